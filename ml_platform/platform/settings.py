"""Every environment variable the platform reads, read here and nowhere else.

`Settings` is a snapshot of the environment with one property per setting; a property parses
its variable when asked and names the variable when the value is wrong, so a bad value of one
setting does not stop code that needs another. Resources are configured with `dg.EnvVar`s of
the variables that are set, so the UI and the run config show variable names, not values
(secrets included); everything else takes plain values from here.

Storage is one rule for the landing zone and the lake: a directory by default, S3 when the
location's URL variable holds `s3://bucket/prefix`. Both S3 locations share one
`dagster_aws.s3.S3Resource` (endpoint and region below; credentials from the boto3 chain).
"""

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlparse

CONTRACTS_ENV = "ML_PLATFORM_CONTRACTS"
DATASET_ENV = "ML_PLATFORM_DATASET"
# The replays the code location serves beside the live datasets (`ml-platform replay`).
REPLAYS_ENV = "ML_PLATFORM_REPLAYS_DIR"
LANDING_URL_ENV = "ML_PLATFORM_LANDING_URL"
LANDING_DIR_ENV = "ML_PLATFORM_LANDING_DIR"
LAKE_URL_ENV = "ML_PLATFORM_LAKE_URL"
LAKE_DIR_ENV = "ML_PLATFORM_LAKE_DIR"
S3_ENDPOINT_ENV = "ML_PLATFORM_S3_ENDPOINT_URL"
S3_REGION_ENV = "ML_PLATFORM_S3_REGION"
# botocore's check of a region name (`InvalidRegionError`).
REGION_NAME = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?")
SENSOR_INTERVAL_ENV = "ML_PLATFORM_SENSOR_INTERVAL_SECONDS"
DAGSTER_URL_ENV = "ML_PLATFORM_DAGSTER_URL"
# `make serve`'s webserver.
DEFAULT_DAGSTER_URL = "http://127.0.0.1:3000"
DEFAULT_SENSOR_INTERVAL = 30
BACKFILL_DAYS_PER_RUN_ENV = "ML_PLATFORM_BACKFILL_DAYS_PER_RUN"
# Half a year a run. The assets chained to the day before (validated_data, the registry, the
# monitoring) advance one run per backfill-daemon loop (30 s), as does the model, which waits for
# its window's features: each chunk of a range costs them a loop or more, while the other
# assets' chunks run side by side on the run workers. A year of flights through the embedded
# instance (two runs at once) took 494 s in 2 chunks (183 days) against 634 s in 5 (90 days)
# when every chained asset ran a run per chunk (benchmarks/backfill_year.py, docs/benchmarks.md;
# 443 s in 2 chunks since the registry takes its days at once); more workers (ECS tasks) favour
# a smaller N. A run's memory holds one day at a time however many days it has.
DEFAULT_BACKFILL_DAYS_PER_RUN = 183
LOG_FORMAT_ENV = "ML_PLATFORM_LOG_FORMAT"
GIT_COMMIT_ENV = "ML_PLATFORM_GIT_COMMIT"
GIT_URL_ENV = "ML_PLATFORM_GIT_URL"
GIT_BRANCH_ENV = "ML_PLATFORM_GIT_BRANCH"
IMAGE_TAG_ENV = "ML_PLATFORM_IMAGE_TAG"
DAGSTER_HOME_ENV = "DAGSTER_HOME"
# Where a run's steps execute (docs/running.md#where-steps-run): in the run's own process (the
# embedded default), a process each, a task each on ECS, or a Celery task each on workers.
EXECUTOR_ENV = "ML_PLATFORM_EXECUTOR"
EXECUTORS = ("in_process", "multiprocess", "ecs", "celery")
# The Celery broker, which also holds the steps' results (redis://host:6379/0).
CELERY_BROKER_ENV = "ML_PLATFORM_CELERY_BROKER"
# The distributed engine's worker pools, `name=MiB,...`: the memory each worker of a pool has.
WORKER_POOLS_ENV = "ML_PLATFORM_WORKER_POOLS"
# Set in a worker's environment: the pool it belongs to, which each step it runs records.
WORKER_POOL_ENV = "ML_PLATFORM_WORKER_POOL"
POOL_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")

