"""Pool mode against sync mode with a policy in the loop (issue 10's targets), interleaved rounds.

    flock /tmp/bench.lock python benchmarks/pool_loop.py --rounds 3 --seconds 4
    flock /tmp/bench.lock python benchmarks/pool_loop.py --slow --rounds 3 --seconds 3

Default: ALE Pong, ``AtariPreprocessing`` + ``FrameStackObservation(4)`` inside each env
(``shmvec.bench.envs:pong_84x84x4``, observations (4, 84, 84) uint8), CleanRL's NatureCNN agent in
torch on the main process (``--torch-threads``), sampling actions for each batch. Configurations:

- ``sync``: ``ShmVectorEnv`` with ``--batch`` envs, ``step()``;
- ``pool-first``: ``ShmVectorEnv(batch_size=--batch)`` with ``--pool`` envs, first-ready order;
- ``pool-det``: the same, deterministic order.

Per configuration and round: env steps/s and the process tree's CPU time per env step (main process,
all its threads, plus the workers; a waiting loop that spins shows up here), then pool/sync ratios of
each round, side by side.

``--slow``: synthetic 84x84x4 envs sleeping 2 ms per step, one of them 100 ms, random actions: the
fast envs' steps/s with and without the slow env, for sync mode and first-ready pool mode (batches of
half the envs) with one env per worker, and pool mode with the default ``n_workers`` (``pool-default``;
issue 24's case is ``--slow --pool 8``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any

import numpy as np

from shmvec import ShmVectorEnv
from shmvec.bench import system
from shmvec.bench.envs import pong_84x84x4
from shmvec.bench.policy import nature_cnn
from shmvec.synthetic import SyntheticImageEnv


def make(config: str, args: argparse.Namespace, fns: list | None = None) -> ShmVectorEnv:
    n = args.batch if config == "sync" else args.pool
    fns = fns or [pong_84x84x4] * n
    if config == "sync":
        return ShmVectorEnv(fns, start_method="fork", n_workers=args.workers)
    order = "first_ready" if config == "pool-first" else "deterministic"
    return ShmVectorEnv(fns, start_method="fork", batch_size=args.batch, pool_order=order)


def measure(config: str, agent: Any, args: argparse.Namespace) -> tuple[float, float]:
    """(env steps/s, process-tree CPU ms per env step) of one window."""
    import torch

    env = make(config, args)
    try:
        procs = list(env._eng.transport.processes)

        def act(obs: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                logits = agent(torch.as_tensor(obs).float() / 255.0)
                return torch.distributions.Categorical(logits=logits).sample().numpy()

        if config == "sync":
            obs, _ = env.reset(seed=0)

            def batch_step(obs: np.ndarray) -> np.ndarray:
                return env.step(act(obs))[0]
        else:
            env.async_reset(seed=0)
            obs = env.recv()[0]

            def batch_step(obs: np.ndarray) -> np.ndarray:
                env.send(act(obs))
                return env.recv()[0]

        for _ in range(10):  # warm-up
            obs = batch_step(obs)
        cpu0, start, batches = system.cpu_snapshot(procs).tree_s, time.perf_counter(), 0
        while time.perf_counter() - start < args.seconds:
            obs = batch_step(obs)
            batches += 1
        wall = time.perf_counter() - start
        cpu = system.cpu_snapshot(procs).tree_s - cpu0
    finally:
        env.close()
    steps = batches * args.batch
    return steps / wall, 1000 * cpu / steps


def slow_fns(n: int, with_slow: bool) -> list:
    fast = functools.partial(SyntheticImageEnv, io_s=(0.002, 0.002))
    slow = functools.partial(SyntheticImageEnv, io_s=(0.1, 0.1))
    return [slow if with_slow and i == 0 else fast for i in range(n)]


def fast_rate(config: str, with_slow: bool, args: argparse.Namespace) -> float:
    """Steps/s of the fast envs (1..n-1), random actions."""
    n = args.pool
    fns = slow_fns(n, with_slow)
    if config == "sync":
        env = ShmVectorEnv(fns, start_method="fork", n_workers=n)
    elif config == "pool-default":
        env = ShmVectorEnv(fns, start_method="fork", batch_size=n // 2)
    else:
        env = ShmVectorEnv(fns, start_method="fork", n_workers=n, batch_size=n // 2)
    try:
        counts = np.zeros(n)
        if config == "sync":
            env.reset(seed=0)
            start = time.perf_counter()
            while time.perf_counter() - start < args.seconds:
                env.step(np.zeros(n, np.int64))
                counts += 1
        else:
            env.async_reset(seed=0)
            env.recv()
            start = time.perf_counter()
            while time.perf_counter() - start < args.seconds:
                env.send(np.zeros(n // 2, np.int64))
                np.add.at(counts, env.recv()[4]["env_id"], 1)
        wall = time.perf_counter() - start
    finally:
        env.close()
    return float(counts[1:].sum() / wall)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=8, help="sync envs and pool batch size (default 8)")
    parser.add_argument("--pool", type=int, default=16, help="pool envs (default 16)")
    parser.add_argument("--workers", type=int, default=None, help="sync workers (default: CPUs)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per window (default 4)")
    parser.add_argument("--configs", default="sync,pool-first,pool-det")
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch intra-op threads (default: torch's, the CPUs)"
    )
    parser.add_argument("--slow", action="store_true", help="the slow-env comparison instead")
    args = parser.parse_args()
    from shmvec.bench import host

    wake_up_us = host.wake_up_us()  # the host's, printed beside the ratios
    print(host.describe(wake_up_us) + ".", flush=True)
    if args.slow:
        rates: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for config in ("sync", "pool-first", "pool-default"):
                for with_slow in (False, True):
                    key = f"{config} {'with' if with_slow else 'without'} slow env"
                    rates.setdefault(key, []).append(fast_rate(config, with_slow, args))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items()), flush=True)
        for config in ("sync", "pool-first", "pool-default"):
            kept = [
                w / wo for w, wo in zip(rates[f"{config} with slow env"], rates[f"{config} without slow env"])
            ]
            print(f"{config}: fast envs keep {', '.join(f'{k:.0%}' for k in kept)} of their rate (per round)")
        return
    import torch

    torch.manual_seed(0)
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    agent = nature_cnn((4, 84, 84), 6).eval()  # CleanRL's Atari agent: the actor (the critic costs the same)
    configs = args.configs.split(",")
    figures: dict[str, list[tuple[float, float]]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for config in configs if r % 2 == 0 else configs[::-1]:
            figures[config].append(measure(config, agent, args))
        print(
            f"round {r + 1}: "
            + ", ".join(f"{c} {v[-1][0]:,.0f} steps/s {v[-1][1]:.2f} cpu-ms" for c, v in figures.items()),
            flush=True,
        )
    print(
        f"\nn: sync {args.batch} envs, pool {args.pool} envs batch {args.batch}; torch threads {torch.get_num_threads()}"
    )
    for c, v in figures.items():
        rates_c, cpus = [x[0] for x in v], [x[1] for x in v]
        line = f"{c:>11}: {statistics.median(rates_c):,.0f} steps/s (rounds {min(rates_c):,.0f}-{max(rates_c):,.0f}), "
        print(
            line
            + f"CPU {statistics.median(cpus):.2f} ms per env step (rounds {min(cpus):.2f}-{max(cpus):.2f})"
        )
        if c != "sync" and "sync" in figures:
            ratios = [a[0] / b[0] for a, b in zip(v, figures["sync"])]
            cpu_ratios = [a[1] / b[1] for a, b in zip(v, figures["sync"])]
            print(
                f"{'':>11}  vs sync per round: {', '.join(f'{x:.2f}x' for x in ratios)}; "
                f"CPU per step {', '.join(f'{x:.2f}x' for x in cpu_ratios)}"
            )


if __name__ == "__main__":
    main()
