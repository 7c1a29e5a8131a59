"""Gymnasium's own ``tests/vector`` suite, run with :class:`shmvec.ShmVectorEnv` in place of
``gymnasium.vector.AsyncVectorEnv``.

Gymnasium's tests are not copied here: point the script at a checkout of Gymnasium's repository at
the installed version (the PyPI sdist has no tests), e.g.::

    git clone https://github.com/Farama-Foundation/Gymnasium /tmp/gymnasium-src
    # the installed version's tag where the clone has it (the counts in the docs: 3f0476a8c)
    git -C /tmp/gymnasium-src checkout v$(python -c 'import gymnasium; print(gymnasium.__version__)')
    flock /tmp/shmvec-cpu.lock python benchmarks/gymnasium_suite.py /tmp/gymnasium-src
    python benchmarks/gymnasium_suite.py /tmp/gymnasium-src --unmodified   # the reference counts

Only the checkout's ``tests/`` is used (see ``benchmarks/suites.py``); ``gymnasium`` itself is the
installed one (the one shmvec runs on). Before collection the script replaces ``gymnasium.vector.AsyncVectorEnv`` (and so
``gymnasium.make_vec(..., vectorization_mode="async")``) with :class:`AsyncVectorEnvOnShm`, which
translates AsyncVectorEnv's constructor arguments to ShmVectorEnv's. It prints pytest's summary and
the failed and errored test ids (``--json FILE`` writes every test's outcome, to compare two runs).
The tests expected to differ, and why, are listed in ``docs/migration/asyncvectorenv.md``.
Extra arguments go to pytest (e.g. ``-k autoreset``, ``-x``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import suites
from gymnasium.vector import AutoresetMode

from shmvec import ShmVectorEnv


class NotTranslated(Exception):
    """An AsyncVectorEnv argument this script cannot translate into ShmVectorEnv's. Derived from
    ``Exception`` alone, so that no Gymnasium test expects it: a test that passes an untranslatable
    argument fails, even one that expects AsyncVectorEnv to refuse the argument with a ``TypeError``
    or a ``ValueError`` of its own (with such an error here, ``test_mixed_observation_spaces`` passed
    without testing anything)."""


class AsyncVectorEnvOnShm(ShmVectorEnv):
    """A ShmVectorEnv built from ``AsyncVectorEnv``'s constructor arguments.

    ``shared_memory``: ignored (observations always travel in shared memory; what cannot is
    refused). ``copy``: the same meaning. ``context``: the start method. ``daemon``: ignored
    (workers always stop with the main process). ``max_concurrency``: the number of worker processes
    (each steps its envs one after another). ``worker`` (a replacement worker loop) and an
    ``observation_mode`` other than ``"same"`` have no equivalent: :class:`NotTranslated`.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        shared_memory: bool = True,
        copy: bool = True,
        context: str | None = None,
        daemon: bool = True,
        worker: Callable[..., None] | None = None,
        observation_mode: Any = "same",
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        max_concurrency: int | None = None,
    ) -> None:
        if worker is not None:
            raise NotTranslated("ShmVectorEnv has no replaceable worker loop (AsyncVectorEnv's `worker`)")
        if not (isinstance(observation_mode, str) and observation_mode == "same"):
            raise NotTranslated(
                f"ShmVectorEnv needs envs with equal spaces, not observation_mode={observation_mode!r}"
            )
        env_fns = list(env_fns)
        n_workers = None if max_concurrency is None else min(int(max_concurrency), len(env_fns))
        super().__init__(
            env_fns, autoreset_mode=autoreset_mode, copy=copy, start_method=context, n_workers=n_workers
        )
        self.shared_memory, self.context, self.daemon = shared_memory, context, daemon


def substitute() -> None:
    """``gymnasium.vector.AsyncVectorEnv`` becomes :class:`AsyncVectorEnvOnShm`, where test modules
    (``from gymnasium.vector import AsyncVectorEnv``) and ``gymnasium.make_vec`` look it up."""
    AsyncVectorEnvOnShm.__name__ = AsyncVectorEnvOnShm.__qualname__ = "AsyncVectorEnv"
    gym.vector.AsyncVectorEnv = AsyncVectorEnvOnShm  # type: ignore[misc]
    gym.vector.async_vector_env.AsyncVectorEnv = AsyncVectorEnvOnShm  # type: ignore[misc]


def main(argv: list[str] | None = None) -> int:
    return suites.main(
        argv, __doc__, "a checkout of Gymnasium's repository", ["tests/vector"], substitute,
        ("AsyncVectorEnv", "ShmVectorEnv as AsyncVectorEnv"),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
