"""The one fault policy: what an :class:`~shmvec.transports.base.Outcome` means for the engine.

:func:`judge` reads what a wait returned and says what to do: raise (and whether that closes the
engine), or rebuild which workers (restart mode). It decides from its arguments alone and does
nothing; the core (:mod:`shmvec.engine.core`) carries the verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from shmvec.errors import EnvTimeoutError
from shmvec.transports.base import Fault, Outcome
from shmvec.transports.failures import add_note, env_error
from shmvec.wire.messages import RemoteError


class Phase(Enum):
    """What the engine was doing when the outcome came."""

    START_UP = "start-up"  # building envs, attaching, configuring: never recovered from
    STEP = "step"
    RESET = "reset"
    CALL = "call"  # get_attr, env_method, render...: restart mode rebuilds, then raises


@dataclass
class Verdict:
    """What to do about an outcome.

    :param error: the error to raise once the rest is done (None: carry on).
    :param close: close the engine before raising.
    :param graceful: with ``close``: ask the workers to close their envs first (not for a hang).
    :param rebuild: restart mode: the faults whose workers to rebuild.
    """

    error: BaseException | None = None
    close: bool = False
    graceful: bool = True
    rebuild: list[Fault] = field(default_factory=list)


def env_fault(w: int, err: RemoteError, envs: range) -> Fault:
    """The fault that rebuilds worker ``w`` (restart mode) after its env raised ``err``."""
    error = env_error(err, w, envs)
    return Fault(w, error.args[0], error)


def judge(outcome: Outcome, restart: bool, phase: Phase, worker_envs: list[range]) -> Verdict:
    """The verdict on ``outcome`` (see the module docstring).

    - A dead or hung worker closes the engine and raises, unless restart mode may rebuild it (not
      during start-up).
    - An env that raised during a step or reset: restart mode rebuilds its worker; otherwise its
      error is raised and the engine stays open (during start-up it closes).
    - Restart mode, a dead or hung worker during an env call: rebuilt, and its error raised with a
      note (the call's results are lost).
    """
    recovering = restart and phase is not Phase.START_UP
    if outcome.faults and not recovering:
        error = outcome.faults[0].error
        hang = isinstance(error, EnvTimeoutError)
        if hang:
            add_note(error, " and the VecEnv closed")
        return Verdict(error=error, close=True, graceful=not hang)
    faults = list(outcome.faults)
    for fault in faults:
        if isinstance(fault.error, EnvTimeoutError):
            add_note(fault.error, " and will be restarted")
            fault.reason = fault.error.args[0]
    errors = dict(outcome.errors)
    if recovering and phase in (Phase.STEP, Phase.RESET):
        faults += [env_fault(w, e, worker_envs[w]) for w, e in errors.items()]
        faults.sort(key=lambda f: f.worker)
        errors = {}
    if errors:
        w = min(errors)
        error = env_error(errors[w], w, worker_envs[w])
        return Verdict(error=error, close=phase is Phase.START_UP, rebuild=faults)
    if faults and phase is Phase.CALL:
        note = "; the worker was restarted: its envs end their episode (done=True) at the next step"
        return Verdict(error=add_note(faults[0].error, note), rebuild=faults)
    return Verdict(rebuild=faults)
