"""The Ray transport: each worker is a Ray actor; the same interface as the local
:class:`~shmvec.transports.local.WorkerPool`, so the engine drives both the same way.

One Ray call per worker and command: ``actor.call(cmd, payload)`` returns the reply (pickled, as a
worker's pipe carries it) and, for ``step``/``reset``, the worker's batch packed by
:mod:`shmvec.transports.ray_wire` (observations encoded by the codecs, rewards, flags). Landing a
reply writes the batch into the engine's ring, which in this backend only the main process maps.

Faults: an actor that died (``ray.kill``, node lost, out of memory) is a
:class:`~shmvec.errors.WorkerCrashedError` naming the worker, its envs and its node, reported within
:data:`POLL_S` seconds of Ray knowing it even while other actors are still busy; ``timeout`` bounds a
hung actor (killed). Start-up waits at most :data:`START_TIMEOUT_S`, or ``timeout`` but at least
:data:`MIN_START_S` (an actor whose resources the cluster cannot provide is never scheduled).

Connection: the running one when ``ray.is_initialized()``; else a local Ray is started and shut
down when the last engine that uses it closes (:func:`connect`, :func:`disconnect`).
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from typing import Any

from shmvec.errors import install_hint

try:
    import ray
    from ray.exceptions import RayError
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(f'backend="ray" needs Ray: {install_hint("ray")} ({exc})') from None

from shmvec.errors import WorkerCrashedError
from shmvec.failures import timeout_error, worker_label
from shmvec.protocol import Command, Outcome, pickle_factories
from shmvec.restart import Fault
from shmvec.transports.ray_actor import RayWorker
from shmvec.transports.ray_wire import unpack

# Longest wait between looks at the actors still busy: a dead one is reported within this (s).
POLL_S = 1.0
# Start-up bound when no ``timeout`` is given: scheduling an actor, its process, its envs (s).
START_TIMEOUT_S = 300.0
# With a ``timeout``, start-up still gets at least this long: an actor's process and imports take
# seconds (1.5-5.6 s measured on 2 cores), far more than a step (s).
MIN_START_S = 60.0
# How long close() lets actors close their envs before killing them (s).
CLOSE_GRACE_S = 5.0
# Ray's own actor restarts would bring back an actor without its envs' state: shmvec restarts
# workers itself (on_crash="restart"). The user's ray_options may override these.
_DEFAULT_OPTIONS = {"max_restarts": 0, "max_task_retries": 0}

_owned_users = 0  # engines using a Ray connection that shmvec started


def connect() -> bool:
    """Use the running Ray connection, or start a local Ray; True when shmvec started it."""
    global _owned_users
    if ray.is_initialized():
        if _owned_users:
            _owned_users += 1
            return True
        return False
    ray.init(include_dashboard=False, logging_level=logging.WARNING)
    _owned_users = 1
    return True


def disconnect() -> None:
    """One engine on a connection shmvec started is done: shut Ray down after the last one."""
    global _owned_users
    _owned_users -= 1
    if _owned_users <= 0:
        _owned_users = 0
        if ray.is_initialized():
            ray.shutdown()


class RayResources:
    """What must be released: the actors, results still in flight, the ring, the reader, and the
    Ray connection if shmvec started it. ``processes``/``remotes`` are empty (no local workers)."""

    def __init__(self, owns_ray: bool) -> None:
        self.actors: list[Any] = []
        self.pending: dict[int, tuple[Any, str, int | None]] = {}  # worker -> (ref, command, slot)
        self.ring: Any = None
        self.reader: Any = None
        self.processes: list[Any] = []
        self.remotes: list[Any] = []
        self.owns_ray = owns_ray

    def release(self, graceful: bool = True) -> None:
        """Close the actors' envs (``graceful``), kill every actor, free the ring, and disconnect."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if ray.is_initialized():
            refs = [ref for ref, _, _ in self.pending.values()]
            if graceful:
                with suppress(Exception):
                    refs += [actor.close.remote() for actor in self.actors]
                refs = drain(refs, CLOSE_GRACE_S)
            for actor in self.actors:
                with suppress(Exception):
                    ray.kill(actor, no_restart=True)
            drain(refs, 1.0)  # what the killed actors still owed: errors by now
        self.pending = {}
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self.owns_ray:
            self.owns_ray = False
            disconnect()


