"""The benchmark matrix: workloads x backends x n_envs, as pytest-benchmark cases.

Run everything (about 15 minutes on 2 cores):

    python -m pytest benchmarks/ --benchmark-only

Select by keyword (ids look like ``pong_raw-shm-n8``) or marker:

    python -m pytest benchmarks/ --benchmark-only -m first          # issue 2's first benchmark (~1 min)
    python -m pytest benchmarks/ --benchmark-only -k "synth512 and n8"
    python -m pytest benchmarks/ --benchmark-only --benchmark-save=main   # then, on a branch:
    python -m pytest benchmarks/ --benchmark-only --benchmark-compare=0001_main

Each case is one group per workload and n_envs (``--benchmark-group-by=group``, the default), so the
backends of a group are compared side by side; ``extra_info`` holds env steps/s. The cases are timed
by shmvec's own pytest plugin (``vec_env_benchmark``, :mod:`shmvec.testing`, loaded by
``benchmarks/conftest.py``), the one users load in their test suites; pytest-benchmark's options
(``--benchmark-max-time``, default 1 s, ``--benchmark-min-rounds``) set how long each case runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import pytest

from shmvec.bench.envs import env_factory
from shmvec.testing import VecEnvBenchmark

SYN = "shmvec.synthetic:SyntheticImageEnv"
N_ENVS = (1, 2, 4, 8, 16)
IO_N_ENVS = (8, 16, 32, 64)
BACKENDS = ("dummy", "subproc", "shm", "async")


@dataclass(frozen=True)
class Workload:
    """An env to benchmark, and the env counts to try."""

    name: str
    factory: Callable[[], gym.Env]
    n_envs: tuple[int, ...] = N_ENVS
    needs_atari: bool = False


def _synthetic(side: int, channels: int, work_ms: int) -> Workload:
    shape = (side, side, channels)
    return Workload(
        f"synth{side}x{side}x{channels}_{work_ms}ms", env_factory(SYN, shape=shape, work_s=work_ms / 1000)
    )


WORKLOADS = [
    Workload("pong_raw", env_factory("ALE/Pong-v5"), needs_atari=True),
    Workload("pong_84x84x4", env_factory("shmvec.bench.envs:pong_84x84x4"), needs_atari=True),
    *(_synthetic(side, ch, ms) for side, ch in ((84, 4), (256, 3), (512, 3), (1024, 3)) for ms in (0, 1)),
    # A simulator or service behind a socket: each step waits 20-200 ms. Many more envs than cores is
    # the right answer here, so shm is also run with one worker per env ("shm_wn").
    Workload("io_20_200ms", env_factory(SYN, shape=(84, 84, 4), io_s=(0.02, 0.2)), IO_N_ENVS),
]

# Issue 2's first benchmark: Pong raw and synthetic 512x512x3 (0 ms, random episode lengths), n=8.
FIRST = {("pong_raw", 8), ("synth512x512x3_0ms", 8)}
FIRST_BACKENDS = ("dummy", "subproc", "shm")


def cases() -> list:
    """Every (workload, backend, n_envs) case as a ``pytest.param`` with an id and markers; the
    backend is the plugin's ``vec_env_backend`` (``shm_wn``: ``shm`` with one worker per env)."""
    out = []
    for w in WORKLOADS:
        backends = (*BACKENDS, "shm_wn") if w.name.startswith("io") else BACKENDS
        for b in backends:
            for n in w.n_envs:
                if b == "dummy" and w.name.startswith("io") and n > 8:
                    continue  # 64 envs x ~110 ms in sequence: 7 s a step, and nothing to learn
                marks = [pytest.mark.first] if (w.name, n) in FIRST and b in FIRST_BACKENDS else []
                out.append(pytest.param(w, b.removesuffix("_wn"), n, b, id=f"{w.name}-{b}-n{n}", marks=marks))
    return out


@pytest.mark.parametrize(("workload", "vec_env_backend", "n_envs", "label"), cases())
def test_step(vec_env_benchmark: VecEnvBenchmark, workload: Workload, n_envs: int, label: str) -> None:
    """One batch step (step_async + step_wait) of ``n_envs`` envs, random actions."""
    if workload.needs_atari:
        pytest.importorskip("ale_py")
    n_workers = n_envs if label == "shm_wn" else None
    # Started as ShmVecEnv's default (forkserver), as these figures always were; extra_info keeps
    # this matrix's own names (matrix_summary.py reads "workload" and "backend").
    vec_env_benchmark(
        workload.factory,
        n_envs,
        name=workload.name,
        start_method="forkserver",
        n_workers=n_workers,
        extra_info={"workload": workload.name, "backend": label},
    )
