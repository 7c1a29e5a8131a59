"""Recipes: one env definition every backend of a benchmark builds alike (``shmvec bench --recipe``).

``sb3-atari`` is SB3's Atari recipe, ``VecFrameStack(make_atari_env(env_id, n), 4)``: each env is
``AtariWrapper(Monitor(gym.make(env_id)))`` over a ``*NoFrameskip-v4`` id
(:func:`shmvec.bench.envs.sb3_atari`: no-op starts, 4 frames per action with the max of the last two,
episodic life, FIRE on reset, 84x84 gray, clipped rewards), and :data:`FRAME_STACK` frames are stacked,
channels last: observations (84, 84, 4) uint8. How a backend stacks is its registration's
``stacking`` (:mod:`shmvec.bench.backends`): SB3's VecEnvs under ``VecFrameStack``, ShmVecEnv and
ShmVectorEnv in their workers (``frame_stack=4``), the C++ vector envs in C++.

The C++ vector envs (``ale-vec``, ``ale_py.AtariVectorEnv``, and ``envpool``) cannot run Python
wrappers. They get SB3's settings as far as they have them (:class:`AtariSettings`) and are **not
bit-identical** to the recipe: they take the max of the last two *gray* frames (SB3 takes the max of
the RGB frames, then converts), handle no-op starts, FIRE resets and lives their own way, reset an env
whose episode ended in place of its next step, and give frames channels first, (4, 84, 84): what
SB3's ``VecTransposeImage`` makes of (84, 84, 4) for a CNN policy, so they are left that way.

Factories are ``functools.partial`` objects of module-level functions (they pickle under every start
method), and the C++ backends read the env id back out of them (:func:`recipe_env_id`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.bench.envs import env_factory, sb3_atari

#: The recipes ``shmvec bench --recipe`` takes.
RECIPES = ("sb3-atari",)
#: Frames the ``sb3-atari`` recipe stacks (SB3's Atari examples and rl-zoo: ``frame_stack: 4``).
FRAME_STACK = 4
#: The env ``--recipe sb3-atari`` measures when ``--env`` is not given.
DEFAULT_ENV = "PongNoFrameskip-v4"
_NO_FRAMESKIP = re.compile(r"^[A-Za-z]+NoFrameskip-v4$")


def check_recipe(recipe: str, env_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
    """:raises ValueError: for an unknown recipe, an id the recipe is not built over, or env keyword
    arguments (every backend builds the recipe's own env, so none can be passed on)."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose from {', '.join(RECIPES)}")
    if env_kwargs:
        raise ValueError(f"--env-kwargs does not apply to --recipe {recipe}: it builds the recipe's env")
    if not _NO_FRAMESKIP.match(env_id):
        raise ValueError(
            f"--recipe {recipe} is SB3's Atari recipe over a NoFrameskip-v4 id (e.g. {DEFAULT_ENV}), "
            f"got {env_id!r}"
        )
    _ale_spec(env_id)


def _ale_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    import ale_py

    gym.register_envs(ale_py)
    try:
        return gym.spec(env_id)
    except gym.error.Error as exc:
        raise ValueError(f"cannot find {env_id!r}: {exc}") from None


def recipe_env(
    recipe: str | None, env: str, env_kwargs: dict[str, Any] | None = None
) -> tuple[Callable[[], gym.Env], int | None]:
    """The factory of one env of the benchmark and the frames its VecEnvs stack (None: none).

    :param recipe: one of :data:`RECIPES`, or None for ``env`` as it is
        (:func:`shmvec.bench.envs.env_factory`).
    :raises ValueError: as :func:`check_recipe`.
    """
    if recipe is None:
        return env_factory(env, **(env_kwargs or {})), None
    check_recipe(recipe, env, env_kwargs)
    return functools.partial(sb3_atari, env), FRAME_STACK


def recipe_env_id(env_fn: Callable[[], gym.Env]) -> str | None:
    """The env id of a ``sb3-atari`` factory made by :func:`recipe_env`; None for any other."""
    if isinstance(env_fn, functools.partial) and env_fn.func is sb3_atari:
        return str(env_fn.args[0] if env_fn.args else env_fn.keywords["env_id"])
    return None


def stacked_space(space: gym.Space, frame_stack: int | None) -> gym.Space:
    """The observation space of one env after stacking ``frame_stack`` frames on the last axis, as
    ``VecFrameStack`` does for the recipe's (84, 84, 1) frames (``space`` itself for None)."""
    if not frame_stack:
        return space
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"frame stacking takes a Box space, got {space}")
    low = np.repeat(space.low, frame_stack, axis=-1)
    high = np.repeat(space.high, frame_stack, axis=-1)
    return gym.spaces.Box(low, high, dtype=space.dtype)


@dataclass(frozen=True)
class AtariSettings:
    """SB3's ``AtariWrapper`` defaults for one game, in the terms the C++ vector envs take them.

    :param game: ALE's ROM id, snake case (``"ms_pacman"``).
    :param task: the game in CamelCase (``"MsPacman"``), as EnvPool names its tasks.
    :param frame_skip: emulator frames per action (4).
    :param screen_size: frame height and width in pixels (84).
    :param frame_stack: frames stacked (4; 1 for none).
    :param noop_max: most no-op actions at reset (30).
    :param episodic_life: a lost life ends the episode for the agent (True).
    :param fire_reset: press FIRE at reset in games that need it (True).
    :param clip_reward: rewards clipped to their sign (True).
    :param repeat_action_probability: sticky actions (0: none, as NoFrameskip-v4).
    :param max_frames: emulator frames per episode at most (ALE's 108,000).
    """

    game: str
    task: str
    frame_skip: int = 4
    screen_size: int = 84
    frame_stack: int = FRAME_STACK
    noop_max: int = 30
    episodic_life: bool = True
    fire_reset: bool = True
    clip_reward: bool = True
    repeat_action_probability: float = 0.0
    max_frames: int = 108_000


def atari_settings(env_id: str, frame_stack: int | None = FRAME_STACK) -> AtariSettings:
    """:class:`AtariSettings` for the game of a NoFrameskip-v4 id, its sticky actions and episode
    length taken from the id's registration.

    :raises ValueError: for an id the recipe is not built over.
    """
    check_recipe(RECIPES[0], env_id)
    ale = _ale_spec(env_id).kwargs
    game = str(ale["game"])
    return AtariSettings(
        game=game,
        task="".join(part.capitalize() for part in game.split("_")),
        frame_stack=frame_stack or 1,
        repeat_action_probability=float(ale.get("repeat_action_probability", 0.0)),
        max_frames=int(ale.get("max_num_frames_per_episode") or 108_000),
    )
