"""Structured logs: one JSON object per line, with the run, the step and the partition.

Dagster hands every record of a run (our `context.log` calls, its own events, and the Python
loggers `dagster.yaml` lists as managed) to the handlers of `python_logs.dagster_handler_config`
with a `dagster_meta` attribute that carries the run id, the step and the run's tags. The
handlers here turn that into flat JSON fields a log search can filter on:

    {"timestamp", "level", "component", "run_id", "partition", "job", "event", "message", ...}

plus the `extra=` fields of the call. `partition` is the run's day; on a run of a range of
days, the day the line's event is about (a materialisation, a check evaluation), else the
range, "start...end". `JsonFileHandler` always writes a rotating file under
`$DAGSTER_HOME/logs/` (yaml cannot build that path, so the handler resolves it);
`JsonStderrHandler` writes the same lines to stderr when `ML_PLATFORM_LOG_FORMAT=json`, and
nothing otherwise, because Dagster's console logger already prints text there.

Secrets never reach a line: values of environment variables whose names look like secrets
(`*SECRET*`, `*PASSWORD*`, `*TOKEN*`, `*KEY*`, `*WEBHOOK*`), as written, JSON-escaped or
percent-encoded, and passwords in URLs are replaced. A line that cannot be written (a read-only
or full log directory) is reported on stderr and dropped: a log line never fails a run.
"""

import contextlib
import datetime as dt
import fcntl
import json
import logging
import logging.handlers
import os
import re
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from ml_platform.platform.failures import error_chain, user_error
from ml_platform.platform.run_events import partition_of_tags
from ml_platform.platform.settings import MIN_SECRET_LENGTH, Settings

