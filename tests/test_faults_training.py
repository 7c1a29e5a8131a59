"""Training through faults: PPO in restart mode, with an env whose worker is killed again and again,
ends exactly as with DummyVecEnv over envs that end and restart the way restart mode says."""

from __future__ import annotations

import functools

import gymnasium as gym
import pytest
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmVecEnv
from shmvec.engine.restart import restart_seed
from tests.fault_helpers import N_ENVS, faulty_fns
from tests.training import assert_same_parameters, parameters


def _ppo(venv, steps: int) -> list:
    torch.set_num_threads(1)
    try:
        model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
        model.learn(steps)
        return parameters(model)
    finally:
        venv.close()


def _monitored(fn):
    return Monitor(fn())


class _RebuiltEvery(gym.Env):
    """What restart mode makes of an env whose worker dies at the env's ``every``-th step, for
    DummyVecEnv: that step ends the episode as truncated, with reward 0 and the last observation; the
    env is built again and reset with :func:`restart_seed` of the last seed it was given."""

    def __init__(self, make, every: int) -> None:
        self.make, self.every = make, every
        self.env, self.steps, self.restarts, self.rebuild = make(), 0, 0, False
        self.observation_space, self.action_space = self.env.observation_space, self.env.action_space
        self.render_mode = self.env.render_mode
        self.seed_given: int | None = None

    def reset(self, *, seed=None, options=None):
        if self.rebuild:
            self.restarts += 1
            self.env, self.steps, self.rebuild = self.make(), 0, False
            seed = restart_seed(self.seed_given, self.restarts)
        elif seed is not None:
            self.seed_given = seed
        self.last, info = self.env.reset(seed=seed, options=options)
        return self.last, info

    def step(self, action):
        self.steps += 1
        if self.steps == self.every:  # the worker died in this step: its result is lost
            self.rebuild = True
            return self.last, 0.0, False, True, {}
        self.last, *rest = self.env.step(action)
        return self.last, *rest


def _ppo_as_dummy_through_restarts(crash_every: int, steps: int) -> int:
    """PPO on 4 envs of which env 3 is SIGKILLed at every ``crash_every``-th step of its life, so that
    worker 1's envs (2 and 3) are rebuilt: it ends with the parameters it gets from DummyVecEnv over
    envs that end and restart at those steps the way restart mode says, bit for bit (terminal
    observation, truncation, reward 0, the restart seeds). Returns the restarts."""
    fns = [functools.partial(_monitored, fn) for fn in faulty_fns("kill", at=crash_every)]
    venv = ShmVecEnv(fns, "fork", n_workers=2, on_crash="restart", restart_window=None)
    got = _ppo(venv, steps)
    fns = [functools.partial(_monitored, fn) for fn in faulty_fns(None)]
    fns[2:] = [functools.partial(_RebuiltEvery, fn, crash_every) for fn in fns[2:]]
    assert_same_parameters(got, _ppo(DummyVecEnv(fns), steps))
    return venv.n_restarts


@pytest.mark.timeout(120)
def test_ppo_through_a_crashing_env_trains_as_dummy_with_the_same_restarts(no_leaks):
    assert _ppo_as_dummy_through_restarts(crash_every=150, steps=1024) == 1024 // N_ENVS // 150


@pytest.mark.slow
def test_ppo_through_an_env_crashing_every_5000_steps(no_leaks):
    assert _ppo_as_dummy_through_restarts(crash_every=5000, steps=41_000) == 2
