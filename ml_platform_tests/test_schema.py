"""Raw schema checks and typing of landed rows: faults found, dtypes, event time and label."""

import csv
import datetime as dt
import io
import unicodedata

import numpy as np
import pandas as pd
import pytest

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import parse_contract
from ml_platform.contracts.schema import (
    ContractViolationError,
    expected_typed_dtypes,
    raw_schema,
    type_rows,
)
from ml_platform.ingestion.assets import (
    LandingFileError,
    read_landed_file,
    read_landed_stream,
    schema_check_result,
    storable,
)
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.ingestion.synthetic import FAULTS, generate_day

FLIGHTS = load_contract("flights")
SYNTHETIC = load_contract("synthetic")
FLIGHTS_DAY = dt.date(2013, 1, 1)
SYNTHETIC_DAY = dt.date(2024, 1, 3)
SCHEMA_FAULTS = {"missing_column", "extra_column", "retyped_column"}


def landed(frame: pd.DataFrame, file_name: str = "day.csv", partition: str = "p") -> pd.DataFrame:
    """`frame` as it reads back after landing as CSV."""
    return read_landed_file(frame.to_csv(index=False).encode(), file_name, partition)


@pytest.fixture(scope="module")
def flights_raw() -> pd.DataFrame:
    return landed(flights_for_day(FLIGHTS_DAY), "flights_2013-01-01.csv", "2013-01-01")


@pytest.fixture(scope="module")
def flights_typed(flights_raw) -> pd.DataFrame:
    return type_rows(flights_raw, FLIGHTS, "flights_2013-01-01.csv (partition 2013-01-01)")


def synthetic_raw(fault: str | None = None) -> pd.DataFrame:
    frame = generate_day(SYNTHETIC_DAY, seed=7, rows=200, fault=fault)
    return landed(frame, "synthetic_2024-01-03.csv", "2024-01-03")


SYNTHETIC_RAW = synthetic_raw()


def dtypes_of(frame: pd.DataFrame) -> dict[str, str]:
    return {str(name): str(dtype) for name, dtype in frame.dtypes.items()}


def test_clean_flights_day_fits_the_contract(flights_raw):
    report = raw_schema(flights_raw, FLIGHTS)
    assert report.ok
    assert (report.missing, report.unexpected, report.retyped) == ([], [], {})
    result = schema_check_result(flights_raw, FLIGHTS, "flights_2013-01-01.csv", "2013-01-01")
    assert result.passed
    assert "flights_2013-01-01.csv (partition 2013-01-01)" in result.description


def test_clean_synthetic_day_fits_the_contract():
    assert raw_schema(synthetic_raw(), SYNTHETIC).ok


def test_every_non_schema_fault_still_passes_the_schema_check():
    for fault in set(FAULTS) - SCHEMA_FAULTS:
        assert raw_schema(synthetic_raw(fault), SYNTHETIC).ok, fault


def test_missing_column_is_reported():
    report = raw_schema(synthetic_raw("missing_column"), SYNTHETIC)
    assert not report.ok
    assert (report.missing, report.unexpected, report.retyped) == (["x3"], [], {})
    assert report.describe() == "missing column(s) x3"


def test_extra_column_is_reported():
    report = raw_schema(synthetic_raw("extra_column"), SYNTHETIC)
    assert not report.ok
    assert (report.missing, report.unexpected, report.retyped) == ([], ["promo_code"], {})
    assert report.describe() == "unexpected column(s) promo_code"


def test_retyped_column_is_reported_with_the_offending_sample():
    raw = synthetic_raw("retyped_column")
    n_bad = int((raw["x1"] == "n/a").sum())
    assert n_bad > 0

    report = raw_schema(raw, SYNTHETIC)

    assert not report.ok
    assert (report.missing, report.unexpected, list(report.retyped)) == ([], [], ["x1"])
    description = report.describe()
    assert description.startswith("column x1 should be float")
    assert f"{n_bad} of {len(raw)} value(s)" in description
    assert "'n/a'" in description


