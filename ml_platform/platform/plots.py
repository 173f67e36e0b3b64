"""Report charts: matplotlib figures rendered as SVG and embedded in markdown as data URIs.

Every chart of the platform (evaluation curves, the loss per epoch, the drift report) is drawn
here, so they share one look and one way into the UI. The SVG keeps its text as text: the
browser draws it sharp at any zoom and a test can read titles, legends and tick labels back.

Importing matplotlib costs about 0.5 s of CPU, so it is imported inside the functions that draw,
never when the code location loads. A chart costs its artists: building a figure (axes, ticks,
legend) took as long as rendering it, so a line chart or confusion matrix keeps its figure for
the next chart of the same layout (title, axis labels, limits, series styles) and only changes its
data and texts. A backfill draws the same three or four layouts every day: about 25 ms a chart
instead of 55 (benchmarks/evaluation_report.py). Tick marks are left out, the grid lines mark the
ticks.
"""

import base64
import contextlib
import dataclasses
import functools
import io
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage
    from matplotlib.legend import Legend
    from matplotlib.lines import Line2D
    from matplotlib.text import Text
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
    # No tick marks: the grid line of each tick marks it, at a third of the artists to draw.
    "xtick.major.size": 0.0,
    "ytick.major.size": 0.0,
}
# Layouts whose figure is kept: the evaluation's ROC, precision-recall and confusion matrix,
# the loss per epoch or iteration, and a few more.
KEPT_FIGURES = 8
# matplotlib's rc parameters and a kept figure are shared by the threads of a process: one
# chart is drawn at a time.
_DRAWING = threading.RLock()


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

    with _DRAWING, matplotlib.rc_context(STYLE):
        yield Figure(figsize=(width, height), dpi=DPI)


@contextlib.contextmanager
def _report_style() -> Iterator[None]:
    """The report style and the drawing lock, around drawing a kept figure."""
    import matplotlib

    with _DRAWING, matplotlib.rc_context(STYLE):
        yield


def svg_image(chart: "Figure", alt: str) -> str:
    """The figure as a markdown image of an SVG document, without a creation date."""
    buffer = io.StringIO()
    chart.savefig(buffer, format="svg", metadata={"Date": None})
    encoded = base64.b64encode(buffer.getvalue().encode()).decode()
    return f"![{alt}](data:image/svg+xml;base64,{encoded})"


@dataclasses.dataclass(frozen=True)
class _LineLayout:
    """What a line chart's figure is built with; its series' data and names are filled in."""

    title: str
    x_label: str
    y_label: str
    x_limits: tuple[float, float] | None
    y_limits: tuple[float, float] | None
    whole_x: bool
    styles: tuple[tuple[str, bool, bool], ...]  # (colour, dashed, steps) of each series


@dataclasses.dataclass(frozen=True)
class _LineFigure:
    figure: "Figure"
    axes: "Axes"
    lines: list["Line2D"]
    legend: "Legend"
    # The limits the new figure had before any data: those of a chart with none to show.
    empty_limits: tuple[tuple[float, float], tuple[float, float]]