LOG_FILE_NAME = "ml_platform.jsonl"
REDACTED = "***"
# A URL's password: after `scheme://user:` (the user may be empty, as in a Redis broker's
# `redis://:password@host`) up to the last '@' of the URL's authority, which ends at the first
# '/', '?', '#' or space. Parsers split user info from the host at that last '@', so a password
# may hold '@' (`p@ssw0rd`): none of it may stay in the line.
URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://[^:/?#@\s]*:)[^/?#\s]*@", re.IGNORECASE)
# Attributes every LogRecord has; anything else on a record came from `extra=`.
STANDARD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def redact(text: str, secrets: list[str]) -> str:
    """`text` with every secret value and URL password replaced by ***."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return URL_PASSWORD.sub(rf"\g<scheme>{REDACTED}@", text)


def line_partition(tags: Mapping[str, str], event: Any) -> str | None:
    """The partition of a log line: the run's day, else the day its event is about, else the range.

    A range's run has no `dagster/partition` tag, while its materialisations and check
    evaluations each name their own day; its other lines carry the run's "start...end".
    """
    if "dagster/partition" not in tags:
        # A materialisation's or observation's day, or that of a check evaluation's data.
        data = getattr(event, "event_specific_data", None)
        day = getattr(event, "partition", None) or getattr(data, "partition", None)
        if day:
            return str(day)
    return partition_of_tags(tags)


def log_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The JSON fields of a record, from Dagster's metadata when the record passed through it."""
    meta: Mapping[str, Any] = getattr(record, "dagster_meta", None) or {}
    tags: Mapping[str, str] = meta.get("job_tags") or {}
    event = meta.get("dagster_event")
    resource = meta.get("resource_name")
    # What produced the line: the asset's step, a resource, or else the job or Python logger.
    component = (
        meta.get("step_key")
        or (f"resource:{resource}" if resource else None)
        or meta.get("job_name")
        or record.name
    )
    fields: dict[str, Any] = {
        "timestamp": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
        "level": record.levelname,
        "component": component,
        "run_id": meta.get("run_id"),
        "partition": line_partition(tags, event),
        "job": meta.get("job_name"),
        "event": event.event_type_value if event is not None else None,
        "logger": record.name,
        "message": meta.get("orig_message", record.getMessage()),
    }
    error = getattr(getattr(event, "event_specific_data", None), "error", None)
    if error is not None:
        fields["error"] = " <- caused by ".join(error_chain(user_error(error)))
    if record.exc_info and record.exc_info[1] is not None:
        fields["error"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
    for key, value in record.__dict__.items():
        # dagster_* attributes are Dagster's own copies of the event, already in the fields.
        if key not in STANDARD_ATTRS and not key.startswith("dagster_") and key not in fields:
            fields[key] = value
    return fields


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line with secrets redacted."""

    def __init__(self) -> None:
        super().__init__()
        secrets = Settings().secret_values
        # A secret of several lines (a key file, a JSON credential) reaches a line with other
        # line breaks (CRLF), or a line at a time (a file read line by line, a traceback's
        # source line): each of its lines is redacted too.
        parts = {
            part.strip()
            for secret in secrets
            for part in secret.splitlines()
            if len(part.strip()) >= MIN_SECRET_LENGTH
        }
        plain = set(secrets) | parts
        # A secret with quotes or backslashes appears escaped in the JSON text.
        escaped = {json.dumps(secret, ensure_ascii=False)[1:-1] for secret in plain}
        # A token put in a URL (a webhook's query, a URI's password) appears percent-encoded:
        # base64 tokens hold '/', '+' and '=', which then read %2F, %2B and %3D.
        quoted = {
            form
            for secret in plain
            for form in (urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret))
        }
        self.secrets = sorted(plain | escaped | quoted, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        """One line of JSON; values that are not JSON types are written as their text."""
        line = json.dumps(log_fields(record), default=str, ensure_ascii=False)
        # A lone surrogate (a file name that is not UTF-8, decoded with surrogateescape) has no
        # UTF-8 form, and the file refused the whole line: it is written as JSON's escape
        # (`\udcff`), the only characters `backslashreplace` changes. An ASCII line, the usual
        # one, is known as such without a scan and left as it is.
        if not line.isascii():
            line = line.encode("utf-8", "backslashreplace").decode("utf-8")
        return redact(line, self.secrets)


def log_dir() -> Path:
    """`$DAGSTER_HOME/logs`; a clear error when DAGSTER_HOME is unset."""
    home = Settings().dagster_home
    if not home:
        raise RuntimeError("DAGSTER_HOME is not set: the JSON log file lives under it")
    return Path(home) / "logs"


class JsonFileHandler(logging.handlers.RotatingFileHandler):
    """Appends JSON lines to `$DAGSTER_HOME/logs/ml_platform.jsonl`, rotating by size.

    Each run process opens the file in append mode and writes whole lines, so concurrent runs
    interleave lines, never bytes of a line (lines are far below the pipe/atomic-append size).
    Every process of the machine writes the same file: each line is written under an exclusive
    lock of `ml_platform.jsonl.lock`, after reopening the file if another process rotated it,
    so one rotation happens at a time, by the file's own size. Each process rotating by the
    size of the file its descriptor pointed at renamed away others' fresh files: lines were
    lost though all fitted the file and its backups.
    """

    def __init__(self, max_bytes: int = 50_000_000, backup_count: int = 5) -> None:
        directory = log_dir()
        # A log directory that cannot be made (a read-only or full DAGSTER_HOME) must not stop
        # the runs: the file is opened at the first line (`delay`), whose failure is reported
        # on stderr by `handleError` and the line dropped.
        with contextlib.suppress(OSError):
            directory.mkdir(parents=True, exist_ok=True)
        super().__init__(
            directory / LOG_FILE_NAME,
            maxBytes=max_bytes,
            backupCount=backup_count,
            encoding="utf-8",
            delay=True,
        )
        self.lock_path = directory / f"{LOG_FILE_NAME}.lock"
        self.lock_file: TextIO | None = None
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        """Write the line under the machine-wide lock, to the file now at the log's path.

        A line that cannot be written (a read-only or full log directory, a lock file that
        cannot be opened) is reported on stderr and dropped, as `logging` does for a write that
        fails: the run whose `context.log` call it was goes on.
        """
        try:
            # Opened on use, as the log file is: a closed handler may still be handed records.
            if self.lock_file is None:
                self.lock_file = open(self.lock_path, "a")  # noqa: SIM115
            fcntl.flock(self.lock_file, fcntl.LOCK_EX)
        except Exception:
            self.handleError(record)
            return
        try:
            stream = self.stream
            if stream is not None and not self._current(stream):
                stream.close()
                self.stream = self._open()
            super().emit(record)
        except Exception:
            self.handleError(record)
        finally:
            fcntl.flock(self.lock_file, fcntl.LOCK_UN)

    def _current(self, stream: TextIO) -> bool:
        """Whether `stream` is the file at the log's path (not rotated away since)."""
        try:
            at_path = os.stat(self.baseFilename)
        except FileNotFoundError:
            return False
        opened = os.fstat(stream.fileno())
        return (at_path.st_dev, at_path.st_ino) == (opened.st_dev, opened.st_ino)

    def close(self) -> None:
        """Close the log file and the lock file."""
        try:
            super().close()
        finally:
            if self.lock_file is not None:
                self.lock_file.close()
                self.lock_file = None


class JsonStderrHandler(logging.StreamHandler):
    """JSON lines on stderr when ML_PLATFORM_LOG_FORMAT=json; silent otherwise."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.enabled = Settings().json_logs
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record only when JSON output was asked for."""
        if self.enabled:
            super().emit(record)
