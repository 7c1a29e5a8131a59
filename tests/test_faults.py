"""Fault injection: killed, crashing, raising and hung envs, in raise mode and in restart mode.

Every case asserts the error (raise mode) or the recovery (restart mode), no hang (a per-test timeout
far above any expected duration, never a bound on elapsed time) and, through ``no_leaks``, zero
leaked segments, processes and file descriptors.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import types

import numpy as np
import pytest

from shmvec import ClosedError, EnvError, EnvTimeoutError, ShmVecEnv, WorkerCrashedError
from shmvec.engine.restart import REASON_KEY, RESTARTED_KEY, restart_seed
from tests.envs import CRASHES, FaultyEnv, Gate
from tests.fault_helpers import ACTIONS, faulty_fns
from tests.helpers import assert_obs_equal, wait_until


def make(fns, **kwargs) -> ShmVecEnv:
    env = ShmVecEnv(fns, "fork", n_workers=2, **kwargs)
    env.seed(0)
    return env


# ---------------------------------------------------------------- raise mode


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", sorted(CRASHES))
def test_crash_in_step_raises(no_leaks, fault):
    env = make(faulty_fns(fault))
    # The workers' fault logs are unlinked as soon as the workers run: nothing to leak in /tmp.
    assert len(env._engine.transport.res.fault_logs) == 2 and not any(
        os.path.exists(p) for _, p in env._engine.transport.res.fault_logs
    )
    env.reset()
    env.step(ACTIONS)
    env.step(ACTIONS)
    with pytest.raises(WorkerCrashedError, match=CRASHES[fault].format(command="step")) as info:
        env.step(ACTIONS)
    err = info.value
    assert err.worker_index == 1 and err.env_indices == [2, 3] and err.command == "step"
    assert err.worker_pid is not None and err.exitcode is not None
    if fault in ("segv", "abort"):  # faulthandler's stack of the worker travels with the error
        assert "in misbehave" in err.remote_traceback and "Fault in the worker" in str(err)
        assert "its Python stack is in remote_traceback" in str(err)
    else:
        assert err.remote_traceback == ""
    assert env.closed
    env.close()
    with pytest.raises(ClosedError, match="closed by a failure: a worker died or hung"):
        env.step(ACTIONS)


def test_exception_in_step_raises_env_error(no_leaks):
    with make(faulty_fns("raise")) as env:
        env.reset()
        env.step(ACTIONS)
        env.step(ACTIONS)
        with pytest.raises(
            EnvError, match="env 3 raised RuntimeError during step: simulated env failure"
        ) as info:
            env.step(ACTIONS)
        assert info.value.env_index == 3 and info.value.command == "step"
        assert "misbehave" in info.value.remote_traceback
        assert isinstance(info.value.original, RuntimeError)
        env.reset()  # usable again after a reset
        env.step(ACTIONS)


@pytest.mark.timeout(60)
def test_hang_in_step_times_out(no_leaks):
    env = make(faulty_fns("hang"), timeout=0.5)
    env.reset()
    env.step(ACTIONS)
    env.step(ACTIONS)
    with pytest.raises(
        EnvTimeoutError, match=r"worker 1 \(pid \d+, envs 2\.\.3\) did not answer step within 0.5 s"
    ):
        env.step(ACTIONS)
    assert env.closed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("when", ["idle", "step", "reset"])
@pytest.mark.parametrize("mode", ["raise", "restart"])
def test_worker_killed_from_outside(no_leaks, tmp_path, when, mode):
    """SIGKILL (the OOM killer, a user) while the worker waits, steps (env 3 has said that it is
    inside ``step``: the kill cannot land before the step began nor after it ended) or resets."""
    gate = Gate(tmp_path / "gate")
    fns = faulty_fns(None)
    fns[3] = functools.partial(FaultyEnv, gate=gate.path)
    env = make(fns, on_crash=mode)
    obs = env.reset()
    victim = env.processes[1]
    old_pid = victim.pid
    if when == "step":
        gate.close()
        env.step_async(ACTIONS)
        wait_until(lambda: os.path.exists(gate.waiting), "env 3 inside step")
    os.kill(old_pid, signal.SIGKILL)
    victim.join(30)
    if when == "step":
        gate.open()  # for the rebuilt env 3 (restart mode)
    call = {"idle": lambda: env.step(ACTIONS), "step": env.step_wait, "reset": env.reset}[when]
    command = "reset" if when == "reset" else "step"
    if mode == "raise":
        with pytest.raises(
            WorkerCrashedError,
            match=rf"worker 1 \(pid {old_pid}, envs 2\.\.3\) was killed by signal SIGKILL during {command}",
        ):
            call()
        assert env.closed
    else:
        result = call()
        assert env.processes[1].pid != old_pid and env.processes[1].is_alive()
        assert env.n_restarts == 1
        if when == "reset":
            for i in (2, 3):
                assert env.reset_infos[i][RESTARTED_KEY] is True
        else:
            new_obs, rewards, dones, infos = result
            assert dones.tolist() == [False, False, True, True]
            for i in (2, 3):
                assert infos[i][RESTARTED_KEY] is True and "SIGKILL" in infos[i][REASON_KEY]
                assert infos[i]["TimeLimit.truncated"] is True
                assert_obs_equal(infos[i]["terminal_observation"], obs[i])
                assert rewards[i] == 0
            assert RESTARTED_KEY not in infos[0] and RESTARTED_KEY not in infos[1]
        env.step(ACTIONS)  # goes on normally
        env.close()


# ---------------------------------------------------------------- restart mode


@pytest.mark.parametrize("fault", [*sorted(CRASHES), "raise", "hang"])
def test_restart_after_fault_in_step(no_leaks, fault):
    """The faulty env's worker is rebuilt; its envs end the episode with their last observation; the
    other worker's envs get exactly what a run without the fault gives them."""
    clean = make(faulty_fns(None))
    env = make(faulty_fns(fault), on_crash="restart", timeout=1.0 if fault == "hang" else None)
    try:
        obs = env.reset()
        assert_obs_equal(obs, clean.reset())
        for t in range(1, 5):
            prev = obs
            obs, rewards, dones, infos = env.step(ACTIONS)
            c_obs, c_rewards, c_dones, c_infos = clean.step(ACTIONS)
            assert_obs_equal(obs[:2], c_obs[:2], f"step {t}")
            np.testing.assert_array_equal(rewards[:2], c_rewards[:2])
            np.testing.assert_array_equal(dones[:2], c_dones[:2])
            if t == 3:  # the victim (env 3) fails at its third step
                assert dones[2:].all() and env.n_restarts == 1
                for i in (2, 3):
                    assert infos[i][RESTARTED_KEY] is True
                    assert infos[i]["TimeLimit.truncated"] is True
                    assert_obs_equal(infos[i]["terminal_observation"], prev[i])
                reason = infos[3][REASON_KEY]
                if fault in CRASHES:
                    assert re.search(CRASHES[fault].format(command="step"), reason), reason
                elif fault == "raise":
                    assert "env 3 raised RuntimeError during step: simulated env failure" in reason
                else:
                    assert "did not answer step within 1 s" in reason
            else:
                assert RESTARTED_KEY not in infos[3]
    finally:
        env.close()
        clean.close()


