"""Report charts: SVG a browser can size, read back for title, legend, ticks, colours and data;
a figure kept for the next chart of its layout draws each chart as a new figure would."""

import base64
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np

from ml_platform.platform import plots
from ml_platform.platform.plots import GREY, Series, confusion_matrix, line_chart, scatter

SVG = "{http://www.w3.org/2000/svg}"


def svg_of(markdown: str, alt: str) -> ET.Element:
    match = re.fullmatch(
        rf"!\[{re.escape(alt)}\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", markdown
    )
    assert match, markdown[:80]
    root = ET.fromstring(base64.b64decode(match.group(1)))
    assert root.tag == f"{SVG}svg"
    # A natural size, which the UI's <img> needs to lay the chart out.
    assert float(root.get("width").removesuffix("pt")) > 100
    assert float(root.get("height").removesuffix("pt")) > 100
    return root


def texts(root: ET.Element) -> list[str]:
    return [t.text for t in root.iter(f"{SVG}text")]


def line(root: ET.Element, index: int) -> dict[str, str]:
    """Path data and style properties of the `index`-th series of a line chart."""
    group = root.find(f".//{SVG}g[@id='series-{index}']")
    assert group is not None, f"no series {index}"
    path = group.find(f"{SVG}path")
    style = dict(p.split(": ", 1) for p in path.get("style").split("; "))
    return {"d": path.get("d"), **style}


def vertices(d: str) -> np.ndarray:
    return np.array([[float(v) for v in p.split()] for p in re.split(r"[ML]", d) if p.strip()])


def test_line_chart_shows_title_axis_labels_ticks_legend_and_each_series():
    x = np.linspace(0, 1, 5000)
    markdown = line_chart(
        "ROC curve",
        [
            Series("candidate (AUC = 0.61)", x, x**0.5),
            Series("chance", [0, 1], [0, 1], GREY, dashed=True),
        ],
        "false positive rate",
        "true positive rate",
        (-0.02, 1.02),
        (-0.02, 1.02),
    )
    root = svg_of(markdown, "ROC curve")
    labels = texts(root)
    for label in ["ROC curve", "false positive rate", "true positive rate", "chance"]:
        assert label in labels
    assert "candidate (AUC = 0.61)" in labels
    assert {"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"} <= set(labels)
    candidate, chance = line(root, 0), line(root, 1)
    # The first colour of the cycle, solid; the chance line grey and dashed.
    assert candidate["stroke"] == "#1f77b4" and "stroke-dasharray" not in candidate
    assert chance["stroke"] == GREY and "stroke-dasharray" in chance
    # A concave curve: above the diagonal at every drawn point (SVG's y axis points down).
    start, end = vertices(chance["d"])
    points = vertices(candidate["d"])
    points = points[(points[:, 0] > start[0]) & (points[:, 0] < end[0])]
    diagonal = start[1] + (points[:, 0] - start[0]) / (end[0] - start[0]) * (end[1] - start[1])
    assert (points[:, 1] < diagonal).all()
    # 5,000 points collapse to what shows at screen size.
    assert len(points) < 1000 and len(markdown) < 40_000


def test_line_chart_draws_steps_and_survives_non_finite_and_constant_values():
    markdown = line_chart(
        "Loss per epoch",
        [Series("training", [1, 2, 3], [0.5, np.nan, np.inf]), Series("kept", [2, 2], [1, 1])],
        "epoch",
        "loss",
    )
    root = svg_of(markdown, "Loss per epoch")
    assert {"training", "kept", "epoch", "loss"} <= set(texts(root))
    steps = line_chart("PR", [Series("s", [1.0, 0.5, 0.0], [0.2, 0.4, 1.0], steps=True)], "r", "p")
    # steps-post: the value holds until the next x, then jumps.
    drawn = vertices(line(svg_of(steps, "PR"), 0)["d"])
    assert len(drawn) == 5
    assert drawn[1, 1] == drawn[0, 1] and drawn[2, 0] == drawn[1, 0]


def test_whole_number_x_values_get_whole_number_ticks():
    epochs = list(range(1, 21))
    markdown = line_chart("Loss per epoch", [Series("training", epochs, epochs)], "epoch", "loss")
    x_axis = svg_of(markdown, "Loss per epoch").find(f".//{SVG}g[@id='matplotlib.axis_1']")
    labels = texts(x_axis)
    assert {"5", "10", "15", "20"} <= set(labels) and not any("." in label for label in labels)


def test_confusion_matrix_shows_counts_labels_and_darker_cells_for_larger_counts():
    root = svg_of(
        confusion_matrix("Confusion matrix", np.array([[50, 7], [3, 40]]), ["0", "1"]),
        "Confusion matrix",
    )
    labels = texts(root)
    assert {"50", "7", "3", "40", "Predicted label", "True label", "0", "1"} <= set(labels)
    ink = {t.text: t.get("style") for t in root.iter(f"{SVG}text")}
    # Counts above half the largest sit on dark cells and are written in white.
    assert "fill: #ffffff" in ink["50"] and "fill: #ffffff" in ink["40"]
    assert "fill: #ffffff" not in ink["7"] and "fill: #ffffff" not in ink["3"]
    assert len(list(root.iter(f"{SVG}image"))) == 1  # the cells


def test_scatter_is_one_image_of_points_whatever_the_rows():
    rng = np.random.default_rng(0)
    small, large = (
        scatter("Residuals", rng.normal(size=n), rng.normal(size=n), "predicted", "residual")
        for n in (200, 20_000)
    )
    for markdown in (small, large):
        root = svg_of(markdown, "Residuals")
        assert {"Residuals", "predicted", "residual"} <= set(texts(root))
        assert len(list(root.iter(f"{SVG}image"))) == 1
        zero = root.find(f".//{SVG}g[@id='zero']/{SVG}path")
        assert f"stroke: {GREY}" in zero.get("style")
    assert len(large) < 150_000


