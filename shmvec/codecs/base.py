"""What a codec is: a named, picklable recipe that turns one observation array into bytes and back.

A :class:`Codec` object holds only its parameters (it is pickled to the workers). Codecs that carry
state from frame to frame (the ``delta`` codec) keep it in a *stream* object made by
:meth:`Codec.new_stream`, one per env and leaf: the worker holds the encoding streams and the main
process the decoding streams. Stateless codecs use ``None`` as their stream.

Buffers are preallocated by the caller: :meth:`Codec.encode` writes into a ``uint8`` array of at
least :meth:`Codec.max_encoded_size` bytes and returns how many it wrote; :meth:`Codec.decode`
writes into an array of the original shape and dtype.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np


class CodecError(ValueError):
    """A codec cannot take an array (dtype, shape) or was given bytes it cannot decode.

    :attr:`row` is the row :meth:`Codec.decode_rows` failed at (None elsewhere).
    """

    row: int | None = None


class Codec(ABC):
    """Base class of every codec.

    Subclasses set :attr:`name` and :attr:`lossless` and implement :meth:`max_encoded_size`,
    :meth:`encode` and :meth:`decode`; stateful ones also :meth:`new_stream` and :meth:`restart`.
    """

    #: registry name, e.g. ``"lz4"``.
    name: str = ""
    #: True if ``decode(encode(x))`` is bit-identical to ``x`` for every accepted array.
    lossless: bool = True
    #: True if the codec releases the GIL while it works, so decoding a batch in threads pays off.
    releases_gil: bool = False

    def check(self, shape: tuple[int, ...], dtype: np.dtype) -> None:  # noqa: B027 - optional hook
        """Raise :class:`CodecError` if this shape and dtype cannot be encoded (default: all can)."""

    @abstractmethod
    def max_encoded_size(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """Worst-case encoded size in bytes of one array (incompressible input included)."""

    @abstractmethod
    def encode(self, arr: np.ndarray, out: np.ndarray, stream: Any = None) -> int:
        """Encode ``arr`` into the ``uint8`` array ``out``; return the number of bytes written.

        :param arr: one observation (C-contiguous or not; it is not modified).
        :param out: 1-D ``uint8`` buffer of at least ``max_encoded_size`` bytes.
        :param stream: this env's encoding stream from :meth:`new_stream` (None for stateless codecs).
        """

    @abstractmethod
    def decode(self, data: np.ndarray, out: np.ndarray, stream: Any = None) -> np.ndarray:
        """Decode ``data`` (1-D ``uint8``, exactly the bytes ``encode`` wrote) into ``out``; return ``out``.

        :param out: C-contiguous array of the original shape and dtype.
        :param stream: this env's decoding stream (None for stateless codecs).
        :raises CodecError: when ``data`` cannot be decoded (corrupt bytes, a stream out of step).
        """

    def new_stream(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """State for one sequence of frames (one env, one leaf); None for stateless codecs."""
        return None

    def new_streams(self, n: int, shape: tuple[int, ...], dtype: np.dtype) -> list[Any]:
        """One stream per env of a batch (default: :meth:`new_stream` each). A codec may lay them
        out together, for :meth:`decode_rows` to decode a batch in one call."""
        return [self.new_stream(shape, dtype) for _ in range(n)]

    def decode_rows(
        self, data: np.ndarray, lengths: np.ndarray, rows: Sequence[int], out: np.ndarray, streams: list[Any]
    ) -> None:
        """Decode the frames of ``rows`` of a batch, in order: row ``i``'s are the first
        ``lengths[i]`` bytes of ``data[i]``, decoded into ``out[i]`` with ``streams[i]`` (default:
        :meth:`decode` each).

        :param data: 2-D ``uint8``, one row of encoded bytes per env.
        :param out: the batch's array, ``(n_envs, *shape)``.
        :raises CodecError: as :meth:`decode`, with :attr:`CodecError.row` set; the rows before it
            are decoded.
        """
        for i in rows:
            try:
                self.decode(data[i, : lengths[i]], out[i, ...], streams[i])  # a view, also for 0-d
            except CodecError as exc:
                exc.row = i
                raise

    def restart(self, stream: Any) -> None:  # noqa: B027 - optional hook
        """Make the next frame of ``stream`` independent of the previous ones (after an env reset)."""

    def params(self) -> dict[str, Any]:
        """The parameters this codec was built with (for reports and ``repr``)."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.params() == self.params()

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.params().items()))))


def nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of one array of ``shape`` and ``dtype``."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def out_bytes(out: np.ndarray) -> np.ndarray:
    """A flat ``uint8`` view of a decode destination, which must be C-contiguous to be written through."""
    if not out.flags.c_contiguous:
        raise CodecError("decode needs a C-contiguous output array")
    return out.reshape(-1).view(np.uint8)


def byte_view(arr: np.ndarray) -> np.ndarray:
    """A flat ``uint8`` view of ``arr`` (a contiguous copy only when ``arr`` is not C-contiguous)."""
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
