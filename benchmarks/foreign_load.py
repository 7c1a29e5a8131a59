"""Under foreign load: ShmVecEnv / ShmVectorEnv against the in-process references while another
process keeps one core busy, and quiet, side by side.

    python benchmarks/foreign_load.py                        # Pong raw, n=8, 5 rounds, both loads
    python benchmarks/foreign_load.py --configs dummy,shm,shm-w4,shm-w8 --rounds 3
    python benchmarks/foreign_load.py --json benchmarks/results/foreign_load.json

The load is a busy loop pinned to the first CPU this process may use (one core of a 2-core
machine), started before each measuring window and stopped after it. Every window runs in a fresh
interpreter, configurations interleaved round by round; env steps/s of ALE Pong (raw 210x160x3
frames, random actions, fork), and each configuration's ratio to its reference (``dummy`` for the
SB3 face, ``sync`` for the Gymnasium one), the median over rounds with the range of the per-round
ratios.

Configurations: ``dummy``, ``sync`` (references); ``shm``, ``vector`` (the faces' defaults);
``shm-w<k>`` (ShmVecEnv with ``n_workers=k``); ``shm-w<k>-pin`` (and ``worker_cpus="auto"``: the
workers dealt out to the CPUs in turn); ``shm-nospin`` (``worker_spin_us=0``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = "dummy,shm,sync,vector,shm-w4,shm-w8,shm-nospin"


def _busy(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


def window(config: str, n_envs: int, seconds: float) -> float:
    """Env steps/s of one configuration in this interpreter."""
    import functools

    import ale_py
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec import ShmVecEnv, ShmVectorEnv

    gym.register_envs(ale_py)
    fns = [functools.partial(gym.make, "ALE/Pong-v5")] * n_envs
    gymnasium_face = config in ("sync", "vector")
    if config == "dummy":
        env = DummyVecEnv(fns)
    elif config == "sync":
        env = gym.vector.SyncVectorEnv(fns)
    elif config == "vector":
        env = ShmVectorEnv(fns, start_method="fork")
    elif config.startswith("shm-w"):
        k, _, pin = config[5:].partition("-")
        env = ShmVecEnv(fns, "fork", n_workers=int(k), worker_cpus="auto" if pin == "pin" else None)
    elif config == "shm-nospin":
        env = ShmVecEnv(fns, "fork", worker_spin_us=0)
    else:
        env = ShmVecEnv(fns, "fork")
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 6, n_envs) for _ in range(64)]
    try:
        env.reset(seed=0) if gymnasium_face else env.reset()
        for k in range(30):
            env.step(actions[k % 64])
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            env.step(actions[n % 64])
            n += 1
        return n * n_envs / (time.perf_counter() - start)
    finally:
        env.close()


def run_one(config: str, n_envs: int, seconds: float, loaded: bool) -> float:
    hog = None
    if loaded:
        hog = mp.get_context("fork").Process(target=_busy, args=(min(os.sched_getaffinity(0)),), daemon=True)
        hog.start()
    try:
        cmd = [sys.executable, __file__, "--one", config, "--n-envs", str(n_envs), "--seconds", str(seconds)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"{config} failed:\n{out.stderr[-2000:]}")
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        if hog is not None:
            hog.kill()
            hog.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=DEFAULT)
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--loads", default="loaded,quiet")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(window(args.one, args.n_envs, args.seconds))
        return
    from shmvec.bench import host

    wake_up_us = host.wake_up_us()  # the host's, printed beside the ratios
    print(host.describe(wake_up_us) + ".", flush=True)
    configs = args.configs.split(",")
    loads = args.loads.split(",")
    rates: dict[str, dict[str, list[float]]] = {load: {c: [] for c in configs} for load in loads}
    for r in range(args.rounds):
        for load in loads:
            for config in configs:
                rate = run_one(config, args.n_envs, args.seconds, load == "loaded")
                rates[load][config].append(rate)
                print(f"round {r + 1} {load:6s} {config:10s} {rate:8.0f} env steps/s", flush=True)
    rows = []
    for load in loads:
        for config in configs:
            ref = "sync" if config in ("sync", "vector") else "dummy"
            row = {"load": load, "config": config, "env_steps_per_s": statistics.median(rates[load][config])}
            if ref in rates[load]:
                ratios = [a / b for a, b in zip(rates[load][config], rates[load][ref])]
                row |= {
                    "vs": ref,
                    "ratio": statistics.median(ratios),
                    "ratio_range": [min(ratios), max(ratios)],
                }
            rows.append(row)
    print("\n| load | config | env steps/s | vs reference (per round) |\n|---|---|---|---|")
    for row in rows:
        ratio = (
            f"{row['ratio']:.2f}x {row['vs']} ({row['ratio_range'][0]:.2f}-{row['ratio_range'][1]:.2f})"
            if "ratio" in row
            else ""
        )
        print(f"| {row['load']} | {row['config']} | {row['env_steps_per_s']:,.0f} | {ratio} |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "n_envs": args.n_envs,
                    "rounds": args.rounds,
                    "rows": rows,
                    "host": {"wake_up_us": wake_up_us},
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
