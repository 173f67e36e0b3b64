"""Drift episodes: a lasting move told once, a day's weather not at all."""

import dataclasses
import datetime as dt
import functools

import pytest

from ml_platform.automation.alerts import RESOLVED, WARNING, Notifier, evaluate_run
from ml_platform.contracts import load_contract
from ml_platform.contracts.model import DriftEpisodeSpec
from ml_platform.contracts.reference import reference_days
from ml_platform.contracts.schema import type_rows
from ml_platform.drift.detect import calibrate, detect_drift
from ml_platform.drift.episodes import (
    FeatureDay,
    advance,
    feature_days,
    replay,
    states_from_json,
)
from ml_platform.drift.report import DriftReport
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.synthetic import POPULATION_SD, generate_day
from ml_platform.platform.run_events import EpisodeNews, FailedCheck, RunOutcome

SPEC = DriftEpisodeSpec()
START = dt.date(2024, 1, 1)
# The synthetic contract compares each day with a fixed baseline: its first 28 days.
JUDGED_FROM = START + dt.timedelta(days=28)
SHIFT_FROM = JUDGED_FROM + dt.timedelta(days=20)


def days(flags: str, start: dt.date = JUDGED_FROM) -> list[tuple[str, dict[str, FeatureDay]]]:
    """A series of one feature's verdicts: 'D' drifted, '.' quiet, ' ' not judged."""
    series = []
    for i, flag in enumerate(flags):
        day = (start + dt.timedelta(days=i)).isoformat()
        verdicts = {} if flag == " " else {"f": FeatureDay(drifted=flag == "D", effect=0.1)}
        series.append((day, verdicts))
    return series


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("..D...D...D..", []),  # scattered weather
        ("...D..", []),  # a one-day excursion
        ("..DD..DD..", []),  # two days twice, apart
        ("..DDD..", [(4, 6)]),  # opens on the third drifted day, closes on the second quiet
        ("..DD.D...", [(5, 7)]),  # 3 of the last 4
        ("..DDDDDDDDDD....", [(4, 13)]),  # ten days: one episode, closed once
        ("..DDD.D.D.D..DDD..", [(4, 12), (15, 17)]),  # one quiet day a time keeps it open
        ("..DD  D..", [(6, 8)]),  # days not judged neither count nor close
    ],
)
def test_an_episode_opens_when_drift_lasts_and_closes_once(flags, expected):
    episodes = replay(days(flags), SPEC)
    found = [
        (
            (dt.date.fromisoformat(e.opened) - JUDGED_FROM).days,
            (dt.date.fromisoformat(e.closed) - JUDGED_FROM).days if e.closed else None,
        )
        for e in episodes
    ]
    assert found == expected


def test_a_day_that_drifts_where_the_reference_never_was_opens_at_once():
    series = days("..D..")
    day, _ = series[2]
    series[2] = (day, {"f": FeatureDay(drifted=True, effect=0.9, unseen=True)})
    [episode] = replay(series, SPEC)
    assert (episode.since, episode.opened, episode.closed) == (day, day, series[4][0])
    # Unseen values that do not drift (a rare category in a few rows) open nothing.
    series[2] = (day, {"f": FeatureDay(drifted=False, effect=0.01, unseen=True)})
    assert replay(series, SPEC) == []


def test_an_episode_of_a_feature_the_contract_stops_testing_ends_saying_so():
    series = days("DDD")
    before: dict = {}
    for day, verdicts in series:
        before = advance(day, verdicts, before, SPEC, monitored={"f", "g"}).states
    assert before["f"].episode is not None
    # The team excludes the feature from drift (or drops it): only g is judged from now on.
    next_day = (JUDGED_FROM + dt.timedelta(days=3)).isoformat()
    quiet_g = {"g": FeatureDay(drifted=False, effect=0.01)}

    after = advance(next_day, quiet_g, before, SPEC, monitored={"g"})

    assert after.open == [] and "f" not in after.states
    [ended] = after.closed
    assert (ended.feature, ended.closed) == ("f", next_day)
    assert ended.describe().endswith(
        f"ended {next_day}: the contract no longer tests the feature for drift"
    )
    # Told as such, not as a feature that settled back.
    news = EpisodeNews(
        "synthetic/champion_performance", "drift_episode", next_day, [], [ended.to_json()]
    )
    [alert] = evaluate_run(outcome_with(news), {}, Notifier(), now=0.0)
    assert alert.title == (
        f"synthetic: f no longer tested for drift (drifting since {JUDGED_FROM.isoformat()})"
    )
    # A day that merely could not judge a monitored feature keeps its episode, as before.
    kept = advance(next_day, quiet_g, before, SPEC, monitored={"f", "g"})
    assert [e.feature for e in kept.open] == ["f"] and kept.closed == []


