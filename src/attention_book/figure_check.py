"""Overlapping text in a matplotlib figure: tick labels that collide, a legend over a note.

A maintainer's tool, not taught in the book: the test command runs it on every figure a chapter
shows (``_figure_check_inline``, the matplotlib backend of the test kernels), so a figure whose
words cannot be read fails the chapter's test.

:func:`text_overlaps` lists every pair of visible text items of a figure whose boxes overlap:

* the tick labels along one axis (``3×10¹4×10¹`` on a crowded log axis), and tick labels of
  different axes (a colour bar's labels running into the next panel's);
* every other text item (titles, axis labels, the figure's title and axis labels, texts and
  annotations, legends as whole boxes) against each other and against every tick label.

Boxes are the items' window extents in pixels; a rotated text is its rotated rectangle, not
the larger upright box around it, so slanted tick labels that only come close are not reported.
Two boxes overlap when they share more than ``tolerance`` pixels in depth (touching is fine).
Only what is drawn counts: invisible, empty, fully transparent, and clipped-away texts are
skipped, and the ticks outside an axis's view limits are not drawn. An annotation counts by its
text (and the box drawn around it), not its arrow; a legend by its whole box.
"""

from __future__ import annotations

import dataclasses
import math
import re

__all__ = ["TextOverlap", "FigureTextOverlapError", "text_overlaps", "check_figure"]

TOLERANCE = 1.0  # pixels: boxes that share no more than this are touching, not overlapping


@dataclasses.dataclass(frozen=True)
class TextOverlap:
    """Two text items of a figure whose boxes overlap.

    Attributes:
        first: what the first item is and says, e.g. ``'legend of "Sinks"'``.
        second: the same for the second item.
        depth: how far the boxes overlap, in pixels (the smaller of the two directions).
    """

    first: str
    second: str
    depth: float

    def __str__(self) -> str:
        return f"{self.first} overlaps {self.second} (by {self.depth:.1f} px)"


class FigureTextOverlapError(ValueError):
    """A figure shows text that overlaps other text (see :func:`text_overlaps`)."""


@dataclasses.dataclass
class _Item:
    label: str
    corners: tuple[tuple[float, float], ...]  # a convex polygon, in pixels
    kind: str  # "tick" or "free"
    group: tuple  # tick labels of one axis side share a group; a free item has its own
    axes: int  # id of the Axes it belongs to (0 for the figure)

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        xs = [x for x, _ in self.corners]
        ys = [y for _, y in self.corners]
        return min(xs), min(ys), max(xs), max(ys)


def _readable(text: str) -> str:
    """A label's text as a reader sees it: mathtext like ``$\\mathdefault{3\\times10^{1}}$`` → 3×10^1."""
    text = text.replace("\\mathdefault", "").replace("\\times", "×").replace("\\cdot", "·")
    text = re.sub(r"[${}]", "", text).replace("\\", "")
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _axes_name(ax, index: int) -> str:
    for title in (ax.get_title(), ax.get_title("left"), ax.get_title("right")):
        if title.strip():
            return f'"{_readable(title)}"'
    if ax.get_label() == "<colorbar>":
        return f"the colour bar (axes {index})"
    return f"axes {index}"


def _drawn(text, renderer) -> bool:
    if not text.get_visible() or not text.get_text().strip():
        return False
    alpha = text.get_alpha()
    if alpha is not None and alpha == 0:
        return False
    from matplotlib.colors import to_rgba

    if to_rgba(text.get_color())[3] == 0:
        return False
    check_xy = getattr(text, "_check_xy", None)  # an Annotation whose point is clipped away
    if check_xy is not None and not check_xy(renderer):
        return False
    return True


