"""The portable transport: worker processes on this machine, every command and reply a message in
the worker's pipe, built only from what Python offers on every platform (Linux, macOS, Windows).

Observations, rewards, flags and typed infos still go through the shared-memory ring
(:mod:`shmvec.memory.ring`, ``multiprocessing.shared_memory``); what the portable transport does
without is the Linux transport's doorbell (futexes and an ``eventfd``) and ``epoll``. A step is one
small pickled :class:`~shmvec.wire.messages.Step` per worker, read and written with
``multiprocessing.Connection``; a worker answers each command, with an empty message for a step
that left nothing over. :meth:`PipeTransport.wait <shmvec.transports.pipes.PipeTransport.wait>`
blocks in ``multiprocessing.connection.wait`` on every worker's pipe and process sentinel, with the
earliest command deadline as its timeout: no busy-waiting, a death noticed at once, a hang within
``timeout``. So the main process pays a system call or two per worker and batch where the Linux
transport pays one per batch (the docs' platform page has the measured cost).

Chosen where the Linux transport cannot run (:func:`shmvec.transports.choose_transport`), and on
Linux with ``transport="portable"`` or ``SHMVEC_TRANSPORT=portable``.
"""

from __future__ import annotations

import pickle
import threading
from multiprocessing import connection

from shmvec.transports.pipes import PIPE, SENTINEL, PipeTransport
from shmvec.transports.processes import Processes
from shmvec.transports.resources import Resources
from shmvec.wire.messages import Reply

# A message up to this size (bytes) is written at once: it fits any platform's pipe buffer (Windows'
# multiprocessing pipes hold 8 KiB), and an idle worker is always reading. A larger one is written
# by a thread, so that a worker that does not take it within ``timeout`` is found hung.
_SMALL_MESSAGE = 4096


class PortableTransport(PipeTransport):
    """The worker processes of one engine, reached through their pipes alone (any platform).

    :param procs: the worker processes to start (their factories, start method, threads).
    :param timeout: seconds a reply may take (None: no limit; a dead worker is noticed at once).
    """

    def __init__(self, procs: Processes, timeout: float | None) -> None:
        super().__init__(procs, timeout, Resources())

    def _watch(self, w: int) -> None:
        self._watched[self.res.remotes[w]] = (PIPE, w)
        self._watched[self.res.processes[w].sentinel] = (SENTINEL, w)

    def _events(self, wait_s: float) -> list[tuple[int, int]]:
        watched = self._watched
        ready = connection.wait(list(watched), None if wait_s < 0 else wait_s)  # type: ignore[arg-type]
        return [watched[key] for key in ready if key in watched]

    def _send(self, w: int, data: bytes) -> bool:
        remote = self.res.remotes[w]
        if self.timeout is None or len(data) <= _SMALL_MESSAGE:
            remote.send_bytes(data)
            return True
        failed: list[BaseException] = []

        def write() -> None:
            try:
                remote.send_bytes(data)
            except BaseException as exc:  # the worker died (or was killed as hung) while it wrote
                failed.append(exc)

        writer = threading.Thread(target=write, name=f"shmvec-send-{w}", daemon=True)
        writer.start()
        writer.join(self.timeout)
        if writer.is_alive():
            return False  # the caller kills the worker: the write then fails and the thread ends
        if failed:
            raise BrokenPipeError(f"worker {w} is gone: {failed[0]}")
        return True

    def _recv(self, w: int) -> Reply | None:
        data = self.res.remotes[w].recv_bytes()
        return pickle.loads(data) if data else None
