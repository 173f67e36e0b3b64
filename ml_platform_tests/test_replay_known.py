"""A replay's warm-up days and the live contract's partitions: days the live chain had otherwise.

Warm-up days judged without the history the live chain judged them against, warm-up days
before the live dataset's first day, and a live contract whose partitions changed after the
replay was made. The chains' records are reported to a real instance as the day assets record
them (metadata only, no data), and the comparison is materialised from the code location's own
graph.
"""

import datetime as dt
import logging

import dagster as dg
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.platform.datasets import asset_key
from ml_platform.replay.replays import ReplayError, create_replay, load_replays
from ml_platform_tests.test_replay_shapes import DAYS, START, compare, flights_replay, record_day


def record_validated(instance: dg.DagsterInstance, dataset: str, day: str, reason: str) -> None:
    """`dataset`'s validated_data records `day`: accepted without a reason, else rejected."""
    metadata = (
        {"verdict": "failed history gate", "accepted": False, "reason": reason}
        if reason
        else {"verdict": "accepted", "accepted": True, "reason": ""}
    )
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key(dataset, "validated_data"), partition=day, metadata=metadata
        )
    )


def test_warm_up_days_the_chains_judged_otherwise_are_named_by_the_comparison(tmp_path):
    replay = flights_replay(tmp_path)
    warm_up = replay.warm_up_days()
    assert warm_up[0] == "2013-02-01" and warm_up[-1] == "2013-02-28"
    instance = dg.DagsterInstance.ephemeral()
    for day in DAYS:
        record_day(instance, "flights", day, 0.70)
        record_day(instance, replay.dataset, day, 0.71)
    # The live chain rejected a warm-up day against its history; the replay, which computed
    # none of the days before its warm-up, accepted it (its gate passes on too few days).
    blizzard = "2013-02-09"
    for day in warm_up:
        reason = "row_count 452 outside 700 to 1100" if day == blizzard else ""
        record_validated(instance, "flights", day, reason)
        record_validated(instance, replay.dataset, day, "")
    found = compare(tmp_path, replay, instance)
    metadata, stored = found["metadata"], found["stored"]
    assert metadata["warm_up_differing_days"].value == 1
    [note] = [n for n in stored["notes"] if "warm-up" in n]
    assert note.startswith(
        f"Not like for like before the first day: 1 of the replay's {len(warm_up)} warm-up "
        "day(s) (the days before 2013-03-01 its days look back on) were judged otherwise than "
        "in the live chain: 2013-02-09 (live: rejected, validated_data: failed history gate: "
        "row_count 452 outside 700 to 1100; replay: accepted)"
    )
    assert note in str(metadata["summary"].value)
    assert stored["warm_up"]["differing"] == [blizzard]
    # The replayed days' verdict is the figures', as before.
    assert str(metadata["verdict"].value).startswith("the replay's serving champion did better")


def test_warm_up_days_judged_alike_add_no_note(tmp_path):
    replay = flights_replay(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    for day in DAYS:
        record_day(instance, "flights", day, 0.70)
        record_day(instance, replay.dataset, day, 0.70)
    for day in replay.warm_up_days():
        for dataset in ("flights", replay.dataset):
            record_validated(instance, dataset, day, "")
    found = compare(tmp_path, replay, instance)
    assert found["stored"]["notes"] == []
    assert found["metadata"]["warm_up_differing_days"].value == 0


def test_a_changed_start_date_whose_warm_up_reaches_before_the_live_one_is_refused(tmp_path):
    flights = load_contract("flights")
    changed = tmp_path / "flights_december.yaml"
    changed.write_text(
        bundled_contracts()["flights"]
        .read_text()
        .replace("start_date: 2013-01-01", "start_date: 2012-12-01")
    )
    replays = tmp_path / "replays"
    with pytest.raises(ReplayError) as refused:
        create_replay(replays, changed, flights, "december", dt.date(2013, 1, 10), 5)
    said = str(refused.value)
    # 28 reference days before 2013-01-10: from 2012-12-13, of which 19 the live chain lacks.
    assert (
        "19 of the replay's warm-up day(s), the days its first days look back on, are before "
        "the live dataset's first day 2013-01-01: the first 2012-12-13 and the last 2012-12-31"
    ) in said
    assert "start the replay on or after 2013-01-29" in said
    assert not replays.exists()
    # Started late enough, every warm-up day is a live day.
    later = create_replay(replays, changed, flights, "december", dt.date(2013, 1, 29), 5)
    assert later.warm_up_days()[0] == "2013-01-01"


def edited_live(tmp_path, **partitions) -> tuple:
    """The flights contract with `partitions` (or event_time's timezone) edited, loaded."""
    document = yaml.safe_load(bundled_contracts()["flights"].read_text())
    timezone = partitions.pop("timezone", None)
    if timezone:
        document["event_time"]["timezone"] = timezone
    document["partitions"].update(partitions)
    path = tmp_path / "contracts" / "flights.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return load_contract(path)


def test_a_replay_whose_days_the_live_contract_no_longer_has_is_not_served(tmp_path, caplog):
    replay = flights_replay(tmp_path)
    assert replay.day_keys[0] == START
    live = edited_live(tmp_path, start_date=dt.date(2013, 3, 5))
    with caplog.at_level(logging.ERROR, logger="ml_platform.replay.replays"):
        assert load_replays(replay.folder.parent, [live]) == []
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"replay 'week' of flights in {replay.folder} is not served")
    assert (
        "the live contract's partitions changed since the replay was made (start_date "
        "2013-01-01 -> 2013-03-05): 4 of the 10 day(s) are outside the partitions, the first "
        "2013-03-01 and the last 2013-03-04"
    ) in message
    assert "run `ml-platform replay remove week`" in message
    # Its end moved before the replayed days: said the same way.
    caplog.clear()
    live = edited_live(tmp_path, end_date=dt.date(2013, 2, 28))
    with caplog.at_level(logging.ERROR, logger="ml_platform.replay.replays"):
        assert load_replays(replay.folder.parent, [live]) == []
    [message] = [r.getMessage() for r in caplog.records]
    assert "(end_date 2013-12-31 -> 2013-02-28): 10 of the 10 day(s)" in message