def test_the_state_a_day_stores_gives_the_next_day_the_same_verdict():
    series = days("..DDDDD...")
    states: dict = {}
    told = []
    for day, verdicts in series:
        # Each day starts from the state the day before stored, read back from JSON.
        result = advance(day, verdicts, states_from_json(_json(states)), SPEC)
        states = result.states
        told += [("opened", e.opened) for e in result.opened]
        told += [("closed", e.closed) for e in result.closed]
    assert told == [("opened", series[4][0]), ("closed", series[8][0])]


def _json(states):
    import json

    return json.loads(json.dumps({f: s.to_json() for f, s in states.items()}))


def test_open_days_cannot_exceed_the_window():
    with pytest.raises(ValueError, match="open_days"):
        DriftEpisodeSpec(window=2, open_days=3)


# The synthetic days: `temperature` moves every day like the weather (its day's mean is drawn
# anew around a climate); its verdicts come from the drift check's own detection.
SYNTHETIC = load_contract("synthetic")


@functools.cache
def feature_frame(day: dt.date, shift_sd: float = 0.0):
    frame = generate_day(day, seed=11, rows=SYNTHETIC.source.rows_per_day)
    frame["temperature"] += shift_sd * POPULATION_SD["temperature"]
    return build_features(type_rows(frame, SYNTHETIC, where=str(day)), SYNTHETIC)


@functools.cache
def baseline_calibration():
    return calibrate([feature_frame(d) for d in _baseline()], SYNTHETIC)


def _baseline() -> list[dt.date]:
    return reference_days(SYNTHETIC.drift.reference, JUDGED_FROM, SYNTHETIC.partitions.start_date)


@functools.cache
def judged(day: dt.date, shift_sd: float = 0.0) -> dict[str, FeatureDay]:
    """The day's verdicts as the stored drift report has them."""
    reference = [feature_frame(d) for d in _baseline()]
    verdicts = detect_drift(
        reference, feature_frame(day, shift_sd), SYNTHETIC, baseline_calibration()
    )
    report = DriftReport(
        dataset="synthetic",
        partition=day.isoformat(),
        reference="baseline",
        reference_days=[d.isoformat() for d in _baseline()],
        missing_reference_days=[],
        reference_rows=0,
        current_rows=0,
        correction="holm",
        alpha=0.02,
        verdicts=verdicts,
    )
    return feature_days(report.to_json())


def synthetic_series(shifted: dict[int, float]) -> list[tuple[str, dict[str, FeatureDay]]]:
    """60 judged days, the days at `shifted` offsets from SHIFT_FROM moved by that many sd."""
    series = []
    for i in range(60):
        day = JUDGED_FROM + dt.timedelta(days=i)
        shift = shifted.get((day - SHIFT_FROM).days, 0.0)
        series.append((day.isoformat(), {"temperature": judged(day, shift)["temperature"]}))
    return series


def test_a_weather_like_feature_opens_no_episode_over_60_days():
    series = synthetic_series({})
    # It does drift on some days (the check's own verdict), and none of them lasts.
    assert any(verdicts["temperature"].drifted for _, verdicts in series)
    assert replay(series, SPEC) == []


def test_a_ten_day_shift_opens_one_episode_within_three_days_and_closes_it_once():
    series = synthetic_series({i: 4.0 for i in range(10)})
    [episode] = replay(series, SPEC)
    opened = dt.date.fromisoformat(episode.opened)
    assert SHIFT_FROM <= opened <= SHIFT_FROM + dt.timedelta(days=2)
    assert episode.since == SHIFT_FROM.isoformat()
    # Back on the second quiet day after the shift.
    assert episode.closed == (SHIFT_FROM + dt.timedelta(days=11)).isoformat()
    assert episode.usual is not None and episode.largest > episode.usual
    assert f"temperature since {SHIFT_FROM}" in episode.describe()


def test_a_one_day_excursion_opens_none():
    series = synthetic_series({0: 2.5})
    excursion = dict(series)[SHIFT_FROM.isoformat()]["temperature"]
    assert excursion.drifted and not excursion.unseen
    assert replay(series, SPEC) == []


def test_a_level_that_leaves_the_reference_opens_on_its_first_day():
    series = synthetic_series({i: 4.0 for i in range(10)})
    first = dict(series)[SHIFT_FROM.isoformat()]["temperature"]
    assert first.drifted and first.unseen
    assert replay(series, SPEC)[0].opened == SHIFT_FROM.isoformat()


