"""What crosses the Ray wire for one ``step`` or ``reset`` of a worker's envs, and where it lands.

An actor's worker writes into a ring of its own (:class:`PrivateRing`: plain arrays, its envs only,
one slot), exactly as a local worker writes into the shared ring. :func:`pack` turns that slot into
a few arrays for one Ray return value; :func:`unpack`, in the main process, writes them into the
engine's ring at the worker's rows and the step's slot. From there the engine's one read path
(:class:`shmvec.engine.obs_reader.Reader`) lends, decodes and checks them as it does for local workers,
so crc verification, lossy-codec sampling, masked resets and restarts need nothing new.

Per observation leaf: an object leaf (no fixed size) sends nothing here, its values are in the
pickled reply itself; a raw leaf sends its ``(n, *shape)`` batch (and the terminal rows of the envs
whose episode ended); an encoded leaf sends its byte counts, checksums, the used bytes of every env
concatenated, and (lossy codecs) the raw samples of the sampled frames only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from shmvec.memory.layout import Leaf
from shmvec.memory.ring import EncodedSize, Ring, plan_fields

if TYPE_CHECKING:
    from shmvec.codecs import Codec

# (byte counts, checksums, concatenated bytes, raw samples of sampled frames or None)
EncodedPart = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None"]
# (rewards, terminated, truncated, local indices of envs whose terminal obs follow, per leaf:
#  (step part, terminal part or None)); a part is an array (raw leaf), an EncodedPart or None (an
#  object leaf).
Packed = tuple[np.ndarray, np.ndarray, np.ndarray, list[int], list[tuple[Any, Any]]]


class PrivateRing(Ring):
    """The ring's fields as plain arrays in one process: what a worker in a Ray actor writes into.

    Same field table and accessors as the shared ring (:func:`shmvec.memory.ring.plan_fields`), one slot,
    no action buffer (actions travel with the call), nothing in ``/dev/shm``.
    """

    def __init__(self, obs_leaves: list[Leaf], n_envs: int, codecs: Sequence[Codec | None] | None) -> None:
        # No segment and no mapping: Ring.__init__ is not called, only its accessors are used.
        encoded = None
        if codecs:
            encoded = [
                None if c is None else EncodedSize(c.max_encoded_size(leaf.shape, leaf.dtype), c.lossless)
                for c, leaf in zip(codecs, obs_leaves)
            ]
        wanted, _ = plan_fields(obs_leaves, n_envs, 1, None, encoded)
        self.spec = None  # type: ignore[assignment]
        self._shm = None
        self._owner = False
        self._mm = None
        self.views = {name: np.zeros(shape, dtype) for name, shape, dtype in wanted}


def pack(ring: Ring, leaves: list[Leaf], codecs: Sequence[Codec | None], done: list[int]) -> Packed:
    """Actor side: slot 0 of ``ring`` and the terminal observations of the local envs ``done``."""
    parts: list[tuple[Any, Any]] = []
    for j, (leaf, codec) in enumerate(zip(leaves, codecs)):
        if not leaf.fixed:
            parts.append((None, None))
        elif codec is None:
            parts.append((ring.obs(j)[0], ring.final(j)[done] if done else None))
        else:
            terminal = _pack_encoded(ring, j, True, done) if done else None
            parts.append((_pack_encoded(ring, j, False, None), terminal))
    return ring.rewards[0], ring.terminated[0], ring.truncated[0], done, parts


def _pack_encoded(ring: Ring, j: int, terminal: bool, rows: list[int] | None) -> EncodedPart:
    enc, length, crc, sample = ring.encoded(j, terminal)
    idx = np.arange(len(length)) if rows is None else np.asarray(rows)
    lens = length[idx]
    blob = np.concatenate([enc[i, :n] for i, n in zip(idx.tolist(), lens.tolist())])
    crcs = crc[idx]
    samples = None if sample is None else sample[idx[crcs >= 0]]
    return lens, crcs, blob, samples


def unpack(ring: Ring, envs: range, slot: int, packed: Packed) -> int:
    """Main side: write what :func:`pack` sent for the worker of ``envs`` into ``slot`` of ``ring``;
    the number of bytes it carried (arrays only: what the codecs decide)."""
    rewards, terminated, truncated, done, parts = packed
    lo, hi = envs.start, envs.stop
    ring.rewards[slot, lo:hi] = rewards
    ring.terminated[slot, lo:hi] = terminated
    ring.truncated[slot, lo:hi] = truncated
    ended = [lo + k for k in done]
    size = rewards.nbytes + terminated.nbytes + truncated.nbytes
    for j, (obs, final) in enumerate(parts):
        if obs is None:
            continue
        if isinstance(obs, np.ndarray):
            ring.obs(j)[slot, lo:hi] = obs
            size += obs.nbytes
            if final is not None:
                ring.final(j)[ended] = final
                size += final.nbytes
            continue
        size += _unpack_encoded(ring, j, False, list(envs), obs)
        if final is not None:
            size += _unpack_encoded(ring, j, True, ended, final)
    return size


def _unpack_encoded(ring: Ring, j: int, terminal: bool, rows: list[int], part: EncodedPart) -> int:
    lens, crcs, blob, samples = part
    enc, length, crc, sample = ring.encoded(j, terminal)
    length[rows] = lens
    crc[rows] = crcs
    start = 0
    for i, n in zip(rows, lens.tolist()):
        enc[i, :n] = blob[start : start + n]
        start += n
    size = lens.nbytes + crcs.nbytes + blob.nbytes
    if samples is not None and sample is not None:
        sample[np.asarray(rows)[crcs >= 0]] = samples
        size += samples.nbytes
    return size
