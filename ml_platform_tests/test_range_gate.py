"""The range's quality gate: real flights days screened together reach the one-by-one verdicts."""

import datetime as dt
import json

import dagster as dg
import pandas as pd
import pytest

from ml_platform.contracts import Contract
from ml_platform.contracts.model import EVENT_TIME
from ml_platform.contracts.schema import type_rows
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.validation.expectations import (
    HISTORY,
    PARTITION_DAY,
    UNIQUENESS,
    VALIDITY,
    VOLUME,
    GateReport,
    quality_gate,
    render_data_docs,
)
from ml_platform.validation.history import day_profile, window_from_profiles
from ml_platform.validation.range_gate import (
    DAY,
    RULE,
    RULE_DAY,
    RangeValidation,
    ScreenedDay,
    range_screen,
    range_validations,
    screen_range,
)
from ml_platform_tests.conftest import Platform, days_from
from ml_platform_tests.test_history_gate import (
    flights_with_history,
    land_edited,
    materialize_range,
)

DAYS = days_from("2013-01-01", 9)
# Each broken day fails one rule of a different kind; the others are the real days.
BAD_DISTANCE, TOO_FEW_ROWS, HALF_TAILNUMS, WRONG_DAY, DUPLICATE = (
    DAYS[2],
    DAYS[3],
    DAYS[5],
    DAYS[6],
    DAYS[7],
)


@pytest.fixture(scope="module")
def contract(tmp_path_factory) -> Contract:
    """Flights, each day judged against the previous 7 days' history (3 needed)."""
    return flights_with_history(
        tmp_path_factory.mktemp("range_gate"),
        reference={"mode": "previous_days", "days": 7},
        min_days=3,
    )


def typed_day(contract: Contract, day: str) -> pd.DataFrame:
    """A real day as validated_data types it, broken as its name in this module says."""
    name = contract.landing.file_name(day)
    flights = flights_for_day(dt.date.fromisoformat(day))
    text = [c.name for c in contract.columns if c.dtype == "str"]
    raw = read_landed_file(flights.to_csv(index=False).encode(), name, day, text)
    typed = type_rows(raw, contract, where=name).reset_index(drop=True)
    if day == BAD_DISTANCE:
        typed.loc[7, "distance"] = 9000.0
    if day == TOO_FEW_ROWS:
        typed = typed.iloc[:200].reset_index(drop=True)
    if day == HALF_TAILNUMS:
        typed.loc[typed.index % 2 == 0, "tailnum"] = None
    if day == WRONG_DAY:
        typed.loc[3, EVENT_TIME] = typed.loc[3, EVENT_TIME] + pd.Timedelta(days=1)
    if day == DUPLICATE:
        typed = pd.concat([typed, typed.iloc[[10]]], ignore_index=True)
    return typed


@pytest.fixture(scope="module")
def frames(contract) -> dict[str, pd.DataFrame]:
    return {day: typed_day(contract, day) for day in DAYS}


def judge_in_order(contract, frames, screened: dict[str, ScreenedDay]) -> dict:
    """Each day's report and GE result, judged in order as validated_data judges a range.

    A day's history is the profiles of the days before it that passed; a day the screen passed
    against that very history takes the screen's verdict (its result is the range's), any other
    is validated on its own.
    """
    gate, screen = quality_gate(contract), range_screen(contract)
    passed: dict[str, dict[str, float | None]] = {}
    outcome: dict[str, tuple[GateReport, object, bool]] = {}
    for day, typed in frames.items():
        history = window_from_profiles(contract, day, passed)
        entry = screened.get(day)
        from_screen = entry is not None and entry.history == history
        if from_screen:
            report, result = screen.passed_report(typed), None
        else:
            report, result = gate.validate(typed, day, history)
        if not report.failures:
            passed[day] = day_profile(typed, contract)
        outcome[day] = (report, result, from_screen)
    return outcome


def day_rows(validation: RangeValidation, column: str, day: str) -> list[dict]:
    """The failing rows GE lists for `day` in a validation of the screen (by its day column)."""
    return [
        index
        for r in validation.result.results
        if not r.success
        for index in r.result["unexpected_index_list"]
        if index[column] == day
    ]


