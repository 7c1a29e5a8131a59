"""Error builders: every error about a worker names it the same way and carries the same fields.

One label, ``worker w (pid p, envs a..b)``, and the fields of :class:`shmvec.errors.ShmVecEnvError`
(worker index, env indices, pid, command) filled in one place.
"""

from __future__ import annotations

import builtins
import importlib.util
import signal
from typing import Any

from shmvec.errors import EnvError, EnvTimeoutError, WorkerCrashedError, install_hint
from shmvec.wire.messages import RemoteError

_MAIN_GUARD_HINT = (
    "With the '{method}' start method each worker re-imports your main script: if the code that "
    'creates the VecEnv runs at import time, put it under `if __name__ == "__main__":`, or pass '
    "start_method='fork'. The worker's own error, if it printed one, is on stderr above."
)
_NATIVE_CRASHES = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE)


def worker_label(w: int, pid: int | None, envs: range) -> str:
    """``worker w (pid p, envs a..b)``: how every message names a worker."""
    return f"worker {w} (pid {pid}, envs {envs.start}..{envs.stop - 1})"


def crash_error(
    w: int,
    pid: int | None,
    envs: range,
    exitcode: int | None,
    command: str,
    fault_text: str,
    start_method: str,
) -> WorkerCrashedError:
    """The error for dead worker ``w``: how it ended, and the faulthandler text if it wrote one."""
    if exitcode is not None and exitcode < 0:
        try:
            how = f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with code {exitcode}"
    message = f"{worker_label(w, pid, envs)} {how} during {command}"
    if exitcode is not None and -exitcode in _NATIVE_CRASHES:
        message += " (a crash inside the env or a native library"
        message += "; its Python stack is in remote_traceback)" if fault_text else ")"
    if command == "make_env" and start_method != "fork":
        message += ". " + _MAIN_GUARD_HINT.format(method=start_method)
    return WorkerCrashedError(
        message,
        worker_index=w,
        env_indices=list(envs),
        worker_pid=pid,
        exitcode=exitcode,
        command=command,
        remote_traceback=fault_text,
    )


def timeout_error(
    w: int, pid: int | None, envs: range, command: str, timeout: float, outcome: str, verb: str = "answer"
) -> EnvTimeoutError:
    """The error for worker ``w`` that did not answer (or take, ``verb``) ``command`` within
    ``timeout`` seconds."""
    return EnvTimeoutError(
        f"{worker_label(w, pid, envs)} did not {verb} {command} within {timeout:g} s; {outcome}",
        worker_index=w,
        env_indices=list(envs),
        worker_pid=pid,
        command=command,
        timeout=timeout,
    )


def env_error(err: RemoteError, w: int, envs: range) -> EnvError:
    """The :class:`EnvError` for an exception raised in worker ``w``, the original chained."""
    where = f"env {err.env_index}" if err.env_index is not None else "a worker"
    name = err.exc_type.rsplit(".", 1)[-1]
    message = f"{where} raised {name} during {err.command}: {err.message}"
    if err.command == "make_env":
        message = f"the factory of {where} raised {name}: {err.message}"
    fields: dict[str, Any] = {
        "env_index": err.env_index,
        "command": err.command,
        "worker_pid": err.pid,
        "exc_type": err.exc_type,
        "remote_traceback": err.traceback,
        "worker_index": w,
        "env_indices": list(envs),
    }
    hint = missing_env_hint(err.exc_type, err.message)
    if hint is not None:
        message = f"{message}\n{hint}"
    original = err.original()
    fields["original"] = original
    kind = type(original) if original is not None else _builtin(err.exc_type)
    try:
        exc = EnvError.like(kind)(message, **fields)
    except TypeError:  # a constructor the combined class does not accept
        exc = EnvError(message, **fields)
    return exc


def missing_env_hint(exc_type: str, message: str) -> str | None:
    """For gymnasium's "not found" errors of an ALE game (``ALE/Pong-v5``, ``PongNoFrameskip-v4``):
    the lines that register ALE's games, which gymnasium's message does not give (it asks whether
    the package is installed, even when it is). None for other errors."""
    if exc_type == "gymnasium.error.NamespaceNotFound":
        is_ale = message.startswith("Namespace ALE ")
    elif exc_type == "gymnasium.error.NameNotFound" and message.count("`") >= 2:
        is_ale = _is_atari_name(message.split("`")[1])
    else:
        return None
    if not is_ale:
        return None
    if importlib.util.find_spec("ale_py") is None:
        return f"hint: ALE's games come with ale-py: {install_hint('atari')}, or pip install ale-py"
    return (
        "hint: ALE's games are registered by ale-py, which is installed but was not imported where the "
        "env is made. Add these lines before gym.make (in your script: the workers, and Ray's actors, "
        "import the packages that registered your envs there):\n"
        "    import ale_py\n    gym.register_envs(ale_py)"
    )


def _is_atari_name(name: str) -> bool:
    """Whether ``name`` (``PongNoFrameskip``, ``SpaceInvaders-ram``) is one of ale-py's old ids."""
    try:
        from ale_py.roms import get_all_rom_ids
    except ImportError:
        return False
    base = name.split("-")[0].removesuffix("NoFrameskip").removesuffix("Deterministic")
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in base).lstrip("_")
    return snake in get_all_rom_ids()


def _builtin(qualified: str) -> type[BaseException] | None:
    """A builtin exception type by its qualified name (an original that could not be pickled)."""
    module, _, name = qualified.rpartition(".")
    kind = getattr(builtins, name, None) if module == "builtins" else None
    return kind if isinstance(kind, type) and issubclass(kind, BaseException) else None


def add_note(error: BaseException, note: str) -> BaseException:
    """Append ``note`` to the error's message (its first argument) and return it."""
    error.args = (f"{error.args[0]}{note}", *error.args[1:])
    return error