@functools.lru_cache(maxsize=KEPT_FIGURES)
def _line_figure(layout: _LineLayout) -> _LineFigure:
    """A line chart's figure with empty lines, kept for the next chart of the same layout."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    chart = Figure(figsize=SIZE, dpi=DPI)
    axes = chart.add_subplot()
    lines = []
    for i, (colour, dashed, steps) in enumerate(layout.styles):
        # Each line is the SVG group `series-<i>`: a reader of the document finds it by id.
        (line,) = axes.plot(
            [],
            [],
            color=colour,
            linestyle="--" if dashed else "-",
            drawstyle="steps-post" if steps else "default",
            linewidth=1.8,
            markersize=4.0,
            label=f"series {i}",
            gid=f"series-{i}",
        )
        lines.append(line)
    axes.set(title=layout.title, xlabel=layout.x_label, ylabel=layout.y_label)
    if layout.x_limits:
        axes.set_xlim(layout.x_limits)
    if layout.y_limits:
        axes.set_ylim(layout.y_limits)
    if layout.whole_x:
        # Epochs and counts: no tick between two whole numbers.
        axes.xaxis.set_major_locator(MaxNLocator("auto", steps=[1, 2, 5, 10], integer=True))
    # Under the axes: inside, a legend would hide a curve along an edge.
    legend = chart.legend(loc="lower center", ncols=min(len(lines), 3), frameon=False)
    chart.subplots_adjust(left=0.12, right=0.97, top=0.91, bottom=0.25)
    return _LineFigure(chart, axes, lines, legend, (axes.get_xlim(), axes.get_ylim()))


def line_chart(
    alt: str,
    series: list[Series],
    x_label: str,
    y_label: str,
    x_limits: tuple[float, float] | None = None,
    y_limits: tuple[float, float] | None = None,
) -> str:
    """Markdown image of named lines with axes, ticks, title (the alt text) and a legend."""
    layout = _LineLayout(
        alt,
        x_label,
        y_label,
        x_limits,
        y_limits,
        all(float(v).is_integer() for s in series for v in s.x),
        tuple(
            (s.colour or COLOURS[i % len(COLOURS)], s.dashed, s.steps) for i, s in enumerate(series)
        ),
    )
    with _report_style():
        chart = _line_figure(layout)
        texts: list[Text] = chart.legend.get_texts()
        for s, line, text in zip(series, chart.lines, texts, strict=True):
            x, y = np.asarray(s.x, dtype="float64"), np.asarray(s.y, dtype="float64")
            line.set_data(x, y)
            line.set_label(s.name)
            text.set_text(s.name)
            # A line needs two points: a point alone (a single epoch, a replay of one day, a
            # value between two NaN) would draw nothing, so it gets a dot, and only it.
            alone = _lone_points(x, y)
            line.set_marker("o" if alone else "None")
            line.set_markevery(alone or None)
        if not (x_limits and y_limits):
            # The limits of this chart's data alone, as a new figure would take them; with no
            # point to show, relim keeps the last chart's, so the new figure's are put back.
            chart.axes.relim()
            chart.axes.autoscale_view()
            if not any(np.isfinite(np.asarray(s.y, dtype="float64")).any() for s in series):
                empty_x, empty_y = chart.empty_limits
                # auto=None: the next chart of the layout is scaled to its data again.
                chart.axes.set_xlim(x_limits or empty_x, auto=None)
                chart.axes.set_ylim(y_limits or empty_y, auto=None)
        image = svg_image(chart.figure, alt)
        # The x tick labels are one line of text, whatever they say; the y tick labels are the
        # same on every chart with fixed y limits.
        _keep_label_positions(chart.axes, y=y_limits is not None)
        return image


def _lone_points(x: np.ndarray, y: np.ndarray) -> list[int]:
    """Indices of the finite points that no segment joins: no finite neighbour either side."""
    finite = np.isfinite(x) & np.isfinite(y)
    before = np.concatenate([[False], finite[:-1]])
    after = np.concatenate([finite[1:], [False]])
    return [int(i) for i in np.flatnonzero(finite & ~before & ~after)]


def _keep_label_positions(axes: "Axes", y: bool = True) -> None:
    """Keep the axis labels where the last drawing placed them, clear of the tick labels.

    matplotlib places an axis label beyond its tick labels by measuring them again at every
    drawing (about 2 ms an axis). Where the tick labels keep their extent, the next drawing of
    the figure would place the label at the same point: it is fixed there.
    """
    for axis in (axes.xaxis, axes.yaxis) if y else (axes.xaxis,):
        axis.set_label_coords(*axis.label.get_position(), transform=axis.label.get_transform())


@dataclasses.dataclass(frozen=True)
class _MatrixFigure:
    figure: "Figure"
    image: "AxesImage"
    counts: list["Text"]  # row by row


@functools.lru_cache(maxsize=KEPT_FIGURES)
def _matrix_figure(title: str, labels: tuple[str, ...]) -> _MatrixFigure:
    """A confusion matrix's figure with blank cells, kept for the next one of the same labels."""
    from matplotlib.figure import Figure

    size = len(labels)
    chart = Figure(figsize=(1.3 + 1.25 * size, 1.0 + 1.25 * size), dpi=DPI)
    axes = chart.add_subplot()
    # The cells as they are (size x size pixels), which the SVG asks the browser to scale
    # without smoothing: crisp at any zoom, and no image resampled to the screen and encoded.
    image = axes.imshow(np.zeros((size, size)), cmap="Blues", vmin=0, vmax=1, interpolation="none")
    counts = [
        axes.text(column, row, "", ha="center", va="center", size=14)
        for row in range(size)
        for column in range(size)
    ]
    ticks = np.arange(size)
    axes.set_xticks(ticks, list(labels))
    axes.set_yticks(ticks, list(labels))
    axes.grid(False)
    axes.set(title=title, xlabel="Predicted label", ylabel="True label")
    chart.subplots_adjust(left=0.22, right=0.95, top=0.88, bottom=0.2)
    return _MatrixFigure(chart, image, counts)


def confusion_matrix(alt: str, counts: np.ndarray, labels: Sequence[str]) -> str:
    """Markdown image of a confusion matrix: true labels by row, predicted by column, counts."""
    with _report_style():
        chart = _matrix_figure(alt, tuple(str(label) for label in labels))
        largest = max(int(counts.max()), 1)
        chart.image.set_data(counts)
        chart.image.set_clim(0, largest)
        for text, count in zip(chart.counts, counts.ravel(), strict=True):
            text.set_text(str(int(count)))
            # White on the dark cells, dark on the light ones.
            text.set_color("white" if count / largest > 0.5 else "#222")
        image = svg_image(chart.figure, alt)
        # Its tick labels are the class labels, the same on every drawing.
        _keep_label_positions(chart.image.axes)
        return image


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