def test_a_header_name_that_differs_only_by_spaces_case_or_unicode_form_is_pointed_out():
    # "régión" as macOS tools write it: each accent a letter and a combining mark (NFD).
    decomposed = unicodedata.normalize("NFD", "régión")
    contract = SYNTHETIC.model_copy(
        update={
            "columns": [
                c.model_copy(update={"name": "régión"}) if c.name == "x2" else c
                for c in SYNTHETIC.columns
            ]
        }
    )
    frame = generate_day(SYNTHETIC_DAY, seed=7, rows=200).rename(
        columns={"amount": " amount", "segment": "Segment", "x2": decomposed}
    )
    report = raw_schema(landed(frame), contract)
    description = report.describe()
    assert "missing column(s) régión, amount, segment" in description
    but = "but for spaces, case or Unicode form (NFC)"
    assert f"the file's ' amount' is the contract's 'amount' {but}" in description
    assert f"the file's 'Segment' is the contract's 'segment' {but}" in description
    assert f"the file's {decomposed!r} is the contract's 'régión' {but}" in description


def test_schema_check_result_fails_and_tells_what_to_do():
    result = schema_check_result(
        synthetic_raw("missing_column"), SYNTHETIC, "synthetic_2024-01-03.csv", "2024-01-03"
    )
    assert not result.passed
    assert "synthetic_2024-01-03.csv (partition 2024-01-03)" in result.description
    assert "missing column(s) x3" in result.description
    assert result.metadata["missing_columns"].value == ["x3"]


def test_type_rows_refuses_a_file_that_does_not_fit():
    with pytest.raises(ContractViolationError, match=r"synthetic_2024-01-03\.csv.*x3"):
        type_rows(synthetic_raw("missing_column"), SYNTHETIC, "synthetic_2024-01-03.csv")


def test_typed_flights_have_exactly_the_expected_dtypes(flights_typed):
    assert dtypes_of(flights_typed) == expected_typed_dtypes(FLIGHTS)
    assert list(flights_typed.columns) == [*FLIGHTS.column_names, "event_time", "delayed"]


def test_typed_synthetic_rows_have_exactly_the_expected_dtypes():
    typed = type_rows(synthetic_raw(), SYNTHETIC, "synthetic_2024-01-03.csv")
    assert dtypes_of(typed) == expected_typed_dtypes(SYNTHETIC)
    assert len(typed) == 200


def test_a_header_only_file_types_to_an_empty_frame_with_the_expected_dtypes():
    typed = type_rows(synthetic_raw("header_only"), SYNTHETIC, "synthetic_2024-01-03.csv")
    assert len(typed) == 0
    assert dtypes_of(typed) == expected_typed_dtypes(SYNTHETIC)


