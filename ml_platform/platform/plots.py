"""Report charts: matplotlib figures rendered as SVG and embedded in markdown as data URIs.

Every chart of the platform (evaluation curves, the loss per epoch, the drift report) is drawn
here, so they share one look and one way into the UI. The SVG keeps its text as text: the
browser draws it sharp at any zoom and a test can read titles, legends and tick labels back.

Importing matplotlib costs about 0.5 s of CPU, so it is imported inside the functions that draw,
never when the code location loads: a step that draws pays it once per process, then about 50 ms
a chart (layout and text measuring, most of it fixed per chart).
"""

import base64
import contextlib
import dataclasses
import io
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType

# matplotlib's default colour cycle, spelled out for the series of a line chart.
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
GREY = "#7f7f7f"
# Inches at 72 dpi: 440 x 270 px, the size a chart shows at in the UI's markdown dialog.
SIZE = (6.1, 3.75)
DPI = 72
STYLE: dict["RcKeyType", Any] = {
    # Text stays <text> elements (not glyph outlines): smaller, sharp, and searchable.
    "svg.fonttype": "none",
    # Element ids from a fixed salt, so the same chart gives the same SVG.
    "svg.hashsalt": "ml_platform",
    # matplotlib's own font first; the SVG names the families, a browser without it falls back.
    "font.sans-serif": ["DejaVu Sans", "Arial"],
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.titleweight": "bold",
    # A fixed title position: placing it above tick labels measures them all again.
    "axes.titley": 1.02,
    "axes.grid": True,
    # Grid lines under the data, the dots of a scatter included.
    "axes.axisbelow": True,
    "grid.color": "#e5e5e5",
    "legend.fontsize": 8.0,
    # Curves lose the vertices that move them less than half a pixel: a precision-recall curve
    # has one per distinct score, thousands, most of them invisible at this size.
    "path.simplify_threshold": 0.5,
}


@dataclasses.dataclass(frozen=True)
class Series:
    """A named line of a line chart; with `steps` each value holds until the next x."""

    name: str
    x: Sequence[float] | np.ndarray
    y: Sequence[float] | np.ndarray
    colour: str | None = None
    dashed: bool = False
    steps: bool = False


@contextlib.contextmanager
def new_figure(width: float = SIZE[0], height: float = SIZE[1]) -> Iterator["Figure"]:
    """An empty figure of `width` x `height` inches; draw and render it inside the block.

    A `Figure` rather than pyplot: it needs no GUI backend and keeps no global state between
    the charts of a run. The report style holds inside the block only, where matplotlib reads
    it (axes when they are created, text when the SVG is written).
    """
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(STYLE):
        yield Figure(figsize=(width, height), dpi=DPI)


def svg_image(chart: "Figure", alt: str) -> str:
    """The figure as a markdown image of an SVG document, without a creation date."""
    buffer = io.StringIO()
    chart.savefig(buffer, format="svg", metadata={"Date": None})
    encoded = base64.b64encode(buffer.getvalue().encode()).decode()
    return f"![{alt}](data:image/svg+xml;base64,{encoded})"


def line_chart(
    alt: str,
    series: list[Series],
    x_label: str,
    y_label: str,
    x_limits: tuple[float, float] | None = None,
    y_limits: tuple[float, float] | None = None,
) -> str:
    """Markdown image of named lines with axes, ticks, title (the alt text) and a legend."""
    from matplotlib.ticker import MaxNLocator

    with new_figure() as chart:
        axes = chart.add_subplot()
        for i, s in enumerate(series):
            # Each line is the SVG group `series-<i>`: a reader of the document finds it by id.
            axes.plot(
                np.asarray(s.x, dtype="float64"),
                np.asarray(s.y, dtype="float64"),
                color=s.colour or COLOURS[i % len(COLOURS)],
                linestyle="--" if s.dashed else "-",
                drawstyle="steps-post" if s.steps else "default",
                linewidth=1.8,
                label=s.name,
                gid=f"series-{i}",
            )
        axes.set(title=alt, xlabel=x_label, ylabel=y_label)
        if x_limits:
            axes.set_xlim(x_limits)
        if y_limits:
            axes.set_ylim(y_limits)
        if all(float(v).is_integer() for s in series for v in s.x):
            # Epochs and counts: no tick between two whole numbers.
            axes.xaxis.set_major_locator(MaxNLocator("auto", steps=[1, 2, 5, 10], integer=True))
        # Under the axes: inside, a legend would hide a curve along an edge.
        chart.legend(loc="lower center", ncols=min(len(series), 3), frameon=False)
        chart.subplots_adjust(left=0.12, right=0.97, top=0.91, bottom=0.25)
        return svg_image(chart, alt)


def confusion_matrix(alt: str, counts: np.ndarray, labels: Sequence[str]) -> str:
    """Markdown image of a confusion matrix: true labels by row, predicted by column, counts."""
    size = len(labels)
    with new_figure(1.3 + 1.25 * size, 1.0 + 1.25 * size) as chart:
        axes = chart.add_subplot()
        largest = max(int(counts.max()), 1)
        axes.imshow(counts, cmap="Blues", vmin=0, vmax=largest)
        for (row, column), count in np.ndenumerate(counts):
            # White on the dark cells, dark on the light ones.
            ink = "white" if count / largest > 0.5 else "#222"
            axes.text(column, row, str(int(count)), ha="center", va="center", color=ink, size=14)
        ticks = np.arange(size)
        axes.set_xticks(ticks, [str(label) for label in labels])
        axes.set_yticks(ticks, [str(label) for label in labels])
        axes.grid(False)
        axes.set(title=alt, xlabel="Predicted label", ylabel="True label")
        chart.subplots_adjust(left=0.22, right=0.95, top=0.88, bottom=0.2)
        return svg_image(chart, alt)


def scatter(
    alt: str, x: np.ndarray, y: np.ndarray, x_label: str, y_label: str, zero_line: bool = True
) -> str:
    """Markdown image of points, with a grey line at y = 0.

    The points are one raster image inside the SVG: a held-out set has thousands of rows, and a
    vector mark per row would make the report megabytes long.
    """
    with new_figure() as chart:
        axes = chart.add_subplot()
        axes.scatter(
            np.asarray(x, dtype="float64"),
            np.asarray(y, dtype="float64"),
            s=9,
            color=COLOURS[0],
            alpha=0.5,
            linewidths=0,
            rasterized=True,
        )
        if zero_line:
            axes.axhline(0.0, color=GREY, linewidth=1.0, gid="zero")
        axes.set(title=alt, xlabel=x_label, ylabel=y_label)
        chart.subplots_adjust(left=0.13, right=0.97, top=0.92, bottom=0.14)
        return svg_image(chart, alt)
