"""SB3's Atari recipe checked: an action should last 4 emulator frames, not 16.

SB3's ``AtariWrapper`` (what ``make_atari_env`` wraps each env in) repeats every action over 4 frames
with its ``MaxAndSkipEnv``. It expects an env that does not skip frames itself, as SB3 and rl-zoo3
use: ``PongNoFrameskip-v4``, or an ``ALE/...-v5`` id made with ``frameskip=1``. ``ALE/Pong-v5`` as
registered already skips 4 frames (and repeats the last action with probability 0.25), so under the
wrapper every action lasts 16 frames: a different, harder task than the recipe's. Workers call
:func:`check_frame_skip` on every env they build and warn once per process.

Imported by workers: standard library and gymnasium only (SB3's wrapper is recognised by name).
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym

from shmvec.errors import FrameSkipWarning

# Wrappers that repeat each action: (module prefix, class name, attribute holding the frame count).
_SKIPPING_WRAPPERS = (
    ("stable_baselines3", "MaxAndSkipEnv", "_skip"),
    ("gymnasium", "AtariPreprocessing", "frame_skip"),
)


def _wrapper_skip(env: gym.Env) -> int:
    for module, name, attr in _SKIPPING_WRAPPERS:
        if type(env).__module__.startswith(module) and type(env).__name__ == name:
            return int(getattr(env, attr, 1))
    return 1


def _own_skip(env: Any) -> float:
    """The ALE env's own frames per action (ale-py's ``frameskip``; a (low, high) range: its mean)."""
    skip = getattr(env, "_frameskip", 1)
    return sum(skip) / len(skip) if isinstance(skip, tuple) else float(skip)


def frames_per_action(env: gym.Env) -> float:
    """Emulator frames one action of ``env`` lasts: the frame skips of its wrappers times the ALE
    env's own (1 for an env that is not an ALE game and has no such wrapper)."""
    frames = 1.0
    while isinstance(env, gym.Wrapper):
        frames *= _wrapper_skip(env)
        env = env.env
    return frames * _own_skip(env)


def check_frame_skip(env: gym.Env) -> None:
    """Warn (:class:`~shmvec.errors.FrameSkipWarning`, once per process) when a frame-skipping wrapper
    sits on an ALE env that skips frames itself, e.g. ``make_atari_env("ALE/Pong-v5")``."""
    outer = 1
    inner: Any = env
    while isinstance(inner, gym.Wrapper):
        outer *= _wrapper_skip(inner)
        inner = inner.env
    own = _own_skip(inner)
    if outer > 1 and own != 1:
        spec = getattr(inner, "spec", None)
        name = spec.id if spec is not None else type(inner).__name__
        warnings.warn(
            f"{name} skips {own:g} frames per action itself and a wrapper (SB3's AtariWrapper, as "
            f"make_atari_env adds) skips {outer} more: every action lasts {outer * own:g} frames, not "
            f"{outer}. Use a NoFrameskip-v4 id (make_atari_env('PongNoFrameskip-v4', ...), as SB3 and "
            "rl-zoo3 do) or make the v5 env with frameskip=1 (env_kwargs={'frameskip': 1}).",
            FrameSkipWarning,
            stacklevel=2,
        )
