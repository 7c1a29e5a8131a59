"""The XOR run kernels of the ``delta`` codec, compiled by numba: the runs of 64-bit words where a frame
differs from the previous one (:func:`_encode_runs`), and their application (:func:`_apply_runs`).

Shared by :mod:`shmvec.codecs.delta` (one frame at a time) and :mod:`shmvec.codecs.fused` (a batch
of frames in one call), so that neither imports the other's kernels.
"""

from __future__ import annotations

import numba
import numpy as np

_BLOCK = 32  # words per block of the encoder's unchanged-block test


def _encode_runs(cur: np.ndarray, prev: np.ndarray, runs: np.ndarray) -> int:  # pragma: no cover
    """Write the runs of words where ``cur`` differs from ``prev`` into ``runs``; set ``prev = cur``.

    All arrays are uint64; ``runs`` has room for ``cur.size + 1`` words (the worst case: runs of one
    changed word each, separated by one unchanged word). Returns the number of words written.
    """
    m = 0
    w = 0
    last = 0
    nw = cur.size
    zero = np.uint64(0)
    while w < nw:
        # Most blocks are unchanged: an OR of XORs over a block has no branch per word, so the
        # compiler vectorises it and the pass runs at memory speed.
        end = min(w + _BLOCK, nw)
        acc = zero
        for k in range(w, end):
            acc |= cur[k] ^ prev[k]
        if acc == zero:
            w = end
            continue
        while w < end and cur[w] == prev[w]:
            w += 1
        start = w
        while w < nw and cur[w] != prev[w]:
            w += 1
        runs[m] = (np.uint64(start - last) << np.uint64(32)) | np.uint64(w - start)
        m += 1
        for k in range(start, w):
            runs[m] = cur[k] ^ prev[k]
            prev[k] = cur[k]
            m += 1
        last = w
    return m


def _apply_runs(runs: np.ndarray, m: int, prev: np.ndarray) -> bool:  # pragma: no cover
    """XOR the first ``m`` words of runs made by :func:`_encode_runs` into ``prev``; False for runs
    that reach past the frame."""
    i = 0
    w = 0
    mask = np.uint64(0xFFFFFFFF)
    while i < m:
        head = runs[i]
        w += int(head >> np.uint64(32))
        length = int(head & mask)
        i += 1
        if w + length > prev.size or i + length > m:
            return False
        for k in range(length):
            prev[w + k] ^= runs[i + k]
        i += length
        w += length
    return True


# Compiled once per machine (cache=True keeps the machine code next to this file, or in numba's
# user cache when that is read-only); nogil so that a batch decodes in parallel threads.
_encode_runs = numba.njit(nogil=True, cache=True)(_encode_runs)
_apply_runs = numba.njit(nogil=True, cache=True)(_apply_runs)
