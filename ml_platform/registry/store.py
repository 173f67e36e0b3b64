"""The model registry, kept in the platform's lake storage next to the data it came from.

Layout under `<dataset>/registry/`: `versions/<version>/model-<sha256>.joblib` and
`manifest.json`, and `aliases.json` (where each alias points now). Versions are named after
what they are (`daily-2013-01-28`, `full-2013-01-28`), so registering the model of a day again
replaces that version instead of adding one. One writer moves the aliases: registered_model,
which walks the days in date order (`ml_platform.registry.assets`). The history of the aliases
is Dagster's record of registered_model (each day's materialisation says what it moved and
what the aliases were after it, `ml_platform.registry.chain`); the registry keeps no second one.

A version is whole or absent. Its manifest is its commit record: written last, in one write
(an atomic rename on a directory, one PUT on S3, neither of which has a multi-object commit),
and it names the model object with its checksum. The model object is named by its content, so
registering a version again never touches the bytes the committed manifest points to until the
new manifest replaces it. A version without a manifest, or whose manifest names a model that is
missing or does not match its checksum, is invisible to `versions()` and refused by `load` and
`set_alias`. Versions written before this layout (`model.joblib` beside a manifest without a
model entry) still load.
"""

import hashlib
import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import dagster as dg

from ml_platform.platform.formats import deserialise, serialise
from ml_platform.platform.settings import Settings
from ml_platform.platform.storage import LakeStorage
from ml_platform.platform.storage_errors import LakeStorageError, storage_error
from ml_platform.training.model import TrainedModel

ALIASES = ("champion", "challenger")
KEY_PACKAGES = ("dagster", "pandas", "numpy", "scikit-learn", "great-expectations", "scipy")
MANIFEST = "manifest.json"
# The model object of versions registered before manifests named their model.
LEGACY_MODEL = "model.joblib"
# Manifest entries that make it the version's commit record.
MODEL_OBJECT = "model_object"
MODEL_SHA256 = "model_sha256"


def version_day(version: str) -> str:
    """The day of a version's data: `daily-2013-01-28` and `full-2013-01-28` are 2013-01-28."""
    return version.split("-", 1)[1]


class RegistryError(LookupError):
    """A version or alias asked for is not in the registry, or not whole."""


class RegistryStorageError(LakeStorageError):
    """The lake failed to read or write a registry object; the message names it and the version.

    A `LakeStorageError` (with the cause's errno when it had one), so out-of-disk still reads as
    `[Errno 28]` to the failure classifier, the step adds its asset and day, and a full disk or
    a refused permission fails it at once (`storage_errors.partition_errors`).
    """


def _is_model_object(name: str) -> bool:
    return name == LEGACY_MODEL or (name.startswith("model-") and name.endswith(".joblib"))


