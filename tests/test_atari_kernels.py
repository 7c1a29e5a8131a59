"""The pieces of the native Atari path against ALE, OpenCV and NumPy: the palette, the gray-of-max
table, the area resize, on real ALE screens of several games and on random screens."""

from __future__ import annotations

import ale_py  # the atari extra: a core install (tests/core_suite.py) leaves this module out
import cv2
import numpy as np
import pytest
from ale_py import roms
from hypothesis import given, settings
from hypothesis import strategies as st

from shmvec.atari import palette
from shmvec.atari.frames import ChannelsFrame, weighted_gray
from shmvec.atari.warp import MAX, Warp, area_table, checked, colour

GAMES = ["pong", "breakout", "space_invaders", "ms_pacman", "seaquest", "qbert", "montezuma_revenge"]


def _screens(game: str, frames: int = 400, every: int = 3):
    """(index screen, RGB screen, gray screen) of every ``every``-th frame of random play."""
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", 1)
    ale.loadROM(roms.get_rom_path(game))
    actions = ale.getMinimalActionSet()
    rng = np.random.default_rng(1)
    for f in range(frames):
        ale.act(actions[rng.integers(len(actions))], 1.0)
        if ale.game_over():
            ale.reset_game()
        if f % every == 0:
            yield ale.getScreen(), ale.getScreenRGB(), ale.getScreenGrayscale()


