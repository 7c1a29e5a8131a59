"""Comparing VecEnv outputs array for array."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shmvec.testing import EquivalenceReport, assert_equivalent
from shmvec.testing.compare import Difference, InfoKeys, sb3_step_difference, value_difference
from shmvec.testing.equivalence import sample_actions as sample_batch

#: The adapters for other RL libraries (tests/test_import_graph.py: nothing in shmvec imports them).
ADAPTERS = ("shmvec.tianshou", "shmvec.torchrl", "shmvec.rllib")


def check(found: Difference | None, where: str = "") -> None:
    """Fail with what :mod:`shmvec.testing.compare` found, if anything."""
    if found is not None:
        env = "" if found.env is None else f" (env {found.env})"
        raise AssertionError(f"{where}{' ' if where else ''}{found.field}{env}: {found.detail}")


def _leaves_as_arrays(obs: Any) -> Any:
    if isinstance(obs, dict):
        return {k: _leaves_as_arrays(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_leaves_as_arrays(v) for v in obs)
    return np.asarray(obs)


def assert_obs_equal(a: Any, b: Any, where: str = "obs", ordered: bool = True) -> None:
    """Exact equality of observations (array, dict or tuple), including dtype and (if ``ordered``)
    dict key order. Leaves are compared as arrays: a batch's ``np.int64`` equals an env's own ``int``
    observation of a Discrete space (both ``int64`` arrays)."""
    check(value_difference(_leaves_as_arrays(a), _leaves_as_arrays(b), where, ordered))


def assert_step_equal(got: tuple, want: tuple, t: int) -> None:
    """Two results of SB3's ``step_wait()``, as :func:`shmvec.testing.assert_equivalent` compares them."""
    check(sb3_step_difference(got, want, InfoKeys()), f"step {t}")


def sample_actions(space, n: int, rng: np.random.Generator) -> Any:
    """A batch of actions shaped and typed the way SB3 sends them for this action space."""
    space.seed(int(rng.integers(1 << 31)))
    return sample_batch(space, n)


def assert_steps_equal(
    got: Any, want: Any, steps: int, rng: np.random.Generator, first: int = 0
) -> list[dict]:
    """Step two SB3 VecEnvs ``steps`` times with the same random actions (:func:`sample_actions`)
    and check each step's results are equal; ``first`` numbers the steps in the messages. The
    reference's infos of the episodes that ended, in order."""
    ended = []
    for t in range(first, first + steps):
        actions = sample_actions(got.action_space, got.num_envs, rng)
        result = want.step(actions)
        assert_step_equal(got.step(actions), result, t)
        ended += [info for done, info in zip(result[2], result[3]) if done]
    return ended


ROOT = Path(__file__).resolve().parent.parent


def run_python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python ARGS`` as a user would run it from the repository's root: a fresh interpreter with
    the repository importable; output captured."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def run_script(path: Path, source: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Write ``source`` (dedented) to ``path`` and run it (:func:`run_python`). A file, not
    ``python -c``: spawn workers re-import main files."""
    path.write_text(textwrap.dedent(source))
    return run_python(str(path), timeout=timeout)


def require(module: str, how: str) -> Any:
    """Import ``module`` for a test (or at a test module's top); when it is missing, skip (``how``
    installs it), or fail in CI (``CI`` set), where every optional piece is installed and a skip would
    hide a missing step."""
    import importlib

    import pytest

    try:
        return importlib.import_module(module)
    except ImportError:
        message = f"{module} is not installed ({how})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message, allow_module_level=True)


def not_checked(monkeypatch: Any, *names: str) -> None:
    """Make the installed code of the restated methods ``names`` (``module.Class.method``) one that
    ``shmvec.atari.fingerprints.KNOWN`` does not list, with the same releases: as on a release shmvec
    was not checked against. Workers see it under the fork start method only (they inherit it)."""
    from shmvec.atari.fingerprints import KNOWN

    for name in names:
        monkeypatch.setitem(KNOWN, name, {f"{i:016d}": span for i, span in enumerate(KNOWN[name].values())})


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Return once ``condition()`` holds; fail, naming ``what``, after ``timeout`` seconds: a bound on
    a hang, not a speed figure."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.005)


def equivalent_with_statuses(fns: list, steps: int, wrap_reference: Any = None, **options: Any) -> list:
    """``shmvec.testing.assert_equivalent`` of ``fns`` (SB3 face, fork), then each env's
    ``native_steps`` status, read from a ShmVecEnv built with the same options."""
    from shmvec import ShmVecEnv
    from shmvec.testing import assert_equivalent

    options.setdefault("start_method", "fork")
    assert_equivalent(fns, steps, seed=5, wrap_reference=wrap_reference, **options)
    with ShmVecEnv(fns, **options) as env:
        return env.native_steps


def run_beside_dummy(make, n_envs: int, steps: int = 60, seed: int = 7, **shm_kwargs) -> EquivalenceReport:
    """ShmVecEnv against DummyVecEnv through :func:`shmvec.testing.assert_equivalent`: every array of
    every step and reset, the reset infos, options at the first reset, an explicit reset half-way."""
    report = assert_equivalent([make] * n_envs, steps, seed, options={"level": 1}, **shm_kwargs)
    # Terminal observations, time-limit flags and reset infos were only compared if episodes ended.
    assert report.terminated and report.truncated, f"episodes ended only as {report}"
    return report


def needs_envpool() -> None:
    """Skip the test without EnvPool (it is not in CI's default extras), except in CI's envpool
    step (``SHMVEC_REQUIRE_ENVPOOL=1``), where missing is a failure."""
    import pytest

    from shmvec.errors import install_hint

    if os.environ.get("SHMVEC_REQUIRE_ENVPOOL") == "1":
        import envpool  # noqa: F401  # CI's envpool step: missing is a failure, not a skip
    else:
        pytest.importorskip("envpool", reason=f"EnvPool is not installed: {install_hint('envpool')}")
