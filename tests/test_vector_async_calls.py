"""The AsyncVectorEnv calls migrating code uses: ``reset_async``/``reset_wait`` and
``step_async``/``step_wait(timeout=...)``, against SyncVectorEnv, with Gymnasium's timeout error."""

from __future__ import annotations

import functools
import multiprocessing
import re
import warnings
from contextlib import closing

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError

from shmvec import NoPendingCallError, PendingCallError, ShmVectorEnv
from tests.envs import FaultyEnv
from tests.test_vector_env import assert_reset_equal, assert_step_equal

FNS = [functools.partial(FaultyEnv)] * 4


def test_reset_and_step_in_two_halves_equal_sync(no_leaks):
    """Observations, rewards, flags and infos (values, masks) equal SyncVectorEnv's, across episode
    ends of both kinds and the autoreset steps after them."""
    with closing(ShmVectorEnv(FNS, start_method="fork", n_workers=2)) as env:
        want = gym.vector.SyncVectorEnv(FNS)
        env.reset_async(seed=3)
        assert_reset_equal(env.reset_wait(timeout=30), want.reset(seed=3), "reset")
        ends = set()
        for t in range(12):
            actions = np.array([t % 3] * 4)
            env.step_async(actions)
            exp = want.step(actions)
            assert_step_equal(env.step_wait(timeout=30), exp, f"step {t}")
            ends |= {"terminated"} if exp[2].any() else set()
            ends |= {"truncated"} if exp[3].any() else set()
        want.close()
    assert ends == {"terminated", "truncated"}


def test_step_wait_timeout_leaves_the_step_pending(no_leaks):
    """Past ``timeout`` the step is still in flight (as AsyncVectorEnv: multiprocessing.TimeoutError);
    a later step_wait collects it, and nothing was lost or killed."""
    slow = [functools.partial(FaultyEnv, delay=0.5)] * 2
    with closing(ShmVectorEnv(slow, start_method="fork", n_workers=2)) as env:
        env.reset(seed=0)
        env.step_async(np.zeros(2, np.int64))
        with pytest.raises(multiprocessing.TimeoutError):
            env.step_wait(timeout=0.01)
        with pytest.raises(
            PendingCallError, match="Calling `step_async` while waiting for a pending call to `step`"
        ):
            env.step_async(np.zeros(2, np.int64))
        obs, rewards, *_ = env.step_wait(timeout=30)
        assert obs.shape == (2, 4, 4, 1) and rewards.tolist() == [1.0, 1.0]
        assert not env.closed and env.n_restarts == 0


def test_the_halves_are_refused_out_of_order(no_leaks):
    """Out of order, the errors are Gymnasium's types with AsyncVectorEnv's text (its own tests match
    on both), and RuntimeErrors as before."""
    with closing(ShmVectorEnv(FNS, start_method="fork", n_workers=2)) as env:
        env.reset(seed=0)
        with pytest.raises(
            NoAsyncCallError, match=re.escape("Calling `step_wait` without any prior call to `step_async`.")
        ):
            env.step_wait()
        with pytest.raises(
            NoPendingCallError,
            match=re.escape("Calling `reset_wait` without any prior call to `reset_async`."),
        ):
            env.reset_wait()
        with pytest.raises(ValueError, match="reset_mask"):
            env.reset_async(options={"reset_mask": np.ones(4, bool)})
        env.step_async(np.zeros(4, np.int64))
        with pytest.raises(
            AlreadyPendingCallError,
            match=re.escape("Calling `reset_async` while waiting for a pending call to `step` to complete"),
        ) as e:
            env.reset_async()
        assert isinstance(e.value, RuntimeError) and e.value.name == "step"
        with pytest.raises(NoPendingCallError, match="reset_wait"):
            env.reset_wait()  # a step, not a reset, is pending
        env.step_wait(timeout=30)
        env.reset_async(seed=1)
        with pytest.raises(
            PendingCallError,
            match=re.escape("Calling `step_async` while waiting for a pending call to `reset` to complete"),
        ):
            env.step_async(np.zeros(4, np.int64))
        with pytest.raises(NoPendingCallError, match="step_wait"):
            env.step_wait()
        with pytest.warns(
            UserWarning,
            match=re.escape("Calling `close` while waiting for a pending call to `reset` to complete."),
        ):
            env.close()
    assert env.closed


def test_closing_with_nothing_pending_warns_nothing(no_leaks, recwarn):
    env = ShmVectorEnv(FNS, start_method="fork", n_workers=2)
    env.reset(seed=0)
    env.step(np.zeros(4, np.int64))
    env.close()
    assert not [w for w in recwarn if "pending" in str(w.message)]


@pytest.mark.parametrize("face", ["gymnasium", "sb3"])
def test_an_env_raising_in_reset_leaves_nothing_pending(no_leaks, face):
    """The reset that raised is over: the next step is not refused as out of order, close() does not
    warn of a pending call (Gymnasium's own test_async_vector_subenv_error counts its warnings)."""
    from stable_baselines3.common.vec_env import VecEnv

    from shmvec import ShmVecEnv

    # Env 0 raises at its second reset; env 1 (another worker) resets fine each time.
    fns = [functools.partial(FaultyEnv, fault="raise", where="reset", at=2), FaultyEnv]
    env: VecEnv | ShmVectorEnv
    if face == "gymnasium":
        env = ShmVectorEnv(fns, start_method="fork", n_workers=2)
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match="misbehaves|reset"):
            env.reset(seed=1)
        env.step(np.zeros(2, np.int64))
    else:
        env = ShmVecEnv(fns, "fork", n_workers=2)
        env.reset()
        with pytest.raises(RuntimeError):
            env.reset()
        env.step(np.zeros(2, np.int64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.close()