@pytest.mark.parametrize("game", GAMES)
def test_palette_and_kernels_on_real_screens(game):
    rgb = palette.rgb_palette()
    table = palette.gray_of_max()
    sb3 = checked((210, 160), (84, 84), colour=True)
    gym = checked((210, 160), (84, 84), colour=False)
    assert sb3 is not None and gym is not None
    out = np.zeros((84, 84), np.uint8)
    rows_sb3, rows_gym = sb3.state(), gym.state()  # rows kept from frame to frame, as an env's
    coloured = np.zeros((210, 160, 3), np.uint8)
    previous = None
    for idx, screen, gray in _screens(game):
        assert np.array_equal(rgb[idx], screen), "palette != getScreenRGB"
        colour(idx, rgb, coloured)
        assert np.array_equal(coloured, screen), "colour() != getScreenRGB"
        if previous is not None:
            # SB3: max of two RGB frames, cvtColor, INTER_AREA.
            prev_idx, prev_screen, prev_gray = previous
            want = cv2.resize(
                cv2.cvtColor(np.maximum(prev_screen, screen), cv2.COLOR_RGB2GRAY),
                (84, 84),
                interpolation=cv2.INTER_AREA,
            )
            sb3(prev_idx, idx, table, out, rows_sb3)
            assert np.array_equal(out, want), "SB3 warp"
            # Gymnasium: max of two ALE gray frames, INTER_AREA.
            pooled = np.maximum(prev_gray, gray)
            gym(pooled, pooled, MAX, out, rows_gym)
            assert np.array_equal(out, cv2.resize(pooled, (84, 84), interpolation=cv2.INTER_AREA)), "gym warp"
        previous = idx, screen, gray


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.sampled_from([(84, 84), (64, 64), (96, 96), (42, 42), (84, 120), (100, 37)]),
    flat=st.booleans(),
)
def test_warp_and_cleanrl_stage_equal_opencv_on_random_screens(seed, size, flat):
    rng = np.random.default_rng(seed)
    i0 = rng.integers(0, 128, (210, 160), dtype=np.uint8) * 2
    i1 = rng.integers(0, 128, (210, 160), dtype=np.uint8) * 2
    if flat:  # few colours in large areas, as game screens have
        i0 = (i0 // 64) * 64
        i1 = np.where(rng.random((210, 160)) < 0.9, i0, i1)
    rgb = palette.rgb_palette()
    want = cv2.resize(
        cv2.cvtColor(np.maximum(rgb[i0], rgb[i1]), cv2.COLOR_RGB2GRAY),
        size[::-1],
        interpolation=cv2.INTER_AREA,
    )
    out = np.zeros(size, np.uint8)
    warp = Warp((210, 160), size)
    warp(i0, i1, palette.gray_of_max(), out, warp.state())
    assert np.array_equal(out, want), "SB3 warp"
    # CleanRL's chain: ResizeObservation of the RGB max, then GrayscaleObservation's float sum.
    resized = cv2.resize(np.maximum(rgb[i0], rgb[i1]), size[::-1], interpolation=cv2.INTER_AREA)
    stage = ChannelsFrame(warp)
    stage(i0, i1, out)
    assert np.array_equal(
        out, np.sum(np.multiply(resized, [0.2125, 0.7154, 0.0721]), axis=-1).astype(np.uint8)
    )
    assert stage.agrees(*_gymnasium_functions(size)), "against the wrappers' own functions"


def test_area_table_matches_opencv_one_axis():
    # A 1-row resize exercises one axis' table alone: weights and order as OpenCV's.
    src = np.random.default_rng(0).integers(0, 256, (1, 160), dtype=np.uint8)
    dst, idx, weight = area_table(160, 84)
    row = np.zeros(84, np.float32)
    for d, s, w in zip(dst, idx, weight):
        row[d] += np.float32(src[0, s]) * w
    want = cv2.resize(src, (84, 1), interpolation=cv2.INTER_AREA)[0]
    assert np.array_equal(np.clip(np.rint(row), 0, 255).astype(np.uint8), want)


@pytest.mark.parametrize("screen", [(210, 160), (210, 150)])
@pytest.mark.parametrize("colour", [True, False])
def test_warp_kept_from_frame_to_frame_equals_opencv(screen, colour):
    # Whole screens, then rows changed, then sprites moved (a few columns of a few rows): from one
    # frame to the next only the changed columns' pixels are recomputed. A width that is not a
    # multiple of 8 takes the per-pixel comparison.
    warp = Warp(screen, (84, 60))
    colours, table = (
        (palette.rgb_palette(), palette.gray_of_max()) if colour else (np.arange(256, dtype=np.uint8), MAX)
    )
    assert warp.agrees_with_opencv(colours, table, frames=40)


def test_sizes_opencv_resizes_otherwise_are_refused():
    assert checked((210, 160), (105, 80), colour=True) is None  # whole factors: OpenCV's fast path
    assert checked((210, 160), (10, 10), colour=True) is None
    assert checked((210, 160), (220, 84), colour=True) is None  # an enlargement
    assert checked((210, 160), (84, 84), colour=True) is not None


def test_palette_is_complete_and_read_off_ale():
    """Every NTSC colour, and the table in the source is what ALE shows (a few games, quickly)."""
    seen = palette.read_off_ale(["pong", "breakout", "ms_pacman"], frames=300, every=10)
    rgb = palette.rgb_palette()
    for index, packed in seen.items():
        assert index % 2 == 0
        assert tuple(rgb[index]) == ((packed >> 16) & 255, (packed >> 8) & 255, packed & 255)
    assert len(palette.NTSC_RGB) == 128 and len(set(palette.NTSC_RGB)) == 128


# ---------------------------------------------------------------- CleanRL's chain: resize, then gray


def _gymnasium_functions(size: tuple[int, int]):
    """Gymnasium's own ``ResizeObservation`` and ``GrayscaleObservation`` functions (OpenCV and
    NumPy), as CleanRL's chain stacks them over a (210, 160, 3) screen."""
    import gymnasium as gym

    from shmvec.synthetic import SyntheticImageEnv

    resize = gym.wrappers.ResizeObservation(SyntheticImageEnv((210, 160, 3)), size)
    gray = gym.wrappers.GrayscaleObservation(resize)
    return resize.func, gray.func


def test_weighted_gray_equals_grayscale_observation_on_every_colour():
    _, gray = _gymnasium_functions((84, 84))
    planes = np.zeros((3, 256, 256), np.uint8)
    planes[1], planes[2] = np.arange(256)[:, None], np.arange(256)[None, :]
    out = np.zeros((256, 256), np.uint8)
    for red in range(256):  # all 2**24 colours, 65,536 at a time
        planes[0] = red
        weighted_gray(planes, out)
        assert np.array_equal(out, gray(np.ascontiguousarray(planes.transpose(1, 2, 0)))), f"red {red}"


@pytest.mark.parametrize("game", GAMES)
def test_channels_frame_on_real_screens(game):
    resize, gray = _gymnasium_functions((84, 84))
    warp = checked((210, 160), (84, 84), colour=False)
    assert warp is not None
    stage = ChannelsFrame(warp)  # rows kept from frame to frame, as an env's
    out = np.zeros((84, 84), np.uint8)
    previous = None
    for idx, screen, _ in _screens(game):
        if previous is not None:
            stage(previous[0], idx, out)
            assert np.array_equal(out, gray(resize(np.maximum(previous[1], screen)))), "CleanRL stage"
        previous = idx, screen
