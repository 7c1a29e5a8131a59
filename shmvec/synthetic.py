"""Synthetic image envs with a chosen frame size and step cost, for benchmarks and tests.

They stand in for camera-like or simulator-like envs whose cost we want to control: ``work_s`` of
CPU work per step (a busy loop, like physics or rendering), or ``io_s`` of waiting (like a simulator
behind a socket), and random episode lengths so auto-resets and terminal observations happen.
Frames are deterministic functions of the seed and the step, so two runs with the same seeds can be
compared array for array.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class SyntheticImageEnv(gym.Env):
    """An env whose observation is a ``shape`` uint8 frame that changes a little every step.

    :param shape: frame shape, e.g. ``(84, 84, 4)`` or ``(512, 512, 3)``.
    :param work_s: seconds of CPU busy-work per step (default 0).
    :param io_s: ``(low, high)`` seconds to sleep per step, drawn uniformly (default None: no sleep).
    :param episode_len: ``(low, high)`` inclusive range of episode lengths in steps; an episode ends
        by termination or, one time in three, by truncation.
    :param texture: if True the first frame is random noise (natural-image-like, hard to compress);
        otherwise it is mostly flat (Atari-like).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(
        self,
        shape: tuple[int, ...] = (84, 84, 4),
        work_s: float = 0.0,
        io_s: tuple[float, float] | None = None,
        episode_len: tuple[int, int] = (50, 200),
        texture: bool = False,
        render_mode: str | None = None,
    ) -> None:
        self.shape = tuple(shape)
        self.work_s = work_s
        self.io_s = io_s
        self.episode_len = episode_len
        self.texture = texture
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0, 255, self.shape, np.uint8)
        self.action_space = spaces.Discrete(4)
        self._frame = np.zeros(self.shape, np.uint8)
        self._t = 0
        self._len = episode_len[1]
        self._truncate = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        """Start an episode: a new first frame and episode length from the env's RNG.

        :returns: the frame and ``{"episode_len": ...}``.
        """
        super().reset(seed=seed)
        rng = self.np_random
        if self.texture:
            self._frame[...] = rng.integers(0, 256, self.shape, dtype=np.uint8)
        else:
            self._frame[...] = rng.integers(0, 256, dtype=np.uint8)
        self._t = 0
        self._len = int(rng.integers(self.episode_len[0], self.episode_len[1] + 1))
        self._truncate = bool(rng.integers(0, 3) == 0)
        return self._frame.copy(), {"episode_len": self._len}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Spend ``work_s`` of CPU and ``io_s`` of sleep, change one row of the frame by the action.

        :returns: frame, reward (1.0 when the action matches the step count mod 4), terminated,
            truncated, ``{}``.
        """
        if self.work_s > 0:
            end = time.perf_counter() + self.work_s
            while time.perf_counter() < end:
                pass
        if self.io_s is not None:
            time.sleep(float(self.np_random.uniform(*self.io_s)))
        self._t += 1
        row = self._t % self.shape[0]
        self._frame[row] += np.uint8(1 + int(action))  # uint8 wraps around
        done = self._t >= self._len
        terminated = done and not self._truncate
        truncated = done and self._truncate
        return self._frame.copy(), float(int(action) == self._t % 4), terminated, truncated, {}

    def render(self) -> np.ndarray:
        """The current frame (its first three channels), a copy."""
        return self._frame[..., :3].copy() if self._frame.ndim == 3 else self._frame.copy()


class CameraEnv(gym.Env):
    """Camera-like frames: a smooth random texture that pans a few pixels per step, plus sensor noise.

    Stands in for natural-image observations (real cameras, rendered 3-D scenes), where almost every
    pixel changes every step and lossless codecs win little; see the guide "Codecs and fidelity".

    :param shape: ``(H, W, 3)`` frame shape (default 256 x 256 x 3).
    :param noise: standard deviation of the per-frame Gaussian sensor noise, in grey levels (default 2).
    :param episode_len: steps per episode (default 200; ends by truncation).
    """

    def __init__(
        self, shape: tuple[int, int, int] = (256, 256, 3), noise: float = 2.0, episode_len: int = 200
    ) -> None:
        self.shape = tuple(shape)
        self.noise = noise
        self.episode_len = episode_len
        self.observation_space = spaces.Box(0, 255, self.shape, np.uint8)
        self.action_space = spaces.Discrete(5)  # stay, pan up / down / left / right
        self._t = 0
        self._pos = np.zeros(2, np.int64)
        self._scene = np.zeros((2 * self.shape[0], 2 * self.shape[1], self.shape[2]), np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        """Start an episode with a new texture and position from the env's RNG.

        :returns: the first frame and an empty info dict.
        """
        super().reset(seed=seed)
        rng = self.np_random
        h, w, c = self._scene.shape
        # Smooth noise octaves: brightness shared by the channels (as in photos, where colour
        # varies more slowly than brightness), plus a coarse colour tint per channel.
        scene = np.zeros((h, w, c), np.float32)
        for cell, weight, channels in ((64, 50.0, 1), (16, 25.0, 1), (4, 12.0, 1), (64, 25.0, c)):
            coarse = rng.standard_normal((-(-h // cell), -(-w // cell), channels)).astype(np.float32)
            scene += weight * _smooth_upsample(coarse, cell, h, w)
        self._scene = scene + 128
        self._pos = rng.integers(0, [h - self.shape[0], w - self.shape[1]])
        self._t = 0
        return self._frame(), {}

    def _frame(self) -> np.ndarray:
        y, x = self._pos
        view = self._scene[y : y + self.shape[0], x : x + self.shape[1]]
        noisy = view + self.np_random.normal(0, self.noise, view.shape).astype(np.float32)
        return np.clip(noisy, 0, 255).astype(np.uint8)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Pan the view 3 pixels by the action (0 stay, 1 up, 2 down, 3 left, 4 right); fresh noise.

        :returns: frame, reward 0.0, terminated False, truncated after ``episode_len`` steps, ``{}``.
        """
        moves = ((0, 0), (-3, 0), (3, 0), (0, -3), (0, 3))
        limit = np.array(self._scene.shape[:2]) - self.shape[:2]
        self._pos = np.clip(self._pos + moves[int(action)], 0, limit)
        self._t += 1
        return self._frame(), 0.0, False, self._t >= self.episode_len, {}


