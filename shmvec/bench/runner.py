"""Measuring VecEnv configurations on one env: throughput, where a step's time goes, CPU, memory and
start-up, repeated and interleaved.

How a batch step's wall time is attributed (all per batch step, in seconds):

- ``policy_s``: measured, the time to choose the actions (SB3 ``predict``; ~0 for random actions).
- ``send_s``: measured, ``step_async`` in the main process.
- ``wait_s``: measured, ``step_wait`` in the main process. It is split, from outside the engine, into
  - ``env_s``: env compute on the critical path, *estimated* as the env's own step time (one env
    stepped alone in this process, median over the rounds) x the envs one CPU must step in turn
    (``ceil(n_envs / min(processes stepping envs, usable CPUs))``; for an env that mostly waits,
    the waiting part overlaps across all processes), capped at ``wait_s``;
  - ``copy_s``: *estimated* as the measured time of one fresh copy of a batch of observations (the
    copy DummyVecEnv, SubprocVecEnv and AsyncVectorEnv make to hand over an array the caller may
    keep; ShmVecEnv lends ring slots instead when it can, so for it this is an upper bound), capped
    at what is left;
  - ``ipc_s``: the rest of ``wait_s``: pipes, pickling, waking up, waiting for the slowest worker,
    and any extra copies or bookkeeping the backend makes.
- ``unattributed_s``: wall time minus policy, send and wait (the loop's own overhead).

So ``policy + send + env + copy + ipc + unattributed`` is the measured step time by construction;
``unattributed_s`` small is the check that the timers cover the loop. What cannot be attributed from
outside: how much of ``ipc_s`` is transport versus a worker waiting for a CPU, and the extra copies a
backend makes. A hook in the engine reporting worker-side step and write times would split it.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.bench import host, system
from shmvec.bench.backends import make_vec_env
from shmvec.bench.envs import check_env_name
from shmvec.bench.policy import make_actor
from shmvec.bench.recipes import recipe_env, stacked_space
from shmvec.bench.recommend import recommend
from shmvec.bench.results import (
    MAX_OTHER_CORES,
    MAX_REL_SPREAD,
    MAX_STEAL,
    BenchResult,
    BenchSpec,
    Config,
    Point,
    Sample,
)
from shmvec.bench.stats import summarize
from shmvec.engine.start_methods import resolve_start_method
from shmvec.native import grouped

Progress = Callable[[int, int, str], None]


def run(spec: BenchSpec, progress: Progress | None = None) -> BenchResult:
    """Measure every configuration of ``spec``; the Python API behind ``shmvec bench``.

    :param progress: called as ``progress(done, total, message)`` after each window.
    :raises ValueError: for a bad spec or an env that cannot be created.
    """
    spec.validate()
    # Recorded resolved, so the JSON says which start method the start-up figures are for.
    spec.start_method = resolve_start_method(spec.start_method)
    check_env_name(spec.env, **spec.env_kwargs)
    # With a recipe, env_fn builds one env of it and the backends stack frame_stack frames each.
    env_fn, frame_stack = recipe_env(spec.recipe, spec.env, spec.env_kwargs)
    actor = make_actor(spec.policy, env_fn, spec.seed, frame_stack)
    configs = spec.configs()
    points = [Point(c) for c in configs]
    alone: list[float] = []
    alone_cpu: list[float] = []
    alone_other: list[float] = []
    probe = env_fn()
    space = stacked_space(probe.observation_space, frame_stack)
    probe.close()
    obs_bytes = int(sum(np.asarray(x).nbytes for x in _leaves(space.sample())))
    copy_s = {n: _copy_time(space, n) for n in sorted({c.batch for c in configs})}
    # The host's state, printed beside the ratios (shmvec.bench.host): measured before the rounds.
    host_state = {"wake_up_us": host.wake_up_us()}
    if spec.recipe is not None:
        host_state["emulator_floor_us"] = host.emulator_floor_us(spec.env)
    total, done = (len(configs) + 1) * spec.repeats, 0
    for r in range(spec.repeats):
        rate, cpu, other = _measure_alone(env_fn, spec.seconds, spec.seed + r)
        alone.append(rate)
        alone_cpu.append(cpu)
        alone_other.append(other)
        done += 1
        if progress:
            progress(done, total, f"round {r + 1}: one env alone {alone[-1]:,.0f} steps/s")
        # Alternate the order between rounds so slow drift of the machine does not favour one end.
        order = points if r % 2 == 0 else points[::-1]
        for point in order:
            c = point.config
            sample, point.native = _measure(c, env_fn, frame_stack, actor, spec, spec.seed + r)
            point.samples.append(sample)
            done += 1
            if progress:
                progress(done, total, f"{c.label}: {point.samples[-1].steps_per_s:,.0f} steps/s")
    # Attributed after all rounds, from the median env-alone rate: one disturbed round then does
    # not distort the estimate.
    env_step_s = 1.0 / float(np.median(alone))
    machine = {
        "usable_cpus": system.usable_cpus(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **host_state,
    }
    result = BenchResult(
        spec, machine, obs_bytes, alone, alone_cpu, points, batch_copy_s=copy_s, alone_other_cores=alone_other
    )
    for point in points:
        for sample in point.samples:
            n = point.config.batch
            _attribute(sample, n, env_step_s, result.cpu_fraction, copy_s[n])
        _summarize(point)
    result.recommendation = recommend(result)
    return result


def _leaves(obs: Any) -> list[Any]:
    if isinstance(obs, dict):
        return [x for v in obs.values() for x in _leaves(v)]
    if isinstance(obs, tuple):
        return [x for v in obs for x in _leaves(v)]
    return [obs]


def _copy_time(space: gym.Space, n_envs: int) -> float:
    """Median time of one fresh copy of a batch of ``n_envs`` observations (s)."""
    batch = [np.stack([np.asarray(x)] * n_envs) for x in _leaves(space.sample())]
    times = []
    for _ in range(15):
        t = time.perf_counter()
        for x in batch:
            x.copy()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _measure_alone(env_fn: Callable[[], gym.Env], seconds: float, seed: int) -> tuple[float, float, float]:
    """Steps/s of one env stepped in this process with random actions, resets included; the
    fraction of that time this process was on a CPU; and the CPU (in cores) other processes took."""
    env = env_fn()
    try:
        env.action_space.seed(seed)
        env.reset(seed=seed)
        actions = [env.action_space.sample() for _ in range(64)]
        snap = system.cpu_snapshot([])
        steps, start, cpu = 0, time.perf_counter(), time.process_time()
        while True:
            _, _, term, trunc, _ = env.step(actions[steps % 64])
            if term or trunc:
                env.reset()
            steps += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                own = time.process_time() - cpu
                after = system.cpu_snapshot([])
                other = max(0.0, after.machine_busy_s - snap.machine_busy_s - (after.tree_s - snap.tree_s))
                return steps / elapsed, own / elapsed, other / elapsed
    finally:
        env.close()


def _measure(
    config: Config,
    env_fn: Callable[[], gym.Env],
    frame_stack: int | None,
    actor: Callable[[Any], np.ndarray] | None,
    spec: BenchSpec,
    seed: int,
) -> tuple[Sample, list[dict[str, Any]] | None]:
    """One window, and which envs stepped natively (:func:`shmvec.native.grouped`; None for a backend that
    is not shmvec); ``env_s``, ``copy_s`` and ``ipc_s`` are left 0 for :func:`_attribute`."""
    n = config.n_envs
    shm_before = system.shm_segments()
    t0 = time.perf_counter()
    venv = make_vec_env(
        config.backend, [env_fn] * n, config.n_workers, spec.start_method, config.batch_size, frame_stack
    )
    n = config.batch  # env steps per batch step (a pool steps batch_size of its n_envs)
    try:
        venv.seed(seed)
        obs = venv.reset()
        startup_s = time.perf_counter() - t0
        statuses = getattr(venv, "native_steps", None)
        native = None if statuses is None else grouped(statuses)
        shm_bytes = sum(s for name, s in system.shm_segments().items() if name not in shm_before)
        procs = list(venv.processes)
        mem0 = system.memory(procs)
        venv.action_space.seed(seed)
        presampled = [np.array([venv.action_space.sample() for _ in range(n)]) for _ in range(64)]

        def act(k: int, obs: Any) -> np.ndarray:
            return presampled[k % 64] if actor is None else actor(obs)

        # Warm-up: first steps touch fresh pages and fill caches.
        warm_end = time.perf_counter() + min(0.5, 0.2 * spec.seconds)
        k = 0
        while k < 3 or time.perf_counter() < warm_end:
            venv.step_async(act(k, obs))
            obs = venv.step_wait()[0]
            k += 1
        cpu0 = system.cpu_snapshot(procs)
        policy = send = wait = wait_cpu = 0.0
        steps = 0
        start = time.perf_counter()
        while True:
            a = time.perf_counter()
            actions = act(steps, obs)
            b = time.perf_counter()
            venv.step_async(actions)
            c = time.perf_counter()
            c_cpu = time.process_time()
            obs = venv.step_wait()[0]
            d = time.perf_counter()
            wait_cpu += time.process_time() - c_cpu
            policy += b - a
            send += c - b
            wait += d - c
            steps += 1
            if d - start >= spec.seconds:
                break
        wall = d - start
        cpu1 = system.cpu_snapshot(procs)
        mem1 = system.memory(procs)
    finally:
        venv.close()
    per = 1.0 / steps
    tree = cpu1.tree_s - cpu0.tree_s
    machine_total = cpu1.machine_total_s - cpu0.machine_total_s
    sample = Sample(
        steps_per_s=steps * n / wall,
        batch_steps=steps,
        wall_s=wall,
        step_s=wall * per,
        policy_s=policy * per,
        send_s=send * per,
        wait_s=wait * per,
        env_s=0.0,
        copy_s=0.0,
        ipc_s=0.0,
        unattributed_s=(wall - policy - send - wait) * per,
        cpu_cores=tree / wall,
        other_cores=max(0.0, (cpu1.machine_busy_s - cpu0.machine_busy_s - tree) / wall),
        steal=(cpu1.machine_steal_s - cpu0.machine_steal_s) / machine_total if machine_total > 0 else 0.0,
        rss_bytes=max(mem0.rss, mem1.rss),
        pss_bytes=max(mem0.pss, mem1.pss),
        shm_bytes=shm_bytes,
        startup_s=startup_s,
        processes=len(procs),
        wait_cpu_s=wait_cpu * per,
    )
    return sample, native


def _attribute(sample: Sample, n_envs: int, env_step_s: float, cpu_fraction: float, copy_s: float) -> None:
    """Split ``wait_s`` into env compute, copy and IPC+waiting (see the module docstring).

    The computing part of an env step runs on at most one process per CPU at a time; the waiting
    part (``1 - cpu_fraction``) overlaps across all processes.
    """
    procs = max(sample.processes, 1)
    cpu_lanes = min(procs, system.usable_cpus())
    env_s = env_step_s * (
        cpu_fraction * math.ceil(n_envs / cpu_lanes) + (1 - cpu_fraction) * math.ceil(n_envs / procs)
    )
    sample.env_s = min(env_s, sample.wait_s)
    sample.copy_s = min(copy_s, sample.wait_s - sample.env_s)
    sample.ipc_s = sample.wait_s - sample.env_s - sample.copy_s


def _summarize(point: Point) -> None:
    point.steps_per_s = summarize([s.steps_per_s for s in point.samples])
    reasons = []
    if point.steps_per_s.rel_spread > MAX_REL_SPREAD:
        reasons.append(f"repeats differ by {point.steps_per_s.rel_spread:.0%}")
    other = point.median("other_cores")
    if other > MAX_OTHER_CORES:
        reasons.append(f"other processes used {other:.1f} cores")
    steal = point.median("steal")
    if steal > MAX_STEAL:
        reasons.append(f"hypervisor stole {steal:.0%} of CPU time")
    point.disturbed = reasons
