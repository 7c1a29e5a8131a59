"""Defects of the engine before the split (issue 9, section 5), each with a test that failed then.

Every test builds its envs with fork and checks for leaks with ``no_leaks``.
"""

from __future__ import annotations

import functools
import os
import pickle
import random
import signal

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from shmvec import EnvError, EnvTimeoutError, ObservationError, ShmVecEnv
from shmvec.synthetic import SyntheticImageEnv, misbehave
from tests.envs import FaultyEnv, NanEnv
from tests.helpers import assert_obs_equal

N_ENVS = 4
ACTIONS = np.ones(N_ENVS, np.int64)


def make(fns, **kwargs) -> ShmVecEnv:
    env = ShmVecEnv(fns, "fork", n_workers=2, **kwargs)
    env.seed(0)
    return env


def _hanging_factory() -> FaultyEnv:
    misbehave("hang")
    raise AssertionError("unreachable")


@pytest.mark.timeout(40)
def test_startup_wait_is_bounded_by_timeout(no_leaks):
    """A factory that hangs: start-up gives up after ``timeout`` (it used to wait at least 60 s)."""
    with pytest.raises(EnvTimeoutError, match=r"did not answer make_env within 1 s"):
        ShmVecEnv([FaultyEnv, _hanging_factory], "fork", n_workers=2, timeout=1.0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("on_crash", ["raise", "restart"])
def test_sending_to_a_stopped_worker_is_bounded(no_leaks, on_crash):
    """A worker that does not read its pipe (here: stopped) and a message larger than the pipe:
    sending gives up after ``timeout`` instead of blocking the main process forever."""
    env = make([FaultyEnv] * N_ENVS, timeout=1.0, on_crash=on_crash)
    try:
        env.reset()
        os.kill(env.processes[1].pid, signal.SIGSTOP)
        with pytest.raises(EnvTimeoutError, match=r"worker 1 .* did not take set_attr:blob within 1 s"):
            env.set_attr("blob", b"x" * (64 << 20))
        if on_crash == "raise":
            assert env.closed
            return
        # Restart mode: the worker was rebuilt; its envs end their episode at the next step.
        assert not env.closed and env.n_restarts == 1
        _, _, dones, infos = env.step(ACTIONS)
        assert dones.tolist() == [False, False, True, True]
        assert "did not take set_attr:blob" in infos[2]["shmvec.restart_reason"]
    finally:
        env.close()


def _flaky_factory(counter: str) -> FaultyEnv:
    """First call: an env that dies at its 3rd step; second call (the first rebuild): the factory
    raises; later calls: a healthy env."""
    with open(counter, "a+") as f:
        f.write("x")
        f.seek(0)
        calls = len(f.read())
    if calls == 2:
        raise RuntimeError("factory failed once")
    return FaultyEnv("kill", 3, "step") if calls == 1 else FaultyEnv()


@pytest.mark.parametrize("max_restarts", [2, 1])
def test_factory_failing_in_a_rebuild_counts_against_the_budget(no_leaks, tmp_path, max_restarts):
    fns = [FaultyEnv] * 3 + [functools.partial(_flaky_factory, str(tmp_path / "calls"))]
    env = make(fns, on_crash="restart", max_restarts=max_restarts, restart_window=None)
    try:
        env.reset()
        env.step(ACTIONS)
        env.step(ACTIONS)
        if max_restarts == 1:  # the failed rebuild is the second restart: over the budget
            with pytest.raises(EnvError, match=r"factory failed once.*restart limit reached"):
                env.step(ACTIONS)
            assert env.closed
            return
        _, _, dones, infos = env.step(ACTIONS)  # env 3 dies; its first rebuild fails, the second works
        assert dones.tolist() == [False, False, True, True] and env.n_restarts == 2
        assert "killed by signal SIGKILL" in infos[3]["shmvec.restart_reason"]
        for _ in range(3):
            env.step(ACTIONS)
    finally:
        env.close()


IMAGE = functools.partial(SyntheticImageEnv, (24, 20, 3), episode_len=(4, 9))


def _image_or_raising(raise_at: int | None) -> SyntheticImageEnv:
    env = IMAGE()
    if raise_at is not None:
        step, count = env.step, [0]

        def failing_step(action):
            count[0] += 1
            if count[0] == raise_at:
                raise RuntimeError("step failed once")
            return step(action)

        env.step = failing_step  # type: ignore[method-assign]
    return env


def test_delta_codec_resynchronises_after_a_failed_step(no_leaks):
    """Env 1 (second of worker 0) raises in one step while envs 0, 2, 3 stepped and encoded a frame
    that is never decoded. The next steps decode (key frames), equal to the same run without codec."""
    fns = [functools.partial(_image_or_raising, 3 if i == 1 else None) for i in range(N_ENVS)]
    runs = []
    for codec in (None, "delta"):
        env = make(fns, codec=codec)
        with env:
            seen = [env.reset()]
            for t in range(8):
                if t == 2:
                    with pytest.raises(EnvError, match="step failed once"):
                        env.step(ACTIONS)
                    continue
                seen.append(env.step(ACTIONS))
        runs.append(seen)
    for t, (raw, coded) in enumerate(zip(*runs)):
        if t == 0:
            assert_obs_equal(coded, raw, "reset")
            continue
        assert_obs_equal(coded[0], raw[0], f"step {t} obs")
        np.testing.assert_array_equal(coded[2], raw[2])
        for i in range(N_ENVS):
            if "terminal_observation" in raw[3][i]:
                assert_obs_equal(coded[3][i]["terminal_observation"], raw[3][i]["terminal_observation"])


def test_codec_with_restart_mode_matches_raw(no_leaks):
    """A codec and on_crash='restart' together: the run equals the same run with raw observations,
    terminal observations of the rebuilt envs included."""
    fns = [functools.partial(FaultyEnv)] * 3 + [functools.partial(FaultyEnv, "kill", 3, "step")]
    runs = []
    for codec in (None, "delta"):
        with make(fns, codec=codec, on_crash="restart") as env:
            runs.append([env.reset(), *(env.step(ACTIONS) for _ in range(8))])
    for t, (raw, coded) in enumerate(zip(*runs)):
        if t == 0:
            assert_obs_equal(coded, raw)
            continue
        assert_obs_equal(coded[0], raw[0], f"step {t}")
        np.testing.assert_array_equal(coded[2], raw[2])
        for i in range(N_ENVS):
            assert sorted(coded[3][i]) == sorted(raw[3][i])
            if "terminal_observation" in raw[3][i]:
                assert_obs_equal(coded[3][i]["terminal_observation"], raw[3][i]["terminal_observation"])
    assert any("shmvec.restarted" in info for step in runs[1][1:] for info in step[3])


def test_codec_with_check_finite(no_leaks):
    fns = [functools.partial(NanEnv, at=0), functools.partial(NanEnv, "free", float("nan"), 2, False)]
    with ShmVecEnv(fns, "fork", n_workers=1, check_finite=True, codec="lz4") as env:
        env.reset()
        env.step(np.zeros(2, np.int64))
        with pytest.raises(EnvError, match=r"env 1, key 'free': observation contains NaN") as info:
            env.step(np.zeros(2, np.int64))
        assert isinstance(info.value.original, ObservationError)


def test_env_error_is_an_instance_of_the_original_type(no_leaks):
    """Code written for DummyVecEnv (``except AttributeError``, as SB3's own VecEnv.__init__) still
    catches a missing attribute; the worker traceback is kept and the error pickles."""
    with make([FaultyEnv, functools.partial(FaultyEnv, "raise", 1, "method")]) as env:
        with pytest.raises(AttributeError) as info:
            env.get_attr("no_such_attribute")
        error = info.value
        assert isinstance(error, EnvError) and error.env_index == 0 and error.worker_index == 0
        assert "get_wrapper_attr" in error.remote_traceback
        copy = pickle.loads(pickle.dumps(error))
        assert isinstance(copy, AttributeError) and isinstance(copy, EnvError)
        assert str(copy) == str(error)
        with pytest.raises(RuntimeError, match="simulated env failure") as info:
            env.env_method("misbehave_now")
        assert isinstance(info.value, EnvError) and info.value.env_index == 1


class _GlobalRngEnv(gym.Env):
    """Draws from the process-global RNGs (as sb3-contrib's InvalidActionEnvDiscrete does)."""

    observation_space = spaces.Box(0, 1000, (2,), np.int64)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([np.random.randint(1000), int(random.random() * 1000)], np.int64)

    def step(self, action):
        return self._obs(), 0.0, False, False, {}


def _global_rng_run(n_workers: int, isolate: bool, vec_cls=ShmVecEnv) -> list[np.ndarray]:
    kwargs = {"n_workers": n_workers, "isolate_rng": isolate} if vec_cls is ShmVecEnv else {}
    env = vec_cls([_GlobalRngEnv] * N_ENVS, "fork", **kwargs)
    try:
        return [env.reset(), *(env.step(ACTIONS)[0] for _ in range(5))]
    finally:
        env.close()


def test_isolated_global_rng_does_not_depend_on_n_workers(no_leaks):
    """With isolate_rng each env draws from np.random what it would draw alone in a forked process:
    the same for 1 or 4 workers, and what SubprocVecEnv (fork) gives; shared (the default), envs
    packed into one worker share one stream. ``random.*`` is reseeded in every forked process, so
    there each env only gets a stream of its own."""
    from stable_baselines3.common.vec_env import SubprocVecEnv

    one, four = _global_rng_run(1, True), _global_rng_run(4, True)
    subproc = _global_rng_run(4, False, SubprocVecEnv)
    for t, (a, b, c) in enumerate(zip(one, four, subproc)):
        assert_obs_equal(a[:, 0], b[:, 0], f"step {t}")
        assert_obs_equal(a[:, 0], c[:, 0], f"step {t} vs SubprocVecEnv")
        assert len(set(a[:, 1].tolist())) > 1 or t > 0  # own random.* streams, not one copied state
    shared = _global_rng_run(1, False)
    assert any((x[:, 0] != y[:, 0]).any() for x, y in zip(shared, one))
