"""What the machine itself allows, with no VecEnv at all: envs stepped by independent processes.

    python benchmarks/free_ceiling.py                       # ALE Pong, 2 processes x 4 envs, 3 rounds
    python benchmarks/free_ceiling.py --processes 2 --envs 4 --rounds 5 --seconds 3

`shmvec bench` compares every configuration with a *ceiling*: one env stepped alone in one process,
times min(n_envs, CPUs). No VecEnv reaches it, and part of the gap is the machine's: two processes
stepping at once share caches, memory bandwidth and, on a virtual machine, the host. This runs,
round by round, one env alone in a process of its own, then ``--processes`` processes at once, each
stepping ``--envs`` envs one after the other with random actions and no communication of any kind,
and prints their summed env steps/s as a fraction of the ceiling: the most a VecEnv could reach on
this machine. The fork start method; every window in fresh processes.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from typing import Any


def _step(env_id: str, n_envs: int, seconds: float, out: Any) -> None:
    import ale_py
    import gymnasium as gym
    import numpy as np

    gym.register_envs(ale_py)
    envs = [gym.make(env_id) for _ in range(n_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    actions = np.random.default_rng(0).integers(0, envs[0].action_space.n, 4096).tolist()
    k = 0
    for _ in range(50):  # warm-up
        for env in envs:
            env.step(actions[k % 4096])
            k += 1
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for env in envs:
            _, _, terminated, truncated, _ = env.step(actions[k % 4096])
            k += 1
            n += 1
            if terminated or truncated:
                env.reset()
    out.put(n / (time.perf_counter() - start))


def _together(env_id: str, processes: int, n_envs: int, seconds: float) -> float:
    """Summed env steps/s of ``processes`` processes stepping ``n_envs`` envs each, all at once."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_step, args=(env_id, n_envs, seconds, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    rates = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="ALE/Pong-v5", help="a gymnasium id of an ALE game")
    parser.add_argument(
        "--processes", type=int, default=2, help="processes at once, at most the CPUs (default 2)"
    )
    parser.add_argument("--envs", type=int, default=4, help="envs per process (default 4)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring window (s)")
    args = parser.parse_args()
    from shmvec.bench import host

    wake_up_us = host.wake_up_us()  # the host's, printed beside the ratios
    print(host.describe(wake_up_us) + ".", flush=True)
    fractions = []
    for r in range(args.rounds):
        alone = _together(args.env, 1, 1, args.seconds)
        ceiling = alone * args.processes  # one env alone x min(n_envs, CPUs), processes <= CPUs
        free = _together(args.env, args.processes, args.envs, args.seconds)
        fractions.append(free / ceiling)
        print(
            f"round {r + 1}: one env alone {alone:,.0f} steps/s, ceiling {ceiling:,.0f}; "
            f"{args.processes} processes x {args.envs} envs {free:,.0f} = {free / ceiling:.0%} of it",
            flush=True,
        )
    print(
        f"{args.processes} free processes reach {statistics.median(fractions):.0%} of the ceiling "
        f"(median of {args.rounds} rounds, {min(fractions):.0%}-{max(fractions):.0%})"
    )


if __name__ == "__main__":
    main()
