"""raw_data: the landed file of each day, kept as it arrived."""

import hashlib
import io
import warnings
from collections.abc import Sequence

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.ingestion.landing import LandingZone
from ml_platform.observability import table_schema
from ml_platform.storage import FORMAT_KEY
from ml_platform.validation.schema import raw_schema

RAW_SCHEMA_CHECK = "raw_schema"


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
            return pd.read_csv(
                io.BytesIO(data),
                keep_default_na=False,
                na_values=[""],
                index_col=False,
                dtype=dict.fromkeys(text_columns, "str"),
            )
    except (
        pd.errors.ParserError,
        pd.errors.ParserWarning,
        pd.errors.EmptyDataError,
        UnicodeDecodeError,
    ) as exc:
        raise LandingFileError(
            f"{file_name} (partition {partition}) is not a readable CSV file: {exc}"
        ) from exc


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


def build_raw_data(contract: Contract, partitions: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    """The raw_data asset of a dataset."""

    @dg.asset(
        name="raw_data",
        partitions_def=partitions,
        group_name="ingestion",
        kinds={"csv", "parquet"},
        metadata={FORMAT_KEY: "parquet", "dataset": contract.name},
        check_specs=[
            dg.AssetCheckSpec(
                RAW_SCHEMA_CHECK,
                asset="raw_data",
                blocking=True,
                description="The landed file has the contract's columns, each of a castable type.",
            )
        ],
    )
    def raw_data(context: dg.AssetExecutionContext, landing: LandingZone):
        """The file that landed for day D, read as-is and stored as parquet.

        Its schema is checked against the dataset contract; a mismatch fails the blocking
        `raw_schema` check, so nothing downstream runs on that day.
        """
        day = context.partition_key
        file_name = contract.landing.file_name(day)
        data = landing.read_bytes(file_name, day)
        text_columns = [c.name for c in contract.columns if c.dtype == "str"]
        frame = read_landed_file(data, file_name, day, text_columns)
        digest = hashlib.sha256(data).hexdigest()
        return dg.MaterializeResult(
            value=frame,
            data_version=dg.DataVersion(digest),
            metadata={
                "dagster/row_count": len(frame),
                "dagster/column_schema": table_schema(frame),
                "source_file": dg.MetadataValue.path(str(landing.path_for(file_name))),
                "source_bytes": len(data),
                "source_sha256": digest,
            },
            check_results=[schema_check_result(frame, contract, file_name, day)],
        )

    return raw_data
