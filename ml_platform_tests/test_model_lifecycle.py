"""Training of each estimator that survives SIGKILL, the loss-plateau check, promotion against
the champion, the registry's versions, aliases and lineage manifests, and scoring."""

import json
import os
import shutil
import signal
import subprocess
import sys

import dagster as dg
import pandas as pd
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.platform.formats import deserialise
from ml_platform.registry.store import ModelRegistry
from ml_platform.training.assets import LOSS_PLATEAU_CHECK
from ml_platform.training.window import data_version
from ml_platform_tests.conftest import REPO, Platform, days_from, lake_registry

pytestmark = pytest.mark.slow

DAYS = days_from("2024-01-01", 3)
DAILY = ["raw_data", "validated_data", "features", "model", "evaluation_report"]


def write_contract(
    tmp_path, name: str, rows: int = 1000, training=None, evaluation=None, model=None
):
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["source"]["rows_per_day"] = rows
    document["quality"]["row_count"] = {"min": 1, "max": rows + 1}
    document["training"].update(training or {})
    if model is not None:
        document["model"] = model
    document["evaluation"].update(evaluation or {})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def registry_of(platform: Platform) -> ModelRegistry:
    return lake_registry(platform.lake_dir, platform.contract.name)


# The run killed at an exact point of its training, placed by wrapping the model's checkpoint
# store: once the checkpoint of epoch or iteration KILL_AT is saved (argv[4]). The kill lands
# strictly while the step trains, however fast the machine: nothing depends on when a test
# looks.
KILL_SCRIPT = """
import os
import signal
import sys
from pathlib import Path
import dagster as dg
from ml_platform.contracts import load_contract
from ml_platform.training.assets import LakeCheckpoints
from ml_platform_tests.conftest import Platform
platform = Platform(load_contract(sys.argv[1]), Path(sys.argv[2]))
# A copy of the test's on-disk instance (DAGSTER_HOME) as the days left it: it records the
# window's days as accepted, and a model reads accepted days only.
platform.instance = dg.DagsterInstance.get()
kill_at = int(sys.argv[4])
save = LakeCheckpoints.save
def save_then_die(self, state):
    save(self, state)
    if state.epoch >= kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
LakeCheckpoints.save = save_then_die
result = platform.materialize(sys.argv[3], selection=["model"])
sys.exit(0 if result.success else 1)
"""
KILL_AT = 3


# Each estimator's settings: a checkpoint after every epoch or boosting iteration
# (checkpoint_seconds 0), more of them than KILL_AT, so the kill (at the KILL_AT-th checkpoint,
# not after some time) lands between two: SGD in 512-row calls on 12,000 rows (which also
# exercises resuming a run that cuts its epochs into many calls), without early stop; boosting
# one iteration a step on 15,000 rows without early stop. (A linear model has no checkpoint:
# a restart is the resume, as every rerun of the model step is.)
KILLED = {
    "sgd": (
        4000,
        {"estimator": "sgd", "max_epochs": 10, "patience": 10, "batch_size": 512},
    ),
    "hist_gradient_boosting": (
        5000,
        {"estimator": "hist_gradient_boosting", "max_iter": 20, "patience": 20, "step": 1},
    ),
}


@pytest.mark.parametrize("estimator", list(KILLED))
def test_training_killed_mid_run_resumes_and_matches_an_uninterrupted_run(tmp_path, estimator):
    rows, model = KILLED[estimator]
    path = write_contract(
        tmp_path, "big", rows=rows, training={"checkpoint_seconds": 0}, model=model
    )
    killed = Platform(load_contract(path), tmp_path / "killed")
    # A real instance on disk, so that the killed process can start from a copy of it taken
    # once the days are recorded, instead of materialising them again in an instance of its own.
    home = tmp_path / "dagster_home"
    home.mkdir()
    # As the ephemeral instance it replaces: no telemetry.
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    killed.instance = dg.DagsterInstance.local_temp(str(home))
    killed.land(DAYS[0], 3)
    for day in DAYS:
        assert killed.materialize(day, selection=DAILY[:3]).success
    # The killed process's instance: what this one records of the days, and nothing later (it
    # never sees the uninterrupted run, nor this one the killed run).
    killed_home = tmp_path / "dagster_home_killed"
    shutil.copytree(home, killed_home)
    checkpoint = killed.lake_dir / "synthetic" / "checkpoints" / "model" / f"{DAYS[2]}.joblib"

    # The uninterrupted run first, on the same stored days: it starts from no checkpoint and
    # leaves none, so the killed run after it starts from scratch too.
    uninterrupted = killed.materialize(DAYS[2], selection=["model"])
    assert uninterrupted.success and not checkpoint.exists()
    clean_model = killed.stored("model", DAYS[2], "joblib").read_bytes()

    # Killed once the third epoch or iteration is checkpointed.
    proc = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(path), str(tmp_path / "killed"), DAYS[2]]
        + [str(KILL_AT)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "DAGSTER_HOME": str(killed_home)},
        check=False,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, "training ended before its kill point"
    unit = "epoch" if estimator == "sgd" else "iteration"
    killed_at = deserialise(checkpoint.read_bytes(), "joblib").epoch
    assert killed_at == KILL_AT

    resumed = killed.materialize(DAYS[2], selection=["model"])

    assert resumed.success
    meta = resumed.asset_materializations_for_node(killed.node("model"))[0].metadata
    assert meta["estimator"].value == estimator
    assert meta[f"resumed_from_{unit}"].value == killed_at
    assert (
        uninterrupted.asset_materializations_for_node(killed.node("model"))[0]
        .metadata[f"resumed_from_{unit}"]
        .value
        == 0
    )
    assert not checkpoint.exists(), "a finished model's checkpoint is cleaned up"
    features = pd.read_parquet(killed.stored("features", DAYS[2], "parquet"))
    model_a = deserialise(killed.stored("model", DAYS[2], "joblib").read_bytes(), "joblib")
    model_b = deserialise(clean_model, "joblib")
    pd.testing.assert_series_equal(model_a.predict(features), model_b.predict(features))
    assert model_a.history == model_b.history


