"""Soak: step a ShmVecEnv in restart mode for many env steps while injecting random faults, and show
that memory stays flat and nothing leaks.

    python benchmarks/soak.py                 # 1,000,000 env steps (the issue's target)
    python benchmarks/soak.py --steps 200000  # shorter

Faults, drawn at random about every ``--fault-every`` env steps: SIGKILL of a worker from outside
(while it is idle), and an env that at its next step segfaults, aborts, calls ``os._exit``, raises,
or hangs (killed after ``--timeout`` s). Every ``--sample-every`` env steps it records the RSS of the
main process and its workers, this process's ShmVecEnv segments in /dev/shm, its open file
descriptors and worker count. At the end: whether RSS is flat (last quarter vs. the sample after
warm-up), and leaks after close (segments, processes, fds).

Not part of the test run; it prints one table and a verdict, and exits 1 if anything leaked.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import time
from collections import Counter

import gymnasium as gym
import numpy as np
import psutil
from gymnasium import spaces

from shmvec import ShmVecEnv
from shmvec.memory.ring import SEGMENT_PREFIX
from shmvec.synthetic import misbehave

FAULTS = ("kill", "segv", "abort", "exit", "raise", "hang")


class SoakEnv(gym.Env):
    """Pixel observations that change every step; misbehaves at its next step when told to."""

    action_space = spaces.Discrete(4)

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)
        self.frame = np.zeros(shape, np.uint8)
        self.fault: str | None = None
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.frame[...] = self.np_random.integers(0, 256, dtype=np.uint8)
        self.t = 0
        return self.frame.copy(), {}

    def step(self, action):
        if self.fault is not None:
            fault, self.fault = self.fault, None
            misbehave(fault)
        self.t += 1
        self.frame[self.t % self.frame.shape[0]] += np.uint8(1 + int(action))
        done = self.t >= 200
        return self.frame.copy(), 1.0, done and self.t % 2 == 0, done and self.t % 2 == 1, {}


def tree_rss(proc: psutil.Process) -> int:
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def segments() -> int:
    prefix = f"{SEGMENT_PREFIX}{os.getpid()}_"
    return sum(1 for name in os.listdir("/dev/shm") if name.startswith(prefix))


def fds() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


def workers(proc: psutil.Process) -> int:
    alive = 0
    for child in proc.children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                alive += 1
        except psutil.NoSuchProcess:
            pass
    return alive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="env steps in total (default 1,000,000)")
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--n-workers", type=int, default=4)
    parser.add_argument("--shape", default="84,84,4", help="observation shape (default 84,84,4)")
    parser.add_argument("--fault-every", type=int, default=5_000, help="mean env steps between faults")
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds before a hung env is killed")
    parser.add_argument("--sample-every", type=int, default=50_000, help="env steps between samples")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from multiprocessing import resource_tracker

    logging.getLogger("shmvec").setLevel(logging.ERROR)  # one warning per restart: counted instead
    resource_tracker.ensure_running()  # lives for the whole process: not part of the leak count
    me = psutil.Process()
    rng = np.random.default_rng(args.seed)
    shape = tuple(int(s) for s in args.shape.split(","))
    gc.collect()
    fds_before = fds()
    env = ShmVecEnv(
        [lambda: SoakEnv(shape)] * args.n_envs,
        "fork",
        n_workers=args.n_workers,
        on_crash="restart",
        timeout=args.timeout,
        max_restarts=1000,
        restart_window=60.0,
    )
    env.seed(args.seed)
    env.reset()
    n = args.n_envs
    vec_steps = args.steps // n
    fault_p = n / args.fault_every  # per VecEnv step
    sample_at = max(1, args.sample_every // n)
    injected: Counter[str] = Counter()
    samples = []
    restart_dones = 0
    start = time.monotonic()
    print(
        f"{'env steps':>10} {'s':>7} {'RSS MiB':>8} {'segments':>8} {'fds':>4} {'workers':>7} {'restarts':>8}"
    )
    for t in range(1, vec_steps + 1):
        if rng.random() < fault_p:
            fault = FAULTS[int(rng.integers(len(FAULTS)))]
            victim = int(rng.integers(n))
            injected[fault] += 1
            if fault == "kill":
                w = next(w for w, g in enumerate(env.worker_envs) if victim in g)
                os.kill(env.processes[w].pid, signal.SIGKILL)
            else:
                env.set_attr("fault", fault, indices=[victim])
        _, _, dones, infos = env.step(rng.integers(0, 4, n))
        restart_dones += sum(1 for i in np.flatnonzero(dones) if infos[i].get("shmvec.restarted"))
        if t % sample_at == 0 or t == vec_steps:
            row = (
                t * n,
                time.monotonic() - start,
                tree_rss(me) / 2**20,
                segments(),
                fds(),
                workers(me),
                env.n_restarts,
            )
            samples.append(row)
            print(
                f"{row[0]:>10} {row[1]:>7.1f} {row[2]:>8.1f} {row[3]:>8} {row[4]:>4} {row[5]:>7} {row[6]:>8}",
                flush=True,
            )
    elapsed = time.monotonic() - start
    restarts = env.n_restarts
    env.close()
    del env
    gc.collect()
    time.sleep(0.5)
    leaked = {"segments": segments(), "processes": workers(me), "fds": fds() - fds_before}

    rss = np.array([s[2] for s in samples])
    warm = rss[min(1, len(rss) - 1)]
    tail = rss[len(rss) * 3 // 4 :].mean()
    growth = tail - warm
    flat = growth < max(0.05 * warm, 10.0)
    print()
    print(
        f"{vec_steps * n:,} env steps in {elapsed:.0f} s ({vec_steps * n / elapsed:,.0f} env steps/s), {n} envs on {args.n_workers} workers, obs {shape} uint8"
    )
    print(
        f"faults injected: {sum(injected.values())} ({', '.join(f'{k} {v}' for k, v in sorted(injected.items()))}); worker restarts: {restarts}; episodes ended by a restart: {restart_dones}"
    )
    print(
        f"RSS (main + workers): after warm-up {warm:.1f} MiB, last quarter mean {tail:.1f} MiB, max {rss.max():.1f} MiB -> {'flat' if flat else 'GROWING'} ({growth:+.1f} MiB)"
    )
    print(
        f"during the run: segments {min(s[3] for s in samples)}..{max(s[3] for s in samples)}, fds {min(s[4] for s in samples)}..{max(s[4] for s in samples)}, workers {min(s[5] for s in samples)}..{max(s[5] for s in samples)}"
    )
    print(
        f"after close: leaked segments {leaked['segments']}, processes {leaked['processes']}, fds {leaked['fds']}"
    )
    ok = flat and leaked["segments"] == 0 and leaked["processes"] == 0 and leaked["fds"] <= 0
    print("OK: memory flat, no leaks" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
