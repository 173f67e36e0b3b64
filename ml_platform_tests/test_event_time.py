"""Event times from a date and an hour column, per-row timezones, and their contract errors."""

import pandas as pd
import pytest

from ml_platform.contracts.model import parse_contract
from ml_platform.contracts.schema import raw_schema, time_of_day, type_rows
from ml_platform.drift.detect import skip_reason
from ml_platform.ingestion.assets import schema_check_result
from ml_platform_tests.test_contracts import edit, line_of, load_broken, located

VISITS = """\
name: visits
source: {kind: external}
partitions: {start_date: 2024-03-07}
landing: {file_pattern: "visits_{date}.csv"}
event_time: {column: visit_date, hour: visit_hour, timezone_column: tz}
columns:
  - {name: visit_date, dtype: str}
  - {name: visit_hour, dtype: str}
  - {name: tz, dtype: str}
  - {name: stamp, dtype: datetime, nullable: true}
  - {name: visitors, dtype: int}
label: {name: visitors_label, task: regression, source: visitors}
features:
  - {name: hour, kind: numeric, source: local_event_time, transform: hour}
  - {name: weekday, kind: categorical, source: local_event_time, transform: day_of_week}
  - {name: utc_hour, kind: numeric, source: event_time, transform: hour}
"""
CONTRACT = parse_contract(VISITS, "visits.yaml")


def frame(**columns) -> pd.DataFrame:
    """A landed frame of the visits contract: text columns as the landing zone reads them."""
    n = len(next(iter(columns.values())))
    base = {"visit_date": ["Mar 10, 2024"] * n, "stamp": [None] * n, "visitors": [1] * n}
    return pd.DataFrame({**base, **columns})[
        ["visit_date", "visit_hour", "tz", "stamp", "visitors"]
    ]


def test_hour_values_as_people_write_them():
    values = pd.Series(["6am", "6 PM", "18:00", "0", "12am", " 7 pm ", "23", "6:30 AM", None])
    hours = time_of_day(values) / pd.Timedelta(hours=1)
    assert hours.iloc[:8].tolist() == [6, 18, 18, 0, 0, 19, 23, 6.5]
    assert pd.isna(hours.iloc[8])
    assert (time_of_day(pd.Series([0, 9, 23])) / pd.Timedelta(hours=1)).tolist() == [0, 9, 23]
    bad = pd.Series(["noonish", "25", "24:00", "2024-03-05", "7.5", "-1"])
    assert time_of_day(bad).isna().all()


def test_each_rows_local_time_is_converted_to_utc_in_its_own_zone():
    landed = frame(
        visit_hour=["6am", "18:00", "10 PM", "2am", "12am"],
        tz=["Asia/Tokyo", "Europe/Paris", "America/Los_Angeles", "America/Los_Angeles", "UTC"],
    )
    typed = type_rows(landed, CONTRACT, where="visits_2024-03-10.csv (partition 2024-03-10)")
    assert typed["event_time"].astype(str).tolist() == [
        "2024-03-09 21:00:00",  # Tokyo is UTC+9
        "2024-03-10 17:00:00",  # Paris is still on winter time (UTC+1)
        "2024-03-11 05:00:00",  # Los Angeles changed to summer time (UTC-7) that night
        # 2am does not exist in Los Angeles that day: the clock jumped to 3am PDT.
        "2024-03-10 10:00:00",
        "2024-03-10 00:00:00",
    ]
    assert typed["local_event_time"].astype(str).tolist()[:3] == [
        "2024-03-10 06:00:00",
        "2024-03-10 18:00:00",
        "2024-03-10 22:00:00",
    ]
    assert str(typed["event_time"].dtype) == "datetime64[ns]"


def test_an_hour_repeated_by_the_autumn_change_is_taken_in_summer_time():
    landed = frame(visit_hour=["1am"], tz=["America/New_York"]).assign(visit_date="2024-11-03")
    typed = type_rows(landed, CONTRACT, where="visits_2024-11-03.csv (partition 2024-11-03)")
    assert typed["event_time"].astype(str).tolist() == ["2024-11-03 05:00:00"]  # EDT, UTC-4


def test_a_date_and_an_int_hour_in_one_timezone_give_the_local_time():
    text = edit(
        edit(VISITS, "hour: visit_hour, timezone_column: tz}", "hour: visit_hour}"),
        "{name: visit_hour, dtype: str}",
        "{name: visit_hour, dtype: int}",
    )
    text = text.split("  - {name: hour,")[0] + (
        "  - {name: hour, kind: numeric, source: event_time, transform: hour}\n"
    )
    contract = parse_contract(text, "visits.yaml")
    landed = frame(visit_hour=[0, 13], tz=["x", "y"]).assign(visit_date=["2024-03-10", "3/10/2024"])
    typed = type_rows(landed, contract, where="visits_2024-03-10.csv (partition 2024-03-10)")
    assert typed["event_time"].astype(str).tolist() == [
        "2024-03-10 00:00:00",
        "2024-03-10 13:00:00",
    ]
    assert "local_event_time" not in typed.columns


