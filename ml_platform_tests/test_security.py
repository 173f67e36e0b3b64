"""No secret in the repository; the scanner that checks it (and the production test's logs)
finds the kinds of secret it looks for; the webserver binds 127.0.0.1 unless configured; links
in the landing zone (to /etc/os-release, to a valid file outside it) are refused by
landing-status, the sensor and raw_data, and nothing of their targets shows anywhere.
"""

import datetime as dt
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ml_platform.cli import main
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform_tests.conftest import REPO

# A value after a $ { < is a placeholder (`${DAGSTER_PG_PASSWORD}`, `<password>`), not a secret.
PATTERNS = {
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "AWS secret access key": re.compile(
        r"(?i)aws_secret_access_key[\"'\s]*[:=][\"'\s]*(?![${<])[A-Za-z0-9/+=]{40}\b"
    ),
    "private key": re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----"),
    "password in a URL": re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@'\"]+:(?![${<*])[^\s/@'\"]+@"),
}


def secret_findings(text: str, known_secrets: list[str] = ()) -> list[str]:
    """What in `text` looks like a secret: pattern matches and occurrences of known secrets."""
    found = [
        f"{kind}: {match.group(0)[:12]}..."
        for kind, pattern in PATTERNS.items()
        for match in pattern.finditer(text)
    ]
    found.extend(f"a known secret ({secret[:3]}...)" for secret in known_secrets if secret in text)
    return found


def test_the_scanner_finds_each_kind_of_secret():
    # Assembled at run time, so that this file does not hold what the repository scan rejects.
    samples = {
        "AWS access key id": "key = AKIA" + "IOSFODNN7EXAMPLE",
        "AWS secret access key": "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG"
        + "/bPxRfiCYEXAMPLEKEY",
        "private key": "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIE",
        "password in a URL": "postgresql+psycopg2://dagster:" + "hunter2@db:5432/dagster",
    }
    for kind, sample in samples.items():
        assert [f.split(":")[0] for f in secret_findings(sample)] == [kind], sample
    assert secret_findings("the token is s3cr3t-value!", ["s3cr3t-value"]) != []


def test_the_scanner_ignores_placeholders():
    for text in [
        "AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-}",
        "AWS_SECRET_ACCESS_KEY=",
        "postgresql://${DAGSTER_PG_USERNAME}:${DAGSTER_PG_PASSWORD}@postgres:5432/dagster",
        "postgresql://user:<password>@host/db",
        "http://127.0.0.1:3000/runs",
    ]:
        assert secret_findings(text) == [], text


def test_no_tracked_file_holds_a_secret():
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    ).stdout.split(b"\0")
    found = []
    for name in filter(None, files):
        path = REPO / name.decode()
        if not path.is_file():
            continue  # deleted in the working tree, not yet committed
        text = path.read_bytes().decode(errors="replace")
        found.extend(f"{name.decode()}: {finding}" for finding in secret_findings(text))
    assert found == []


def test_every_secret_of_the_instance_configs_comes_from_the_environment():
    for config in ["deploy/dagster.yaml", "deploy/local/dagster.yaml"]:
        document = yaml.safe_load((REPO / config).read_text())
        database = document["storage"]["postgres"]["postgres_db"]
        for field in ["username", "password", "hostname", "port", "db_name"]:
            assert set(database[field]) == {"env"}, f"{config}: {field} is not from env"


