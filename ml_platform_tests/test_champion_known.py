"""champion_performance under a contract change: a champion the contract no longer feeds stops
the step with the registry's named error, and changes the champion can live with do not."""

import json
from pathlib import Path

import dagster as dg
import yaml

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.platform.failures import CONFIGURATION, error_chain
from ml_platform.platform.run_events import classify_outcome, run_outcome
from ml_platform.registry.monitoring import SCORED
from ml_platform_tests.conftest import Platform, days_from

FIRST, SECOND = days_from("2024-01-01", 2)
# The day's own assets and its monitoring; registered_model of the day before is recorded.
MONITORED = ["raw_data", "validated_data", "features", "drift_report", "champion_performance"]


def changed_contract(folder: Path, change=None) -> Contract:
    """The synthetic contract with `change(document)` applied, written to `folder`."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    if change is not None:
        change(document)
    folder.mkdir()
    path = folder / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_contract(path)


def renamed_x4(document: dict) -> None:
    for feature in document["features"]:
        if feature["name"] == "x4":
            feature["name"] = "x4_value"


def champion_then(tmp_path: Path, change, rebuilt=("features",)) -> Platform:
    """A champion trained on FIRST under the bundled contract, then `change` made to it.

    The returned platform runs the changed contract over the same lake and Dagster records,
    its `rebuilt` assets of FIRST materialised again under it.
    """
    before = Platform(changed_contract(tmp_path / "before"), tmp_path)
    before.land(FIRST, 2)
    assert before.materialize(FIRST).success
    assert before.registry().alias("champion") == f"daily-{FIRST}"
    after = Platform(changed_contract(tmp_path / "after", change), tmp_path)
    after.instance = before.instance  # the same records: the chain goes on
    # The day's features under the changed contract, as drift's reference and the model's
    # window read them (the champion's day's registered_model is not rerun: its decision stands).
    assert after.materialize(FIRST, list(rebuilt)).success
    return after


def test_a_champion_the_contract_no_longer_feeds_stops_monitoring_with_the_named_error(tmp_path):
    platform = champion_then(tmp_path, renamed_x4)

    result = platform.materialize(SECOND, MONITORED)

    assert not result.success
    data = platform.step_failure(result, "champion_performance")
    assert "KeyError" not in data.error.message
    assert data.user_failure_data is not None
    description = data.user_failure_data.description
    # The step that stopped, the champion, the feature it lacks and the day, in words.
    assert f"champion_performance {SECOND}" in description
    assert f"daily-{FIRST}" in description and "'x4'" in description
    assert "ChampionFeaturesError" in error_chain(data.error)[-1]
    # Classed as the contract change it is, as the failure alerts class the run, never retried.
    outcome = run_outcome(platform.instance, result.run_id, succeeded=False)
    assert outcome is not None
    assert classify_outcome(outcome).failure_class == CONFIGURATION
    retried = [
        e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
    ]
    assert retried == []
    assert SECOND not in platform.materialized("champion_performance")


def renamed_label(document: dict) -> None:
    document["label"]["name"] = "target_renamed"


def test_a_champion_trained_under_another_label_name_is_judged_by_the_contracts_label(tmp_path):
    # The label is renamed (its validated column too, so the champion's day is rebuilt from
    # raw_data): the champion never read its label to predict, so it still serves and is scored.
    platform = champion_then(
        tmp_path, renamed_label, rebuilt=["raw_data", "validated_data", "features"]
    )

    # Each of the two steps that score the champion, the monitoring first (in one run, a
    # failed registered_model would skip it).
    assert platform.materialize(SECOND, MONITORED).success
    assert platform.materialize(SECOND, ["model", "evaluation_report", "registered_model"]).success

    performance = json.loads(platform.stored("champion_performance", SECOND, "json").read_text())
    assert performance["status"] == SCORED
    assert performance["champion_version"] == f"daily-{FIRST}"
    assert performance["metrics"]["r2"] > 0.9
    registered = json.loads(platform.stored("registered_model", SECOND, "json").read_text())
    assert registered["champion_met"] == f"daily-{FIRST}"
    assert registered["champion_metrics"]["r2"] > 0.9


def added_feature(document: dict) -> None:
    document["features"].append({"name": "x1_again", "kind": "numeric", "source": "x1"})


def test_a_champion_trained_before_the_contract_gained_a_feature_still_serves(tmp_path):
    # The day's rows hold a feature the champion never learnt: it reads the ones it did.
    platform = champion_then(tmp_path, added_feature)

    assert platform.materialize(SECOND).success

    performance = json.loads(platform.stored("champion_performance", SECOND, "json").read_text())
    assert performance["status"] == SCORED
    assert performance["champion_version"] == f"daily-{FIRST}"
    registered = json.loads(platform.stored("registered_model", SECOND, "json").read_text())
    assert registered["champion_met"] == f"daily-{FIRST}" and registered["registered"]


def test_score_refuses_a_champion_the_contract_no_longer_feeds(tmp_path, monkeypatch, capsys):
    from ml_platform.cli import main

    platform = champion_then(tmp_path, renamed_x4)
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(platform.lake_dir))
    landed = platform.landing_dir / f"synthetic_{FIRST}.csv"
    out = tmp_path / "scored.csv"

    code = main(
        [
            "score",
            str(landed),
            "--dataset",
            str(tmp_path / "after" / "synthetic.yaml"),
            "--output",
            str(out),
        ]
    )

    # Told which version needs what, and what to do; no traceback and no file of scores.
    assert code == 2
    error = capsys.readouterr().err
    assert f"daily-{FIRST} cannot be scored under the contract of 'synthetic'" in error
    assert "it needs the feature(s) ['x4']" in error and "--version" in error
    assert not out.exists()
