"""The doorbell: the main process wakes the workers of a batch with one system call, and is woken
once, by the last of them to finish.

Before it, every step cost the main process one pipe write, one poll registration, one wake-up and
one pickled reply per worker: about 22 µs per worker per batch (shared/MEASURED.md), 1.5-2 ms per
batch at 64 workers. Now the commands of a batch are words in the ring:

=================  ========================================================================
``ctl[BELL]``      written by the main process only; every idle worker sleeps on it (futex)
``ctl[LEFT]``      a counted batch's workers still busy; each decrements it atomically
``cmd[w]``         ``(seq, op, slot, flags)``: worker ``w``'s latest command (main writes)
``ack[w]``         ``(seq, has_reply)``: the command worker ``w`` finished last (``w`` writes)
=================  ========================================================================

The main process writes the commands, bumps ``BELL`` and calls ``FUTEX_WAKE_BITSET`` once for all
the workers it addressed (worker ``w`` waits with bit ``w % 32``, so a subset wakes only its own).
A worker finishing a *counted* command (a batch posted while no other command was in flight: every
synchronous step) decrements ``LEFT`` with ``FUTEX_WAKE_OP`` (the kernel's atomic add; Python has
none), and the one that takes it to zero writes the main process's ``eventfd``: one wake-up per
batch. Other commands (pool mode posts groups while others step) write the ``eventfd`` each.
The main process waits in ``epoll`` on that ``eventfd``, every worker's pipe (replies that do not
fit the ring) and every worker's process sentinel (a death is noticed at once), with the step
deadline as its timeout: no busy-waiting, every wait bounded.

Measured on the 2-core development VM, workers doing nothing (``/tmp``-style prototype of this
module, fork, 2,000 batches): main-process CPU per batch 5.6 / 31.7 / 91.5 µs for 2 / 16 / 64
workers with one bitset wake (79.2 µs at 64 with a plain broadcast, 146.1 µs writing one eventfd per
worker); the remaining ~1.2 µs per worker is the kernel waking each one.

Ordering: a worker reads ``seq`` only after ``BELL`` changed (or while it polls), and the main
process writes ``op``/``slot`` before ``seq``; a worker writes ``has_reply`` (and its pipe reply)
before ``ack``'s ``seq``, and ``ack`` before its atomic decrement. x86-64 keeps stores in order and
the kernel's atomics are full barriers; the futex system call numbers are known for Linux on
x86-64, arm64, riscv64, ppc64 and s390x.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import select
import time
from collections.abc import Callable

import numpy as np

# ctl words (each on its own cache line: the main process writes BELL, workers LEFT)
BELL, LEFT = 0, 16
# cmd columns
SEQ, OP, SLOT, FLAGS = 0, 1, 2, 3
# ack columns
ACK_SEQ, HAS_REPLY = 0, 1
# ops: a step whose actions and slot are in the ring, or "read one message from your pipe"
OP_STEP, OP_MESSAGE = 1, 2
# flags
COUNTED = 1

_MASK = 0xFFFFFFFF
_ALL_BITS = 0xFFFFFFFF
# How long a sleeping worker waits before it looks whether the main process is still there (s).
CHECK_PARENT_S = 1.0

_SYS_FUTEX = {
    "x86_64": 202,
    "amd64": 202,
    "aarch64": 98,
    "arm64": 98,
    "riscv64": 98,
    "ppc64": 221,
    "ppc64le": 221,
    "s390x": 238,
}
_FUTEX_WAKE_OP, _FUTEX_WAIT_BITSET, _FUTEX_WAKE_BITSET = 5, 9, 10
# FUTEX_OP(FUTEX_OP_ADD, -1, FUTEX_OP_CMP_EQ, 0): the kernel adds -1 (12-bit two's complement).
_DECREMENT = (1 << 28) | (0 << 24) | (0xFFF << 12) | 0


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_syscall() -> Callable[..., int] | None:
    number = _SYS_FUTEX.get(platform.machine().lower())
    if number is None or not hasattr(os, "eventfd"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [
        ctypes.c_long,  # the system call number
        ctypes.c_void_p,  # uaddr
        ctypes.c_int,  # futex op
        ctypes.c_uint32,  # val
        ctypes.c_void_p,  # timeout (or val2)
        ctypes.c_void_p,  # uaddr2
        ctypes.c_uint32,  # val3
    ]
    return lambda *args: fn(number, *args)


_FUTEX = _futex_syscall()


def available() -> bool:
    """Whether this platform has what the doorbell needs (Linux futexes with a known system call
    number, and ``os.eventfd``)."""
    return _FUTEX is not None


def check_available() -> None:
    """:raises RuntimeError: naming what is missing, where :func:`available` is False."""
    if not available():
        raise RuntimeError(
            "shmvec's local workers need Linux futexes and os.eventfd (Python >= 3.10 on Linux, on "
            f"x86-64, arm64, riscv64, ppc64 or s390x); this is {platform.system()} on "
            f"{platform.machine()}. Use backend='ray', or SB3's SubprocVecEnv."
        )


def worker_bit(w: int) -> int:
    """The futex bitset bit worker ``w`` sleeps on."""
    return 1 << (w % 32)


class MainBell:
    """The main process's side: post commands to workers, tell which have finished.

    :param words: the ring's ``(ctl, cmd, ack)`` arrays (:attr:`shmvec.memory.ring.Ring.bell`).
    :param wake_fd: the ``eventfd`` the workers write when the main process should look.
    """

    def __init__(self, words: tuple[np.ndarray, np.ndarray, np.ndarray], wake_fd: int) -> None:
        check_available()
        self.ctl, cmd, ack = words
        self.seq, self.op, self.slot, self.flags = (cmd[:, c] for c in (SEQ, OP, SLOT, FLAGS))
        self.acked, self.has_reply = ack[:, ACK_SEQ], ack[:, HAS_REPLY]
        self.wake_fd = wake_fd
        self._bell_addr = self.ctl.ctypes.data + BELL * 4
        self._bell = int(self.ctl[BELL])
        n = len(self.seq)
        self._bits = np.array([worker_bit(w) for w in range(n)], np.uint64)
        self._all_bits = _ALL_BITS if n >= 32 else int(np.bitwise_or.reduce(self._bits))

    def post(self, workers: np.ndarray | slice, op: int, slots: np.ndarray | int, counted: bool) -> None:
        """Give ``workers`` their next command and wake them (one system call).

        :param workers: worker indices (an int array, or a slice for all).
        :param op: :data:`OP_STEP` (slot ``slots``, actions in the ring) or :data:`OP_MESSAGE`.
        :param counted: whether these are all the commands in flight: then only the last worker to
            finish wakes the main process.
        """
        if counted:
            self.ctl[LEFT] = len(self.seq[workers])
        self.op[workers] = op
        self.slot[workers] = slots
        self.flags[workers] = COUNTED if counted else 0
        self.seq[workers] += 1  # uint32: wraps around, as the workers compare for equality only
        self._bell = (self._bell + 1) & _MASK
        self.ctl[BELL] = self._bell
        bits = (
            self._all_bits if isinstance(workers, slice) else int(np.bitwise_or.reduce(self._bits[workers]))
        )
        _FUTEX(self._bell_addr, _FUTEX_WAKE_BITSET, 0x7FFFFFFF, None, None, bits)  # type: ignore[misc]

    def done(self, workers: np.ndarray) -> np.ndarray:
        """Per worker of ``workers``: whether it finished its latest command."""
        return self.acked[workers] == self.seq[workers]

    def drain(self) -> None:
        """Reset the ``eventfd`` after a wake-up (its count says nothing the ack words do not)."""
        try:
            os.eventfd_read(self.wake_fd)
        except BlockingIOError:
            pass

    def resume(self, w: int) -> None:
        """A new worker ``w`` (restart mode) starts from the command words as they are."""
        self.acked[w] = self.seq[w]


class WorkerBell:
    """A worker's side: sleep until the next command, say when it is finished.

    :param words: the ring's ``(ctl, cmd, ack)`` arrays.
    :param w: this worker's index.
    :param wake_fd: the main process's ``eventfd``.
    :param pipe_fd: this worker's pipe: a hang-up there means the main process is gone.
    :param spin: how to poll before sleeping (see :class:`shmvec.worker.waiting.CommandWait`), or None.
    """

    def __init__(
        self,
        words: tuple[np.ndarray, np.ndarray, np.ndarray],
        w: int,
        wake_fd: int,
        pipe_fd: int,
        spin: Callable[[Callable[[], bool]], None] | None = None,
    ) -> None:
        check_available()
        self.ctl, cmd, ack = words
        self.mine, self.ack = cmd[w], ack[w]
        self.wake_fd, self.spin = wake_fd, spin
        self.bit = worker_bit(w)
        self.last = int(self.mine[SEQ])
        self.ack[ACK_SEQ] = self.last
        self.flags = 0
        self._bell_addr = self.ctl.ctypes.data + BELL * 4
        self._left_addr = self.ctl.ctypes.data + LEFT * 4
        self._deadline = _Timespec()
        self._hangup = select.poll()
        self._hangup.register(pipe_fd, 0)  # POLLHUP and POLLERR are always reported

    def _new(self) -> bool:
        return int(self.mine[SEQ]) != self.last

    def wait(self) -> tuple[int, int] | None:
        """The next command's ``(op, slot)``; None when the main process is gone."""
        if self.spin is not None and not self._new():
            self.spin(self._new)
        while True:
            bell = int(self.ctl[BELL])
            if self._new():
                break
            until = time.monotonic() + CHECK_PARENT_S
            self._deadline.tv_sec = int(until)
            self._deadline.tv_nsec = int((until % 1) * 1e9)
            result = _FUTEX(  # type: ignore[misc]
                self._bell_addr, _FUTEX_WAIT_BITSET, bell, ctypes.addressof(self._deadline), None, self.bit
            )
            if result != 0 and ctypes.get_errno() == errno.ETIMEDOUT and not self._new() and self._orphaned():
                return None
        mine = self.mine
        self.last = int(mine[SEQ])
        self.flags = int(mine[FLAGS])
        return int(mine[OP]), int(mine[SLOT])

    def _orphaned(self) -> bool:
        return any(event & (select.POLLHUP | select.POLLERR) for _, event in self._hangup.poll(0))

    def finish(self, has_reply: bool) -> None:
        """The command is done (its reply, if any, is already in the pipe): say so, and wake the
        main process if this was the last of a counted batch, or not counted."""
        self.ack[HAS_REPLY] = has_reply
        self.ack[ACK_SEQ] = self.last
        if self.flags & COUNTED:
            _FUTEX(self._left_addr, _FUTEX_WAKE_OP, 0, None, self._left_addr, _DECREMENT)  # type: ignore[misc]
            if int(self.ctl[LEFT]) != 0:
                return
        try:
            os.eventfd_write(self.wake_fd, 1)
        except BlockingIOError:  # the counter is full of earlier wake-ups: the main process looks anyway
            pass
