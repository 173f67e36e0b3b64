"""The settings: the one module that reads the environment, and what each variable means."""

import re

import dagster as dg
import pytest

from ml_platform.platform.settings import Location, Settings, SettingsError, parse_s3_url
from ml_platform_tests.conftest import REPO

ENV_READ = re.compile(r"os\.environ|os\.getenv|getenv\(")


def test_no_module_but_settings_reads_the_environment():
    readers = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "ml_platform").rglob("*.py"))
        if path.name != "settings.py" and ENV_READ.search(path.read_text())
    ]
    assert readers == [], f"read the environment through ml_platform.platform.settings: {readers}"


def test_an_empty_environment_means_every_bundled_dataset_in_local_directories():
    settings = Settings({})
    assert settings.contracts_dir is None and settings.dataset is None
    assert settings.landing == Location("local", None, "ML_PLATFORM_LANDING_DIR")
    assert settings.lake.kind == "local"
    assert settings.s3_config == {}
    assert settings.sensor_interval_seconds == 30
    assert settings.backfill_days_per_run == 183
    assert not settings.json_logs


def test_an_s3_url_selects_s3_for_that_location_only():
    settings = Settings(
        {"ML_PLATFORM_LANDING_URL": "s3://deliveries/daily", "ML_PLATFORM_LAKE_DIR": "/lake"}
    )
    assert settings.landing == Location("s3", "s3://deliveries/daily", "ML_PLATFORM_LANDING_URL")
    assert settings.lake == Location("local", "/lake", "ML_PLATFORM_LAKE_DIR")
    # Resources see the variable, not its value.
    assert settings.landing.config() == dg.EnvVar("ML_PLATFORM_LANDING_URL")
    assert Location.directory("/tmp/x").config() == "/tmp/x"


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://lake", "lake", ""),
        ("s3://lake/", "lake", ""),
        ("s3://lake/team/daily", "lake", "team/daily/"),
        # Ordinary characters of an S3 key: the prefix is the whole path, not a web URL's.
        ("s3://lake/runs#2/", "lake", "runs#2/"),
        ("s3://lake/team?a/lake", "lake", "team?a/lake/"),
    ],
)
def test_an_s3_url_is_its_bucket_and_whole_prefix(url, bucket, prefix):
    assert parse_s3_url(url) == (bucket, prefix)


@pytest.mark.parametrize("url", ["s3:/lake/x", "s3:///x", "/lake/x", "https://lake/x"])
def test_what_is_not_an_s3_url_is_refused(url):
    with pytest.raises(ValueError, match="not an S3 URL of the form s3://bucket/prefix"):
        parse_s3_url(url)


def test_a_local_command_on_an_s3_location_says_what_to_do():
    with pytest.raises(ValueError, match="ML_PLATFORM_LANDING_URL=.*--landing-dir"):
        Settings({"ML_PLATFORM_LANDING_URL": "s3://b/p"}).landing.local_dir()
    with pytest.raises(ValueError, match="set ML_PLATFORM_LANDING_DIR"):
        Settings({}).landing.local_dir()


@pytest.mark.parametrize("value", ["two", "0", "-1"])
def test_a_bad_number_names_its_variable(value):
    settings = Settings({"ML_PLATFORM_SENSOR_INTERVAL_SECONDS": value})
    with pytest.raises(ValueError, match=f"ML_PLATFORM_SENSOR_INTERVAL_SECONDS='{value}'"):
        _ = settings.sensor_interval_seconds
    # Only the setting asked for is parsed: a bad interval does not stop the backfill's runs.
    assert settings.backfill_days_per_run == 183


@pytest.mark.parametrize(("value", "starttls"), [("on", True), ("Yes", True), ("0", False)])
def test_a_yes_no_setting_takes_yes_or_no_words(value, starttls):
    config = Settings({"ML_PLATFORM_SMTP_STARTTLS": value}).notifier_config
    assert config["smtp_starttls"] is starttls


def test_a_yes_no_setting_misspelt_is_an_error_not_a_no():
    # A typo must not turn STARTTLS off, which would send the SMTP password in clear.
    with pytest.raises(SettingsError, match="ML_PLATFORM_SMTP_STARTTLS='ture': use one of"):
        _ = Settings({"ML_PLATFORM_SMTP_STARTTLS": "ture"}).notifier_config


