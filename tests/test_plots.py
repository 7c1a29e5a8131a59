"""The docs' pictures: each one drawn by benchmarks/plots.py (or a benchmark's --plot) from committed
results, shown on a page with the command that draws it, and every picture a page shows exists."""

from __future__ import annotations

import re
import sys

import pytest

from tests.helpers import ROOT

pytest.importorskip("matplotlib", reason='matplotlib is not installed (pip install -e ".[bench]")')
sys.path.insert(0, str(ROOT / "benchmarks"))
import plots  # noqa: E402

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Pictures drawn by something else than plots.py, and the command shown under them.
OTHER_PICTURES = {
    "pong.png": "--plot docs/img/pong.png",
    "synth512_1ms.png": "--plot docs/img/synth512_1ms.png",
    "learning_curve.png": "python benchmarks/learning_curve.py --from-json benchmarks/results/learning_curve.json",
    "main_cpu.png": "python benchmarks/scale.py --plot-only",
}


@pytest.mark.parametrize("name", sorted(plots.FIGURES))
def test_figure_draws_from_the_committed_results(name, tmp_path):
    out = tmp_path / f"{name}.png"
    plots.FIGURES[name](out)
    assert out.stat().st_size > 10_000


def test_every_picture_exists_and_shows_its_command():
    shown = set()
    for page in PAGES:
        text = page.read_text()
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text):
            path = (page.parent / image).resolve()
            assert path.exists(), f"{page.relative_to(ROOT)} shows {image}, which does not exist"
            name = path.name
            shown.add(name)
            command = OTHER_PICTURES.get(name, f"python benchmarks/plots.py {name.removesuffix('.png')}")
            assert command in text, f"{page.relative_to(ROOT)} shows {name} without `{command}`"
    drawn = {f"{name}.png" for name in plots.FIGURES} | set(OTHER_PICTURES)
    assert drawn <= shown, f"pictures no page shows: {sorted(drawn - shown)}"
    assert shown <= drawn, f"pictures nothing draws: {sorted(shown - drawn)}"
