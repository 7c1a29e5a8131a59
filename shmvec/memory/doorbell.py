"""The doorbell: the main process wakes the workers of a batch with one system call, and is woken
once, by the last of them to finish.

Before it, every step cost the main process one pipe write, one poll registration, one wake-up and
one pickled reply per worker: about 22 µs per worker per batch (shared/MEASURED.md), 1.5-2 ms per
batch at 64 workers. Now the commands of a batch are words in the ring:

=================  ========================================================================
``ctl[BELL]``      written by the main process only; every idle worker sleeps on it (futex)
``ctl[BITS:]``     one *pending* bit per worker of a counted batch, set by the main process and
                   cleared by the worker, atomically, when it is done
``cmd[w]``         ``(seq, op, slot, flags)``: worker ``w``'s latest command (main writes)
``ack[w]``         ``(seq, has_reply)``: the command worker ``w`` finished last (``w`` writes)
=================  ========================================================================

The main process writes the commands, bumps ``BELL`` and calls ``FUTEX_WAKE_BITSET`` once for all
the workers it addressed (worker ``w`` waits with bit ``w % 32``, so a subset wakes only its own).
The kernel wakes each sleeper in turn, ~1-2 µs each, on the caller's CPU: on a synchronous step the
main process wakes only the first worker of each group of :data:`FAN_OUT_GROUP` (its *leader*,
flagged ``FAN_OUT``), which wakes the rest of its group before stepping its own envs, so the main
process's cost stays ~1/8 of the workers'. Up to :data:`FAN_OUT_GROUP` workers the caller chooses
(:meth:`MainBell.step_all`): the engine lets worker 0 wake the others when the main process ended no
OpenMP pool for the step (a single-threaded loop between steps, as Tianshou's Collector with random
actions; a GPU policy would be one too, not measured), and wakes them all itself when it did (a CPU
policy). Measured on the 2-core development VM, 8 preprocessed Breakout envs in 2 workers, random
actions, 800 µs of single-threaded work in the main process between steps, fresh processes
alternated (3 pairs): 2,122-2,273 env steps/s with the main process waking both workers, 2,985-3,168
with worker 0 waking worker 1 (the main process waking both in one call put both on one CPU at
times, and the CPU it left when it went to sleep stayed idle for the step); with nothing between
steps, 4,787-5,183 against 4,603-5,233. With SB3's Atari recipe and PPO's CnnPolicy in the loop
(``benchmarks/against_commit.py --workloads atari-policy --rounds 7``), worker 0 waking worker 1 ran
0.962x (0.93-0.99 per round), hence the choice (with it, 1.000x, 0.99-1.01, 5 rounds).

A leader that died is covered by :meth:`MainBell.give_up_on`, one that is stopped or starved by the
main process waking everyone once the step has taken 50 ms (:mod:`shmvec.transports.local`).
A worker finishing a *counted* command (a batch posted while no other command was in flight: every
synchronous step) clears its pending bit with ``FUTEX_WAKE_OP`` (the kernel's atomic and-not;
Python has no atomics of its own), and the one that finds every bit clear writes the main process's
``eventfd``: one wake-up per batch. For a counted command, the cleared bit *is* the worker's
"done": a clear can never land on a later batch's bits (the main process sets them only once every
bit of the last batch is clear, or its worker dead), and a worker that dies has its bit cleared by
the main process, which then knows whether anyone is left to wake it. Other commands (pool mode
posts groups while others step) write the ``eventfd`` each. The main process waits in ``epoll``
on that ``eventfd`` (edge-triggered: its count is never read back), every worker's pipe (replies
that do not fit the ring) and every worker's process sentinel (a death is noticed at once), with
the step deadline as its timeout: no busy-waiting, every wait bounded.

Measured on the 2-core development VM, workers doing nothing (a prototype of this module, fork,
2,000 batches): main-process CPU per batch 5.6 / 31.7 / 91.5 µs for 2 / 16 / 64 workers with one
bitset wake (79.2 µs at 64 with a plain broadcast, 146.1 µs writing one eventfd per worker); the
remaining ~1.2 µs per worker is the kernel waking each one.

Ordering: a worker reads ``seq`` only after ``BELL`` changed (or while it polls), and the main
process writes ``op``/``slot`` before ``seq``; a worker writes ``has_reply`` (and its pipe reply)
before ``ack``, and ``ack`` before clearing its bit. x86-64 keeps stores in order and the kernel's
atomics are full barriers; the futex system call numbers are known for Linux on x86-64, arm64,
riscv64, ppc64 and s390x.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import operator
import os
import platform
import select
import time
from collections.abc import Callable, Iterable

import numpy as np

# ctl words: the bell on the first cache line, the pending bits from the second on
BELL, BITS = 0, 16
# cmd columns
SEQ, OP, SLOT, FLAGS = 0, 1, 2, 3
# ack columns
ACK_SEQ, HAS_REPLY = 0, 1
# ops: a step whose actions and slot are in the ring, or "read one message from your pipe"
OP_STEP, OP_MESSAGE = 1, 2
# flags
COUNTED = 1
FAN_OUT = 2  # a synchronous step: this worker (a leader) wakes its followers first
# Workers per wake-up group of a synchronous step: the main process wakes one worker in FAN_OUT
# (the group's leader), the leader wakes the rest.
FAN_OUT_GROUP = 8

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


def _clear_bit_op(bit: int) -> int:
    """FUTEX_OP(FUTEX_OP_ANDN | FUTEX_OP_OPARG_SHIFT, bit, FUTEX_OP_CMP_EQ, 0): the kernel clears
    ``1 << bit`` of the word atomically."""
    return ((3 | 8) << 28) | (0 << 24) | ((bit & 0xFFF) << 12)


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


def _wake(bell_addr: int, wake_bits: int) -> None:
    """Wake the workers sleeping on the bell with any of ``wake_bits``."""
    _FUTEX(bell_addr, _FUTEX_WAKE_BITSET, 0x7FFFFFFF, None, None, wake_bits)  # type: ignore[misc]


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
            f"{platform.machine()}. transport='portable' (the default here) runs on every platform."
        )


def worker_bit(w: int) -> int:
    """The futex bitset bit worker ``w`` sleeps on."""
    return 1 << (w % 32)


def _pending_words(workers: Iterable[int], n_words: int) -> list[int]:
    """The pending words with one bit set per worker of ``workers`` (bit ``w % 32`` of word
    ``w // 32``)."""
    words = [0] * n_words
    for w in workers:
        words[w >> 5] |= 1 << (w & 31)
    return words


def leaders(n_workers: int) -> list[int]:
    """The workers the main process wakes for a fanned-out synchronous step of ``n_workers``: the
    first of each group of :data:`FAN_OUT_GROUP`, which wakes the others of its group
    (:func:`followers`)."""
    return list(range(0, n_workers, FAN_OUT_GROUP))


def followers(w: int, n_workers: int) -> range:
    """The workers leader ``w`` wakes in a synchronous step (none for a worker that leads nothing)."""
    if w % FAN_OUT_GROUP:
        return range(0)
    return range(w + 1, min(w + FAN_OUT_GROUP, n_workers))


class MainBell:
    """The main process's side: post commands to workers, tell which have finished.

    :param words: the ring's ``(ctl, cmd, ack)`` arrays (:attr:`shmvec.memory.ring.Ring.bell`).
    """

    def __init__(self, words: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        check_available()
        self.ctl, cmd, ack = words
        self.seq, self.op, self.slot, self.flags = (cmd[:, c] for c in (SEQ, OP, SLOT, FLAGS))
        self.acked, self.has_reply = ack[:, ACK_SEQ], ack[:, HAS_REPLY]
        n = len(self.seq)
        self.pending = self.ctl[BITS : BITS + -(-n // 32)]  # one bit per worker of a counted batch
        self._all_pending = _pending_words(range(n), len(self.pending))
        self.counted = [False] * n  # per worker: whether its latest command is counted
        # op and counted hold a counted step of every worker, and flags this array (None: not)
        self._stepping_all: np.ndarray | None = None
        self._bell_addr = self.ctl.ctypes.data + BELL * 4
        self._bell = int(self.ctl[BELL])
        self._wake_bit = [worker_bit(w) for w in range(n)]
        self._all_wake_bits = _ALL_BITS if n >= 32 else sum(self._wake_bit)
        # A fanned-out synchronous step wakes the leaders only; they wake their followers (see
        # followers()). Up to FAN_OUT_GROUP workers a step may instead wake every worker directly.
        first = leaders(n)
        self._leader_bits = functools.reduce(operator.or_, (self._wake_bit[w] for w in first), 0)
        self._fan_flags = np.full(n, COUNTED, np.uint32)
        self._fan_flags[[w for w in first if followers(w, n)]] |= FAN_OUT
        self._direct_flags = np.full(n, COUNTED, np.uint32)
        self._may_go_direct = n <= FAN_OUT_GROUP
        self._fanning = False  # whether the last synchronous step woke leaders only

    def post(self, workers: list[int] | None, op: int, slots: int | list[int], counted: bool) -> None:
        """Give ``workers`` their next command and wake them (one system call).

        :param workers: worker indices (None: every worker).
        :param op: :data:`OP_STEP` (slot ``slots``, or one slot per worker; actions in the ring) or
            :data:`OP_MESSAGE`.
        :param counted: whether these are all the commands in flight (every bit of the last counted
            batch is clear): then only the last worker to finish wakes the main process.
        """
        every = workers is None
        index: slice | np.ndarray = slice(None) if every else np.array(workers, dtype=np.intp)
        if counted:
            words = self._all_pending if workers is None else _pending_words(workers, len(self.pending))
            self.pending[:] = words
        self._stepping_all, self._fanning = None, False
        if every:
            self.counted = [counted] * len(self.counted)
        else:
            for w in workers:  # type: ignore[union-attr]
                self.counted[w] = counted
        self.op[index] = op
        self.slot[index] = slots
        self.flags[index] = COUNTED if counted else 0
        self.seq[index] += 1  # uint32: wraps around, as the workers compare for equality only
        if every:
            self._ring(self._all_wake_bits)
        else:
            wake_bits = 0
            for w in workers:  # type: ignore[union-attr]
                wake_bits |= self._wake_bit[w]
            self._ring(wake_bits)

    def step_all(self, slot: int, fan_out: bool = True) -> None:
        """:meth:`post` of a counted step into ``slot`` to every worker: the synchronous step, with
        whole-array writes only.

        :param fan_out: wake the leaders only, which wake the others (default True; always so beyond
            :data:`FAN_OUT_GROUP` workers). False: wake every worker in this call.
        """
        direct = not fan_out and self._may_go_direct
        flags = self._direct_flags if direct else self._fan_flags
        self.pending[:] = self._all_pending
        if self._stepping_all is not flags:  # the words of the last synchronous step: left as they are
            self.counted = [True] * len(self.counted)
            self.op[:] = OP_STEP
            self.flags[:] = flags
            self._stepping_all = flags
        self.slot[:] = slot
        self.seq += 1
        self._fanning = not direct and self._leader_bits != self._all_wake_bits
        self._ring(self._all_wake_bits if direct else self._leader_bits)

    def _ring(self, wake_bits: int) -> None:
        self._bell = (self._bell + 1) & _MASK
        self.ctl[BELL] = self._bell
        _wake(self._bell_addr, wake_bits)

    @property
    def fans_out(self) -> bool:
        """Whether the last synchronous step woke leaders only (more than one worker, fanned out)."""
        return self._fanning

    def wake_all(self) -> None:
        """Wake every worker (those without a new command go back to sleep)."""
        _wake(self._bell_addr, self._all_wake_bits)

    def batch_done(self) -> bool:
        """Whether every worker of the last counted batch is done (every pending bit clear)."""
        return not self.pending.any()

    def finished(self, workers: list[int]) -> list[int]:
        """The workers of ``workers`` that finished their latest command (a counted one: its pending
        bit is clear), in ``workers`` order."""
        if not workers:
            return []
        # One read of each word array, then Python ints: a pool batch asks about a worker or two.
        acked, seq, counted = self.acked.tolist(), self.seq.tolist(), self.counted
        bits = self.pending.tolist()
        return [
            w for w in workers if (not (bits[w >> 5] >> (w & 31)) & 1 if counted[w] else acked[w] == seq[w])
        ]

    def give_up_on(self, w: int) -> bool:
        """Worker ``w`` is gone: clear its pending bit for it (atomically, as it would have); whether
        the counted batch is now done (then nobody is left to write the eventfd)."""
        if self.counted[w]:
            addr = self.pending.ctypes.data + (w >> 5) * 4
            _FUTEX(addr, _FUTEX_WAKE_OP, 0, None, addr, _clear_bit_op(w & 31))  # type: ignore[misc]
            if self._fanning:
                self.wake_all()  # it may have been a leader that died before waking its followers
            self.counted[w] = False
            self._stepping_all = None
        return self.batch_done()


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
        self._follower_bits = functools.reduce(operator.or_, map(worker_bit, followers(w, len(cmd))), 0)
        self.last = int(self.mine[SEQ])
        self.ack[ACK_SEQ] = self.last
        self.flags = 0
        n_words = -(-len(cmd) // 32)
        self.pending = self.ctl[BITS : BITS + n_words]
        self._pending_addr = self.pending.ctypes.data + (w // 32) * 4
        self._clear = _clear_bit_op(w % 32)
        self._bell_addr = self.ctl.ctypes.data + BELL * 4
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
        if self.flags & FAN_OUT:
            _wake(self._bell_addr, self._follower_bits)  # before this worker's own envs step
        return int(mine[OP]), int(mine[SLOT])

    def _orphaned(self) -> bool:
        return any(event & (select.POLLHUP | select.POLLERR) for _, event in self._hangup.poll(0))

    def finish(self, has_reply: bool) -> None:
        """The command is done (its reply, if any, is already in the pipe): say so, and wake the
        main process if this was the last of a counted batch, or not counted."""
        self.ack[HAS_REPLY] = has_reply
        self.ack[ACK_SEQ] = self.last
        if self.flags & COUNTED:
            _FUTEX(self._pending_addr, _FUTEX_WAKE_OP, 0, None, self._pending_addr, self._clear)  # type: ignore[misc]
            if self.pending.any():
                return
        try:
            os.eventfd_write(self.wake_fd, 1)
        except BlockingIOError:  # the counter is full of earlier wake-ups: the main process looks anyway
            pass
