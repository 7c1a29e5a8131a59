"""The transport contract: what the engine needs from whatever reaches its workers.

Two transports implement it: :class:`~shmvec.transports.local.LocalTransport` (worker processes on
this machine, the ring's doorbell and a pipe each) and
:class:`~shmvec.transports.ray.transport.RayTransport` (Ray actors, results landed into the ring by the
main process). The engine's core (:mod:`shmvec.engine.core`) drives either through these methods
alone, so synchronous steps, pool mode, restart mode and every env call work the same on both.

A transport never raises for what a worker did: :meth:`Transport.wait` returns an :class:`Outcome`
with the replies, the exceptions the envs raised, and the workers that died or hung; the engine's
fault policy (:mod:`shmvec.engine.faults`) decides what that means.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import cloudpickle

from shmvec.errors import unpicklable_factory
from shmvec.wire.messages import Command, RemoteError, Reply


@dataclass
class Fault:
    """A worker that died or hung: which one, why (a readable sentence), and the error raise mode
    raises (restart mode re-raises it when the restart budget is spent)."""

    worker: int
    reason: str
    error: BaseException


@dataclass
class Outcome:
    """What waiting on some workers gave.

    :param results: worker -> its reply, for the workers that finished, in the order they were seen
        to finish; None for a step answered by the ring alone (nothing was left over).
    :param errors: worker -> the exception its env raised (the worker lives on).
    :param faults: workers that died or did not answer within the timeout, in worker order.
    """

    results: dict[int, Reply | None] = field(default_factory=dict)
    errors: dict[int, RemoteError] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)

    @property
    def finished(self) -> int:
        """Workers that answered (a result or an env error)."""
        return len(self.results) + len(self.errors)


class Transport(Protocol):
    """How the engine reaches its workers.

    Worker ``w`` hosts the envs ``worker_envs[w]``. A worker has at most one command in flight;
    :meth:`post` sends one to each of some idle workers, :meth:`wait` collects what they answer.
    """

    worker_envs: list[range]
    #: seconds a worker may take to answer a command (None: as long as it lives)
    timeout: float | None

    def start(self, workers: Sequence[int]) -> None:
        """Launch ``workers`` (new, or in place of dead ones): their start-up replies
        (:class:`~shmvec.wire.messages.Ready`, the spaces of their envs) come through :meth:`wait`."""

    def bind(self, ring: Any) -> None:
        """The engine's ring exists: the transport may use it (doorbell, landing batches)."""

    def post(
        self,
        workers: Sequence[int],
        commands: Command | Sequence[Command],
        partial: bool = False,
        fan_out: bool = True,
    ) -> list[Fault]:
        """Send one command to each of ``workers`` (one for all, or one each); the faults of the
        workers that could not take it (killed if hung). The others are now in flight.

        :param partial: the replies will be waited for as they come, fewer than all at a time: each
            worker must be seen to finish on its own (no single wake-up when the last one does).
        :param fan_out: a synchronous step of every worker may have the first worker wake the
            others instead of the main process (the doorbell's choice, see
            :meth:`shmvec.memory.doorbell.MainBell.step_all`); transports without one ignore it."""

    def wait(self, workers: Sequence[int], need: int, limit: float | None = None) -> Outcome:
        """Wait until ``need`` of ``workers`` (all in flight) have answered, died or hung, or until
        ``limit`` seconds have passed (then fewer may have; the rest stay in flight). Hung workers
        (past :attr:`timeout`) are killed."""

    def kill(self, w: int) -> None:
        """Kill worker ``w`` at once (its envs are rebuilt or the engine closes)."""

    def replace(self, w: int) -> None:
        """Kill worker ``w`` and :meth:`start` a new one from the same factories."""

    @property
    def processes(self) -> list[Any]:
        """The local worker processes in worker order, updated in place when one is replaced (empty
        for remote workers)."""

    def close(self, graceful: bool = True) -> None:
        """Stop every worker (``graceful``: ask first, then kill) and release what the transport
        holds. Idempotent; also run by a finalizer if the engine is garbage collected unclosed."""


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
        raise unpicklable_factory(first, needed_by, way_out, exc, unpicklable_part(fn)) from None


def unpicklable_part(fn: Any, depth: int = 3) -> str | None:
    """What in ``fn`` cannot be pickled, named as the user wrote it: a variable its closure captured,
    a global it reads, a default or a ``functools.partial`` argument, an attribute of a callable
    object, followed through functions up to ``depth`` deep (``"`helper`, whose `LOCK` (a
    _thread.lock)"``); None when no single part is to blame. Only called once pickling has failed."""
    for name, value in _parts(fn):
        try:
            cloudpickle.dumps(value)
        except Exception:
            inner = unpicklable_part(value, depth - 1) if depth > 1 else None
            kind = type(value)
            own = f"`{name}` (a {kind.__module__}.{kind.__qualname__})".replace("builtins.", "")
            return own if inner is None else f"`{name}`, whose {inner}"
    return None


def _parts(fn: Any) -> list[tuple[str, Any]]:
    """The named parts cloudpickle pickles along with ``fn`` (see :func:`unpicklable_part`)."""
    if isinstance(fn, functools.partial):
        args = [(f"argument {i} of the partial", a) for i, a in enumerate(fn.args)]
        return [("func", fn.func), *args, *fn.keywords.items()]
    if inspect.ismethod(fn):
        return [("self", fn.__self__), *_parts(fn.__func__)]
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        cells = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
        parts = list(zip(code.co_freevars, cells))
        scope = getattr(fn, "__globals__", {})
        parts += [(n, scope[n]) for n in _global_names(code) if n in scope]
        parts += [(f"a default of {fn.__name__}", d) for d in getattr(fn, "__defaults__", None) or ()]
        return parts + list((getattr(fn, "__kwdefaults__", None) or {}).items())
    if not isinstance(fn, type) and hasattr(fn, "__dict__"):
        return list(vars(fn).items())
    return []


def _global_names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions, comprehensions
            names += _global_names(const)
    return names


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - raises for a cell not yet assigned
    except ValueError:
        return False
    return True
