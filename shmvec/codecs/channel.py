"""Codecs inside ShmVecEnv: the worker encodes into the ring, the main process decodes out of it.

Worker side, :class:`LeafEncoder`: one per encoded observation leaf and worker, holding one codec
stream per env. Its two :class:`EncodedArea` objects (step observation, terminal observation) stand
where the raw batched arrays would be, so :func:`shmvec.layout.write_leaf` checks shape and dtype
and then ``area[i] = value`` encodes env ``i``'s value into its row of the ring.

Every ``verify_every``-th frame of an env (counted per env, step and terminal observations alike)
the worker also writes ``zlib.crc32`` of the raw bytes, and for a lossy codec the raw observation
itself; other frames get checksum -1. Main side, :class:`Decoder` decodes each env's terminal
observation (if its episode ended) before its step observation, the order the worker encoded them,
and compares: a checksum mismatch raises :class:`~shmvec.errors.CodecMismatchError`, a lossy error
beyond the user's :class:`~shmvec.fidelity.Tolerance` raises or warns. Envs are decoded in a thread
pool when the codecs release the GIL.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import numpy as np

from shmvec.codecs.base import Codec, CodecError, byte_view
from shmvec.errors import CodecMismatchError, FidelityError, FidelityWarning
from shmvec.layout import Leaf

if TYPE_CHECKING:
    from shmvec.fidelity import Tolerance
    from shmvec.ring import Ring

_PREFIXES = ("", "f")  # step observation, terminal observation


class EncodedArea:
    """One leaf's encoded rows for a worker's envs (step or terminal observation); indexable like
    the raw batch it replaces: ``area[slot]`` is the area itself (no slot dimension), ``area[i] = x``
    encodes."""

    def __init__(
        self, owner: LeafEncoder, views: dict[str, np.ndarray], prefix: str, j: int, envs: slice
    ) -> None:
        self.owner = owner
        self.enc = views[f"{prefix}enc{j}"][envs]
        self.len = views[f"{prefix}len{j}"][envs]
        self.crc = views[f"{prefix}crc{j}"][envs]
        sample = views.get(f"{prefix}sample{j}")
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
        self.obs, self.final = (EncodedArea(self, ring.views, p, j, rows) for p in _PREFIXES)

    def restart(self, i: int) -> None:
        """Env ``i`` (local index) was reset: its next frame must not depend on earlier ones."""
        self.codec.restart(self.streams[i])


class _LeafDecoder:
    """Main side of one encoded leaf: streams per env and the ring views to read."""

    def __init__(
        self, codec: Codec, leaf: Leaf, ring: Ring, j: int, n_envs: int, n_slots: int, copy: bool
    ) -> None:
        self.codec, self.leaf = codec, leaf
        self.streams = [codec.new_stream(leaf.shape, leaf.dtype) for _ in range(n_envs)]
        # (encoded bytes, byte counts, checksums, raw samples or None) of step and terminal obs.
        self.areas: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = [
            (v[f"{p}enc{j}"], v[f"{p}len{j}"], v[f"{p}crc{j}"], v.get(f"{p}sample{j}"))
            for v in (ring.views,)
            for p in _PREFIXES
        ]
        # copy=False hands out read-only views of buffers kept per slot, like the raw ring.
        self.kept = None if copy else np.zeros((n_slots, n_envs, *leaf.shape), leaf.dtype)
        self.readonly = None
        if self.kept is not None:
            self.readonly = self.kept.view()
            self.readonly.flags.writeable = False

    def output(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """The array to decode this step's batch into, and the one to return (read-only if kept)."""
        if self.kept is None:
            out = np.empty((len(self.streams), *self.leaf.shape), self.leaf.dtype)
            return out, out
        assert self.readonly is not None
        return self.kept[slot], self.readonly[slot]


