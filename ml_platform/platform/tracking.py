"""MLflow, where the platform's trainings and models live: its tracking and its registry store.

One experiment and one registered model per dataset, both named after it. The stores come from
MLflow's own variables, `MLFLOW_TRACKING_URI` and `MLFLOW_REGISTRY_URI` (the registry defaults
to the tracking store); unset, the tracking store is a SQLite file in the lake directory
(`<lake>/mlflow/mlflow.db`, embedded, nothing to start). Artifacts go under the lake
(`<lake>/mlflow/artifacts/<dataset>`, a directory or an S3 prefix); MLflow reaches S3 through
boto3's chain and `MLFLOW_S3_ENDPOINT_URL`. A lake on S3 needs a tracking store MLflow can share
between machines (PostgreSQL): the embedded file is refused there. MLflow's HTTP client retries
a failed request for seconds, not its default of minutes (`quiet_mlflow`): longer outages are the
steps' retry policy's, and a value set in the environment stands.

MLflow is imported by the steps that use it, not by the code location: its import costs seconds
that the webserver, the daemon and the sensors never need.
"""

import functools
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from ml_platform.platform.datasets import MLFLOW_PREFIX
from ml_platform.platform.settings import quiet_mlflow
from ml_platform.platform.storage import LakeStorage, LocalStorage

if TYPE_CHECKING:
    from mlflow import MlflowClient

TRACKING_ENV = "MLFLOW_TRACKING_URI"
REGISTRY_ENV = "MLFLOW_REGISTRY_URI"
# Tags the platform sets on runs and model versions, under one namespace.
TAG = "ml_platform"
# Before any module of the platform imports MLflow (they all import this one first).
quiet_mlflow()

# Creating an experiment or registered model twice at once is refused by one of the two;
# within a process one lock keeps it to one attempt, across processes the loser reads it.
_create_lock = threading.Lock()


class TrackingConfigError(ValueError):
    """The tracking store cannot be chosen for this lake (the message says what to set)."""


class MlflowStores(dg.ConfigurableResource):
    """Where MLflow keeps runs, registered models and artifacts for the lake `lake`.

    `tracking_uri` and `registry_uri` are MLflow's (from `MLFLOW_TRACKING_URI` and
    `MLFLOW_REGISTRY_URI` as `EnvVar`s: a PostgreSQL URI carries its password); None: the
    embedded SQLite file in a lake directory.
    """

    lake: LakeStorage
    tracking_uri: str | None = None
    registry_uri: str | None = None
    # The MLflow UI's address (`ML_PLATFORM_MLFLOW_UI_URL`); None: metadata names no link.
    ui_url: str | None = None

    def tracking(self) -> str:
        """The tracking store's URI: the configured one, else the lake's embedded file."""
        if self.tracking_uri:
            return self.tracking_uri
        if not isinstance(self.lake, LocalStorage):
            raise TrackingConfigError(
                f"the lake is at {self.lake.uri('')}: set {TRACKING_ENV} to a tracking store "
                "every machine reaches (e.g. postgresql+psycopg2://user@host/mlflow); the embedded "
                "SQLite file is only for a lake in a directory"
            )
        folder = Path(self.lake.uri(MLFLOW_PREFIX))
        folder.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{folder / 'mlflow.db'}"

    def registry(self) -> str:
        """The registry store's URI: the configured one, else the tracking store."""
        return self.registry_uri or self.tracking()

    def artifact_location(self, dataset: str) -> str:
        """Where a dataset's experiment keeps its artifacts: under the lake."""
        where = self.lake.uri(f"{MLFLOW_PREFIX}/artifacts/{dataset}")
        return where if "://" in where else Path(where).as_uri()

    def run_link(self, dataset: str, run_id: str) -> dict[str, Any]:
        """Metadata naming an MLflow run, with its page in the UI when one is configured."""
        link: dict[str, Any] = {"mlflow_run_id": run_id}
        if self.ui_url:
            page = f"{self.ui_url}/#/experiments/{self.experiment_id(dataset)}/runs/{run_id}"
            link["mlflow_run"] = dg.MetadataValue.url(page)
        return link

    def model_version_link(self, dataset: str, version: str) -> dict[str, Any]:
        """Metadata naming a model version (`models:/<dataset>/<n>`), with its UI page if any."""
        link: dict[str, Any] = {"mlflow_model_version": f"models:/{dataset}/{version}"}
        if self.ui_url:
            page = f"{self.ui_url}/#/models/{dataset}/versions/{version}"
            link["mlflow_model_version_page"] = dg.MetadataValue.url(page)
        return link

    def client(self) -> "MlflowClient":
        """An MLflow client on these stores (one per process and stores)."""
        return _client(self.tracking(), self.registry())

    def experiment_id(self, dataset: str) -> str:
        """The id of the dataset's experiment, created with its artifacts under the lake."""
        return _experiment_id(
            self.tracking(), self.registry(), dataset, self.artifact_location(dataset)
        )


class DeletedInMlflowError(dg.Failure):
    """What the platform writes to was deleted in MLflow (its UI or API): waiting cannot help.

    A configuration failure, not retried: a person restores it, or removes it for good.
    """

    def __init__(self, message: str):
        super().__init__(description=message, allow_retries=False)


@functools.cache
def _client(tracking: str, registry: str) -> "MlflowClient":
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking, registry_uri=registry)


# Looked up at each use (one query), not kept for the process: a range's run trains and
# registers day after day, and an experiment deleted (or purged and created again) meanwhile
# must be named as such, not written to by the id an earlier day found.
def _experiment_id(tracking: str, registry: str, dataset: str, artifacts: str) -> str:
    from mlflow.exceptions import MlflowException

    client = _client(tracking, registry)
    with _create_lock:
        found = client.get_experiment_by_name(dataset)
        if found is not None and found.lifecycle_stage == "deleted":
            # MLflow keeps a deleted experiment's name until it is purged: no new one can
            # take it, and nothing can be logged to the deleted one.
            raise DeletedInMlflowError(
                f"MLflow's experiment '{dataset}' (id {found.experiment_id}) was deleted, so no "
                "training or registration can be recorded: restore it (`mlflow experiments "
                f"restore --experiment-id {found.experiment_id}`, or in MLflow's UI), or purge "
                "it (`mlflow gc`) for the platform to create a new one, then rerun the day"
            )
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(
                client.create_experiment(
                    dataset, artifact_location=artifacts, tags={f"{TAG}.dataset": dataset}
                )
            )
        except MlflowException:
            # Another process created it between the lookup and the creation.
            found = client.get_experiment_by_name(dataset)
            if found is None:
                raise
            return str(found.experiment_id)
