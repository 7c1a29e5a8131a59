"""Learning curves: the episodes a training run finished, with when they finished, turned into mean
return against wall-clock time and against env steps, over seeds.

An episode is ``(seconds, env_steps, return)``: seconds since the run started (the VecEnv's
construction included, as a user waits for it), env steps taken by then over all envs, and the
episode's undiscounted return. A run's curve at ``x`` is the mean return of its last ``window``
episodes finished by ``x``; over seeds the plot shows the mean of those curves and their range
(min-max), and :func:`time_to` says when each seed's curve first reached a threshold.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Episode = tuple[float, int, float]  # (seconds since the start, env steps by then, return)
WINDOW = 50  # episodes per point of a curve


def sb3_recorder(episodes: list[Episode], start: float) -> Any:
    """An SB3 callback that appends ``(seconds, num_timesteps, return)`` to ``episodes`` for every
    episode a ``Monitor``-wrapped env finishes (its ``info["episode"]``).

    :param start: ``time.perf_counter()`` when the run started.
    """
    import time

    from stable_baselines3.common.callbacks import BaseCallback

    class _Recorder(BaseCallback):
        def _on_step(self) -> bool:
            now = time.perf_counter() - start
            for info in self.locals["infos"]:
                if "episode" in info:
                    episodes.append((now, self.num_timesteps, float(info["episode"]["r"])))
            return True

    return _Recorder()


def curve(episodes: Sequence[Episode], axis: int, grid: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """The mean return of the last ``window`` episodes finished by each point of ``grid``.

    :param axis: 0 for seconds, 1 for env steps.
    :returns: one value per grid point; NaN before ``min(window, 10)`` episodes have finished (the
        first few are the short ones: their mean says little). After the run's last episode the
        value stays: a run that ended sooner has its final return while the others still train.
    """
    xs = np.array([e[axis] for e in episodes], dtype=float)
    returns = np.array([e[2] for e in episodes], dtype=float)
    sums = np.concatenate([[0.0], np.cumsum(returns)])
    done = np.searchsorted(xs, grid, side="right")  # episodes finished by each grid point
    first = np.maximum(done - window, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (sums[done] - sums[first]) / (done - first)
    return np.where(done >= min(window, 10), means, np.nan)


def time_to(episodes: Sequence[Episode], threshold: float, window: int = WINDOW) -> Episode | None:
    """The first episode at which the mean return of the last ``window`` episodes (fewer at the
    start: at least ``min(window, 10)``) reached ``threshold``; None if it never did."""
    returns = [e[2] for e in episodes]
    for i in range(min(window, 10) - 1, len(episodes)):
        recent = returns[max(0, i + 1 - window) : i + 1]
        if statistics.fmean(recent) >= threshold:
            return episodes[i]
    return None


@dataclass
class Reached:
    """When the seeds of one configuration reached a return threshold."""

    seconds: list[float]  # one per seed that reached it
    steps: list[int]
    missed: int  # seeds that never reached it

    def describe(self) -> str:
        """``median s (min-max), median steps (min-max)``, and the seeds that missed."""
        if not self.seconds:
            return f"not reached ({self.missed} seeds)"
        s, n = self.seconds, self.steps
        text = (
            f"{statistics.median(s):.1f} s ({min(s):.1f}-{max(s):.1f}), "
            f"{statistics.median(n):,.0f} env steps ({min(n):,}-{max(n):,})"
        )
        return text + (f"; {self.missed} seeds did not reach it" if self.missed else "")


def reached(runs: Sequence[Sequence[Episode]], threshold: float, window: int = WINDOW) -> Reached:
    """:func:`time_to` for each seed's run."""
    hits = [time_to(r, threshold, window) for r in runs]
    found = [h for h in hits if h is not None]
    return Reached([h[0] for h in found], [h[1] for h in found], len(hits) - len(found))


def plot(
    runs: Mapping[str, Sequence[Sequence[Episode]]],
    path: Path,
    title: str,
    threshold: float | None = None,
    window: int = WINDOW,
    labels: Callable[[str], str] = str,
) -> None:
    """Two panels, mean return against wall-clock seconds and against env steps: per configuration
    the mean over seeds and a band from the lowest to the highest seed.

    :param runs: configuration -> one list of episodes per seed.
    :param threshold: drawn as a dotted line when given.
    :param labels: the legend's name for a configuration.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for axis, ax, xlabel in ((0, panels[0], "wall-clock seconds"), (1, panels[1], "env steps")):
        end = max(r[-1][axis] for seeds in runs.values() for r in seeds if r)
        grid = np.linspace(0, end, 200)
        for name, seeds in runs.items():
            curves = np.array([curve(r, axis, grid, window) for r in seeds if r])
            if not len(curves):
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # columns where no seed has a value
                mean, low, high = (f(curves, axis=0) for f in (np.nanmean, np.nanmin, np.nanmax))
            (line,) = ax.plot(grid, mean, label=f"{labels(name)} ({len(curves)} seeds)")
            ax.fill_between(grid, low, high, alpha=0.2, color=line.get_color(), linewidth=0)
        if threshold is not None:
            ax.axhline(threshold, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    panels[0].set_ylabel(f"mean return (last {window} episodes)")
    panels[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
