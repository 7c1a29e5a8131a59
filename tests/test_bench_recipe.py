"""``shmvec bench --recipe sb3-atari``: every backend builds SB3's Atari recipe (the same observations
as ``make_atari_env`` + ``VecFrameStack`` for the same seed, array for array, where the backend runs
Python envs; the shape the C++ envs give otherwise), the report says which envs stepped natively and
sets the backends side by side, and the CLI refuses what the recipe cannot run in one line.

Tiny runs only; nothing asserts on speed. The EnvPool test is in ``test_bench_backends.py`` (CI's
envpool step runs that file's envpool tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from shmvec.bench.backends import check_backend, make_vec_env
from shmvec.bench.compare import cells, side_by_side
from shmvec.bench.envs import env_factory
from shmvec.bench.recipes import FRAME_STACK, atari_settings, check_recipe, recipe_env
from shmvec.bench.report import WIDTH
from shmvec.cli.main import main
from shmvec.native import UNCHECKED, describe
from tests.helpers import ROOT, assert_obs_equal

PONG = "PongNoFrameskip-v4"


def _rollout(venv, steps: int, seed: int = 3) -> list[tuple]:
    """(obs, rewards, dones) after ``venv.seed(seed)``, a reset and ``steps`` seeded random steps."""
    try:
        venv.seed(seed)
        out = [(np.array(venv.reset()), None, None)]
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            venv.step_async(rng.integers(0, venv.action_space.n, venv.num_envs))
            obs, rewards, dones, _ = venv.step_wait()
            out.append((np.array(obs), np.array(rewards, np.float32), np.array(dones)))
        return out
    finally:
        venv.close()


def _assert_same(got: list[tuple], want: list[tuple], who: str) -> None:
    for t, ((obs, rew, done), (w_obs, w_rew, w_done)) in enumerate(zip(got, want, strict=True)):
        assert_obs_equal(obs, w_obs, f"{who} step {t} obs")
        if t:
            assert_obs_equal(rew, w_rew, f"{who} step {t} rewards")
            assert_obs_equal(done, w_done, f"{who} step {t} dones")


def _recipe_fns(n: int) -> list:
    env_fn, stack = recipe_env("sb3-atari", PONG)
    assert stack == FRAME_STACK == 4
    return [env_fn] * n


def test_the_recipe_is_make_atari_env_with_vec_frame_stack():
    """The bench's dummy backend under the recipe gives what SB3's own one-liner gives."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    want = _rollout(VecFrameStack(make_atari_env(PONG, 2, seed=3), 4), 30)
    got = _rollout(make_vec_env("dummy", _recipe_fns(2), frame_stack=4), 30)
    assert want[0][0].shape == (2, 84, 84, 4) and want[0][0].dtype == np.uint8
    assert want[0][0].any(), "blank frames: nothing was compared"
    _assert_same(got, want, "dummy")


@pytest.mark.parametrize("backend", ["shm", "shm-wrappers", "subproc", "shm-vector"])
def test_recipe_steps_like_dummy(no_leaks, backend):
    """Same seed, same actions: the same stacked frames, rewards and dones as VecFrameStack over
    DummyVecEnv; shm steps its envs natively, shm-wrappers through the wrappers."""
    want = _rollout(make_vec_env("dummy", _recipe_fns(2), frame_stack=4), 40)
    venv = make_vec_env(backend, _recipe_fns(2), 2, "fork", frame_stack=4)
    paths = {s.path for s in venv.native_steps} if backend.startswith("shm") else None
    _assert_same(_rollout(venv, 40), want, backend)
    native = {"sb3-atari+frame-stack"}
    assert paths == {"shm": native, "shm-vector": native, "shm-wrappers": {None}, "subproc": None}[backend]
    # A changed seed is caught: the comparison can fail.
    other = _rollout(make_vec_env("dummy", _recipe_fns(2), frame_stack=4), 40, seed=4)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(other, want))


@pytest.mark.parametrize(("backend", "batch"), [("ale-vec", 4), ("ale-vec-async", 2)])
def test_ale_vec_gives_the_recipe_shape_channels_first(backend, batch):
    venv = make_vec_env(backend, _recipe_fns(4), batch_size=2, frame_stack=4)
    assert venv.num_envs == batch and venv.action_space.n == 6 and venv.processes == []
    assert venv.native_steps is None
    out = _rollout(venv, 12)
    for obs, rewards, dones in out[1:]:
        assert obs.shape == (batch, 4, 84, 84) and obs.dtype == np.uint8
        assert rewards.dtype == np.float32 and set(np.unique(rewards)) <= {-1.0, 0.0, 1.0}
        assert dones.shape == (batch,) and dones.dtype == np.bool_
    assert out[-1][0].any()


