"""Registry versions are whole or absent: a registration that a full disk cuts short leaves no
model version behind; `versions()`, `load`, the aliases and `score --version` refuse what is not
whole or is damaged; the previous champion keeps serving, and the error says why."""

import errno
import json
import shutil
import sqlite3
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlparse

import boto3
import pandas as pd
import pytest
import sqlalchemy
from dagster_aws.s3 import S3Resource
from mlflow.artifacts import download_artifacts
from mlflow.exceptions import MlflowException

from ml_platform.cli import main
from ml_platform.contracts import load_contract
from ml_platform.platform.failures import (
    CONFIGURATION,
    TRANSIENT_INFRASTRUCTURE,
    StepFailure,
    classify_failure,
    transient,
)
from ml_platform.platform.s3 import S3Storage
from ml_platform.platform.storage import LocalStorage
from ml_platform.platform.tracking import DeletedInMlflowError, MlflowStores
from ml_platform.registry.store import MODEL_FILE, ModelRegistry, RegistryError, version_day
from ml_platform.training.model import TrainedModel
from ml_platform_tests.conftest import (
    Platform,
    empty_mlflow_store,
    fill,
    lake_registry,
    tmpfs,
)
from ml_platform_tests.services import FAKE_AWS, moto_s3

FIRST, SECOND = "2024-01-01", "2024-01-02"
NEW = f"daily-{SECOND}"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A synthetic lake after one day: its champion version, landed file and feature rows."""
    root = tmp_path_factory.mktemp("served")
    platform = Platform(load_contract("synthetic"), root)
    platform.land(FIRST, 1)
    assert platform.materialize(FIRST).success
    registry = platform.registry()
    assert registry.alias("champion") == f"daily-{FIRST}"
    features = pd.read_parquet(platform.stored("features", FIRST, "parquet"))
    return platform, platform.landing_dir / f"synthetic_{FIRST}.csv", features


def score(landed, tmp_path, capsys, *options: str) -> tuple[int, str, str]:
    code = main(["score", str(landed), "--output", str(tmp_path / "scored.csv"), *options])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_registration_cut_short_by_a_full_disk_leaves_no_version(
    served, tmp_path, monkeypatch, capsys
):
    platform, landed, features = served
    live = platform.registry()
    champion = str(live.alias("champion"))
    model, manifest = live.load(champion), live.manifest(champion)
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("ML_PLATFORM_DATASET", "synthetic")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    with tmpfs(tmp_path / "lake", "1m") as lake:
        monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(lake))
        registry = ModelRegistry(
            MlflowStores(lake=LocalStorage(base_dir=str(lake)), tracking_uri=tracking),
            "synthetic",
        )
        registry.upsert(champion, model, manifest, features.head(5))
        registry.set_alias("champion", champion)
        # Room for a file or two of the next version's, not for all of them.
        fill(lake, leave_pages=1)

        with pytest.raises(OSError) as raised:
            registry.upsert(NEW, model, {**manifest, "partition": SECOND}, features.head(5))

        # The disk's own error, so the failure is classed as resource exhaustion.
        assert raised.value.errno == errno.ENOSPC
        # No model version of it, nothing of it listed, loaded or served.
        assert registry.versions() == [champion]
        with pytest.raises(RegistryError, match=f"no version '{NEW}'"):
            registry.load(NEW)
        with pytest.raises(RegistryError, match=f"cannot point 'champion' at version '{NEW}'"):
            registry.set_alias("champion", NEW)
        code, _, err = score(landed, tmp_path, capsys, "--version", NEW)
        assert code == 2 and f"error: no version '{NEW}'" in err and "Traceback" not in err
        # The previous champion still serves.
        assert registry.alias("champion") == champion
        code, out, _ = score(landed, tmp_path, capsys)
        assert code == 0 and f"1000 rows scored by {champion} (champion, models:/synthetic/" in out


def own_lake(served, tmp_path, monkeypatch) -> tuple[ModelRegistry, str, TrainedModel, dict]:
    """The served champion registered in a lake of its own, which the commands are set to use.

    Its registry, the champion's name, model and manifest.
    """
    platform, _, features = served
    monkeypatch.setenv("ML_PLATFORM_DATASET", "synthetic")
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(tmp_path / "lake"))
    live = platform.registry()
    champion = str(live.alias("champion"))
    model, manifest = live.load(champion), live.manifest(champion)
    registry = lake_registry(tmp_path / "lake", "synthetic")
    registry.upsert(champion, model, manifest, features.head(5))
    registry.set_alias("champion", champion)
    return registry, champion, model, manifest


def test_scores_that_do_not_fit_on_the_disk_leave_the_earlier_file_whole(
    served, tmp_path, monkeypatch, capsys
):
    landed = served[1]
    own_lake(served, tmp_path, monkeypatch)
    with tmpfs(tmp_path / "out", "1m") as out:
        # Room for a part of the next scores only, beside an earlier file's.
        filler = fill(out, leave_pages=8)
        earlier = b"x1,prediction\n0.1,0.5\n"
        (out / "scored.csv").write_bytes(earlier)

        code, _, err = score(landed, out, capsys)

        assert code == 1 and "Traceback" not in err
        told = f"error: the scores could not be written to {out / 'scored.csv'}: [Errno 28] No"
        assert told in err
        assert (out / "scored.csv").read_bytes() == earlier
        assert {p.name for p in out.iterdir()} == {"scored.csv", filler.name}


def test_a_damaged_model_file_is_refused_and_the_champion_keeps_serving(
    served, tmp_path, monkeypatch, capsys
):
    _, landed, features = served
    registry, champion, model, manifest = own_lake(served, tmp_path, monkeypatch)
    lake = tmp_path / "lake"
    # A second version, whose model file is then damaged.
    registry.upsert(NEW, model, {**manifest, "partition": SECOND}, features.head(5))
    source = registry.model_version(NEW).source
    assert source.startswith(f"file://{lake}/mlflow/artifacts/synthetic/"), source
    damaged = Path(urlparse(source).path) / MODEL_FILE
    with open(damaged, "r+b") as handle:
        handle.seek(10)
        handle.write(b"\xff\xff")

    # Read as any other process reads it (this registry created NEW, so it trusts it whole).
    registry = lake_registry(lake, "synthetic")
    with pytest.raises(RegistryError, match="is damaged"):
        registry.load(NEW)
    with pytest.raises(RegistryError, match=f"cannot point 'challenger' at version '{NEW}'"):
        registry.set_alias("challenger", NEW)
    code, _, err = score(landed, tmp_path, capsys, "--version", NEW)
    assert code == 2 and "does not match its checksum" in err and "Traceback" not in err
    code, out, _ = score(landed, tmp_path, capsys)
    assert code == 0 and f"1000 rows scored by {champion} (champion, models:/synthetic/" in out

    # Registering the day again makes a whole version of it, the one its name loads.
    registry.upsert(NEW, model, {**manifest, "partition": SECOND}, features.head(5))
    assert registry.load(NEW).features == model.features
    assert registry.versions() == [champion, NEW]


def test_the_aliases_move_only_to_whole_versions_and_no_alias_file_is_written(served, tmp_path):
    platform, _, features = served
    model = platform.registry().load(f"daily-{FIRST}")
    registry = lake_registry(tmp_path, "synthetic")
    for day in ("2024-01-01", "2024-01-02"):
        registry.upsert(f"daily-{day}", model, {"partition": day}, features.head(5))
    registry.set_alias("champion", "daily-2024-01-02")
    registry.set_alias("challenger", "daily-2024-01-01")

    # Back to what a recorded day says: both at once, an alias at nothing cleared.
    registry.set_aliases({"champion": "daily-2024-01-01", "challenger": None})
    assert registry.aliases() == {"champion": "daily-2024-01-01", "challenger": None}
    # Nothing moves to a version that is not whole, and nothing else moves with it.
    with pytest.raises(
        RegistryError, match="cannot point 'challenger' at version 'daily-2024-01-09'"
    ):
        registry.set_aliases({"champion": "daily-2024-01-02", "challenger": "daily-2024-01-09"})
    assert registry.alias("champion") == "daily-2024-01-01"
    with pytest.raises(ValueError, match="unknown alias"):
        registry.set_aliases({"production": "daily-2024-01-01"})
    # MLflow holds the aliases; no second history of the moves: Dagster's record is the history.
    mlflow_aliases = registry.client.get_registered_model("synthetic").aliases
    assert mlflow_aliases == {"champion": registry.model_version("daily-2024-01-01").version}
    assert not list(tmp_path.rglob("aliases*.json"))
    assert version_day("full-2024-01-02") == "2024-01-02"


def champion_registered(served, tmp_path) -> tuple[ModelRegistry, TrainedModel, pd.DataFrame]:
    """A registry of its own whose champion is the served day's model registered as NEW."""
    platform, _, features = served
    model = platform.registry().load(f"daily-{FIRST}")
    registry = lake_registry(tmp_path, "synthetic")
    registry.upsert(NEW, model, {"partition": SECOND}, features.head(5))
    registry.set_aliases({"champion": NEW})
    return registry, model, features


