"""The AsyncVectorEnv calls migrating code uses: ``reset_async``/``reset_wait`` and
``step_async``/``step_wait(timeout=...)``, against SyncVectorEnv, with Gymnasium's timeout error;
``call_async``/``call_wait`` and the errors of calls made while another is pending, against
AsyncVectorEnv itself on the same envs."""

from __future__ import annotations

import functools
import multiprocessing
import re
import time
import warnings
from contextlib import closing

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError

from shmvec import NoPendingCallError, PendingCallError, ShmVectorEnv
from tests.envs import FaultyEnv
from tests.vector_helpers import assert_reset_equal, assert_step_equal

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


class CallEnv(FaultyEnv):
    """FaultyEnv with a method that takes arguments and time."""

    def scaled(self, factor: int, *, offset: int = 0, delay: float = 0.0) -> tuple[int, int]:
        time.sleep(delay)
        return self.steps * factor + offset, self.resets


CALL_FNS = [CallEnv] * 4
# AsyncVectorEnv(shared_memory=False) below: its calls are the same, and multiprocessing's shared
# heap, once made, stays mapped (a descriptor that no_leaks would count).


def test_call_async_and_call_wait_equal_async_vector_env(no_leaks):
    """Methods with arguments, attributes and the synchronous call, after the same steps: the same
    tuples as AsyncVectorEnv's."""
    want = gym.vector.AsyncVectorEnv(CALL_FNS, context="fork", shared_memory=False)
    with closing(ShmVectorEnv(CALL_FNS, start_method="fork", n_workers=2)) as env, closing(want):
        for venv in (env, want):
            venv.reset(seed=5)
            for t in range(3):
                venv.step(np.array([t % 3] * 4))
        for name, args, kwargs in [
            ("scaled", (3,), {"offset": 2}),
            ("steps", (), {}),
            ("np_random_seed", (), {}),
        ]:
            env.call_async(name, *args, **kwargs)
            want.call_async(name, *args, **kwargs)
            got, exp = env.call_wait(timeout=30), want.call_wait(timeout=30)
            assert isinstance(got, tuple) and got == exp, name
        assert env.call("scaled", 2) == want.call("scaled", 2)


def test_call_wait_timeout_leaves_the_call_pending(no_leaks):
    """Past ``timeout`` the call is still in flight (AsyncVectorEnv would forget it): other calls are
    refused, a later call_wait collects it, and the env works on."""
    with closing(ShmVectorEnv(CALL_FNS[:2], start_method="fork", n_workers=2)) as env:
        env.reset(seed=0)
        env.call_async("scaled", 1, delay=0.5)
        with pytest.raises(multiprocessing.TimeoutError):
            env.call_wait(timeout=0.01)
        with pytest.raises(
            AlreadyPendingCallError, match="Calling `step_async` while waiting for a pending call to `call`"
        ):
            env.step_async(np.zeros(2, np.int64))
        with pytest.raises(
            AlreadyPendingCallError, match="Calling `reset` while waiting for a pending call to `call`"
        ):
            env.reset()
        assert env.call_wait(timeout=30) == ((0, 1), (0, 1))
        env.step(np.zeros(2, np.int64))
        assert env.get_attr("steps") == (1, 1) and env.n_restarts == 0
        env.call_async("scaled", 1, delay=0.2)
        with pytest.warns(
            UserWarning, match=re.escape("Calling `close` while waiting for a pending call to `call`")
        ):
            env.close()


def _first_call(venv: gym.vector.VectorEnv, pending: str) -> None:
    """Leave a ``pending`` call (step, reset, call) in flight."""
    if pending == "step":
        venv.step_async(np.zeros(4, np.int64))
    elif pending == "reset":
        venv.reset_async(seed=1)
    else:
        venv.call_async("steps")


SECOND_CALLS = {
    "step_async": lambda v: v.step_async(np.zeros(4, np.int64)),
    "reset_async": lambda v: v.reset_async(),
    "call_async": lambda v: v.call_async("steps"),
    "call": lambda v: v.call("steps"),
    "get_attr": lambda v: v.get_attr("steps"),
    "set_attr": lambda v: v.set_attr("t", 0),
    "render": lambda v: v.render(),
}


@pytest.mark.parametrize("pending", ["step", "reset", "call"])
def test_calls_while_one_is_pending_raise_what_async_vector_env_raises(no_leaks, pending):
    """Every call AsyncVectorEnv refuses while a step, reset or call is pending: the same error type
    (Gymnasium's AlreadyPendingCallError), the same text up to shmvec's advice, the same ``name``;
    then the pending call still completes, and ``call_wait`` with nothing pending is refused alike."""
    want = gym.vector.AsyncVectorEnv(CALL_FNS, context="fork", shared_memory=False)
    with closing(ShmVectorEnv(CALL_FNS, start_method="fork", n_workers=2)) as env, closing(want):
        for venv in (env, want):
            venv.reset(seed=0)
            _first_call(venv, pending)
        for call, make_call in SECOND_CALLS.items():
            errors = []
            for venv in (env, want):
                with pytest.raises(AlreadyPendingCallError) as e:
                    make_call(venv)
                errors.append(e.value)
            got, exp = errors
            assert str(got).startswith(str(exp).rstrip(".")), (call, str(got), str(exp))
            assert got.name == exp.name == pending, call
        for venv in (env, want):
            getattr(venv, f"{pending}_wait")(timeout=30)
            with pytest.raises(NoAsyncCallError) as e:
                venv.call_wait()
            errors.append(str(e.value))
        assert errors[-2] == errors[-1] == "Calling `call_wait` without any prior call to `call_async`."
