"""RLlib: :class:`ShmEnvCreator`, shmvec as the vector env of RLlib's EnvRunners (extra ``shmvec[rllib]``).

RLlib's new API stack (``SingleAgentEnvRunner``, Ray 2.60) builds each EnvRunner's envs with
``gymnasium.make_vec(..., vectorization_mode=config.gym_env_vectorize_mode)``, registering an env
creator given as ``config.environment(env=creator)`` (a callable, or a name registered with
``ray.tune.register_env``) both as the Gymnasium entry point and as the ``vector_entry_point``
``lambda num_envs: creator(env_config | {"num_envs": num_envs})``. With
``gym_env_vectorize_mode="vector_entry_point"`` RLlib calls only the latter: a creator that then
returns a :class:`~shmvec.ShmVectorEnv` makes shmvec each EnvRunner's vector env, with no RLlib
code patched or subclassed. RLlib's loop needs Gymnasium's default autoreset mode (``NEXT_STEP``),
which is the env's default.

Nothing in this module imports Ray: the creator is sent to the EnvRunner actors by pickling, and the
``ShmVectorEnv`` it builds there starts its own local worker processes beside each actor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from shmvec.vector_env import ShmVectorEnv

#: The ``gym_env_vectorize_mode`` RLlib must be given for :class:`ShmEnvCreator`.
VECTORIZE_MODE = "vector_entry_point"


def _one_env(env_fn: Callable[[dict[str, Any]], gym.Env], env_config: dict[str, Any]) -> gym.Env:
    # Module level, so that the workers' start method can unpickle the factory.
    return env_fn(env_config)


class ShmEnvCreator:
    """An RLlib env creator whose vector entry point is a :class:`~shmvec.ShmVectorEnv`.

    :param env_fn: RLlib's env creator for one env: takes the env config (a dict; ``num_envs``
        removed) and returns a ``gymnasium.Env``. It must be picklable by cloudpickle (it travels to
        the EnvRunner actors and on to shmvec's workers).
    :param options: keyword options of :class:`~shmvec.ShmVectorEnv` (``n_workers``,
        ``start_method``, ``codec``, ``frame_stack``...), except ``autoreset_mode`` (RLlib's loop
        reads ``NEXT_STEP`` results) and pool mode's ``batch_size`` / ``pool_order`` (RLlib steps
        every env at once).

    Use it with ``gym_env_vectorize_mode="vector_entry_point"``::

        config.environment(ShmEnvCreator(make_env)).env_runners(
            num_envs_per_env_runner=8, gym_env_vectorize_mode="vector_entry_point")

    Called without ``num_envs`` in the config (RLlib's ``"sync"`` or ``"async"`` modes), it raises a
    ``ValueError`` saying so, rather than run without shmvec unnoticed.
    """

    def __init__(self, env_fn: Callable[[dict[str, Any]], gym.Env], **options: Any) -> None:
        for name in ("autoreset_mode", "batch_size", "pool_order"):
            if name in options:
                raise ValueError(
                    f"ShmEnvCreator: {name}= is not taken (RLlib steps every env at once and reads "
                    "Gymnasium's default NEXT_STEP autoreset results)"
                )
        self.env_fn = env_fn
        self.options = options

    def __call__(self, env_config: Mapping[str, Any]) -> ShmVectorEnv:
        """The vector env of ``env_config["num_envs"]`` envs, each ``env_fn(env_config)`` without
        ``num_envs``.

        :raises ValueError: if ``env_config`` has no ``num_envs`` (RLlib asked for one env).
        """
        config = dict(env_config)
        num_envs = config.pop("num_envs", None)
        if num_envs is None:
            raise ValueError(
                "ShmEnvCreator was asked for one env: RLlib calls it for a vector env only with "
                f"config.env_runners(gym_env_vectorize_mode={VECTORIZE_MODE!r})"
            )
        return ShmVectorEnv([functools.partial(_one_env, self.env_fn, config)] * num_envs, **self.options)

    def __repr__(self) -> str:
        return f"ShmEnvCreator({self.env_fn!r}, **{self.options!r})"


__all__ = ["VECTORIZE_MODE", "ShmEnvCreator"]