def test_a_zone_aware_event_time_column_keeps_its_instant_with_a_timezone_column():
    text = edit(VISITS, "{column: visit_date, hour: visit_hour,", "{column: stamp,")
    contract = parse_contract(text, "visits.yaml")
    landed = frame(visit_hour=["1am"], tz=["Asia/Tokyo"]).assign(stamp=["2024-03-10T01:00:00Z"])
    typed = type_rows(landed, contract, where="x")
    assert str(typed["event_time"].iloc[0]) == "2024-03-10 01:00:00"
    assert str(typed["local_event_time"].iloc[0]) == "2024-03-10 10:00:00"


def test_unreadable_hours_dates_and_zones_fail_the_raw_check_naming_file_and_values():
    landed = frame(
        visit_hour=["6am", "noonish", "25", "7pm"],
        tz=["Europe/Paris", "Mars/Olympus_Mons", "Europe/Paris", "Europe/Atlantis"],
    ).assign(visit_date=["Mar 10, 2024", "Mar 10, 2024", "Feb 30, 2024", "Mar 10, 2024"])
    report = raw_schema(landed, CONTRACT)
    assert not report.ok and not report.retyped
    assert set(report.unreadable) == {"visit_hour", "visit_date", "tz"}
    assert "2 of 4 value(s) do not, e.g. 'noonish', '25'" in report.unreadable["visit_hour"]
    assert "'Feb 30, 2024'" in report.unreadable["visit_date"]
    assert "'Europe/Atlantis', 'Mars/Olympus_Mons'" in report.unreadable["tz"]
    result = schema_check_result(landed, CONTRACT, "visits_2024-03-10.csv", "2024-03-10")
    assert not result.passed
    assert result.description is not None
    assert result.description.startswith("visits_2024-03-10.csv (partition 2024-03-10) does not")
    assert "column visit_hour should hold an hour of the day" in result.description
    assert "unknown zones: 'Europe/Atlantis', 'Mars/Olympus_Mons'" in result.description
    assert result.metadata["unreadable_columns"].value == report.unreadable


def test_calendar_features_of_the_local_time_are_not_tested_for_drift():
    features = {f.name: f for f in CONTRACT.features}
    assert skip_reason(features["weekday"], CONTRACT) is not None
    # A local day spans two UTC dates: the UTC event time's calendar is no constant.
    utc_weekday = features["weekday"].model_copy(update={"source": "event_time"})
    assert skip_reason(utc_weekday, CONTRACT) is None


@pytest.mark.parametrize(
    ("old", "new", "snippet", "path", "reason"),
    [
        (
            "timezone_column: tz}",
            "timezone_column: tz, timezone: UTC}",
            "event_time:",
            "event_time.timezone_column",
            "give either 'timezone' (one zone for every row) or 'timezone_column'",
        ),
        (
            "hour: visit_hour,",
            "hour: visit_hr,",
            "event_time:",
            "event_time.hour",
            "'visit_hr' is not a declared column",
        ),
        (
            "{column: visit_date,",
            "{column: stamp,",
            "event_time:",
            "event_time.hour",
            "'stamp' is a datetime column, which carries its own time of day",
        ),
        (
            "{name: visit_hour, dtype: str}",
            "{name: visit_hour, dtype: float}",
            "event_time:",
            "event_time.hour",
            "'visit_hour' is a float column; an hour column holds an int 0-23",
        ),
        (
            "timezone_column: tz}",
            "timezone_column: zone}",
            "event_time:",
            "event_time.timezone_column",
            "'zone' is not a declared column",
        ),
        (
            "{name: tz, dtype: str}",
            "{name: tz, dtype: int}",
            "event_time:",
            "event_time.timezone_column",
            "'tz' must be a str column of IANA zone names",
        ),
        (
            "{name: visit_hour, dtype: str}",
            "{name: visit_hour, dtype: str, constant_within_day: true}",
            "{name: visit_hour",
            "columns[1].constant_within_day",
            "'visit_hour' is the event time's hour, which varies within a day",
        ),
        (
            "{name: visitors, dtype: int}",
            "{name: visitors, dtype: int}\n  - {name: local_event_time, dtype: datetime}",
            "event_time:",
            "event_time.timezone_column",
            "with a timezone column, validated rows get a 'local_event_time' column",
        ),
    ],
)
def test_event_time_misuse_is_reported_by_check_contract(tmp_path, old, new, snippet, path, reason):
    text = edit(VISITS, old, new)
    problems = located(load_broken(tmp_path, text))
    assert problems[(line_of(text, snippet), path)].startswith(reason), problems


def test_with_an_hour_column_the_date_column_may_be_constant_within_day():
    text = edit(
        VISITS,
        "{name: visit_date, dtype: str}",
        "{name: visit_date, dtype: str, constant_within_day: true}",
    )
    assert parse_contract(text, "visits.yaml").column("visit_date").constant_within_day


def test_an_hour_with_parts_and_local_time_features_without_a_zone_column_are_reported(tmp_path):
    text = edit(
        VISITS,
        "{column: visit_date, hour: visit_hour, timezone_column: tz}",
        "{parts: {year: visitors, month: visitors, day: visitors}, hour: visit_hour}",
    )
    problems = located(load_broken(tmp_path, text))
    hour = problems[(line_of(text, "event_time:"), "event_time.hour")]
    assert hour.startswith("an hour column goes with a date 'column', not with 'parts'")
    local = problems[(line_of(text, "{name: hour,"), "features[0].source")]
    assert local.startswith("'local_event_time' exists with event_time.timezone_column only")
