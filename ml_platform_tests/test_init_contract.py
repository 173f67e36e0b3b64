"""`init-contract`: a draft contract from sample files of a new shape, checked and materialised."""

import datetime as dt
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ml_platform import cli
from ml_platform.contracts import load_contract
from ml_platform.contracts.model import parse_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.validation.expectations import quality_gate
from ml_platform.validation.infer import InferenceError, draft_contract
from ml_platform_tests.conftest import DAILY_ASSETS, Platform

ZONES = ["America/Los_Angeles", "Europe/Paris", "Asia/Tokyo"]
# A week across the night Los Angeles changes to summer time (2024-03-10), Paris not yet.
WEEK = [dt.date(2024, 3, 7) + dt.timedelta(days=i) for i in range(7)]


def hour_text(hour: int, style: int) -> str:
    """An hour as exports write it: '6pm', '6 PM' or '18:00'."""
    twelve, half = hour % 12 or 12, "am" if hour < 12 else "pm"
    return (f"{twelve}{half}", f"{twelve} {half.upper()}", f"{hour}:00")[style]


def visits_day(day: dt.date, seed: int, rows: int = 240) -> tuple[pd.DataFrame, pd.Series]:
    """A shuffled day file of shop visits, and each row's event time in UTC by ticket."""
    rng = np.random.default_rng(seed)
    hours = rng.integers(6, 23, rows)
    zones = rng.choice(ZONES, rows)
    store = rng.choice(["north", "south", "east"], rows)
    temperature = rng.normal(12, 4, rows).round(1)
    temperature[rng.random(rows) < 0.1] = np.nan
    holiday = int(day.weekday() == 6)  # one value all day, another on Sundays
    visitors = 20 + 2 * hours + 5 * (store == "north") + 10 * holiday + rng.normal(0, 2, rows)
    tickets = np.arange(rows) + seed * 10_000
    frame = pd.DataFrame(
        {
            "visit_date": day.strftime("%b %d, %Y"),
            "visit_hour": [
                hour_text(h, int(s)) for h, s in zip(hours, rng.integers(0, 3, rows), strict=True)
            ],
            "tz": zones,
            "store": store,
            "holiday": holiday,
            "temperature": temperature,
            "ticket": tickets,
            "visitors": visitors.round().astype(int),
        }
    )
    utc = [
        pd.Timestamp(f"{day} {h:02d}:00", tz=z).tz_convert("UTC").tz_localize(None)
        for h, z in zip(hours, zones, strict=True)
    ]
    return frame.sample(frac=1, random_state=seed), pd.Series(utc, index=tickets)


def write_week(folder: Path) -> tuple[list[Path], pd.Series]:
    folder.mkdir(parents=True, exist_ok=True)
    paths, truths = [], []
    for i, day in enumerate(WEEK):
        frame, utc = visits_day(day, seed=i + 1)
        path = folder / f"visits_{day}.csv"
        frame.to_csv(path, index=False)
        paths.append(path)
        truths.append(utc)
    return paths, pd.concat(truths)


@pytest.fixture
def week(tmp_path):
    return write_week(tmp_path / "samples")


def drafted(text: str) -> dict:
    return yaml.safe_load(text)