def content(root: ET.Element, series: int) -> tuple[list[str], list[str]]:
    """(texts, path data of each series): what a reader of the chart sees."""
    return texts(root), [line(root, i)["d"] for i in range(series)]


def test_a_kept_figure_draws_the_next_chart_of_its_layout_as_a_new_figure_would():
    def loss(values: list[float], names: tuple[str, str]) -> str:
        epochs = list(range(1, len(values) + 1))
        return line_chart(
            "Loss per epoch",
            [Series(names[0], epochs, values), Series(names[1], [2, 2], [0, max(values)], GREY)],
            "epoch",
            "loss",
        )

    plots._line_figure.cache_clear()
    small = loss([0.9, 0.5, 0.4], ("training", "kept"))
    large = loss([120.0, 80.0, 60.0, 55.0, 50.0], ("validation", "best validation"))
    again = loss([0.9, 0.5, 0.4], ("training", "kept"))
    plots._line_figure.cache_clear()
    new_large = loss([120.0, 80.0, 60.0, 55.0, 50.0], ("validation", "best validation"))
    # The same layout, other data: its own limits, ticks and names, nothing of the first chart.
    assert again == small and large == new_large
    small_texts, small_paths = content(svg_of(small, "Loss per epoch"), 2)
    large_texts, large_paths = content(svg_of(large, "Loss per epoch"), 2)
    assert {"training", "kept", "0.4", "0.8"} <= set(small_texts)
    assert {"validation", "best validation", "60", "120", "5"} <= set(large_texts)
    assert not {"training", "kept", "0.8"} & set(large_texts) and "120" not in small_texts
    assert len(vertices(large_paths[0])) == 5 and len(vertices(small_paths[0])) == 3

    def roc(power: float, name: str) -> str:
        x = np.linspace(0, 1, 50)
        return line_chart(
            "ROC curve",
            [Series(name, x, x**power), Series("chance", [0, 1], [0, 1], GREY, dashed=True)],
            "false positive rate",
            "true positive rate",
            (-0.02, 1.02),
            (-0.02, 1.02),
        )

    first_roc, second_roc = roc(0.5, "candidate (AUC = 0.67)"), roc(0.2, "candidate (AUC = 0.83)")
    plots._line_figure.cache_clear()
    assert roc(0.2, "candidate (AUC = 0.83)") == second_roc != first_roc
    assert "candidate (AUC = 0.67)" not in texts(svg_of(second_roc, "ROC curve"))

    plots._matrix_figure.cache_clear()
    first = confusion_matrix("Confusion matrix", np.array([[50, 7], [3, 40]]), ["0", "1"])
    other = confusion_matrix("Confusion matrix", np.array([[1, 2], [3, 400]]), ["0", "1"])
    plots._matrix_figure.cache_clear()
    assert confusion_matrix("Confusion matrix", np.array([[1, 2], [3, 400]]), ["0", "1"]) == other
    assert confusion_matrix("Confusion matrix", np.array([[50, 7], [3, 40]]), ["0", "1"]) == first
    ink = {t.text: t.get("style") for t in svg_of(other, "Confusion matrix").iter(f"{SVG}text")}
    assert "fill: #ffffff" in ink["400"] and "fill: #ffffff" not in ink["3"]
    assert "50" not in ink


def test_loading_the_code_location_leaves_matplotlib_unimported():
    # Every run process loads the definitions; only a step that draws may pay for matplotlib.
    code = (
        "import sys, ml_platform.definitions; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'matplotlib']"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_chart_with_no_point_on_a_kept_figure_shows_no_earlier_charts_axes():
    def champion(days: list[float], values: list[float]) -> str:
        series = [Series("live", days, values), Series("replay", days, values)]
        return line_chart("Serving champion's next-day roc_auc", series, "day", "roc_auc")

    plots._line_figure.cache_clear()
    fresh = champion([], [])
    # A metric no champion scored (every value NaN), drawn after a chart with data.
    scored = champion(list(range(30)), [100.0 + day for day in range(30)])
    assert champion([], []) == fresh
    alt = "Serving champion's next-day roc_auc"
    earlier = set(texts(svg_of(scored, alt))) & {"100", "110", "120"}
    assert earlier
    unscored = texts(svg_of(champion([0.0, 1.0], [float("nan")] * 2), alt))
    assert not earlier & set(unscored)


def test_a_point_no_segment_joins_is_drawn_as_a_dot_and_only_it():
    # A model of one epoch (or a replay of one day): a line of one point drew nothing, and the
    # chart showed empty axes under its legend, as if the training had no loss at all.
    def loss(epochs: list[float], values: list[float]) -> ET.Element:
        series = [Series("training", epochs, values), Series("validation", epochs, values)]
        return svg_of(line_chart("Loss per epoch", series, "epoch", "loss"), "Loss per epoch")

    def dots(root: ET.Element, index: int) -> int:
        group = root.find(f".//{SVG}g[@id='series-{index}']")
        return len(list(group.iter(f"{SVG}use")))

    plots._line_figure.cache_clear()
    one = loss([1], [0.5])
    assert dots(one, 0) == 1 and dots(one, 1) == 1
    # A value between NaN or inf is alone too; points a segment joins keep a plain line.
    gap = loss([1, 2, 3, 4, 5, 6], [0.5, np.nan, 0.4, np.inf, 0.3, 0.2])
    assert dots(gap, 0) == 2
    # The kept figure's next chart of the layout has no dot left of the last one.
    many = loss([1, 2, 3], [0.5, 0.4, 0.3])
    assert dots(many, 0) == 0 and dots(many, 1) == 0
