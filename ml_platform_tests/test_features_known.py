"""Features and the lake's IO manager on shapes their normal days do not meet, each a bug once:
a day's categories that depended on its other rows, validated rows stored before the contract
gained a column, a stored file that the code reading it cannot load said to be damaged.
"""

import datetime as dt
import sys
import types

import dagster as dg
import pandas as pd
import pytest

from ml_platform.contracts import FeatureSpec
from ml_platform.features.transforms import feature_column
from ml_platform.ingestion.synthetic import generate_day
from ml_platform.platform.failures import DATA, DEPENDENCY_MISMATCH, classify_failure
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.storage import LocalStorage
from ml_platform.troubleshooting.diagnose import diagnose_run
from ml_platform_tests.test_features import typed
from ml_platform_tests.test_storage_errors import failure_of

DAY = "2024-01-02"


def feature(values: pd.Series, kind: str, transform: str) -> pd.Series:
    spec = FeatureSpec(name="f", kind=kind, source="source", transform=transform)
    return feature_column(pd.DataFrame({"source": values}), spec)


@pytest.mark.parametrize(
    ("transform", "category"),
    [("hour", "5"), ("minute_of_day", "310"), ("month", "1"), ("day_of_year", "2")],
)
def test_a_time_category_is_the_same_on_a_day_with_a_missing_time(transform, category):
    # The same 05:10 of a datetime column, on a day without a missing time and on one with
    # one (a cancelled flight's actual departure): one category, or the model learns two and
    # drift compares them as two.
    whole_day = pd.Series(pd.to_datetime([f"{DAY} 05:10", f"{DAY} 07:00"]))
    day_with_a_hole = pd.Series(pd.to_datetime([f"{DAY} 05:10", None]))

    assert feature(whole_day, "categorical", transform).iloc[0] == category
    holed = feature(day_with_a_hole, "categorical", transform)
    assert holed.iloc[0] == category
    assert pd.isna(holed.iloc[1])
    # As numbers, both days are floats, a missing time missing.
    numbers = feature(day_with_a_hole, "numeric", transform)
    assert numbers.dtype == "float64"
    assert numbers.iloc[0] == float(category) and pd.isna(numbers.iloc[1])


def test_validated_rows_stored_before_the_contract_gained_a_column_fail_their_day_naming_it(
    platform_for,
):
    # The contract gained the column `amount` and the feature log_amount on it: a day validated
    # before has no such column, and its features cannot be computed until it is validated
    # again. Said so, as a data failure, not as a KeyError classed a code bug.
    platform = platform_for("synthetic")
    rows = typed(generate_day(dt.date.fromisoformat(DAY), seed=7, rows=50), platform.contract)
    platform.put("validated_data", DAY, rows.drop(columns=["amount"]), "parquet")

    result = platform.materialize(DAY, ["features"])

    assert not result.success
    events = platform.instance.all_logs(result.run_id)
    kinds = [e.dagster_event.event_type for e in events if e.dagster_event]
    assert dg.DagsterEventType.STEP_UP_FOR_RETRY not in kinds  # waiting cannot add the column
    diagnosis = diagnose_run(platform.instance, result.run_id)
    (failure,) = diagnosis.failed_steps
    assert (
        f"{DAY}: ContractViolationError: synthetic/validated_data partition {DAY} lacks the "
        "column amount that the contract's features read"
    ) in failure.message
    assert f"--start {DAY} --days 1 --force" in failure.message
    assert diagnosis.classification is not None
    assert diagnosis.classification.failure_class == DATA
    assert platform.materialized("features") == set()


@pytest.mark.parametrize("change", ["module gone", "class gone"])
def test_a_model_file_written_by_other_code_is_not_said_to_be_damaged(
    tmp_path, monkeypatch, change
):
    # A day's model pickles the classes it holds by module and name: after an upgrade that
    # moved one (ml_platform's own, or scikit-learn's private modules), its bytes are whole but
    # this code cannot rebuild it. Restoring the file or waiting cannot help, and neither is
    # what a damaged file's message advises instead.
    old_code = types.ModuleType("old_code")
    exec("class OldModel:\n    weights = [1.0, 2.0]\n", old_code.__dict__)
    monkeypatch.setitem(sys.modules, "old_code", old_code)

    lake = LakeIOManager(storage=LocalStorage(base_dir=str(tmp_path / "lake")))
    key = f"tiny/model/{DAY}/run-0.joblib"
    lake.store_at(key, "joblib", old_code.OldModel())
    if change == "module gone":
        monkeypatch.delitem(sys.modules, "old_code")
    else:
        monkeypatch.delattr(old_code, "OldModel")

    with pytest.raises(dg.Failure) as raised:
        lake.load_key(key, "joblib", what=f"tiny/model partition {DAY}")

    stop = raised.value
    assert not stop.allow_retries
    message = stop.description or ""
    assert message.startswith(f"tiny/model partition {DAY} cannot be read: ")
    assert str(tmp_path / "lake" / key) in message
    assert "damaged" not in message
    assert "written by code" in message
    assert "materialise the day again" in message
    assert isinstance(stop.__cause__, ImportError | AttributeError)
    if change == "module gone":
        # Classed by its cause, a missing module: not a data failure.
        verdict = classify_failure([failure_of(stop, "tiny__model")], [])
        assert verdict.failure_class == DEPENDENCY_MISMATCH
