"""When the main process's OpenMP threads are paused (shmvec.engine.openmp.PolicyThreads): decided at each
step from how busy the workers kept the cores, read from their clocks (WorkerClocks). The runtimes
and clocks are stand-ins here, so that a decision is checked without timings; the real pool, ended
and started again in a fresh interpreter, is tests/test_openmp.py's.
"""

from __future__ import annotations

import contextlib
import os
import types

import pytest


class _Pauses:
    """Stands in for the libgomp runtimes: counts pauses and starts instead of ending and starting
    threads."""

    def __init__(self, runtimes: int = 1) -> None:
        self.n_runtimes, self.count, self.starts = runtimes, 0, 0

    def runtimes(self) -> int:
        return self.n_runtimes

    def idle(self) -> bool:
        return False

    def pause(self) -> int:
        self.count += 1
        return self.n_runtimes

    def start(self) -> None:
        assert self.starts < self.count, "started without a pause"
        self.starts += 1


class _Phases:
    """A wall clock and workers' run and queued seconds that each phase advances by what the test
    says."""

    def __init__(self) -> None:
        self.now = self.cpu = self.queued = 0.0
        self.reads: list[list[int]] = []
        self.gone = False

    def clock(self) -> float:
        return self.now

    def times(self, pids) -> tuple[float, float] | None:
        self.reads.append(list(pids))
        return None if self.gone else (self.cpu, self.queued)

    def advance(self, busy_cores: float, wall: float = 0.01, queued_cores: float = 0.0) -> None:
        self.now += wall
        self.cpu += busy_cores * wall
        self.queued += queued_cores * wall

    def phase(self, threads, busy_cores: float, wall: float = 0.01) -> bool:
        paused = threads.before_step()
        self.advance(busy_cores, wall)
        threads.after_step()
        return paused

    def pool_cycle(self, threads, busy_cores: float, overlapped: bool) -> bool:
        """send (``overlapped``: the next batch can come without it), the workers step until recv."""
        paused = threads.before_step(overlapped)
        self.advance(busy_cores)
        threads.after_step()
        return paused


def _threads(cpus: int, runtimes: int = 1, pids=(11, 12), every: int = 1):
    from shmvec.engine.openmp import PolicyThreads

    phases = _Phases()
    processes = [types.SimpleNamespace(pid=pid) for pid in pids]
    threads = PolicyThreads(cpus, processes, times=phases.times, clock=phases.clock)
    threads.pauser = _Pauses(runtimes)
    threads.SAMPLE_EVERY = every
    return threads, phases


def test_pauses_while_the_workers_keep_the_cores_busy_and_not_while_they_wait():
    threads, phases = _threads(cpus=2)
    assert phases.phase(threads, 0.9), "nothing measured yet: the first step pauses"
    assert threads.busy is None and phases.reads == [], "the first step's one-time costs are not measured"
    assert phases.phase(threads, 1.8)
    assert threads.busy == pytest.approx(1.8)
    assert all(phases.phase(threads, 1.6) for _ in range(4))
    # The env starts waiting on I/O: the average falls below 1.25 cores within a few steps.
    waits = [phases.phase(threads, 0.05) for _ in range(6)]
    assert waits[0] and not waits[-1], waits
    assert threads.busy < 1
    first_free = waits.index(False)
    assert all(not w for w in waits[first_free:]), "once the average is low it stays low"
    # CPU-bound again: pausing resumes.
    busy_again = [phases.phase(threads, 2.0) for _ in range(8)]
    assert busy_again[-1] and not busy_again[0], busy_again
    assert threads.pauser.count == sum([True] * 6 + waits + busy_again)
    assert threads.pauser.starts == threads.pauser.count, "every paused step starts the pool after it"
    assert phases.reads == [[11, 12]] * (2 * 19), "each phase after the first reads at both ends"


def test_workers_slowed_by_the_spinning_threads_still_count_as_needing_the_cores():
    threads, phases = _threads(cpus=2)
    threads.busy = 1.8
    # Not paused, a spinner holds one core: the workers run on ~1 and queue for the other.
    for _ in range(12):
        threads.before_step()
        phases.advance(0.95, queued_cores=0.5)
        threads.after_step()
    assert threads.busy == pytest.approx(1.45, abs=0.02) and threads.pausing


def test_one_core_pauses_for_a_busy_worker_and_an_unreadable_clock_adds_no_sample():
    threads, phases = _threads(cpus=1)
    assert all(phases.phase(threads, 0.5) for _ in range(4)), "half of the only core is busy"
    assert not all(phases.phase(threads, 0.02) for _ in range(8)), "a worker that waits leaves it spare"
    busy = threads.busy
    phases.gone = True  # a worker ended: its clock cannot be read
    phases.phase(threads, 0.5)
    assert threads.busy == busy


def test_one_phase_in_sample_every_is_measured():
    threads, phases = _threads(cpus=2, every=4)
    assert phases.phase(threads, 1.9) and phases.reads == [], "the first step is not measured"
    assert phases.phase(threads, 0.05)
    assert threads.busy == pytest.approx(0.05) and len(phases.reads) == 2
    assert not any(phases.phase(threads, 1.9) for _ in range(3)), "phases 2-4 are not measured"
    assert threads.busy == pytest.approx(0.05) and len(phases.reads) == 2
    phases.phase(threads, 1.9)
    assert threads.busy > 0.05 and len(phases.reads) == 4


