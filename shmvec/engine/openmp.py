"""Idle OpenMP threads in the main process, and why shmvec ends them while the workers step.

PyTorch's CPU wheels for Linux run intra-op parallelism (convolutions, matrix products, MKL) on GNU
OpenMP (libgomp). When a parallel region ends, libgomp's pool threads do not go to sleep: unless
``OMP_WAIT_POLICY=PASSIVE`` was set before libgomp loaded, each spins for ``GOMP_SPINCOUNT`` (300,000
pause instructions) first. Measured on the 2-core development machine: after every forward pass of
SB3's NatureCNN, torch's second thread burned 8 ms of a core while the main thread slept.

In a synchronous VecEnv the env step follows the forward pass at once. ``DummyVecEnv`` steps the envs
on the main thread, so the spinner only takes a core nobody else wants; shmvec's workers need every
core, and the spinner takes one of them: with PPO's ``CnnPolicy`` in the loop on 2 cores the two
workers ran one after the other instead of side by side (SB3 Atari recipe, 8 envs: the env phase took
11.5 ms per batch while each worker spent only 5.3 ms in ``env.step``).

``omp_pause_resource_all`` (OpenMP 5.0, in libgomp since GCC 9) ends the calling thread's pool; the
next parallel region starts new threads, so nothing is lost but thread start-up. ShmVecEnv calls it
in ``step_async`` before it sends the step: the pool threads are still spinning then, so they leave
at once, and the workers wake up to free cores (paused after sending instead, the second worker
started 1.7-1.9 ms after the first; paused before, both within 0.5 ms). The environment
variable cannot do this: libgomp reads ``OMP_WAIT_POLICY`` once, when ``import torch`` loads it,
usually before shmvec is imported.

Only libgomp is handled: its pause touches the calling thread's pool alone, so it is safe whatever
other threads do. Intel's and LLVM's runtimes (``libiomp5``, ``libomp``) pause process-wide and are
left alone.

The pause has a price, so :class:`PolicyThreads` pays it only when the workers need the cores. The
next parallel region must start new threads, and when the cores have been idle meanwhile that start
is slow: on the development machine the first region after a pause and a 1 ms sleep took 7-8 ms more,
all of it CPU time of the main thread spinning for the new thread. With an env that sleeps 2 ms per
step (8 envs, 2 workers, PPO ``CnnPolicy`` in the loop) a batch step took 26.3 ms pausing and 16.9 ms
pausing only when needed (``benchmarks/policy_pause.py``). Whether the workers need the cores is
measured, not guessed: the time they ran or waited for a core over each env phase (the step sent to
the last reply), read from their process CPU clocks and ``/proc/<pid>/schedstat``.

A paused pool is started again as soon as the step's last reply is in (an empty parallel region),
before the cores the workers just left go idle, instead of by the policy's next forward pass after
whatever the caller does in between. SB3's recipe with ``VecFrameStack(ShmVecEnv)`` stacks frames in
the main process for ~0.6 ms there: PPO ``CnnPolicy`` in the loop ran 1.23x faster (median of 6
interleaved rounds, 0.80-1.54x), the forward passes' 90th percentile falling from 17.8 to 5.6 ms;
with ``frame_stack=4``, 1.09x (0.94-1.27x). That is done only once the policy has been seen to
make the pool again itself (see :meth:`OpenMPPauser.start`): a pool that something else made, once,
would be restarted for nothing after every step.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from shmvec.engine.procfs import ProcFiles

_OMP_PAUSE_SOFT = 1
_LIBGOMP = re.compile(r"/libgomp[^/]*\.so[^/]*$")


def loaded_libgomp(maps: str = "/proc/self/maps") -> list[str]:
    """Paths of the GNU OpenMP runtimes mapped into this process (several when libraries ship their
    own copy, as PyTorch does); empty where ``/proc`` is missing."""
    try:
        with open(maps) as f:
            paths = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if _LIBGOMP.search(p))


class OpenMPPauser:
    """Ends the idle OpenMP threads of the calling thread's pools (see the module docstring).

    :meth:`pause` is cheap when there is nothing to do: the runtimes are looked up again only when
    the set of imported modules has changed since the last look (a library that loads libgomp is
    imported as a module first). :meth:`idle` says when there is nothing to do at all.
    """

    RECHECK = 64

    def __init__(self) -> None:
        self._pauses: list[Callable[[int], int]] = []
        self._regions: list[Callable[[], None]] = []  # an empty parallel region per runtime
        self._ended: list[Callable[[], None]] = []  # the regions of the runtimes start() may start
        self._before = 0  # threads before the last pause
        self._seen: set[str] = set()
        self._n_modules = -1
        self._count = 0  # threads at the last look (idle())
        self._floor = 0  # threads of the process with no pool, as last confirmed (0: not known)
        self._unconfirmed = 0  # threads before the last pause if it seemed to end none, else 0
        self._idle_steps = 0
        self._remakes: bool | None = None  # whether the policy's regions made an ended pool again
        self._left = 0  # threads once a pool start() left to the policy had gone (0: none left)
        self._starts = 0  # pools start() found ended, counted for one in RECHECK to be left

    def _refresh(self) -> None:
        self._n_modules = len(sys.modules)
        for path in loaded_libgomp():
            if path in self._seen:
                continue
            self._seen.add(path)
            try:
                # dlopen of an already loaded library returns it; nothing new is loaded.
                lib = ctypes.CDLL(path)
                fn, parallel, noop = lib.omp_pause_resource_all, lib.GOMP_parallel, lib.omp_get_thread_num
            except (OSError, AttributeError):  # a libgomp older than GCC 9
                continue
            fn.argtypes = [ctypes.c_int]
            fn.restype = ctypes.c_int
            self._pauses.append(fn)
            # GOMP_parallel(fn, data, num_threads, flags) is what "#pragma omp parallel" compiles to;
            # num_threads 0 is the calling thread's default, the team size the policy's regions use.
            parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
            parallel.restype = None
            body = ctypes.cast(noop, ctypes.c_void_p)  # a C function that does nothing harmful
            self._regions.append(functools.partial(parallel, body, None, 0, 0))

    def runtimes(self) -> int:
        """How many libgomp runtimes :meth:`pause` would ask (looked up again as in :meth:`pause`)."""
        if len(sys.modules) != self._n_modules:
            self._refresh()
        return len(self._pauses)

    def idle(self) -> bool:
        """Whether no pool can have started since a pause found none (one ``stat``): the process has
        as many threads as it had then. A policy on a GPU, or no policy (random actions), never
        makes a pool, and pausing and measuring for it cost the main process ~12 µs per step at 2
        workers and ~30 at 32. Confirmed an env phase after that pause, when a pool it ended has
        surely left (see :meth:`start`); a pool that starts later adds threads. One idle step in
        :attr:`RECHECK` says False all the same, so that a pause looks again: a pool
        whose threads had not yet left when it was judged gone (a very short env phase) would
        otherwise keep the same count and never be paused again. After a pool :meth:`start` left
        to the policy, the count says whether the policy made it again (see :meth:`start`)."""
        if self._left:  # a pool start() left to the policy: whether its regions made it again
            self._count = count = _thread_count()
            self._remakes = count > self._left
            if not self._remakes:  # none: nothing to pause until a pool is made (counted)
                self._floor = self._left
            self._left = 0
        elif not (self._floor or self._unconfirmed):  # no pause yet ended nothing (pool mode's overlap)
            return False
        else:
            self._count = count = _thread_count()
        if self._unconfirmed:
            if count == self._unconfirmed:
                self._floor = count
            self._unconfirmed = 0
        if not 0 < count == self._floor:
            return False
        self._idle_steps += 1
        return self._idle_steps % self.RECHECK != 0

    def pause(self) -> int:
        """Pause every libgomp pool of the calling thread; return how many runtimes were asked.
        Notes which runtimes :meth:`start` may start again."""
        n = self.runtimes()
        self._before = count = self._count or _thread_count()
        self._count = 0
        if n == 1:  # whether it ended threads is judged in start(), once they have surely left
            self._ended = self._regions[:]
            self._pauses[0](_OMP_PAUSE_SOFT)
            return n
        self._ended = []
        for fn, start in zip(self._pauses, self._regions):
            # -1 inside a parallel region (nothing happens); 0 otherwise.
            fn(_OMP_PAUSE_SOFT)
            after = _thread_count()
            if after < count:
                self._ended.append(start)
            count = after
        return n

    def start(self) -> None:
        """Start again the pools the last :meth:`pause` ended, with an empty parallel region in each
        of their runtimes: what the policy's next region would do, done now. Nothing if the process
        has no fewer threads than before that pause (no pool: a policy on a GPU, or one too small
        for parallel regions), so that no pool is made that nobody uses, whose threads would spin on
        the workers' cores.

        Only where the policy's own regions have been seen to make an ended pool again: the first
        ended pool, and one in :attr:`RECHECK` after, is left to the policy, and :meth:`idle` looks
        at the next step whether it was made. A pool made once by something else than the policy (a
        network's initialisation, with random actions after) would otherwise be started after every
        step for nothing, its threads spinning on the workers' cores: in Tianshou's Collector with
        random actions on 2 cores that cost the main process 957 µs of CPU per env step against 96
        without pausing, 2.7x fewer env steps per second (``benchmarks/tianshou_loop.py``).

        The pause's threads may still be leaving when it returns (``pthread_join`` returns before
        the kernel drops the thread), so with one runtime the count is compared here, an env phase
        later. With several (scikit-learn and others bundle their own libgomp), only the runtimes
        whose pause showed fewer threads at once are started: the others' empty regions would make
        pools the policy does not use."""
        ended, self._ended = self._ended, []
        now = _thread_count() if ended else 0
        if ended and now < self._before:
            self._floor = 0  # there was a pool after all
            self._starts += 1
            if self._remakes and self._starts % self.RECHECK:
                for start in ended:
                    start()
            else:  # left to the policy, which shows by the next step whether it makes the pool
                self._left = now
        else:  # none ended, or not yet gone: idle() tells which, an env phase later
            self._unconfirmed = self._before


def _thread_count() -> int:
    """Threads of this process, 0 where ``/proc`` is missing: Linux gives ``/proc/self/task`` a link
    count of 2 plus the threads, so one ``stat`` (~5 µs) does what listing it did in ~13."""
    try:
        return os.stat("/proc/self/task").st_nlink - 2
    except OSError:
        return 0


def live_pids(processes: Sequence[Any]) -> list[int]:
    """The pids of the started ones of ``processes``; empty if one is closed (being replaced)."""
    try:
        return [p.pid for p in processes if p.pid is not None]
    except ValueError:  # Process.pid of a closed process object
        return []


def process_cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time, for :func:`time.clock_gettime` (Linux's encoding,
    the one glibc's ``clock_getcpuclockid`` returns): one system call per read, no ``/proc`` parsing."""
    return ((~pid) << 3) | 2


