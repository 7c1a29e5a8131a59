"""Your own env with a native step: it draws its frame straight into shmvec's shared memory.

    python examples/native_env.py --n-envs 8 --steps 2000

A worker normally calls ``env.step(action)``, takes the observation it returns and copies it into the
ring of shared memory the main process reads. An env that also has ``step_into(action, out)`` is
called that way instead: ``out`` is the env's own row of the ring, and the env writes its
observation there (here with a numba kernel): no observation array is allocated or copied per step,
and no Python runs per pixel. ``step`` and ``step_into`` must give the same results; writing
``step`` on top of ``step_into``, as below, makes that hold by construction.

Catch: a ball falls from the top of an 84x84 frame; move the paddle under it (actions: stay, left,
right). Reward +1 for a catch, -1 for a miss; an episode is one ball.
"""

import argparse
import time

import gymnasium as gym
import numba
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmVecEnv

SIZE, PADDLE, BALL = 84, 12, 3


@numba.njit(cache=True)
def draw(out: np.ndarray, ball_x: int, ball_y: int, paddle_x: int) -> None:
    """Black frame, a white ball, a gray paddle on the bottom rows: into ``out`` (84, 84, 1)."""
    out[:] = 0
    out[ball_y : ball_y + BALL, ball_x : ball_x + BALL, 0] = 255
    out[SIZE - BALL :, paddle_x : paddle_x + PADDLE, 0] = 128


class CatchEnv(gym.Env):
    """The game of the module docstring, with ``step_into`` for shmvec's workers."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0, 255, (SIZE, SIZE, 1), np.uint8)
        self.action_space = spaces.Discrete(3)
        self.ball_x = self.ball_y = self.paddle_x = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.ball_x = int(self.np_random.integers(0, SIZE - BALL))
        self.ball_y = 0
        self.paddle_x = (SIZE - PADDLE) // 2
        obs = np.empty(self.observation_space.shape, np.uint8)
        draw(obs, self.ball_x, self.ball_y, self.paddle_x)
        return obs, {}

    def step_into(self, action, out: np.ndarray):
        """Advance one step and draw the frame into ``out``; (reward, terminated, truncated, info)."""
        move = (0, -3, 3)[int(action)]
        self.paddle_x = min(max(self.paddle_x + move, 0), SIZE - PADDLE)
        self.ball_y += 2
        draw(out, self.ball_x, self.ball_y, self.paddle_x)
        if self.ball_y + BALL < SIZE - BALL:
            return 0.0, False, False, {}
        caught = self.paddle_x <= self.ball_x + BALL - 1 and self.ball_x <= self.paddle_x + PADDLE - 1
        return (1.0 if caught else -1.0), True, False, {}

    def step(self, action):
        obs = np.empty(self.observation_space.shape, np.uint8)
        reward, terminated, truncated, info = self.step_into(action, obs)
        return obs, reward, terminated, truncated, info


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--n-envs", type=int, default=8, help="parallel envs")
    parser.add_argument("--steps", type=int, default=2000, help="batch steps to time")
    args = parser.parse_args()

    fns = [CatchEnv] * args.n_envs
    venv = ShmVecEnv(fns)
    reference = DummyVecEnv(fns)
    try:
        print("native steps:", {s.path for s in venv.native_steps})
        venv.seed(0)
        reference.seed(0)
        assert np.array_equal(venv.reset(), reference.reset())
        rng = np.random.default_rng(0)
        start = time.perf_counter()
        for _ in range(args.steps):
            actions = rng.integers(0, 3, args.n_envs)
            obs, rewards, dones, infos = venv.step(actions)
            want_obs, want_rewards, want_dones, _ = reference.step(actions)
            assert np.array_equal(obs, want_obs) and np.array_equal(rewards, want_rewards)
        seconds = time.perf_counter() - start
        print(f"{args.steps} batch steps equal to DummyVecEnv's ({seconds:.1f} s for both)")
    finally:
        venv.close()
        reference.close()


if __name__ == "__main__":
    main()
