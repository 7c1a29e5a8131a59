"""The docs' pictures, drawn from the committed results in benchmarks/results/ (nothing is measured).

    python benchmarks/plots.py            # every figure into docs/img/
    python benchmarks/plots.py home crossover --out /tmp/img

One function per figure, in the plot_*.py modules beside this script (:data:`SOURCES` says which;
plot_common.py holds what they share); each reads the JSON files named in its docstring. The pages show the
command under each picture. To change a figure's numbers, re-run the benchmark that wrote its JSON
(the page says which), then this script.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the figures' modules, and learning_curve for its JSON

# Figure name (its PNG's, and the argument that draws it) -> the module of benchmarks/ whose function
# of the same name draws it. A new figure is one line here.
SOURCES = {
    "home": "plot_home",
    "atari": "plot_atari",
    "policy_loop": "plot_training",
    "ppo_zoo": "plot_training",
    "crossover": "plot_throughput",
    "scale": "plot_throughput",
    "ray_wire": "plot_throughput",
    "pool": "plot_training",
    "codecs": "plot_codecs",
    "codec_learning": "plot_codec_learning",
    "codec_eval": "plot_codec_learning",
}
FIGURES: dict[str, Callable[[Path], None]] = {
    name: getattr(importlib.import_module(module), name) for name, module in SOURCES.items()
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
