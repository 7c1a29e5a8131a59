"""The local transport: worker processes on this machine, the ring's doorbell, a pipe each.

Steps whose actions are in the ring travel as doorbell words (:mod:`shmvec.memory.doorbell`): one
system call wakes every worker of a batch, and the last to finish wakes the main process once.
Every other command, and any reply that does not fit the ring, is a pickled message in the worker's
pipe. :meth:`LocalTransport.wait` blocks in one ``epoll`` on the doorbell's ``eventfd``, the pipes
(a reply that does not fit the pipe's buffer is read while the worker writes it) and the process
sentinels (a death is noticed at once), with the earliest command deadline as its timeout.

Releasing everything goes through one path, :meth:`Resources.release`
(:mod:`shmvec.transports.resources`), which a ``weakref.finalize`` also runs if the owner is garbage
collected unclosed.
"""

from __future__ import annotations

import math
import os
import select
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from shmvec.failures import crash_error, timeout_error
from shmvec.memory.doorbell import OP_MESSAGE, OP_STEP, MainBell, check_available
from shmvec.memory.ring import Ring
from shmvec.transports.base import Fault, Outcome, pickle_factories
from shmvec.transports.resources import Resources
from shmvec.wire import framing
from shmvec.wire.messages import MAKE_ENV, Attach, Command, Failed, Reply, Returned, Step
from shmvec.worker.loop import worker_main
from shmvec.worker.process import thread_env

# A message up to this size (bytes) is written in one go: the worker reads every message it is
# woken for, so the pipe has room. A larger one is written within ``timeout``.
_SMALL_MESSAGE = 4096
# While a counted batch lost a worker, nobody may be left to wake the main process (the dead one
# may have finished without counting down): it looks at the doorbell this often instead (s).
_LOST_COUNT_POLL_S = 0.01
_WAKE, _PIPE, _SENTINEL = 0, 1, 2


@dataclass
class _Flight:
    """A command in flight to one worker."""

    label: str
    deadline: float
    via_bell: bool  # answered through the doorbell (else: the reply is a pipe message)
    counted: bool


