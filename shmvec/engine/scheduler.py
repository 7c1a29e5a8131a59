"""Pool mode (EnvPool's ``send``/``recv``): each worker group steps on its own, and a batch is made
of the first groups to finish (or of groups in a fixed round-robin).

Envs of one worker step one after another, so the unit of scheduling is the worker's group, not
the env: every group has ``num_envs / n_workers`` envs and a batch of ``batch_size`` envs is filled
by ``batch_size / group`` whole groups (:func:`~shmvec.engine.pool_rules.pool_workers` picks or
checks the worker count).

Each worker writes into its own rows of the ring and alternates ring slots on its own; ``recv``
copies (gathers) the rows of the batch's groups out of the ring before they are sent again, so the
previous slot of a worker always holds the last observation the caller saw of its envs (restart
mode carries it over for a rebuilt worker). Waiting blocks in ``poll`` on the pipes and the worker
processes' sentinels, with the earliest step deadline as its timeout: no busy-waiting.
"""

from __future__ import annotations

import math
import select
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from shmvec.engine.core import Engine
from shmvec.engine.pool_reader import PoolReader
from shmvec.engine.pool_rules import FIRST_READY, POOL_ORDERS, RESTARTED, PoolBatch
from shmvec.errors import EnvTimeoutError
from shmvec.failures import env_error
from shmvec.protocol import Command, RemoteError
from shmvec.restart import Fault

_IN_RING = object()  # marks an action already written into the ring's typed action buffer


