"""The delta codec's kernels against plain numpy, its defaults, and a corrupt run refused."""

from __future__ import annotations

import numpy as np
import pytest

from shmvec import codecs as C
from shmvec.codecs import CodecError
from shmvec.codecs.delta import _BLOCK, _DELTA, _HEAD, _HEADER, _encode_runs
from shmvec.engine import options as options_module
from shmvec.engine.options import Options
from tests.helpers import require


def require_fused():
    """:mod:`shmvec.codecs.fused`, where numba and lz4 are installed (else a skip, or a failure in
    CI). With both installed, lz4's library must load into numba: that it cannot is a failure, not a
    reason to skip."""
    require("numba", 'pip install -e ".[codecs]"')
    require("lz4.block", 'pip install -e ".[codecs]"')
    from shmvec.codecs import fused

    assert fused.AVAILABLE, "numba and lz4 are installed, but lz4's library cannot be loaded into numba"
    return fused


def reference_runs(cur: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """The runs format, one word at a time in Python: (skip << 32 | length), then the XORed words."""
    out, w, last = [], 0, 0
    changed = cur != prev
    while w < cur.size:
        if not changed[w]:
            w += 1
            continue
        start = w
        while w < cur.size and changed[w]:
            w += 1
        out.append(((start - last) << 32) | (w - start))
        out.extend(int(x) for x in cur[start:w] ^ prev[start:w])
        last = w
    return np.array(out, np.uint64)


# Word counts around the block size; changes at block edges, in the last word, spanning blocks.
CASES = [
    (1, [0]),
    (_BLOCK, [_BLOCK - 1]),
    (_BLOCK + 1, [_BLOCK]),
    (3 * _BLOCK + 5, [0, _BLOCK - 1, _BLOCK, 2 * _BLOCK + 3, 3 * _BLOCK + 4]),
    (4 * _BLOCK, list(range(_BLOCK - 3, 2 * _BLOCK + 2))),  # one run across a block boundary
    (5 * _BLOCK + 7, []),
    (100, list(range(0, 100, 2))),  # worst case: every other word
]


@pytest.mark.parametrize(("words", "changed"), CASES)
def test_encode_runs_matches_reference(words, changed):
    rng = np.random.default_rng(words)
    prev = rng.integers(0, 2**63, words, dtype=np.uint64)
    cur = prev.copy()
    for w in changed:
        cur[w] ^= np.uint64(1 + w)
    expected = reference_runs(cur, prev)
    kept = prev.copy()
    runs = np.zeros(words + 1, np.uint64)
    m = _encode_runs(cur, kept, runs)
    assert np.array_equal(runs[:m], expected)
    assert np.array_equal(kept, cur)  # the encoder's reference is now the new frame


@pytest.mark.parametrize("backend", ["lz4", "zstd"])
def test_random_changes_roundtrip_exactly(backend):
    """Frames of an odd byte count (padded) with a few random changes each, key frame every 5."""
    codec = C.get("delta", backend=backend, key_every=5)
    shape = (37, 53, 3)
    rng = np.random.default_rng(1)
    frame = rng.integers(0, 256, shape, dtype=np.uint8)
    enc, dec = codec.new_stream(shape, np.uint8), codec.new_stream(shape, np.uint8)
    buf = np.empty(codec.max_encoded_size(shape, np.uint8), np.uint8)
    out = np.empty(shape, np.uint8)
    for _ in range(40):
        flat = frame.reshape(-1)
        flat[rng.integers(0, flat.size, rng.integers(0, 50))] = rng.integers(0, 256, dtype=np.uint8)
        n = codec.encode(frame, buf, enc)
        codec.decode(buf[:n], out, dec)
        assert np.array_equal(out, frame)


def test_default_backend_is_lz4():
    assert C.get("delta").params()["backend"] == "lz4"
    assert C.get("delta", backend="zstd").params() == {"backend": "zstd", "level": 1, "key_every": 256}


def test_runs_past_the_frame_are_refused():
    codec = C.get("delta")
    shape = (16,)
    enc, dec = codec.new_stream(shape, np.uint8), codec.new_stream(shape, np.uint8)
    buf = np.empty(codec.max_encoded_size(shape, np.uint8), np.uint8)
    out = np.empty(shape, np.uint8)
    n = codec.encode(np.zeros(shape, np.uint8), buf, enc)
    codec.decode(buf[:n], out, dec)  # a key frame: seq 0
    runs = np.array([(5 << 32) | 1, 7], np.uint64)  # skip 5 words of a 2-word frame
    _HEAD.pack_into(buf.data, 0, _DELTA, 1, runs.nbytes)
    n = _HEADER + codec.inner.compress_into(runs.view(np.uint8), buf[_HEADER:])
    with pytest.raises(CodecError, match="corrupt runs"):
        codec.decode(buf[:n], out, dec)


@pytest.mark.parametrize(("cpus", "threads"), [(1, 1), (2, 1), (3, 3), (8, 8)])
def test_decode_threads_default_follows_usable_cpus(monkeypatch, cpus, threads):
    monkeypatch.setattr(options_module, "usable_cpus", lambda: cpus)
    opts = Options()
    assert opts.decode_threads_for((C.get("delta"),)) == threads
    assert opts.decode_threads_for(None) == 1


def test_fused_lz4_path_writes_and_reads_the_python_paths_bytes(monkeypatch):
    """numba calling lz4 itself (shmvec.codecs.fused) and the Python path make the same bytes, and
    each decodes the other's."""
    from shmvec.codecs import delta

    require_fused()
    codec = C.get("delta", key_every=6)
    shape = (21, 16, 3)
    rng = np.random.default_rng(2)
    frames = np.repeat(rng.integers(0, 256, (1, *shape), dtype=np.uint8), 15, axis=0)
    for k in range(1, len(frames)):
        frames[k:, k % 21, k % 16] += np.uint8(k)

    def encode_all(use_fused):
        monkeypatch.setattr(delta, "_FUSED", None if use_fused else False)
        stream = codec.new_stream(shape, np.uint8)
        buf = np.zeros(codec.max_encoded_size(shape, np.uint8), np.uint8)
        return [buf[: codec.encode(f, buf, stream)].copy() for f in frames]

    fast, slow = encode_all(True), encode_all(False)
    assert len(fast) == len(slow) and all(np.array_equal(a, b) for a, b in zip(fast, slow))
    for use_fused, encoded in ((True, slow), (False, fast)):
        monkeypatch.setattr(delta, "_FUSED", None if use_fused else False)
        stream, out = codec.new_stream(shape, np.uint8), np.empty(shape, np.uint8)
        for frame, data in zip(frames, encoded):
            assert np.array_equal(codec.decode(data, out, stream), frame)


@pytest.mark.parametrize("use_fused", [True, False])
def test_both_paths_refuse_lost_and_corrupt_frames(monkeypatch, use_fused):
    from shmvec.codecs import delta

    monkeypatch.setattr(delta, "_FUSED", None if use_fused else False)
    codec = C.get("delta")
    shape = (64,)
    enc = codec.new_stream(shape, np.uint8)
    buf = np.zeros(codec.max_encoded_size(shape, np.uint8), np.uint8)
    frames = [np.full(shape, k, np.uint8) for k in range(3)]
    data = [buf[: codec.encode(f, buf, enc)].copy() for f in frames]
    out = np.empty(shape, np.uint8)
    with pytest.raises(CodecError, match="lost"):  # a delta with no key frame before it
        codec.decode(data[1], out, codec.new_stream(shape, np.uint8))
    dec = codec.new_stream(shape, np.uint8)
    codec.decode(data[0], out, dec)
    with pytest.raises(CodecError, match="frame 2 follows frame 0"):
        codec.decode(data[2], out, dec)
    with pytest.raises(CodecError, match="corrupt frame header"):
        codec.decode(data[1][:5], out, dec)
    bad = data[1].copy()
    bad[0] = 7  # neither a key frame nor a delta
    with pytest.raises(CodecError, match="corrupt frame header"):
        codec.decode(bad, out, dec)
    bad = data[1].copy()
    bad[_HEADER:] = 0xFF  # the payload
    with pytest.raises(CodecError, match="corrupt"):
        codec.decode(bad, out, dec)
    assert np.array_equal(codec.decode(data[1], out, dec), frames[1])  # the stream is still in step


def _encoded_batches(codec, shape, dtype, n_envs, n_steps, seed=3, rows_at=None):
    """Per step: (frames, data, lengths, rows) of ``n_envs`` envs, each with its own encoding stream;
    the envs of ``rows_at(step)`` (default: all) change a few values and are encoded, the others keep
    their frame and send nothing (length 0), as envs outside a pool-mode batch; env 2's stream
    restarts (a key frame) at step 3."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 200, (n_envs, *shape)).astype(dtype)
    streams = [codec.new_stream(shape, np.dtype(dtype)) for _ in range(n_envs)]
    size = codec.max_encoded_size(shape, np.dtype(dtype))
    out = []
    for step in range(n_steps):
        rows = range(n_envs) if rows_at is None else rows_at(step)
        flat = frames.reshape(n_envs, -1)
        idx = np.asarray(rows, np.int64)
        flat[idx, rng.integers(0, flat.shape[1], len(idx))] += 1
        if step == 3:
            codec.restart(streams[2])
        data, lengths = np.zeros((n_envs, size), np.uint8), np.zeros(n_envs, np.int64)
        for i in rows:
            lengths[i] = codec.encode(frames[i], data[i], streams[i])
        out.append((frames.copy(), data, lengths, rows))
    return out


# The rows decoded at each step: a whole batch (one block copy), and subsets that skip rows.
SUBSETS = [range(4), [1, 3], [0, 2, 3], [2], range(1, 3)]


@pytest.mark.parametrize(("shape", "dtype"), [((21, 16, 3), np.uint8), ((5, 3), np.float32), ((), np.int64)])
def test_decode_rows_of_a_batch_equal_the_frames_and_per_frame_decoding(shape, dtype):
    """DeltaCodec.decode_rows (one numba call per batch with lz4) against Codec.decode_rows's
    per-frame loop: the same frames, bit for bit, in the rows asked for, whole batches and subsets;
    the rows not asked for are left as they were."""
    from shmvec.codecs.base import Codec

    require_fused()
    codec, n = C.get("delta", key_every=5), 4
    fast, slow = codec.new_streams(n, shape, np.dtype(dtype)), codec.new_streams(n, shape, np.dtype(dtype))
    assert all(s.rows is fast[0].rows for s in fast)
    untouched = np.full(shape, 77, dtype)
    batches = _encoded_batches(codec, shape, dtype, n, 15, rows_at=lambda step: SUBSETS[step % len(SUBSETS)])
    for step, (frames, data, lengths, rows) in enumerate(batches):
        got, want = np.full((n, *shape), 77, dtype), np.full((n, *shape), 77, dtype)
        codec.decode_rows(data, lengths, rows, got, fast)
        Codec.decode_rows(codec, data, lengths, rows, want, slow)
        assert got.tobytes() == want.tobytes(), step
        for i in range(n):
            expected = frames[i] if i in rows else untouched
            assert got[i].tobytes() == expected.tobytes(), (step, i, list(rows))
        assert [s.seq for s in fast] == [s.seq for s in slow]


def test_decode_rows_names_the_row_that_failed_and_falls_back_for_a_replaced_stream(monkeypatch):
    fused = require_fused()
    codec, n, shape = C.get("delta"), 4, (64,)
    batches = _encoded_batches(codec, shape, np.uint8, n, 3)
    streams = codec.new_streams(n, shape, np.dtype(np.uint8))
    out = np.zeros((n, *shape), np.uint8)
    frames, data, lengths, _ = batches[0]
    codec.decode_rows(data, lengths, range(n), out, streams)
    frames, data, lengths, _ = batches[2]  # step 1 skipped: every row's delta follows a lost frame
    data[1, 0] = 7  # row 1's header is corrupt as well, but row 0 fails first
    with pytest.raises(CodecError, match="frame 2 follows frame 0") as caught:
        codec.decode_rows(data, lengths, range(n), out, streams)
    assert caught.value.row == 0
    # An env rebuilt on its own (Reader.restart) gets a stream that is no row of the batch: the
    # per-frame loop decodes the batch, and row 2's delta is refused there, named by its row.
    streams[2] = codec.new_stream(shape, np.dtype(np.uint8))
    batched = []
    monkeypatch.setattr(fused, "decode_rows", lambda *a: batched.append(a) or (-1, 0, 0))
    frames, data, lengths, _ = batches[1]
    with pytest.raises(CodecError, match="lost") as caught:
        codec.decode_rows(data, lengths, range(n), out, streams)
    assert caught.value.row == 2 and batched == []
    assert out[:2].tobytes() == frames[:2].tobytes(), "the rows before it were decoded"
