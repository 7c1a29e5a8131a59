"""Native step paths: an env that writes its observation straight into the ring slot it is given.

A worker normally calls ``env.step(action)`` through every wrapper of the env, then copies the
returned observation into the ring. An env (or a wrapper chain the worker recognises, such as SB3's
Atari recipe: :mod:`shmvec.atari.sb3`) that implements :class:`NativeEnv` is instead called as
``env.step_into(action, out)``: it writes its observation into ``out``, its row of the ring slot of
this step, and returns the rest of what ``step`` returns. An env written with numba or in C then
costs no copy and no Python per frame. Resets still go through ``env.reset()`` (SB3's Atari recipe
alone restates its frequent life-loss resets: :meth:`shmvec.atari.sb3.AtariStep.reset`).

The protocol, for your own env (no base class needed; the worker looks for the method)::

    class MyEnv(gymnasium.Env):
        def step_into(self, action, out: np.ndarray) -> tuple[float, bool, bool, dict]:
            ...  # advance the state, write the observation into out (shape and dtype of the space)
            return reward, terminated, truncated, info

        def sync(self) -> None:  # optional
            ...  # bring any state that step_into keeps in its own form up to date

It must give exactly what ``step`` gives: ``out`` equal to ``step``'s observation, the same reward,
flags and info, and the same state afterwards. ``sync()``, if present, is called before any other
call into the env (reset, ``get_attr``, ``env_method``, ``render``, close, a step through the
wrappers), so state that ``step_into`` keeps lazily can be written back first. Gymnasium's standard
wrappers that ``gymnasium.make`` adds (``TimeLimit``, ``OrderEnforcing``, ``PassiveEnvChecker``) may
sit on top: the worker applies what they do (:class:`GymLayers`). Observation spaces with one Box
leaf only (not Dict or Tuple). Turn native paths off with ``native_step=False``; see which envs use
one with the faces' ``native_steps``.

Imported by workers: standard library, numpy and gymnasium only.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import io
import textwrap
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

StepInto = tuple[Any, bool, bool, dict[str, Any]]


@runtime_checkable
class NativeEnv(Protocol):
    """What a native step path implements (see the module docstring)."""

    def step_into(self, action: Any, out: np.ndarray) -> StepInto:
        """Step once, write the observation into ``out``; ``(reward, terminated, truncated, info)``."""
        ...


@dataclass(frozen=True)
class NativeStatus:
    """Whether one env is stepped natively, and how or why not.

    :param path: the native path in use (``"sb3-atari"``, ``"cleanrl-atari"``, ``"gymnasium-atari"``,
        ``"ale"`` (a raw ALE env: :mod:`shmvec.atari.raw`), ``"step_into"``, with ``"+frame-stack"``
        when shmvec's ``frame_stack`` sits on top), or None.
    :param reason: why not, when ``path`` is None (the wrapper or setting that is not recognised).
    :param unchecked: when the env's wrapper chain is one a native path steps but code it restates is
        not a version shmvec was checked against: each such method as ``("module.Class.method",
        "package version")``, the version installed where the env runs; the faces warn once about
        these (``reason`` lists them too).
    """

    path: str | None
    reason: str | None = None
    unchecked: tuple[tuple[str, str], ...] = ()


#: How a :class:`NativeStatus` reason begins when the code, not the chain, keeps the native step off.
UNCHECKED = "code shmvec's native Atari step was not checked against"


def grouped(statuses: Sequence[NativeStatus]) -> list[dict[str, Any]]:
    """Envs with the same status, counted: ``{"path", "reason", "envs"}`` per distinct ``(path,
    reason)`` of ``statuses`` (a face's ``native_steps``), in order of first appearance."""
    counts: dict[tuple[str | None, str | None], int] = {}
    for status in statuses:
        key = (status.path, status.reason)
        counts[key] = counts.get(key, 0) + 1
    return [{"path": path, "reason": reason, "envs": n} for (path, reason), n in counts.items()]


def describe(groups: list[dict[str, Any]]) -> str:
    """The line :func:`summary` prints, from :func:`grouped`'s groups."""
    count = sum(g["envs"] for g in groups if g["path"] is not None)
    if count == 0 and not any((g["reason"] or "").startswith(UNCHECKED) for g in groups):
        # Most envs have no native path: nothing is wrong, they step as they always do.
        why = "; ".join(g["reason"] or "" for g in groups)
        return f"native step: none, every env steps through its wrappers ({why}; see docs/guides/native.md)"
    many = len(groups) > 1
    native = [f"{g['envs']} {g['path']}" if many else g["path"] for g in groups if g["path"] is not None]
    others = [
        f"{g['envs']} not ({g['reason']})" if many else g["reason"] for g in groups if g["path"] is None
    ]
    line = f"native step: {count} of {sum(g['envs'] for g in groups)} envs"
    if native:
        line += f" ({', '.join(native)})"
    if others:
        line += ("; " if native else ": ") + "; ".join(others)
    return line


def summary(statuses: Sequence[NativeStatus]) -> str:
    """One line saying which envs a face's workers step natively, by which path, and why the others
    do not, e.g. ``print(summary(env.native_steps))``: ``"native step: 8 of 8 envs
    (sb3-atari+frame-stack)"``."""
    return describe(grouped(statuses))


def through_wrappers(env: Any, action: Any, out: np.ndarray) -> StepInto:
    """``env.step(action)`` through every wrapper, its observation copied into ``out``: what a native
    path does on the steps it leaves to the wrappers (the first two, which ``PassiveEnvChecker``
    checks; before a reset, when ``OrderEnforcing`` raises). Sync the native path first."""
    obs, reward, terminated, truncated, info = env.step(action)
    out[...] = obs
    return reward, terminated, truncated, info


def sync(env: Any) -> None:
    """Call ``env.sync()`` if it has one (see :class:`NativeEnv`)."""
    method = getattr(env, "sync", None)
    if method is not None:
        method()


def class_name(obj: Any) -> str:
    """``module.QualifiedName`` of the object's class."""
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def is_exactly(obj: Any, name: str) -> bool:
    """Whether ``obj``'s class is the one of that ``module.QualifiedName`` (not a subclass: a
    subclass may step differently)."""
    return class_name(obj) == name


@functools.cache
def fingerprint(func: Any) -> str:
    """A hash of a function's source tokens, comments, docstrings and layout left out: a native path
    restates what a wrapper's ``step`` does, and runs only over the versions whose source it was
    checked against (an unknown fingerprint makes the worker step through the wrappers)."""
    return fingerprint_source(inspect.getsource(func))


def fingerprint_source(source: str) -> str:
    """:func:`fingerprint` of a function's source text, as ``inspect.getsource`` gives it (its
    decorators, ``def`` line and body; indented as in its file or not)."""
    source = textwrap.dedent(source)
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(value.lineno, (value.end_lineno or value.lineno) + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    tokens = [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type not in skip and tok.start[0] not in docstrings
    ]
    return hashlib.sha256(" ".join(tokens).encode()).hexdigest()[:16]


class GymLayers:
    """What Gymnasium's ``TimeLimit``, ``OrderEnforcing`` and ``PassiveEnvChecker`` do on a step, for
    a native path under them (each may be absent).

    :param env: the outermost of these wrappers (or the env itself when there are none).
    """

    ORDER = "gymnasium.wrappers.common.OrderEnforcing"
    CHECKER = "gymnasium.wrappers.common.PassiveEnvChecker"
    LIMIT = "gymnasium.wrappers.common.TimeLimit"

    def __init__(self, env: gym.Env) -> None:
        # Any: the attributes read are these wrappers' own, which their types do not declare.
        self.limit: Any = None
        self.order: Any = None
        self.checker: Any = None
        for attr, name in (("limit", self.LIMIT), ("order", self.ORDER), ("checker", self.CHECKER)):
            if is_exactly(env, name):
                setattr(self, attr, env)
                env = env.env  # type: ignore[attr-defined]
        self.inner: Any = env

    def layers(self) -> list[Any]:
        """The wrappers present, outermost first."""
        return [w for w in (self.limit, self.order, self.checker) if w is not None]

    def ready(self) -> bool:
        """Whether the next step may skip these wrappers: the env was reset (else ``OrderEnforcing``
        raises) and ``PassiveEnvChecker`` has made its checks of the first two steps."""
        order, checker = self.order, self.checker
        if order is not None and not order._has_reset:
            return False
        # Gymnasium < 1.4's checker has no data-reuse check (nor its flag): nothing to wait for.
        return checker is None or (checker.checked_step and getattr(checker, "checked_data_reuse", True))

    def truncate(self, truncated: bool) -> bool:
        """``TimeLimit``'s count of one inner step: the truncated flag it passes on."""
        limit = self.limit
        if limit is None:
            return truncated
        limit._elapsed_steps += 1
        return truncated or limit._elapsed_steps >= limit._max_episode_steps
