"""Stable-Baselines3's own tests that use ``SubprocVecEnv``, run with :class:`shmvec.ShmVecEnv` in
its place.

SB3's source distribution on PyPI carries its tests: unpack the installed version's, e.g.::

    pip download --no-deps --no-binary :all: stable-baselines3==$(python -c 'import stable_baselines3; print(stable_baselines3.__version__)') -d /tmp/sb3
    tar xzf /tmp/sb3/stable_baselines3-*.tar.gz -C /tmp/sb3
    python benchmarks/sb3_suite.py /tmp/sb3/stable_baselines3-2.9.2
    python benchmarks/sb3_suite.py /tmp/sb3/stable_baselines3-2.9.2 --unmodified   # the reference counts

Only the checkout's ``tests/`` is used (see ``benchmarks/suites.py``); ``stable_baselines3`` itself is
the installed one. Before collection the script replaces ``SubprocVecEnv`` where the tests and
``make_vec_env`` look it up with :class:`SubprocVecEnvOnShm`, a ShmVecEnv built from
SubprocVecEnv's constructor arguments. It runs the test modules that use ``SubprocVecEnv``
(:data:`MODULES`) and prints pytest's summary and the failed and errored test ids (``--json FILE``
writes every test's outcome). Extra arguments go to pytest (e.g. ``-k start_method``, ``-x``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import gymnasium as gym
import stable_baselines3.common.env_util as env_util
import stable_baselines3.common.vec_env as vec_env
import stable_baselines3.common.vec_env.subproc_vec_env as subproc_vec_env
import suites

from shmvec import ShmVecEnv

#: SB3's test modules that step a ``SubprocVecEnv`` (SB3 2.9.2).
MODULES = ("tests/test_vec_envs.py", "tests/test_dict_env.py", "tests/test_utils.py", "tests/test_her.py")


class SubprocVecEnvOnShm(ShmVecEnv):
    """A ShmVecEnv built from ``SubprocVecEnv``'s constructor arguments: its envs and start method
    (one worker process per env, as SubprocVecEnv has)."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], start_method: str | None = None) -> None:
        env_fns = list(env_fns)
        super().__init__(env_fns, start_method=start_method, n_workers=len(env_fns))


def substitute() -> None:
    """``SubprocVecEnv`` becomes :class:`SubprocVecEnvOnShm` where SB3's test modules (``from
    stable_baselines3.common.vec_env import SubprocVecEnv``) and ``make_vec_env`` look it up."""
    SubprocVecEnvOnShm.__name__ = SubprocVecEnvOnShm.__qualname__ = "SubprocVecEnv"
    vec_env.SubprocVecEnv = SubprocVecEnvOnShm  # type: ignore[misc]
    subproc_vec_env.SubprocVecEnv = SubprocVecEnvOnShm  # type: ignore[misc]
    env_util.SubprocVecEnv = SubprocVecEnvOnShm  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    return suites.main(
        argv, __doc__, "SB3's unpacked source distribution (or a checkout)", MODULES, substitute,
        ("SubprocVecEnv", "ShmVecEnv as SubprocVecEnv"),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
