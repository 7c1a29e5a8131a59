"""SB3's Atari recipe stepped without its Python wrappers, exactly as the wrappers step it.

``make_atari_env`` builds ``AtariWrapper(Monitor(gym.make(id)))``; per agent step that is eight
Python wrappers and, per emulator frame, an RGB screen grabbed and allocated (14 µs), then
``cvtColor`` and an area resize (~50 µs). :class:`Sb3AtariStep` runs the same step as one loop over
the frames: ``ale.act``, the game-over and truncation flags, ``Monitor``'s per-frame bookkeeping and
``TimeLimit``'s count as those wrappers do them, palette indices (0.3 µs) of only the two frames
``MaxAndSkipEnv`` keeps, and :class:`~shmvec.atari.warp.Warp` for the max-pool, gray conversion and
resize in one numba call; ``EpisodicLifeEnv``'s lives and ``ClipRewardEnv``'s sign at the end. The
wrappers' own state is kept as they would keep it (``Monitor``'s lists and CSV rows, the lives,
``StickyActionEnv``'s action, ``TimeLimit``'s count); ``MaxAndSkipEnv``'s RGB frame buffer alone is
kept as palette indices and written back before anything else touches the env (:meth:`sync`).
Resets, a step the wrappers must check (the first two, ``OrderEnforcing``), and a game whose palette
is not ALE's NTSC one go through the wrappers.

Recognised (outermost first; ``[...]`` may be absent, as ``AtariWrapper``'s parameters decide):
``[AtariWrapper]``, ``[ClipRewardEnv]``, ``WarpFrame``, ``[FireResetEnv]``, ``[EpisodicLifeEnv]``,
``[MaxAndSkipEnv]``, ``[NoopResetEnv]``, ``[StickyActionEnv]``, ``[Monitor]``, Gymnasium's
``[TimeLimit]``, ``[OrderEnforcing]``, ``[PassiveEnvChecker]``, and ale-py's ``AtariEnv`` with RGB
observations and a fixed frame skip (``*NoFrameskip-v4``; ``ALE/*-v5`` with ``frameskip=1``, its
sticky actions happen inside ALE). Each class exactly (not a subclass), each step method with a
source fingerprint this module was checked against (:data:`KNOWN`).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.atari import palette
from shmvec.atari.emulator import Emulator, emulator, unknown_code
from shmvec.atari.warp import Warp, checked, colour
from shmvec.native import StepInto, class_name, is_exactly

SB3 = "stable_baselines3.common.atari_wrappers."
MONITOR = "stable_baselines3.common.monitor.Monitor"
# ClipRewardEnv's np.sign of a float sum of whole ALE rewards, by (sum > 0) - (sum < 0): the same
# np.float64 values at a tuple lookup's cost.
_SIGN = (np.float64(0.0), np.float64(1.0), np.float64(-1.0))
# SB3's wrappers as AtariWrapper stacks them, outermost first: (name, may be absent).
CHAIN = (
    ("AtariWrapper", True),
    ("ClipRewardEnv", True),
    ("WarpFrame", False),
    ("FireResetEnv", True),
    ("EpisodicLifeEnv", True),
    ("MaxAndSkipEnv", True),
    ("NoopResetEnv", True),
    ("StickyActionEnv", True),
)


def recognise(env: gym.Env) -> tuple[Sb3AtariStep | None, str | None]:
    """The native step of ``env`` if it is SB3's Atari recipe (module docstring), else None and the
    reason."""
    found: dict[str, Any] = {}
    layer: Any = env
    for name, optional in CHAIN:
        if is_exactly(layer, SB3 + name):
            found[name] = layer
            layer = layer.env
        elif not optional:
            return None, f"{class_name(layer)} where SB3's WarpFrame was expected"
    if is_exactly(layer, MONITOR):
        found["Monitor"] = layer
        layer = layer.env
    emu, reason = emulator(layer)
    if emu is None:
        return None, reason
    if emu.atari._obs_type != "rgb":
        return None, "AtariEnv with grayscale observations under SB3's wrappers"
    space = found["WarpFrame"].observation_space
    if space.dtype != np.uint8 or len(space.shape) != 3 or space.shape[2] != 1:
        return None, f"WarpFrame's observation space {space} is not (height, width, 1) uint8"
    code = unknown_code(list(found.values()))
    if code is not None:
        return None, f"{code} differs from the versions shmvec's native Atari step was checked against"
    warp = checked(tuple(emu.ale.getScreenDims()), space.shape[:2], colour=True)
    if warp is None:
        return None, f"this OpenCV's INTER_AREA resize to {space.shape[:2]} is not the one shmvec restates"
    return Sb3AtariStep(env, found, emu, warp), None


class Sb3AtariStep:
    """One env of SB3's Atari recipe, stepped natively (see the module docstring).

    :param env: the outermost wrapper.
    :param found: SB3's wrappers (and ``Monitor``) by class name.
    :param emu: the ``AtariEnv`` under them, with Gymnasium's wrappers.
    :param warp: the frame warp for its screen and output sizes.
    """

    path = "sb3-atari"

    def __init__(self, env: gym.Env, found: dict[str, Any], emu: Emulator, warp: Warp) -> None:
        self.env, self.emu, self.warp = env, emu, warp
        self.ale = emu.ale
        self.warp_frame = found["WarpFrame"]
        self.monitor = found.get("Monitor")
        self.sticky = found.get("StickyActionEnv")
        self.max_skip = found.get("MaxAndSkipEnv")
        self.skip: int = 1 if self.max_skip is None else self.max_skip._skip
        self.life = found.get("EpisodicLifeEnv")
        self.clip = "ClipRewardEnv" in found
        self.rgb = palette.rgb_palette()
        self.table = palette.gray_of_max()
        self.idx = np.zeros((2, *warp.screen), np.uint8)
        self.screens = list(self.idx)  # its two halves, as views made once
        self.rows = warp.state()
        # Which entries of MaxAndSkipEnv's buffer hold their frame only as indices in self.idx.
        self.in_idx = [False, False]
        self.palette_checked = False
        self.off: str | None = None  # why this env steps through its wrappers for good

    def _ready(self) -> bool:
        if self.off is not None or not self.emu.layers.ready():
            return False
        if self.monitor is not None and self.monitor.needs_reset:
            return False  # Monitor.step raises its own error
        if not self.palette_checked:
            self.palette_checked = True
            screen = self.ale.getScreenRGB()
            if not np.array_equal(self.rgb[self.ale.getScreen()], screen):
                self.off = "the game's colours are not ALE's NTSC palette"
        return self.off is None

    def step_into(self, action: Any, out: np.ndarray) -> StepInto:
        """One agent step of the recipe; the 84x84x1 frame goes into ``out``."""
        if not self._ready():
            return self._through_wrappers(action, out)
        ale, frame, screens = self.ale, self.emu.frame, self.screens
        skip, monitor, sticky = self.skip, self.monitor, self.sticky
        rewards = None if monitor is None else monitor.rewards
        info: dict[str, Any] | None = None
        total = 0.0
        terminated = truncated = False
        for i in range(skip):
            # StickyActionEnv, then Monitor, TimeLimit, OrderEnforcing, PassiveEnvChecker, AtariEnv.
            a = action
            if sticky is not None:
                if sticky.np_random.random() >= sticky.action_repeat_probability:
                    sticky._sticky_action = action
                a = sticky._sticky_action
            reward, terminated, truncated = frame(a)
            done = terminated or truncated
            if done:
                info = self.emu.info()
            if rewards is not None:
                rewards.append(float(reward))
                if done:
                    self._episode_end(info)  # type: ignore[arg-type]
                monitor.total_steps += 1  # type: ignore[union-attr]
            # MaxAndSkipEnv keeps the screens of the last two frames.
            if i >= skip - 2:
                e = i - skip + 2
                ale.getScreen(screens[e])
                self.in_idx[e] = True
            total += float(reward)
            if done:
                break
        if info is None:
            info = self.emu.info()
        if self.life is not None:
            life = self.life
            life.was_real_done = terminated or truncated
            lives = ale.lives()
            if 0 < lives < life.lives:
                terminated = True
            life.lives = lives
        self._frame(out)
        return (_SIGN[(total > 0) - (total < 0)] if self.clip else total), terminated, truncated, info

    def _through_wrappers(self, action: Any, out: np.ndarray) -> StepInto:
        self.sync()
        obs, reward, terminated, truncated, info = self.env.step(action)
        out[...] = obs
        return reward, terminated, truncated, info

    def _episode_end(self, info: dict[str, Any]) -> None:
        """What ``Monitor.step`` does when an episode ends."""
        m: Any = self.monitor
        m.needs_reset = True
        ep_rew = sum(m.rewards)
        ep_len = len(m.rewards)
        ep_info = {"r": round(ep_rew, 6), "l": ep_len, "t": round(time.time() - m.t_start, 6)}
        for key in m.info_keywords:
            ep_info[key] = info[key]
        m.episode_returns.append(ep_rew)
        m.episode_lengths.append(ep_len)
        m.episode_times.append(time.time() - m.t_start)
        ep_info.update(m.current_reset_info)
        if m.results_writer:
            m.results_writer.write_row(ep_info)
        info["episode"] = ep_info

    def _frame(self, out: np.ndarray) -> None:
        """WarpFrame of MaxAndSkipEnv's max (or of the one frame without it) into ``out``."""
        if self.max_skip is None:
            self.warp(self.idx[1], self.idx[1], self.table, out.reshape(out.shape[:2]), self.rows)
        elif all(self.in_idx):
            self.warp(self.idx[0], self.idx[1], self.table, out.reshape(out.shape[:2]), self.rows)
        else:
            # An episode ended before the step's second-last frame and a frame the max needs came
            # from the wrappers (a reset's steps): the wrappers' own code on their own buffer.
            self.sync()
            out[...] = self.warp_frame.observation(self.max_skip._obs_buffer.max(axis=0))

    def sync(self) -> None:
        """Write MaxAndSkipEnv's frames held as indices back into its RGB buffer (before anything
        but :meth:`step_into` touches the env, and before the wrappers' own code reads it)."""
        for e in (0, 1):
            if self.in_idx[e]:
                if self.max_skip is not None:
                    colour(self.idx[e], self.rgb, self.max_skip._obs_buffer[e])
                self.in_idx[e] = False
