"""SVG report charts: well-formed images with their title, legend, ticks and data."""

import base64
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from ml_platform.platform.plots import Series, confusion_matrix, line_chart, nice_ticks, scatter

SVG = "{http://www.w3.org/2000/svg}"


def svg_of(markdown: str, alt: str) -> ET.Element:
    match = re.fullmatch(
        rf"!\[{re.escape(alt)}\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", markdown
    )
    assert match, markdown[:80]
    root = ET.fromstring(base64.b64decode(match.group(1)))
    assert root.tag == f"{SVG}svg"
    # A natural size, which the UI's <img> needs to lay the chart out.
    assert int(root.get("width")) > 100 and int(root.get("height")) > 100
    return root


def texts(root: ET.Element) -> list[str]:
    return [t.text for t in root.iter(f"{SVG}text")]


def test_line_chart_has_title_axis_labels_ticks_and_legend():
    x = np.linspace(0, 1, 5000)
    markdown = line_chart(
        "ROC curve",
        [
            Series("candidate (AUC = 0.61)", x, x**0.5),
            Series("chance", [0, 1], [0, 1], dashed=True),
        ],
        "false positive rate",
        "true positive rate",
        (-0.02, 1.02),
        (-0.02, 1.02),
    )
    labels = texts(svg_of(markdown, "ROC curve"))
    for label in ["ROC curve", "false positive rate", "true positive rate", "chance"]:
        assert label in labels
    assert "candidate (AUC = 0.61)" in labels
    assert {"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"} <= set(labels)
    # 5,000 points collapse to what shows at screen size.
    assert len(markdown) < 20_000


def test_line_chart_draws_steps_and_survives_non_finite_and_constant_values():
    markdown = line_chart(
        "Loss per epoch",
        [Series("training", [1, 2, 3], [0.5, np.nan, np.inf]), Series("kept", [2, 2], [1, 1])],
        "epoch",
        "loss",
    )
    assert "kept" in texts(svg_of(markdown, "Loss per epoch"))
    steps = line_chart("PR", [Series("s", [1.0, 0.5, 0.0], [0.2, 0.4, 1.0], steps=True)], "r", "p")
    path = next(p for p in svg_of(steps, "PR").iter(f"{SVG}path"))
    # steps-post: the value holds until the next x, then jumps.
    assert path.get("d").count("L") == 4


def test_confusion_matrix_shows_counts_and_labels():
    root = svg_of(
        confusion_matrix("Confusion matrix", np.array([[50, 7], [3, 40]]), ["0", "1"]),
        "Confusion matrix",
    )
    labels = texts(root)
    assert {"50", "7", "3", "40", "Predicted label", "True label"} <= set(labels)
    assert len(list(root.iter(f"{SVG}rect"))) == 1 + 4  # background and the cells


def test_scatter_keeps_one_dot_per_pixel():
    rng = np.random.default_rng(0)
    x = rng.normal(size=20_000)
    markdown = scatter("Residuals", x, rng.normal(size=20_000), "predicted", "actual - predicted")
    dots = next(p for p in svg_of(markdown, "Residuals").iter(f"{SVG}path")).get("d")
    assert 0 < dots.count("h0") < 20_000


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (-0.02, 1.02, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0.6512, 0.6761, [0.655, 0.66, 0.665, 0.67, 0.675]),
        (0, 30, [0, 5, 10, 15, 20, 25, 30]),
    ],
)
def test_nice_ticks(low, high, expected):
    np.testing.assert_allclose(nice_ticks(low, high), expected)