class Decoder:
    """Main side: decodes every encoded leaf of a step (and copies the raw ones) and verifies.

    :param codecs: one codec or None (raw) per leaf.
    :param tolerance: what a lossy codec may change (required when any codec is lossy).
    :param threads: decode threads (1: in the calling thread).
    """

    def __init__(
        self,
        codecs: Sequence[Codec | None],
        leaves: list[Leaf],
        ring: Ring,
        n_envs: int,
        n_slots: int,
        copy: bool,
        tolerance: Tolerance | None,
        threads: int,
    ) -> None:
        self.leaves, self.copy, self.tolerance, self.n_envs = leaves, copy, tolerance, n_envs
        self.parts: list[_LeafDecoder | tuple[np.ndarray, np.ndarray]] = []
        for j, (codec, leaf) in enumerate(zip(codecs, leaves)):
            if codec is None:
                self.parts.append((ring.obs(j), ring.final(j)))
            else:
                self.parts.append(_LeafDecoder(codec, leaf, ring, j, n_envs, n_slots, copy))
        self.steps = 0
        threads = max(1, min(threads, n_envs))
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="shmvec-decode") if threads > 1 else None
        bounds = np.linspace(0, n_envs, threads + 1).astype(int)
        self.chunks = [range(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]

    def read(
        self, slot: int, done: Sequence[int], is_step: bool
    ) -> tuple[list[np.ndarray], dict[int, list[np.ndarray]]]:
        """Decode a step (or reset): leaf arrays of the batch, and the terminal leaves of ``done`` envs."""
        if is_step:
            self.steps += 1
        outs, results = [], []
        for part in self.parts:
            if isinstance(part, _LeafDecoder):
                out, result = part.output(slot)
            else:
                view = part[0][slot]
                out = result = view.copy() if self.copy else view
            outs.append(out)
            results.append(result)
        finals: dict[int, list[np.ndarray]] = {i: [] for i in done}
        if self.pool is None:
            self._decode_envs(range(self.n_envs), outs, finals)
        else:
            futures = [self.pool.submit(self._decode_envs, c, outs, finals) for c in self.chunks]
            wait(futures)  # all of them, even when one fails: none may still run during the next step
            for future in futures:
                future.result()
        return results, finals

    def _decode_envs(self, envs: range, outs: list[np.ndarray], finals: dict[int, list[np.ndarray]]) -> None:
        for i in envs:
            final = finals.get(i)
            for part, out in zip(self.parts, outs):
                if isinstance(part, _LeafDecoder):
                    if final is not None:
                        final.append(self._decode_one(part, 1, i, np.empty(part.leaf.shape, part.leaf.dtype)))
                    self._decode_one(part, 0, i, out[i, ...])  # a view, also for 0-d leaves
                elif final is not None:
                    final.append(part[1][i].copy())

    def _decode_one(self, part: _LeafDecoder, which: int, i: int, out: np.ndarray) -> np.ndarray:
        enc, length, crc, sample = part.areas[which]
        try:
            part.codec.decode(enc[i, : length[i]], out, part.streams[i])
        except CodecError as exc:
            raise self._mismatch(f"could not be decoded ({exc})", i, part, which) from exc
        expected = int(crc[i])
        if expected < 0:
            return out
        if sample is None:
            got = zlib.crc32(byte_view(out).data)
            if got != expected:
                raise self._mismatch(
                    f"decoded by {part.codec!r} differs from what the worker encoded "
                    f"(crc32 {got:#010x}, worker {expected:#010x})",
                    i,
                    part,
                    which,
                )
            return out
        self._check_lossy(i, part, which, sample[i], out)
        return out

    def _where(self, i: int, part: _LeafDecoder, which: int) -> str:
        what = "terminal observation" if which else "observation"
        return f"env {i}, step {self.steps}, key {part.leaf.name!r}: {what}"

    def _mismatch(self, message: str, i: int, part: _LeafDecoder, which: int) -> CodecMismatchError:
        return CodecMismatchError(
            f"{self._where(i, part, which)} {message}",
            env_index=i,
            step=self.steps,
            key=part.leaf.name,
            terminal=bool(which),
        )

    def _check_lossy(self, i: int, part: _LeafDecoder, which: int, raw: np.ndarray, out: np.ndarray) -> None:
        from shmvec.fidelity import errors

        assert self.tolerance is not None
        max_abs, _, _, psnr = errors(raw, out)
        breach = self.tolerance.breach(max_abs, psnr)
        if breach is None:
            return
        message = f"{self._where(i, part, which)} through {part.codec!r} is outside the tolerance: {breach}"
        if self.tolerance.on_breach == "raise":
            raise FidelityError(message)
        warnings.warn(message, FidelityWarning, stacklevel=4)

    def close(self) -> None:
        """Stop the decode threads."""
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None


def check_lossy(codecs: Sequence[Codec | None], names: list[str], tolerance: Any) -> None:
    """Refuse a lossy codec unless the user gave a tolerance.

    :raises ValueError: naming the codec and the key, saying what to pass.
    """
    for codec, name in zip(codecs, names):
        if codec is not None and not codec.lossless and tolerance is None:
            raise ValueError(
                f"codec {codec!r} for observation key {name!r} is lossy: the agent would see changed "
                "pixels. Pass tolerance=shmvec.fidelity.Tolerance(min_psnr_db=..., max_abs_error=...) "
                "to accept it with sampled checks, or use a lossless codec (delta, lz4, zstd, png)."
            )
