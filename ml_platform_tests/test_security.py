"""No secret in the repository; the scanner that checks it (and the production test's logs)
finds the kinds of secret it looks for; the webserver binds 127.0.0.1 unless configured.
"""

import re
import subprocess

import yaml

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
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
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


def test_the_webserver_binds_loopback_unless_configured():
    assert re.search(r"^HOST \?= 127\.0\.0\.1$", (REPO / "Makefile").read_text(), re.M)
    compose = yaml.safe_load((REPO / "deploy/docker-compose.yaml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond this host"
