"""The quality gate on shapes of days it was not designed around: Unicode forms, degenerate days."""

import unicodedata

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ml_platform.contracts.model import parse_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.validation.expectations import VALIDITY, quality_gate
from ml_platform.validation.history import day_profile, window_from_profiles
from ml_platform.validation.range_gate import range_screen, screen_range

# GE's fixed cost per validation is most of it.
pytestmark = pytest.mark.slow

CONTRACT = """
name: shapes
owners: []
source: {kind: external}
partitions: {start_date: 2024-01-01}
landing: {file_pattern: "shapes_{date}.csv", format: csv}
event_time: {column: ts, timezone: UTC}
columns:
  - {name: ts, dtype: datetime}
  - {name: id, dtype: int, min: 1, unique: true}
  - {name: amount, dtype: float, min: 0, max: 100}
  - {name: city, dtype: str, allowed_values: ["Zürich", "São Paulo", "東京"]}
  - {name: note, dtype: str, nullable: true}
  - {name: y, dtype: int, nullable: true}
label: {name: y_label, task: classification, source: y, rule: {op: "==", value: 1}}
leakage_columns: []
features:
  - {name: amount, kind: numeric, source: amount}
quality:
  row_count: {min: 1, max: 1000}
  row_key: [id]
  history: {reference: {mode: previous_days, days: 7}, min_days: 2}
"""


def typed_day(contract, day: str, frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` landed as its day's CSV file, read and typed as validated_data types it."""
    name = contract.landing.file_name(day)
    text = [c.name for c in contract.columns if c.dtype == "str"]
    raw = read_landed_file(frame.to_csv(index=False).encode(), name, day, text)
    return type_rows(raw, contract, where=name).reset_index(drop=True)


def shapes_day(day: str, cities: list[str]) -> pd.DataFrame:
    """A day of the shapes contract, one row per city given."""
    rows = len(cities)
    return pd.DataFrame(
        {
            "ts": [f"{day} {h % 24:02d}:30:00" for h in range(rows)],
            "id": range(1, rows + 1),
            "amount": [float(h % 100) for h in range(rows)],
            "city": cities,
            "note": ["x"] * rows,
            "y": [h % 2 for h in range(rows)],
        }
    )


def test_an_allowed_value_in_another_unicode_form_is_told_as_such():
    contract = parse_contract(CONTRACT, "shapes")
    day = "2024-01-02"
    # Zürich as macOS and some exporters write it: u, then the diaeresis as its own character.
    decomposed = unicodedata.normalize("NFD", "Zürich")
    typed = typed_day(contract, day, shapes_day(day, ["Zürich", decomposed, "東京", "Paris"]))

    report, _ = quality_gate(contract).validate(typed, day)

    [failure] = report.of(VALIDITY)
    assert failure.rows == [1, 3]
    # It prints as an allowed value: the sentence says why it is not one, and what to do.
    assert f"Of these, {decomposed!r} read as allowed values" in failure.sentence
    assert "another Unicode form than the contract's" in failure.sentence
    assert "'Paris' read as" not in failure.sentence
    assert "convert the file to NFC" in failure.sentence


# One generated row: each cell one of a few values, at, beyond or outside each rule's edge.
CELLS = {
    "id": st.sampled_from(["1", "2", "3", "", "0"]),
    "amount": st.sampled_from(["0", "100", "50.5", "", "100.0000001", "-0.0", "inf"]),
    "city": st.sampled_from(["Zürich", "東京", "", unicodedata.normalize("NFD", "Zürich")]),
    "note": st.sampled_from(["x", "é", ""]),
    "y": st.sampled_from(["0", "1", ""]),
    "time": st.sampled_from(["00:00:00", "23:59:59", "12:00:00"]),
    "next_day": st.sampled_from([False, False, False, True]),
}
SHAPE_DAYS = [f"2024-01-0{i}" for i in range(1, 6)]


def one_by_one(contract, frames: dict[str, pd.DataFrame], screened: dict) -> dict[str, list]:
    """Each day's failures judged in order, as validated_data judges a day or a range.

    A day the range's screen passed against the history it then has takes the screen's verdict;
    any other is validated on its own. A day without failures becomes history.
    """
    gate, screen = quality_gate(contract), range_screen(contract)
    passed: dict[str, dict] = {}
    failures = {}
    for day, typed in frames.items():
        history = window_from_profiles(contract, day, passed)
        entry = screened.get(day)
        if entry is not None and entry.history == history:
            report = screen.passed_report(typed)
        else:
            report, _ = gate.validate(typed, day, history)
        if not report.failures:
            passed[day] = day_profile(typed, contract)
        failures[day] = [f.sentence for f in report.failures]
    return failures


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.fixed_dictionaries(CELLS), max_size=5), min_size=5, max_size=5))
def test_a_range_of_degenerate_days_gets_each_days_own_verdict(days_rows):
    # Empty days, one-row days, all-null columns, duplicates within and across days, values at
    # and just beyond their bounds, rows of the next day: screened together, each day fails
    # exactly as it fails alone.
    contract = parse_contract(CONTRACT, "shapes")
    frames = {}
    for day, rows in zip(SHAPE_DAYS, days_rows, strict=True):
        frame = pd.DataFrame(rows, columns=list(CELLS))
        stamp = pd.Timestamp(day) + pd.to_timedelta(frame["next_day"].astype(int), unit="D")
        frame.insert(0, "ts", stamp.dt.strftime("%Y-%m-%d") + " " + frame["time"])
        frames[day] = typed_day(contract, day, frame.drop(columns=["time", "next_day"]))
    alone = one_by_one(contract, frames, screened={})
    screened = screen_range(
        lambda day: None,
        contract,
        SHAPE_DAYS,
        rows_of=lambda day: len(frames[day]),
        typed_of=lambda day: frames[day],
        history_on=True,
    )
    assert one_by_one(contract, frames, screened) == alone


def test_the_last_nanoseconds_of_a_day_are_on_it_alone_and_in_a_range():
    contract = parse_contract(CONTRACT, "shapes")
    day, before = "2024-01-02", "2024-01-01"
    frame = shapes_day(day, ["Zürich"] * 4)
    # Times as a system with nanosecond clocks writes them: the day's first and last instants.
    frame["ts"] = [
        "2024-01-02T00:00:00",
        "2024-01-02T23:59:59.999999",
        "2024-01-02T23:59:59.9999995",
        "2024-01-02T23:59:59.999999999",
    ]
    typed = typed_day(contract, day, frame)
    late = typed_day(contract, day, frame.assign(ts="2024-01-03T00:00:00"))

    report, _ = quality_gate(contract).validate(typed, day)
    assert report.failures == []
    [failure] = quality_gate(contract).validate(late, day)[0].failures
    assert failure.rows == [0, 1, 2, 3]
    # The range's screen draws the same line between a day and the next.
    days = {before: typed_day(contract, before, shapes_day(before, ["東京"] * 3)), day: typed}
    passed, _ = range_screen(contract).screen_rows(days, (before, day))
    assert passed == {before, day}
    passed, _ = range_screen(contract).screen_rows({**days, day: late}, (before, day))
    assert passed == {before}