def test_a_range_reaches_each_days_one_by_one_verdict_and_failures(contract, frames, tmp_path):
    one_by_one = judge_in_order(contract, frames, screened={})
    failed = {
        day: sorted({f.check for f in report.failures})
        for day, (report, _, _) in one_by_one.items()
        if report.failures
    }
    # The broken days fail as a day of their own fails: a row, a table, a history rule.
    assert failed[BAD_DISTANCE] == [VALIDITY]
    assert VOLUME in failed[TOO_FEW_ROWS]
    assert failed[HALF_TAILNUMS] == [HISTORY]
    assert failed[WRONG_DAY] == [PARTITION_DAY]
    assert failed[DUPLICATE] == [UNIQUENESS]
    assert set(failed) == {BAD_DISTANCE, TOO_FEW_ROWS, HALF_TAILNUMS, WRONG_DAY, DUPLICATE}

    # No day before the range is history: every reference day is one of the range's.
    screened = screen_range(
        lambda day: None,
        contract,
        DAYS,
        rows_of=lambda day: len(frames[day]),
        typed_of=lambda day: frames[day],
        history_on=True,
    )
    in_range = judge_in_order(contract, frames, screened)

    # The screen passed every good day, and no broken one.
    assert set(screened) == set(DAYS) - set(failed)
    for day in DAYS:
        report, result, _ = in_range[day]
        expected, expected_result, _ = one_by_one[day]
        assert report.failures == expected.failures, day
        assert report.rows == expected.rows and report.evaluated == expected.evaluated
        if day in failed:
            # A day the screen did not pass is validated on its own: GE's result is its own.
            assert without_meta(result.to_json_dict()) == without_meta(
                expected_result.to_json_dict()
            ), day
        else:
            assert result is None, day
    # Every good day passed on the screen's verdict, judged against the days before it that
    # passed: the screen assumed the broken days fail once it had not passed them.
    assert [day for day in DAYS if in_range[day][2]] == sorted(set(DAYS) - set(failed))
    last = screened[DAYS[8]]
    assert last.history is not None and last.history.stored == [DAYS[1], DAYS[4]]

    # The screen's results are GE's own: one validation of the days' rows, one of their
    # table-level rules (and one more for the days whose history changed), each GE's
    # ExpectationSuiteValidationResult of its suite, whose failing rows name their days.
    from great_expectations.core import ExpectationSuiteValidationResult

    validations = range_validations(screened)
    rows = next(v for v in validations if v.kind == "rows")
    assert {v.kind for v in validations} <= {"rows", "days", "days-2", "days-3"}
    for validation in validations:
        assert isinstance(validation.result, ExpectationSuiteValidationResult)
        assert validation.chunk == (DAYS[0], DAYS[-1])
        # A validation's meta names the batch GE validated, which no hand-made result has.
        assert {"batch_spec", "batch_markers"} <= set(validation.result.meta)
        screen = range_screen(contract)
        suite = screen.rows_suite if validation.kind == "rows" else screen.days_suite
        assert validation.result.suite_name == suite.name
        assert len(validation.result.results) == len(suite.expectations)
        # GE renders each as its own Data Docs page.
        assert validation.result.suite_name in render_data_docs(validation.result)
    assert rows.days == DAYS
    assert not rows.result.success
    # The broken rows are named by their day in GE's result; no good day's rows fail.
    assert rows.failed == {BAD_DISTANCE, WRONG_DAY, DUPLICATE}
    for day in DAYS:
        assert bool(day_rows(rows, DAY, day)) == (day in rows.failed), day
    for day, entry in screened.items():
        assert entry.rows is rows and not day_rows(entry.table, RULE_DAY, day)
        assert day not in entry.table.failed and day in entry.table.days
        assert f"whose {DAY} is {day} in validation_result" in entry.description(day)
    # The table-level rules name the day and the rule that failed: the partial day's volume.
    table = next(v for v in validations if v.kind == "days")
    assert {(i[RULE_DAY], i[RULE]) for i in day_rows(table, RULE_DAY, TOO_FEW_ROWS)} >= {
        (TOO_FEW_ROWS, "row_count")
    }


