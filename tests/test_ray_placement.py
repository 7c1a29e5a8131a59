"""backend="ray" places its workers: one placement-group bundle per worker, spread over the nodes.

A local cluster of two 4-CPU nodes (every process on 127.0.0.1), so that where the workers land is
Ray's choice, not forced by a lack of CPUs. Slow-marked, like tests/test_ray.py (whose cluster has
1-CPU nodes); CI installs the ``[ray]`` extra before its slow step.
"""

from __future__ import annotations

import gc
import logging
from collections import Counter

import numpy as np
import pytest

from tests.ray_helpers import (
    live_actors,
    live_placement_groups,
    local_cluster,
    loopback_environ,
    nothing_left_in_ray,
    worker_nodes,
)

loopback_environ()  # before Ray is imported
ray = pytest.importorskip("ray", reason='Ray is not installed (pip install -e ".[ray]")')

from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from shmvec import EnvError, EnvTimeoutError, ShmVecEnv, ShmVectorEnv  # noqa: E402
from shmvec.transports.ray import placement, transport  # noqa: E402
from tests.envs import TinyImageEnv, make_broken_env  # noqa: E402

pytestmark = pytest.mark.slow

CPUS = 4  # per node
RUNS = 10


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(2, cpus=CPUS) as cluster:
        yield cluster


@pytest.fixture
def leaks(cluster):
    with nothing_left_in_ray():
        yield


def unbalanced(placed: list[list[str]], per_node: int) -> list[dict[str, int]]:
    """The runs whose workers are not ``per_node`` on each of the two nodes."""
    counts = [dict(Counter(nodes)) for nodes in placed]
    return [c for c in counts if sorted(c.values()) != [per_node, per_node]]


@pytest.mark.parametrize("n_workers", [2, 4])
def test_default_placement_spreads_the_workers_evenly_over_the_nodes(leaks, n_workers):
    """Each node could hold every worker: only the placement spreads them (Ray's default packs)."""
    placed = worker_nodes(RUNS, n_workers, TinyImageEnv)
    bad = unbalanced(placed, n_workers // 2)
    assert not bad, f"{len(bad)} of {RUNS} runs not {n_workers // 2} workers per node: {bad}"


def test_restart_puts_the_new_actor_back_in_its_bundle(leaks):
    venv = ShmVecEnv([TinyImageEnv] * 4, n_workers=4, backend="ray", on_crash="restart")
    try:
        tp = venv._eng.transport
        bundles = tp.placement.bundle_nodes()
        assert tp.nodes == bundles and sorted(Counter(bundles).values()) == [2, 2]
        groups = live_placement_groups()
        venv.reset()
        old = venv.actors[1]
        ray.kill(old)
        actions = np.zeros(4, np.int64)
        for _ in range(20):
            _, _, dones, infos = venv.step(actions)
            if venv.n_restarts:
                break
        assert venv.n_restarts == 1 and infos[1]["shmvec.restarted"]
        assert venv.actors[1] != old
        assert tp.nodes == bundles, "the new actor left its bundle's node"
        assert live_placement_groups() == groups, "a restart made or removed a placement group"
        venv.step(actions)
    finally:
        venv.close()


def test_user_scheduling_strategy_makes_no_placement_group(leaks):
    groups = live_placement_groups()
    own = placement_group([{"CPU": 1}] * 2, strategy="STRICT_PACK")
    try:
        ray.get(own.ready(), timeout=60)
        strategy = PlacementGroupSchedulingStrategy(own)
        venv = ShmVectorEnv(
            [TinyImageEnv] * 2, n_workers=2, backend="ray", ray_options={"scheduling_strategy": strategy}
        )
        try:
            assert venv._eng.transport.placement is None
            assert live_placement_groups() - groups == {own.id.hex()}, "shmvec made a placement group"
            table = ray.util.placement_group_table(own)["bundles_to_node_id"]
            assert set(venv._eng.transport.nodes) == set(table.values())  # in the user's group, one node
            venv.reset(seed=0)
        finally:
            venv.close()
    finally:
        remove_placement_group(own)


def test_cluster_too_small_is_a_clear_error_within_the_bound(leaks, monkeypatch, caplog):
    monkeypatch.setattr(transport, "MIN_START_S", 2.0)
    n_workers = 2 * CPUS + 1
    with caplog.at_level(logging.WARNING, logger="shmvec"), pytest.raises(EnvTimeoutError) as info:
        ShmVecEnv([TinyImageEnv] * n_workers, n_workers=n_workers, backend="ray", timeout=2.0)
    message = str(info.value)
    assert info.value.timeout == 2.0
    assert "not placed within 2 s" in message, message
    assert f"too small for {n_workers} workers of CPU 1 each" in message, message
    assert "its 2 nodes (CPU 4, CPU 4) hold 8" in message, message
    assert any("waiting up to 2 s" in r.getMessage() for r in caplog.records), "no warning at once"


@pytest.mark.timeout(120)
def test_cluster_busy_with_other_work_is_a_clear_error_within_the_bound(leaks, monkeypatch):
    """Two workers need a CPU on each node; another group holds every CPU of one of them."""
    monkeypatch.setattr(transport, "MIN_START_S", 2.0)
    other = placement_group([{"CPU": CPUS}], strategy="STRICT_PACK")
    try:
        ray.get(other.ready(), timeout=60)
        with pytest.raises(EnvTimeoutError, match=r"other Ray work holds its resources \(free now: CPU 4\)"):
            ShmVecEnv([TinyImageEnv] * 2, n_workers=2, backend="ray", timeout=2.0)
    finally:
        remove_placement_group(other)


def test_failed_start_up_leaves_nothing(leaks):
    with pytest.raises(EnvError, match="this factory is broken"):
        ShmVecEnv([TinyImageEnv, make_broken_env], n_workers=2, backend="ray")


def test_garbage_collected_env_leaves_nothing(leaks):
    groups, actors = live_placement_groups(), live_actors()
    venv = ShmVecEnv([TinyImageEnv] * 2, n_workers=2, backend="ray")
    assert len(live_placement_groups() - groups) == 1 and len(live_actors() - actors) == 2
    del venv
    gc.collect()
    assert live_placement_groups() == groups  # the actors: checked by the fixture (they die async)


def test_bundles_follow_the_actor_options(leaks):
    """num_cpus and resources make the bundle: 4 workers of half a CPU fill one 2-CPU node's worth
    on each node; an option that places the actors means no placement group."""
    venv = ShmVecEnv([TinyImageEnv] * 4, n_workers=4, backend="ray", ray_options={"num_cpus": 0.5})
    try:
        tp = venv._eng.transport
        assert tp.placement.bundle == {"CPU": 0.5} and tp.placement.strategy == "SPREAD"
        assert sorted(Counter(tp.nodes).values()) == [2, 2]
        assert ray.available_resources().get("CPU", 0) == 2 * CPUS - 2
    finally:
        venv.close()
    assert placement.bundle_of({"num_cpus": 0, "resources": {"envs": 2}}) == {"envs": 2.0}
    assert placement.bundle_of({"num_gpus": 1, "memory": 2e9}) == {"CPU": 1.0, "GPU": 1.0, "memory": 2e9}
    for key in placement.USER_PLACEMENT:
        assert placement.placement_for({key: None}, 2) is None
    assert placement.Placement(2, {"num_cpus": 0}).actor_options(0) == {"scheduling_strategy": "SPREAD"}
