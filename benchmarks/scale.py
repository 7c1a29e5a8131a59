"""How the main process's cost grows with workers and envs, and a many-core stand-in on 2 cores.

    python benchmarks/scale.py                      # both parts, 3 rounds, writes the JSON + plot
    python benchmarks/scale.py --part cpu --rounds 5
    python benchmarks/scale.py --plot-only          # redraw docs/img/main_cpu.png from the JSON
    python benchmarks/scale.py --part cpu --against /tmp/old   # shmvec of another checkout, side by side

**CPU part.** Synthetic 84x84x4 uint8 frames, 0 ms steps, random actions: the main process's CPU time
(``time.process_time()``, user + system) per batch step and per env step, for ShmVecEnv,
ShmVectorEnv (synchronous, and pool mode with half the envs per batch), SubprocVecEnv,
AsyncVectorEnv and DummyVecEnv, over n_envs 8-256 and n_workers 2-64. On a 2-core machine the
workers of a configuration share the cores with the main process, so its wall time says little; its
CPU time per batch is what would limit it on a machine with a core per worker.

**Stand-in part.** Envs that sleep 2 ms per step use no CPU, so each worker stands in for a core of a
bigger machine: 64 envs in 64 workers and 128 envs in 32 workers, env steps/s reported as a fraction
of the ideal (envs / the sleep time per batch: envs per worker x 2 ms). How far a machine lets
sleeping envs get at all is the ``free`` row: the same 64 envs each stepped on its own by a process
of its own, no VecEnv and no batches (on a virtual machine a sleep costs CPU: its wake-up, on cold
caches).

Every configuration runs in an interpreter of its own (fork start method), rounds interleaved. The
workers' CPU per env step (``workers_cpu_us_per_env_step``, 0 for DummyVecEnv, whose envs step in
the main process) is read when they have ended, so it includes their start-up and close.
Results: ``benchmarks/results/scale.json``; plot: ``docs/img/main_cpu.png``.

``--against DIR`` runs every shmvec configuration a second time with ``PYTHONPATH=DIR`` (a checkout
of another commit, e.g. ``git worktree add /tmp/old 04f8025``), interleaved with this tree's, and
prints the ratio of the medians with the range of the per-round ratios; the JSON goes to
``benchmarks/results/scale_against.json`` and no plot is drawn.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "scale.json"
PLOT = ROOT / "docs" / "img" / "main_cpu.png"
SHAPE = (84, 84, 4)

# (vec env, n_envs, n_workers); n_workers None for those with one process per env or none.
CPU_CONFIGS: list[tuple[str, int, int | None]] = [
    *[("shm", n, w) for n, w in ((8, 2), (32, 2), (128, 2), (32, 16), (128, 32), (64, 64), (256, 64))],
    *[("shm-vector", n, w) for n, w in ((8, 2), (128, 32), (64, 64))],
    *[("shm-pool", n, w) for n, w in ((8, 2), (128, 32), (64, 64))],
    *[("subproc", n, None) for n in (8, 32)],
    *[("async", n, None) for n in (8, 32)],
    *[("dummy", n, None) for n in (8, 32, 128)],
]
STANDIN_CONFIGS: list[tuple[str, int, int | None]] = [
    *[(v, 64, 64) for v in ("shm", "shm-vector", "subproc", "async", "free")],
    *[(v, 128, 32) for v in ("shm", "shm-vector")],
]
SLEEP_S = 0.002


def _env_fn(sleep: bool) -> Any:
    from shmvec.synthetic import SyntheticImageEnv

    io = (SLEEP_S, SLEEP_S) if sleep else None
    return functools.partial(SyntheticImageEnv, SHAPE, io_s=io)


def measure(kind: str, n_envs: int, n_workers: int | None, sleep: bool, seconds: float) -> dict[str, Any]:
    """One configuration in this interpreter: main CPU per batch, env steps/s."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from shmvec import ShmVecEnv, ShmVectorEnv

    fns = [_env_fn(sleep)] * n_envs
    if kind == "free":
        return _free_running(fns, seconds)
    pool = kind == "shm-pool"
    # The workers' CPU (user + system) as the kernel counts reaped children: known after close().
    children = os.times()
    if kind in ("shm", "shm-portable"):  # shm-portable: the portable transport (not in the default plan)
        transport = "portable" if kind == "shm-portable" else "auto"
        env: Any = ShmVecEnv(fns, "fork", n_workers=n_workers, transport=transport)
    elif kind in ("shm-vector", "shm-pool"):
        batch = n_envs // 2 if pool else None
        env = ShmVectorEnv(fns, start_method="fork", n_workers=n_workers, batch_size=batch)
    elif kind == "subproc":
        env = SubprocVecEnv(fns, "fork")
    elif kind == "async":
        env = gym.vector.AsyncVectorEnv(fns, shared_memory=True, context="fork")
    else:
        env = DummyVecEnv(fns)
    gymnasium_face = kind in ("shm-vector", "shm-pool", "async")
    per_batch = n_envs // 2 if pool else n_envs
    actions = np.zeros(per_batch, np.int64)

    def step() -> None:
        if pool:
            env.recv()
            env.send(actions)
        elif gymnasium_face:
            env.step(actions)
        else:
            env.step(actions)

    try:
        if pool:
            env.async_reset(seed=0)
        elif gymnasium_face:
            env.reset(seed=0)
        else:
            env.reset()
        for _ in range(30):  # warm-up: fresh pages, caches
            step()
        n, start, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            step()
            n += 1
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        env.close()
    after = os.times()
    workers_cpu = (
        after.children_user + after.children_system - children.children_user - children.children_system
    )
    return {
        "main_cpu_us_per_batch": cpu / n * 1e6,
        "main_cpu_us_per_env_step": cpu / n / per_batch * 1e6,
        "env_steps_per_s": n * per_batch / wall,
        # Start-up, warm-up and close included: an upper bound of a measured step's share.
        "workers_cpu_us_per_env_step": workers_cpu / ((n + 30) * per_batch) * 1e6,
    }


