"""ShmVectorEnv's workers import neither SB3 nor torch (Gymnasium users need neither, and importing
torch costs every worker seconds of start-up and hundreds of MB)."""

from __future__ import annotations

import sys
from contextlib import closing

import pytest

import shmvec
from tests.envs import DictImageEnv


@pytest.mark.parametrize("start_method", ["forkserver", pytest.param("spawn", marks=pytest.mark.slow)])
def test_vector_env_workers_import_neither_sb3_nor_torch(no_leaks, start_method):
    import torch  # noqa: F401  # loaded here, in the main process: the workers must still not have it

    assert "torch" in sys.modules
    with closing(shmvec.ShmVectorEnv([DictImageEnv] * 2, start_method=start_method)) as env:
        assert env.call("modules_loaded", "torch") == (False, False)
        assert env.call("modules_loaded", "stable_baselines3") == (False, False)
        assert env.call("modules_loaded", "gymnasium") == (True, True)  # the probe itself works