def test_a_replay_made_before_the_live_partitions_were_recorded_is_still_checked(tmp_path, caplog):
    replay = flights_replay(tmp_path)
    plan = yaml.safe_load((replay.folder / "replay.yaml").read_text())
    plan.pop("live_partitions", None)
    (replay.folder / "replay.yaml").write_text(yaml.safe_dump(plan))
    assert [r.name for r in load_replays(replay.folder.parent, [load_contract("flights")])] == [
        "week"
    ]
    live = edited_live(tmp_path, end_date=dt.date(2013, 3, 5))
    with caplog.at_level(logging.ERROR, logger="ml_platform.replay.replays"):
        assert load_replays(replay.folder.parent, [live]) == []
    [message] = [r.getMessage() for r in caplog.records]
    assert (
        "its days are no longer all days of the live contract: 5 of the 10 day(s) are outside "
        "the partitions, the first 2013-03-06 and the last 2013-03-10"
    ) in message


def test_a_live_timezone_changed_since_the_replay_is_said_by_the_comparison(tmp_path, caplog):
    made = flights_replay(tmp_path)
    live = edited_live(tmp_path, timezone="UTC")
    with caplog.at_level(logging.WARNING, logger="ml_platform.replay.replays"):
        [replay] = load_replays(made.folder.parent, [live])
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith(
        f"replay 'week' of flights in {made.folder}: the live contract's partitions changed "
        "since the replay was made (timezone America/New_York -> UTC)"
    )
    instance = dg.DagsterInstance.ephemeral()
    for day in DAYS:
        record_day(instance, "flights", day, 0.70)
        record_day(instance, replay.dataset, day, 0.71)
    found = compare(tmp_path, replay, instance)
    [note] = found["stored"]["notes"]
    assert note.startswith(
        "The live contract's partitions changed since the replay was made (timezone "
        "America/New_York -> UTC)"
    )
    # Its days are still live days: the verdict stands, the note beside it.
    assert str(found["metadata"]["verdict"].value).startswith(
        "the replay's serving champion did better"
    )


def test_a_weekly_retrains_window_is_warmed_up_never_before_the_live_first_day(tmp_path):
    flights = load_contract("flights")
    changed = tmp_path / "flights_december.yaml"
    changed.write_text(
        bundled_contracts()["flights"]
        .read_text()
        .replace("start_date: 2013-01-01", "start_date: 2012-12-01")
    )
    replay = create_replay(tmp_path / "replays", changed, flights, "dec", dt.date(2013, 2, 4), 5)
    # The live chain's Sunday retrain trained on its days from 2013-01-01: the replay's too,
    # not on December days the live dataset never had.
    assert replay.contract.training.full_window_days > 40
    assert replay.warm_up_days(["2013-02-03"])[0] == "2013-01-01"
    assert replay.backfill_ranges(["2013-02-03"])["raw_data"] == [("2013-01-01", "2013-02-08")]
