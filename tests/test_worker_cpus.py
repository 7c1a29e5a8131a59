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
