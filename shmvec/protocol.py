"""The small messages between the main process and workers, and how errors travel.

A command is ``(name, payload)``; a reply is ``(True, result)`` or ``(False, RemoteError)``. Arrays
never travel here: observations, rewards and flags live in the ring (see :mod:`shmvec.ring`), and
actions too when the action space is array-shaped. What does travel: non-empty info dicts, reset
infos, attribute values and env-method results, and actions that do not fit the typed buffer.

Commands (payload -> result):

- ``attach`` (RingSpec, codecs, verify_every) -> None
- ``configure`` (dict of options) -> None
- ``step`` (slot, actions for this worker's envs or None = read the ring) ->
  list of ``(local_env, info, reset_info | None)`` for envs with a non-empty info or an auto-reset
- ``reset`` (slot, seeds, reset keyword arguments besides the seed, mask or None) -> list of reset
  infos
- ``get_attr`` / ``has_attr`` / ``set_attr`` / ``env_method`` / ``call`` / ``set_wrapper_attr`` /
  ``is_wrapped`` / ``render`` (local env indices, ...) -> list of results
- ``close`` -> the worker exits, no reply

Env factories travel once, when a worker starts: cloudpickled in the main process
(:func:`pickle_factories`) unless the worker is forked. What a command to several workers came back
with, as both transports give it to the engine, is an :class:`Outcome`.

On a local pipe each message is framed as ``multiprocessing.Connection`` frames it (a 4-byte length,
or -1 and an 8-byte length beyond 2 GiB) and written and read with bare ``os.write``/``os.read``
(:func:`write_message`, :func:`read_message`): going around Connection's layers of Python per
message took about a tenth off the main process's CPU per step on an 8-env CartPole. A worker has
at most one message in flight each way (it answers each command before reading the next), so
reading exact lengths never takes a byte of the next message.
"""

from __future__ import annotations

import os
import pickle
import struct
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import cloudpickle

from shmvec.errors import unpicklable_factory
from shmvec.restart import Fault

# Start-up message a worker sends once its envs exist: the spaces of each env, for checking.
READY = "ready"


class Command(str, Enum):
    """The commands a worker serves. A ``str`` so the plain value crosses the pipe (an enum member
    would pickle as a class reference, costlier on every step) and still compares equal."""

    MAKE_ENV = "make_env"  # not sent: names the start-up wait in errors
    ATTACH = "attach"
    CONFIGURE = "configure"
    STEP = "step"
    RESET = "reset"
    GET_ATTR = "get_attr"
    HAS_ATTR = "has_attr"
    SET_ATTR = "set_attr"
    ENV_METHOD = "env_method"
    CALL = "call"  # like env_method, but a non-callable attribute gives its value (gymnasium's call)
    SET_WRAPPER_ATTR = "set_wrapper_attr"  # one value per env
    IS_WRAPPED = "is_wrapped"
    RENDER = "render"
    CLOSE = "close"

    def label(self, payload: Any = None) -> str:
        """How errors name the command: ``"get_attr:render_mode"`` for the commands that name an
        attribute or method (the second item of their payload), else the bare name."""
        if self in _NAMED and isinstance(payload, tuple) and len(payload) > 1:
            return f"{self.value}:{payload[1]}"
        return self.value


_NAMED = frozenset(
    {
        Command.GET_ATTR,
        Command.HAS_ATTR,
        Command.SET_ATTR,
        Command.ENV_METHOD,
        Command.CALL,
        Command.SET_WRAPPER_ATTR,
    }
)


@dataclass
class RemoteError:
    """An exception raised in a worker, in a form that always pickles."""

    env_index: int | None
    command: str
    exc_type: str
    message: str
    traceback: str
    pid: int
    exception: bytes | None  # pickled original exception, when it can be pickled

    @classmethod
    def capture(cls, exc: BaseException, env_index: int | None, command: str, pid: int) -> RemoteError:
        try:
            pickled: bytes | None = pickle.dumps(exc)
        except Exception:
            pickled = None
        return cls(
            env_index=env_index,
            command=command,
            exc_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            message=str(exc),
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            pid=pid,
            exception=pickled,
        )

    def original(self) -> BaseException | None:
        """The original exception object, rebuilt in the main process, or None."""
        if self.exception is None:
            return None
        try:
            exc = pickle.loads(self.exception)
        except Exception:
            return None
        return exc if isinstance(exc, BaseException) else None


Reply = tuple[bool, Any]

_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")


def frame_header(size: int) -> bytes:
    """The length prefix of a message of ``size`` bytes."""
    return _LENGTH.pack(size) if size <= 0x7FFFFFFF else _LENGTH.pack(-1) + _LONG_LENGTH.pack(size)


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


@dataclass
class Outcome:
    """What a command to some workers came back with.

    :param results: per worker asked, in that order: its result, or None when it failed.
    :param errors: worker -> the exception its env raised (the worker lives on).
    :param faults: workers that died or did not answer within the timeout, in worker order.
    """

    results: list[Any]
    errors: dict[int, RemoteError] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)


def pickle_factories(
    fns: list[Callable[[], Any]], first: int, needed_by: str, way_out: str | None = None
) -> bytes:
    """Cloudpickle a worker's factories now, so an unpicklable one fails here with a useful message.

    :param first: the env index of ``fns[0]`` (the error names the env).
    :param needed_by: what needs them pickled, as the error names it: ``"the 'spawn' start method"``,
        ``'backend="ray"'``.
    :param way_out: how to do without pickling, if there is a way (``"use start_method='fork'"``).
    """
    try:
        return cloudpickle.dumps(fns)
    except Exception:
        for i, fn in enumerate(fns):
            try:
                cloudpickle.dumps(fn)
            except Exception as fn_exc:
                exc = fn_exc
                first += i
                break
        raise unpicklable_factory(first, needed_by, way_out, exc) from None
