"""Registry versions are whole or absent: a registration that fails midway (disk full, a dropped
S3 connection) leaves no version behind, `versions()`, `load`, aliases and `score --version`
refuse what is not whole, the previous champion keeps serving, and the error names the object."""

import errno
import json
import shutil

import pytest
from dagster_aws.s3 import S3Resource
from pydantic import PrivateAttr

from ml_platform.cli import main
from ml_platform.contracts import load_contract
from ml_platform.platform.s3 import S3Storage
from ml_platform.platform.storage import LakeStorage, LocalStorage
from ml_platform.registry.store import ModelRegistry, RegistryError, version_day
from ml_platform_tests.conftest import Platform
from ml_platform_tests.services import FAKE_AWS, s3_test_client

FIRST, SECOND = "2024-01-01", "2024-01-02"
NEW = f"daily-{SECOND}"


class FullDisk(LocalStorage):
    """A local lake whose disk is full after a given number of further writes.

    Like the real directory backend, a write that runs out of space leaves no file (its temporary
    file is removed) and raises ENOSPC.
    """

    _writes_left: int | None = PrivateAttr(default=None)

    def fill_after(self, writes: int) -> None:
        self._writes_left = writes

    def write_bytes(self, key: str, data: bytes) -> None:
        if self._writes_left is not None:
            if self._writes_left == 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            self._writes_left -= 1
        super().write_bytes(key, data)


