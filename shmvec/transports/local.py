"""The local transport: worker processes on this machine, a pipe to each, one shared-memory ring.

:meth:`WorkerPool.call` never raises for what a worker did: it returns an
:class:`~shmvec.protocol.Outcome` with the results, the exceptions the envs raised and the workers
that died or hung, and the caller decides (raise, or rebuild the worker). Releasing everything goes
through one path, :meth:`Resources.release` (:mod:`shmvec.transports.resources`), which a
``weakref.finalize`` also runs if the owner is garbage collected unclosed.
"""

from __future__ import annotations

import ctypes
import math
import os
import pickle
import select
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from shmvec.failures import crash_error, timeout_error
from shmvec.process import thread_env
from shmvec.procfs import last_cpu
from shmvec.protocol import (
    Command,
    Outcome,
    RemoteError,
    frame_header,
    pickle_factories,
    read_message,
    write_message,
)
from shmvec.restart import Fault
from shmvec.transports.resources import Resources
from shmvec.worker import worker_main

# Unpinned workers' CPUs are read again every this many sends: a worker stays where it is for
# hundreds of steps (0.00-0.01 migrations per step measured with PPO in the loop), and reading two
# workers' /proc/<pid>/stat costs ~8 µs.
_CPUS_EVERY = 8

# A message up to this size (bytes) is written in one go: the worker has read every earlier message
# (it answered them), so the pipe has room for it. A larger one is written within ``timeout``.
_SMALL_MESSAGE = 4096


def _sched_getcpu() -> Any:
    try:
        return ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):  # not glibc/musl
        return None


_SCHED_GETCPU = _sched_getcpu()


def current_cpu() -> int | None:
    """The CPU the calling thread runs on right now (None where the C library cannot tell)."""
    return None if _SCHED_GETCPU is None else int(_SCHED_GETCPU())