def test_a_command_with_a_bad_setting_names_it_without_a_traceback(monkeypatch, capsys):
    from ml_platform.cli import main

    monkeypatch.setenv("ML_PLATFORM_LANDING_URL", "https://bucket/incoming")
    assert main(["landing-status", "--dataset", "synthetic"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "'https://bucket/incoming'" in err
    assert "Traceback" not in err


def test_the_webserver_url_is_checked_and_its_credentials_never_repeated():
    assert Settings({}).dagster_url == "http://127.0.0.1:3000"
    served_under = "https://dagster.example.com/team-a"
    assert Settings({"ML_PLATFORM_DAGSTER_URL": served_under}).dagster_url == served_under
    # Assembled at run time, so that this file holds no URL with a password in it.
    with_password = "https://ci:" + "s3cretT0ken@host:3000"
    with pytest.raises(SettingsError) as raised:
        _ = Settings({"ML_PLATFORM_DAGSTER_URL": with_password}).dagster_url
    assert "holds a user or password" in str(raised.value)
    assert "s3cretT0ken" not in str(raised.value)
    for bad in ["127.0.0.1:3000", "http://127.0.0.1:30x0", "ftp://host"]:
        with pytest.raises(SettingsError, match="give the webserver as http"):
            _ = Settings({"ML_PLATFORM_DAGSTER_URL": bad}).dagster_url


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        # boto3 raised a bare ValueError naming no variable at a step's first read.
        ("ML_PLATFORM_S3_ENDPOINT_URL", "localhost:9000", "give the S3 API server as http"),
        ("ML_PLATFORM_S3_ENDPOINT_URL", "http://minio:90x0", "give the S3 API server as http"),
        # Every request failed with InvalidRegionError, and was retried.
        ("ML_PLATFORM_S3_REGION", "eu west 1", "is no region name"),
    ],
)
def test_an_s3_endpoint_or_region_boto3_cannot_use_is_named(variable, value, said):
    with pytest.raises(SettingsError, match=said) as raised:
        _ = Settings({variable: value}).s3_config
    assert f"{variable}={value!r}" in str(raised.value)


def test_the_s3_endpoint_and_region_are_env_vars_when_set():
    settings = Settings(
        {"ML_PLATFORM_S3_ENDPOINT_URL": "http://127.0.0.1:9000", "ML_PLATFORM_S3_REGION": "eu"}
    )
    assert settings.s3_config == {
        "endpoint_url": dg.EnvVar("ML_PLATFORM_S3_ENDPOINT_URL"),
        "region_name": dg.EnvVar("ML_PLATFORM_S3_REGION"),
    }


def test_secret_values_are_those_of_credential_looking_names_longest_first():
    settings = Settings(
        {
            "AWS_SECRET_ACCESS_KEY": "abcdefgh12345678",
            "ML_PLATFORM_ALERT_WEBHOOK_URL": "https://hooks.example/T0/x",
            "ML_PLATFORM_SMTP_PASSWORD": "short",
            "ML_PLATFORM_LAKE_DIR": "/a/long/enough/path",
        }
    )
    assert settings.secret_values == ["https://hooks.example/T0/x", "abcdefgh12345678"]


def test_every_variable_the_settings_read_is_documented_in_env_example():
    from ml_platform.platform import settings

    names = {v for n, v in vars(settings).items() if n.endswith("_ENV") and isinstance(v, str)}
    for variables in (settings.NOTIFIER_ENV, settings.NOTIFIER_INT_ENV, settings.NOTIFIER_BOOL_ENV):
        names |= set(variables.values())
    documented = set(
        re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", (REPO / ".env.example").read_text(), re.M)
    )
    assert names - documented == set(), "variables missing from .env.example"


def test_the_executor_is_in_process_unless_set_and_celery_needs_its_broker():
    assert Settings({}).executor == "in_process"
    assert Settings({"ML_PLATFORM_EXECUTOR": "Multiprocess"}).executor == "multiprocess"
    with pytest.raises(ValueError, match="ML_PLATFORM_EXECUTOR='spark': choose one of"):
        _ = Settings({"ML_PLATFORM_EXECUTOR": "spark"}).executor
    with pytest.raises(ValueError, match="celery needs ML_PLATFORM_CELERY_BROKER"):
        _ = Settings({"ML_PLATFORM_EXECUTOR": "celery"}).executor
    broker = {"ML_PLATFORM_CELERY_BROKER": "redis://127.0.0.1:6379/0"}
    assert Settings({"ML_PLATFORM_EXECUTOR": "celery", **broker}).executor == "celery"


def test_worker_pools_are_read_smallest_first_and_a_bad_one_is_named():
    pools = Settings({"ML_PLATFORM_WORKER_POOLS": " large=4096, small=1024 "}).worker_pools
    assert list(pools.items()) == [("small", 1024), ("large", 4096)]
    assert Settings({}).worker_pools == {}
    for bad in ("small", "small=lots", "Small=1024", "small=0"):
        with pytest.raises(ValueError, match="ML_PLATFORM_WORKER_POOLS=.*is not name=MiB"):
            _ = Settings({"ML_PLATFORM_WORKER_POOLS": bad}).worker_pools