def test_days_whose_history_changes_twice_are_judged_again_until_it_holds(contract, tmp_path):
    # A: half the tail numbers missing, which fails against ordinary days. B: 40 % missing,
    # which passes only with A in its history. C and D: ordinary days after both. The screen
    # first assumes A and B pass; once A fails, B is judged again without it and fails; then C
    # and D are judged again without either: a third round.
    days = days_from("2013-01-20", 8)
    a, b = days[4], days[5]

    def real_day(day: str) -> pd.DataFrame:
        typed = typed_day(contract, day)
        share = {a: 0.5, b: 0.4}.get(day, 0.0)
        typed.loc[: int(share * len(typed)) - 1, "tailnum"] = None
        return typed

    frames = {day: real_day(day) for day in days}
    one_by_one = judge_in_order(contract, frames, screened={})
    failed = {day for day, (report, _, _) in one_by_one.items() if report.failures}
    assert failed == {a, b}
    assert [f.check for f in one_by_one[b][0].failures] == [HISTORY]

    screened = screen_range(
        lambda day: None,
        contract,
        days,
        rows_of=lambda day: len(frames[day]),
        typed_of=lambda day: frames[day],
        history_on=True,
    )
    in_range = judge_in_order(contract, frames, screened)
    assert set(screened) == set(days) - failed
    # Every good day takes the screen's verdict: none is validated on its own.
    assert {day for day, (_, _, from_screen) in in_range.items() if from_screen} == set(screened)
    for day in days:
        assert in_range[day][0].failures == one_by_one[day][0].failures, day
    kinds = {day: screened[day].table.kind for day in screened}
    assert kinds == {**dict.fromkeys(days[:4], "days"), days[6]: "days-3", days[7]: "days-3"}
    assert screened[days[6]].history == window_from_profiles(
        contract, days[6], {day: day_profile(frames[day], contract) for day in days[:4]}
    )


# What a day the range's screen passed links to: the range's results, and its day in them.
RANGE_LINKS = {"table_validation_result", "table_data_docs", "judged_in_range"}


def check_verdicts(result: dg.ExecuteInProcessResult, platform: Platform) -> dict:
    """Day -> check -> (passed, description, metadata but the run's own file links).

    A description's link to the run's quarantined parse names the lake and the run; both are
    written as placeholders, so that two platforms' runs of a day compare equal. The versions
    of the reference days name the runs that recorded them, which differ between a range and
    days run one by one: they are left out too.
    """
    links = {"validation_result", "data_docs", "rejected_parse", "quarantine", *RANGE_LINKS}
    links |= {"history_reference_data_versions", "history_reference_runs"}
    verdicts: dict[str, dict] = {}
    for check in result.get_asset_check_evaluations():
        metadata = {k: v for k, v in check.metadata.items() if k not in links}
        description = (check.description or "").replace(str(platform.lake_dir), "<lake>")
        verdicts.setdefault(check.partition, {})[check.check_name] = (
            check.passed,
            description.replace(result.run_id, "<run>"),
            metadata,
        )
    return verdicts


def recorded_days(result: dg.ExecuteInProcessResult, platform: Platform, asset: str) -> dict:
    """Day -> what the run recorded of the day of `asset`: verdict, accepted, accepted rows."""
    return {
        m.partition: (
            m.metadata["verdict"].value,
            m.metadata["accepted"].value,
            m.metadata["accepted_rows"].value,
        )
        for m in result.asset_materializations_for_node(platform.node(asset))
    }


def without_meta(document: dict) -> dict:
    return {key: value for key, value in document.items() if key != "meta"}


