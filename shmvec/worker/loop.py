"""A local worker process: its entry point and its command loop.

Start-up goes through the pipe (the ring is laid out from the spaces the worker reports): the worker
builds its envs and sends :class:`~shmvec.wire.messages.Ready`, then reads
:class:`~shmvec.wire.messages.Attach`, maps the ring and answers. From then on it sleeps on the
ring's doorbell (:mod:`shmvec.memory.doorbell`): a step whose actions are in the ring arrives as
words in shared memory and is answered in the ring alone, unless an info or reset info is left
over; any other command arrives as a message in the pipe. An exception in an env is answered as an
error and the loop goes on.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from shmvec.memory.doorbell import OP_STEP, WorkerBell
from shmvec.wire import framing
from shmvec.wire import messages as m
from shmvec.worker.envapi import unpicklable
from shmvec.worker.envs import EnvGroup, answer, handlers, start_group
from shmvec.worker.process import (
    enable_faulthandler,
    exit_with_parent,
    limit_threads,
    pin_to_cpu,
    quiet_ale_banner,
)
from shmvec.worker.waiting import CommandWait


def worker_main(
    w: int,
    conn: Connection,
    wake: Connection,
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
    :param wake: the main process's ``eventfd`` (as a Connection, so every start method passes it).
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
    fd = conn.fileno()
    group, ready = start_group(env_fns, first_env, isolate_rng, pid)
    try:
        framing.send(fd, ready)
        if group is not None:
            _serve(group, w, fd, wake.fileno(), pid)
    except (EOFError, OSError):
        pass  # the main process is gone
    finally:
        if group is not None:
            group.close()
        conn.close()
        wake.close()


def _serve(group: EnvGroup, w: int, fd: int, wake_fd: int, pid: int) -> None:
    table = handlers(group)
    msg = framing.receive(fd)
    if isinstance(msg, m.Close):
        return
    reply = answer(group, table, msg, pid)
    attached = not isinstance(reply, m.Failed) and group.ring is not None and group.ring.bell is not None
    spin = CommandWait()
    # Before the reply: the main process posts the next command as soon as it has it, and the bell
    # must have taken the command words as they were before that.
    bell = WorkerBell(group.ring.bell, w, wake_fd, fd, spin) if attached else None  # type: ignore[union-attr,arg-type]
    framing.send(fd, reply)
    if bell is None:
        # Not attached: nothing to do but wait for the main process to close us.
        while not isinstance(framing.receive(fd), m.Close):
            pass
        return
    while True:
        spin.spin_s = group.spin_s
        command = bell.wait()
        if command is None:
            return  # the main process is gone
        spin.received()
        op, slot = command
        msg = m.Step(slot) if op == OP_STEP else framing.receive(fd)
        if isinstance(msg, m.Close):
            return
        reply = answer(group, table, msg, pid)
        # A step that left nothing over is answered by the ring alone.
        has_reply = not isinstance(reply, m.Stepped) or bool(reply.items) or reply.objects is not None
        if has_reply:
            _reply(fd, msg, reply, group.first_env)
        bell.finish(has_reply)
        spin.done()


def _reply(fd: int, msg: m.Command, reply: m.Reply, first_env: int) -> None:
    try:
        data = framing.dumps(reply)
    except Exception as exc:  # e.g. an info dict or attribute value that cannot be pickled
        data = framing.dumps(unpicklable(msg, reply, first_env, exc))
    framing.write_message(fd, data)
