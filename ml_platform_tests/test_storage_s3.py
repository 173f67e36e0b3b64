"""Lake storage behaves the same on a local directory and on a real S3 API server (moto).

Also: the settings pick each backend (one `S3Resource` for lake and landing) and name the
variable when its value is wrong, and the IO manager stores partitions through S3 like through a
directory.
"""

import os
import subprocess
import sys
from typing import Any

import dagster as dg
import pandas as pd
import pytest
from dagster_aws.s3 import S3Resource

from ml_platform.platform.formats import deserialise
from ml_platform.platform.inputs import DailyInput
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.locations import lake_storage
from ml_platform.platform.s3 import S3Storage
from ml_platform.platform.settings import Settings
from ml_platform.platform.storage import LakeStorage, LocalStorage
from ml_platform_tests.services import FAKE_AWS, s3_test_client

BUCKET = "lake-bucket"


@pytest.fixture
def aws_env(monkeypatch):
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path, aws_env) -> LakeStorage:
    if request.param == "local":
        return LocalStorage(base_dir=str(tmp_path / "lake"))
    endpoint = request.getfixturevalue("s3_server")
    s3_test_client(endpoint).create_bucket(Bucket=BUCKET)
    return S3Storage(url=f"s3://{BUCKET}/prod/lake", s3=S3Resource(endpoint_url=endpoint))


def test_write_read_replace_delete(storage):
    key = "flights/raw_data/2013-01-01.parquet"
    assert not storage.exists(key)

    storage.write_bytes(key, b"first")
    storage.write_bytes(key, b"second")

    assert storage.exists(key)
    assert storage.read_bytes(key) == b"second"
    storage.delete(key)
    storage.delete(key)  # deleting what is gone is not an error
    assert not storage.exists(key)


def test_reading_a_missing_object_names_it(storage):
    with pytest.raises(FileNotFoundError, match="nothing/here.json"):
        storage.read_bytes("nothing/here.json")


def test_write_with_streams_an_object_whole_and_open_read_reads_it(storage):
    key = "d/validated_data/2024-01-01.parquet"
    storage.write_bytes(key, b"previous")

    def failing(handle):
        handle.write(b"half of")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        storage.write_with(key, failing)
    assert storage.read_bytes(key) == b"previous"  # a failed write leaves the old version
    assert storage.list_keys("d/validated_data") == [key]

    assert storage.write_with(key, lambda handle: handle.write(b"new content")) == 11
    with storage.open_read(key) as handle:
        assert handle.read() == b"new content"
        handle.seek(4)  # parquet readers seek
        assert handle.read(7) == b"content"
    with (
        pytest.raises(FileNotFoundError, match="nothing/here.parquet"),
        storage.open_read("nothing/here.parquet"),
    ):
        pass


def test_a_frame_round_trips_through_the_io_manager_unchanged(storage):
    io_manager = LakeIOManager(storage=storage)
    frame = pd.DataFrame(
        {
            "when": pd.to_datetime(["2024-01-01 10:00", None, "2024-01-01 12:30"]),
            "x": [1.5, float("nan"), 3.0],
            "n": pd.array([1, None, 3], dtype="Int64"),
            "label": pd.array([0, 1, None], dtype="Int8"),
            "segment": pd.array(["a", None, "c"], dtype="str"),
        }
    )
    key = io_manager.version_key(dg.AssetKey(["d", "t"]), "2024-01-01", "parquet", "run-0")
    metadata = io_manager.store_at(key, "parquet", frame)

    loaded = io_manager.load_key(metadata["lake_key"], "parquet")
    pd.testing.assert_frame_equal(loaded, frame)
    assert metadata["stored_bytes"] == len(storage.read_bytes("d/t/2024-01-01/run-0.parquet"))


def test_list_keys_is_a_sorted_folder_listing_without_dot_files(storage):
    for key in ["d/registry/versions/v2/m.json", "d/registry/versions/v1/m.json", "d/other.json"]:
        storage.write_bytes(key, b"{}")
    storage.write_bytes("d/registry/versions/v1/.m.json.tmp", b"")
    storage.write_bytes("d/registry_old/x.json", b"{}")  # shares the prefix, not the folder

    assert storage.list_keys("d/registry") == [
        "d/registry/versions/v1/m.json",
        "d/registry/versions/v2/m.json",
    ]
    assert storage.list_keys("d/registry/") == storage.list_keys("d/registry")
    assert storage.list_keys("absent") == []


def test_s3_objects_live_below_the_prefix(s3_server, aws_env):
    s3_test_client(s3_server).create_bucket(Bucket=BUCKET)
    storage = S3Storage(url=f"s3://{BUCKET}/prod/lake/", s3=S3Resource(endpoint_url=s3_server))

    storage.write_bytes("d/a.json", b"{}")

    assert storage.uri("d/a.json") == f"s3://{BUCKET}/prod/lake/d/a.json"
    listed = s3_test_client(s3_server).list_objects_v2(Bucket=BUCKET)["Contents"]
    assert [o["Key"] for o in listed] == ["prod/lake/d/a.json"]


def test_s3_errors_other_than_a_missing_key_are_raised(s3_server, aws_env):
    storage = S3Storage(url="s3://no-such-bucket/lake", s3=S3Resource(endpoint_url=s3_server))
    with pytest.raises(Exception, match="NoSuchBucket"):
        storage.write_bytes("d/a.json", b"{}")


