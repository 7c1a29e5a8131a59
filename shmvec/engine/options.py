"""The engine's options, checked once: every face passes its parameters through :meth:`Options.checked`."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from shmvec._start_methods import resolve_start_method
from shmvec.codecs import Codec, CodecSpec
from shmvec.engine.groups import usable_cpus
from shmvec.frame_stack import ChannelsOrder, stacked_factory
from shmvec.layout import Leaf
from shmvec.restart import ON_CRASH_MODES, RestartBudget
from shmvec.transports import check_backend, default_codecs
from shmvec.transports.local import WorkerPool

if TYPE_CHECKING:
    from shmvec.fidelity import Tolerance

AUTORESET_MODES = ("same_step", "next_step", "disabled")


@dataclass(frozen=True)
class Options:
    """What :class:`shmvec.ShmVecEnv` documents, plus ``autoreset``: ``"same_step"`` (an env whose
    episode ends is reset in the same step), ``"next_step"`` (reset in place of its next step) or
    ``"disabled"`` (the caller resets it)."""

    n_workers: int | str | None = None  # "auto": resolved by shmvec.engine.autoworkers first
    copy: bool = True
    n_slots: int | None = None
    worker_threads: int | None = 1
    timeout: float | None = None
    codec: CodecSpec = None
    verify_every: int = 100
    tolerance: Tolerance | None = None
    decode_threads: int | None = None
    on_crash: str = "raise"
    max_restarts: int = 10
    restart_window: float | None = 60.0
    check_finite: bool = False
    isolate_rng: bool = False
    autoreset: str = "same_step"
    pause_openmp: bool = True
    frame_stack: int | None = None
    frame_stack_channels_order: ChannelsOrder = None
    info_keys: Any = "auto"
    backend: str = "local"
    ray_options: Mapping[str, Any] | None = None
    worker_cpus: str | Sequence[int] | None = None  # checked() turns it into one CPU per worker
    worker_spin_us: int | None = None  # checked() turns None into DEFAULT_SPIN_US or 0

    @classmethod
    def pick(cls, values: dict[str, Any], **overrides: Any) -> Options:
        """Options from a face's parameters (``locals()`` of its ``__init__``: the names that are
        options are taken, the rest ignored), then ``overrides``."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names}, **overrides)

    def checked(self, n_envs: int) -> Options:
        """These options with the defaults that depend on ``n_envs`` filled in.

        :raises ValueError: naming the option that is out of range.
        """
        if isinstance(self.n_workers, str):
            raise ValueError(
                f"n_workers={self.n_workers!r} must be resolved first (autoworkers.resolve_auto)"
            )
        n_workers = min(n_envs, usable_cpus()) if self.n_workers is None else self.n_workers
        if not 1 <= n_workers <= n_envs:
            raise ValueError(f"n_workers must be between 1 and n_envs={n_envs}, got {n_workers}")
        n_slots = (3 if self.copy else 2) if self.n_slots is None else self.n_slots
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {n_slots}")
        if not self.copy and n_slots < 2:
            raise ValueError("copy=False needs n_slots >= 2: SB3 keeps the previous observation one step")
        if self.verify_every < 0:
            raise ValueError(f"verify_every must be >= 0 (0: never verify), got {self.verify_every}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {self.timeout}")
        if self.on_crash not in ON_CRASH_MODES:
            raise ValueError(f"on_crash must be one of {ON_CRASH_MODES}, got {self.on_crash!r}")
        if self.on_crash == "restart" and n_slots < 2:
            raise ValueError(
                "on_crash='restart' needs n_slots >= 2: the last observation of a crashed env is read "
                "from the previous slot"
            )
        if self.autoreset not in AUTORESET_MODES:
            raise ValueError(f"autoreset must be one of {AUTORESET_MODES}, got {self.autoreset!r}")
        RestartBudget(self.max_restarts, self.restart_window)  # checks its own arguments
        check_backend(self.backend, self.ray_options)
        fs = self.frame_stack
        if fs is not None and (isinstance(fs, bool) or not isinstance(fs, int) or fs < 1):
            raise ValueError(f"frame_stack must be a whole number >= 1 or None, got {fs!r}")
        from shmvec.engine.typed_infos import columns_for

        columns_for(self.info_keys)  # checks the option
        worker_cpus = resolve_worker_cpus(self.worker_cpus, n_workers, self.backend)
        spin = resolve_spin(self.worker_spin_us, n_workers, self.backend)
        return replace(
            self, n_workers=n_workers, n_slots=n_slots, worker_cpus=worker_cpus, worker_spin_us=spin
        )

    def env_fns(self, env_fns: list[Callable[[], gym.Env]]) -> list[Callable[[], gym.Env]]:
        """The factories the workers call: with ``frame_stack``, each env comes out of its worker
        already stacked (see :mod:`shmvec.frame_stack`), so the main process does no stacking work."""
        if self.frame_stack is None:
            return env_fns
        return [
            functools.partial(stacked_factory, fn, self.frame_stack, self.frame_stack_channels_order)
            for fn in env_fns
        ]

    def budget(self) -> RestartBudget:
        return RestartBudget(self.max_restarts, self.restart_window)

    def worker_options(self) -> dict[str, Any]:
        """The ``configure`` payload for workers (empty: nothing to send)."""
        out: dict[str, Any] = {"check_finite": True} if self.check_finite else {}
        if self.autoreset != "same_step":
            out["autoreset"] = self.autoreset
        if self.worker_spin_us:
            out["spin_us"] = self.worker_spin_us
        return out

    def leaf_codecs(self, obs_leaves: list[Leaf]) -> tuple[Codec | None, ...] | None:
        """The codec of each observation leaf, or None when nothing is encoded (the default path)."""
        if self.codec is None:
            # Ray: observations cross the network, so they are encoded unless the user says otherwise.
            return None if self.backend == "local" else default_codecs(obs_leaves)
        from shmvec.codecs import per_leaf
        from shmvec.codecs.channel import check_lossy

        names = [leaf.name for leaf in obs_leaves]
        codecs = per_leaf(self.codec, names, [(leaf.shape, leaf.dtype) for leaf in obs_leaves])
        check_lossy(codecs, names, self.tolerance)
        return None if all(c is None for c in codecs) else tuple(codecs)

    def decode_threads_for(self, codecs: tuple[Codec | None, ...] | None) -> int:
        """Decode threads: as given, else as many as usable CPUs when every codec releases the GIL and
        there are more than two (on two CPUs the workers keep both busy, and thread hand-offs cost
        the main process more CPU than they save)."""
        if self.decode_threads is not None:
            return self.decode_threads
        if codecs is None:
            return 1
        cpus = usable_cpus()
        return cpus if cpus > 2 and all(c is None or c.releases_gil for c in codecs) else 1


