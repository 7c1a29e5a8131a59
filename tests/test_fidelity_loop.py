"""The closed loop (shmvec.fidelity.closed_loop, ``shmvec codecs --model``): the policy acts on decoded
observations in the env; checked against a hand-rolled loop with the same seeds, against a policy
keyed on one pixel and a codec that zeroes it, and for its errors."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest

from shmvec import codecs as C
from shmvec.cli.main import main
from shmvec.codecs.base import Codec, byte_view, nbytes, out_bytes
from shmvec.fidelity import closed_loop, roundtrip
from shmvec.fidelity.loop import paired_ci95
from tests.envs import TinyImageEnv

PIXEL = (3, 5)


class PixelEnv(gym.Env):
    """8x8x1 frames; pixel PIXEL is 255 (cue on) or 0; reward 1 when the action says which. Episodes
    of 6-12 steps (drawn from the reset seed), so the raw returns have a spread."""

    observation_space = gym.spaces.Box(0, 255, (8, 8, 1), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def _obs(self):
        self.cue = int(self.np_random.integers(2))
        obs = np.full((8, 8, 1), 90, np.uint8)
        obs[PIXEL] = 255 * self.cue
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.integers(6, 13))
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.cue)
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}


def pixel_policy(batch):
    return {"action": (batch[:, PIXEL[0], PIXEL[1], 0] > 127).astype(np.int64)}


class ZeroPixel(Codec):
    """A lossy codec that sends the frame unchanged but for one pixel, which it zeroes."""

    name, lossless = "zero-pixel", False

    def __init__(self, pixel=PIXEL):
        self.pixel = pixel

    def params(self):
        return {"pixel": self.pixel}

    def max_encoded_size(self, shape, dtype):
        return nbytes(shape, dtype)

    def encode(self, arr, out, stream=None):
        frame = arr.copy()
        frame[self.pixel] = 0
        data = byte_view(frame)
        out[: len(data)] = data
        return len(data)

    def decode(self, data, out, stream=None):
        out_bytes(out)[:] = data
        return out


def test_a_codec_that_hides_the_cue_is_caught():
    hidden, elsewhere = closed_loop(pixel_policy, PixelEnv, [ZeroPixel(), ZeroPixel((0, 0))], episodes=8)
    assert hidden.raw_returns == [float(r) for r in hidden.raw_returns] and len(hidden.seeds) == 8
    # Raw: always right, the return is the episode length. Decoded: right only when the cue is off.
    assert all(6 <= r <= 12 for r in hidden.raw_returns)
    assert sum(hidden.decoded_returns) < sum(hidden.raw_returns)
    assert hidden.action_change_rate > 0.2 and hidden.verdict() == "outside"
    assert hidden.open_loop is not None and hidden.open_loop.action_change_rate > 0.2
    mean, low, high = hidden.difference
    assert high < -hidden.raw_spread < 0 and mean < 0
    # Zeroing a pixel the policy does not read changes nothing.
    assert elsewhere.decoded_returns == elsewhere.raw_returns and elsewhere.action_change_rate == 0
    assert elsewhere.verdict() == "within" and elsewhere.difference == (0.0, 0.0, 0.0)


def fragile_policy(batch):
    """Keyed on every pixel: any change of the frame's sum may change the action."""
    return {"action": batch.reshape(len(batch), -1).sum(axis=1).astype(np.int64) % 4}


def hand_rolled(codec, seeds):
    env = TinyImageEnv()
    returns, steps, changed = [], 0, 0
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            seen = obs if codec is None else roundtrip(codec, obs[None])[0][0]
            action = fragile_policy(seen[None])["action"][0]
            changed += int(action != fragile_policy(obs[None])["action"][0])
            obs, reward, terminated, truncated, _ = env.step(action)
            total, steps, done = total + reward, steps + 1, terminated or truncated
        returns.append(total)
    return returns, steps, changed


