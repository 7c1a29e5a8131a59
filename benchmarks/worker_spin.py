"""What a worker's polling for its next command (``worker_spin_us``, see ``shmvec.waiting``) does.

    flock /tmp/bench.lock python benchmarks/worker_spin.py --rounds 4 --markdown benchmarks/results/worker_spin.md

Two parts, each interleaved over ``--rounds`` rounds:

1. Why: 4 ALE Pong envs stepped in one process, the CPU time (``time.thread_time``) their steps take
   per batch when the batches follow each other and when the process sleeps 1 ms between them, as a
   worker does while the main process has the CPU. Alone, and two such processes at once.
2. What it gives: ``ShmVecEnv`` with the default (workers poll for up to 1 ms) against
   ``worker_spin_us=0`` (workers sleep at once), random actions, on Pong raw (``ALE/Pong-v5``) and
   on the synthetic 512x512x3 env at ~1 ms a step, 8 envs each: env steps/s, the per-round ratio,
   and the CPU per batch step of the main process and of the workers.

With the policy in the loop the workers wait several ms for each step and do not poll; that case is
``benchmarks/policy_loop.py`` (config ``shm-sleep`` against ``shm-stack``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import numpy as np

from shmvec.bench.envs import env_factory

SYN = "shmvec.synthetic:SyntheticImageEnv"

WORKLOADS = {
    "pong_raw": env_factory("ALE/Pong-v5"),
    "synth512x512x3_1ms": env_factory(SYN, shape=(512, 512, 3), work_s=0.001),
}
VARIANTS = {"poll (default)": None, "sleep (worker_spin_us=0)": 0}


def env_cpu_per_batch(pause_s: float, batches: int, queue: Any = None) -> float:
    """CPU ms of 4 Pong envs' steps per batch, with ``pause_s`` of sleep between batches."""
    envs = [WORKLOADS["pong_raw"]() for _ in range(4)]
    for k, env in enumerate(envs):
        env.reset(seed=k)
    actions = np.random.default_rng(0).integers(0, 6, len(envs))
    total = 0.0
    for b in range(batches + 50):
        if b == 50:
            total = 0.0
        for env, action in zip(envs, actions):
            start = time.thread_time()
            _, _, terminated, truncated, _ = env.step(action)
            total += time.thread_time() - start
            if terminated or truncated:
                env.reset()
        if pause_s:
            time.sleep(pause_s)
    ms = total / batches * 1e3
    if queue is not None:
        queue.put(ms)
    return ms


def two_at_once(pause_s: float, batches: int) -> list[float]:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=env_cpu_per_batch, args=(pause_s, batches, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return [queue.get() for _ in procs]


def step_rate(workload: str, spin_us: int | None, steps: int, n_envs: int) -> dict[str, float]:
    import psutil

    from shmvec import ShmVecEnv

    venv = ShmVecEnv([WORKLOADS[workload]] * n_envs, worker_spin_us=spin_us)
    try:
        venv.action_space.seed(0)
        actions = np.array([venv.action_space.sample() for _ in range(n_envs)])
        venv.reset()
        for _ in range(50):
            venv.step(actions)
        procs = [psutil.Process()] + [psutil.Process(p.pid) for p in venv.processes]
        cpu0 = [sum(p.cpu_times()[:2]) for p in procs]
        start = time.perf_counter()
        for _ in range(steps):
            venv.step(actions)
        wall = time.perf_counter() - start
        cpu = [(sum(p.cpu_times()[:2]) - c) / steps * 1e3 for p, c in zip(procs, cpu0)]
    finally:
        venv.close()
    return {
        "steps_per_s": steps * n_envs / wall,
        "main_cpu_ms": cpu[0],
        "worker_cpu_ms": float(np.mean(cpu[1:])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000, help="batch steps per window (default 2000)")
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--markdown", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    out = [f"`python benchmarks/worker_spin.py --rounds {args.rounds} --steps {args.steps}`", ""]

    def say(line: str = "") -> None:
        print(line, flush=True)
        out.append(line)

    from shmvec.bench import host

    say(host.describe(host.wake_up_us()) + ".")
    say()
    say("## Env CPU per batch of 4 Pong steps (ms), without and with a 1 ms sleep between batches")
    say()
    say("| round | alone | alone, sleeping | two at once | two at once, sleeping |")
    say("|---|---|---|---|---|")
    for r in range(args.rounds):
        cells = [env_cpu_per_batch(0, 1500), env_cpu_per_batch(0.001, 1500)]
        both = [two_at_once(0, 1500), two_at_once(0.001, 1500)]
        say(
            f"| {r + 1} | {cells[0]:.2f} | {cells[1]:.2f} | "
            + " | ".join(" / ".join(f"{x:.2f}" for x in b) for b in both)
            + " |"
        )
    for workload in WORKLOADS:
        say()
        say(f"## {workload}, {args.n_envs} envs, random actions")
        say()
        say("| round | variant | env steps/s | main CPU ms per batch | worker CPU ms per batch |")
        say("|---|---|---|---|---|")
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        names = list(VARIANTS)
        for r in range(args.rounds):
            for variant in names if r % 2 == 0 else names[::-1]:
                got = step_rate(workload, VARIANTS[variant], args.steps, args.n_envs)
                rates[variant].append(got["steps_per_s"])
                say(
                    f"| {r + 1} | {variant} | {got['steps_per_s']:,.0f} | {got['main_cpu_ms']:.2f} | "
                    f"{got['worker_cpu_ms']:.2f} |"
                )
        ratios = [a / b for a, b in zip(*rates.values())]
        say()
        say(
            f"poll / sleep per round: {', '.join(f'{x:.3f}' for x in ratios)}; median {np.median(ratios):.3f}; "
            f"medians {np.median(rates[names[0]]):,.0f} / {np.median(rates[names[1]]):,.0f} env steps/s"
        )
    if args.markdown:
        args.markdown.write_text("# Workers polling for their next command\n\n" + "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
