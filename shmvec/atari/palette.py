"""ALE's NTSC palette, read off ALE itself, and the per-pixel tables the native Atari paths use.

ALE's screen is a 210x160 array of palette indices (``ale.getScreen``, 0.3 µs); ``getScreenRGB``
(14 µs) turns each index into a colour through a fixed palette. SB3's native step path grabs
indices only, and turns the two frames its max-pool needs into one gray frame with one table lookup
per pixel: ``gray_of_max()[a << 8 | b]`` is what ``MaxAndSkipEnv`` and ``WarpFrame`` make of a pixel
whose colour is index ``a`` in one frame and ``b`` in the other (OpenCV's gray of the channel-wise
max of the two colours). The table is computed with OpenCV from the palette: OpenCV's own results,
not its formula restated.

The palette below was read off ALE (``python -m shmvec.atari.palette``: every game ale-py ships,
3,000 frames each, the index and colour of every pixel of every 5th frame; all 128 NTSC colours
appear, and no index ever showed two colours). The TIA ignores the lowest bit of a colour register,
so NTSC games show even indices only; odd entries are unused. Games in ALE's PAL format (screens of
250 rows) use another palette: the native path leaves them alone, and checks each game's first
frame against ``getScreenRGB`` besides (tests/test_atari_kernels.py checks many more).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np

# Colour (0xRRGGBB) of each even palette index 0, 2, ..., 254, in order.
# Regenerate: python -m shmvec.atari.palette
NTSC_RGB = (
    0x000000, 0x4A4A4A, 0x6F6F6F, 0x8E8E8E, 0xAAAAAA, 0xC0C0C0, 0xD6D6D6, 0xECECEC,
    0x484800, 0x69690F, 0x86861D, 0xA2A22A, 0xBBBB35, 0xD2D240, 0xE8E84A, 0xFCFC54,
    0x7C2C00, 0x904811, 0xA26221, 0xB47A30, 0xC3903D, 0xD2A44A, 0xDFB755, 0xECC860,
    0x901C00, 0xA33915, 0xB55328, 0xC66C3A, 0xD5824A, 0xE39759, 0xF0AA67, 0xFCBC74,
    0x940000, 0xA71A1A, 0xB83232, 0xC84848, 0xD65C5C, 0xE46F6F, 0xF08080, 0xFC9090,
    0x840064, 0x97197A, 0xA8308F, 0xB846A2, 0xC659B3, 0xD46CC3, 0xE07CD2, 0xEC8CE0,
    0x500084, 0x68199A, 0x7D30AD, 0x9246C0, 0xA459D0, 0xB56CE0, 0xC57CEE, 0xD48CFC,
    0x140090, 0x331AA3, 0x4E32B5, 0x6848C6, 0x7F5CD5, 0x956FE3, 0xA980F0, 0xBC90FC,
    0x000094, 0x181AA7, 0x2D32B8, 0x4248C8, 0x545CD6, 0x656FE4, 0x7580F0, 0x8490FC,
    0x001C88, 0x183B9D, 0x2D57B0, 0x4272C2, 0x548AD2, 0x65A0E1, 0x75B5EF, 0x84C8FC,
    0x003064, 0x185080, 0x2D6D98, 0x4288B0, 0x54A0C5, 0x65B7D9, 0x75CCEB, 0x84E0FC,
    0x004030, 0x18624E, 0x2D8169, 0x429E82, 0x54B899, 0x65D1AE, 0x75E7C2, 0x84FCD4,
    0x004400, 0x1A661A, 0x328432, 0x48A048, 0x5CBA5C, 0x6FD26F, 0x80E880, 0x90FC90,
    0x143C00, 0x355F18, 0x527E2D, 0x6E9C42, 0x87B754, 0x9ED065, 0xB4E775, 0xC8FC84,
    0x303800, 0x505916, 0x6D762B, 0x88923E, 0xA0AB4F, 0xB7C25F, 0xCCD86E, 0xE0EC7C,
    0x482C00, 0x694D14, 0x866A26, 0xA28638, 0xBB9F47, 0xD2B656, 0xE8CC63, 0xFCE070,
)  # fmt: skip

#: Screen height of games in ALE's PAL format (another palette): the native path leaves them alone.
PAL_HEIGHT = 250


def rgb_palette() -> np.ndarray:
    """(256, 3) uint8: the colour of each palette index (odd indices, which NTSC games never show,
    black)."""
    rgb = np.zeros((256, 3), np.uint8)
    for k, colour in enumerate(NTSC_RGB):
        rgb[2 * k] = (colour >> 16) & 0xFF, (colour >> 8) & 0xFF, colour & 0xFF
    return rgb


@functools.cache
def gray_of_max() -> np.ndarray:
    """(65536,) uint8: ``cv2.cvtColor(max(rgb[a], rgb[b]), COLOR_RGB2GRAY)`` at ``a << 8 | b``: SB3's
    max-pool of two RGB frames followed by ``WarpFrame``'s conversion, per pixel."""
    import cv2

    rgb = rgb_palette()
    pairs = np.maximum(rgb[:, None, :], rgb[None, :, :])  # (256, 256, 3)
    table = cv2.cvtColor(np.ascontiguousarray(pairs), cv2.COLOR_RGB2GRAY).reshape(-1)
    table.flags.writeable = False
    return table


