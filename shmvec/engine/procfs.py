"""The main process's reads of its workers' ``/proc/<pid>/`` files (Linux), cheap enough for the step path.

Opening a ``/proc`` file costs ~10 µs, reading an open one again with ``pread`` ~3 µs; the OpenMP
pause reads ``schedstat`` (how long each worker waited to run) during steps, so each file stays open
between reads. Where ``/proc`` is missing the reads return None and the callers do without.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from contextlib import suppress


class ProcFiles:
    """One ``/proc/<pid>/<name>`` file per pid, kept open between reads.

    Files of pids no longer asked for are closed at the next read, and a file that fails to read
    (its process reaped: a kept file never shows a later process that reuses the pid) is closed, to
    be opened again at the next read. :meth:`close` closes the rest, and so does garbage collection
    of this object: they are plain descriptors, so a VecEnv dropped without ``close()`` leaves no
    ``ResourceWarning`` ("unclosed file"), which fails test suites run with warnings as errors (SB3's
    own ``test_vec_monitor_ppo`` among them).

    :param name: the file under ``/proc/<pid>/``, e.g. ``"stat"``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._fds: dict[int, int] = {}  # pid -> descriptor
        self._finalizer = weakref.finalize(self, _close_all, self._fds)

    def read(self, pids: Sequence[int]) -> list[bytes] | None:
        """The contents of each pid's file (its first 4 KiB), in order; None where one is gone or
        ``/proc`` is missing."""
        fds = self._fds
        for pid in [p for p in fds if p not in pids]:
            os.close(fds.pop(pid))
        texts, failed = [], False
        for pid in pids:
            fd = fds.get(pid)
            try:
                if fd is None:  # kept open across reads on purpose: closed when the pid goes or by close()
                    fd = fds[pid] = os.open(f"/proc/{pid}/{self.name}", os.O_RDONLY | os.O_CLOEXEC)
                texts.append(os.pread(fd, 4096, 0))
            except OSError:  # every pid is tried, so that each failing file is closed now
                if pid in fds:
                    os.close(fds.pop(pid))
                failed = True
        return None if failed else texts

    def close(self) -> None:
        """Close the files kept open (idempotent; a later read opens them again)."""
        _close_all(self._fds)


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        with suppress(OSError):
            os.close(fd)
    fds.clear()
