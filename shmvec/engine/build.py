"""Building an engine: the options resolved (``n_workers="auto"`` by a probe) and checked, the
transport picked for the backend, the engine started."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import gymnasium as gym

from shmvec.atari.fingerprints import warning
from shmvec.engine import autoworkers
from shmvec.engine.core import Engine
from shmvec.engine.flights import FIRST_READY
from shmvec.engine.groups import split_envs
from shmvec.engine.options import Options, context
from shmvec.engine.start_methods import exit_if_reimported_main
from shmvec.errors import NativeStepWarning
from shmvec.transports.base import Transport


def build(
    env_fns: Sequence[Callable[[], gym.Env]],
    start_method: str | None,
    options: Options,
    owner: str = "ShmVecEnv",
    batch_size: int | None = None,
    order: str = FIRST_READY,
    info_form: str = "dicts",
    same_spaces: bool = True,
) -> Engine:
    """An engine stepping ``env_fns`` (see :class:`~shmvec.engine.core.Engine` for the rest).

    :param start_method: multiprocessing start method (default: forkserver where available).
    :raises ValueError, TypeError: for bad factories or options, before any worker starts.
    """
    # A worker re-importing a main script without the __main__ guard stops here with one line.
    exit_if_reimported_main()
    env_fns = list(env_fns)
    if not env_fns:
        # The user typed a count, not a list: name it as their call spelt it.
        count = "num_envs" if owner == "ShmVectorEnv" else "n_envs"
        callers = "shmvec.make_vec" if owner == "ShmVectorEnv" else "make_vec_env, make_atari_env"
        raise ValueError(
            f"{owner} got 0 env factories: {count}=0 ({callers}) or an empty env_fns makes no env; "
            f"pass {count} >= 1"
        )
    if not all(callable(fn) for fn in env_fns):
        raise TypeError("env_fns must be callables that each create an env (e.g. lambda: gym.make(id))")
    options.check_device()
    pool = batch_size is not None and batch_size < len(env_fns)
    if pool and options.n_workers is None:
        # Pool mode is for envs whose steps take uneven time: measured, a waiting env gets a worker
        # of its own, so that a slow env holds back no other (see autoworkers.resolve_auto).
        options = replace(options, n_workers="auto")
    opts = autoworkers.resolve_auto(options, env_fns, start_method, build, batch_size if pool else None)
    opts = opts.checked(len(env_fns))
    assert isinstance(opts.n_workers, int)
    resolved, ctx = context(start_method)
    transport = make_transport(
        opts, ctx, resolved, split_envs(len(env_fns), opts.n_workers), opts.env_fns(env_fns)
    )
    engine = Engine(len(env_fns), opts, transport, owner, batch_size, order, info_form, same_spaces)
    engine.start_method = resolved
    unchecked = warning(engine.native_steps)
    if unchecked is not None:
        warnings.warn(unchecked, NativeStepWarning, stacklevel=_outside_shmvec())
    return engine


def _outside_shmvec() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside shmvec (the user's line
    that built the VecEnv, or the library's that built it for them)."""
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("shmvec."):
        frame, level = frame.f_back, level + 1
    return level


def make_transport(
    options: Options, ctx: Any, start_method: str, worker_envs: list[range], env_fns: list[Callable[[], Any]]
) -> Transport:
    """The transport of ``options.backend``: local processes (through ``options.transport``, resolved by
    :meth:`Options.checked`: the Linux transport or the portable one), or Ray actors (imports Ray)."""
    if options.backend == "ray":
        from shmvec.transports.ray.transport import RayTransport  # imports Ray: only for this backend

        args = (worker_envs, env_fns, options.worker_threads, options.timeout, options.isolate_rng)
        return RayTransport(*args, ray_options=options.ray_options)
    from shmvec.transports.processes import Processes

    # worker_cpus="auto" was resolved to a list of CPUs by Options.checked().
    cpus: Any = options.worker_cpus
    procs = Processes(
        ctx, start_method, worker_envs, env_fns, options.worker_threads, options.isolate_rng, cpus
    )
    if options.transport == "portable":
        from shmvec.transports.portable import PortableTransport

        return PortableTransport(procs, options.timeout)
    from shmvec.transports.local import LocalTransport

    return LocalTransport(procs, options.timeout)