def test_flights_event_time_is_the_local_scheduled_departure(flights_typed):
    t = flights_typed
    hhmm = t["sched_dep_time"].astype("int64")
    expected = pd.to_datetime(
        pd.DataFrame({"year": t["year"], "month": t["month"], "day": t["day"]}).astype("int64")
    ) + pd.to_timedelta(hhmm // 100 * 60 + hhmm % 100, unit="min")
    expected = expected.astype("datetime64[ns]")
    pd.testing.assert_series_equal(t["event_time"], expected, check_names=False)
    assert (t["event_time"].dt.date == FLIGHTS_DAY).all()
    # time_hour is the scheduled hour in UTC: New York is five hours behind it in January.
    assert (t["event_time"].dt.floor("h") == t["time_hour"] - pd.Timedelta(hours=5)).all()


def test_flights_event_time_of_known_rows():
    raw = flights_for_day(FLIGHTS_DAY).head(3).copy()
    raw["sched_dep_time"] = [5, 1345, 2359]
    typed = type_rows(landed(raw), FLIGHTS, "w")
    assert typed["event_time"].tolist() == [
        pd.Timestamp("2013-01-01 00:05"),
        pd.Timestamp("2013-01-01 13:45"),
        pd.Timestamp("2013-01-01 23:59"),
    ]


def test_flights_label_is_arrival_delay_over_15_minutes(flights_typed):
    t = flights_typed
    known = t["arr_delay"].notna()
    assert not known.all(), "the day should hold flights without an arrival delay"
    assert t.loc[~known, "delayed"].isna().all()
    expected = (t.loc[known, "arr_delay"] > 15).astype("int64")
    assert t.loc[known, "delayed"].astype("int64").tolist() == expected.tolist()


def test_flights_label_at_the_threshold():
    raw = flights_for_day(FLIGHTS_DAY).head(5).copy()
    raw["arr_delay"] = [15.0, 16.0, np.nan, -3.0, 15.5]
    typed = type_rows(landed(raw), FLIGHTS, "w")
    assert typed["delayed"].tolist() == [0, 1, pd.NA, 0, 1]


TZ_CONTRACT = """
name: deliveries
source: {kind: external}
partitions: {start_date: 2013-01-01}
landing: {file_pattern: "deliveries_{date}.csv"}
event_time: {column: delivered_at, timezone: America/New_York}
columns:
  - {name: delivered_at, dtype: datetime}
  - {name: weight, dtype: float}
  - {name: minutes, dtype: float}
label: {name: duration, task: regression, source: minutes}
features:
  - {name: weight, kind: numeric, source: weight}
"""


def test_event_time_from_a_utc_datetime_column_is_local_wall_clock_time():
    contract = parse_contract(TZ_CONTRACT, "deliveries.yaml")
    raw = landed(
        pd.DataFrame(
            {
                "delivered_at": ["2013-01-01T10:00:00Z", "2013-07-01T10:00:00Z"],
                "weight": [1.0, 2.0],
                "minutes": [30.0, 40.0],
            }
        )
    )
    typed = type_rows(raw, contract, "deliveries_2013-01-01.csv")
    # New York is UTC-5 in winter and UTC-4 in summer.
    assert typed["event_time"].tolist() == [
        pd.Timestamp("2013-01-01 05:00"),
        pd.Timestamp("2013-07-01 06:00"),
    ]


def deliveries(times: list[str]) -> pd.DataFrame:
    """A landed deliveries file with these `delivered_at` values."""
    n = len(times)
    return landed(
        pd.DataFrame({"delivered_at": times, "weight": [1.0] * n, "minutes": [30.0] * n}),
        "deliveries_2013-03-10.csv",
        "2013-03-10",
    )


def test_a_day_that_changes_to_summer_time_types_each_time_as_the_instant_it_names():
    # New York moved from UTC-5 to UTC-4 at 2:00 on 10 March 2013: one file, two offsets.
    contract = parse_contract(TZ_CONTRACT, "deliveries.yaml")
    raw = deliveries(["2013-03-10T01:30:00-05:00", "2013-03-10T03:30:00-04:00"])

    assert raw_schema(raw, contract).ok
    typed = type_rows(raw, contract, "deliveries_2013-03-10.csv")
    assert typed["delivered_at"].tolist() == [
        pd.Timestamp("2013-03-10 06:30"),
        pd.Timestamp("2013-03-10 07:30"),
    ]
    assert typed["event_time"].tolist() == [
        pd.Timestamp("2013-03-10 01:30"),
        pd.Timestamp("2013-03-10 03:30"),
    ]


def test_a_time_without_an_offset_among_times_with_one_fails_the_schema_check_naming_it():
    contract = parse_contract(TZ_CONTRACT, "deliveries.yaml")
    raw = deliveries(["2013-03-10T01:30:00-05:00", "2013-03-10T03:30:00"])

    result = schema_check_result(raw, contract, "deliveries_2013-03-10.csv", "2013-03-10")

    assert not result.passed
    assert "deliveries_2013-03-10.csv (partition 2013-03-10)" in result.description
    assert "column delivered_at should be datetime but 1 of 2 value(s) are not" in (
        result.description
    )
    assert "'2013-03-10T03:30:00'" in result.description
    with pytest.raises(ContractViolationError, match="delivered_at"):
        type_rows(raw, contract, "deliveries_2013-03-10.csv")


CODES_CONTRACT = """
name: shipments
source: {kind: external}
partitions: {start_date: 2024-01-01}
landing: {file_pattern: "shipments_{date}.csv"}
event_time: {column: shipped_at}
columns:
  - {name: shipped_at, dtype: datetime}
  - {name: zip_code, dtype: str, nullable: true}
  - {name: cost, dtype: float}
label: {name: cost_value, task: regression, source: cost}
features:
  - {name: zip_code, kind: categorical, source: zip_code}
"""


def test_a_yes_no_column_of_ones_and_zeros_with_a_blank_is_read_as_yes_no():
    contract = parse_contract(
        TZ_CONTRACT.replace(
            "  - {name: minutes, dtype: float}\n",
            "  - {name: minutes, dtype: float}\n  - {name: fragile, dtype: bool, nullable: true}\n",
        ),
        "deliveries.yaml",
    )
    times = ["2013-03-10T01:30:00-05:00"] * 3
    frame = pd.DataFrame(
        {
            "delivered_at": times,
            "weight": [1.0] * 3,
            "minutes": [30.0] * 3,
            "fragile": ["1", "", "0"],
        }
    )
    # Read back from CSV, 1, blank, 0 is the float column 1.0, NaN, 0.0.
    raw = landed(frame, "deliveries_2013-03-10.csv", "2013-03-10")

    assert raw_schema(raw, contract).ok
    typed = type_rows(raw, contract, "deliveries_2013-03-10.csv")
    assert typed["fragile"].tolist() == [True, pd.NA, False]


def test_text_columns_keep_their_text_when_it_looks_like_numbers():
    contract = parse_contract(CODES_CONTRACT, "shipments.yaml")
    data = (
        b"shipped_at,zip_code,cost\n"
        b"2024-01-01T08:00:00,00501,1.5\n"
        b"2024-01-01T09:00:00,,2.5\n"
        b"2024-01-01T10:00:00,10001,3.5\n"
    )
    raw = read_landed_file(data, "shipments_2024-01-01.csv", "2024-01-01", ["zip_code"])
    typed = type_rows(raw, contract, "shipments_2024-01-01.csv")
    assert typed["zip_code"].tolist()[0] == "00501"
    assert typed["zip_code"].tolist()[2] == "10001"
    assert typed["zip_code"].isna().tolist() == [False, True, False]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\n\n",
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00",
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03",
        b'x1,x2\n"1.0,2.0\n',
    ],
    ids=["empty", "blank-lines", "png", "gzip", "open-quote"],
)
def test_unreadable_landed_file_names_file_and_partition(data):
    with pytest.raises(LandingFileError) as info:
        read_landed_file(data, "synthetic_2024-01-03.csv", "2024-01-03")
    message = str(info.value)
    assert "synthetic_2024-01-03.csv" in message
    assert "partition 2024-01-03" in message


