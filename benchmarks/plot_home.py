"""The home page's and README's figure: SB3's Atari recipe, Pong on Gymnasium's API against EnvPool,
and the seconds PPO took to learn a pixel task, side by side."""

from __future__ import annotations

from pathlib import Path

from plot_atari import ATARI_NAMES, atari_medians
from plot_common import NAMES, bars, measured, plt, read_bench, read_result, save, steps_at
from plot_training import time_to_threshold


def home(out: Path) -> None:
    """Home page and README: env steps/s of SB3's Atari recipe on Pong (``atari.json``), of Pong on
    Gymnasium's API against EnvPool (``peers_pong8.json``), and the time PPO took to learn a pixel
    task (``learning_curve.json``)."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    recipe = atari_medians(read_result("atari.json"), "pong", 8, "steps_per_s")
    keys = ["dummy", "subproc", "envpool", "ale-vec", "shm-stack"]
    bars(axes[0], [ATARI_NAMES[k] for k in keys], *zip(*[recipe[k] for k in keys]))
    axes[0].set_title("SB3's Atari recipe, Pong, 8 envs:\nenv steps/s", fontsize=10)
    peers = steps_at(read_bench("peers_pong8.json"), 8)
    keys = ["envpool", "async", "sync", "shm-vector"]
    bars(
        axes[1],
        [NAMES[k] for k in keys],
        *zip(*[(peers[k].median, peers[k].ci_low, peers[k].ci_high) for k in keys]),
    )
    axes[1].set_title("Pong raw frames, 8 envs, Gymnasium API:\nenv steps/s", fontsize=10)
    labels, med, low, high, threshold = time_to_threshold()
    bars(axes[2], labels, med, low, high)
    axes[2].set_title(f"PPO on MiniGrid pixels:\nseconds to return {threshold:g}", fontsize=10)
    for ax in axes:
        ax.tick_params(labelsize=8)
    caption = (
        f"2 CPU cores; Atari recipe measured {read_result('atari.json')['started'][:10]}, "
        f"Gymnasium API {measured('peers_pong8.json')[9:]}; bars: median, whiskers: range over rounds "
        "or 95% CI (Gymnasium API) or range over 5 seeds (seconds)"
    )
    save(fig, out, caption)
