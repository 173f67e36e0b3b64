"""champion_performance: the serving champion scored on each day's rows, and champion_decay."""

import datetime as dt
import json
import math

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from ml_platform.automation.alerts import WARNING, Notifier, evaluate_run
from ml_platform.contracts import load_contract
from ml_platform.drift.episodes import DayEpisodes, Episode, FeatureState
from ml_platform.evaluation.metrics import Predictions
from ml_platform.ingestion.landing import LandingZone, source_day
from ml_platform.ingestion.synthetic import POPULATION_SD, file_bytes
from ml_platform.platform.failures import FailedCheck
from ml_platform.platform.run_events import RunOutcome, run_outcome
from ml_platform.platform.storage import write_atomically
from ml_platform.registry.monitoring import (
    CHAMPION_PERFORMANCE,
    DECAY_CHECK,
    EPISODE_CHECK,
    NO_CHAMPION,
    NO_LABELLED_ROWS,
    SCORED,
    champion_record,
    decay_check,
    judged,
    threshold_results,
    undefined_metrics,
    with_importance,
)
from ml_platform.troubleshooting.health import open_episodes, pipeline_health
from ml_platform_tests.conftest import Platform, contract_with, days_from
from ml_platform_tests.test_backfill_range import evaluations, materialize_range

pytestmark = pytest.mark.slow

GOOD = days_from("2024-01-01", 2)
# The changed days, and a day between them whose delivery fails the quality gate.
CHANGED_AND_REJECTED = days_from("2024-01-03", 4)
REJECTED = CHANGED_AND_REJECTED[1]
CHANGED = [day for day in CHANGED_AND_REJECTED if day != REJECTED]


def land_changed_relation(platform: Platform, days: list[str]) -> None:
    """Land days on which the label's relation to x1 turned around (concept drift).

    x1 keeps its distribution, so every data gate passes: only a model's errors show the
    change, which is what a decaying champion looks like. The days are also much warmer: a
    drift episode of `temperature`, which the target does not depend on.
    """
    zone = LandingZone(base_dir=str(platform.landing_dir))
    for day in days:
        frame = source_day(platform.contract, dt.date.fromisoformat(day))
        # The generator's coefficient of x1 is +2: the changed world has -2.
        frame["target"] = (frame["target"] - 4.0 * frame["x1"]).round(6)
        frame["temperature"] += 4.0 * POPULATION_SD["temperature"]
        write_atomically(zone.path_for(platform.contract.landing.file_name(day)), file_bytes(frame))


def record(platform: Platform, day: str) -> dict:
    return json.loads(platform.stored(CHAMPION_PERFORMANCE, day, "json").read_text())


def serving(platform: Platform, day: str) -> str | None:
    """The champion the registrations before `day` left, from registered_model's records."""
    registered = [
        path
        for earlier in sorted(platform.materialized("registered_model"))
        if earlier < day and (path := platform.stored("registered_model", earlier, "json")).exists()
    ]
    return json.loads(registered[-1].read_text())["champion_after"] if registered else None


