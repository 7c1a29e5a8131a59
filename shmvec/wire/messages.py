"""The typed messages between the main process and a worker: one small class per command and reply.

Arrays never travel here: observations, rewards and flags live in the ring (:mod:`shmvec.memory.ring`),
and actions too when the action space is array-shaped. A synchronous step of a local worker whose
actions are in the ring is not a message at all: the doorbell (:mod:`shmvec.memory.doorbell`) carries
its slot, and the worker answers through the ring alone unless an info or reset info is left over.
What does travel: the commands below, non-empty info dicts, reset infos, attribute values,
env-method results, errors, actions that do not fit the typed action buffer, and the values of
observation leaves without a fixed size (Text, Sequence, Graph...: "object leaves").

A worker serves each command with the handler registered for its class
(:func:`shmvec.worker.serving.handlers`); :attr:`Command.label` names it in errors. Replies are
:class:`Ready` (start-up), :class:`Stepped`, :class:`ResetDone`, :class:`Returned` or
:class:`Failed`; :class:`Restarted` stands in the engine for a worker rebuilt by restart mode.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass, field
from typing import Any, ClassVar

# How start-up (building a worker's envs) is named in errors: it is not a command anyone sends.
MAKE_ENV = "make_env"


class Command:
    """Base of every command. ``name`` is the command's name in errors."""

    __slots__ = ()
    name: ClassVar[str] = "command"

    @property
    def label(self) -> str:
        """How errors name this command (``"get_attr:render_mode"`` for the named env calls)."""
        return self.name


@dataclass(frozen=True, slots=True)
class Attach(Command):
    """Map the ring and encode leaves with ``codecs``. ``spec``: the ring's
    :class:`~shmvec.memory.ring.RingSpec` (None: a Ray actor's private ring); ``verify_every``: how
    often to checksum encoded frames (see :mod:`shmvec.worker.encoder`); ``native``: step the envs
    that have a native step path through it (see :mod:`shmvec.native`). Answered with
    :class:`Returned` holding each env's :class:`~shmvec.native.NativeStatus`."""

    spec: Any
    codecs: tuple[Any, ...] | None
    verify_every: int
    native: bool = True
    name: ClassVar[str] = "attach"


@dataclass(frozen=True, slots=True)
class Configure(Command):
    """Options that change a worker's behaviour; None (or False) leaves one as it is.

    :param check_finite: refuse NaN/inf observations.
    :param autoreset: ``"same_step"``, ``"next_step"`` or ``"disabled"``.
    :param spin_us: how long the worker polls for its next command before sleeping (µs).
    :param info_schema: write these info values into the ring's typed columns
        (:class:`~shmvec.memory.infos.InfoSchema`).
    :param key_frames: every env's next encoded frame is a key frame.
    :param reset_seeds: reset every env (with these seeds, one per env) in place of its next step.
    :param record: what the worker writes into recording tapes from now on (:class:`RecordFrames`,
        :class:`RecordSteps`; an empty tuple: nothing), replacing what it wrote before.
    """

    check_finite: bool = False
    autoreset: str | None = None
    spin_us: int | None = None
    info_schema: Any = None
    key_frames: bool = False
    reset_seeds: list[int | None] | None = None
    record: tuple[Any, ...] | None = None
    name: ClassVar[str] = "configure"


@dataclass(frozen=True, slots=True)
class RecordFrames:
    """Part of :class:`Configure`: write render frames of the tape's envs into it
    (:mod:`shmvec.worker.taps`). ``tape``: its :class:`~shmvec.memory.tape.TapeSpec`;
    ``episode_trigger``: the cloudpickled ``episode_trigger(episode_id) -> bool`` the worker decides
    with (None: the main process says, through the tape's ``want`` words); ``video_length``: frames
    after a clip's first (0: whole episodes); ``episodes``: per row, the episode it is in and its clip
    (``(episode_id, tag, frames)``), for a tape that starts after the envs' first reset."""

    tape: Any
    episode_trigger: bytes | None = None
    video_length: int = 0
    episodes: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class RecordSteps:
    """Part of :class:`Configure`: write every step and reset of the tape's envs into it (a
    dataset's records, :mod:`shmvec.worker.taps`). ``tape``: its
    :class:`~shmvec.memory.tape.TapeSpec`."""

    tape: Any


@dataclass(frozen=True, slots=True)
class Step(Command):
    """Step the worker's envs once, writing into ring slot ``slot``. ``actions``: one per env (None
    for an env not stepped), or None to read them from the ring's typed action buffer. ``envs``: the
    local indices of the envs to step, ascending (None: all); the others' rows of the slot are left
    as they were."""

    slot: int
    actions: list[Any] | None = None
    envs: tuple[int, ...] | None = None
    name: ClassVar[str] = "step"