def test_the_io_manager_stores_partitions_in_s3(s3_server, aws_env):
    s3_test_client(s3_server).create_bucket(Bucket=BUCKET)
    lake = S3Storage(url=f"s3://{BUCKET}/lake", s3=S3Resource(endpoint_url=s3_server))
    daily = dg.DailyPartitionsDefinition(start_date="2024-01-01")

    @dg.asset(key_prefix="d", partitions_def=daily, metadata={"ml_platform/format": "parquet"})
    def numbers(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return pd.DataFrame({"day": [context.partition_key], "n": [1]})

    @dg.asset(
        key_prefix="d",
        partitions_def=daily,
        metadata={"ml_platform/format": "json"},
        ins={"numbers": dg.AssetIn(["d", "numbers"])},
    )
    def total(context: dg.AssetExecutionContext, numbers: Any) -> dict:
        # As the platform's assets do: a partitioned input is a `DailyInput`, read per day.
        assert isinstance(numbers, DailyInput)
        return {"n": int(numbers.for_day(context.partition_key)["n"].sum())}

    result = dg.materialize(
        [numbers, total],
        partition_key="2024-01-02",
        resources={"io_manager": LakeIOManager(storage=lake)},
    )

    assert result.success
    # Each day's version is an object of its own, which its materialisation names.
    [materialization] = result.asset_materializations_for_node("d__numbers")
    key = str(materialization.metadata["lake_key"].value)
    assert key.startswith(f"d/numbers/2024-01-02/{result.run_id}-")
    assert materialization.metadata["path"].value == f"s3://{BUCKET}/lake/{key}"
    assert deserialise(lake.read_bytes(key), "parquet")["day"].tolist() == ["2024-01-02"]
    [total_record] = result.asset_materializations_for_node("d__total")
    total_key = str(total_record.metadata["lake_key"].value)
    assert deserialise(lake.read_bytes(total_key), "json") == {"n": 1}


def test_a_code_location_without_s3_never_imports_the_s3_backend_nor_mlflow(tmp_path):
    # Every run, code server and command loads the definitions: dagster_aws costs each of
    # them about 1.5 s of CPU, which only an S3 lake or landing zone uses; MLflow about 2 s,
    # which only the steps that train and register use (the webserver and daemon never).
    code = (
        "import sys\n"
        "from ml_platform.contracts import load_contracts\n"
        "from ml_platform.definitions import build_definitions\n"
        "from ml_platform.platform.settings import Settings\n"
        "defs = build_definitions(load_contracts(), Settings())\n"
        "assert 'lake' in defs.resources and 's3' not in defs.resources, defs.resources\n"
        "unused = ('dagster_aws', 'boto3', 'mlflow')\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in unused]\n"
        "assert not loaded, loaded\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ML_PLATFORM_")}
    env.update(ML_PLATFORM_LAKE_DIR=str(tmp_path / "lake"), ML_PLATFORM_LANDING_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def test_the_settings_choose_each_backend_and_share_one_s3_resource(tmp_path):
    from ml_platform.contracts import load_contract
    from ml_platform.definitions import build_definitions

    local = Settings({"ML_PLATFORM_LAKE_DIR": str(tmp_path), "ML_PLATFORM_LANDING_DIR": "x"})
    resources = build_definitions(load_contract("synthetic"), local).resources
    assert isinstance(resources["lake"], LocalStorage)
    assert resources["lake"].base_dir == dg.EnvVar("ML_PLATFORM_LAKE_DIR")

    env = {
        "ML_PLATFORM_LAKE_URL": "s3://bucket/lake",
        "ML_PLATFORM_LANDING_URL": "s3://deliveries/daily",
        "ML_PLATFORM_S3_ENDPOINT_URL": "http://127.0.0.1:9",
    }
    resources = build_definitions(load_contract("synthetic"), Settings(env)).resources
    lake, landing, s3 = resources["lake"], resources["landing"], resources["s3"]
    assert isinstance(lake, S3Storage) and isinstance(s3, S3Resource)
    # Configured by variable name: the UI and the run config show names, not values.
    assert isinstance(lake.url, dg.EnvVar) and lake.url.env_var_name == "ML_PLATFORM_LAKE_URL"
    assert s3.endpoint_url == dg.EnvVar("ML_PLATFORM_S3_ENDPOINT_URL")
    # One S3 configuration: both locations reach S3 through the same resource.
    assert lake.s3 is s3 and landing.s3 is s3
    assert resources["io_manager"].storage is lake
    # MLflow keeps its artifacts in the same lake, on S3 too, and the model step and the
    # registry share its stores.
    mlflow = resources["mlflow"]
    assert resources["model_registry"].stores is mlflow and mlflow.lake is lake
    assert s3.region_name is None  # unset: the boto3 chain's region


@pytest.mark.parametrize("url", ["/data/lake", "s3://", "gs://bucket/lake"])
def test_a_bad_lake_url_names_the_variable(url):
    from ml_platform.contracts import load_contract
    from ml_platform.definitions import build_definitions

    settings = Settings({"ML_PLATFORM_LAKE_URL": url})
    with pytest.raises(ValueError, match="ML_PLATFORM_LAKE_URL.*ML_PLATFORM_LAKE_DIR"):
        build_definitions(load_contract("synthetic"), settings)


def test_an_s3_lake_resolves_its_client_from_the_environment(monkeypatch, s3_server, aws_env):
    from ml_platform.cli import configured

    s3_test_client(s3_server).create_bucket(Bucket=BUCKET)
    monkeypatch.setenv("ML_PLATFORM_LAKE_URL", f"s3://{BUCKET}/lake")
    monkeypatch.setenv("ML_PLATFORM_S3_ENDPOINT_URL", s3_server)
    settings = Settings()
    storage = lake_storage(settings.lake, settings)

    with configured(storage) as lake:
        lake.write_bytes("d/a.json", b"{}")
        assert lake.s3.endpoint_url == s3_server

    listed = s3_test_client(s3_server).list_objects_v2(Bucket=BUCKET)["Contents"]
    assert [o["Key"] for o in listed] == ["lake/d/a.json"]