def test_the_champion_is_scored_each_day_and_decay_warns_on_the_third_bad_day(tmp_path):
    contract = contract_with(tmp_path, "synthetic", window_days=7)
    platform = Platform(contract, tmp_path / "platform")
    platform.land(GOOD[0], len(GOOD))
    land_changed_relation(platform, CHANGED)
    platform.land(REJECTED, 1, fault="out_of_range")

    # Good days, one run per day as the sensor runs them.
    for day in GOOD:
        assert platform.materialize(day).success, day
    # The changed days in one run, as a backfill runs them.
    result = materialize_range(platform, CHANGED_AND_REJECTED[0], CHANGED_AND_REJECTED[-1])
    assert result.success

    days = GOOD + CHANGED
    assert platform.materialized(CHAMPION_PERFORMANCE) == set(days) | {REJECTED}
    # The rejected day is a tombstone down to the monitoring: no record in the lake.
    assert not platform.stored(CHAMPION_PERFORMANCE, REJECTED, "json").exists()
    first = record(platform, GOOD[0])
    assert first["status"] == NO_CHAMPION and first["champion_version"] is None
    for day in days[1:]:
        scored = record(platform, day)
        assert scored["status"] == SCORED, day
        # The serving champion: what the registrations of the days before left.
        assert scored["champion_version"] == serving(platform, day), day
        assert scored["champion_version"] is not None, day
        assert scored["labelled_rows"] == 1000, day
        assert set(scored["metrics"]) == {"mae", "rmse", "r2"}, day
        low, high = scored["intervals"]["rmse"]
        assert low <= scored["metrics"]["rmse"] <= high, day
    # The champion serves the good day well and misses on every changed day; the changed
    # days' candidates are rejected, so the champion they compete with stays the registry's.
    assert record(platform, GOOD[1])["meets_thresholds"] is True
    champion = platform.registry().alias("champion")
    for day in CHANGED:
        report = json.loads(platform.stored("evaluation_report", day, "json").read_text())
        assert report["decision"] == "reject", day
        assert record(platform, day)["champion_version"] == champion, day
        assert record(platform, day)["meets_thresholds"] is False, day
        assert record(platform, day)["thresholds"]["rmse"]["met"] is False, day

    # Plotted across partitions: one float per metric of the task, and the version.
    plotted = {
        r.partition_key: r.asset_materialization.metadata
        for r in platform.instance.fetch_materializations(
            platform.key(CHAMPION_PERFORMANCE), limit=100
        ).records
        if r.asset_materialization is not None
    }
    assert set(plotted) == set(days) | {REJECTED}
    assert "champion_rmse" not in plotted[GOOD[0]]
    for day in days[1:]:
        # Plotted to 4 significant digits; the stored record keeps full precision.
        for metric in ("mae", "rmse", "r2"):
            full = record(platform, day)["metrics"][metric]
            shown = plotted[day][f"champion_{metric}"].value
            assert shown == pytest.approx(full, rel=5e-4), (day, metric)
        assert plotted[day]["champion_version"].value == record(platform, day)["champion_version"]

    # The tombstoned day neither counts nor breaks the streak: the third scored bad day warns.
    decay = evaluations(platform, CHAMPION_PERFORMANCE, DECAY_CHECK)
    assert decay == {
        GOOD[0]: True,
        GOOD[1]: True,
        CHANGED[0]: True,
        CHANGED[1]: True,
        CHANGED[2]: False,
    }

    # A one-day rerun of the last day reads the earlier days' records from the lake.
    rerun = platform.materialize(CHANGED[-1], selection=[CHAMPION_PERFORMANCE])
    assert rerun.success
    [evaluation] = [e for e in rerun.get_asset_check_evaluations() if e.check_name == DECAY_CHECK]
    assert not evaluation.passed and evaluation.partition == CHANGED[-1]
    assert f"({CHANGED[0]} to {CHANGED[-1]})" in (evaluation.description or "")

    # The failed WARN check of the run becomes one WARNING alert with the runbook section.
    outcome = run_outcome(platform.instance, result.run_id, result.success)
    assert outcome is not None
    alerts = [
        a
        for a in evaluate_run(outcome, {}, Notifier(), now=0.0)
        if a.subject == f"{platform.key(CHAMPION_PERFORMANCE).to_user_string()}:{DECAY_CHECK}"
    ]
    assert len(alerts) == 1
    assert alerts[0].severity == WARNING and alerts[0].rule == "check_failed"
    assert "the model is decaying: retrain or look at the data" in alerts[0].cause.lower()
    assert alerts[0].runbook.endswith(f"#check-{DECAY_CHECK}")
    # Decay is a symptom: it pages.
    assert alerts[0].page

    # The warm days are one drift episode of temperature, opened on the first of them (4 sd
    # warmer than anything the reference held: the level left it) and still open, the
    # rejected day not judged: told once, paging nobody, since the champion does not lean on
    # a feature the target ignores.
    told = [a for a in evaluate_run(outcome, {}, Notifier(), now=0.0) if a.rule.startswith("drift")]
    assert [(a.severity, a.rule, a.page) for a in told] == [(WARNING, "drift_episode", False)]
    opened_on = told[0].partition
    assert opened_on == CHANGED[0]
    assert told[0].title.startswith("synthetic: temperature drifting since 2024-01-0")
    assert "the champion barely uses it" in told[0].cause
    episodes = evaluations(platform, CHAMPION_PERFORMANCE, EPISODE_CHECK)
    assert episodes == {day: day < opened_on for day in days}
    opened = record(platform, opened_on)["drift_episodes"]["temperature"]["episode"]
    assert opened["opened"] == opened_on and opened["leaned_on"] is False
    assert opened["importance"] < 0.05
    # The day's drift check fails on the warm days and pages nobody.
    drifted = [
        a
        for a in evaluate_run(outcome, {}, Notifier(), now=0.0)
        if a.subject.endswith(":features_drift")
    ]
    assert CHANGED[0] in {a.partition for a in drifted} and not any(a.page for a in drifted)
    # `ml-platform health` lists the dataset's open episode at its latest monitored day.
    [(day, [line])] = open_episodes(platform.instance).values()
    assert day == CHANGED[-1]
    assert line.startswith(f"temperature since {opened['since']} (")
    assert "ks_d up to 1.000" in line
    rendered = pipeline_health(platform.instance, days=1).render()
    heading = "open drift episodes (at each dataset's latest monitored day):"
    assert f"{heading}\n  synthetic ({day}): 1\n    {line}" in rendered


