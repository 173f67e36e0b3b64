"""champion_performance's known problems: a past day rerun alone, and days of too few labels."""

import datetime as dt
import json

import pandas as pd
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.drift.episodes import advance, feature_days, states_from_json
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.landing import LandingZone, source_day
from ml_platform.ingestion.synthetic import POPULATION_SD, file_bytes, generate_day
from ml_platform.platform.storage import write_atomically
from ml_platform.registry.monitoring import (
    CHAMPION_PERFORMANCE,
    DECAY_CHECK,
    EPISODE_CHECK,
    EPISODE_LOOKBACK,
    SCORED,
    TOO_FEW_LABELLED_ROWS,
    carried_days,
    champion_record,
    decay_check,
    threshold_results,
)
from ml_platform.training.model import labelled, train_model
from ml_platform_tests.conftest import Platform, contract_with, days_from
from ml_platform_tests.test_backfill_range import latest_evaluations, materialize_range

DAYS = days_from("2024-01-01", 6)
WARM = DAYS[2:]


def land(platform: Platform, days: list[str], warm: bool) -> None:
    """Land synthetic days; warm ones are 4 sd warmer, a drift episode of `temperature`."""
    zone = LandingZone(base_dir=str(platform.landing_dir))
    for day in days:
        frame = source_day(platform.contract, dt.date.fromisoformat(day))
        if warm:
            frame["temperature"] += 4.0 * POPULATION_SD["temperature"]
        write_atomically(zone.path_for(platform.contract.landing.file_name(day)), file_bytes(frame))


def record(platform: Platform, day: str) -> dict:
    return json.loads(platform.stored(CHAMPION_PERFORMANCE, day, "json").read_text())


def carried_from_day_before(platform: Platform, day: str, before: str) -> bool:
    """Whether `day`'s stored episode states advance what `before`'s record stored."""
    report = json.loads(platform.stored("drift_report", day, "json").read_text())
    spec = platform.contract.drift.episodes
    states = states_from_json(record(platform, before)["drift_episodes"])
    expected = advance(day, feature_days(report), states, spec).states
    stored = states_from_json(record(platform, day)["drift_episodes"])
    return {f: s.recent for f, s in expected.items()} == {f: s.recent for f, s in stored.items()}


@pytest.mark.slow
def test_a_past_day_rerun_alone_names_the_later_days_whose_episode_states_it_makes_stale(
    tmp_path,
):
    platform = Platform(contract_with(tmp_path, "synthetic", window_days=7), tmp_path / "p")
    land(platform, DAYS[:2], warm=False)
    land(platform, WARM, warm=True)
    assert materialize_range(platform, DAYS[0], DAYS[-1]).success
    assert record(platform, WARM[0])["drift_episodes"]["temperature"]["episode"] is not None

    # The first warm day was a sensor's fault: its corrected file is re-landed and the day
    # rerun alone, as the landing sensor does.
    land(platform, WARM[:1], warm=False)
    rerun = platform.materialize(WARM[0])
    assert rerun.success
    assert record(platform, WARM[0])["drift_episodes"]["temperature"]["episode"] is None
    # The later days still hold what they carried from the earlier version of the day.
    assert not carried_from_day_before(platform, WARM[1], WARM[0])

    later = WARM[1:]
    assert record(platform, WARM[0])["stale_later_days"] == {EPISODE_CHECK: later, DECAY_CHECK: []}
    [materialization] = rerun.asset_materializations_for_node(platform.node(CHAMPION_PERFORMANCE))
    assert materialization.metadata["stale_later_days"].value == ", ".join(later)
    [episode] = [e for e in rerun.get_asset_check_evaluations() if e.check_name == EPISODE_CHECK]
    description = episode.description or ""
    span = f"{later[0]}...{later[-1]}"
    assert f"{later[0]} to {later[-1]}" in description
    assert f"--partition-range {span}" in description
    assert platform.key(CHAMPION_PERFORMANCE).to_user_string() in description

    # Rerunning the days named, as one range, carries the new state through: the chain agrees
    # with itself again, and the range's last day, the latest, names nothing stale.
    again = materialize_range(platform, later[0], later[-1], selection=[CHAMPION_PERFORMANCE])
    assert again.success
    for before, day in zip(WARM, later, strict=False):
        assert carried_from_day_before(platform, day, before), day
    assert record(platform, later[-1])["stale_later_days"] == {EPISODE_CHECK: [], DECAY_CHECK: []}
    # A rerun that changes nothing the later days read names nothing either.
    assert platform.materialize(later[0], selection=[CHAMPION_PERFORMANCE]).success
    assert record(platform, later[0])["stale_later_days"] == {EPISODE_CHECK: [], DECAY_CHECK: []}