def test_the_draft_reads_types_nulls_ranges_key_pattern_and_event_time(week):
    paths, _ = week
    text = draft_contract(paths, "visits")
    document = drafted(text)
    assert document["landing"]["file_pattern"] == "visits_{date}.csv"
    assert document["partitions"]["start_date"] == WEEK[0]
    assert document["event_time"] == {
        "column": "visit_date",
        "hour": "visit_hour",
        "timezone_column": "tz",
    }
    columns = {c["name"]: c for c in document["columns"]}
    assert {n: c["dtype"] for n, c in columns.items()} == {
        "visit_date": "str",
        "visit_hour": "str",
        "tz": "str",
        "store": "str",
        "holiday": "int",
        "temperature": "float",
        "ticket": "int",
        "visitors": "int",
    }
    assert columns["temperature"]["nullable"] is True
    assert "null in the samples" in next(
        line for line in text.splitlines() if "temperature, " in line
    )
    assert not any(c.get("nullable") for n, c in columns.items() if n != "temperature")
    # The values seen, for a person who knows the set is closed: a value too rare for the
    # samples must not reject a later day.
    assert "allowed_values" not in columns["store"]
    assert next(line for line in text.splitlines() if "{name: store," in line).endswith(
        "add allowed_values: [east, north, south]"
    )
    assert columns["holiday"] == {
        "name": "holiday",
        "dtype": "int",
        "min": 0,
        "max": 1,
        "constant_within_day": True,
    }
    # Never negative in the samples: the sign bound, and a far end that only a gross error
    # (a unit changed, a sentinel) passes; an ordinary day beyond the samples' range passes.
    seen = pd.concat(pd.read_csv(p)["visitors"] for p in paths)
    assert (columns["visitors"]["min"], columns["visitors"]["max"]) == (0, 10 * seen.max())
    # A key's values move on from day to day, so it gets no range.
    assert columns["ticket"] == {"name": "ticket", "dtype": "int", "unique": True}
    assert document["quality"]["row_key"] == ["ticket"]
    # Undecided: the label is only offered, and no column is guessed to leak it.
    assert "label" not in document
    assert "# label: {name: visitors_label, task: regression, source: visitors}" in text
    assert document["leakage_columns"] == []
    sources = {f["source"] for f in document["features"]}
    assert "visitors" not in sources and "ticket" not in sources
    assert {"local_event_time", "store", "tz", "holiday"} <= sources


def test_init_contract_with_the_label_chosen_passes_check_contract_and_a_week_materialises(
    week, tmp_path, capsys
):
    paths, utc = week
    output = tmp_path / "visits.yaml"
    argv = ["init-contract", *map(str, paths), "--name", "visits", "-o", str(output)]
    assert cli.main(argv) == 0
    assert "choose the label there" in capsys.readouterr().out
    assert cli.main(["check-contract", str(output)]) == 2  # no label yet
    assert "label" in capsys.readouterr().err
    choice = "# label: {name: visitors_label, task: regression, source: visitors}"
    output.write_text(output.read_text().replace(choice, choice.removeprefix("# ")))
    assert cli.main(["check-contract", str(output)]) == 0
    assert "contract 'visits' is valid" in capsys.readouterr().out

    platform = Platform(load_contract(output), tmp_path / "platform")
    platform.landing_dir.mkdir(parents=True)
    for path in paths:
        shutil.copy(path, platform.landing_dir / path.name)
    days = [day.isoformat() for day in WEEK]
    for day in days:
        assert platform.materialize(day).success, day
    for asset in DAILY_ASSETS:
        assert platform.materialized(asset) == set(days), asset
    validated = pd.concat(
        pd.read_parquet(platform.stored("validated_data", day, "parquet")) for day in days
    )
    assert len(validated) == 7 * 240
    expected = utc.loc[validated["ticket"].to_numpy()].to_numpy()
    assert (validated["event_time"].to_numpy() == expected).all()
    # The Sunday's Los Angeles rows are in summer time, UTC-7; the Saturday's in winter, UTC-8.
    la = validated[validated["tz"] == "America/Los_Angeles"]
    offset = (la["local_event_time"] - la["event_time"]).dt.total_seconds() / 3600
    by_day = offset.groupby(la["local_event_time"].dt.date).unique()
    assert by_day[dt.date(2024, 3, 9)].tolist() == [-8.0]
    assert by_day[dt.date(2024, 3, 10)].tolist() == [-7.0]