def scored_record(day: str, rmse: float, r2: float = 0.9, version: str = "daily-2024-01-01"):
    """A stored record of a scored day, as champion_record writes it."""
    values = {"mae": rmse * 0.8, "rmse": rmse, "r2": r2}
    thresholds = threshold_results(values, {"r2": 0.8, "rmse": 1.0})
    return {
        "partition": day,
        "status": SCORED,
        "champion_version": version,
        "labelled_rows": 1000,
        "metrics": values,
        "intervals": {},
        "thresholds": thresholds,
        "meets_thresholds": all(t["met"] for t in thresholds.values()),
        "note": "",
    }


def test_thresholds_are_maximums_for_errors_and_minimums_for_the_rest():
    results = threshold_results({"rmse": 1.2, "r2": 0.85}, {"rmse": 1.0, "r2": 0.8, "roc_auc": 0.6})
    assert results["rmse"] == {"value": 1.2, "bound": 1.0, "direction": "max", "met": False}
    assert results["r2"]["direction"] == "min" and results["r2"]["met"] is True
    # A metric the task does not produce misses its bound, as in the promotion verdict.
    assert results["roc_auc"]["met"] is False


@pytest.fixture
def synthetic():
    return load_contract("synthetic")


def test_decay_needs_decay_days_missed_in_a_row_and_a_gap_breaks_the_streak(synthetic):
    assert synthetic.evaluation.decay_days == 3
    today = scored_record("2024-01-10", rmse=2.0)
    missed = {d: scored_record(d, rmse=2.5) for d in ("2024-01-09", "2024-01-08")}

    failed = decay_check(synthetic, today, missed)
    assert not failed.passed and failed.severity == dg.AssetCheckSeverity.WARN
    assert failed.description is not None
    assert failed.description.startswith("The model is decaying: retrain or look at the data.")
    assert "2024-01-08 to 2024-01-10" in failed.description
    assert "rmse 2.0000 (at most 1.0)" in failed.description
    assert failed.metadata["streak_days"].value == 3

    # Two days in a row are not decay yet.
    two = decay_check(synthetic, today, {**missed, "2024-01-08": scored_record("2024-01-08", 0.5)})
    assert two.passed and two.metadata["streak_days"].value == 2
    # A day without a record (a tombstone: its data was rejected) is skipped, not a break.
    gap = {"2024-01-09": missed["2024-01-09"], "2024-01-06": scored_record("2024-01-06", 2.5)}
    skipped = decay_check(synthetic, today, gap)
    assert not skipped.passed
    assert (skipped.metadata["days"].value) == "2024-01-06, 2024-01-09, 2024-01-10"
    assert decay_check(synthetic, today, {"2024-01-09": missed["2024-01-09"]}).passed
    # ...within a bounded look-back: 4 times decay_days.
    far = {"2024-01-09": missed["2024-01-09"], "2023-12-28": scored_record("2023-12-28", 2.5)}
    assert decay_check(synthetic, today, far).passed
    nearer = {"2024-01-09": missed["2024-01-09"], "2023-12-29": scored_record("2023-12-29", 2.5)}
    assert not decay_check(synthetic, today, nearer).passed
    # A day without a champion breaks the streak.
    no_champion = {**scored_record("2024-01-08", 2.5), "status": NO_CHAMPION}
    assert decay_check(synthetic, today, {**missed, "2024-01-08": no_champion}).passed
    # A good day today passes whatever came before.
    assert decay_check(synthetic, scored_record("2024-01-10", rmse=0.5), missed).passed


def test_a_day_without_labels_or_champion_is_recorded_and_scores_nothing(synthetic):
    frame = pd.DataFrame({"x1": [0.1, 0.2], synthetic.label_name: [np.nan, np.nan]})

    def never(version: str):
        raise AssertionError(f"loaded {version} with nothing to score")

    unlabelled = champion_record(synthetic, "2024-01-05", "daily-2024-01-04", frame, never)
    assert unlabelled["status"] == NO_LABELLED_ROWS and unlabelled["labelled_rows"] == 0
    assert unlabelled["champion_version"] == "daily-2024-01-04"
    first = champion_record(synthetic, "2024-01-01", None, frame, never)
    assert first["status"] == NO_CHAMPION and first["meets_thresholds"] is None
    result = decay_check(synthetic, unlabelled, {})
    assert result.passed and "no labelled rows" in (result.description or "")


