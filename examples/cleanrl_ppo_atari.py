"""CleanRL-style PPO on Atari with a Gymnasium vector env: sync, async or shmvec's shared memory.

    python examples/cleanrl_ppo_atari.py --vec shm --env-id ALE/Breakout-v5 --total-timesteps 1000000

One file, read top to bottom: the env pipeline, the network, then the PPO loop (rollout, advantages,
clipped updates) after CleanRL's ppo_atari.py. ``--vec`` picks the vector env and is the only thing
that changes between the three runs: ``sync`` steps the envs one after the other in this process,
``async`` is gymnasium's AsyncVectorEnv (one process per env), ``shm`` is ``shmvec.ShmVectorEnv`` (a
few worker processes that write observations into shared memory). ``--device`` is where the network
and the rollout live; with ``shm`` the observations come back there as uint8 tensors
(``device=``: straight from shared memory, see the guide "Observations on the policy's device").
Needs Gymnasium >= 1.1 (``AutoresetMode.SAME_STEP``, which Gymnasium 1.0 does not have).
"""

import argparse
import functools
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from torch import nn
from torch.distributions import Categorical

import shmvec

try:
    from gymnasium.vector import AutoresetMode
except ImportError:  # Gymnasium 1.0: its vector envs reset an ended env at the next step only
    raise SystemExit(
        f"{__file__} needs Gymnasium >= 1.1 for AutoresetMode.SAME_STEP, which the loop below "
        f"assumes; this is Gymnasium {gym.__version__}: pip install 'gymnasium>=1.1'"
    ) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--vec", choices=["sync", "async", "shm"], default="shm", help="vector env")
    parser.add_argument("--env-id", default="ALE/Pong-v5", help="an Atari id from ale-py")
    parser.add_argument("--seed", type=int, default=1, help="seeds the envs, torch and numpy")
    parser.add_argument(
        "--total-timesteps", type=int, default=1024, help="env steps in all (a demo; Atari needs ~10M)"
    )
    parser.add_argument("--num-envs", type=int, default=8, help="envs stepped together")
    parser.add_argument("--num-steps", type=int, default=64, help="steps per env in each rollout")
    parser.add_argument("--learning-rate", type=float, default=2.5e-4, help="Adam's step size")
    parser.add_argument(
        "--anneal-lr", action=argparse.BooleanOptionalAction, default=True, help="anneal it linearly to 0"
    )
    parser.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    parser.add_argument("--gae-lambda", type=float, default=0.95, help="GAE's lambda")
    parser.add_argument("--num-minibatches", type=int, default=4, help="per pass over a rollout")
    parser.add_argument("--update-epochs", type=int, default=4, help="passes over each rollout")
    parser.add_argument("--clip-coef", type=float, default=0.1, help="PPO's ratio clipping")
    parser.add_argument("--ent-coef", type=float, default=0.01, help="entropy bonus weight")
    parser.add_argument("--vf-coef", type=float, default=0.5, help="value loss weight")
    parser.add_argument("--max-grad-norm", type=float, default=0.5, help="gradient clipping")
    parser.add_argument("--device", default="cpu", help="the network's and the rollout's: cpu, cuda, cuda:N")
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="CPU threads for the network (the rest: env workers)"
    )
    return parser.parse_args(argv)