def test_loss_plateau_warns_on_a_stalled_run_and_not_on_a_normal_one(tmp_path):
    stalled = Platform(
        # A learning rate next to zero, a classic slip: the loss stays flat from the start.
        load_contract(
            write_contract(
                tmp_path, "stalled", model={"estimator": "sgd", "eta0": 1e-9, "patience": 8}
            )
        ),
        tmp_path / "stalled",
    )
    normal = Platform(
        load_contract(write_contract(tmp_path, "normal", model={"estimator": "sgd"})),
        tmp_path / "normal",
    )
    verdicts = {}
    for name, platform in (("stalled", stalled), ("normal", normal)):
        platform.land(DAYS[0], 1)
        result = platform.materialize(DAYS[0], selection=DAILY[:4])
        assert result.success
        checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
        verdicts[name] = checks[LOSS_PLATEAU_CHECK]
    assert not verdicts["stalled"].passed
    assert "has not improved for 5 epochs" in verdicts["stalled"].description
    assert verdicts["normal"].passed, verdicts["normal"].description


def test_a_worse_candidate_stays_challenger_and_a_better_one_is_promoted(tmp_path):
    # Same dataset and lake, two trainers: a good one and one crippled by regularisation whose
    # models still pass the (lowered) value thresholds.
    lenient = {"value_thresholds": {"r2": 0.0}}
    good = Platform(
        load_contract(write_contract(tmp_path, "good", evaluation=lenient)), tmp_path / "lake"
    )
    weak = Platform(
        load_contract(
            write_contract(
                tmp_path, "weak", model={"estimator": "linear", "alpha": 1e5}, evaluation=lenient
            )
        ),
        tmp_path / "lake",
    )
    # One lake, one instance: each trainer's runs read the records of the other's days.
    weak.instance = good.instance
    good.land(DAYS[0], 3)
    registry = registry_of(good)

    assert weak.materialize(DAYS[0]).success  # the first model: no champion to beat
    assert registry.alias("champion") == f"daily-{DAYS[0]}"
    assert good.materialize(DAYS[1]).success
    assert registry.alias("champion") == f"daily-{DAYS[1]}"
    worse = weak.materialize(DAYS[2])
    assert worse.success
    # The evaluation finds the weak candidate eligible; the registry, scoring the champion on
    # the same held-out rows, keeps the champion.
    report = worse.asset_materializations_for_node(weak.node("evaluation_report"))[0].metadata
    assert report["decision"].value == "eligible"
    registered = worse.asset_materializations_for_node(weak.node("registered_model"))[0].metadata
    assert registered["decision"].value == "challenger"
    assert registered["outcome"].value == "kept champion (challenger)"
    assert registered["champion_met"].value == f"daily-{DAYS[1]}"
    assert report["rmse"].value > registered["champion_rmse"].value
    assert registered["improvement_rmse_high"].value < 0
    assert registry.alias("champion") == f"daily-{DAYS[1]}"
    assert registry.alias("challenger") == f"daily-{DAYS[2]}"
    # Each day's record says what it moved.
    moves = [
        (value["alias"], value["version"])
        for day in DAYS
        for value in [json.loads(good.stored("registered_model", day, "json").read_text())]
    ]
    assert moves == [
        ("champion", f"daily-{DAYS[0]}"),
        ("champion", f"daily-{DAYS[1]}"),
        ("challenger", f"daily-{DAYS[2]}"),
    ]


