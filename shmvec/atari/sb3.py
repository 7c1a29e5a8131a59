"""SB3's Atari recipe, and CleanRL's ``ppo_atari.py`` chain, stepped without their Python wrappers,
exactly as the wrappers step them.

``make_atari_env`` builds ``AtariWrapper(Monitor(gym.make(id)))``; per agent step that is eight
Python wrappers and, per emulator frame, an RGB screen grabbed and allocated (14 µs), then
``cvtColor`` and an area resize (~50 µs). :class:`AtariStep` runs the same step as one loop over
the frames: ``ale.act``, the game-over and truncation flags, the episode record's per-frame
bookkeeping (:mod:`shmvec.atari.records`) and ``TimeLimit``'s count as those wrappers do them,
palette indices (0.3 µs) of only the two frames ``MaxAndSkipEnv`` keeps, and the frame stage
(:mod:`shmvec.atari.frames`) for the max-pool, gray conversion and resize in numba; ``EpisodicLifeEnv``'s
lives and ``ClipRewardEnv``'s sign at the end. The wrappers' own state is kept as they would keep it
(the record's lists, queues and CSV rows, the lives, ``StickyActionEnv``'s action, ``TimeLimit``'s
count); ``MaxAndSkipEnv``'s RGB frame buffer alone is kept as palette indices and written back
before anything else touches the env (:meth:`AtariStep.sync`). The most frequent reset, a life lost
while the game goes on (``EpisodicLifeEnv``: a no-op step, then ``FireResetEnv``'s two steps), is
stepped the same way (:meth:`AtariStep.reset`); other resets, a step the wrappers must check (the
first two, ``OrderEnforcing``), and a game whose palette is not ALE's NTSC one go through the
wrappers.

Recognised (outermost first; ``[...]`` may be absent), each class exactly (not a subclass), each
method a native step restates with a source fingerprint it was checked against
(:data:`~shmvec.atari.fingerprints.KNOWN`):

- ``"sb3-atari"``, SB3's recipe as ``AtariWrapper``'s parameters stack it: ``[AtariWrapper]``,
  ``[ClipRewardEnv]``, ``WarpFrame``, ``[FireResetEnv]``, ``[EpisodicLifeEnv]``,
  ``[MaxAndSkipEnv]``, ``[NoopResetEnv]``, ``[StickyActionEnv]``, ``[Monitor]``;
- ``"cleanrl-atari"``, CleanRL's chain as it reads with Gymnasium 1.x's names (SB3's wrappers under
  Gymnasium's): ``GrayscaleObservation``, ``ResizeObservation`` (any size OpenCV resizes by its
  general area method), ``[ClipRewardEnv]``, ``[FireResetEnv]``, ``[EpisodicLifeEnv]``,
  ``[MaxAndSkipEnv]``, ``[NoopResetEnv]``, ``[RecordEpisodeStatistics]``;

either with ``FrameStackObservation`` on top (path ``+frame-stack-observation``), over Gymnasium's
``[TimeLimit]``, ``[OrderEnforcing]``, ``[PassiveEnvChecker]`` and ale-py's ``AtariEnv`` with RGB
observations and a fixed frame skip (``*NoFrameskip-v4``; ``ALE/*-v5`` with ``frameskip=1``, its
sticky actions happen inside ALE).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.atari import palette, records
from shmvec.atari.emulator import METHODS, Emulator, emulator
from shmvec.atari.fingerprints import unchecked_status, unknown_code
from shmvec.atari.frames import ChannelsFrame, GrayFrame
from shmvec.atari.preprocessing import FRAME_STACK, StackedObservationStep
from shmvec.atari.warp import checked, colour
from shmvec.native import NativeStatus, StepInto, class_name, is_exactly, through_wrappers

SB3 = "stable_baselines3.common.atari_wrappers."
GYM = "gymnasium.wrappers.transform_observation."
# ClipRewardEnv's np.sign of a float sum of whole ALE rewards, by (sum > 0) - (sum < 0): the same
# np.float64 values at a tuple lookup's cost.
_SIGN = (np.float64(0.0), np.float64(1.0), np.float64(-1.0))
# Each chain as its builder stacks it, outermost first: (class, may be absent); then its record.
_UNDER_FRAME = ("FireResetEnv", "EpisodicLifeEnv", "MaxAndSkipEnv", "NoopResetEnv")
CHAINS = {
    "sb3-atari": (
        tuple((SB3 + name, True) for name in ("AtariWrapper", "ClipRewardEnv"))
        + ((SB3 + "WarpFrame", False),)
        + tuple((SB3 + name, True) for name in (*_UNDER_FRAME, "StickyActionEnv")),
        records.MONITOR,
    ),
    "cleanrl-atari": (
        (
            (GYM + "GrayscaleObservation", False),
            (GYM + "ResizeObservation", False),
            (SB3 + "ClipRewardEnv", True),
        )
        + tuple((SB3 + name, True) for name in _UNDER_FRAME),
        records.EPISODE_STATISTICS,
    ),
}
_ATARI_INFO = ("lives", "episode_frame_number", "frame_number")
# The wrappers whose reset a life-loss reset passes through, from the top down to EpisodicLifeEnv.
_ABOVE_LIFE = (
    "AtariWrapper", "ClipRewardEnv", "WarpFrame", "ResizeObservation", "GrayscaleObservation",
    "FireResetEnv", "EpisodicLifeEnv",
)  # fmt: skip


def recognise(env: gym.Env) -> tuple[Any, NativeStatus]:
    """The native step of ``env`` if it is one of the chains of the module docstring (with
    ``FrameStackObservation`` on top, optionally) and its status, else None and the status saying
    why not."""
    if is_exactly(env, FRAME_STACK):
        inner, status = recognise(env.env)  # type: ignore[attr-defined]
        names = [name for name, _ in status.unchecked] + unknown_code([env], METHODS)
        if names and (inner is not None or status.unchecked):
            return None, unchecked_status(names)
        if inner is None:
            return None, status
        if isinstance(inner, StackedObservationStep):
            return None, NativeStatus(None, "FrameStackObservation over FrameStackObservation")
        stacked = StackedObservationStep(env, inner)
        return stacked, NativeStatus(stacked.path)
    path = "cleanrl-atari" if is_exactly(env, GYM + "GrayscaleObservation") else "sb3-atari"
    chain, record_name = CHAINS[path]
    found: dict[str, Any] = {}
    layer: Any = env
    for name, optional in chain:
        if is_exactly(layer, name):
            found[name.rsplit(".", 1)[1]] = layer
            layer = layer.env
        elif not optional:
            return None, NativeStatus(None, f"{class_name(layer)} where {name} was expected")
    record = records.record(layer) if is_exactly(layer, record_name) else None
    if record is not None:
        found[record_name.rsplit(".", 1)[1]] = layer
        layer = layer.env
    emu, reason = emulator(layer)
    if emu is None:
        return None, NativeStatus(None, reason)
    if emu.atari._obs_type != "rgb":
        return None, NativeStatus(None, "AtariEnv with grayscale observations under SB3's wrappers")
    names = emu.unchecked() + unknown_code(list(found.values()), METHODS)
    if path == "cleanrl-atari":
        names += unknown_code([found["GrayscaleObservation"], found["ResizeObservation"]], ("__init__",))
    if names:
        return None, unchecked_status(names)
    if getattr(found.get("RecordEpisodeStatistics"), "_stats_key", None) in _ATARI_INFO:
        return None, NativeStatus(
            None, "RecordEpisodeStatistics' stats_key is a key of AtariEnv's info (its assert fails)"
        )
    stage, reason = _stage(path, found, emu)
    if stage is None:
        return None, NativeStatus(None, reason)
    return AtariStep(path, env, found, emu, stage, record), NativeStatus(path)


def _stage(path: str, found: dict[str, Any], emu: Emulator) -> tuple[Any, str | None]:
    """The frame stage of the chain, or None and why not."""
    screen = tuple(emu.ale.getScreenDims())
    if path == "sb3-atari":
        space = found["WarpFrame"].observation_space
        if space.dtype != np.uint8 or len(space.shape) != 3 or space.shape[2] != 1:
            return None, f"WarpFrame's observation space {space} is not (height, width, 1) uint8"
        size = space.shape[:2]
        warp = checked(screen, size, colour=True)
        if warp is None:
            return None, f"this OpenCV's INTER_AREA resize to {size} is not the one shmvec restates"
        return GrayFrame(warp), None
    resize, gray = found["ResizeObservation"], found["GrayscaleObservation"]
    size = tuple(resize.shape)
    warp = checked(screen, size, colour=False)
    # Their functions must be the lambdas of the __init__ whose source KNOWN lists (not replaced).
    for layer in (resize, gray):
        if layer.func.__code__ not in type(layer).__init__.__code__.co_consts:
            return None, f"{class_name(layer)}.func is not the function its __init__ makes"
    stage = ChannelsFrame(warp) if warp else None
    if stage is None or not stage.agrees(resize.func, gray.func):
        return None, f"this OpenCV's INTER_AREA resize to {size} is not the one shmvec restates"
    return stage, None


class AtariStep:
    """One env of a recognised chain, stepped natively (see the module docstring).

    :param path: the chain's name (:data:`CHAINS`).
    :param env: the outermost wrapper.
    :param found: the chain's wrappers by class name.
    :param emu: the ``AtariEnv`` under them, with Gymnasium's wrappers.
    :param stage: the frame stage (:mod:`shmvec.atari.frames`).
    :param record: the episode record (:mod:`shmvec.atari.records`), if the chain has one.
    """

    def __init__(
        self, path: str, env: gym.Env, found: dict[str, Any], emu: Emulator, stage: Any, record: Any
    ) -> None:
        self.path, self.env, self.emu, self.stage, self.record = path, env, emu, stage, record
        self.ale = emu.ale
        # The observation wrappers, innermost first: what the wrappers make of the max-pooled frame.
        self.observers = [
            found[k] for k in ("WarpFrame", "ResizeObservation", "GrayscaleObservation") if k in found
        ]
        self.sticky = found.get("StickyActionEnv")
        self.max_skip = found.get("MaxAndSkipEnv")
        self.skip: int = 1 if self.max_skip is None else self.max_skip._skip
        self.life: Any = found.get("EpisodicLifeEnv")  # None without it: read where it is known present
        self.fire = found.get("FireResetEnv")
        self.clip = "ClipRewardEnv" in found
        # Life-loss resets natively: with EpisodicLifeEnv, when every reset above it is one KNOWN lists.
        above = [found[name] for name in _ABOVE_LIFE if name in found]
        self.resets = self.life is not None and not unknown_code(above, ("reset",))
        self.reset_obs = np.zeros(self.observers[-1].observation_space.shape, np.uint8)
        self.rgb = palette.rgb_palette()
        self.idx = np.zeros((2, *stage.warp.screen), np.uint8)
        self.screens = list(self.idx)  # its two halves, as views made once
        # Which entries of MaxAndSkipEnv's buffer hold their frame only as indices in self.idx.
        self.in_idx = [False, False]
        self.palette_checked = False
        self.off: str | None = None  # why this env steps through its wrappers for good

    def _ready(self) -> bool:
        if self.off is not None or not self.emu.layers.ready():
            return False
        if self.record is not None and self.record.blocked():
            return False  # Monitor.step raises its own error
        if not self.palette_checked:
            self.palette_checked = True
            screen = self.ale.getScreenRGB()
            if not np.array_equal(self.rgb[self.ale.getScreen()], screen):
                self.off = "the game's colours are not ALE's NTSC palette"
        return self.off is None

    def step_into(self, action: Any, out: np.ndarray) -> StepInto:
        """One agent step of the chain; the frame goes into ``out``."""
        if not self._ready():
            self.sync()
            return through_wrappers(self.env, action, out)
        total, terminated, truncated, info = self._skip(action)
        if self.life is not None:
            terminated = self._life(terminated, truncated)
        self._frame(out)
        return (_SIGN[(total > 0) - (total < 0)] if self.clip else total), terminated, truncated, info

    def _skip(self, action: Any) -> tuple[float, bool, bool, dict[str, Any]]:
        """``MaxAndSkipEnv.step`` and everything under it; its frames stay in ``self.idx``."""
        emu, screens, ale, frame = self.emu, self.screens, self.ale, self.emu.frame
        skip, record, sticky = self.skip, self.record, self.sticky
        info: dict[str, Any] | None = None
        total = 0.0
        terminated = truncated = False
        frames = 0
        for i in range(skip):
            # StickyActionEnv, then the record, TimeLimit, OrderEnforcing, PassiveEnvChecker, AtariEnv.
            a = action
            if sticky is not None:
                if sticky.np_random.random() >= sticky.action_repeat_probability:
                    sticky._sticky_action = action
                a = sticky._sticky_action
            reward, terminated, truncated = frame(a)
            frames += 1
            done = terminated or truncated
            if done:
                info = emu.info()
            if record is not None:
                record.frame(reward, info)
            # MaxAndSkipEnv keeps the screens of the last two frames.
            if i >= skip - 2:
                e = i - skip + 2
                ale.getScreen(screens[e])
                self.in_idx[e] = True
            total += reward
            if done:
                break
        if record is not None:
            record.frames(frames)
        return total, terminated, truncated, (self.emu.info() if info is None else info)

    def _life(self, terminated: bool, truncated: bool) -> bool:
        """What ``EpisodicLifeEnv.step`` makes of the flags under it: ``terminated``."""
        life = self.life
        life.was_real_done = terminated or truncated
        lives = self.ale.lives()
        if 0 < lives < life.lives:
            terminated = True
        life.lives = lives
        return terminated

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """``env.reset(seed=seed, options=options)``. A life lost while the game goes on
        (``EpisodicLifeEnv``'s reset: a no-op step, then ``FireResetEnv``'s two steps) is stepped
        natively, the other resets go through the wrappers."""
        life = self.life
        natively = self.resets and not life.was_real_done and seed is None and options is None
        if not natively or not self._ready():
            self.sync()
            return self.env.reset(seed=seed, options=options)
        kwargs = {"seed": seed, "options": options}
        if self.fire is None:
            obs, info = self._life_reset(kwargs)
            return self._observation(obs), info
        # FireResetEnv.reset: the obs it returns is its second step's, taken before any reset after it.
        self._life_reset(kwargs)
        _, terminated, truncated, _ = self._skip(1)
        if self._life(terminated, truncated) or truncated:
            self._life_reset(kwargs)
        _, terminated, truncated, _ = self._skip(2)
        obs = self._observation(None)
        if self._life(terminated, truncated) or truncated:
            self._life_reset(kwargs)
        return obs, {}

    def _life_reset(self, kwargs: dict[str, Any]) -> tuple[np.ndarray | None, dict[str, Any]]:
        """``EpisodicLifeEnv.reset(**kwargs)``: its obs (None: the frame in ``self.idx``) and info."""
        life = self.life
        if life.was_real_done:
            self.sync()
            return life.reset(**kwargs)
        _, terminated, truncated, info = self._skip(0)
        obs = None
        if terminated or truncated:
            self.sync()
            obs, info = life.env.reset(**kwargs)
        life.lives = self.ale.lives()
        return obs, info

    def _observation(self, obs: np.ndarray | None) -> np.ndarray:
        """The observation wrappers' result for MaxAndSkipEnv's ``obs`` (None: the frame held in
        ``self.idx``), in an array of this step's own (its value is copied by whoever takes it)."""
        if obs is None:
            self._frame(self.reset_obs)
            return self.reset_obs
        return self._observe(obs)

    def _observe(self, frame: np.ndarray) -> Any:
        """The observation wrappers' own code on MaxAndSkipEnv's RGB ``frame``."""
        for observer in self.observers:
            frame = observer.observation(frame)
        return frame

    def _frame(self, out: np.ndarray) -> None:
        """The observation of MaxAndSkipEnv's max (or of the one frame without it) into ``out``."""
        if self.max_skip is None:
            self.stage(self.idx[1], self.idx[1], out)
        elif all(self.in_idx):
            self.stage(self.idx[0], self.idx[1], out)
        else:
            # An episode ended before the step's second-last frame and a frame the max needs came
            # from the wrappers (a reset's steps): the wrappers' own code on their own buffer.
            self.sync()
            out[...] = self._observe(self.max_skip._obs_buffer.max(axis=0))

    def sync(self) -> None:
        """Write MaxAndSkipEnv's frames held as indices back into its RGB buffer (before anything
        but :meth:`step_into` touches the env, and before the wrappers' own code reads it)."""
        for e in (0, 1):
            if self.in_idx[e]:
                if self.max_skip is not None:
                    colour(self.idx[e], self.rgb, self.max_skip._obs_buffer[e])
                self.in_idx[e] = False
