"""benchmarks/sb3_suite.py puts ShmVecEnv where SB3's tests and ``make_vec_env`` find
``SubprocVecEnv``, one worker per env as SubprocVecEnv has, and its start-method errors are the ones
SB3's tests expect."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_python

SCRIPT = """
import json, sys
sys.path.insert(0, "benchmarks")
import gymnasium as gym
import sb3_suite
from stable_baselines3.common.env_util import make_vec_env

from shmvec import ShmVecEnv

if __name__ == "__main__":
    sb3_suite.substitute()
    from stable_baselines3.common.vec_env import SubprocVecEnv

    venv = make_vec_env("CartPole-v1", n_envs=3, vec_env_cls=SubprocVecEnv, vec_env_kwargs={"start_method": "fork"})
    shim = [type(venv).__name__, isinstance(venv, ShmVecEnv), venv.n_workers]
    venv.close()
    try:
        SubprocVecEnv([lambda: gym.make("CartPole-v1")], start_method="illegal_method")
        error = None
    except ValueError as exc:
        error = str(exc)
    print(json.dumps({"shim": shim, "error": error}))
"""


@pytest.mark.sb3  # its subprocess imports SB3
def test_make_vec_env_builds_shmvec_in_subprocvecenvs_place():
    proc = run_python("-c", SCRIPT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["shim"] == ["SubprocVecEnv", True, 3]
    # What SB3's test_vecenv_start_methods expects of SubprocVecEnv(start_method="illegal_method").
    assert "cannot find context for 'illegal_method'" in out["error"]
