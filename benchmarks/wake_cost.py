"""What a worker's sleep-and-wake cycle costs on this machine, apart from the env's own step.

    python benchmarks/wake_cost.py                   # 3 rounds, 3 s per measurement
    python benchmarks/wake_cost.py --rounds 5 --seconds 5

The many-core stand-in of ``benchmarks/scale.py`` (envs that sleep 2 ms, one worker each) is limited
on a 2-core VM by the CPU the workers spend per env step. This separates that CPU into the env's own
step and the worker's cycle around it, in steady state (start-up and close left out):

- ``alone``: the synthetic 84x84x4 env stepped in this process, CPU per step (``time.process_time``);
- ``worker``: the same env as the only env of a ShmVecEnv with one worker, the worker's CPU per env
  step (``/proc/<pid>/stat``) and the main process's per batch;
- ``stand-in``: 64 sleeping envs in 64 workers, the workers' CPU per env step, env steps/s, and how
  the machine's time split meanwhile (``/proc/stat``: user, system, idle, steal).

Each as ``0 ms`` (no sleep) and ``2 ms`` (a 2 ms ``time.sleep`` per step). The fork start method; every
measurement in a fresh interpreter, rounds interleaved; medians with the range over rounds.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

SLEEP_S = 0.002
WARM_UP = 200


def _env_fn(sleep: bool) -> Any:
    from shmvec.synthetic import SyntheticImageEnv

    return functools.partial(SyntheticImageEnv, (84, 84, 4), io_s=(SLEEP_S, SLEEP_S) if sleep else None)


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU of ``pids`` so far, in seconds."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _machine() -> list[int]:
    """The first line of /proc/stat: user, nice, system, idle, iowait, irq, softirq, steal (ticks)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def _alone(sleep: bool, seconds: float) -> dict[str, float]:
    env = _env_fn(sleep)()
    env.reset(seed=0)
    for _ in range(WARM_UP):
        env.step(0)
    n, cpu, start = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(0)
        n += 1
    return {"cpu_us_per_env_step": (time.process_time() - cpu) / n * 1e6}


def _vec(sleep: bool, n_envs: int, seconds: float) -> dict[str, float]:
    import numpy as np

    from shmvec import ShmVecEnv

    env = ShmVecEnv([_env_fn(sleep)] * n_envs, n_workers=n_envs, start_method="fork")
    try:
        env.reset()
        actions = np.zeros(n_envs, dtype=np.int64)
        for _ in range(WARM_UP):
            env.step(actions)
        pids = [p.pid for p in env._eng.transport.processes]
        workers, main, machine = _cpu_s(pids), time.process_time(), _machine()
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            env.step(actions)
            n += 1
        wall = time.perf_counter() - start
        workers, main = _cpu_s(pids) - workers, time.process_time() - main
        spent = [b - a for a, b in zip(machine, _machine())]
    finally:
        env.close()
    total = sum(spent)
    return {
        "workers_cpu_us_per_env_step": workers / (n * n_envs) * 1e6,
        "main_cpu_us_per_batch": main / n * 1e6,
        "env_steps_per_s": n * n_envs / wall,
        "user_pct": 100 * (spent[0] + spent[1]) / total,
        "system_pct": 100 * (spent[2] + spent[5] + spent[6]) / total,
        "idle_pct": 100 * (spent[3] + spent[4]) / total,
        "steal_pct": 100 * spent[7] / total,
    }


def measure(kind: str, sleep: bool, seconds: float) -> dict[str, float]:
    """One measurement in this interpreter."""
    if kind == "alone":
        return _alone(sleep, seconds)
    return _vec(sleep, 1 if kind == "worker" else 64, seconds)


KINDS = [(kind, sleep) for kind in ("alone", "worker", "stand-in") for sleep in (False, True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, sleep = json.loads(args.one)
        print(json.dumps(measure(kind, sleep, args.seconds)))
        return
    samples: dict[tuple[str, bool], list[dict[str, float]]] = {k: [] for k in KINDS}
    for r in range(args.rounds):
        for kind, sleep in KINDS:
            one = ["--one", json.dumps([kind, sleep]), "--seconds", str(args.seconds)]
            cmd = [sys.executable, __file__, *one]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
            samples[kind, sleep].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    for (kind, sleep), runs in samples.items():
        cells = []
        for key in runs[0]:
            values = [run[key] for run in runs]
            cells.append(f"{key} {statistics.median(values):,.1f} ({min(values):,.1f}-{max(values):,.1f})")
        print(f"{kind:8} {'2 ms' if sleep else '0 ms'}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
