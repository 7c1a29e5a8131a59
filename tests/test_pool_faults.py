"""Pool mode under faults (kill, raise, hang during a step; raise and restart modes) and the
``shm-pool`` backend of ``shmvec bench``. The drivers and references are those of
``tests/test_pool.py``."""

from __future__ import annotations

import functools
import re
import time
from contextlib import closing

import numpy as np
import pytest

from shmvec import EnvError, EnvTimeoutError, ShmVectorEnv, WorkerCrashedError
from shmvec.engine.restart import REASON_KEY, RESTARTED_KEY
from tests.envs import FaultyEnv
from tests.helpers import assert_obs_equal
from tests.pool_helpers import FAULTY, check_trajectories, make, run_pool

# ---------------------------------------------------------------- faults


def faulty(fault: str | None) -> list:
    """4 envs on 2 workers (batches of 2): env 3 (worker 1) misbehaves at its third step."""
    fns = [FAULTY] * 4
    fns[3] = functools.partial(FaultyEnv, fault, 3, "step")
    return fns


def drive(env: ShmVectorEnv, batches: int) -> dict[int, list[tuple]]:
    return run_pool(env, 0, each=batches)[0]


ORDERS = ["first_ready", "deterministic"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("fault", ["kill", "raise", "hang"])
def test_fault_in_raise_mode(no_leaks, fault, order):
    env = make(faulty(fault), batch_size=2, n_workers=2, timeout=1.0, pool_order=order)
    with closing(env):
        start = time.monotonic()
        if fault == "raise":
            with pytest.raises(
                EnvError, match="env 3 raised RuntimeError during step: simulated env failure"
            ):
                drive(env, 12)
            assert not env.closed
            got, _ = run_pool(env, 0, each=4)  # async_reset: usable again
            assert sorted(got) == [0, 1, 2, 3]
        else:
            error = WorkerCrashedError if fault == "kill" else EnvTimeoutError
            match = r"worker 1 \(pid \d+, envs 2\.\.3\) " + (
                "was killed by signal SIGKILL during step"
                if fault == "kill"
                else "did not answer step within 1 s"
            )
            with pytest.raises(error, match=match):
                drive(env, 12)
            assert env.closed
        assert time.monotonic() - start < 30


@pytest.mark.timeout(60)
@pytest.mark.parametrize("order", ORDERS)
# hang: the rebuilt env hangs again at its own third step, and close() waits out its grace (5 s).
@pytest.mark.parametrize(
    "fault,codec",
    [("kill", None), ("raise", None), ("kill", "lz4"), pytest.param("hang", None, marks=pytest.mark.slow)],
)
def test_fault_in_restart_mode(no_leaks, fault, codec, order):
    """The victim's worker is rebuilt: its envs end their episode (truncated, reward 0, the last
    observation seen, restart keys) in place of the lost step; worker 0's envs lose no step."""
    env = make(
        faulty(fault),
        batch_size=2,
        n_workers=2,
        on_crash="restart",
        timeout=1.0,
        pool_order=order,
        codec=codec,
    )
    with closing(env):
        got = drive(env, 7)
        # The rebuilt env 3 fails again at its own third step (its result 7, then every 4th) when
        # first_ready lets worker 1 run ahead while drive() waits for worker 0's envs: results past
        # 7 belong to later restarts, each counted.
        assert env.n_restarts == len(range(3, len(got[3]), 4)) >= 1
    check_trajectories(FAULTY, {i: got[i] for i in (0, 1)})
    reason = {"kill": "killed by signal SIGKILL", "raise": "simulated env failure", "hang": "did not answer"}[
        fault
    ]
    for i in (2, 3):
        results = got[i]
        # Step 3 of env 3 fails; the group steps together, so both envs lost their step 3.
        lost = results[3]
        assert (lost[1], lost[2], lost[3]) == (0.0, False, True)
        assert_obs_equal(lost[0], results[2][0], f"env {i}: the last observation seen")
        assert lost[4][RESTARTED_KEY] and re.search(reason, lost[4][REASON_KEY])
        assert (results[4][1], results[4][3]) == (0.0, False)  # the reset step of the new episode
        for r in results[:3] + results[4:7]:
            assert RESTARTED_KEY not in r[4]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("before", "at"), [(1, 3), (3, 4), (5, 6)])
def test_a_restart_after_pool_batches_and_a_reset_shows_the_last_observation_seen(no_leaks, before, at):
    """Pool batches leave the groups in different ring slots; a reset() then copies the rows it is
    about to overwrite. When env 3's worker is killed at a later step, its group's carried rows must
    be the last observations seen (after the reset), never that copy's."""
    fns = [FAULTY] * 4
    fns[3] = functools.partial(FaultyEnv, "kill", at, "step")
    env = make(fns, batch_size=2, n_workers=2, on_crash="restart", pool_order="deterministic", timeout=2.0)
    with closing(env):
        env.async_reset(seed=0)
        in_flight = set(range(4))
        for _ in range(before):
            _, _, _, _, infos = env.recv()
            ids = infos["env_id"].tolist()
            env.send(np.zeros(len(ids), np.int64), ids)
        while in_flight:
            _, _, _, _, infos = env.recv()
            in_flight -= set(infos["env_id"].tolist())
        obs, _ = env.reset(seed=1)
        last = {i: obs[i].copy() for i in range(4)}
        env.send(np.zeros(4, np.int64), np.arange(4))
        restarted = []
        for _ in range(12):
            obs, _, _, _, infos = env.recv()
            ids = infos["env_id"].tolist()
            flags = infos.get(f"_{RESTARTED_KEY}", np.zeros(len(ids), bool))
            for pos, i in enumerate(ids):
                if flags[pos]:
                    restarted.append(i)
                    assert_obs_equal(obs[pos], last[i], f"env {i}: the last observation seen")
                last[i] = obs[pos].copy()
            if restarted:
                break
            env.send(np.zeros(len(ids), np.int64), ids)
        assert restarted == [2, 3]


# ---------------------------------------------------------------- bench backend


def test_bench_pool_backend_counts_batch_steps(no_leaks):
    """``shm-pool`` in ``shmvec bench``: a batch step steps batch_size envs, and steps/s counts them."""
    from shmvec.bench.runner import BenchSpec, run

    spec = BenchSpec(
        env="tests.envs:make_small_synthetic",
        backends=("shm-pool",),
        n_envs=(1, 4),
        batch_size=2,
        repeats=1,
        seconds=0.3,
        start_method="fork",
    )
    (point,) = run(spec).points  # n_envs=1 < batch_size is skipped
    assert point.config.label == "shm-pool n=4 b=2"
    (sample,) = point.samples
    assert sample.steps_per_s == pytest.approx(2 / sample.step_s)
    assert sample.processes == 2


def test_bench_pool_backend_is_not_trained_on():
    from shmvec.bench.train import check_train_args

    with pytest.raises(ValueError, match="backend 'shm-pool' is not an SB3 VecEnv and cannot be trained on"):
        check_train_args("tests.envs:make_small_synthetic", ["shm-pool"], "ppo:CnnPolicy", 2, 64, [0], None)