def test_a_candidate_below_the_value_thresholds_is_rejected_and_the_run_succeeds(tmp_path):
    strict = {"value_thresholds": {"r2": 0.999}}
    platform = Platform(
        load_contract(write_contract(tmp_path, "strict", evaluation=strict)), tmp_path
    )
    platform.land(DAYS[0], 1)
    result = platform.materialize(DAYS[0])
    # A rejection is an outcome: the run succeeds, and the day is recorded as not registered.
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    verdict = checks["promotion_verdict"]
    assert not verdict.passed and verdict.severity == dg.AssetCheckSeverity.WARN
    assert verdict.description.startswith("reject: r2 ")
    assert "misses the bound (at least 0.999)" in verdict.description
    assert registry_of(platform).versions() == []
    registered = result.asset_materializations_for_node(platform.node("registered_model"))[
        0
    ].metadata
    assert registered["version"].value == "none: rejected, not registered"
    assert registered["outcome"].value.startswith("rejected: r2 ")


def test_rerunning_a_day_keeps_one_version_whose_manifest_names_its_inputs(
    tmp_path, monkeypatch, capsys
):
    platform = Platform(load_contract("synthetic"), tmp_path)
    platform.land(DAYS[0], 3)
    for day in DAYS:
        assert platform.materialize(day).success
    registry = registry_of(platform)
    aliases = {alias: registry.alias(alias) for alias in ("champion", "challenger")}
    assert platform.materialize(DAYS[2]).success

    # The rerun met what the first run met and decided the same: the aliases are as they were.
    assert {alias: registry.alias(alias) for alias in aliases} == aliases
    assert registry.versions() == [f"daily-{day}" for day in DAYS]
    manifest = registry.manifest(f"daily-{DAYS[2]}")
    assert manifest["input_partitions"] == DAYS
    for day in DAYS:
        frame = pd.read_parquet(platform.stored("features", day, "parquet"))
        assert manifest["input_data_versions"][day] == data_version(frame)
    assert manifest["git_commit"] and manifest["python"] and manifest["packages"]["dagster"]
    assert manifest["lock_sha256"] and manifest["estimator"] == "linear"
    assert manifest["hyperparameters"]["alpha"] == 1.0  # Ridge's, the contract's default
    assert manifest["model_settings"] == {
        "estimator": "linear",
        "C": None,
        "alpha": None,
        "max_iter": 1000,
    }
    # The contract's linear model, as test_score_command_uses_the_champion_on_a_landed_file
    # scores the other estimators: its first two days are that test's two days.
    assert_the_champion_scores_a_landed_file(platform, "linear", tmp_path, monkeypatch, capsys)


def assert_the_champion_scores_a_landed_file(
    platform: Platform, estimator: str, tmp_path, monkeypatch, capsys
) -> None:
    """After DAYS[:2] (at least) of the daily graph: the second day's candidate was judged, and
    `ml-platform score` scores a landed file with the champion, of `estimator`."""
    from ml_platform.cli import main

    # The second day's candidate was judged against the trivial baseline by its evaluation,
    # then against the first day's champion on the same held-out rows by the registry.
    report = json.loads(platform.stored("evaluation_report", DAYS[1], "json").read_text())
    registered = json.loads(platform.stored("registered_model", DAYS[1], "json").read_text())
    assert registered["champion_met"] == f"daily-{DAYS[0]}"
    assert "rmse" in registered["improvements"]
    assert report["baseline"]["strategy"] == "mean" and report["baseline"]["beats"]
    assert report["baseline"]["metrics"]["rmse"] > report["metrics"]["rmse"]
    registry = registry_of(platform)
    champion = registry.alias("champion")
    manifest = registry.manifest(champion)
    assert manifest["estimator"] == estimator == manifest["model_settings"]["estimator"]
    assert manifest["hyperparameters"]["random_state" if estimator != "linear" else "alpha"]
    monkeypatch.setenv("ML_PLATFORM_DATASET", "synthetic")
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(platform.lake_dir))
    landed = platform.landing_dir / f"synthetic_{DAYS[1]}.csv"
    out = tmp_path / "scored.csv"

    assert main(["score", str(landed), "--output", str(out)]) == 0

    assert f"1000 rows scored by {champion}" in capsys.readouterr().out
    scored = pd.read_csv(out)
    # Real predictions: close to the targets, and not a constant.
    error = (scored["prediction"] - scored["target"]).abs().mean()
    assert error < 1.0 and scored["prediction"].std() > 1.0


# The linear model (the synthetic contract's own) is scored by
# test_rerunning_a_day_keeps_one_version_whose_manifest_names_its_inputs, whose first two days
# are these two days of it.
@pytest.mark.parametrize("estimator", ["sgd", "hist_gradient_boosting"])
def test_score_command_uses_the_champion_on_a_landed_file(tmp_path, monkeypatch, capsys, estimator):
    path = write_contract(tmp_path, estimator, model={"estimator": estimator})
    platform = Platform(load_contract(path), tmp_path)
    platform.land(DAYS[0], 2)
    for day in DAYS[:2]:
        assert platform.materialize(day).success
    assert_the_champion_scores_a_landed_file(platform, estimator, tmp_path, monkeypatch, capsys)
