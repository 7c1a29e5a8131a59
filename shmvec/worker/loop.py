"""A local worker process: its entry point and its command loop.

Start-up goes through the pipe (the ring is laid out from the spaces the worker reports): the worker
builds its envs and sends :class:`~shmvec.wire.messages.Ready`, then reads
:class:`~shmvec.wire.messages.Attach`, maps the ring and answers. From then on, under the Linux
transport, it sleeps on the ring's doorbell (:mod:`shmvec.memory.doorbell`): a step whose actions
are in the ring arrives as words in shared memory and is answered in the ring alone, unless an info
or reset info is left over; any other command arrives as a message in the pipe. Under the portable
transport (no doorbell) every command is a message in the pipe, and every command is answered there
(an empty message: a step that left nothing over). Either way an exception in an env is answered as
an error and the loop goes on.
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from shmvec.memory.doorbell import OP_STEP, WorkerBell
from shmvec.wire import framing
from shmvec.wire import messages as m
from shmvec.worker.envapi import unpicklable
from shmvec.worker.envs import EnvGroup
from shmvec.worker.process import (
    enable_faulthandler,
    exit_with_parent,
    limit_threads,
    pin_to_cpu,
    quiet_ale_banner,
)
from shmvec.worker.serving import answer, handlers, start_group
from shmvec.worker.waiting import CommandWait


def worker_main(
    w: int,
    conn: Connection,
    wake: Connection | None,
    env_fns: bytes | list[Callable[[], Any]],
    first_env: int,
    n_threads: int | None,
    fault_log: str | None = None,
    isolate_rng: bool = False,
    cpu: int | None = None,
) -> None:
    """Entry point of a worker process.

    :param w: this worker's index.
    :param conn: this worker's end of its pipe to the main process.
    :param wake: the main process's ``eventfd`` (as a Connection, so every start method passes it);
        None under the portable transport (no doorbell: every command comes through the pipe).
    :param env_fns: the env factories, cloudpickled (spawn/forkserver) or as objects (fork).
    :param first_env: global index of the first env of this worker.
    :param n_threads: BLAS/OpenMP threads allowed in this worker (None: leave as is).
    :param fault_log: file for faulthandler's traceback if the worker crashes (None: stderr).
    :param isolate_rng: give each env its own process-global RNG state (see :class:`GlobalRngs`).
    :param cpu: the CPU this worker runs on (None: wherever the OS puts it).
    """
    # Ctrl-C reaches the whole process group; the main process decides what happens, then closes us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    enable_faulthandler(fault_log)
    exit_with_parent()
    quiet_ale_banner()
    pin_to_cpu(cpu)
    limit_threads(n_threads)
    pid = os.getpid()
    pipe = Pipe(conn) if wake is None else FdPipe(conn.fileno())
    group, ready = start_group(env_fns, first_env, isolate_rng, pid)
    try:
        pipe.send(framing.dumps(ready))
        if group is not None:
            _serve(group, w, pipe, wake)
    except (EOFError, OSError):
        pass  # the main process is gone
    finally:
        if group is not None:
            group.close()
        conn.close()
        if wake is not None:
            wake.close()


class Pipe:
    """Commands and replies as messages in the worker's pipe (``multiprocessing.Connection``: every
    platform); every command is answered, a step answered by the ring alone with an empty message."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def send(self, data: bytes) -> None:
        self.conn.send_bytes(data)

    def receive(self) -> m.Command:
        return pickle.loads(self.conn.recv_bytes())

    def next(self, group: EnvGroup) -> m.Command | None:
        """The next command (None: the main process is gone)."""
        return self.receive()

    def finish(self, data: bytes | None) -> None:
        """The command is done: send its reply (None: nothing over, the ring holds it all)."""
        self.send(data or b"")


class FdPipe(Pipe):
    """The same messages read and written on the bare file descriptor (see :mod:`shmvec.wire.framing`)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, data: bytes) -> None:
        framing.write_message(self.fd, data)

    def receive(self) -> m.Command:
        return framing.receive(self.fd)


class Bell:
    """The Linux transport once the worker is attached: steps whose actions are in the ring come as
    doorbell words, other commands are woken for and read from the pipe; only replies with something
    left over are sent."""

    def __init__(self, pipe: FdPipe, bell: WorkerBell, spin: CommandWait) -> None:
        self.pipe, self.bell, self.spin = pipe, bell, spin

    def next(self, group: EnvGroup) -> m.Command | None:
        self.spin.spin_s = group.spin_s
        command = self.bell.wait()
        if command is None:
            return None  # the main process is gone
        self.spin.received()
        op, slot = command
        return m.Step(slot) if op == OP_STEP else self.pipe.receive()

    def finish(self, data: bytes | None) -> None:
        if data is not None:
            self.pipe.send(data)
        self.bell.finish(data is not None)
        self.spin.done()


def _serve(group: EnvGroup, w: int, pipe: Pipe, wake: Connection | None) -> None:
    table = handlers(group)
    first = pipe.receive()
    if isinstance(first, m.Close):
        return
    pid = os.getpid()
    reply = answer(group, table, first, pid)
    channel: Pipe | Bell = pipe
    words = None if isinstance(reply, m.Failed) or group.ring is None else group.ring.bell
    if isinstance(pipe, FdPipe) and wake is not None and words is not None:
        # Before the reply: the main process posts the next command as soon as it has it, and the bell
        # must have taken the command words as they were before that.
        spin = CommandWait()
        channel = Bell(pipe, WorkerBell(words, w, wake.fileno(), pipe.fd, spin), spin)
    pipe.send(_encode(first, reply, group.first_env))
    while True:
        msg = channel.next(group)
        if msg is None or isinstance(msg, m.Close):
            return
        reply = answer(group, table, msg, pid)
        # A step that left nothing over is answered by the ring alone.
        has_reply = not isinstance(reply, m.Stepped) or bool(reply.items) or reply.objects is not None
        channel.finish(_encode(msg, reply, group.first_env) if has_reply else None)


def _encode(msg: m.Command, reply: m.Reply, first_env: int) -> bytes:
    try:
        return framing.dumps(reply)
    except Exception as exc:  # e.g. an info dict or attribute value that cannot be pickled
        return framing.dumps(unpicklable(msg, reply, first_env, exc))
