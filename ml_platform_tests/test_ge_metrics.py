"""GE's range metric on nullable integer columns: vectorised, with GE's own semantics."""

import great_expectations as gx
import pandas as pd
import pytest
from great_expectations.execution_engine import PandasExecutionEngine
from great_expectations.expectations.registry import get_metric_provider

from ml_platform.ingestion.assets import LandingFileError, read_landed_file
from ml_platform.validation.ge_metrics import NullableAwareColumnValuesBetween


@pytest.fixture(scope="module")
def batch_definition():
    context = gx.get_context(mode="ephemeral")
    asset = context.data_sources.add_pandas("t").add_dataframe_asset("frame")
    return asset.add_batch_definition_whole_dataframe("all")


def unexpected(batch_definition, series: pd.Series, **bounds) -> list:
    frame = pd.DataFrame({"v": series})
    expectation = gx.expectations.ExpectColumnValuesToBeBetween(column="v", **bounds)
    result = batch_definition.get_batch(batch_parameters={"dataframe": frame}).validate(
        expectation, result_format="COMPLETE"
    )
    assert not result.exception_info.get("raised_exception"), result.exception_info
    return result.result["unexpected_list"]


def test_ge_computes_ranges_with_the_vectorised_metric():
    provider, _ = get_metric_provider("column_values.between.condition", PandasExecutionEngine())
    assert provider is NullableAwareColumnValuesBetween


@pytest.mark.parametrize("dtype", ["Int64", "Int8", "Float64"])
def test_nullable_numbers_are_checked_like_numpy_ones_and_nulls_are_not_counted(
    batch_definition, dtype
):
    values = pd.Series([1, 5, None, 10, -3, 7], dtype=dtype)
    assert unexpected(batch_definition, values, min_value=0, max_value=7) == [10, -3]
    assert unexpected(batch_definition, values, min_value=1) == [-3]
    assert unexpected(batch_definition, values, max_value=5, strict_max=True) == [5, 10, 7]
    assert unexpected(batch_definition, values, min_value=1, strict_min=True) == [1, -3]


def test_other_dtypes_keep_ges_own_implementation(batch_definition):
    mixed = pd.Series([1, 50, 3], dtype=object)  # GE's per-value path
    assert unexpected(batch_definition, mixed, min_value=0, max_value=10) == [50]
    floats = pd.Series([0.5, 2.5, float("nan")])
    assert unexpected(batch_definition, floats, min_value=0.0, max_value=1.0) == [2.5]


def test_a_file_cut_mid_row_is_an_error_naming_file_and_partition():
    data = b"a,b,c\n1,2,3\n4,5,6\n7,"
    with pytest.raises(LandingFileError, match=r"f\.csv \(partition 2024-01-01\).*truncated"):
        read_landed_file(data, "f.csv", "2024-01-01")


def test_a_quoted_field_spanning_lines_at_the_end_is_not_taken_for_a_cut():
    data = b'a,b,c\n1,2,3\n4,5,"six\nand a half"\n'
    frame = read_landed_file(data, "f.csv", "2024-01-01")
    assert len(frame) == 2
    assert frame["c"].iloc[-1] == "six\nand a half"
