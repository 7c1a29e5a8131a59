"""Figures of benchmarks/atari.py's results (``atari.json``): SB3's Atari recipe on Pong per VecEnv."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
from plot_common import SHM_COLOR, plt, read_result, save

# Configurations of benchmarks/atari.py, by what they are.
ATARI_NAMES = {
    "ale-vec": "ALE AtariVectorEnv",
    "ale-vec-async": "ALE AtariVectorEnv, async",
    "envpool": "EnvPool",
    "shm-stack": "ShmVecEnv(frame_stack=4)",
    "shm": "ShmVecEnv + VecFrameStack",
    "shm-wrappers": "ShmVecEnv, native_step=False",
    "dummy": "DummyVecEnv",
    "subproc": "SubprocVecEnv",
    "floor": "emulator alone",
}


# Peers in colours of their own (matplotlib's first default colour is shmvec's blue).
ATARI_STYLES: dict[str, dict[str, Any]] = {
    "shm": {"color": SHM_COLOR, "linestyle": "--"},
    "ale-vec": {"color": "tab:orange"},
    "ale-vec-async": {"color": "tab:brown"},
    "envpool": {"color": "tab:green"},
    "subproc": {"color": "tab:red"},
    "dummy": {"color": "tab:purple"},
    "floor": {"color": "black", "linestyle": ":"},
}


def atari_medians(result: Any, game: str, n: int, key: str) -> dict[str, tuple[float, float, float]]:
    """Per configuration of benchmarks/atari.py: median, min and max of ``key`` over the rounds."""
    table = next(t for t in result["tables"] if t["game"] == game and t["n"] == n)
    out = {}
    for config, runs in table["rows"].items():
        values = [r[key] for r in runs]
        out[config] = (statistics.median(values), min(values), max(values))
    return out


def atari(out: Path) -> None:
    """Atari at the emulator's speed: env steps/s and CPU per env step of SB3's Atari recipe on Pong
    against the number of envs, for each VecEnv and the emulator alone (``atari.json``)."""
    result = read_result("atari.json")
    ns = sorted({t["n"] for t in result["tables"] if t["game"] == "pong"})
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for config in ("shm-stack", "ale-vec", "ale-vec-async", "envpool", "shm", "subproc", "dummy", "floor"):
        for ax, key in zip(axes, ("steps_per_s", "cpu_us")):
            points = [atari_medians(result, "pong", n, key).get(config) for n in ns]
            if any(p is None for p in points) or (config == "floor" and key == "steps_per_s"):
                continue
            med, low, high = zip(*points)
            style = ATARI_STYLES.get(config, {"color": SHM_COLOR, "linewidth": 2.5})
            ax.errorbar(ns, med, yerr=[np.subtract(med, low), np.subtract(high, med)], marker="o",
                        markersize=4, capsize=3, label=ATARI_NAMES[config], **style)  # fmt: skip
    axes[0].set_title("Pong, SB3's Atari recipe: env steps/s", fontsize=10)
    axes[1].set_title("CPU per env step, whole process tree (µs)", fontsize=10)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("envs", fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[0].set_ylim(bottom=0)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    caption = (
        f"2 CPU cores, random actions, measured {result['started'][:10]}; median of 3 rounds, whiskers: range"
    )
    save(fig, out, caption)