class StripesEnv(gym.Env):
    """A task where fine detail decides: which way do the thin, faint lines run?

    Each step shows a ``(size, size, 3)`` grey frame (a random level, 96-160) covered with
    1-pixel stripes, ``contrast`` grey levels above and below it, running horizontally or
    vertically; action 0 says horizontal, 1 vertical; reward 1 when right. A wrong answer ends the
    episode; new stripes every step, up to ``episode_len`` steps: the return is the number of right
    answers before the first mistake, 0 to ``episode_len`` (random play: about 1).

    Why this task: 1-pixel lines of low contrast are the highest spatial frequency at the smallest
    amplitude, what lossy image codecs quantise away first. With the default contrast of 4 levels,
    JPEG at quality 95 and 75 and WebP at 75 keep the stripes, JPEG at 50 leaves about a tenth of
    their contrast and JPEG at 25 flattens them (36x36 frames, OpenCV's codecs). MiniGrid's objects,
    by contrast, are 8-pixel cells of flat colour. The cue covers the frame, so PPO learns it in a
    few tens of thousands of steps, on 2 CPU cores in a minute or so. Ending on a mistake gives PPO a
    clear signal (with a reward per step and no end, the later steps' random rewards drown it).

    :param size: frame side in pixels (default 36, the smallest SB3's ``CnnPolicy`` takes).
    :param contrast: stripe amplitude in grey levels (default 4).
    :param episode_len: most steps per episode (default 10).
    """

    def __init__(self, size: int = 36, contrast: int = 4, episode_len: int = 10) -> None:
        self.size, self.contrast, self.episode_len = size, contrast, episode_len
        self.observation_space = spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = spaces.Discrete(2)
        self._t = 0
        self._vertical = 0

    def _frame(self) -> np.ndarray:
        self._vertical = int(self.np_random.integers(2))
        level = int(self.np_random.integers(96, 161))
        stripes = np.where(np.arange(self.size) % 2 == 0, self.contrast, -self.contrast) + level
        plane = (
            np.tile(stripes, (self.size, 1)) if self._vertical else np.tile(stripes[:, None], (1, self.size))
        )
        return np.repeat(plane[..., None], 3, axis=2).astype(np.uint8)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        """Start an episode (seeded by ``seed``); the first frame and ``{}``."""
        super().reset(seed=seed)
        self._t = 0
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Reward 1.0 if ``action`` names the stripes' direction (0 horizontal, 1 vertical), then new
        stripes.

        :returns: frame, reward, terminated (the action was wrong), truncated after ``episode_len``
            steps, ``{}``.
        """
        reward = float(int(action) == self._vertical)
        self._t += 1
        return self._frame(), reward, reward == 0.0, self._t >= self.episode_len, {}


def _smooth_upsample(coarse: np.ndarray, cell: int, h: int, w: int) -> np.ndarray:
    """Repeat each value ``cell`` times along both axes, then box-blur with a ``cell`` window (no
    blocky edges), cropped to ``(h, w)``."""
    out = np.repeat(np.repeat(coarse, cell, 0), cell, 1)
    for axis in (0, 1):
        padded = np.concatenate([np.take(out, [0] * cell, axis=axis), out], axis=axis)
        csum = np.cumsum(padded, axis=axis, dtype=np.float64)
        n = out.shape[axis]
        upper = np.take(csum, range(cell, cell + n), axis=axis)
        lower = np.take(csum, range(0, n), axis=axis)
        out = ((upper - lower) / cell).astype(np.float32)
    return out[:h, :w]


def misbehave(fault: str) -> None:
    """Fail the way a real env can, for fault-injection tests and the soak benchmark.

    :param fault: ``kill`` (SIGKILL, like the OOM killer), ``segv`` (a segfault in native code),
        ``abort``, ``exit`` (``os._exit(3)``), ``raise`` (RuntimeError) or ``hang`` (sleeps an hour).
    """
    if fault == "kill":
        os.kill(os.getpid(), 9)
    elif fault == "segv":
        ctypes.string_at(0)
    elif fault == "abort":
        os.abort()
    elif fault == "exit":
        os._exit(3)
    elif fault == "raise":
        raise RuntimeError("simulated env failure")
    elif fault == "hang":
        time.sleep(3600)
    else:
        raise ValueError(f"unknown fault {fault!r}")
