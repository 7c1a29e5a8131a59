"""``worker_cpus``: each worker process runs on the CPU it was dealt, on both faces and after a restart.

Affinity masks read back from inside the workers, not timings: what pinning gains is measured by
``benchmarks/policy_loop.py`` (config ``shm-pin``).
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from shmvec import ShmVecEnv, ShmVectorEnv
from shmvec.engine.options import resolve_worker_cpus
from tests.envs import CpuReportEnv

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _per_env(worker_cpus: list[int], worker_envs: list[range]) -> list[list[int]]:
    return [[worker_cpus[w]] for w, group in enumerate(worker_envs) for _ in group]


@pytest.mark.parametrize("n_workers", [2, 3])
def test_auto_deals_the_usable_cpus_to_the_workers_in_turn(no_leaks, n_workers):
    with ShmVecEnv([CpuReportEnv] * 4, n_workers=n_workers, worker_cpus="auto") as venv:
        expected = [ALLOWED[w % len(ALLOWED)] for w in range(n_workers)]
        assert venv.env_method("cpus") == _per_env(expected, venv.worker_envs)


def test_a_sequence_is_dealt_out_and_none_leaves_the_mask_alone(no_leaks):
    last = ALLOWED[-1]
    with ShmVecEnv([CpuReportEnv] * 3, n_workers=3, worker_cpus=[last]) as venv:
        assert venv.env_method("cpus") == [[last]] * 3
    with ShmVecEnv([CpuReportEnv] * 2, n_workers=2) as venv:
        assert venv.env_method("cpus") == [ALLOWED] * 2


def test_a_restarted_worker_keeps_its_cpu(no_leaks):
    with ShmVecEnv(
        [CpuReportEnv] * 4, n_workers=2, worker_cpus=list(reversed(ALLOWED)), on_crash="restart"
    ) as venv:
        before = venv.env_method("cpus")
        venv.reset()
        os.kill(venv.processes[1].pid, signal.SIGKILL)
        _, _, dones, infos = venv.step(np.zeros(4, dtype=np.int64))
        assert dones[2:].all() and all(infos[i].get("shmvec.restarted") for i in (2, 3))
        assert venv.n_restarts == 1
        assert venv.env_method("cpus") == before


def test_the_gymnasium_face_pins_too(no_leaks):
    venv = ShmVectorEnv([CpuReportEnv] * 2, n_workers=2, worker_cpus="auto")
    try:
        expected = [ALLOWED[w % len(ALLOWED)] for w in range(2)]
        assert list(venv.call("cpus")) == [[c] for c in expected]
    finally:
        venv.close()


@pytest.mark.parametrize("bad", ["first", [], 3, [True], [0.5], [-1], [max(ALLOWED or [0]) + 1]])
def test_bad_values_are_refused_naming_the_option(no_leaks, bad):
    with pytest.raises(ValueError, match="worker_cpus"):
        ShmVecEnv([CpuReportEnv], worker_cpus=bad)


def test_refused_on_ray():
    with pytest.raises(ValueError, match="backend='ray'"):
        resolve_worker_cpus("auto", 2, "ray")
    assert resolve_worker_cpus(None, 2, "ray") is None


@pytest.mark.parametrize("worker_cpus", [None, "auto"], ids=["unpinned", "pinned"])
def test_a_step_is_sent_last_to_the_worker_on_the_main_threads_cpu(no_leaks, worker_cpus):
    """Woken on the main thread's CPU, a worker preempts it: sent first, it would hold back the send
    to the other. Unpinned, where each worker last ran is read from ``/proc/<pid>/stat``."""
    if len(ALLOWED) < 2:
        pytest.skip("needs 2 CPUs")
    mine = os.sched_getaffinity(0)
    venv = ShmVecEnv([CpuReportEnv] * 2, start_method="fork", n_workers=2, worker_cpus=worker_cpus)
    try:
        pool = venv._engine.pool
        pids = [p.pid for p in pool.res.processes]
        for pid, cpu in zip(pids, ALLOWED):  # unpinned: placed by the test, as the OS might have
            os.sched_setaffinity(pid, {cpu})
        venv.reset()
        sent: list[int] = []
        send = pool.send
        pool.send = lambda w, *args: sent.append(w) or send(w, *args)  # type: ignore[method-assign]
        for here, on_it in ((ALLOWED[0], 0), (ALLOWED[1], 1)):
            os.sched_setaffinity(0, {here})
            pool._sends = 0  # read the workers' CPUs at the next send, not up to 7 sends later
            sent.clear()
            for _ in range(3):
                venv.step(np.zeros(2, dtype=np.int64))
            assert sent == [1 - on_it, on_it] * 3, f"main thread on CPU {here}: sent in order {sent}"
    finally:
        os.sched_setaffinity(0, mine)
        venv.close()