class LocalTransport:
    """The worker processes of one engine, and what reaches them.

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
        check_available()
        self.ctx, self.start_method, self.worker_envs = ctx, start_method, worker_envs
        self.isolate_rng, self.worker_cpus = isolate_rng, worker_cpus
        self.worker_threads, self.timeout = worker_threads, timeout
        # Kept in the main process: a replaced worker is rebuilt from them.
        self.worker_fns: list[bytes | list[Callable[[], Any]]] = []
        needed_by, way_out = f"the '{start_method}' start method", "use start_method='fork'"
        for group in worker_envs:
            group_fns = [env_fns[i] for i in group]
            pickled = start_method != "fork"
            self.worker_fns.append(
                pickle_factories(group_fns, group.start, needed_by, way_out) if pickled else group_fns
            )
        n = len(worker_envs)
        # An eventfd in a Connection: every start method knows how to hand a Connection to a child.
        self.res = Resources(Connection(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)))
        self.res.attached = [False] * n
        self._fds: dict[int, tuple[int, int]] = {}  # epoll'd fd -> (kind, worker)
        self.res.epoll.register(self.res.wake.fileno(), select.EPOLLIN)
        self._fds[self.res.wake.fileno()] = (_WAKE, -1)
        self.in_flight: dict[int, _Flight] = {}
        self.replies: dict[int, Reply] = {}  # pipe replies read for workers in flight
        self.idle_faults: dict[int, Fault] = {}  # workers found dead while idle
        self._lost_count = False
        self._all = np.arange(n)

    @property
    def n_workers(self) -> int:
        return len(self.worker_envs)

    # ------------------------------------------------------------------ processes

    def start(self, workers: Sequence[int]) -> None:
        """Start ``workers`` (new, or in place of dead ones); their start-up replies come through
        :meth:`wait`."""
        for w in workers:
            self._start(w)

    def _start(self, w: int) -> None:
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
        cpu = None if self.worker_cpus is None else self.worker_cpus[w]
        process = self.ctx.Process(
            target=worker_main,
            args=(
                w,
                work_remote,
                res.wake,
                self.worker_fns[w],
                self.worker_envs[w].start,
                self.worker_threads,
                fault_log[1],
                self.isolate_rng,
                cpu,
            ),
            daemon=True,
            name=f"shmvec-worker-{w}",
        )
        with _environ(thread_env(self.worker_threads)):
            process.start()
        work_remote.close()
        if w < len(res.processes):
            res.processes[w], res.remotes[w] = process, remote
        else:
            res.processes.append(process)
            res.remotes.append(remote)
        res.attached[w] = False
        self.idle_faults.pop(w, None)
        for kind, fd in ((_PIPE, remote.fileno()), (_SENTINEL, process.sentinel)):
            res.epoll.register(fd, select.EPOLLIN)
            self._fds[fd] = (kind, w)
        self.in_flight[w] = _Flight(MAKE_ENV, self._deadline(), via_bell=False, counted=False)

    def bind(self, ring: Ring) -> None:
        """The ring exists: its doorbell reaches the workers once they have attached."""
        assert ring.bell is not None, "the local transport needs a ring with a doorbell"
        self.res.ring = ring
        self.res.bell = MainBell(ring.bell, self.res.wake.fileno())

    def kill(self, w: int) -> None:
        """SIGKILL worker ``w`` and reap it (a hung or broken env gets no chance to clean up: its envs
        are rebuilt anyway, and the shared memory belongs to the main process)."""
        process = self.res.processes[w]
        if process.is_alive():
            process.kill()
        process.join(5.0)
        self._forget(w)

    def replace(self, w: int) -> None:
        """Kill worker ``w`` and start a new one from the same factories."""
        self.kill(w)
        self.res.remotes[w].close()
        with suppress(ValueError):
            self.res.processes[w].close()
        self._start(w)

    def _forget(self, w: int) -> None:
        """Worker ``w`` is gone: stop watching it, and count down for it if a batch waits on it."""
        flight = self.in_flight.pop(w, None)
        if flight is not None and flight.counted:
            self._lost_count = True
        self.replies.pop(w, None)
        for fd, (kind, owner) in list(self._fds.items()):
            if owner == w and kind != _WAKE:
                del self._fds[fd]
                with suppress(OSError, ValueError):
                    self.res.epoll.unregister(fd)

    @property
    def processes(self) -> list[Any]:
        """The worker processes, in worker order (a list replaced workers are updated in)."""
        return self.res.processes

    def close(self, graceful: bool = True) -> None:
        self.res.release(graceful)

    # ------------------------------------------------------------------ commands

    def _deadline(self) -> float:
        return math.inf if self.timeout is None else time.monotonic() + self.timeout

    def post(self, workers: Sequence[int], commands: Command | Sequence[Command]) -> list[Fault]:
        """Send one command to each of ``workers`` (see :class:`~shmvec.transports.base.Transport`)."""
        ws = list(workers)
        msgs = [commands] * len(ws) if isinstance(commands, Command) else list(commands)
        faults = [self.idle_faults.pop(w) for w in ws if w in self.idle_faults]
        if faults:
            failed = {f.worker for f in faults}
            kept = [(w, c) for w, c in zip(ws, msgs) if w not in failed]
            ws, msgs = [w for w, _ in kept], [c for _, c in kept]
        if not ws:
            return faults
        attached, bell = self.res.attached, self.res.bell
        by_bell = [k for k, w in enumerate(ws) if attached[w]] if bell is not None else []
        # Counted (one wake-up when the last finishes) when these are all the commands in flight.
        counted = not self.in_flight and len(by_bell) == len(ws)
        steps = [msgs[k] for k in by_bell]
        in_ring = bool(steps) and all(isinstance(c, Step) and c.actions is None for c in steps)
        if by_bell:
            assert bell is not None
            every = len(by_bell) == self.n_workers
            targets: slice | np.ndarray = slice(None) if every else self._all[[ws[k] for k in by_bell]]
            if in_ring:
                slots = [msgs[k].slot for k in by_bell]  # type: ignore[attr-defined]
                same = slots.count(slots[0]) == len(slots)
                bell.post(targets, OP_STEP, slots[0] if same else np.array(slots), counted)
            else:
                # Rung before the messages are written: a worker reads its pipe only once woken, and a
                # message larger than the pipe's buffer could not be written before that.
                bell.post(targets, OP_MESSAGE, 0, counted)
        deadline = self._deadline()
        for k, w in enumerate(ws):
            via_bell = bool(attached[w] and bell is not None)
            if not (via_bell and in_ring):
                fault = self._write(w, msgs[k], msgs[k].label)
                if fault is not None:
                    self._lost_count = self._lost_count or counted
                    self.kill(w)
                    faults.append(fault)
                    continue
            self.in_flight[w] = _Flight(msgs[k].label, deadline, via_bell, counted)
        return faults

    def _write(self, w: int, msg: Command, label: str) -> Fault | None:
        """Write one message to worker ``w``'s pipe; the fault if the worker is dead or does not take
        it within ``timeout``."""
        data = framing.dumps(msg)
        fd = self.res.remotes[w].fileno()
        try:
            if self.timeout is None or len(data) <= _SMALL_MESSAGE:
                framing.write_message(fd, data)
            elif not _send_within(fd, data, self.timeout):
                return self.hung(w, label, "it was killed", "take")
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return self.lost(w, label)
        return None

    def wait(self, workers: Sequence[int], need: int, limit: float | None = None) -> Outcome:
        """Wait until ``need`` of ``workers`` answered, died or hung (see
        :class:`~shmvec.transports.base.Transport`)."""
        outcome = Outcome()
        pending = [w for w in workers if w in self.in_flight]
        for w in workers:
            if w not in self.in_flight and w in self.idle_faults:
                outcome.faults.append(self.idle_faults.pop(w))
        give_up = math.inf if limit is None else time.monotonic() + limit
        while True:
            pending = self._collect(pending, outcome)
            if outcome.finished + len(outcome.faults) >= need or not pending:
                break
            now = time.monotonic()
            until = min(give_up, min(self.in_flight[w].deadline for w in pending))
            wait_s = None if until == math.inf else max(0.0, until - now)
            if self._lost_count:
                wait_s = _LOST_COUNT_POLL_S if wait_s is None else min(wait_s, _LOST_COUNT_POLL_S)
            events = self.res.epoll.poll(-1 if wait_s is None else wait_s)
            for fd, _ in events:
                kind, w = self._fds.get(fd, (None, -1))
                if kind == _WAKE:
                    self.res.bell.drain() if self.res.bell is not None else os.eventfd_read(fd)
                elif kind == _PIPE:
                    self._read_reply(w, outcome)
                elif kind == _SENTINEL:
                    self._ended(w, outcome)
            pending = self._collect([w for w in pending if w in self.in_flight], outcome)
            now = time.monotonic()
            hung = sorted(w for w in pending if self.in_flight[w].deadline <= now)
            for w in hung:
                label = self.in_flight[w].label
                self.kill(w)
                outcome.faults.append(self.hung(w, label, "it was killed"))
            if hung:
                pending = [w for w in pending if w in self.in_flight]
            if now >= give_up:
                pending = self._collect(pending, outcome)
                break
        if not self.in_flight:
            self._lost_count = False
        outcome.faults.sort(key=lambda f: f.worker)
        return outcome

    def _collect(self, pending: list[int], outcome: Outcome) -> list[int]:
        """Move the finished workers of ``pending`` into ``outcome``; the ones still busy."""
        bell = self.res.bell
        by_bell = [w for w in pending if self.in_flight[w].via_bell]
        finished: list[int] = []
        if by_bell and bell is not None:
            ws = self._all[by_bell]
            done = ws[bell.done(ws)]
            if len(done):
                with_reply = done[bell.has_reply[done] != 0].tolist()
                for w in with_reply:
                    if w not in self.replies:
                        self._receive(w)
                finished = done.tolist()
        finished += [w for w in pending if w in self.replies and not self.in_flight[w].via_bell]
        if not finished:
            return pending
        for w in finished:
            flight = self.in_flight.pop(w, None)
            reply = self.replies.pop(w, None)
            if flight is None:  # died while its reply was read
                continue
            if flight.label == MAKE_ENV:
                # The worker has opened its fault log: its name can go (the fd stays here).
                with suppress(OSError):
                    os.unlink(self.res.fault_logs[w][1])
            if isinstance(reply, Failed):
                outcome.errors[w] = reply.error
            else:
                outcome.results[w] = reply
                if flight.label == Attach.name and isinstance(reply, Returned):
                    self.res.attached[w] = True
        gone = set(finished)
        return [w for w in pending if w not in gone and w in self.in_flight]

    def _receive(self, w: int) -> None:
        """Read worker ``w``'s reply from its pipe (it is there, or being written)."""
        try:
            self.replies[w] = framing.receive(self.res.remotes[w].fileno())
        except (EOFError, OSError):
            self.idle_faults[w] = self.lost(w, self.in_flight[w].label if w in self.in_flight else "step")
            self._forget(w)

    def _read_reply(self, w: int, outcome: Outcome) -> None:
        """Worker ``w``'s pipe is readable: its reply (before it finished), or EOF (it ended)."""
        if w in self.in_flight and w not in self.replies:
            label = self.in_flight[w].label
            try:
                self.replies[w] = framing.receive(self.res.remotes[w].fileno())
            except (EOFError, OSError):
                outcome.faults.append(self.lost(w, label))
                self._forget(w)
            return
        self._ended(w, outcome)

    def _ended(self, w: int, outcome: Outcome) -> None:
        """Worker ``w``'s process ended (or its pipe closed)."""
        process = self.res.processes[w]
        if process.is_alive() and w in self.in_flight:
            return  # a pipe event while its reply was being read: nothing ended
        if w in self.in_flight:
            if w not in self.replies and _readable(self.res.remotes[w].fileno()):
                # A reply it sent before ending is still read.
                with suppress(EOFError, OSError):
                    self.replies[w] = framing.receive(self.res.remotes[w].fileno())
            if w in self.replies and not self.in_flight[w].via_bell:
                return  # collected as a reply; its end shows at the next command
            outcome.faults.append(self.lost(w, self.in_flight[w].label))
        else:
            self.idle_faults[w] = self.lost(w, "step")
        self._forget(w)

    # ------------------------------------------------------------------ faults

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

    def _fault_text(self, w: int) -> str:
        try:
            return os.pread(self.res.fault_logs[w][0], 1 << 16, 0).decode(errors="replace")
        except (OSError, IndexError):
            return ""


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return any(event & select.POLLIN for _, event in poller.poll(0))


def _send_within(fd: int, data: bytes, timeout: float) -> bool:
    """:func:`~shmvec.wire.framing.write_message`, giving up after ``timeout`` seconds of a full pipe;
    False then (part of the message may have been written)."""
    header = framing.frame_header(len(data))
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