def test_sb3_settings_for_the_cpp_envs():
    from shmvec.bench.ale_vec_backend import ale_vec_kwargs

    s = atari_settings("MsPacmanNoFrameskip-v4")
    assert (s.game, s.task, s.frame_skip, s.screen_size, s.frame_stack) == ("ms_pacman", "MsPacman", 4, 84, 4)
    assert (s.noop_max, s.episodic_life, s.fire_reset, s.clip_reward) == (30, True, True, True)
    assert (s.repeat_action_probability, s.max_frames) == (0.0, 108_000)
    kwargs = ale_vec_kwargs(s)
    assert kwargs["repeat_action_probability"] == 0.0 and kwargs["maxpool"] and kwargs["grayscale"]
    assert (kwargs["stack_num"], kwargs["frameskip"], kwargs["img_height"]) == (4, 4, 84)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: check_recipe("sb3-atari", "ALE/Pong-v5"), "over a NoFrameskip-v4 id"),
        (lambda: check_recipe("sb3-atari", PONG, {"frameskip": 2}), "--env-kwargs does not apply"),
        (lambda: check_recipe("sb3", PONG), "unknown recipe 'sb3'; choose from sb3-atari"),
        (lambda: check_recipe("sb3-atari", "NopeNoFrameskip-v4"), "cannot find 'NopeNoFrameskip-v4'"),
        (lambda: check_backend("async", "sb3-atari"), "'async' cannot stack frames"),
        (lambda: check_backend("ale-vec"), "runs with --recipe sb3-atari only"),
        (lambda: make_vec_env("ale-vec", [env_factory("ALE/Pong-v5")]), "run --recipe sb3-atari only"),
        (lambda: make_vec_env("sync", [env_factory("ALE/Pong-v5")], frame_stack=4), "cannot stack"),
    ],
)
def test_what_the_recipe_cannot_run_is_refused(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        call()


def test_gymnasium_backends_on_gymnasium_1_0_are_refused_with_the_release_they_need(monkeypatch):
    import gymnasium as gym

    if hasattr(gym.vector, "AutoresetMode"):
        check_backend("sync")
        monkeypatch.delattr(gym.vector, "AutoresetMode")  # as on Gymnasium 1.0
    for name in ("sync", "async"):
        with pytest.raises(ValueError, match=f"backend '{name}' needs Gymnasium >= 1.1"):
            check_backend(name)
    check_backend("shm-vector")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--recipe", "sb3-atari", "--env", "ALE/Pong-v5"], "over a NoFrameskip-v4 id"),
        (["--recipe", "nope"], "unknown recipe 'nope'"),
        (["--recipe", "sb3-atari", "--backends", "dummy,async"], "'async' cannot stack frames"),
        (["--env", "ALE/Pong-v5", "--backends", "ale-vec"], "'ale-vec' runs with --recipe sb3-atari only"),
        (["--recipe", "none", "--backends", "ale-vec"], "'ale-vec' runs with --recipe sb3-atari only"),
        (["--recipe", "sb3-atari", "--train", "--backends", "ale-vec"], "not an SB3 VecEnv"),
        (["--recipe", "sb3-atari", "--env-kwargs", '{"frameskip": 2}'], "--env-kwargs does not apply"),
    ],
)
def test_cli_refuses_in_one_line(capsys, args, message):
    assert main(["bench", *args, "--repeats", "1", "--seconds", "0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shmvec bench: error: ") and message in err[0], err


def test_training_on_the_recipe_defaults_to_what_sb3_can_train():
    from shmvec.bench.train import check_train_args
    from shmvec.cli.main import _parser, resolve_defaults

    args = _parser().parse_args(["bench", "--train", "--recipe", "sb3-atari"])
    resolve_defaults(args)
    assert (args.env, args.n_envs) == ("PongNoFrameskip-v4", "8")
    for backend in args.backends.split(","):  # ale-vec and envpool are not SB3 VecEnvs
        check_train_args(args.env, [backend], "ppo:CnnPolicy", 8, 1024, [0], None, args.recipe)


def test_native_line_counts_envs_and_says_why_not():
    one = [{"path": "sb3-atari+frame-stack", "reason": None, "envs": 8}]
    assert describe(one) == "native step: 8 of 8 envs (sb3-atari+frame-stack)"
    off = [{"path": None, "reason": "native_step=False", "envs": 2}]
    assert describe(off) == (
        "native step: none, every env steps through its wrappers (native_step=False; see docs/guides/native.md)"
    )
    unchecked = [{"path": None, "reason": f"{UNCHECKED}: a.B.step (b 9.9.9)", "envs": 2}]
    assert describe(unchecked) == f"native step: 0 of 2 envs: {UNCHECKED}: a.B.step (b 9.9.9)"
    mixed = [{"path": "sb3-atari", "reason": None, "envs": 3}, {"path": None, "reason": "a Foo", "envs": 1}]
    assert describe(mixed) == "native step: 3 of 4 envs (3 sb3-atari); 1 not (a Foo)"


def test_side_by_side_takes_ratios_round_by_round():
    runs = {
        "a": [{"steps_per_s": 100.0, "cpu_us": 10.0}, {"steps_per_s": 200.0, "cpu_us": 20.0}],
        "b": [{"steps_per_s": 300.0, "cpu_us": 10.0}, {"steps_per_s": 200.0, "cpu_us": 30.0}],
    }
    rows = side_by_side(runs, "a")
    assert rows[1]["steps_per_s_ratio"] == [3.0, 1.0] and rows[1]["cpu_us_ratio"] == [1.0, 1.5]
    assert cells(rows[1]) == ["b", "250 (200-300)", "2.00x (1.00-3.00)", "20 (10-30)", "1.25x (1.00-1.50)"]
    assert cells(rows[1], figure_ranges=False)[1] == "250"
    assert side_by_side(runs, "c")[0]["steps_per_s_ratio"] is None
    assert cells(side_by_side(runs, None)[0])[2] == ""


def test_cli_reports_native_steps_and_backends_side_by_side(tmp_path):
    """End to end, tiny: the default env with --recipe, the native line for each shm backend (none
    for the others), the side-by-side table against the first backend, the same in the JSON, and
    the same report again from the JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["--recipe", "sb3-atari", "--backends", "ale-vec,shm,shm-wrappers,dummy", "--n-envs", "2"]
    args += [
        "--repeats",
        "2",
        "--seconds",
        "0.2",
        "--start-method",
        "fork",
        "--json",
        str(tmp_path / "r.json"),
    ]
    out = subprocess.run(
        [sys.executable, "-m", "shmvec", "bench", *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert text.startswith(f"{PONG} (recipe sb3-atari), policy none")
    assert "  shm n=2: native step: 2 of 2 envs (sb3-atari+frame-stack)\n" in text
    assert (
        "  shm-wrappers n=2: native step: none, every env steps through its wrappers (native_step=False;"
        in text
    )
    assert "dummy n=2: native" not in text and "ale-vec n=2: native" not in text
    assert "ratios to ale-vec n=2 round by round" in text and "not bit-identical" in text
    side = text[text.index("side by side") :].splitlines()
    assert side[2].startswith("ale-vec n=2") and "1.00x (1.00-1.00)" in side[2]
    assert max(map(len, text.splitlines())) <= WIDTH

    data = json.loads((tmp_path / "r.json").read_text())
    assert data["spec"]["recipe"] == "sb3-atari" and data["spec"]["env"] == PONG
    native = {p["label"]: p["native"] for p in data["points"]}
    assert native["shm n=2"] == [{"path": "sb3-atari+frame-stack", "reason": None, "envs": 2}]
    assert native["dummy n=2"] is None and native["ale-vec n=2"] is None
    (table,) = data["side_by_side"]
    assert table["base"] == "ale-vec n=2" and [r["label"] for r in table["rows"]] == list(native)
    for row, point in zip(table["rows"], data["points"]):
        assert row["cpu_us"] == point["cpu_us_per_env_step"] and all(c > 0 for c in row["cpu_us"])
        assert len(row["steps_per_s_ratio"]) == 2

    again = subprocess.run(
        [sys.executable, "-m", "shmvec", "bench", "--from-json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout == text.replace(f"raw figures: {tmp_path / 'r.json'}\n", "")


@pytest.mark.slow
def test_the_default_bench_measures_the_recipe_against_its_peers(tmp_path):
    """``shmvec bench`` with no workload options (shortened windows): SB3's Atari recipe on Pong, shm
    against ale-vec, subproc and dummy at 8 envs, the verdict saying which are bit-identical."""
    out = subprocess.run(
        [sys.executable, "-m", "shmvec", "bench", "--repeats", "1", "--seconds", "0.3", "--json", str(tmp_path / "d.json")],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["spec"]["recipe"] == "sb3-atari" and data["spec"]["env"] == PONG
    labels = [p["label"] for p in data["points"]]
    assert labels[:4] == ["shm n=8", "ale-vec n=8", "subproc n=8", "dummy n=8"], labels
    verdict = out.stdout[out.stdout.index("Verdict") :]
    assert "shm n=8 (bit-identical to the in-process reference)" in " ".join(verdict.split())
    assert "ale-vec n=8 (not bit-identical)" in " ".join(verdict.split())
    assert "shm n=8: native step: 8 of 8 envs (sb3-atari+frame-stack)" in out.stdout