# Notifier field -> variable. Only variables that are set are passed, as EnvVars, so the UI
# shows the variable name, never a secret's value.
NOTIFIER_ENV = {
    "ui_url": "ML_PLATFORM_UI_URL",
    "runbook_url": "ML_PLATFORM_RUNBOOK_URL",
    "webhook_url": "ML_PLATFORM_ALERT_WEBHOOK_URL",
    "smtp_host": "ML_PLATFORM_SMTP_HOST",
    "smtp_user": "ML_PLATFORM_SMTP_USER",
    "smtp_password": "ML_PLATFORM_SMTP_PASSWORD",
    "email_from": "ML_PLATFORM_ALERT_EMAIL_FROM",
    "email_to": "ML_PLATFORM_ALERT_EMAIL_TO",
}
NOTIFIER_INT_ENV = {
    "smtp_port": "ML_PLATFORM_SMTP_PORT",
    "dedup_seconds": "ML_PLATFORM_ALERT_DEDUP_SECONDS",
}
NOTIFIER_BOOL_ENV = {"smtp_starttls": "ML_PLATFORM_SMTP_STARTTLS"}

SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|KEY|WEBHOOK|CREDENTIAL", re.IGNORECASE)
# Shorter values (e.g. "1", "true", a port) are not credentials and would redact ordinary text.
MIN_SECRET_LENGTH = 8
# MLflow's own store variables (`mlflow_config`); a database URI in them carries a password.
MLFLOW_URI_ENVS = {"tracking_uri": "MLFLOW_TRACKING_URI", "registry_uri": "MLFLOW_REGISTRY_URI"}
MLFLOW_UI_ENV = "ML_PLATFORM_MLFLOW_UI_URL"


# The words a yes/no setting accepts.
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


class SettingsError(ValueError):
    """A setting (an environment variable) whose value cannot be used; the message names it."""


