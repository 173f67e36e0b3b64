"""The model registry: MLflow's, one registered model per dataset, named after it.

Each eligible candidate registered_model judges is a model version: the scikit-learn pipeline in
MLflow's sklearn flavour (its signature and an input example, so `mlflow.pyfunc.load_model`
serves it without this package), beside two files of the platform's own: what the model was
trained on (`ml_platform_model.json`) and the lineage manifest (`ml_platform_manifest.json`).
The version's tags say its platform name (`daily-2013-01-28`, `full-2013-01-28`: the day of its
data and its kind), decision, run and the model file's checksum. Registering a day again adds a
model version with the same platform name; the latest one is that name's version. One writer
moves the aliases `champion` and `challenger`: registered_model, in day order
(`ml_platform.registry.assets`). Their history is Dagster's record of registered_model
(`ml_platform.registry.chain`); nothing else keeps a second one.

A version is whole or absent: its files are logged first, under a folder named by the model's
content (so logging again never touches the bytes a committed version points to), and the model
version is created after them, in one call that carries its tags. A registration that fails
midway (a full disk) leaves no model version; a version whose model file does not match its
checksum is refused by `load` and by `set_aliases` (`DamagedVersionError`).

A version's files lost from the artifact store afterwards (a retention job, a partial restore)
are written again by `restore`, from the day's stored model, only when that model is the one
registered: the sklearn flavour's pickle is the same bytes for the same pipeline, so its sha256
is the registered one. registered_model calls it when a rerun of the day that registered the
version finds it damaged (`registered_on`).
"""

import dataclasses
import datetime as dt
import functools
import hashlib
import importlib.metadata
import json
import logging
import math
import platform
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from ml_platform.platform.failures import transient
from ml_platform.platform.formats import from_json_text, json_text
from ml_platform.platform.settings import Settings
from ml_platform.platform.tracking import TAG, MlflowStores
from ml_platform.training.model import TrainedModel

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.entities.model_registry import ModelVersion

ALIASES = ("champion", "challenger")
KEY_PACKAGES = ("dagster", "pandas", "numpy", "scikit-learn", "great-expectations", "scipy")
# What a served model needs, pinned to this environment's releases.
SERVING_PACKAGES = ("scikit-learn", "pandas", "numpy", "scipy", "cloudpickle")
VERSION_TAG = f"{TAG}.version"
# MLflow's error code for a registered model that does not exist (yet).
NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"
SHA256_TAG = f"{TAG}.model_sha256"
MODEL_FILE = "model.pkl"  # the sklearn flavour's pickle (cloudpickle)
MODEL_FIELDS = "ml_platform_model.json"
MANIFEST_FILE = "ml_platform_manifest.json"
# What `load` and `manifest` read beside the model file: MLflow's description of the model
# and the platform's two files.
LOADED_WITH = ("MLmodel", MODEL_FIELDS, MANIFEST_FILE)


class _ChosenFormat(logging.Filter):
    """Drops MLflow's warning, at every registration, that a cloudpickle file runs code on load.

    The format is chosen: a version must load where only MLflow, scikit-learn and pandas are
    installed, and `load` refuses a file whose sha256 is not the one registered with it
    (docs/models.md). A warning that no one can act on, once a day in every run's log, teaches
    people to skip the log.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "pickle or cloudpickle format" not in record.getMessage()


logging.getLogger("mlflow.sklearn").addFilter(_ChosenFormat())


@functools.cache
def _serving_pins() -> tuple[str, ...]:
    return tuple(f"{name}=={importlib.metadata.version(name)}" for name in SERVING_PACKAGES)


def serving_environment() -> dict[str, Any]:
    """What a served model needs, as the conda environment MLflow writes beside the model.

    This Python and the serving packages at this environment's releases (MLflow writes the same
    pins to the model's requirements.txt). Given whole, MLflow does not look for an installed pip
    to pin (a uv environment has none, and it would warn so at every registration).
    """
    # A new dict a call (MLflow is handed it), from pins read once a process.
    return {
        "name": "ml_platform-model",
        "channels": ["conda-forge"],
        "dependencies": [
            f"python={platform.python_version()}",
            "pip",
            {"pip": list(_serving_pins())},
        ],
    }


def version_day(version: str) -> str:
    """The day of a version's data: `daily-2013-01-28` and `full-2013-01-28` are 2013-01-28."""
    return version.split("-", 1)[1]


