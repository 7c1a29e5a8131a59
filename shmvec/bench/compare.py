"""Figures side by side: each configuration's env steps/s and CPU per env step against a base
configuration's, round by round.

The configurations of one round were measured one right after another, so the ratio of two of them
within a round shrugs off slow drift of the machine that a ratio of medians over rounds would carry.
``shmvec bench --recipe`` (:meth:`shmvec.bench.results.BenchResult.side_by_side`) and
``benchmarks/atari.py`` both report this way.
"""

from __future__ import annotations

import statistics
from typing import Any

#: The figures compared: env steps per second, and CPU µs of the whole process tree per env step.
KEYS = ("steps_per_s", "cpu_us")


def side_by_side(runs: dict[str, list[dict[str, float]]], base: str | None) -> list[dict[str, Any]]:
    """One row per configuration, in the order of ``runs``.

    :param runs: per configuration label, one dict per round with ``"steps_per_s"`` (env steps/s) and
        ``"cpu_us"`` (CPU µs per env step).
    :param base: the label the ratios are taken against (None, or a label not in ``runs``: no ratios).
    :returns: ``{"label", "steps_per_s", "cpu_us", "steps_per_s_ratio", "cpu_us_ratio"}`` per
        configuration: the figures per round, and their ratios to ``base``'s of the same round (None
        without a base).
    """
    rows = []
    for label, rounds in runs.items():
        row: dict[str, Any] = {"label": label}
        for key in KEYS:
            row[key] = [r[key] for r in rounds]
            row[f"{key}_ratio"] = (
                [r[key] / b[key] for r, b in zip(rounds, runs[base])] if base in runs else None
            )
        rows.append(row)
    return rows


def spread(values: list[float] | None, ratio: bool = False) -> str:
    """``"7,000 (6,900-7,100)"``: the median and range of ``values``; ``"1.05x (1.01-1.10)"`` for
    ratios; ``""`` for none."""
    if not values:
        return ""
    if ratio:
        return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def cells(row: dict[str, Any], figure_ranges: bool = True) -> list[str]:
    """A row of :func:`side_by_side` as table cells: label, steps/s, its ratio, CPU µs, its ratio;
    each a median and range (the figures' medians only without ``figure_ranges``)."""
    out = [row["label"]]
    for key in KEYS:
        figure = spread(row[key]) if figure_ranges else f"{statistics.median(row[key]):,.0f}"
        out += [figure, spread(row[f"{key}_ratio"], ratio=True)]
    return out
