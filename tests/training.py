"""Training equivalence: the algorithms the tests train, and their parameters compared bit for bit.

Imports SB3 and torch: for the tests that train, never for the env modules workers import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from stable_baselines3 import A2C, DQN, PPO
from stable_baselines3.common.env_util import make_vec_env

from tests.envs import TinyImageEnv

# name -> (algorithm, its arguments): small enough for a few seconds of training on TinyImageEnv.
ALGOS: dict[str, tuple[Any, dict[str, Any]]] = {
    "ppo": (PPO, dict(policy="CnnPolicy", n_steps=64, batch_size=64, n_epochs=2)),
    "a2c": (A2C, dict(policy="CnnPolicy", n_steps=8)),
    "dqn": (DQN, dict(policy="CnnPolicy", learning_starts=100, buffer_size=2000, train_freq=4)),
}


def parameters(model: Any) -> list[torch.Tensor]:
    """Copies of the policy's parameters, in the policy's order."""
    return [p.detach().clone() for p in model.policy.parameters()]


def assert_same_parameters(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> None:
    """Every parameter equal bit for bit, and as many of them."""
    assert len(got) == len(want), f"{len(got)} parameters, {len(want)} expected"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m, i=i: f"parameter {i}: {m}")


def assert_moved(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> None:
    """Training changed some parameter: equality with a reference then means something."""
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True)), "training changed nothing"


def assert_trains_as_dummy(
    make_venv: Callable[[bool], Any], make_model: Callable[[Any], Any], steps: int
) -> None:
    """Train ``make_model(venv)`` for ``steps`` on ``make_venv(True)`` (the DummyVecEnv reference),
    then on ``make_venv(False)`` (the VecEnv under test): the training moved the parameters, and both
    runs end with the same ones, bit for bit."""
    runs = []
    for reference in (True, False):
        venv = make_venv(reference)
        try:
            model = make_model(venv)
            before = parameters(model)
            model.learn(steps)
            runs.append((before, parameters(model)))
        finally:
            venv.close()
    (_, want), (before, got) = runs
    assert_moved(before, got)
    assert_same_parameters(got, want)


def train_tiny(algo, vec_env_cls, env_kwargs=None, vec_env_kwargs=None, steps=2048, **algo_kwargs):
    """``algo`` trained ``steps`` env steps on 4 TinyImageEnvs (seed 3) in ``vec_env_cls``; its parameters."""
    venv = make_vec_env(
        TinyImageEnv,
        n_envs=4,
        seed=3,
        vec_env_cls=vec_env_cls,
        env_kwargs=env_kwargs,
        vec_env_kwargs=vec_env_kwargs,
    )
    try:
        model = algo(policy_kwargs={"net_arch": [16]}, env=venv, seed=3, device="cpu", **algo_kwargs)
        model.learn(steps)
        return parameters(model)
    finally:
        venv.close()
