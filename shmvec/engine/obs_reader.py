"""Observations out of the ring: one path for raw, encoded and object leaves.

Each observation leaf is either raw (batched arrays in the ring slots, lent or copied out), encoded
(bytes in the ring, decoded here; see :mod:`shmvec.worker.encoder` for the worker side) or an
object leaf (no fixed size: its values come from the workers' replies, kept by
:class:`~shmvec.engine.objects.ObjectLeaves`, taken before the batch is read).
:meth:`Reader.read` returns the leaf arrays of a batch and the terminal leaves of the envs whose
episode ended, whatever mix of leaves the space has, so restart mode, masked resets and
``check_finite`` work the same with or without a codec.

Encoded leaves: each env's terminal observation (if its episode ended) is decoded before its step
observation, the order the worker encoded them, and sampled frames are checked: a checksum
mismatch raises :class:`~shmvec.errors.CodecMismatchError`, a lossy error beyond the user's
:class:`~shmvec.codecs.Tolerance` raises or warns. Envs are decoded in a thread pool when the
codecs release the GIL.
"""

from __future__ import annotations

import mmap
import warnings
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

import numpy as np

from shmvec.codecs.base import Codec, CodecError, byte_view
from shmvec.engine.objects import ObjectLeaves
from shmvec.engine.slots import Slots
from shmvec.errors import CodecMismatchError, FidelityError, FidelityWarning
from shmvec.memory.layout import Leaf
from shmvec.memory.ring import Ring

if TYPE_CHECKING:
    from shmvec.codecs.tolerance import Tolerance


class _Decoded:
    """One encoded leaf: a codec stream per env, the ring areas to read, where batches go."""

    def __init__(
        self, codec: Codec, leaf: Leaf, ring: Ring, j: int, n_envs: int, n_slots: int, copy: bool
    ) -> None:
        self.codec, self.leaf = codec, leaf
        self.streams = codec.new_streams(n_envs, leaf.shape, leaf.dtype)
        # (encoded bytes, byte counts, checksums, raw samples or None) of step and terminal obs.
        self.areas = [ring.encoded(j, terminal) for terminal in (False, True)]
        # copy=False hands out read-only views of buffers kept per slot, like the raw ring.
        self.kept = None if copy else np.zeros((n_slots, n_envs, *leaf.shape), leaf.dtype)
        self.readonly = None
        if self.kept is not None:
            self.readonly = self.kept.view()
            self.readonly.flags.writeable = False
        # copy=True decodes into slots of a mapping of our own, lent like the ring's (see
        # Ring.lend_obs): no allocation per batch, and the lending rules of raw leaves apply.
        self.shape = (n_envs, *leaf.shape)
        self.slot_bytes = n_envs * leaf.nbytes
        self.mm = mmap.mmap(-1, max(1, n_slots * self.slot_bytes)) if copy else None

    def lend(self, slot: int) -> np.ndarray:
        """A new array over decoded slot ``slot`` (copy=True), whose views all reference it."""
        return np.ndarray(self.shape, self.leaf.dtype, buffer=self.mm, offset=slot * self.slot_bytes)

    def output(self, slot: int, lend: bool) -> tuple[np.ndarray, np.ndarray]:
        """The array to decode this batch into, and the one to return (read-only if kept; lent from
        ``slot`` if ``lend``, else the caller's own)."""
        if self.kept is None:
            out = self.lend(slot) if lend else np.empty(self.shape, self.leaf.dtype)
            return out, out
        assert self.readonly is not None
        return self.kept[slot], self.readonly[slot]