def test_of_many_workers_a_spread_sample_is_read_and_scaled_to_all():
    """Reading 32 workers' clocks at both ends of a phase cost the main process ~65 µs per step: a
    few are read, the same ones each time, and stand for the rest."""
    pids = list(range(100, 132))
    threads, phases = _threads(cpus=16, pids=pids)
    share = {}  # the cores each worker ran on per second of the phase

    def times(asked):
        phases.reads.append(list(asked))
        return sum(share[p] for p in asked) * phases.now, 0.0

    threads._times = times
    share.update(dict.fromkeys(pids, 0.5))  # 16 busy cores in all
    for _ in range(3):
        phases.phase(threads, 0.0)
    assert phases.reads == [[100, 108, 116, 124]] * 4
    assert threads.busy == pytest.approx(16.0) and threads.pausing
    share.update(dict.fromkeys(pids, 0.1))
    for _ in range(30):
        phases.phase(threads, 0.0)
    assert threads.busy == pytest.approx(3.2, abs=0.01) and not threads.pausing
    few, few_phases = _threads(cpus=2, pids=(1, 2, 3, 4))
    few_phases.phase(few, 1.0)
    few_phases.phase(few, 1.0)
    assert few_phases.reads == [[1, 2, 3, 4]] * 2 and few.busy == pytest.approx(1.0), "4 are read in full"


def test_pool_mode_does_not_pause_steps_that_run_while_the_policy_does():
    threads, phases = _threads(cpus=2)
    # batch_size == num_envs: the next batch needs these envs, so pausing pays as in step().
    assert all(phases.pool_cycle(threads, 1.9, overlapped=False) for _ in range(4))
    # Smaller batches: the next batch comes from the other envs while these step.
    assert not any(phases.pool_cycle(threads, 1.9, overlapped=True) for _ in range(4))
    assert threads.busy == pytest.approx(1.9) and len(phases.reads) == 2 * 7, "still measured"
    assert phases.pool_cycle(threads, 1.9, overlapped=False), "decided at every send"


def test_workers_that_wait_for_a_core_count_as_needing_it():
    """Two CPU-bound processes on one CPU: each runs half the time and waits the other half, and
    both halves are demand (the case of workers next to a spinning OpenMP thread)."""
    import os
    import subprocess
    import sys
    import time

    from shmvec.engine.openmp import WorkerClocks

    cpu = min(os.sched_getaffinity(0))
    spin = f"import os, time; os.sched_setaffinity(0, {{{cpu}}}); print(flush=True)\nwhile True: pass"
    children = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for child in children:
            child.stdout.readline()  # pinned and spinning
        pids = [c.pid for c in children]
        clocks = WorkerClocks()
        (run0, queued0), start = clocks(pids), time.perf_counter()
        time.sleep(0.4)
        (run, queued), wall = clocks(pids), time.perf_counter() - start
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert (run - run0) / wall < 1.2, "the two shared one CPU"
    assert (run - run0 + queued - queued0) / wall > 1.6, "both were runnable all along"
    fds = len(os.listdir("/proc/self/fd"))
    assert clocks(pids) is None, "reaped: the files kept open read as no such process"
    assert len(os.listdir("/proc/self/fd")) == fds - 2, "the reaped pids' files closed"
    assert clocks([os.getpid()]) is not None
    assert len(os.listdir("/proc/self/fd")) == fds - 1, "one opened"
    clocks.close()
    assert len(os.listdir("/proc/self/fd")) == fds - 2


def test_nothing_to_measure_always_pauses_and_no_runtime_reads_nothing():
    threads, phases = _threads(cpus=4, pids=())
    assert all(threads.before_step() for _ in range(3)), "no local workers (Ray): every step pauses"
    threads.after_step()
    assert threads.busy is None and phases.reads == []
    quiet, quiet_phases = _threads(cpus=4, runtimes=0)
    assert not quiet_phases.phase(quiet, 3.0)
    assert quiet.pauser.count == 0 and quiet_phases.reads == [] and quiet.busy is None


def test_live_pids_skips_unstarted_processes_and_gives_up_on_a_closed_one():
    import multiprocessing as mp

    from shmvec.engine.openmp import live_pids

    started, unstarted = types.SimpleNamespace(pid=7), mp.get_context("fork").Process(target=print)
    assert live_pids([started, unstarted]) == [7]
    unstarted.close()
    assert live_pids([started, unstarted]) == []


def test_close_releases_the_worker_clock_files_while_the_env_is_still_referenced():
    import gymnasium as gym
    import numpy as np

    from shmvec import ShmVecEnv

    venv = ShmVecEnv([lambda: gym.make("CartPole-v1")] * 2, start_method="fork", n_workers=2)
    venv._engine._openmp.pauser = _Pauses()  # a pool to pause: the steps are measured
    venv.reset()
    for _ in range(6):  # phases 1 and 5 are measured: each worker's schedstat is opened
        venv.step(np.zeros(2, dtype=np.int64))
    fds = list(venv._engine._openmp._clocks._files._fds.values())
    assert len(fds) == 2, "the steps were measured"
    venv.close()
    for fd in fds:  # closed: gone, or (reused meanwhile) no longer a worker's schedstat
        with contextlib.suppress(OSError):
            assert not os.readlink(f"/proc/self/fd/{fd}").endswith("/schedstat")