def test_a_unit_changed_leaves_the_reference_and_a_few_stray_values_do_not():
    reference = [feature_frame(d) for d in _baseline()]
    day = feature_frame(SHIFT_FROM)
    fahrenheit = day.assign(temperature=day["temperature"] * 1.8 + 32)
    [verdict] = [
        v
        for v in detect_drift(reference, fahrenheit, SYNTHETIC, baseline_calibration())
        if v.feature == "temperature"
    ]
    assert verdict.status == "drift" and verdict.unseen, verdict
    # Nine values far beyond the range are too few to say where the day lies.
    stray = day.head(9).assign(temperature=day["temperature"].max() * 100)
    [verdict] = [
        v
        for v in detect_drift(reference, stray, SYNTHETIC, baseline_calibration())
        if v.feature == "temperature"
    ]
    assert not verdict.unseen, verdict


def outcome_with(news: EpisodeNews) -> RunOutcome:
    return RunOutcome(
        run_id="r1",
        root_run_id="r1",
        job_name="synthetic_daily_pipeline_job",
        partition=news.partition,
        succeeded=True,
        step_failures=[],
        succeeded_steps=["synthetic__champion_performance"],
        failed_checks=[],
        run_message="",
        episodes=[news],
    )


def test_an_episode_is_told_once_when_it_opens_and_once_when_it_closes():
    series = synthetic_series({i: 4.0 for i in range(10)})
    [episode] = replay(series, SPEC)
    leaned = dataclasses.replace(episode, closed=None, leaned_on=True, importance=0.4)
    asset = "synthetic/champion_performance"
    notifier = Notifier(owners={"synthetic": ["team:data"]})

    opened = EpisodeNews(asset, "drift_episode", episode.opened, [leaned.to_json()], [])
    [alert] = evaluate_run(outcome_with(opened), {}, notifier, now=0.0)
    assert (alert.severity, alert.rule, alert.page) == (WARNING, "drift_episode", True)
    assert alert.title == f"synthetic: temperature drifting since {SHIFT_FROM}"
    assert alert.owners == ("team:data",)
    assert alert.runbook == "docs/runbook.md#check-drift_episode"

    closed = dataclasses.replace(leaned, closed=episode.closed)
    ended = EpisodeNews(asset, "drift_episode", episode.closed, [], [closed.to_json()])
    [alert] = evaluate_run(outcome_with(ended), {}, notifier, now=0.0)
    assert (alert.severity, alert.rule, alert.page) == (RESOLVED, "drift_episode_closed", True)
    assert f"back since {episode.closed}" in alert.title

    # Features that open on the same day are told together; any one leaned on pages.
    other = dataclasses.replace(leaned, feature="x1", since=episode.opened, leaned_on=False)
    both = EpisodeNews(
        asset, "drift_episode", episode.opened, [leaned.to_json(), other.to_json()], []
    )
    [alert] = evaluate_run(outcome_with(both), {}, notifier, now=0.0)
    assert alert.title == f"synthetic: temperature, x1 drifting since {SHIFT_FROM}" and alert.page
    assert alert.cause.count("; the champion ") == 2
    unused = dataclasses.replace(leaned, leaned_on=False, importance=0.01)
    quiet = EpisodeNews(asset, "drift_episode", episode.opened, [unused.to_json()], [])
    [alert] = evaluate_run(outcome_with(quiet), {}, notifier, now=0.0)
    assert not alert.page and "the champion barely uses it (1% of" in alert.cause

    # A backfill replays the past: its episodes are in the checks, not told.
    assert evaluate_run(outcome_with(opened), {}, notifier, now=0.0, in_backfill=True) == []


def test_paging_drift_episode_pages_the_opening_not_each_day_the_episode_stays_open():
    series = synthetic_series({i: 4.0 for i in range(10)})
    [episode] = replay(series, SPEC)
    unused = dataclasses.replace(episode, closed=None, leaned_on=False, importance=0.01)
    asset = "synthetic/champion_performance"
    # A team that wants every episode paged, whatever the champion leans on.
    notifier = Notifier(paging={"synthetic": {"drift_episode": True}})
    opened = EpisodeNews(asset, "drift_episode", episode.opened, [unused.to_json()], [])
    still_open = RunOutcome(
        run_id="r2",
        root_run_id="r2",
        job_name="synthetic_daily_pipeline_job",
        partition="2024-01-09",
        succeeded=True,
        step_failures=[],
        succeeded_steps=["synthetic__champion_performance"],
        failed_checks=[FailedCheck(asset, "drift_episode", "WARN", "temperature open since")],
        run_message="",
    )

    told = [
        notifier.routed(alert)
        for outcome in (outcome_with(opened), still_open)
        for alert in evaluate_run(outcome, {}, notifier, now=0.0)
    ]

    assert [(a.rule, a.page) for a in told] == [("drift_episode", True), ("check_failed", False)]