def stored_results(platform: Platform, day: str) -> list[dict]:
    """The day's stored GE results, without their meta (batch markers, times)."""
    folder = platform.lake_dir / platform.contract.name / "quality" / "validated_data" / day
    return [without_meta(json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]


def test_a_range_run_of_validated_data_gives_each_day_its_one_by_one_checks(contract, tmp_path):
    # A day failing the history gate amid the range, judged against the days before it that
    # passed, and a day after it that must not see it as history.
    days = DAYS[:7]

    def break_days(platform: Platform) -> None:
        platform.land(days[0], len(days))

        def bad_distance(frame: pd.DataFrame) -> None:
            frame.loc[7, "distance"] = "9000"

        def half_tailnums(frame: pd.DataFrame) -> None:
            frame.loc[frame.index % 2 == 0, "tailnum"] = ""

        land_edited(platform, days[1], bad_distance)
        land_edited(platform, days[5], half_tailnums)
        # A partial delivery: the header and the first 200 flights.
        partial = platform.landing_dir / contract.landing.file_name(days[3])
        partial.write_text("".join(partial.read_text().splitlines(keepends=True)[:201]))

    alone = Platform(contract, tmp_path / "alone")
    break_days(alone)
    one_by_one: dict[str, dict] = {}
    records: dict[str, tuple] = {}
    for day in days:
        result = alone.materialize(day, selection=["raw_data", "validated_data"])
        one_by_one.update(check_verdicts(result, alone))
        records.update(recorded_days(result, alone, "validated_data"))

    together = Platform(contract, tmp_path / "together")
    break_days(together)
    result = materialize_range(together, days)

    # The rejected days are verdicts of their own, not failures: the range's run succeeds.
    assert result.success
    assert not any(e.event_type_value == "STEP_FAILURE" for e in result.all_events)
    in_range = check_verdicts(result, together)
    failed = {d for d, checks in in_range.items() if not all(p for p, _, _ in checks.values())}
    assert failed == {days[1], days[3], days[5]}
    assert not in_range[days[1]][VALIDITY][0] and not in_range[days[3]][VOLUME][0]
    assert not in_range[days[5]][HISTORY][0]
    assert in_range[days[6]][HISTORY][2]["history_reference_days"].value == [
        days[0],
        days[2],
        days[4],
    ]
    # Each day's delivery check says whether it was accepted, and a rejected day's reason.
    for day in days:
        passed, description, _ = in_range[day]["delivery_accepted"]
        assert passed == (day not in failed), day
        if day in failed:
            assert description.startswith(f"{day} was rejected (failed quality gate): ")
            assert contract.landing.file_name(day) in description
    assert "(gx_volume): the file holds 200 rows" in in_range[days[3]]["delivery_accepted"][1]
    assert in_range == one_by_one
    # Every day is recorded with its verdict, the same as a run of that day alone.
    in_range_records = recorded_days(result, together, "validated_data")
    assert in_range_records == records
    assert {d for d, (verdict, _, _) in in_range_records.items() if verdict != "accepted"} == failed
    for day in failed:
        assert in_range_records[day] == ("failed quality gate", False, 0)
    # The good days are stored, the rejected ones not.
    for day in days:
        assert together.stored("validated_data", day, "parquet").exists() == (day not in failed)
        if day not in failed:
            # The rows the range's screen typed are the day's own, stored as a day alone does.
            pd.testing.assert_frame_equal(
                pd.read_parquet(together.stored("validated_data", day, "parquet")),
                pd.read_parquet(alone.stored("validated_data", day, "parquet")),
            )
    # A rejected day was validated on its own: GE's result of the day, as a day alone stores.
    for day in failed:
        assert stored_results(together, day) == stored_results(alone, day), day
    # The good days took their verdicts from the range's validations, not validations of their
    # own: they store no result, and each links to GE's two results of the range, stored once
    # with their Data Docs pages, naming its day in them.
    materialized = {
        m.partition: m.metadata
        for m in result.asset_materializations_for_node(together.node("validated_data"))
    }
    folder = together.lake_dir / contract.name / "quality" / "validated_data"
    ranges = folder / "range" / f"{days[0]}..{days[-1]}"
    # The rows, the table-level rules, and those of the days after a rejected day judged again
    # without it in their history.
    assert sorted(p.name for p in ranges.iterdir()) == sorted(
        f"{result.run_id}.{kind}.{ext}"
        for kind in ("rows", "days", "days-2")
        for ext in ("json", "html")
    )
    rows_result = json.loads((ranges / f"{result.run_id}.rows.json").read_text())
    assert rows_result["suite_name"] == f"{contract.name}_range_rows"
    assert not rows_result["success"]  # the day with a distance of 9000 miles
    bad_rows = {
        index[DAY]
        for r in rows_result["results"]
        if not r["success"]
        for index in r["result"]["unexpected_index_list"]
    }
    assert bad_rows == {days[1]}
    for day in days:
        if day in failed:
            assert stored_results(together, day) != [], day
            assert not RANGE_LINKS & set(materialized[day]), day
            continue
        assert not (folder / day).exists(), day
        metadata = materialized[day]
        assert metadata["validation_result"].value == str(
            ranges.resolve() / f"{result.run_id}.rows.json"
        )
        assert metadata["data_docs"].value == str(ranges.resolve() / f"{result.run_id}.rows.html")
        # A day after a rejected one was judged again, once the screen knew its history.
        table = "days" if day < min(failed) else "days-2"
        assert metadata["table_validation_result"].value == str(
            ranges.resolve() / f"{result.run_id}.{table}.json"
        )
        assert metadata["table_data_docs"].value == str(
            ranges.resolve() / f"{result.run_id}.{table}.html"
        )
        assert f"whose {DAY} is {day} in validation_result" in metadata["judged_in_range"].value
        assert metadata["expectations_evaluated"].value == quality_gate(contract).expectation_count
        # Each check of the day links to the same results, and says what it found.
        assert all(passed for passed, _, _ in in_range[day].values()), day
        checks = {
            c.check_name: c for c in result.get_asset_check_evaluations() if c.partition == day
        }
        assert checks[VALIDITY].metadata["judged_in_range"] == metadata["judged_in_range"]
        assert checks[VALIDITY].description.endswith(": all gx_validity expectations pass.")
