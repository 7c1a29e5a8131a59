"""Envs and wrappers for the tests of the Gymnasium face (``ShmVectorEnv``). Like ``tests/envs.py``,
this imports only numpy and gymnasium: spawn and forkserver workers import it."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class MutatingEnv(gym.Env):
    """Returns the *same* observation arrays and the *same* info dict on every call, changed in place.

    Many real envs do this to avoid allocating (a frame buffer, a reused info dict). A vector env
    that keeps a reference to the terminal observation or info and then calls ``reset()`` reports the
    reset values in place of the terminal ones (Farama-Foundation/Gymnasium #1132). Episodes have
    random lengths and end by termination or by truncation.

    :param dict_obs: a Dict observation (image + vector) instead of a plain image Box.
    """

    def __init__(self, dict_obs: bool = False, max_len: int = 7) -> None:
        image = spaces.Box(0, 255, (6, 5, 2), np.uint8)
        vec = spaces.Box(-1e6, 1e6, (3,), np.float64)
        self.observation_space = spaces.Dict({"image": image, "vec": vec}) if dict_obs else image
        self.action_space = spaces.Discrete(3)
        self.dict_obs, self.max_len = dict_obs, max_len
        self._image = np.zeros(image.shape, np.uint8)
        self._vec = np.zeros(3, np.float64)
        self._obs = {"image": self._image, "vec": self._vec} if dict_obs else self._image
        self._info: dict[str, Any] = {}
        self.t = self.len = self.episode = 0

    def _fill(self, phase: str) -> tuple[Any, dict]:
        self._image[...] = self.np_random.integers(0, 256, self._image.shape, dtype=np.uint8)
        self._vec[...] = (self.episode, self.t, self.np_random.random())
        # The same dict object, emptied and refilled: the keys differ between reset and step.
        self._info.clear()
        self._info.update({"phase": phase, "t": self.t, "trace": self._vec})
        if phase == "step":
            self._info["reward_parts"] = np.array([self.t, -self.t], np.int32)
        return self._obs, self._info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.episode += 1
        self.len = int(self.np_random.integers(1, self.max_len + 1))
        return self._fill("reset")

    def step(self, action):
        self.t += 1
        ended = self.t >= self.len
        terminated = ended and bool(self.np_random.random() < 0.5)
        obs, info = self._fill("step")
        return obs, float(action) + 0.5 * self.t, terminated, ended and not terminated, info


class CopyOutputs(gym.Wrapper):
    """Deep-copies what the env returns, so a reference vector env keeps the true values of an env
    that mutates its outputs in place (see :class:`MutatingEnv`)."""

    def reset(self, **kwargs):
        return copy.deepcopy(self.env.reset(**kwargs))

    def step(self, action):
        return copy.deepcopy(self.env.step(action))


def make_mutating(dict_obs: bool = False) -> gym.Env:
    return MutatingEnv(dict_obs)


def make_copied_mutating(dict_obs: bool = False) -> gym.Env:
    return CopyOutputs(MutatingEnv(dict_obs))


OMITTED = "<options not passed>"


class OptionsRecorderEnv(gym.Env):
    """Records what each ``reset`` got as ``options``: the value, or :data:`OMITTED` when the
    caller did not pass the argument at all (read back with ``get_attr("received")``)."""

    observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.received: list[Any] = []

    def reset(self, *, seed: int | None = None, **kwargs: Any) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.received.append(copy.deepcopy(kwargs.get("options", OMITTED)))
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(1, np.float32), 0.0, False, False, {}
