"""The doorbell's wake-up path (shmvec.memory.doorbell): one wake-up per batch, no busy-waiting, and
every failure still noticed: a worker killed while the main process sleeps on the doorbell, a hung
one, a worker that dies after it finished its part of a batch."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from multiprocessing.process import BaseProcess

import numpy as np
import pytest

from shmvec import EnvTimeoutError, ShmVecEnv, ShmVectorEnv, WorkerCrashedError
from shmvec.memory.doorbell import available
from tests.envs import FaultyEnv
from tests.helpers import assert_step_equal

pytestmark = pytest.mark.skipif(not available(), reason="the doorbell needs Linux futexes")

SLOW = functools.partial(FaultyEnv, delay=0.5)


def test_a_synchronous_step_waits_without_spinning(no_leaks):
    """While a step of envs that sleep 0.5 s is out, the main process uses almost no CPU (CPU time,
    not wall-clock time): it sleeps in epoll until the last worker's eventfd write."""
    with ShmVecEnv([SLOW] * 4, "fork", n_workers=2) as env:
        env.reset()
        env.step(np.zeros(4, np.int64))
        cpu = time.process_time()
        env.step(np.zeros(4, np.int64))
        assert time.process_time() - cpu < 0.03


def test_a_worker_killed_while_the_main_process_sleeps(no_leaks):
    """Its process sentinel wakes the main process: WorkerCrashedError naming it, no hang."""
    with ShmVecEnv([SLOW] * 4, "fork", n_workers=2) as env:
        env.reset()
        victim = env.processes[1].pid
        threading.Timer(0.2, os.kill, (victim, signal.SIGKILL)).start()
        start = time.monotonic()
        with pytest.raises(
            WorkerCrashedError, match=r"worker 1 \(pid \d+, envs 2\.\.3\) was killed by signal SIGKILL"
        ):
            env.step(np.zeros(4, np.int64))
        assert time.monotonic() - start < 30  # a hang check, not a speed figure
        assert env.closed


def test_a_hung_worker_times_out(no_leaks):
    hang = functools.partial(FaultyEnv, "hang", 2, "step")
    with ShmVecEnv([FaultyEnv, FaultyEnv, hang, FaultyEnv], "fork", n_workers=2, timeout=0.5) as env:
        env.reset()
        env.step(np.zeros(4, np.int64))
        with pytest.raises(
            EnvTimeoutError, match=r"worker 1 \(pid \d+, envs 2\.\.3\) did not answer step within 0.5 s"
        ):
            env.step(np.zeros(4, np.int64))


def test_a_worker_killed_after_its_part_of_a_batch(no_leaks):
    """Worker 0 is killed once its part of a batch is done, while worker 1's envs still sleep: its
    death shows (sentinel) even though it sends nothing more, and restart mode rebuilds it."""
    fns = [FaultyEnv, FaultyEnv, SLOW, SLOW]
    with ShmVecEnv(fns, "fork", n_workers=2, on_crash="restart") as env:
        env.reset()
        victim = env.processes[0].pid
        threading.Timer(0.2, os.kill, (victim, signal.SIGKILL)).start()
        start = time.monotonic()
        for _ in range(3):
            env.step(np.zeros(4, np.int64))
        assert time.monotonic() - start < 30
        assert env.n_restarts == 1


def test_close_right_after_a_command_lets_every_worker_exit_on_its_own(no_leaks, monkeypatch):
    """A worker woken for a command reads its words when it gets a CPU; close() posted right after
    the command must not overwrite them before that (the worker then ran the old command under the
    close's number and slept through the close until it was terminated). Every worker exits by
    itself: close() never has to terminate one."""
    terminated = []
    monkeypatch.setattr(BaseProcess, "terminate", lambda self: terminated.append(self.pid) or self.kill())
    fns = [functools.partial(FaultyEnv, delay=0.01)] * 8
    for _ in range(10):
        env = ShmVectorEnv(fns, start_method="fork", batch_size=2, n_workers=4)
        env.async_reset(seed=0)  # every worker gets a Reset: some are still asleep at close()
        env.close()
    assert terminated == []


