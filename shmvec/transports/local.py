"""The local transport (Linux): worker processes on this machine, the ring's doorbell, a pipe each.

Steps whose actions are in the ring travel as doorbell words (:mod:`shmvec.memory.doorbell`): one
system call wakes every worker of a batch, and the last to finish wakes the main process once.
Every other command, and any reply that does not fit the ring, is a pickled message in the worker's
pipe (the books and the general wait are :class:`~shmvec.transports.pipes.PipeTransport`'s, shared
with the portable transport). :meth:`LocalTransport.wait` blocks in one ``epoll`` on the doorbell's
``eventfd``, the pipes (a reply that does not fit the pipe's buffer is read while the worker writes
it) and the process sentinels (a death is noticed at once), with the earliest command deadline as
its timeout.

Releasing everything goes through one path, :meth:`Resources.release`
(:mod:`shmvec.transports.resources`), which a ``weakref.finalize`` also runs if the owner is garbage
collected unclosed.
"""

from __future__ import annotations

import math
import os
import select
import time
from collections.abc import Hashable, Sequence
from contextlib import suppress
from multiprocessing.connection import Connection

import numpy as np

from shmvec.memory.doorbell import OP_MESSAGE, OP_STEP, MainBell, check_available
from shmvec.memory.ring import Ring
from shmvec.transports.base import Fault, Outcome
from shmvec.transports.pipes import PIPE, SENTINEL, PipeTransport
from shmvec.transports.processes import Processes
from shmvec.transports.resources import Resources
from shmvec.wire import framing
from shmvec.wire.messages import Attach, Command, Reply, Returned, Step, Stepped

# A message up to this size (bytes) is written in one go: the worker reads every message it is
# woken for, so the pipe has room. A larger one is written within ``timeout``.
_SMALL_MESSAGE = 4096
_WAKE = 0  # the doorbell's eventfd, in a poll's events
# A synchronous step not done after this long (s): the main process wakes every worker itself, in
# case a leader (memory.doorbell.leaders) did not wake its followers.
_REWAKE_S = 0.05


