"""Reading a pool-mode batch out of the ring: the rows of whole worker groups, each from the slot
its worker wrote, gathered into one batch (:class:`~shmvec.engine.pool_rules.PoolBatch`).

Encoded leaves are decoded first, in order (each env's codec stream advances), into one array per
leaf that keeps every env's last observation; raw leaves are gathered straight from the ring. With
``copy=False`` a batch's observations are read-only views of ``n_slots`` buffers reused in turn.
Which groups make the batch, and when, is :mod:`shmvec.engine.scheduler`'s business.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from shmvec.engine.pool_rules import RESTARTED, PoolBatch
from shmvec.protocol import Command

if TYPE_CHECKING:
    from shmvec.engine.core import Engine


class PoolReader:
    """The observation buffers of pool mode and the gathering of a batch.

    :param engine: the engine whose ring and reader are read.
    :param batch_size: envs per batch.
    :param n_slots: the ring's slots (and the read-only buffers reused in turn with ``copy=False``).
    """

    def __init__(self, engine: Engine, batch_size: int, n_slots: int) -> None:
        self.engine, self.n_slots = engine, n_slots
        self.readonly_out: list[list[np.ndarray]] | None = None
        if not engine.options.copy:
            # copy=False: read-only batches in n_slots buffers, reused in turn.
            self.readonly_out = []
            for leaf in engine.obs_leaves:
                bufs = [np.zeros((batch_size, *leaf.shape), leaf.dtype) for _ in range(n_slots)]
                self.readonly_out.append(bufs)
        # Encoded leaves are decoded into one array per leaf (every env's last observation).
        self.decoded = {
            j: np.zeros((engine.num_envs, *engine.obs_leaves[j].shape), engine.obs_leaves[j].dtype)
            for j in engine.reader.decoded
        }
        self.raw = {j: engine.ring.obs(j) for j in engine.reader.raw}
        self.n_read = 0

    def after_reset(self, arrays: list[np.ndarray]) -> None:
        """A synchronous ``reset()`` of every env returned ``arrays``: the decoded leaves' last
        observations are theirs."""
        for j, buf in self.decoded.items():
            buf[...] = arrays[j]

    def carry_last(self, group: range, slot: int, prev: int) -> None:
        """The raw rows of ``group`` in ``slot`` become those of ``prev`` (the last the caller saw)."""
        for obs in self.raw.values():
            obs[slot, group.start : group.stop] = obs[prev, group.start : group.stop]

    def read(self, groups: list[range], slots: list[int], replies: list[tuple[str, Any]]) -> PoolBatch:
        """The batch made of ``groups`` (in that order), each read from its slot of ``slots``, with
        the infos of ``replies`` (``(command, reply)`` per group)."""
        engine = self.engine
        ring = engine.ring
        rows = list(zip(slots, groups))
        # Decode first (the envs' codec streams advance), then gather every leaf.
        if self.decoded:
            envs = [i for g, (cmd, _) in zip(groups, replies) if cmd != RESTARTED for i in g]
            engine.reader.decode_envs(envs, self.decoded)
        out: list[np.ndarray] = []
        for j in range(len(engine.obs_leaves)):
            parts = [
                self.decoded[j][g.start : g.stop] if j in self.decoded else self.raw[j][s, g.start : g.stop]
                for s, g in rows
            ]
            if self.readonly_out is None:
                out.append(np.concatenate(parts))
            else:
                buf = self.readonly_out[j][self.n_read % self.n_slots]
                np.concatenate(parts, out=buf)
                view = buf.view()
                view.flags.writeable = False
                out.append(view)
        rewards, terminated, truncated = (
            np.concatenate([field[s, g.start : g.stop] for s, g in rows])
            for field in (ring.rewards, ring.terminated, ring.truncated)
        )
        infos: dict[int, dict[str, Any]] = {}
        typed = engine.typed_infos.columns
        pos = 0
        for (slot, group), (cmd, reply) in zip(rows, replies):
            if typed is not None and cmd == Command.STEP.value:
                # Numeric values the worker wrote into the ring's typed info columns (shmvec.infos).
                by_env = _infos(cmd, reply, group.start)
                typed.read(slot, [group], by_env)
                infos.update({pos + i - group.start: info for i, info in by_env.items()})
            else:
                infos.update(_infos(cmd, reply, pos))
            pos += len(group)
        self.n_read += 1
        ids = np.concatenate([np.arange(g.start, g.stop) for g in groups]).astype(np.int32)
        return PoolBatch(ids, out, rewards, terminated, truncated, infos)


def _infos(cmd: str, reply: Any, first: int) -> dict[int, dict[str, Any]]:
    """Batch position -> info of one group's reply (a step's ``(i, info, reset_info)`` triples, or
    a reset's list of infos)."""
    if cmd == Command.RESET.value:
        return {first + k: info for k, info in enumerate(reply) if info}
    return {first + i: info for i, info, _ in reply or () if info}


__all__ = ["PoolReader"]
