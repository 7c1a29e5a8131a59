"""What the two local transports share: worker processes on this machine, one pipe each, and the
per-worker books of the commands in flight.

:class:`PipeTransport` is a whole transport (:class:`~shmvec.transports.base.Transport`) in which
every command and every reply is a message in the worker's pipe, and a wait blocks until a pipe or
a process sentinel is ready, with the earliest command deadline as its timeout. Its two kinds differ
only in how they read, write and wait:

- :class:`~shmvec.transports.portable.PortableTransport`: ``multiprocessing.Connection`` reads and
  writes and ``multiprocessing.connection.wait``, which every platform has;
- :class:`~shmvec.transports.local.LocalTransport` (Linux): bare ``os.read``/``os.write`` in
  Connection's framing and one ``epoll``, plus the ring's doorbell, which carries steps whose
  actions are in the ring without any message (its own fast paths, on top of these books).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Hashable, Sequence
from contextlib import suppress
from typing import Any

from shmvec.transports.base import Fault, Outcome
from shmvec.transports.processes import Processes
from shmvec.transports.resources import Resources
from shmvec.wire import framing
from shmvec.wire.messages import MAKE_ENV, Command, Failed, Reply

# What a watched object is: a worker's pipe, or its process's sentinel.
PIPE, SENTINEL = 1, 2


class PipeTransport:
    """The worker processes of one engine, a pipe each (see the module docstring).

    :param procs: the worker processes to start (their factories, start method, threads, CPUs).
    :param timeout: seconds a reply may take (None: no limit; a dead worker is noticed at once).
    :param res: what must be released whatever happens (its ``wake`` is the doorbell's eventfd, or
        None without a doorbell).
    """

    def __init__(self, procs: Processes, timeout: float | None, res: Resources) -> None:
        self.procs, self.timeout, self.res = procs, timeout, res
        self.worker_envs, self.start_method = procs.worker_envs, procs.start_method
        n = len(self.worker_envs)
        self.res.attached = [False] * n
        # What a wait watches: key (an fd, or the object itself) -> (PIPE or SENTINEL, worker).
        self._watched: dict[Hashable, tuple[int, int]] = {}
        # The workers with a command in flight; each one's deadline; per worker, its last command's
        # name (for errors). Sets and lists, not arrays: a pool batch posts to one or two workers,
        # where numpy's per-call cost is most of the work.
        self._flying: set[int] = set()
        self._deadlines: dict[int, float] = {}
        self._labels = [""] * n
        self.replies: dict[int, Reply | None] = {}  # pipe replies read for workers in flight
        self.idle_faults: dict[int, Fault] = {}  # workers found dead while idle

    @property
    def n_workers(self) -> int:
        return len(self.worker_envs)

    # ------------------------------------------------------------------ what the kinds provide

    def _watch(self, w: int) -> None:
        """Start watching worker ``w``'s pipe and sentinel (it was just launched)."""
        raise NotImplementedError

    def _unwatch(self, key: Hashable) -> None:
        """Stop watching ``key`` (the worker is gone)."""

    def _events(self, wait_s: float) -> list[tuple[int, int]]:
        """Block up to ``wait_s`` seconds (-1: no limit) for a watched pipe or sentinel; the
        ``(kind, worker)`` of each one ready."""
        raise NotImplementedError

    def _send(self, w: int, data: bytes) -> bool:
        """Write one pickled message to worker ``w``'s pipe; False if it did not take it within
        :attr:`timeout`. :raises OSError, EOFError: the worker is gone."""
        raise NotImplementedError

    def _recv(self, w: int) -> Reply | None:
        """Read one reply from worker ``w``'s pipe (it is there, or being written); None for a step
        answered by the ring alone. :raises EOFError, OSError: worker gone."""
        raise NotImplementedError

    def _settle(self) -> None:
        """Bring the books up to date before anything reads them (the doorbell's fast path keeps
        a synchronous step out of them until then)."""

    # ------------------------------------------------------------------ processes

    def start(self, workers: Sequence[int]) -> None:
        """Start ``workers`` (new, or in place of dead ones); their start-up replies come through
        :meth:`wait`."""
        for w in workers:
            self._start(w)

    def _start(self, w: int) -> None:
        self.procs.launch(w, self.res)
        self.res.attached[w] = False
        self.idle_faults.pop(w, None)
        self._watch(w)
        self._settle()
        self._flying.add(w)
        self._deadlines[w] = math.inf if self.timeout is None else time.monotonic() + self.timeout
        self._labels[w] = MAKE_ENV

    def bind(self, ring: Any) -> None:
        """The ring exists: released with the workers (:class:`~shmvec.transports.resources.Resources`)."""
        self.res.ring = ring

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
        """Worker ``w`` is gone: stop watching it and forget its command."""
        self._settle()
        self._flying.discard(w)
        self.replies.pop(w, None)
        for key, (_, owner) in list(self._watched.items()):
            if owner == w:
                del self._watched[key]
                self._unwatch(key)

    @property
    def processes(self) -> list[Any]:
        """The worker processes, in worker order (a list replaced workers are updated in)."""
        return self.res.processes

    def close(self, graceful: bool = True) -> None:
        self.res.release(graceful)

    def lost(self, w: int, command: str) -> Fault:
        """The fault of dead worker ``w``."""
        return self.procs.lost(w, command, self.res)

    # ------------------------------------------------------------------ commands

    def post(
        self,
        workers: Sequence[int],
        commands: Command | Sequence[Command],
        partial: bool = False,
        fan_out: bool = True,
    ) -> list[Fault]:
        """Send one command to each of ``workers`` (see :class:`~shmvec.transports.base.Transport`),
        each as a message in its pipe (each reply is seen on its own: ``partial`` and ``fan_out``
        change nothing)."""
        ws, msgs, faults = self._live(workers, commands)
        self._book(self._write_all(ws, msgs, faults), msgs[0].label if msgs else "")
        return faults

    def _live(
        self, workers: Sequence[int], commands: Command | Sequence[Command]
    ) -> tuple[list[int], list[Command], list[Fault]]:
        """The workers to post to and their commands, less those found dead while idle (their faults)."""
        self._settle()
        ws = list(workers)
        msgs = [commands] * len(ws) if isinstance(commands, Command) else list(commands)
        faults = [self.idle_faults.pop(w) for w in ws if w in self.idle_faults] if self.idle_faults else []
        if faults:
            dead = {f.worker for f in faults}
            msgs = [c for w, c in zip(ws, msgs) if w not in dead]
            ws = [w for w in ws if w not in dead]
        return ws, msgs, faults

    def _write_all(self, ws: list[int], msgs: list[Command], faults: list[Fault]) -> list[int]:
        """Write each message to its worker's pipe; the workers that took theirs (the others are
        killed and their faults added to ``faults``)."""
        sent, last, data = [], None, b""
        for w, msg in zip(ws, msgs):
            if msg is not last:  # one command for many workers (a synchronous step) is pickled once
                last, data = msg, framing.dumps(msg)
            fault = self._write(w, msg, data)
            if fault is None:
                sent.append(w)
                continue
            self.kill(w)
            faults.append(fault)
        return sent

    def _book(self, sent: Sequence[int], label: str) -> None:
        """``sent`` now have a command named ``label`` in flight, due within :attr:`timeout`."""
        deadline = math.inf if self.timeout is None else time.monotonic() + self.timeout
        self._flying.update(sent)
        self._deadlines.update(dict.fromkeys(sent, deadline))
        for w in sent:
            self._labels[w] = label

    def _write(self, w: int, msg: Command, data: bytes) -> Fault | None:
        """Write ``msg``, pickled as ``data``, to worker ``w``'s pipe; the fault if the worker is dead
        or does not take it within ``timeout``."""
        try:
            if not self._send(w, data):
                return self.procs.hung(w, msg.label, self.timeout, self.res, "take")  # type: ignore[arg-type]
        except (OSError, EOFError):  # BrokenPipeError, ConnectionResetError; Windows' pipe errors
            return self.lost(w, msg.label)
        return None

    def wait(self, workers: Sequence[int], need: int, limit: float | None = None) -> Outcome:
        """Wait until ``need`` of ``workers`` answered, died or hung (see
        :class:`~shmvec.transports.base.Transport`)."""
        outcome = Outcome()
        if self._wait_fast(need, limit, outcome):
            return outcome
        flying = self._flying
        pending = [w for w in workers if w in flying]
        for w in workers:
            if w not in flying and w in self.idle_faults:
                outcome.faults.append(self.idle_faults.pop(w))
        give_up = math.inf if limit is None else time.monotonic() + limit
        polled = False  # a wait of limit 0 still looks once at what arrived
        # One look at what finished per wake-up, right after the poll that woke this process.
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
            for kind, w in self._events(-1.0 if until == math.inf else max(0.0, until - now)):
                if kind == PIPE:
                    self._read_reply(w, outcome)
                elif kind == SENTINEL:
                    self._ended(w, outcome)
            polled = True
            pending = [w for w in pending if w in flying]
        if not flying:
            outcome.faults.sort(key=lambda f: f.worker)
        return outcome

    def _wait_fast(self, need: int, limit: float | None, outcome: Outcome) -> bool:
        """A wait the kind answers its own way (True: ``outcome`` holds it); none here."""
        return False

    def _collect(self, pending: list[int], outcome: Outcome) -> list[int]:
        """Move the workers of ``pending`` whose replies were read into ``outcome``; the ones still busy."""
        if not pending or not self.replies:
            return pending
        finished = [w for w in pending if w in self.replies]
        if not finished:
            return pending
        self._record(finished, outcome)
        return [w for w in pending if w in self._flying]

    def _record(self, finished: list[int], outcome: Outcome) -> None:
        """``finished`` (in flight, their replies read or in the ring) are done: their replies,
        or their envs' errors, into ``outcome``."""
        self._flying.difference_update(finished)
        if not self.replies:  # the usual step: every reply is in the ring
            outcome.results.update(dict.fromkeys(finished))
            return
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

    def _receive(self, w: int, label: str | None = None) -> None:
        """Read worker ``w``'s reply from its pipe (it is there, or being written); if it is gone,
        its fault is kept for the next wait or post (``label``: its command's name, if not booked)."""
        try:
            self.replies[w] = self._recv(w)
        except (EOFError, OSError):
            self.idle_faults[w] = self.lost(w, self._labels[w] if label is None else label)
            self._forget(w)

    def _read_reply(self, w: int, outcome: Outcome) -> None:
        """Worker ``w``'s pipe is readable: its reply (before it finished), or EOF (it ended)."""
        if w in self._flying and w not in self.replies:
            try:
                self.replies[w] = self._recv(w)
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
            if w not in self.replies:
                # A reply it sent before ending is still read.
                with suppress(EOFError, OSError):
                    if self.res.remotes[w].poll(0):
                        self.replies[w] = self._recv(w)
            if w in self.replies and self._answers_by_pipe(w):
                return  # collected as a reply; its end shows at the next command
            outcome.faults.append(self.lost(w, self._labels[w]))
        else:
            self.idle_faults[w] = self.lost(w, "step")
        self._forget(w)

    def _answers_by_pipe(self, w: int) -> bool:
        """Whether worker ``w``'s reply in the pipe is its whole answer (not part of a doorbell step)."""
        return True
