"""SB3's Atari recipe through ShmVecEnv against DummyVecEnv, step by step (:func:`run_sb3`): what the
native Atari tests and the Ray tests compare."""

from __future__ import annotations

import csv
from contextlib import closing
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack

from shmvec import ShmVecEnv
from tests.helpers import assert_step_equal, require

# Wrapper state that get_attr must read as the wrappers leave it, and that the native step keeps.
STATE = ("episode_returns", "episode_lengths", "total_steps", "lives", "was_real_done", "_obs_buffer")


def monitor_rows(folder: Path) -> dict[str, list[list[str]]]:
    """Each Monitor CSV's rows (header line and time column left out: wall-clock)."""
    out = {}
    for path in sorted(folder.glob("*.monitor.csv")):
        with open(path) as f:
            next(f)  # '#{"t_start": ..., "env_id": ...}'
            rows = list(csv.reader(f))
        out[path.name] = [row[:2] for row in rows]
    return out


def registered(env_id: str, **kwargs) -> gym.Env:
    """``gym.make`` with ALE's ids registered first: what a process that did not import the test
    module (a Ray actor) needs to build the env."""
    gym.register_envs(require("ale_py", 'pip install -e ".[atari]"'))
    return gym.make(env_id, **kwargs)


def run_sb3(
    env_id: Any,
    tmp_path: Path,
    n_envs: int = 4,
    steps: int = 600,
    seed: int = 0,
    ref_seed: int | None = None,
    wrapper_kwargs: dict | None = None,
    env_kwargs: dict | None = None,
    **options,
) -> dict[str, int]:
    """``make_atari_env`` through ShmVecEnv and through DummyVecEnv (``ref_seed``: another seed for
    the reference, the negative control), compared step by step; how episodes ended, by kind."""
    stack = options.get("frame_stack")
    common = dict(n_envs=n_envs, wrapper_kwargs=wrapper_kwargs, env_kwargs=env_kwargs)
    ref = make_atari_env(
        env_id, seed=seed if ref_seed is None else ref_seed, monitor_dir=str(tmp_path / "ref"), **common
    )
    ref = VecFrameStack(ref, stack) if stack else ref
    options.setdefault("start_method", "fork")
    got = make_atari_env(
        env_id,
        seed=seed,
        monitor_dir=str(tmp_path / "shm"),
        vec_env_cls=ShmVecEnv,
        vec_env_kwargs=options,
        **common,
    )
    ends = {"game over": 0, "life lost": 0, "truncated": 0}
    with closing(got), closing(ref):
        paths = {s.path for s in got.native_steps}
        assert paths == {"sb3-atari+frame-stack" if stack else "sb3-atari"}, got.native_steps
        assert np.array_equal(got.reset(), ref.reset()), "reset obs"
        rng = np.random.default_rng(seed)
        for t in range(steps):
            actions = rng.integers(0, got.action_space.n, n_envs)
            want = ref.step(actions)
            assert_step_equal(got.step(actions), want, t)
            for done, info in zip(want[2], want[3]):
                if done:
                    kind = (
                        "truncated"
                        if info["TimeLimit.truncated"]
                        else "game over"
                        if "episode" in info
                        else "life lost"
                    )
                    ends[kind] += 1
        for attr in STATE:
            if hasattr(ref.unwrapped.envs[0], attr):  # VecEnv.has_attr: SB3 >= 2.5
                for i, (x, y) in enumerate(zip(got.get_attr(attr), ref.get_attr(attr))):
                    assert np.array_equal(x, y), f"get_attr({attr!r}) of env {i}"
    assert monitor_rows(tmp_path / "shm") == monitor_rows(tmp_path / "ref")
    return ends
