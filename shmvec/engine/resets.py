"""Resets, the third of the engine's primitives: :class:`Resets` resets every env (or those of a
mask) and returns the batch, or posts the resets and lets ``recv()`` return them a batch at a time
(``async_reset``). Steps in flight are waited for and dropped first; a reset writes observations
only, so its rows of the ring read as reward 0, not done. Sending and receiving steps are the core's
(:mod:`shmvec.engine.core`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shmvec.engine.batch import Batch
from shmvec.engine.batch_reader import BatchReader
from shmvec.engine.flights import Flights
from shmvec.engine.obs_reader import Reader
from shmvec.engine.recovery import NOTHING_ENDED
from shmvec.engine.slots import Slots
from shmvec.engine.supervisor import Supervisor
from shmvec.memory.ring import Ring
from shmvec.transports.base import Outcome, Transport
from shmvec.wire import messages as m


class Resets:
    """The reset methods of :class:`shmvec.engine.core.Engine` (a mixin: the engine parts they use
    are declared here and set by the engine)."""

    n_workers: int
    worker_envs: list[range]
    restart: bool
    flights: Flights
    slots: Slots
    ring: Ring
    reader: Reader
    reading: BatchReader
    supervisor: Supervisor
    transport: Transport
    check_open: Callable[[], None]
    refuse_during_call: Callable[[str], None]
    drain: Callable[[], None]
    land: Callable[[Outcome], None]

    def reset(
        self,
        seeds: Sequence[int | None],
        kwargs: Sequence[dict[str, Any]],
        mask: Sequence[bool] | np.ndarray | None = None,
    ) -> tuple[list[np.ndarray], list[dict[str, Any] | None]]:
        """Reset the envs (all, or those where ``mask`` is True) with one seed each and the keyword
        arguments of ``kwargs`` (``{"options": ...}`` or ``{}``: the face's convention); the
        observation leaves of the batch (envs not reset keep their last observation) and the reset
        infos (None for envs not reset). Steps in flight are waited for and dropped first."""
        slot = self._post_resets(seeds, kwargs, mask, whole=True)
        busy = sorted(self.flights.busy)
        try:
            self.land(self.transport.wait(busy, len(busy)))
            replies = [self.flights.ready.pop(w, (None, None))[1] for w in range(self.n_workers)]
        finally:
            # Also when an env raised: the other workers' replies are dropped with the failed reset,
            # and nothing stays pending (the next step or reset is not refused as out of order).
            self.flights.clear()
        self.supervisor.needs_reset.clear()
        only = None if mask is None else np.flatnonzero(mask)
        self.reading.take_objects(range(self.n_workers), replies)
        arrays, _ = self.reader.read(slot, (), is_step=False, only=only)
        infos = [i for r in replies for i in (r.infos if isinstance(r, m.ResetDone) else [None])]
        return arrays, infos

    def async_reset(self, seeds: Sequence[int | None], kwargs: Sequence[dict[str, Any]]) -> None:
        """Reset every env without waiting (seeds and keyword arguments as for :meth:`reset`); the
        reset observations come back through :meth:`recv`, a batch at a time."""
        self._post_resets(seeds, kwargs, None, whole=False)

    def reset_idle(
        self, env_ids: Any, seeds: Sequence[int | None], kwargs: Sequence[dict[str, Any]]
    ) -> Batch:
        """Reset envs ``env_ids`` (whole worker groups, whose workers are idle) and return their batch,
        while the steps of other workers stay in flight (Tianshou's asynchronous ``reset(id)``).
        ``seeds`` and ``kwargs``: one per env of the vector env, as for :meth:`reset`; the batch's
        infos are the reset infos.

        :raises ValueError: for bad ``env_ids``, ids that split a worker's group, or a worker that is
            stepping (nothing is sent then).
        """
        self.check_open()
        self.refuse_during_call("reset")
        flights = self.flights
        ids = flights.check_ids(env_ids)
        workers = flights.whole_groups(ids, "reset")
        chosen = set(ids.tolist())
        self.supervisor.note_seeds([s if i in chosen else None for i, s in enumerate(seeds)])
        self._post_reset_commands(workers, [self.slots.advance(w) for w in workers], seeds, kwargs, None)
        posted = [w for w in workers if w in flights.busy]  # not those whose post failed
        try:
            self.land(self.transport.wait(posted, len(posted)))
            arrived = [flights.ready[w] for w in workers]
        finally:
            # Also when an env raised: no reply of this reset may come back as a later batch.
            for w in workers:
                flights.ready.pop(w, None)
        return self.reading.read(workers, arrived, NOTHING_ENDED)

    def _post_resets(
        self, seeds: Sequence[int | None], kwargs: Sequence[dict[str, Any]], mask: Any, whole: bool
    ) -> int:
        """Drop what is in flight, then post a reset to every worker: into one slot (``whole``; its
        number is returned) or each into its own next slot."""
        self.check_open()
        self.refuse_during_call("reset")
        self.drain()
        self.supervisor.note_seeds(seeds)
        slot = self.slots.advance_all() if whole else -1
        if whole and (self.restart or mask is not None):
            self.reader.keep_previous()
        workers = list(range(self.n_workers))
        slots = [slot if whole else self.slots.advance(w) for w in workers]
        self._post_reset_commands(workers, slots, seeds, kwargs, mask)
        return slot

    def _post_reset_commands(
        self,
        workers: list[int],
        slots: list[int],
        seeds: Sequence[int | None],
        kwargs: Sequence[dict[str, Any]],
        mask: Any,
    ) -> None:
        """Post a reset to each of ``workers`` (idle), into its slot of ``slots``, with its envs' seeds,
        keyword arguments and part of ``mask`` (None: all its envs)."""
        ring, commands = self.ring, []
        for w, at in zip(workers, slots):
            g = self.worker_envs[w]
            self.supervisor.needs_reset.pop(w, None)
            rows = slice(g.start, g.stop)
            # A reset writes observations only: its rows read as reward 0, not done.
            ring.rewards[at, rows], ring.terminated[at, rows], ring.truncated[at, rows] = 0.0, False, False
            part = None if mask is None else [bool(x) for x in mask[rows]]
            commands.append(m.Reset(at, list(seeds[rows]), list(kwargs[rows]), part))
        self.flights.busy.update(zip(workers, commands))
        faults = self.transport.post(workers, commands)
        if faults:
            self.land(Outcome(faults=faults))


__all__ = ["Resets"]