class WorkerPool:
    """The worker processes of one engine and the pipes to them.

    :param ctx: the multiprocessing context.
    :param start_method: its name (for error hints and whether factories are pickled).
    :param worker_envs: the env indices of each worker.
    :param env_fns: all env factories.
    :param worker_threads: BLAS/OpenMP threads per worker (None: the libraries' defaults).
    :param timeout: seconds a reply may take (None: no limit; a dead worker is noticed at once).
    :param isolate_rng: give each env its own process-global RNG state in its worker.
    :param worker_cpus: the CPU of each worker (None: the OS places them).
    """

    def __init__(
        self,
        ctx: Any,
        start_method: str,
        worker_envs: list[range],
        env_fns: list[Callable[[], Any]],
        worker_threads: int | None,
        timeout: float | None,
        isolate_rng: bool = False,
        worker_cpus: Sequence[int] | None = None,
    ) -> None:
        self.ctx, self.start_method, self.worker_envs = ctx, start_method, worker_envs
        self.isolate_rng, self.worker_cpus = isolate_rng, worker_cpus
        self.worker_threads, self.timeout = worker_threads, timeout
        self.res = Resources()
        # Per worker: its pipe's fd and its process sentinel, looked up on every step otherwise.
        self._fds: list[tuple[int, int]] = []
        self._sends = 0  # calls of post, for _last_cpus
        self._cpus: Sequence[int | None] | None = None
        # Kept in the main process: a replaced worker is rebuilt from them.
        self.worker_fns: list[bytes | list[Callable[[], Any]]] = []
        needed_by, way_out = f"the '{start_method}' start method", "use start_method='fork'"
        for group in worker_envs:
            group_fns = [env_fns[i] for i in group]
            pickled = start_method != "fork"
            self.worker_fns.append(
                pickle_factories(group_fns, group.start, needed_by, way_out) if pickled else group_fns
            )

    @property
    def n_workers(self) -> int:
        return len(self.worker_envs)

    def start(self, w: int) -> None:
        """Start worker ``w`` (new, or in place of a dead one) and wait until its envs exist.

        The start-up reply (the spaces of its envs) is read by the caller through :meth:`gather`.
        """
        res = self.res
        fault_log = tempfile.mkstemp(prefix=f"shmvec-worker-{w}-", suffix=".fault")
        if w < len(res.fault_logs):
            res.close_fault_log(w)
            res.fault_logs[w] = fault_log
        else:
            res.fault_logs.append(fault_log)
        remote, work_remote = self.ctx.Pipe()
        # The pipe is created right before its own worker so no other worker inherits the
        # child end: a dead worker then shows up as EOF instead of a silent hang.
        process = self.ctx.Process(
            target=worker_main,
            args=(
                work_remote,
                self.worker_fns[w],
                self.worker_envs[w].start,
                self.worker_threads,
                fault_log[1],
                self.isolate_rng,
                None if self.worker_cpus is None else self.worker_cpus[w],
            ),
            daemon=True,
            name=f"shmvec-worker-{w}",
        )
        with _environ(thread_env(self.worker_threads)):
            process.start()
        work_remote.close()
        fds = (remote.fileno(), process.sentinel)
        if w < len(res.processes):
            res.processes[w], res.remotes[w], self._fds[w] = process, remote, fds
        else:
            res.processes.append(process)
            res.remotes.append(remote)
            self._fds.append(fds)

    def started(self, workers: Sequence[int], stop_on_fault: bool) -> Outcome:
        """Wait for the start-up replies of ``workers``, then unlink their fault logs' names (the
        workers have opened them; the main process reads them through its own fds)."""
        outcome = self.gather(workers, Command.MAKE_ENV.value, stop_on_fault)
        for w in workers:
            with suppress(OSError):
                os.unlink(self.res.fault_logs[w][1])
        return outcome

    def kill(self, w: int) -> None:
        """SIGKILL worker ``w`` and reap it (a hung or broken env gets no chance to clean up: its envs
        are rebuilt anyway, and the shared memory belongs to the main process)."""
        process = self.res.processes[w]
        if process.is_alive():
            process.kill()
        process.join(5.0)

    def replace(self, w: int) -> None:
        """Kill worker ``w`` and start a new one from the same factories."""
        self.kill(w)
        self.res.remotes[w].close()
        with suppress(ValueError):
            self.res.processes[w].close()
        self.start(w)

    def send(self, w: int, cmd: Command, payload: Any, label: str) -> Fault | None:
        """Send one command; the fault if the worker is dead or does not take it within ``timeout``."""
        # Plain pickle: Connection.send builds a ForkingPickler per message, which costs more than
        # the rest of sending a step command.
        data = pickle.dumps((cmd.value, payload), pickle.HIGHEST_PROTOCOL)
        fd = self._fds[w][0]
        try:
            if self.timeout is None or len(data) <= _SMALL_MESSAGE:
                write_message(fd, data)
            elif not _send_within(fd, data, self.timeout):
                return self.hung(w, label, "it was killed", "take")
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return self.lost(w, label)
        return None

    def post(
        self, cmd: Command, payloads: Sequence[Any], workers: Sequence[int], label: str, stop_on_fault: bool
    ) -> list[Fault]:
        """Send ``cmd`` with one payload to each of ``workers``; the faults of those that could not
        take it (killed if hung: a half-written message leaves their pipe unusable). Stops at the
        first fault with ``stop_on_fault``."""
        faults = []
        order = list(zip(workers, payloads))
        cpus = self.worker_cpus if self.worker_cpus is not None else self._last_cpus()
        if cpus is not None and len(order) > 1:
            # A worker woken on this thread's CPU preempts it; sent first, it would hold back the
            # messages to the others. Sent last, it delays nothing. Measured on 2 CPUs: pinned, one
            # batch in ten started its second worker 3.4 ms late; unpinned, with PPO in the loop,
            # the env phase took 3.86-3.89 ms when the worker sent first shared this CPU against
            # 3.06-3.14 ms otherwise, each worker stepping for 2.65 ms either way.
            here = current_cpu()
            order.sort(key=lambda item: cpus[item[0]] == here)
        for w, payload in order:
            fault = self.send(w, cmd, payload, label)
            if fault is not None:
                self.kill(w)
                faults.append(fault)
                if stop_on_fault:
                    break
        return faults

    def _last_cpus(self) -> Sequence[int | None] | None:
        """The CPU each worker last ran on, read every :data:`_CPUS_EVERY` calls; None if unknown."""
        self._sends += 1
        if self._sends % _CPUS_EVERY == 1:
            try:
                pids = [p.pid for p in self.res.processes]
                texts = None if None in pids else self.res.stat_files.read(pids)
            except ValueError:  # a closed process object: a worker being replaced
                texts = None
            self._cpus = None if texts is None else [last_cpu(text) for text in texts]
        return self._cpus

    def call(
        self,
        cmd: Command,
        payloads: Sequence[Any],
        workers: Iterable[int],
        label: str,
        stop_on_fault: bool,
    ) -> Outcome:
        """Send ``cmd`` with one payload to each of ``workers``, then :meth:`gather` their replies."""
        workers = list(workers)
        faults = self.post(cmd, payloads, workers, label, stop_on_fault)
        if faults and stop_on_fault:
            return Outcome([None] * len(workers), faults=faults)
        failed = {f.worker for f in faults}
        outcome = self.gather([w for w in workers if w not in failed], label, stop_on_fault)
        results = dict(zip([w for w in workers if w not in failed], outcome.results))
        outcome.results = [results.get(w) for w in workers]
        outcome.faults = sorted(outcome.faults + faults, key=lambda f: f.worker)
        return outcome

    def lost(self, w: int, command: str) -> Fault:
        """The fault of dead worker ``w`` (waits up to 1 s for its exit code)."""
        process = self.res.processes[w]
        process.join(1.0)
        error = crash_error(
            w,
            process.pid,
            self.worker_envs[w],
            process.exitcode,
            command,
            self._fault_text(w),
            self.start_method,
        )
        return Fault(w, error.args[0], error)

    def hung(self, w: int, command: str, outcome: str, verb: str = "answer") -> Fault:
        """The fault of worker ``w`` that did not answer (or take) ``command`` in time."""
        assert self.timeout is not None
        error = timeout_error(
            w, self.res.processes[w].pid, self.worker_envs[w], command, self.timeout, outcome, verb
        )
        return Fault(w, error.args[0], error)

    def fds(self, w: int) -> tuple[int, int]:
        """What to ``poll`` for worker ``w``: its pipe (a reply) and its process sentinel (its end)."""
        return self._fds[w]

    def has_reply(self, w: int) -> bool:
        """Whether worker ``w``'s pipe holds a reply (one it sent before ending is still read)."""
        poller = select.poll()
        poller.register(self._fds[w][0], select.POLLIN)
        return any(event & select.POLLIN for _, event in poller.poll(0))

    def receive(self, w: int) -> tuple[bool, Any]:
        """Worker ``w``'s next reply, ``(ok, result or RemoteError)``.

        :raises EOFError, OSError: when the worker is gone (see :meth:`lost`).
        """
        return pickle.loads(read_message(self._fds[w][0]))

    def gather(self, workers: Iterable[int], command: str, stop_on_fault: bool) -> Outcome:
        """Wait for one reply from each worker, watching for death and the timeout.

        Every worker is waited for even after one reports an env error, so the pipes stay in step.
        ``stop_on_fault``: return at the first dead or hung worker (the caller closes everything);
        else hung workers are killed and every fault is collected.
        """
        workers = list(workers)
        results: dict[int, Any] = {}
        errors: dict[int, RemoteError] = {}
        faults: dict[int, Fault] = {}
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        # A bare poll object, not multiprocessing.connection.wait: that builds a selectors object on
        # every call, which was a third of the main process's CPU time per step on Pong.
        poller = select.poll()
        watched: dict[int, tuple[int, bool]] = {}  # fd -> (worker, is its process sentinel)
        for w in workers:
            pipe, sentinel = self.fds(w)
            watched[pipe], watched[sentinel] = (w, False), (w, True)
        for fd in watched:
            poller.register(fd, select.POLLIN)
        pending = set(workers)

        def forget(w: int) -> None:
            pending.discard(w)
            for fd in self.fds(w):
                if watched.pop(fd, None) is not None:
                    poller.unregister(fd)

        while pending:
            wait_ms = None if deadline is None else math.ceil(max(0.0, deadline - time.monotonic()) * 1000)
            events = poller.poll(wait_ms)
            if not events:
                hung = sorted(pending)
                if stop_on_fault:
                    faults[hung[0]] = self.hung(hung[0], command, "it was killed and the VecEnv closed")
                    break
                for w in hung:
                    self.kill(w)
                    faults[w] = self.hung(w, command, "it was killed and will be restarted")
                break
            for fd, _ in events:
                if fd not in watched:
                    continue
                w, is_sentinel = watched[fd]
                if is_sentinel:  # the process ended; a reply it sent first is still read
                    if not self.has_reply(w):
                        faults[w] = self.lost(w, command)
                        forget(w)
                    continue
                try:
                    ok, payload = self.receive(w)
                except (EOFError, OSError):
                    faults[w] = self.lost(w, command)
                    forget(w)
                    continue
                forget(w)
                if ok:
                    results[w] = payload
                else:
                    errors[w] = payload
            if faults and stop_on_fault:
                break
        return Outcome([results.get(w) for w in workers], errors, [faults[w] for w in sorted(faults)])

    def _fault_text(self, w: int) -> str:
        try:
            return os.pread(self.res.fault_logs[w][0], 1 << 16, 0).decode(errors="replace")
        except (OSError, IndexError):
            return ""


def _send_within(fd: int, data: bytes, timeout: float) -> bool:
    """:func:`~shmvec.protocol.write_message`, giving up after ``timeout`` seconds of a full pipe;
    False then (part of the message may have been written)."""
    header = frame_header(len(data))
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    os.set_blocking(fd, False)
    try:
        for chunk in (memoryview(header), memoryview(data)):
            while len(chunk):
                try:
                    chunk = chunk[os.write(fd, chunk) :]
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0 or not poller.poll(math.ceil(left * 1000)):
                        return False
    finally:
        os.set_blocking(fd, True)
    return True


@contextmanager
def _environ(values: dict[str, str]) -> Any:
    """Set environment variables for the duration of a worker start (spawn children read them)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
