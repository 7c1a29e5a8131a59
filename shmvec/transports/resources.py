"""What a local worker pool must release whatever happens, and the one path that releases it."""

from __future__ import annotations

import os
import pickle
import time
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import Any

from shmvec.procfs import ProcFiles
from shmvec.protocol import Command
from shmvec.ring import Ring

# How long close() lets a worker finish its current command and exit before terminating it (s).
_CLOSE_GRACE_S = 5.0


class Resources:
    """What must be released whatever happens: processes, pipes, fault logs, the ring, the reader.

    Kept apart from the engine so a ``weakref.finalize`` can release them without keeping it alive.
    """

    def __init__(self) -> None:
        self.processes: list[Any] = []
        self.remotes: list[Connection] = []
        self.ring: Ring | None = None
        self.reader: Any = None  # an engine.reader.Reader once built (its decode threads)
        # Per worker: an fd of the file its faulthandler writes to (unlinked once the worker runs).
        self.fault_logs: list[tuple[int, str]] = []
        # The workers' /proc/<pid>/stat, kept open: the CPU each last ran on orders a step's sends.
        self.stat_files = ProcFiles("stat")

    def close_fault_log(self, w: int) -> None:
        fd, path = self.fault_logs[w]
        with suppress(OSError):
            os.unlink(path)
        with suppress(OSError):
            os.close(fd)

    def release(self, graceful: bool = True) -> None:
        """Stop the workers (``graceful``: ask first, then terminate), close pipes, free the ring."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if graceful:
            close = pickle.dumps((Command.CLOSE.value, None), pickle.HIGHEST_PROTOCOL)
            for remote in self.remotes:
                with suppress(OSError, ValueError):
                    remote.send_bytes(close)
            deadline = time.monotonic() + _CLOSE_GRACE_S
            for process, remote in zip(self.processes, self.remotes):
                while process.is_alive() and time.monotonic() < deadline:
                    # Drain a reply the worker may be blocked sending (a step left pending).
                    try:
                        while remote.poll():
                            remote.recv_bytes()
                    except (OSError, EOFError, ValueError):
                        pass
                    process.join(0.02)
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join(1.0)
        for remote in self.remotes:
            remote.close()
        for process in self.processes:
            try:
                process.close()
            except ValueError:  # still running after kill: leave it to the OS
                pass
        self.stat_files.close()
        for w in range(len(self.fault_logs)):
            self.close_fault_log(w)
        self.fault_logs = []
        if self.ring is not None:
            self.ring.close()
            self.ring = None
