"""Reading a batch: the replies of its workers and their rows of the ring, made into a
:class:`~shmvec.engine.batch.Batch`.

A batch of every worker, all in one ring slot (every synchronous step), is read from that slot by
the :class:`~shmvec.engine.obs_reader.Reader`: lent without a copy where a slot is free, terminal
observations of ended episodes included. Any other batch (pool mode) is gathered from the slots its
groups wrote (:class:`~shmvec.engine.gather.Gather`). Either way the infos come from the replies
(what crossed the pipe) and the ring's typed columns, and envs a restart ended carry their
restart infos (:class:`~shmvec.engine.recovery.Ended`); so do the values of object leaves
(:mod:`shmvec.engine.objects`), taken from the replies before the batch is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmvec.engine.batch import Batch
from shmvec.engine.flights import envs_stepped
from shmvec.engine.gather import Gather
from shmvec.engine.recovery import Ended
from shmvec.engine.slots import Slots
from shmvec.engine.startup import Layout
from shmvec.wire import messages as m

Arrived = tuple[m.Command, "m.Reply | None"]


class BatchReader:
    """Makes batches for one engine.

    :param layout: the engine's ring, reader and typed infos.
    :param slots: the slot each worker wrote.
    :param worker_envs: the env indices of each worker.
    :param batch_size: envs per batch.
    :param same_step: terminal observations are read for envs whose episode ended.
    :param arrays: typed infos stay columns (Gymnasium's face) instead of merged dicts (SB3's).
    """

    def __init__(
        self,
        layout: Layout,
        slots: Slots,
        worker_envs: list[range],
        batch_size: int,
        same_step: bool,
        copy: bool,
        arrays: bool,
    ) -> None:
        self.layout, self.slots, self.worker_envs = layout, slots, worker_envs
        self.ring, self.reader, self.typed = layout.ring, layout.reader, layout.typed
        self.same_step, self.arrays = same_step, arrays
        self.n_envs = worker_envs[-1].stop
        self.gather = Gather(layout.obs_leaves, self.ring, self.reader, batch_size, slots.n_slots, copy)
        self._ids = [np.arange(g.start, g.stop, dtype=np.int32) for g in self.worker_envs]  # per worker

    def close(self) -> None:
        """Let go of the ring's arrays (the engine is closed)."""
        self.gather.close()

    def whole(self, workers: list[int], arrived: list[Arrived]) -> bool:
        """Whether the batch of ``workers`` is every env of every worker, all written into one slot."""
        return (
            len(workers) == len(self.worker_envs)
            and self.slots.uniform
            and all(getattr(cmd, "envs", None) is None for cmd, _ in arrived)
        )

    def read(self, workers: list[int], arrived: list[Arrived], ended: Ended) -> Batch:
        """The batch of ``workers`` (ascending) whose commands and replies are ``arrived``."""
        if self.reader.objects is not None:
            self.take_objects(workers, [reply for _, reply in arrived])
        if self.whole(workers, arrived):
            return self._whole(workers, arrived, ended)
        return self._gathered(workers, arrived, ended)

    def take_objects(self, workers: list[int] | range, replies: list[m.Reply | None]) -> None:
        """Record the object leaf values of ``replies`` (one per worker of ``workers``) for the batch
        read next; nothing when the space has no object leaf."""
        objects = self.reader.objects
        if objects is not None:
            for w, reply in zip(workers, replies):
                objects.take(reply, self.worker_envs[w].start)

    def _whole(self, workers: list[int], arrived: list[Arrived], ended: Ended) -> Batch:
        slot = self.slots.slot[workers[0]]
        infos: dict[int, dict[str, Any]] = {}
        reset_infos: dict[int, dict[str, Any]] = {}
        replied: list[range] = self.worker_envs
        for w, (_, reply) in zip(workers, arrived):
            if reply is not None:  # most workers' replies were the ring alone
                _collect(reply, self.worker_envs[w].start, infos, reset_infos)
                if not isinstance(reply, m.Stepped):
                    replied = [
                        self.worker_envs[w]
                        for w, (_, r) in zip(workers, arrived)
                        if isinstance(r, m.Stepped | None)
                    ]
        typed = None
        if self.arrays:
            typed = self.typed.rows([(slot, range(self.n_envs))], infos)
            for w, (_, reply) in zip(workers, arrived):
                if typed is not None and isinstance(reply, m.Restarted):
                    g = self.worker_envs[w]
                    typed.mask[g.start : g.stop] = False
        else:
            self.typed.read(slot, replied, infos)
        infos.update(ended.infos)
        reset_infos.update(ended.reset_infos)
        ring = self.ring
        rewards, terminated, truncated = ring.rewards[slot], ring.terminated[slot], ring.truncated[slot]
        done: list[int] = []
        if self.same_step:
            # Most steps end no episode: ndarray.any() costs a fraction of flatnonzero's Python layers.
            finished = terminated | truncated
            if finished.any():
                done = [i for i in finished.nonzero()[0].tolist() if i not in ended.finals]
        only = None
        if ended.carried:
            carried = {i for w in ended.carried for i in self.worker_envs[w]}
            only = np.array([i for i in range(self.n_envs) if i not in carried])
        arrays, finals = self.reader.read(slot, done, only=only)
        finals.update(ended.finals)
        return Batch(None, arrays, rewards, terminated, truncated, infos, reset_infos, finals, typed)

    def _gathered(self, workers: list[int], arrived: list[Arrived], ended: Ended) -> Batch:
        slot = self.slots.slot
        groups = self.worker_envs
        rows = [(slot[w], envs_stepped(groups[w], cmd)) for w, (cmd, _) in zip(workers, arrived)]
        for w in ended.carried:
            self.gather.carry_last(self.worker_envs[w], slot[w])
        carried = set(ended.carried)
        decode = [i for w, (_, g) in zip(workers, rows) if w not in carried for i in g]
        obs, rewards, terminated, truncated = self.gather.read(rows, decode)
        infos: dict[int, dict[str, Any]] = {}
        reset_infos: dict[int, dict[str, Any]] = {}
        columns = self.typed.columns
        typed = None
        if columns is not None and self.arrays:
            typed = self.typed.rows(rows, {})
        learning: dict[int, dict[str, Any]] | None = None  # the steps' own infos, to learn from
        pos = 0
        for w, (s, g), (cmd, reply) in zip(workers, rows, arrived):
            by_env: dict[int, dict[str, Any]] = {}
            by_env_reset: dict[int, dict[str, Any]] = {}
            _collect(reply, self.worker_envs[w].start, by_env, by_env_reset)
            stepped = isinstance(cmd, m.Step) and not isinstance(reply, m.Restarted)
            if columns is not None and stepped and typed is None:
                columns.read(s, [g], by_env)
            if columns is None and stepped:
                learning = {} if learning is None else learning
                learning.update(by_env)
            if typed is not None and not stepped:
                typed.mask[pos : pos + len(g)] = False
            if ended.infos:
                by_env.update((i, ended.infos[i]) for i in g if i in ended.infos)
            if isinstance(g, range):
                shift = pos - g.start
                if by_env:
                    infos.update((i + shift, info) for i, info in by_env.items())
                if by_env_reset:
                    reset_infos.update((i + shift, info) for i, info in by_env_reset.items())
            else:  # some envs of the group: each at its place among them
                at = {i: pos + k for k, i in enumerate(g)}
                infos.update((at[i], info) for i, info in by_env.items())
                reset_infos.update((at[i], info) for i, info in by_env_reset.items())
            pos += len(g)
        if learning is not None:  # from the steps' infos, not from resets', as a synchronous step
            self.typed.learn(learning)
        # A new array: the caller's to keep.
        ids = np.concatenate(
            [
                self._ids[w] if isinstance(g, range) else np.array(g, np.int32)
                for w, (_, g) in zip(workers, rows)
            ]
        )
        return Batch(ids, obs, rewards, terminated, truncated, infos, reset_infos, {}, typed)


def _collect(
    reply: m.Reply | None,
    first: int,
    infos: dict[int, dict[str, Any]],
    reset_infos: dict[int, dict[str, Any]],
) -> None:
    """The infos of one worker's reply, keyed ``first + local env``: a step's non-empty infos and
    reset infos, or a reset's infos (reported as the batch's infos)."""
    if isinstance(reply, m.Stepped):
        for i, info, reset_info in reply.items:
            if info:
                infos[first + i] = info
            if reset_info is not None:
                reset_infos[first + i] = reset_info
    elif isinstance(reply, m.ResetDone):
        for k, reset_info in enumerate(reply.infos):
            if reset_info:
                infos[first + k] = reset_info