class ModelRegistry:
    """Versions and aliases of one dataset's models."""

    def __init__(self, storage: LakeStorage, dataset: str):
        self.storage = storage
        self.prefix = f"{dataset}/registry"

    def _key(self, version: str, name: str) -> str:
        return f"{self.prefix}/versions/{version}/{name}"

    def _failed(self, doing: str, key: str, version: str | None, exc: Exception) -> OSError:
        """The storage error of `exc`, naming the object and the version it belongs to."""
        of = f" of version '{version}'" if version is not None else ""
        # The backend's error already names the object; the reason is its cause's.
        cause = exc.__cause__ if isinstance(exc, LakeStorageError) and exc.__cause__ else exc
        return storage_error(doing, f"{self.storage.uri(key)}{of}", cause, RegistryStorageError)

    def _read(self, key: str, version: str | None = None) -> bytes:
        try:
            return self.storage.read_bytes(key)
        except Exception as exc:
            raise self._failed("reading", key, version, exc) from exc

    def _write(self, key: str, data: bytes, version: str | None = None) -> None:
        try:
            self.storage.write_bytes(key, data)
        except Exception as exc:
            raise self._failed("writing", key, version, exc) from exc

    def _exists(self, key: str, version: str | None = None) -> bool:
        try:
            return self.storage.exists(key)
        except Exception as exc:
            raise self._failed("looking up", key, version, exc) from exc

    def _json(self, key: str, default: Any) -> Any:
        full = f"{self.prefix}/{key}"
        return json.loads(self._read(full)) if self._exists(full) else default

    def _write_json(self, key: str, value: Any) -> None:
        self._write(f"{self.prefix}/{key}", serialise(value, "json"))

    def _objects(self, version: str) -> set[str]:
        """Names of the objects stored under a version, whole or not."""
        folder = f"{self.prefix}/versions/{version}"
        try:
            keys = self.storage.list_keys(folder)
        except Exception as exc:
            raise self._failed("listing", folder, version, exc) from exc
        return {k.rsplit("/", 1)[-1] for k in keys}

    def versions(self) -> list[str]:
        """Registered whole versions, sorted: a manifest and a model object (see the module)."""
        folder = f"{self.prefix}/versions"
        try:
            keys = self.storage.list_keys(folder)
        except Exception as exc:
            raise self._failed("listing", folder, None, exc) from exc
        names: dict[str, set[str]] = {}
        for key in keys:
            parts = key[len(folder) + 1 :].split("/")
            if len(parts) == 2:
                names.setdefault(parts[0], set()).add(parts[1])
        return sorted(
            v
            for v, found in names.items()
            if MANIFEST in found and any(map(_is_model_object, found))
        )

    def upsert(self, version: str, model: TrainedModel, manifest: dict) -> None:
        """Store a version whole, replacing a previous one of the same name (never a second copy).

        The model object first, under a name of its content, then the manifest naming it: until
        the manifest is written the version is absent (or still the previous one). A failed
        write removes what it wrote, and raises naming the object and the version.
        """
        data = serialise(model, "joblib")
        digest = hashlib.sha256(data).hexdigest()
        model_name = f"model-{digest[:16]}.joblib"
        model_key = self._key(version, model_name)
        before = self._objects(version)
        record = {**manifest, "version": version, MODEL_OBJECT: model_name, MODEL_SHA256: digest}
        try:
            if model_name not in before:
                self._write(model_key, data, version)
            self._write(self._key(version, MANIFEST), serialise(record, "json"), version)
        except BaseException as exc:
            # The previous manifest, if any, still names its own (older) model object.
            if model_name not in before:
                self._discard(model_key, version, exc)
            raise
        # Model objects no manifest names any more: the replaced one, and leftovers of writes
        # that were cut short (a killed process cannot clean up after itself).
        for name in before - {model_name, MANIFEST}:
            if _is_model_object(name):
                self._discard(self._key(version, name), version, None)

    def _discard(self, key: str, version: str, failure: BaseException | None) -> None:
        try:
            self.storage.delete(key)
        except Exception as exc:
            error = self._failed("removing", key, version, exc)
            if failure is None:
                raise error from exc
            # The write's own error is the one to raise; the leftover is not a version (no
            # manifest names it) and the next registration of the version removes it.
            failure.add_note(f"also left behind: {error}")

    def manifest(self, version: str) -> dict:
        """The lineage manifest of a whole version; RegistryError if there is none."""
        key = self._key(version, MANIFEST)
        if not self._exists(key, version):
            raise RegistryError(self._absent(version))
        return dict(json.loads(self._read(key, version)))

    def _absent(self, version: str) -> str:
        """Why a version cannot be used: never registered, or a write of it never finished."""
        where = self.storage.uri(f"{self.prefix}/versions/{version}")
        known = ", ".join(self.versions()[-5:]) or "none"
        if self._objects(version):
            return (
                f"version '{version}' is incomplete at {where}: its manifest was never written "
                "(the registration failed midway), so it is not a registered version; rerun "
                f"registered_model for its day. Latest registered versions: {known}"
            )
        return f"no version '{version}' in {self.storage.uri(self.prefix)}; latest: {known}"

    def _model_key(self, version: str) -> tuple[str, str | None]:
        """The key of a whole version's model object and its checksum (None: an old version)."""
        manifest = self.manifest(version)
        name = manifest.get(MODEL_OBJECT, LEGACY_MODEL)
        key = self._key(version, name)
        if not self._exists(key, version):
            raise RegistryError(
                f"version '{version}' is incomplete: its manifest names the model object "
                f"{self.storage.uri(key)}, which is missing; rerun registered_model for its day"
            )
        return key, manifest.get(MODEL_SHA256)

    def load(self, version: str) -> TrainedModel:
        """The model of a whole version; RegistryError saying why when it is absent or partial."""
        key, digest = self._model_key(version)
        data = self._read(key, version)
        if digest is not None and hashlib.sha256(data).hexdigest() != digest:
            raise RegistryError(
                f"version '{version}' is damaged: {self.storage.uri(key)} does not match the "
                "checksum in its manifest; rerun registered_model for its day"
            )
        model: TrainedModel = deserialise(data, "joblib")
        return model

    def alias(self, name: str) -> str | None:
        """The version an alias points to now, if any."""
        value = self._json("aliases.json", {}).get(name)
        return str(value) if value is not None else None

    def set_alias(self, name: str, version: str) -> None:
        """Point an alias at a whole version; RegistryError if the version is not whole."""
        self.set_aliases({**self._json("aliases.json", {}), name: version})

    def set_aliases(self, aliases: dict[str, str | None]) -> None:
        """Point every alias as given (None: at nothing), in one write; a no-op if they do.

        Each version named must be whole: RegistryError names the alias and why otherwise.
        """
        unknown = set(aliases) - set(ALIASES)
        if unknown:
            raise ValueError(f"unknown alias(es) {sorted(unknown)}; aliases are {ALIASES}")
        wanted = {name: version for name, version in aliases.items() if version is not None}
        current = self._json("aliases.json", {})
        if wanted == current:
            return
        for name, version in wanted.items():
            if current.get(name) == version:
                continue
            try:
                self._model_key(version)
            except RegistryError as exc:
                raise RegistryError(f"cannot point '{name}' at version '{version}': {exc}") from exc
        self._write_json("aliases.json", wanted)


class ModelRegistryResource(dg.ConfigurableResource):
    """The model registry as a resource: each dataset's versions and aliases in the lake.

    registered_model (the one writer of the aliases) and champion_performance (which reads the
    champion a day was served by) take it as a parameter, so the UI lists the registry among
    what they use, and a test or `ml-platform reproduce` hands them another registry.
    """

    storage: LakeStorage

    def for_dataset(self, dataset: str) -> ModelRegistry:
        """The registry of one dataset's models."""
        return ModelRegistry(self.storage, dataset)


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
