"""The naive way to put envs on Ray, for comparison: one actor per env, raw observations through
``ray.get``, one Ray call per env and step (what ``RayEnvWrapper``-style VecEnvs do).

Only the four calls the benchmark runner makes (``seed``, ``reset``, ``step_async``/``step_wait``,
``close``), with SB3's conventions (same-step autoreset, ``terminal_observation``). Not a VecEnv to
train with: ``get_attr`` and the rest are missing, as in the projects it stands for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np


class _EnvActor:
    """One env in one actor."""

    def __init__(self, env_fn: bytes) -> None:
        self.env = cloudpickle.loads(env_fn)()

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.env.observation_space, self.env.action_space

    def reset(self, seed: int | None) -> Any:
        return self.env.reset(seed=seed)[0]

    def step(self, action: Any) -> tuple[Any, float, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        done = terminated or truncated
        if done:
            info["terminal_observation"] = obs
            obs, _ = self.env.reset()
        info["TimeLimit.truncated"] = truncated and not terminated
        return obs, float(reward), done, info


class NaiveRayVecEnv:
    """One Ray actor per env (the running Ray connection, else a local Ray shut down on close).

    :param env_fns: one factory per env.
    :param ray_options: options of every actor (default none).
    """

    def __init__(self, env_fns: list[Callable[[], gym.Env]], ray_options: dict | None = None) -> None:
        import ray

        self._ray = ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            from shmvec.transports.ray.connection import start_local

            start_local()  # as the Ray backend starts it: loopback only
        actor: Any = ray.remote(_EnvActor).options(**(ray_options or {}))
        self.actors: list[Any] = [actor.remote(cloudpickle.dumps(fn)) for fn in env_fns]
        self.num_envs = len(env_fns)
        self.observation_space, self.action_space = ray.get(self.actors[0].spaces.remote())
        self.processes: list[Any] = []  # no local processes: the runner counts none
        self._seed: int | None = None
        self._refs: list[Any] = []

    def seed(self, seed: int | None = None) -> None:
        """Seed for the next :meth:`reset` (env ``i`` gets ``seed + i``)."""
        self._seed = seed

    def reset(self) -> np.ndarray:
        seeds = [None if self._seed is None else self._seed + i for i in range(self.num_envs)]
        self._seed = None
        return _stack(self._ray.get([a.reset.remote(s) for a, s in zip(self.actors, seeds)]))

    def step_async(self, actions: np.ndarray) -> None:
        self._refs = [a.step.remote(act) for a, act in zip(self.actors, actions)]

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        results = self._ray.get(self._refs)
        obs, rewards, dones, infos = zip(*results)
        return _stack(list(obs)), np.array(rewards, np.float32), np.array(dones), list(infos)

    def close(self) -> None:
        for actor in self.actors:
            self._ray.kill(actor)
        self.actors = []
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()


def _stack(obs: list[Any]) -> Any:
    """One env's observations batched: arrays stacked, Dict observations stacked per key."""
    if isinstance(obs[0], dict):
        return {k: np.stack([o[k] for o in obs]) for k in obs[0]}
    return np.stack(obs)
