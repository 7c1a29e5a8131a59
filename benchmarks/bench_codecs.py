"""Codec benchmarks, not part of the default test run:

    python -m pytest benchmarks/bench_codecs.py --benchmark-only
    python -m pytest benchmarks/bench_codecs.py -k interleaved -s

- per-frame encode + decode time of each codec on 400 raw frames (210x160x3) of Pong, Breakout and
  MsPacman, random actions, one frame at a time, one thread; bit-exactness and the compression
  ratio are asserted (delta >= 150x with zstd, >= 100x with lz4: deterministic, unlike the times,
  which are measured and reported, never asserted) and the ratio stored in ``extra_info``;
- ShmVecEnv on Pong raw frames, n_envs=8: one batch step with ``codec=None``, ``"delta"`` (default
  threads) and ``"delta"`` with ``decode_threads=1``;
- the same three, interleaved over several repeats, steps/s with spread and per-repeat ratios to raw
  (printed: the second command; it measures steps/s itself, so ``--benchmark-only`` skips it).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

pytest.importorskip("ale_py", reason='ALE is not installed (pip install -e ".[atari]")')

from shmvec import codecs as C  # noqa: E402
from shmvec.bench.envs import env_factory  # noqa: E402
from shmvec.fidelity import collect_frames, roundtrip  # noqa: E402

GAMES = ["Pong", "Breakout", "MsPacman"]
CODECS = {
    "lz4": C.get("lz4"),
    "zstd": C.get("zstd"),
    "delta-lz4": C.get("delta", backend="lz4"),
    "delta-zstd": C.get("delta", backend="zstd"),
}
RATIO_TARGET = {"delta-lz4": 100, "delta-zstd": 150}


@pytest.fixture(scope="module", params=GAMES)
def game_frames(request):
    return request.param, collect_frames(env_factory(f"ALE/{request.param}-v5"), 400, seed=0)


@pytest.mark.parametrize("name", sorted(CODECS))
def test_codec_roundtrip(benchmark, game_frames, name):
    game, frames = game_frames
    codec = CODECS[name]
    decoded, total, _, _ = roundtrip(codec, frames)
    assert np.array_equal(decoded, frames)
    ratio = frames.nbytes / total
    benchmark.extra_info.update(game=game, codec=repr(codec), ratio=round(ratio, 1))
    if name in RATIO_TARGET:
        assert ratio >= RATIO_TARGET[name], f"{name} on {game}: {ratio:.0f}x"

    shape, dtype = frames.shape[1:], frames.dtype
    buf = np.empty(codec.max_encoded_size(shape, dtype), np.uint8)
    out = np.empty(shape, dtype)
    enc, dec = codec.new_stream(shape, dtype), codec.new_stream(shape, dtype)
    k = [0]

    def one_frame():  # the frames in order, as an env produces them (delta needs the order)
        frame = frames[k[0] % len(frames)]
        k[0] += 1
        n = codec.encode(frame, buf, enc)
        codec.decode(buf[:n], out, dec)

    benchmark.pedantic(one_frame, rounds=len(frames) * 2, warmup_rounds=len(frames) // 4)


def _make_env(codec, decode_threads=None):
    from shmvec import ShmVecEnv

    fns = [env_factory("ALE/Pong-v5")] * 8
    return ShmVecEnv(fns, "fork", codec=codec, decode_threads=decode_threads)


VARIANTS = {"raw": (None, None), "delta": ("delta", None), "delta-1thread": ("delta", 1)}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_shmvec_pong_step(benchmark, variant):
    env = _make_env(*VARIANTS[variant])
    try:
        env.seed(0)
        env.reset()
        rng = np.random.default_rng(0)
        actions = [rng.integers(0, env.action_space.n, 8) for _ in range(64)]
        k = [0]

        def step():
            env.step(actions[k[0] % 64])
            k[0] += 1

        benchmark.pedantic(step, rounds=600, warmup_rounds=30)
        benchmark.extra_info["env_steps_per_s"] = round(8 / benchmark.stats["median"])
    finally:
        env.close()


def _steps_per_s(env, seconds: float, seed: int) -> float:
    """Env steps/s of random actions over ``seconds`` of stepping, after a short warm-up."""
    env.seed(seed)
    env.reset()
    rng = np.random.default_rng(seed)
    actions = [rng.integers(0, env.action_space.n, env.num_envs) for _ in range(64)]
    for k in range(20):
        env.step(actions[k % 64])
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[n % 64])
        n += 1
    return n * env.num_envs / (time.perf_counter() - start)


def test_shmvec_pong_interleaved():
    """steps/s of raw / delta / delta with one decode thread, interleaved so that a disturbance of the
    shared machine hits all three alike; prints medians, ranges and per-round ratios."""
    repeats, seconds = 7, 3.0
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(repeats):
        for variant, args in VARIANTS.items():
            env = _make_env(*args)
            try:
                samples[variant].append(_steps_per_s(env, seconds, seed=r))
            finally:
                env.close()
    print(f"\nShmVecEnv Pong raw n_envs=8, {repeats} interleaved repeats x {seconds:g} s, steps/s:")
    for variant, xs in samples.items():
        print(
            f"  {variant:<14} median {statistics.median(xs):>7,.0f}  min {min(xs):>7,.0f}  max {max(xs):>7,.0f}"
        )
    for variant in ("delta", "delta-1thread"):
        ratios = [a / b for a, b in zip(samples[variant], samples["raw"])]
        print(
            f"  {variant} / raw: median {statistics.median(ratios):.3f} "
            f"(per-repeat {min(ratios):.3f}-{max(ratios):.3f})"
        )
    print("  steps/s per repeat:", {k: [round(x) for x in v] for k, v in samples.items()})
    from shmvec.bench import host

    print(f"  {host.describe(host.wake_up_us())}.")
