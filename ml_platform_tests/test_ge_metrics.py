"""GE's own range metric, fast on the frames the gate hands it; and landed files cut mid-row.

The gate hands GE its typed rows through `ge_frame`: nullable integer columns without missing
values as numpy integers, which GE's own `column_values.between` compares in one vectorised
step. No metric of GE's is replaced; the verdicts are those on the typed rows.
"""

import datetime as dt

import great_expectations as gx
import pandas as pd
import pytest
from great_expectations.execution_engine import PandasExecutionEngine
from great_expectations.expectations.metrics import ColumnValuesBetween
from great_expectations.expectations.registry import get_metric_provider

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import EVENT_TIME
from ml_platform.contracts.schema import type_rows
from ml_platform.ingestion.assets import LandingFileError, read_landed_file
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.validation.expectations import ge_frame, quality_gate


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
    return [int(v) for v in result.result["unexpected_list"]]


def test_ge_computes_ranges_with_its_own_metric():
    quality_gate(load_contract("flights"))  # the platform's gate registers nothing of its own
    provider, _ = get_metric_provider("column_values.between.condition", PandasExecutionEngine())
    assert provider is ColumnValuesBetween


def test_nullable_integers_without_missing_values_are_handed_to_ge_as_numpy():
    frame = pd.DataFrame(
        {
            "full": pd.array([1, 2, 3], dtype="Int64"),
            "holed": pd.array([1, None, 3], dtype="Int64"),
            "label": pd.array([0, 1, 1], dtype="Int8"),
            "x": [0.5, float("nan"), 1.5],
            "s": pd.Series(["a", None, "c"], dtype="str"),
        }
    )
    handed = ge_frame(frame)
    assert {name: str(dtype) for name, dtype in handed.dtypes.items()} == {
        "full": "int64",
        "holed": "Int64",  # as floats it would fail its type rule: GE's per-value path
        "label": "int8",
        "x": "float64",
        "s": "str",
    }
    pd.testing.assert_frame_equal(handed, frame, check_dtype=False)
    assert str(frame["full"].dtype) == "Int64", "the typed rows are left as they are"


@pytest.mark.parametrize("dtype", ["Int64", "Int8"])
@pytest.mark.parametrize("missing", [False, True])
def test_ge_reaches_the_same_range_verdicts_on_the_frame_it_is_handed(
    batch_definition, dtype, missing
):
    values = pd.Series([1, 5, None if missing else 4, 10, -3, 7], dtype=dtype)
    handed = ge_frame(pd.DataFrame({"v": values}))["v"]
    assert (handed.dtype == dtype) == missing
    for bounds in (
        {"min_value": 0, "max_value": 7},
        {"min_value": 1},
        {"max_value": 5, "strict_max": True},
        {"min_value": 1, "strict_min": True},
    ):
        assert unexpected(batch_definition, handed, **bounds) == unexpected(
            batch_definition, values, **bounds
        ), bounds


def test_the_gate_reaches_the_same_results_on_a_real_day_as_on_its_typed_rows(batch_definition):
    contract = load_contract("flights")
    day = dt.date(2013, 1, 1)
    name = contract.landing.file_name(day.isoformat())
    text = [c.name for c in contract.columns if c.dtype == "str"]
    raw = read_landed_file(flights_for_day(day).to_csv(index=False).encode(), name, "x", text)
    typed = type_rows(raw, contract, where=name).reset_index(drop=True)
    # Broken values in integer columns with and without missing values, and in the row key.
    typed.loc[3, "month"] = 13
    typed.loc[4, "dep_time"] = 2401
    typed.loc[5, "flight"] = 0
    typed.loc[7, EVENT_TIME] = typed.loc[7, EVENT_TIME] + pd.Timedelta(days=1)
    typed = pd.concat([typed, typed.iloc[[10]]], ignore_index=True)
    gate = quality_gate(contract)
    handed = ge_frame(typed)
    assert str(handed["month"].dtype) == "int64" and str(handed["dep_time"].dtype) == "Int64"

    def results(frame: pd.DataFrame) -> list[dict]:
        batch = gate.batch_definition.get_batch(batch_parameters={"dataframe": frame})
        result = batch.validate(
            gate.suite,
            expectation_parameters=gate.parameters(day.isoformat(), None),
            result_format="COMPLETE",
        )
        return result.to_json_dict()["results"]

    on_typed, on_handed = results(typed), results(handed)
    assert on_handed == on_typed
    failed = {
        r["expectation_config"]["kwargs"].get("column") for r in on_handed if not r["success"]
    }
    assert {"month", "dep_time", "flight", EVENT_TIME} <= failed


def test_a_file_cut_mid_row_is_an_error_naming_file_and_partition():
    data = b"a,b,c\n1,2,3\n4,5,6\n7,"
    with pytest.raises(LandingFileError, match=r"f\.csv \(partition 2024-01-01\).*truncated"):
        read_landed_file(data, "f.csv", "2024-01-01")


def test_a_quoted_field_spanning_lines_at_the_end_is_not_taken_for_a_cut():
    data = b'a,b,c\n1,2,3\n4,5,"six\nand a half"\n'
    frame = read_landed_file(data, "f.csv", "2024-01-01")
    assert len(frame) == 2
    assert frame["c"].iloc[-1] == "six\nand a half"