def drain(refs: Sequence[Any], timeout: float) -> list[Any]:
    """Fetch ``refs`` (errors included) for up to ``timeout`` seconds, and return those not ready:
    a result holding an error that is never fetched makes Ray print "Unhandled error"."""
    if not refs:
        return []
    ready, left = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    for ref in ready:
        with suppress(Exception):
            ray.get(ref, timeout=0)
    return list(left)


class RayPool:
    """Ray actors for the workers of one engine; see :class:`shmvec.transports.local.WorkerPool` for the
    methods (same meaning). ``ctx`` and ``start_method`` are not used.

    :param ray_options: options of every actor (``ray.remote(...).options(**ray_options)``:
        ``num_cpus``, ``resources``, ``scheduling_strategy``, ``runtime_env``...).
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
        *,
        ray_options: Mapping[str, Any] | None = None,
    ) -> None:
        # Options refuses worker_cpus with backend="ray": Ray places actors (ray_options) itself.
        assert worker_cpus is None, "worker_cpus is refused for backend='ray' by Options.checked"
        self.worker_envs, self.worker_threads, self.timeout = worker_envs, worker_threads, timeout
        self.isolate_rng = isolate_rng
        # Pickled once here: a factory that cannot be pickled fails now, naming its env.
        self.worker_fns = [
            pickle_factories([env_fns[i] for i in g], g.start, 'backend="ray"') for g in worker_envs
        ]
        self.actor_options = {**_DEFAULT_OPTIONS, **(ray_options or {})}
        self.res = RayResources(connect())
        self.actor_class = ray.remote(RayWorker)
        self.where: list[tuple[int | None, str, str]] = [(None, "?", "?")] * len(worker_envs)
        self.bytes_received = 0  # batch bytes landed so far (see ray_wire.unpack)

    @property
    def n_workers(self) -> int:
        return len(self.worker_envs)

    @property
    def actors(self) -> list[Any]:
        """The actor handles, in worker order."""
        return list(self.res.actors)

    @property
    def nodes(self) -> list[str]:
        """The node id of each worker's actor (known once it started)."""
        return [node for _, _, node in self.where]

    def start(self, w: int) -> None:
        """Create worker ``w``'s actor (new, or in place of a dead one); :meth:`started` waits for it."""
        g = self.worker_envs[w]
        actor: Any = self.actor_class.options(**self.actor_options).remote(
            self.worker_fns[w], g.start, self.worker_threads, self.isolate_rng
        )
        if w < len(self.res.actors):
            self.res.actors[w] = actor
        else:
            self.res.actors.append(actor)
        self.where[w] = (None, "?", "?")
        self.res.pending[w] = (actor.ready.remote(), Command.MAKE_ENV.value, None)

    def started(self, workers: Sequence[int], stop_on_fault: bool) -> Outcome:
        """Wait for the start-up replies of ``workers``."""
        return self.gather(workers, Command.MAKE_ENV.value, stop_on_fault)

    def kill(self, w: int) -> None:
        """Kill worker ``w``'s actor and fetch what it still owed (an error, by now)."""
        with suppress(Exception):
            ray.kill(self.res.actors[w], no_restart=True)
        pending = self.res.pending.pop(w, None)
        if pending is not None:
            drain([pending[0]], 1.0)

    def replace(self, w: int) -> None:
        """Kill worker ``w``'s actor and start a new one (Ray may place it on another node)."""
        self.kill(w)
        self.start(w)

    def post(
        self, cmd: Command, payloads: Sequence[Any], workers: Sequence[int], label: str, stop_on_fault: bool
    ) -> list[Fault]:
        """Send ``cmd`` to each of ``workers``. Ray takes every call (a dead actor shows up when
        its result is gathered), so no faults come back here."""
        for w, payload in zip(workers, payloads):
            self.submit(w, cmd, payload)
        return []

    def submit(self, w: int, cmd: Command, payload: Any) -> None:
        """One Ray call; the actor's ring has one slot (0), the step's slot is kept for landing."""
        slot = None
        if cmd == Command.STEP:
            slot, actions = payload
            if actions is None:  # the engine put them in the ring's typed buffer
                g = self.worker_envs[w]
                actions = self.res.ring.actions[g.start : g.stop]
            payload = (0, actions)  # pickled below: the buffer may be reused at once
        elif cmd == Command.RESET:
            slot = payload[0]
            payload = (0, *payload[1:])
        elif cmd == Command.ATTACH:
            _spec, codecs, verify_every = payload
            payload = (codecs, verify_every)
        message = pickle.dumps((Command(cmd).value, payload), pickle.HIGHEST_PROTOCOL)
        ref = self.res.actors[w].call.remote(message)
        self.res.pending[w] = (ref, Command(cmd).value, slot)

    def call(
        self, cmd: Command, payloads: Sequence[Any], workers: Iterable[int], label: str, stop_on_fault: bool
    ) -> Outcome:
        """Send ``cmd`` with one payload to each of ``workers``, then :meth:`gather` their replies."""
        workers = list(workers)
        self.post(cmd, payloads, workers, label, stop_on_fault)
        return self.gather(workers, label, stop_on_fault)

    def gather(self, workers: Iterable[int], command: str, stop_on_fault: bool) -> Outcome:
        """Wait for one reply from each worker, watching for dead actors and the timeout."""
        workers = list(workers)
        refs = {self.res.pending[w][0]: w for w in workers if w in self.res.pending}
        results: dict[int, Any] = {}
        errors: dict[int, Any] = {}
        faults: dict[int, Fault] = {}
        starting = command == Command.MAKE_ENV.value
        limit = self.timeout
        if starting:
            limit = START_TIMEOUT_S if limit is None else max(limit, MIN_START_S)
        deadline = None if limit is None else time.monotonic() + limit
        left = list(refs)
        while left:
            wait_s = POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
            ready, left = ray.wait(left, num_returns=len(left), timeout=wait_s)
            for ref in ready:
                w = refs[ref]
                _, cmd, slot = self.res.pending.pop(w)
                try:
                    value = ray.get(ref)
                except RayError as exc:
                    faults[w] = self.lost(w, command, exc)
                    continue
                ok, payload = self._land(w, cmd, slot, value)
                if ok:
                    results[w] = payload
                else:
                    errors[w] = payload
            if faults and stop_on_fault:
                break
            if left and deadline is not None and time.monotonic() >= deadline:
                hung = sorted(refs[ref] for ref in left)
                if stop_on_fault:
                    outcome = "it was killed and the VecEnv closed"
                    faults[hung[0]] = self.hung(hung[0], command, limit, outcome)
                    break
                for w in hung:
                    self.kill(w)
                    faults[w] = self.hung(w, command, limit, "it was killed and will be restarted")
                break
        return Outcome([results.get(w) for w in workers], errors, [faults[w] for w in sorted(faults)])

    def _land(self, w: int, cmd: str, slot: int | None, value: Any) -> tuple[bool, Any]:
        """A reply's ``(ok, payload)``; its batch written into the ring at ``slot``."""
        if cmd == Command.MAKE_ENV.value:
            reply, pid, ip, node = value
            self.where[w] = (pid, ip, node)
            return pickle.loads(reply)
        (ok, payload), data = pickle.loads(value)
        if ok and data is not None and slot is not None:
            self.bytes_received += unpack(self.res.ring, self.worker_envs[w], slot, data)
        return ok, payload

    def lost(self, w: int, command: str, exc: BaseException) -> Fault:
        """The fault of worker ``w`` whose actor died (or whose call Ray could not complete)."""
        pid, ip, _ = self.where[w]
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        error = WorkerCrashedError(
            f"{worker_label(w, pid, self.worker_envs[w])}, a Ray actor on node {ip}, died during "
            f"{command} ({type(exc).__name__}: {first})",
            worker_index=w,
            env_indices=list(self.worker_envs[w]),
            worker_pid=pid,
            exitcode=None,
            command=command,
            remote_traceback=str(exc),
        )
        return Fault(w, error.args[0], error)

    def hung(self, w: int, command: str, limit: float | None, outcome: str) -> Fault:
        """The fault of worker ``w`` whose actor did not answer ``command`` within ``limit`` s."""
        assert limit is not None
        pid = self.where[w][0]
        error = timeout_error(w, pid, self.worker_envs[w], command, limit, outcome)
        return Fault(w, error.args[0], error)


__all__ = ["RayPool", "RayResources", "connect", "disconnect"]
