"""A vectorised Great Expectations range metric for pandas' nullable numeric dtypes.

GE 1.x's pandas `column_values.between` metric compares values in a vectorised way only when a
column's dtype is numpy int/float or datetime; for the nullable extension dtypes a typed
partition uses (`Int64`, `Int8`, `Float64`) it falls back to a Python function called once per
value: about 3 s per column at 1M rows. This registers the same metric, with the same semantics,
that takes GE's own vectorised path for those dtypes too. Expectations, results and Data Docs are
GE's: only the computation of one metric on one engine changes.

Importing this module registers the metric (GE's registry lets a provider be replaced).
"""

import inspect
import logging
from typing import Any

import pandas as pd
from great_expectations.execution_engine import PandasExecutionEngine
from great_expectations.expectations.metrics.column_map_metrics.column_values_between import (
    ColumnValuesBetween,
)
from great_expectations.expectations.metrics.map_metric_provider import column_condition_partial

# GE's own implementation, below its decorators: the fallback for every other dtype.
_default_between = inspect.unwrap(ColumnValuesBetween._pandas)


def _is_nullable_number(dtype: Any) -> bool:
    return (
        isinstance(dtype, pd.api.extensions.ExtensionDtype)
        and pd.api.types.is_numeric_dtype(dtype)
        and not pd.api.types.is_bool_dtype(dtype)
    )


# GE warns when a metric provider is replaced; here the replacement is the point.
_registry_logger = logging.getLogger("great_expectations.expectations.registry")
_level = _registry_logger.level
_registry_logger.setLevel(logging.ERROR)
try:

    class NullableAwareColumnValuesBetween(ColumnValuesBetween):
        """`column_values.between`, vectorised for nullable numeric columns as for numpy ones."""

        condition_metric_name = "column_values.between"

        @column_condition_partial(engine=PandasExecutionEngine)
        def _pandas(
            cls,
            column: pd.Series,
            min_value: Any = None,
            max_value: Any = None,
            strict_min: Any = None,
            strict_max: Any = None,
            **kwargs: Any,
        ) -> pd.Series:
            if _is_nullable_number(column.dtype):
                # Missing values were filtered out by GE before this call, so the comparison
                # holds no NA and means the same as GE's per-value function.
                return ColumnValuesBetween._pandas_vectorized(
                    column, min_value, max_value, strict_min, strict_max
                )
            return _default_between(
                cls,
                column,
                min_value=min_value,
                max_value=max_value,
                strict_min=strict_min,
                strict_max=strict_max,
                **kwargs,
            )
finally:
    _registry_logger.setLevel(_level)
