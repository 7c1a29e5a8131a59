"""What an :class:`~shmvec.protocol.Outcome` means for the engine: which failures are raised, which
close it, when the codec streams start over, and which faults are left for restart mode to rebuild.

The pool reports what happened (:meth:`WorkerPool.call` never raises); this module decides; the
engine (its host) and the supervisor do the work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from shmvec.errors import EnvTimeoutError
from shmvec.failures import add_note, env_error
from shmvec.protocol import Command, Outcome
from shmvec.restart import Fault

if TYPE_CHECKING:
    from shmvec.engine.reader import Reader
    from shmvec.engine.supervisor import Supervisor

# Commands after which restart mode rebuilds a worker whose env raised (its envs may be mid-step).
RESTART_ON_ENV_ERROR = (Command.STEP, Command.RESET)
# Bringing a worker up: a failure here is never recovered from by a restart.
START_UP = (Command.MAKE_ENV, Command.ATTACH, Command.CONFIGURE)


class Host(Protocol):
    """What settling needs from the engine."""

    restart: bool
    closed: bool
    waiting: bool
    worker_envs: list[range]
    reader: Reader
    supervisor: Supervisor

    def give_up(self, graceful: bool = True) -> None:
        """Close everything."""

    def resync(self) -> None:
        """Have every env's codec stream start over from a key frame."""

    def env_fault(self, w: int, err: Any) -> Fault:
        """The fault that rebuilds worker ``w`` after its env raised ``err``."""


def recovering(host: Host, cmd: Command) -> bool:
    """Whether a dead or hung worker during ``cmd`` is rebuilt (else: the first one closes all)."""
    return host.restart and cmd not in START_UP and not host.closed


def settle(host: Host, outcome: Outcome, cmd: Command) -> list[Fault]:
    """Raise what must be raised for ``outcome``; the faults left for the caller to rebuild
    (restart mode, ``step``/``reset`` only)."""
    if outcome.faults and (not host.restart or cmd in START_UP):
        error = outcome.faults[0].error
        host.give_up(graceful=not isinstance(error, EnvTimeoutError))
        raise error
    faults = list(outcome.faults)
    errors = outcome.errors
    if host.restart and cmd in RESTART_ON_ENV_ERROR:
        faults += [host.env_fault(w, e) for w, e in errors.items()]
        faults.sort(key=lambda f: f.worker)
        errors = {}
    if errors:
        w = min(errors)
        if cmd in START_UP:
            host.give_up()
        elif cmd == Command.STEP and host.reader.decoded:
            host.resync()
        host.waiting = False
        raise env_error(errors[w], w, host.worker_envs[w])
    if faults and cmd not in RESTART_ON_ENV_ERROR:
        host.supervisor.rebuild(faults)
        note = "; the worker was restarted: its envs end their episode (done=True) at the next step"
        raise add_note(faults[0].error, note)
    return faults


__all__ = ["RESTART_ON_ENV_ERROR", "START_UP", "recovering", "settle"]