def test_a_header_that_names_a_column_twice_is_refused_naming_it():
    # A join of two tables that both had an amount: pandas would read the second as amount.1.
    data = b"ts,amount,amount,qty\n2024-01-03T08:00:00,-1,12.5,3\n"
    with pytest.raises(LandingFileError) as info:
        read_landed_file(data, "orders_2024-01-03.csv", "2024-01-03")
    assert str(info.value) == (
        "orders_2024-01-03.csv (partition 2024-01-03) is not a readable CSV file: its header "
        "names 'amount' more than once; which one is meant is not known"
    )


def test_a_spreadsheets_non_utf8_export_is_named_as_such_without_a_chunks_position():
    rows = "".join(f"2024-01-03T08:00:00,{i},caf\u00e9 {i}\n" for i in range(300))
    data = ("ts,qty,shop\n" + rows).encode("cp1252")
    with pytest.raises(LandingFileError) as info:
        read_landed_file(data, "orders_2024-01-03.csv", "2024-01-03")
    message = str(info.value)
    assert message.startswith(
        "orders_2024-01-03.csv (partition 2024-01-03) is not a readable CSV file: it is not "
        "utf-8 text (byte 0xe9: invalid continuation byte); save it as UTF-8"
    )
    assert "position" not in message


def test_a_file_separated_by_semicolons_is_named_as_such():
    # Decimal commas make rows longer than the header: the file does not parse.
    with pytest.raises(LandingFileError) as info:
        read_landed_file(b"ts;amount;qty\n2024-01-03T08:00:00;12,5;3\n", "o.csv", "2024-01-03")
    assert str(info.value) == (
        "o.csv (partition 2024-01-03) is not a readable CSV file: its header is separated by "
        "';', not ','; export it comma-separated"
    )
    # Without them it parses as one column, which the schema check names.
    frame = generate_day(SYNTHETIC_DAY, seed=7, rows=20)
    raw = read_landed_file(frame.to_csv(index=False, sep=";").encode(), "s.csv", "2024-01-03")
    described = raw_schema(raw, SYNTHETIC).describe()
    assert "missing column(s) event_time, x1" in described
    assert described.endswith(
        "the header looks separated by ';', not ','; export it comma-separated"
    )