def test_without_a_key_or_a_spread_the_draft_says_so(tmp_path):
    folder = tmp_path / "samples"
    folder.mkdir()
    paths = []
    for i, day in enumerate(WEEK[:2]):
        frame, _ = visits_day(day, seed=i + 1, rows=60)
        frame = frame.drop(columns=["ticket"])
        path = folder / f"visits_{day}.csv"
        pd.concat([frame, frame.iloc[:3]]).to_csv(path, index=False)  # three rows twice
        paths.append(path)
    text = draft_contract(paths, "visits")
    assert drafted(text)["quality"]["row_key"] == []
    assert "# No column, or pair of columns, is unique within every sample day" in text
    # Thursday and Friday are no holidays: one value everywhere is neither a range nor a sign
    # of a column constant within a day (that needs days that differ).
    holiday = next(c for c in drafted(text)["columns"] if c["name"] == "holiday")
    assert holiday == {"name": "holiday", "dtype": "int"}
    assert "always 0 in the samples: no range guessed" in text


def test_a_draft_holds_its_own_samples_tiny_floats_and_a_column_never_filled(tmp_path):
    paths = []
    for day in ["2024-01-01", "2024-01-02"]:
        frame = pd.DataFrame(
            {
                "ts": [f"{day} {h:02d}:15:00" for h in range(20)],
                "rate": [f"{(1 + h) * 1e-8:.3e}" for h in range(20)],  # a rare event's share
                "score": [str(1.0 + h * 1e-8) for h in range(20)],
                "coupon": [""] * 20,  # an optional field nobody used yet
                "amount": [str(10 * h) for h in range(20)],
            }
        )
        paths.append(tmp_path / f"shop_{day}.csv")
        frame.to_csv(paths[-1], index=False)

    text = draft_contract(paths, "shop")

    columns = {c["name"]: c for c in drafted(text)["columns"]}
    assert columns["rate"]["min"] <= 1e-8 and columns["rate"]["max"] >= 2e-7, columns["rate"]
    assert columns["score"]["max"] >= 1.0 + 19e-8, columns["score"]
    assert "allowed_values" not in columns["coupon"]
    # The draft, its label chosen, accepts the days it was drawn from.
    accepts_its_samples(text, paths, "amount_label")


def test_times_of_a_day_that_changes_to_summer_time_are_drafted_as_times(tmp_path):
    paths = []
    # Paris, 2024-03-31: from +01:00 to +02:00 at 02:00.
    for day, offset in [
        ("2024-03-30", lambda h: "+01:00"),
        ("2024-03-31", lambda h: "+01:00" if h < 2 else "+02:00"),
    ]:
        times = [f"{day}T{h:02d}:30:00{offset(h)}" for h in range(0, 24, 2)]
        paths.append(tmp_path / f"shop_{day}.csv")
        pd.DataFrame({"when": times, "amount": range(len(times))}).to_csv(paths[-1], index=False)

    columns = {c["name"]: c for c in drafted(draft_contract(paths, "shop"))["columns"]}

    assert columns["when"]["dtype"] == "datetime"


def test_times_with_an_offset_that_leave_their_day_in_utc_are_pointed_out(tmp_path):
    paths = []
    for day in ["2024-01-10", "2024-01-11"]:
        times = [f"{day}T{h:02d}:30:00+01:00" for h in range(0, 24, 2)]
        paths.append(tmp_path / f"shop_{day}.csv")
        pd.DataFrame({"when": times, "amount": range(len(times))}).to_csv(paths[-1], index=False)

    text = draft_contract(paths, "shop")

    # 00:30+01:00 is 23:30 the day before in UTC: one row of each file.
    assert "# The times carry UTC offsets (+01:00): in UTC, 2 of 24 sample row(s)" in text
    # Times without an offset name no instant: nothing to point out.
    for path in paths:
        frame = pd.read_csv(path)
        frame["when"] = frame["when"].str.replace("+01:00", "", regex=False)
        frame.to_csv(path, index=False)
    assert "carry UTC offsets" not in draft_contract(paths, "shop")