def test_an_alias_follows_a_day_registered_again_to_its_new_version(served, tmp_path):
    registry, model, features = champion_registered(served, tmp_path)
    first = registry.model_version(NEW).version

    # The day registered again by a later step (a retry after the aliases moved, a corrected
    # day rerun), which then sets the aliases to what its days left.
    again = lake_registry(tmp_path, "synthetic")
    number = again.upsert(NEW, model, {"partition": SECOND}, features.head(5))
    again.set_aliases({"champion": NEW})

    def aliased() -> dict[str, str]:
        aliases = again.client.get_registered_model("synthetic").aliases
        return {alias: str(number) for alias, number in aliases.items()}

    assert str(number) != str(first)
    # MLflow's alias is on the version the name now loads, as `models:/synthetic@champion`
    # serves it and the platform's own loading of the champion reads it.
    assert aliased() == {"champion": str(number)}
    assert str(again.model_version(NEW).version) == str(number)
    # Where it is already, nothing moves.
    again.set_aliases({"champion": NEW, "challenger": None})
    assert aliased() == {"champion": str(number)}


def test_the_same_model_registered_again_never_rewrites_an_earlier_versions_files(served, tmp_path):
    platform, _, features = served
    model = platform.registry().load(f"daily-{FIRST}")
    registry = lake_registry(tmp_path, "synthetic")
    training = registry.client.create_run(registry.stores.experiment_id("synthetic")).info.run_id
    # A re-execution of the registry step: the same training run, the same model.
    for attempt in ("first", "second"):
        registry.upsert(
            NEW, model, {"partition": SECOND, "run_id": attempt}, features.head(5), training
        )
    first, second = (registry.client.get_model_version("synthetic", n) for n in ("1", "2"))

    assert first.source != second.source
    files = download_artifacts(
        artifact_uri=first.source,
        dst_path=str(tmp_path / "first"),
        tracking_uri=registry.stores.tracking(),
    )
    manifest = json.loads((Path(files) / "ml_platform_manifest.json").read_text())
    assert manifest["run_id"] == "first"


