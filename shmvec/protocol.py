"""The small messages between the main process and workers, and how errors travel.

A command is ``(name, payload)``; a reply is ``(True, result)`` or ``(False, RemoteError)``. Arrays
never travel here: observations, rewards and flags live in the ring (see :mod:`shmvec.ring`), and
actions too when the action space is array-shaped. What does travel: non-empty info dicts, reset
infos, attribute values and env-method results, and actions that do not fit the typed buffer.

Commands (payload -> result):

- ``attach`` (RingSpec) -> None
- ``step`` (slot, actions for this worker's envs or None = read the ring) ->
  list of ``(local_env, info, reset_info | None)`` for envs with a non-empty info or an auto-reset
- ``reset`` (slot, seeds, options) -> list of reset infos
- ``get_attr`` / ``has_attr`` / ``set_attr`` / ``env_method`` / ``is_wrapped`` / ``render``
  (local env indices, ...) -> list of results
- ``close`` -> the worker exits, no reply
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass
from typing import Any

# Start-up message a worker sends once its envs exist: the spaces of each env, for checking.
READY = "ready"


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
