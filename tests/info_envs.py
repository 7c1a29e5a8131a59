"""Envs whose info dicts exercise typed info columns (:mod:`shmvec.infos`). Like ``tests/envs.py``,
this imports only numpy and gymnasium, so spawn and forkserver workers can import it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def stable_info(t: int, s: int) -> dict[str, Any]:
    """The same keys and types every step: every supported kind, then values that cannot be typed."""
    return {
        "t": t,
        "x": t / 4,
        "late_in_episode": t >= 4,
        "n32": np.int32(-t),
        "f32": np.float32(t / 3),
        "b": np.bool_(t % 2),
        "u64": np.uint64(2**64 - 1 - s),
        "name": f"step {s}",
        "nested": {"s": s},
    }


def changing_info(t: int, s: int, k: int, huge: bool = True) -> dict[str, Any]:
    """Keys that come and go, change type, order and size; ``k`` (a draw per step) picks the case.
    ``huge``: include ints beyond int64 (Gymnasium's vector infos cannot hold them)."""
    if s < 3 and k % 2:
        return {}  # keys that appear late (for some envs)
    info: dict[str, Any] = {"v": t, "w": s}
    if k == 1:
        info["v"] = t / 2  # int -> float
    elif k == 2:
        info["v"] = np.int64(t)  # int -> numpy int
    elif k == 3:
        del info["v"]  # a key disappears
    elif k == 4:
        info = {"w": s, "v": t}  # reordered
    elif k == 5 and huge:
        info["v"] = 2**70 + t  # beyond int64
    elif k == 6:
        info["v"] = True  # int -> bool (a subclass of int)
    elif k == 7:
        info = {"new": 1.5, **info}  # a key appears in front
    if s >= 10:
        info["extra"] = s  # a key appears late, at the end
    return info


class InfoEnv(gym.Env):
    """A tiny env whose infos follow ``pattern`` (``"stable"``, ``"changing"`` or ``"changing-gym"``:
    without ints beyond int64); episodes end by
    termination after a random number of steps in ``[lengths[0], lengths[1])`` (wrap in TimeLimit for
    truncations)."""

    observation_space = spaces.Box(-1e3, 1e3, (3,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self, pattern: str = "stable", lengths: tuple[int, int] = (3, 10)) -> None:
        self.pattern, self.lengths = pattern, lengths
        self.t = self.s = self.len = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.s, self.np_random.random()], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.len = int(self.np_random.integers(*self.lengths))
        return self._obs(), {"t": 0, "reset": True}

    def step(self, action):
        self.t += 1
        self.s += 1
        if self.pattern == "stable":
            info = stable_info(self.t, self.s)
        else:
            k = int(self.np_random.integers(0, 12))
            info = changing_info(self.t, self.s, k, huge=self.pattern == "changing")
        return self._obs(), float(action), self.t >= self.len, False, info


def make_info_env(
    pattern: str = "stable", monitor: bool = False, max_steps: int = 7, lengths: tuple[int, int] = (3, 10)
) -> gym.Env:
    """An :class:`InfoEnv` in a TimeLimit (truncations), optionally in SB3's Monitor (``episode``)."""
    env: gym.Env = gym.wrappers.TimeLimit(InfoEnv(pattern, lengths), max_steps)
    if monitor:
        from stable_baselines3.common.monitor import Monitor

        env = Monitor(env)
    return env


class BigInfo(gym.Wrapper):
    """Adds ``blob``, ``size`` bytes (more than a pipe holds), to the info of every ``every``-th
    step: a reply the worker can only finish writing while the main process reads it."""

    def __init__(self, env: gym.Env, every: int, size: int) -> None:
        super().__init__(env)
        self.every, self.size, self.t = every, size, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        if self.t % self.every == 0:
            info = {**info, "blob": bytes([self.t % 256]) * self.size}
        return obs, reward, terminated, truncated, info


def make_big_info_env(every: int = 3, size: int = 1 << 20) -> gym.Env:
    """An :class:`InfoEnv` whose episodes outlast a test, in :class:`BigInfo`."""
    return BigInfo(make_info_env("stable", max_steps=1000, lengths=(1000, 1001)), every, size)