def _step_alone(fn: Any, seconds: float, out: Any) -> None:
    env = fn()
    env.reset(seed=0)
    for _ in range(30):
        env.step(0)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(0)
        n += 1
        if terminated or truncated:
            env.reset()
    out.put(n / (time.perf_counter() - start))


def _free_running(fns: list[Any], seconds: float) -> dict[str, Any]:
    """Each env stepped by a process of its own, all at once: the machine's own limit, no VecEnv."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    children = os.times()
    procs = [ctx.Process(target=_step_alone, args=(fn, seconds, out)) for fn in fns]
    for p in procs:
        p.start()
    rates = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    after = os.times()
    rate = sum(rates)
    workers_cpu = (
        after.children_user + after.children_system - children.children_user - children.children_system
    )
    return {
        "main_cpu_us_per_batch": 0.0,
        "main_cpu_us_per_env_step": 0.0,
        "env_steps_per_s": rate,
        # Start-up included, as for the VecEnvs' workers.
        "workers_cpu_us_per_env_step": workers_cpu / (rate * seconds + 30 * len(fns)) * 1e6,
    }


def _one(
    kind: str, n_envs: int, n_workers: int | None, sleep: bool, seconds: float, tree: str | None = None
) -> dict[str, Any]:
    """The configuration in a fresh interpreter (importing the shmvec of ``tree`` when given)."""
    cmd = [sys.executable, __file__, "--one", json.dumps([kind, n_envs, n_workers, sleep, seconds])]
    env = dict(os.environ, PYTHONPATH=tree) if tree else None
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} n={n_envs} w={n_workers} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(parts: list[str], rounds: int, seconds: float, against: str | None = None) -> dict[str, Any]:
    plan = [(c, False, None) for c in CPU_CONFIGS if "cpu" in parts] + [
        (c, True, None) for c in STANDIN_CONFIGS if "standin" in parts
    ]
    if against:
        # Only shmvec differs between the trees; each of its configurations runs twice, in turn.
        plan = [p for c in plan if c[0][0].startswith("shm") for p in (c, (c[0], c[1], against))]
    samples: dict[str, list[dict[str, Any]]] = {}
    for r in range(rounds):
        for (kind, n, w), sleep, tree in plan:
            key = f"{'standin' if sleep else 'cpu'}:{kind}:{n}:{w}:{'against' if tree else 'this'}"
            sample = _one(kind, n, w, sleep, seconds, tree)
            samples.setdefault(key, []).append(sample)
            print(f"round {r + 1}/{rounds} {key}: {sample}", flush=True)
    rows = []
    for key, ss in samples.items():
        part, kind, n, w, tree = key.split(":")
        row: dict[str, Any] = {
            "part": part,
            "vec_env": kind,
            "n_envs": int(n),
            "n_workers": None if w == "None" else int(w),
            "tree": against if tree == "against" else "this",
            "samples": ss,
        }
        for metric in ss[0]:
            values = [s[metric] for s in ss]
            row[metric] = statistics.median(values)
            row[f"{metric}_range"] = [min(values), max(values)]
        if part == "standin":
            # A batch takes at least each worker's envs one after the other: envs per worker x sleep.
            per_worker = -(-int(n) // (int(n) if w == "None" else int(w)))
            row["ideal_env_steps_per_s"] = int(n) / (per_worker * SLEEP_S)
            row["fraction_of_ideal"] = row["env_steps_per_s"] / row["ideal_env_steps_per_s"]
        rows.append(row)
    return {"rounds": rounds, "seconds": seconds, "cpus": len(os.sched_getaffinity(0)), "rows": rows}


def compare(data: dict[str, Any]) -> str:
    """Main CPU per batch, the other tree against this one: medians, ratio, per-round ratio range."""
    this = {
        (r["part"], r["vec_env"], r["n_envs"], r["n_workers"]): r for r in data["rows"] if r["tree"] == "this"
    }
    lines = [
        "| configuration | n_envs / n_workers | main CPU per batch, against (µs) | this tree (µs) "
        "| against / this | per-round range |",
        "|---|---|---|---|---|---|",
    ]
    for other in (r for r in data["rows"] if r["tree"] != "this"):
        key = (other["part"], other["vec_env"], other["n_envs"], other["n_workers"])
        mine = this[key]
        per_round = [
            a["main_cpu_us_per_batch"] / b["main_cpu_us_per_batch"]
            for a, b in zip(other["samples"], mine["samples"])
        ]
        lines.append(
            f"| {key[1]}{' (sleeping envs)' if key[0] == 'standin' else ''} | {key[2]} / {key[3]} "
            f"| {other['main_cpu_us_per_batch']:,.0f} | {mine['main_cpu_us_per_batch']:,.0f} "
            f"| {other['main_cpu_us_per_batch'] / mine['main_cpu_us_per_batch']:.2f}x "
            f"| {min(per_round):.2f}-{max(per_round):.2f}x |"
        )
    from shmvec.bench import host

    lines.append(f"\n{host.describe(data.get('host', {}).get('wake_up_us'))}.")
    return "\n".join(lines)


def _color(vec_env: str) -> str:
    """shmvec blue, its peers gray, the free-running processes (no VecEnv) green."""
    return "tab:green" if vec_env == "free" else "tab:blue" if vec_env.startswith("shm") else "tab:gray"


def plot(data: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 6))
    cpu = [r for r in data["rows"] if r["part"] == "cpu"]
    # SubprocVecEnv and AsyncVectorEnv run one process per env, DummyVecEnv none: n_envs alone.
    labels = [f"{r['vec_env']} {r['n_envs']}" + (f"/{r['n_workers']}" if r["n_workers"] else "") for r in cpu]
    values = [r["main_cpu_us_per_batch"] for r in cpu]
    errs = [
        [v - r["main_cpu_us_per_batch_range"][0] for v, r in zip(values, cpu)],
        [r["main_cpu_us_per_batch_range"][1] - v for v, r in zip(values, cpu)],
    ]
    colors = [_color(r["vec_env"]) for r in cpu]
    left.barh(range(len(cpu)), values, xerr=errs, color=colors)
    left.set_yticks(range(len(cpu)), labels, fontsize=8)
    left.invert_yaxis()
    left.set_xscale("log")
    left.set_xlabel("main-process CPU per batch step (µs, log)")
    left.set_title("84x84x4 frames, 0 ms steps (n_envs/n_workers)", fontsize=9)
    stand = [r for r in data["rows"] if r["part"] == "standin"]
    right.barh(
        range(len(stand)),
        [100 * r["fraction_of_ideal"] for r in stand],
        color=[_color(r["vec_env"]) for r in stand],
    )
    right.set_yticks(
        range(len(stand)),
        [
            f"no VecEnv: {r['n_envs']} free processes"
            if r["vec_env"] == "free"
            else f"{r['vec_env']} {r['n_envs']}/{r['n_workers']}"
            for r in stand
        ],
        fontsize=8,
    )
    right.invert_yaxis()
    right.set_xlabel("% of the ideal env steps/s")
    right.set_title("many-core stand-in: envs sleeping 2 ms per step", fontsize=9)
    fig.suptitle(f"python benchmarks/scale.py ({data['rounds']} rounds, {data['cpus']} CPUs)", fontsize=9)
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["cpu", "standin", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per run (s)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument(
        "--against", help="a checkout of another commit: its shmvec side by side with this one"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*json.loads(args.one))))
        return
    if args.plot_only:
        plot(json.loads(args.json.read_text()))
        return
    parts = ["cpu", "standin"] if args.part == "both" else [args.part]
    if len(parts) < 2 and not args.against and args.json == RESULTS:
        parser.error(f"--part {args.part} needs --json: {RESULTS.name} keeps the full run the docs show")
    from shmvec.bench import host

    wake_up_us = host.wake_up_us()  # the host's, beside the ratios
    data = run(parts, args.rounds, args.seconds, args.against)
    data["host"] = {"wake_up_us": wake_up_us}
    if args.against:
        path = args.json.with_name("scale_against.json") if args.json == RESULTS else args.json
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(compare(data))
        print(f"wrote {path}")
        return
    args.json.write_text(json.dumps(data, indent=1) + "\n")
    if args.json != RESULTS:  # the docs' plot shows the run kept in RESULTS
        print(f"wrote {args.json}")
        return
    plot(data)
    print(f"wrote {args.json} and {PLOT}")


if __name__ == "__main__":
    main()
