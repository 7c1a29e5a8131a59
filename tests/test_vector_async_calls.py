"""The AsyncVectorEnv calls migrating code uses: ``reset_async``/``reset_wait`` and
``step_async``/``step_wait(timeout=...)``, against SyncVectorEnv, with Gymnasium's timeout error."""

from __future__ import annotations

import functools
import multiprocessing
from contextlib import closing

import gymnasium as gym
import numpy as np
import pytest

from shmvec import ShmVectorEnv
from tests.envs import FaultyEnv
from tests.helpers import assert_obs_equal

FNS = [functools.partial(FaultyEnv)] * 4


def test_reset_and_step_in_two_halves_equal_sync(no_leaks):
    with closing(ShmVectorEnv(FNS, start_method="fork", n_workers=2)) as env:
        want = gym.vector.SyncVectorEnv(FNS)
        env.reset_async(seed=3)
        obs, infos = env.reset_wait(timeout=30)
        w_obs, w_infos = want.reset(seed=3)
        assert_obs_equal(obs, w_obs)
        for t in range(12):
            actions = np.array([t % 3] * 4)
            env.step_async(actions)
            got = env.step_wait(timeout=30)
            exp = want.step(actions)
            for a, b in zip(got[:4], exp[:4]):
                assert_obs_equal(a, b, f"step {t}")
            assert got[4].keys() == exp[4].keys()
        want.close()


def test_step_wait_timeout_leaves_the_step_pending(no_leaks):
    """Past ``timeout`` the step is still in flight (as AsyncVectorEnv: multiprocessing.TimeoutError);
    a later step_wait collects it, and nothing was lost or killed."""
    slow = [functools.partial(FaultyEnv, delay=0.5)] * 2
    with closing(ShmVectorEnv(slow, start_method="fork", n_workers=2)) as env:
        env.reset(seed=0)
        env.step_async(np.zeros(2, np.int64))
        with pytest.raises(multiprocessing.TimeoutError):
            env.step_wait(timeout=0.01)
        with pytest.raises(RuntimeError, match="step_async\\(\\) called twice"):
            env.step_async(np.zeros(2, np.int64))
        obs, rewards, *_ = env.step_wait(timeout=30)
        assert obs.shape == (2, 4, 4, 1) and rewards.tolist() == [1.0, 1.0]
        assert not env.closed and env.n_restarts == 0


def test_the_halves_are_refused_out_of_order(no_leaks):
    with closing(ShmVectorEnv(FNS, start_method="fork", n_workers=2)) as env:
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match="step_wait\\(\\) called without step_async\\(\\)"):
            env.step_wait()
        with pytest.raises(RuntimeError, match="reset_wait\\(\\) called without reset_async\\(\\)"):
            env.reset_wait()
        with pytest.raises(ValueError, match="reset_mask"):
            env.reset_async(options={"reset_mask": np.ones(4, bool)})
