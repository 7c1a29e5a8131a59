"""SB3's Atari recipe, as the README, the docs and the examples build it, lasts 4 frames per action;
``make_atari_env("ALE/Pong-v5")`` (16 frames) is warned about, in the workers that build it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import gymnasium as gym
import pytest

from shmvec.atari import check_frame_skip, frames_per_action
from shmvec.errors import FrameSkipWarning
from tests.helpers import ROOT, run_script

ale_py = pytest.importorskip("ale_py", reason='ALE is not installed (pip install -e ".[atari]")')
gym.register_envs(ale_py)

SOURCES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "examples").glob("*.py")),
]


def _atari_wrapped(env_id: str, **kwargs) -> gym.Env:
    from stable_baselines3.common.atari_wrappers import AtariWrapper

    return AtariWrapper(gym.make(env_id, **kwargs))


def _recipe_ids() -> dict[str, str]:
    """``file: id`` for every env id handed to ``make_atari_env`` in the README, the docs and the
    examples: string literals in the call, and an example's ``--env`` default where the call takes
    ``args.env``."""
    found = {}
    for path in SOURCES:
        text = path.read_text()
        for i, env_id in enumerate(re.findall(r'make_atari_env\(\s*"([^"]+)"', text)):
            found[f"{path.relative_to(ROOT)}:{i}"] = env_id
        if re.search(r"make_atari_env\(\s*args\.env", text):
            default = re.search(r'"--env", default="([^"]+)"', text)
            assert default, f"{path.name}: make_atari_env(args.env) without an --env default"
            found[f"{path.relative_to(ROOT)}:--env"] = default.group(1)
    return found


RECIPE_IDS = _recipe_ids()


def test_the_recipe_is_found_where_it_is_written():
    files = {key.split(":")[0] for key in RECIPE_IDS}
    assert {
        "README.md",
        "examples/ppo_atari.py",
        "examples/dqn_atari.py",
        "examples/ray_cluster_ppo.py",
    } <= files


@pytest.mark.parametrize("where", sorted(RECIPE_IDS))
def test_every_written_recipe_lasts_4_frames_per_action(where):
    env = _atari_wrapped(RECIPE_IDS[where])
    try:
        assert frames_per_action(env) == 4, f"{where}: {RECIPE_IDS[where]} under AtariWrapper"
    finally:
        env.close()


@pytest.mark.parametrize(
    ("env_id", "kwargs", "frames"),
    [
        ("ALE/Pong-v5", {}, 16),
        ("ALE/Pong-v5", {"frameskip": 1}, 4),
        ("PongNoFrameskip-v4", {}, 4),
        ("Pong-v4", {}, 14),  # frameskip drawn from 2..4 (mean 3.5)
    ],
)
def test_frames_per_action_under_sb3s_wrapper(env_id, kwargs, frames):
    env = _atari_wrapped(env_id, **kwargs)
    try:
        assert frames_per_action(env) == frames
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_frame_skip(env)
        assert [w.category for w in caught] == ([FrameSkipWarning] if frames != 4 else [])
    finally:
        env.close()


def test_the_guard_leaves_unwrapped_and_non_atari_envs_alone():
    for env in (gym.make("ALE/Pong-v5"), gym.make("CartPole-v1")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_frame_skip(env)
        env.close()


@pytest.mark.slow
def test_workers_warn_about_a_16_frame_recipe(tmp_path):
    script = tmp_path / "recipe.py"
    script.write_text(
        "import ale_py, gymnasium as gym\n"
        "from stable_baselines3.common.env_util import make_atari_env\n"
        "from shmvec import ShmVecEnv\n"
        "if __name__ == '__main__':\n"
        "    gym.register_envs(ale_py)\n"
        "    for env_id in ('ALE/Pong-v5', 'PongNoFrameskip-v4'):\n"
        "        venv = make_atari_env(env_id, n_envs=2, seed=0, vec_env_cls=ShmVecEnv,\n"
        "                              vec_env_kwargs={'n_workers': 1})\n"
        "        venv.reset()\n"
        "        venv.close()\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if "FrameSkipWarning" in line]
    assert len(warned) == 1 and "ALE/Pong-v5" in warned[0] and "16 frames" in warned[0], proc.stderr
    # The workers' ALE banners are quiet by default (SHMVEC_ALE_BANNER=1 keeps them).
    assert "Arcade Learning Environment" not in proc.stderr + proc.stdout


@pytest.mark.parametrize(("keep", "shown"), [(None, False), ("1", True)])
def test_ale_banner_is_quiet_unless_asked_for(keep, shown):
    # What a worker does first (shmvec.worker.process.quiet_ale_banner), then an ALE env as its env would.
    code = (
        "from shmvec.worker.process import quiet_ale_banner\n"
        "quiet_ale_banner()\n"
        "import gymnasium as gym\n"
        "gym.make('ale_py:ALE/Pong-v5').reset(seed=0)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SHMVEC_ALE_BANNER"}
    if keep is not None:
        env["SHMVEC_ALE_BANNER"] = keep
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("Arcade Learning Environment" in proc.stdout + proc.stderr) is shown


def test_a_ray_actor_keeps_ales_banner_quiet_too(tmp_path):
    """backend="ray": the actor's own set-up (RayWorker, run here without Ray) quiets the banner
    before it makes its envs, as a local worker does; Ray would relay one banner per actor."""
    proc = run_script(
        tmp_path / "actor.py",
        """
        import cloudpickle
        from shmvec.transports.ray.actor import RayWorker

        def make():
            import ale_py
            import gymnasium as gym

            gym.register_envs(ale_py)
            return gym.make("ALE/Pong-v5")

        worker = RayWorker(cloudpickle.dumps([make]), 0, 1, False)
        print("started:", type(worker.started).__name__)
        """,
    )
    assert proc.returncode == 0 and "started: Ready" in proc.stdout, proc.stderr[-2000:]
    assert "Arcade Learning Environment" not in proc.stdout + proc.stderr