def test_sample_names_must_carry_their_day(tmp_path):
    (tmp_path / "visits_latest.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InferenceError, match="visits_latest.csv: a day file's name must carry"):
        draft_contract([tmp_path / "visits_latest.csv"], "visits")
    assert cli.main(["init-contract", str(tmp_path / "visits_latest.csv"), "--name", "v"]) == 2


def test_a_sample_that_does_not_exist_is_named_before_any_rule_on_names(tmp_path, capsys):
    well_named, badly_named = tmp_path / "visits_2024-01-01.csv", tmp_path / "visits.csv"
    for missing in (well_named, badly_named):
        assert cli.main(["init-contract", str(missing), "--name", "v"]) == 2
        assert f"error: no such sample file: {missing}" in capsys.readouterr().err


def write_samples(folder: Path, frames: dict[str, pd.DataFrame]) -> list[Path]:
    """Each day's frame as the sample file shop_<day>.csv."""
    paths = []
    for day, frame in frames.items():
        paths.append(folder / f"shop_{day}.csv")
        frame.to_csv(paths[-1], index=False)
    return paths


def accepts_its_samples(text: str, paths: list[Path], label: str) -> None:
    """The draft, `label`'s line uncommented, types and passes every sample it was drawn from."""
    contract = parse_contract(
        text.replace(f"# label: {{name: {label}", f"label: {{name: {label}"), "d"
    )
    gate = quality_gate(contract)
    text_columns = [c.name for c in contract.columns if c.dtype == "str"]
    for path in paths:
        day = path.stem.split("_")[1]
        raw = read_landed_file(path.read_bytes(), path.name, day, text_columns)
        report, _ = gate.validate(type_rows(raw, contract, where=path.name), day)
        assert [f.sentence for f in report.failures] == [], day


def test_infinities_in_a_float_column_get_the_finite_values_range_and_a_warning(tmp_path):
    days = ["2024-01-01", "2024-01-02"]
    paths = write_samples(
        tmp_path,
        {
            day: pd.DataFrame(
                {
                    "ts": [f"{day} {h:02d}:15:00" for h in range(20)],
                    "ratio": [
                        "inf" if h == 3 else "-inf" if h == 4 else str(h / 2) for h in range(20)
                    ],
                    "amount": [str(h) for h in range(20)],
                }
            )
            for day in days
        },
    )

    text = draft_contract(paths, "shop")

    ratio = next(c for c in drafted(text)["columns"] if c["name"] == "ratio")
    # The finite values' range (0 to 9.5) as drafted: never negative, at most 10x the largest.
    assert ratio["dtype"] == "float" and (ratio["min"], ratio["max"]) == (0, 95)
    line = next(line for line in text.splitlines() if "{name: ratio," in line)
    assert "4 infinite value(s) in the samples, which the quality gate rejects" in line


def test_whole_numbers_beyond_64_bits_are_drafted_as_text_the_typing_accepts(tmp_path):
    days = ["2024-01-01", "2024-01-02"]
    paths = write_samples(
        tmp_path,
        {
            day: pd.DataFrame(
                {
                    "ts": [f"{day} {h:02d}:15:00" for h in range(20)],
                    # 64-bit unsigned ids, as hashes and some exporters write them.
                    "order_id": [str(2**63 + 1000 * i + h) for h in range(20)],
                    "amount": [str(h) for h in range(20)],
                }
            )
            for i, day in enumerate(days)
        },
    )

    text = draft_contract(paths, "shop")

    order_id = next(c for c in drafted(text)["columns"] if c["name"] == "order_id")
    assert order_id["dtype"] == "str"
    line = next(line for line in text.splitlines() if "{name: order_id," in line)
    assert "whole numbers beyond 64 bits: text, which holds every digit" in line
    accepts_its_samples(text, paths, "amount_label")


def test_samples_of_one_row_a_day_show_no_column_constant_within_a_day(tmp_path):
    days = ["2024-01-01", "2024-01-02", "2024-01-03"]
    paths = write_samples(
        tmp_path,
        {
            day: pd.DataFrame({"ts": [f"{day} 10:15:00"], "amount": [str(3 + i)], "shop": ["n"]})
            for i, day in enumerate(days)
        },
    )

    text = draft_contract(paths, "shop")

    # One row a day says nothing of how a column moves within a day.
    assert not any("constant_within_day" in c for c in drafted(text)["columns"])
    assert "# label: {name: amount_label, task: regression, source: amount}" in text
    accepts_its_samples(text, paths, "amount_label")


def date_samples(folder: Path, spelling: str) -> list[Path]:
    """Two days of sales with the day in a date column spelled as `spelling`, and no hour."""
    days = ["2024-01-01", "2024-01-02"]
    return write_samples(
        folder,
        {
            day: pd.DataFrame(
                {
                    "sold_on": [dt.date.fromisoformat(day).strftime(spelling)] * 6,
                    "store": list("abcdef"),
                    "amount": [str(3 * h + i) for h in range(6)],
                }
            )
            for i, day in enumerate(days)
        },
    )


@pytest.mark.parametrize("spelling", ["%Y-%m-%d", "%Y-%m-%d 00:00:00"])
def test_a_date_column_without_an_hour_is_drafted_as_the_event_time(tmp_path, spelling):
    paths = date_samples(tmp_path, spelling)

    text = draft_contract(paths, "shop")

    assert drafted(text)["event_time"] == {"column": "sold_on", "timezone": "UTC"}
    assert "'sold_on' holds each file's day, and no column holds an hour" in text
    accepts_its_samples(text, paths, "amount_label")


def test_a_date_spelled_otherwise_without_an_hour_is_named_but_not_drafted(tmp_path):
    # Without an hour column the typing reads the event time column as ISO 8601 only: drafted
    # as the event time, 'Jan 01, 2024' would reject every day.
    text = draft_contract(date_samples(tmp_path, "%b %d, %Y"), "shop")

    assert drafted(text)["event_time"]["column"] is None
    assert "'sold_on' holds each file's day, but not as ISO 8601 dates" in text


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "is not a readable CSV file"),
        ("città,amount\nRoma,3\n".encode("latin-1"), "it is not utf-8 text"),
        (b"ts,amount,amount\n2024-01-01 10:00:00,3,4\n", "names 'amount' more than once"),
        (b"ts,amount,shop\n2024-01-01 10:00:00,3,a\n2024-01-01 11:00:00,4", "looks truncated"),
    ],
)
def test_a_sample_the_landing_zone_cannot_read_is_named_with_the_reason(
    tmp_path, capsys, content, reason
):
    path = tmp_path / "shop_2024-01-01.csv"
    path.write_bytes(content)

    with pytest.raises(InferenceError, match=f"shop_2024-01-01.csv .*{reason}"):
        draft_contract([path], "shop")
    # The command says so, as for any sample it cannot draft from, instead of a traceback.
    assert cli.main(["init-contract", str(path), "--name", "shop"]) == 2
    assert reason in capsys.readouterr().err


