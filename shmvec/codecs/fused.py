"""The delta codec's per-frame work in one numba call each way, lz4 included.

Encoding a frame through Python costs a dozen small calls (views, the header's ``struct``, lz4's
``ctypes`` call with its addresses): ~30 µs per Pong frame on the development machine, as much as the
kernel's pass over the frame. Here numba calls ``LZ4_compress_fast`` / ``LZ4_decompress_safe`` itself,
by symbol name (:class:`numba.types.ExternalFunction`, resolved in the library that
:mod:`shmvec.codecs.clib` found, so the compiled code can be cached), and writes or reads the
9-byte header, so a frame costs one dispatch. The bytes are those of the Python path:
``LZ4_compress_fast`` at the same acceleration, the same header.

:data:`AVAILABLE` is False where lz4's library cannot be found or loaded; the codec then keeps its
Python path.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import types

from shmvec.codecs import clib
from shmvec.codecs.runs import _apply_runs, _encode_runs

# Status codes of decode_frame (0: decoded).
OK, BAD_HEADER, LOST, BAD_DATA, BAD_RUNS = 0, 1, 2, 3, 4
_KEY, _DELTA = 1, 2  # as in shmvec.codecs.delta
_HEADER = 9


def _load() -> bool:
    """Make lz4's symbols visible to numba's linker."""
    lib = clib.lz4_library()
    if lib is None:
        return False
    import llvmlite.binding as llvm

    try:
        llvm.load_library_permanently(lib._name)
    except RuntimeError:
        return False
    return True


AVAILABLE = _load()

_i32 = types.int32
_compress: Any = types.ExternalFunction(
    "LZ4_compress_fast", _i32(types.voidptr, types.voidptr, _i32, _i32, _i32)
)
_decompress: Any = types.ExternalFunction(
    "LZ4_decompress_safe", _i32(types.voidptr, types.voidptr, _i32, _i32)
)


@numba.njit(nogil=True, cache=True)
def _put_header(out: np.ndarray, kind: int, seq: int, size: int) -> None:  # pragma: no cover
    out[0] = kind
    for b in range(4):
        out[1 + b] = (seq >> (8 * b)) & 0xFF
        out[5 + b] = (size >> (8 * b)) & 0xFF


@numba.njit(nogil=True, cache=True)
def encode_frame(
    cur: np.ndarray, prev: np.ndarray, runs: np.ndarray, out: np.ndarray, seq: int, key: bool, accel: int
) -> int:  # pragma: no cover
    """Header and lz4 payload of one frame (``cur``, uint64 words) into ``out`` (uint8): all of ``cur``
    if ``key``, else its runs against ``prev`` (see ``delta._encode_runs``); ``prev`` becomes ``cur``.
    Returns the bytes written, or -1 if they do not fit ``out``."""
    if key:
        prev[:] = cur
        payload = cur
        m = cur.size
    else:
        m = _encode_runs(cur, prev, runs)
        payload = runs
    size = m * 8
    _put_header(out, _KEY if key else _DELTA, seq, size)
    n = _compress(payload.ctypes.data, out[_HEADER:].ctypes.data, size, out.size - _HEADER, accel)
    if n <= 0:
        return -1
    return _HEADER + n


@numba.njit(nogil=True, cache=True)
def decode_frame(
    data: np.ndarray, prev: np.ndarray, runs: np.ndarray, last_seq: int
) -> tuple[int, int]:  # pragma: no cover
    """Apply one encoded frame (header and lz4 payload) to ``prev``, the stream's uint64 reference;
    ``last_seq``: the counter of the frame decoded before (-1: none). Returns (status, counter): a
    delta must follow ``last_seq``, a key frame may come at any time."""
    if data.size < _HEADER:
        return BAD_HEADER, 0
    kind = data[0]
    seq = 0
    size = 0
    for b in range(4):
        seq |= int(data[1 + b]) << (8 * b)
        size |= int(data[5 + b]) << (8 * b)
    src = data[_HEADER:].ctypes.data
    if kind == _KEY and size == prev.size * 8:
        if _decompress(src, prev.ctypes.data, data.size - _HEADER, size) != size:
            return BAD_DATA, seq
        return OK, seq
    if kind != _DELTA or size > runs.size * 8 or size % 8 != 0:
        return BAD_HEADER, seq
    if last_seq < 0 or seq != (last_seq + 1) & 0xFFFFFFFF:
        return LOST, seq
    if _decompress(src, runs.ctypes.data, data.size - _HEADER, size) != size:
        return BAD_DATA, seq
    if not _apply_runs(runs, size // 8, prev):
        return BAD_RUNS, seq
    return OK, seq


@numba.njit(nogil=True, cache=True)
def decode_rows(
    data: np.ndarray,
    lengths: np.ndarray,
    rows: np.ndarray,
    prev: np.ndarray,
    runs: np.ndarray,
    seqs: np.ndarray,
) -> tuple[int, int, int]:  # pragma: no cover
    """:func:`decode_frame` for each row ``i`` of ``rows`` in order: ``data[i, :lengths[i]]`` onto the
    reference ``prev[i]`` with scratch ``runs[i]``; ``seqs[k]``, the counter of row ``rows[k]``'s
    last frame, is updated. Returns ``(-1, OK, 0)``, or at the first failure ``(k, status,
    counter)``, the rows before it decoded. Copying the references out is left to numpy: numba's
    byte loop took ~40 µs per Pong frame where a memcpy takes a few."""
    for k in range(rows.size):
        i = rows[k]
        status, seq = decode_frame(data[i, : lengths[i]], prev[i], runs[i], seqs[k])
        if status != OK:
            return k, status, seq
        seqs[k] = seq
    return -1, OK, 0
