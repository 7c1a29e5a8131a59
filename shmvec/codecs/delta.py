"""``delta``: each frame as the words that changed since the same env's previous frame, then lz4/zstd.

Consecutive Atari frames differ in a few hundred bytes. A numba kernel compares the frame with the
env's previous one 8 bytes at a time and writes only the changed words, as runs: one header word
(``skip << 32 | length``, in words) followed by the XOR of each changed word with the old one. XOR
is exact for every dtype (it works on the bytes) and its own inverse. The runs are then compressed
by lz4 or zstd. Writing runs instead of a full XOR frame keeps both sides at one pass over the frame
plus the compression of a few hundred bytes (a full-frame XOR then zstd costs 2-3x more time).

Every encoded frame starts with a 9-byte header: byte 0 the kind (key frame or delta), bytes 1-4 a
little-endian frame counter, bytes 5-8 the payload size before compression. A key frame carries the
whole frame: it is sent for the first frame of a stream, after :meth:`DeltaCodec.restart` (the worker
calls it after every env reset) and every ``key_every`` frames. The decoder never guesses: it takes
a key frame as its new reference, and refuses a delta whose counter does not follow the last frame
it decoded (a frame was lost, e.g. a step that raised midway; ``reset()`` brings streams back in step).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shmvec.codecs.base import Codec, CodecError, byte_view, nbytes, out_bytes
from shmvec.codecs.runs import _BLOCK, _apply_runs, _encode_runs  # noqa: F401 - _BLOCK: tests

_HEAD = struct.Struct("<BII")  # kind, frame counter, payload bytes before compression
_HEADER = _HEAD.size
_KEY, _DELTA = 1, 2
_SEQ_MASK = 0xFFFFFFFF
_LOST = (
    "delta: frame {seq} follows frame {last}: a frame was lost and the decoder's reference is stale "
    "(reset the envs to start new key frames)"
)
_FUSED: Any = None  # shmvec.codecs.fused once imported, False where it cannot work
_CORRUPT_HEADER = "delta: corrupt frame header"
_CORRUPT_RUNS = "delta: corrupt runs (they reach past the frame)"


def _fused() -> Any:
    """:mod:`shmvec.codecs.fused` (imported on first use: it loads lz4 into numba), or False."""
    global _FUSED
    if _FUSED is None:
        from shmvec.codecs import fused

        _FUSED = fused if fused.AVAILABLE else False
    return _FUSED


def _fused_error(fused: Any, status: int, seq: int, last: int) -> CodecError:
    """The error of a failed :func:`shmvec.codecs.fused.decode_frame`, worded as the Python path's."""
    message = {
        fused.BAD_HEADER: _CORRUPT_HEADER,
        fused.LOST: _LOST,
        fused.BAD_DATA: "lz4: corrupt data in delta frame {seq}",
        fused.BAD_RUNS: _CORRUPT_RUNS,
    }[status]
    return CodecError(message.format(seq=seq, last=last))


@dataclass
class _Rows:
    """The references and scratch of a batch of streams, one row per env (``new_streams``)."""

    prev: np.ndarray  # (n, words) uint64
    runs: np.ndarray  # (n, words + 1) uint64


@dataclass
class DeltaStream:
    """One env's delta state: its reference frame (padded to whole words), a runs buffer, counters."""

    prev: np.ndarray  # uint64 words; bytes past the frame's size stay zero
    runs: np.ndarray  # uint64 scratch for the runs (encoder) or the decompressed payload (decoder)
    pad: np.ndarray | None  # word-aligned copy of a frame whose size or address is not a multiple of 8
    seq: int = -1  # counter of the last frame encoded/decoded; -1 = none yet
    since_key: int = 0
    need_key: bool = True
    rows: _Rows | None = None  # the batch whose rows prev and runs are (new_streams), if any