def test_a_failed_decay_check_in_a_successful_run_is_a_warning_alert():
    outcome = RunOutcome(
        run_id="r1",
        root_run_id="r1",
        job_name="daily_pipeline_job",
        partition="2024-01-10",
        succeeded=True,
        step_failures=[],
        succeeded_steps=[CHAMPION_PERFORMANCE],
        failed_checks=[
            FailedCheck(
                CHAMPION_PERFORMANCE,
                DECAY_CHECK,
                "WARN",
                "The model is decaying: retrain or look at the data. Champion daily-2024-01-01 ...",
            )
        ],
        run_message="",
    )
    [alert] = evaluate_run(outcome, {}, Notifier(), now=0.0)
    assert (alert.severity, alert.rule, alert.partition) == (WARNING, "check_failed", "2024-01-10")
    assert alert.cause.startswith("The model is decaying")
    assert alert.runbook == f"docs/runbook.md#check-{DECAY_CHECK}"


def test_a_metric_the_days_rows_cannot_define_neither_meets_nor_misses(synthetic):
    def predictions(task: str, labels: list[float]) -> Predictions:
        n = len(labels)
        return Predictions(task, np.array(labels), np.zeros(n), np.linspace(0.1, 0.9, n))

    negative = "all 50 labelled rows are negative"
    assert undefined_metrics(predictions("classification", [0] * 50)) == {
        "roc_auc": negative,
        "recall": negative,
        "f1": negative,
    }
    assert set(undefined_metrics(predictions("classification", [1] * 50))) == {"roc_auc"}
    assert undefined_metrics(predictions("classification", [0, 1] * 25)) == {}
    assert set(undefined_metrics(predictions("regression", [2.5] * 40))) == {"r2"}
    assert set(undefined_metrics(predictions("regression", [2.5]))) == {"r2"}
    assert undefined_metrics(predictions("regression", [2.5, 3.0])) == {}

    # A day of one class: recall's 0 and ROC AUC's NaN are conventions, not the champion's.
    bounds = {"recall": 0.3, "roc_auc": 0.55}
    one_class = threshold_results(
        {"recall": 0.0, "roc_auc": math.nan}, bounds, undefined={"recall", "roc_auc"}
    )
    assert [t["met"] for t in one_class.values()] == [None, None]
    assert judged(one_class) is None
    # A metric defined and missed still misses, whatever else is undefined.
    missed = threshold_results({"recall": 0.1, "roc_auc": math.nan}, bounds)
    assert missed["recall"]["met"] is False and missed["roc_auc"]["met"] is None
    assert judged(missed) is False

    # Such a day is no decay and breaks a streak: two missed days before it, one after.
    values = {"mae": 0.1, "rmse": 0.2, "r2": math.nan}
    thresholds = threshold_results(values, {"r2": 0.8, "rmse": 1.0}, undefined={"r2"})
    unknown = {
        **scored_record("2024-01-10", rmse=0.2),
        "metrics": values,
        "thresholds": thresholds,
        "meets_thresholds": judged(thresholds),
        "note": "champion daily-2024-01-01 on 1 labelled rows of 2024-01-10: cannot be judged "
        "against the value thresholds: r2 is undefined (the label is the same on all 1 "
        "labelled row(s))",
    }
    missed_before = {d: scored_record(d, rmse=2.5) for d in ("2024-01-09", "2024-01-08")}
    today = decay_check(synthetic, unknown, missed_before)
    assert today.passed and today.description is not None
    assert today.description.startswith("Champion daily-2024-01-01 on 1 labelled rows")
    assert "Nothing to fix" in today.description
    after = decay_check(
        synthetic, scored_record("2024-01-11", rmse=2.5), {"2024-01-10": unknown, **missed_before}
    )
    assert after.passed and after.metadata["streak_days"].value == 1


def test_a_drift_episode_whose_importance_cannot_be_measured_is_told_as_leaned_on():
    episode = Episode(
        feature="dep_delay",
        since="2013-03-04",
        opened="2013-03-04",
        drift_days=1,
        largest=0.4,
        largest_day="2013-03-04",
        usual=0.1,
        effect_name="ks",
    )
    day = DayEpisodes(
        states={"dep_delay": FeatureState(episode=episode)}, opened=[episode], closed=[]
    )

    why = "roc_auc is undefined on the 12 labelled rows of 2013-03-04"
    [told] = with_importance(day, None, page_importance=0.1, unmeasured=why).opened
    assert told.leaned_on is True and told.importance is None
    assert told.leaning() == (
        f"how much the champion leans on it could not be measured ({why}): told as if it did"
    )
    # Without a champion to measure, nothing leans on it, as before.
    [alone] = with_importance(day, None, page_importance=0.1).opened
    assert alone.leaned_on is False and alone.leaning() == "no serving champion to lean on it"
