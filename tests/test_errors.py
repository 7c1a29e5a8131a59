"""Mistakes give a clear error naming the env and the cause, never a hang."""

from __future__ import annotations

import functools
import threading

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from shmvec import (
    EnvError,
    EnvTimeoutError,
    ObservationError,
    SharedMemoryTooSmallError,
    ShmVecEnv,
)
from shmvec.memory.ring import check_free_space
from shmvec.synthetic import SyntheticImageEnv
from tests.envs import BadObsEnv, DictImageEnv, NanEnv, SlowStepEnv
from tests.helpers import run_script

IMAGE = functools.partial(SyntheticImageEnv, (16, 16, 3))


def _raise_in_factory():
    raise RuntimeError("simulator license missing")


def test_factory_that_raises_names_env(no_leaks):
    fns = [IMAGE, IMAGE, _raise_in_factory]
    with pytest.raises(EnvError, match="the factory of env 2 raised RuntimeError: simulator license missing"):
        ShmVecEnv(fns, "fork", n_workers=2)


def test_factory_that_returns_no_env(no_leaks):
    with pytest.raises(EnvError, match="returned builtins.str, not a gymnasium.Env"):
        ShmVecEnv([lambda: "CartPole-v1"], "fork")


def test_unpicklable_factory_message(no_leaks):
    lock = threading.Lock()

    def make():
        assert not lock.locked()  # the closure captures a lock, which cannot be pickled
        return IMAGE()

    with pytest.raises(
        TypeError,
        match=r"^the factory of env 1 refers to `lock` \(a _thread.lock\), which cannot be pickled: do not "
        r"capture it.*start_method='fork'.*'spawn'",
    ):
        ShmVecEnv([IMAGE, make], "spawn")


def test_unpicklable_factory_works_with_fork(no_leaks):
    lock = threading.Lock()
    with ShmVecEnv([lambda: (lock, IMAGE())[1]], "fork") as env:
        env.reset()


def test_wrong_number_of_actions(no_leaks):
    with ShmVecEnv([IMAGE] * 3, "fork") as env:
        env.reset()
        with pytest.raises(ValueError, match="expected 3 actions"):
            env.step(np.zeros(2, np.int64))
        env.step(np.zeros(3, np.int64))  # still usable


def test_illegal_start_method():
    with pytest.raises(ValueError, match="cannot find context for 'illegal_method'"):
        ShmVecEnv([IMAGE], "illegal_method")


@pytest.mark.parametrize(
    "bad,message",
    [
        (
            "shape",
            r"env 1, key 'image': observation shape \(8, 8\) does not match the observation space shape \(8, 8, 3\)",
        ),
        (
            "dtype",
            r"env 1, key 'image': observation dtype float32 cannot be stored as the observation space dtype uint8",
        ),
    ],
)
def test_observation_that_does_not_fit(no_leaks, bad, message):
    fns = [functools.partial(BadObsEnv, bad, 10**9), functools.partial(BadObsEnv, bad, 1)]
    with ShmVecEnv(fns, "fork", n_workers=1) as env:
        env.reset()
        with pytest.raises(EnvError, match=message) as info:
            env.step(np.zeros(2, np.int64))
        assert isinstance(info.value.original, ObservationError)


def test_get_attr_missing_and_has_attr(no_leaks):
    with ShmVecEnv([DictImageEnv] * 2, "fork") as env:
        assert env.has_attr("max_len") and not env.has_attr("no_such_attr")
        with pytest.raises(EnvError, match="env 0 raised AttributeError during get_attr:no_such_attr"):
            env.get_attr("no_such_attr")


def test_hung_env_times_out(no_leaks):
    env = ShmVecEnv([functools.partial(SlowStepEnv, 60)] * 2, "fork", timeout=0.5)
    env.reset()
    with pytest.raises(EnvTimeoutError, match=r"did not answer step within 0.5 s"):
        env.step(np.zeros(2, np.int64))
    assert env.closed


def test_shm_too_small_is_refused_before_start(tmp_path):
    with pytest.raises(
        SharedMemoryTooSmallError, match=r"needs .* MiB but .* has only .* MiB free.*--shm-size"
    ):
        check_free_space(1 << 60, str(tmp_path))


def test_workers_use_one_thread_and_no_torch(no_leaks):
    with ShmVecEnv([DictImageEnv] * 2, "spawn") as env:
        assert env.env_method("threads_env") == ["1", "1"]
        assert env.env_method("modules_loaded", "torch") == [False, False]
        assert env.env_method("modules_loaded", "stable_baselines3") == [False, False]