def test_replies_through_pipes_stay_in_the_one_wake_up_wait(no_leaks, monkeypatch):
    """Infos the ring does not hold (typed columns off here) come through the workers' pipes; the
    synchronous step reads them as they come inside its one wait on the doorbell, without falling
    back to the general wait loop (which used to cost an extra wake-up and a look at every worker)."""
    from shmvec.transports.local import LocalTransport
    from tests.info_envs import make_info_env

    looked: list[int] = []
    collect = LocalTransport._collect

    def counting(self, pending, outcome):
        looked.append(len(pending))
        return collect(self, pending, outcome)

    monkeypatch.setattr(LocalTransport, "_collect", counting)
    fn = functools.partial(make_info_env, "stable", max_steps=1000, lengths=(1000, 1001))
    with ShmVecEnv([fn] * 4, "fork", n_workers=2, info_keys=None) as env:
        env.reset()
        looked.clear()
        for t in range(1, 6):
            _, _, _, infos = env.step(np.zeros(4, np.int64))
            assert [info["t"] for info in infos] == [t] * 4 and infos[0]["name"] == f"step {t}"
    assert looked == []


def test_replies_larger_than_a_pipe_during_a_synchronous_step(no_leaks):
    """An info of 1 MiB every third step: the worker blocks writing it until the main process reads
    it inside the step's wait; the infos equal DummyVecEnv's, step after step."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from tests.info_envs import make_big_info_env

    fn = functools.partial(make_big_info_env, 3, 1 << 20)
    ref = DummyVecEnv([fn] * 4)
    with ShmVecEnv([fn] * 4, "fork", n_workers=2) as env:
        for venv in (env, ref):
            venv.seed(0)
            venv.reset()
        for t in range(1, 8):
            got, want = env.step(np.zeros(4, np.int64))[3], ref.step(np.zeros(4, np.int64))[3]
            assert [i.get("blob") for i in got] == [i.get("blob") for i in want], f"step {t}"
            assert [i["t"] for i in got] == [i["t"] for i in want] == [t] * 4
            assert ("blob" in got[0]) == (t % 3 == 0)
    ref.close()


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 16, 17, 20, 33, 64, 70])
def test_leaders_and_their_followers_cover_every_worker_once(n):
    from shmvec.memory.doorbell import FAN_OUT_GROUP, followers, leaders

    first = leaders(n)
    woken = first + [v for w in first for v in followers(w, n)]
    assert sorted(woken) == list(range(n))
    # The main process wakes one worker per group, below FAN_OUT_GROUP workers too (see leaders()).
    assert first == list(range(0, n, FAN_OUT_GROUP))
    assert all(not followers(v, n) for w in first for v in followers(w, n))  # one level only


@pytest.mark.parametrize("n", [1, 2, 8, 9, 20])
def test_the_caller_chooses_who_wakes_a_synchronous_step_up_to_a_group(n, monkeypatch):
    """Up to FAN_OUT_GROUP workers, step_all(fan_out=False) wakes every worker in one call and flags
    no leader; fan_out=True (what the engine asks when it ended no OpenMP pool) wakes worker 0
    alone, flagged to wake the rest. Beyond a group, leaders only either way."""
    from shmvec.memory import doorbell
    from shmvec.memory.ring import bell_words

    woken: list[int] = []
    monkeypatch.setattr(doorbell, "_wake", lambda addr, bits: woken.append(bits))
    words = (np.zeros(bell_words(n), np.uint32), np.zeros((n, 4), np.uint32), np.zeros((n, 4), np.uint32))
    bell = doorbell.MainBell(words)
    every = sum(doorbell.worker_bit(w) for w in range(n)) if n < 32 else doorbell._ALL_BITS
    for fan_out in (False, True, False):
        bell.step_all(1, fan_out)
        leaders_only = fan_out or n > doorbell.FAN_OUT_GROUP
        flagged = np.flatnonzero(doorbell.FAN_OUT & words[1][:, doorbell.FLAGS]).tolist()
        if leaders_only and n > 1:
            assert woken[-1] == sum(doorbell.worker_bit(w) for w in doorbell.leaders(n))
            assert flagged == [w for w in doorbell.leaders(n) if doorbell.followers(w, n)] and bell.fans_out
        else:
            assert woken[-1] == every and flagged == [] and not bell.fans_out
    assert (words[1][:, doorbell.SEQ] == 3).all() and (words[1][:, doorbell.SLOT] == 1).all()


def test_fanned_out_steps_equal_dummyvecenv(no_leaks):
    """20 workers: the main process wakes workers 0, 8 and 16, they wake the others; every env steps
    (observations, rewards, dones and infos equal DummyVecEnv's, episode ends included)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    fns = [FaultyEnv] * 20
    ref = DummyVecEnv(fns)
    rng = np.random.default_rng(0)
    with ShmVecEnv(fns, "fork", n_workers=20) as env:
        for venv in (env, ref):
            venv.seed(3)
        np.testing.assert_array_equal(env.reset(), ref.reset())
        ended = 0
        for t in range(12):
            actions = rng.integers(0, 3, 20)
            got = env.step(actions)
            assert_step_equal(got, ref.step(actions), t)
            ended += int(got[2].sum())
    ref.close()
    assert ended > 0, "no episode ended: terminal observations were not compared"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("n", "stopped"), [(16, 8), (4, 0)])
