"""raw_data: the landed file of each day, kept as it arrived."""

import csv
import datetime as dt
import hashlib
import io
import warnings
from collections.abc import Iterator, Sequence

import dagster as dg
import pandas as pd

from ml_platform.automation.retries import STORAGE_RETRY_POLICY
from ml_platform.contracts import Contract
from ml_platform.ingestion.landing import LandingZone, MissingLandingFileError
from ml_platform.observability import record_bytes_read, table_schema
from ml_platform.runbook import check_description
from ml_platform.steps import SINGLE_RUN, each_day
from ml_platform.storage import FORMAT_KEY
from ml_platform.validation.schema import raw_schema

RAW_SCHEMA_CHECK = "raw_schema"
SCHEMA_CHANGE_CHECK = "schema_change"


class LandingFileError(ValueError):
    """A landed file exists but cannot be read as its declared format."""


def read_landed_file(
    data: bytes, file_name: str, partition: str, text_columns: Sequence[str] = ()
) -> pd.DataFrame:
    """Parse a landed CSV as-is, with inferred types except for `text_columns`, read as text.

    Only empty fields are read as missing, so text like 'n/a' in a number column stays visible
    to the schema check instead of silently becoming NaN; text columns keep text that looks
    like a number ('00501' stays '00501'). A row with more fields than the header is an error,
    not a shift of its values into other columns.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            frame = pd.read_csv(
                io.BytesIO(data),
                keep_default_na=False,
                na_values=[""],
                index_col=False,
                dtype=dict.fromkeys(text_columns, "str"),
            )
        _check_last_line(data, frame)
    except (
        pd.errors.ParserError,
        pd.errors.ParserWarning,
        pd.errors.EmptyDataError,
        UnicodeDecodeError,
    ) as exc:
        raise LandingFileError(
            f"{file_name} (partition {partition}) is not a readable CSV file: {exc}"
        ) from exc
    return frame


def _check_last_line(data: bytes, frame: pd.DataFrame) -> None:
    """A file cut off mid-row ends with a row of fewer fields than its header.

    pandas fills the missing fields with NaN, so the cut would pass as missing values. Only the
    last line can be cut, so only it is compared with the header; the parsed last row must miss
    those fields too (a quoted field spanning lines would otherwise look short).
    """
    # Offsets, not split or rstrip: those would copy the whole file (300 MB at 1M rows).
    end = len(data)
    while end and data[end - 1] in b"\r\n":
        end -= 1
    last_start = data.rfind(b"\n", 0, end) + 1
    if last_start == 0 or frame.empty:
        return
    lines = (data[: data.find(b"\n")], data[last_start:end])
    header, last = (next(csv.reader([line.decode()])) for line in lines)
    if len(last) < len(header) and frame.iloc[-1, len(last) :].isna().all():
        raise pd.errors.ParserError(
            f"its last line has {len(last)} of the header's {len(header)} fields: "
            "the file looks truncated"
        )


def schema_check_result(frame: pd.DataFrame, contract: Contract, file_name: str, partition: str):
    """The blocking schema check of a landed file, with a description a person can act on."""
    report = raw_schema(frame, contract)
    if report.ok:
        description = f"{file_name} (partition {partition}): {report.describe()}."
    else:
        description = (
            f"{file_name} (partition {partition}) does not match contract '{contract.name}': "
            f"{report.describe()}. Fix the upstream export and re-land the file, or change the "
            "contract if the change is intended."
        )
    return dg.AssetCheckResult(
        check_name=RAW_SCHEMA_CHECK,
        passed=report.ok,
        severity=dg.AssetCheckSeverity.ERROR,
        description=description,
        metadata={
            "file": file_name,
            "missing_columns": report.missing,
            "unexpected_columns": report.unexpected,
            "retyped_columns": report.retyped,
        },
    )


def schema_change_result(
    current: dg.TableSchema, previous: dg.TableSchema | None, previous_day: str, where: str
) -> dg.AssetCheckResult:
    """Warn when a day's columns differ from the previous day's: new, missing or retyped."""
    if previous is None:
        return dg.AssetCheckResult(
            check_name=SCHEMA_CHANGE_CHECK,
            passed=True,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"{where}: no materialised {previous_day} to compare with.",
        )
    before = {c.name: c.type for c in previous.columns}
    now = {c.name: c.type for c in current.columns}
    new = [c for c in now if c not in before]
    missing = [c for c in before if c not in now]
    retyped = {c: f"{before[c]} -> {now[c]}" for c in now if c in before and now[c] != before[c]}
    changes = []
    if new:
        changes.append(f"new column(s) {', '.join(new)}")
    if missing:
        changes.append(f"missing column(s) {', '.join(missing)}")
    changes += [f"column {c} changed type {change}" for c, change in retyped.items()]
    return dg.AssetCheckResult(
        check_name=SCHEMA_CHANGE_CHECK,
        passed=not changes,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"{where}: schema changed since {previous_day}: {'; '.join(changes)}. Ask the "
            "upstream owner whether the change is intended before it reaches the model."
            if changes
            else f"{where}: same columns and types as {previous_day}."
        ),
        metadata={"new_columns": new, "missing_columns": missing, "retyped_columns": retyped},
    )


def previous_column_schema(
    context: dg.AssetExecutionContext, contract: Contract, day: str
) -> tuple[str, dg.TableSchema | None]:
    """The previous day and the column schema recorded by its latest raw_data materialisation."""
    previous = dt.date.fromisoformat(day) - dt.timedelta(days=1)
    previous_day = previous.isoformat()
    if previous < contract.partitions.start_date:
        return previous_day, None
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=context.asset_key, asset_partitions=[previous_day]),
        limit=1,
    ).records
    if not records or records[0].asset_materialization is None:
        return previous_day, None
    schema = records[0].asset_materialization.metadata.get("dagster/column_schema")
    return previous_day, schema.value if schema is not None else None


def build_raw_data(contract: Contract, partitions: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    """The raw_data asset of a dataset."""

    @dg.asset(
        name="raw_data",
        partitions_def=partitions,
        backfill_policy=SINGLE_RUN,
        retry_policy=STORAGE_RETRY_POLICY,
        group_name="ingestion",
        kinds={"csv", "parquet"},
        metadata={FORMAT_KEY: "parquet", "dataset": contract.name},
        check_specs=[
            dg.AssetCheckSpec(
                RAW_SCHEMA_CHECK,
                asset="raw_data",
                blocking=True,
                description=check_description(
                    RAW_SCHEMA_CHECK,
                    "The landed file has the contract's columns, each of a castable type.",
                ),
            ),
            dg.AssetCheckSpec(
                SCHEMA_CHANGE_CHECK,
                asset="raw_data",
                description=check_description(
                    SCHEMA_CHANGE_CHECK,
                    "The file has the same columns and types as the previous day's.",
                ),
            ),
        ],
    )
    def raw_data(context: dg.AssetExecutionContext, landing: LandingZone) -> Iterator:
        """The file that landed for day D, read as-is and stored as parquet.

        Its schema is checked against the dataset contract: a mismatch fails the blocking
        `raw_schema` check and the step, so nothing downstream runs on that day and the
        previous version of the partition is kept. `schema_change` warns when the columns
        differ from the previous day's.
        """
        text_columns = [c.name for c in contract.columns if c.dtype == "str"]
        # Schemas of the days this step has read: in a range, the previous day's
        # materialisation is recorded only when the whole range is.
        schemas: dict[str, dg.TableSchema] = {}

        def day_of_raw_data(day: str) -> Iterator:
            file_name = contract.landing.file_name(day)
            where = f"{file_name} (partition {day})"
            try:
                data = landing.read_bytes(file_name, day)
                frame = read_landed_file(data, file_name, day, text_columns)
            except (MissingLandingFileError, LandingFileError) as exc:
                # Retrying will not land a file nor repair one: fail now (the landing sensor
                # runs the day when a corrected file lands) instead of after the retry
                # policy's backoff.
                raise dg.Failure(description=str(exc), allow_retries=False) from exc
            # The landed file is this step's input; the lake IO manager counts the others'.
            record_bytes_read("raw_data", len(data))
            schema = table_schema(frame)
            previous_day, previous = previous_column_schema(context, contract, day)
            previous = schemas.get(previous_day, previous)
            yield schema_change_result(schema, previous, previous_day, where)
            check = schema_check_result(frame, contract, file_name, day)
            yield check
            if not check.passed:
                raise dg.Failure(description=check.description, allow_retries=False)
            schemas[day] = schema
            digest = hashlib.sha256(data).hexdigest()
            yield dg.MaterializeResult(
                value=frame,
                data_version=dg.DataVersion(digest),
                metadata={
                    "dagster/row_count": len(frame),
                    "dagster/column_schema": schema,
                    "source_file": dg.MetadataValue.path(str(landing.path_for(file_name))),
                    "source_bytes": len(data),
                    "source_sha256": digest,
                },
            )

        yield from each_day(context, day_of_raw_data)

    return raw_data
