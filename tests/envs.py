"""Small deterministic envs for the tests. Import only numpy and gymnasium here: spawn workers
import this module, and pulling torch in would make every worker start slowly."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec.synthetic import misbehave


class DictImageEnv(gym.Env):
    """Dict observation (image + vector + Discrete), returned in a different key order than the space,
    random episode lengths ending by termination or truncation, non-empty infos on some steps."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, size: int = 16, max_len: int = 12) -> None:
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (size, size, 3), np.uint8),
                "vec": spaces.Box(-1.0, 1.0, (5,), np.float32),
                "count": spaces.Discrete(100),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.size, self.max_len = size, max_len
        self.render_mode = "rgb_array"
        self.t = 0

    def _obs(self) -> dict[str, Any]:
        rng = self.np_random
        return {  # deliberately not in space order
            "count": self.t,
            "vec": rng.uniform(-1, 1, 5).astype(np.float32),
            "image": rng.integers(0, 256, (self.size, self.size, 3), dtype=np.uint8),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.len = int(self.np_random.integers(1, self.max_len))
        return self._obs(), {"reset_token": int(self.np_random.integers(1 << 30)), "options": options}

    def step(self, action):
        self.t += 1
        terminated = self.t >= self.len and self.np_random.random() < 0.5
        truncated = self.t >= self.len and not terminated
        info = {"a": np.asarray(action).tolist()} if self.t % 3 == 0 else {}
        return self._obs(), float(np.sum(action)) + self.t, terminated, truncated, info

    def render(self):
        return np.full((4, 4, 3), self.t, np.uint8)

    def worker_pid(self) -> int:
        return os.getpid()

    def modules_loaded(self, name: str) -> bool:
        return name in sys.modules

    @property
    def loaded_modules(self) -> frozenset[str]:
        """The modules of this env's process (an attribute: Tianshou's faces have no method calls)."""
        return frozenset(sys.modules)

    def threads_env(self) -> str | None:
        return os.environ.get("OMP_NUM_THREADS")

    def blas_threads(self) -> int:
        from threadpoolctl import threadpool_info

        return max((pool["num_threads"] for pool in threadpool_info()), default=1)

    def thread_count(self) -> int:
        """Threads of this process (Linux)."""
        return len(os.listdir("/proc/self/task"))

    def matmul_then_threads(self) -> tuple[bool, int]:
        """A matrix product big enough for OpenBLAS to use its threads if it may: whether it is right,
        and the threads of this process after it."""
        a = np.arange(300 * 300, dtype=np.float64).reshape(300, 300) % 7
        right = bool(np.allclose(a @ np.eye(300), a))
        return right, self.thread_count()

    def fail(self, message: str = "boom"):
        raise ValueError(message)


class TupleEnv(gym.Env):
    """Tuple observation (MultiDiscrete, MultiBinary, Box float64) with a MultiBinary action space."""

    def __init__(self) -> None:
        self.observation_space = spaces.Tuple(
            (spaces.MultiDiscrete([3, 5]), spaces.MultiBinary(4), spaces.Box(-5, 5, (2, 3), np.float64))
        )
        self.action_space = spaces.MultiBinary(3)
        self.t = 0

    def _obs(self):
        rng = self.np_random
        return (
            rng.integers([0, 0], [3, 5]).astype(np.int64),
            rng.integers(0, 2, 4).astype(np.int8),
            rng.uniform(-5, 5, (2, 3)),
        )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        done = self.np_random.random() < 0.2
        return self._obs(), float(np.sum(action)), done, self.t >= 7, {"t": self.t}


class SlowStepEnv(gym.Env):
    """Sleeps ``delay`` seconds in step (a hung env when delay is large)."""

    observation_space = spaces.Box(0, 1, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, delay: float = 60.0) -> None:
        self.delay = delay

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        time.sleep(self.delay)
        return np.zeros(3, np.float32), 0.0, False, False, {}


class BadObsEnv(gym.Env):
    """Returns an observation of the wrong shape (or dtype) after ``after`` steps."""

    observation_space = spaces.Dict({"image": spaces.Box(0, 255, (8, 8, 3), np.uint8)})
    action_space = spaces.Discrete(2)

    def __init__(self, bad: str = "shape", after: int = 1) -> None:
        self.bad, self.after, self.t = bad, after, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"image": np.zeros((8, 8, 3), np.uint8)}, {}

    def step(self, action):
        self.t += 1
        image = np.zeros((8, 8, 3), np.uint8)
        if self.t >= self.after:
            image = np.zeros((8, 8), np.uint8) if self.bad == "shape" else np.zeros((8, 8, 3), np.float32)
        return {"image": image}, 0.0, False, False, {}