class PoolScheduler:
    """Pool mode on an :class:`Engine`: post steps per worker group, collect the first done.

    :param engine: an engine whose groups all have the same size (see :func:`pool_workers`).
    :param batch_size: envs per :meth:`recv`.
    :param order: ``"first_ready"`` or ``"deterministic"`` (fixed round-robin of groups).
    """

    def __init__(self, engine: Engine, batch_size: int, order: str = FIRST_READY) -> None:
        if order not in POOL_ORDERS:
            raise ValueError(f"pool_order must be one of {POOL_ORDERS}, got {order!r}")
        self.engine, self.batch_size, self.order = engine, batch_size, order
        self.groups = engine.worker_envs
        n_workers, n_slots = engine.n_workers, engine.options.n_slots
        self.group_size = len(self.groups[0])  # every group's, except with batch_size == num_envs
        self.per_batch = n_workers if batch_size == engine.num_envs else batch_size // self.group_size
        self.owner = np.repeat(np.arange(n_workers), [len(g) for g in self.groups])  # env -> worker
        assert n_slots is not None
        self.n_slots = n_slots
        self.slot = [0] * n_workers  # the slot each worker writes (or wrote) its current step into
        self.prev = [0] * n_workers  # the slot of the step before: what the caller saw last
        self.in_flight: dict[int, tuple[str, float]] = {}  # worker -> (command, deadline)
        self.ready: dict[int, tuple[str, Any]] = {}  # worker -> (command, reply), in arrival order
        self.pending: dict[int, dict[int, Any]] = {}  # worker -> local env -> action, until all are set
        self.next_worker = 0  # deterministic order: the first group of the next batch
        self.reset_payloads: list[Any] = [None] * n_workers  # of the last async_reset, for a retry
        self.last_ids: np.ndarray | None = None
        self.reading = PoolReader(engine, batch_size, n_slots)

    # ------------------------------------------------------------------ state

    @property
    def busy(self) -> list[int]:
        """Workers with a step or reset in flight."""
        return sorted(self.in_flight)

    def _worker_of(self, i: int) -> int:
        return int(self.owner[i])

    def _advance(self, w: int) -> int:
        """The slot worker ``w`` writes next: not the one the caller saw last (restart mode carries
        it over), nor one whose arrays a synchronous ``step()``/``reset()`` lent and are still used."""
        self.prev[w] = self.slot[w]
        after = [(self.slot[w] + k) % self.n_slots for k in range(1, self.n_slots)] or [self.slot[w]]
        self.slot[w] = next((s for s in after if self.engine.slots.free(s)), after[0])
        return self.slot[w]

    def _deadline(self) -> float:
        timeout = self.engine.options.timeout
        return math.inf if timeout is None else time.monotonic() + timeout

    # ------------------------------------------------------------------ reset

    def drain(self) -> None:
        """Wait for every step in flight and drop what was not received (before a reset)."""
        while self.in_flight:
            self._wait()
        self.ready.clear()
        self.pending.clear()
        self.last_ids = None

    def async_reset(self, seeds: Sequence[int | None], kwargs: Sequence[dict[str, Any]]) -> None:
        """Reset every env in its worker (seeds and reset keyword arguments as for
        :meth:`Engine.reset`); the reset observations come back through :meth:`recv`."""
        engine = self.engine
        engine.check_open()
        self.drain()
        engine.supervisor.note_seeds(seeds)
        ring = engine.ring
        self.next_worker = 0
        for w, g in enumerate(self.groups):
            slot = self._advance(w)
            # A reset writes observations only: its rows read as reward 0, not done.
            ring.rewards[slot, g.start : g.stop] = 0.0
            ring.terminated[slot, g.start : g.stop] = False
            ring.truncated[slot, g.start : g.stop] = False
            engine.supervisor.needs_reset.pop(w, None)
            payload = (slot, list(seeds[g.start : g.stop]), list(kwargs[g.start : g.stop]), None)
            self.reset_payloads[w] = payload
            self._post(w, Command.RESET, payload)

    def after_reset(self, arrays: list[np.ndarray]) -> None:
        """After a synchronous ``reset()`` of every env (slot ``engine.slots.current``)."""
        slot = self.engine.slots.current
        self.slot = [slot] * len(self.groups)
        self.prev = list(self.slot)
        self.reading.after_reset(arrays)
        self.last_ids = np.arange(self.engine.num_envs, dtype=np.int32)

    # ------------------------------------------------------------------ send

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Give envs ``env_ids`` (default: the last batch received) their next actions. A worker's
        group steps once all of its envs have one.

        :raises ValueError: for a bad ``env_ids`` or action count, or an env still stepping.
        """
        engine = self.engine
        engine.check_open()
        ids = self._check_ids(env_ids)
        try:
            n = len(actions)
        except TypeError:
            raise TypeError(
                f"actions must be a sequence of {len(ids)} actions (one per env of env_ids), "
                f"got {type(actions).__name__}"
            ) from None
        if n != len(ids):
            raise ValueError(f"expected {len(ids)} actions (one per env of env_ids), got {n}")
        for i in ids.tolist():
            w = self._worker_of(i)
            if w in self.in_flight or w in self.ready:
                g = self.groups[w]
                raise ValueError(
                    f"send(): env {i}'s previous step was not received yet (worker {w} steps envs "
                    f"{g.start}..{g.stop - 1} together): recv() it before sending a new action"
                )
            if i - self.groups[w].start in self.pending.get(w, {}):
                raise ValueError(f"send(): env {i} already has an action waiting for the rest of its group")
        in_ring = engine.ring.takes_actions(actions)
        if in_ring:
            engine.ring.actions[ids] = actions  # type: ignore[index]
        touched: list[int] = []
        for k, i in enumerate(ids.tolist()):
            w = self._worker_of(i)
            self.pending.setdefault(w, {})[i - self.groups[w].start] = _IN_RING if in_ring else actions[k]
            if w not in touched:
                touched.append(w)
        full = [w for w in touched if len(self.pending[w]) == len(self.groups[w])]
        if full:
            # Before sending: the idle threads free the workers' cores when they need them, unless
            # the next batch can come from other envs and these step while the policy runs.
            engine.pause_policy_threads(overlapped=len(self.ready) + len(self.in_flight) >= self.per_batch)
        for w in full:
            self._post_step(w)
        if self.last_ids is not None and env_ids is None:
            self.last_ids = None

    def _check_ids(self, env_ids: Any) -> np.ndarray:
        n_envs = self.engine.num_envs
        if env_ids is None:
            if self.last_ids is None:
                raise ValueError(
                    "send(): no batch to answer (env_ids=None): call recv() first, or pass env_ids"
                )
            return self.last_ids
        ids = np.asarray(env_ids)
        if ids.ndim != 1 or not (ids.dtype.kind in "iu" or ids.size == 0):
            raise ValueError(f"env_ids must be a 1-d array of env indices, got {env_ids!r}")
        if ids.size and (ids.min() < 0 or ids.max() >= n_envs):
            raise ValueError(f"env_ids must be in 0..{n_envs - 1}, got {ids.tolist()}")
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"env_ids must not repeat an env, got {ids.tolist()}")
        return ids.astype(np.int64)

    def _post_step(self, w: int) -> None:
        actions = self.pending.pop(w)
        slot = self._advance(w)
        if w in self.engine.supervisor.needs_reset:
            # Rebuilt since its last step (restart mode): its envs end their episode now.
            self.ready[w] = (RESTARTED, self._end_episodes(w))
            return
        ring_actions = self.engine.ring.actions
        payload: Any = None
        if any(a is not _IN_RING for a in actions.values()):
            payload = [
                ring_actions[self.groups[w].start + k].copy() if a is _IN_RING else a  # type: ignore[index]
                for k, a in sorted(actions.items())
            ]
        self._post(w, Command.STEP, (slot, payload))

    def _post(self, w: int, cmd: Command, payload: Any) -> None:
        fault = self.engine.pool.send(w, cmd, payload, cmd.value)
        if fault is None:
            self.in_flight[w] = (cmd.value, self._deadline())
            return
        self.engine.pool.kill(w)
        self._fault(w, cmd.value, fault)

    # ------------------------------------------------------------------ recv

    def recv(self) -> PoolBatch:
        """Wait for the next batch (see the module docstring) and read it out of the ring.

        :raises RuntimeError: when too few groups are stepping to fill a batch (a hang otherwise).
        """
        self.engine.check_open()
        workers = self._await_batch()
        # Taken before reading: a failed read (a codec error) leaves them received, not stuck.
        replies = [self.ready.pop(w) for w in workers]
        self.engine.steps_received()
        batch = self.reading.read([self.groups[w] for w in workers], [self.slot[w] for w in workers], replies)
        self.last_ids = batch.env_ids.copy()
        return batch

    def _await_batch(self) -> list[int]:
        """The workers of the next batch, once they are all ready."""
        m, n_workers = self.per_batch, len(self.groups)
        while True:
            if self.order == FIRST_READY:
                if len(self.ready) >= m:
                    workers = list(self.ready)[:m]
                    break
                if len(self.ready) + len(self.in_flight) < m:
                    raise RuntimeError(
                        f"recv(): a batch needs {m} worker group(s) of {self.group_size} envs, but only "
                        f"{len(self.ready) + len(self.in_flight)} are stepping: send() actions (or "
                        "async_reset()) first"
                    )
            else:
                workers = [(self.next_worker + k) % n_workers for k in range(m)]
                idle = [w for w in workers if w not in self.ready and w not in self.in_flight]
                if idle:
                    g = self.groups[idle[0]]
                    raise RuntimeError(
                        "recv(): in deterministic order the next batch includes envs "
                        f"{g.start}..{g.stop - 1}, which are not stepping: send() their actions (or "
                        "async_reset()) first"
                    )
                if all(w in self.ready for w in workers):
                    self.next_worker = (self.next_worker + m) % n_workers
                    break
            self._wait()
        # Within a batch, envs in ascending order (with batch_size == num_envs: env order, as step()).
        return sorted(workers)

    # ------------------------------------------------------------------ waiting and failures

    def _wait(self) -> None:
        """Block until at least one worker in flight answers, dies or passes its deadline."""
        pool = self.engine.pool
        poller = select.poll()
        watched: dict[int, tuple[int, bool]] = {}
        for w in self.in_flight:
            pipe, sentinel = pool.fds(w)
            watched[pipe], watched[sentinel] = (w, False), (w, True)
        for fd in watched:
            poller.register(fd, select.POLLIN)
        deadline = min(d for _, d in self.in_flight.values())
        wait_ms = None if deadline == math.inf else math.ceil(max(0.0, deadline - time.monotonic()) * 1000)
        events = poller.poll(wait_ms)
        done: list[int] = []
        for fd, _ in events:
            w, is_sentinel = watched[fd]
            if w in done or (is_sentinel and pool.has_reply(w)):
                continue  # a reply it sent before ending is read through its pipe
            cmd = self.in_flight[w][0]
            done.append(w)
            del self.in_flight[w]
            if is_sentinel:
                self._fault(w, cmd, pool.lost(w, cmd))
                continue
            try:
                ok, payload = pool.receive(w)
            except (EOFError, OSError):
                self._fault(w, cmd, pool.lost(w, cmd))
                continue
            if ok:
                self.ready[w] = (cmd, payload)
            else:
                self._env_raised(w, cmd, payload)
        now = time.monotonic()
        for w, (cmd, w_deadline) in list(self.in_flight.items()):
            if w_deadline <= now:
                del self.in_flight[w]
                pool.kill(w)
                verdict = (
                    "it was killed and will be restarted"
                    if self.engine.restart
                    else ("it was killed and the VecEnv closed")
                )
                self._fault(w, cmd, pool.hung(w, cmd, verdict))

    def _env_raised(self, w: int, cmd: str, err: RemoteError) -> None:
        engine = self.engine
        if engine.restart:
            self._fault(w, cmd, engine.env_fault(w, err))
            return
        if engine.reader.decoded:
            # Some of its envs encoded a frame that will never be decoded: restart their streams.
            engine.pool.call(Command.CONFIGURE, [{"key_frames": True}], [w], cmd, True)
            engine.reader.restart(self.groups[w])
        raise env_error(err, w, self.groups[w])

    def _fault(self, w: int, cmd: str, fault: Fault) -> None:
        """A worker that died or hung: close and raise (raise mode), or rebuild it and report its
        envs as truncated (restart mode) in the place of the step it lost."""
        engine = self.engine
        if not engine.restart:
            engine.give_up(graceful=not isinstance(fault.error, EnvTimeoutError))
            raise fault.error
        if cmd == Command.RESET.value:
            infos = engine.supervisor.retry_reset([fault], self.reset_payloads)
            self.ready[w] = (cmd, infos.get(w, [None] * len(self.groups[w])))
            return
        engine.supervisor.rebuild([fault])
        self.ready[w] = (RESTARTED, self._end_episodes(w))

    def _end_episodes(self, w: int) -> list[tuple[int, dict, None]]:
        """Restart mode: worker ``w`` was rebuilt; its envs end their episode in its current slot,
        truncated, with the last observation the caller saw, and reset in place of their next step."""
        g = self.groups[w]
        # Each worker of a pool has its own slot: its episodes alone end in it.
        _, infos = self.engine.supervisor.end_episodes(self.slot[w], same_step=False, only=w)
        self.reading.carry_last(g, self.slot[w], self.prev[w])
        return [(i - g.start, infos[i][0], None) for i in g]


__all__ = ["PoolScheduler"]
