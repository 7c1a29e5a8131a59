"""``lz4`` and ``zstd``: general-purpose lossless byte compressors over the array's raw bytes.

They take any dtype and shape. Both libraries release the GIL while they work, so a batch decodes in
parallel threads. They compress and decompress straight into the caller's preallocated buffer (the
ring row, the output array) through the libraries' C functions (:mod:`shmvec.codecs.clib`): no
allocation per frame. Where those cannot be found, the Python bindings' ``bytes`` results are copied
into the buffer instead.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from typing import Any

import numpy as np

from shmvec.codecs import clib
from shmvec.codecs.base import Codec, CodecError, byte_view, nbytes, out_bytes


class ByteCodec(Codec):
    """A lossless compressor of flat bytes; subclasses provide :meth:`compress` and :meth:`decompress`."""

    lossless = True
    releases_gil = True

    @abstractmethod
    def bound(self, n: int) -> int:
        """Worst-case compressed size of ``n`` input bytes."""

    @abstractmethod
    def compress(self, src: np.ndarray) -> bytes:
        """Compress a flat ``uint8`` array."""

    @abstractmethod
    def decompress(self, data: np.ndarray, n: int) -> bytes:
        """Decompress to exactly ``n`` bytes; raise :class:`CodecError` on corrupt input."""

    def max_encoded_size(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """Worst-case compressed size of one array in bytes (:meth:`bound` of its size)."""
        return self.bound(nbytes(shape, dtype))

    def compress_into(self, src: np.ndarray, out: np.ndarray) -> int:
        """Compress the flat ``uint8`` array ``src`` into ``out``; return the byte count."""
        packed = self.compress(src)
        if len(packed) > out.size:
            raise CodecError(f"{self.name}: {len(packed)} bytes do not fit the {out.size}-byte buffer")
        out[: len(packed)] = np.frombuffer(packed, np.uint8)
        return len(packed)

    def decompress_into(self, data: np.ndarray, out: np.ndarray) -> None:
        """Decompress ``data`` into the flat ``uint8`` array ``out`` (exactly ``out.size`` bytes)."""
        raw = self.decompress(data, out.size)
        if len(raw) != out.size:
            raise CodecError(f"{self.name}: decoded {len(raw)} bytes, expected {out.size}")
        out[:] = np.frombuffer(raw, np.uint8)

    def encode(self, arr: np.ndarray, out: np.ndarray, stream: Any = None) -> int:
        """Compress the array's raw bytes into ``out``; return the number of bytes written."""
        return self.compress_into(byte_view(arr), out)

    def decode(self, data: np.ndarray, out: np.ndarray, stream: Any = None) -> np.ndarray:
        """Decompress ``data`` into ``out`` (which must hold exactly the original bytes); return ``out``."""
        self.decompress_into(data, out_bytes(out))
        return out


class LZ4Codec(ByteCodec):
    """LZ4 block compression (fast; ratios ~15-130x on raw Atari frames).

    :param acceleration: LZ4 "fast" mode acceleration (default 1 = the default mode); larger is
        faster and compresses less.
    """

    name = "lz4"

    def __init__(self, acceleration: int = 1) -> None:
        if acceleration < 1:
            raise ValueError(f"lz4 acceleration must be >= 1, got {acceleration}")
        self.acceleration = int(acceleration)

    def params(self) -> dict[str, Any]:
        """``{"acceleration": ...}``: LZ4's speed/ratio trade-off (1 = best ratio)."""
        return {"acceleration": self.acceleration}

    def bound(self, n: int) -> int:
        """LZ4's worst-case compressed size of ``n`` input bytes."""
        return n + n // 255 + 16  # LZ4_COMPRESSBOUND

    def compress(self, src: np.ndarray) -> bytes:
        """LZ4 block compression of a flat ``uint8`` array (no size header)."""
        import lz4.block

        if self.acceleration == 1:
            return lz4.block.compress(src, store_size=False)
        return lz4.block.compress(src, mode="fast", acceleration=self.acceleration, store_size=False)

    def compress_into(self, src: np.ndarray, out: np.ndarray) -> int:
        """Compress the flat ``uint8`` array ``src`` straight into ``out``; return the byte count."""
        lib = clib.lz4()
        if lib is None:
            return super().compress_into(src, out)
        n = lib.compress(clib.address(src), clib.address(out), src.size, out.size, self.acceleration)
        if n <= 0:
            raise CodecError(f"lz4: {src.size} bytes do not fit the {out.size}-byte buffer")
        return int(n)

    def decompress_into(self, data: np.ndarray, out: np.ndarray) -> None:
        """Decompress ``data`` straight into the flat ``uint8`` array ``out`` (exactly ``out.size`` bytes)."""
        lib = clib.lz4()
        if lib is None:
            return super().decompress_into(data, out)
        n = lib.decompress(clib.address(data), clib.address(out), data.size, out.size)
        if n != out.size:
            raise CodecError(f"lz4: corrupt data (decoded {n} bytes, expected {out.size})")
        return None

    def decompress(self, data: np.ndarray, n: int) -> bytes:
        """LZ4 block decompression of ``data`` into ``n`` bytes."""
        import lz4.block

        try:
            return lz4.block.decompress(data, uncompressed_size=n)
        except lz4.block.LZ4BlockError as exc:
            raise CodecError(f"lz4: corrupt data ({exc})") from exc


