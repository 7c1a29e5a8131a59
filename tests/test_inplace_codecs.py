"""Codecs that encode and decode in place (:mod:`shmvec.codecs.clib`, the Reader's decoded slots):
bit-exact round trips, interchangeable with the Python bindings' formats, and no allocation per
frame (counted with tracemalloc)."""

from __future__ import annotations

import functools
import tracemalloc
import zlib

import numpy as np
import pytest

from shmvec import ShmVecEnv
from shmvec import codecs as C
from shmvec.codecs import clib
from shmvec.codecs.base import CodecError
from shmvec.synthetic import SyntheticImageEnv
from tests.helpers import require

for _module in ("lz4.block", "zstandard", "numba"):  # a skip here, a failure in CI
    require(_module, 'pip install -e ".[codecs]"')

SHAPE = (210, 160, 3)  # an Atari frame: 100,800 bytes
CODECS = {
    "lz4": lambda: C.get("lz4"),
    "zstd": lambda: C.get("zstd"),
    "delta-zstd": lambda: C.get("delta", key_every=4),
    "delta-lz4": lambda: C.get("delta", backend="lz4", key_every=4),
}


def frames(kind: str, n: int, seed: int = 0) -> list[np.ndarray]:
    """``noise``: incompressible (the worst case for the output size); ``atari``: mostly constant with a
    few moving blocks, as consecutive game frames are."""
    rng = np.random.default_rng(seed)
    if kind == "noise":
        return [rng.integers(0, 256, SHAPE, dtype=np.uint8) for _ in range(n)]
    base = np.full(SHAPE, 90, np.uint8)
    out = []
    for t in range(n):
        frame = base.copy()
        y, x = rng.integers(0, SHAPE[0] - 8), rng.integers(0, SHAPE[1] - 8)
        frame[y : y + 8, x : x + 8] = 236
        frame[t % SHAPE[0]] = t
        out.append(frame)
    return out


def test_native_functions_are_found():
    """The wheels installed with ``shmvec[codecs]`` export the C functions; if a new release hid them,
    the codecs would silently fall back to the copying path."""
    assert clib.lz4() is not None
    assert clib.zstd() is not None


@pytest.mark.parametrize("size", [1, 7, 4096, 100_800])
def test_byte_codecs_interoperate_with_the_bindings(size):
    """What the in-place path writes, the Python bindings read, and the other way round."""
    import lz4.block
    import zstandard

    rng = np.random.default_rng(size)
    for src in (rng.integers(0, 256, size, dtype=np.uint8), np.zeros(size, np.uint8)):
        for codec, compress, decompress in (
            (C.get("lz4"), lambda b: lz4.block.compress(b, store_size=False), None),
            (C.get("zstd"), zstandard.ZstdCompressor(level=1).compress, None),
        ):
            buf = np.zeros(codec.max_encoded_size(src.shape, src.dtype), np.uint8)
            n = codec.compress_into(src, buf)
            theirs = codec.decompress(buf[:n], size)  # the bindings' own decompression
            assert theirs == src.tobytes()
            packed = np.frombuffer(compress(src), np.uint8)
            out = np.full(size, 1, np.uint8)
            codec.decompress_into(packed, out)
            np.testing.assert_array_equal(out, src)
            del decompress


@pytest.mark.parametrize("name", sorted(CODECS))
@pytest.mark.parametrize("kind", ["noise", "atari"])
def test_round_trip_is_exact_and_allocates_nothing_per_frame(name, kind):
    """Encode + decode of 40 frames in order (delta: a key frame every 4): bit-exact, and the most
    memory Python allocates at once per frame stays under 16 KiB (small call objects): a frame is
    100,800 bytes, so any frame-sized buffer (a ``bytes`` result, a fresh array) fails this."""
    codec = CODECS[name]()
    seq = frames(kind, 45)
    shape, dtype = seq[0].shape, seq[0].dtype
    buf = np.zeros(codec.max_encoded_size(shape, dtype), np.uint8)
    out = np.zeros(shape, dtype)
    enc, dec = codec.new_stream(shape, dtype), codec.new_stream(shape, dtype)
    for frame in seq[:5]:  # warm-up: numba dispatch, per-thread contexts
        codec.decode(buf[: codec.encode(frame, buf, enc)], out, dec)
        np.testing.assert_array_equal(out, frame)
    peaks = []
    tracemalloc.start()
    try:
        for frame in seq[5:]:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            codec.decode(buf[: codec.encode(frame, buf, enc)], out, dec)
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
            assert zlib.crc32(out) == zlib.crc32(frame)  # np.array_equal would allocate a frame of bools
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, seq[-1])
    assert max(peaks) < 16384, f"{name} allocated up to {max(peaks)} bytes per {kind} frame"


@pytest.mark.parametrize("name", ["lz4", "zstd"])
def test_corrupt_data_is_a_codec_error(name):
    codec = CODECS[name]()
    src = frames("atari", 1)[0].reshape(-1)
    buf = np.zeros(codec.max_encoded_size(src.shape, src.dtype), np.uint8)
    n = codec.compress_into(src, buf)
    out = np.zeros_like(src)
    with pytest.raises(CodecError, match=name):
        codec.decompress_into(buf[: n // 2], out)  # truncated
    with pytest.raises(CodecError, match=name):
        codec.decompress_into(np.full(64, 0xFF, np.uint8), out)  # garbage
    with pytest.raises(CodecError, match=name):
        codec.compress_into(frames("noise", 1)[0].reshape(-1), np.zeros(100, np.uint8))  # does not fit


def test_decoded_batches_are_lent_not_allocated(no_leaks):
    """With a codec and copy=True, the main process decodes into slots it lends like raw ring slots:
    no step allocates a batch-sized array (a few KiB of small objects per step remain), and a batch
    the caller keeps is never written again."""
    fn = functools.partial(SyntheticImageEnv, (96, 80, 3), episode_len=(400, 500))
    venv = ShmVecEnv([fn] * 4, "fork", n_workers=2, codec="delta", decode_threads=1)
    try:
        venv.reset()
        actions = np.zeros(4, np.int64)
        for _ in range(5):
            obs, _, _, _ = venv.step(actions)
        transient = []
        tracemalloc.start()
        try:
            for _ in range(10):  # as SB3 steps: the previous batch is still referenced meanwhile
                before = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                obs, _, _, _ = venv.step(actions)
                transient.append(tracemalloc.get_traced_memory()[1] - before)
        finally:
            tracemalloc.stop()
        assert max(transient) < obs.nbytes // 4, f"{transient} bytes for {obs.nbytes}-byte batches"
        assert venv.copy_fallbacks == 0
        kept, snapshot = obs, obs.copy()
        for _ in range(6):
            obs, _, _, _ = venv.step(actions)
            assert not np.shares_memory(kept, obs)
        np.testing.assert_array_equal(kept, snapshot)
    finally:
        venv.close()
