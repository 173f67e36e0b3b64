"""Metadata helpers shared by the assets, so every stage reports the same way."""

import collections
import contextlib
import functools
import inspect
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import dagster as dg
import pandas as pd


def table_schema(frame: pd.DataFrame) -> dg.TableSchema:
    """Column names and dtypes of a frame, for the `dagster/column_schema` metadata."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(name=str(name), type=str(dtype)) for name, dtype in frame.dtypes.items()
        ]
    )


PROC_SELF = Path("/proc/self")


def reset_peak_rss() -> None:
    """Start a new peak-memory measurement for this process, where the OS can.

    Linux resets the peak resident set size (VmHWM) when "5" is written to clear_refs. Steps of
    a run share one process (in-process executor), so without the reset every step would
    report the largest peak of the steps before it.
    """
    # Not Linux: peak_rss_mb then reports the peak since the process started.
    with contextlib.suppress(OSError):
        (PROC_SELF / "clear_refs").write_text("5")


def peak_rss_mb() -> float:
    """Peak resident memory of this process since the last reset (MiB)."""
    try:
        for line in (PROC_SELF / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass  # not Linux: fall back to the peak since the process started
    # Linux reports ru_maxrss in KiB, macOS in bytes; /proc exists on Linux, so this is macOS.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024


class StepTelemetry:
    """Wall time, CPU time, CPU utilisation and peak memory of a block of work."""

    def __init__(self, reset_peak: bool = False) -> None:
        self.reset_peak = reset_peak

    def start(self) -> "StepTelemetry":
        """Begin measuring."""
        if self.reset_peak:
            reset_peak_rss()
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        return self

    def stop(self) -> None:
        """Take the figures since `start`."""
        self.wall_seconds = time.perf_counter() - self._wall
        self.cpu_seconds = time.process_time() - self._cpu
        self.peak_rss_mb = peak_rss_mb()

    def __enter__(self) -> "StepTelemetry":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def cpu_utilisation(self) -> float:
        """CPU seconds per wall second (1.0 = one core busy all the time)."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def metadata(self, prefix: str = "") -> dict[str, float]:
        """The figures as numeric metadata the UI plots across partitions."""
        return {
            f"{prefix}wall_seconds": round(self.wall_seconds, 3),
            f"{prefix}cpu_seconds": round(self.cpu_seconds, 3),
            f"{prefix}cpu_utilisation": round(self.cpu_utilisation, 3),
            f"{prefix}peak_rss_mb": round(self.peak_rss_mb, 1),
        }


# Bytes the IO manager loaded for each op's inputs, taken when the op's step starts computing.
# Inputs are loaded in the step's own process just before its compute function runs.
_bytes_read: collections.Counter[str] = collections.Counter()


def record_bytes_read(op_name: str, size: int) -> None:
    """Count bytes loaded from storage as an input of `op_name` (called by the IO manager)."""
    _bytes_read[op_name] += size


def take_bytes_read(op_name: str) -> int:
    """Bytes loaded for `op_name`'s inputs since the last call, and start counting afresh."""
    return _bytes_read.pop(op_name, 0)


def row_count(value: Any) -> int:
    """Rows of a frame, or of the frames of a partition window (a dict); 0 for anything else."""
    if isinstance(value, pd.DataFrame):
        return len(value)
    if isinstance(value, dict):
        return sum(row_count(item) for item in value.values())
    return 0


STEP_PREFIX = "step_"
Fn = TypeVar("Fn", bound=Callable[..., Any])


def step_metrics(op_name: str) -> Callable[[Fn], Fn]:
    """Record an asset step's resource use and data volume as numeric metadata.

    Put it under `@dg.asset(name=op_name, ...)` of an asset that returns or yields a
    `dg.MaterializeResult` (with `value=` when the IO manager stores it). Every materialisation
    then carries
    `step_wall_seconds`, `step_cpu_seconds`, `step_cpu_utilisation`, `step_peak_rss_mb`,
    `rows_in`, `rows_out` and `bytes_read` (the IO manager adds `stored_bytes`, the bytes
    written), which the UI plots across partitions and `ml-platform health` sizes containers
    from. The wrapped function keeps its signature (Dagster reads inputs and resources from it).
    """

    def decorate(fn: Fn) -> Fn:
        def metrics(telemetry: StepTelemetry, rows_in: int, value: Any) -> dict[str, float]:
            return {
                **telemetry.metadata(prefix=STEP_PREFIX),
                "rows_in": rows_in,
                "rows_out": row_count(value),
                "bytes_read": take_bytes_read(op_name),
            }

        def annotate(item: Any, telemetry: StepTelemetry, rows_in: int) -> Any:
            if isinstance(item, dg.MaterializeResult):
                return dg.MaterializeResult(
                    asset_key=item.asset_key,
                    metadata={**metrics(telemetry, rows_in, item.value), **(item.metadata or {})},
                    check_results=item.check_results,
                    data_version=item.data_version,
                    tags=item.tags,
                    value=item.value,
                )
            # Dagster rejects an Output where the function is annotated with a plain type, so
            # the metrics ride on the MaterializeResult every platform asset returns.
            raise TypeError(
                f"{op_name}: @step_metrics needs the asset to return or yield a "
                f"dg.MaterializeResult, not {type(item).__name__}"
            )

        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def generator(*args: Any, **kwargs: Any) -> Any:
                rows_in = sum(row_count(v) for v in kwargs.values())
                telemetry = StepTelemetry(reset_peak=True).start()
                for item in fn(*args, **kwargs):
                    if isinstance(item, dg.MaterializeResult):
                        # The result is the step's last item: measure up to it.
                        telemetry.stop()
                        item = annotate(item, telemetry, rows_in)
                    yield item

            return generator  # type: ignore[return-value]

        @functools.wraps(fn)
        def function(*args: Any, **kwargs: Any) -> Any:
            rows_in = sum(row_count(v) for v in kwargs.values())
            with StepTelemetry(reset_peak=True) as telemetry:
                result = fn(*args, **kwargs)
            return annotate(result, telemetry, rows_in)

        return function  # type: ignore[return-value]

    return decorate
