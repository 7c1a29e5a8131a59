"""PPO on an Atari game with ShmVecEnv: the standard SB3 Atari recipe, one argument changed.

    python examples/ppo_atari.py --env BreakoutNoFrameskip-v4 --steps 100000

``make_atari_env`` applies the usual preprocessing (84x84 grey frames, 4 frames per action, episodic
life) to a ``NoFrameskip-v4`` game, as SB3 and rl-zoo3 do: an ``ALE/...-v5`` id skips 4 frames itself,
and under SB3's wrapper every action would last 16 (shmvec warns);
``VecFrameStack`` stacks 4 frames. ``vec_env_cls=ShmVecEnv`` is the only change from SB3's own
example: observations come back through shared memory instead of pickled pipes.
"""

import argparse

import ale_py
import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack

from shmvec import ShmVecEnv


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--env", default="PongNoFrameskip-v4", help="an Atari id that does not skip frames")
    parser.add_argument("--n-envs", type=int, default=8, help="parallel envs")
    parser.add_argument("--steps", type=int, default=100_000, help="total env steps")
    parser.add_argument("--seed", type=int, default=0, help="seed of the envs and the algorithm")
    args = parser.parse_args()

    gym.register_envs(ale_py)
    venv = make_atari_env(args.env, n_envs=args.n_envs, seed=args.seed, vec_env_cls=ShmVecEnv)
    venv = VecFrameStack(venv, n_stack=4)
    try:
        # n_steps x n_envs is the rollout size: change n_envs and you change what PPO learns from.
        model = PPO("CnnPolicy", venv, n_steps=128, batch_size=256, n_epochs=4, seed=args.seed, verbose=1)
        model.learn(total_timesteps=args.steps)
    finally:
        venv.close()


if __name__ == "__main__":  # required: ShmVecEnv's default start method re-imports this file in workers
    main()
