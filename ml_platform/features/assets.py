"""features: model inputs of each day, computed row-wise from validated rows."""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.schema import ContractViolationError
from ml_platform.features.profile import feature_profile
from ml_platform.features.transforms import build_features, read_columns
from ml_platform.platform.datasets import asset_key, dataset_name, writer_pool
from ml_platform.platform.formats import FORMAT_KEY
from ml_platform.platform.observability import table_schema
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.platform.sizes import request_metadata, step_tags
from ml_platform.platform.steps import daily_backfill_policy, each_day


def build_features_asset(
    contract: Contract, partitions: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    """The features asset of a dataset."""

    @dg.asset(
        name="features",
        key_prefix=contract.name,
        pool=writer_pool(contract.name, "features"),
        ins={"validated_data": dg.AssetIn(asset_key(contract.name, "validated_data"))},
        partitions_def=partitions,
        backfill_policy=daily_backfill_policy(),
        retry_policy=STORAGE_RETRY_POLICY,
        group_name=dataset_name(contract.name, "features"),
        kinds={"pandas", "parquet"},
        metadata={FORMAT_KEY: "parquet", **request_metadata(contract, "features")},
        op_tags=step_tags(contract, "features"),
    )
    def features(context: dg.AssetExecutionContext, validated_data: Any) -> Iterator:
        """Model inputs of day D: the contract's features, the event time and the label.

        Deterministic and row-wise: nothing is fitted here, so a day's features never depend
        on other days, and columns that leak the label never appear. Each feature's profile
        (count, nulls, mean, std, min, quantiles, max; categories and top share for
        categorical features) is recorded as `profile/<feature>/<statistic>`, so the UI plots
        every feature across days.
        """

        def day_of_features(day: str, validated_data: pd.DataFrame) -> Iterator:
            lacking = [c for c in read_columns(contract) if c not in validated_data.columns]
            if lacking:
                # A day validated before the contract gained a column: only validating it
                # again gives it one, whatever the retries.
                where = asset_key(contract.name, "validated_data").to_user_string()
                columns, them = ("columns", "them") if len(lacking) > 1 else ("column", "it")
                raise ContractViolationError(
                    f"{where} partition {day} lacks the {columns} {', '.join(lacking)} that "
                    "the contract's features read: it was validated before the contract "
                    f"declared {them}. Materialise the day again from raw_data: `ml-platform "
                    f"materialize --dataset {contract.name} --start {day} --days 1 --force`"
                )
            frame = build_features(validated_data, contract)
            profile = {
                f"profile/{key}": value for key, value in feature_profile(frame, contract).items()
            }
            yield dg.MaterializeResult(
                value=frame,
                metadata={
                    "dagster/row_count": len(frame),
                    "dagster/column_schema": table_schema(frame),
                    "labelled_rows": int(frame[contract.label_name].notna().sum()),
                    **profile,
                },
            )

        yield from each_day(context, day_of_features, validated_data=validated_data)

    return features
