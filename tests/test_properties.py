"""Property-based: for random observation spaces, episode ends, n_envs and n_workers, ShmVecEnv
returns exactly what DummyVecEnv returns (or, for nested Dict/Tuple spaces, which DummyVecEnv
refuses, what a per-env reference with DummyVecEnv's semantics returns)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmVecEnv
from tests.helpers import assert_obs_equal, assert_step_equal

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]

shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)


@st.composite
def boxes(draw) -> spaces.Box:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    low, high = (0, 100) if dtype.kind in "ui" else (-1.0, 1.0)
    return spaces.Box(low, high, draw(shapes), dtype)


leaf_spaces = st.one_of(
    boxes(),
    st.integers(2, 9).map(spaces.Discrete),
    st.lists(st.integers(2, 5), min_size=1, max_size=3).map(spaces.MultiDiscrete),
    st.integers(1, 4).map(spaces.MultiBinary),
)
obs_spaces = st.recursive(
    leaf_spaces,
    lambda children: st.one_of(
        st.dictionaries(st.sampled_from(["a", "b", "img", "z", "pos"]), children, min_size=1, max_size=3).map(
            spaces.Dict
        ),
        st.lists(children, min_size=1, max_size=3).map(lambda xs: spaces.Tuple(tuple(xs))),
    ),
    max_leaves=5,
)


def sample(space: spaces.Space, rng: np.random.Generator) -> Any:
    """One observation of ``space`` in its exact dtype, from the env's own RNG."""
    if isinstance(space, spaces.Dict):
        return {k: sample(s, rng) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(sample(s, rng) for s in space.spaces)
    if isinstance(space, spaces.Discrete):
        return np.int64(rng.integers(space.n))
    if isinstance(space, spaces.MultiDiscrete):
        return rng.integers(space.nvec).astype(space.dtype)
    if isinstance(space, spaces.MultiBinary):
        return rng.integers(0, 2, space.shape).astype(space.dtype)
    assert isinstance(space, spaces.Box)
    if space.dtype.kind in "ui":
        return rng.integers(0, 100, space.shape).astype(space.dtype)
    return rng.uniform(-1, 1, space.shape).astype(space.dtype)


class SpaceEnv(gym.Env):
    """Observations of any space; episodes end by termination (probability ``p_term`` per step) or by
    truncation after ``max_len`` steps; an info entry on some steps."""

    action_space = spaces.Discrete(3)

    def __init__(self, space: spaces.Space, p_term: float, max_len: int) -> None:
        self.observation_space = space
        self.p_term, self.max_len = p_term, max_len
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return sample(self.observation_space, self.np_random), {"r": int(self.np_random.integers(9))}

    def step(self, action):
        self.t += 1
        terminated = bool(self.np_random.random() < self.p_term)
        truncated = self.t >= self.max_len
        info = {"t": self.t} if self.t % 2 else {}
        return (
            sample(self.observation_space, self.np_random),
            float(action) * 0.5,
            terminated,
            truncated,
            info,
        )


def _nested(space: spaces.Space) -> bool:
    subs = (
        list(space.spaces.values()) if isinstance(space, spaces.Dict) else list(getattr(space, "spaces", []))
    )
    return any(isinstance(s, (spaces.Dict, spaces.Tuple)) for s in subs)


def _stack(space: spaces.Space, items: list) -> Any:
    if isinstance(space, spaces.Dict):
        return {k: _stack(s, [o[k] for o in items]) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_stack(s, [o[i] for o in items]) for i, s in enumerate(space.spaces))
    return np.stack([np.asarray(o) for o in items]).astype(space.dtype)


class ReferenceVecEnv:
    """DummyVecEnv's semantics for any space, nested ones included (enough for this comparison)."""

    def __init__(self, fns) -> None:
        self.envs = [fn() for fn in fns]
        self.space = self.envs[0].observation_space

    def reset(self, seed: int):
        results = [env.reset(seed=seed + i) for i, env in enumerate(self.envs)]
        self.reset_infos = [info for _, info in results]
        return _stack(self.space, [obs for obs, _ in results])

    def step(self, actions):
        obs_list, rewards, dones, infos = [], [], [], []
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, info = env.step(actions[i])
            info = dict(info)
            info["TimeLimit.truncated"] = truncated and not terminated
            if terminated or truncated:
                info["terminal_observation"] = obs
                obs, self.reset_infos[i] = env.reset()
            obs_list.append(obs)
            rewards.append(reward)
            dones.append(terminated or truncated)
            infos.append(info)
        return _stack(self.space, obs_list), np.array(rewards, np.float32), np.array(dones), infos


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    space=obs_spaces,
    n_envs=st.integers(1, 4),
    data=st.data(),
    p_term=st.sampled_from([0.0, 0.2, 0.6]),
    max_len=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_matches_reference_for_random_spaces(space, n_envs, data, p_term, max_len, seed):
    n_workers = data.draw(st.integers(1, n_envs), label="n_workers")
    fns = [lambda: SpaceEnv(space, p_term, max_len)] * n_envs
    flat = not _nested(space)
    ref: Any = DummyVecEnv(fns) if flat else ReferenceVecEnv(fns)
    rng = np.random.default_rng(seed)
    with ShmVecEnv(fns, "fork", n_workers=n_workers) as env:
        env.seed(seed)
        if flat:
            ref.seed(seed)
            want = ref.reset()
        else:
            want = ref.reset(seed)
        assert_obs_equal(env.reset(), want, "reset obs")
        assert env.reset_infos == ref.reset_infos
        for t in range(8):
            actions = rng.integers(0, 3, n_envs)
            assert_step_equal(env.step(actions), ref.step(actions), t)
            assert env.reset_infos == ref.reset_infos
