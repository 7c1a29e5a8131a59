"""How a message crosses a local pipe: pickled, and framed as ``multiprocessing.Connection`` frames it
(a 4-byte length, or -1 and an 8-byte length beyond 2 GiB), written and read with bare
``os.write``/``os.read``. Going around Connection's layers of Python per message took about a tenth
off the main process's CPU per step on an 8-env CartPole; plain ``pickle`` instead of Connection's
``ForkingPickler`` (built anew per message) saves as much again.

A worker has at most one message in flight each way (it answers each command before reading the
next), so reading exact lengths never takes a byte of the next message.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import struct
import time
from typing import Any

_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")


def frame_header(size: int) -> bytes:
    """The length prefix of a message of ``size`` bytes."""
    return _LENGTH.pack(size) if size <= 0x7FFFFFFF else _LENGTH.pack(-1) + _LONG_LENGTH.pack(size)


def dumps(message: Any) -> bytes:
    """A message as the pipe carries it."""
    return pickle.dumps(message, pickle.HIGHEST_PROTOCOL)


def send(fd: int, message: Any) -> None:
    """Pickle and write one message to the blocking pipe ``fd``.

    :raises BrokenPipeError: when the reader is gone; pickling errors before anything is written.
    """
    write_message(fd, dumps(message))


def receive(fd: int) -> Any:
    """Read and unpickle one message from the blocking pipe ``fd``.

    :raises EOFError: when the writer is gone.
    """
    return pickle.loads(read_message(fd))


def write_message(fd: int, data: bytes) -> None:
    """Write one framed message to the blocking pipe ``fd``.

    :raises BrokenPipeError: when the reader is gone.
    """
    if len(data) <= 1 << 16:  # one write: one wake-up of the reader
        _write_all(fd, frame_header(len(data)) + data)
    else:  # no copy of a large message just to prepend its length
        _write_all(fd, frame_header(len(data)))
        _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view) :]


def read_message(fd: int) -> bytes:
    """Read one framed message from the blocking pipe ``fd``.

    :raises EOFError: when the writer is gone (at a message boundary or inside one).
    """
    (size,) = _LENGTH.unpack(_read_exact(fd, 4))
    if size == -1:
        (size,) = _LONG_LENGTH.unpack(_read_exact(fd, 8))
    return _read_exact(fd, size)


def _read_exact(fd: int, size: int) -> bytes:
    data = os.read(fd, size)
    if len(data) == size:
        return data
    if not data and size:
        raise EOFError("the other end of the pipe closed")
    parts = [data]
    left = size - len(data)
    while left:
        part = os.read(fd, left)
        if not part:
            raise EOFError("the other end of the pipe closed in the middle of a message")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def write_within(fd: int, data: bytes, timeout: float) -> bool:
    """:func:`write_message`, giving up after ``timeout`` seconds of a full pipe;
    False then (part of the message may have been written)."""
    header = frame_header(len(data))
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    os.set_blocking(fd, False)
    try:
        for chunk in (memoryview(header), memoryview(data)):
            while len(chunk):
                try:
                    chunk = chunk[os.write(fd, chunk) :]
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0 or not poller.poll(math.ceil(left * 1000)):
                        return False
    finally:
        os.set_blocking(fd, True)
    return True
