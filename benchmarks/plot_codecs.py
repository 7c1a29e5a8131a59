"""The codecs figure: size against fidelity for each codec on Atari frames, and its cost
(``codecs_breakout.json``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from plot_common import OTHER_COLOR, SHM_COLOR, plt, read_result, save
from plot_layout import place_above


def codecs(out: Path) -> None:
    """Codecs and fidelity: size against fidelity for each codec on Atari frames, and its cost
    (``codecs_breakout.json``, written by ``shmvec codecs --json``)."""
    result = read_result("codecs_breakout.json")
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
    save(fig, out)
