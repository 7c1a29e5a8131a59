"""Two palette-index screens -> one gray frame resized like ``cv2.resize(..., INTER_AREA)``, bit for bit.

SB3's ``WarpFrame`` costs ~50 µs a frame (``cvtColor`` then an area resize of 210x160 to 84x84) after
the max of two RGB screens that ale-py grabbed at 14 µs each. Here the two screens arrive as palette
indices (0.3 µs each) and one numba call does the rest:

1. one table lookup per pixel (:mod:`shmvec.atari.palette`) gives the gray value of the max-pooled
   pixel;
2. OpenCV's area resize, in OpenCV's order of float32 operations: per source row, each destination
   column sums its source pixels times their weights (``computeResizeAreaTab``'s table, restated in
   :func:`area_table`); per destination row, the rows' sums times their weights; ``cvRound`` and
   saturation.

Step 2's per-row sums depend on that row's two index rows alone, and most rows of a game screen are
the same as a step earlier: each env keeps its rows' sums (:class:`WarpState`) and recomputes only
the rows whose indices changed (9-45 of 210 on Pong, Breakout, MsPacman, Seaquest). When most rows
changed, all are recomputed at once with the horizontal pass running over every source row together
(vectorised). What changes in a row is mostly a sprite a few pixels wide, and a destination pixel
depends on a few source rows and columns alone: so within a changed row only the destination
columns that its changed 8-byte words feed are recomputed, and the env keeps the frame it gave last
and recomputes only the destination pixels those columns and rows feed. None of this changes a
single float operation, only which are done and their interleaving.

:class:`Warp` checks itself against OpenCV when it is built (:func:`checked`): an OpenCV whose area
resize computes otherwise makes the native path step through the wrappers instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

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
def _changed_rows(i0, i1, prev, valid, span, dfrom, dupto) -> int:
    """The rows where ``i0`` or ``i1`` differ from ``prev`` (all, if not ``valid``): how many, and in
    ``span[sy]`` the destination columns (from, to) that a row's differing pixels feed, empty for a
    row that did not change. ``dfrom`` / ``dupto``: per source column, the first destination column
    it or a column after it feeds / the last one it or a column before it feeds. A span runs from
    the first to the last differing 8-byte word (pixel, where the width is not a multiple of 8)."""
    height, width = i0.shape
    if not valid:
        span[:, 0] = 0
        span[:, 1] = dupto[width - 1] + 1
        return height
    words = width // 8 if width % 8 == 0 else 0
    if words:
        a = i0.reshape(height * width).view(np.uint64).reshape(height, words)
        b = i1.reshape(height * width).view(np.uint64).reshape(height, words)
        pa = prev[0].reshape(height * width).view(np.uint64).reshape(height, words)
        pb = prev[1].reshape(height * width).view(np.uint64).reshape(height, words)
    n = 0
    for sy in range(height):
        diff = False
        if words:
            for k in range(words):
                diff |= (a[sy, k] != pa[sy, k]) | (b[sy, k] != pb[sy, k])
        else:
            for sx in range(width):
                diff |= (i0[sy, sx] != prev[0, sy, sx]) | (i1[sy, sx] != prev[1, sy, sx])
        if not diff:
            span[sy, 0] = span[sy, 1] = 0
            continue
        n += 1
        # Second pass on the changed rows alone (a few per frame): where the difference lies.
        lo, hi = width, 0
        if words:
            for k in range(words):
                if (a[sy, k] != pa[sy, k]) | (b[sy, k] != pb[sy, k]):
                    lo, hi = min(lo, 8 * k), 8 * k + 8
        else:
            for sx in range(width):
                if (i0[sy, sx] != prev[0, sy, sx]) | (i1[sy, sx] != prev[1, sy, sx]):
                    lo, hi = min(lo, sx), sx + 1
        span[sy, 0], span[sy, 1] = dfrom[lo], dupto[hi - 1] + 1
    return n


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _rows(i0, i1, table, prev, span, g, buf, taps, weights, sfirst, slast) -> None:
    """Per changed row: the lookup of the source pixels its changed destination columns read, then
    each of those columns' sum over its source pixels, the taps in OpenCV's order (padding taps
    weigh 0 and add +0.0, which changes no sum). Other columns' sums read unchanged pixels only."""
    ntaps = taps.shape[0]
    for sy in range(i0.shape[0]):
        d0, d1 = span[sy, 0], span[sy, 1]
        if d0 == d1:
            continue
        for sx in range(sfirst[d0], slast[d1 - 1] + 1):
            a, b = i0[sy, sx], i1[sy, sx]
            prev[0, sy, sx], prev[1, sy, sx] = a, b
            g[sx] = table[(np.int32(a) << 8) | b]
        row = buf[sy]
        for d in range(d0, d1):
            row[d] = g[taps[0, d]] * weights[0, d]
        for t in range(1, ntaps):
            for d in range(d0, d1):
                row[d] += g[taps[t, d]] * weights[t, d]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _all_rows(i0, i1, table, prev, gt, buft, buf, xd, xs, xw) -> None:
    """The same sums for every row at once: lookup written transposed (source columns contiguous),
    the horizontal pass over all rows together, the result transposed back."""
    height, width = i0.shape
    for sy in range(height):
        for sx in range(width):
            a, b = i0[sy, sx], i1[sy, sx]
            prev[0, sy, sx], prev[1, sy, sx] = a, b
            gt[sx, sy] = table[(np.int32(a) << 8) | b]
    buft[:, :] = 0
    for k in range(len(xd)):
        d, s, w = xd[k], xs[k], xw[k]
        for sy in range(height):
            buft[d, sy] += gt[s, sy] * w
    for d in range(buft.shape[0]):
        for sy in range(height):
            buf[sy, d] = buft[d, sy]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _vertical(buf, acc, last, span, ys, yw, ystart) -> None:
    """Per destination row fed by a changed source row: over the destination columns those rows'
    changes feed, the rows' sums times their weights, in OpenCV's order, then ``cvRound`` and
    saturation, into ``last`` (the env's previous frame, whose other pixels stay as they are)."""
    for dy in range(len(ystart) - 1):
        lo, hi = ystart[dy], ystart[dy + 1]
        d0, d1 = acc.shape[0], 0
        for j in range(lo, hi):
            if span[ys[j], 0] < span[ys[j], 1]:
                d0, d1 = min(d0, span[ys[j], 0]), max(d1, span[ys[j], 1])
        if d0 >= d1:
            continue
        sy, w = ys[lo], yw[lo]
        for dx in range(d0, d1):
            acc[dx] = w * buf[sy, dx]
        for j in range(lo + 1, hi):
            sy, w = ys[j], yw[j]
            for dx in range(d0, d1):
                acc[dx] = acc[dx] + w * buf[sy, dx]
        for dx in range(d0, d1):
            v = np.rint(acc[dx])
            last[dy, dx] = np.uint8(min(max(v, 0.0), 255.0))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def warp_frame(
    i0, i1, table, out, prev, valid, buf, last, g, gt, buft, acc, span, x, taps, weights, y, cols
) -> int:
    """``out[:] = area_resize(table[i0 << 8 | i1])`` (see the module docstring): ``prev``, ``valid``,
    ``buf``, ``last`` are the env's :class:`WarpState`, the rest the warp's tables and scratch.
    Returns the rows recomputed."""
    n = _changed_rows(i0, i1, prev, valid[0], span, cols[0], cols[1])
    if n > len(span) // 3:
        # Every row at once; the pixels outside the spans come out as they were.
        _all_rows(i0, i1, table, prev, gt, buft, buf, x[0], x[1], x[2])
    elif n:
        _rows(i0, i1, table, prev, span, g, buf, taps, weights, cols[2], cols[3])
    valid[0] = True
    if n:
        _vertical(buf, acc, last, span, y[1], y[2], y[3])
    for dy in range(out.shape[0]):  # (numba's 2-d slice assignment takes 8x as long)
        for dx in range(out.shape[1]):
            out[dy, dx] = last[dy, dx]
    return n


