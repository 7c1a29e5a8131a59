"""How envs are dealt to workers: contiguous groups, and the CPUs there are to deal them to."""

from __future__ import annotations

import os
from collections.abc import Sequence


def usable_cpus() -> int:
    """CPUs this process may run on (affinity mask / cgroup-limited where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def split_envs(n_envs: int, n_workers: int) -> list[range]:
    """Contiguous groups of env indices, sizes differing by at most one (the first ones larger)."""
    base, extra = divmod(n_envs, n_workers)
    groups, start = [], 0
    for w in range(n_workers):
        size = base + (1 if w < extra else 0)
        groups.append(range(start, start + size))
        start += size
    return groups


def by_worker(
    indices: Sequence[int], worker_envs: list[range]
) -> list[tuple[int, tuple[list[int], list[int]]]]:
    """Env indices (negative ones count from the end) grouped by worker, in worker order:
    ``(worker, (local indices, positions in indices))``.

    :raises IndexError: for an index out of range.
    """
    n_envs = worker_envs[-1].stop
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for pos, i in enumerate(indices):
        if not -n_envs <= i < n_envs:
            raise IndexError(f"env index {i} out of range for {n_envs} envs")
        i %= n_envs
        w = next(w for w, g in enumerate(worker_envs) if i in g)
        local, positions = groups.setdefault(w, ([], []))
        local.append(i - worker_envs[w].start)
        positions.append(pos)
    return sorted(groups.items())