def test_restart_seeds_reproducible_and_distinct(no_leaks):
    runs = []
    for _ in range(2):
        with make(faulty_fns("kill", victim=2), on_crash="restart") as env:
            env.reset()
            for _ in range(3):
                result = env.step(ACTIONS)
            runs.append((result[0], env.reset_infos[2:4]))
    assert_obs_equal(runs[0][0], runs[1][0])
    seeds = [info["seed"] for info in runs[0][1]]
    assert seeds == [restart_seed(2, 1), restart_seed(3, 1)]
    assert len(set(seeds)) == 2 and not set(seeds) & {0, 1, 2, 3}
    assert restart_seed(2, 2) not in seeds and restart_seed(None, 1) is None


@pytest.mark.timeout(60)
def test_restart_limit_raises(no_leaks):
    """An env that crashes on every start is a crash loop: after max_restarts the error is raised."""
    env = make(faulty_fns("kill", at=1), on_crash="restart", max_restarts=2, restart_window=None)
    env.reset()
    with pytest.raises(
        WorkerCrashedError, match=r"SIGKILL during step \(restart limit reached: max_restarts=2"
    ):
        for _ in range(10):
            env.step(ACTIONS)
    assert env.closed and env.n_restarts == 2


def test_restart_budget_window(monkeypatch):
    """Two restarts within any 0.25 s: a third counts once the first is more than 0.25 s old (the
    budget's clock is the test's; times exact in binary)."""
    from shmvec.engine import restart

    now = [0.0]
    monkeypatch.setattr(restart, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    budget = restart.RestartBudget(2, 0.25)
    assert budget.take()
    now[0] = 0.125
    assert budget.take() and not budget.take()
    now[0] = 0.25  # the first is exactly 0.25 s old: still inside the window
    assert not budget.take()
    now[0] = 0.375
    assert budget.take() and not budget.take() and budget.total == 3
    never = restart.RestartBudget(1, None)
    assert never.take()
    now[0] = 1e9
    assert not never.take() and never.total == 1
    with pytest.raises(ValueError):
        restart.RestartBudget(-1, None)


def test_restart_needs_two_slots():
    with pytest.raises(ValueError, match="n_slots >= 2"):
        ShmVecEnv([FaultyEnv], "fork", on_crash="restart", n_slots=1)
    with pytest.raises(ValueError, match="on_crash must be one of"):
        ShmVecEnv([FaultyEnv], "fork", on_crash="ignore")


@pytest.mark.parametrize("fault", ["raise", "kill"])
@pytest.mark.parametrize("mode", ["raise", "restart"])
def test_fault_in_reset(no_leaks, fault, mode):
    """The second reset() fails in env 3 (the first one built the episode)."""
    env = make(faulty_fns(fault, at=2, where="reset"), on_crash=mode)
    env.reset()
    env.step(ACTIONS)
    if mode == "raise":
        expected = EnvError if fault == "raise" else WorkerCrashedError
        with pytest.raises(
            expected, match=r"env 3 raised RuntimeError during reset" if fault == "raise" else "during reset"
        ):
            env.reset()
        if fault == "raise":
            assert not env.closed
            env.close()
        assert env.closed
        return
    with env:
        env.seed(10)
        obs = env.reset()
        # The rebuilt env is reset with the seed reset() asked for, so it matches a clean run.
        with make(faulty_fns(None)) as clean:
            clean.seed(10)
            assert_obs_equal(obs, clean.reset())
        assert [info.get(RESTARTED_KEY, False) for info in env.reset_infos] == [False, False, True, True]
        assert env.reset_infos[3]["seed"] == 13
        env.step(ACTIONS)


@pytest.mark.parametrize("fault", ["raise", "kill"])
@pytest.mark.parametrize("mode", ["raise", "restart"])
@pytest.mark.parametrize("where", ["render", "method"])
def test_fault_in_render_and_env_method(no_leaks, fault, mode, where):
    env = make(faulty_fns(fault, where=where), on_crash=mode)
    obs = env.reset()
    call = env.get_images if where == "render" else functools.partial(env.env_method, "misbehave_now")
    command = "render" if where == "render" else "env_method:misbehave_now"
    if fault == "raise":
        # An env that raises in a query is reported, never restarted: the worker and its envs are fine.
        with pytest.raises(EnvError, match=f"env 3 raised RuntimeError during {command}"):
            call()
        assert not env.closed and env.n_restarts == 0
        env.step(ACTIONS)
        env.close()
        return
    with pytest.raises(
        WorkerCrashedError,
        match=rf"worker 1 \(pid \d+, envs 2\.\.3\) was killed by signal SIGKILL during {command}",
    ) as info:
        call()
    if mode == "raise":
        assert env.closed
        return
    assert "the worker was restarted" in str(info.value)
    assert not env.closed and env.n_restarts == 1
    # The rebuilt envs end their episode at the next step, with the last observation the agent saw.
    _, _, dones, infos = env.step(ACTIONS)
    assert dones.tolist() == [False, False, True, True]
    assert_obs_equal(infos[2]["terminal_observation"], obs[2])
    assert "during " + command in infos[2][REASON_KEY]
    env.close()


def test_crash_during_restart_reset_is_retried(no_leaks):
    """The rebuilt env crashes in its own first reset: rebuilt again, within the budget."""
    # Env 3 dies at its third step; its rebuilt versions die in their first reset (the factories
    # kept for rebuilds are swapped after the start).
    env = make(faulty_fns("kill", at=3), on_crash="restart", max_restarts=3, restart_window=None)
    env._engine.transport.procs.worker_fns[1] = [
        functools.partial(FaultyEnv),
        functools.partial(FaultyEnv, "kill", 1, "reset"),
    ]
    env.reset()
    with pytest.raises(WorkerCrashedError, match=r"during reset \(restart limit reached: max_restarts=3"):
        for _ in range(5):
            env.step(ACTIONS)
    assert env.n_restarts == 3 and env.closed


def test_terminal_observation_when_the_previous_slot_is_rewritten(no_leaks):
    """copy=True with 2 slots and the caller holding on to an old batch: no slot is free, so the
    workers write over the slot of the last batch; a crash then still reports that batch's obs."""
    env = make(faulty_fns("kill", at=3), on_crash="restart", n_slots=2)
    try:
        held = env.reset()  # kept: its slot stays lent
        env.step(ACTIONS)
        before_crash, _, _, _ = env.step(ACTIONS)
        obs, _, dones, infos = env.step(ACTIONS)  # env 3 dies at its third step
        assert dones[2:].all() and infos[3][RESTARTED_KEY]
        for i in (2, 3):
            assert_obs_equal(infos[i]["terminal_observation"], before_crash[i])
        assert env.copy_fallbacks > 0  # the scenario really had no free slot
        del held
    finally:
        env.close()


@pytest.mark.timeout(60)
def test_close_with_a_hung_step_pending_is_bounded(no_leaks):
    env = make(faulty_fns("hang", at=1))
    env.reset()
    env.step_async(ACTIONS)
    env.close()  # waits a few seconds for the worker, then kills it
    assert env.closed


def test_restart_with_forkserver(no_leaks):
    """With spawn/forkserver the rebuilt worker gets the pickled factories kept in the main process."""
    fns = faulty_fns("exit", at=2)
    with ShmVecEnv(fns, "forkserver", n_workers=2, on_crash="restart") as env:
        env.seed(0)
        env.reset()
        env.step(ACTIONS)
        _, _, dones, infos = env.step(ACTIONS)
        assert dones[2:].all() and "exited with code 3 during step" in infos[3][REASON_KEY]
        assert env.n_restarts == 1
        env.step(ACTIONS)