def test_a_stopped_leader_holds_back_none_of_its_followers(no_leaks, monkeypatch, n, stopped):
    """A stopped leader (8 of 16 wakes workers 9..15; 0 of 4, fanned out as the engine does when it
    ended no OpenMP pool, wakes 1..3): the main process wakes its followers itself once the step
    has taken 50 ms, so they answer within the timeout and only the leader is taken for hung and
    rebuilt. The workers here look for their next command on their own only every 600 s, not every
    second: woken by nobody, the followers would sleep past the timeout (3 s: ample for answering
    once woken, on a loaded machine too) and be rebuilt with their leader."""
    from shmvec.memory import doorbell

    monkeypatch.setattr(doorbell, "CHECK_PARENT_S", 600.0)  # inherited by the forked workers
    # pause_openmp=False: no pool is ended, so the 4 workers' step fans out whatever ran before.
    kwargs = {"timeout": 3.0, "on_crash": "restart", "pause_openmp": False}
    with ShmVecEnv([FaultyEnv] * n, "fork", n_workers=n, **kwargs) as env:
        env.reset()
        env.step(np.zeros(n, np.int64))
        os.kill(env.processes[stopped].pid, signal.SIGSTOP)
        _, _, dones, infos = env.step(np.zeros(n, np.int64))
        assert [i for i, info in enumerate(infos) if "shmvec.restart_reason" in info] == [stopped]
        assert env.n_restarts == 1
        reason = infos[stopped]["shmvec.restart_reason"]
        assert dones[stopped] and "did not answer step within 3 s" in reason


@pytest.mark.parametrize("on_crash", ["raise", "restart"])
def test_a_leader_killed_while_idle(no_leaks, on_crash):
    """Leader 0 dies between steps, before it could wake its followers for the next: its death is
    noticed, the main process wakes the followers, and the step raises WorkerCrashedError naming
    worker 0 (or, restarting, rebuilds worker 0 alone and the other envs step)."""
    with ShmVecEnv([FaultyEnv] * 12, "fork", n_workers=12, on_crash=on_crash) as env:
        env.reset()
        env.step(np.zeros(12, np.int64))
        victim = env.processes[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        start = time.monotonic()
        if on_crash == "raise":
            with pytest.raises(WorkerCrashedError, match=r"worker 0 \(pid \d+, envs 0\.\.0\)"):
                env.step(np.zeros(12, np.int64))
            assert env.closed
        else:
            _, _, dones, infos = env.step(np.zeros(12, np.int64))
            assert env.n_restarts == 1
            assert [i for i, info in enumerate(infos) if "shmvec.restart_reason" in info] == [0]
        assert time.monotonic() - start < 30  # a hang check, not a speed figure