def http_url(name: str, url: str, what: str) -> str:
    """`url`, the value of variable `name`, if it is an http(s) URL that can be used.

    With a host, a numeric port if any, and no user or password; else a `SettingsError` saying
    how to give `what`.
    """
    no_credentials(name, url)
    parts = urlparse(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise SettingsError(f"{name}={url!r}: give {what} as http(s)://HOST[:PORT][/PATH]")
    return url


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`; the prefix is empty or ends with '/'.

    Split by hand, not as a web URL: `#` and `?` are ordinary characters of an S3 key, and a
    URL parser would cut the prefix at them and point the zone or the lake at another one.
    """
    scheme, _, rest = url.partition("://")
    bucket, _, path = rest.partition("/")
    if scheme != "s3" or not bucket:
        raise SettingsError(f"not an S3 URL of the form s3://bucket/prefix: {url!r}")
    prefix = path.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def no_credentials(variable: str, url: str) -> None:
    """Refuse a URL setting that holds a user or password, without repeating them.

    No setting needs one (S3 takes credentials from the boto3 chain; the links and the webserver
    take none), and every message or link that names the URL would show them.
    """
    parts = urlparse(url)
    if parts.username is not None or parts.password is not None:
        raise SettingsError(
            f"{variable} holds a user or password, which nothing sends and every message or link "
            "naming it would show: remove them from it"
        )


@dataclasses.dataclass(frozen=True)
class Location:
    """Where the landing zone or the lake lives: a local directory or an S3 prefix.

    `variable` names the environment variable that holds `value`; resources are configured
    with its `EnvVar`. A location given directly (a test, a `--landing-dir`) has none.
    """

    kind: Literal["local", "s3"]
    value: str | None  # the directory or the s3:// URL; None when the variable is unset
    variable: str | None = None

    @classmethod
    def directory(cls, path: str) -> "Location":
        """A local directory given directly, not through the environment."""
        return cls("local", path)

    def config(self) -> Any:
        """The resource field's value: the variable's `EnvVar`, or the value given directly."""
        # Dagster is imported where config is built, so commands that only read a setting
        # (`ml-platform check-contract`) start without it.
        import dagster as dg

        return dg.EnvVar(self.variable) if self.variable else self.value

    def local_dir(self) -> str:
        """The directory; a clear error when the location is S3 or its variable is unset."""
        if self.kind == "s3":
            raise SettingsError(
                f"{self.variable}={self.value!r} is an S3 location; this command works on a "
                "local directory: pass one (--landing-dir) or unset the URL"
            )
        if not self.value:
            raise SettingsError(f"set {self.variable} (see .env.example)")
        return self.value


def quiet_mlflow() -> None:
    """MLflow's own switches as the platform needs them, where the environment leaves them unset.

    Its telemetry is off: nothing leaves the machine (as `telemetry` in dagster.yaml); MLflow
    starts it when imported, so this runs before. No progress bar per downloaded model in the
    runs' logs. Its REST client retries a failed request inside the call, by default 7 times
    with a backoff factor of 2 (about 4 minutes before the step sees the error), which the
    steps' retry policy then repeats: one attempt retries a blip for a few seconds (1 + 2 s)
    and leaves longer outages to the retry policy, which logs each attempt. A variable the
    user set stands.
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")


class Settings:
    """The platform's settings, read from a snapshot of the environment (`os.environ`)."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.environ = dict(os.environ if environ is None else environ)

    def _get(self, name: str) -> str | None:
        value = self.environ.get(name, "").strip()
        return value or None

    @property
    def contracts_dir(self) -> str | None:
        """The directory of the contracts the code location serves; None: the bundled ones."""
        return self._get(CONTRACTS_ENV)

    @property
    def replays_dir(self) -> str | None:
        """The directory of the replays: ML_PLATFORM_REPLAYS_DIR, else `$DAGSTER_HOME/replays`.

        The code location and `ml-platform replay` must see the same directory (both run with
        the instance's DAGSTER_HOME on the embedded default); None: no replays.
        """
        home = self._get(DAGSTER_HOME_ENV)
        return self._get(REPLAYS_ENV) or (os.path.join(home, "replays") if home else None)

    @property
    def dataset(self) -> str | None:
        """Serve only this dataset: a contract's name in the directory, or a contract path."""
        return self._get(DATASET_ENV)

    def _as_set(self, name: str, what: str) -> str | None:
        """The variable as a resource's `EnvVar` reads it (unstripped); None when it is unset.

        Commands read the stripped value, so a blank value or one with spaces around it would
        put the runs' `what` elsewhere: Dagster gives "" (the working directory) or the padded
        value (another directory or prefix). Both are refused.
        """
        raw = self.environ.get(name)
        if raw is None:
            return None
        if not raw.strip():
            raise SettingsError(f"{name} is set but empty: set it to {what}, or unset it")
        if raw != raw.strip():
            raise SettingsError(
                f"{name}={raw!r} has spaces or line breaks around its value, which the runs "
                "would keep as part of it: remove them"
            )
        return raw

    def _location(self, url_variable: str, dir_variable: str) -> Location:
        url = self._get(url_variable)
        if url is None:
            return Location("local", self._as_set(dir_variable, "a directory"), dir_variable)
        no_credentials(url_variable, url)
        # Set and not blank here: only spaces around it are refused.
        self._as_set(url_variable, "an s3://bucket/prefix URL")
        try:
            parse_s3_url(url)
        except ValueError as exc:
            raise SettingsError(
                f"{url_variable}={url!r} is not supported: use s3://bucket/prefix, or unset it "
                f"and set {dir_variable} for a local directory"
            ) from exc
        return Location("s3", url, url_variable)

    @property
    def landing(self) -> Location:
        """The landing zone: `ML_PLATFORM_LANDING_URL` (s3://) if set, else the LANDING_DIR."""
        return self._location(LANDING_URL_ENV, LANDING_DIR_ENV)

    @property
    def lake(self) -> Location:
        """The lake: `ML_PLATFORM_LAKE_URL` (s3://) if set, else `ML_PLATFORM_LAKE_DIR`."""
        return self._location(LAKE_URL_ENV, LAKE_DIR_ENV)

    @property
    def s3_config(self) -> dict[str, Any]:
        """`S3Resource` fields of the S3 variables that are set, as EnvVars.

        Unset, the endpoint is AWS itself and the region the boto3 chain's. Credentials are
        never configured here: the boto3 chain (AWS_* variables, a profile, a task role).
        """
        import dagster as dg

        config: dict[str, Any] = {}
        if endpoint := self._get(S3_ENDPOINT_ENV):
            # Without its scheme (localhost:9000) boto3 raises a bare ValueError naming no
            # variable, at the first read of a step.
            http_url(S3_ENDPOINT_ENV, endpoint, "the S3 API server")
            config["endpoint_url"] = dg.EnvVar(S3_ENDPOINT_ENV)
        if region := self._get(S3_REGION_ENV):
            # boto3's own rule: otherwise every request fails with InvalidRegionError, retried.
            if not REGION_NAME.fullmatch(region):
                raise SettingsError(
                    f"{S3_REGION_ENV}={region!r} is no region name: letters, digits and inner "
                    "hyphens, e.g. eu-west-1"
                )
            config["region_name"] = dg.EnvVar(S3_REGION_ENV)
        return config

    @property
    def mlflow_config(self) -> dict[str, Any]:
        """`MlflowStores` fields of MLflow's own store variables that are set, as EnvVars.

        Unset, the tracking (and registry) store is the embedded file in the lake directory.
        """
        import dagster as dg

        return {
            field: dg.EnvVar(variable)
            for field, variable in MLFLOW_URI_ENVS.items()
            if self._get(variable)
        }

    @property
    def mlflow_ui_url(self) -> str | None:
        """The MLflow UI that assets link their runs and model versions to; None: no links."""
        url = self._get(MLFLOW_UI_ENV)
        if url is not None:
            no_credentials(MLFLOW_UI_ENV, url)
        return url.rstrip("/") if url else None

    @property
    def sensor_interval_seconds(self) -> int:
        """Seconds between sensor ticks (default 30)."""
        return self._positive_int(SENSOR_INTERVAL_ENV) or DEFAULT_SENSOR_INTERVAL

    @property
    def dagster_url(self) -> str:
        """The Dagster webserver `ml-platform materialize` launches runs through.

        An http(s) URL with a host, a numeric port if any, and a path if the webserver is
        served under one (`--path-prefix`). A user or password in it is refused, unrepeated:
        nothing sends them, and every message that names the webserver would print them.
        """
        return http_url(
            DAGSTER_URL_ENV, self._get(DAGSTER_URL_ENV) or DEFAULT_DAGSTER_URL, "the webserver"
        )

    @property
    def backfill_days_per_run(self) -> int:
        """Days of a backfill's range one run holds at most (default 183): see `platform.steps`."""
        return self._positive_int(BACKFILL_DAYS_PER_RUN_ENV) or DEFAULT_BACKFILL_DAYS_PER_RUN

    def _positive_int(self, name: str) -> int | None:
        configured = self._get(name)
        if configured is None:
            return None
        try:
            value = int(configured)
        except ValueError:
            raise SettingsError(f"{name}={configured!r} is not a whole number") from None
        if value < 1:
            raise SettingsError(f"{name}={configured!r}: at least 1")
        return value

    @property
    def executor(self) -> str:
        """Where a run's steps execute: one of EXECUTORS, default in_process.

        `celery` also needs the broker the workers listen to (ML_PLATFORM_CELERY_BROKER).
        """
        value = (self._get(EXECUTOR_ENV) or "in_process").lower()
        if value not in EXECUTORS:
            raise SettingsError(f"{EXECUTOR_ENV}={value!r}: choose one of {', '.join(EXECUTORS)}")
        if value == "celery" and self._get(CELERY_BROKER_ENV) is None:
            raise SettingsError(
                f"{EXECUTOR_ENV}=celery needs {CELERY_BROKER_ENV}, the URL of the broker the "
                "workers listen to (redis://host:6379/0)"
            )
        return value

    @property
    def worker_pools(self) -> dict[str, int]:
        """The engine's worker pools, smallest first: name -> MiB of each of its workers.

        From `small=1024,large=4096`; empty when unset (every step goes to Celery's default
        queue, `dagster`).
        """
        configured = self._get(WORKER_POOLS_ENV)
        pools: dict[str, int] = {}
        for item in (configured or "").split(","):
            if not item.strip():
                continue
            name, _, memory = (part.strip() for part in item.partition("="))
            # isdecimal, not isdigit: int() refuses digits such as '²'.
            if not POOL_NAME.match(name) or not memory.isdecimal() or int(memory) < 1:
                raise SettingsError(
                    f"{WORKER_POOLS_ENV}={configured!r}: {item.strip()!r} is not name=MiB "
                    "(e.g. small=1024,large=4096)"
                )
            if name in pools:
                # The last size would win unseen, and steps would go to workers too small.
                raise SettingsError(
                    f"{WORKER_POOLS_ENV}={configured!r}: pool {name!r} is given twice; give each "
                    "pool once, with the memory its workers have"
                )
            pools[name] = int(memory)
        return dict(sorted(pools.items(), key=lambda pool: pool[1]))

    @property
    def worker_pool(self) -> str | None:
        """The pool of the worker this process is (ML_PLATFORM_WORKER_POOL), if it is one."""
        return self._get(WORKER_POOL_ENV)

    @property
    def json_logs(self) -> bool:
        """Whether run logs also go to stderr as JSON lines (`ML_PLATFORM_LOG_FORMAT=json`)."""
        return (self._get(LOG_FORMAT_ENV) or "text").lower() == "json"

    @property
    def dagster_home(self) -> str | None:
        """The Dagster instance's directory, when set."""
        return self._get(DAGSTER_HOME_ENV)

    @property
    def git_commit(self) -> str | None:
        """The commit the image was built from (set by the image build), when known."""
        return self._get(GIT_COMMIT_ENV)

    @property
    def code_links(self) -> tuple[str, str] | None:
        """(repository URL, branch or commit) the assets' code references open; None: local files.

        The branch defaults to `ML_PLATFORM_GIT_COMMIT`, so the links show the code that runs.
        """
        url, branch = self._get(GIT_URL_ENV), self._get(GIT_BRANCH_ENV) or self.git_commit
        if url is None:
            if self._get(GIT_BRANCH_ENV):
                raise SettingsError(f"{GIT_BRANCH_ENV} is set: set {GIT_URL_ENV} to the repository")
            return None
        # Every asset's code reference shows it in the UI.
        no_credentials(GIT_URL_ENV, url)
        if not any(host in url for host in ("github", "gitlab")):
            raise SettingsError(
                f"{GIT_URL_ENV}={url!r}: code references link to GitHub or GitLab repositories "
                "only; unset it to link to local files"
            )
        if branch is None:
            raise SettingsError(
                f"{GIT_URL_ENV} is set: set {GIT_BRANCH_ENV} (or {GIT_COMMIT_ENV}) to the branch "
                "or commit its links open"
            )
        return url.rstrip("/"), branch

    @property
    def image_tag(self) -> str | None:
        """The container image the code runs in, when set."""
        return self._get(IMAGE_TAG_ENV)

    @property
    def notifier_config(self) -> dict[str, Any]:
        """`Notifier` fields of the alerting variables that are set (see .env.example)."""
        import dagster as dg

        config: dict[str, Any] = {}
        for field, var in NOTIFIER_ENV.items():
            if self._get(var):
                config[field] = dg.EnvVar(var)
        for field, var in NOTIFIER_INT_ENV.items():
            if self._get(var):
                config[field] = dg.EnvVar.int(var)
        for field, var in NOTIFIER_BOOL_ENV.items():
            value = self._get(var)
            if value:
                # Not a secret, and EnvVar has no boolean form: read when the definitions load.
                # A word that is neither is an error: a typo must not turn STARTTLS off and
                # send the SMTP password in clear.
                word = value.strip().lower()
                if word not in TRUE_WORDS | FALSE_WORDS:
                    raise SettingsError(
                        f"{var}={value!r}: use one of {', '.join(sorted(TRUE_WORDS))} or "
                        f"{', '.join(sorted(FALSE_WORDS))}"
                    )
                config[field] = word in TRUE_WORDS
        return config

    @property
    def secret_values(self) -> list[str]:
        """Values of variables that look like credentials, longest first, to redact from logs."""
        # A pass phrase has spaces, and a secret mounted from a file often ends with a line
        # break: a program may write it to a log with or without it, so both forms are redacted.
        values = {
            form
            for name, value in self.environ.items()
            if SECRET_NAME.search(name)
            for form in (value, value.strip())
            if len(form.strip()) >= MIN_SECRET_LENGTH
        }
        # A database URI of MLflow's carries its password.
        for name in MLFLOW_URI_ENVS.values():
            password = urlparse(self.environ.get(name, "")).password
            if password and len(password) >= MIN_SECRET_LENGTH:
                values.add(password)
        # Longest first, so a secret containing another is replaced whole.
        return sorted(values, key=len, reverse=True)
