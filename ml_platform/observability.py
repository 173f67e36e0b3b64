"""Metadata helpers shared by the assets, so every stage reports the same way."""

import base64
import io
import resource
import time
from typing import Any

import dagster as dg
import pandas as pd


def table_schema(frame: pd.DataFrame) -> dg.TableSchema:
    """Column names and dtypes of a frame, for the `dagster/column_schema` metadata."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(name=str(name), type=str(dtype)) for name, dtype in frame.dtypes.items()
        ]
    )


def figure_markdown(figure: Any, alt: str) -> str:
    """A matplotlib figure as a markdown image (inline PNG), for reports shown in the UI."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    plt.close(figure)
    encoded = base64.b64encode(buffer.getvalue()).decode()
    return f"![{alt}](data:image/png;base64,{encoded})"


def new_figure(width: float = 4.5, height: float = 3.0) -> tuple[Any, Any]:
    """A figure and its axes, drawn off-screen (no display on servers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


class StepTelemetry:
    """Wall time, CPU time, CPU utilisation and peak memory of a block of work."""

    def __enter__(self) -> "StepTelemetry":
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_seconds = time.perf_counter() - self._wall
        self.cpu_seconds = time.process_time() - self._cpu
        # Peak resident memory of the process so far (Linux reports kilobytes).
        self.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    @property
    def cpu_utilisation(self) -> float:
        """CPU seconds per wall second (1.0 = one core busy all the time)."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def metadata(self) -> dict[str, float]:
        """The figures as numeric metadata the UI plots across partitions."""
        return {
            "wall_seconds": round(self.wall_seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "cpu_utilisation": round(self.cpu_utilisation, 3),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
        }
