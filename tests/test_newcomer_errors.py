"""The errors a newcomer hits first, read as they are printed: an ALE id without ale-py registered,
a typo in an env id, a factory that cannot be pickled, a test skipped for a missing extra."""

from __future__ import annotations

import sys
import threading

import gymnasium as gym
import pytest

from shmvec import ShmVecEnv
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
def test_a_missing_env_id_prints_gymnasiums_message_once_and_how_to_register_ales_games(
    tmp_path, env_id, kind, message, hint
):
    """Printed as Python prints the uncaught error, in a fresh interpreter that never imported
    ale-py (as a newcomer's script): gymnasium's message once, in the error's first line, and for
    ALE's games the lines that register them."""
    proc = run_script(tmp_path / "make.py", SCRIPT.format(env_id=env_id))
    err = proc.stderr
    assert proc.returncode == 1, err
    assert err.count(message) == 1, err
    first = f"shmvec.errors.EnvError[{kind}]: the factory of env 0 raised {kind}: {message}"
    assert first in err.splitlines(), err
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
    from tests.test_bench_backends import _needs_envpool

    monkeypatch.delenv("SHMVEC_REQUIRE_ENVPOOL", raising=False)
    monkeypatch.setitem(sys.modules, "envpool", None)  # as if not installed
    with pytest.raises(pytest.skip.Exception) as e:
        _needs_envpool()
    assert 'pip install -e ".[envpool]"' in str(e.value), str(e.value)
