"""Training through ShmVectorEnv gives SyncVectorEnv's parameters: CleanRL's PPO update, shrunk, on
both, with the same seeds. (Its own module: once torch is imported, every later ``gc.collect()`` of
``no_leaks`` is slower.)"""

from __future__ import annotations

from contextlib import closing

import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from tests.envs import TinyImageEnv
from tests.vector_helpers import (
    NEXT,
    SAME,
    make,
)


def _cleanrl_ppo(envs, seed: int = 0, num_steps: int = 32, updates: int = 3) -> list:
    """The core of CleanRL's ppo_atari.py, shrunk: a tiny CNN, GAE, clipped surrogate, minibatches."""
    import torch
    from torch import nn
    from torch.distributions import Categorical

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    n_envs, n_actions = envs.num_envs, envs.single_action_space.n
    trunk = nn.Sequential(
        nn.Conv2d(1, 4, 8, stride=4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 32), nn.ReLU()
    )
    actor, critic = nn.Linear(32, n_actions), nn.Linear(32, 1)
    params = [*trunk.parameters(), *actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=2.5e-4, eps=1e-5)

    def policy(x):
        hidden = trunk(x.permute(0, 3, 1, 2) / 255.0)
        return Categorical(logits=actor(hidden)), critic(hidden).squeeze(-1)

    obs_shape = envs.single_observation_space.shape
    obs_buf = torch.zeros((num_steps, n_envs, *obs_shape))
    actions, logprobs, rewards, dones, values = (torch.zeros((num_steps, n_envs)) for _ in range(5))
    next_obs = torch.tensor(envs.reset(seed=seed)[0], dtype=torch.float32)
    next_done = torch.zeros(n_envs)
    for _ in range(updates):
        for step in range(num_steps):
            obs_buf[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                dist, value = policy(next_obs)
                action = dist.sample()
            actions[step], logprobs[step], values[step] = action, dist.log_prob(action), value
            obs, reward, terminations, truncations, _ = envs.step(action.numpy())
            rewards[step] = torch.tensor(reward, dtype=torch.float32)
            next_obs = torch.tensor(obs, dtype=torch.float32)
            next_done = torch.tensor(np.logical_or(terminations, truncations), dtype=torch.float32)
        with torch.no_grad():
            next_value = policy(next_obs)[1]
            advantages = torch.zeros_like(rewards)
            last = 0
            for t in reversed(range(num_steps)):
                nonterminal = 1.0 - (next_done if t == num_steps - 1 else dones[t + 1])
                following = next_value if t == num_steps - 1 else values[t + 1]
                delta = rewards[t] + 0.99 * following * nonterminal - values[t]
                advantages[t] = last = delta + 0.99 * 0.95 * nonterminal * last
            returns = advantages + values
        b_obs, b_actions, b_logprobs = obs_buf.flatten(0, 1), actions.flatten(), logprobs.flatten()
        b_advantages, b_returns = advantages.flatten(), returns.flatten()
        for _ in range(2):
            for idx in torch.randperm(num_steps * n_envs).split(32):
                dist, value = policy(b_obs[idx])
                ratio = (dist.log_prob(b_actions[idx]) - b_logprobs[idx]).exp()
                adv = b_advantages[idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
                loss = pg_loss + 0.5 * ((value - b_returns[idx]) ** 2).mean() - 0.01 * dist.entropy().mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, 0.5)
                optimizer.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.name)
def test_cleanrl_ppo_update_matches_sync(no_leaks, mode):
    """384 env steps and 3 PPO updates on 4 envs: parameters bit-equal to the same loop on
    SyncVectorEnv (any difference in any observation, reward or flag would show)."""
    import torch

    fns = [TinyImageEnv] * 4
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    with closing(ref):
        want = _cleanrl_ppo(ref)
    with closing(make(fns, autoreset_mode=mode)) as env:
        got = _cleanrl_ppo(env)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"parameter {i} differs by up to {(a - b).abs().max().item()}"
