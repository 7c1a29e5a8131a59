"""Where each worker stands between ``send`` and ``recv``, and which workers make the next batch.

A worker is idle, *busy* (a step or reset in flight) or *ready* (its reply is in, not yet received
by the caller). Envs of one worker step one after another, so the unit of scheduling is the worker's
group: a batch of ``batch_size`` envs is ``batch_size / group`` whole groups, the first ready
(``"first_ready"``, EnvPool's way) or in a fixed round-robin (``"deterministic"``). With
``batch_size == num_envs`` a batch is every group: a synchronous step. This module keeps the books
only; it does no I/O.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import numpy as np

from shmvec.memory.ring import Ring
from shmvec.wire.messages import Command, Reply, Reset

# Stands for an action already written into the ring's typed action buffer.
IN_RING = object()

FIRST_READY = "first_ready"
DETERMINISTIC = "deterministic"
POOL_ORDERS = (FIRST_READY, DETERMINISTIC)


def _fits(num_envs: int, batch_size: int, n_workers: int) -> bool:
    return num_envs % n_workers == 0 and batch_size % (num_envs // n_workers) == 0


def pool_workers(num_envs: int, batch_size: int, n_workers: int | str | None, cpus: int) -> int | str | None:
    """The worker count of a pool: groups of equal size that fill a batch whole.

    ``n_workers=None`` (or ``"auto"``, checked here only): the smallest count >= ``min(num_envs,
    cpus)`` (as many workers as CPUs, so the envs left stepping while the caller holds a batch can
    use every CPU) that divides ``num_envs`` into groups whose size divides ``batch_size``; pool mode
    resolves ``None`` with a probe first (:func:`shmvec.engine.autoworkers.resolve_auto`). With
    ``batch_size == num_envs`` any worker count fills a batch: ``n_workers`` is returned as given.

    :raises ValueError: for a ``batch_size`` out of range, or an ``n_workers`` whose groups cannot
        fill a batch whole (the message lists the counts that can).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"batch_size must be an int or None, got {batch_size!r}")
    if not 1 <= batch_size <= num_envs:
        raise ValueError(f"batch_size must be between 1 and num_envs={num_envs}, got {batch_size}")
    if batch_size == num_envs:
        return n_workers  # one batch is every group, whatever their sizes
    valid = [n for n in range(1, num_envs + 1) if _fits(num_envs, batch_size, n)]
    if n_workers is None or n_workers == "auto":
        return next(n for n in valid if n >= min(num_envs, cpus))
    if n_workers not in valid:
        raise ValueError(
            f"pool mode fills each batch with whole worker groups of equal size: n_workers={n_workers} "
            f"cannot split num_envs={num_envs} into groups that fill batch_size={batch_size}; "
            f"use one of n_workers={valid} (or None to choose)"
        )
    return n_workers


def envs_stepped(group: range, sent: Command) -> range | list[int]:
    """The envs (global indices) of ``group`` that ``sent``, a command to its worker, covers: a
    step of some of them (:attr:`~shmvec.wire.messages.Step.envs`) those, any other command all."""
    envs = getattr(sent, "envs", None)
    return group if envs is None else [group.start + k for k in envs]


def check_count(actions: Any, want: int, of: str) -> None:
    """:raises TypeError: when ``actions`` has no length; :raises ValueError: unless it has ``want``."""
    try:
        given = len(actions)
    except TypeError:
        raise TypeError(
            f"actions must be a sequence of {want} actions (one per env{of}, e.g. an array of shape "
            f"({want}, ...)), got {type(actions).__name__}"
        ) from None
    if given != want:
        raise ValueError(f"expected {want} actions (one per env{of}), got {given}")


