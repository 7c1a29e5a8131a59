"""The docs' pictures: each one drawn by benchmarks/plots.py (or a benchmark's --plot) from committed
results, shown on a page with the command that draws it, every picture a page shows exists, and
every committed picture's text reads well (inside the figure, no two texts over each other)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT

pytest.importorskip("matplotlib", reason='matplotlib is not installed (pip install -e ".[bench]")')
sys.path.insert(0, str(ROOT / "benchmarks"))
import plots  # noqa: E402
from plot_layout import layout_problems  # noqa: E402

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


def _draw_from_json(name: str, out: Path) -> None:
    """Draw committed picture ``name`` into ``out`` as the command shown under it does."""
    if name.removesuffix(".png") in plots.FIGURES:
        plots.FIGURES[name.removesuffix(".png")](out)
    elif name in ("pong.png", "synth512_1ms.png"):
        from shmvec.bench.report import plot, read_json

        plot(read_json(ROOT / "benchmarks" / "results" / name.replace(".png", ".json")), out)
    elif name == "learning_curve.png":
        import learning_curve

        from shmvec.bench import curves

        result = json.loads((ROOT / "benchmarks" / "results" / "learning_curve.json").read_text())
        title = f"PPO on {result['task']} (pixels), {learning_curve.N_ENVS} envs, {result['cpus']} CPUs"
        runs = learning_curve._runs(result)
        curves.plot(runs, out, title, result["threshold"], labels=lambda c: learning_curve.LABELS.get(c, c))
    elif name == "main_cpu.png":
        import scale

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(scale, "PLOT", out)
            scale.plot(json.loads(scale.RESULTS.read_text()))
    else:
        raise AssertionError(f"docs/img/{name}: no known way to draw it (add one here)")


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "docs" / "img").glob("*.png")))
def test_every_committed_picture_has_its_text_inside_and_apart(name, tmp_path, monkeypatch):
    """Each picture in docs/img, drawn again from its committed JSON: checked as it is saved."""
    from matplotlib.figure import Figure

    found: list[str] = []
    save = Figure.savefig

    def checked(fig: Figure, *args: Any, **kwargs: Any) -> None:
        found.extend(layout_problems(fig))
        save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", checked)
    _draw_from_json(name, tmp_path / name)
    assert (tmp_path / name).exists(), f"{name} was not drawn"
    assert not found, f"{name}: " + "; ".join(found)
