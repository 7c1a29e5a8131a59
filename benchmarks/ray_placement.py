"""What the Ray backend's placement group costs, on a local two-node Ray cluster (127.0.0.1 only).

Per round, interleaved: the placement group alone (made, placed, removed: what
:class:`shmvec.transports.ray.placement.Placement` does), then ``ShmVecEnv(backend="ray")`` started and
closed twice in a row (the second one recorded: placed right after the first one's close()) with
the default placement, with it but a ``close()`` that does not wait for Ray to count the freed
resources, and with ``ray_options={"scheduling_strategy": "DEFAULT"}`` (Ray's default
placement, no group); and where the workers landed. Then ``--groups`` bare groups made and removed
back to back with each strategy (nothing waits between them): how often Ray did not spread them.

    flock /tmp/shmvec-cpu.lock python benchmarks/ray_placement.py --rounds 10 --workers 2 --cpus 1

Prints Markdown tables (seconds: median, min-max; runs whose workers were spread evenly).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ray_helpers import local_cluster, loopback_environ  # noqa: E402

loopback_environ()  # before Ray is imported

from shmvec.transports.ray.placement import RETURN_WAIT_S  # noqa: E402


def even(nodes: list[str]) -> bool:
    """The workers are on both nodes, as many on each."""
    counts = sorted(Counter(nodes).values())
    return len(counts) == 2 and counts[0] == counts[1]


def groups_back_to_back(n_bundles: int, strategy: str, runs: int) -> int:
    """How many of ``runs`` groups of ``n_bundles`` default bundles, each made as soon as the
    previous one was removed, Ray spread evenly over the 2 nodes."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    spread = 0
    for _ in range(runs):
        group = placement_group([{"CPU": 1.0}] * n_bundles, strategy=strategy)
        ray.get(group.ready(), timeout=60)
        spread += even(list(ray.util.placement_group_table(group)["bundles_to_node_id"].values()))
        remove_placement_group(group)
    return spread


def group_alone(n_workers: int) -> tuple[float, float]:
    """(seconds to place, seconds to remove) one placement group of ``n_workers`` default bundles."""
    from shmvec.transports.ray import placement as module

    module.RETURN_WAIT_S = RETURN_WAIT_S
    placement = module.Placement(n_workers, {})
    t0 = time.perf_counter()
    placement.actor_options(0)
    placement.wait(60.0)
    placed = time.perf_counter() - t0
    t0 = time.perf_counter()
    placement.remove()
    return placed, time.perf_counter() - t0


def vec_env(n_workers: int, ray_options: dict | None, return_wait_s: float) -> tuple[float, float, bool]:
    """(start-up s, close s, workers spread evenly over the nodes) of one ShmVecEnv whose close()
    waits at most ``return_wait_s`` for Ray to count the group's resources as free."""
    from shmvec import ShmVecEnv
    from shmvec.transports.ray import placement
    from tests.envs import TinyImageEnv

    placement.RETURN_WAIT_S = return_wait_s
    t0 = time.perf_counter()
    venv = ShmVecEnv([TinyImageEnv] * n_workers, n_workers=n_workers, backend="ray", ray_options=ray_options)
    start = time.perf_counter() - t0
    nodes = venv._eng.transport.nodes
    t0 = time.perf_counter()
    venv.close()
    return start, time.perf_counter() - t0, even(nodes)


def show(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=1, help="CPUs of each of the 2 nodes")
    parser.add_argument("--groups", type=int, default=30, help="bare groups made back to back per strategy")
    args = parser.parse_args()
    kinds = {
        "placement group (default)": (None, RETURN_WAIT_S),
        "placement group, close() not waiting": (None, 0.0),
        "Ray's default, no group": ({"scheduling_strategy": "DEFAULT"}, RETURN_WAIT_S),
    }
    groups: list[tuple[float, float]] = []
    runs: dict[str, list[tuple[float, float, bool]]] = {kind: [] for kind in kinds}
    strategies = ["SPREAD", "STRICT_SPREAD"] if args.workers <= 2 else ["SPREAD"]
    with local_cluster(2, cpus=args.cpus):
        for r in range(args.rounds):
            groups.append(group_alone(args.workers))
            for kind in list(kinds) if r % 2 == 0 else list(kinds)[::-1]:
                vec_env(args.workers, *kinds[kind])
                runs[kind].append(vec_env(args.workers, *kinds[kind]))
        bare = {strategy: groups_back_to_back(args.workers, strategy, args.groups) for strategy in strategies}
    print(
        f"\n{args.workers} workers, 2 nodes of {args.cpus} CPU, {args.rounds} rounds (s: median, min-max)\n"
    )
    print("| what | start-up | close | runs spread evenly |")
    print("|---|---|---|---|")
    print(f"| the group alone | {show([p for p, _ in groups])} | {show([r for _, r in groups])} | |")
    for kind, values in runs.items():
        spread = sum(e for _, _, e in values)
        starts, closes = [s for s, _, _ in values], [c for _, c, _ in values]
        print(f"| ShmVecEnv, {kind} | {show(starts)} | {show(closes)} | {spread} of {len(values)} |")
    print("\n| bare groups back to back | spread evenly |\n|---|---|")
    for strategy, spread in bare.items():
        print(f"| {strategy} | {spread} of {args.groups} |")


if __name__ == "__main__":
    main()