def test_the_later_days_a_rerun_day_makes_stale_end_where_the_states_started_afresh():
    later = ["2024-01-04", "2024-01-31", "2024-03-01", "2024-03-02"]
    # 2024-01-31 read 2024-01-04's state (27 days before it); 2024-03-01, 30 days after any
    # stored day, started afresh, and 2024-03-02 carried that.
    assert carried_days("2024-01-03", later, EPISODE_LOOKBACK) == later[:2]
    assert carried_days("2024-01-03", [], EPISODE_LOOKBACK) == []


def land_turned(platform: Platform, days: list[str]) -> None:
    """Land days on which the label's relation to x1 turned around: the champion misses."""
    zone = LandingZone(base_dir=str(platform.landing_dir))
    for day in days:
        frame = source_day(platform.contract, dt.date.fromisoformat(day))
        frame["target"] = (frame["target"] - 4.0 * frame["x1"]).round(6)
        write_atomically(zone.path_for(platform.contract.landing.file_name(day)), file_bytes(frame))


@pytest.mark.slow
def test_a_past_day_rerun_alone_names_the_later_days_whose_decay_streaks_it_makes_stale(
    tmp_path,
):
    platform = Platform(contract_with(tmp_path, "synthetic", window_days=7), tmp_path / "p")
    land(platform, DAYS[:2], warm=False)
    turned = DAYS[2:5]
    land_turned(platform, turned)
    assert materialize_range(platform, DAYS[0], turned[-1]).success
    assert [record(platform, day)["meets_thresholds"] for day in turned] == [False] * 3
    decay = latest_evaluations(platform, CHAMPION_PERFORMANCE, DECAY_CHECK)
    assert not decay[turned[-1]].passed

    # The first of the bad days was a broken file: corrected, re-landed and rerun alone.
    land(platform, turned[:1], warm=False)
    assert platform.materialize(turned[0]).success
    assert record(platform, turned[0])["meets_thresholds"] is True
    # The last day's check still says three bad days in a row, the first of them now good.
    assert not latest_evaluations(platform, CHAMPION_PERFORMANCE, DECAY_CHECK)[turned[-1]].passed

    later = turned[1:]
    # Its drift verdicts are the same (only the label changed): no episode state is stale.
    assert record(platform, turned[0])["stale_later_days"] == {
        EPISODE_CHECK: [],
        DECAY_CHECK: later,
    }
    rerun = latest_evaluations(platform, CHAMPION_PERFORMANCE, DECAY_CHECK)[turned[0]]
    assert f"--partition-range {later[0]}...{later[-1]}" in (rerun.description or "")
    assert "the decay streaks they counted" in (rerun.description or "")

    again = materialize_range(platform, later[0], later[-1], selection=[CHAMPION_PERFORMANCE])
    assert again.success
    decay = latest_evaluations(platform, CHAMPION_PERFORMANCE, DECAY_CHECK)
    assert decay[later[-1]].passed and decay[later[-1]].metadata["streak_days"].value == 2


SYNTHETIC = load_contract("synthetic")


@pytest.fixture(scope="module")
def champion():
    """A real champion: the synthetic contract's model trained on two days."""
    window = {}
    for day in days_from("2024-01-01", 2):
        frame = generate_day(dt.date.fromisoformat(day), seed=7, rows=200)
        window[day] = build_features(type_rows(frame, SYNTHETIC, where=day), SYNTHETIC)
    return train_model(window, SYNTHETIC)


def day_rows(day: str, labelled_rows: int, shift: float = 0.0) -> pd.DataFrame:
    """A synthetic day's features with only `labelled_rows` labels, moved by `shift`."""
    frame = generate_day(dt.date.fromisoformat(day), seed=11, rows=200)
    features = build_features(type_rows(frame, SYNTHETIC, where=day), SYNTHETIC)
    label = SYNTHETIC.label_name
    features[label] = features[label] + shift
    features.loc[features.index[labelled_rows:], label] = float("nan")
    return features