class WorkerClocks:
    """Reads the seconds processes have run and the seconds their main threads have waited to run
    (runnable, queued behind other threads), each in total over the pids asked.

    Run time alone understates what a worker needs when something else holds its core: next to a
    spinning OpenMP thread two CPU-bound workers ran 0.95 cores' worth (median, 2 cores) and would
    have read as not needing both; with their queueing added they read 1.48 (1.76 with the threads
    paused). The run time comes from the process CPU clock, which is up to date when read;
    schedstat's own run time is not (it lags by up to a scheduler tick for a thread that is running).

    Each pid's ``/proc/<pid>/schedstat`` stays open between reads (:class:`~shmvec.engine.procfs.ProcFiles`;
    two workers are read at both ends of every fourth step); :meth:`close` closes them.
    """

    def __init__(self) -> None:
        self._files = ProcFiles("schedstat")

    def __call__(self, pids: Sequence[int]) -> tuple[float, float] | None:
        """Total run and queued seconds of ``pids``; None where one is gone or ``/proc`` is missing."""
        texts = self._files.read(pids)
        if texts is None:
            return None
        try:
            queued = sum(int(text.split()[1]) for text in texts) / 1e9
            run = sum(time.clock_gettime(process_cpu_clock(pid)) for pid in pids)
        except (OSError, ValueError, IndexError):
            return None
        return run, queued

    def close(self) -> None:
        """Close the files kept open (idempotent; a later read opens them again)."""
        self._files.close()


