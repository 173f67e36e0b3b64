"""Report charts written as SVG text and embedded in markdown as data URIs.

matplotlib costs 0.15-0.3 s a figure (layout, rasterising, PNG encoding) and a day's reports
draw four, which a year's backfill pays 365 times. These charts are a few lines, dots and
boxes: written directly they take about a millisecond, and the browser draws them sharp at any
zoom.
"""

import base64
import dataclasses
import html
import math
from collections.abc import Sequence

import numpy as np

# matplotlib's default colour cycle, so the charts look like the drift report's.
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
GREY = "#7f7f7f"
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'
WIDTH, HEIGHT = 440, 290
# Plot area inside the chart: room for the title above, tick labels and axis labels around.
LEFT, RIGHT, TOP, BOTTOM = 58, 16, 30, 44
LEGEND_ROW = 16
CHAR_WIDTH = 6.2  # of an 11 px sans-serif character, for laying out the legend


@dataclasses.dataclass(frozen=True)
class Series:
    """A named line of a line chart; with `steps` each value holds until the next x."""

    name: str
    x: Sequence[float] | np.ndarray
    y: Sequence[float] | np.ndarray
    colour: str | None = None
    dashed: bool = False
    steps: bool = False


def markdown_image(svg: str, alt: str) -> str:
    """An SVG document as a markdown image with an inline (base64) data URI."""
    encoded = base64.b64encode(svg.encode()).decode()
    return f"![{alt}](data:image/svg+xml;base64,{encoded})"


def nice_ticks(low: float, high: float, count: int = 5) -> np.ndarray:
    """About `count` round values (1, 2 or 5 times a power of ten apart) within [low, high]."""
    raw = (high - low) / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = min((m * magnitude for m in (1, 2, 5, 10)), key=lambda s: abs(math.log(s / raw)))
    first = math.ceil(low / step - 1e-9) * step
    ticks = np.arange(first, high + step * 1e-9, step)
    # Round away float residue (0.30000000000000004) so labels print short.
    return np.round(ticks, max(0, -math.floor(math.log10(step))) + 1)


def _label(value: float, ticks: np.ndarray) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:.{decimals}f}"


def _limits(values: list[np.ndarray]) -> tuple[float, float]:
    """Data range with matplotlib's 5 % margin; a constant gets a unit range around it."""
    finite = np.concatenate([v[np.isfinite(v)] for v in values])
    if not len(finite):
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    if low == high:
        return low - 0.5, high + 0.5
    margin = (high - low) * 0.05
    return low - margin, high + margin


class _Frame:
    """Axes of a chart: maps data to pixels and writes the frame, ticks, labels and title."""

    def __init__(
        self,
        x_limits: tuple[float, float],
        y_limits: tuple[float, float],
        width: int = WIDTH,
        height: int = HEIGHT,
    ) -> None:
        self.x_limits, self.y_limits = x_limits, y_limits
        self.left, self.top = LEFT, TOP
        self.right, self.bottom = width - RIGHT, height - BOTTOM

    def px(self, x: np.ndarray) -> np.ndarray:
        """Horizontal pixel positions of data x values."""
        low, high = self.x_limits
        return self.left + (np.asarray(x, dtype="float64") - low) / (high - low) * (
            self.right - self.left
        )

    def py(self, y: np.ndarray) -> np.ndarray:
        """Vertical pixel positions of data y values (SVG's y axis points down)."""
        low, high = self.y_limits
        return self.bottom - (np.asarray(y, dtype="float64") - low) / (high - low) * (
            self.bottom - self.top
        )

    def axes(self, title: str, x_label: str, y_label: str) -> list[str]:
        """SVG elements of the grid, frame, ticks, axis labels and title."""
        parts = []
        x_ticks, y_ticks = nice_ticks(*self.x_limits), nice_ticks(*self.y_limits)
        for tick, pos in zip(x_ticks, self.px(x_ticks), strict=True):
            parts.append(
                f'<line x1="{pos:.1f}" y1="{self.top}" x2="{pos:.1f}" y2="{self.bottom + 4}" '
                'stroke="#e5e5e5"/>'
                f'<text x="{pos:.1f}" y="{self.bottom + 16}" text-anchor="middle">'
                f"{_label(tick, x_ticks)}</text>"
            )
        for tick, pos in zip(y_ticks, self.py(y_ticks), strict=True):
            parts.append(
                f'<line x1="{self.left - 4}" y1="{pos:.1f}" x2="{self.right}" y2="{pos:.1f}" '
                'stroke="#e5e5e5"/>'
                f'<text x="{self.left - 7}" y="{pos + 4:.1f}" text-anchor="end">'
                f"{_label(tick, y_ticks)}</text>"
            )
        middle_x, middle_y = (self.left + self.right) / 2, (self.top + self.bottom) / 2
        parts.append(
            f'<rect x="{self.left}" y="{self.top}" width="{self.right - self.left}" '
            f'height="{self.bottom - self.top}" fill="none" stroke="#333"/>'
            f'<text x="{middle_x:.1f}" y="{self.bottom + 34}" text-anchor="middle">'
            f"{html.escape(x_label)}</text>"
            f'<text transform="translate(16 {middle_y:.1f}) rotate(-90)" text-anchor="middle">'
            f"{html.escape(y_label)}</text>"
            f'<text x="{middle_x:.1f}" y="19" text-anchor="middle" font-size="13" '
            f'font-weight="bold">{html.escape(title)}</text>'
        )
        return parts


