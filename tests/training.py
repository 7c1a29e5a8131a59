"""Training equivalence: the algorithms the tests train, and their parameters compared bit for bit.

Imports SB3 and torch: for the tests that train, never for the env modules workers import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from stable_baselines3 import A2C, DQN, PPO

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