# pids, wall clock, their run and queued seconds, and the factor from those pids to every worker
_Reading = tuple[list[int], float, float, float, float]


class PolicyThreads:
    """Before each step, pauses the policy's idle OpenMP threads when the workers need the cores.

    The workers need them when, over recent env phases, they ran or waited to run on all but less
    than :attr:`SPARE` of the cores (a spinning thread would take a whole one): a running average of
    their run plus queued seconds (:class:`WorkerClocks`) per second, with weight :attr:`WEIGHT` on
    the newest phase. Waiting to run counts, or workers slowed down by the spinning threads would
    look as if they needed less and the pause, once stopped, would not resume. Not a whole core, so
    that on one core a worker that mostly waits (a few percent of a core) does not count as needing
    it. Until a phase has been measured, and where there are no local worker processes to measure
    (Ray) or no ``/proc/<pid>/schedstat``, every step pauses. A step that paused starts the threads
    again in :meth:`after_step`. One phase in :attr:`SAMPLE_EVERY` is measured, from the second: the
    reads cost ~4 µs per worker at each end (:class:`WorkerClocks`), and the average needs no more.
    Of more than :attr:`READ_AT_MOST` workers, that many spread evenly over them are read and their
    sum scaled to all: read in full, 32 workers cost the main process ~65 µs per step on average
    (synthetic 84x84x4 env, 128 envs, torch imported), for an estimate that a sample of workers
    stepping equal shares of the envs gives as well.

    In pool mode a send after which the next batch can be filled without the envs it sends
    (``before_step(overlapped=True)``) does not pause: those envs step while the policy runs, their
    workers hold the cores the restarted threads would need, and the forward pass waits for them.
    Measured with 16 envs in batches of 8 (2 workers, PPO ``CnnPolicy``, three runs): pausing there
    was never faster, and with envs that wait it was 1.43x slower in one run
    (``benchmarks/policy_pause.py --loops pool``; with NatureCNN and Pong in the envs, 1.09-1.53x
    per round). That is known from the pool's state, not measured: the workers' run time while the
    policy runs would read low exactly when the policy's threads crowd them out.

    :param cpus: cores this process may run on.
    :param processes: the local worker processes (``multiprocessing`` process objects), a list the
        owner updates in place as workers are replaced; empty: none to measure.
    :param times: seconds the given pids have run and waited to run, None when unreadable (tests
        pass their own; default: a :class:`WorkerClocks` of this object's own, closed by :meth:`close`).
    :param clock: wall clock in seconds (tests pass their own).
    """

    WEIGHT = 0.25
    SPARE = 0.75
    SAMPLE_EVERY = 4
    READ_AT_MOST = 4

    def __init__(
        self,
        cpus: int,
        processes: Sequence[Any],
        times: Callable[[Sequence[int]], tuple[float, float] | None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.pauser = OpenMPPauser()
        self.limit = cpus - self.SPARE  # pause above this many busy cores
        self.busy: float | None = None  # cores the workers ran or waited on, averaged over env phases
        self._processes = processes
        self._clocks = WorkerClocks()
        self._times = self._clocks if times is None else times
        self._clock = clock
        self._steps = 0
        self._phase: _Reading | None = None  # where the env phase being measured began
        self._paused = False  # the step in flight paused the threads

    @property
    def pausing(self) -> bool:
        """Whether the next step pauses (when a runtime is loaded)."""
        return self.busy is None or self.busy > self.limit

    def before_step(self, overlapped: bool = False) -> bool:
        """Call right before sending a step to the workers; whether it paused. ``overlapped``: pool
        mode, where the next batch can come without these steps, so they run while the policy does
        (no pause; see the class docstring)."""
        self._phase = None
        if not self.pauser.runtimes() or self.pauser.idle():  # no OpenMP pool: nothing to pause or measure
            return False
        # Steps 1, 1 + SAMPLE_EVERY...: not step 0, whose env phase holds one-time costs (the
        # workers' first step after a reset, the pool's first start); CPU-bound envs read 0.84 busy
        # cores there against 1.5-1.8 later.
        if self._steps > 0 and (self._steps - 1) % self.SAMPLE_EVERY == 0:
            self._phase = self._sample()
        self._steps += 1
        self._paused = not overlapped and self.pausing
        if self._paused:
            self.pauser.pause()
        return self._paused

    def after_step(self) -> None:
        """Call once the step's last reply (pool mode: the batch) is in: adds this env phase to the
        average, and starts the paused threads again while the cores the workers just left are warm
        (see the class docstring)."""
        if self._phase is not None:
            pids, then, run0, queued0, scale = self._phase
            self._phase = None
            now = self._read(pids)
            if now is not None and now[1] > then:
                sample = scale * (now[2] - run0 + now[3] - queued0) / (now[1] - then)
                self.busy = sample if self.busy is None else self.busy + self.WEIGHT * (sample - self.busy)
        if self._paused:
            self._paused = False
            self.pauser.start()

    def close(self) -> None:
        """Close the files the default clocks keep open (idempotent)."""
        self._clocks.close()

    def _sample(self) -> _Reading | None:
        """The start of a measured phase: of more than :attr:`READ_AT_MOST` workers, the same ones
        at every sample (their files stay open), spread over the groups."""
        processes = self._processes
        if len(processes) > self.READ_AT_MOST:
            processes = processes[:: -(-len(processes) // self.READ_AT_MOST)]
        return self._read(live_pids(processes), len(self._processes) / max(len(processes), 1))

    def _read(self, pids: list[int], scale: float = 1.0) -> _Reading | None:
        times = self._times(pids) if pids else None
        return None if times is None else (pids, self._clock(), *times, scale)