@functools.cache
def channel_max() -> np.ndarray:
    """(3, 65536) uint8: ``max(rgb[a, c], rgb[b, c])`` at ``[c, a << 8 | b]``: one channel of the
    max-pool of two RGB frames, per pixel (the frames Gymnasium's ``ResizeObservation`` resizes)."""
    rgb = rgb_palette()
    table = np.maximum(rgb[:, None, :], rgb[None, :, :]).reshape(-1, 3).T.copy()
    table.flags.writeable = False
    return table


def read_off_ale(games: Iterable[str] | None = None, frames: int = 3000, every: int = 5) -> dict[int, int]:
    """Index -> colour (0xRRGGBB) of every pixel ALE showed in ``frames`` frames of random play of
    each NTSC game (default: every game ale-py ships), reading every ``every``-th frame.

    :raises ValueError: if one index ever showed two colours.
    """
    import ale_py
    from ale_py import roms

    from shmvec.atari.fingerprints import act_strength

    strength = act_strength()
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    seen: dict[int, int] = {}
    rng = np.random.default_rng(0)
    # ale-py registers no single-player game for these ROMs (see ale_py.registration).
    skip = {"combat", "joust", "maze_craze", "warlords"}
    for game in games if games is not None else roms.get_all_rom_ids():
        if game in skip:
            continue
        path = roms.get_rom_path(game)
        if path is None:
            continue
        ale = ale_py.ALEInterface()
        ale.setInt("random_seed", 0)
        ale.loadROM(path)
        height, width = ale.getScreenDims()
        if height == PAL_HEIGHT:
            continue
        idx, rgb = np.zeros((height, width), np.uint8), np.zeros((height, width, 3), np.uint8)
        actions = ale.getLegalActionSet()
        for f in range(frames):
            ale.act(actions[rng.integers(len(actions))], *strength)
            if ale.game_over():
                ale.reset_game()
            if f % every:
                continue
            ale.getScreen(idx)
            ale.getScreenRGB(rgb)
            values, first = np.unique(idx, return_index=True)
            colours = rgb.reshape(-1, 3)[first].astype(np.int64)
            packed = colours[:, 0] << 16 | colours[:, 1] << 8 | colours[:, 2]
            for value, colour in zip(values.tolist(), packed.tolist()):
                if seen.setdefault(value, colour) != colour:
                    raise ValueError(f"{game}: index {value} shows {colour:06x} and {seen[value]:06x}")
    return seen


def main() -> None:
    """Print :data:`NTSC_RGB` as read off ALE (for this module's source)."""
    seen = read_off_ale()
    missing = [i for i in range(0, 256, 2) if i not in seen]
    odd = sorted(i for i in seen if i % 2)
    if missing or odd:
        raise SystemExit(f"incomplete palette: missing even indices {missing}, odd indices seen {odd}")
    rows = [", ".join(f"0x{seen[i]:06X}" for i in range(r, r + 16, 2)) for r in range(0, 256, 16)]
    print("NTSC_RGB = (\n" + "".join(f"    {row},\n" for row in rows) + ")  # fmt: skip")


if __name__ == "__main__":
    main()