class ZstdCodec(ByteCodec):
    """Zstandard compression (slower than lz4, several times smaller output on Atari frames).

    :param level: zstd compression level, 1 (fastest, default) to 22; negative levels are faster still.
    """

    name = "zstd"

    def __init__(self, level: int = 1) -> None:
        if not -7 <= level <= 22:
            raise ValueError(f"zstd level must be between -7 and 22, got {level}")
        self.level = int(level)
        self._local = threading.local()
        lib = clib.zstd()
        self._native = None if lib is None else clib.ZstdContexts(lib)

    def params(self) -> dict[str, Any]:
        """``{"level": ...}``: the zstd compression level."""
        return {"level": self.level}

    def __getstate__(self) -> dict[str, Any]:
        # (De)compressor contexts are neither picklable nor safe to share between threads.
        return {"level": self.level}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def bound(self, n: int) -> int:
        """zstd's worst-case compressed size of ``n`` input bytes."""
        # ZSTD_COMPRESSBOUND, plus room for the frame header with the content size.
        return n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0) + 32

    def _contexts(self) -> Any:
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            import zstandard

            ctx = self._local.ctx = (
                zstandard.ZstdCompressor(level=self.level),
                zstandard.ZstdDecompressor(),
            )
        return ctx

    def compress_into(self, src: np.ndarray, out: np.ndarray) -> int:
        """Compress the flat ``uint8`` array ``src`` straight into ``out``; return the byte count."""
        if self._native is None:
            return super().compress_into(src, out)
        cctx, _ = self._native.get()
        lib = self._native.lib
        n = lib.compress(cctx, clib.address(out), out.size, clib.address(src), src.size, self.level)
        if n > out.size:  # zstd's error codes are the largest size_t values
            raise CodecError(f"zstd: {src.size} bytes do not fit the {out.size}-byte buffer")
        return int(n)

    def decompress_into(self, data: np.ndarray, out: np.ndarray) -> None:
        """Decompress ``data`` straight into the flat ``uint8`` array ``out`` (exactly ``out.size`` bytes)."""
        if self._native is None:
            return super().decompress_into(data, out)
        _, dctx = self._native.get()
        lib = self._native.lib
        n = lib.decompress(dctx, clib.address(out), out.size, clib.address(data), data.size)
        if n != out.size:
            raise CodecError(f"zstd: corrupt data (decoded {n} bytes or an error code, expected {out.size})")
        return None

    def compress(self, src: np.ndarray) -> bytes:
        """zstd compression of a flat ``uint8`` array, with this thread's compression context."""
        return self._contexts()[0].compress(src)

    def decompress(self, data: np.ndarray, n: int) -> bytes:
        """zstd decompression of ``data`` into ``n`` bytes, with this thread's context."""
        import zstandard

        try:
            return self._contexts()[1].decompress(data, max_output_size=n)
        except zstandard.ZstdError as exc:
            raise CodecError(f"zstd: corrupt data ({exc})") from exc
