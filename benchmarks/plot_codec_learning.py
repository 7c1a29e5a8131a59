"""The pictures of "Do codecs change what the agent learns?" (docs/guides/codec-learning.md), drawn
from committed results (nothing is measured); ``benchmarks/plots.py`` draws them:

    python benchmarks/plots.py codec_learning codec_eval

- ``codec_learning``: PPO's return against env steps with each codec in the training loop, per task
  (``codec_learning_TASK.json``, written by ``learning_curve.py --codec``).
- ``codec_eval``: raw-trained policies acting through each codec: the return difference (95% CI)
  and the action-change rate against the compression ratio, per task (``codec_eval_TASK.json``,
  written by ``codec_eval.py``).
"""

from __future__ import annotations

import json
import statistics
import warnings
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
TASKS = ("minigrid", "stripes")
TITLES = {
    "minigrid": "MiniGrid-Empty-Random-6x6 (56x56x3)",
    "stripes": "StripesEnv (36x36x3, 1-pixel stripes)",
}


# One colour per codec in both figures, in the order the studies list them; lines that coincide
# (a lossless codec's run is raw's, bit for bit) stay visible by their dashes.
CODEC_ORDER = ("raw", "delta", "jpeg:quality=95", "jpeg:quality=75", "jpeg:quality=50", "jpeg:quality=25")
CODEC_ORDER += ("webp:quality=75",)
_DASHES = ("-", "--", ":", "-.")


def _style(codec: str) -> dict[str, str]:
    """Colour (and line style, for curves) of ``codec`` ("raw (none)" is raw)."""
    codec = codec.removesuffix(" (none)")
    k = CODEC_ORDER.index(codec) if codec in CODEC_ORDER else len(CODEC_ORDER) + sum(map(ord, codec)) % 3
    return {"color": f"C{k}", "linestyle": _DASHES[k % len(_DASHES)]}


