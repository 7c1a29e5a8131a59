"""shmvec without its extras (``pip install shmvec``): no torch, no SB3.

Each check runs a script in a fresh interpreter in which ``torch`` and ``stable_baselines3`` cannot be
imported (blocked where they are installed), so the full suite checks the same as CI's core stage,
which runs in a venv where they are not installed at all (``SHMVEC_CORE_SUITE=1``; checked here too).
"""

from __future__ import annotations

import importlib.util
import os
import textwrap

import pytest

from tests.helpers import run_script

# Put first in each script: `import torch` and `import stable_baselines3` then raise ImportError.
_BLOCK = """
import sys
for name in ("torch", "stable_baselines3"):
    if name not in sys.modules:
        sys.modules[name] = None
"""


def test_core_stage_has_neither_torch_nor_sb3():
    """In CI's core stage the venv holds shmvec with no extras: torch and SB3 must not be installed."""
    if os.environ.get("SHMVEC_CORE_SUITE") != "1":
        pytest.skip("only in the core stage (SHMVEC_CORE_SUITE=1): the full suite has torch and SB3")
    assert importlib.util.find_spec("torch") is None, "torch is installed in the core venv"
    assert importlib.util.find_spec("stable_baselines3") is None, "SB3 is installed in the core venv"


def test_vector_env_equals_sync_without_torch_or_sb3(tmp_path):
    """ShmVectorEnv on a pixel env with episode ends equals SyncVectorEnv over 200 steps; neither the
    main process nor the workers load torch or SB3."""
    result = run_script(
        tmp_path / "core_vector.py",
        _BLOCK
        + textwrap.dedent(
            """
        import gymnasium as gym
        import numpy as np

        import shmvec
        from shmvec.synthetic import SyntheticImageEnv


        class Probe(gym.Wrapper):
            def loaded(self, name):
                return sys.modules.get(name) is not None


        def make():
            return Probe(SyntheticImageEnv(shape=(42, 32, 3), episode_len=(5, 30)))


        if __name__ == "__main__":
            n, rng = 6, np.random.default_rng(0)
            ref = gym.vector.SyncVectorEnv([make] * n)
            env = shmvec.ShmVectorEnv([make] * n, n_workers=3)
            try:
                for got, want in zip(env.reset(seed=7), ref.reset(seed=7)):
                    np.testing.assert_equal(got, want)
                ends = 0
                for t in range(200):
                    actions = rng.integers(0, 4, n)
                    got, want = env.step(actions), ref.step(actions)
                    for g, w in zip(got[:4], want[:4]):
                        np.testing.assert_array_equal(g, w, err_msg=f"step {t}")
                    np.testing.assert_equal(got[4], want[4], err_msg=f"infos, step {t}")
                    ends += int(np.sum(got[2] | got[3]))
                assert ends >= 20, ends
                assert env.call("loaded", "torch") == (False,) * n
                assert env.call("loaded", "stable_baselines3") == (False,) * n
            finally:
                env.close()
                ref.close()
            assert sys.modules.get("torch") is None and sys.modules.get("stable_baselines3") is None
            print("equal over 200 steps,", ends, "episode ends")
        """
        ),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "equal over 200 steps" in result.stdout


def test_sb3_face_without_sb3_names_the_extra(tmp_path):
    """ShmVecEnv(...) without SB3: one line that names ``shmvec[sb3]``, raised before any worker
    starts; ``import shmvec`` and ``from shmvec import ShmVecEnv`` themselves work."""
    result = run_script(
        tmp_path / "core_sb3.py",
        _BLOCK
        + textwrap.dedent(
            """
        import gymnasium as gym
        import multiprocessing

        from shmvec import ShmVecEnv

        if __name__ == "__main__":
            try:
                ShmVecEnv([lambda: gym.make("CartPole-v1")] * 2)
            except ModuleNotFoundError as exc:
                print("ERROR:" + str(exc))
            print("children:", len(multiprocessing.active_children()))
        """
        ),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stdout
    assert "pip install 'shmvec[sb3]'" in errors[0]
    assert "children: 0" in result.stdout
