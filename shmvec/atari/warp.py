"""Two palette-index screens -> one gray frame resized like ``cv2.resize(..., INTER_AREA)``, bit for bit.

SB3's ``WarpFrame`` costs ~50 µs a frame (``cvtColor`` then an area resize of 210x160 to 84x84) after
the max of two RGB screens that ale-py grabbed at 14 µs each. Here the two screens arrive as palette
indices (0.3 µs each) and one numba call does the rest in ~20 µs:

1. one table lookup per pixel (:mod:`shmvec.atari.palette`) gives the gray value of the max-pooled
   pixel, written transposed (source columns contiguous);
2. OpenCV's area resize, in OpenCV's order of float32 operations: per source row, each destination
   column sums its source pixels times their weights (``computeResizeAreaTab``'s table, restated in
   :func:`area_table`); per destination row, the rows' sums times their weights; ``cvRound`` and
   saturation. Step 2's horizontal pass runs over all source rows at once (vectorised), which changes
   no single float operation, only their interleaving.

:class:`Warp` checks itself against OpenCV when it is built (:meth:`Warp.agrees_with_opencv`): an
OpenCV whose area resize computes otherwise makes the native path step through the wrappers instead.
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from shmvec.atari import palette

#: Pair table for screens that are gray already: ``MAX[a << 8 | b] = max(a, b)``.
MAX = np.maximum.outer(np.arange(256), np.arange(256)).astype(np.uint8).reshape(-1)


def area_table(ssize: int, dsize: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV's area-resize table along one axis (``computeResizeAreaTab`` with ``scale = ssize /
    dsize``): per entry, the destination index, the source index and the float32 weight, in
    OpenCV's order."""
    scale = ssize / dsize
    dst: list[int] = []
    src: list[int] = []
    weight: list[float] = []
    for d in range(dsize):
        fs1 = d * scale
        fs2 = fs1 + scale
        cell = min(scale, ssize - fs1)
        s1, s2 = math.ceil(fs1), math.floor(fs2)
        s2 = min(s2, ssize - 1)
        s1 = min(s1, s2)
        if s1 - fs1 > 1e-3:
            dst.append(d)
            src.append(s1 - 1)
            weight.append((s1 - fs1) / cell)
        for s in range(s1, s2):
            dst.append(d)
            src.append(s)
            weight.append(1.0 / cell)
        if fs2 - s2 > 1e-3:
            dst.append(d)
            src.append(s2)
            weight.append(min(min(fs2 - s2, 1.0), cell) / cell)
    return np.array(dst, np.int32), np.array(src, np.int32), np.array(weight, np.float32)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _lookup_transposed(i0: np.ndarray, i1: np.ndarray, table: np.ndarray, gt: np.ndarray) -> None:
    height, width = i0.shape
    for sy in range(height):
        for sx in range(width):
            gt[sx, sy] = table[(np.int32(i0[sy, sx]) << 8) | i1[sy, sx]]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _horizontal(gt, buft, xd, xs, xw) -> None:
    buft[:, :] = 0
    height = gt.shape[1]
    for k in range(len(xd)):
        d, s, w = xd[k], xs[k], xw[k]
        for sy in range(height):
            buft[d, sy] += gt[s, sy] * w


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _store(acc: np.ndarray, out: np.ndarray, dy: int) -> None:
    for dx in range(len(acc)):
        v = np.rint(acc[dx])
        out[dy, dx] = np.uint8(min(max(v, 0.0), 255.0))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _vertical(buft, buf, acc, out, yd, ys, yw) -> None:
    dwidth, height = buft.shape
    for d in range(dwidth):
        for sy in range(height):
            buf[sy, d] = buft[d, sy]
    prev = yd[0]
    acc[:] = 0
    for j in range(len(yd)):
        dy, sy, w = yd[j], ys[j], yw[j]
        if dy != prev:
            _store(acc, out, prev)
            for dx in range(dwidth):
                acc[dx] = w * buf[sy, dx]
            prev = dy
        else:
            for dx in range(dwidth):
                acc[dx] = acc[dx] + w * buf[sy, dx]
    _store(acc, out, prev)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def warp_frame(i0, i1, table, out, gt, buft, buf, acc, xd, xs, xw, yd, ys, yw) -> None:
    """``out[:] = area_resize(table[i0 << 8 | i1])`` (see the module docstring); the rest is scratch."""
    _lookup_transposed(i0, i1, table, gt)
    _horizontal(gt, buft, xd, xs, xw)
    _vertical(buft, buf, acc, out, yd, ys, yw)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def colour(idx: np.ndarray, palette: np.ndarray, out: np.ndarray) -> None:
    """``out[y, x] = palette[idx[y, x]]``: an index screen in colour, as ``getScreenRGB`` gives it
    (NumPy's ``take`` and fancy indexing allocate an index array of the screen's size first)."""
    height, width = idx.shape
    for y in range(height):
        for x in range(width):
            for c in range(palette.shape[1]):
                out[y, x, c] = palette[idx[y, x], c]


