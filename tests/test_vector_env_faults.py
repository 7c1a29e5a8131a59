"""ShmVectorEnv when an env or its worker fails: raise mode reports it and stays usable (or closes
itself, for a lost worker); restart mode rebuilds the worker and says so in the infos, with the
episodes the agent saw ended by truncation. Every test uses ``no_leaks``."""

from __future__ import annotations

import functools
from contextlib import closing

import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from shmvec import ClosedError, EnvError, EnvTimeoutError, WorkerCrashedError
from shmvec.engine.restart import RESTARTED_KEY, restart_seed
from tests.envs import CRASHES, FaultyEnv
from tests.helpers import assert_obs_equal
from tests.vector_helpers import (
    ACTIONS,
    N_ENVS,
    NEXT,
    SAME,
    WHERE,
    assert_restarted,
    faulty_fns,
    make,
    not_restarted,
    trigger,
)

# ---------------------------------------------------------------- faults: raise mode


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("fault", ["kill", "segv", "raise", "hang"])
def test_fault_in_raise_mode(no_leaks, fault, where):
    env = make(faulty_fns(fault, where), on_crash="raise", timeout=0.5 if fault == "hang" else None)
    try:
        env.reset(seed=0)
        command = {"step": "step", "reset": "reset", "call": r"\S*misbehave_now"}[where]
        if fault == "raise":
            # An env that raises leaves its worker alive: reported, and the env stays usable.
            with pytest.raises(EnvError, match=rf"env 3 raised RuntimeError during {command}") as info:
                trigger(env, where)
            assert info.value.env_index == 3 and isinstance(info.value, RuntimeError)
            assert "misbehave" in info.value.remote_traceback
            env.reset(seed=0)
            env.step(ACTIONS)
            return
        if fault == "hang":
            with pytest.raises(
                EnvTimeoutError,
                match=rf"worker 1 \(pid \d+, envs 2\.\.3\) did not answer {command} within 0.5 s",
            ) as info:
                trigger(env, where)
        else:
            with pytest.raises(WorkerCrashedError, match=CRASHES[fault].format(command=command)) as info:
                trigger(env, where)
            assert info.value.exitcode is not None and info.value.worker_pid is not None
        assert info.value.worker_index == 1 and info.value.env_indices == [2, 3]
        assert env.closed  # a dead or hung worker closes the env in raise mode
        with pytest.raises(ClosedError):
            env.step(ACTIONS)
    finally:
        env.close()


@pytest.mark.parametrize("codec", [None, "delta"])
def test_stepping_on_after_an_env_error(no_leaks, codec):
    """After an EnvError in step (raise mode), stepping on without a reset works; with the delta codec
    too (issue 9: it raised "frame lost" until reset()). The envs that did step in the failed call
    (0, 1 and 2, before the victim) match a run without the fault."""
    ref = SyncVectorEnv(faulty_fns(None))
    with closing(make(faulty_fns("raise"), codec=codec)) as env, closing(ref):
        assert_obs_equal(env.reset(seed=0)[0], ref.reset(seed=0)[0])
        with pytest.raises(EnvError):
            trigger(env, "step")
        for _ in range(3):
            ref.step(ACTIONS)
        for t in (4, 5, 6):
            obs, rewards, terminations, truncations, _ = env.step(ACTIONS)
            r_obs, r_rewards, r_terminations, r_truncations, _ = ref.step(ACTIONS)
            assert_obs_equal(obs[:3], r_obs[:3], f"step {t}")
            np.testing.assert_array_equal(rewards[:3], r_rewards[:3])
            np.testing.assert_array_equal(terminations, r_terminations)  # FaultyEnv's t went on
            np.testing.assert_array_equal(truncations, r_truncations)


# ---------------------------------------------------------------- faults: restart mode


