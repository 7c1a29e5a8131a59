"""What chooses the actions in a benchmark loop: random actions, or an SB3 policy so that inference
is part of the loop as it is in training.

A policy spec is ``none`` (random actions, sampled before the clock starts) or ``algo:Policy``, e.g.
``ppo:CnnPolicy``, ``a2c:MlpPolicy``, ``dqn:CnnPolicy``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

ALGOS = ("a2c", "dqn", "ppo")

Act = Callable[[Any], np.ndarray]


def parse_policy(spec: str) -> tuple[str, str] | None:
    """``("ppo", "CnnPolicy")`` for ``"ppo:CnnPolicy"``; None for ``"none"``.

    :raises ValueError: for an unknown algorithm or a malformed spec.
    """
    if spec == "none":
        return None
    algo, sep, policy = spec.partition(":")
    if not sep or not policy or algo.lower() not in ALGOS:
        raise ValueError(
            f"policy must be 'none' or ALGO:POLICY with ALGO in {', '.join(ALGOS)} (e.g. ppo:CnnPolicy), "
            f"got {spec!r}"
        )
    return algo.lower(), policy


def algo_class(algo: str) -> type:
    """The SB3 algorithm class for ``algo`` (one of :data:`ALGOS`)."""
    import stable_baselines3

    return {"a2c": stable_baselines3.A2C, "dqn": stable_baselines3.DQN, "ppo": stable_baselines3.PPO}[algo]


def make_actor(
    spec: str, env_fn: Callable[[], gym.Env], seed: int = 0, frame_stack: int | None = None
) -> Act | None:
    """A function from a batch of observations to a batch of actions, or None for random actions.

    The policy is built once on a single env (untrained weights: inference costs the same) and used
    for every backend and batch size; ``predict`` takes any batch size, and image batches channels
    first or last (SB3 transposes what needs it).

    :param frame_stack: frames the backends stack (``VecFrameStack``'s); default None: none.
    """
    parsed = parse_policy(spec)
    if parsed is None:
        return None
    algo, policy = parsed
    from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecFrameStack

    venv: VecEnv = DummyVecEnv([env_fn])
    if frame_stack:
        venv = VecFrameStack(venv, frame_stack)
    try:
        kwargs: dict[str, Any] = {"buffer_size": 1} if algo == "dqn" else {}
        model = algo_class(algo)(policy, venv, seed=seed, device="cpu", **kwargs)
    except Exception as exc:
        raise ValueError(f"cannot build policy {spec!r}: {type(exc).__name__}: {exc}") from exc
    finally:
        venv.close()

    def act(obs: Any) -> np.ndarray:
        actions, _ = model.policy.predict(obs, deterministic=False)
        return actions

    return act


def nature_cnn(obs_shape: tuple[int, ...], n_actions: int, channels_last: bool = False) -> Any:
    """SB3's ``NatureCNN`` layers (CleanRL's Atari agent: three convolutions, a 512-unit layer) with
    a linear head of ``n_actions``, untrained, for frames of ``obs_shape`` (channels first, or last
    with ``channels_last``; the input must be given channels first). Imports torch."""
    import torch
    from torch import nn

    c, h, w = (obs_shape[2], *obs_shape[:2]) if channels_last else obs_shape
    trunk = nn.Sequential(
        nn.Conv2d(c, 32, 8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
    )
    with torch.no_grad():
        n_flat = trunk(torch.zeros(1, c, h, w)).shape[1]  # 64 * 7 * 7 for 84x84 frames
    return nn.Sequential(*trunk, nn.Linear(n_flat, 512), nn.ReLU(), nn.Linear(512, n_actions))
