"""``make_vec``: a :class:`~shmvec.ShmVectorEnv` of a registered env id, as ``gymnasium.make_vec``."""

from __future__ import annotations

import copy
import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from shmvec.vector_env import ShmVectorEnv


def _make_env(env_id: str, wrappers: tuple[Callable[[gym.Env], gym.Env], ...], kwargs: dict) -> gym.Env:
    # Module level so spawn and forkserver workers can unpickle the factory.
    env = gym.make(env_id, **kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return env


def make_vec(
    env_id: str,
    num_envs: int = 1,
    *,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> ShmVectorEnv:
    """A :class:`ShmVectorEnv` of ``num_envs`` copies of a registered env, like
    ``gymnasium.make_vec(env_id, num_envs, wrappers=...)``.

    :param env_id: a registered id, e.g. ``"CartPole-v1"``, or ``"module:EnvId"`` to import the module
        that registers it first (``"ale_py:ALE/Pong-v5"``).
    :param wrappers: applied in order to each env (in its worker) after ``gymnasium.make``.
    :param env_kwargs: keyword arguments of ``gymnasium.make`` (default none).
    :param kwargs: parameters of :class:`ShmVectorEnv` (``autoreset_mode``, ``n_workers``...).
    """
    env_kwargs = dict(env_kwargs or {})
    # "module:EnvId" as gymnasium takes it: the module registers the id when imported.
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    spec = copy.deepcopy(gym.spec(name))
    spec.kwargs = {**spec.kwargs, **env_kwargs, "num_envs": num_envs, "vectorization_mode": None}
    fn = functools.partial(_make_env, env_id, tuple(wrappers or ()), env_kwargs)
    env = ShmVectorEnv([fn] * num_envs, **kwargs)
    env.spec = spec
    return env


__all__ = ["make_vec"]