def _beside_reference(env, steps: int):
    """Reset ``env`` (faulty_fns' 4 envs, restart mode) and a SyncVectorEnv without the fault
    (seed 0), step both ``steps`` times, check that worker 0's envs (0 and 1) get exactly what the
    reference gives, and yield ``(t, the previous obs, env's step)`` from t = 1."""
    with closing(SyncVectorEnv(faulty_fns(None))) as ref:
        obs, _ = env.reset(seed=0)
        assert_obs_equal(obs, ref.reset(seed=0)[0])
        for t in range(1, steps + 1):
            prev = obs
            result = env.step(ACTIONS)
            want = ref.step(ACTIONS)
            obs = result[0]
            assert_obs_equal(obs[:2], want[0][:2], f"step {t}")
            for got_k, want_k in zip(result[1:4], want[1:4]):  # rewards, terminations, truncations
                np.testing.assert_array_equal(got_k[:2], want_k[:2])
            yield t, prev, result


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["kill", "segv", "raise", "hang"])
def test_fault_in_step_restarts(no_leaks, fault):
    """NEXT_STEP: the rebuilt worker's envs end their episode by truncation, with the last observation
    the agent saw and reward 0; at the next step they start a new episode. The other worker's envs
    get exactly what a run without the fault gives them."""
    env = make(faulty_fns(fault), on_crash="restart", timeout=1.0 if fault == "hang" else None)
    with closing(env):
        for t, prev, (obs, rewards, terminations, truncations, infos) in _beside_reference(env, 5):
            if t == 3:  # the victim fails at its third step
                assert truncations[2:].all() and not terminations[2:].any()
                assert_obs_equal(obs[2:], prev[2:], "last observation of the rebuilt envs")
                assert rewards[2:].tolist() == [0.0, 0.0]
                assert_restarted(infos, [2, 3], fault, "step")
            elif t == 4:  # NEXT_STEP: the rebuilt envs start their new episode now
                assert not truncations[2:].any() and not terminations[2:].any()
                assert rewards[2:].tolist() == [0.0, 0.0]
            else:
                assert not_restarted(infos)
        assert env.get_attr("steps")[2:] == (1, 1)  # rebuilt at step 3, stepped once since (t=5)


@pytest.mark.timeout(120)
def test_fault_in_step_restarts_same_step(no_leaks):
    """SAME_STEP: final_obs of a rebuilt env is the last observation the agent saw; the observation
    returned is the first of its new episode; the restart keys are in the infos or in final_info."""
    env = make(faulty_fns("kill"), on_crash="restart", autoreset_mode=SAME)
    with closing(env):
        obs, _ = env.reset(seed=0)
        for _ in range(2):
            obs, *_ = env.step(ACTIONS)
        new_obs, rewards, terminations, truncations, infos = env.step(ACTIONS)
        assert truncations.tolist() == [False, False, True, True] and not terminations.any()
        assert infos["_final_obs"].tolist() == [False, False, True, True]
        for i in (2, 3):
            assert_obs_equal(infos["final_obs"][i], obs[i], f"final_obs[{i}]")
        where = infos if RESTARTED_KEY in infos else infos["final_info"]
        assert_restarted(where, [2, 3], "kill", "step")
        assert env.get_attr("steps")[2:] == (0, 0)  # a fresh env, reset, not stepped yet
        for i in (2, 3):  # the observation returned is the rebuilt env's first one
            rebuilt = FaultyEnv()
            first, _ = rebuilt.reset(seed=restart_seed(i, 1))
            assert_obs_equal(new_obs[i], first, f"obs[{i}]")
        env.step(ACTIONS)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("codec", ["lz4", "delta"])
def test_restart_with_codec(no_leaks, codec):
    """Restart mode and a codec together: the rebuilt envs end their episode with the last observation
    (decoded), and every env, the rebuilt ones' new episodes included, goes on decoding exactly."""
    env = make(faulty_fns("kill"), on_crash="restart", codec=codec)
    with closing(env):
        for t, prev, (obs, _, _, truncations, infos) in _beside_reference(env, 8):
            if t == 3:
                assert truncations[2:].all()
                assert_obs_equal(obs[2:], prev[2:], "last observation of the rebuilt envs")
                assert_restarted(infos, [2, 3], "kill", "step")
            elif t == 4:  # the new episodes' first observations, from their restart seeds
                for i in (2, 3):
                    assert_obs_equal(obs[i], FaultyEnv().reset(seed=restart_seed(i, 1))[0], f"obs[{i}]")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.name)
