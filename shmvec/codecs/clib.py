"""Compress and decompress straight into caller buffers, through the C functions of lz4 and zstd.

The Python bindings return a new ``bytes`` object per call (no ``out=`` parameter in
``lz4.block.decompress`` nor in ``zstandard``'s one-shot API), which the codecs then copy into the ring
or the output array: a frame-sized allocation and copy per decoded key frame, and one per encoded
frame. The same wheels export the C entry points (``LZ4_compress_fast`` / ``LZ4_decompress_safe`` in
``lz4.block._block``; ``ZSTD_compressCCtx`` / ``ZSTD_decompressDCtx`` in zstandard's cffi backend,
``zstandard._cffi``), so we call those through :mod:`ctypes` with the destination's address: nothing
is allocated but a few small call objects, whatever the frame size. Where a library's symbols cannot
be found (another build of the package), :func:`lz4` / :func:`zstd` return None and the codecs keep
the copying path. Both sides produce the standard lz4 block and zstd frame formats, so either path
decodes what the other encoded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np


def address(arr: np.ndarray) -> int:
    """Address of the first byte of a C-contiguous array (a writable one costs ~1 us less)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))  # type: ignore[arg-type]
    except (TypeError, ValueError):  # read-only, or empty
        return int(arr.__array_interface__["data"][0])


def _library(module: str, fallback: str, symbol: str) -> ctypes.CDLL | None:
    """The shared object of ``module`` if it exports ``symbol``, else the system library ``fallback``."""
    candidates = []
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        candidates.append(spec.origin)
    system = ctypes.util.find_library(fallback)
    if system:
        candidates.append(system)
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
            getattr(lib, symbol)
        except (OSError, AttributeError):
            continue
        return lib
    return None


def _fn(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


_P, _I, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t


@dataclass(frozen=True)
class LZ4:
    """lz4's block functions: ``compress(src, n, dst, capacity, acceleration) -> bytes written (0:
    does not fit)`` and ``decompress(src, n, dst, capacity) -> bytes written (< 0: corrupt)``,
    on addresses."""

    compress: Any
    decompress: Any


@dataclass(frozen=True)
class Zstd:
    """zstd's context functions on addresses; results above the capacity are error codes."""

    compress: Any  # (cctx, dst, capacity, src, n, level) -> size
    decompress: Any  # (dctx, dst, capacity, src, n) -> size
    create_cctx: Any
    create_dctx: Any
    free_cctx: Any
    free_dctx: Any


@functools.cache
def lz4_library() -> ctypes.CDLL | None:
    """The shared object that exports lz4's block functions, or None where none can be found."""
    return _library("lz4.block._block", "lz4", "LZ4_decompress_safe")


@functools.cache
def lz4() -> LZ4 | None:
    """lz4's C block functions, or None where they cannot be found."""
    lib = lz4_library()
    if lib is None:
        return None
    return LZ4(
        _fn(lib, "LZ4_compress_fast", _I, _P, _P, _I, _I, _I),
        _fn(lib, "LZ4_decompress_safe", _I, _P, _P, _I, _I),
    )


@functools.cache
def zstd() -> Zstd | None:
    """zstd's C context functions, or None where they cannot be found."""
    lib = _library("zstandard._cffi", "zstd", "ZSTD_decompressDCtx")
    if lib is None:
        return None
    return Zstd(
        _fn(lib, "ZSTD_compressCCtx", _S, _P, _P, _S, _P, _S, _I),
        _fn(lib, "ZSTD_decompressDCtx", _S, _P, _P, _S, _P, _S),
        _fn(lib, "ZSTD_createCCtx", _P),
        _fn(lib, "ZSTD_createDCtx", _P),
        _fn(lib, "ZSTD_freeCCtx", _S, _P),
        _fn(lib, "ZSTD_freeDCtx", _S, _P),
    )


class ZstdContexts:
    """One compression and one decompression context per thread (zstd contexts are not thread-safe),
    freed with the thread's state."""

    def __init__(self, lib: Zstd) -> None:
        self.lib = lib
        self._local = threading.local()

    def get(self) -> tuple[int, int]:
        """This thread's ``(cctx, dctx)`` addresses."""
        pair = getattr(self._local, "pair", None)
        if pair is None:
            pair = self._local.pair = _ContextPair(self.lib)
        return pair.cctx, pair.dctx


class _ContextPair:
    def __init__(self, lib: Zstd) -> None:
        self.cctx, self.dctx = lib.create_cctx(), lib.create_dctx()
        if not self.cctx or not self.dctx:
            raise MemoryError("zstd could not create its contexts")
        weakref.finalize(self, _free, lib, self.cctx, self.dctx)


def _free(lib: Zstd, cctx: int, dctx: int) -> None:
    lib.free_cctx(cctx)
    lib.free_dctx(dctx)