def test_rows_with_more_fields_than_the_header_are_not_silently_shifted():
    # Extra values on every row: pandas would by default make the first column the index and
    # shift every value one column to the left.
    data = b"a,b\n1,2,9\n3,4,9\n"
    with pytest.raises(LandingFileError, match=r"day\.csv \(partition 2024-01-03\)"):
        read_landed_file(data, "day.csv", "2024-01-03")


def test_a_trailing_empty_field_keeps_every_value_in_its_column():
    frame = read_landed_file(b"a,b\n1,2,\n3,4,\n", "day.csv", "2024-01-03")
    assert frame.to_dict("list") == {"a": [1, 3], "b": [2, 4]}


def test_a_file_with_classic_mac_line_endings_reads_and_a_cut_in_it_is_caught():
    # Excel for Mac's "CSV (Macintosh)" ends lines with CR alone.
    frame = read_landed_file(b"a,b,c\r1,2,3\r4,5,\r", "day.csv", "2024-01-03")
    assert frame["a"].tolist() == [1, 4]
    with pytest.raises(
        LandingFileError, match=r"day\.csv \(partition 2024-01-03\).*2 of the header's 3"
    ):
        read_landed_file(b"a,b,c\r1,2,3\r4,5\r", "day.csv", "2024-01-03")


def test_a_header_the_csv_module_cannot_read_is_an_unreadable_file():
    # A name longer than Python's csv field limit (128 KiB): pandas reads it, csv does not.
    data = b"a," + b"n" * 200_000 + b"\n1,2\n"
    with pytest.raises(LandingFileError, match=r"^day\.csv \(partition 2024-01-03\) is not a"):
        read_landed_file(data, "day.csv", "2024-01-03")


@pytest.mark.parametrize("last", [False, True], ids=["long value first", "long value last"])
def test_a_text_value_longer_than_the_csv_modules_limit_reads_on_any_row(last):
    limit = csv.field_size_limit()
    rows = [b"1,short,2.0", b"2," + b"x" * 200_000 + b",3.0"]
    data = b"id,comment,y\n" + b"\n".join(rows if last else rows[::-1]) + b"\n"
    frame = read_landed_file(data, "day.csv", "2024-01-03")
    assert sorted(frame["comment"].str.len()) == [5, 200_000]
    assert csv.field_size_limit() == limit
    cut = data.rstrip(b"\n").rsplit(b",", 1)[0] + b"\n"
    with pytest.raises(LandingFileError, match="2 of the header's 3 fields"):
        read_landed_file(cut, "day.csv", "2024-01-03")


def test_a_last_row_whose_quoted_field_spans_lines_is_judged_whole():
    # Its last line starts inside the quoted field: alone it would look 2 fields short.
    data = (
        b'id,comment,ts,y,x\n1,plain,10:00,2.0,1.5\n2,"first, line\n""second"" line",11:00,3.0,\n'
    )
    frame = read_landed_file(data, "day.csv", "2024-01-03")
    assert frame["comment"].tolist() == ["plain", 'first, line\n"second" line']
    assert frame["x"].isna().tolist() == [False, True]
    cut = b'id,comment,ts,y,x\n1,plain,10:00,2.0,1.5\n2,"first\nsecond",11:00\n'
    with pytest.raises(LandingFileError, match="3 of the header's 5 fields: the file looks trunc"):
        read_landed_file(cut, "day.csv", "2024-01-03")