def make_dict_env(size: int = 16, max_len: int = 12) -> gym.Env:
    return DictImageEnv(size, max_len)


def make_tuple_env() -> gym.Env:
    return TupleEnv()


class TinyImageEnv(gym.Env):
    """36x36x1 image (the smallest NatureCNN takes) with a learnable signal: reward 1 when the action
    matches the bright quadrant. Episodes end by termination or by a time limit."""

    observation_space = spaces.Box(0, 255, (36, 36, 1), np.uint8)

    def __init__(self, n_actions: int = 4, continuous: bool = False) -> None:
        self.action_space = spaces.Box(-1, 1, (2,), np.float32) if continuous else spaces.Discrete(n_actions)
        self.t = 0

    def _obs(self):
        self.target = int(self.np_random.integers(4))
        img = np.zeros((36, 36, 1), np.uint8)
        r, c = divmod(self.target, 2)
        img[r * 18 : (r + 1) * 18, c * 18 : (c + 1) * 18] = 200
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        if isinstance(self.action_space, spaces.Box):
            reward = -float(np.abs(np.asarray(action) - self.target / 4).sum())
        else:
            reward = float(int(action) == self.target)
        terminated = bool(self.np_random.random() < 0.05)
        return self._obs(), reward, terminated, self.t >= 25, {}


class GoalEnv(gym.Env):
    """A minimal goal-conditioned env for HER: reach a 2-D goal in a few steps."""

    def __init__(self) -> None:
        box = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})
        self.action_space = spaces.Box(-0.2, 0.2, (2,), np.float32)

    def _obs(self):
        return {
            "observation": self.pos.copy(),
            "achieved_goal": self.pos.copy(),
            "desired_goal": self.goal.copy(),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.zeros(2, np.float32)
        self.goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.t = 0
        return self._obs(), {}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return -(np.linalg.norm(achieved_goal - desired_goal, axis=-1) > 0.1).astype(np.float32)

    def step(self, action):
        self.t += 1
        self.pos = np.clip(self.pos + action, -1, 1).astype(np.float32)
        reward = float(self.compute_reward(self.pos, self.goal, {}))
        return self._obs(), reward, reward == 0.0, self.t >= 10, {}


class Gate:
    """A gate between a test and an env's steps, in any worker under any start method: closed while
    the file ``path`` exists. A step that meets it closed first creates ``path + ".waiting"`` (the
    env's own word that it is inside ``step``), then waits until the test opens it."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.waiting = self.path + ".waiting"

    def close(self) -> None:
        open(self.path, "w").close()

    def open(self) -> None:
        os.remove(self.path)

    def pass_through(self) -> None:
        """In the env: return once the gate is open."""
        if os.path.exists(self.path):
            open(self.waiting, "w").close()
            while os.path.exists(self.path):
                time.sleep(0.001)


class FaultyEnv(gym.Env):
    """A small deterministic image env that misbehaves on purpose.

    :param fault: see :func:`misbehave`; None never misbehaves.
    :param where: ``"step"``: at the ``at``-th step of this env's life; ``"reset"``: at its ``at``-th
        reset; ``"render"``/``"method"``: when ``render()``/``misbehave_now()`` is called.
    :param delay: seconds to sleep in every step (a slow env).
    :param gate: a :class:`Gate`'s path: every step waits there while the test holds it closed (to
        catch a worker mid-step, or hold one env back, without guessing at timings).
    Episodes end every 5 steps, alternately by termination (the episodes its 1st, 3rd... reset
    began) and truncation.
    """

    metadata = {"render_modes": ["rgb_array"]}
    observation_space = spaces.Box(0, 255, (4, 4, 1), np.uint8)
    action_space = spaces.Discrete(3)

    def __init__(
        self,
        fault: str | None = None,
        at: int = 3,
        where: str = "step",
        delay: float = 0.0,
        gate: str | None = None,
    ) -> None:
        self.fault, self.at, self.where, self.delay = fault, at, where, delay
        self.gate = None if gate is None else Gate(gate)
        self.render_mode = "rgb_array"
        self.steps = self.resets = self.t = 0

    def _maybe(self, where: str, count: int | None = None) -> None:
        if self.fault is not None and self.where == where and (count is None or count == self.at):
            misbehave(self.fault)

    def _obs(self) -> np.ndarray:
        return self.np_random.integers(0, 256, (4, 4, 1), dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1
        self._maybe("reset", self.resets)
        self.t = 0
        return self._obs(), {"seed": seed}

    def step(self, action):
        self.steps += 1
        self.t += 1
        if self.delay:
            time.sleep(self.delay)
        if self.gate is not None:
            self.gate.pass_through()
        self._maybe("step", self.steps)
        done = self.t % 5 == 0
        terminated = done and self.resets % 2 == 1
        return self._obs(), float(action) + self.t, terminated, done and not terminated, {}

    def render(self):
        self._maybe("render")
        return np.zeros((2, 2, 3), np.uint8)

    def misbehave_now(self) -> int:
        self._maybe("method")
        return os.getpid()


# How the main process reports a FaultyEnv fault that ends the worker of envs 2..3 (the tests' 4 envs
# on 2 workers), as a regex with the command to fill in: ``CRASHES[fault].format(command="step")``.
CRASHES = {
    "kill": r"worker 1 \(pid \d+, envs 2\.\.3\) was killed by signal SIGKILL during {command}",
    "segv": r"worker 1 \(pid \d+, envs 2\.\.3\) was killed by signal SIGSEGV during {command}",
    "abort": r"worker 1 \(pid \d+, envs 2\.\.3\) was killed by signal SIGABRT during {command}",
    "exit": r"worker 1 \(pid \d+, envs 2\.\.3\) exited with code 3 during {command}",
}


def make_small_synthetic() -> gym.Env:
    """A cheap 16x16x3 synthetic image env for end-to-end runs of ``shmvec bench``."""
    from shmvec.synthetic import SyntheticImageEnv

    return SyntheticImageEnv((16, 16, 3), episode_len=(5, 20))


def make_broken_env() -> gym.Env:
    """A factory that raises, as a user's broken factory would."""
    raise RuntimeError("this factory is broken\non purpose")


