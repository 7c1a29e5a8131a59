"""Adapters that give vector envs with other calling conventions SB3's VecEnv calls, so the bench
runner drives every backend the same way (:mod:`shmvec.bench.backends` builds them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import gymnasium as gym
import numpy as np


class BenchVecEnv(Protocol):
    """What the runner needs from a backend (SB3's VecEnv has all of it but ``processes``)."""

    num_envs: int
    observation_space: gym.Space
    action_space: gym.Space

    def seed(self, seed: int | None = None) -> Any:
        """Seed for the next :meth:`reset` (env ``i`` gets ``seed + i``)."""

    def reset(self) -> Any:
        """Reset every env; return the batch of observations."""

    def step_async(self, actions: np.ndarray) -> None:
        """Send one action per env."""

    def step_wait(self) -> Any:
        """Wait for the step; return observations, rewards, dones and infos."""

    def close(self) -> None:
        """Stop the workers and release their resources."""


class GymVectorAdapter:
    """A gymnasium ``VectorEnv`` with SB3's VecEnv calling convention, for the runner.

    The vector env must auto-reset in the same step (``AutoresetMode.SAME_STEP``), as SB3 does, so
    the env work per step is the same as for the other backends. Observations are returned as the
    vector env returns them; rewards, dones and infos are converted only as far as the runner needs
    (no per-env info dicts are built: that cost is left out for these backends).

    :param env: the vector env (its ``step_async``/``step_wait`` are used where it has them).
    :param processes: its worker processes, in env order, for CPU and memory accounting (default
        none: the envs run in this process).
    """

    def __init__(self, env: Any, processes: list[Any] | None = None) -> None:
        self._env = env
        self.num_envs = env.num_envs
        self.observation_space = env.single_observation_space
        self.action_space = env.single_action_space
        self.processes = list(processes or [])
        self._seed: int | None = None
        self._actions: Any = None

    def seed(self, seed: int | None = None) -> None:
        """Seed for the next :meth:`reset` (gymnasium gives env ``i`` the seed ``seed + i``)."""
        self._seed = seed

    def reset(self) -> Any:
        """Reset every env (with the pending seed, once); return the batch of observations."""
        obs, _ = self._env.reset(seed=self._seed)
        self._seed = None
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Send the actions (vector envs without ``step_async`` step in :meth:`step_wait`)."""
        if hasattr(self._env, "step_async"):
            self._env.step_async(actions)
        else:
            self._actions = actions

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, dict]:
        """Wait for the step; rewards as float32 and ``dones = terminated | truncated``, as SB3."""
        if hasattr(self._env, "step_async"):
            obs, rewards, terminated, truncated, infos = self._env.step_wait()
        else:
            obs, rewards, terminated, truncated, infos = self._env.step(self._actions)
        return obs, rewards.astype(np.float32), terminated | truncated, infos

    @property
    def native_steps(self) -> list[Any] | None:
        """The vector env's ``native_steps`` (:class:`shmvec.ShmVectorEnv`'s: which envs step
        natively, see :mod:`shmvec.native`); None for any other vector env."""
        return getattr(self._env, "native_steps", None)

    def close(self) -> None:
        """Close the vector env and its workers."""
        self._env.close()


class SendRecvAdapter(GymVectorAdapter):
    """A C++ vector env stepped with ``send``/``recv`` (EnvPool, ``ale_py.AtariVectorEnv``): the
    actions go to its threads in :meth:`step_async`, the batch comes back in :meth:`step_wait`.
    These envs reset an env whose episode ended in place of its next step (like
    ``AutoresetMode.NEXT_STEP``), one step per episode that the other backends do not count."""

    def step_async(self, actions: np.ndarray) -> None:
        """Hand the actions to the env's threads (``send``)."""
        self._env.send(np.asarray(actions))

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, dict]:
        """Wait for the batch (``recv``); rewards as float32, ``dones = terminated | truncated``."""
        obs, rewards, terminated, truncated, infos = self._env.recv()
        return obs, rewards.astype(np.float32), terminated | truncated, infos


class PoolAdapter:
    """:class:`shmvec.ShmVectorEnv` in pool mode with SB3's VecEnv calling convention: a batch step
    is ``send`` (actions for the batch received last) then ``recv`` (the next ``batch_size`` envs to
    finish), so ``num_envs`` here is the batch size: what one batch step steps. The other envs step
    while the caller (the policy) works.

    :param batch_size: envs per batch step (default None: half the envs, rounded up).
    :param options: more ShmVectorEnv options (default: none).
    """

    def __init__(
        self,
        env_fns: list[Callable[[], gym.Env]],
        start_method: str,
        batch_size: int | None = None,
        **options: Any,
    ) -> None:
        from shmvec.vector_env import ShmVectorEnv

        batch_size = batch_size or (len(env_fns) + 1) // 2
        self._env = ShmVectorEnv(env_fns, start_method=start_method, batch_size=batch_size, **options)
        self.num_envs = batch_size
        self.observation_space = self._env.single_observation_space
        self.action_space = self._env.single_action_space
        self._seed: int | None = None

    @property
    def processes(self) -> list[Any]:
        """The worker processes."""
        return list(self._env._eng.transport.processes)

    @property
    def native_steps(self) -> list[Any]:
        """Which envs step natively (:attr:`shmvec.ShmVectorEnv.native_steps`)."""
        return self._env.native_steps

    def seed(self, seed: int | None = None) -> None:
        """Seed for the next :meth:`reset` (env ``i`` gets ``seed + i``)."""
        self._seed = seed

    def reset(self) -> Any:
        """Reset every env; the first batch of observations."""
        self._env.async_reset(seed=self._seed)
        self._seed = None
        return self._env.recv()[0]

    def step_async(self, actions: np.ndarray) -> None:
        """``send``: actions for the batch received last."""
        self._env.send(actions)

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, dict]:
        """``recv``: the next batch; rewards as float32 and ``dones = terminated | truncated``, as SB3."""
        obs, rewards, terminated, truncated, infos = self._env.recv()
        return obs, rewards.astype(np.float32), terminated | truncated, infos

    def close(self) -> None:
        """Stop the workers."""
        self._env.close()
