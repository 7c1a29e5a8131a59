"""Turning an env name into picklable factories, for the CLI and the benchmarks.

A name is a gymnasium id (``ALE/Pong-v5``; ALE ids register ale-py first) or ``module:factory`` for a
user's own env. Factories are ``functools.partial`` objects of module-level functions so they pickle
under every start method.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from shmvec.worker.process import quiet_ale_banner


def _make_registered(env_id: str, kwargs: dict[str, Any]) -> gym.Env:
    if env_id.startswith("ALE/") or "NoFrameskip" in env_id:
        # Every backend's processes build envs here, SubprocVecEnv's too: quiet ALE's banner in all.
        quiet_ale_banner()
        import ale_py

        gym.register_envs(ale_py)
    return gym.make(env_id, **kwargs)


def _make_from_factory(spec: str, kwargs: dict[str, Any]) -> gym.Env:
    module_name, _, attr = spec.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory(**kwargs)


def atari_preprocessed(env_id: str = "ALE/Pong-v5", frame_stack: int = 4) -> gym.Env:
    """The standard Atari pipeline: no-op starts, frame skip 4, 84x84 grayscale, ``frame_stack``
    frames stacked first: observations of shape (4, 84, 84) uint8."""
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    env = _make_registered(env_id, {"frameskip": 1})  # AtariPreprocessing does the skipping
    return FrameStackObservation(AtariPreprocessing(env, frame_skip=4, screen_size=84), frame_stack)


def pong_84x84x4() -> gym.Env:
    """ALE Pong through :func:`atari_preprocessed` (``--env shmvec.bench.envs:pong_84x84x4``)."""
    return atari_preprocessed("ALE/Pong-v5")


def sb3_atari(env_id: str = "PongNoFrameskip-v4") -> gym.Env:
    """One env of SB3's Atari recipe, built as ``make_atari_env`` builds it: Monitor, then
    AtariWrapper (no-op starts, frame skip 4 with max-pooling, episodic life, fire on reset, 84x84
    grayscale, clipped rewards); observations (84, 84, 1) uint8
    (``--env shmvec.bench.envs:sb3_atari``; ``--recipe sb3-atari`` stacks 4 of them, see
    :mod:`shmvec.bench.recipes`). Imports SB3, and so torch, in every worker, as the recipe does."""
    from stable_baselines3.common.atari_wrappers import AtariWrapper
    from stable_baselines3.common.monitor import Monitor

    # make_atari_env asks for render_mode="rgb_array" (rendering costs nothing until render()).
    return AtariWrapper(Monitor(_make_registered(env_id, {"render_mode": "rgb_array"})))


def env_factory(name: str, **kwargs: Any) -> Callable[[], gym.Env]:
    """A picklable zero-argument factory for ``name`` (gymnasium id or ``module:factory``)."""
    if ":" in name and "/" not in name.split(":", 1)[0]:
        return functools.partial(_make_from_factory, name, kwargs)
    return functools.partial(_make_registered, name, kwargs)


def check_env_name(name: str, **kwargs: Any) -> None:
    """Build and close one env so a bad name fails with a one-line message before workers start.

    :raises ValueError: with the reason (unknown id, missing module, a factory that raises).
    """
    try:
        env = env_factory(name, **kwargs)()
    except Exception as exc:
        raise ValueError(f"cannot create env {name!r}: {type(exc).__name__}: {exc}") from exc
    env.close()
