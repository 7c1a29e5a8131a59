"""The native step protocol (shmvec.native) for a user's own env: ``step_into`` writes into the ring
row, and the results equal DummyVecEnv's stepping the same env through ``step``."""

from __future__ import annotations

import functools
import importlib.util
from contextlib import closing
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack

from shmvec import EnvError, ShmVecEnv
from tests.helpers import ROOT, equivalent_with_statuses


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("native_env_example", ROOT / "examples" / "native_env.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


CatchEnv = _example().CatchEnv


class Counter(gym.Env):
    """Keeps its step count in ``pending`` until ``sync()`` moves it to ``count`` (state that a
    native step holds in its own form); fails on request, writes NaN on request."""

    def __init__(self, fail_at: int = -1, nan_at: int = -1) -> None:
        self.observation_space = spaces.Box(-1, 1, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.count = self.pending = 0
        self.fail_at, self.nan_at = fail_at, nan_at
        self.synced = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.sync()
        self.count = 0
        return np.zeros(3, np.float32), {}

    def sync(self) -> None:
        self.count += self.pending
        self.pending = 0
        self.synced += 1

    def step_into(self, action, out):
        self.pending += 1
        t = self.count + self.pending
        if t == self.fail_at:
            raise ValueError("boom")
        out[:] = (t % 7) / 7 if t != self.nan_at else np.nan
        return float(action), t % 9 == 0, False, {"t": t}

    def step(self, action):
        obs = np.empty(3, np.float32)
        result = self.step_into(action, obs)
        self.sync()
        return (obs, *result)


def _compare(fns, steps: int = 120, ref_wrap=None, **options) -> list:
    return equivalent_with_statuses(fns, steps, ref_wrap, n_workers=2, **options)


def test_example_env_is_native_and_equals_dummy(no_leaks):
    statuses = _compare([CatchEnv] * 4)
    assert {s.path for s in statuses} == {"step_into"}


def test_under_gymnasiums_standard_wrappers(no_leaks):
    """gym.make adds PassiveEnvChecker and OrderEnforcing, max_episode_steps a TimeLimit: the worker
    applies them (truncation included)."""
    gym.register("shmvec-test/Catch-v0", entry_point=CatchEnv, max_episode_steps=15)
    try:
        fn = functools.partial(gym.make, "shmvec-test/Catch-v0")
        assert "TimeLimit" in str(fn())
        statuses = _compare([fn] * 3)
        assert {s.path for s in statuses} == {"step_into"}
    finally:
        gym.registry.pop("shmvec-test/Catch-v0")


def test_frame_stack_over_a_native_env(no_leaks):
    statuses = _compare([CatchEnv] * 2, frame_stack=3, ref_wrap=lambda v: VecFrameStack(v, 3))
    assert {s.path for s in statuses} == {"step_into+frame-stack"}


@pytest.mark.parametrize("options", [{"codec": "zstd"}, {"check_finite": True}, {"copy": False}])
def test_with_codecs_checks_and_views(no_leaks, options):
    statuses = _compare([CatchEnv] * 2, steps=60, **options)
    assert {s.path for s in statuses} == {"step_into"}


def test_sync_runs_before_other_calls(no_leaks):
    with ShmVecEnv([Counter] * 2, start_method="fork") as env, closing(DummyVecEnv([Counter] * 2)) as ref:
        env.reset(), ref.reset()
        for _ in range(5):
            env.step(np.array([1, 0])), ref.step(np.array([1, 0]))
        assert env.get_attr("count") == ref.get_attr("count") == [5, 5]


def test_an_error_in_step_into_names_the_env(no_leaks):
    with ShmVecEnv([Counter, functools.partial(Counter, fail_at=3)], start_method="fork") as env:
        env.reset()
        with pytest.raises(EnvError, match="env 1") as info:
            for _ in range(5):
                env.step(np.array([0, 0]))
        assert "boom" in str(info.value)


def test_check_finite_sees_what_step_into_wrote(no_leaks):
    from shmvec import ObservationError

    with ShmVecEnv([functools.partial(Counter, nan_at=4)], start_method="fork", check_finite=True) as env:
        env.reset()
        with pytest.raises(EnvError) as info:
            for _ in range(5):
                env.step(np.array([0]))
        assert isinstance(info.value.original, ObservationError) and "NaN" in str(info.value)


@pytest.mark.parametrize(
    "shape,n", [((84, 84, 1), 4), ((10, 12, 3), 4), ((6, 2), 3), ((5, 5, 1), 2), ((3, 3, 4), 1)]
)
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_stack_kernel_equals_numpy(shape, n, dtype):
    from shmvec.worker.frame_stack_kernel import interleave

    frames = (np.random.default_rng(0).random((n, *shape)) * 200).astype(dtype)
    for oldest in range(n):
        out = np.zeros((*shape[:-1], shape[-1] * n), dtype)
        interleave(frames, oldest, out)
        assert np.array_equal(out, np.concatenate([frames[(oldest + j) % n] for j in range(n)], axis=-1))