@pytest.mark.parametrize("values", [["0", "-1e308"], ["-1.7e308", "1.7e308"], ["1e300", "3e300"]])
def test_floats_near_the_largest_get_a_range_that_holds_them(tmp_path, values):
    days = ["2024-01-01", "2024-01-02"]
    paths = write_samples(
        tmp_path,
        {
            day: pd.DataFrame(
                {
                    "ts": [f"{day} {h:02d}:15:00" for h in range(6)],
                    "reading": values * 3,
                    "amount": [str(3 * h + i) for h in range(6)],
                }
            )
            for i, day in enumerate(days)
        },
    )

    text = draft_contract(paths, "shop")

    reading = next(c for c in drafted(text)["columns"] if c["name"] == "reading")
    numbers = [float(v) for v in values]
    assert reading["min"] <= min(numbers) and reading["max"] >= max(numbers)
    accepts_its_samples(text, paths, "amount_label")


def test_codes_with_leading_zeros_are_drafted_as_text_that_keeps_them(tmp_path):
    days = ["2024-01-01", "2024-01-02"]
    paths = write_samples(
        tmp_path,
        {
            day: pd.DataFrame(
                {
                    "ts": [f"{day} {h:02d}:15:00" for h in range(20)],
                    # Branch codes as the source system writes them: five digits, zero-padded.
                    "branch": [f"{h % 4 + 1:05d}" for h in range(20)],
                    "amount": [str(3 * h + i) for h in range(20)],
                }
            )
            for i, day in enumerate(days)
        },
    )

    text = draft_contract(paths, "shop")

    branch = next(c for c in drafted(text)["columns"] if c["name"] == "branch")
    assert branch["dtype"] == "str"
    assert "allowed_values" not in branch
    line = next(line for line in text.splitlines() if "{name: branch," in line)
    assert "leading zeros ('00001'): text, which keeps them" in line
    # The codes seen, quoted: copied into the mapping they stay text, zeros kept.
    seen = line.split("add allowed_values: ")[1]
    assert yaml.safe_load(seen) == ["00001", "00002", "00003", "00004"]
    feature = next(f for f in drafted(text)["features"] if f["source"] == "branch")
    assert feature["kind"] == "categorical"
    accepts_its_samples(text, paths, "amount_label")
    # A later day's code keeps its zeros in the typed rows.
    contract = parse_contract(
        text.replace("# label: {name: amount_label", "label: {name: amount_label"), "d"
    )
    raw = read_landed_file(paths[0].read_bytes(), paths[0].name, days[0], ["ts", "branch"])
    assert type_rows(raw, contract, where="d")["branch"].iloc[0] == "00001"


