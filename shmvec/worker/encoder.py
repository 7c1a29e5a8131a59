"""Encoding observation leaves into the ring, worker side (``codec=``).

Worker side, :class:`LeafEncoder`: one per encoded observation leaf and worker, holding one codec
stream per env. Its two :class:`EncodedArea` objects (step observation, terminal observation) stand
where the raw batched arrays would be, so :func:`shmvec.memory.layout.write_leaf` checks shape and dtype
and then ``area[i] = value`` encodes env ``i``'s value into its row of the ring.

Every ``verify_every``-th frame of an env (counted per env, step and terminal observations alike)
the worker also writes ``zlib.crc32`` of the raw bytes, and for a lossy codec the raw observation
itself; other frames get checksum -1. The main side is :class:`shmvec.engine.obs_reader.Reader`, which
decodes and checks them.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

from shmvec.codecs.base import Codec, byte_view
from shmvec.memory.layout import Leaf

if TYPE_CHECKING:
    from shmvec.memory.ring import Ring


class EncodedArea:
    """One leaf's encoded rows for a worker's envs (step or terminal observation); indexable like
    the raw batch it replaces: ``area[slot]`` is the area itself (no slot dimension), ``area[i] = x``
    encodes."""

    def __init__(self, owner: LeafEncoder, ring: Ring, j: int, terminal: bool, envs: slice) -> None:
        self.owner = owner
        enc, length, crc, sample = ring.encoded(j, terminal)
        self.enc, self.len, self.crc = enc[envs], length[envs], crc[envs]
        self.sample = None if sample is None else sample[envs]

    def __getitem__(self, slot: int) -> EncodedArea:
        return self

    def __setitem__(self, i: int, value: np.ndarray) -> None:
        o = self.owner
        arr = np.asarray(value, dtype=o.leaf.dtype)  # write_leaf has checked the cast is safe
        self.len[i] = o.codec.encode(arr, self.enc[i], o.streams[i])
        count = o.counts[i]
        o.counts[i] = count + 1
        if o.verify_every and count % o.verify_every == 0:
            self.crc[i] = zlib.crc32(byte_view(arr).data)
            if self.sample is not None:
                self.sample[i] = arr
        else:
            self.crc[i] = -1


class LeafEncoder:
    """Worker side of one encoded leaf: the codec, a stream and a frame counter per env, two areas.

    :param verify_every: checksum (and, lossy, sample) every this many frames per env; 0 never.
    """

    def __init__(self, codec: Codec, leaf: Leaf, ring: Ring, j: int, envs: range, verify_every: int) -> None:
        self.codec, self.leaf, self.verify_every = codec, leaf, verify_every
        self.streams = [codec.new_stream(leaf.shape, leaf.dtype) for _ in envs]
        self.counts = [0] * len(envs)
        rows = slice(envs.start, envs.stop)
        self.obs, self.final = (EncodedArea(self, ring, j, terminal, rows) for terminal in (False, True))

    def restart(self, i: int) -> None:
        """Env ``i`` (local index) was reset: its next frame must not depend on earlier ones."""
        self.codec.restart(self.streams[i])
