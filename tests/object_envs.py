"""Envs whose observation spaces have leaves without a fixed size (Text, Sequence, Graph, OneOf, a
custom space), alone or inside a Dict or Tuple next to Box/Discrete leaves. Like ``tests/envs.py``,
this imports only numpy and gymnasium: spawn and forkserver workers import it."""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from tests.envs import FaultyEnv


class Bag(spaces.Space):
    """A custom space: a list of 0..4 small ints (a mutable value of no fixed size)."""

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(None, None, seed)

    def sample(self, mask: Any = None, probability: Any = None) -> list[int]:
        return self.np_random.integers(0, 10, int(self.np_random.integers(0, 5))).tolist()

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(isinstance(v, int) for v in x)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Bag)


# name -> the observation space (a new one each call)
SPACES = {
    "text": lambda: spaces.Text(12),
    "sequence": lambda: spaces.Sequence(spaces.Box(-1, 1, (2,), np.float32)),
    "sequence-stacked": lambda: spaces.Sequence(spaces.Box(-1, 1, (2,), np.float32), stack=True),
    "graph": lambda: spaces.Graph(spaces.Box(0, 1, (3,), np.float32), spaces.Discrete(4)),
    "oneof": lambda: spaces.OneOf([spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float32)]),
    "custom": Bag,
    # MiniGrid's default observation: an image, a direction and a mission string.
    "text-in-dict": lambda: spaces.Dict(
        {
            "image": spaces.Box(0, 255, (5, 5, 3), np.uint8),
            "direction": spaces.Discrete(4),
            "mission": spaces.Text(20),
        }
    ),
    "text-in-tuple": lambda: spaces.Tuple((spaces.Box(-1, 1, (3,), np.float32), spaces.Text(8))),
}


class ObjectObsEnv(gym.Env):
    """Observations drawn from the observation space with the env's own seeded RNG; episodes of 1..6
    steps ending by termination or truncation; an info on some steps.

    :param kind: a key of :data:`SPACES`.
    :param reuse: return the *same* array object every time, changed in place (as envs that avoid
        allocating do), for ``"sequence-stacked"``: a vector env that keeps a reference to the
        terminal observation and then resets the env would report the reset's values.
    """

    def __init__(self, kind: str, reuse: bool = False) -> None:
        self.observation_space = SPACES[kind]()
        self.action_space = spaces.Discrete(3)
        self.reuse = reuse
        self.buffer = np.zeros((32, 2), np.float32)
        self.t = self.len = 0

    def _draw(self) -> Any:
        self.observation_space.seed(int(self.np_random.integers(1 << 31)))
        value = self.observation_space.sample()
        if self.reuse:
            if len(value) > len(self.buffer):  # rare: the same object from then on
                self.buffer = np.zeros((2 * len(value), 2), np.float32)
            self.buffer[: len(value)] = value
            return self.buffer[: len(value)]
        return value

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.len = 0, int(self.np_random.integers(1, 7))
        return self._draw(), {"len": self.len}

    def step(self, action):
        self.t += 1
        ended = self.t >= self.len
        terminated = ended and bool(self.np_random.random() < 0.5)
        info = {"t": self.t} if self.t % 2 else {}
        return self._draw(), float(action) + self.t, terminated, ended and not terminated, info


def make_object_env(kind: str, reuse: bool = False) -> gym.Env:
    return ObjectObsEnv(kind, reuse)


class Mission(gym.ObservationWrapper):
    """:class:`tests.envs.FaultyEnv` with MiniGrid's layout: its image next to a mission string that
    names the env's step and reset count."""

    def __init__(self, env: FaultyEnv) -> None:
        super().__init__(env)
        self.observation_space = spaces.Dict({"image": env.observation_space, "mission": spaces.Text(24)})

    def observation(self, observation: np.ndarray) -> dict[str, Any]:
        env = self.env.unwrapped
        return {"image": observation, "mission": f"step {env.steps} reset {env.resets}"}


def make_faulty_mission(**kwargs: Any) -> gym.Env:
    return Mission(FaultyEnv(**kwargs))


TEXT_IN_DICT = functools.partial(make_object_env, "text-in-dict")