def test_a_column_never_filled_in_the_samples_is_drafted_as_no_feature(tmp_path):
    days = ["2024-01-01", "2024-01-02"]
    paths = write_samples(
        tmp_path,
        {
            day: pd.DataFrame(
                {
                    "ts": [f"{day} {h:02d}:15:00" for h in range(20)],
                    "coupon": [""] * 20,  # an optional field nobody used yet
                    "amount": [str(3 * h + i) for h in range(20)],
                }
            )
            for i, day in enumerate(days)
        },
    )

    text = draft_contract(paths, "shop")

    assert "coupon" not in {f["source"] for f in drafted(text)["features"]}
    assert (
        "# - {name: coupon, kind: categorical, source: coupon}  # empty in every sample: no "
        "feature until its values are known" in text
    )
    accepts_its_samples(text, paths, "amount_label")


def test_zero_padded_numbers_are_no_hour_unless_named_so(tmp_path):
    # Text now (they keep their zeros), a month's "03" still reads as no hour of the day.
    days = ["2024-03-01", "2024-03-02"]
    paths = write_samples(
        tmp_path,
        {
            day: pd.DataFrame(
                {
                    "sale_date": [day] * 20,
                    "shelf": [f"{h % 12 + 1:02d}" for h in range(20)],
                    "sale_hour": [str(h) for h in range(20)],
                    "amount": [str(3 * h + i) for h in range(20)],
                }
            )
            for i, day in enumerate(days)
        },
    )

    text = draft_contract(paths, "shop")

    event_time = drafted(text)["event_time"]
    assert (event_time["column"], event_time["hour"]) == ("sale_date", "sale_hour")
    shelf = next(c for c in drafted(text)["columns"] if c["name"] == "shelf")
    assert shelf["dtype"] == "str"


def test_init_contract_never_replaces_an_existing_contract_unasked(tmp_path, capsys):
    days = ["2024-01-01", "2024-01-02", "2024-01-03"]
    paths = write_samples(
        tmp_path,
        {
            day: pd.DataFrame({"ts": [f"{day} 10:15:00"], "amount": [str(3 + i)], "shop": ["n"]})
            for i, day in enumerate(days)
        },
    )
    edited = tmp_path / "shop.yaml"
    edited.write_text("# the contract a person has edited\n")
    command = ["init-contract", *map(str, paths), "--name", "shop", "-o", str(edited)]

    assert cli.main(command) == 2

    assert f"error: {edited} exists" in capsys.readouterr().err
    assert edited.read_text() == "# the contract a person has edited\n"
    assert cli.main([*command, "--force"]) == 0
    assert "name: shop" in edited.read_text()
