"""``raw``: the array's bytes as they are. The reference every other codec is measured against."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmvec.codecs.base import Codec, byte_view, nbytes, out_bytes


class RawCodec(Codec):
    """Identity codec: copies the bytes (lossless, any dtype and shape)."""

    name = "raw"
    lossless = True
    releases_gil = True  # numpy copies large blocks without the GIL

    def max_encoded_size(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """The array's own size in bytes: raw output is never larger or smaller."""
        return nbytes(shape, dtype)

    def encode(self, arr: np.ndarray, out: np.ndarray, stream: Any = None) -> int:
        """Copy the array's bytes into ``out``; return their number."""
        src = byte_view(arr)
        out[: src.size] = src
        return int(src.size)

    def decode(self, data: np.ndarray, out: np.ndarray, stream: Any = None) -> np.ndarray:
        """Copy ``data`` back into ``out`` byte for byte; return ``out``."""
        out_bytes(out)[:] = data
        return out
