"""Odd settings and partitions: blank or padded variables, credentials, a far last day."""

import datetime as dt

import dagster as dg
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.platform.locations import lake_storage
from ml_platform.platform.partitions import daily_partitions
from ml_platform.platform.settings import Settings, SettingsError
from ml_platform.platform.storage import LakeStorage
from ml_platform_tests.conftest import bundled_contracts


def stored_in(settings: Settings, monkeypatch) -> str:
    """Where a run's lake resource puts a day: its EnvVars resolved as Dagster resolves them."""
    for name, value in settings.environ.items():
        monkeypatch.setenv(name, value)
    storage = lake_storage(settings.lake, settings)
    seen: list[str] = []

    @dg.asset
    def where(lake: LakeStorage) -> None:
        seen.append(lake.uri("flights/raw_data/2024-01-01"))

    assert dg.materialize([where], resources={"lake": storage}).success
    return seen[0]


@pytest.mark.parametrize("padding", [" {} ", "{}\n", "\t{}"])
def test_a_padded_lake_directory_is_refused_not_read_as_another_directory(
    tmp_path, monkeypatch, padding
):
    # Commands read the value stripped; the run's resource reads the variable as it is set, so
    # a run wrote `<cwd>/ /data/lake /...` while `ml-platform` commands read /data/lake.
    lake = str(tmp_path / "lake")
    settings = Settings({"ML_PLATFORM_LAKE_DIR": padding.format(lake)})
    with pytest.raises(SettingsError, match="ML_PLATFORM_LAKE_DIR=.* spaces or line breaks"):
        _ = settings.lake
    # Without the padding, the run's lake is the directory the commands read.
    assert stored_in(Settings({"ML_PLATFORM_LAKE_DIR": lake}), monkeypatch).startswith(lake)


def test_a_blank_lake_directory_is_refused_not_read_as_the_working_directory():
    # Dagster resolves the EnvVar of a blank variable to "": the lake was the code server's
    # working directory, while every command said the variable was unset.
    with pytest.raises(SettingsError, match="ML_PLATFORM_LAKE_DIR is set but empty"):
        _ = Settings({"ML_PLATFORM_LAKE_DIR": "  "}).lake
    with pytest.raises(SettingsError, match="ML_PLATFORM_LANDING_DIR is set but empty"):
        _ = Settings({"ML_PLATFORM_LANDING_DIR": ""}).landing


def test_a_padded_s3_url_is_refused_not_read_as_another_prefix():
    with pytest.raises(SettingsError, match="ML_PLATFORM_LAKE_URL=.* spaces or line breaks"):
        _ = Settings({"ML_PLATFORM_LAKE_URL": "s3://bucket/lake "}).lake


def test_a_blank_url_beside_a_directory_is_unset_as_env_example_writes_it(tmp_path):
    settings = Settings({"ML_PLATFORM_LAKE_URL": "", "ML_PLATFORM_LAKE_DIR": str(tmp_path)})
    assert settings.lake.kind == "local" and settings.lake.value == str(tmp_path)
    # Unset stays the clear error of the commands that need it.
    with pytest.raises(SettingsError, match="set ML_PLATFORM_LANDING_DIR"):
        Settings({}).landing.local_dir()


# Assembled at run time, so that this file holds no URL with a password in it.
TOKEN = "glcbt-" + "s3cretJobT0ken"


@pytest.mark.parametrize(
    ("variable", "url", "setting"),
    [
        # GitLab CI's own repository URL carries the job's token.
        (
            "ML_PLATFORM_GIT_URL",
            f"https://gitlab-ci-token:{TOKEN}@gitlab.com/team/ml",
            "code_links",
        ),
        ("ML_PLATFORM_MLFLOW_UI_URL", f"https://admin:{TOKEN}@mlflow.example.org", "mlflow_ui_url"),
        ("ML_PLATFORM_LAKE_URL", f"https://minio:{TOKEN}@minio.example.org/lake", "lake"),
        ("ML_PLATFORM_LANDING_URL", f"s3://AKIA0EXAMPLE:{TOKEN}@bucket/landing", "landing"),
    ],
)
def test_a_url_setting_with_credentials_is_refused_without_repeating_them(variable, url, setting):
    # The git URL became every asset's code reference and the MLflow UI every run's link, shown
    # in the UI to anyone; a refused location's error repeated the URL whole.
    settings = Settings({variable: url, "ML_PLATFORM_GIT_COMMIT": "abc123"})
    with pytest.raises(SettingsError) as raised:
        _ = getattr(settings, setting)
    assert f"{variable} holds a user or password" in str(raised.value)
    assert TOKEN not in str(raised.value)


@pytest.mark.parametrize("secret", ["correct horse battery staple", "abcdefgh12345678\n"])
def test_a_secret_with_spaces_or_a_line_break_is_redacted_too(secret):
    # A pass phrase is a secret; a secret mounted from a file often ends with a line break,
    # and is written to a log as the program uses it, with or without it.
    values = Settings({"ML_PLATFORM_SMTP_PASSWORD": secret}).secret_values
    assert secret in values and secret.strip() in values


def test_spaces_alone_or_a_short_value_are_no_secret():
    settings = Settings({"ML_PLATFORM_SMTP_PASSWORD": "        ", "DAGSTER_PG_PASSWORD": " short "})
    assert settings.secret_values == []


def test_a_contract_whose_partitions_end_on_the_last_date_has_no_end(tmp_path):
    # 9999-12-31, the usual "no end", is a date the contract accepts; the day after it is not,
    # and the code location failed to load with an OverflowError naming no contract.
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["partitions"]["end_date"] = dt.date.max
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document))
    partitions = daily_partitions(load_contract(path))
    assert partitions.end is None
    assert partitions.get_first_partition_key() == document["partitions"]["start_date"].isoformat()
    # A last day before it still ends the partitions on it.
    document["partitions"]["end_date"] = dt.date(2024, 12, 31)
    path.write_text(yaml.safe_dump(document))
    assert daily_partitions(load_contract(path)).get_last_partition_key() == "2024-12-31"


@pytest.mark.parametrize(
    ("pools", "says"),
    [
        # The last size won unseen: a step sized for 8 GiB went to the 1 GiB workers.
        ("small=1024,large=4096,small=8192", "pool 'small' is given twice"),
        # A digit that int() refuses escaped as a bare ValueError naming no variable.
        ("small=²", "'small=²' is not name=MiB"),
    ],
)
def test_a_worker_pool_given_twice_or_not_a_number_is_named(pools, says):
    with pytest.raises(SettingsError, match=f"ML_PLATFORM_WORKER_POOLS=.*{says}"):
        _ = Settings({"ML_PLATFORM_WORKER_POOLS": pools}).worker_pools
