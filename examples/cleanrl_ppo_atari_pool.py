"""CleanRL-style PPO on Atari with shmvec's pool mode: the policy works on one batch of envs while
the others step.

    python examples/cleanrl_ppo_atari_pool.py --num-envs 16 --batch-size 8 --total-timesteps 1000000

The sibling of ``cleanrl_ppo_atari.py`` written for ``send``/``recv`` (EnvPool's calling convention,
as in CleanRL's ``ppo_atari_envpool.py``): ``recv()`` returns the first ``batch_size`` envs to finish
their step with ``infos["env_id"]`` naming them, the network picks their actions, ``send()`` hands
the actions back, and meanwhile the other envs keep stepping in their worker processes.

Because batches come in any order, the rollout storage is per env: env ``i`` writes its ``k``-th
transition of the rollout at ``[k, i]``. Autoreset is ``NEXT_STEP``: after a result with
``terminated or truncated`` the env's next step is its reset, so the action sent for the terminal
observation is ignored and not stored. A rollout ends when every env has ``--num-steps``
transitions; an env that is ahead keeps stepping meanwhile, and those extra steps are not stored.
"""

import argparse
import functools
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

import shmvec


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--env-id", default="ALE/Pong-v5", help="an Atari id from ale-py")
    parser.add_argument("--seed", type=int, default=1, help="seeds the envs, torch and numpy")
    parser.add_argument(
        "--total-timesteps", type=int, default=2048, help="env steps stored in all (a demo; Atari needs ~10M)"
    )
    parser.add_argument("--num-envs", type=int, default=16, help="envs in the pool")
    parser.add_argument("--batch-size", type=int, default=8, help="envs per recv()")
    parser.add_argument(
        "--pool-order", choices=["first_ready", "deterministic"], default="first_ready", help="batch order"
    )
    parser.add_argument("--num-steps", type=int, default=64, help="transitions per env in each rollout")
    parser.add_argument("--learning-rate", type=float, default=2.5e-4, help="Adam's, annealed to 0")
    parser.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    parser.add_argument("--gae-lambda", type=float, default=0.95, help="GAE's lambda")
    parser.add_argument("--num-minibatches", type=int, default=4, help="per pass over a rollout")
    parser.add_argument("--update-epochs", type=int, default=4, help="passes over each rollout")
    parser.add_argument("--clip-coef", type=float, default=0.1, help="PPO's ratio clipping")
    parser.add_argument("--ent-coef", type=float, default=0.01, help="entropy bonus weight")
    parser.add_argument("--vf-coef", type=float, default=0.5, help="value loss weight")
    parser.add_argument("--max-grad-norm", type=float, default=0.5, help="gradient clipping")
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="CPU threads for the network (the rest: env workers)"
    )
    return parser.parse_args()