class Flights:
    """The books of one engine's workers.

    :param groups: the env indices of each worker.
    :param batch_size: envs per batch (``num_envs``: every group).
    :param order: :data:`FIRST_READY` or :data:`DETERMINISTIC`.
    """

    def __init__(self, groups: list[range], batch_size: int, order: str = FIRST_READY) -> None:
        if order not in POOL_ORDERS:
            raise ValueError(f"pool_order must be one of {POOL_ORDERS}, got {order!r}")
        self.groups, self.order = groups, order
        n_envs, n_workers = groups[-1].stop, len(groups)
        self.n_envs = n_envs
        self.every = batch_size == n_envs
        self.group_size = len(groups[0])  # every group's, except when a batch is every group
        self.per_batch = n_workers if self.every else batch_size // self.group_size
        self.owner = np.repeat(np.arange(n_workers), [len(g) for g in groups]).tolist()  # env -> worker
        self.busy: dict[int, Command] = {}  # worker -> the command in flight
        self.ready: dict[int, tuple[Command, Reply | None]] = {}  # in the order they came in
        self.pending: dict[int, dict[int, Any]] = {}  # worker -> local env -> action, until all are set
        self.next_worker = 0  # deterministic order: the first group of the next batch
        self.last_ids: np.ndarray | None = None  # the envs of the batch received last

    @property
    def idle(self) -> bool:
        """Nothing in flight and nothing waiting to be received."""
        return not self.busy and not self.ready and not self.pending

    def pending_call(self) -> str:
        """``"reset"`` when any worker's command in flight or not received is a reset, else
        ``"step"`` (for a face's out-of-order errors; call while not :attr:`idle`)."""
        # map and `in` loop in C: every synchronous step asks this, with a command per worker.
        if Reset in map(type, self.busy.values()):
            return "reset"
        return "reset" if Reset in map(type, map(itemgetter(0), self.ready.values())) else "step"

    def clear(self) -> None:
        """Forget replies not received and actions of partly sent groups (a reset follows)."""
        self.ready.clear()
        self.pending.clear()
        self.next_worker = 0
        self.last_ids = None

    def check_ids(self, env_ids: Any) -> np.ndarray:
        """``env_ids`` as an int64 array.

        :raises ValueError: for anything but distinct env indices in ``0..num_envs-1``.
        """
        ids = np.asarray(env_ids)
        if ids.ndim != 1 or not (ids.dtype.kind in "iu" or ids.size == 0):
            raise ValueError(f"env_ids must be a 1-d array of env indices, got {env_ids!r}")
        # On lists: a pool batch has a few ids, where numpy's reductions cost microseconds each.
        listed = ids.tolist()
        if listed and (min(listed) < 0 or max(listed) >= self.n_envs):
            raise ValueError(f"env_ids must be in 0..{self.n_envs - 1}, got {listed}")
        if len(set(listed)) != len(listed):
            raise ValueError(f"env_ids must not repeat an env, got {listed}")
        return ids.astype(np.int64)

    def stage(
        self, ids: np.ndarray, actions: Any, ring: Ring, split: bool = False
    ) -> tuple[list[int], list[list[Any]] | None, list[tuple[int, ...] | None] | None]:
        """Record one action per env of ``ids`` (into the ring's typed action buffer where they fit);
        the workers whose whole group now has its actions (``split``: every worker touched), in the
        order first touched, their actions (None: all of them are in the ring; else one list per
        worker, None for an env not stepped) and the local envs each steps (None: all of them, for
        every worker).

        :raises ValueError: for a wrong number of actions, an env still stepping or already given an
            action (nothing recorded then).
        """
        check_count(actions, len(ids), " of env_ids")
        listed = ids.tolist()
        owner, groups, pending = self.owner, self.groups, self.pending
        workers = [owner[i] for i in listed]
        touched = list(dict.fromkeys(workers))  # in the order first touched
        for w in touched:
            if w in self.busy or w in self.ready:
                g = groups[w]
                raise ValueError(
                    f"send(): env {listed[workers.index(w)]}'s previous step was not received yet "
                    f"(worker {w} steps envs {g.start}..{g.stop - 1} together): recv() it before "
                    "sending a new action"
                )
        if pending:
            for i, w in zip(listed, workers):
                if w in pending and i - groups[w].start in pending[w]:
                    raise ValueError(
                        f"send(): env {i} already has an action waiting for the rest of its group"
                    )
        in_ring = ring.takes_actions(actions)
        if in_ring:
            ring.actions[ids] = actions  # type: ignore[index]
            # Whole groups and nothing partly sent (every batch recv() returns): nothing to record.
            if not pending and len(listed) == sum(len(groups[w]) for w in touched):
                return touched, None, None
        for k, (i, w) in enumerate(zip(listed, workers)):
            pending.setdefault(w, {})[i - groups[w].start] = IN_RING if in_ring else actions[k]
        full = touched if split else [w for w in touched if len(pending[w]) == len(groups[w])]
        staged = [sorted(pending.pop(w).items()) for w in full]
        envs: list[tuple[int, ...] | None] | None = None
        if split:
            envs = [
                None if len(p) == len(groups[w]) else tuple(k for k, _ in p) for w, p in zip(full, staged)
            ]
            if not any(envs):
                envs = None
        if all(a is IN_RING for p in staged for _, a in p):
            return full, None, envs
        # A group partly sent through the ring, partly not: it travels pickled (None where not stepped).
        buffer = ring.actions
        sent: list[list[Any]] = []
        for w, p in zip(full, staged):
            row: list[Any] = [None] * len(groups[w])
            for k, a in p:
                row[k] = buffer[groups[w].start + k].copy() if a is IN_RING else a  # type: ignore[index]
            sent.append(row)
        return full, sent, envs

    def choose(self) -> list[int] | None:
        """The workers of the next batch (ascending) once they are all ready, else None.

        :raises RuntimeError: when too few groups are stepping to ever fill it (a hang otherwise).
        """
        m, n_workers = self.per_batch, len(self.groups)
        if self.order == FIRST_READY:
            if len(self.ready) >= m:
                return sorted(list(self.ready)[:m])
            if len(self.ready) + len(self.busy) < m:
                raise RuntimeError(
                    f"recv(): a batch needs {m} worker group(s) of {self.group_size} envs, but only "
                    f"{len(self.ready) + len(self.busy)} are stepping: send() actions (or "
                    "async_reset()) first"
                )
            return None
        workers = self.deterministic_next()
        idle = [w for w in workers if w not in self.ready and w not in self.busy]
        if idle:
            g = self.groups[idle[0]]
            raise RuntimeError(
                "recv(): in deterministic order the next batch includes envs "
                f"{g.start}..{g.stop - 1}, which are not stepping: send() their actions (or "
                "async_reset()) first"
            )
        if all(w in self.ready for w in workers):
            self.next_worker = (self.next_worker + m) % n_workers
            return sorted(workers)
        return None

    def stepping(self, w: int) -> int:
        """How many envs worker ``w``'s command in flight or not received covers (a step of some of
        its envs covers those only)."""
        sent = self.busy.get(w)
        return len(envs_stepped(self.groups[w], self.ready[w][0] if sent is None else sent))

    def choose_ready(self, at_least: int) -> list[int] | None:
        """Every ready worker (ascending) once their envs number ``at_least``, or all the envs ready
        or in flight when fewer are; else None. The batch of a caller that takes whatever is ready
        (Tianshou's ``wait_num``), whatever ``order`` says.

        :raises RuntimeError: when no env is ready or in flight (a hang otherwise).
        """
        stepping = self.stepping
        ready = sum(map(stepping, self.ready))
        busy = sum(map(stepping, self.busy))
        if not ready + busy:
            raise RuntimeError("recv(): no env is stepping: send() actions first")
        return sorted(self.ready) if ready >= min(at_least, ready + busy) else None

    def whole_groups(
        self, ids: np.ndarray, call: str, why: str = "one env per worker takes any envs"
    ) -> list[int]:
        """The workers whose groups ``ids`` (checked env indices) make up exactly, ascending, all idle.

        :raises ValueError: when ``ids`` splits a worker's group (the message ends with ``why``) or
            names an env whose worker is busy or has a reply not received yet.
        """
        listed = ids.tolist()
        workers = sorted({self.owner[i] for i in listed})
        for w in workers:
            g = self.groups[w]
            if w in self.busy or w in self.ready or w in self.pending:
                raise ValueError(
                    f"{call}(): envs {g.start}..{g.stop - 1} (worker {w}) are stepping: receive them first"
                )
        if len(listed) != sum(len(self.groups[w]) for w in workers):
            split = next(w for w in workers if not set(self.groups[w]) <= set(listed))
            g = self.groups[split]
            raise ValueError(
                f"{call}(): worker {split} steps envs {g.start}..{g.stop - 1} together: name all of them "
                f"or none, got {listed} ({why})"
            )
        return workers

    def deterministic_next(self) -> list[int]:
        """The workers of the next batch in deterministic order."""
        n_workers = len(self.groups)
        return [(self.next_worker + k) % n_workers for k in range(self.per_batch)]

    def awaited(self, at_least: int | None = None) -> tuple[list[int], int]:
        """The busy workers to wait on for the next batch, and how many of them must answer (for
        :meth:`choose_ready` with ``at_least``: at least as many as could bring that many envs)."""
        if at_least is not None:
            stepping = self.stepping
            short = min(at_least, sum(map(stepping, (*self.ready, *self.busy))))
            short -= sum(map(stepping, self.ready))
            return sorted(self.busy), max(1, -(-short // max(map(stepping, self.busy))))
        if self.order == FIRST_READY:
            return sorted(self.busy), self.per_batch - len(self.ready)
        missing = [w for w in self.deterministic_next() if w in self.busy]
        return missing, len(missing)
