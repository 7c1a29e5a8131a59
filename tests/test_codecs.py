"""Every codec round-trips what it accepts, refuses what it cannot take, and ShmVecEnv with a codec
returns exactly what DummyVecEnv returns."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from shmvec import CodecMismatchError, ShmVecEnv
from shmvec import codecs as C
from shmvec.codecs import CodecError
from shmvec.synthetic import SyntheticImageEnv
from tests.envs import make_dict_env
from tests.helpers import require, run_beside_dummy

LOSSLESS = [
    C.get("raw"),
    C.get("lz4"),
    C.get("zstd"),
    C.get("zstd", level=5),
    C.get("delta"),
    C.get("delta", backend="zstd"),
    C.get("delta", backend="lz4", key_every=7),
    C.get("png"),
] + ([C.get("webp", quality=101)] if "webp" in C.available() else [])


@pytest.fixture(scope="module")
def pong_frames():
    """~50 consecutive Pong frames, with an episode boundary (truncation at 30 steps) inside."""
    require("ale_py", 'pip install -e ".[atari]"')
    from shmvec.bench.envs import env_factory
    from shmvec.fidelity import collect_frames

    return collect_frames(env_factory("ALE/Pong-v5", max_episode_steps=30), 50)


def roundtrip(codec, frames, restart_at=()):
    frames = np.asarray(frames)
    shape, dtype = frames.shape[1:], frames.dtype
    codec.check(shape, dtype)
    buf = np.full(codec.max_encoded_size(shape, dtype), 0xAB, np.uint8)  # garbage past the data
    enc, dec = codec.new_stream(shape, dtype), codec.new_stream(shape, dtype)
    out = []
    for k, frame in enumerate(frames):
        if k in restart_at:
            codec.restart(enc)
        n = codec.encode(frame, buf, enc)
        assert 0 < n <= buf.size
        decoded = np.empty(shape, dtype)
        assert codec.decode(buf[:n].copy(), decoded, dec) is decoded
        out.append(decoded)
    return np.stack(out)


def _accepts(codec, shape, dtype) -> bool:
    try:
        codec.check(shape, np.dtype(dtype))
    except CodecError:
        return False
    return True


@pytest.mark.parametrize("codec", LOSSLESS, ids=repr)
def test_lossless_on_ale_frames(codec, pong_frames):
    np.testing.assert_array_equal(roundtrip(codec, pong_frames, restart_at={30}), pong_frames)


CASES = {
    "noise": lambda rng: rng.integers(0, 256, (6, 210, 160, 3), dtype=np.uint8),
    "zeros": lambda rng: np.zeros((4, 210, 160, 3), np.uint8),
    "odd_shape": lambda rng: rng.integers(0, 3, (5, 7, 13, 5), dtype=np.uint8),
    "one_byte": lambda rng: rng.integers(0, 256, (3, 1), dtype=np.uint8),
    "uint16": lambda rng: rng.integers(0, 65536, (4, 31, 17), dtype=np.uint16),
    "float32": lambda rng: rng.standard_normal((4, 9, 11, 3)).astype(np.float32),
    "float64_vec": lambda rng: rng.standard_normal((4, 5)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("codec", LOSSLESS, ids=repr)
def test_lossless_or_clear_refusal(codec, case):
    frames = CASES[case](np.random.default_rng(0))
    if case == "noise":  # slowly changing noise: deltas are incompressible too
        frames[1:, ::3] ^= 0x5A
    if not _accepts(codec, frames.shape[1:], frames.dtype):
        assert codec.name in ("png", "webp")
        with pytest.raises(CodecError, match=codec.name):
            codec.check(frames.shape[1:], frames.dtype)
        return
    np.testing.assert_array_equal(roundtrip(codec, frames), frames)


@pytest.mark.parametrize("name", ["jpeg", "webp"])
def test_lossy_codecs_refuse_what_they_cannot_encode(name):
    if name not in C.available():
        pytest.skip("OpenCV without WebP")
    codec = C.get(name)
    assert not codec.lossless
    with pytest.raises(CodecError, match="float32"):
        codec.check((8, 8, 3), np.dtype(np.float32))
    with pytest.raises(CodecError, match="use png or a byte codec|webp encodes"):
        codec.check((8, 8, 5), np.dtype(np.uint8))


def test_jpeg_changes_pixels_but_keeps_shape(pong_frames):
    decoded = roundtrip(C.get("jpeg", quality=5), pong_frames[:5])
    assert decoded.shape == pong_frames[:5].shape and decoded.dtype == np.uint8
    assert not np.array_equal(decoded, pong_frames[:5])


def test_delta_key_frames_and_lost_frames():
    codec = C.get("delta", backend="lz4", key_every=4)
    rng = np.random.default_rng(1)
    frames = np.cumsum(rng.integers(0, 2, (10, 16, 16), dtype=np.uint8), axis=0, dtype=np.uint8)
    shape, dtype = frames.shape[1:], frames.dtype
    buf = np.empty(codec.max_encoded_size(shape, dtype), np.uint8)
    enc, dec = codec.new_stream(shape, dtype), codec.new_stream(shape, dtype)
    kinds, out = [], np.empty(shape, dtype)
    for k, frame in enumerate(frames):
        if k == 5:
            codec.restart(enc)
        n = codec.encode(frame, buf, enc)
        kinds.append(int(buf[0]))
        codec.decode(buf[:n], out, dec)
        np.testing.assert_array_equal(out, frame)
    # key frames: first, every 4 since the last key, after the restart at 5
    assert [k for k, kind in enumerate(kinds) if kind == 1] == [0, 4, 5, 9]
    # A delta frame the decoder never saw: the next one is refused, not silently wrong.
    codec.encode(frames[0], buf, enc)
    n = codec.encode(frames[1], buf, enc)
    with pytest.raises(CodecError, match="lost"):
        codec.decode(buf[:n], out, dec)
    # A key frame brings the decoder back.
    codec.restart(enc)
    n = codec.encode(frames[2], buf, enc)
    np.testing.assert_array_equal(codec.decode(buf[:n], out, dec), frames[2])


def test_registry():
    assert {"raw", "lz4", "zstd", "delta", "png", "jpeg"} <= set(C.available())
    assert C.get("zstd", level=3) == C.get("zstd", level=3) != C.get("zstd", level=4)
    with pytest.raises(ValueError, match="unknown codec 'nope'.*available: raw"):
        C.get("nope")
    with pytest.raises(ValueError, match="level"):
        C.get("zstd", level=99)


def test_corrupt_bytes_are_an_error_not_garbage():
    for codec in (C.get("lz4"), C.get("zstd"), C.get("png")):
        frame = np.arange(3000, dtype=np.uint8).reshape(30, 100)
        buf = np.empty(codec.max_encoded_size(frame.shape, frame.dtype), np.uint8)
        n = codec.encode(frame, buf)
        with pytest.raises(CodecError):
            codec.decode(buf[: n // 2], np.empty_like(frame))


# ---------------------------------------------------------------- inside ShmVecEnv

IMAGE = functools.partial(SyntheticImageEnv, (24, 20, 3), episode_len=(3, 9))
DICT = functools.partial(make_dict_env, 12, 8)
ENV_CODECS = ["raw", "lz4", "zstd", "delta", "png", C.get("delta", backend="lz4", key_every=4)]
ENV_CODECS += [C.get("webp", quality=101)] if "webp" in C.available() else []


@pytest.mark.parametrize("codec", ENV_CODECS, ids=str)
def test_image_env_matches_dummy(no_leaks, codec):
    run_beside_dummy(IMAGE, 5, start_method="fork", n_workers=2, codec=codec, verify_every=1)


@pytest.mark.parametrize("codec", ["delta", "zstd", {"image": "png", "vec": "lz4"}], ids=str)
def test_dict_env_matches_dummy(no_leaks, codec):
    run_beside_dummy(DICT, 4, start_method="fork", n_workers=2, codec=codec, verify_every=1)


@pytest.mark.parametrize("copy", [True, False])
def test_without_copy_and_threads(no_leaks, copy):
    run_beside_dummy(IMAGE, 4, start_method="fork", n_workers=2, codec="delta", copy=copy, decode_threads=1)
    run_beside_dummy(IMAGE, 4, start_method="fork", n_workers=1, codec="delta", copy=copy, decode_threads=3)


def test_png_refuses_float_leaf_with_key(no_leaks):
    with pytest.raises(ValueError, match="key '(count|vec)'.*png cannot encode (int64|float32)"):
        ShmVecEnv([DICT] * 2, "fork", codec="png")
    with pytest.raises(ValueError, match="'nope', not an observation key"):
        ShmVecEnv([DICT] * 2, "fork", codec={"nope": "lz4"})


def test_lossy_codec_without_tolerance_is_refused(no_leaks):
    with pytest.raises(ValueError, match=r"JPEGCodec\(quality=50\).*'obs' is lossy.*tolerance="):
        ShmVecEnv([IMAGE] * 2, "fork", codec=C.get("jpeg", quality=50))


def _flip_byte(encode):
    """Wrap a codec's encode so that one byte of env 1's 4th encoded frame is flipped in the ring."""
    calls = {"n": 0}

    def flipped(self, arr, out, stream=None):
        n = encode(self, arr, out, stream)
        calls["n"] += 1
        if calls["n"] == 4:
            out[n // 2] ^= 0x01
        return n

    return flipped


def test_checksum_catches_a_corrupted_byte(no_leaks, monkeypatch):
    from shmvec.codecs.raw import RawCodec

    # Fork: the worker inherits the patched class; it encodes env 0, env 1 on reset, then on step.
    monkeypatch.setattr(RawCodec, "encode", _flip_byte(RawCodec.encode))
    fns = [functools.partial(SyntheticImageEnv, (8, 8, 3), episode_len=(50, 50))] * 2
    with ShmVecEnv(fns, "fork", n_workers=1, codec="raw", verify_every=1) as env:
        env.reset()
        with pytest.raises(CodecMismatchError, match=r"env 1, step 1, key 'obs'.*crc32") as info:
            env.step(np.zeros(2, np.int64))  # the 4th encoded frame: env 1's
    assert (info.value.env_index, info.value.step, info.value.key) == (1, 1, "obs")


def test_verify_every_zero_does_not_check(no_leaks, monkeypatch):
    """Unchecked, the flipped byte reaches the caller: env 1's observation differs from
    DummyVecEnv's in that one byte, by that one bit; env 0's is untouched."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec.codecs.raw import RawCodec

    monkeypatch.setattr(RawCodec, "encode", _flip_byte(RawCodec.encode))
    fns = [functools.partial(SyntheticImageEnv, (8, 8, 3), episode_len=(50, 50))] * 2
    ref = DummyVecEnv(fns)
    with ShmVecEnv(fns, "fork", n_workers=1, codec="raw", verify_every=0) as env:
        for venv in (env, ref):
            venv.seed(0)
            venv.reset()
        obs = env.step(np.zeros(2, np.int64))[0]  # corrupted, unnoticed: what verification is for
    want = ref.step(np.zeros(2, np.int64))[0]
    ref.close()
    np.testing.assert_array_equal(obs[0], want[0])
    flipped = (obs[1] ^ want[1]).ravel()
    middle = flipped.size // 2  # _flip_byte's byte of the 192 encoded
    assert np.flatnonzero(flipped).tolist() == [middle] and flipped[middle] == 0x01


def test_codecs_travel_to_forkserver_workers(no_leaks):
    # The codecs are pickled to the workers (zstd contexts are rebuilt there, numba kernels loaded).
    run_beside_dummy(DICT, 3, steps=20, start_method="forkserver", n_workers=2, codec="delta", verify_every=1)
