"""The leak check every engine test runs (``tests/conftest.py``'s ``no_leaks``) fails a block that
leaves a shared-memory segment, a worker process or a file descriptor, and passes one whose env is
closed, or dropped in a reference cycle (the collector after the block finds it)."""

from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing import shared_memory

import pytest

from shmvec import ShmVecEnv
from shmvec.memory.ring import SEGMENT_PREFIX
from tests.conftest import leak_check, shm_segments
from tests.envs import TinyImageEnv


def test_a_leaked_segment_fails_it():
    segment = None
    try:
        with pytest.raises(AssertionError, match="shared-memory segments leaked"), leak_check(wait_s=0.1):
            segment = shared_memory.SharedMemory(
                f"{SEGMENT_PREFIX}{os.getpid()}_leak_probe", create=True, size=64
            )
    finally:
        if segment is not None:
            segment.close()
            segment.unlink()
    assert not {s for s in shm_segments() if s.endswith("leak_probe")}


def test_a_live_child_fails_it():
    child = None
    try:
        with pytest.raises(AssertionError, match="worker processes still running"), leak_check(wait_s=0.1):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    finally:
        if child is not None:
            child.kill()
            child.wait()


def test_an_open_fd_fails_it():
    fd = None
    try:
        with pytest.raises(AssertionError, match="file descriptors leaked"), leak_check(wait_s=0.1):
            fd = os.open(os.devnull, os.O_RDONLY)
    finally:
        if fd is not None:
            os.close(fd)


def test_an_env_closed_or_dropped_in_a_cycle_passes_it():
    with leak_check():
        ShmVecEnv([TinyImageEnv] * 2, n_workers=2).close()
    with leak_check():
        venv = ShmVecEnv([TinyImageEnv] * 2, n_workers=2)
        venv.reset()
        holder: dict = {"venv": venv}
        holder["self"] = holder  # only the collector after the block can free it
        del venv, holder
