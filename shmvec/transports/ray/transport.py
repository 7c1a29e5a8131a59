"""The Ray transport: each worker is a Ray actor, driven through the transport contract
(:class:`~shmvec.transports.base.Transport`) like local workers, pool mode included.

One Ray call per worker and command: ``actor.call(message)`` returns the reply (pickled, as a
worker's pipe carries it) and, for a step or reset, the worker's batch packed by
:mod:`shmvec.transports.ray.wire` (observations encoded by the codecs, rewards, flags). Landing a
reply writes the batch into the engine's ring, which in this backend only the main process maps.

Placement: unless ``ray_options`` place the actors, one placement-group bundle per worker spreads
them over the cluster's nodes (:mod:`shmvec.transports.ray.placement`), waited for within the start-up
bound below.

Faults: an actor that died (``ray.kill``, node lost, out of memory) is a
:class:`~shmvec.errors.WorkerCrashedError` naming the worker, its envs and its node, reported within
:data:`POLL_S` seconds of Ray knowing it even while other actors are still busy; ``timeout`` bounds a
hung actor (killed). Start-up waits at most :data:`START_TIMEOUT_S`, or ``timeout`` but at least
:data:`MIN_START_S` (an actor whose resources the cluster cannot provide is never scheduled).

Connection: the running one when ``ray.is_initialized()``; else a local Ray, on loopback only, is
started and shut down when the last engine that uses it closes
(:mod:`shmvec.transports.ray.connection`).
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any

from shmvec.errors import install_hint

try:
    import ray
    from ray.exceptions import RayError
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(f'backend="ray" needs Ray: {install_hint("ray")} ({exc})') from None

from shmvec.errors import WorkerCrashedError
from shmvec.transports.base import Fault, Outcome, pickle_factories
from shmvec.transports.failures import timeout_error, worker_label
from shmvec.transports.ray.actor import RayWorker, env_packages
from shmvec.transports.ray.connection import connect, disconnect
from shmvec.transports.ray.placement import Placement, placement_for
from shmvec.transports.ray.wire import unpack
from shmvec.wire import messages as m

# Longest wait between looks at the actors still busy: a dead one is reported within this (s).
POLL_S = 1.0
# Start-up bound when no ``timeout`` is given: placing the workers, then each actor's process and
# envs (s).
START_TIMEOUT_S = 300.0
# With a ``timeout``, start-up still gets at least this long: an actor's process and imports take
# seconds (1.5-5.6 s measured on 2 cores), far more than a step (s).
MIN_START_S = 60.0
# How long close() lets actors close their envs before killing them (s).
CLOSE_GRACE_S = 5.0
# Ray's own actor restarts would bring back an actor without its envs' state: shmvec restarts
# workers itself (on_crash="restart"). The user's ray_options may override these.
_DEFAULT_OPTIONS = {"max_restarts": 0, "max_task_retries": 0}


class RayResources:
    """What must be released: the actors, results still in flight, their placement group, the ring,
    and the Ray connection if shmvec started it (the engine closes its reader itself).
    ``processes``/``remotes`` are empty (no local workers)."""

    def __init__(self, owns_ray: bool) -> None:
        self.actors: list[Any] = []
        self.pending: dict[int, tuple[Any, str, int | None]] = {}  # worker -> (ref, command, slot)
        self.ring: Any = None
        self.processes: list[Any] = []
        self.remotes: list[Any] = []
        self.placement: Placement | None = None
        self.owns_ray = owns_ray

    def release(self, graceful: bool = True) -> None:
        """Close the actors' envs (``graceful``), kill every actor, remove their placement group,
        free the ring, and disconnect."""
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
            if self.placement is not None:
                self.placement.remove()
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


class RayTransport:
    """Ray actors for the workers of one engine; see :class:`~shmvec.transports.base.Transport` for
    the methods.

    :param worker_envs: the env indices of each worker.
    :param env_fns: all env factories (cloudpickled here, once).
    :param worker_threads: BLAS/OpenMP threads per actor (None: the libraries' defaults).
    :param timeout: seconds a reply may take (None: no limit; a dead actor is noticed anyway).
    :param isolate_rng: give each env its own process-global RNG state in its actor.
    :param ray_options: options of every actor (``ray.remote(...).options(**ray_options)``:
        ``num_cpus``, ``resources``, ``scheduling_strategy``, ``runtime_env``...). Without a
        ``scheduling_strategy`` (or another key of
        :data:`~shmvec.transports.ray.placement.USER_PLACEMENT`), the actors go in a placement group
        that spreads them over the nodes, one bundle each.
    """

    def __init__(
        self,
        worker_envs: list[range],
        env_fns: list[Callable[[], Any]],
        worker_threads: int | None,
        timeout: float | None,
        isolate_rng: bool = False,
        *,
        ray_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.worker_envs, self.worker_threads, self.timeout = worker_envs, worker_threads, timeout
        self.isolate_rng = isolate_rng
        # Pickled once here: a factory that cannot be pickled fails now, naming its env.
        self.worker_fns = [
            pickle_factories([env_fns[i] for i in g], g.start, 'backend="ray"') for g in worker_envs
        ]
        self.actor_options = {**_DEFAULT_OPTIONS, **(ray_options or {})}
        self.packages = env_packages()  # what registered the envs here, for the actors to import
        self.res = RayResources(connect())
        self.res.placement = placement_for(self.actor_options, len(worker_envs))
        self.actor_class = ray.remote(RayWorker)
        self.where: list[tuple[int | None, str, str]] = [(None, "?", "?")] * len(worker_envs)
        self.deadlines: dict[int, float] = {}
        self.bytes_received = 0  # batch bytes landed so far (see wire.unpack)

    @property
    def n_workers(self) -> int:
        return len(self.worker_envs)

    @property
    def processes(self) -> list[Any]:
        """No local worker processes."""
        return []

    @property
    def actors(self) -> list[Any]:
        """The actor handles, in worker order."""
        return list(self.res.actors)

    @property
    def nodes(self) -> list[str]:
        """The node id of each worker's actor (known once it started)."""
        return [node for _, _, node in self.where]

    @property
    def placement(self) -> Placement | None:
        """The workers' placement group (None when ``ray_options`` place the actors)."""
        return self.res.placement

    def start_limit(self) -> float:
        """How long start-up may wait for the placement, then again for each actor (s)."""
        return START_TIMEOUT_S if self.timeout is None else max(self.timeout, MIN_START_S)

    def start(self, workers: Sequence[int]) -> None:
        """Create the actors of ``workers`` (new, or in place of dead ones), each in its worker's
        bundle of the placement group: made and waited for on the first call.

        :raises EnvTimeoutError: when the cluster did not place the workers within the start-up
            bound, naming what it lacks.
        """
        placement = self.res.placement
        # The first call makes the group; waiting before any actor exists leaves each actor its
        # whole start-up bound.
        extra = [{} if placement is None else placement.actor_options(w) for w in workers]
        if placement is not None:
            placement.wait(self.start_limit())
        for w, options in zip(workers, extra):
            g = self.worker_envs[w]
            actor: Any = self.actor_class.options(**{**self.actor_options, **options}).remote(
                self.worker_fns[w], g.start, self.worker_threads, self.isolate_rng, self.packages
            )
            if w < len(self.res.actors):
                self.res.actors[w] = actor
            else:
                self.res.actors.append(actor)
            self.where[w] = (None, "?", "?")
            self.res.pending[w] = (actor.ready.remote(), m.MAKE_ENV, None)
            self.deadlines[w] = time.monotonic() + self.start_limit()

    def bind(self, ring: Any) -> None:
        """Replies are landed into ``ring`` (the main process's only: actors write private rings)."""
        self.res.ring = ring

    def kill(self, w: int) -> None:
        """Kill worker ``w``'s actor and fetch what it still owed (an error, by now)."""
        with suppress(Exception):
            ray.kill(self.res.actors[w], no_restart=True)
        pending = self.res.pending.pop(w, None)
        if pending is not None:
            drain([pending[0]], 1.0)

    def replace(self, w: int) -> None:
        """Kill worker ``w``'s actor and start a new one (in the same bundle, so on the same node,
        unless ``ray_options`` place the actors)."""
        self.kill(w)
        self.start([w])

    def close(self, graceful: bool = True) -> None:
        self.res.release(graceful)

    def post(
        self,
        workers: Sequence[int],
        commands: m.Command | Sequence[m.Command],
        partial: bool = False,
        fan_out: bool = True,
    ) -> list[Fault]:
        """Send one command to each of ``workers``. Ray takes every call (a dead actor shows up when
        its result is waited for), so no faults come back here; each result is waited for on its
        own (``partial`` and ``fan_out`` change nothing)."""
        msgs = [commands] * len(workers) if isinstance(commands, m.Command) else list(commands)
        deadline = math.inf if self.timeout is None else time.monotonic() + self.timeout
        for w, msg in zip(workers, msgs):
            self._submit(w, msg)
            self.deadlines[w] = deadline
        return []

    def _submit(self, w: int, msg: m.Command) -> None:
        """One Ray call. The actor's ring has one slot (0); the step's slot is kept for landing."""
        slot = None
        if isinstance(msg, m.Step):
            slot = msg.slot
            actions = msg.actions
            if actions is None:  # the engine put them in the ring's typed buffer
                g = self.worker_envs[w]
                actions = list(self.res.ring.actions[g.start : g.stop])
            msg = m.Step(0, actions, msg.envs)  # pickled below: the buffer may be reused at once
        elif isinstance(msg, m.Reset):
            slot = msg.slot
            msg = m.Reset(0, msg.seeds, msg.kwargs, msg.mask)
        elif isinstance(msg, m.Attach):
            msg = dataclasses.replace(msg, spec=None)
        message = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        ref = self.res.actors[w].call.remote(message)
        self.res.pending[w] = (ref, msg.label, slot)

    def wait(self, workers: Sequence[int], need: int, limit: float | None = None) -> Outcome:
        """Wait until ``need`` of ``workers`` answered, died or hung (see
        :class:`~shmvec.transports.base.Transport`)."""
        refs = {self.res.pending[w][0]: w for w in workers if w in self.res.pending}
        outcome = Outcome()
        give_up = math.inf if limit is None else time.monotonic() + limit
        left = list(refs)
        while left and outcome.finished + len(outcome.faults) < need:
            deadline = min(give_up, min(self.deadlines.get(refs[r], math.inf) for r in left))
            wait_s = min(POLL_S, max(0.0, deadline - time.monotonic()))
            want = min(len(left), need - outcome.finished - len(outcome.faults))
            ready, left = ray.wait(left, num_returns=want, timeout=wait_s)
            for ref in ready:
                w = refs[ref]
                _, label, slot = self.res.pending.pop(w)
                try:
                    value = ray.get(ref)
                except RayError as exc:
                    outcome.faults.append(self.lost(w, label, exc))
                    continue
                reply = self._land(w, label, slot, value)
                if isinstance(reply, m.Failed):
                    outcome.errors[w] = reply.error
                else:
                    outcome.results[w] = reply
            now = time.monotonic()
            hung = sorted(refs[r] for r in left if self.deadlines.get(refs[r], math.inf) <= now)
            for w in hung:
                label = self.res.pending[w][1]
                limit_s = (
                    self.timeout
                    if label != m.MAKE_ENV or self.timeout is None
                    else max(self.timeout, MIN_START_S)
                )
                self.kill(w)
                outcome.faults.append(self.hung(w, label, limit_s))
            left = [r for r in left if refs[r] in self.res.pending]
            if now >= give_up:
                break
        outcome.faults.sort(key=lambda f: f.worker)
        return outcome

    def _land(self, w: int, label: str, slot: int | None, value: Any) -> m.Reply:
        """A reply, its batch written into the ring at ``slot``."""
        if label == m.MAKE_ENV:
            reply, pid, ip, node = value
            self.where[w] = (pid, ip, node)
            return pickle.loads(reply)
        reply, data = pickle.loads(value)
        if not isinstance(reply, m.Failed) and data is not None and slot is not None:
            self.bytes_received += unpack(self.res.ring, self.worker_envs[w], slot, data)
        return reply

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

    def hung(self, w: int, command: str, limit: float | None) -> Fault:
        """The fault of worker ``w`` whose actor did not answer ``command`` within ``limit`` s."""
        assert limit is not None
        pid = self.where[w][0]
        error = timeout_error(w, pid, self.worker_envs[w], command, limit, "it was killed")
        return Fault(w, error.args[0], error)


__all__ = ["RayResources", "RayTransport"]