def test_trailing_empty_columns_are_unnamed_extra_columns_not_a_repeated_name():
    contract = parse_contract(
        CODES_CONTRACT.replace("name: shipments", "name: shipments\nallow_extra_columns: true"),
        "shipments.yaml",
    )
    data = b"shipped_at,zip_code,cost,,\n2024-01-01T08:00:00,00501,1.5,,\n"
    raw = read_landed_file(data, "shipments_2024-01-01.csv", "2024-01-01", ["zip_code"])
    assert raw.shape == (1, 5)
    assert raw_schema(raw, contract).ok
    with pytest.raises(LandingFileError, match="names 'cost' more than once"):
        read_landed_file(b"cost,cost,,\n1,2,,\n", "day.csv", "2024-01-01")


def test_not_available_text_stays_visible_to_the_schema_check():
    frame = read_landed_file(b"x,y\n1.5,a\nn/a,b\n,c\nNA,d\n", "day.csv", "p")
    x = frame["x"].tolist()
    assert x[0] == "1.5"
    assert x[1] == "n/a"
    assert pd.isna(x[2])
    assert x[3] == "NA"


@pytest.mark.parametrize(
    "value", ["1e308", "3.5", "99999999999999999999", "9223372036854775808", "-1e19", "inf"]
)
def test_a_value_that_does_not_fit_an_int_column_fails_the_schema_check_naming_it(value):
    frame = flights_for_day(FLIGHTS_DAY).astype({"flight": "str"})
    frame.loc[7, "flight"] = value
    text = [c.name for c in FLIGHTS.columns if c.dtype == "str"]
    raw = read_landed_file(
        frame.to_csv(index=False).encode(), "flights_2013-01-01.csv", "2013-01-01", text
    )

    result = schema_check_result(raw, FLIGHTS, "flights_2013-01-01.csv", "2013-01-01")

    assert not result.passed
    assert "flights_2013-01-01.csv (partition 2013-01-01)" in result.description
    assert f"column flight should be int but 1 of {len(frame)} value(s) are not" in (
        result.description
    )
    shown = result.metadata["retyped_columns"].value["flight"]
    assert repr(str(raw["flight"].iloc[7])) in shown


def test_the_extreme_int64_values_still_fit_an_int_column():
    for numbers in ([2**63 - 1, -(2**63), 1], [float(2**62), -float(2**63)]):
        raw = SYNTHETIC_RAW.assign(transaction_id=(numbers * 400)[: len(SYNTHETIC_RAW)])
        assert raw_schema(raw, SYNTHETIC).ok, numbers
        assert type_rows(raw, SYNTHETIC, "here")["transaction_id"].iloc[0] == numbers[0]


def test_a_text_event_time_that_gives_no_time_fails_the_schema_check_naming_it():
    contract = parse_contract(
        CODES_CONTRACT.replace("dtype: datetime", "dtype: str"), "shipments.yaml"
    )
    data = (
        b"shipped_at,zip_code,cost\n"
        b"2024-01-01T08:00:00,00501,1.5\n"
        b"n/a,00502,2.5\n"
        b"31/12/2024 10:00,00503,3.5\n"
    )
    raw = read_landed_file(data, "shipments_2024-01-01.csv", "2024-01-01", ["shipped_at"])
    report = raw_schema(raw, contract)
    assert report.unreadable == {
        "shipped_at": "should hold an ISO 8601 time (e.g. 2024-03-05T10:00:00) but 2 of 3 "
        "value(s) do not, e.g. 'n/a', '31/12/2024 10:00'"
    }
    with pytest.raises(ContractViolationError, match=r"^shipments_2024-01-01\.csv: .*'n/a'"):
        type_rows(raw, contract, "shipments_2024-01-01.csv")
    assert raw_schema(raw.iloc[:1], contract).ok