class Reader:
    """Reads batches of observation leaves out of the ring.

    :param leaves: the observation leaves.
    :param ring: the ring.
    :param codecs: one codec or None (raw) per leaf; None: every leaf raw.
    :param slots: the ring's slot rotation (raw leaves are lent from it with ``copy=True``).
    :param copy: True: the caller owns what it gets; False: read-only views valid for
        ``n_slots - 1`` more batches.
    :param tolerance: what a lossy codec may change (required when any codec is lossy).
    :param threads: decode threads (1: in the calling thread).
    """

    def __init__(
        self,
        leaves: list[Leaf],
        ring: Ring,
        codecs: Sequence[Codec | None] | None,
        slots: Slots,
        copy: bool,
        tolerance: Tolerance | None = None,
        threads: int = 1,
    ) -> None:
        n_envs = ring.rewards.shape[1]
        self.ring, self.slots, self.copy, self.tolerance, self.n_envs = ring, slots, copy, tolerance, n_envs
        codecs = codecs or [None] * len(leaves)
        self.decoded: dict[int, _Decoded] = {
            j: _Decoded(c, leaf, ring, j, n_envs, slots.n_slots, copy)
            for j, (c, leaf) in enumerate(zip(codecs, leaves))
            if c is not None
        }
        self.raw = [j for j, leaf in enumerate(leaves) if j not in self.decoded and leaf.fixed]
        self.fixed = [j for j, leaf in enumerate(leaves) if leaf.fixed]
        self.objects = None if len(self.fixed) == len(leaves) else ObjectLeaves(leaves, n_envs)
        # Views of our own: made read-only for copy=False without locking the ring's arrays.
        self.obs_views = {j: ring.obs(j).view() for j in self.raw}
        self.final_views = {j: ring.final(j) for j in self.raw}
        self.n_leaves = len(leaves)
        if not copy:
            for view in self.obs_views.values():
                view.flags.writeable = False
        self.steps = 0
        # Where each env's last returned observation is, for envs whose rows are carried over
        # (masked reset, restart): raw rows in the ring slot ``last_slot[i]``; encoded leaves in the
        # arrays of the whole batch returned last, or, for envs a gathered (pool) batch returned
        # since (``in_gathered``), in ``gathered``, which gathered batches decode into.
        self.last_slot = np.zeros(n_envs, np.intp)
        self.in_gathered = np.zeros(n_envs, bool)
        self.gathered = {j: np.zeros((n_envs, *leaves[j].shape), leaves[j].dtype) for j in self.decoded}
        self._last_decoded: dict[int, np.ndarray] = {}
        self._last_slot = 0  # the slot of the whole batch returned last (lent decoded leaves are read back)
        self._previous_copy: dict[int, np.ndarray] | None = None
        threads = max(1, min(threads, n_envs)) if self.decoded else 1
        self.decoders = (
            ThreadPoolExecutor(threads, thread_name_prefix="shmvec-decode") if threads > 1 else None
        )
        bounds = np.linspace(0, n_envs, threads + 1).astype(int)
        self.chunks = [range(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]

    def keep_previous(self) -> None:
        """Call after ``slots.advance_all()`` when :meth:`previous` will be needed: if the workers are
        about to overwrite a slot holding some env's last observation (pool batches left envs in
        several slots, or every other slot is still lent), copy those observations first."""
        self._previous_copy = None
        if self.obs_views and (self.last_slot == self.slots.current).any():
            envs = np.arange(self.n_envs)
            self._previous_copy = {j: v[self.last_slot, envs] for j, v in self.obs_views.items()}

    def seen(self, slot: int, envs: range | list[int]) -> None:
        """A gathered batch returned the rows of ``envs`` from ``slot`` (encoded leaves decoded into
        :attr:`gathered`)."""
        rows = slice(envs.start, envs.stop) if isinstance(envs, range) else envs
        self.last_slot[rows] = slot
        self.in_gathered[rows] = True
        self._previous_copy = None  # of rows no longer the last (keep_previous copies anew)

    def previous(self, rows: Sequence[int] | np.ndarray | slice) -> list[np.ndarray]:
        """Copies of ``rows`` of each env's last returned observation, per leaf (after
        :meth:`keep_previous`).

        Raw leaves come from the slot each env was last read from, which the workers do not write in
        this step (n_slots >= 2); encoded ones from the last whole batch or :attr:`gathered`; object
        leaves are the values each env returned last (:class:`~shmvec.engine.objects.ObjectLeaves`).
        """
        out = []
        envs = np.arange(self.n_envs)[rows]
        objects = {} if self.objects is None else dict(zip(self.objects.index, self.objects.rows(rows)))
        gathered = self.in_gathered[envs]
        for j in range(self.n_leaves):
            if j in objects:
                out.append(objects[j])
                continue
            part = self.decoded.get(j)
            if part is not None:
                last = self._last_decoded.get(j)
                if last is None:  # lent: read back from its slot (not held, or it would stay lent)
                    last = part.lend(self._last_slot)
                rows_j = last[envs]  # fancy indexing: a copy
                if gathered.any():
                    rows_j[gathered] = self.gathered[j][envs[gathered]]
                out.append(rows_j)
            elif self._previous_copy is not None:
                out.append(self._previous_copy[j][envs])
            else:
                out.append(self.obs_views[j][self.last_slot[envs], envs])
        return out

    def read(
        self,
        slot: int,
        done: Sequence[int] = (),
        is_step: bool = True,
        only: Sequence[int] | np.ndarray | None = None,
    ) -> tuple[list[np.ndarray], dict[int, list[np.ndarray]]]:
        """The leaf arrays of the batch in ``slot`` and the terminal leaves of the ``done`` envs
        (object leaves: the values taken from the batch's replies, every env's last one).

        :param is_step: count the batch as a step (for the step number in codec errors).
        :param only: the envs the workers wrote (a masked reset); the others keep the rows of the
            batch returned last (needs :meth:`keep_previous`).
        """
        if is_step:
            self.steps += 1
        keep = None if only is None else np.setdiff1d(np.arange(self.n_envs), only)
        if keep is not None and len(keep):
            carried = self.previous(keep)
            for j in self.obs_views:
                self.ring.obs(j)[slot][keep] = carried[j]
        arrays: list[np.ndarray] = [None] * self.n_leaves  # type: ignore[list-item]
        # Lend the slot itself (no copy) while another stays free for the next write.
        lend = self.copy and self.slots.can_lend(slot)
        if not self.copy:
            for j, view in self.obs_views.items():
                arrays[j] = view[slot]
        elif self.obs_views:
            if lend:
                lent = self.slots.lent[slot] = [self.ring.lend_obs(j, slot) for j in self.obs_views]
                for j, arr in zip(self.obs_views, lent):
                    arrays[j] = arr
            else:
                for j, view in self.obs_views.items():
                    arrays[j] = view[slot].copy()
        finals: dict[int, list[np.ndarray]] = {i: [] for i in done}
        if not self.decoded:
            self.last_slot[:] = slot
            self._previous_copy = None
            for i in done:
                finals[i] = [v[i].copy() for v in self.final_views.values()]
            if self.objects is not None:
                self.objects.complete(arrays, finals, slice(None))
            return arrays, finals
        outs: dict[int, np.ndarray] = {}
        for j, part in self.decoded.items():
            outs[j], arrays[j] = part.output(slot, lend)
            if lend:
                self.slots.lent[slot].append(arrays[j])
        envs = range(self.n_envs) if only is None else list(only)
        if self.decoders is None or only is not None:
            self.decode_envs(envs, outs, finals)
        else:
            futures = [self.decoders.submit(self.decode_envs, c, outs, finals) for c in self.chunks]
            wait(futures)  # all of them, even when one fails: none may still run during the next step
            for future in futures:
                future.result()
        if keep is not None and len(keep):
            for j in self.decoded:
                outs[j][keep] = carried[j]
        self._last_decoded = {} if lend else {j: arrays[j] for j in self.decoded}
        self._last_slot = slot
        self.last_slot[:] = slot
        self.in_gathered[:] = False
        self._previous_copy = None
        if self.objects is not None:
            self.objects.complete(arrays, finals, slice(None))
        return arrays, finals

    def decode_envs(
        self, envs: Sequence[int], outs: dict[int, np.ndarray], finals: dict[int, list] | None = None
    ) -> None:
        """Decode the frames the workers encoded for ``envs`` into ``outs`` (leaf -> array of every
        env's row); for the envs that are keys of ``finals``, append their terminal leaves (every
        fixed-size leaf, raw or decoded; the caller adds the object leaves) to its lists. An env's
        terminal frame is decoded before its step frame, the order its worker encoded them (streams
        are per env: the order across envs is free)."""
        finals = {} if finals is None else finals
        for i in envs:
            final = finals.get(i)
            if final is None:
                continue
            for j in self.fixed:
                part = self.decoded.get(j)
                if part is None:
                    final.append(self.final_views[j][i].copy())
                else:
                    final.append(self._decode_one(part, 1, i, np.empty(part.leaf.shape, part.leaf.dtype)))
        for j, part in self.decoded.items():
            enc, length, crc, _ = part.areas[0]
            try:
                part.codec.decode_rows(enc, length, envs, outs[j], part.streams)
            except CodecError as exc:
                i = envs[0] if exc.row is None else exc.row
                raise self._mismatch(f"could not be decoded ({exc})", i, part, 0) from exc
            for i in envs:
                if crc[i] >= 0:  # a sampled frame
                    self._check(part, 0, i, outs[j][i, ...])

    def restart(self, envs: Sequence[int]) -> None:
        """Envs rebuilt from scratch: their next encoded frame is a key frame, whatever came before."""
        for part in self.decoded.values():
            for i in envs:
                part.streams[i] = part.codec.new_stream(part.leaf.shape, part.leaf.dtype)

    def _decode_one(self, part: _Decoded, which: int, i: int, out: np.ndarray) -> np.ndarray:
        enc, length, crc, _ = part.areas[which]
        try:
            part.codec.decode(enc[i, : length[i]], out, part.streams[i])
        except CodecError as exc:
            raise self._mismatch(f"could not be decoded ({exc})", i, part, which) from exc
        if crc[i] >= 0:  # a sampled frame
            self._check(part, which, i, out)
        return out

    def _check(self, part: _Decoded, which: int, i: int, out: np.ndarray) -> None:
        """Check env ``i``'s decoded frame against the worker's checksum (lossless) or raw sample."""
        _, _, crc, sample = part.areas[which]
        if sample is None:
            got = zlib.crc32(byte_view(out).data)
            if got != int(crc[i]):
                raise self._mismatch(
                    f"decoded by {part.codec!r} differs from what the worker encoded "
                    f"(crc32 {got:#010x}, worker {int(crc[i]):#010x})",
                    i,
                    part,
                    which,
                )
            return
        self._check_lossy(i, part, which, sample[i], out)

    def _where(self, i: int, part: _Decoded, which: int) -> str:
        what = "terminal observation" if which else "observation"
        return f"env {i}, step {self.steps}, key {part.leaf.name!r}: {what}"

    def _mismatch(self, message: str, i: int, part: _Decoded, which: int) -> CodecMismatchError:
        return CodecMismatchError(
            f"{self._where(i, part, which)} {message}",
            env_index=i,
            step=self.steps,
            key=part.leaf.name,
            terminal=bool(which),
        )

    def _check_lossy(self, i: int, part: _Decoded, which: int, raw: np.ndarray, out: np.ndarray) -> None:
        from shmvec.codecs.tolerance import errors

        assert self.tolerance is not None
        max_abs, _, _, psnr = errors(raw, out)
        breach = self.tolerance.breach(max_abs, psnr)
        if breach is None:
            return
        message = f"{self._where(i, part, which)} through {part.codec!r} is outside the tolerance: {breach}"
        if self.tolerance.on_breach == "raise":
            raise FidelityError(message)
        warnings.warn(message, FidelityWarning, stacklevel=5)

    def close(self) -> None:
        """Stop the decode threads and let go of the ring's arrays (the engine is closed)."""
        if self.decoders is not None:
            self.decoders.shutdown(wait=True)
            self.decoders = None
        self.obs_views, self.final_views, self.decoded = {}, {}, {}
        self._last_decoded, self._previous_copy, self.gathered = {}, None, {}