def make_envs(vec: str, env_id: str, num_envs: int, device: str = "cpu") -> gym.vector.VectorEnv:
    """``num_envs`` copies of the standard Atari pipeline, in the vector env ``vec`` (``shm``:
    observations as tensors on ``device``)."""
    # Each env: no-op starts, 4 frames per action, 84x84 grey frames, rewards clipped to [-1, 1],
    # the last 4 frames stacked into one (4, 84, 84) observation. (The env itself is made with
    # frameskip=1, below: AtariPreprocessing does the skipping.)
    wrappers = [
        functools.partial(gym.wrappers.AtariPreprocessing, noop_max=30, frame_skip=4, screen_size=84),
        functools.partial(gym.wrappers.ClipReward, min_reward=-1, max_reward=1),
        functools.partial(gym.wrappers.FrameStackObservation, stack_size=4),
    ]
    # "ale_py:" makes gymnasium import ale_py (which registers the Atari ids) in every process that
    # builds an env, worker processes included.
    env_id = f"ale_py:{env_id}"
    # SAME_STEP: an env that ends an episode is reset within the same step, so the observation
    # after a done is the first of the next episode -- the classic behaviour PPO's GAE below assumes.
    mode = AutoresetMode.SAME_STEP
    if vec == "shm":
        envs = shmvec.make_vec(
            env_id,
            num_envs,
            wrappers=wrappers,
            env_kwargs={"frameskip": 1},
            autoreset_mode=mode,
            device=device,
        )
    else:
        envs = gym.make_vec(
            env_id,
            num_envs,
            vectorization_mode=vec,
            vector_kwargs={"autoreset_mode": mode},
            wrappers=wrappers,
            frameskip=1,
        )
    return RecordEpisodeStatistics(envs)  # adds infos["episode"] when an episode ends


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature DQN convolutional trunk, shared by a policy head and a value head (SB3's
    ``CnnPolicy`` is the same network). Observations are channels first: (4, 84, 84) for Atari."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int) -> None:
        super().__init__()
        convs = nn.Sequential(
            layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():  # 64 * 7 * 7 for 84x84 frames
            n_flat = convs(torch.zeros(1, *obs_shape)).shape[1]
        self.network = nn.Sequential(*convs, layer_init(nn.Linear(n_flat, 512)), nn.ReLU())
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


def train(
    envs: gym.vector.VectorEnv,
    args: argparse.Namespace,
    on_episode: Callable[[int, float], None] | None = None,
) -> Agent:
    """PPO on ``envs`` (which must auto-reset in the same step) for ``args.total_timesteps`` env
    steps; ``on_episode(global_step, return)`` for each finished episode (default: print it)."""
    if on_episode is None:
        on_episode = lambda step, ret: print(f"global_step={step}, episodic_return={ret:.0f}")  # noqa: E731
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = max(1, args.total_timesteps // batch_size)

    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)

    device = torch.device(args.device)
    agent = Agent(envs.single_observation_space.shape, envs.single_action_space.n).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # Rollout storage: one row per step, one column per env.
    obs = torch.zeros((args.num_steps, args.num_envs, *envs.single_observation_space.shape), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    global_step = 0
    start_time = time.time()
    next_obs, _ = envs.reset(seed=args.seed)
    # A numpy batch is copied to the device here; one from ShmVectorEnv(device=...) is there already
    # (as_tensor then does nothing), uint8 as stored: float only on the device.
    next_obs = torch.as_tensor(next_obs, device=device).float()
    next_done = torch.zeros(args.num_envs, device=device)
    for iteration in range(1, num_iterations + 1):
        if args.anneal_lr:  # linearly to 0 over the run
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # 1. Collect a rollout of num_steps steps in every env with the current policy.
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device)
            next_obs = torch.as_tensor(next_obs, device=device).float()
            done = np.logical_or(terminations, truncations)
            next_done = torch.as_tensor(done, dtype=torch.float32, device=device)
            if "episode" in infos:
                for i in np.flatnonzero(infos["_episode"]):
                    on_episode(global_step, float(infos["episode"]["r"][i]))

        # 2. Advantages by GAE, bootstrapped from the value of the observation after the rollout.
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = (
                    delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                )
            returns = advantages + values

        # 3. Several epochs of clipped policy-gradient and value updates on shuffled minibatches.
        b_obs = obs.reshape((-1, *envs.single_observation_space.shape))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        for _ in range(args.update_epochs):
            for mb_inds in torch.randperm(batch_size, device=device).split(minibatch_size):
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

        sps = int(global_step / (time.time() - start_time))
        print(f"iteration {iteration}/{num_iterations}: global_step={global_step}, SPS={sps}")
    return agent


def main() -> None:
    args = parse_args()
    envs = make_envs(args.vec, args.env_id, args.num_envs, args.device)
    try:
        train(envs, args)
    finally:
        envs.close()


# Required: ShmVectorEnv (and AsyncVectorEnv with spawn/forkserver) start worker processes that
# import this file; the guard keeps them from running the training loop themselves.
if __name__ == "__main__":
    main()
