"""What every figure of benchmarks/plots.py draws with: the committed results in
benchmarks/results/ read, the backends' display names and shmvec's colour, horizontal bars with
whiskers, and a figure saved once its text reads well (:mod:`plot_layout`). Nothing is measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: the figures are files, never windows
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from plot_layout import layout_problems  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

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


def read_result(name: str) -> Any:
    """The JSON ``benchmarks/results/<name>``, as it was written."""
    return json.loads((RESULTS / name).read_text())


def read_bench(name: str) -> Any:
    """The ``shmvec bench`` result ``benchmarks/results/<name>`` (a :class:`shmvec.bench.results.BenchResult`)."""
    from shmvec.bench.report import read_json

    return read_json(RESULTS / name)


def bars(ax: Any, labels: list[str], values: list[float], low: list[float], high: list[float]) -> None:
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


def save(fig: Any, out: Path, caption: str | None = None) -> None:
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


def measured(*names: str) -> str:
    """``measured 2026-12-03`` (the days, if several): when the ``shmvec bench`` JSONs ``names`` were
    measured, for the caption of a figure whose runs could otherwise be taken for others'."""
    days = sorted({read_result(name)["machine"]["date_utc"][:10] for name in names})
    return "measured " + " and ".join(days)


def steps_at(result: Any, n_envs: int) -> dict[str, Any]:
    return {p.config.backend: p.steps_per_s for p in result.points if p.config.n_envs == n_envs}


__all__ = [
    "NAMES",
    "OTHER_COLOR",
    "RESULTS",
    "ROOT",
    "SHM_COLOR",
    "bars",
    "measured",
    "plt",
    "read_bench",
    "read_result",
    "save",
    "steps_at",
]