def _read(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def _have(prefix: str) -> list[str]:
    return [t for t in TASKS if (RESULTS / f"{prefix}_{t}.json").exists()]


def codec_learning(out: Path) -> None:
    """Mean return over seeds (band: min-max) against env steps, one line per codec, per task."""
    import learning_curve
    import matplotlib.pyplot as plt
    from plot_common import save

    from shmvec.bench import curves

    tasks = _have("codec_learning")
    fig, panels = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(panels[0], tasks):
        result = _read(f"codec_learning_{task}.json")
        runs = learning_curve._runs(result)
        end = max(r[-1][1] for seeds in runs.values() for r in seeds if r)
        grid = np.linspace(0, end, 150)
        for config, seeds in runs.items():
            lines = np.array([curves.curve(r, 1, grid, learning_curve.window(result)) for r in seeds if r])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # grid points where no seed has a value
                mean, low, high = (f(lines, axis=0) for f in (np.nanmean, np.nanmin, np.nanmax))
            name = learning_curve.label(config, True).removeprefix("codec ")
            style = _style(name)
            ax.plot(grid, mean, label=name, linewidth=1.2, **style)
            ax.fill_between(grid, low, high, alpha=0.1, color=style["color"])
        ax.axhline(result["threshold"], color="gray", linestyle=":", linewidth=0.8)
        seeds = len({r["seed"] for r in result["runs"]})
        ax.set_title(f"{TITLES[task]}: {result['steps']:,} steps, {seeds} seeds", fontsize=9)
        ax.set_xlabel("env steps")
        ax.set_ylabel(f"return (mean of last {curves.WINDOW} episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    save(fig, out)


def eval_points(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per codec: ratio, the mean over models of the return difference and its CI bounds, the
    closed- and open-loop action-change rates, and the verdicts."""
    points = []
    for codec, check in result["codecs"].items():
        reports = [m["closed_loop"][codec] for m in result["models"]]
        points.append(
            {
                "codec": codec,
                "ratio": check["compression_ratio"],
                "psnr_db": check["psnr_db"],
                "diff": statistics.fmean(r["return_difference"] for r in reports),
                "low": min(r["ci95"][0] for r in reports),
                "high": max(r["ci95"][1] for r in reports),
                "spread": statistics.fmean(r["raw_spread"] for r in reports),
                "closed_change": statistics.fmean(r["action_change_rate"] for r in reports),
                "open_change": statistics.fmean(r["open_loop"]["action_change_rate"] for r in reports),
                "verdicts": [r["verdict"] for r in reports],
            }
        )
    return points


def codec_eval(out: Path) -> None:
    """Return difference (CI: lowest to highest bound over models) and action changes against ratio."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter
    from plot_common import save

    tasks = _have("codec_eval")
    fig, panels = plt.subplots(2, len(tasks), figsize=(5 * len(tasks), 6), squeeze=False)
    for k, task in enumerate(tasks):
        result = _read(f"codec_eval_{task}.json")
        points = eval_points(result)
        top, bottom = panels[0][k], panels[1][k]
        for p in points:
            color = _style(p["codec"])["color"]
            top.errorbar(p["ratio"], p["diff"], yerr=[[p["diff"] - p["low"]], [p["high"] - p["diff"]]],
                         fmt="o", color=color, capsize=3, label=p["codec"])  # fmt: skip
            bottom.scatter(p["ratio"], 100 * p["closed_change"], color=color, marker="o")
            bottom.scatter(p["ratio"], 100 * p["open_change"], color=color, marker="x")
        spread = statistics.fmean(p["spread"] for p in points)
        top.axhspan(-spread, spread, color="gray", alpha=0.15, label="raw SD over episodes")
        top.axhline(0, color="gray", linewidth=0.6)
        top.set_title(
            f"{TITLES[task]}: {len(result['seeds'])} models x {result['episodes']} episodes", fontsize=9
        )
        top.set_ylabel("return difference (decoded - raw)")
        bottom.set_ylabel("actions changed, % (o closed, x open loop)")
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # 3x10^1 and 4x10^1 would run into each other
            ax.grid(alpha=0.3, which="both")
        bottom.set_xlabel("compression ratio (raw / encoded bytes), log scale")
        top.legend(fontsize=7, loc="best")
    save(fig, out)


def eval_markdown(task: str) -> str:
    """The table under the closed-loop figure: per codec, its ratio and PSNR, the return difference
    and the action-change rates over the raw-trained models, and their verdicts."""
    result = _read(f"codec_eval_{task}.json")
    lines = [
        "| codec | ratio | PSNR dB | return difference, mean (95% CI over the models' intervals) | "
        "actions changed: closed loop | open loop | verdicts (models) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in eval_points(result):
        psnr = "exact" if p["psnr_db"] is None else f"{p['psnr_db']:.1f}"
        verdicts = ", ".join(
            f"{v} {p['verdicts'].count(v)}" for v in ("within", "unclear", "outside") if v in p["verdicts"]
        )
        lines.append(
            f"| {p['codec']} | {p['ratio']:,.1f}x | {psnr} | {p['diff']:+.3f} ({p['low']:+.3f} to {p['high']:+.3f}) | "
            f"{p['closed_change']:.1%} | {p['open_change']:.1%} | {verdicts} |"
        )
    spread = statistics.fmean(p["spread"] for p in eval_points(result))
    lines += [
        "",
        f"{result['task']}: {len(result['seeds'])} raw-trained models (seeds {', '.join(map(str, result['seeds']))}), "
        f"{result['episodes']} paired episodes each (reset seeds 10,000 on), greedy actions; raw returns' "
        f"SD over episodes {spread:.3f} (mean over models). Ratio and PSNR: {result['frames']} random-action "
        "frames. Verdict per model: within (the CI lies inside +- the raw SD), outside (wholly beyond "
        "it), unclear.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # the tables: python benchmarks/plot_codec_learning.py
    for task in _have("codec_eval"):
        (RESULTS / f"codec_eval_{task}.md").write_text(eval_markdown(task))
        print(RESULTS / f"codec_eval_{task}.md")
