"""``shmvec.testing.assert_equivalent``: it passes on envs that are the same in shmvec and in the
in-process reference, and fails, naming the step, the env and the field, on the usual ways an env
is not (negative controls): numpy's global RNG, wall-clock infos, a factory that shares state."""

from __future__ import annotations

import functools
import itertools
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from shmvec.synthetic import SyntheticImageEnv
from shmvec.testing import Difference, assert_equivalent
from shmvec.testing.compare import InfoKeys, value_difference
from tests.helpers import require

# The SB3 face needs SB3 when it runs (assert_equivalent imports it): the core suite leaves it out.
FACES = [pytest.param("sb3", marks=pytest.mark.sb3), "gymnasium"]
PIXELS = functools.partial(SyntheticImageEnv, (12, 10, 3), episode_len=(3, 9))
# fork: the negative controls below are classes of this file, and fork starts fastest.
FORK = {"start_method": "fork", "n_workers": 2}


class GlobalRngEnv(SyntheticImageEnv):
    """Adds noise from numpy's global RNG to each reward: the classic non-reproducible env."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward + np.random.random(), terminated, truncated, info


class ClockInfoEnv(SyntheticImageEnv):
    """Puts the wall-clock time in every step's info."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "time": time.time()}


class StampedEnv(gym.Env):
    """An observation that is the env's ``stamp``, given at construction."""

    observation_space = spaces.Box(0, 255, (4, 4, 1), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self, stamp: int) -> None:
        self.stamp = stamp % 256

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full((4, 4, 1), self.stamp, np.uint8), {}

    def step(self, action):
        return np.full((4, 4, 1), self.stamp, np.uint8), 0.0, False, False, {}


_built = itertools.count()


def wrong_factory() -> gym.Env:
    """Deliberately wrong: the envs it builds depend on how many it built before in this process
    (a counter), so a worker's envs differ from the ones built in the main process."""
    return StampedEnv(next(_built))


@pytest.mark.parametrize("face", FACES)
def test_passes_on_a_deterministic_pixel_env(no_leaks, face):
    report = assert_equivalent([PIXELS] * 4, steps=40, seed=3, face=face, **FORK)
    assert report.steps == 40 and report.n_envs == 4 and report.face == face
    # Episodes ended both ways, so the auto-resets and terminal observations were compared.
    assert report.terminated > 0 and report.truncated > 0


def test_passes_in_the_disabled_autoreset_mode(no_leaks):
    report = assert_equivalent([PIXELS] * 3, steps=30, face="gymnasium", autoreset_mode="disabled", **FORK)
    assert report.terminated + report.truncated > 0


@pytest.mark.parametrize("face", FACES)
def test_fails_on_numpy_global_rng(no_leaks, face):
    # Envs 0 and 1 share worker 0, which draws from its copy of the parent's stream in the same order
    # as the reference's envs 0 and 1: env 2 (worker 1) is the first that differs.
    fns = [functools.partial(GlobalRngEnv, (4, 4, 1))] * 4
    with pytest.raises(AssertionError, match=r"differ at step 0, env 2, in reward:\n") as caught:
        assert_equivalent(fns, steps=10, face=face, **FORK)
    assert "global RNG" in str(caught.value) and "docs/guides/seeds.md" in str(caught.value)


@pytest.mark.parametrize("face", FACES)
def test_fails_on_a_wall_clock_info_unless_the_key_is_ignored(no_leaks, face):
    fns = [functools.partial(ClockInfoEnv, (4, 4, 1))] * 2
    field = "info" if face == "sb3" else "infos"
    with pytest.raises(AssertionError, match=rf"differ at step 0, env 0, in {field}\['time'\]:\n") as caught:
        assert_equivalent(fns, steps=10, face=face, **FORK)
    assert "ignore_info_keys=['time']" in str(caught.value)
    assert assert_equivalent(fns, steps=10, face=face, ignore_info_keys=["time"], **FORK).steps == 10


@pytest.mark.parametrize("face", FACES)
def test_fails_on_a_deliberately_wrong_factory(no_leaks, face):
    with pytest.raises(
        AssertionError, match=r"differ at reset, env 0, in obs:\n  values differ at index \(0, 0, 0\)"
    ):
        assert_equivalent([wrong_factory] * 3, steps=5, face=face, **FORK)


