"""The main process's reads of its workers' ``/proc/<pid>/`` files (Linux), cheap enough for the step path.

Opening a ``/proc`` file costs ~10 µs, reading an open one again with ``pread`` ~3 µs; the OpenMP
pause reads ``schedstat`` (how long each worker waited to run) during steps, so each file stays open
between reads. Where ``/proc`` is missing the reads return None and the callers do without.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


class ProcFiles:
    """One ``/proc/<pid>/<name>`` file per pid, kept open between reads.

    Files of pids no longer asked for are closed at the next read, and a file that fails to read
    (its process reaped: a kept file never shows a later process that reuses the pid) is closed, to
    be opened again at the next read. :meth:`close` closes the rest.

    :param name: the file under ``/proc/<pid>/``, e.g. ``"stat"``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._files: dict[int, Any] = {}

    def read(self, pids: Sequence[int]) -> list[bytes] | None:
        """The contents of each pid's file (its first 4 KiB), in order; None where one is gone or
        ``/proc`` is missing."""
        for pid in [p for p in self._files if p not in pids]:
            self._files.pop(pid).close()
        texts, failed = [], False
        for pid in pids:
            f = self._files.get(pid)
            try:
                if f is None:  # kept open across reads on purpose: closed when the pid goes or by close()
                    f = self._files[pid] = open(f"/proc/{pid}/{self.name}", "rb", buffering=0)  # noqa: SIM115
                texts.append(os.pread(f.fileno(), 4096, 0))
            except OSError:  # every pid is tried, so that each failing file is closed now
                if pid in self._files:
                    self._files.pop(pid).close()
                failed = True
        return None if failed else texts

    def close(self) -> None:
        """Close the files kept open (idempotent; a later read opens them again)."""
        for f in self._files.values():
            f.close()
        self._files.clear()