class Warp:
    """The lookup and area resize for one screen size and one output size, with its scratch memory
    (nothing is allocated per frame).

    :param screen: (height, width) of the index screens.
    :param size: (height, width) of the output frame.
    """

    def __init__(self, screen: tuple[int, int], size: tuple[int, int]) -> None:
        height, width = screen
        dheight, dwidth = size
        self.screen, self.size = screen, size
        self.x = area_table(width, dwidth)
        self.y = area_table(height, dheight)
        self.scratch = (
            np.zeros((width, height), np.float32),
            np.zeros((dwidth, height), np.float32),
            np.zeros((height, dwidth), np.float32),
            np.zeros(dwidth, np.float32),
        )

    def __call__(self, i0: np.ndarray, i1: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
        """Write the frame of index screens ``i0``/``i1`` through pair ``table`` into ``out``, a
        (height, width) uint8 array."""
        warp_frame(i0, i1, table, out, *self.scratch, *self.x, *self.y)

    def agrees_with_opencv(self, colours: np.ndarray, table: np.ndarray, frames: int = 16) -> bool:
        """Whether this warp equals OpenCV's own chain (``colours`` of the indices, channel-wise max,
        ``cvtColor`` to gray for RGB colours, ``cv2.resize(..., INTER_AREA)``) on random and
        structured screens.

        :param colours: (256, 3) colours for a table built by ``cvtColor``, or (256,) gray values
            for one built as the max of gray values.
        """
        import cv2

        rng = np.random.default_rng(0)
        out = np.zeros(self.size, np.uint8)
        dsize = (self.size[1], self.size[0])
        for f in range(frames):
            i0 = rng.integers(0, 128, self.screen, dtype=np.uint8) * 2
            i1 = rng.integers(0, 128, self.screen, dtype=np.uint8) * 2
            if f % 2:  # large flat areas and hard edges, as game screens have
                i1 = np.where(i0 > 128, i0, 0).astype(np.uint8)
                i0 = np.repeat(i0[:, :1], self.screen[1], axis=1)
            pooled = np.maximum(colours[i0], colours[i1])
            gray = cv2.cvtColor(pooled, cv2.COLOR_RGB2GRAY) if pooled.ndim == 3 else pooled
            self(i0, i1, table, out)
            if not np.array_equal(out, cv2.resize(gray, dsize, interpolation=cv2.INTER_AREA)):
                return False
        return True


@functools.cache
def checked(screen: tuple[int, int], size: tuple[int, int], colour: bool) -> Warp | None:
    """The warp from ``screen`` to ``size``, or None where it would not equal OpenCV's: an
    enlargement, or a reduction by whole factors on both axes (OpenCV's integer fast path, which
    rounds otherwise), or an OpenCV whose general area resize computes otherwise (checked here on
    test screens once per process and size). ``colour``: index screens through SB3's
    :func:`~shmvec.atari.palette.gray_of_max` (else gray screens through :data:`MAX`)."""
    ratios = (screen[0] / size[0], screen[1] / size[1])
    if min(ratios) < 1 or all(r == int(r) for r in ratios):
        return None
    warp = Warp(screen, size)
    if colour:
        agrees = warp.agrees_with_opencv(palette.rgb_palette(), palette.gray_of_max())
    else:
        agrees = warp.agrees_with_opencv(np.arange(256, dtype=np.uint8), MAX)
    return warp if agrees else None