def test_monitors_wall_clock_episode_time_is_not_compared(no_leaks):
    """SB3's Monitor records each episode's wall-clock time in ``info["episode"]["t"]``: left out,
    while its return and length are compared."""
    from stable_baselines3.common.monitor import Monitor

    report = assert_equivalent([lambda: Monitor(PIXELS())] * 2, steps=30, **FORK)
    assert report.terminated + report.truncated > 0


def test_info_keys_rules():
    keys = InfoKeys(["time", ("stats", "wall")])
    assert keys.ignored(("time",)) and keys.ignored(("final_info", "time")) and keys.ignored(("_time",))
    assert keys.ignored(("stats", "wall")) and not keys.ignored(("wall",))
    assert keys.ignored(("episode", "t")) and not keys.ignored(("t",))  # always: Monitor's time
    got = {"r": 1.0, "episode": {"r": 1.0, "t": 2.0}, "TimeLimit.truncated": False}
    want = {"r": 1.0, "episode": {"r": 1.0, "t": 9.0}, "TimeLimit.truncated": False}
    assert value_difference(got, want, "info", ignore=keys) is None
    assert value_difference(got, want, "info") == Difference("info['episode']['t']", "2.0 != 9.0")


def test_value_difference_names_what_differs():
    assert (
        value_difference(np.zeros(3, np.uint8), np.zeros(3, np.int64), "obs").detail == "dtype uint8 != int64"
    )
    assert value_difference({"b": 1, "a": 2}, {"a": 2, "b": 1}, "x").detail.startswith("key order")
    assert value_difference({"b": 1, "a": 2}, {"a": 2, "b": 1}, "x", ordered=False) is None
    assert value_difference(np.array([1.0, np.nan]), np.array([1.0, np.nan]), "x") is None
    assert value_difference(True, np.True_, "flag").detail == "True != np.True_ (bool != numpy.bool)"


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="face must be one of"):
        assert_equivalent([PIXELS], face="torchrl")
    with pytest.raises(ValueError, match="env_fns is empty"):
        assert_equivalent([])
    with pytest.raises(ValueError, match="pool mode"):
        assert_equivalent([PIXELS] * 4, face="gymnasium", batch_size=2)


def test_gymnasium_face_imports_no_sb3():
    """The Gymnasium face's check must work where SB3 is not installed: it never imports it."""
    code = (
        "import sys, functools\n"
        "from shmvec.synthetic import SyntheticImageEnv\n"
        "from shmvec.testing import assert_equivalent\n"
        "fn = functools.partial(SyntheticImageEnv, (4, 4, 1))\n"
        "assert_equivalent([fn] * 2, steps=5, face='gymnasium', start_method='fork')\n"
        "bad = [m for m in ('stable_baselines3', 'torch', 'pytest') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    from tests.helpers import run_python

    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("face", FACES)
def test_passes_on_minigrid(no_leaks, face):
    """MiniGrid's Dict observation (image, direction, mission string) through the Gymnasium face; its
    image alone (``ImgObsWrapper``) through SB3's, whose DummyVecEnv takes no strings."""
    require("minigrid", "pip install minigrid")
    from minigrid.wrappers import ImgObsWrapper

    make = functools.partial(gym.make, "MiniGrid-Empty-5x5-v0", max_steps=12)
    fn = make if face == "gymnasium" else lambda: ImgObsWrapper(make())
    report = assert_equivalent([fn] * 3, steps=40, face=face, **FORK)
    assert report.truncated > 0


@pytest.mark.sb3
def test_message_format_is_stable():
    """What users read: the first line names the step, env and field; the causes follow."""
    with pytest.raises(AssertionError) as caught:
        assert_equivalent([wrong_factory] * 2, steps=1, **FORK)
    lines = str(caught.value).splitlines()
    assert lines[0] == "ShmVecEnv and DummyVecEnv differ at reset, env 0, in obs:", lines
    assert lines[1].startswith("  values differ at index (0, 0, 0): ")
    assert lines[3].startswith("Usual causes") and sum(line.startswith("  - ") for line in lines) == 3
    assert max(map(len, lines[2:])) <= 88
