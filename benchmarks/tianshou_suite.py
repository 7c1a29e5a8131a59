"""Tianshou's own tests of its vector envs, run with :class:`shmvec.tianshou.ShmTianshouVectorEnv` in
the place of ``SubprocVectorEnv`` and ``ShmemVectorEnv``.

Tianshou's source distribution on PyPI carries no tests (its ``pyproject.toml`` excludes ``test/``):
use a checkout of the installed version's tag, e.g.::

    git clone --depth 1 --branch v2.0.1 https://github.com/thu-ml/tianshou /tmp/tianshou
    python benchmarks/tianshou_suite.py /tmp/tianshou
    python benchmarks/tianshou_suite.py /tmp/tianshou --unmodified   # the reference counts

Only the checkout's ``test/`` is used (see ``benchmarks/suites.py``); ``tianshou`` itself is the
installed one. Before collection the script replaces ``SubprocVectorEnv`` and ``ShmemVectorEnv``
where the tests look them up (``tianshou.env``, ``tianshou.env.venvs``) with :class:`OnShm`, a
ShmTianshouVectorEnv built from their constructor arguments (its ``context`` is the start method).
It runs the test modules that step them (:data:`MODULES`) and prints pytest's summary and the failed
and errored test ids (``--json FILE`` writes every test's outcome). Extra arguments go to pytest
(e.g. ``-k async``, ``-x``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import suites
import tianshou.env as ts_env
import tianshou.env.venvs as venvs

from shmvec.tianshou import ShmTianshouVectorEnv

#: Tianshou's test modules that step a ``SubprocVectorEnv`` or ``ShmemVectorEnv`` (Tianshou 2.0.1).
MODULES = (
    "test/base/test_env.py",
    "test/base/test_collector.py",
    "test/base/test_env_finite.py",
    "test/base/test_action_space_sampling.py",
)


class OnShm(ShmTianshouVectorEnv):
    """A ShmTianshouVectorEnv built from ``SubprocVectorEnv``'s (and ``ShmemVectorEnv``'s)
    constructor arguments: its envs, ``wait_num``, ``timeout`` and ``context`` (the start method);
    ``share_memory`` changes nothing (shmvec's observations always travel in shared memory)."""

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        wait_num: int | None = None,
        timeout: float | None = None,
        share_memory: bool = False,
        context: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(env_fns, wait_num, timeout, start_method=context, **kwargs)


def substitute() -> None:
    """``SubprocVectorEnv`` and ``ShmemVectorEnv`` become :class:`OnShm` where Tianshou's tests import
    them from (``from tianshou.env import SubprocVectorEnv``)."""
    for name in ("SubprocVectorEnv", "ShmemVectorEnv"):
        setattr(ts_env, name, OnShm)
        setattr(venvs, name, OnShm)


def main(argv: list[str] | None = None) -> int:
    return suites.main(
        argv, __doc__, "a checkout of Tianshou's source (its git tag)", MODULES, substitute,
        ("SubprocVectorEnv/ShmemVectorEnv", "ShmTianshouVectorEnv as SubprocVectorEnv/ShmemVectorEnv"),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
