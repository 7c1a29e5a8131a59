"""What the machine and the benchmarked process tree do while a measurement runs: CPU time of the
tree, CPU time everyone else took, hypervisor steal, and memory (RSS/PSS and shared-memory segments).

Linux-first: ``/proc/stat`` and ``/dev/shm`` are read where they exist; elsewhere the figures that
need them are reported as 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import psutil

from shmvec.engine.groups import usable_cpus

__all__ = ["CpuSnapshot", "Memory", "cpu_snapshot", "memory", "shm_segments", "usable_cpus"]


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU counters at one instant (seconds)."""

    tree_s: float  # user + system time of the main process and the workers
    machine_busy_s: float  # all CPUs, everything but idle/iowait/steal
    machine_steal_s: float  # time the hypervisor gave our virtual CPUs to someone else
    machine_total_s: float


def _tree(processes: list[Any]) -> list[psutil.Process]:
    procs = [psutil.Process()]
    for p in processes:
        try:
            proc = psutil.Process(p.pid)
            procs.append(proc)
            procs.extend(proc.children(recursive=True))
        except (psutil.NoSuchProcess, ValueError, TypeError):
            continue
    return procs


def _proc_stat() -> tuple[float, float, float]:
    """(busy, steal, total) seconds over all CPUs since boot, from the first line of /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is inside user.
    idle = fields[3] + fields[4]
    steal = fields[7] if len(fields) > 7 else 0.0
    total = sum(fields[:8])
    return (total - idle - steal) / tick, steal / tick, total / tick


def cpu_snapshot(processes: list[Any]) -> CpuSnapshot:
    """CPU counters of this process plus ``processes`` (and their children), and of the machine."""
    tree = 0.0
    for proc in _tree(processes):
        try:
            t = proc.cpu_times()
            tree += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    busy, steal, total = _proc_stat()
    return CpuSnapshot(tree, busy, steal, total)


@dataclass(frozen=True)
class Memory:
    """Memory of the process tree (bytes). RSS counts shared pages once per process; PSS splits
    them between the processes that map them, so the PSS sum is the tree's real footprint."""

    rss: int
    pss: int


def memory(processes: list[Any]) -> Memory:
    """RSS and PSS summed over this process plus ``processes`` (and their children)."""
    rss = pss = 0
    for proc in _tree(processes):
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return Memory(rss, pss)


def shm_segments() -> dict[str, int]:
    """Named shared-memory segments in /dev/shm and their sizes (bytes)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return {}
    sizes = {}
    for name in names:
        try:
            sizes[name] = os.stat(os.path.join("/dev/shm", name)).st_size
        except OSError:
            continue
    return sizes
