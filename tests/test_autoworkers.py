"""``n_workers="auto"`` (both faces): the count chosen from a probe of one env, and results equal to
the in-process references whatever it chose. Asserts on the chosen count, never on time.

The usable CPU count is set to 2 here, so the expected counts do not depend on the machine."""

from __future__ import annotations

import functools
from contextlib import closing

import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from stable_baselines3.common.vec_env import DummyVecEnv

import shmvec
from shmvec.engine import autoworkers
from shmvec.synthetic import SyntheticImageEnv
from tests.helpers import assert_obs_equal, assert_steps_equal

CPUS = 2
# Sleeps 5-10 ms a step (a simulator behind a socket) vs computes 10 ms a step (a busy loop).
WAITING = functools.partial(SyntheticImageEnv, (8, 8, 3), io_s=(0.005, 0.01), episode_len=(3, 9))
COMPUTING = functools.partial(SyntheticImageEnv, (8, 8, 3), work_s=0.01, episode_len=(3, 9))


@pytest.fixture(autouse=True)
def two_cpus(monkeypatch):
    monkeypatch.setattr(autoworkers, "usable_cpus", lambda: CPUS)


@pytest.mark.parametrize(
    ("n_envs", "busy", "want"),
    [(16, 0.01, 16), (16, 0.0, 16), (16, 0.97, 2), (16, 0.75, 2), (16, 0.5, 4), (16, 0.3, 7), (3, 0.01, 3)],
)
def test_choose_workers(n_envs, busy, want):
    assert autoworkers.choose_workers(n_envs, CPUS, busy) == want


def test_probe_fraction_ignores_time_queued_for_a_cpu():
    # 0.1 s of CPU in 0.4 s of wall time of which 0.3 s waiting for a CPU: the env computes.
    assert autoworkers.Probe(10, 0.4, 0.1, 0.3).busy_fraction == pytest.approx(1.0)
    assert autoworkers.Probe(10, 0.4, 0.01, 0.0).busy_fraction == pytest.approx(0.025)


def _compare_with_dummy(env: shmvec.ShmVecEnv, fn, n_envs: int, steps: int = 20) -> None:
    ref = DummyVecEnv([fn] * n_envs)
    try:
        env.seed(4)
        ref.seed(4)
        assert_obs_equal(env.reset(), ref.reset(), "reset obs")
        rng = np.random.default_rng(4)
        assert_steps_equal(env, ref, steps, rng)
    finally:
        ref.close()


def test_waiting_env_gets_a_worker_per_env_and_steps_like_dummy(no_leaks):
    with shmvec.ShmVecEnv([WAITING] * 6, "fork", n_workers="auto") as env:
        assert env.n_workers == 6 and len(env.processes) == 6
        _compare_with_dummy(env, WAITING, 6)


def test_computing_env_gets_a_worker_per_cpu_and_steps_like_dummy(no_leaks):
    with shmvec.ShmVecEnv([COMPUTING] * 6, "fork", n_workers="auto") as env:
        assert env.n_workers == CPUS and len(env.processes) == CPUS
        _compare_with_dummy(env, COMPUTING, 6, steps=10)


def test_vector_face_chooses_too_and_steps_like_sync(no_leaks):
    env = shmvec.ShmVectorEnv([WAITING] * 5, start_method="fork", n_workers="auto")
    ref = SyncVectorEnv([WAITING] * 5)
    with closing(env), closing(ref):
        assert env.n_workers == 5
        assert_obs_equal(env.reset(seed=2)[0], ref.reset(seed=2)[0], "reset obs")
        ref.action_space.seed(2)
        for t in range(15):
            actions = ref.action_space.sample()
            for got, want, name in zip(env.step(actions), ref.step(actions), ("obs", "rew", "term", "trunc")):
                assert_obs_equal(got, want, f"step {t} {name}")


def test_no_probe_where_no_other_count_is_possible(no_leaks, monkeypatch):
    def no_probe(*args):
        raise AssertionError("probed although n_envs <= usable CPUs")

    monkeypatch.setattr(autoworkers, "probe", no_probe)
    with shmvec.ShmVecEnv([COMPUTING] * CPUS, "fork", n_workers="auto") as env:
        assert env.n_workers == CPUS


def test_without_scheduler_counters_the_default_count(no_leaks, monkeypatch):
    monkeypatch.setattr(autoworkers, "_queued_s", lambda: None)
    with shmvec.ShmVecEnv([WAITING] * 5, "fork", n_workers="auto") as env:
        assert env.n_workers == CPUS


@pytest.mark.parametrize("bad", ["autoo", "AUTO", ""])
def test_other_strings_are_refused_in_one_line(no_leaks, bad):
    with pytest.raises(ValueError, match=rf"^n_workers must be a whole number, None or 'auto', got {bad!r}$"):
        shmvec.ShmVecEnv([WAITING] * 3, "fork", n_workers=bad)
