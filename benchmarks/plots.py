"""The docs' pictures, drawn from the committed results in benchmarks/results/ (nothing is measured).

    python benchmarks/plots.py            # every figure into docs/img/
    python benchmarks/plots.py home crossover --out /tmp/img

One function per figure; each reads the JSON files named in its docstring. The pages show the
command under each picture. To change a figure's numbers, re-run the benchmark that wrote its JSON
(the page says which), then this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))  # learning_curve, for its JSON's reading
from plot_codec_learning import FIGURES as CODEC_FIGURES  # noqa: E402
from plot_layout import layout_problems, place_above  # noqa: E402

NAMES = {
    "dummy": "DummyVecEnv",
    "subproc": "SubprocVecEnv",
    "shm": "ShmVecEnv",
    "shm-vector": "ShmVectorEnv",
    "async": "AsyncVectorEnv",
    "sync": "SyncVectorEnv",
    "envpool": "EnvPool",
    "shm_wn": "ShmVecEnv, a worker per env",
}
SHM_COLOR, OTHER_COLOR = "tab:blue", "tab:gray"


def _read(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def _bench(name: str) -> Any:
    from shmvec.bench.report import read_json

    return read_json(RESULTS / name)


def _bars(ax: Any, labels: list[str], values: list[float], low: list[float], high: list[float]) -> None:
    """Horizontal bars with error bars; shmvec's own in blue."""
    colors = [SHM_COLOR if label.startswith("Shm") else OTHER_COLOR for label in labels]
    y = np.arange(len(labels))
    err = [np.subtract(values, low), np.subtract(high, values)]
    ax.barh(y, values, xerr=err, color=colors, capsize=3)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    for i, (v, top) in enumerate(zip(values, high)):
        ax.text(top, i, f"  {v:,.0f}", va="center", ha="left", fontsize=8)
    ax.set_xlim(0, max(high) * 1.3)


def _save(fig: Any, out: Path, caption: str | None = None) -> None:
    """Lay out and write the figure, once its text reads well (:mod:`plot_layout`).

    :param caption: a gray line under the panels (how and when it was measured).
    :raises ValueError: for text cut by the figure's edge or drawn over other text.
    """
    if caption is not None:
        fig.text(0.5, 0.01, caption, ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0, 1, 1) if caption is None else (0, 0.05, 1, 1))
    problems = layout_problems(fig)
    if problems:
        plt.close(fig)
        raise ValueError(f"{out.name}: " + "; ".join(problems))
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _measured(*names: str) -> str:
    """``measured 2026-12-03`` (the days, if several): when the ``shmvec bench`` JSONs ``names`` were
    measured, for the caption of a figure whose runs could otherwise be taken for others'."""
    days = sorted({_read(name)["machine"]["date_utc"][:10] for name in names})
    return "measured " + " and ".join(days)


def _steps_at(result: Any, n_envs: int) -> dict[str, Any]:
    return {p.config.backend: p.steps_per_s for p in result.points if p.config.n_envs == n_envs}


def _time_to_threshold() -> tuple[list[str], list[float], list[float], list[float], float]:
    from learning_curve import LABELS, _runs

    from shmvec.bench import curves

    result = _read("learning_curve.json")
    labels, med, low, high = [], [], [], []
    for config, runs in _runs(result).items():
        seconds = curves.reached(runs, result["threshold"]).seconds
        labels.append(LABELS[config].replace("SB3 PPO, ", "").replace("CleanRL PPO, ", "CleanRL, "))
        med.append(statistics.median(seconds))
        low.append(min(seconds))
        high.append(max(seconds))
    return labels, med, low, high, result["threshold"]


