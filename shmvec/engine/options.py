"""The engine's options, declared once for both faces and checked once (:meth:`Options.checked`)."""

from __future__ import annotations

import difflib
import functools
import multiprocessing as mp
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from shmvec.codecs import Codec, CodecSpec
from shmvec.engine.groups import usable_cpus
from shmvec.engine.restart import ON_CRASH_MODES, RestartBudget
from shmvec.engine.start_methods import resolve_start_method
from shmvec.memory.layout import Leaf
from shmvec.transports import can_pin, check_backend, choose_transport, default_codecs, has_procfs, supported
from shmvec.worker.frame_stack import ChannelsOrder, stacked_factory

if TYPE_CHECKING:
    from shmvec.codecs.tolerance import Tolerance

AUTORESET_MODES = ("same_step", "next_step", "disabled")


@dataclass(frozen=True)
class Options:
    """Every option of :class:`shmvec.ShmVecEnv` and :class:`shmvec.ShmVectorEnv`, declared once.

    Both faces take them as keyword arguments (``ShmVecEnv(env_fns, n_workers=4, codec="delta")``);
    an unknown name is a ``TypeError`` that suggests the closest one. The groups: workers, memory,
    device, envs, codecs, restart mode, backend.
    """

    # ---------------------------------------------------------------- workers
    n_workers: int | str | None = None
    """Number of worker processes (default: ``min(n_envs, usable CPUs)``). Envs are split into
    contiguous groups, one per worker; the split may be uneven. ``"auto"``: chosen from a short probe
    of one env in a throwaway worker (about 0.3 s, before the real workers start): envs that mostly
    wait get more workers, up to one per env; envs that compute get one per usable CPU (see
    :mod:`shmvec.engine.autoworkers`). The chosen count is the face's ``n_workers``."""
    worker_threads: int | None = 1
    """BLAS/OpenMP/torch/OpenCV threads per worker (default 1; None leaves the libraries' defaults).
    Many workers each running a full-size thread pool on few cores is several times slower."""
    timeout: float | None = None
    """Seconds to wait for a worker's answer before raising :class:`shmvec.EnvTimeoutError` (default
    None: as long as the worker lives; a dead worker is noticed at once either way)."""
    worker_cpus: str | Sequence[int] | None = None
    """Pin each worker process to one CPU, so the OS stops moving it between cores. None (default):
    the OS places them. ``"auto"``: worker ``w`` runs on the ``w``-th CPU this process may use (dealt
    out again from the first when there are more workers than CPUs). A sequence of CPU ids is dealt
    out the same way: give runs that share a machine disjoint sets. Linux only; not with
    ``backend="ray"``. The main process is not pinned."""
    worker_spin_us: int | None = None
    """How long, in µs, each worker polls for its next command before it sleeps, while its recent
    waits were shorter than that (with a policy in the loop the waits are longer, and the workers
    sleep at once). On a virtual machine a sleeping worker's CPU goes back to the host and the next
    step pays for it. None (default): 1000 when every worker has a CPU of its own (``n_workers`` <=
    usable CPUs), else 0 (always sleep). Local workers only; see :mod:`shmvec.worker.waiting`."""
    pause_openmp: bool = True
    """Before sending each step, end the idle OpenMP threads of the calling thread (PyTorch's
    intra-op pool on Linux) so that their spin-wait does not take a core the workers need; they are
    started again as soon as the step's replies are in. Only while the workers need the cores (their
    CPU clocks over recent steps); pool mode never pauses before steps that run while the policy
    does. Default True; see :mod:`shmvec.engine.openmp` for the measurements."""
    # ---------------------------------------------------------------- memory
    copy: bool = True
    """True (default): the observation arrays returned are yours; shmvec never writes to them while
    anything references them, as SB3's algorithms require. They are lent from the ring without
    copying when a slot is free and copied out otherwise. False: read-only views into the ring that
    stay valid for ``n_slots - 1`` further steps/resets (1 by default, what SB3's collectors need).
    Rewards, flags and infos are always fresh."""
    n_slots: int | None = None
    """Ring slots, each holding one batch of observations (default None: 3 with ``copy=True`` — the
    caller holds one batch, one is being written, one stays free so the next can be lent — and 2
    with ``copy=False``)."""
    # ---------------------------------------------------------------- device
    device: Any = None
    """Where observations come back: None (default): numpy arrays, torch is never imported.
    ``"cpu"`` (or a ``torch.device``): ``torch.Tensor`` leaves over the same memory as the arrays,
    no copy, lent by the same rules (a ring slot stays lent while a tensor over it lives); with
    ``copy=False`` they share the read-only views: never write into them (``add_``, ``div_``,
    ``t[...] = ...``, ``out=``). ``"cuda"`` / ``"cuda:N"``: tensors on that GPU, in the stored dtype
    (uint8 frames stay uint8), copied from the ring (registered with CUDA once: ``pin_memory``) on a
    side stream; the stream current at ``step``/``recv`` waits for the copy, so use them on it. With
    ``copy=True`` each batch is new GPU memory of yours, with ``copy=False`` two GPU buffers serve in
    turn (valid until the next-but-one batch). Dict and Tuple spaces keep their structure, tensors
    at the leaves. Rewards, flags and infos stay as they are unless ``device_fields`` names them.
    See the guide "Observations on the policy's device"."""
    device_fields: Sequence[str] = ()
    """With ``device``: which other outputs come back as tensors there, any of ``"rewards"``,
    ``"flags"`` (SB3's ``dones``; Gymnasium's ``terminations`` and ``truncations``) and
    ``"final_obs"`` (terminal observations: SB3's ``info["terminal_observation"]``, Gymnasium's
    ``infos["final_obs"]``). Default (): none, which SB3's algorithms and wrappers need."""
    pin_memory: bool | None = None
    """With a CUDA ``device``: register the ring's pages with CUDA once at start-up (unregistered at
    ``close()``) so that every batch is copied asynchronously straight from the ring. None (default):
    if CUDA refuses, warn and copy from pageable memory (same results, slower). True: refuse to start
    instead. False: never register. See :mod:`shmvec.device.pinning`."""
    # ---------------------------------------------------------------- envs
    autoreset: str = "same_step"
    """Internal: set by the face. ``"same_step"`` (an env whose episode ends is reset in the same
    step, SB3's way), ``"next_step"`` (in place of its next step) or ``"disabled"`` (the caller
    resets it). ``ShmVectorEnv`` takes ``autoreset_mode`` instead."""
    check_finite: bool = False
    """Refuse observations (and terminal observations) with NaN in a float Box leaf, or +/-inf in one
    whose bounds are all finite: an :class:`shmvec.EnvError` caused by
    :class:`shmvec.ObservationError` naming env and key (restart mode restarts the worker). Off by
    default: it reads every float observation once more per step."""
    native_step: bool = True
    """Step envs that have a native step path through it (default True): the worker writes their
    observations straight into the ring instead of calling their Python wrappers, with the same
    results. SB3's Atari recipe (``make_atari_env``) has one, and so does any env that implements
    ``step_into``; see :mod:`shmvec.native` and the faces' ``native_steps``. False: every env steps
    through its wrappers."""
    isolate_rng: bool = False
    """Give each env its own process-global RNG state (``np.random.*``, ``random.*``), swapped in
    around every call into it, so an env that draws from them gets the same numbers whatever
    ``n_workers`` is. Off by default: the swap costs about 0.2 ms of CPU per env and step. Envs that
    use their own ``self.np_random`` need none of this."""
    frame_stack: int | None = None
    """Stack this many consecutive observations of each env in its worker, giving exactly what
    ``VecFrameStack(venv, frame_stack)`` gives (observations, space and terminal observations)
    without the main process's per-step stacking work. Default None: no stacking. Box and
    Dict-of-Box spaces; see :mod:`shmvec.worker.frame_stack`."""
    frame_stack_channels_order: ChannelsOrder = None
    """As ``VecFrameStack``'s ``channels_order``: ``"first"``, ``"last"``, None (default: channels
    first only for images whose smallest dimension is the first), or a mapping from Dict key to one
    of those."""
    info_keys: Any = "auto"
    """Which info values travel as typed columns of the ring instead of being pickled through the
    pipe; the infos you get are the same either way (keys, order, types, values). ``"auto"``
    (default): learned from the first step, the leading keys whose values are ``int``, ``float``,
    ``bool`` or numpy scalars in every env's info (ALE's ``lives``...). A mapping such as ``{"lives":
    int, "frame_number": np.int32}`` declares them (in the env's order; at most 8). None: every info
    through the pipe. An info that does not match goes whole through the pipe for that step: never
    an error, never lost. See :mod:`shmvec.memory.infos`."""
    # ---------------------------------------------------------------- codecs
    codec: CodecSpec = None
    """Compress observations in the workers and decode them here (default None: raw arrays, no
    extra work). A registry name (``"delta"``, ``"lz4"``, ``"zstd"``, ``"png"``...), a
    :class:`shmvec.codecs.Codec` (``shmvec.codecs.get("zstd", level=3)``), or a mapping from Dict keys
    (nested keys joined by ``.``) to either, other keys staying raw. A lossy codec needs
    ``tolerance``. See the guide "Codecs and fidelity" for when this pays."""
    verify_every: int = 100
    """With a codec, every this many frames of each env (default 100) the worker sends a crc32 of the
    raw observation (lossy codecs: the raw observation itself) and the decoded one is checked against
    it: :class:`shmvec.CodecMismatchError` names env, step and key. 1: every frame; 0: never."""
    tolerance: Tolerance | None = None
    """A :class:`shmvec.codecs.Tolerance` (minimum PSNR and/or maximum absolute error, raise or
    warn) that a lossy codec's sampled frames must meet; without one a lossy codec is refused."""
    decode_threads: int | None = None
    """Threads decoding a batch in parallel (default None: as many as usable CPUs when every codec
    releases the GIL and there are more than 2, else 1)."""
    # ---------------------------------------------------------------- restart mode
    on_crash: str = "raise"
    """``"raise"`` (default): a dead or hung worker raises :class:`shmvec.WorkerCrashedError` /
    :class:`shmvec.EnvTimeoutError` and closes the env; an env exception raises
    :class:`shmvec.EnvError`. ``"restart"``: a worker that dies, hangs past ``timeout``, or whose env
    raises during a step or reset is killed and rebuilt from its factories; its envs end their
    episode in that step as truncated, with ``info["shmvec.restarted"] = True`` and
    ``info["shmvec.restart_reason"]`` (a sentence). Other envs are unaffected. Needs ``n_slots >=
    2``; see :mod:`shmvec.engine.restart` for the seeds of rebuilt envs."""
    max_restarts: int = 10
    """Restart mode: worker restarts allowed within ``restart_window`` (default 10); one more raises
    the error that caused it and closes the env."""
    restart_window: float | None = 60.0
    """Restart mode: length in seconds of the sliding window ``max_restarts`` applies to (default
    60.0; None: the env's whole life)."""
    # ---------------------------------------------------------------- backend
    backend: str = "local"
    """``"local"`` (default): worker processes on this machine, observations in shared memory.
    ``"ray"``: each worker is a Ray actor, on any node of a Ray cluster (the running Ray connection,
    else a local Ray started here and shut down on ``close()``); observations travel encoded by
    ``codec`` (default None here means the lossless ``delta`` codec for leaves of 1 KiB or more;
    ``codec="raw"`` sends them as they are). Needs Ray: ``pip install -e ".[ray]"`` in a clone of
    shmvec; see the guide "Workers on a Ray cluster"."""
    transport: str = "auto"
    """How the local backend's main process reaches its workers. ``"auto"`` (default): the
    environment variable ``SHMVEC_TRANSPORT`` if set, else ``"linux"`` where it can run and
    ``"portable"`` elsewhere. ``"linux"``: the ring's doorbell (futexes and an ``eventfd``: one
    system call wakes a batch's workers, one wakes the main process) and ``epoll``. ``"portable"``:
    one pipe message per worker and command, waited on with ``multiprocessing.connection.wait``,
    from what Python offers on Linux, macOS and Windows alike; observations still go through shared
    memory, and results are the same. See the guide "Platforms and the portable transport" for what
    each costs. Not with ``backend="ray"``."""
    ray_options: Mapping[str, Any] | None = None
    """``backend="ray"`` only: options of every actor, as for ``ray.remote(...).options(...)``:
    ``num_cpus``, ``num_gpus``, ``memory``, ``resources``, ``scheduling_strategy``,
    ``runtime_env``... Default None: 1 CPU per worker. Unless they hold a ``scheduling_strategy``
    (or ``placement_group``, ``label_selector``, ``accelerator_type``: then the actors go where these
    say), the workers are spread over the cluster's nodes by a placement group made at start-up, one
    bundle per worker holding what its actor asks for (``num_cpus``, default 1; ``num_gpus``,
    ``memory``, ``resources``): each worker on its own node while there are enough nodes, else
    evenly by free resources; a restarted worker goes back into its bundle; ``close()`` removes the
    group. Start-up waits for the placement at most 300 s (with a ``timeout``: that many seconds,
    but at least 60), then raises :class:`~shmvec.EnvTimeoutError` naming what the cluster lacks.
    See the guide "Workers on a Ray cluster"."""

    @classmethod
    def from_kwargs(cls, owner: str, kwargs: Mapping[str, Any], **fixed: Any) -> Options:
        """Options from a face's keyword arguments, then ``fixed`` (what the face sets itself).

        :raises TypeError: for a name that is not an option, suggesting the closest.
        """
        names = [f.name for f in fields(cls) if f.name not in fixed]
        for key in kwargs:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}{hint}")
        return cls(**kwargs, **fixed)

    def check_device(self) -> None:
        """Check ``device``, ``device_fields`` and ``pin_memory`` (build() does, before any worker starts,
        the ``n_workers="auto"`` probe's included); imports torch only when ``device`` is given.

        :raises ValueError, TypeError, ImportError: see :func:`shmvec.device.checks.check_device`.
        """
        from shmvec.device.checks import check_device

        check_device(self.device, self.device_fields, self.pin_memory)

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
        transport = choose_transport(self.transport, self.backend)
        fs = self.frame_stack
        if fs is not None and (isinstance(fs, bool) or not isinstance(fs, int) or fs < 1):
            raise ValueError(f"frame_stack must be a whole number >= 1 or None, got {fs!r}")
        from shmvec.engine.typed_infos import columns_for

        columns_for(self.info_keys)  # checks the option
        worker_cpus = resolve_worker_cpus(self.worker_cpus, n_workers, self.backend)
        spin = resolve_spin(self.worker_spin_us, n_workers, self.backend, transport)
        pause = self.pause_openmp and supported("pause_openmp", has_procfs(), "/proc")
        return replace(
            self,
            n_workers=n_workers,
            n_slots=n_slots,
            worker_cpus=worker_cpus,
            worker_spin_us=spin,
            transport=transport,
            pause_openmp=pause,
        )

    def env_fns(self, env_fns: list[Callable[[], gym.Env]]) -> list[Callable[[], gym.Env]]:
        """The factories the workers call: with ``frame_stack``, each env comes out of its worker
        already stacked (see :mod:`shmvec.worker.frame_stack`), so the main process does no stacking work."""
        if self.frame_stack is None:
            return env_fns
        return [
            functools.partial(stacked_factory, fn, self.frame_stack, self.frame_stack_channels_order)
            for fn in env_fns
        ]

    def budget(self) -> RestartBudget:
        """Restart mode's budget: ``max_restarts`` within ``restart_window``."""
        return RestartBudget(self.max_restarts, self.restart_window)

    def leaf_codecs(self, obs_leaves: list[Leaf]) -> tuple[Codec | None, ...] | None:
        """The codec of each observation leaf, or None when nothing is encoded (the default path).
        Object leaves (no fixed size) have none: their values travel pickled.

        :raises ValueError: for a codec mapping that names an object leaf.
        """
        if self.codec is None:
            # Ray: observations cross the network, so they are encoded unless the user says otherwise.
            return None if self.backend == "local" else default_codecs(obs_leaves)
        from shmvec.codecs import per_leaf

        objects = [leaf.name for leaf in obs_leaves if not leaf.fixed]
        named = [key for key in self.codec if key in objects] if isinstance(self.codec, Mapping) else []
        if named:
            raise ValueError(
                f"codec mapping names {named[0]!r}, an observation key whose space has no fixed size "
                "(Text, Sequence, Graph...): its values travel pickled, codecs encode fixed-size "
                "arrays only (Box, Discrete, MultiDiscrete, MultiBinary)"
            )
        fixed = [leaf for leaf in obs_leaves if leaf.fixed]
        names = [leaf.name for leaf in fixed]
        chosen = iter(per_leaf(self.codec, names, [(leaf.shape, leaf.dtype) for leaf in fixed]))
        codecs = [next(chosen) if leaf.fixed else None for leaf in obs_leaves]
        for codec, name in zip(codecs, [leaf.name for leaf in obs_leaves]):
            if codec is not None and not codec.lossless and self.tolerance is None:
                raise ValueError(
                    f"codec {codec!r} for observation key {name!r} is lossy: the agent would see changed "
                    "pixels. Pass tolerance=shmvec.codecs.Tolerance(min_psnr_db=..., max_abs_error=...) "
                    "to accept it with sampled checks, or use a lossless codec (delta, lz4, zstd, png)."
                )
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