def missed(day: str) -> dict:
    values = {"mae": 2.0, "rmse": 2.5, "r2": 0.1}
    thresholds = threshold_results(values, SYNTHETIC.evaluation.value_thresholds)
    return {
        "partition": day,
        "status": SCORED,
        "champion_version": "daily-2024-01-02",
        "labelled_rows": 1000,
        "metrics": values,
        "intervals": {},
        "thresholds": thresholds,
        "meets_thresholds": False,
        "note": "",
    }


def test_a_day_of_fewer_labelled_rows_than_min_holdout_rows_is_too_few_to_judge(champion):
    assert SYNTHETIC.evaluation.min_holdout_rows == 30
    assert SYNTHETIC.evaluation.decay_days == 3

    def load(version: str):
        return champion

    # Two labelled rows on which the champion is far off, after two days it missed.
    few = champion_record(
        SYNTHETIC, "2024-01-10", "daily-2024-01-02", day_rows("2024-01-10", 2, 50), load
    )
    assert few["status"] == TOO_FEW_LABELLED_ROWS and few["labelled_rows"] == 2
    assert few["meets_thresholds"] is None and few["metrics"] == {}
    assert "2 labelled rows" in few["note"] and "evaluation.min_holdout_rows" in few["note"]
    before: dict[str, dict | None] = {d: missed(d) for d in ("2024-01-09", "2024-01-08")}
    today = decay_check(SYNTHETIC, few, before)
    assert today.passed, today.description
    assert "too few" in (today.description or "")
    assert "neither counts toward nor breaks" in (today.description or "")
    # Nor does it break the streak: the next missed day is the third of it.
    after = decay_check(SYNTHETIC, missed("2024-01-11"), {"2024-01-10": few, **before})
    assert not after.passed
    assert after.metadata["days"].value == "2024-01-08, 2024-01-09, 2024-01-11"

    # A day with enough rows is judged as before, whichever way it goes.
    enough = champion_record(
        SYNTHETIC, "2024-01-10", "daily-2024-01-02", day_rows("2024-01-10", 30, 50), load
    )
    assert enough["status"] == SCORED and enough["meets_thresholds"] is False
    good = champion_record(
        SYNTHETIC, "2024-01-10", "daily-2024-01-02", day_rows("2024-01-10", 30), load
    )
    assert good["status"] == SCORED and good["meets_thresholds"] is True
    assert len(labelled(day_rows("2024-01-10", 30), SYNTHETIC)) == 30


def labels_arrive_later(tmp_path) -> Platform:
    """The synthetic dataset with a label that may be missing (known only days later)."""
    contract_with(tmp_path, "synthetic", window_days=7)
    path = tmp_path / "synthetic.yaml"
    document = yaml.safe_load(path.read_text())
    for column in document["columns"]:
        if column["name"] == "target":
            column["nullable"] = True
    path.write_text(yaml.safe_dump(document))
    return Platform(load_contract(path), tmp_path / "p")


@pytest.mark.slow
@pytest.mark.parametrize("labelled_rows", [0, 1])
def test_an_episode_opened_on_a_day_of_too_few_labels_is_told_as_leaned_on(tmp_path, labelled_rows):
    platform = labels_arrive_later(tmp_path)
    days = DAYS[:3]
    land(platform, days[:2], warm=False)
    # x1 drives the target (its coefficient is 2): a level the reference never had opens an
    # episode at once, on a day whose labels are mostly not in yet.
    zone = LandingZone(base_dir=str(platform.landing_dir))
    frame = source_day(platform.contract, dt.date.fromisoformat(days[2]))
    frame["x1"] += 10.0 * POPULATION_SD["x1"]
    frame.loc[frame.index[labelled_rows:], "target"] = float("nan")
    write_atomically(zone.path_for(platform.contract.landing.file_name(days[2])), file_bytes(frame))
    assert materialize_range(platform, days[0], days[-1]).success

    monitored = record(platform, days[2])
    assert monitored["champion_version"] is not None
    assert monitored["labelled_rows"] == labelled_rows
    episode = monitored["drift_episodes"]["x1"]["episode"]
    assert episode["opened"] == days[2]
    # Nothing measured how much the champion leans on x1: told as if it did, not as a feature
    # it barely uses (one row shuffled changes nothing) nor as if no champion served the day.
    assert episode["importance"] is None and episode["leaned_on"] is True
    assert "evaluation.min_holdout_rows" in episode["unmeasured"]
    check = latest_evaluations(platform, CHAMPION_PERFORMANCE, EPISODE_CHECK)[days[2]]
    assert "could not be measured" in (check.description or "")
