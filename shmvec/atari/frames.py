"""The observation a native Atari step makes of the two index screens ``MaxAndSkipEnv`` max-pools.

- :class:`GrayFrame`: SB3's ``WarpFrame`` (``cvtColor`` to gray, then an area resize): one
  :class:`~shmvec.atari.warp.Warp` through :func:`~shmvec.atari.palette.gray_of_max`.
- :class:`ChannelsFrame`: Gymnasium's ``ResizeObservation`` (an area resize of the RGB frame) then
  ``GrayscaleObservation`` (a float64 weighted sum of the channels, cast to uint8), as CleanRL's
  ``ppo_atari.py`` stacks them: one warp per channel through
  :func:`~shmvec.atari.palette.channel_max` (OpenCV resizes each channel of an RGB image alone, in
  the same float32 order), then :func:`weighted_gray`, the wrapper's sum in NumPy's order.

Each stage checks itself against the wrappers' own functions on test screens when it is built
(:meth:`ChannelsFrame.agrees`; the warp against OpenCV: :func:`~shmvec.atari.warp.checked`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from shmvec.atari import palette
from shmvec.atari.warp import Warp, screen_pairs

# GrayscaleObservation's weights, as its source writes them (emulator.KNOWN holds its fingerprint).
_R, _G, _B = 0.2125, 0.7154, 0.0721


@numba.njit(cache=True, nogil=True, boundscheck=False)
def weighted_gray(planes: np.ndarray, out: np.ndarray) -> None:
    """``np.sum(np.multiply(rgb, [0.2125, 0.7154, 0.0721]), axis=-1).astype(np.uint8)`` of the
    (3, height, width) channel ``planes``: float64 products, summed left to right (NumPy's sum of
    three), truncated to uint8 (the sum never leaves [0, 255.0000000000001))."""
    for y in range(out.shape[0]):
        for x in range(out.shape[1]):
            out[y, x] = np.uint8(planes[0, y, x] * _R + planes[1, y, x] * _G + planes[2, y, x] * _B)


class GrayFrame:
    """SB3's ``WarpFrame`` of the max of two index screens.

    :param warp: the resize for the screen and output sizes.
    """

    def __init__(self, warp: Warp) -> None:
        self.warp, self.table, self.rows = warp, palette.gray_of_max(), warp.state()

    def __call__(self, i0: np.ndarray, i1: np.ndarray, out: np.ndarray) -> None:
        """Write the frame into ``out`` (any shape of ``warp.size``'s pixels)."""
        self.warp(i0, i1, self.table, out.reshape(self.warp.size), self.rows)


class ChannelsFrame:
    """Gymnasium's ``GrayscaleObservation`` of its ``ResizeObservation`` of the RGB max of two
    index screens.

    :param warp: the resize for the screen and output sizes.
    """

    def __init__(self, warp: Warp) -> None:
        self.warp, self.tables = warp, palette.channel_max()
        self.rows = [warp.state() for _ in range(3)]  # each channel's rows, kept from frame to frame
        self.planes = np.zeros((3, *warp.size), np.uint8)

    def __call__(self, i0: np.ndarray, i1: np.ndarray, out: np.ndarray) -> None:
        """Write the frame into ``out`` (any shape of ``warp.size``'s pixels)."""
        for c in range(3):
            self.warp(i0, i1, self.tables[c], self.planes[c], self.rows[c])
        weighted_gray(self.planes, out.reshape(self.warp.size))

    def agrees(self, resize: Callable[[np.ndarray], Any], gray: Callable[[np.ndarray], Any]) -> bool:
        """Whether this stage gives ``gray(resize(rgb max))`` (the wrappers' own functions) on the
        test screens of :func:`~shmvec.atari.warp.screen_pairs` (from fresh rows for each pair)."""
        rgb = palette.rgb_palette()
        out = np.zeros(self.warp.size, np.uint8)
        stage = self
        for i0, i1, recomputed in screen_pairs(self.warp.screen, 6):
            if recomputed == self.warp.screen[0]:
                stage = ChannelsFrame(self.warp)
            stage(i0, i1, out)
            want = np.asarray(gray(resize(np.maximum(rgb[i0], rgb[i1]))))
            if not np.array_equal(out, want.reshape(out.shape)):
                return False
        return True
