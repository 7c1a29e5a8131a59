"""ShmVecEnv inside SB3: wrappers, helpers and algorithms behave exactly as with SB3's own VecEnvs."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from stable_baselines3 import PPO, SAC, HerReplayBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    SubprocVecEnv,
    VecCheckNan,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
)

from shmvec import ShmVecEnv
from shmvec.synthetic import SyntheticImageEnv
from tests.envs import DictImageEnv, GoalEnv, TinyImageEnv
from tests.helpers import assert_step_equal, assert_steps_equal, require
from tests.training import ALGOS, assert_same_parameters, assert_trains_as_dummy, parameters, train_tiny

FORK = functools.partial(ShmVecEnv, start_method="fork")

WRAPPERS = {
    "frame_stack": lambda v: VecFrameStack(v, 4),
    "transpose": VecTransposeImage,
    "normalize": lambda v: VecNormalize(v, norm_obs=True, norm_reward=True),
    "monitor": VecMonitor,
    "check_nan": lambda v: VecCheckNan(v, raise_exception=True),
    "stack+transpose": lambda v: VecTransposeImage(VecFrameStack(v, 3)),
}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_under_vec_wrappers(no_leaks, wrapper):
    make = functools.partial(SyntheticImageEnv, (20, 20, 3), episode_len=(3, 8))
    ref = WRAPPERS[wrapper](make_vec_env(make, n_envs=3, seed=5))
    env = WRAPPERS[wrapper](make_vec_env(make, n_envs=3, seed=5, vec_env_cls=FORK))
    rng = np.random.default_rng(0)
    try:
        assert_step_equal((env.reset(), 0, 0, []), (ref.reset(), 0, 0, []), -1)
        assert_steps_equal(env, ref, 40, rng)
    finally:
        env.close()
        ref.close()


def test_env_helpers(no_leaks):
    venv = make_vec_env(DictImageEnv, n_envs=3, vec_env_cls=FORK)
    try:
        assert venv.env_is_wrapped(Monitor) == [True, True, True]
        assert venv.env_is_wrapped(VecMonitor) == [False] * 3
        venv.set_attr("max_len", 5, indices=[0, -1])
        assert venv.get_attr("max_len") == [5, 12, 5]
        assert venv.env_method("get_wrapper_attr", "max_len", indices=1) == [12]
        venv.reset()
        images = venv.get_images()
        assert len(images) == 3 and all(img.shape == (4, 4, 3) for img in images)
        assert venv.render(mode="rgb_array").shape[-1] == 3
        assert venv.metadata["render_fps"] == 15
    finally:
        venv.close()


def test_rewards_writable_float_dones_bool_fresh_dicts(no_leaks):
    with ShmVecEnv([DictImageEnv] * 2, "fork") as venv:
        venv.reset()
        previous = None
        for _ in range(5):
            obs, rewards, dones, infos = venv.step(np.zeros((2, 2), np.float32))
            assert rewards.dtype == np.float32 and rewards.flags.writeable
            rewards[0] += 1.0
            assert dones.dtype == bool
            assert obs is not previous
            for key in obs:
                obs[key] = obs[key].reshape((2, -1))  # DictReplayBuffer mutates the returned dict
            previous = obs


@pytest.mark.parametrize("name", sorted(ALGOS))
@pytest.mark.parametrize("copy", [True, False])
def test_training_identical_to_dummy(no_leaks, name, copy):
    """Same seed, same data: identical parameters, with copy=True and with zero-copy views."""
    algo, kwargs = ALGOS[name]
    torch.set_num_threads(1)
    want = train_tiny(algo, DummyVecEnv, **kwargs)
    got = train_tiny(algo, ShmVecEnv, vec_env_kwargs={"start_method": "fork", "copy": copy}, **kwargs)
    assert_same_parameters(got, want)


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_training_identical_to_subproc(no_leaks, name):
    algo, kwargs = ALGOS[name]
    torch.set_num_threads(1)
    want = train_tiny(algo, SubprocVecEnv, vec_env_kwargs={"start_method": "fork"}, **kwargs)
    got = train_tiny(
        algo, ShmVecEnv, vec_env_kwargs={"start_method": "fork", "reward_dtype": np.float64}, **kwargs
    )
    assert_same_parameters(got, want)


def test_training_changes_parameters_and_ppo_copy_false_matches(no_leaks):
    """Guard for the equivalence tests: training moves the parameters, so equality means something;
    and PPO trained on zero-copy views (copy=False) ends with DummyVecEnv's parameters, bit for bit."""
    torch.set_num_threads(1)

    def make_venv(reference: bool):
        cls, kwargs = (
            (DummyVecEnv, None) if reference else (ShmVecEnv, {"start_method": "fork", "copy": False})
        )
        return make_vec_env(TinyImageEnv, n_envs=2, seed=3, vec_env_cls=cls, vec_env_kwargs=kwargs)

    def make_model(venv):
        return PPO(
            "CnnPolicy",
            venv,
            n_steps=32,
            batch_size=64,
            n_epochs=1,
            policy_kwargs={"net_arch": [16]},
            seed=3,
            device="cpu",
        )

    assert_trains_as_dummy(make_venv, make_model, 64)


def test_sac_continuous_and_evaluate_policy(no_leaks):
    torch.set_num_threads(1)
    results = []
    for cls in (DummyVecEnv, FORK):
        venv = make_vec_env(TinyImageEnv, n_envs=2, seed=1, vec_env_cls=cls, env_kwargs={"continuous": True})
        try:
            model = SAC(
                "CnnPolicy",
                venv,
                buffer_size=500,
                learning_starts=20,
                batch_size=16,
                seed=1,
                policy_kwargs={"net_arch": [8]},
                device="cpu",
            )
            model.learn(60)
            results.append((parameters(model), evaluate_policy(model, venv, n_eval_episodes=2)))
        finally:
            venv.close()
    assert_same_parameters(results[1][0], results[0][0])
    assert results[0][1] == results[1][1]


def test_her_uses_compute_reward_through_env_method(no_leaks):
    """HER relabels sampled goals with the env's compute_reward, called through env_method: SAC with
    HER ends with DummyVecEnv's parameters bit for bit, which a wrong reward from there would change."""
    torch.set_num_threads(1)

    def make_venv(reference: bool):
        return make_vec_env(GoalEnv, n_envs=2, seed=0, vec_env_cls=DummyVecEnv if reference else FORK)

    def make_model(venv):
        return SAC(
            "MultiInputPolicy",
            venv,
            replay_buffer_class=HerReplayBuffer,
            learning_starts=40,
            batch_size=16,
            buffer_size=1000,
            seed=0,
            device="cpu",
            policy_kwargs={"net_arch": [8]},
        )

    assert_trains_as_dummy(make_venv, make_model, 100)


def test_make_atari_env(no_leaks):
    ale_py = require("ale_py", 'pip install -e ".[atari]"')
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env

    gym.register_envs(ale_py)
    ref = VecFrameStack(make_atari_env("ALE/Pong-v5", n_envs=2, seed=0), 4)
    env = VecFrameStack(make_atari_env("ALE/Pong-v5", n_envs=2, seed=0, vec_env_cls=FORK), 4)
    rng = np.random.default_rng(0)
    try:
        assert_step_equal((env.reset(), 0, 0, []), (ref.reset(), 0, 0, []), -1)
        assert_steps_equal(env, ref, 50, rng)
    finally:
        env.close()
        ref.close()
