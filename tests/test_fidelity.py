"""fidelity.check measures what it claims, lossy codecs in ShmVecEnv are checked against the user's
tolerance, and the policy-level probe sees no change for lossless codecs and some for coarse JPEG."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest

from shmvec import FidelityError, FidelityWarning, ShmVecEnv
from shmvec import codecs as C
from shmvec.codecs import Tolerance
from shmvec.fidelity import check, collect_frames, policy_effect, roundtrip
from shmvec.synthetic import SyntheticImageEnv
from tests.envs import TinyImageEnv


@pytest.fixture(scope="module")
def frames():
    return collect_frames(functools.partial(SyntheticImageEnv, (40, 32, 3), episode_len=(5, 20)), 40)


def test_lossless_report(frames):
    report = check("delta", frames)
    assert report.bit_exact and report.lossless
    assert report.max_abs_error == report.mean_abs_error == 0 and math.isinf(report.psnr_db)
    assert report.compression_ratio > 5  # one row changes per step
    assert report.encode_mb_s > 0 and report.decode_mb_s > 0 and report.us_per_frame > 0
    d = report.to_dict()
    assert d["psnr_db"] is None and d["params"]["backend"] == "lz4"
    json.dumps(d)


def test_lossy_report_agrees_with_a_direct_computation(frames):
    report = check(C.get("jpeg", quality=10), frames)
    decoded = roundtrip(C.get("jpeg", quality=10), frames)[0]
    diff = np.abs(decoded.astype(float) - frames)
    assert not report.bit_exact and not report.lossless
    assert report.max_abs_error == diff.max() > 0
    assert report.mean_abs_error == pytest.approx(diff.mean())
    assert report.psnr_db == pytest.approx(10 * np.log10(255**2 / np.mean(diff**2)))


def test_tolerance_needs_a_bound():
    with pytest.raises(ValueError, match="min_psnr_db or max_abs_error"):
        Tolerance()
    assert Tolerance(max_abs_error=3).breach(4, 50) == "max abs error 4 > 3"
    assert Tolerance(min_psnr_db=30).breach(100, 29.5) == "PSNR 29.5 dB < 30 dB"
    assert Tolerance(min_psnr_db=30, max_abs_error=9).breach(9, 30) is None


TEXTURED = functools.partial(SyntheticImageEnv, (32, 32, 3), episode_len=(4, 9), texture=True)


def test_lossy_codec_in_env_raises_or_warns(no_leaks):
    jpeg = C.get("jpeg", quality=5)
    strict = Tolerance(min_psnr_db=60)
    with (
        ShmVecEnv([TEXTURED] * 2, "fork", codec=jpeg, tolerance=strict) as env,
        pytest.raises(FidelityError, match=r"env 0, step 0, key 'obs'.*PSNR .* < 60 dB"),
    ):
        env.reset()
    tolerance = Tolerance(max_abs_error=1, on_breach="warn")
    with (
        ShmVecEnv([TEXTURED] * 2, "fork", codec=jpeg, tolerance=tolerance, verify_every=1) as env,
        pytest.warns(FidelityWarning, match="max abs error"),
    ):
        env.reset()
        env.step(np.zeros(2, np.int64))


def test_lossy_codec_within_tolerance_changes_pixels_quietly(no_leaks):
    from stable_baselines3.common.vec_env import DummyVecEnv

    # Flat Atari-like frames: JPEG keeps them close. (Per-pixel colour noise, above, it cannot:
    # chroma subsampling alone puts it near 12 dB whatever the quality.)
    flat = functools.partial(SyntheticImageEnv, (32, 32, 3), episode_len=(4, 9))
    ref = DummyVecEnv([flat] * 2)
    ref.seed(0)
    tolerance = Tolerance(min_psnr_db=30)
    with ShmVecEnv([flat] * 2, "fork", codec="jpeg", tolerance=tolerance, verify_every=1) as env:
        env.seed(0)
        assert_close(env.reset(), ref.reset())
        for _ in range(12):
            got, want = env.step(np.zeros(2, np.int64)), ref.step(np.zeros(2, np.int64))
            assert_close(got[0], want[0])
            np.testing.assert_array_equal(got[2], want[2])
    ref.close()


def assert_close(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.abs(got.astype(int) - want).mean() < 3


@pytest.fixture(scope="module")
def small_cnn_model():
    from stable_baselines3 import PPO

    env = TinyImageEnv()
    return PPO("CnnPolicy", env, seed=0, n_steps=16, batch_size=16, device="cpu")


@pytest.fixture(scope="module")
def tiny_frames():
    rng = np.random.default_rng(0)
    f = collect_frames(TinyImageEnv, 40)
    # Some texture, so a coarse JPEG has something to get wrong.
    return np.clip(f.astype(int) + rng.integers(-40, 40, f.shape), 0, 255).astype(np.uint8)


def test_policy_effect_zero_for_lossless(small_cnn_model, tiny_frames):
    for codec in ("delta", "png"):
        effect = policy_effect(small_cnn_model, tiny_frames, roundtrip(codec, tiny_frames)[0])
        assert effect.action_change_rate == 0 and effect.max_value_change == 0 and effect.mean_kl == 0
        assert effect.n_frames == len(tiny_frames)


def test_policy_effect_nonzero_for_coarse_jpeg(small_cnn_model, tiny_frames):
    decoded = roundtrip(C.get("jpeg", quality=5), tiny_frames)[0]
    effect = policy_effect(small_cnn_model, tiny_frames, decoded)
    assert effect.max_value_change is not None and effect.max_value_change > 0
    assert effect.mean_kl is not None and effect.mean_kl > 0


def test_policy_effect_with_a_callable(tiny_frames):
    def policy(batch):
        brightness = batch.reshape(len(batch), -1).mean(axis=1)
        logits = np.stack([brightness / 50, -brightness / 50], axis=1)
        probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        return {"action": (brightness > 60).astype(int), "value": brightness, "probs": probs}

    same = policy_effect(policy, tiny_frames, tiny_frames.copy())
    assert (same.action_change_rate, same.max_value_change, same.mean_kl) == (0, 0, 0)
    shifted = policy_effect(
        policy, tiny_frames, np.clip(tiny_frames.astype(int) + 30, 0, 255).astype(np.uint8)
    )
    assert shifted.max_value_change > 0 and shifted.mean_kl > 0


def test_codecs_command(tmp_path, capsys, small_cnn_model):
    from shmvec.cli.main import main

    model_path = tmp_path / "model.zip"
    small_cnn_model.save(model_path)
    out_json = tmp_path / "report.json"
    argv = ["codecs", "--env", "tests.envs:TinyImageEnv", "--steps", "30", "--codec", "delta:backend=lz4"]
    argv += ["--codec", "jpeg:quality=5", "--model", str(model_path), "--json", str(out_json)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "delta backend=lz4" in printed and "jpeg quality=5" in printed and "act chg" in printed
    reports = json.loads(out_json.read_text())["reports"]
    delta, jpeg = reports
    assert delta["bit_exact"] and delta["policy"]["mean_kl"] == 0
    assert not jpeg["bit_exact"] and jpeg["policy"]["max_value_change"] > 0


def test_codecs_command_bad_input(capsys):
    from shmvec.cli.main import main

    assert main(["codecs", "--env", "tests.envs:TinyImageEnv", "--steps", "5", "--codec", "nope"]) == 2
    assert "unknown codec 'nope'" in capsys.readouterr().err


def test_camera_frames_are_hard_for_lossless_codecs():
    from shmvec.fidelity import candidate_codecs
    from shmvec.synthetic import CameraEnv

    frames = collect_frames(functools.partial(CameraEnv, (64, 64, 3)), 6)
    assert frames.shape == (6, 64, 64, 3) and frames.dtype == np.uint8
    assert not np.array_equal(frames[1], frames[2])  # sensor noise: every frame differs
    names = [c.name for c in candidate_codecs(frames.shape[1:], frames.dtype)]
    assert {"raw", "lz4", "delta", "png", "jpeg"} <= set(names)
    assert check("delta", frames, warmup=0).compression_ratio < 3
