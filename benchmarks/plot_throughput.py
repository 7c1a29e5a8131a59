"""Figures of env steps/s against the workload: DummyVecEnv against ShmVecEnv as the env's work per step
grows (``crossover/work_*.json``), every backend against n_envs (``matrix.json``), and the Ray
backend, with what crosses its network per frame (``ray_backend.json``)."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
from plot_common import NAMES, RESULTS, bars, plt, read_bench, read_result, save, steps_at


def crossover(out: Path) -> None:
    """Choosing a VecEnv: DummyVecEnv and ShmVecEnv against the env's CPU work per step
    (``crossover/work_*.json``)."""
    points = []
    for path in sorted((RESULTS / "crossover").glob("work_*us.json"), key=lambda p: int(p.stem[5:-2])):
        steps = steps_at(read_bench(f"crossover/{path.name}"), 8)
        points.append((int(path.stem[5:-2]), steps["dummy"], steps["shm"]))
    fig, ax = plt.subplots(figsize=(7, 3.4))
    work = [p[0] for p in points]
    for i, name in ((1, "dummy"), (2, "shm")):
        s = [p[i] for p in points]
        ax.plot(work, [v.median for v in s], marker="o", label=NAMES[name])
        ax.fill_between(work, [v.ci_low for v in s], [v.ci_high for v in s], alpha=0.2)
    ax.set_yscale("log")
    ax.set_xlabel("CPU work per env step, µs (on top of the env's own ~15-20 µs)")
    ax.set_ylabel("env steps/s (median, 95% CI)")
    ax.set_title("Synthetic 84x84x4 frames, 8 envs, 2 CPUs: where the crossover is", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, out)


SCALE = {
    "pong_raw": "Pong raw frames",
    "synth512x512x3_1ms": "512x512x3, 1 ms a step",
    "synth84x84x4_0ms": "84x84x4, no work",
    "io_20_200ms": "waiting 20-200 ms a step",
}


def scale(out: Path) -> None:
    """Benchmarks: env steps/s against n_envs for four workloads of the matrix (``matrix.json``)."""
    matrix = read_result("matrix.json")
    cases = matrix["cases"]
    fig, axes = plt.subplots(1, len(SCALE), figsize=(12, 3.2))
    for ax, (workload, title) in zip(axes, SCALE.items()):
        for backend in ("dummy", "subproc", "async", "shm", "shm_wn"):
            rows = sorted(
                (c for c in cases if c["workload"] == workload and c["backend"] == backend),
                key=lambda c: c["n_envs"],
            )
            if rows:
                style = "-" if backend.startswith("shm") else "--"
                ax.plot(
                    [c["n_envs"] for c in rows],
                    [c["steps_per_s"] for c in rows],
                    style,
                    marker="o",
                    markersize=3,
                    label=NAMES[backend],
                )
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("n_envs", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("env steps/s (median)", fontsize=8)
    axes[-1].legend(fontsize=7)
    cpu = matrix["machine"]["cpu"]
    caption = (
        f"random actions, {cpu['count']} CPUs ({cpu['brand_raw']}), measured {matrix['datetime'][:10]}: "
        "compare ratios, not steps/s, with figures of other days"
    )
    save(fig, out, caption)


def ray_wire(out: Path) -> None:
    """Workers on a Ray cluster: bytes per observation on the wire by codec, and env steps/s of the
    local and Ray backends (``ray_backend.json``)."""
    result = read_result("ray_backend.json")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.2))
    games = list(result["wire"])
    codecs = list(result["wire"][games[0]])
    width = 0.8 / len(games)
    for i, game in enumerate(games):
        left.bar(
            np.arange(len(codecs)) + i * width, [result["wire"][game][c] for c in codecs], width, label=game
        )
    left.set_yscale("log")
    left.set_xticks(np.arange(len(codecs)) + width * (len(games) - 1) / 2, codecs)
    left.set_ylabel("bytes per Atari frame")
    left.set_title("What crosses the network per frame", fontsize=10)
    left.legend(fontsize=8)
    left.grid(axis="y", alpha=0.3)
    runs = result["runs"]
    labels = {
        "local": "ShmVecEnv, local",
        "ray": "ShmVecEnv, Ray + delta",
        "ray-raw": "ShmVecEnv, Ray raw",
        "naive": "an actor per env",
    }
    keys = [k for k in labels if k in runs]
    rates = [[r[1] for r in runs[k]] for k in keys]
    bars(
        right,
        [labels[k] for k in keys],
        [statistics.median(r) for r in rates],
        [min(r) for r in rates],
        [max(r) for r in rates],
    )
    right.set_title(
        f"Pong, {result['n_envs']} envs, one machine: env steps/s (range over rounds)", fontsize=10
    )
    save(fig, out)
