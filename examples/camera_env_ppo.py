"""A camera-like robot env (large RGB frames + a proprioceptive vector) trained with PPO.

    python examples/camera_env_ppo.py --steps 20000

This is where shared memory pays: each step moves a 256x256x3 frame per env. With SubprocVecEnv
every frame is pickled through a pipe (twice at episode end, once more inside ``info``); with
ShmVecEnv it is written once into shared memory and copied once in the main process.
"""

import argparse

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from shmvec import ShmVecEnv


class CameraReachEnv(gym.Env):
    """Move a point towards a target seen by a camera. Observation: ``{"image", "proprio"}``."""

    def __init__(self, size: int = 256, max_steps: int = 100) -> None:
        self.size, self.max_steps = size, max_steps
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (size, size, 3), np.uint8),
                "proprio": spaces.Box(-1.0, 1.0, (4,), np.float32),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self) -> dict:
        image = self.background.copy()
        tx, ty = ((self.target + 1) / 2 * (self.size - 9)).astype(int)
        image[ty : ty + 8, tx : tx + 8] = (255, 0, 0)
        return {"image": image, "proprio": np.concatenate([self.pos, self.velocity]).astype(np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        # Textured background, like a real camera: hard to compress, costly to pickle.
        self.background = rng.integers(0, 64, (self.size, self.size, 3), dtype=np.uint8)
        self.pos = np.zeros(2, np.float32)
        self.velocity = np.zeros(2, np.float32)
        self.target = rng.uniform(-1, 1, 2).astype(np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.velocity = np.clip(np.asarray(action, np.float32) * 0.1, -1, 1)
        self.pos = np.clip(self.pos + self.velocity, -1, 1)
        distance = float(np.linalg.norm(self.pos - self.target))
        terminated = distance < 0.1
        return self._obs(), -distance, terminated, self.t >= self.max_steps, {"distance": distance}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--n-envs", type=int, default=4, help="parallel envs")
    parser.add_argument("--size", type=int, default=256, help="camera frame height and width (pixels)")
    parser.add_argument("--steps", type=int, default=20_000, help="total env steps")
    args = parser.parse_args()

    venv = make_vec_env(
        CameraReachEnv, n_envs=args.n_envs, seed=0, env_kwargs={"size": args.size}, vec_env_cls=ShmVecEnv
    )
    try:
        model = PPO("MultiInputPolicy", venv, n_steps=64, batch_size=64, seed=0, verbose=1)
        model.learn(total_timesteps=args.steps)
    finally:
        venv.close()


if __name__ == "__main__":
    main()
