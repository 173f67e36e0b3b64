"""validated_data: typed rows of each day, per the contract, behind a blocking schema check."""

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.model import EVENT_TIME
from ml_platform.observability import table_schema
from ml_platform.storage import FORMAT_KEY
from ml_platform.validation.schema import SAMPLE_SIZE, expected_typed_dtypes, type_rows

TYPED_SCHEMA_CHECK = "typed_schema"


def typed_schema_result(typed: pd.DataFrame, contract: Contract, partition: str, file_name: str):
    """Blocking check that the typed rows have the contract's dtypes and all fall on the day."""
    problems = []
    expected = expected_typed_dtypes(contract)
    actual = {str(k): str(v) for k, v in typed.dtypes.items()}
    if actual != expected:
        wrong = {
            c: f"{actual.get(c, 'absent')} instead of {t}"
            for c, t in expected.items()
            if actual.get(c) != t
        }
        problems.append(f"typed columns differ from the contract: {wrong}")
    dates = typed[EVENT_TIME].dt.strftime("%Y-%m-%d")
    outside = typed[dates != partition]
    if len(outside):
        sample = ", ".join(sorted(set(dates[outside.index]))[:SAMPLE_SIZE])
        problems.append(
            f"{len(outside)} of {len(typed)} rows have event dates outside {partition} "
            f"(e.g. {sample}); the upstream file holds the wrong day's rows"
        )
    return dg.AssetCheckResult(
        check_name=TYPED_SCHEMA_CHECK,
        passed=not problems,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(
            f"{file_name} (partition {partition}): " + "; ".join(problems) + "."
            if problems
            else f"{len(typed)} typed rows of {partition} match the contract."
        ),
        metadata={
            "rows_outside_partition": len(outside),
            "outside_sample": dg.MetadataValue.md(
                outside.head(SAMPLE_SIZE).to_markdown(index=False) if len(outside) else "none"
            ),
        },
    )


def build_validated_data(
    contract: Contract, partitions: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    """The validated_data asset of a dataset."""

    @dg.asset(
        name="validated_data",
        partitions_def=partitions,
        group_name="validation",
        kinds={"pandas", "parquet"},
        metadata={FORMAT_KEY: "parquet"},
        check_specs=[
            dg.AssetCheckSpec(
                TYPED_SCHEMA_CHECK,
                asset="validated_data",
                blocking=True,
                description="Typed columns match the contract and every row falls on the day.",
            )
        ],
    )
    def validated_data(context: dg.AssetExecutionContext, raw_data: pd.DataFrame):
        """Rows of day D cast to the contract's types, with the local event time and the label.

        Text is trimmed and empty text is missing. Rows whose label is not known yet (e.g. a
        cancelled flight has no arrival delay) are kept with an empty label and counted; the
        model does not train on them.
        """
        day = context.partition_key
        file_name = contract.landing.file_name(day)
        typed = type_rows(raw_data, contract, where=f"{file_name} (partition {day})")
        return dg.MaterializeResult(
            value=typed,
            metadata={
                "dagster/row_count": len(typed),
                "dagster/column_schema": table_schema(typed),
                "rows_without_label": int(typed[contract.label_name].isna().sum()),
            },
            check_results=[typed_schema_result(typed, contract, day, file_name)],
        )

    return validated_data
