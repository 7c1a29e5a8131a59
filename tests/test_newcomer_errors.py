"""The errors a newcomer hits first, read as they are printed: an ALE id without ale-py registered,
a typo in an env id, a factory that cannot be pickled, a test skipped for a missing extra, an
observation of another dtype than its space's, no envs at all."""

from __future__ import annotations

import sys
import threading

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.env_util import make_vec_env

import shmvec
from shmvec import ShmVecEnv
from shmvec.errors import EnvError
from tests.helpers import run_script

REGISTER = "    import ale_py\n    gym.register_envs(ale_py)"

SCRIPT = """
import gymnasium as gym
from shmvec import ShmVecEnv

if __name__ == "__main__":
    ShmVecEnv([lambda: gym.make({env_id!r})] * 2, start_method="fork")
"""


@pytest.mark.parametrize(
    ("env_id", "kind", "message", "hint"),
    [
        (
            "ALE/Pong-v5",
            "NamespaceNotFound",
            "Namespace ALE not found. Have you installed the proper package for ALE?",
            True,
        ),
        ("PongNoFrameskip-v4", "NameNotFound", "Environment `PongNoFrameskip` doesn't exist.", True),
        (
            "CartPol-v1",
            "NameNotFound",
            "Environment `CartPol` doesn't exist. Did you mean: `CartPole`?",
            False,
        ),
    ],
)
def test_a_missing_env_id_ends_with_gymnasiums_message_and_says_how_to_register_ales_games(
    tmp_path, env_id, kind, message, hint
):
    """Printed as Python prints the uncaught error, in a fresh interpreter that never imported
    ale-py (as a newcomer's script): gymnasium's message in the error's first line and as the last
    line printed (the worker's traceback between them closes with it, as an in-process one would),
    nowhere else, and for ALE's games the lines that register them."""
    proc = run_script(tmp_path / "make.py", SCRIPT.format(env_id=env_id))
    err = proc.stderr
    assert proc.returncode == 1, err
    assert err.count(message) == 2, err
    first = f"shmvec.errors.EnvError[{kind}]: the factory of env 0 raised {kind}: {message}"
    assert first in err.splitlines(), err
    assert err.rstrip().splitlines()[-1] == f"gymnasium.error.{kind}: {message}", err
    assert (REGISTER in err) is hint, err


def test_an_unpicklable_global_of_the_factory_is_named(no_leaks):
    """A module-level function that reads a module-level lock (as a main script's would be, pickled
    by value): the error names the lock and says not to capture it."""
    scope = {"__name__": "a_main_script", "gym": gym, "LOCK": threading.Lock()}
    exec("def make_env():\n    with LOCK:\n        return gym.make('CartPole-v1')\n", scope)
    with pytest.raises(TypeError) as e:
        ShmVecEnv([scope["make_env"]], "spawn")
    first = str(e.value).splitlines()[0]
    assert first.startswith(
        "the factory of env 0 refers to `LOCK` (a _thread.lock), which cannot be pickled: do not capture it"
    ), first


def test_a_closure_through_a_helper_is_followed(no_leaks):
    lock = threading.Lock()

    def helper():
        return lock.locked()

    def make():
        helper()
        return gym.make("CartPole-v1")

    with pytest.raises(
        TypeError, match=r"^the factory of env 0 refers to `helper`, whose `lock` \(a _thread.lock\)"
    ):
        ShmVecEnv([make, make], "spawn", n_workers=2)


def test_the_envpool_skip_says_how_to_install_it(monkeypatch):
    from tests.helpers import needs_envpool

    monkeypatch.delenv("SHMVEC_REQUIRE_ENVPOOL", raising=False)
    monkeypatch.setitem(sys.modules, "envpool", None)  # as if not installed
    with pytest.raises(pytest.skip.Exception) as e:
        needs_envpool()
    assert 'pip install -e ".[envpool]"' in str(e.value), str(e.value)


class Float64Frames(gym.Env):
    """A uint8 image space whose observations come out of a float computation, uncast."""

    observation_space = gym.spaces.Box(0, 255, (8, 8, 1), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros((8, 8, 1), np.float64), {}

    def step(self, action):
        return np.zeros((8, 8, 1), np.float64), 0.0, False, False, {}


def test_an_observation_of_another_dtype_says_how_to_fix_it_and_names_no_key_for_a_plain_box(no_leaks):
    with ShmVecEnv([Float64Frames], "fork") as env, pytest.raises(EnvError) as info:
        env.reset()
    first = str(info.value).splitlines()[0]
    assert first.startswith(
        "env 0 raised ObservationError during reset: env 0: observation dtype float64 cannot be stored as "
        "the observation space dtype uint8 without changing its values (DummyVecEnv would cast it, "
        "SubprocVecEnv pass float64 through"
    ), first
    assert "key" not in first, first
    assert "np.asarray(obs, dtype=np.uint8)" in first and "dtype=np.float64" in first, first


@pytest.mark.parametrize(
    ("build", "typed"),
    [
        (lambda: ShmVecEnv([]), "n_envs=0 (make_vec_env, make_atari_env)"),
        (lambda: make_vec_env("CartPole-v1", n_envs=0, vec_env_cls=ShmVecEnv), "n_envs=0"),
        (lambda: shmvec.make_vec("CartPole-v1", num_envs=0), "num_envs=0 (shmvec.make_vec)"),
    ],
)
def test_no_envs_names_the_count_the_user_typed(no_leaks, build, typed):
    with pytest.raises(ValueError, match=r"got 0 env factories: ") as info:
        build()
    assert typed in str(info.value) and ">= 1" in str(info.value), str(info.value)