def home(out: Path) -> None:
    """Home page and README: env steps/s of SB3's Atari recipe on Pong (``atari.json``), of Pong on
    Gymnasium's API against EnvPool (``peers_pong8.json``), and the time PPO took to learn a pixel
    task (``learning_curve.json``)."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    recipe = _atari_medians(_read("atari.json"), "pong", 8, "steps_per_s")
    keys = ["dummy", "subproc", "envpool", "ale-vec", "shm-stack"]
    _bars(axes[0], [ATARI_NAMES[k] for k in keys], *zip(*[recipe[k] for k in keys]))
    axes[0].set_title("SB3's Atari recipe, Pong, 8 envs:\nenv steps/s", fontsize=10)
    peers = _steps_at(_bench("peers_pong8.json"), 8)
    keys = ["envpool", "async", "sync", "shm-vector"]
    _bars(
        axes[1],
        [NAMES[k] for k in keys],
        *zip(*[(peers[k].median, peers[k].ci_low, peers[k].ci_high) for k in keys]),
    )
    axes[1].set_title("Pong raw frames, 8 envs, Gymnasium API:\nenv steps/s", fontsize=10)
    labels, med, low, high, threshold = _time_to_threshold()
    _bars(axes[2], labels, med, low, high)
    axes[2].set_title(f"PPO on MiniGrid pixels:\nseconds to return {threshold:g}", fontsize=10)
    for ax in axes:
        ax.tick_params(labelsize=8)
    caption = (
        f"2 CPU cores; Atari recipe measured {_read('atari.json')['started'][:10]}, "
        f"Gymnasium API {_measured('peers_pong8.json')[9:]}; bars: median, whiskers: range over rounds "
        "or 95% CI (Gymnasium API) or range over 5 seeds (seconds)"
    )
    _save(fig, out, caption)


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


def _atari_medians(result: Any, game: str, n: int, key: str) -> dict[str, tuple[float, float, float]]:
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
    result = _read("atari.json")
    ns = sorted({t["n"] for t in result["tables"] if t["game"] == "pong"})
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for config in ("shm-stack", "ale-vec", "ale-vec-async", "envpool", "shm", "subproc", "dummy", "floor"):
        for ax, key in zip(axes, ("steps_per_s", "cpu_us")):
            points = [_atari_medians(result, "pong", n, key).get(config) for n in ns]
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
    _save(fig, out, caption)


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

    result = _read("policy_loop.json")
    rounds = result["rounds"]
    keys = [k for k in POLICY_LOOP if k in rounds]
    stats = [summarize([r["steps_per_s"] for r in rounds[k]]) for k in keys]
    fig, ax = plt.subplots(figsize=(8, 3.9))
    _bars(
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
    _save(fig, out)


def crossover(out: Path) -> None:
    """Choosing a VecEnv: DummyVecEnv and ShmVecEnv against the env's CPU work per step
    (``crossover/work_*.json``)."""
    points = []
    for path in sorted((RESULTS / "crossover").glob("work_*us.json"), key=lambda p: int(p.stem[5:-2])):
        steps = _steps_at(_bench(f"crossover/{path.name}"), 8)
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
    _save(fig, out)


SCALE = {
    "pong_raw": "Pong raw frames",
    "synth512x512x3_1ms": "512x512x3, 1 ms a step",
    "synth84x84x4_0ms": "84x84x4, no work",
    "io_20_200ms": "waiting 20-200 ms a step",
}


def scale(out: Path) -> None:
    """Benchmarks: env steps/s against n_envs for four workloads of the matrix (``matrix.json``)."""
    matrix = _read("matrix.json")
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
    _save(fig, out, caption)


def ray_wire(out: Path) -> None:
    """Workers on a Ray cluster: bytes per observation on the wire by codec, and env steps/s of the
    local and Ray backends (``ray_backend.json``)."""
    result = _read("ray_backend.json")
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
    _bars(
        right,
        [labels[k] for k in keys],
        [statistics.median(r) for r in rates],
        [min(r) for r in rates],
        [max(r) for r in rates],
    )
    right.set_title(
        f"Pong, {result['n_envs']} envs, one machine: env steps/s (range over rounds)", fontsize=10
    )
    _save(fig, out)


def ppo_zoo(out: Path) -> None:
    """Training: where a whole PPO run's time goes, per VecEnv (``ppo_zoo.json``): rollouts
    (forward passes and env steps) and updates."""
    result = _read("ppo_zoo.json")
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
    _save(fig, out)


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
    _bars(
        ax,
        [labels[k] for k in rates],
        [statistics.median(v) for v in rates.values()],
        [min(v) for v in rates.values()],
        [max(v) for v in rates.values()],
    )
    ax.set_xlabel(f"env steps/s with PPO's forward pass, median and range of {len(rounds)} rounds")
    ax.set_title("Pong, CleanRL-style loop, 2 CPUs: the policy works while other envs step", fontsize=10)
    _save(fig, out)


def codecs(out: Path) -> None:
    """Codecs and fidelity: size against fidelity for each codec on Atari frames, and its cost
    (``codecs_breakout.json``, written by ``shmvec codecs --json``)."""
    result = _read("codecs_breakout.json")
    fig, ax = plt.subplots(figsize=(8, 3.8))
    exact_db = 1 + max((r["psnr_db"] for r in result["reports"] if not r["bit_exact"]), default=50)
    lossy = [r for r in result["reports"] if not r["bit_exact"]]
    exact = sorted((r for r in result["reports"] if r["bit_exact"]), key=lambda r: r["compression_ratio"])
    for r in lossy + exact:
        size = 20 + 4 * np.sqrt(r["us_per_frame"])
        color = OTHER_COLOR if r in lossy else SHM_COLOR
        ax.scatter(
            r["compression_ratio"], r["psnr_db"] if r in lossy else exact_db, s=size, color=color, alpha=0.7
        )
    ax.set_ylim(top=exact_db + 6)
    ax.axhline(exact_db, color=SHM_COLOR, linewidth=0.5, linestyle=":")
    ax.text(
        0.01, exact_db - 0.8, "bit-exact (lossless)", fontsize=8, va="top", transform=ax.get_yaxis_transform()
    )
    ax.set_xscale("log")
    ax.set_xlabel("compression ratio (raw bytes / encoded bytes), log scale")
    ax.set_ylabel("PSNR, dB (higher: closer)")
    shape = "x".join(map(str, result["frame_shape"]))
    ax.set_title(
        f"{result['env']}, {result['steps']} frames {shape}: marker area ~ µs per frame", fontsize=10
    )
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()  # the axes' final place, before the labels are placed against each other
    renderer = fig.canvas.get_renderer()
    placed = []
    for r in lossy:
        label = r["codec"] + "".join(f" {k}={v}" for k, v in r["params"].items())
        note = ax.annotate(
            label,
            (r["compression_ratio"], r["psnr_db"]),
            fontsize=7,
            xytext=(4, 3),
            textcoords="offset points",
        )
        placed.append(note.get_window_extent(renderer))
    for r in exact:  # all on one line: each name at the lowest height where it meets no other
        name = r["codec"] + (f" {r['params']['backend']}" if r["codec"] == "delta" else "")
        place_above(ax, name, (r["compression_ratio"], exact_db), placed, renderer)
    _save(fig, out)


FIGURES: dict[str, Callable[[Path], None]] = {
    "home": home,
    "atari": atari,
    "policy_loop": policy_loop,
    "ppo_zoo": ppo_zoo,
    "crossover": crossover,
    "scale": scale,
    "ray_wire": ray_wire,
    "pool": pool,
    "codecs": codecs,
    **CODEC_FIGURES,
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "figures", nargs="*", help=f"figures to draw, from {', '.join(FIGURES)} (default all)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="folder of the PNGs")
    args = parser.parse_args()
    unknown = set(args.figures) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figures {sorted(unknown)}; choose from {', '.join(FIGURES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.figures or FIGURES:
        FIGURES[name](args.out / f"{name}.png")
        print(args.out / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