def test_an_alias_a_person_put_on_a_version_of_their_own_is_named_and_moved_back(served, tmp_path):
    registry, model, features = champion_registered(served, tmp_path)
    # In MLflow's UI: a version registered by hand, and the challenger alias put on it.
    client = registry.client
    own = client.create_model_version("synthetic", registry.model_version(NEW).source)
    client.set_registered_model_alias("synthetic", "challenger", own.version)

    assert registry.aliases() == {
        "champion": NEW,
        "challenger": f"model version {own.version} (registered outside the platform)",
    }
    # What a recorded day says wins: the alias leaves the person's version.
    registry.set_aliases({"champion": NEW, "challenger": None})
    assert registry.aliases() == {"champion": NEW, "challenger": None}


def test_what_a_person_deleted_in_mlflow_is_worked_around_or_named_not_retried(served, tmp_path):
    platform, _, features = served
    model = platform.registry().load(f"daily-{FIRST}")
    registry = lake_registry(tmp_path / "runs", "synthetic")
    # The training's run deleted in MLflow's UI: the registration takes a run of its own.
    experiment = registry.stores.experiment_id("synthetic")
    training = registry.client.create_run(experiment, run_name="training")
    registry.client.delete_run(training.info.run_id)
    registry.upsert(NEW, model, {"partition": SECOND}, features.head(5), training.info.run_id)
    registered = registry.model_version(NEW)
    assert registered.run_id != training.info.run_id
    assert registry.client.get_run(registered.run_id).info.lifecycle_stage == "active"

    # The dataset's experiment deleted: nothing can be logged until a person restores it.
    gone = lake_registry(tmp_path / "experiment", "synthetic")
    deleted = gone.client.create_experiment("synthetic")
    gone.client.delete_experiment(deleted)
    with pytest.raises(DeletedInMlflowError) as raised:
        gone.upsert(NEW, model, {"partition": SECOND}, features.head(5))
    stop = raised.value
    assert not stop.allow_retries
    assert f"MLflow's experiment 'synthetic' (id {deleted}) was deleted" in stop.description
    assert f"mlflow experiments restore --experiment-id {deleted}" in stop.description
    failure = StepFailure(
        "synthetic__registered_model", "DeletedInMlflowError", stop.description, True
    )
    assert classify_failure([failure], []).failure_class == CONFIGURATION


