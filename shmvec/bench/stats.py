"""Summary statistics of repeated measurements: median and a bootstrap 95% confidence interval."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Bootstrap resamples for the CI; seeded so a report rendered twice from the same JSON is identical.
_RESAMPLES = 2000
_SEED = 0


@dataclass(frozen=True)
class Summary:
    """Median of the samples with a 95% CI of the median (percentile bootstrap).

    With 3 samples a bootstrap CI of the median is close to the sample range: it says how far apart
    the repeats were, not more. ``rel_spread`` is (max - min) / median.
    """

    median: float
    ci_low: float
    ci_high: float
    rel_spread: float
    n: int


def summarize(samples: Sequence[float]) -> Summary:
    """Median and bootstrap 95% CI of ``samples`` (at least one)."""
    x = np.asarray(samples, dtype=float)
    med = float(statistics.median(x.tolist()))
    if len(x) == 1:
        return Summary(med, med, med, 0.0, 1)
    rng = np.random.default_rng(_SEED)
    medians = np.median(rng.choice(x, size=(_RESAMPLES, len(x)), replace=True), axis=1)
    lo, hi = np.percentile(medians, [2.5, 97.5])
    spread = float((x.max() - x.min()) / med) if med else 0.0
    return Summary(med, float(lo), float(hi), spread, len(x))


def overlaps(a: Summary, b: Summary) -> bool:
    """Whether the two confidence intervals overlap (the difference is not established)."""
    return a.ci_low <= b.ci_high and b.ci_low <= a.ci_high
