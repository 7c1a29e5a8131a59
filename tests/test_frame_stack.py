"""``ShmVecEnv(frame_stack=K)`` gives exactly what ``VecFrameStack(DummyVecEnv(...), K)`` gives."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import FilterObservation
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack

from shmvec import EnvError, ShmVecEnv
from shmvec.synthetic import SyntheticImageEnv
from tests.envs import TinyImageEnv, make_dict_env
from tests.helpers import assert_obs_equal, assert_step_equal, sample_actions
from tests.training import ALGOS, assert_same_parameters, parameters


def dict_of_boxes() -> gym.Env:
    # VecFrameStack stacks Box leaves only: drop the Discrete key of the test Dict env.
    return FilterObservation(make_dict_env(12, 8), ["image", "vec"])


ENVS = {
    "channels_last": functools.partial(SyntheticImageEnv, (10, 12, 3), episode_len=(3, 9)),
    "channels_first": functools.partial(SyntheticImageEnv, (2, 10, 12), episode_len=(3, 9)),
    "vector": functools.partial(gym.make, "CartPole-v1"),
    "dict": dict_of_boxes,
}


def run_both(make, n_stack: int, n_envs: int = 5, steps: int = 60, seed: int = 5, order=None, **kwargs):
    fns = [make] * n_envs
    ref = VecFrameStack(DummyVecEnv(fns), n_stack, channels_order=order)
    env = ShmVecEnv(fns, frame_stack=n_stack, frame_stack_channels_order=order, **kwargs)
    try:
        assert env.observation_space == ref.observation_space
        rng = np.random.default_rng(seed)
        ref.seed(seed)
        env.seed(seed)
        assert_obs_equal(env.reset(), ref.reset(), "reset obs")
        ended = 0
        for t in range(steps):
            actions = sample_actions(env.action_space, n_envs, rng)
            got = env.step(actions)
            assert_step_equal(got, ref.step(actions), t)
            ended += int(got[2].sum())
        assert ended > 0, "no episode ended: terminal observations were not compared"
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("kind", sorted(ENVS))
@pytest.mark.parametrize("n_stack", [1, 4])
def test_matches_vec_frame_stack(no_leaks, kind, n_stack):
    run_both(ENVS[kind], n_stack, start_method="fork", n_workers=2)


@pytest.mark.parametrize("order", ["first", "last", {"image": "first", "vec": "last"}])
def test_explicit_channels_order(no_leaks, order):
    make = ENVS["dict"] if isinstance(order, dict) else ENVS["channels_last"]
    run_both(make, 3, start_method="fork", n_workers=2, order=order)


def test_with_a_codec_and_without_copy(no_leaks):
    run_both(ENVS["channels_last"], 4, start_method="fork", n_workers=2, codec="lz4")
    run_both(ENVS["channels_last"], 4, start_method="fork", n_workers=2, copy=False)


def test_under_forkserver(no_leaks):
    run_both(ENVS["channels_last"], 2, n_envs=2, steps=20, start_method="forkserver", n_workers=1)


def _train(algo, stacked_in_workers: bool, **algo_kwargs):
    if stacked_in_workers:
        venv = make_vec_env(
            TinyImageEnv,
            n_envs=4,
            seed=3,
            vec_env_cls=ShmVecEnv,
            vec_env_kwargs={"start_method": "fork", "frame_stack": 4},
        )
    else:
        venv = VecFrameStack(make_vec_env(TinyImageEnv, n_envs=4, seed=3, vec_env_cls=DummyVecEnv), 4)
    try:
        model = algo(policy_kwargs={"net_arch": [16]}, env=venv, seed=3, device="cpu", **algo_kwargs)
        model.learn(1024)
        return parameters(model)
    finally:
        venv.close()


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_training_identical_to_vec_frame_stack(no_leaks, name):
    algo, kwargs = ALGOS[name]
    torch.set_num_threads(1)
    want = _train(algo, False, **kwargs)
    got = _train(algo, True, **kwargs)
    assert_same_parameters(got, want)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_bad_frame_stack_is_refused(bad):
    with pytest.raises(ValueError, match="frame_stack must be"):
        ShmVecEnv([ENVS["channels_last"]], start_method="fork", frame_stack=bad)


def test_unstackable_space_names_the_env(no_leaks):
    with pytest.raises(EnvError, match="frame_stack stacks Box observations only.*Discrete"):
        ShmVecEnv([functools.partial(gym.make, "FrozenLake-v1")], start_method="fork", frame_stack=2)


def test_bad_channels_order_is_refused(no_leaks):
    with pytest.raises(EnvError, match="channels_order must be"):
        ShmVecEnv(
            [ENVS["channels_last"]], start_method="fork", frame_stack=2, frame_stack_channels_order="middle"
        )
