"""DQN on an Atari game with ShmVecEnv.

    python examples/dqn_atari.py --env PongNoFrameskip-v4 --steps 100000

DQN stores (obs, next_obs) pairs in its replay buffer. ShmVecEnv returns fresh arrays by default,
so nothing in the buffer changes under it; with ``copy=False`` it returns read-only views that stay
valid for one more step, which is exactly what SB3's collector needs (tested: same parameters).
"""

import argparse

import ale_py
import gymnasium as gym
from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack

from shmvec import ShmVecEnv


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--env", default="PongNoFrameskip-v4", help="an Atari id that does not skip frames")
    parser.add_argument("--n-envs", type=int, default=4, help="parallel envs")
    parser.add_argument("--steps", type=int, default=100_000, help="total env steps")
    parser.add_argument("--seed", type=int, default=0, help="seed of the envs and the algorithm")
    args = parser.parse_args()

    gym.register_envs(ale_py)
    venv = make_atari_env(
        args.env,
        n_envs=args.n_envs,
        seed=args.seed,
        vec_env_cls=ShmVecEnv,
        vec_env_kwargs={"copy": False},  # zero-copy views: safe for SB3's own collectors
    )
    venv = VecFrameStack(venv, n_stack=4)
    try:
        model = DQN(
            "CnnPolicy",
            venv,
            buffer_size=min(100_000, args.steps),
            learning_starts=min(10_000, args.steps // 2),
            train_freq=4,
            optimize_memory_usage=False,
            seed=args.seed,
            verbose=1,
        )
        model.learn(total_timesteps=args.steps)
    finally:
        venv.close()


if __name__ == "__main__":
    main()
