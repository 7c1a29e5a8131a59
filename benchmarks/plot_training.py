"""Figures of training with shmvec: the policy in the loop (``policy_loop.json``), where a PPO run's
time goes (``ppo_zoo.json``), pool mode's policy loop (``pool_loop.md``), and the seconds PPO took to
learn a pixel task (``learning_curve.json``, for the home page)."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
from plot_common import OTHER_COLOR, RESULTS, SHM_COLOR, bars, plt, read_result, save


def time_to_threshold() -> tuple[list[str], list[float], list[float], list[float], float]:
    from learning_curve import LABELS, _runs

    from shmvec.bench import curves

    result = read_result("learning_curve.json")
    labels, med, low, high = [], [], [], []
    for config, runs in _runs(result).items():
        seconds = curves.reached(runs, result["threshold"]).seconds
        labels.append(LABELS[config].replace("SB3 PPO, ", "").replace("CleanRL PPO, ", "CleanRL, "))
        med.append(statistics.median(seconds))
        low.append(min(seconds))
        high.append(max(seconds))
    return labels, med, low, high, result["threshold"]


# Configurations of benchmarks/policy_loop.py, by what they are (its short names are its own).
POLICY_LOOP = {
    "dummy": "DummyVecEnv",
    "subproc": "SubprocVecEnv",
    "shm": "ShmVecEnv",
    "shm-stack": "ShmVecEnv(frame_stack=4)",
    "shm-pin": "ShmVecEnv(frame_stack=4, pinned)",
    "shm-sleep": "ShmVecEnv(frame_stack=4, worker_spin_us=0)",
    "shm-spin": "ShmVecEnv(pause_openmp=False)",
    "shm-late": "ShmVecEnv, OpenMP restarted late",
}


def policy_loop(out: Path) -> None:
    """Training: the policy in the loop. SB3's Atari recipe with PPO's forward pass, 8 envs
    (``policy_loop.json``): env steps/s per configuration, and the ideal multi-process VecEnv."""
    from shmvec.bench.stats import summarize
    from shmvec.bench.train import best_case

    result = read_result("policy_loop.json")
    rounds = result["rounds"]
    keys = [k for k in POLICY_LOOP if k in rounds]
    stats = [summarize([r["steps_per_s"] for r in rounds[k]]) for k in keys]
    fig, ax = plt.subplots(figsize=(8, 3.9))
    bars(
        ax,
        [POLICY_LOOP[k] for k in keys],
        [s.median for s in stats],
        [s.ci_low for s in stats],
        [s.ci_high for s in stats],
    )
    policy, env = (float(np.median([x[k] for x in rounds["dummy"]])) for k in ("policy_ms", "env_ms"))
    ideal = stats[0].median / best_case(policy + env, env, result["cpus"])
    ax.set_ylim(len(keys) - 0.5, -1.4)  # a free row at the top, for the line's label
    ax.axvline(ideal, color="black", linestyle="--", linewidth=1)
    ax.text(ideal, -0.95, "ideal multi-process VecEnv ", fontsize=8, va="center", ha="right")
    ax.set_xlabel(f"env steps/s, median and 95% CI of {result['spec']['rounds']} rounds")
    # Over the figure, not the axes: the long labels leave the axes too narrow for the title.
    fig.suptitle(
        f"PPO's forward pass + step, SB3's Atari recipe (Pong), 8 envs, {result['cpus']} CPUs", fontsize=10
    )
    save(fig, out)


def ppo_zoo(out: Path) -> None:
    """Training: where a whole PPO run's time goes, per VecEnv (``ppo_zoo.json``): rollouts
    (forward passes and env steps) and updates."""
    result = read_result("ppo_zoo.json")
    rounds = result["rounds"]
    keys = [k for k in POLICY_LOOP if k in rounds]
    rollout = [statistics.median(r["rollout_s"] for r in rounds[k]) for k in keys]
    train = [statistics.median(r["train_s"] for r in rounds[k]) for k in keys]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    y = np.arange(len(keys))
    ax.barh(y, rollout, color=SHM_COLOR, label="rollouts (policy + env steps)")
    ax.barh(y, train, left=rollout, color=OTHER_COLOR, label="PPO updates")
    ax.set_yticks(y, [POLICY_LOOP[k] for k in keys])
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds, median of {len(rounds[keys[0]])} runs")
    ax.set_title(
        f"PPO, rl-zoo3 Atari settings, {result['spec']['steps']:,} env steps, 8 envs, 2 CPUs", fontsize=10
    )
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    save(fig, out)


def pool(out: Path) -> None:
    """Gymnasium users, pool mode: env steps/s of the policy loop, sync against pool mode, per round
    (the quiet-machine run at the top of ``pool_loop.md``, the output of ``benchmarks/pool_loop.py``)."""
    import re

    text = (RESULTS / "pool_loop.md").read_text()
    first_run = text[: text.index("\n## ", text.index("## Quiet machine") + 3)]
    rounds = re.findall(r"^round \d+: (.*)$", first_run, re.M)
    rates: dict[str, list[float]] = {}
    for line in rounds:
        for name, value in re.findall(r"([\w-]+) (\d+) steps/s", line):
            rates.setdefault(name, []).append(float(value))
    labels = {
        "sync": "ShmVectorEnv, 8 envs, step()",
        "pool-first": "ShmVectorEnv pool: 16 envs, recv() 8",
        "pool-det": "ShmVectorEnv pool, fixed order",
    }
    fig, ax = plt.subplots(figsize=(8, 2.6))
    bars(
        ax,
        [labels[k] for k in rates],
        [statistics.median(v) for v in rates.values()],
        [min(v) for v in rates.values()],
        [max(v) for v in rates.values()],
    )
    ax.set_xlabel(f"env steps/s with PPO's forward pass, median and range of {len(rounds)} rounds")
    ax.set_title("Pong, CleanRL-style loop, 2 CPUs: the policy works while other envs step", fontsize=10)
    save(fig, out)