def test_mlflow_sends_no_telemetry_from_the_platforms_processes():
    # MLflow starts its usage telemetry when imported unless told not to; every module of the
    # platform that uses MLflow imports it after ml_platform.platform.tracking, which tells it.
    code = (
        "import ml_platform.registry.store, ml_platform.training.tracking, mlflow\n"
        "from mlflow.telemetry import get_telemetry_client\n"
        "assert get_telemetry_client() is None, get_telemetry_client()\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")
    }
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def test_the_webserver_binds_loopback_unless_configured():
    assert re.search(r"^HOST \?= 127\.0\.0\.1$", (REPO / "Makefile").read_text(), re.M)
    compose = yaml.safe_load((REPO / "deploy/docker-compose.yaml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond this host"


OS_RELEASE = Path("/etc/os-release")


@pytest.fixture
def linked_zone(platform_for, tmp_path):
    """A synthetic platform whose zone holds a real day file and two links out of the zone.

    2024-01-01 is a link to /etc/os-release; 2024-01-02 a link to a valid day file kept outside
    the zone (what was once ingested and made champion). Returns the platform and the first
    line of each link's target, which must never show anywhere.
    """
    platform = platform_for("synthetic")
    outside = LandingZone(base_dir=str(tmp_path / "outside"))
    list(land_days(platform.contract, outside, [dt.date(2024, 1, 2)]))
    platform.land("2024-01-03", 1)
    zone = platform.landing_dir
    (zone / "synthetic_2024-01-01.csv").symlink_to(OS_RELEASE)
    target = outside.path_for("synthetic_2024-01-02.csv")
    (zone / "synthetic_2024-01-02.csv").symlink_to(target)
    secrets = [
        OS_RELEASE.read_text().splitlines()[0],
        *target.read_text().splitlines()[:2],  # the valid file's header and first row
    ]
    return platform, secrets


def test_landing_status_names_links_out_of_the_zone_with_the_reason(linked_zone, capsys):
    platform, secrets = linked_zone

    code = main(
        ["landing-status", "--dataset", "synthetic", "--landing-dir", str(platform.landing_dir)]
    )

    out = capsys.readouterr()
    assert code == 1
    assert "1 day file(s) of synthetic (2024-01-03 to 2024-01-03)" in out.out
    for day in ["2024-01-01", "2024-01-02"]:
        path = platform.landing_dir / f"synthetic_{day}.csv"
        assert f"error: {path} is refused: it is a symbolic link" in out.err
    assert not [s for s in secrets if s in out.out + out.err]


def test_the_sensor_alerts_once_on_links_and_requests_no_run_for_them(linked_zone, caplog):
    from ml_platform_tests.test_sensors import Sensor

    platform, secrets = linked_zone
    sensor = Sensor(LandingZone(base_dir=str(platform.landing_dir)))

    with caplog.at_level(logging.INFO):
        assert sensor.requested() == ["2024-01-03"]
        assert sensor.requested() == []
        assert sensor.requested() == []

    alerts = [r.getMessage() for r in caplog.records if r.name == "ml_platform.alerts"]
    assert len(alerts) == 1
    assert '"rule": "landing_misfit"' in alerts[0]
    for day in ["2024-01-01", "2024-01-02"]:
        assert f"synthetic_{day}.csv: it is a symbolic link" in alerts[0]
    assert not [s for s in secrets if s in caplog.text]


def test_raw_data_refuses_a_link_naming_file_partition_and_reason_and_reads_nothing(linked_zone):
    platform, secrets = linked_zone

    for day in ["2024-01-01", "2024-01-02"]:
        result = platform.materialize(day, selection=["raw_data"])

        # A refused entry is the day's verdict, not a failure of the run.
        assert result.success
        path = platform.landing_dir / f"synthetic_{day}.csv"
        refused = f"{path} (partition {day}) is refused: it is a symbolic link"
        [check] = [c for c in result.get_asset_check_evaluations() if c.check_name == "raw_schema"]
        assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
        assert (check.partition, check.metadata["file"].value) == (day, f"synthetic_{day}.csv")
        assert refused in (check.description or "")
        [record] = result.asset_materializations_for_node(platform.node("raw_data"))
        assert record.metadata["verdict"].value == "unreadable file"
        assert record.metadata["accepted"].value is False
        assert refused in record.metadata["reason"].value
        # Waiting does not turn a link into a file: no retry.
        logs = platform.instance.all_logs(result.run_id)
        assert not [
            e
            for e in logs
            if e.dagster_event_type
            in (dg.DagsterEventType.STEP_UP_FOR_RETRY, dg.DagsterEventType.STEP_FAILURE)
        ]
        everything = "\n".join([*(str(e) for e in result.all_events), *(str(e) for e in logs)])
        assert str(path) in everything
        assert not [s for s in secrets if s in everything]
    # Both days are recorded as rejected, and nothing of the links' targets is stored.
    assert platform.materialized("raw_data") == {"2024-01-01", "2024-01-02"}
    assert not list((platform.lake_dir / "synthetic" / "raw_data").glob("*"))
    stored = [p.read_bytes() for p in platform.lake_dir.rglob("*") if p.is_file()]
    assert not [s for s in secrets for data in stored if s.encode() in data]