class DeltaCodec(Codec):
    """Lossless temporal codec: per-env changed words against the previous frame, then lz4 or zstd.

    :param backend: ``"lz4"`` (default; faster) or ``"zstd"`` (smaller output, ~10% on Atari
        frames, but each call costs more: worth it where bytes, not CPU, are the limit).
    :param level: zstd level (default 1); ignored for lz4.
    :param key_every: a key frame at least every this many frames of a stream (default 256), besides
        the one after every reset; bounds how long a stale reference could last.
    """

    name = "delta"
    lossless = True
    releases_gil = True

    def __init__(self, backend: str = "lz4", level: int = 1, key_every: int = 256) -> None:
        from shmvec.codecs.byte import ByteCodec, LZ4Codec, ZstdCodec

        if key_every < 1:
            raise ValueError(f"key_every must be >= 1, got {key_every}")
        self.inner: ByteCodec
        if backend == "zstd":
            self.inner = ZstdCodec(level)
        elif backend == "lz4":
            self.inner = LZ4Codec()
        else:
            raise ValueError(f"delta backend must be 'zstd' or 'lz4', got {backend!r}")
        self.backend, self.level, self.key_every = backend, int(level), int(key_every)

    def params(self) -> dict[str, Any]:
        """``backend``, ``level`` (zstd only) and ``key_every``."""
        level = {"level": self.level} if self.backend == "zstd" else {}
        return {"backend": self.backend, **level, "key_every": self.key_every}

    def max_encoded_size(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """Header plus the backend's bound for a key frame (every word changed), in bytes."""
        words = -(-nbytes(shape, dtype) // 8)
        return _HEADER + self.inner.bound(8 * (words + 1))

    def new_stream(self, shape: tuple[int, ...], dtype: np.dtype) -> DeltaStream:
        """State for one env's leaf: the previous frame's words and scratch; begins with a key frame."""
        n = nbytes(shape, dtype)
        words = -(-n // 8)
        pad = np.zeros(words, np.uint64) if n % 8 else None
        return DeltaStream(np.zeros(words, np.uint64), np.zeros(words + 1, np.uint64), pad)

    def new_streams(self, n: int, shape: tuple[int, ...], dtype: np.dtype) -> list[DeltaStream]:
        """``n`` streams whose references and scratch are rows of two arrays, so that
        :meth:`decode_rows` decodes a batch in one numba call."""
        size = nbytes(shape, dtype)
        words = -(-size // 8)
        rows = _Rows(np.zeros((n, words), np.uint64), np.zeros((n, words + 1), np.uint64))
        pad = size % 8 != 0
        return [
            DeltaStream(rows.prev[i], rows.runs[i], np.zeros(words, np.uint64) if pad else None, rows=rows)
            for i in range(n)
        ]

    def decode_rows(
        self, data: np.ndarray, lengths: np.ndarray, rows: Sequence[int], out: np.ndarray, streams: list[Any]
    ) -> None:
        """As :meth:`Codec.decode_rows`. With lz4 and streams from one :meth:`new_streams`, one numba
        call applies the whole batch to the references and one numpy copy hands them out: per frame,
        the calls cost ~25 µs in the main process (8 Pong envs: 0.2 ms per batch step), mostly
        dispatch and views."""
        fused = self.backend == "lz4" and _fused()
        batch = streams[rows[0]].rows if len(rows) else None
        if (
            not fused
            or batch is None
            or not out.flags.c_contiguous
            or any(streams[i].rows is not batch for i in rows)
        ):
            # A stream replaced on its own (an env rebuilt in restart mode) is no row of the batch.
            super().decode_rows(data, lengths, rows, out, streams)
            return
        seqs = np.fromiter((streams[i].seq for i in rows), np.int64, len(rows))
        idx = np.asarray(rows, np.int64)
        k, status, seq = fused.decode_rows(data, lengths, idx, batch.prev, batch.runs, seqs)
        decoded = len(rows) if k < 0 else k
        for i, last in zip(rows[:decoded], seqs.tolist()):
            streams[i].seq = last
        flat = out.reshape(out.shape[0], -1).view(np.uint8)
        refs = batch.prev.view(np.uint8)
        if isinstance(rows, range) and rows.step == 1:  # the usual batch: one copy of a block
            flat[rows.start : rows.start + decoded] = refs[rows.start : rows.start + decoded, : flat.shape[1]]
        else:
            flat[idx[:decoded]] = refs[idx[:decoded], : flat.shape[1]]
        if k >= 0:
            exc = _fused_error(fused, status, seq, streams[rows[k]].seq)
            exc.row = rows[k]
            raise exc

    def restart(self, stream: DeltaStream) -> None:
        """Make the next frame of ``stream`` a key frame (called after the env resets)."""
        stream.need_key = True

    @staticmethod
    def _words(arr: np.ndarray, stream: DeltaStream) -> np.ndarray:
        if stream.pad is None and arr.flags.c_contiguous:  # the usual case, without byte_view's calls
            words = arr.reshape(-1).view(np.uint64)
            if words.flags.aligned:
                return words
        src = byte_view(arr)
        if stream.pad is None:
            words = src.view(np.uint64)
            if words.flags.aligned:  # the kernels want 8-byte aligned words
                return words
        if stream.pad is None:
            stream.pad = np.zeros(stream.prev.size, np.uint64)
        stream.pad.view(np.uint8)[: src.size] = src
        return stream.pad

    def encode(self, arr: np.ndarray, out: np.ndarray, stream: Any = None) -> int:
        """Encode one frame against the stream's previous one (a key frame when due); return bytes written.

        :raises CodecError: without a ``stream``.
        """
        if stream is None:
            raise CodecError("delta is stateful: pass a stream from new_stream() to encode/decode")
        cur = self._words(arr, stream)
        stream.seq = (stream.seq + 1) & _SEQ_MASK
        key = stream.need_key or stream.since_key >= self.key_every
        if key:
            stream.need_key, stream.since_key = False, 0
        stream.since_key += 1
        fused = self.backend == "lz4" and _fused()
        if fused:
            n = fused.encode_frame(cur, stream.prev, stream.runs, out, stream.seq, key, 1)
            if n < 0:
                raise CodecError(f"delta: the frame does not fit the {out.size}-byte buffer")
            return int(n)
        if key:
            kind, payload = _KEY, cur
            stream.prev[:] = cur
        else:
            kind = _DELTA
            payload = stream.runs[: _encode_runs(cur, stream.prev, stream.runs)]
        _HEAD.pack_into(out.data, 0, kind, stream.seq, payload.size * 8)
        return _HEADER + self.inner.compress_into(payload.view(np.uint8), out[_HEADER:])

    def decode(self, data: np.ndarray, out: np.ndarray, stream: Any = None) -> np.ndarray:
        """Rebuild one frame from ``data`` and the stream's previous frame into ``out``; return ``out``.

        :raises CodecError: without a ``stream``, or for a corrupt or out-of-sequence frame.
        """
        if stream is None:
            raise CodecError("delta is stateful: pass a stream from new_stream() to encode/decode")
        dst = out_bytes(out)
        fused = self.backend == "lz4" and _fused()
        if fused:
            status, seq = fused.decode_frame(data, stream.prev, stream.runs, stream.seq)
            if status:
                raise _fused_error(fused, status, seq, stream.seq)
        else:
            seq = self._decode_python(data, stream)
        stream.seq = seq
        dst[:] = stream.prev.view(np.uint8)[: dst.size]
        return out

    def _decode_python(self, data: np.ndarray, stream: DeltaStream) -> int:
        """Apply one frame to the stream's reference through the backend's Python binding (zstd, or
        lz4 where numba cannot link it); return the frame's counter."""
        if data.size < _HEADER:
            raise CodecError(_CORRUPT_HEADER)
        kind, seq, size = _HEAD.unpack_from(data.data, 0)
        if kind == _KEY and size == stream.prev.size * 8:
            self.inner.decompress_into(data[_HEADER:], stream.prev.view(np.uint8))
        elif kind == _DELTA and size <= stream.runs.size * 8 and size % 8 == 0:
            if stream.seq < 0 or seq != (stream.seq + 1) & _SEQ_MASK:
                raise CodecError(_LOST.format(seq=seq, last=stream.seq))
            self.inner.decompress_into(data[_HEADER:], stream.runs.view(np.uint8)[:size])
            if not _apply_runs(stream.runs, size // 8, stream.prev):
                raise CodecError(_CORRUPT_RUNS)
        else:
            raise CodecError(_CORRUPT_HEADER)
        return int(seq)
