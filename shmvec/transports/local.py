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
import time
from collections.abc import Sequence
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from shmvec.memory.doorbell import OP_MESSAGE, OP_STEP, MainBell, check_available
from shmvec.memory.ring import Ring
from shmvec.transports.base import Fault, Outcome
from shmvec.transports.processes import Processes
from shmvec.transports.resources import Resources
from shmvec.wire import framing
from shmvec.wire.messages import MAKE_ENV, Attach, Command, Failed, Reply, Returned, Step, Stepped

# A message up to this size (bytes) is written in one go: the worker reads every message it is
# woken for, so the pipe has room. A larger one is written within ``timeout``.
_SMALL_MESSAGE = 4096
_WAKE, _PIPE, _SENTINEL = 0, 1, 2
# A synchronous step not done after this long (s): the main process wakes every worker itself, in
# case a leader (memory.doorbell.leaders) did not wake its followers.
_REWAKE_S = 0.05


class LocalTransport:
    """The worker processes of one engine, and what reaches them.

    :param procs: the worker processes to start (their factories, start method, threads, CPUs).
    :param timeout: seconds a reply may take (None: no limit; a dead worker is noticed at once).
    """

    def __init__(self, procs: Processes, timeout: float | None) -> None:
        check_available()
        self.procs, self.timeout = procs, timeout
        self.worker_envs, self.start_method = procs.worker_envs, procs.start_method
        n = len(self.worker_envs)
        # An eventfd in a Connection: every start method knows how to hand a Connection to a child.
        self.res = Resources(Connection(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)))
        self.res.attached = [False] * n
        self._fds: dict[int, tuple[int, int]] = {}  # epoll'd fd -> (kind, worker)
        # Edge-triggered: each worker's write is an event; the count never needs reading back.
        self.res.epoll.register(self.res.wake.fileno(), select.EPOLLIN | select.EPOLLET)
        self._fds[self.res.wake.fileno()] = (_WAKE, -1)
        # The workers with a command in flight; those of them answering through the doorbell (the
        # others: through their pipe); each one's deadline; per worker, its last command's name (for
        # errors). Sets and lists, not arrays: a pool batch posts to one or two workers, where
        # numpy's per-call cost is most of the work.
        self._flying: set[int] = set()
        self._via_bell: set[int] = set()
        self._deadlines: dict[int, float] = {}
        self._labels = [""] * n
        self._attached = [False] * n  # the worker has mapped the ring: the doorbell reaches it
        self.replies: dict[int, Reply] = {}  # pipe replies read for workers in flight
        self.idle_faults: dict[int, Fault] = {}  # workers found dead while idle
        # A counted step of every worker in flight (the fast path): its deadline, and its label; the
        # books above say nothing of it until _materialize() writes it into them.
        self._whole_until: float | None = None
        self._whole_label = ""
        self._all_attached = False  # every worker has mapped the ring (and the bell exists)

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
        self.procs.launch(w, res)
        remote, process = res.remotes[w], res.processes[w]
        res.attached[w] = False
        self._attached[w] = self._all_attached = False
        self.idle_faults.pop(w, None)
        for kind, fd in ((_PIPE, remote.fileno()), (_SENTINEL, process.sentinel)):
            res.epoll.register(fd, select.EPOLLIN)
            self._fds[fd] = (kind, w)
        self._materialize()
        self._flying.add(w)
        self._via_bell.discard(w)
        self._deadlines[w] = math.inf if self.timeout is None else time.monotonic() + self.timeout
        self._labels[w] = MAKE_ENV

    def bind(self, ring: Ring) -> None:
        """The ring exists: its doorbell reaches the workers once they have attached."""
        assert ring.bell is not None, "the local transport needs a ring with a doorbell"
        self.res.ring = ring
        self.res.bell = MainBell(ring.bell)

    def kill(self, w: int) -> None:
        """SIGKILL worker ``w`` and reap it; stop watching it."""
        self.procs.kill(w, self.res)
        self._forget(w)

    def replace(self, w: int) -> None:
        """Kill worker ``w`` and start a new one from the same factories."""
        self.kill(w)
        self.res.remotes[w].close()
        with suppress(ValueError):
            self.res.processes[w].close()
        self._start(w)

    def _forget(self, w: int) -> None:
        """Worker ``w`` is gone: stop watching it, and clear its pending bit if a batch waits on it."""
        self._materialize()
        if self.res.bell is not None:
            self.res.bell.give_up_on(w)
        self._flying.discard(w)
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

    def post(self, workers: Sequence[int], commands: Command | Sequence[Command]) -> list[Fault]:
        """Send one command to each of ``workers`` (see :class:`~shmvec.transports.base.Transport`)."""
        if self._whole_ready(workers, commands):
            # The synchronous step: every worker, one counted batch, actions and slot in the ring.
            self.res.bell.step_all(commands.slot)  # type: ignore[union-attr]
            self._whole_until = math.inf if self.timeout is None else time.monotonic() + self.timeout
            self._whole_label = commands.label  # type: ignore[union-attr]
            return []
        self._materialize()
        ws = list(workers)
        msgs = [commands] * len(ws) if isinstance(commands, Command) else list(commands)
        faults = [self.idle_faults.pop(w) for w in ws if w in self.idle_faults] if self.idle_faults else []
        if faults:
            dead = {f.worker for f in faults}
            msgs = [c for w, c in zip(ws, msgs) if w not in dead]
            ws = [w for w in ws if w not in dead]
        if not ws:
            return faults
        bell, attached = self.res.bell, self._attached
        # A worker is attached only once the ring and its bell exist.
        by_bell = ws if self._all_attached else [w for w in ws if attached[w]]
        # Counted (one wake-up when the last finishes) when these are all the commands in flight.
        counted = len(by_bell) == len(ws) and not self._flying
        in_ring = len(by_bell) == len(ws) and all(isinstance(c, Step) and c.actions is None for c in msgs)
        if by_bell:
            targets = None if counted and len(ws) == self.n_workers else by_bell
            if in_ring:
                slots = [c.slot for c in msgs]  # type: ignore[attr-defined]
                same = slots.count(slots[0]) == len(slots)
                bell.post(targets, OP_STEP, slots[0] if same else slots, counted)  # type: ignore[union-attr]
            else:
                # Rung before the messages are written: a worker reads its pipe only once woken, and a
                # message larger than the pipe's buffer could not be written before that.
                bell.post(targets, OP_MESSAGE, 0, counted)  # type: ignore[union-attr]
        sent = ws
        if not in_ring:
            sent = []
            for w, msg in zip(ws, msgs):
                fault = self._write(w, msg)
                if fault is None:
                    sent.append(w)
                    continue
                self.kill(w)
                faults.append(fault)
        deadline = math.inf if self.timeout is None else time.monotonic() + self.timeout
        self._flying.update(sent)
        self._via_bell.difference_update(sent)
        self._via_bell.update(w for w in sent if attached[w])
        self._deadlines.update(dict.fromkeys(sent, deadline))
        label = msgs[0].label
        for w in sent:
            self._labels[w] = label
        return faults

    def _whole_ready(self, workers: Sequence[int], commands: Command | Sequence[Command]) -> bool:
        """Whether this post is a step of every worker, all idle and attached, actions in the ring."""
        return (
            isinstance(commands, Step)
            and commands.actions is None
            and isinstance(workers, range)
            and len(workers) == self.n_workers
            and not self.idle_faults
            and self._all_attached
            and not self._flying
            and self._whole_until is None
        )

    def _write(self, w: int, msg: Command) -> Fault | None:
        """Write one message to worker ``w``'s pipe; the fault if the worker is dead or does not take
        it within ``timeout``."""
        data = framing.dumps(msg)
        fd = self.res.remotes[w].fileno()
        try:
            if self.timeout is None or len(data) <= _SMALL_MESSAGE:
                framing.write_message(fd, data)
            elif not framing.write_within(fd, data, self.timeout):
                return self.procs.hung(w, msg.label, self.timeout, self.res, "take")
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return self.lost(w, msg.label)
        return None

    def wait(self, workers: Sequence[int], need: int, limit: float | None = None) -> Outcome:
        """Wait until ``need`` of ``workers`` answered, died or hung (see
        :class:`~shmvec.transports.base.Transport`)."""
        outcome = Outcome()
        if self._whole_until is not None:
            if need == self.n_workers and limit is None and self._wait_whole(outcome):
                return outcome
            self._materialize()
        flying = self._flying
        pending = [w for w in workers if w in flying]
        for w in workers:
            if w not in flying and w in self.idle_faults:
                outcome.faults.append(self.idle_faults.pop(w))
        give_up = math.inf if limit is None else time.monotonic() + limit
        polled = False  # a wait of limit 0 still looks once at what arrived
        # One look at the ring per wake-up: the workers done are collected at the top, right after
        # the poll that woke this process.
        while True:
            pending = self._collect(pending, outcome)
            if outcome.finished + len(outcome.faults) >= need or not pending:
                break
            now = time.monotonic()
            first = min(self._deadlines[w] for w in pending)
            if first <= now:
                for w in [w for w in pending if self._deadlines[w] <= now]:
                    label = self._labels[w]
                    self.kill(w)
                    outcome.faults.append(self.procs.hung(w, label, self.timeout, self.res))  # type: ignore[arg-type]
                pending = [w for w in pending if w in flying]
                continue
            if polled and now >= give_up:
                break
            until = min(give_up, first)
            wait_s = -1.0 if until == math.inf else max(0.0, until - now)
            for fd, _ in self.res.epoll.poll(wait_s):
                kind, w = self._fds.get(fd, (None, -1))
                if kind == _PIPE:
                    self._read_reply(w, outcome)
                elif kind == _SENTINEL:
                    self._ended(w, outcome)
            polled = True
            pending = [w for w in pending if w in flying]
        if not flying:
            outcome.faults.sort(key=lambda f: f.worker)
        return outcome

    def _wait_whole(self, outcome: Outcome) -> bool:
        """The synchronous step's wait: sleep until the last worker's eventfd write, then take every
        reply from the ring, and the few from pipes (an episode's end with untyped infos: about one
        worker a step at 128 envs), read as they come. False at anything else: a process event, the
        deadline, an error; the general loop then handles it (with the pipe replies already read)."""
        bell = self.res.bell
        assert bell is not None and self._whole_until is not None
        until = self._whole_until
        woken_all = not bell.fans_out
        while not bell.batch_done():
            wait_s = -1.0 if until == math.inf else max(0.0, until - time.monotonic())
            if not woken_all:
                wait_s = _REWAKE_S if wait_s < 0 else min(wait_s, _REWAKE_S)
            events = self.res.epoll.poll(wait_s)
            if not events:
                if not woken_all and time.monotonic() < until:
                    # A leader that has not woken its followers by now (stopped, or given no CPU):
                    # they are not to wait for it, nor be taken for hung with it.
                    bell.wake_all()
                    woken_all = True
                    continue
                return False
            for fd, _ in events:
                kind, w = self._fds.get(fd, (_WAKE, -1))
                if kind == _PIPE and w not in self.replies:
                    self._receive(w)  # written before the worker finishes; an EOF is a fault
                elif kind != _WAKE:
                    return False
            if self.idle_faults:
                return False
        results: dict[int, Reply | None] = dict.fromkeys(range(self.n_workers))
        if bell.has_reply.any():
            replying = np.flatnonzero(bell.has_reply).tolist()
            for w in replying:
                if w not in self.replies:
                    self._receive(w)  # written before the worker finished: there in full
            if self.idle_faults or any(type(self.replies.get(w)) is not Stepped for w in replying):
                return False
            for w in replying:
                results[w] = self.replies.pop(w)
        self._whole_until = None
        outcome.results.update(results)
        return True

    def _materialize(self) -> None:
        """Write a fast-path step of every worker into the per-worker books (before anything that
        reads them: the general wait, a post, a worker's end)."""
        if self._whole_until is None:
            return
        every = range(self.n_workers)
        self._flying.update(every)
        self._via_bell.update(every)
        self._deadlines.update(dict.fromkeys(every, self._whole_until))
        self._labels = [self._whole_label] * self.n_workers
        self._whole_until = None

    def _collect(self, pending: list[int], outcome: Outcome) -> list[int]:
        """Move the finished workers of ``pending`` into ``outcome``; the ones still busy."""
        if not pending:
            return pending
        bell, via = self.res.bell, self._via_bell
        done = set(bell.finished([w for w in pending if w in via])) if bell is not None else set()
        done.update(w for w in pending if w not in via and w in self.replies)
        if not done:
            return pending
        finished = [w for w in pending if w in done]
        if bell is not None:
            has_reply = bell.has_reply  # read after the words that said the worker finished
            for w in finished:
                if w in via and has_reply[w] and w not in self.replies:
                    self._receive(w)
        finished = [w for w in finished if w in self._flying]  # not those that died as their reply was read
        self._flying.difference_update(finished)
        still = [w for w in pending if w not in done]
        if not self.replies:  # the usual step: every reply is in the ring
            outcome.results.update(dict.fromkeys(finished))
            return still
        for w in finished:
            reply = self.replies.pop(w, None)
            if self._labels[w] == MAKE_ENV:
                # The worker has opened its fault log: its name can go (the fd stays here).
                with suppress(OSError):
                    os.unlink(self.res.fault_logs[w][1])
            if isinstance(reply, Failed):
                outcome.errors[w] = reply.error
                continue
            outcome.results[w] = reply
            if self._labels[w] == Attach.name and isinstance(reply, Returned):
                self._attached[w] = True
                self.res.attached[w] = True
                self._all_attached = all(self._attached) and self.res.bell is not None
        return still

    def _receive(self, w: int) -> None:
        """Read worker ``w``'s reply from its pipe (it is there, or being written)."""
        try:
            self.replies[w] = framing.receive(self.res.remotes[w].fileno())
        except (EOFError, OSError):
            # During a synchronous step's wait the labels are not written out yet (_materialize).
            label = self._labels[w] if self._whole_until is None else self._whole_label
            self.idle_faults[w] = self.lost(w, label)
            self._forget(w)

    def _read_reply(self, w: int, outcome: Outcome) -> None:
        """Worker ``w``'s pipe is readable: its reply (before it finished), or EOF (it ended)."""
        if w in self._flying and w not in self.replies:
            try:
                self.replies[w] = framing.receive(self.res.remotes[w].fileno())
            except (EOFError, OSError):
                outcome.faults.append(self.lost(w, self._labels[w]))
                self._forget(w)
            return
        self._ended(w, outcome)

    def _ended(self, w: int, outcome: Outcome) -> None:
        """Worker ``w``'s process ended (or its pipe closed)."""
        if w in self._flying:
            if self.res.processes[w].is_alive():
                return  # a pipe event while its reply was being read: nothing ended
            if w not in self.replies and _readable(self.res.remotes[w].fileno()):
                # A reply it sent before ending is still read.
                with suppress(EOFError, OSError):
                    self.replies[w] = framing.receive(self.res.remotes[w].fileno())
            if w in self.replies and w not in self._via_bell:
                return  # collected as a reply; its end shows at the next command
            outcome.faults.append(self.lost(w, self._labels[w]))
        else:
            self.idle_faults[w] = self.lost(w, "step")
        self._forget(w)

    def lost(self, w: int, command: str) -> Fault:
        """The fault of dead worker ``w``."""
        return self.procs.lost(w, command, self.res)


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return any(event & select.POLLIN for _, event in poller.poll(0))
