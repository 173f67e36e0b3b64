"""The model registry, kept in the platform's lake storage next to the data it came from.

Layout under `<dataset>/registry/`: `versions/<version>/model.joblib` and `manifest.json`,
`aliases.json` (where each alias points now) and `alias_history.json` (every move of an alias,
never rewritten, only extended), which answers "which version was champion on date X".
Versions are named after what they are (`daily-2013-01-28`), so registering the model of a day
again replaces that version instead of adding one.
"""

import datetime as dt
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from ml_platform.storage import LakeStorage, deserialise, serialise
from ml_platform.training.model import TrainedModel

ALIASES = ("champion", "challenger")
KEY_PACKAGES = ("dagster", "pandas", "numpy", "scikit-learn", "great-expectations", "scipy")


class RegistryError(LookupError):
    """A version or alias asked for is not in the registry."""


class ModelRegistry:
    """Versions and aliases of one dataset's models."""

    def __init__(self, storage: LakeStorage, dataset: str):
        self.storage = storage
        self.prefix = f"{dataset}/registry"

    def _json(self, key: str, default: Any) -> Any:
        full = f"{self.prefix}/{key}"
        return json.loads(self.storage.read_bytes(full)) if self.storage.exists(full) else default

    def _write_json(self, key: str, value: Any) -> None:
        self.storage.write_bytes(f"{self.prefix}/{key}", serialise(value, "json"))

    def versions(self) -> list[str]:
        """Registered version names, sorted."""
        keys = self.storage.list_keys(f"{self.prefix}/versions")
        return sorted({k.split("/")[-2] for k in keys if k.endswith("/manifest.json")})

    def upsert(self, version: str, model: TrainedModel, manifest: dict) -> None:
        """Store a version, replacing a previous one of the same name (never a second copy)."""
        base = f"versions/{version}"
        self.storage.write_bytes(f"{self.prefix}/{base}/model.joblib", serialise(model, "joblib"))
        self._write_json(f"{base}/manifest.json", {**manifest, "version": version})

    def manifest(self, version: str) -> dict:
        """The lineage manifest of a version."""
        found = self._json(f"versions/{version}/manifest.json", None)
        if found is None:
            raise RegistryError(f"no version '{version}' in {self.storage.uri(self.prefix)}")
        return dict(found)

    def load(self, version: str) -> TrainedModel:
        """The model of a version."""
        key = f"{self.prefix}/versions/{version}/model.joblib"
        if not self.storage.exists(key):
            raise RegistryError(f"no version '{version}' in {self.storage.uri(self.prefix)}")
        model: TrainedModel = deserialise(self.storage.read_bytes(key), "joblib")
        return model

    def alias(self, name: str) -> str | None:
        """The version an alias points to now, if any."""
        value = self._json("aliases.json", {}).get(name)
        return str(value) if value is not None else None

    def champion_to_beat(self, candidate: str) -> str | None:
        """The champion a candidate version competes with.

        When the candidate already is the champion (its day is being re-run), it competes with
        the champion it replaced, so a re-run reaches the same verdict as the first run.
        """
        current = self.alias("champion")
        if current != candidate:
            return current
        moves = [h for h in self.history() if h["alias"] == "champion" and h["version"] == current]
        return moves[-1]["previous"] if moves else None

    def load_alias(self, name: str) -> TrainedModel:
        """The model an alias points to."""
        version = self.alias(name)
        if version is None:
            raise RegistryError(f"alias '{name}' points to no version yet")
        return self.load(version)

    def set_alias(self, name: str, version: str, *, partition: str, run_id: str, reason: str):
        """Point an alias at a version and record the move; a no-op if it already points there."""
        if name not in ALIASES:
            raise ValueError(f"unknown alias '{name}'; aliases are {', '.join(ALIASES)}")
        aliases = self._json("aliases.json", {})
        if aliases.get(name) == version:
            return
        history = self.history()
        history.append(
            {
                "alias": name,
                "version": version,
                "previous": aliases.get(name),
                "at": dt.datetime.now(dt.UTC).isoformat(),
                "partition": partition,
                "run_id": run_id,
                "reason": reason,
            }
        )
        self._write_json("alias_history.json", history)
        self._write_json("aliases.json", {**aliases, name: version})

    def history(self) -> list[dict]:
        """Every move of every alias, oldest first."""
        return list(self._json("alias_history.json", []))

    def alias_at(self, name: str, when: dt.datetime) -> str | None:
        """The version an alias pointed to at a moment (UTC), from the history."""
        current = None
        for entry in self.history():
            if entry["alias"] == name and dt.datetime.fromisoformat(entry["at"]) <= when:
                current = entry["version"]
        return current


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def environment_manifest() -> dict:
    """Code and environment a model was built with: commit, lock, Python, packages, image."""
    commit = os.environ.get("ML_PLATFORM_GIT_COMMIT") or _git("rev-parse", "HEAD") or "unknown"
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no")) if commit else None
    lock = Path(__file__).resolve().parents[2] / "uv.lock"
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else None,
        "python": platform.python_version(),
        "packages": {name: importlib.metadata.version(name) for name in KEY_PACKAGES},
        "container_image": os.environ.get("ML_PLATFORM_IMAGE_TAG"),
    }
