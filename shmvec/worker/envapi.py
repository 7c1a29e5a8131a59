"""Calling a user's env: the factory's result checked (old gym envs converted as SB3 does), and
what ``reset()`` / ``step()`` return checked against the gymnasium API, with messages that say
which env and what to change.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from shmvec.atari import check_frame_skip
from shmvec.wire import messages as m


def make_env(env_fn: Callable[[], Any]) -> gym.Env:
    """Call a factory and check it returned an env, converting old ``gym`` envs like SB3 does; warn
    about an Atari env whose actions last 16 frames (:func:`shmvec.atari.check_frame_skip`)."""
    env = env_fn()
    if isinstance(env, gym.Env):
        check_frame_skip(env)
        return env
    if type(env).__module__.split(".")[0] == "gym":
        # Old gym API: SB3's shim (needs shimmy). Imported only here because it loads torch.
        from stable_baselines3.common.vec_env.patch_gym import _patch_env

        return _patch_env(env)
    raise TypeError(
        f"the env factory returned {type(env).__module__}.{type(env).__qualname__}, not a gymnasium.Env; "
        "env_fns must be callables that create an env, e.g. lambda: gym.make('CartPole-v1')"
    )


def is_wrapped(env: gym.Env, wrapper_class: type) -> bool:
    # Same walk as SB3's env_util.is_wrapped, without importing SB3 (and torch) in the worker.
    while isinstance(env, gym.Wrapper):
        if isinstance(env, wrapper_class):
            return True
        env = env.env
    return False


def check_reset(result: Any, env_index: int) -> tuple[Any, dict]:
    """``(obs, info)`` from ``env.reset()``, or a clear error for the old gym API and other shapes."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        return result
    raise TypeError(
        f"env {env_index}: reset() must return a tuple (obs, info) with an info dict (gymnasium API), "
        f"got {_describe(result)}"
    )


def check_step(result: Any, env_index: int) -> tuple[Any, Any, Any, Any, dict]:
    """``(obs, reward, terminated, truncated, info)`` from ``env.step()``, or a clear error."""
    if isinstance(result, tuple) and len(result) == 5 and isinstance(result[4], dict):
        return result
    hint = ""
    if isinstance(result, tuple) and len(result) == 4:
        hint = " (the old gym API returned 4 values: update the env or wrap it with shimmy)"
    raise TypeError(
        f"env {env_index}: step() must return a tuple (obs, reward, terminated, truncated, info) "
        f"(gymnasium API), got {_describe(result)}{hint}"
    )


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return f"a {type(value).__name__}"


def unpicklable(msg: m.Command, reply: m.Reply, first_env: int, exc: Exception) -> m.Failed:
    """The error reply for a ``reply`` to ``msg`` that could not be pickled, naming the env and the
    info key (or attribute value) to blame when one can be found (else ``exc`` itself)."""
    env_index, error = _blame(msg, reply, first_env, exc)
    return m.Failed(m.RemoteError.capture(error, env_index, msg.label, os.getpid()))


def _blame(msg: m.Command, reply: m.Reply, first_env: int, exc: Exception) -> tuple[int | None, Exception]:
    items: list[tuple[int, str, dict]] = []  # (local env, what, dict)
    if isinstance(reply, m.Stepped):
        for i, info, reset_info in reply.items:
            items += [(i, "info", info), (i, "reset info", reset_info or {})]
        for objects in (reply.objects, reply.final_objects):
            items += [(i, "observation", {None: v}) for i, vs in (objects or {}).items() for v in vs]
    elif isinstance(reply, m.ResetDone):
        items = [(i, "reset info", info) for i, info in enumerate(reply.infos) if info is not None]
        items += [(i, "observation", {None: v}) for i, vs in (reply.objects or {}).items() for v in vs]
    elif isinstance(reply, m.Returned) and reply.values is not None:
        what = f"the result of {msg.label}"
        indices = getattr(msg, "indices", range(len(reply.values)))
        items = [(i, what, {None: value}) for i, value in zip(indices, reply.values)]
    for i, what, values in items:
        for key, value in values.items():
            try:
                pickle.dumps(value)
            except Exception as value_exc:
                where = f"{what} key {key!r}" if key is not None else what
                kind = f"{type(value).__module__}.{type(value).__qualname__}"
                return first_env + i, TypeError(
                    f"env {first_env + i}: {where} holds a {kind}"
                    f" that cannot be pickled ({type(value_exc).__name__}: {value_exc}); what a worker "
                    "returns (infos, attributes, method results, observation leaves without a fixed "
                    "size) travels to the main process by pickle"
                )
    return None, exc


def has_wrapper_attr(env: gym.Env, name: str) -> bool:
    try:
        env.get_wrapper_attr(name)
    except AttributeError:
        return False
    return True