@numba.njit(cache=True, nogil=True, boundscheck=False)
def colour(idx: np.ndarray, palette: np.ndarray, out: np.ndarray) -> None:
    """``out[y, x] = palette[idx[y, x]]``: an index screen in colour, as ``getScreenRGB`` gives it
    (NumPy's ``take`` and fancy indexing allocate an index array of the screen's size first)."""
    height, width = idx.shape
    for y in range(height):
        for x in range(width):
            for c in range(palette.shape[1]):
                out[y, x, c] = palette[idx[y, x], c]


def screen_pairs(screen: tuple[int, int], frames: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """Test pairs of index screens (even indices, as NTSC games show), for checking a warp: random
    ones and ones with large flat areas and hard edges, as game screens have; each pair first whole
    (with ``height`` rows to recompute: start from a fresh :class:`WarpState`), then with a few of
    its rows changed, then with a few sprites moved (small rectangles: a few columns of a few rows
    changed, at the screen's edges too): ``(i0, i1, rows to recompute)``."""
    rng = np.random.default_rng(0)
    height, width = screen
    for f in range(frames):
        i0 = rng.integers(0, 128, screen, dtype=np.uint8) * 2
        i1 = rng.integers(0, 128, screen, dtype=np.uint8) * 2
        if f % 2:
            i1 = np.where(i0 > 128, i0, 0).astype(np.uint8)
            i0 = np.repeat(i0[:, :1], width, axis=1)
        yield i0, i1, height
        before = i0.copy(), i1.copy()
        rows = rng.choice(height, size=height // 8, replace=False)
        i1[rows] = rng.integers(0, 128, (len(rows), width), dtype=np.uint8) * 2
        yield i0, i1, _rows_differing(before, (i0, i1))
        before = i0.copy(), i1.copy()
        for _ in range(4):
            top = int(rng.integers(0, height - 1))
            left = (0, width - 1, int(rng.integers(0, width - 1)))[rng.integers(3)]
            box = slice(top, top + int(rng.integers(1, 9))), slice(left, left + int(rng.integers(1, 17)))
            screen_of = (i0, i1)[rng.integers(2)]
            screen_of[box] = rng.integers(0, 128, screen_of[box].shape, dtype=np.uint8) * 2
        yield i0, i1, _rows_differing(before, (i0, i1))


def _rows_differing(before: tuple[np.ndarray, np.ndarray], after: tuple[np.ndarray, np.ndarray]) -> int:
    return int(np.any((before[0] != after[0]) | (before[1] != after[1]), axis=1).sum())


class WarpState:
    """One env's rows of a :class:`Warp`: the index rows it last saw and their horizontal sums.

    :param warp: the warp it serves.
    """

    def __init__(self, warp: Warp) -> None:
        height, width = warp.screen
        self.prev = np.zeros((2, height, width), np.uint8)
        self.valid = np.zeros(1, np.bool_)  # False until the first frame: every row computed
        self.buf = np.zeros((height, warp.size[1]), np.float32)
        self.last = np.zeros(warp.size, np.uint8)  # the frame it gave last


class Warp:
    """The lookup and area resize for one screen size and one output size, with its tables and
    scratch memory (shared by the envs of a process; each env has a :class:`WarpState`). Nothing is
    allocated per frame.

    :param screen: (height, width) of the index screens.
    :param size: (height, width) of the output frame.
    """

    def __init__(self, screen: tuple[int, int], size: tuple[int, int]) -> None:
        height, width = screen
        dheight, dwidth = size
        self.screen, self.size = screen, size
        self.x = area_table(width, dwidth)
        yd, ys, yw = area_table(height, dheight)
        # Each destination row's entries of the vertical table: yd is sorted, rows run ystart[d]:[d+1].
        self.y = (yd, ys, yw, np.searchsorted(yd, np.arange(dheight + 1)).astype(np.int32))
        # The horizontal table per destination column, padded to the most taps any column has.
        counts = np.bincount(self.x[0], minlength=dwidth)
        self.taps = np.zeros((counts.max(), dwidth), np.int32)
        self.weights = np.zeros((counts.max(), dwidth), np.float32)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for k, (d, s, w) in enumerate(zip(*self.x)):
            self.taps[k - first[d], d], self.weights[k - first[d], d] = s, w
        # Which destination columns a change in a source column reaches, and back (area_table's
        # entries are sorted by destination and by source alike): per source column the first
        # destination column it or a later column feeds and the last it or an earlier one feeds;
        # per destination column its first and last source column.
        dfirst = np.full(width, dwidth, np.int32)
        np.minimum.at(dfirst, self.x[1], self.x[0])
        dlast = np.full(width, -1, np.int32)
        np.maximum.at(dlast, self.x[1], self.x[0])
        self.cols = np.zeros((4, max(width, dwidth)), np.int32)
        self.cols[0, :width] = np.minimum.accumulate(dfirst[::-1])[::-1]
        self.cols[1, :width] = np.maximum.accumulate(dlast)
        self.cols[2, :dwidth] = [self.x[1][self.x[0] == d].min() for d in range(dwidth)]
        self.cols[3, :dwidth] = [self.x[1][self.x[0] == d].max() for d in range(dwidth)]
        self.scratch = (
            np.zeros(width, np.float32),
            np.zeros((width, height), np.float32),
            np.zeros((dwidth, height), np.float32),
            np.zeros(dwidth, np.float32),
            np.zeros((height, 2), np.int32),  # each row's span (see _changed_rows)
        )

    def state(self) -> WarpState:
        """A new env's rows (see :class:`WarpState`)."""
        return WarpState(self)

    def __call__(
        self, i0: np.ndarray, i1: np.ndarray, table: np.ndarray, out: np.ndarray, state: WarpState
    ) -> int:
        """Write the frame of index screens ``i0``/``i1`` through pair ``table`` into ``out``, a
        (height, width) uint8 array, for the env whose rows ``state`` holds; the rows recomputed."""
        return warp_frame(
            i0, i1, table, out, state.prev, state.valid, state.buf, state.last, *self.scratch,
            self.x, self.taps, self.weights, self.y, self.cols,
        )  # fmt: skip

    def agrees_with_opencv(self, colours: np.ndarray, table: np.ndarray, frames: int = 12) -> bool:
        """Whether this warp equals OpenCV's own chain (``colours`` of the indices, channel-wise max,
        ``cvtColor`` to gray for RGB colours, ``cv2.resize(..., INTER_AREA)``) on random and
        structured screens, each computed whole and then again with a few of its rows changed (the
        rows recomputed alone).

        :param colours: (256, 3) colours for a table built by ``cvtColor``, or (256,) gray values
            for one built as the max of gray values.
        """
        import cv2

        out = np.zeros(self.size, np.uint8)
        dsize = (self.size[1], self.size[0])
        state = self.state()
        for i0, i1, recomputed in screen_pairs(self.screen, frames):
            if recomputed == self.screen[0]:
                state = self.state()
            pooled = np.maximum(colours[i0], colours[i1])
            gray = cv2.cvtColor(pooled, cv2.COLOR_RGB2GRAY) if pooled.ndim == 3 else pooled
            if self(i0, i1, table, out, state) != recomputed:
                return False
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
