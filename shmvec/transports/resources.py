"""What the local transport must release whatever happens, and the one path that releases it.

Kept apart from the transport and the engine, so that a ``weakref.finalize`` can release them
without keeping either alive.
"""

from __future__ import annotations

import os
import select
import time
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import Any

from shmvec.memory.doorbell import OP_MESSAGE, MainBell
from shmvec.memory.ring import Ring
from shmvec.wire import framing
from shmvec.wire.messages import Close

# How long close() lets a worker finish its current command and exit before terminating it (s).
_CLOSE_GRACE_S = 5.0


class Resources:
    """What must be released whatever happens: processes, pipes, fault logs, the ``eventfd`` and the
    ``epoll`` object (the Linux transport's; None for the portable one), the ring (the engine closes
    its reader, and so its decode threads, itself)."""

    def __init__(self, wake: Connection | None = None) -> None:
        self.processes: list[Any] = []
        self.remotes: list[Connection] = []
        self.wake = wake
        self.epoll = None if wake is None else select.epoll()
        self.bell: MainBell | None = None
        self.attached: list[bool] = []
        self.ring: Ring | None = None
        # Per worker: an fd of the file its faulthandler writes to (unlinked once the worker runs).
        self.fault_logs: list[tuple[int, str]] = []

    def close_fault_log(self, w: int) -> None:
        fd, path = self.fault_logs[w]
        with suppress(OSError):
            os.close(fd)
        with suppress(OSError):  # closed first: Windows unlinks no open file
            os.unlink(path)

    def read_fault_log(self, w: int) -> str:
        """What worker ``w``'s faulthandler wrote (empty if nothing, or the log is gone)."""
        try:
            fd = self.fault_logs[w][0]
            os.lseek(fd, 0, os.SEEK_SET)
            return os.read(fd, 1 << 16).decode(errors="replace")
        except (OSError, IndexError):
            return ""

    def release(self, graceful: bool = True) -> None:
        """Stop the workers (``graceful``: ask first, then terminate), close pipes, free the ring."""
        if graceful:
            self._ask_to_close()
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
        for w in range(len(self.fault_logs)):
            self.close_fault_log(w)
        self.fault_logs = []
        if self.epoll is not None:
            self.epoll.close()
        if self.wake is not None:
            self.wake.close()
        self.bell = None  # its arrays are views of the ring
        if self.ring is not None:
            self.ring.close()
            self.ring = None

    def _ask_to_close(self) -> None:
        deadline = time.monotonic() + _CLOSE_GRACE_S
        attached = [w for w, a in enumerate(self.attached) if a and self.processes[w].is_alive()]
        if self.bell is not None and attached:
            # A worker still busy with a command reads its words only once it is done: overwritten
            # now, its command and the close would be mixed up. Let it finish first (within the grace).
            busy = attached
            while busy and time.monotonic() < deadline:
                done = set(self.bell.finished(busy))
                busy = [w for w in busy if w not in done and self.processes[w].is_alive()]
                if busy:
                    self._drain_replies(busy, 0.02)
            # Rung first: a worker reads its pipe only once woken. Not counted: nobody waits.
            self.bell.post(attached, OP_MESSAGE, 0, counted=False)
        close = framing.dumps(Close())
        for remote in self.remotes:
            with suppress(OSError, ValueError):
                remote.send_bytes(close)  # Connection's own framing: the same bytes as framing's on POSIX
        for w, process in enumerate(self.processes):
            while process.is_alive() and time.monotonic() < deadline:
                self._drain_replies([w], 0.02)
                process.join(0.02)

    def _drain_replies(self, workers: list[int], wait_s: float) -> None:
        """Read and drop what ``workers`` are sending (a reply they may be blocked writing, left
        pending by a step that will not be received), waiting up to ``wait_s`` for some."""
        for w in workers:
            remote = self.remotes[w]
            try:
                while remote.poll(wait_s / len(workers)):
                    remote.recv_bytes()
            except (OSError, EOFError, ValueError):
                pass