def test_missing_main_guard_gets_a_hint(tmp_path):
    proc = run_script(
        tmp_path / "no_guard.py",
        """
        from shmvec import ShmVecEnv
        from shmvec.synthetic import SyntheticImageEnv
        env = ShmVecEnv([SyntheticImageEnv], "spawn")
        env.close()
        """,
    )
    assert proc.returncode != 0
    assert "WorkerCrashedError" in proc.stderr
    assert 'if __name__ == "__main__":' in proc.stderr


class _MisbehavingEnv(gym.Env):
    """Breaks the gymnasium API in one chosen way."""

    observation_space = spaces.Box(0, 1, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, how: str) -> None:
        self.how = how

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        obs = np.zeros(2, np.float32)
        if self.how == "reset_obs_only":
            return obs
        if self.how == "reset_lock_info":
            return obs, {"ok": 1, "lock": threading.Lock()}
        return obs, {}

    def step(self, action):
        obs = np.zeros(2, np.float32)
        if self.how == "old_gym_step":
            return obs, 0.0, False, {}
        if self.how == "lock_info":
            return obs, 0.0, False, False, {"ok": 1, "handle": threading.Lock()}
        return obs, 0.0, False, False, {}

    def make_lock(self):
        return threading.Lock()


@pytest.mark.parametrize(
    "how,call,message",
    [
        ("reset_obs_only", "reset", r"env 1: reset\(\) must return a tuple \(obs, info\).*got a ndarray"),
        ("old_gym_step", "step", r"env 1: step\(\) must return a tuple .*got a tuple of 4.*old gym API"),
        ("lock_info", "step", r"env 1: info key 'handle' holds a _thread.lock that cannot be pickled"),
        (
            "reset_lock_info",
            "reset",
            r"env 1: reset info key 'lock' holds a _thread.lock that cannot be pickled",
        ),
        (
            "none",
            "method",
            r"env 0: the result of env_method:make_lock holds a _thread.lock that cannot be pickled",
        ),
    ],
)
def test_env_breaking_the_api_is_named(no_leaks, how, call, message):
    fns = [functools.partial(_MisbehavingEnv, "none"), functools.partial(_MisbehavingEnv, how)]
    with ShmVecEnv(fns, "fork", n_workers=1) as env:
        if call != "reset":
            env.reset()
        with pytest.raises(EnvError, match=message) as info:
            if call == "reset":
                env.reset()
            elif call == "step":
                env.step(np.zeros(2, np.int64))
            else:
                env.env_method("make_lock")
        assert info.value.env_index == (0 if call == "method" else 1)
        assert env.get_attr("how") == ["none", how]  # the worker answers normally afterwards


def test_actions_of_the_wrong_type_or_length(no_leaks):
    with ShmVecEnv([IMAGE] * 2, "fork") as env:
        env.reset()
        with pytest.raises(TypeError, match=r"actions must be a sequence of 2 actions .* got int"):
            env.step(3)
        with pytest.raises(ValueError, match="expected 2 actions"):
            env.step([0, 1, 2])
        env.step([0, 1])  # a list goes through the pipe, as with SubprocVecEnv
        env.step(np.zeros(2, np.int64))


@pytest.mark.parametrize(
    "key,value,end,message",
    [
        (
            "bounded",
            float("nan"),
            False,
            r"env 1, key 'bounded': observation contains NaN or inf \(its Box bounds are finite\)",
        ),
        ("bounded", float("inf"), False, r"env 1, key 'bounded': observation contains NaN or inf"),
        ("free", float("nan"), False, r"env 1, key 'free': observation contains NaN"),
        ("free", float("nan"), True, r"env 1, terminal key 'free': observation contains NaN"),
    ],
)
def test_check_finite(no_leaks, key, value, end, message):
    fns = [functools.partial(NanEnv, at=0), functools.partial(NanEnv, key, value, 2, end)]
    with ShmVecEnv(fns, "fork", n_workers=1, check_finite=True) as env:
        env.reset()
        env.step(np.zeros(2, np.int64))
        with pytest.raises(EnvError, match=message) as info:
            env.step(np.zeros(2, np.int64))
        assert isinstance(info.value.original, ObservationError) and info.value.env_index == 1


def test_inf_allowed_in_unbounded_box_and_check_off_by_default(no_leaks):
    fns = [
        functools.partial(NanEnv, "free", float("inf")),
        functools.partial(NanEnv, "bounded", float("nan")),
    ]
    with ShmVecEnv(fns[:1], "fork", check_finite=True) as env:
        env.reset()
        env.step(np.zeros(1, np.int64))
        assert np.isinf(env.step(np.zeros(1, np.int64))[0]["free"]).any()
    with ShmVecEnv(fns[1:], "fork") as env:  # the default passes NaN through, like DummyVecEnv
        env.reset()
        env.step(np.zeros(1, np.int64))
        assert np.isnan(env.step(np.zeros(1, np.int64))[0]["bounded"]).any()
