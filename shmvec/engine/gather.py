"""Gathering a batch out of the ring from several slots: the rows of whole worker groups, each from
the slot its worker wrote (pool mode, where groups step on their own).

Encoded leaves are decoded first, in order (each env's codec stream advances), into one array per
leaf that keeps every env's last observation; raw leaves are gathered straight from the ring, object
leaves from each env's last value (:class:`~shmvec.engine.objects.ObjectLeaves`). With
``copy=False`` a batch's observations are read-only views of ``n_slots`` buffers reused in turn.
"""

from __future__ import annotations

import numpy as np

from shmvec.engine.obs_reader import Reader
from shmvec.memory.layout import Leaf
from shmvec.memory.ring import Ring


class Gather:
    """The observation buffers of gathered batches.

    :param leaves: the observation leaves.
    :param ring: the ring.
    :param reader: decodes encoded leaves.
    :param batch_size: envs per batch.
    :param n_slots: the ring's slots (and the read-only buffers reused in turn with ``copy=False``).
    :param copy: False: read-only views of buffers reused in turn.
    """

    def __init__(
        self, leaves: list[Leaf], ring: Ring, reader: Reader, batch_size: int, n_slots: int, copy: bool
    ) -> None:
        self.ring, self.reader, self.n_slots, self.n_leaves = ring, reader, n_slots, len(leaves)
        self.readonly_out: list[list[np.ndarray]] | None = None
        if not copy:
            self.readonly_out = [
                [np.zeros((batch_size, *leaf.shape), leaf.dtype) for _ in range(n_slots if leaf.fixed else 0)]
                for leaf in leaves
            ]
        # Encoded leaves are decoded into the reader's arrays over every env (Reader.gathered).
        self.decoded = reader.gathered
        self.raw = {j: ring.obs(j) for j in reader.raw}
        self.n_read = 0

    def close(self) -> None:
        """Let go of the ring's arrays (the engine is closed)."""
        self.raw, self.decoded = {}, {}

    def carry_last(self, group: range, slot: int) -> None:
        """The rows of ``group`` in ``slot`` (raw leaves) and in the decoded arrays become the last
        observations the caller saw of it."""
        rows = slice(group.start, group.stop)
        last = self.reader.previous(rows)
        for j, obs in self.raw.items():
            obs[slot, rows] = last[j]
        for j, buf in self.decoded.items():
            buf[rows] = last[j]

    def read(
        self, rows: list[tuple[int, range | list[int]]], decode: list[int]
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """The observation leaves, rewards, terminated and truncated of the batch made of ``rows``
        (``(slot, envs)`` each, in batch order: a worker's group, or the envs of it that stepped);
        ``decode``: the envs whose encoded frames are new."""
        if self.decoded and decode:
            self.reader.decode_envs(decode, self.decoded)
        out: list[np.ndarray] = []
        objects, values = self.reader.objects, {}
        if objects is not None:
            ids = np.concatenate([np.asarray(g) for _, g in rows])
            values = dict(zip(objects.index, objects.rows(ids)))
        index = [(s, _index(g)) for s, g in rows]
        for s, g in rows:
            self.reader.seen(s, g)
        for j in range(self.n_leaves):
            if j in values:
                out.append(values[j])
                continue
            decoded = self.decoded.get(j)
            parts = [decoded[g] if decoded is not None else self.raw[j][s, g] for s, g in index]
            if self.readonly_out is None:
                out.append(_joined(parts))
            else:
                buf = self.readonly_out[j][self.n_read % self.n_slots]
                np.concatenate(parts, out=buf)
                view = buf.view()
                view.flags.writeable = False
                out.append(view)
        ring = self.ring
        rewards, terminated, truncated = (
            _joined([field[s, g] for s, g in index])
            for field in (ring.rewards, ring.terminated, ring.truncated)
        )
        self.n_read += 1
        return out, rewards, terminated, truncated


def _index(envs: range | list[int]) -> slice | list[int]:
    """Rows ``envs`` of an array over every env: a slice for a whole group (a view, no index array)."""
    return slice(envs.start, envs.stop) if isinstance(envs, range) else envs


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The rows of ``parts`` in one new array (a batch of one worker group: a plain copy, half of
    ``np.concatenate``'s cost on a few rows)."""
    return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)
