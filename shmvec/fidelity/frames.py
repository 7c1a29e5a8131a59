"""Codecs measured on a sequence of frames: :func:`check` (pixel errors, ratio, speed), :func:`compare`
(several codecs, optionally with the policy's view), and the frames and models to measure with."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shmvec.codecs import Codec, get
from shmvec.codecs.tolerance import errors
from shmvec.fidelity.loop import PolicyEffect, policy_effect


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass
class FidelityReport:
    """What one codec did to a sequence of frames (see :func:`check`).

    Throughputs are in MB/s (10^6 bytes of raw frame per second), one frame at a time, one thread.
    ``psnr_db`` is ``inf`` when the frames are bit-exact (``None`` in :meth:`to_dict`).
    """

    codec: str
    params: dict[str, Any]
    lossless: bool
    n_frames: int
    frame_bytes: int
    encoded_bytes: int
    bit_exact: bool
    max_abs_error: float
    mean_abs_error: float
    psnr_db: float
    compression_ratio: float
    encode_mb_s: float
    decode_mb_s: float
    us_per_frame: float  # encode + decode, microseconds
    policy: PolicyEffect | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (``psnr_db`` None when bit-exact)."""
        out = asdict(self)
        out["psnr_db"] = _finite(self.psnr_db)
        return out


def _as_codec(codec: str | Codec) -> Codec:
    return get(codec) if isinstance(codec, str) else codec


def roundtrip(
    codec: str | Codec, frames: np.ndarray | Sequence[np.ndarray]
) -> tuple[np.ndarray, int, float, float]:
    """Encode then decode ``frames`` as one stream; ``(decoded, encoded bytes, encode s, decode s)``."""
    codec = _as_codec(codec)
    frames = np.asarray(frames)
    shape, dtype = frames.shape[1:], frames.dtype
    codec.check(shape, dtype)
    buf = np.empty(codec.max_encoded_size(shape, dtype), np.uint8)
    enc_stream, dec_stream = codec.new_stream(shape, dtype), codec.new_stream(shape, dtype)
    decoded = np.empty_like(frames)
    out = np.empty(shape, dtype)  # reused, so the timing has no first-touch page faults in it
    total = 0
    t_enc = t_dec = 0.0
    clock = time.perf_counter
    for k in range(len(frames)):
        t0 = clock()
        n = codec.encode(frames[k], buf, enc_stream)
        t1 = clock()
        codec.decode(buf[:n], out, dec_stream)
        t_dec += clock() - t1
        t_enc += t1 - t0
        total += n
        decoded[k] = out
    return decoded, total, t_enc, t_dec


def check(codec: str | Codec, frames: np.ndarray | Sequence[np.ndarray], warmup: int = 5) -> FidelityReport:
    """Run ``codec`` over ``frames`` (one env's consecutive frames, as one stream) and measure it.

    :param codec: a registry name or a :class:`Codec`.
    :param frames: ``(n, *shape)`` array or sequence of equal-shape arrays.
    :param warmup: frames run first and not timed (JIT compilation, allocator warm-up; default 5).
    """
    codec = _as_codec(codec)
    frames = np.asarray(frames)
    if frames.ndim < 1 or len(frames) == 0:
        raise ValueError("check needs at least one frame")
    if warmup:
        roundtrip(codec, frames[:warmup])
    decoded, total, t_enc, t_dec = roundtrip(codec, frames)
    max_abs, mean_abs, _, psnr = errors(frames, decoded)
    raw_bytes = frames.nbytes
    return FidelityReport(
        codec=codec.name,
        params=codec.params(),
        lossless=codec.lossless,
        n_frames=len(frames),
        frame_bytes=frames[0].nbytes,
        encoded_bytes=total,
        bit_exact=bool(np.array_equal(frames, decoded)),
        max_abs_error=max_abs,
        mean_abs_error=mean_abs,
        psnr_db=psnr,
        compression_ratio=raw_bytes / max(total, 1),
        encode_mb_s=raw_bytes / 1e6 / max(t_enc, 1e-12),
        decode_mb_s=raw_bytes / 1e6 / max(t_dec, 1e-12),
        us_per_frame=(t_enc + t_dec) / len(frames) * 1e6,
    )


def collect_frames(env_fn: Callable[[], Any], steps: int, seed: int = 0) -> np.ndarray:
    """``steps`` consecutive observations of one env under random actions (auto-reset), stacked.

    :param env_fn: zero-argument env factory (see :func:`shmvec.bench.envs.env_factory`); its
        observation space must be a Box.
    """
    env = env_fn()
    try:
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        frames = np.empty((steps, *np.shape(obs)), np.asarray(obs).dtype)
        for k in range(steps):
            frames[k] = obs
            obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                obs, _ = env.reset()
    finally:
        env.close()
    return frames


def compare(codecs: Sequence[str | Codec], frames: np.ndarray, policy: Any = None) -> list[FidelityReport]:
    """:func:`check` each codec on ``frames`` (and :func:`policy_effect` when a policy is given)."""
    reports = []
    for c in codecs:
        report = check(c, frames)
        if policy is not None:
            decoded = roundtrip(c, frames)[0]
            report.policy = policy_effect(policy, frames, decoded)
        reports.append(report)
    return reports


def candidate_codecs(frame_shape: tuple[int, ...], dtype: np.dtype) -> list[Codec]:
    """The codecs the ``shmvec codecs`` command compares by default, those that can take this frame."""
    from shmvec.codecs import available

    candidates: list[Codec] = []
    for name in available():
        if name == "jpeg":
            candidates += [get("jpeg", quality=q) for q in (95, 75, 30, 5)]
        elif name == "delta":
            candidates += [get("delta", backend="lz4"), get("delta", backend="zstd")]
        elif name == "webp":
            candidates += [get("webp", quality=101), get("webp", quality=75)]
        else:
            candidates.append(get(name))
    out = []
    for c in candidates:
        try:
            c.check(frame_shape, dtype)
        except ValueError:
            continue
        out.append(c)
    return out


def load_model(path: str, algo: str = "ppo") -> Any:
    """Load a saved SB3 model (``algo``: ppo, a2c or dqn) on the CPU, for :func:`policy_effect`."""
    import stable_baselines3 as sb3

    classes: dict[str, Any] = {"ppo": sb3.PPO, "a2c": sb3.A2C, "dqn": sb3.DQN}
    if algo not in classes:
        raise ValueError(f"unknown algorithm {algo!r}; choose from {', '.join(classes)}")
    return classes[algo].load(path, device="cpu")
