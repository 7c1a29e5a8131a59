"""Pool mode's scheduling: which envs make a batch. The deterministic order repeats run to run, a
slow env holds back no other in first-ready order (nor, by default, its group mates: the default
worker count gives envs that wait a worker each), and the worker count rule. Trajectories, refused
calls and closing are tests/test_pool.py's; an env that must be slower than the others is held
inside its step by a gate the test opens, never timed.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from contextlib import closing

import numpy as np
import pytest

from shmvec import ShmVectorEnv
from shmvec.engine import autoworkers
from shmvec.engine.flights import pool_workers
from shmvec.synthetic import SyntheticImageEnv
from tests.envs import FaultyEnv, Gate
from tests.pool_helpers import FAULTY, make, run_pool

# ---------------------------------------------------------------- order


def _mixed_speeds() -> list:
    return [functools.partial(FaultyEnv, delay=0.002 * (i % 3)) for i in range(6)]


def test_deterministic_order_repeats_run_to_run(no_leaks):
    runs = []
    for _ in range(2):
        with closing(make(_mixed_speeds(), batch_size=2, n_workers=6, pool_order="deterministic")) as env:
            runs.append(run_pool(env, 15)[1])
    assert runs[0] == runs[1]
    assert runs[0][:4] == [[0, 1], [2, 3], [4, 5], [0, 1]]


def _while_env_0_is_held(env: ShmVectorEnv, gate: Gate, each: int = 10) -> dict[int, int]:
    """Hold env 0 inside its first step (``gate`` closed) and drive the pool until every other env
    has come back ``each`` times; then open the gate and drive on until env 0 comes back too. Returns
    how often each env came back while env 0 was held. Bounded in batches, not in time: envs held back
    with env 0 fail after 1,000 batches (or hang in recv() until the test's timeout)."""
    seen: dict[int, int] = defaultdict(int)

    def drive(until: Callable[[], bool]) -> None:
        for _ in range(1000):
            *_, infos = env.recv()
            ids = infos["env_id"].tolist()
            for i in ids:
                seen[i] += 1
            env.send(np.zeros(len(ids), np.int64))
            if until():
                return
        pytest.fail(f"not within 1,000 batches; batches per env: {dict(seen)}")

    gate.close()
    env.async_reset(seed=0)
    drive(lambda: min(seen[i] for i in range(1, env.num_envs)) >= each)
    held = dict(seen)
    gate.open()
    drive(lambda: seen[0] > held[0])
    return held


@pytest.mark.timeout(60)
def test_slow_env_does_not_hold_back_first_ready(no_leaks, tmp_path):
    """One env per worker, batches of 2: in first-ready order the other envs keep coming back while
    env 0 is held inside a step (its own word that it is there is not needed: it cannot come back)."""
    gate = Gate(tmp_path / "gate")
    fns = [functools.partial(FaultyEnv, gate=gate.path)] + [functools.partial(FaultyEnv, delay=0.002)] * 3
    with closing(make(fns, batch_size=2, n_workers=4)) as env:
        held = _while_env_0_is_held(env, gate)
    assert held[0] == 1, f"only env 0's reset came back while it was held: {held}"


# ---------------------------------------------------------------- the default grouping


def _slow_first(n: int, slow_s: float = 0.1, fast_s: float = 0.002, gate: str | None = None) -> list:
    return [
        functools.partial(FaultyEnv, delay=slow_s, gate=gate)
        if i == 0
        else functools.partial(FaultyEnv, delay=fast_s)
        for i in range(n)
    ]


@pytest.mark.timeout(60)
def test_by_default_a_slow_env_holds_back_no_other(no_leaks, tmp_path):
    """Pool mode's default measures the envs: envs that wait (100 ms per step against 2 ms) get a
    worker each, so while env 0 is held inside a step every other env goes on coming back. With the
    old grouping (two workers of four envs) env 0's three group mates were held back with it."""
    gate = Gate(tmp_path / "gate")
    with closing(make(_slow_first(8, gate=gate.path), batch_size=4)) as env:
        assert env.n_workers == 8
        held = _while_env_0_is_held(env, gate)
    assert held[0] == 1, f"only env 0's reset came back while it was held: {held}"


def test_computing_envs_keep_the_grouping_rule(no_leaks, monkeypatch):
    """Envs that compute get as many workers as CPUs (groups filling a batch whole), as before."""
    monkeypatch.setattr(autoworkers, "usable_cpus", lambda: 2)
    fns = [functools.partial(SyntheticImageEnv, (4, 4, 1), work_s=0.003)] * 8
    with closing(make(fns, batch_size=4)) as env:
        assert env.n_workers == 2


def test_an_explicit_count_is_kept(no_leaks):
    with closing(make(_slow_first(8, slow_s=0.0), batch_size=4, n_workers=4)) as env:
        assert env.n_workers == 4


@pytest.mark.parametrize(
    "num_envs,batch_size,cpus,want",
    [(16, 8, 2, 2), (16, 8, 8, 8), (16, 8, 3, 4), (6, 4, 2, 3), (6, 1, 2, 6), (5, 5, 2, None), (7, 3, 2, 7)],
)
def test_pool_workers_rule(num_envs, batch_size, cpus, want):
    """None: the smallest worker count >= the CPUs whose equal groups fill a batch whole."""
    assert pool_workers(num_envs, batch_size, None, cpus) == want


def test_default_workers_fill_batches_with_whole_groups(no_leaks):
    with closing(make([FAULTY] * 16, batch_size=8)) as env:
        groups = env._eng.worker_envs
        assert len({len(g) for g in groups}) == 1 and 8 % len(groups[0]) == 0