@dataclass(frozen=True, slots=True)
class Reset(Command):
    """Reset the worker's envs (those where ``mask`` is True; None: all) into ring slot ``slot``, each
    with its seed and its keyword arguments (``{"options": ...}`` or ``{}``: the face decides)."""

    slot: int
    seeds: list[int | None]
    kwargs: list[dict[str, Any]]
    mask: list[bool] | None = None
    name: ClassVar[str] = "reset"


@dataclass(frozen=True, slots=True)
class EnvCall(Command):
    """A call into some of the worker's envs (local ``indices``) that names an attribute or method."""

    indices: list[int]
    attr: str

    @property
    def label(self) -> str:
        """``"<command>:<attribute>"``, e.g. ``"get_attr:render_mode"``."""
        return f"{self.name}:{self.attr}"


@dataclass(frozen=True, slots=True)
class GetAttr(EnvCall):
    """``env.get_wrapper_attr(attr)`` of each env."""

    name: ClassVar[str] = "get_attr"


@dataclass(frozen=True, slots=True)
class HasAttr(EnvCall):
    """Whether each env has ``attr`` (searched through its wrappers)."""

    name: ClassVar[str] = "has_attr"


@dataclass(frozen=True, slots=True)
class SetAttr(EnvCall):
    """``setattr(env, attr, value)`` on the outermost wrapper of each env."""

    value: Any = None
    name: ClassVar[str] = "set_attr"


@dataclass(frozen=True, slots=True)
class EnvMethod(EnvCall):
    """``env.get_wrapper_attr(attr)(*args, **kwargs)`` of each env; with ``value_if_attribute``,
    an attribute that is not callable gives its value (Gymnasium's ``call``)."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    value_if_attribute: bool = False
    name: ClassVar[str] = "env_method"

    @property
    def label(self) -> str:
        """``"env_method:<name>"``, or ``"call:<name>"`` for Gymnasium's ``call``."""
        return f"{'call' if self.value_if_attribute else self.name}:{self.attr}"


@dataclass(frozen=True, slots=True)
class SetWrapperAttr(EnvCall):
    """``env.set_wrapper_attr(attr, values[i])`` of each env; ``values`` holds one value per env of
    the whole vector env (indexed by global env index)."""

    values: list[Any] = field(default_factory=list)
    name: ClassVar[str] = "set_wrapper_attr"


@dataclass(frozen=True, slots=True)
class IsWrapped(Command):
    """Whether each env is wrapped (at any depth) in ``wrapper_class``."""

    indices: list[int]
    wrapper_class: type
    name: ClassVar[str] = "is_wrapped"


@dataclass(frozen=True, slots=True)
class Render(Command):
    """``env.render()`` of each env."""

    indices: list[int]
    name: ClassVar[str] = "render"


@dataclass(frozen=True, slots=True)
class Close(Command):
    """Close the envs and end the worker; no reply."""

    name: ClassVar[str] = "close"


# ---------------------------------------------------------------------------------------- replies


@dataclass(slots=True)
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
        """``exc``, raised by env ``env_index`` (None: the worker's own code) during ``command`` in
        process ``pid``, with its traceback and, if it pickles, the exception itself."""
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


@dataclass(slots=True)
class Ready:
    """Start-up: the worker's envs exist; the observation and action space of each."""

    spaces: list[tuple[Any, Any]]


# Object leaves' values of some envs: local env -> one value per object leaf, in leaf order.
Objects = dict[int, list[Any]]


@dataclass(slots=True)
class Stepped:
    """A step: ``(local env, info, reset info or None)`` for the envs whose info was not empty (after
    the typed columns took their values) or that were reset within the step. A local worker whose
    step leaves nothing over sends no reply at all: the ring holds everything.

    ``objects``: every env's object leaf values (None: the space has no object leaf, and a step
    with one always has a reply); ``final_objects``: those of the terminal observations of envs
    reset within the step (same-step autoreset), copied before the reset."""

    items: list[tuple[int, dict[str, Any], dict[str, Any] | None]] = field(default_factory=list)
    objects: Objects | None = None
    final_objects: Objects | None = None


@dataclass(slots=True)
class ResetDone:
    """A reset: one reset info per env of the worker, None for envs the mask left alone;
    ``objects``: the object leaf values of the envs reset (None: the space has no object leaf)."""

    infos: list[dict[str, Any] | None]
    objects: Objects | None = None


@dataclass(slots=True)
class Returned:
    """What an env call gave: one value per env asked (None for commands without a result)."""

    values: list[Any] | None = None


@dataclass(slots=True)
class Failed:
    """An env (or the worker's own code) raised; the worker lives on."""

    error: RemoteError


@dataclass(slots=True)
class Restarted:
    """Not sent by a worker: what the engine records in place of a step's reply for a worker that
    restart mode rebuilt (its envs end their episode; ``reason`` says why)."""

    reason: str


Reply = Ready | Stepped | ResetDone | Returned | Failed | Restarted