def registered_on(version: str) -> str:
    """The day of registered_model that registers a version, whose rerun restores its files.

    A daily model's own day; a weekly full retrain is judged on the day after its data's.
    """
    day = version_day(version)
    if version.startswith("full-"):
        return (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()
    return day


class RegistryError(LookupError):
    """A version or alias asked for is not in the registry, or not whole."""


class DamagedVersionError(RegistryError):
    """A registered version whose files are lost from the artifact store, or fail the checksum.

    Not an outage: the version is in the registry, and no wait brings its files back. The
    message says which file and what is wrong with it, and the way out (`restore`).
    """


def _tag_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    # MLflow keeps at most 5000 characters of a model version's tag.
    return text if len(text) <= 5000 else text[:4990] + " [...]"


def _save(model: TrainedModel, example: "pd.DataFrame", folder: Path) -> str:
    """A version's files but the manifest, written to `folder`; the model file's sha256."""
    import mlflow.sklearn
    from mlflow.models import infer_signature

    rows = example[model.features]
    mlflow.sklearn.save_model(
        model.pipeline,
        str(folder),
        serialization_format="cloudpickle",
        signature=infer_signature(rows, model.pipeline.predict(rows)),
        input_example=rows,
        conda_env=serving_environment(),
    )
    fields = {
        f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name != "pipeline"
    }
    (folder / MODEL_FIELDS).write_bytes(_json(fields))
    return hashlib.sha256((folder / MODEL_FILE).read_bytes()).hexdigest()


def _json(value: Any) -> bytes:
    def plain(item: Any) -> Any:
        if hasattr(item, "item"):  # numpy scalars
            return item.item()
        return str(item)

    # Strict JSON, as the lake's: MLflow's UI, jq and other clients read these files, and a
    # metric the hold-out could not define (NaN) is no JSON they take.
    return json_text(value, default=plain).encode()


class ModelRegistry:
    """Versions and aliases of one dataset's models, in MLflow's registry."""

    def __init__(self, stores: MlflowStores, dataset: str):
        self.stores = stores
        self.name = dataset
        # The model versions this registry created, whole by construction: an alias moves to
        # them without reading their files back.
        self._created: dict[str, str] = {}

    @property
    def client(self) -> Any:
        """The MLflow client of the stores."""
        return self.stores.client()

    def _search(self, condition: str = "") -> list["ModelVersion"]:
        """The dataset's READY model versions (matching `condition`), oldest first."""
        found = self.client.search_model_versions(f"name='{self.name}'{condition}")
        ready = [mv for mv in found if mv.status == "READY" and VERSION_TAG in mv.tags]
        return sorted(ready, key=lambda mv: int(mv.version))

    def model_version(self, version: str) -> "ModelVersion":
        """The MLflow model version a platform name stands for now (its latest whole one)."""
        matches = self._search(f" and tags.`{VERSION_TAG}`='{version}'")
        if not matches:
            known = ", ".join(self.versions()[-5:]) or "none"
            raise RegistryError(
                f"no version '{version}' of registered model '{self.name}' in "
                f"{self._where()}; latest: {known}"
            )
        return matches[-1]

    def _where(self) -> str:
        return f"MLflow's registry ({self.stores.registry().split('://', 1)[0]})"

    def versions(self) -> list[str]:
        """The platform names of the registered versions, sorted."""
        return sorted({mv.tags[VERSION_TAG] for mv in self._search()})

    def upsert(
        self,
        version: str,
        model: TrainedModel,
        manifest: dict,
        example: "pd.DataFrame",
        run_id: str | None = None,
    ) -> str:
        """Register `model` as a new model version named `version`; the MLflow version number.

        Its files are logged to the training's run `run_id` (else a run of its own), then the
        model version is created from them with its tags: until then the name's previous
        version, if any, is the one that loads.
        """
        from mlflow.entities import Metric

        client = self.client
        # The training's run; none when it was tracked in another store (a reproduction's
        # scratch registry) or not at all: then a run of its own.
        run = self._run(run_id) if run_id is not None else None
        own_run = run is None
        if run is None:
            run = client.create_run(
                self.stores.experiment_id(self.name),
                run_name=f"register {version}",
                tags={f"{TAG}.kind": "registration"},
            )
        run_id = run.info.run_id
        with tempfile.TemporaryDirectory(prefix="ml_platform-register-") as scratch:
            folder = Path(scratch) / "model"
            digest = _save(model, example, folder)
            record = {**manifest, "version": version, "model_sha256": digest}
            (folder / MANIFEST_FILE).write_bytes(_json(record))
            # A folder of its own: the same model registered again (a retry, a rerun) under
            # the same training run never rewrites the files an earlier version points to.
            path = f"model-{digest[:16]}-{uuid.uuid4().hex[:8]}"
            client.log_artifacts(run_id, str(folder), path)
        # The evaluation's metrics of the candidate, beside the training's losses.
        metrics = {
            f"holdout_{name}": float(value)
            for name, value in (manifest.get("metrics") or {}).items()
            if isinstance(value, (int, float)) and math.isfinite(value)
        }
        if metrics:
            client.log_batch(
                run_id,
                metrics=[
                    Metric(key, value, int(time.time() * 1000), 0) for key, value in metrics.items()
                ],
            )
        if own_run:
            client.set_terminated(run_id)
        self._ensure_registered_model()
        tags = {
            VERSION_TAG: version,
            SHA256_TAG: digest,
            **{
                f"{TAG}.{key}": _tag_value(manifest[key])
                for key in (
                    "partition",
                    "kind",
                    "decision",
                    "reason",
                    "run_id",
                    "input_partitions",
                    "input_data_versions",
                    "git_commit",
                    "model_settings",
                )
                if manifest.get(key) is not None
            },
        }
        created = client.create_model_version(
            self.name,
            f"{run.info.artifact_uri}/{path}",
            run_id=run_id,
            tags=tags,
            description=f"{version}: {manifest.get('decision', 'registered')}",
        )
        self._created[version] = str(created.version)
        return str(created.version)

    def _run(self, run_id: str) -> Any:
        """The MLflow run `run_id` of the store, or None if it has none of that id.

        A run a person deleted (MLflow's UI) takes no more artifacts: as good as none.
        """
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code != NOT_FOUND:
                raise
            return None
        return None if run.info.lifecycle_stage == "deleted" else run

    def _ensure_registered_model(self) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(self.name)
        except MlflowException as exc:
            if exc.error_code != NOT_FOUND:
                raise
            try:
                self.client.create_registered_model(
                    self.name,
                    tags={f"{TAG}.dataset": self.name},
                    description=f"The {self.name} dataset's models, one version a candidate.",
                )
            except MlflowException as refused:
                # Created by another process meanwhile. Else the creation's own error says why
                # (a read-only store, a permission), not the lookup's "not found".
                try:
                    self.client.get_registered_model(self.name)
                except MlflowException:
                    raise refused from None

    def _fetch(self, found: "ModelVersion", scratch: str) -> tuple[Path | None, str | None]:
        """A version's files downloaded to `scratch`, or None and why they cannot be read.

        An outage (`transient`) is raised as it is: the step's retry policy tries again and
        the failure is classed as transient, not the version as damaged.
        """
        from mlflow.artifacts import download_artifacts

        try:
            local = download_artifacts(
                artifact_uri=found.source, dst_path=scratch, tracking_uri=self.stores.tracking()
            )
        except Exception as exc:
            if transient(exc):
                raise
            return None, f"{type(exc).__name__}: {exc}"
        return Path(local), None

    def _damage(self, local: Path, found: "ModelVersion") -> dict[str, str]:
        """What is wrong with each damaged file of a downloaded version (none: it is whole)."""
        damage: dict[str, str] = {}
        model_file = local / MODEL_FILE
        if not model_file.is_file():
            damage[MODEL_FILE] = "is missing"
        elif hashlib.sha256(model_file.read_bytes()).hexdigest() != found.tags.get(SHA256_TAG):
            damage[MODEL_FILE] = "does not match its checksum"
        # The files a version loads with beside the model: without one it is as damaged as a
        # model file that fails its checksum, which no retry changes.
        for name in LOADED_WITH:
            if not (local / name).is_file():
                damage[name] = "is missing"
            elif name.endswith(".json"):
                try:
                    from_json_text((local / name).read_text())
                except ValueError as exc:
                    damage[name] = f"is not JSON ({exc})"
        return damage

    def _damaged(
        self, version: str, found: "ModelVersion", what: str, rerun: bool = True
    ) -> DamagedVersionError:
        """The error of a damaged version; `rerun`: whether rerunning its day can restore it."""
        backup = (
            "restore them from a backup of the registry's artifact store "
            "(docs/runbook.md#a-registered-models-files-are-lost)"
        )
        day = registered_on(version)
        way_out = (
            f"Rerun registered_model for {day} (its Materialize in the UI, or `dagster asset "
            f"materialize -m ml_platform.definitions --select {self.name}/registered_model "
            f"--partition {day}`): it writes the files again from the stored model of "
            f"{version_day(version)} when that is the registered model (same checksum); else "
            f"{backup}"
            if rerun
            else backup[0].upper() + backup[1:]
        )
        return DamagedVersionError(
            f"version '{version}' (model version {found.version} of '{self.name}') is in the "
            f"registry but is damaged: {what}. {way_out}"
        )

    def _download(self, version: str, scratch: str) -> tuple[Path, "ModelVersion"]:
        """The files of a whole version, in `scratch`; RegistryError if it is not whole."""
        found = self.model_version(version)
        local, unreadable = self._fetch(found, scratch)
        if local is None:
            raise self._damaged(version, found, f"{found.source} cannot be read ({unreadable})")
        damage = self._damage(local, found)
        if damage:
            raise self._damaged(
                version,
                found,
                "; ".join(f"{found.source}/{name} {what}" for name, what in damage.items()),
            )
        return local, found

    def restore(
        self,
        version: str,
        source: Callable[[], tuple[TrainedModel, "pd.DataFrame"]],
        manifest: dict | None,
    ) -> list[str]:
        """Write again the lost or damaged files of `version`; the names written (none: whole).

        `source()` gives the model and an input example to write them from, asked for only
        when the version is damaged. Only from the model registered: its file must have the
        registered sha256, else DamagedVersionError says so and nothing is written. Files the
        version still holds whole are left as they are; the lineage manifest, when lost, is
        `manifest` (what the day's record of registered_model kept), else DamagedVersionError.
        The files go where the model version's source points (MLflow's record of a version
        never changes), through its run, and the version is read back whole before this
        returns.
        """
        found = self.model_version(version)
        with tempfile.TemporaryDirectory(prefix="ml_platform-restore-") as scratch:
            (Path(scratch) / "found").mkdir()
            local, unreadable = self._fetch(found, str(Path(scratch) / "found"))
            damage = (
                self._damage(local, found)
                if local is not None
                else dict.fromkeys((MODEL_FILE, *LOADED_WITH), f"cannot be read ({unreadable})")
            )
            if not damage:
                return []
            folder = Path(scratch) / "model"
            digest = _save(*source(), folder)
            if digest != found.tags.get(SHA256_TAG):
                raise self._damaged(
                    version,
                    found,
                    f"{found.source}/{MODEL_FILE} {damage.get(MODEL_FILE, 'is damaged')}, and the "
                    f"stored model of {version_day(version)} is not the registered one (its "
                    f"sha256 {digest[:12]}, registered {str(found.tags.get(SHA256_TAG))[:12]}: "
                    "it was materialised again since), so it cannot be written from it",
                    rerun=False,
                )
            if MANIFEST_FILE in damage:
                if manifest is None:
                    raise self._damaged(
                        version,
                        found,
                        f"{found.source}/{MANIFEST_FILE} {damage[MANIFEST_FILE]}, and no record "
                        "of registered_model keeps its lineage manifest to write it from",
                        rerun=False,
                    )
                record = {**manifest, "version": version, "model_sha256": digest}
                (folder / MANIFEST_FILE).write_bytes(_json(record))
            # Every damaged file, and the flavour's others only where they are gone: nothing
            # whole is written over.
            written = sorted(
                p.name
                for p in folder.iterdir()
                if p.name in damage or local is None or not (local / p.name).exists()
            )
            for path in folder.iterdir():
                if path.name not in written:
                    path.unlink()
            # The files go through the version's run: a run deleted, or a source outside its
            # artifacts (a version registered by hand), leaves MLflow's client no way there.
            run = self._run(found.run_id) if found.run_id else None
            base = run.info.artifact_uri.rstrip("/") + "/" if run is not None else ""
            where = found.source or ""
            if not base or not where.startswith(base):
                raise self._damaged(
                    version,
                    found,
                    f"{', '.join(damage)} lost, and {found.source} is not under the artifacts "
                    f"of a live MLflow run ({found.run_id}), where MLflow's client can write "
                    "them again",
                    rerun=False,
                )
            self.client.log_artifacts(found.run_id, str(folder), where[len(base) :])
        with tempfile.TemporaryDirectory(prefix="ml_platform-restored-") as scratch:
            self._download(version, scratch)
        return written

    def _read_json(self, local: Path, name: str, version: str, found: "ModelVersion") -> Any:
        """A JSON file of a downloaded version; RegistryError if it is cut short or not JSON."""
        try:
            return from_json_text((local / name).read_text())
        except ValueError as exc:
            raise self._damaged(
                version, found, f"{found.source}/{name} is not JSON ({exc})"
            ) from exc

    def manifest(self, version: str) -> dict:
        """The lineage manifest of a whole version; RegistryError if there is none."""
        with tempfile.TemporaryDirectory(prefix="ml_platform-manifest-") as scratch:
            local, found = self._download(version, scratch)
            return dict(self._read_json(local, MANIFEST_FILE, version, found))

    def load(self, version: str) -> TrainedModel:
        """The model of a whole version; RegistryError saying why when it is absent or damaged."""
        import mlflow.sklearn

        with tempfile.TemporaryDirectory(prefix="ml_platform-load-") as scratch:
            local, found = self._download(version, scratch)
            fields = self._read_json(local, MODEL_FIELDS, version, found)
            pipeline = mlflow.sklearn.load_model(str(local))
        if fields.get("initial_loss") is None:
            fields["initial_loss"] = math.nan
        return TrainedModel(pipeline=pipeline, **fields)

    def alias(self, name: str) -> str | None:
        """The platform name of the version an alias points to now, if any."""
        return self.aliases().get(name)

    def _alias_numbers(self) -> dict[str, str]:
        """The MLflow version number each alias points at now (none: not set)."""
        from mlflow.exceptions import MlflowException

        try:
            numbers = self.client.get_registered_model(self.name).aliases
        except MlflowException as exc:
            if exc.error_code != NOT_FOUND:
                raise
            return {}  # nothing registered yet
        return {alias: str(number) for alias, number in numbers.items()}

    def aliases(self) -> dict[str, str | None]:
        """Where each alias points now (platform names; None: nowhere).

        An alias a person pointed at a version registered outside the platform (no platform
        name) is described as such: the registry step then warns and moves it back.
        """
        numbers = self._alias_numbers()
        found: dict[str, str | None] = dict.fromkeys(ALIASES)
        for alias in ALIASES:
            if alias in numbers:
                tags = self.client.get_model_version(self.name, numbers[alias]).tags
                found[alias] = tags.get(
                    VERSION_TAG, f"model version {numbers[alias]} (registered outside the platform)"
                )
        return found

    def set_alias(self, name: str, version: str) -> None:
        """Point an alias at a whole version; RegistryError if the version is not whole."""
        self.set_aliases({name: version})

    def set_aliases(self, aliases: dict[str, str | None]) -> None:
        """Point every alias as given (None: at nothing); a no-op where they do already.

        Compared by MLflow version number, not by platform name: a day registered again (a
        retry after the aliases moved, a corrected day rerun) has a newer version of the same
        name, which the name now loads, and the alias must follow it. Each version named must
        be whole: RegistryError names the alias and why otherwise.
        """
        unknown = set(aliases) - set(ALIASES)
        if unknown:
            raise ValueError(f"unknown alias(es) {sorted(unknown)}; aliases are {ALIASES}")
        current = self._alias_numbers()
        targets: dict[str, str | None] = {}
        for name, version in aliases.items():
            if version is None:
                if name in current:
                    targets[name] = None
                continue
            if version in self._created:
                targets[name] = self._created[version]
                continue
            try:
                latest = self.model_version(version)
                if current.get(name) == str(latest.version):
                    continue  # already there: the version was whole when the alias moved
                with tempfile.TemporaryDirectory(prefix="ml_platform-alias-") as scratch:
                    _, found = self._download(version, scratch)
            except RegistryError as exc:
                raise RegistryError(f"cannot point '{name}' at version '{version}': {exc}") from exc
            targets[name] = str(found.version)
        targets = {name: n for name, n in targets.items() if n is None or current.get(name) != n}
        for name, number in targets.items():
            if number is None:
                self.client.delete_registered_model_alias(self.name, name)
            else:
                self.client.set_registered_model_alias(self.name, name, number)


class ModelRegistryResource(dg.ConfigurableResource):
    """The model registry as a resource: each dataset's registered model in MLflow.

    registered_model (the one writer of the aliases) and champion_performance (which reads the
    champion a day was served by) take it as a parameter, so the UI lists the registry among
    what they use, and a test or `ml-platform reproduce` hands them another registry.
    """

    stores: MlflowStores

    def for_dataset(self, dataset: str) -> ModelRegistry:
        """The registry of one dataset's models."""
        return ModelRegistry(self.stores, dataset)


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def environment_manifest() -> dict:
    """Code and environment a model was built with: commit, lock, Python, packages, image."""
    settings = Settings()
    commit = settings.git_commit or _git("rev-parse", "HEAD") or "unknown"
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no")) if commit else None
    lock = Path(__file__).resolve().parents[2] / "uv.lock"
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else None,
        "python": platform.python_version(),
        "packages": {name: importlib.metadata.version(name) for name in KEY_PACKAGES},
        "container_image": settings.image_tag,
    }