# How long each local worker polls for its next command by default, in µs (see shmvec.worker.waiting).
DEFAULT_SPIN_US = 1000


def resolve_spin(spin_us: int | None, n_workers: int, backend: str, transport: str = "linux") -> int:
    """The poll budget of each worker in µs: as given, else :data:`DEFAULT_SPIN_US` when every
    worker can have a CPU of its own and 0 when there are more workers than CPUs (a polling worker
    would take turns from the others). The workers poll the doorbell's words: with the portable
    transport they block in their pipe instead (0, with a note if a budget was given).

    :raises ValueError: for a negative or non-integer budget, or one given with ``backend="ray"``.
    """
    if spin_us is None:
        linux = backend == "local" and transport == "linux"
        return DEFAULT_SPIN_US if linux and n_workers <= usable_cpus() else 0
    if isinstance(spin_us, bool) or not isinstance(spin_us, (int, np.integer)) or spin_us < 0:
        raise ValueError(f"worker_spin_us must be a whole number of µs >= 0 or None, got {spin_us!r}")
    if spin_us and backend != "local":
        raise ValueError(f"worker_spin_us applies to local worker processes; backend={backend!r} has none")
    if spin_us and not supported("worker_spin_us", transport == "linux", "the Linux transport's doorbell"):
        return 0
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
    if not supported("worker_cpus", can_pin(), "os.sched_setaffinity (Linux)"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
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
