"""Tianshou's own tests of its vector envs, run with :class:`shmvec.tianshou.ShmTianshouVectorEnv` in
the place of ``SubprocVectorEnv`` and ``ShmemVectorEnv``.

Tianshou's source distribution on PyPI carries no tests (its ``pyproject.toml`` excludes ``test/``),
and CI reaches package registries only: ``benchmarks/third_party/tianshou-2.0.1/`` holds, unchanged,
the files of Tianshou's tag ``v2.0.1`` these tests need (the four modules, ``test/base/env.py``, the
``__init__.py`` files, ``pyproject.toml`` and ``LICENSE``; its ``SOURCE.md`` lists their git blob
ids)::

    python benchmarks/tianshou_suite.py benchmarks/third_party/tianshou-2.0.1
    python benchmarks/tianshou_suite.py benchmarks/third_party/tianshou-2.0.1 --unmodified  # reference
    python benchmarks/tianshou_suite.py benchmarks/third_party/tianshou-2.0.1 --sabotaged   # must fail

A checkout of another tag works the same way (``git clone --depth 1 --branch vX.Y.Z
https://github.com/thu-ml/tianshou``).

Only the checkout's ``test/`` is used (see ``benchmarks/suites.py``); ``tianshou`` itself is the
installed one. Before collection the script replaces ``SubprocVectorEnv`` and ``ShmemVectorEnv``
where the tests look them up (``tianshou.env``, ``tianshou.env.venvs``) with :class:`OnShm`, a
ShmTianshouVectorEnv built from their constructor arguments (its ``context`` is the start method).
It runs the test modules that step them (:data:`MODULES`) and prints pytest's summary and the failed
and errored test ids (``--json FILE`` writes every test's outcome). Extra arguments go to pytest
(e.g. ``-k async``, ``-x``). With shmvec it exits 0 only when the tests that fail are exactly
:data:`KNOWN_FAILURES`, each for its known reason (``suites.check_known``); ``--unmodified`` gives
pytest's exit code. ``--sabotaged`` runs them with :class:`Sabotaged` (rewards raised by 1) and exits 0
only when a test fails beyond the known failures, or a known one fails for another reason
(:func:`suites.caught`): the suite catches a broken adapter.
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

_NO_SPACE = "object has no attribute 'observation_space'"

#: Tianshou's tests that fail with shmvec in the place of SubprocVectorEnv and ShmemVectorEnv, each
#: with a text its failure report holds. shmvec sizes its shared memory by the observation space and
#: checks each observation against it; Tianshou's own vector envs pickle whatever the env returns.
KNOWN_FAILURES = {
    # MoveToRightEnv(recurse_state=True) returns np.array([1]), shape (1,), for its Discrete(2) leaf.
    "test/base/test_env.py::test_vecenv": "does not match the observation space shape ()",
    # NXEnv (a networkx graph, or an array of its nodes) declares no observation space.
    "test/base/test_env.py::test_env_obs_dtype": f"'NXEnv' {_NO_SPACE}",
    "test/base/test_collector.py::test_collector": f"'NXEnv' {_NO_SPACE}",
    # FiniteEnv (samples of a torch Dataset) declares no observation space.
    "test/base/test_env_finite.py::test_finite_dummy_vector_env": f"'FiniteEnv' {_NO_SPACE}",
    "test/base/test_env_finite.py::test_finite_subproc_vector_env": f"'FiniteEnv' {_NO_SPACE}",
}


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


class Sabotaged(OnShm):
    """:class:`OnShm` with every reward it returns raised by 1: the negative control, which
    Tianshou's tests must catch (``--sabotaged``)."""

    def step(self, action: Any, id: Any = None) -> tuple:
        obs, rew, terminated, truncated, info = super().step(action, id)
        return obs, rew + 1, terminated, truncated, info


def substitute(venv: type[OnShm] = OnShm) -> None:
    """``SubprocVectorEnv`` and ``ShmemVectorEnv`` become ``venv`` where Tianshou's tests import them
    from (``from tianshou.env import SubprocVectorEnv``)."""
    for name in ("SubprocVectorEnv", "ShmemVectorEnv"):
        setattr(ts_env, name, venv)
        setattr(venvs, name, venv)


def main(argv: list[str] | None = None) -> int:
    return suites.main(
        argv, __doc__, "a checkout of Tianshou's source (its git tag)", MODULES, substitute,
        ("SubprocVectorEnv/ShmemVectorEnv", "ShmTianshouVectorEnv as SubprocVectorEnv/ShmemVectorEnv"),
        KNOWN_FAILURES, sabotage=lambda: substitute(Sabotaged),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
