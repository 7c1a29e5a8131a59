"""The core suite: the test modules that run with shmvec's core dependencies alone (``pip install
shmvec``, no extras), as CI's core stage runs them on Python 3.10, 3.12 and 3.13
(``SHMVEC_CORE_SUITE=1``; the whole suite runs on 3.11).

The core venv holds shmvec with the ``codecs`` extra (no torch, no SB3) and the test tools. A module
is left out when importing it fails for want of a library that only another extra (or the full
suite's test tools) brings, or when it imports SB3's face ``ShmVecEnv`` (which needs the ``sb3``
extra, though it imports without it) or ``shmvec.bench`` (the ``bench`` extra); a test in a core
module is left out when its own code or a fixture's it uses imports torch, SB3 or SciPy or uses
``ShmVecEnv``, or when it is
marked ``sb3`` (it needs SB3 through a library call or a subprocess, which its code does not show). The run's header
names the modules left out and what each lacks, its summary the tests, so that what stops being core
is seen.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
# What the extras (sb3, atari, codecs, bench, ray, envpool, docs, dev's jax) and the full suite's
# tools bring: a module that fails to import for want of one of these is left out (the core venv has
# the codecs extra's libraries, never torch or SB3).
EXTRAS = frozenset(
    [
        "stable_baselines3",
        "torch",
        "ale_py",
        "cv2",
        "lz4",
        "zstandard",
        "numba",
        "ray",
        "envpool",
        "matplotlib",
        "pytest_benchmark",
        "jax",
        "minigrid",
        "playwright",
        "mkdocs",
        "av",
        "minari",
        "moviepy",
        "h5py",
    ]
)
# Imports of shmvec's parts that import without their extra but cannot run without it.
_FACE_NEEDS = {"ShmVecEnv": "stable_baselines3 (ShmVecEnv)"}
# What a test's own code needs that the core venv lacks: imports of these, or the SB3 face. (SciPy
# comes with the full suite's libraries, never with the core venv's.)
_TEST_IMPORTS = frozenset({"torch", "stable_baselines3", "scipy"})


def _imports_needing_extras(path: Path) -> str | None:
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module.startswith("shmvec.bench"):
            return "the bench extra (shmvec.bench)"
        for alias in node.names:
            if node.module in ("shmvec", "shmvec.vec_env") and alias.name in _FACE_NEEDS:
                return _FACE_NEEDS[alias.name]
    return None


@functools.cache
def test_lacks(function: Any) -> bool:
    """Whether a test's or fixture's own code (not its strings) imports torch, SB3 or SciPy, or
    names SB3's face."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in _TEST_IMPORTS for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _TEST_IMPORTS:
            return True
        if isinstance(node, ast.Name) and node.id in _FACE_NEEDS:
            return True
        if isinstance(node, ast.Attribute) and node.attr in _FACE_NEEDS:
            return True
    return False


def lacks(path: Path) -> str | None:
    """What test module ``path`` needs that the core venv lacks (None: it is core)."""
    needed = _imports_needing_extras(path)
    if needed is not None:
        return needed
    try:
        importlib.import_module(f"tests.{path.stem}")
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top in EXTRAS:
            return top
        raise
    except pytest.skip.Exception as exc:  # a module-level importorskip
        return str(exc)
    return None


def left_out() -> dict[str, str]:
    """Test file name -> what it lacks, for every test module left out of the core suite."""
    out = {}
    for path in sorted(HERE.glob("test_*.py")):
        missing = lacks(path)
        if missing is not None:
            out[path.name] = missing
    return out