def test_restart_when_the_autoreset_fails(no_leaks, mode):
    """Env 3 dies in its second reset: the autoreset after its first episode (at its 5th step), inside
    step(). The worker is rebuilt, its envs report the restart, the other envs are unaffected."""
    ref = SyncVectorEnv(faulty_fns(None), autoreset_mode=mode)
    env = make(faulty_fns("kill", "reset"), on_crash="restart", autoreset_mode=mode)
    restarted_at = []
    with closing(env), closing(ref):
        assert_obs_equal(env.reset(seed=0)[0], ref.reset(seed=0)[0])
        for t in range(1, 10):
            obs, rewards, terminations, truncations, infos = env.step(ACTIONS)
            r_obs, r_rewards, r_terminations, r_truncations, _ = ref.step(ACTIONS)
            assert_obs_equal(obs[:2], r_obs[:2], f"step {t}")
            np.testing.assert_array_equal(rewards[:2], r_rewards[:2])
            np.testing.assert_array_equal(terminations[:2], r_terminations[:2])
            np.testing.assert_array_equal(truncations[:2], r_truncations[:2])
            where = infos.get("final_info", {}) if RESTARTED_KEY not in infos else infos
            if RESTARTED_KEY in where and where[f"_{RESTARTED_KEY}"].any():
                assert where[f"_{RESTARTED_KEY}"].tolist() == [False, False, True, True]
                restarted_at.append(t)
        # NEXT_STEP resets at the step after the 5th, SAME_STEP within the 5th.
        assert restarted_at == ([6] if mode == NEXT else [5])


def test_restart_seeds(no_leaks):
    """A rebuilt env is reset with restart_seed(its last seed, restart count), as on the SB3 face:
    the same run gives the same seeds, different envs get different ones."""
    env = make(faulty_fns("kill"), on_crash="restart")
    with closing(env):
        env.reset(seed=0)
        trigger(env, "step")
        obs, _, _, _, infos = env.step(ACTIONS)  # NEXT_STEP: the reset of the new episode
        assert infos["_seed"][2:].tolist() == [True, True]
        assert infos["seed"][2:].tolist() == [restart_seed(2, 1), restart_seed(3, 1)]
        for i in (2, 3):
            rebuilt = FaultyEnv()
            assert_obs_equal(obs[i], rebuilt.reset(seed=restart_seed(i, 1))[0], f"obs[{i}]")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["kill", "segv", "raise", "hang"])
def test_fault_in_reset_restarts(no_leaks, fault):
    """The rebuilt envs are reset with the seeds reset() asked for: the batch equals a clean run's."""
    ref = SyncVectorEnv(faulty_fns(None))
    env = make(faulty_fns(fault, "reset"), on_crash="restart", timeout=1.0 if fault == "hang" else None)
    with closing(env), closing(ref):
        env.reset(seed=0)
        obs, infos = trigger(env, "reset")  # reset(seed=10)
        ref.reset(seed=0)
        r_obs, r_infos = ref.reset(seed=10)
        assert_obs_equal(obs, r_obs)
        assert infos["seed"].tolist() == r_infos["seed"].tolist() == [10, 11, 12, 13]
        assert_restarted(infos, [2, 3], fault, "reset")
        _, _, terminations, truncations, infos = env.step(ACTIONS)
        assert not terminations.any() and not truncations.any() and not_restarted(infos)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["kill", "segv", "raise", "hang"])
def test_fault_in_call_in_restart_mode(no_leaks, fault):
    """A query (call/get_attr/render) is never retried: a raising env is reported and nothing is
    restarted; a dead or hung worker is rebuilt, its error raised, and the env stays open with the
    rebuilt envs ending their episode at the next step."""
    env = make(faulty_fns(fault, "call"), on_crash="restart", timeout=1.0 if fault == "hang" else None)
    with closing(env):
        obs, _ = env.reset(seed=0)
        if fault == "raise":
            with pytest.raises(EnvError, match=r"env 3 raised RuntimeError during \S*misbehave_now"):
                trigger(env, "call")
            _, _, terminations, truncations, infos = env.step(ACTIONS)
            assert not truncations.any() and not_restarted(infos)
            return
        error = EnvTimeoutError if fault == "hang" else WorkerCrashedError
        with pytest.raises(error, match="restarted"):
            trigger(env, "call")
        assert not env.closed
        new_obs, rewards, terminations, truncations, infos = env.step(ACTIONS)
        assert truncations.tolist() == [False, False, True, True] and not terminations.any()
        assert_obs_equal(new_obs[2:], obs[2:], "last observation of the rebuilt envs")
        assert_restarted(infos, [2, 3], fault, r"\S*misbehave_now")
        env.step(ACTIONS)
        env.step(ACTIONS)


def test_restart_limit_raises_and_closes(no_leaks):
    fns = [functools.partial(FaultyEnv)] * N_ENVS
    fns[3] = functools.partial(FaultyEnv, "kill", 1, "step")  # every rebuilt env dies at its 1st step
    env = make(fns, on_crash="restart", max_restarts=2, restart_window=None)
    env.reset(seed=0)
    with pytest.raises(WorkerCrashedError, match=r"restart limit reached: max_restarts=2"):
        for _ in range(10):
            env.step(ACTIONS)
    assert env.closed
    env.close()
