"""A picture's text is readable: every text drawn lies inside the figure, and no two overlap.

A cut title ("seconds to return 0" for "... return 0.9") or two labels drawn over each other pass
every other test: only a look at the picture shows them. :func:`layout_problems` looks for them in
what was drawn: it draws the figure once, recording the box of each text as it is drawn (tick
labels of ticks outside the view are never drawn, so they are not counted), then compares the boxes.
``benchmarks/plots.py`` checks each figure before it saves it; ``tests/test_plots.py`` checks every
committed picture, those drawn by other commands too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from matplotlib.text import Text
from matplotlib.transforms import Bbox

# Pixels a box may reach past the figure's edge before it counts (rounding). Two boxes may not meet
# at all: a label touching a title by less than a pixel already reads as one line run into another.
SLACK_PX = 1.0


def layout_problems(fig: Any) -> list[str]:
    """What is wrong with the text of ``fig`` as drawn: texts cut by the figure's edge, and pairs of
    texts that overlap. Empty when the picture reads well."""
    with drawn_texts() as texts:
        fig.canvas.draw()
    width, height = fig.canvas.get_width_height()
    inside = Bbox.from_extents(-SLACK_PX, -SLACK_PX, width + SLACK_PX, height + SLACK_PX)
    problems = []
    for text, box in texts:
        if (
            not inside.containsx(box.x0)
            or not inside.containsx(box.x1)
            or not (inside.containsy(box.y0) and inside.containsy(box.y1))
        ):
            problems.append(f"cut by the figure's edge: {text!r} at {_where(box)} in {width}x{height} px")
    for i, (a, box_a) in enumerate(texts):
        for b, box_b in texts[i + 1 :]:
            if _overlap(box_a, box_b) > 0:
                problems.append(f"overlap: {a!r} at {_where(box_a)} and {b!r} at {_where(box_b)}")
    return problems


@contextmanager
def drawn_texts() -> Iterator[list[tuple[str, Bbox]]]:
    """While in the block: each visible, non-empty text drawn, with its box in display pixels."""
    texts: list[tuple[str, Bbox]] = []
    draw = Text.draw

    def recording(self: Text, renderer: Any) -> None:
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            texts.append((self.get_text(), self.get_window_extent(renderer)))

    Text.draw = recording  # type: ignore[method-assign]
    try:
        yield texts
    finally:
        Text.draw = draw  # type: ignore[method-assign]


def place_above(ax: Any, text: str, xy: tuple[float, float], placed: list[Bbox], renderer: Any) -> None:
    """Annotate point ``xy`` of ``ax`` with ``text`` (7 pt, centred above it) at the lowest of a few
    heights where it meets none of the boxes ``placed``, and add its box to them. Call once the axes
    have their final place (after ``tight_layout``): the label is left out of later layouts."""
    for level in range(4):
        note = ax.annotate(
            text, xy, fontsize=7, xytext=(0, 5 + 9 * level), textcoords="offset points", ha="center"
        )
        box = note.get_window_extent(renderer)
        if level == 3 or not any(box.overlaps(other) for other in placed):
            break  # the last height stays even if it meets one: layout_problems then says so
        note.remove()
    note.set_in_layout(False)
    placed.append(box)


def _overlap(a: Bbox, b: Bbox) -> float:
    """The smaller side of the two boxes' intersection, in pixels (0 if they do not meet)."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(0.0, min(w, h))


def _where(box: Bbox) -> str:
    return f"x {box.x0:.0f}..{box.x1:.0f}, y {box.y0:.0f}..{box.y1:.0f}"


__all__ = ["drawn_texts", "layout_problems", "place_above"]
