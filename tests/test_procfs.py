"""``shmvec.procfs``: workers' ``/proc`` files read cheaply, closed when their process goes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shmvec.procfs import ProcFiles

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_files_stay_open_and_are_closed_when_their_pid_is_not_asked_for_or_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    files = ProcFiles("stat")
    try:
        before = _fds()
        first = files.read([os.getpid(), child.pid])
        assert first is not None and [int(t.split()[0]) for t in first] == [os.getpid(), child.pid]
        assert _fds() == before + 2
        assert files.read([os.getpid(), child.pid]) is not None and _fds() == before + 2, "kept open"
        assert files.read([os.getpid()]) is not None and _fds() == before + 1, "child's closed"
        assert files.read([os.getpid(), child.pid]) is not None and _fds() == before + 2
        child.kill()
        child.wait()
        assert files.read([os.getpid(), child.pid]) is None, "reaped: no such process"
        assert _fds() == before + 1, "the reaped child's file closed"
        assert files.read([child.pid]) is None and _fds() == before, "gone: nothing opened"
    finally:
        child.kill()
        child.wait()
        files.close()
    assert _fds() == before and files.read([]) == []
