"""A replay on the shapes it was not first made for: days a chain never recorded, a day kept
after a rejected re-delivery, a rejection told over several lines, weekly full retrains, a
removal while the replay runs, a replay of a dataset the settings do not serve.

Most chains' records are reported to a real instance as the day assets record them (metadata
only, no data), and the comparison is materialised from the code location's own graph; the
weekly retrain and the re-delivery run synthetic days through that graph (`slow`).
"""

import datetime as dt
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.definitions import build_definitions
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.records import day_records
from ml_platform.platform.rejected import DAY_ASSETS
from ml_platform.platform.tracking import MLFLOW_PREFIX
from ml_platform.registry.assets import PROMOTE
from ml_platform.replay.assets import REPLAY_COMPARISON
from ml_platform.replay.lifecycle import remove_replay, running
from ml_platform.replay.replays import (
    FULL_RETRAIN_ASSETS,
    WARM_UP_ASSETS,
    Replay,
    ReplayError,
    create_replay,
    find_replay,
)
from ml_platform_tests.conftest import Platform, contract_with, days_from, empty_mlflow_store

START = "2013-03-01"
DAYS = days_from(START, 10)


def flights_replay(tmp_path: Path, name: str = "week") -> Replay:
    """A replay of flights with a 7-day window over `DAYS`."""
    changed = tmp_path / f"flights_{name}.yaml"
    changed.write_text(
        bundled_contracts()["flights"]
        .read_text()
        .replace("  window_days: 28\n", "  window_days: 7\n")
    )
    return create_replay(
        tmp_path / "replays",
        changed,
        load_contract("flights"),
        name,
        dt.date.fromisoformat(START),
        len(DAYS),
    )


def record_day(
    instance: dg.DagsterInstance, dataset: str, day: str, score: float, **registered: Any
) -> None:
    """Every day asset of `dataset` records `day` accepted, its champion scored `score`."""
    metadata: dict[str, dict[str, Any]] = {
        "registered_model": {"decision": PROMOTE, "champion": f"daily-{day}", **registered},
        "champion_performance": {"champion_roc_auc": score},
    }
    for name in DAY_ASSETS:
        event = dg.AssetMaterialization(
            asset_key(dataset, name), partition=day, metadata=metadata.get(name, {})
        )
        instance.report_runless_asset_event(event)


def compare(
    tmp_path: Path, replay: Replay, instance: dg.DagsterInstance, live: Contract | None = None
) -> dict[str, Any]:
    """The comparison's metadata and stored JSON, materialised over the recorded days.

    `live`: the live contract served beside the replay (the bundled flights by default).
    """
    defs = build_definitions(
        live or load_contract("flights"),
        landing_dir=str(tmp_path / "landing"),
        lake_dir=str(tmp_path / "lake"),
        replays=[replay],
    )
    result = dg.materialize(
        [*(defs.assets or [])],
        resources=defs.resources,
        instance=instance,
        selection=[asset_key(replay.dataset, REPLAY_COMPARISON)],
    )
    [event] = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    stored = json.loads(Path(str(metadata["path"].value)).read_text())
    return {"metadata": metadata, "stored": stored}