# How long each local worker polls for its next command by default, in µs (see shmvec.waiting).
DEFAULT_SPIN_US = 1000


def resolve_spin(spin_us: int | None, n_workers: int, backend: str) -> int:
    """The poll budget of each worker in µs: as given, else :data:`DEFAULT_SPIN_US` when every
    worker can have a CPU of its own and 0 when there are more workers than CPUs (a polling worker
    would take turns from the others).

    :raises ValueError: for a negative or non-integer budget, or one given with ``backend="ray"``.
    """
    if spin_us is None:
        return DEFAULT_SPIN_US if backend == "local" and n_workers <= usable_cpus() else 0
    if isinstance(spin_us, bool) or not isinstance(spin_us, (int, np.integer)) or spin_us < 0:
        raise ValueError(f"worker_spin_us must be a whole number of µs >= 0 or None, got {spin_us!r}")
    if spin_us and backend != "local":
        raise ValueError(f"worker_spin_us applies to local worker processes; backend={backend!r} has none")
    return int(spin_us)


def resolve_worker_cpus(
    worker_cpus: str | Sequence[int] | None, n_workers: int, backend: str
) -> tuple[int, ...] | None:
    """The CPU of each worker: ``"auto"`` deals the CPUs this process may use out to the workers in
    turn, a sequence of CPU ids is dealt the same way; None leaves placement to the OS.

    :raises ValueError: for another value, a CPU this process may not use, or ``backend="ray"``.
    """
    if worker_cpus is None:
        return None
    if backend != "local":
        raise ValueError(f"worker_cpus pins local worker processes; backend={backend!r} places its own")
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        raise ValueError("worker_cpus needs Linux (os.sched_setaffinity)") from None
    if worker_cpus == "auto":
        cpus = allowed
    else:
        listable = isinstance(worker_cpus, Iterable) and not isinstance(worker_cpus, str)
        cpus = list(worker_cpus) if listable else []  # type: ignore[arg-type]
        if not cpus or any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) for c in cpus):
            raise ValueError(
                f"worker_cpus must be 'auto', a non-empty sequence of CPU ids or None, got {worker_cpus!r}"
            )
        outside = sorted({int(c) for c in cpus} - set(allowed))
        if outside:
            raise ValueError(f"worker_cpus {outside} are not among the CPUs this process may use: {allowed}")
    return tuple(int(cpus[w % len(cpus)]) for w in range(n_workers))


def context(start_method: str | None) -> tuple[str, Any]:
    """The start method (default as SubprocVecEnv: forkserver where available, else spawn) and its
    multiprocessing context; ``ValueError("cannot find context for ...")`` like SB3 for a bad name."""
    try:
        resolved = resolve_start_method(start_method)
    except ValueError as exc:
        # SB3's tests expect multiprocessing's own wording; the valid choices follow it.
        raise ValueError(f"cannot find context for {start_method!r}: {exc}") from None
    return resolved, mp.get_context(resolved)


def pool_class(backend: str, ray_options: Mapping[str, Any] | None) -> Callable[..., Any]:
    """What builds the engine's worker pool for ``backend``, called with the arguments of
    :class:`shmvec.transports.local.WorkerPool`: that class (``"local"``), or the Ray transport's
    :class:`~shmvec.transports.ray_pool.RayPool` with ``ray_options`` (imports Ray)."""
    if backend == "ray":
        from shmvec.transports.ray_pool import RayPool  # imports Ray: only for this backend

        return functools.partial(RayPool, ray_options=ray_options)
    return WorkerPool
