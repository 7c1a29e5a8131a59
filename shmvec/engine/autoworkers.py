"""``n_workers="auto"``: choose the number of worker processes from what one env measures.

Why a probe: the best worker count depends on how much of an env's step is computation and how
much is waiting (a simulator behind a socket, I/O, ``time.sleep``). A worker steps its envs one after
the other, so envs that mostly wait want one worker each (their waits then overlap), while envs that
compute want one worker per usable CPU (more only adds switching). Changing the count later would
mean restarting every worker with another split of the envs, losing their state mid-episode; so the
count is decided once, before the real workers start.

How: one throwaway worker builds one env (``env_fns[0]``, with the same options: frame stacking,
worker threads, RNG isolation), resets it and steps it with random actions (the action space's own
sampler, seeded 0) for :data:`PROBE_SECONDS` (at least :data:`PROBE_MIN_STEPS` steps). A wrapper
inside the worker times each ``env.step`` itself: the stepping thread's CPU time, the wall time,
and the time that thread spent queued for a CPU (the kernel's ``/proc/thread-self/schedstat``).
Only that thread's CPU counts: a freshly started worker has other threads that burn CPU for a
while on their own (OpenBLAS's pool, re-created by the thread limit, spins ~0.1 s after it starts),
which made a sleeping env look busy. Work an env hands to threads of its own counts as waiting.
Timing inside the worker keeps the pipe round trips and the main process's own scheduling out of
the figure. The env's *busy fraction* ``f`` is CPU time over the wall time that was not spent
queueing, so a machine that is busy with other work does not make a computing env look like a
waiting one, nor a waiting env look like a computing one. Then, with ``c`` usable CPUs and ``n``
envs:

- ``f >= CPU_BOUND`` (0.75; below 1 because an env's step has a little waiting of its own): the env
  computes: ``min(n, c)`` workers, one per usable CPU;
- otherwise ``c`` CPUs keep about ``c / f`` such envs busy at once:
  ``min(n, max(c, ceil(c / f)))`` workers, up to one per env.

The probe is skipped, and the count is ``min(n, c)``, where no other count could be chosen
(``n <= c``) and where the kernel counters cannot be read (not Linux). The probe env is closed and
thrown away, and its worker stopped: the envs the caller gets are fresh, so results are the same as
with any fixed ``n_workers``. It costs one extra worker start and ``PROBE_SECONDS`` of stepping (and
one extra env built: an env with side effects sees one more instance).
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from shmvec.engine.flights import pool_workers
from shmvec.engine.groups import usable_cpus
from shmvec.errors import NativeStepWarning
from shmvec.wire import messages as m
from shmvec.worker.envapi import make_env

if TYPE_CHECKING:
    from shmvec.engine.options import Options

# Seconds of stepping the probe measures (after a reset and one warm-up step).
PROBE_SECONDS = 0.3
PROBE_MIN_STEPS = 3
# A busy fraction at or above this is a computing env: one worker per usable CPU.
CPU_BOUND = 0.75


@dataclass(frozen=True)
class Probe:
    """What the probe measured over ``steps`` steps of one env in one worker (seconds)."""

    steps: int
    wall_s: float  # in the worker, around env.step
    cpu_s: float  # the stepping thread's CPU time during env.step
    queued_s: float  # the stepping thread's time waiting for a CPU during env.step

    @property
    def busy_fraction(self) -> float:
        """CPU time over the wall time not spent queueing, in [0, 1]."""
        free = self.wall_s - self.queued_s
        return 1.0 if free <= 0 else min(1.0, self.cpu_s / free)


def choose_workers(n_envs: int, cpus: int, busy_fraction: float) -> int:
    """The worker count for ``n_envs`` envs of this busy fraction on ``cpus`` usable CPUs (see the
    module docstring)."""
    base = min(n_envs, cpus)
    if busy_fraction >= CPU_BOUND:
        return base
    return min(n_envs, max(base, math.ceil(cpus / max(busy_fraction, 1e-3))))


def _queued_s() -> float | None:
    """Seconds this thread has spent queued for a CPU, or None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class _Timed(gym.Wrapper):
    """Sums, over its env's steps, this thread's CPU time, the wall time and this thread's time
    queued for a CPU (seconds): ``probe_totals``, read back with ``get_attr``."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.probe_totals = (0, 0.0, 0.0, 0.0)  # steps, wall, cpu, queued

    def step(self, action: Any) -> Any:
        q0, c0, w0 = _queued_s() or 0.0, time.thread_time(), time.perf_counter()
        out = self.env.step(action)
        wall, cpu, queued = time.perf_counter() - w0, time.thread_time() - c0, (_queued_s() or 0.0) - q0
        n, w, c, q = self.probe_totals
        self.probe_totals = (n + 1, w + wall, c + cpu, q + queued)
        return out


def _timed(env_fn: Callable[[], gym.Env]) -> gym.Env:
    return _Timed(make_env(env_fn))


Builder = Callable[..., Any]  # shmvec.engine.build.build, passed in: build resolves "auto" through here


def probe(
    env_fns: Sequence[Callable[[], gym.Env]], start_method: str | None, options: Options, build: Builder
) -> Probe | None:
    """Step ``env_fns[0]`` alone in one throwaway worker and measure it; None where the kernel's
    scheduler counters cannot be read."""
    if _queued_s() is None:
        return None
    one = replace(
        options, n_workers=1, codec=None, n_slots=None, copy=True, on_crash="raise", check_finite=False
    )
    one = replace(one, device=None, device_fields=(), pin_memory=None)  # the probe reads no batch
    with warnings.catch_warnings():  # the VecEnv being built warns of its envs' native steps once
        warnings.simplefilter("ignore", NativeStepWarning)
        engine = build(
            [functools.partial(_timed, env_fns[0])], start_method, one, owner="n_workers='auto' probe"
        )

    def totals() -> tuple[int, float, float, float]:
        return engine.call(lambda local: m.GetAttr(local, "probe_totals"), [0])[0]

    try:
        space = engine.action_space
        space.seed(0)
        engine.reset([None], [{}])
        engine.send([space.sample()])
        engine.recv()  # warm-up: first steps touch fresh pages
        before = totals()
        start = time.perf_counter()
        while True:
            engine.send([space.sample()])
            engine.recv()
            n, wall, cpu, queued = totals()
            if time.perf_counter() - start >= PROBE_SECONDS and n - before[0] >= PROBE_MIN_STEPS:
                break
    finally:
        engine.close()
    return Probe(n - before[0], wall - before[1], cpu - before[2], queued - before[3])


def resolve_auto(
    options: Options,
    env_fns: Sequence[Callable[[], gym.Env]],
    start_method: str | None,
    build: Builder,
    batch_size: int | None = None,
) -> Options:
    """``options`` with ``n_workers="auto"`` replaced by the chosen count (unchanged otherwise).

    :param batch_size: pool mode's batch size (None: not pool mode). A pool's groups must fill a
        batch whole: envs that wait get one worker each (a group of one: a slow env holds back no
        other), envs that compute the pool's grouping rule
        (:func:`~shmvec.engine.flights.pool_workers`).
    :raises ValueError: for a string other than ``"auto"``.
    """
    n_workers = options.n_workers
    if not isinstance(n_workers, str):
        return options
    if n_workers != "auto":
        raise ValueError(f"n_workers must be a whole number, None or 'auto', got {n_workers!r}")
    n_envs, cpus = len(env_fns), usable_cpus()
    if n_envs <= cpus:  # no other count is possible: one worker per env
        return replace(options, n_workers=max(n_envs, 1))
    measured = probe(env_fns, start_method, options, build)
    if batch_size is not None:
        waits = measured is not None and measured.busy_fraction < CPU_BOUND
        chosen = n_envs if waits else pool_workers(n_envs, batch_size, None, cpus)
    elif measured is None:
        chosen = min(n_envs, cpus)
    else:
        chosen = choose_workers(n_envs, cpus, measured.busy_fraction)
    return replace(options, n_workers=chosen)