def test_days_a_chain_never_recorded_are_told_not_shown_as_quiet_days(tmp_path):
    replay = flights_replay(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    # The live chain ran only from the fourth day; its fifth day's run failed after the model.
    for day in DAYS[3:]:
        if day == DAYS[4]:
            for name in ("raw_data", "validated_data", "features", "drift_report", "model"):
                instance.report_runless_asset_event(
                    dg.AssetMaterialization(asset_key("flights", name), partition=day)
                )
        else:
            record_day(instance, "flights", day, 0.70)
    for day in DAYS:
        record_day(instance, replay.dataset, day, 0.71)
    found = compare(tmp_path, replay, instance)
    metadata, stored = found["metadata"], found["stored"]
    assert stored["summary"]["live"]["unrecorded"] == [*DAYS[:3], DAYS[4]]
    assert stored["summary"]["replay"]["unrecorded"] == []
    assert metadata["live_unrecorded_days"].value == 4
    [note] = stored["notes"]
    assert note.startswith("The live chain has no whole record of 4 of the 10 day(s)")
    summary = str(metadata["summary"].value)
    assert note in summary
    assert "| days not wholly recorded | 4 | 0 |" in summary
    lines = str(metadata["comparison"].value).splitlines()
    day_line = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| 20")}
    # A day never run is said to be so, not shown as a day without decision or score.
    assert day_line[DAYS[0]].startswith(f"| {DAYS[0]} | not recorded | | ")
    assert (
        "(no record of evaluation_report, registered_model, champion_performance)"
        in (day_line[DAYS[4]])
    )


def test_weekly_retrains_only_one_chain_judged_make_the_comparison_say_not_like_for_like(
    tmp_path,
):
    replay = flights_replay(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    for day in DAYS:
        # The live chain's Monday took the Sunday's weekly full retrain, and promoted it.
        weekly = (
            {"weekly_candidate": "full-2013-03-03", "weekly_outcome": "promoted"}
            if day == "2013-03-04"
            else {}
        )
        record_day(instance, "flights", day, 0.70, **weekly)
        record_day(instance, replay.dataset, day, 0.71)
    found = compare(tmp_path, replay, instance)
    metadata, stored = found["metadata"], found["stored"]
    assert metadata["live_weekly_retrains"].value == 1
    assert metadata["replay_weekly_retrains"].value == 0
    [note] = stored["notes"]
    assert note.startswith(
        "Not like for like: the live chain judged a weekly full retrain on 1 day(s) (2013-03-04), "
        "the replay on 0 (none)"
    )
    assert note in str(metadata["summary"].value)
    assert "weekly full-2013-03-03: promoted" in str(metadata["comparison"].value)
    # Ten paired days, the replay a hundredth better each: the verdict stands, the note beside.
    assert str(metadata["verdict"].value).startswith("the replay's serving champion did better")


def test_chains_alike_have_no_notes(tmp_path):
    replay = flights_replay(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    for day in DAYS:
        record_day(instance, "flights", day, 0.70)
        record_day(instance, replay.dataset, day, 0.70)
    found = compare(tmp_path, replay, instance)
    assert found["stored"]["notes"] == []
    assert str(found["metadata"]["notes"].value) == "none"
    assert "no clear difference" in str(found["metadata"]["verdict"].value)


def run_days(
    platform: Platform, defs: dg.Definitions, dataset: str, names: Sequence[str], days: tuple
) -> None:
    """One run of the range `days` (first, last) of the dataset's assets `names`."""
    result = dg.materialize(
        [*(defs.assets or []), *(defs.asset_checks or [])],
        resources=defs.resources,
        instance=platform.instance,
        selection=[asset_key(dataset, name) for name in names],
        tags={
            "dagster/asset_partition_range_start": days[0],
            "dagster/asset_partition_range_end": days[1],
        },
        raise_on_error=False,
    )
    assert result.success, (dataset, names, days)


def run_backfill(
    platform: Platform, defs: dg.Definitions, dataset: str, ranges: dict[str, list[tuple]]
) -> None:
    """The runs of a backfill of `ranges`: each asset's days after those of the assets it reads."""
    done: set[str] = set()
    for group in (WARM_UP_ASSETS, FULL_RETRAIN_ASSETS, DAY_ASSETS):
        names = [name for name in group if name in ranges and name not in done]
        done.update(names)
        for days in sorted({run for name in names for run in ranges[name]}):
            selected = [name for name in names if days in ranges[name]]
            run_days(platform, defs, dataset, selected, days)


@pytest.mark.slow
def test_a_replay_retrains_weekly_on_the_days_the_live_chain_did(tmp_path):
    live = contract_with(tmp_path, "synthetic", full_window_days=5)
    platform = Platform(live, tmp_path / "platform")
    platform.land("2024-01-01", 10)
    # The live chain: its days up to Sunday 2024-01-07, that Sunday's weekly retrain, the rest.
    run_days(platform, platform.defs, "synthetic", DAY_ASSETS, ("2024-01-01", "2024-01-07"))
    run_days(platform, platform.defs, "synthetic", FULL_RETRAIN_ASSETS, ("2024-01-07",) * 2)
    run_days(platform, platform.defs, "synthetic", DAY_ASSETS, ("2024-01-08", "2024-01-10"))
    document = yaml.safe_load((tmp_path / "synthetic.yaml").read_text())
    document["training"]["window_days"] = 3
    changed = tmp_path / "synthetic_short.yaml"
    changed.write_text(yaml.safe_dump(document))
    replay = create_replay(tmp_path / "replays", changed, live, "short", dt.date(2024, 1, 6), 5)
    weekly = replay.live_weekly_days(platform.instance)
    assert weekly == ["2024-01-07"]
    ranges = replay.backfill_ranges(weekly)
    assert ranges["full_model"] == ranges["full_evaluation_report"] == [("2024-01-07",) * 2]
    defs = build_definitions(
        live,
        landing_dir=str(platform.landing_dir),
        lake_dir=str(platform.lake_dir),
        replays=[replay],
    )
    run_backfill(platform, defs, replay.dataset, ranges)
    registered = day_records(
        platform.instance, asset_key(replay.dataset, "registered_model"), ["2024-01-08"]
    )
    assert registered["2024-01-08"].metadata["weekly_candidate"] == "full-2024-01-07"
    result = dg.materialize(
        [*(defs.assets or [])],
        resources=defs.resources,
        instance=platform.instance,
        selection=[asset_key(replay.dataset, REPLAY_COMPARISON)],
    )
    [event] = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert metadata["live_weekly_retrains"].value == metadata["replay_weekly_retrains"].value == 1
    assert "Not like for like" not in str(metadata["summary"].value)


def test_the_weekly_retrains_window_is_warmed_up_never_before_the_first_day(tmp_path):
    flights = load_contract("flights")
    made = flights_replay(tmp_path)
    full = made.contract.training.full_window_days
    replay = create_replay(
        tmp_path / "replays", made.contract_file, flights, "june", dt.date(2013, 6, 3), 10
    )
    # The Sunday before the replay's first day, and one within it.
    weekly = ["2013-06-02", "2013-06-09"]
    warm_up = replay.warm_up_days(weekly)
    assert warm_up[0] == (dt.date(2013, 6, 2) - dt.timedelta(days=full - 1)).isoformat()
    assert warm_up[-1] == "2013-06-02" and len(warm_up) == full
    ranges = replay.backfill_ranges(weekly)
    assert ranges["features"] == [(warm_up[0], "2013-06-12")]
    assert ranges["model"] == [("2013-06-03", "2013-06-12")]
    assert ranges["full_model"] == [("2013-06-02",) * 2, ("2013-06-09",) * 2]
    # Without weekly days, none is run, and the warm-up is the daily window's and references'.
    assert "full_model" not in replay.backfill_ranges()
    assert len(replay.warm_up_days()) < full
    # flights starts on 2013-01-01: a full window reaching before it is cut there.
    assert made.warm_up_days(["2013-03-03"])[0] == "2013-01-01"


def test_a_replay_is_not_removed_while_a_run_of_it_is_in_progress(tmp_path):
    replay = flights_replay(tmp_path)
    defs = build_definitions(
        load_contract("flights"),
        landing_dir=str(tmp_path / "landing"),
        lake_dir=str(tmp_path / "lake"),
        replays=[replay],
    )
    resources = defs.resources or {}
    instance = dg.DagsterInstance.ephemeral()
    refused: list[str] = []

    # A step of the replay's that runs while its owner removes the replay.
    @dg.asset(key=asset_key(replay.dataset, "still_running"))
    def still_running(context: dg.AssetExecutionContext) -> None:
        with pytest.raises(ReplayError) as raised:
            remove_replay(replay, instance, [], resources["lake"], resources["mlflow"])
        refused.append(str(raised.value))
        refused.append(context.run.run_id)

    # As the UI's Materialize of one of the replay's assets: a run of the global asset job.
    comparison = asset_key(replay.dataset, REPLAY_COMPARISON)
    beside = [
        a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition) and a.key == comparison
    ]
    job = dg.Definitions(
        assets=[*beside, still_running], resources=resources
    ).resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(instance=instance, asset_selection=[still_running.key]).success
    said, run_id = refused
    assert said.startswith(f"replay 'week' is running: run {run_id} (STARTED) write(s) its assets")
    assert "Cancel it in the UI (Backfills, Runs) or wait for it to end" in said
    # Nothing was removed; once the run ended, the replay is.
    assert replay.folder.is_dir()
    lake_dir = tmp_path / "lake" / MLFLOW_PREFIX
    lake_dir.mkdir(parents=True)
    shutil.copyfile(empty_mlflow_store(), lake_dir / "mlflow.db")
    remove_replay(replay, instance, [], resources["lake"], resources["mlflow"])
    assert not replay.folder.exists()
    # Another replay's runs do not hold it up.
    other = flights_replay(tmp_path, "week_two")
    assert running(instance, other.dataset) == []


@pytest.mark.slow
def test_a_day_the_live_chain_kept_after_a_rejected_re_delivery_keeps_its_outcome(tmp_path):
    text = bundled_contracts()["synthetic"].read_text()
    live_file = tmp_path / "synthetic.yaml"
    live_file.write_text(text)
    live = load_contract(live_file)
    platform = Platform(live, tmp_path / "platform")
    days = days_from("2024-01-01", 4)
    platform.land(days[0], len(days))
    run_days(platform, platform.defs, "synthetic", DAY_ASSETS, (days[0], days[-1]))
    before = compare_on(platform, live_file, tmp_path, "before", days)["days"]["live"][2]
    # The third day delivered again without its last column: the gate rejects it, and the live
    # chain keeps the day's earlier version and everything computed from it.
    landed = platform.landing_dir / f"synthetic_{days[2]}.csv"
    lines = landed.read_text().splitlines()
    landed.write_text("".join(line.rsplit(",", 1)[0] + "\n" for line in lines))
    run_days(platform, platform.defs, "synthetic", DAY_ASSETS, (days[2], days[2]))

    stored = compare_on(platform, live_file, tmp_path, "after", days)
    live_day, replay_day = stored["days"]["live"][2], stored["days"]["replay"][2]
    # The live chain served the day as before: its decision, champion and score stand.
    assert before["metric"] is not None
    for field in ("decision", "champion", "metric", "train_seconds"):
        assert live_day[field] == before[field], field
    assert live_day["rejected"] is None
    assert live_day["kept"].startswith("raw_data: ")
    assert stored["summary"]["live"]["rejected"] == []
    # The replay reads the file landed now: the day is rejected there.
    assert replay_day["rejected"] is not None and replay_day["metric"] is None
    assert any(
        note.startswith(f"The live chain kept an earlier delivery of 1 day(s) ({days[2]})")
        for note in stored["notes"]
    ), stored["notes"]


def compare_on(
    platform: Platform, live_file: Path, tmp_path: Path, name: str, days: list[str]
) -> dict[str, Any]:
    """A replay `name` of the live synthetic days with another estimator, run and compared."""
    changed = tmp_path / f"synthetic_{name}.yaml"
    changed.write_text(
        live_file.read_text().replace(
            "  estimator: linear\n", "  estimator: sgd\n  max_epochs: 3\n"
        )
    )
    live = load_contract(live_file)
    start = dt.date.fromisoformat(days[0])
    replay = create_replay(tmp_path / "replays", changed, live, name, start, len(days))
    defs = build_definitions(
        live,
        landing_dir=str(platform.landing_dir),
        lake_dir=str(platform.lake_dir),
        replays=[replay],
    )
    run_backfill(platform, defs, replay.dataset, replay.backfill_ranges())
    result = dg.materialize(
        [*(defs.assets or [])],
        resources=defs.resources,
        instance=platform.instance,
        selection=[asset_key(replay.dataset, REPLAY_COMPARISON)],
    )
    [event] = result.get_asset_materialization_events()
    return json.loads(Path(str(event.materialization.metadata["path"].value)).read_text())


def test_a_rejection_told_over_several_lines_keeps_its_day_on_one_line_of_the_table(tmp_path):
    replay = flights_replay(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    # The history gate's reason: findings, then the reference, each on a line of its own.
    reason = "2 history statistics out of bounds: dep_delay | null_share 0.4\nReference: 7 days"
    for day in DAYS:
        record_day(instance, replay.dataset, day, 0.70)
        if day != DAYS[2]:
            record_day(instance, "flights", day, 0.70)
            continue
        for name in DAY_ASSETS:
            verdict, why = ("accepted", "") if name == "raw_data" else ("no accepted input", "")
            if name == "validated_data":
                verdict, why = "failed history gate", reason
            metadata = {"verdict": verdict, "accepted": verdict == "accepted", "reason": why}
            event = dg.AssetMaterialization(
                asset_key("flights", name), partition=day, metadata=metadata
            )
            instance.report_runless_asset_event(event)
    found = compare(tmp_path, replay, instance)
    assert found["stored"]["summary"]["live"]["rejected"] == [DAYS[2]]
    # The stored comparison keeps the whole reason; the table a line a day.
    [live_day] = [d for d in found["stored"]["days"]["live"] if d["day"] == DAYS[2]]
    assert live_day["rejected"] == f"validated_data: failed history gate: {reason}"
    table = str(found["metadata"]["comparison"].value).split("| day |", 1)[1].splitlines()
    rows = [line for line in table if line.startswith("| 20")]
    assert [row.split(" | ")[0] for row in rows] == [f"| {day}" for day in DAYS]
    [row] = [r for r in rows if r.startswith(f"| {DAYS[2]} |")]
    assert "rejected (validated_data: failed history gate: 2 history statistics out of" in row
    # Seven cells, as every line: a `|` of the reason is escaped.
    assert len(row.replace("\\|", "").strip("|").split(" | ")) == 7


def test_a_replay_of_a_dataset_not_served_says_so_to_remove_and_to_a_namesake(tmp_path):
    replays = tmp_path / "replays"
    changed = tmp_path / "synthetic_sgd.yaml"
    changed.write_text(
        bundled_contracts()["synthetic"]
        .read_text()
        .replace("  estimator: linear\n", "  estimator: sgd\n")
    )
    create_replay(replays, changed, load_contract("synthetic"), "week", dt.date(2024, 1, 5), 3)
    flights = load_contract("flights")
    # Settings that serve flights alone: the name is neither free nor removable here.
    with pytest.raises(ReplayError) as removing:
        find_replay(replays, "week", [flights])
    assert str(removing.value) == (
        f"replay 'week' in {replays / 'week'} replays 'synthetic', a dataset these settings do "
        "not serve (ML_PLATFORM_CONTRACTS, ML_PLATFORM_DATASET): run the command where "
        "synthetic is served"
    )
    with pytest.raises(ReplayError) as making:
        flights_replay(tmp_path)
    assert f"exists ({replays / 'week'}, a replay of synthetic): remove it first " in str(
        making.value
    )
    assert "(`ml-platform replay remove week` where synthetic is served)" in str(making.value)
    # A name no folder holds is just not there.
    with pytest.raises(ReplayError, match="no replay named 'other'"):
        find_replay(replays, "other", [flights])
