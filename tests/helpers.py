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


def assert_obs_equal(a: Any, b: Any, where: str = "obs", ordered: bool = True) -> None:
    """Exact equality of observations (array, dict or tuple), including dtype and (if ``ordered``)
    dict key order."""
    if isinstance(b, dict):
        assert isinstance(a, dict), f"{where}: {type(a).__name__} is not a dict"
        if ordered:
            assert list(a) == list(b), f"{where}: key order {list(a)} != {list(b)}"
        assert set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in b:
            assert_obs_equal(a[k], b[k], f"{where}[{k!r}]", ordered)
    elif isinstance(b, tuple):
        assert isinstance(a, tuple) and len(a) == len(b), f"{where}: tuple mismatch"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_obs_equal(x, y, f"{where}[{i}]", ordered)
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{where}: shape {a.shape} != {b.shape}"
        np.testing.assert_array_equal(a, b, err_msg=where)


def assert_info_equal(a: dict, b: dict, where: str) -> None:
    assert list(a) == list(b), f"{where}: info keys {list(a)} != {list(b)}"
    for k in b:
        if k == "episode":  # Monitor's episode record: 't' is wall-clock time, never equal
            assert (a[k]["r"], a[k]["l"]) == (b[k]["r"], b[k]["l"]), f"{where}[episode]"
        elif isinstance(b[k], (np.ndarray, dict, tuple)):
            # DummyVecEnv passes the env's own terminal dict through (the env's key order); shmvec
            # rebuilds it in the observation space's order. Consumers index by key.
            assert_obs_equal(a[k], b[k], f"{where}[{k!r}]", ordered=k != "terminal_observation")
        else:
            assert a[k] == b[k], f"{where}[{k!r}]: {a[k]!r} != {b[k]!r}"


def assert_step_equal(got: tuple, want: tuple, t: int) -> None:
    obs, rewards, dones, infos = got
    w_obs, w_rewards, w_dones, w_infos = want
    assert_obs_equal(obs, w_obs, f"step {t} obs")
    assert_obs_equal(rewards, w_rewards, f"step {t} rewards")
    assert_obs_equal(dones, w_dones, f"step {t} dones")
    assert len(infos) == len(w_infos)
    for i, (x, y) in enumerate(zip(infos, w_infos)):
        assert_info_equal(x, y, f"step {t} infos[{i}]")


def sample_actions(space, n: int, rng: np.random.Generator) -> np.ndarray:
    """A batch of actions shaped and typed the way SB3 sends them for this action space."""
    space.seed(int(rng.integers(1 << 31)))
    return np.array([space.sample() for _ in range(n)])


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


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Return once ``condition()`` holds; fail, naming ``what``, after ``timeout`` seconds: a bound on
    a hang, not a speed figure."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.005)
