"""For the Ray backend's tests: a local multi-node cluster on 127.0.0.1, what a test leaves behind
in it, and a codec that corrupts.

Imported by Ray actors too (codecs travel to them by reference): numpy and shmvec only at module
level.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from shmvec.codecs.raw import RawCodec
from tests.helpers import ROOT


class CorruptingCodec(RawCodec):
    """``raw``, except that the 4th frame encoded in each worker gets one byte flipped (after its
    checksum was taken): what ``verify_every`` must catch."""

    def __init__(self) -> None:
        self.encoded = 0

    def encode(self, arr: np.ndarray, out: np.ndarray, stream: Any = None) -> int:
        n = super().encode(arr, out, stream)
        self.encoded += 1
        if self.encoded == 4:
            out[n // 2] ^= 0x01
        return n


def loopback_environ() -> None:
    """Environment for a cluster on 127.0.0.1 only; must be set before Ray is imported (it reads
    some of it at import time: set later, every node advertises the eth0 address)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # Ray's unix sockets live under RAY_TMPDIR: a short private path keeps them under the length limit.
    # Named here, made by start_cluster: collecting the tests without running them leaves nothing.
    os.environ["RAY_TMPDIR"] = f"/tmp/shmvec-ray-{os.getpid()}"
    # Actors unpickle the tests' env factories by reference: the repository must be importable.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def start_cluster(n_nodes: int = 2, cpus: int = 1) -> Any:
    """A ``ray.cluster_utils.Cluster`` of ``n_nodes`` nodes with ``cpus`` CPUs each, every process on
    127.0.0.1 (after :func:`loopback_environ`), and the driver connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    os.makedirs(os.environ["RAY_TMPDIR"], exist_ok=True)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": cpus, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    for _ in range(n_nodes - 1):
        cluster.add_node(num_cpus=cpus, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    return cluster


@contextmanager
def local_cluster(n_nodes: int = 2, cpus: int = 1) -> Iterator[Any]:
    """:func:`start_cluster`, checked to be on loopback only, shut down and its files removed after."""
    import ray

    cluster = start_cluster(n_nodes, cpus)
    try:
        addresses = {node["NodeManagerAddress"] for node in ray.nodes()}
        assert addresses == {"127.0.0.1"}, f"a Ray node is not on loopback: {addresses}"
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)


def live_placement_groups() -> set[str]:
    """Ids of the cluster's placement groups not removed (``placement_group_table`` needs no dashboard)."""
    import ray

    return {pg_id for pg_id, pg in ray.util.placement_group_table().items() if pg["state"] != "REMOVED"}


def live_actors() -> set[str]:
    """Ids of the cluster's actors not dead. ``ray.util.state.list_actors`` needs the dashboard
    (``ray[default]``) and ``ray.util.list_named_actors`` lists only named actors: this reads the
    GCS's actor table, as ``ray.util.state`` does, through Ray's private ``state`` module."""
    from ray._private import state

    return {actor_id for actor_id, actor in state.actors().items() if actor["State"] != "DEAD"}


@contextmanager
def nothing_left_in_ray(within: float = 30.0) -> Iterator[None]:
    """Fail if the block leaves a placement group or a live actor in the cluster (actors die
    asynchronously after ``ray.kill``: they get ``within`` seconds)."""
    groups, actors = live_placement_groups(), live_actors()
    yield
    deadline = time.monotonic() + within
    while live_actors() - actors and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_placement_groups() - groups == set(), "placement groups left after close()"
    assert live_actors() - actors == set(), "actors left alive after close()"


def worker_nodes(runs: int, n_workers: int, env_fn: Any, **kwargs: Any) -> list[list[str]]:
    """Start ``ShmVecEnv([env_fn] * n_workers, backend="ray", **kwargs)`` ``runs`` times, one after
    the other, each closed before the next starts: the node id of each worker's actor, per run."""
    from shmvec import ShmVecEnv

    placed = []
    for _ in range(runs):
        venv = ShmVecEnv([env_fn] * n_workers, n_workers=n_workers, backend="ray", **kwargs)
        try:
            placed.append(venv._eng.transport.nodes)
        finally:
            venv.close()
    return placed