class CpuReportEnv(TinyImageEnv):
    """TinyImageEnv that reports the CPUs its process may run on (``env_method("cpus")``)."""

    def cpus(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))


TINY = "tests.envs:make_small_synthetic"


class NanEnv(gym.Env):
    """Writes ``value`` into key ``key`` at step ``at`` (and ends the episode there if ``end``)."""

    observation_space = spaces.Dict(
        {
            "bounded": spaces.Box(-1.0, 1.0, (3,), np.float32),
            "free": spaces.Box(-np.inf, np.inf, (2,), np.float64),
            "pixels": spaces.Box(0, 255, (2, 2), np.uint8),
        }
    )
    action_space = spaces.Discrete(2)

    def __init__(self, key: str = "bounded", value: float = float("nan"), at: int = 2, end: bool = False):
        self.key, self.value, self.at, self.end, self.t = key, value, at, end, 0

    def _obs(self, bad: bool):
        obs = {"bounded": np.zeros(3, np.float32), "free": np.zeros(2), "pixels": np.zeros((2, 2), np.uint8)}
        if bad:
            obs[self.key][-1] = self.value
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(False), {}

    def step(self, action):
        self.t += 1
        bad = self.t == self.at
        return self._obs(bad), 0.0, bad and self.end, False, {}


class PaintEnv(gym.Env):
    """A small image env whose render frame (16 x 12 RGB, drawn from the env's RNG at every step
    and reset) differs at every step, with random episode lengths: for the video recordings'
    frame-for-frame checks. ``render_mode=None`` makes one that cannot be recorded."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = "rgb_array", max_len: int = 9) -> None:
        self.observation_space = spaces.Box(0, 255, (6, 6, 1), np.uint8)
        self.action_space = spaces.Discrete(3)
        self.render_mode, self.max_len = render_mode, max_len
        self.frame = np.zeros((16, 12, 3), np.uint8)

    def _paint(self, action: int) -> np.ndarray:
        self.frame = self.np_random.integers(0, 256, self.frame.shape, dtype=np.uint8)
        self.frame[0, 0] = (self.t, action, 7)
        return self.frame[:6, :6, :1].copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.len = 0, int(self.np_random.integers(2, self.max_len))
        return self._paint(0), {}

    def step(self, action):
        self.t += 1
        obs = self._paint(int(action))
        return obs, float(action), self.t >= self.len, False, {}

    def render(self):
        return self.frame.copy() if self.render_mode == "rgb_array" else None