def _svg(width: int, height: int, parts: list[str]) -> str:
    # width/height make the browser give the image a natural size; the viewBox lets it scale.
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" {FONT} font-size="11" fill="#222">'
        f'<rect width="{width}" height="{height}" fill="#fff"/>' + "".join(parts) + "</svg>"
    )


def _path(x: np.ndarray, y: np.ndarray) -> str:
    """Path data through pixel points, less the points that change nothing at screen size.

    A precision-recall curve has a point per distinct score (thousands); rounded to half a
    pixel (the line is wider) most repeat or lie on a straight horizontal or vertical run.
    """
    points = np.round(np.column_stack([x, y]) * 2) / 2
    points = points[np.isfinite(points).all(axis=1)]
    if len(points) > 1:
        changed = np.any(points[1:] != points[:-1], axis=1)
        points = points[np.concatenate([[True], changed])]
    if len(points) > 2:
        before, after = points[1:-1] - points[:-2], points[2:] - points[1:-1]
        # Middle of three points on one vertical or horizontal line, in the same direction.
        same_line = ((before[:, 0] == 0) & (after[:, 0] == 0)) | (
            (before[:, 1] == 0) & (after[:, 1] == 0)
        )
        same_way = np.sign(before).sum(axis=1) == np.sign(after).sum(axis=1)
        points = points[np.concatenate([[True], ~(same_line & same_way), [True]])]
    return "M" + " L".join(f"{a:g} {b:g}" for a, b in points)


def _legend(entries: list[tuple[str, str, bool]], top: float) -> tuple[list[str], float]:
    """Legend rows under the chart (swatch, name); returns the elements and the height used."""
    parts, x, y = [], float(LEFT), top + 11
    for name, colour, dashed in entries:
        width = 28 + CHAR_WIDTH * len(name)
        if x > LEFT and x + width > WIDTH - RIGHT:
            x, y = float(LEFT), y + LEGEND_ROW
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        parts.append(
            f'<line x1="{x:.1f}" y1="{y - 4:.1f}" x2="{x + 20:.1f}" y2="{y - 4:.1f}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
            f'<text x="{x + 25:.1f}" y="{y:.1f}">{html.escape(name)}</text>'
        )
        x += width + 14
    return parts, y - top + 6