def test_each_training_is_an_mlflow_run_that_the_registered_version_comes_from(served):
    platform, _, _ = served
    model_event = platform.instance.get_latest_materialization_event(platform.key("model"))
    registered_event = platform.instance.get_latest_materialization_event(
        platform.key("registered_model")
    )
    model_meta = model_event.asset_materialization.metadata
    registered_meta = registered_event.asset_materialization.metadata
    run_id = model_meta["mlflow_run_id"].value
    registry = platform.registry()
    client = registry.client
    run = client.get_run(run_id)
    # Params a person compares trainings by, the loss of every epoch, the evaluation's metrics.
    assert run.data.params["estimator"] == model_meta["estimator"].value
    assert run.data.params["window_end"] == FIRST
    assert run.data.tags["ml_platform.partition"] == FIRST
    unit = "epoch" if model_meta["estimator"].value == "sgd" else "iteration"
    losses = client.get_metric_history(run_id, "train_loss")
    assert len(losses) == model_meta[f"{unit}s"].value > 0
    assert "holdout_rmse" in run.data.metrics
    # The champion's model version is that run's model, named as the record names it.
    found = registry.model_version(f"daily-{FIRST}")
    assert found.run_id == run_id
    assert registered_meta["mlflow_model_version"].value == f"models:/synthetic/{found.version}"
    assert found.tags["ml_platform.decision"] == "promote"
    assert (
        found.tags["ml_platform.reason"] == platform.registry().manifest(f"daily-{FIRST}")["reason"]
    )
    assert found.tags["ml_platform.kind"] == "daily"
    assert client.get_registered_model("synthetic").aliases == {"champion": found.version}


def test_a_registration_warns_of_nothing_and_its_model_pins_what_serving_needs(
    served, tmp_path, caplog
):
    platform, _, features = served
    live = platform.registry()
    champion = str(live.alias("champion"))
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    registry = ModelRegistry(
        MlflowStores(lake=LocalStorage(base_dir=str(tmp_path / "lake")), tracking_uri=tracking),
        "synthetic",
    )
    with caplog.at_level("WARNING"):
        registry.upsert(champion, live.load(champion), live.manifest(champion), features.head(5))
    # A warning at every registration that nobody can act on is noise in every run's log.
    assert [r.getMessage() for r in caplog.records if r.name.startswith("mlflow")] == []
    folder = Path(
        download_artifacts(
            artifact_uri=registry.model_version(champion).source,
            dst_path=str(tmp_path / "download"),
            tracking_uri=tracking,
        )
    )
    requirements = (folder / "requirements.txt").read_text().split()
    assert f"scikit-learn=={version('scikit-learn')}" in requirements
    assert f"pandas=={version('pandas')}" in requirements