def make_envs(args: argparse.Namespace) -> shmvec.ShmVectorEnv:
    """``num_envs`` copies of the standard Atari pipeline in a pool of ``batch_size`` per recv."""
    wrappers = [
        functools.partial(gym.wrappers.AtariPreprocessing, noop_max=30, frame_skip=4, screen_size=84),
        functools.partial(gym.wrappers.ClipReward, min_reward=-1, max_reward=1),
        functools.partial(gym.wrappers.FrameStackObservation, stack_size=4),
        gym.wrappers.RecordEpisodeStatistics,  # per env: info["episode"] when an episode ends
    ]
    return shmvec.make_vec(
        f"ale_py:{args.env_id}",
        args.num_envs,
        wrappers=wrappers,
        env_kwargs={"frameskip": 1},
        batch_size=args.batch_size,
        pool_order=args.pool_order,
    )


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature DQN convolutional trunk, shared by a policy head and a value head."""

    def __init__(self, n_actions: int) -> None:
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        hidden = self.network(x / 255.0)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


def main() -> None:
    args = parse_args()
    n, T = args.num_envs, args.num_steps
    rollout_size = n * T
    minibatch_size = rollout_size // args.num_minibatches
    num_iterations = max(1, args.total_timesteps // rollout_size)

    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)

    envs = make_envs(args)
    obs_shape = envs.single_observation_space.shape
    agent = Agent(envs.single_action_space.n)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # Per-env rollout storage: transition k of env i at [k, i]. dones[k, i]: that transition ended
    # the episode (its next state is not part of it).
    obs = torch.zeros((T, n, *obs_shape))
    actions = torch.zeros((T, n))
    logprobs = torch.zeros((T, n))
    rewards = torch.zeros((T, n))
    dones = torch.zeros((T, n))
    values = torch.zeros((T, n))
    next_obs = torch.zeros((n, *obs_shape))  # per env: the state after its last stored transition

    stored = np.zeros(n, np.int64)  # transitions stored per env in this rollout
    waiting = np.full(n, -1)  # per env: the stored transition whose reward is still to come
    env_steps = 0
    start_time = time.time()
    envs.async_reset(seed=args.seed)
    try:
        for iteration in range(1, num_iterations + 1):
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * args.learning_rate
            stored[:] = 0
            waiting[:] = -1
            # 1. Collect: every env stores T transitions, whatever order the batches come in.
            while stored.min() < T or (waiting >= 0).any():
                batch_obs, reward, terminations, truncations, infos = envs.recv()
                env_id = infos["env_id"]
                env_steps += len(env_id)
                ended = np.logical_or(terminations, truncations)
                x = torch.as_tensor(batch_obs, dtype=torch.float32)
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(x)
                for pos, i in enumerate(env_id):
                    k = waiting[i]
                    if k >= 0:  # the result of env i's transition k
                        rewards[k, i] = float(reward[pos])
                        dones[k, i] = float(ended[pos])
                        waiting[i] = -1
                        if k == T - 1:
                            next_obs[i] = x[pos]
                    # NEXT_STEP: after an episode ends, the next step is the reset (the action is
                    # ignored, nothing to store). An env that has its T transitions just steps on.
                    if not ended[pos] and stored[i] < T:
                        k = stored[i]
                        obs[k, i] = x[pos]
                        actions[k, i] = action[pos]
                        logprobs[k, i] = logprob[pos]
                        values[k, i] = value[pos, 0]
                        waiting[i], stored[i] = k, k + 1
                    if "episode" in infos and infos["_episode"][pos]:
                        ret = infos["episode"]["r"][pos]
                        print(f"env_steps={env_steps}, env {i}: episodic_return={ret:.0f}")
                envs.send(action.numpy(), env_id)

            # 2. Advantages by GAE per env, bootstrapped from the state after its last transition.
            with torch.no_grad():
                next_value = agent.get_value(next_obs).reshape(-1)
                advantages = torch.zeros_like(rewards)
                lastgaelam = torch.zeros(n)
                for t in reversed(range(T)):
                    nextnonterminal = 1.0 - dones[t]
                    nextvalues = next_value if t == T - 1 else values[t + 1]
                    delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                    lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                    advantages[t] = lastgaelam
                returns = advantages + values

            # 3. Several epochs of clipped policy-gradient and value updates on shuffled minibatches,
            # while the envs left in flight finish their steps.
            b_obs = obs.reshape((-1, *obs_shape))
            b_logprobs = logprobs.reshape(-1)
            b_actions = actions.reshape(-1)
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            for _ in range(args.update_epochs):
                for mb_inds in torch.randperm(rollout_size).split(minibatch_size):
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                        b_obs[mb_inds], b_actions[mb_inds]
                    )
                    ratio = (newlogprob - b_logprobs[mb_inds]).exp()
                    mb_advantages = b_advantages[mb_inds]
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
                    v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb_inds]) ** 2).mean()
                    loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef

                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()

            sps = int(env_steps / (time.time() - start_time))
            print(f"iteration {iteration}/{num_iterations}: env_steps={env_steps}, SPS={sps}")
    finally:
        envs.close()


# Required: ShmVectorEnv starts worker processes that (with spawn/forkserver) import this file; the
# guard keeps them from running the training loop themselves.
if __name__ == "__main__":
    main()
