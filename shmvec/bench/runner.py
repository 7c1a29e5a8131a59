"""Run VecEnv backends on the same env and actions, interleaved, and report steps/s with spread."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

BACKENDS = ("dummy", "subproc", "shm")


def make_vec_env(backend: str, env_fns: list[Callable[[], gym.Env]], start_method: str = "fork"):
    """Build one VecEnv backend: ``dummy`` (SB3 DummyVecEnv), ``subproc`` (SB3 SubprocVecEnv), ``shm``."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from shmvec.vec_env import ShmVecEnv

    if backend == "dummy":
        return DummyVecEnv(env_fns)
    if backend == "subproc":
        return SubprocVecEnv(env_fns, start_method=start_method)
    if backend == "shm":
        return ShmVecEnv(env_fns, start_method=start_method)
    raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")


def measure_steps_per_s(vec_env, seconds: float, warmup_steps: int = 20, seed: int = 0) -> float:
    """Env steps per second (batch steps x n_envs) of random actions over about ``seconds``."""
    n = vec_env.num_envs
    vec_env.action_space.seed(seed)
    vec_env.seed(seed)
    vec_env.reset()
    actions = [np.array([vec_env.action_space.sample() for _ in range(n)]) for _ in range(64)]
    for k in range(warmup_steps):
        vec_env.step(actions[k % 64])
    steps, start = 0, time.perf_counter()
    while True:
        vec_env.step(actions[steps % 64])
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return steps * n / elapsed


@dataclass
class Result:
    """Repeated measurements of one backend: steps/s per repeat."""

    backend: str
    n_envs: int
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def compare(
    env_fns: list[Callable[[], gym.Env]],
    backends: Sequence[str] = BACKENDS,
    repeats: int = 3,
    seconds: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Result]:
    """Measure each backend ``repeats`` times, interleaved (a, b, c, a, b, c...) so that a disturbance
    of the shared machine hits every backend alike instead of biasing one of them."""
    results = {b: Result(b, len(env_fns)) for b in backends}
    for r in range(repeats):
        for b in backends:
            vec_env = make_vec_env(b, env_fns)
            try:
                results[b].samples.append(measure_steps_per_s(vec_env, seconds, seed=r))
            finally:
                vec_env.close()
            if progress is not None:
                progress(f"repeat {r + 1}/{repeats} {b}: {results[b].samples[-1]:,.0f} steps/s")
    return results


def ratio_spread(a: Result, b: Result) -> tuple[float, float, float]:
    """Median, min and max of the per-repeat ratios a/b (repeats are paired: same round)."""
    ratios = [x / y for x, y in zip(a.samples, b.samples)]
    return statistics.median(ratios), min(ratios), max(ratios)