class LocalTransport(PipeTransport):
    """The worker processes of one engine, and what reaches them (Linux).

    :param procs: the worker processes to start (their factories, start method, threads, CPUs).
    :param timeout: seconds a reply may take (None: no limit; a dead worker is noticed at once).
    """

    def __init__(self, procs: Processes, timeout: float | None) -> None:
        check_available()
        # An eventfd in a Connection: every start method knows how to hand a Connection to a child.
        super().__init__(
            procs, timeout, Resources(Connection(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)))
        )
        n = self.n_workers
        assert self.res.wake is not None and self.res.epoll is not None
        self._epoll: select.epoll = self.res.epoll  # released by Resources
        # Edge-triggered: each worker's write is an event; the count never needs reading back.
        self._epoll.register(self.res.wake.fileno(), select.EPOLLIN | select.EPOLLET)
        # The workers in flight answering through the doorbell (the others: through their pipe).
        self._via_bell: set[int] = set()
        self._attached = [False] * n  # the worker has mapped the ring: the doorbell reaches it
        # A counted step of every worker in flight (the fast path): its deadline, and its label; the
        # books say nothing of it until _materialize() writes it into them.
        self._whole_until: float | None = None
        self._whole_label = ""
        self._all_attached = False  # every worker has mapped the ring (and the bell exists)

    # ------------------------------------------------------------------ processes

    def _start(self, w: int) -> None:
        self._attached[w] = self._all_attached = False
        super()._start(w)
        self._via_bell.discard(w)

    def _watch(self, w: int) -> None:
        res = self.res
        for kind, fd in ((PIPE, res.remotes[w].fileno()), (SENTINEL, res.processes[w].sentinel)):
            self._epoll.register(fd, select.EPOLLIN)
            self._watched[fd] = (kind, w)

    def _unwatch(self, key: Hashable) -> None:
        with suppress(OSError, ValueError):
            self._epoll.unregister(key)  # type: ignore[arg-type]

    def _events(self, wait_s: float) -> list[tuple[int, int]]:
        watched = self._watched
        return [watched[fd] for fd, _ in self._epoll.poll(wait_s) if fd in watched]

    def _send(self, w: int, data: bytes) -> bool:
        fd = self.res.remotes[w].fileno()
        if self.timeout is None or len(data) <= _SMALL_MESSAGE:
            framing.write_message(fd, data)
            return True
        return framing.write_within(fd, data, self.timeout)

    def _recv(self, w: int) -> Reply | None:
        return framing.receive(self.res.remotes[w].fileno())

    def _settle(self) -> None:
        self._materialize()

    def bind(self, ring: Ring) -> None:
        """The ring exists: its doorbell reaches the workers once they have attached."""
        assert ring.bell is not None, "the local transport needs a ring with a doorbell"
        self.res.ring = ring
        self.res.bell = MainBell(ring.bell)

    def _forget(self, w: int) -> None:
        """Worker ``w`` is gone: stop watching it, and clear its pending bit if a batch waits on it."""
        self._materialize()
        if self.res.bell is not None:
            self.res.bell.give_up_on(w)
        super()._forget(w)

    # ------------------------------------------------------------------ commands

    def post(
        self,
        workers: Sequence[int],
        commands: Command | Sequence[Command],
        partial: bool = False,
        fan_out: bool = True,
    ) -> list[Fault]:
        """Send one command to each of ``workers`` (see :class:`~shmvec.transports.base.Transport`)."""
        if not partial and self._whole_ready(workers, commands):
            # The synchronous step: every worker, one counted batch, actions and slot in the ring.
            self.res.bell.step_all(commands.slot, fan_out)  # type: ignore[union-attr]
            self._whole_until = math.inf if self.timeout is None else time.monotonic() + self.timeout
            self._whole_label = commands.label  # type: ignore[union-attr]
            return []
        ws, msgs, faults = self._live(workers, commands)
        if not ws:
            return faults
        bell, attached = self.res.bell, self._attached
        # A worker is attached only once the ring and its bell exist.
        by_bell = ws if self._all_attached else [w for w in ws if attached[w]]
        # Counted (one wake-up when the last finishes) when these are all the commands in flight.
        counted = not partial and len(by_bell) == len(ws) and not self._flying
        in_ring = len(by_bell) == len(ws) and all(
            isinstance(c, Step) and c.actions is None and c.envs is None for c in msgs
        )
        if by_bell:
            targets = None if counted and len(ws) == self.n_workers else by_bell
            if in_ring:
                slots = [c.slot for c in msgs]  # type: ignore[attr-defined]
                same = slots.count(slots[0]) == len(slots)
                if targets is None and not same:
                    # Every worker: the bell takes their slots in worker order, not in the order
                    # posted (a send's envs in any order).
                    by_worker = [0] * self.n_workers
                    for w, s in zip(ws, slots):
                        by_worker[w] = s
                    slots = by_worker
                bell.post(targets, OP_STEP, slots[0] if same else slots, counted)  # type: ignore[union-attr]
            else:
                # Rung before the messages are written: a worker reads its pipe only once woken, and a
                # message larger than the pipe's buffer could not be written before that.
                bell.post(targets, OP_MESSAGE, 0, counted)  # type: ignore[union-attr]
        sent = ws if in_ring else self._write_all(ws, msgs, faults)
        self._book(sent, msgs[0].label)
        self._via_bell.difference_update(sent)
        self._via_bell.update(w for w in sent if attached[w])
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

    def _wait_fast(self, need: int, limit: float | None, outcome: Outcome) -> bool:
        """A synchronous step's wait for every worker (:meth:`_wait_whole`); anything else goes
        through the books (written now)."""
        if self._whole_until is None:
            return False
        if need == self.n_workers and limit is None and self._wait_whole(outcome):
            return True
        self._materialize()
        return False

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
            events = self._epoll.poll(wait_s)
            if not events:
                if not woken_all and time.monotonic() < until:
                    # A leader that has not woken its followers by now (stopped, or given no CPU):
                    # they are not to wait for it, nor be taken for hung with it.
                    bell.wake_all()
                    woken_all = True
                    continue
                return False
            for fd, _ in events:
                kind, w = self._watched.get(fd, (_WAKE, -1))
                if kind == PIPE and w not in self.replies:
                    # Written before the worker finishes; an EOF is a fault.
                    self._receive(w, self._whole_label)
                elif kind != _WAKE:
                    return False
            if self.idle_faults:
                return False
        results: dict[int, Reply | None] = dict.fromkeys(range(self.n_workers))
        if bell.has_reply.any():
            replying = np.flatnonzero(bell.has_reply).tolist()
            for w in replying:
                if w not in self.replies:
                    self._receive(w, self._whole_label)  # written before the worker finished: there in full
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
        if self.replies and not self._all_attached:
            for w in finished:
                if self._labels[w] == Attach.name and isinstance(self.replies.get(w), Returned):
                    self._attached[w] = self.res.attached[w] = True
                    self._all_attached = all(self._attached) and self.res.bell is not None
        self._record(finished, outcome)
        return [w for w in pending if w not in done]

    def _answers_by_pipe(self, w: int) -> bool:
        return w not in self._via_bell
