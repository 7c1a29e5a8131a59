"""Exception types that users of :class:`shmvec.ShmVecEnv` catch.

Every error raised on behalf of a worker names the env index (or the envs a worker hosts), the
command that was running, and the worker's process id, so a failure in a long run can be traced to
the env that caused it without re-running.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError


def install_hint(extra: str) -> str:
    """How to install one of shmvec's extras. shmvec is not on PyPI yet: from a clone of its
    repository first, ``pip install -e ".[ray]" (in a clone of shmvec; once released: pip install
    "shmvec[ray]")``."""
    return f'pip install -e ".[{extra}]" (in a clone of shmvec; once released: pip install "shmvec[{extra}]")'


def unpicklable_factory(
    env_index: int, needed_by: str, way_out: str | None, exc: Exception, culprit: str | None = None
) -> TypeError:
    """The error for an env factory that cannot be pickled: what to do first, then why. Raise it
    ``from None``: the pickler's own traceback (dozens of lines of cloudpickle) buries the advice,
    and its one line that matters is in the message.

    :param needed_by: what pickles the factories, e.g. ``"the 'spawn' start method"``.
    :param way_out: how to do without pickling, if there is a way (``"use start_method='fork'"``).
    :param culprit: what in the factory failed to pickle, when known (``"`LOCK` (a _thread.lock)"``):
        then the advice is not to capture it, since making the factory a module-level function
        does not help a function that reads an unpicklable global.
    """
    way = f" (or {way_out})" if way_out else ""
    why = f"Pickling it, which {needed_by} needs, failed: {type(exc).__name__}: {exc}"
    if culprit is not None:
        return TypeError(
            f"the factory of env {env_index} refers to {culprit}, which cannot be pickled: do not capture "
            f"it in the factory, create it inside the factory or the env instead{way}. {why}"
        )
    return TypeError(
        f"make the factory of env {env_index} picklable: a module-level function, or a "
        f"functools.partial of one with picklable arguments{way}. {why}"
    )


def short_traceback(text: str) -> str:
    """A worker's formatted traceback without the frames of shmvec's own worker loop.

    Those frames are the same in every error and say nothing about what went wrong; left in, they
    push the line that matters further up the screen. The whole traceback stays in the error's
    ``remote_traceback``.
    """
    out: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        if line.startswith('  File "'):
            path = line.replace("\\", "/").split('"')[1]
            skipping = "/shmvec/worker/" in path or path.endswith("shmvec/worker.py")
        elif not line.startswith(" "):
            skipping = False
        if not skipping:
            out.append(line)
    return "".join(out)


class ShmVecEnvError(RuntimeError):
    """Base class of every error raised by shmvec on behalf of its workers.

    Every error tied to a worker says which one; the attributes are None (or empty) when the error
    is not tied to a worker (e.g. :class:`ClosedError`).

    :param worker_index: index of the worker process.
    :param env_indices: the envs that run in that worker.
    :param worker_pid: process id of the worker.
    :param command: the command that was running, e.g. ``"step"``, ``"reset"``, ``"env_method:foo"``.
    :param remote_traceback: text from the worker (its Python traceback, or what faulthandler wrote).
    """

    def __init__(
        self,
        message: str = "",
        *,
        worker_index: int | None = None,
        env_indices: Sequence[int] = (),
        worker_pid: int | None = None,
        command: str | None = None,
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.worker_index = worker_index
        self.env_indices = list(env_indices)
        self.worker_pid = worker_pid
        self.command = command
        self.remote_traceback = remote_traceback


class EnvError(ShmVecEnvError):
    """An env raised an exception inside its worker.

    The worker stays alive and the VecEnv remains usable for ``reset()``, ``get_attr`` and
    ``close()``. After a failed ``step`` the envs of that worker before the failing one have stepped
    (their results are dropped), the failing one and those after it have not, and the other workers'
    envs have stepped: reset before stepping again. (With ``on_crash="restart"`` an exception in
    ``step``/``reset`` restarts the worker instead of raising.) The original exception is
    :attr:`original` when it could be pickled, and the error is then also an instance of its type
    (see :meth:`like`): ``except AttributeError`` catches a missing attribute as it would in-process.
    It is not chained as ``__cause__``: Python would print its message above the error's own, which
    already says it (a typo in an env id printed gymnasium's message three times).

    :param env_index: index of the env that raised (``None`` if the error was not tied to one env).
    :param exc_type: qualified name of the original exception type.
    :param original: the original exception, rebuilt in this process (None when it could not be
        pickled).
    :param fields: the worker fields of :class:`ShmVecEnvError`; ``remote_traceback`` is the
        traceback text formatted in the worker.
    """

    def __init__(
        self,
        message: str,
        *,
        env_index: int | None,
        exc_type: str,
        original: BaseException | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(message, **fields)
        self.env_index = env_index
        self.exc_type = exc_type
        self.original = original

    def __str__(self) -> str:
        if not self.remote_traceback.strip():
            return str(self.args[0])
        # The worker's traceback as Python prints it, closing with the exception and its message: the
        # last line on the screen says what went wrong, as for an error raised in this process (the
        # first line says it too, for logs and one-line summaries).
        frames = short_traceback(self.remote_traceback).rstrip()
        return f"{self.args[0]}\n\nTraceback in the worker:\n{frames}"

    @classmethod
    def like(cls, kind: type[BaseException] | None) -> type[EnvError]:
        """A subclass of both EnvError and ``kind`` (cached), so that ``except AttributeError:``
        written for an in-process env still catches it; EnvError itself when ``kind`` is not an
        ``Exception`` or cannot be combined with it."""
        if kind is None or not issubclass(kind, Exception) or issubclass(kind, cls):
            return cls
        combined = _COMBINED.get(kind)
        if combined is None:
            try:
                combined = type(f"EnvError[{kind.__name__}]", (cls, kind), {"__module__": __name__})
            except TypeError:  # incompatible layouts (some C exception types)
                combined = cls
            _COMBINED[kind] = combined
        return combined

    def __reduce__(self) -> tuple:
        # A combined class has no importable name: pickle as "EnvError like this kind".
        kind = next((k for k, c in _COMBINED.items() if c is type(self)), None)
        return _rebuild_env_error, (kind, self.args, self.__dict__)


_COMBINED: dict[type[BaseException], type[EnvError]] = {}


def _rebuild_env_error(kind: type[BaseException] | None, args: tuple, state: dict) -> EnvError:
    error = Exception.__new__(EnvError.like(kind))
    error.args = args
    error.__dict__.update(state)
    return error


class WorkerCrashedError(ShmVecEnvError):
    """A worker process died (killed by a signal, ``os._exit``, a segfault in the env...).

    In raise mode the VecEnv is closed when this is raised: its shared memory is released and the
    other workers are stopped. In restart mode it is raised only when the restart budget is spent
    (then the VecEnv is closed too) or when the death is noticed during a command other than
    ``step``/``reset`` (``get_attr``, ``env_method``, ``render``...): the worker has then been
    rebuilt, the VecEnv stays open, and its envs end their episode at the next step.

    :param exitcode: ``Process.exitcode``: negative for "killed by signal -exitcode".
    :param fields: the worker fields of :class:`ShmVecEnvError`: ``worker_index``, ``env_indices``
        (the envs that ran in that worker), ``worker_pid``, ``command`` (the command that was running
        when the death was noticed) and ``remote_traceback``: what the worker's faulthandler wrote
        (the Python stack of every thread at a segfault, abort, SIGBUS or SIGFPE); empty for SIGKILL
        and ``os._exit``.
    """

    def __init__(self, message: str, *, exitcode: int | None, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.exitcode = exitcode

    def __str__(self) -> str:
        if not self.remote_traceback:
            return str(self.args[0])
        return f"{self.args[0]}\n\nFault in the worker:\n{self.remote_traceback}"


class EnvTimeoutError(ShmVecEnvError, TimeoutError):
    """A worker did not answer within ``timeout`` seconds (a hung env).

    The VecEnv is closed when this is raised: the hung worker is killed, shared memory released.
    (Restart mode kills and rebuilds the worker instead, as for :class:`WorkerCrashedError`.)
    """

    def __init__(self, message: str, *, timeout: float, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.timeout = timeout


class ObservationError(ValueError):
    """An observation does not fit the declared observation space (shape, dtype or missing key).

    Raised inside the worker; it reaches the user as the ``original`` of an :class:`EnvError`.
    """


class SpaceMismatchError(ValueError, RuntimeError):
    """The envs do not all have the same observation and action spaces. A ``ValueError`` (as shmvec
    always raised) and a ``RuntimeError`` (as Gymnasium's ``AsyncVectorEnv`` raises)."""


class UnsupportedSpaceError(TypeError):
    """The observation space has a leaf that cannot live in a fixed-size shared-memory array.

    No longer raised for observation spaces: a leaf without a fixed size (Text, Sequence, Graph,
    OneOf, custom spaces) now travels pickled in the workers' replies. Kept, as public API, for code
    that catches it."""


class SharedMemoryTooSmallError(ShmVecEnvError, MemoryError):
    """``/dev/shm`` has less free space than the ring buffer needs. Raised before any worker starts."""


class ClosedError(ShmVecEnvError, ClosedEnvironmentError):
    """The VecEnv was used after ``close()``, or after a failure closed it (a worker that died or
    hung, or a restart budget spent); the message says which of the two. Also a
    ``gymnasium.error.ClosedEnvironmentError``, what Gymnasium's vector envs raise then. Build it
    with :meth:`because`."""

    @classmethod
    def because(cls, owner: str, by_close: bool) -> ClosedError:
        """The error for using ``owner`` (``"ShmVecEnv"``...) once closed, ``by_close`` (else by a
        failure)."""
        if by_close:
            return cls(f"this {owner} is closed: close() was called on it; create a new one")
        return cls(
            f"this {owner} was closed by a failure: a worker died or hung (the WorkerCrashedError or "
            "EnvTimeoutError raised then says which, and why), or its restart budget was spent. Its "
            "workers are gone and its shared memory is freed: create a new one, or pass "
            'on_crash="restart" to have failed workers rebuilt'
        )


class NoPendingCallError(ShmVecEnvError, NoAsyncCallError):
    """``step_wait()`` / ``reset_wait()`` without the matching ``step_async()`` / ``reset_async()``
    before it. Also Gymnasium's ``NoAsyncCallError`` (what AsyncVectorEnv raises, with its text), and
    a ``RuntimeError``. ``name``: the call that was made. Build it with :meth:`of`."""

    def __init__(self, message: str, name: str) -> None:
        RuntimeError.__init__(self, message)
        self.name = name

    @classmethod
    def of(cls, call: str) -> NoPendingCallError:
        """The error for ``call`` (``"step_wait"`` or ``"reset_wait"``)."""
        sent = call.replace("_wait", "_async")
        return cls(f"Calling `{call}` without any prior call to `{sent}`.", call)


class PendingCallError(ShmVecEnvError, AlreadyPendingCallError):
    """``step_async()`` / ``reset_async()`` while a step or reset is still pending. Also Gymnasium's
    ``AlreadyPendingCallError`` (what AsyncVectorEnv raises, with its text), and a ``RuntimeError``.
    ``name``: the call pending. Build it with :meth:`of`."""

    def __init__(self, message: str, name: str) -> None:
        RuntimeError.__init__(self, message)
        self.name = name

    @classmethod
    def of(cls, call: str, pending: str) -> PendingCallError:
        """The error for ``call`` made while a ``pending`` (``"step"`` or ``"reset"``) is in flight."""
        return cls(
            f"Calling `{call}` while waiting for a pending call to `{pending}` to complete: call "
            f"`{pending}_wait()` first (or `recv()`, after a pool-mode `send()`)",
            pending,
        )


class CodecMismatchError(ShmVecEnvError):
    """A decoded observation differs from what the worker encoded (checksum mismatch, corrupt or
    out-of-step encoded bytes). Names the env, the step and the observation key.

    :param env_index: the env whose observation failed.
    :param step: ``step()`` calls since the VecEnv was created (0 for the first ``reset()``).
    :param key: the observation leaf (``"obs"`` for a plain space, else the Dict/Tuple key path).
    :param terminal: True if it was the terminal observation of an episode.
    """

    def __init__(self, message: str, *, env_index: int, step: int, key: str, terminal: bool) -> None:
        super().__init__(message)
        self.env_index = env_index
        self.step = step
        self.key = key
        self.terminal = terminal


class FidelityError(ShmVecEnvError):
    """A lossy codec changed a sampled observation more than the user's ``Tolerance`` allows."""


class FrameSkipWarning(UserWarning):
    """An env skips frames under a wrapper that skips frames too (e.g. ``make_atari_env("ALE/Pong-v5")``:
    16 frames per action instead of SB3's 4); see :mod:`shmvec.atari`."""


class NativeStepWarning(UserWarning):
    """Envs whose wrapper chain a native step path serves (SB3's Atari recipe, ``AtariPreprocessing``,
    CleanRL's chain) step through their Python wrappers because a method the path restates is code
    shmvec was not checked against (another release of SB3, Gymnasium or ale-py): one warning per
    VecEnv, naming each method, the installed release, the releases checked and the command that
    gets the native step; ``native_step=False`` silences it (see ``native_steps``)."""


class FidelityWarning(UserWarning):
    """Like :class:`FidelityError`, for a ``Tolerance(on_breach="warn")``."""


class PlatformWarning(UserWarning):
    """A Linux-only feature (the OpenMP pause and its ``/proc`` reads, ``worker_cpus``,
    ``worker_spin_us``) is off on this platform; shmvec runs without it (one line per feature)."""