def line_chart(
    alt: str,
    series: list[Series],
    x_label: str,
    y_label: str,
    x_limits: tuple[float, float] | None = None,
    y_limits: tuple[float, float] | None = None,
) -> str:
    """Markdown image of named lines with axes, ticks, title (the alt text) and a legend."""
    xs = [np.asarray(s.x, dtype="float64") for s in series]
    ys = [np.asarray(s.y, dtype="float64") for s in series]
    frame = _Frame(x_limits or _limits(xs), y_limits or _limits(ys))
    parts = frame.axes(alt, x_label, y_label)
    # Lines may not stray out of the frame when limits cut the data.
    parts.append(
        f'<clipPath id="plot"><rect x="{frame.left}" y="{frame.top}" '
        f'width="{frame.right - frame.left}" height="{frame.bottom - frame.top}"/></clipPath>'
        '<g clip-path="url(#plot)" fill="none" stroke-width="1.8" stroke-linejoin="round">'
    )
    entries = []
    for i, (s, x, y) in enumerate(zip(series, xs, ys, strict=True)):
        colour = s.colour or COLOURS[i % len(COLOURS)]
        if s.steps and len(x) > 1:
            # Each value holds until the next x (matplotlib's "steps-post").
            x, y = np.repeat(x, 2)[1:], np.repeat(y, 2)[:-1]
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        parts.append(f'<path d="{_path(frame.px(x), frame.py(y))}" stroke="{colour}"{dash}/>')
        entries.append((s.name, colour, s.dashed))
    parts.append("</g>")
    legend, legend_height = _legend(entries, HEIGHT - 6)
    return markdown_image(_svg(WIDTH, int(HEIGHT + legend_height), parts + legend), alt)


def _heat(share: float) -> str:
    """White to dark blue, as the share of the largest count rises."""
    light, dark = np.array([247, 251, 255]), np.array([8, 48, 107])
    red, green, blue = np.round(light + (dark - light) * share).astype(int)
    return f"rgb({red},{green},{blue})"


def confusion_matrix(alt: str, counts: np.ndarray, labels: Sequence[str]) -> str:
    """Markdown image of a confusion matrix: true labels by row, predicted by column, counts."""
    cell, left, top = 90, 80, 34
    size = len(labels)
    width, height = left + cell * size + 20, top + cell * size + 46
    largest = max(int(counts.max()), 1)
    parts = []
    for row in range(size):
        for column in range(size):
            share = counts[row, column] / largest
            x, y = left + column * cell, top + row * cell
            ink = "#fff" if share > 0.5 else "#222"
            parts.append(
                f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{_heat(share)}" '
                'stroke="#fff"/>'
                f'<text x="{x + cell / 2}" y="{y + cell / 2 + 6}" text-anchor="middle" '
                f'font-size="16" fill="{ink}">{int(counts[row, column])}</text>'
            )
    for i, label in enumerate(labels):
        centre = i * cell + cell / 2
        parts.append(
            f'<text x="{left + centre}" y="{top + size * cell + 16}" text-anchor="middle">'
            f"{html.escape(label)}</text>"
            f'<text x="{left - 8}" y="{top + centre + 4}" text-anchor="end">'
            f"{html.escape(label)}</text>"
        )
    middle_x, middle_y = left + size * cell / 2, top + size * cell / 2
    parts.append(
        f'<text x="{middle_x}" y="{top + size * cell + 36}" text-anchor="middle">'
        "Predicted label</text>"
        f'<text transform="translate(40 {middle_y}) rotate(-90)" text-anchor="middle">'
        "True label</text>"
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="13" font-weight="bold">'
        f"{html.escape(alt)}</text>"
    )
    return markdown_image(_svg(width, height, parts), alt)


def scatter(
    alt: str, x: np.ndarray, y: np.ndarray, x_label: str, y_label: str, zero_line: bool = True
) -> str:
    """Markdown image of points (one dot per occupied pixel), with a grey line at y = 0."""
    x, y = np.asarray(x, dtype="float64"), np.asarray(y, dtype="float64")
    frame = _Frame(_limits([x]), _limits([y, np.zeros(1)] if zero_line else [y]))
    parts = frame.axes(alt, x_label, y_label)
    if zero_line:
        zero = float(frame.py(np.zeros(1))[0])
        parts.append(
            f'<line x1="{frame.left}" y1="{zero:.1f}" x2="{frame.right}" y2="{zero:.1f}" '
            f'stroke="{GREY}"/>'
        )
    # Thousands of points would make a large image; dots closer than a pixel look the same.
    pixels = np.unique(np.round(np.column_stack([frame.px(x), frame.py(y)])), axis=0)
    pixels = pixels[np.isfinite(pixels).all(axis=1)]
    dots = "".join(f"M{a:g} {b:g}h0" for a, b in pixels)
    parts.append(
        f'<path d="{dots}" stroke="{COLOURS[0]}" stroke-opacity="0.5" stroke-width="4" '
        'stroke-linecap="round"/>'
    )
    return markdown_image(_svg(WIDTH, HEIGHT, parts), alt)
