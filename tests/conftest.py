"""Shared fixtures: leak accounting around every test that builds a ShmVecEnv."""

from __future__ import annotations

import contextlib
import gc
import os
import time

import psutil
import pytest

from shmvec.memory.ring import SEGMENT_PREFIX
from tests import core_suite

# CI's core stage (no extras installed): the modules that need an extra are not collected.
CORE = os.environ.get("SHMVEC_CORE_SUITE") == "1"
_LEFT_OUT = core_suite.left_out() if CORE else {}
collect_ignore = list(_LEFT_OUT)


def pytest_report_header(config):
    if not CORE:
        return []
    lines = [f"core suite: {len(_LEFT_OUT)} test modules need an extra (they run in the full suite):"]
    return lines + [f"  {name}: {missing}" for name, missing in _LEFT_OUT.items()]


def _functions(item):
    """The test's function and those of the fixtures it uses (a fixture may be what needs SB3)."""
    yield getattr(item, "function", None)
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info is not None else ():
        for fixture in defs:
            yield fixture.func


def pytest_collection_modifyitems(config, items):
    """Core suite: leave out the tests of core modules whose own code, or a fixture's they use,
    needs torch, SB3 or SciPy."""
    if not CORE:
        return
    out = [
        item
        for item in items
        if item.get_closest_marker("sb3") or any(core_suite.test_lacks(f) for f in _functions(item))
    ]
    if out:
        config.hook.pytest_deselected(items=out)
        items[:] = [item for item in items if item not in out]
        config._core_left_out = [item.nodeid for item in out]


def pytest_terminal_summary(terminalreporter, config):
    left_out = getattr(config, "_core_left_out", [])
    if left_out:
        terminalreporter.write_line(
            f"core suite: {len(left_out)} tests need torch, SB3 or SciPy (full suite only):"
        )
        for nodeid in left_out:
            terminalreporter.write_line(f"  {nodeid}")


def shm_segments(pid: int | None = None) -> set[str]:
    """Names of the ShmVecEnv segments in /dev/shm created by process ``pid`` (default: this one).

    Only our own: other test runs on the same machine create and free segments concurrently."""
    prefix = f"{SEGMENT_PREFIX}{os.getpid() if pid is None else pid}_"
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    except FileNotFoundError:
        return set()


def open_fds() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


def live_children() -> list[psutil.Process]:
    """Children of this process that are still running, ignoring multiprocessing helpers
    (resource tracker, forkserver) that live for the whole session by design."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd:
            continue
        out.append(child)
    return out


@pytest.fixture(scope="session", autouse=True)
def _multiprocessing_helpers():
    """Start the resource tracker and forkserver up front: each keeps a pipe open for the whole
    session, which would otherwise look like a file-descriptor leak of whichever test started it."""
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()
    forkserver.ensure_running()


@contextlib.contextmanager
def leak_check(wait_s: float = 5.0):
    """Raise AssertionError if the block leaves shared-memory segments, worker processes or file
    descriptors (after ``wait_s`` seconds for workers to exit and segments to go)."""
    gc.collect()
    # What is alive now is out of the block's reach: frozen, the collection after it walks only
    # what the block made. A full walk of torch's, JAX's and the test modules' objects took
    # 0.15-0.3 s, twice per test.
    gc.freeze()
    segments, fds = shm_segments(), open_fds()
    yield
    gc.collect()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and (live_children() or shm_segments() - segments):
        time.sleep(0.05)
    assert shm_segments() - segments == set(), "shared-memory segments leaked"
    assert live_children() == [], "worker processes still running"
    assert open_fds() <= fds, f"file descriptors leaked: {fds} before, {open_fds()} after"


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves shared-memory segments, worker processes or file descriptors."""
    with leak_check():
        yield