def test_a_nullable_int_column_keeps_every_digit_of_values_above_2_to_the_53():
    # A blank made pandas read the column as float64, which holds no integer above 2**53
    # exactly: 9007199254740993 became 9007199254740992 and ids were silently wrong.
    ids = [2**53 + 1, None, 2**63 - 1, -(2**63)]
    data = "transaction_id,note\n" + "".join(
        f"{'' if v is None else v},n{i}\n" for i, v in enumerate(ids)
    )
    raw = read_landed_file(data.encode(), "day.csv", "p", int_columns=["transaction_id"])
    assert str(raw["transaction_id"].dtype) == "Int64"
    assert raw["transaction_id"].tolist() == [2**53 + 1, pd.NA, 2**63 - 1, -(2**63)]
    # Whole numbers written with a point or an exponent are taken from their digits.
    data = "transaction_id,n\n9007199254740993.0,a\n,b\n1e3,c\n"
    raw = read_landed_file(data.encode(), "day.csv", "p", int_columns=["transaction_id"])
    assert raw["transaction_id"].tolist() == [2**53 + 1, pd.NA, 1000]


def test_a_nullable_int_column_types_exactly_through_the_stored_parse():
    # raw_data stores the parse (`storable`), validated_data types the stored rows.
    frame = generate_day(SYNTHETIC_DAY, seed=7, rows=200)
    frame["transaction_id"] = frame["transaction_id"] + 2**53
    frame.loc[3, "transaction_id"] = None
    frame["transaction_id"] = frame["transaction_id"].astype("Int64")
    text = [c.name for c in SYNTHETIC.columns if c.dtype == "str"]
    raw = read_landed_file(
        frame.to_csv(index=False).encode(), "day.csv", "p", text, ["transaction_id"]
    )
    assert raw_schema(raw, SYNTHETIC).ok
    typed = type_rows(storable(raw, SYNTHETIC), SYNTHETIC, "day.csv")
    assert typed["transaction_id"].tolist() == frame["transaction_id"].tolist()


@pytest.mark.parametrize("value", ["3.5", "9223372036854775808", "1e999999999", "n/a", "1_000"])
def test_a_value_an_int_column_read_exactly_cannot_hold_is_named_by_the_schema_check(value):
    frame = generate_day(SYNTHETIC_DAY, seed=7, rows=200).astype({"transaction_id": "str"})
    frame.loc[3, "transaction_id"] = ""
    frame.loc[7, "transaction_id"] = value
    text = [c.name for c in SYNTHETIC.columns if c.dtype == "str"]
    raw = read_landed_file(
        frame.to_csv(index=False).encode(), "day.csv", "p", text, ["transaction_id"]
    )
    report = raw_schema(raw, SYNTHETIC)
    assert report.retyped["transaction_id"].startswith("should be int but 1 of 200 value(s)")
    assert repr(str(raw["transaction_id"].iloc[7])) in report.retyped["transaction_id"]
    # Read as any column is when one value does not fit: the others keep their place.
    assert raw["transaction_id"].isna().tolist() == [i == 3 for i in range(200)]


def test_a_header_that_spells_a_column_in_decomposed_unicode_is_read_as_that_column():
    # "régión" as macOS tools write it (NFD) is the contract's "régión" (NFC): both print alike.
    composed = "régión"
    decomposed = unicodedata.normalize("NFD", composed)
    data = f"{decomposed},other\n00501,1\n,2\n".encode()
    landed_file = read_landed_stream(
        io.BytesIO(data), "day.csv", "p", [composed], declared=[composed, "other"]
    )
    assert list(landed_file.frame.columns) == [composed, "other"]
    assert landed_file.renamed == {decomposed: composed}
    # Read as the text column it is: its zeros are kept.
    assert landed_file.frame[composed].tolist()[0] == "00501"
    # Both forms in one header name one column twice.
    with pytest.raises(LandingFileError, match="more than once"):
        read_landed_file(
            f"{decomposed},{composed}\n1,2\n".encode(), "day.csv", "p", declared=[composed]
        )
