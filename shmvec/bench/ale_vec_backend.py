"""The ``ale-vec`` and ``ale-vec-async`` bench backends: ``ale_py.AtariVectorEnv``, ALE's own C++
vector env (derived from EnvPool, in ale-py, so in the ``atari`` extra), set up as SB3's Atari recipe.

It runs no Python factory: it steps its own emulators on a C++ thread pool in the main process (its
CPU is counted there). It runs ``--recipe sb3-atari`` only, with SB3's settings as far as it has
them (:func:`ale_vec_kwargs`), and is not bit-identical to the recipe (see
:mod:`shmvec.bench.recipes`). ``ale-vec`` steps every env each batch step; ``ale-vec-async`` is its
pool mode (``batch_size`` < ``num_envs``): each batch step hands actions to the envs received last
and takes the next ``batch_size`` envs to finish, as ``shm-pool`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from shmvec.bench.adapters import SendRecvAdapter
from shmvec.bench.recipes import AtariSettings, atari_settings, recipe_env_id


def ale_vec_kwargs(settings: AtariSettings) -> dict[str, Any]:
    """``AtariVectorEnv`` keyword arguments (besides the game and counts) for SB3's Atari settings."""
    return {
        "img_height": settings.screen_size,
        "img_width": settings.screen_size,
        "grayscale": True,
        "stack_num": settings.frame_stack,
        "frameskip": settings.frame_skip,
        "maxpool": True,
        "noop_max": settings.noop_max,
        "episodic_life": settings.episodic_life,
        "use_fire_reset": settings.fire_reset,
        "reward_clipping": settings.clip_reward,
        "repeat_action_probability": settings.repeat_action_probability,
        "full_action_space": False,
        "max_num_frames_per_episode": settings.max_frames,
    }


class AleVecAdapter(SendRecvAdapter):
    """``ale_py.AtariVectorEnv`` with the runner's calling convention. With ``batch_size`` below
    ``num_envs`` it is a pool: ``num_envs`` here is the batch size (what one batch step steps), and
    :meth:`reset` returns the first batch.

    :param settings: the game and its settings.
    :param num_envs: emulators.
    :param batch_size: envs per batch step (default None: all of them).
    """

    def __init__(self, settings: AtariSettings, num_envs: int, batch_size: int | None = None) -> None:
        from ale_py.vector_env import AtariVectorEnv

        batch = 0 if batch_size is None or batch_size >= num_envs else batch_size
        env = AtariVectorEnv(settings.game, num_envs, batch_size=batch, **ale_vec_kwargs(settings))
        super().__init__(env)
        self.num_envs = env.batch_size


def make_ale_vec(
    env_fns: list[Callable[[], gym.Env]], batch_size: int | None = None, frame_stack: int | None = None
) -> AleVecAdapter:
    """The ``ale-vec`` backend (``ale-vec-async`` with ``batch_size``) for the recipe's factories.

    :param frame_stack: frames stacked (default None: one).
    :raises ValueError: for factories that are not ``--recipe sb3-atari``'s.
    """
    env_id = recipe_env_id(env_fns[0])
    if env_id is None:
        raise ValueError(f"the ale-vec backends run --recipe sb3-atari only, not {env_fns[0]!r}")
    return AleVecAdapter(atari_settings(env_id, frame_stack), len(env_fns), batch_size)
