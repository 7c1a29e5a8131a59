"""Envs and wrappers for the tests of the Gymnasium face (``ShmVectorEnv``). Like ``tests/envs.py``,
this imports only numpy and gymnasium: spawn and forkserver workers import it."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec.testing.equivalence import CopyOutputs  # noqa: F401 - the reference's wrapper, for the tests


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


def make_mutating(dict_obs: bool = False) -> gym.Env:
    return MutatingEnv(dict_obs)


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


class ActionEchoEnv(gym.Env):
    """Keeps every action it gets (``received``, read back with ``get_attr``) and shows it in its
    observation, reward and info, so an action that reaches the wrong env, or in another form, changes
    the results. Episodes of random length end by termination or by truncation.

    :param action_space: any space ``gymnasium.spaces.flatten`` takes (Tuple, Dict, nested...).
    """

    def __init__(self, action_space: spaces.Space, max_len: int = 4) -> None:
        self.action_space = action_space
        size = spaces.flatdim(action_space) + 1
        self.observation_space = spaces.Box(-np.inf, np.inf, (size,), np.float64)
        self.max_len = max_len
        self.received: list[Any] = []
        self.t = self.len = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.len = int(self.np_random.integers(1, self.max_len + 1))
        return np.full(self.observation_space.shape, -1.0), {"len": self.len}

    def step(self, action):
        self.received.append(copy.deepcopy(action))
        self.t += 1
        flat = spaces.flatten(self.action_space, action).astype(np.float64)
        obs = np.concatenate([flat, [self.np_random.random()]])
        ended = self.t >= self.len
        terminated = ended and bool(self.np_random.random() < 0.5)
        reward = float(flat @ np.arange(1, flat.size + 1))
        return (
            obs,
            reward,
            terminated,
            ended and not terminated,
            {"t": self.t, "action": copy.deepcopy(action)},
        )


class ScalarLeavesEnv(gym.Env):
    """Observation leaves of the types envs really return, which shared memory alone does not keep:
    a Python ``int`` (Discrete), an ``np.int64`` (Discrete), a 0-d float32 array (a shape-() Box) and
    a float64 array for a float32 Box; plus a uint8 frame of the space's dtype. ``dict_obs=False``:
    only the Python ``int`` (a counter, as toy-text envs return theirs). Episodes of 2-4 steps."""

    def __init__(self, dict_obs: bool = True) -> None:
        count = spaces.Discrete(10)
        self.observation_space: spaces.Space = count
        if dict_obs:
            self.observation_space = spaces.Dict(
                {
                    "count": count,
                    "draw": spaces.Discrete(3),
                    "level": spaces.Box(0.0, 1.0, (), np.float32),
                    "pos": spaces.Box(-1.0, 1.0, (2,), np.float32),
                    "frame": spaces.Box(0, 255, (3, 4), np.uint8),
                }
            )
        self.action_space = spaces.Discrete(2)
        self.dict_obs = dict_obs
        self.t = self.len = 0

    def _obs(self) -> Any:
        if not self.dict_obs:
            return self.t
        rng = self.np_random
        return {
            "count": self.t,
            "draw": rng.integers(3),
            "level": np.array(rng.random(), np.float32),
            "pos": rng.uniform(-1, 1, 2),
            "frame": rng.integers(0, 256, (3, 4), dtype=np.uint8),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.len = int(self.np_random.integers(2, 5))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        ended = self.t >= self.len
        return self._obs(), float(action), ended and self.t % 2 == 0, ended and self.t % 2 == 1, {}
