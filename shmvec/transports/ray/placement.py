"""Where the Ray backend's workers run: one placement-group bundle per worker, spread over the nodes.

Actors that ask Ray for no placement are packed: on a local 2-node cluster, 2 workers landed on one
node in 6-8 of 10 runs (1-CPU nodes) and 4-6 of 10 (4-CPU nodes); see the docs guide "Workers on a
Ray cluster". So unless the user's ``ray_options`` place the actors (:data:`USER_PLACEMENT`), the
workers get a placement group made at start-up: one bundle per worker holding what its actor asks
for (1 CPU unless ``num_cpus``, ``num_gpus``, ``memory`` or ``resources`` say otherwise). Strategy
``STRICT_SPREAD`` when at least as many nodes can hold a bundle as there are workers: each worker
on its own node, Ray waits rather than doubling up. Else ``SPREAD``: Ray puts each bundle on the
node with the most resources free, so equal nodes get equal shares. Every bundle is placed before
any actor starts and stays on its node while the node lives: worker ``w``'s actor, and its
replacement after a restart, run in bundle ``w``.

Why not ``SPREAD`` always: it is best effort. In one run of 30 groups of 2 bundles made back to
back on two 4-CPU nodes it put both bundles on one node 5 times: a node whose freed CPUs Ray had
not counted yet looked full (in other runs, never). Ray counts a removed group's resources as free
again about 0.1 s after the removal; :meth:`Placement.remove` waits for that, so that a VecEnv
started right after is placed on an up-to-date view of the cluster.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from shmvec.errors import EnvTimeoutError

logger = logging.getLogger("shmvec")

# Actor options that choose where the actors run: with any of them, the user places the workers
# and no placement group is made.
USER_PLACEMENT = (
    "scheduling_strategy",
    "placement_group",
    "placement_group_bundle_index",
    "placement_group_capture_child_tasks",
    "label_selector",
    "accelerator_type",
)
# A worker steps its envs one after the other: one core, unless ray_options says otherwise.
DEFAULT_CPUS = 1.0
# Longest wait in remove() for Ray to count the removed group's resources as free again (s).
RETURN_WAIT_S = 2.0


def placement_for(options: Mapping[str, Any], n_workers: int) -> Placement | None:
    """The placement of ``n_workers`` actors created with ``options``; None when ``options`` place
    them (any key of :data:`USER_PLACEMENT`)."""
    if any(key in options for key in USER_PLACEMENT):
        return None
    return Placement(n_workers, options)


def bundle_of(options: Mapping[str, Any]) -> dict[str, float]:
    """The resources one actor created with ``options`` asks for (zeros left out)."""
    wanted = {
        "CPU": options.get("num_cpus", DEFAULT_CPUS),
        "GPU": options.get("num_gpus", 0),
        "memory": options.get("memory", 0),
        **(options.get("resources") or {}),
    }
    return {key: float(value) for key, value in wanted.items() if value}


def node_capacity(node_resources: Mapping[str, float], bundle: Mapping[str, float]) -> int:
    """How many ``bundle``-s a node with ``node_resources`` (totals) holds."""
    # The small margin keeps 3 x 0.1 CPU on a 0.3-CPU node: Ray counts in units of 1/10,000.
    return min(math.floor(node_resources.get(key, 0.0) / need + 1e-6) for key, need in bundle.items())


class Placement:
    """The placement group of one engine's workers: made on the first :meth:`actor_options`,
    waited for by :meth:`wait`, removed by :meth:`remove`.

    :param n_workers: one bundle each.
    :param options: the actors' options (``num_cpus``, ``num_gpus``, ``memory``, ``resources``
        make the bundle).
    """

    def __init__(self, n_workers: int, options: Mapping[str, Any]) -> None:
        self.n_workers = n_workers
        self.bundle = bundle_of(options)
        self.group: Any = None
        self.strategy = ""
        self.ready_ref: Any = None
        self.ready = False

    def actor_options(self, w: int) -> dict[str, Any]:
        """The options that put worker ``w``'s actor in bundle ``w`` (the group is made on the
        first call). An actor that asks for no resources cannot be reserved: it gets Ray's
        best-effort ``SPREAD``."""
        if not self.bundle:
            return {"scheduling_strategy": "SPREAD"}
        if self.group is None:
            self.strategy = "STRICT_SPREAD" if self.n_workers <= len(self.capacities()) else "SPREAD"
            self.group = placement_group([dict(self.bundle)] * self.n_workers, strategy=self.strategy)
            self.ready_ref = self.group.ready()
        return {
            "num_cpus": self.bundle.get("CPU", 0.0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=w
            ),
        }

    def capacities(self) -> list[int]:
        """How many bundles each alive node that holds at least one could hold (totals, not what
        is free now)."""
        counts = (node_capacity(node["Resources"], self.bundle) for node in ray.nodes() if node["Alive"])
        return [count for count in counts if count > 0]

    def wait(self, limit: float) -> None:
        """Wait until every bundle is placed, at most ``limit`` seconds.

        :raises EnvTimeoutError: when it is not, naming what the cluster lacks.
        """
        if self.ready or self.group is None:
            return
        held = sum(self.capacities())
        if held < self.n_workers:
            # An autoscaling cluster may still add nodes: say so now rather than wait silently.
            logger.warning("%s; waiting up to %g s for Ray to add nodes", self.shortage(held), limit)
        ready, _ = ray.wait([self.ready_ref], timeout=limit)
        if not ready:
            raise EnvTimeoutError(self.lacking(limit), timeout=limit, command="make_env")
        ray.get(self.ready_ref)
        self.ready = True

    def shortage(self, held: int) -> str:
        """What a cluster whose nodes hold ``held`` bundles in all lacks."""
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        sizes = ", ".join(_show({k: node.get(k, 0.0) for k in self.bundle}) for node in nodes)
        return (
            f"the Ray cluster is too small for {self.n_workers} workers of {_show(self.bundle)} each: "
            f"its {len(nodes)} nodes ({sizes or 'none'}) hold {held}"
        )

    def lacking(self, limit: float) -> str:
        """The start-up error when the group was not placed within ``limit`` seconds."""
        held = sum(self.capacities())
        if held < self.n_workers:
            why = self.shortage(held)
        else:
            free = ray.available_resources()
            why = (
                f"the cluster could hold them, but other Ray work holds its resources "
                f"(free now: {_show({k: free.get(k, 0.0) for k in self.bundle})})"
            )
        return (
            f"the Ray workers were not placed within {limit:g} s: {why} (placement group of "
            f"{self.n_workers} bundles, {self.strategy}). Start more nodes, or pass fewer n_workers, "
            f'a smaller ray_options["num_cpus"] (0.5: two workers per core), or your own '
            f'ray_options["scheduling_strategy"] (then no placement group is made)'
        )

    def bundle_nodes(self) -> list[str]:
        """The node id of each bundle, in worker order (once :meth:`wait` returned)."""
        assert self.ready, "the placement group is not placed yet"
        table = ray.util.placement_group_table(self.group)["bundles_to_node_id"]
        return [table[w] for w in range(self.n_workers)]

    def remove(self) -> None:
        """Remove the group (its actors die with it) and wait, at most :data:`RETURN_WAIT_S`, until
        Ray counts its resources as free."""
        group, self.group = self.group, None
        if group is None:
            return
        reserved = {key: need * self.n_workers for key, need in self.bundle.items()} if self.ready else {}
        before = ray.available_resources()
        with suppress(Exception):
            remove_placement_group(group)
        if not self.ready:
            # Fetched, so that Ray does not report its error (the group was removed) as unhandled.
            with suppress(Exception):
                ray.get(self.ready_ref, timeout=1.0)
        self.ready = False
        deadline = time.monotonic() + RETURN_WAIT_S
        while reserved and time.monotonic() < deadline:
            free = ray.available_resources()
            if all(free.get(k, 0.0) >= before.get(k, 0.0) + v - 1e-6 for k, v in reserved.items()):
                break
            time.sleep(0.01)


def _show(resources: Mapping[str, float]) -> str:
    """``{"CPU": 1.0, "memory": 2e9}`` as ``CPU 1, memory 2e+09``."""
    return ", ".join(f"{key} {value:g}" for key, value in resources.items())


__all__ = ["DEFAULT_CPUS", "USER_PLACEMENT", "Placement", "placement_for"]