def _text_corners(text, renderer):
    """The rotated rectangle of ``text`` (and of the box drawn around it), or None if clipped away."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    extent = Text.get_window_extent(text, renderer)  # the text itself, never an arrow
    patch = text.get_bbox_patch()
    if patch is not None and patch.get_visible():
        extent = Bbox.union([extent, patch.get_window_extent(renderer)])
    if text.get_clip_on():
        clip = text.get_clip_box()
        if clip is not None:
            clipped = Bbox.intersection(extent, clip)
            if clipped is None or clipped.width <= 0 or clipped.height <= 0:
                return None
    angle = text.get_rotation() % 180
    centre = ((extent.x0 + extent.x1) / 2, (extent.y0 + extent.y1) / 2)
    if min(angle, 180 - angle) < 1e-6 or abs(angle - 90) < 1e-6 or patch is not None:
        return _rectangle(extent.x0, extent.y0, extent.x1, extent.y1)
    # A slanted text: measure it upright, then turn the upright box about the shared centre
    # (a rotated rectangle and its upright bounding box have the same centre).
    rotation = text.get_rotation()
    text.set_rotation(0)
    try:
        upright = Text.get_window_extent(text, renderer)
    finally:
        text.set_rotation(rotation)
    theta = math.radians(rotation)
    cos, sin = math.cos(theta), math.sin(theta)
    half_w, half_h = upright.width / 2, upright.height / 2
    return tuple((centre[0] + dx * cos - dy * sin, centre[1] + dx * sin + dy * cos)
                 for dx, dy in ((-half_w, -half_h), (half_w, -half_h), (half_w, half_h),
                                (-half_w, half_h)))


def _rectangle(x0, y0, x1, y1):
    return ((x0, y0), (x1, y0), (x1, y1), (x0, y1))


def _collect(fig, renderer) -> list[_Item]:
    items: list[_Item] = []
    serial = iter(range(10**9))

    def add_text(text, label, kind, group, axes, owner=""):
        if not _drawn(text, renderer):
            return
        corners = _text_corners(text, renderer)
        if corners is not None:
            where = f" of {owner}" if owner else ""
            items.append(_Item(f'{label} "{_readable(text.get_text())}"{where}', corners, kind,
                               group, axes))

    def add_legend(legend, owner, axes):
        if legend is None or not legend.get_visible():
            return
        box = legend.get_window_extent(renderer)
        where = f" of {owner}" if owner else ""
        items.append(_Item(f"the legend{where}", _rectangle(box.x0, box.y0, box.x1, box.y1),
                           "free", ("free", next(serial)), axes))

    shown = [ax for ax in fig.axes if ax.get_visible()]
    for index, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        # With one panel, the error's first line names it (the figure's title) already.
        name = _axes_name(ax, index) if len(shown) > 1 else ""
        for letter, axis in (("x", getattr(ax, "xaxis", None)), ("y", getattr(ax, "yaxis", None))):
            if axis is None or not axis.get_visible():
                continue
            try:
                ticks = axis._update_ticks()  # the ticks matplotlib draws (inside the view limits)
            except Exception:  # noqa: BLE001 - an unusual axis: fall back to every tick
                ticks = axis.get_major_ticks() + axis.get_minor_ticks()
            for tick in ticks:
                for side, label in (("1", tick.label1), ("2", tick.label2)):
                    add_text(label, f"the {letter} tick label", "tick",
                             ("tick", id(ax), letter, side), id(ax), name)
            add_text(axis.label, f"the {letter} axis label", "free",
                     ("free", next(serial)), id(ax), name)
        for title in (ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None)):
            if title is not None:
                add_text(title, "the title", "free", ("free", next(serial)), id(ax), name)
        for text in ax.texts:
            add_text(text, "the text", "free", ("free", next(serial)), id(ax), name)
        add_legend(ax.get_legend(), name, id(ax))

    def add_figure(figure):
        for attribute in ("_suptitle", "_supxlabel", "_supylabel"):
            text = getattr(figure, attribute, None)
            if text is not None:
                add_text(text, f"the figure's {attribute.strip('_')}", "free",
                         ("free", next(serial)), 0)
        for text in figure.texts:
            if all(text is not getattr(figure, a, None) for a in ("_suptitle", "_supxlabel", "_supylabel")):
                add_text(text, "the figure text", "free", ("free", next(serial)), 0)
        for legend in figure.legends:
            add_legend(legend, "the figure", 0)
        for sub in getattr(figure, "subfigs", []):
            add_figure(sub)

    add_figure(fig)
    return items


def _overlap_depth(a: _Item, b: _Item, tolerance: float) -> float:
    """How far two convex polygons overlap (separating axis theorem), 0 when they do not."""
    ax0, ay0, ax1, ay1 = a.bounds
    bx0, by0, bx1, by1 = b.bounds
    if min(ax1, bx1) - max(ax0, bx0) <= tolerance or min(ay1, by1) - max(ay0, by0) <= tolerance:
        return 0.0
    depth = math.inf
    for polygon in (a.corners, b.corners):
        for i in range(len(polygon)):
            (x0, y0), (x1, y1) = polygon[i], polygon[(i + 1) % len(polygon)]
            length = math.hypot(x1 - x0, y1 - y0)
            if length == 0:
                continue
            nx, ny = (y0 - y1) / length, (x1 - x0) / length  # a unit normal of this edge
            pa = [x * nx + y * ny for x, y in a.corners]
            pb = [x * nx + y * ny for x, y in b.corners]
            depth = min(depth, min(max(pa), max(pb)) - max(min(pa), min(pb)))
            if depth <= tolerance:
                return 0.0
    return depth


def text_overlaps(fig, *, tolerance: float = TOLERANCE) -> list[TextOverlap]:
    """Every pair of drawn text items of ``fig`` whose boxes overlap (see the module's doc).

    The figure is laid out first (``fig.draw_without_rendering()``), so constrained and tight
    layouts have placed everything, as they will in the saved picture.

    Args:
        fig: a matplotlib ``Figure``.
        tolerance: pixels of overlap that still count as touching.

    Returns:
        A list of :class:`TextOverlap`, empty when no text overlaps other text.
    """
    from matplotlib.figure import Figure

    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    items = _collect(fig, renderer)
    found = []
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            if a.kind == "tick" and b.kind == "tick":
                # Along one axis side, or across two different axes; an x and a y tick label
                # of the same axes meet at the corner by design.
                if a.group != b.group and a.axes == b.axes:
                    continue
            depth = _overlap_depth(a, b, tolerance)
            if depth > 0:
                found.append(TextOverlap(a.label, b.label, depth))
    return found


def check_figure(fig, *, tolerance: float = TOLERANCE) -> None:
    """Raise :class:`FigureTextOverlapError` if any text of ``fig`` overlaps other text.

    Args:
        fig: a matplotlib ``Figure``.
        tolerance: pixels of overlap that still count as touching.

    Returns:
        None; the error lists every overlap found.
    """
    overlaps = text_overlaps(fig, tolerance=tolerance)
    if overlaps:
        title = fig._suptitle.get_text() if fig._suptitle is not None else ""
        if not title:
            title = next((ax.get_title() for ax in fig.axes if ax.get_title()), "")
        lines = "\n".join(f"  - {overlap}" for overlap in overlaps)
        raise FigureTextOverlapError(
            f'the figure "{_readable(title) or "untitled"}" has overlapping text, which a reader '
            f"cannot read:\n{lines}\nMove the legend (loc=...), the annotation, or thin the tick "
            "labels, then run the cell again."
        )
