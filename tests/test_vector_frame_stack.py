"""``ShmVectorEnv(frame_stack=K)`` equals ``SyncVectorEnv`` over the same envs each wrapped in
:class:`shmvec.frame_stack.FrameStack` (SB3's ``VecFrameStack`` rules), array for array, in all three
autoreset modes: zeros at the start of every episode, ``final_obs`` stacked (``SAME_STEP``)."""

from __future__ import annotations

import functools
from contextlib import closing

import gymnasium as gym
import pytest
from gymnasium.wrappers import FilterObservation

import shmvec
from shmvec.frame_stack import stacked_factory
from shmvec.synthetic import SyntheticImageEnv
from tests import test_vector_env as vector
from tests.envs import make_dict_env

NEXT, SAME, DISABLED = vector.NEXT, vector.SAME, vector.DISABLED


def dict_of_boxes() -> gym.Env:
    # FrameStack stacks Box leaves only, as VecFrameStack: drop the Discrete key of the test Dict env.
    return FilterObservation(make_dict_env(12, 8), ["image", "vec"])


ENVS = {
    "channels_last": functools.partial(SyntheticImageEnv, (10, 12, 3), episode_len=(3, 9)),
    "channels_first": functools.partial(SyntheticImageEnv, (2, 10, 12), episode_len=(3, 9)),
    "dict": dict_of_boxes,
}


@pytest.fixture
def stacked_kinds(monkeypatch):
    """Register each env with its SyncVectorEnv reference (the env wrapped in FrameStack in this
    process) in test_vector_env's table, so its comparison loop runs them."""

    def register(n_stack: int, order=None) -> None:
        for name, fn in ENVS.items():
            ref = functools.partial(stacked_factory, fn, n_stack, order)
            monkeypatch.setitem(vector.ENVS, f"stack-{name}", (fn, ref))

    return register


@pytest.mark.parametrize("kind", sorted(ENVS))
@pytest.mark.parametrize("mode", [NEXT, SAME, DISABLED], ids=lambda m: m.name)
def test_frame_stack_matches_sync_over_frame_stack(no_leaks, stacked_kinds, kind, mode):
    stacked_kinds(4)
    ends = vector.run_both(f"stack-{kind}", mode, n_envs=5, steps=40, frame_stack=4)
    assert ends == {"terminated", "truncated"}, "the run must end episodes both ways to mean anything"


@pytest.mark.parametrize("order", ["first", "last"])
def test_frame_stack_channels_order(no_leaks, stacked_kinds, order):
    stacked_kinds(3, order)
    vector.run_both(
        "stack-channels_last", SAME, n_envs=3, steps=25, frame_stack=3, frame_stack_channels_order=order
    )


def test_frame_stack_with_codec_and_without_copy(no_leaks, stacked_kinds):
    stacked_kinds(2)
    vector.run_both("stack-channels_last", SAME, n_envs=2, steps=15, frame_stack=2, codec="delta")
    vector.run_both("stack-dict", NEXT, n_envs=2, steps=15, frame_stack=2, copy=False)


def test_frame_stack_space_and_bad_value(no_leaks):
    with closing(shmvec.ShmVectorEnv([ENVS["channels_last"]] * 2, start_method="fork", frame_stack=4)) as env:
        assert env.single_observation_space.shape == (10, 12, 12)
        assert env.observation_space.shape == (2, 10, 12, 12)
    with pytest.raises(ValueError, match="frame_stack must be a whole number >= 1 or None, got 0"):
        shmvec.ShmVectorEnv([ENVS["channels_last"]], start_method="fork", frame_stack=0)