class DroppingS3(S3Storage):
    """An S3 lake whose connection drops after a given number of further PUTs."""

    _writes_left: int | None = PrivateAttr(default=None)

    def fill_after(self, writes: int) -> None:
        self._writes_left = writes

    def write_bytes(self, key: str, data: bytes) -> None:
        if self._writes_left is not None:
            if self._writes_left == 0:
                raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
            self._writes_left -= 1
        super().write_bytes(key, data)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A synthetic lake after one day: its champion version, its landed file and its lake dir."""
    root = tmp_path_factory.mktemp("served")
    platform = Platform(load_contract("synthetic"), root)
    platform.land(FIRST, 1)
    assert platform.materialize(FIRST).success
    registry = ModelRegistry(LocalStorage(base_dir=str(platform.lake_dir)), "synthetic")
    assert registry.alias("champion") == f"daily-{FIRST}"
    return platform.lake_dir, platform.landing_dir / f"synthetic_{FIRST}.csv"


@pytest.fixture
def lake(served, tmp_path, monkeypatch):
    """A copy of the served lake, the one `ml-platform score` reads."""
    lake_dir = tmp_path / "lake"
    shutil.copytree(served[0], lake_dir)
    monkeypatch.setenv("ML_PLATFORM_DATASET", "synthetic")
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(lake_dir))
    monkeypatch.delenv("ML_PLATFORM_LAKE_URL", raising=False)
    return lake_dir


def score(landed, tmp_path, capsys, *options: str) -> tuple[int, str, str]:
    code = main(["score", str(landed), "--output", str(tmp_path / "scored.csv"), *options])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("failing", [0, 1], ids=["model-write-fails", "manifest-write-fails"])
def test_a_registration_cut_short_by_a_full_disk_leaves_no_version(
    failing, served, lake, tmp_path, capsys
):
    landed = served[1]
    storage = FullDisk(base_dir=str(lake))
    registry = ModelRegistry(storage, "synthetic")
    champion = registry.alias("champion")
    assert champion is not None
    model, manifest = registry.load(champion), registry.manifest(champion)

    storage.fill_after(failing)
    with pytest.raises(OSError) as raised:
        registry.upsert(NEW, model, {**manifest, "partition": SECOND})

    # The error is the disk's (so it is classed as resource exhaustion) and names what and where.
    assert raised.value.errno == errno.ENOSPC
    message = str(raised.value)
    assert "[Errno 28]" in message and "No space left on device" in message
    written = "model-" if failing == 0 else "manifest.json"
    assert f"{lake.resolve()}/synthetic/registry/versions/{NEW}/{written}" in message
    assert f"version '{NEW}'" in message
    # Nothing that looks like a version is left, and nothing of it is listed or served.
    assert storage.list_keys(f"synthetic/registry/versions/{NEW}") == []
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
    assert code == 0 and f"1000 rows scored by {champion} (champion)" in out


def test_a_half_written_version_of_the_old_layout_is_refused_and_a_whole_one_still_loads(
    served, lake, tmp_path, capsys
):
    landed = served[1]
    storage = LocalStorage(base_dir=str(lake))
    registry = ModelRegistry(storage, "synthetic")
    champion = registry.alias("champion")
    assert champion is not None
    model_bytes = storage.read_bytes(
        f"synthetic/registry/versions/{champion}/{registry.manifest(champion)['model_object']}"
    )
    # What a full disk left before versions had a commit record: a model and no manifest.
    storage.write_bytes(f"synthetic/registry/versions/{NEW}/model.joblib", model_bytes)
    # A whole version of that layout: model.joblib and a manifest that names no model object.
    old = "daily-2023-12-31"
    storage.write_bytes(f"synthetic/registry/versions/{old}/model.joblib", model_bytes)
    storage.write_bytes(
        f"synthetic/registry/versions/{old}/manifest.json",
        json.dumps({"version": old, "partition": "2023-12-31"}).encode(),
    )

    assert registry.versions() == [old, champion]
    code, _, err = score(landed, tmp_path, capsys, "--version", NEW)
    assert code == 2
    assert f"version '{NEW}' is incomplete" in err and "manifest was never written" in err
    with pytest.raises(RegistryError, match="is incomplete"):
        registry.set_alias("challenger", NEW)
    code, out, _ = score(landed, tmp_path, capsys, "--version", old)
    assert code == 0 and f"1000 rows scored by {old} (pinned)" in out

    # Registering the half-written version again makes it whole and clears the old object.
    registry.upsert(NEW, registry.load(old), {"partition": SECOND})
    assert registry.versions() == [old, champion, NEW]
    names = [k.rsplit("/", 1)[-1] for k in storage.list_keys(f"synthetic/registry/versions/{NEW}")]
    assert names == ["manifest.json", registry.manifest(NEW)["model_object"]]


@pytest.fixture(params=["local", "s3"])
def failing_storage(request, tmp_path, monkeypatch) -> LakeStorage:
    if request.param == "local":
        return FullDisk(base_dir=str(tmp_path / "lake"))
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    endpoint = request.getfixturevalue("s3_server")
    s3_test_client(endpoint).create_bucket(Bucket="lake")
    return DroppingS3(url="s3://lake/prod", s3=S3Resource(endpoint_url=endpoint))


def test_replacing_a_version_that_fails_midway_keeps_the_previous_one_whole(failing_storage):
    registry = ModelRegistry(failing_storage, "synthetic")
    # The registry stores whatever joblib serialises; small stand-ins keep this test fast.
    registry.upsert(NEW, {"coef": [1.0]}, {"partition": SECOND, "run_id": "first"})
    registry.set_alias("champion", NEW)

    failing_storage.fill_after(1)
    with pytest.raises(OSError) as raised:
        registry.upsert(NEW, {"coef": [2.0]}, {"partition": SECOND, "run_id": "rerun"})
    assert failing_storage.uri(f"synthetic/registry/versions/{NEW}/manifest.json") in str(
        raised.value
    )

    assert registry.versions() == [NEW]
    assert registry.load(NEW) == {"coef": [1.0]}
    assert registry.manifest(NEW)["run_id"] == "first"
    assert registry.load(registry.alias("champion")) == {"coef": [1.0]}
    folder = f"synthetic/registry/versions/{NEW}"
    assert len(failing_storage.list_keys(folder)) == 2  # its manifest and its one model object

    failing_storage.fill_after(2)
    registry.upsert(NEW, {"coef": [2.0]}, {"partition": SECOND, "run_id": "rerun"})
    assert registry.load(NEW) == {"coef": [2.0]}
    assert registry.manifest(NEW)["run_id"] == "rerun"
    assert len(failing_storage.list_keys(folder)) == 2  # the replaced model object is gone


def test_the_aliases_are_set_together_and_only_to_whole_versions(tmp_path):
    registry = ModelRegistry(LocalStorage(base_dir=str(tmp_path)), "synthetic")
    for day in ("2024-01-01", "2024-01-02"):
        registry.upsert(f"daily-{day}", {"coef": [day]}, {"partition": day})
    registry.set_alias("champion", "daily-2024-01-02")
    registry.set_alias("challenger", "daily-2024-01-01")

    # Back to what a recorded day says: both at once, an alias at nothing cleared.
    registry.set_aliases({"champion": "daily-2024-01-01", "challenger": None})
    assert registry.alias("champion") == "daily-2024-01-01"
    assert registry.alias("challenger") is None
    # Nothing moves to a version that is not whole, and nothing else moves with it.
    with pytest.raises(
        RegistryError, match="cannot point 'challenger' at version 'daily-2024-01-09'"
    ):
        registry.set_aliases({"champion": "daily-2024-01-02", "challenger": "daily-2024-01-09"})
    assert registry.alias("champion") == "daily-2024-01-01"
    with pytest.raises(ValueError, match="unknown alias"):
        registry.set_aliases({"production": "daily-2024-01-01"})
    # No second history of the moves: Dagster's record of registered_model is the history.
    assert sorted(p.name for p in (tmp_path / "synthetic" / "registry").iterdir()) == [
        "aliases.json",
        "versions",
    ]
    assert version_day("full-2024-01-02") == "2024-01-02"
