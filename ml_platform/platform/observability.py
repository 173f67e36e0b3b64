"""Metadata helpers shared by the assets, so every stage reports the same way."""

import collections
import contextlib
import math
import os
import resource
import socket
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.platform.settings import Settings

# What a person reads in the UI: 0.6122, not 0.6121798279906177. Stored reports keep full precision.
SIGNIFICANT_DIGITS = 4


def readable(value: float) -> float:
    """`value` to SIGNIFICANT_DIGITS significant digits (integers, nan and inf as they are)."""
    if not math.isfinite(value) or value == 0 or float(value).is_integer():
        return value
    return round(value, SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(abs(value))))


def readable_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """`metadata` with its float values `readable`; structured values are left whole."""

    def shown(value: Any) -> Any:
        if isinstance(value, float):
            return readable(value)
        if isinstance(value, dg.FloatMetadataValue) and value.value is not None:
            return dg.MetadataValue.float(readable(value.value))
        return value

    return {key: shown(value) for key, value in metadata.items()}


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
        """Begin measuring, in this process (`worker`)."""
        if self.reset_peak:
            reset_peak_rss()
        # The figures are this process's: a training worker's travel back to the step with
        # its name, so that they are never recorded as the step's own process's.
        self.worker = worker_name()
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

    def metadata(self, prefix: str = "") -> dict[str, float | str]:
        """The figures as numeric metadata the UI plots across partitions, and whose they are.

        `worker` names the process measured (`worker_name`): the step's own, or a training
        worker's whose figures a day records as its step's (`training.assets.trained_where`).
        """
        return {
            f"{prefix}wall_seconds": round(self.wall_seconds, 3),
            f"{prefix}cpu_seconds": round(self.cpu_seconds, 3),
            f"{prefix}cpu_utilisation": round(self.cpu_utilisation, 3),
            f"{prefix}peak_rss_mb": round(self.peak_rss_mb, 1),
            f"{prefix}worker": self.worker,
        }


def worker_name() -> str:
    """The process computing this: `pool/host:pid` on a worker of a pool, else `host:pid`.

    A worker's pool is ML_PLATFORM_WORKER_POOL in its environment (set where the worker is
    started); the host and process tell the run's own process from a worker's.
    """
    where = f"{socket.gethostname()}:{os.getpid()}"
    pool = Settings().worker_pool
    return f"{pool}/{where}" if pool else where


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
    """Rows of a frame, or of the partitions read of a window (`inputs.WindowPartitions`).

    0 for anything else (a model, a report).
    """
    if isinstance(value, pd.DataFrame):
        return len(value)
    rows_read = getattr(value, "rows_read", None)
    if isinstance(rows_read, int):
        return rows_read
    return 0


# Prefix of the resource-use metadata of every asset step (steps.day_metrics).
STEP_PREFIX = "step_"