def test_closed_loop_equals_a_hand_rolled_loop():
    jpeg = C.get("jpeg", quality=5)
    lossless, lossy = closed_loop(fragile_policy, TinyImageEnv, ["delta", jpeg], episodes=6, seed=10)
    raw, _, _ = hand_rolled(None, range(10, 16))
    decoded, steps, changed = hand_rolled(jpeg, range(10, 16))
    assert lossy.seeds == list(range(10, 16)) and lossy.raw_returns == raw
    assert lossy.decoded_returns == decoded and decoded != raw  # JPEG changed what the policy did
    assert (lossy.steps, lossy.action_change_rate) == (steps, changed / steps)
    assert lossless.decoded_returns == raw and lossless.action_change_rate == 0
    d = lossy.to_dict()
    json.dumps(d)
    assert d["verdict"] == lossy.verdict() and d["ci95"] == list(lossy.difference[1:])


def test_paired_interval_is_students_t():
    from scipy import stats

    rng = np.random.default_rng(0)
    for n in (2, 5, 20, 45):
        raw, dec = rng.normal(size=n), rng.normal(size=n)
        mean, low, high = paired_ci95(list(raw), list(dec))
        d = dec - raw
        half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
        assert mean == pytest.approx(d.mean()) and high - mean == pytest.approx(half, rel=1e-3)
        assert mean - low == pytest.approx(high - mean)


def test_closed_loop_refuses_bad_input():
    with pytest.raises(ValueError, match="episodes must be >= 2"):
        closed_loop(pixel_policy, PixelEnv, ["raw"], episodes=1)
    with pytest.raises(ValueError, match="a paired interval needs 2"):
        paired_ci95([1.0], [1.0])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from stable_baselines3 import PPO

    path = tmp_path_factory.mktemp("model") / "tiny.zip"
    PPO("CnnPolicy", TinyImageEnv(), seed=0, n_steps=16, batch_size=16, device="cpu").save(path)
    return str(path)


def test_a_model_for_another_env_is_refused(tiny_model):
    from shmvec.fidelity import load_model

    model = load_model(tiny_model)
    with pytest.raises(ValueError, match=r"the model takes observations \(1, 36, 36\) uint8, the env gives"):
        closed_loop(model, PixelEnv, ["raw"], episodes=2)
    with pytest.raises(ValueError, match="the model's actions are Discrete"):
        closed_loop(model, lambda: TinyImageEnv(n_actions=3), ["raw"], episodes=2)


def test_cli_closed_loop_and_recommendation(tiny_model, tmp_path, capsys):
    out = tmp_path / "out.json"
    argv = ["codecs", "--env", "tests.envs:TinyImageEnv", "--steps", "20", "--model", tiny_model]
    argv += ["--codec", "delta", "--codec", "jpeg:quality=5", "--episodes", "3", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "closed loop: the model acts (greedy) on decoded observations, 3 episodes" in text
    assert (
        "within the spread, safe for this model and env: delta backend=lz4 key_every=256 (+0, CI +0 to +0)"
        in text
    )
    result = json.loads(out.read_text())
    loop = {r["codec"]: r for r in result["closed_loop"]}
    assert result["episodes"] == 3 and loop["delta"]["verdict"] == "within"
    assert loop["delta"]["return_difference"] == 0 and len(loop["jpeg"]["decoded_returns"]) == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "no/such.zip"], "--model: no such file 'no/such.zip'"),
        (["--episodes", "5"], "--episodes needs --model"),
        (["--model", "MODEL", "--episodes", "1"], "--episodes must be >= 2"),
        (["--model", "MODEL", "--env", "shmvec.synthetic:CameraEnv"], "the model takes observations"),
    ],
)
def test_cli_bad_closed_loop_input_is_one_line(tiny_model, capsys, extra, message):
    argv = ["codecs", "--env", "tests.envs:TinyImageEnv", "--steps", "3", "--codec", "raw"]
    assert main(argv + [tiny_model if x == "MODEL" else x for x in extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shmvec codecs: error: ") and message in err[0], err