def test_a_registry_whose_artifact_store_is_down_raises_the_outage_for_a_retry(
    served, tmp_path, monkeypatch
):
    platform, _, features = served
    live = platform.registry()
    champion = str(live.alias("champion"))
    model, manifest = live.load(champion), live.manifest(champion)
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    with moto_s3() as endpoint:
        monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", endpoint)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="models")
        lake = S3Storage(url="s3://models/lake", s3=S3Resource(endpoint_url=endpoint))
        tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
        registry = ModelRegistry(MlflowStores(lake=lake, tracking_uri=tracking), "synthetic")
        registry.upsert(champion, model, manifest, features.head(5))
        assert registry.load(champion).features == model.features

    # The S3 server is gone: an outage, which passes, not a version to register again.
    with pytest.raises(Exception) as raised:
        registry.load(champion)
    assert not isinstance(raised.value, RegistryError), raised.value
    assert transient(raised.value)
    failure = StepFailure(
        "synthetic__registered_model", type(raised.value).__name__, str(raised.value), False
    )
    assert classify_failure([failure], []).failure_class == TRANSIENT_INFRASTRUCTURE


def test_a_locked_or_dropped_store_database_is_an_outage_that_passes(tmp_path):
    # Two datasets registering at once in the embedded SQLite store: one waits for the other's
    # write and, past its busy timeout, meets "database is locked", which a retry gets past.
    path = tmp_path / "store.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("create table runs (id)")
    holder.execute("begin exclusive")
    writer = sqlite3.connect(path, timeout=0)
    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked") as locked:
            writer.execute("insert into runs values (1)")
    finally:
        holder.rollback()
        writer.close()
        holder.close()
    wrapped = sqlalchemy.exc.OperationalError("INSERT INTO runs", {}, locked.value)
    assert transient(locked.value) and transient(wrapped)
    # PostgreSQL restarted or failed over under the store's session.
    dropped = sqlalchemy.exc.OperationalError(
        "SELECT 1", {}, Exception("server closed the connection unexpectedly")
    )
    assert transient(dropped)


def test_a_registry_store_that_refuses_the_new_model_says_why(served, tmp_path, monkeypatch):
    # MLflow makes the folder of a `sqlite:///file:...` URI's path as if it were relative: in
    # the test's own folder, not the repository's.
    monkeypatch.chdir(tmp_path)
    platform, _, features = served
    live = platform.registry()
    champion = str(live.alias("champion"))
    model, manifest = live.load(champion), live.manifest(champion)
    # The registry's database opened read-only (a replica's URI, say): the runs' store is
    # writable, the registry cannot create the dataset's registered model.
    registry_db = tmp_path / "registry.db"
    shutil.copyfile(empty_mlflow_store(), registry_db)
    stores = MlflowStores(
        lake=LocalStorage(base_dir=str(tmp_path / "lake")),
        tracking_uri=f"sqlite:///{tmp_path / 'tracking.db'}",
        registry_uri=f"sqlite:///file:{registry_db}?mode=ro&uri=true",
    )
    with pytest.raises(MlflowException, match="attempt to write a readonly database"):
        ModelRegistry(stores, "synthetic").upsert(champion, model, manifest, features.head(5))


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("ml_platform_model.json", "is missing"),
        ("MLmodel", "is missing"),
        ("ml_platform_model.json", "is not JSON"),
    ],
)
def test_a_version_missing_a_file_beside_its_model_is_refused_as_damaged(
    served, tmp_path, monkeypatch, capsys, name, damage
):
    # The model file matches its checksum, but a file the version loads with is gone from the
    # artifact store or cut short (a partial restore, a clean-up by hand): the version is not
    # whole, which waiting cannot change, so it is refused by name, never read as an I/O hiccup
    # that the registry step's retry policy would retry.
    _, landed, features = served
    registry, champion, model, manifest = own_lake(served, tmp_path, monkeypatch)
    registry.upsert(NEW, model, {**manifest, "partition": SECOND}, features.head(5))
    damaged = Path(urlparse(registry.model_version(NEW).source).path) / name
    if damage == "is missing":
        damaged.unlink()
    else:
        damaged.write_bytes(damaged.read_bytes()[:20])

    registry = lake_registry(tmp_path / "lake", "synthetic")
    with pytest.raises(RegistryError, match=f"version '{NEW}' .* is damaged: .*{name} {damage}"):
        registry.load(NEW)
    if damage == "is missing":
        with pytest.raises(RegistryError, match=f"cannot point 'challenger' at version '{NEW}'"):
            registry.set_alias("challenger", NEW)
    code, _, err = score(landed, tmp_path, capsys, "--version", NEW)
    assert code == 2 and f"{name} {damage}" in err and "Traceback" not in err
    assert registry.load(champion).features == model.features
