"""For the Ray backend's tests: a local multi-node cluster on 127.0.0.1, and a codec that corrupts.

Imported by Ray actors too (codecs travel to them by reference): numpy and shmvec only at module
level.
"""

from __future__ import annotations

import os
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


def start_cluster(n_nodes: int = 2) -> Any:
    """A ``ray.cluster_utils.Cluster`` of ``n_nodes`` nodes with one CPU each, every process on
    127.0.0.1 (after :func:`loopback_environ`), and the driver connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    os.makedirs(os.environ["RAY_TMPDIR"], exist_ok=True)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    for _ in range(n_nodes - 1):
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    return cluster
