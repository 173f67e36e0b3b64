"""raw_data: the delivery of each day as parsed, kept as it arrived.

Write-audit-publish: raw_data records each delivery that fits the contract's schema as its
partition; validated_data audits it through the quality gate and publishes the accepted layer
only when the day passes. A day that fails keeps its previously accepted validated_data and
everything downstream; a rejected file's parse is kept in the day's quarantine
(`rejected_key`), linked from the failed check.
"""

import csv
import dataclasses
import datetime as dt
import decimal
import hashlib
import io
import re
import unicodedata
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import IO, Any

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.schema import raw_schema
from ml_platform.ingestion.landing import (
    LandingStore,
    MissingLandingFileError,
    RefusedLandingFileError,
)
from ml_platform.platform.datasets import asset_key, dataset_name, op_name, writer_pool
from ml_platform.platform.formats import FORMAT_KEY, serialise_into
from ml_platform.platform.observability import record_bytes_read, table_schema
from ml_platform.platform.records import DayRecord
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.platform.runbook import check_description
from ml_platform.platform.sizes import request_metadata, step_tags
from ml_platform.platform.steps import (
    DataVerdict,
    Verdict,
    daily_backfill_policy,
    daily_check_spec,
    each_day,
)
from ml_platform.platform.storage import LakeStorage

RAW_SCHEMA_CHECK = "raw_schema"
SCHEMA_CHANGE_CHECK = "schema_change"


def rejected_key(contract: Contract, day: str, run_id: str) -> str:
    """Where the parse of a file a gate rejected in run `run_id` is kept."""
    return f"{contract.name}/quarantine/{day}/{run_id}.raw_data.parquet"


def keep_rejected(lake: LakeStorage, key: str, frame: pd.DataFrame) -> dg.MetadataValue:
    """Store a rejected parse under `key`; the link for the failed check's metadata.

    A column read with mixed types (numbers and text in one column) is stored as text, so that
    the parse of any readable file can be kept.
    """
    mixed = {str(c): "str" for c in frame.columns if frame[c].dtype == object}
    kept = frame.astype(mixed) if mixed else frame
    lake.write_with(key, lambda handle: serialise_into(kept, "parquet", handle))
    return dg.MetadataValue.path(lake.uri(key))


def storable(frame: pd.DataFrame, contract: Contract) -> pd.DataFrame:
    """An accepted parse as parquet can store it: its columns read as Python objects cast.

    pandas reads a number beyond 64 bits (1e23 written out in digits) as a Python int, which
    parquet cannot hold: in a float column it is the float it names; in an extra column, where
    the contract says nothing of its type, it is kept as its text. Other columns stay as read.
    """
    floats = {c.name for c in contract.columns if c.dtype == "float"}
    declared = set(contract.column_names)
    read_as_objects = [str(name) for name in frame.columns if frame[name].dtype == object]
    texts = {name: "str" for name in read_as_objects if name not in declared}
    stored = frame.astype(texts) if texts else frame
    numbers = {
        # raw_schema accepted each value as a number, as pandas' to_numeric reads it.
        name: pd.to_numeric(stored[name]).astype("float64")
        for name in read_as_objects
        if name in floats
    }
    return stored.assign(**numbers) if numbers else stored


class LandingFileError(ValueError):
    """A landed file exists but cannot be read as its declared format."""


@dataclasses.dataclass(frozen=True)
class LandedFile:
    """A landed file parsed as-is, with the sha256 and size of its bytes."""

    frame: pd.DataFrame
    sha256: str
    size: int
    # Header names read as the contract's column they spell in another Unicode form.
    renamed: Mapping[str, str] = dataclasses.field(default_factory=dict)


class _ReadOnce(io.RawIOBase):
    """A binary stream passed through as it is read: hashed, counted, first and last line kept.

    raw_data parses a landed file from the store's stream instead of holding its bytes next to
    the frame (134 MB at 1M rows); what the step needs of the bytes is taken on the way.
    """

    def __init__(self, raw: IO[bytes]):
        super().__init__()
        self.raw = raw
        self.hash = hashlib.sha256()
        self.size = 0
        self.header = b""
        self.header_done = False
        # The bytes after the last line break (CR or LF) that is followed by content (the last
        # line and any line breaks after it), and their offset in the file.
        self.tail = b""
        self.tail_start = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        chunk = self.raw.read() if size is None or size < 0 else self.raw.read(size)
        if chunk:
            self._take(chunk)
        return chunk

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)

    def _take(self, chunk: bytes) -> None:
        self.hash.update(chunk)
        self.size += len(chunk)
        if not self.header_done:
            # A classic Mac export ends its lines with CR alone: the header ends at either.
            cut = _first_break(chunk)
            self.header += chunk if cut < 0 else chunk[:cut]
            self.header_done = cut >= 0
        tail = self.tail + chunk
        end = _content_end(tail)
        cut = max(tail.rfind(b"\n", 0, end), tail.rfind(b"\r", 0, end))
        if cut >= 0:
            self.tail_start += cut + 1
            tail = tail[cut + 1 :]
        self.tail = tail

    def drain(self) -> None:
        """Read what the parser left, so the hash and size cover the whole file."""
        while self.read(1 << 20):
            pass


def _semicolons(landed: _ReadOnce) -> str:
    """What is wrong with a header separated by semicolons (a European spreadsheet's CSV), or ''."""
    if b";" in landed.header and b"," not in landed.header:
        return "its header is separated by ';', not ','; export it comma-separated"
    return ""


def _first_break(data: bytes) -> int:
    """Offset of the first line break (CR or LF) in `data`, or -1."""
    breaks = [i for i in (data.find(b"\r"), data.find(b"\n")) if i >= 0]
    return min(breaks, default=-1)


def _content_end(data: bytes) -> int:
    """Length of `data` without its trailing line breaks (offsets: rstrip would copy)."""
    end = len(data)
    while end and data[end - 1] in b"\r\n":
        end -= 1
    return end


def read_landed_stream(
    stream: IO[bytes],
    file_name: str,
    partition: str,
    text_columns: Sequence[str] = (),
    int_columns: Sequence[str] = (),
    declared: Sequence[str] = (),
) -> LandedFile:
    """Parse a landed CSV from a binary stream read once, front to back; see `read_landed_file`.

    The sha256 and size of the bytes are taken as they are read, so the file's bytes are never
    held whole: a local file or an S3 object body parse alike.
    """
    landed = _ReadOnce(stream)
    # An int column is read as text and then made Int64 from its digits (`exact_ints`): read as
    # a number, a column with a blank is float64, which holds no integer above 2**53 exactly.
    # Each name in both Unicode forms, as a header may spell it (`declared_names`).
    as_text = {
        form: "str"
        for name in [*text_columns, *int_columns]
        for form in {name, unicodedata.normalize("NFC", name), unicodedata.normalize("NFD", name)}
    }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            frame = pd.read_csv(
                landed,
                keep_default_na=False,
                na_values=[""],
                index_col=False,
                dtype=as_text,
            )
        landed.drain()
        _check_last_line(landed, frame)
        names = _header_names(landed)
    except UnicodeDecodeError as exc:
        # The codec's position counts from the start of a chunk the parser read, not the file.
        raise LandingFileError(
            f"{file_name} (partition {partition}) is not a readable CSV file: it is not "
            f"{exc.encoding} text (byte {exc.object[exc.start]:#04x}: {exc.reason}); save it as "
            "UTF-8 (a spreadsheet's 'CSV UTF-8')"
        ) from exc
    except (
        pd.errors.ParserError,
        pd.errors.ParserWarning,
        pd.errors.EmptyDataError,
        csv.Error,
    ) as exc:
        raise LandingFileError(
            f"{file_name} (partition {partition}) is not a readable CSV file: "
            f"{_semicolons(landed) or exc}"
        ) from exc
    # Renamed first, so that a name written in both Unicode forms is the one name twice.
    renamed = declared_names(names, declared)
    names = [renamed.get(name, name) for name in names]
    # pandas reads a repeated name as a second column `name.1`: one of the two would be taken
    # for the contract's column without a word. Empty names (a spreadsheet's trailing empty
    # columns) name no column anyone means: pandas reads them as `Unnamed: <n>` extra columns.
    repeated = sorted({name for name in names if name and names.count(name) > 1})
    if repeated:
        raise LandingFileError(
            f"{file_name} (partition {partition}) is not a readable CSV file: its header names "
            f"{', '.join(map(repr, repeated))} more than once; which one is meant is not known"
        )
    if renamed:
        frame = frame.rename(columns=renamed)
    ints = [name for name in int_columns if name in frame.columns]
    if ints:
        frame = frame.assign(**{name: exact_ints(frame[name]) for name in ints})
    return LandedFile(
        frame=frame, sha256=landed.hash.hexdigest(), size=landed.size, renamed=renamed
    )


def declared_names(names: Sequence[str], declared: Sequence[str]) -> dict[str, str]:
    """Header names that spell a declared column in another Unicode form, each to its spelling.

    macOS tools and some exports write an accent as a letter and a combining mark (NFD): such
    a name prints as the contract's and means it, so it is read as the contract's column.
    """
    spelling = {unicodedata.normalize("NFC", name): name for name in declared}
    found = {}
    for name in names:
        meant = spelling.get(unicodedata.normalize("NFC", name))
        if meant is not None and meant != name:
            found[name] = meant
    return found


# A number as a CSV writes one: digits with an optional sign, point and exponent.
_NUMBER = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")


def exact_ints(text: pd.Series) -> pd.Series:
    """An int column's text as Int64, each value exact; as pandas infers it if one does not fit.

    Whole numbers written with a point or an exponent (1.0, 1e3) are taken from their digits,
    not through a float. A value that is no whole number within Int64's range (a word, 3.5,
    2**63) fails `raw_schema`, which names the column and the value: the column is then read
    as pandas reads any other, so that the check and the kept parse show it as they always did.
    """
    try:
        # Arrow parses plain digits straight to int64: exact, and fast for the usual column.
        return text.astype("int64[pyarrow]").astype("Int64")
    except (TypeError, ValueError):
        pass  # a sign, a space, a point or a word: value by value below
    present = text.dropna()
    numbers = pd.to_numeric(present, errors="coerce", dtype_backend="numpy_nullable")
    if numbers.dtype != "Int64" or numbers.isna().any():
        exact = {value: _whole_number(value) for value in present.unique()}
        if any(number is None for number in exact.values()):
            return _inferred(text)
        numbers = present.map(exact).astype("Int64")
    return numbers.reindex(text.index)


def _inferred(text: pd.Series) -> pd.Series:
    """A column read as text, read again as `read_landed_stream` reads a column of no dtype."""
    written = text.to_csv(index=False, header=False)
    again = pd.read_csv(
        io.StringIO(written),
        header=None,
        keep_default_na=False,
        na_values=[""],
        skip_blank_lines=False,
        index_col=False,
    )
    # A blank stays missing: beside a number beyond 64 bits pandas would read it as ''.
    return again.iloc[:, 0].set_axis(text.index).rename(text.name).where(text.notna())


def _whole_number(value: str) -> int | None:
    """The whole number a CSV field writes, if it writes one within Int64's range."""
    if not _NUMBER.fullmatch(value):
        return None
    number = decimal.Decimal(value)
    # 1e999999999 is whole, and making it an int would take its billion digits' memory.
    if number.adjusted() > 18 or number != number.to_integral_value():
        return None
    whole = int(number)
    return whole if -(2**63) <= whole < 2**63 else None


def read_landed_file(
    data: bytes,
    file_name: str,
    partition: str,
    text_columns: Sequence[str] = (),
    int_columns: Sequence[str] = (),
    declared: Sequence[str] = (),
) -> pd.DataFrame:
    """Parse a landed CSV as-is, with inferred types except for `text_columns`, read as text.

    Only empty fields are read as missing, so text like 'n/a' in a number column stays visible
    to the schema check instead of silently becoming NaN; text columns keep text that looks
    like a number ('00501' stays '00501'). `int_columns` are Int64 with every digit kept
    (`exact_ints`), and a header that spells a `declared` column in another Unicode form is read
    as that column (`declared_names`). A row with more fields than the header is an error, not
    a shift of its values into other columns.
    """
    stream = io.BytesIO(data)
    landed = read_landed_stream(stream, file_name, partition, text_columns, int_columns, declared)
    return landed.frame


def _header_names(landed: _ReadOnce) -> list[str]:
    """The names of the header's columns, as written."""
    return next(csv.reader([landed.header.decode("utf-8-sig")]), [])


# The rest of a quoted field: text and doubled quotes up to its closing quote.
_QUOTED_REST = re.compile(r'[^"]*(?:""[^"]*)*"')


def _field_count(line: str, quoted: bool = False) -> int:
    """How many fields one line of CSV holds; `quoted`: it starts inside a quoted field.

    As pandas and Python's csv read a line: a quote opens a quoted field only at a field's
    start, where a doubled quote is one quote and a comma no separator. Counted without
    Python's csv, whose field size limit (128 KiB) a long text value would exceed.
    """
    count, at = 1, 0
    while True:
        if quoted or line.startswith('"', at):
            closed = _QUOTED_REST.match(line, at if quoted else at + 1)
            if closed is None:
                return count
            at, quoted = closed.end(), False
        comma = line.find(",", at)
        if comma < 0:
            return count
        count, at = count + 1, comma + 1


def _check_last_line(landed: _ReadOnce, frame: pd.DataFrame) -> None:
    """A file cut off mid-row ends with a row of fewer fields than its header.

    pandas fills the missing fields with NaN, so the cut would pass as missing values. Only the
    last row can be cut, so only it is compared with the header; the parsed last row must miss
    those fields too. A last row whose quoted field spans lines ends on a line that starts
    inside that field: the row's fields are those up to the field (the last value of the
    parsed row that holds a line break) and those of its last line.
    """
    if landed.tail_start == 0 or frame.empty:
        return
    header = _field_count(landed.header.decode("utf-8-sig"))
    line = landed.tail[: _content_end(landed.tail)].decode()
    spanning = [
        i
        for i, value in enumerate(frame.iloc[-1])
        if isinstance(value, str) and ("\n" in value or "\r" in value)
    ]
    fields = spanning[-1] + _field_count(line, quoted=True) if spanning else _field_count(line)
    if fields < header and frame.iloc[-1, fields:].isna().all():
        raise pd.errors.ParserError(
            f"its last line has {fields} of the header's {header} fields: the file looks truncated"
        )


def schema_check_result(
    frame: pd.DataFrame,
    contract: Contract,
    file_name: str,
    partition: str,
    keep: Callable[[], dg.MetadataValue] | None = None,
):
    """The blocking schema check of a landed file, with a description a person can act on.

    `keep` stores the parse of a file that fails and returns its link; it is called only then.
    """
    report = raw_schema(frame, contract)
    links: dict[str, dg.MetadataValue] = {}
    if report.ok:
        description = f"{file_name} (partition {partition}): {report.describe()}."
    else:
        if keep is not None:
            links["rejected_parse"] = keep()
        description = (
            f"{file_name} (partition {partition}) does not match contract '{contract.name}': "
            f"{report.describe()}. The day is recorded rejected; an earlier accepted delivery "
            "of it is kept. Fix the upstream export and re-land the file, or "
            "change the contract if the change is intended."
        )
    return dg.AssetCheckResult(
        check_name=RAW_SCHEMA_CHECK,
        passed=report.ok,
        severity=dg.AssetCheckSeverity.ERROR,
        description=description,
        metadata={
            "file": file_name,
            "missing_columns": report.missing,
            "unexpected_columns": report.unexpected,
            "retyped_columns": report.retyped,
            "unreadable_columns": report.unreadable,
            **links,
        },
    )


def delivery_failed_result(file_name: str, reason: str) -> dg.AssetCheckResult:
    """The failed `raw_schema` check of a day whose file is missing or cannot be read."""
    return dg.AssetCheckResult(
        check_name=RAW_SCHEMA_CHECK,
        passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(
            f"{reason}. The day is recorded rejected; an earlier accepted delivery of it is kept. "
            "Land a readable file for the day (the landing sensor then runs it)."
        ),
        metadata={"file": file_name},
    )


def schema_change_result(
    current: dg.TableSchema,
    previous: dg.TableSchema | None,
    previous_day: str,
    where: str,
    rows: int,
    previous_rows: int = 1,
    declared: Collection[str] = (),
) -> dg.AssetCheckResult:
    """Warn when a day's columns differ from the previous day's: new, missing or retyped.

    A file of 0 rows (a header alone), this day's (`rows`) or the previous day's
    (`previous_rows`), has no values to read types from: only the names of the columns are
    compared, and the description says so. The `declared` columns (the contract's) have the
    contract's type whatever their parse's: a nullable int column reads as float on a day with
    a blank, and a value that misfits its type fails `raw_schema`; only the others' types,
    inferred from their values, are compared.
    """
    if previous is None:
        return dg.AssetCheckResult(
            check_name=SCHEMA_CHANGE_CHECK,
            passed=True,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"{where}: no accepted delivery of {previous_day} to compare with.",
        )
    before = {c.name: c.type for c in previous.columns}
    now = {c.name: c.type for c in current.columns}
    new = [c for c in now if c not in before]
    missing = [c for c in before if c not in now]
    typed = rows > 0 and previous_rows > 0
    retyped = {
        c: f"{before[c]} -> {now[c]}"
        for c in now
        if typed and c in before and c not in declared and now[c] != before[c]
    }
    changes = []
    if new:
        changes.append(f"new column(s) {', '.join(new)}")
    if missing:
        changes.append(f"missing column(s) {', '.join(missing)}")
    changes += [f"column {c} changed type {change}" for c, change in retyped.items()]
    return dg.AssetCheckResult(
        check_name=SCHEMA_CHANGE_CHECK,
        passed=not changes,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"{where}: schema changed since {previous_day}: {'; '.join(changes)}. Ask the "
            "upstream owner whether the change is intended before it reaches the model."
            if changes
            else f"{where}: same columns and types as {previous_day}."
            if typed
            else f"{where}: the file holds no rows, so its columns have no types to compare; "
            f"same column names as {previous_day}."
            if not rows
            else f"{where}: {previous_day}'s file held no rows, so its columns have no types to "
            "compare; same column names."
        ),
        metadata={"new_columns": new, "missing_columns": missing, "retyped_columns": retyped},
    )


def previous_column_schema(
    context: dg.AssetExecutionContext,
    contract: Contract,
    day: str,
    computed: Mapping[str, tuple[dg.TableSchema, int]],
) -> tuple[str, dg.TableSchema | None, int]:
    """The previous day, its column schema and row count, as `computed` here or as recorded.

    In a range, the step's days are recorded only when the whole run is: the day before one of
    them is in `computed` (accepted) or asked of Dagster (the day before the range, a rejected
    day's earlier accepted delivery). A rejected re-delivery that kept the day's accepted
    version records no columns: those of the record that accepted that version are read.
    """
    previous = dt.date.fromisoformat(day) - dt.timedelta(days=1)
    previous_day = previous.isoformat()
    if previous_day in computed:
        return previous_day, *computed[previous_day]
    if previous < contract.partitions.start_date:
        return previous_day, None, 0
    records = dg.AssetRecordsFilter(asset_key=context.asset_key, asset_partitions=[previous_day])
    cursor = None
    while True:
        found = context.instance.fetch_materializations(records, limit=10, cursor=cursor)
        for record in found.records:
            if record.asset_materialization is None:
                continue
            if not DayRecord.of(record).accepted:
                return previous_day, None, 0
            metadata = record.asset_materialization.metadata
            schema, rows = metadata.get("dagster/column_schema"), metadata.get("dagster/row_count")
            if schema is not None:
                # A record without a row count is one made before the count was kept: it had rows.
                return previous_day, schema.value, int(rows.value) if rows is not None else 1
        if not found.has_more:
            return previous_day, None, 0
        cursor = found.cursor


def build_raw_data(contract: Contract, partitions: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    """The raw_data asset of a dataset."""

    @dg.asset(
        name="raw_data",
        key_prefix=contract.name,
        pool=writer_pool(contract.name, "raw_data"),
        partitions_def=partitions,
        backfill_policy=daily_backfill_policy(),
        retry_policy=STORAGE_RETRY_POLICY,
        group_name=dataset_name(contract.name, "ingestion"),
        kinds={"csv", "parquet"},
        metadata={
            FORMAT_KEY: "parquet",
            "dataset": contract.name,
            **request_metadata(contract, "raw_data"),
        },
        op_tags=step_tags(contract, "raw_data"),
        check_specs=[
            daily_check_spec(
                RAW_SCHEMA_CHECK,
                asset_key(contract.name, "raw_data"),
                partitions,
                description=check_description(
                    RAW_SCHEMA_CHECK,
                    "The landed file has the contract's columns, each of a castable type.",
                ),
            ),
            daily_check_spec(
                SCHEMA_CHANGE_CHECK,
                asset_key(contract.name, "raw_data"),
                partitions,
                description=check_description(
                    SCHEMA_CHANGE_CHECK,
                    "The file has the same columns and types as the previous day's.",
                ),
            ),
        ],
    )
    def raw_data(
        context: dg.AssetExecutionContext, landing: LandingStore, lake: LakeStorage
    ) -> Iterator:
        """The delivery of day D as parsed: the landed file read as-is, stored as parquet.

        Its schema is checked against the dataset contract: a mismatch (a missing column, a
        value that does not fit its column's type), like a missing or unreadable file, fails
        the `raw_schema` check and records the day rejected (a verdict, not a run failure): no
        file is stored, an earlier accepted delivery of the day is kept, and the days after it
        record "no accepted input". `schema_change` warns when the columns differ from the
        previous day's. validated_data judges what raw_data stored; only it publishes the
        accepted layer (write-audit-publish).
        """
        text_columns = [c.name for c in contract.columns if c.dtype == "str"]
        int_columns = [c.name for c in contract.columns if c.dtype == "int"]
        # Schemas of the days this step has accepted, which the next day compares with.
        schemas: dict[str, tuple[dg.TableSchema, int]] = {}

        def day_of_raw_data(day: str) -> Iterator:
            file_name = contract.landing.file_name(day)
            where = f"{file_name} (partition {day})"
            try:
                with landing.open_file(file_name, day) as stream:
                    landed = read_landed_stream(
                        stream,
                        file_name,
                        day,
                        text_columns,
                        int_columns,
                        declared=contract.column_names,
                    )
            except (MissingLandingFileError, RefusedLandingFileError, LandingFileError) as exc:
                # Retrying will not land a file, repair one nor turn a link into a file: the day
                # is recorded rejected (the landing sensor runs it again when a file lands). A
                # refused entry was never opened, so the message holds its name and the reason,
                # nothing of what it points at.
                verdict = (
                    Verdict.MISSING_FILE
                    if isinstance(exc, MissingLandingFileError)
                    else Verdict.UNREADABLE_FILE
                )
                yield delivery_failed_result(file_name, str(exc))
                raise DataVerdict(verdict, str(exc), {"file": file_name}) from exc
            # The landed file is this step's input; the lake IO manager counts the others'.
            record_bytes_read(op_name(contract.name, "raw_data"), landed.size)
            frame = landed.frame
            renamed = dict(landed.renamed)
            if renamed:
                context.log.warning(
                    f"{where}: header name(s) {', '.join(map(ascii, renamed))} spell the "
                    "contract's column(s) in another Unicode form (accents as separate marks, "
                    f"NFD) and are read as {', '.join(map(ascii, renamed.values()))}"
                )
            schema = table_schema(frame)
            previous_day, previous, previous_rows = previous_column_schema(
                context, contract, day, schemas
            )
            yield schema_change_result(
                schema,
                previous,
                previous_day,
                where,
                len(frame),
                previous_rows,
                declared=contract.column_names,
            )
            rejected = rejected_key(contract, day, context.run.run_id)
            check = schema_check_result(
                frame, contract, file_name, day, keep=lambda: keep_rejected(lake, rejected, frame)
            )
            yield check
            if not check.passed:
                raise DataVerdict(
                    Verdict.SCHEMA_MISMATCH,
                    check.description or "",
                    {
                        "rejected_parse": dg.MetadataValue.path(lake.uri(rejected)),
                        "content_sha256": landed.sha256,
                    },
                )
            schemas[day] = (schema, len(frame))
            yield dg.MaterializeResult(
                value=storable(frame, contract),
                metadata={
                    "dagster/row_count": len(frame),
                    "dagster/column_schema": schema,
                    "source_file": dg.MetadataValue.path(str(landing.path_for(file_name))),
                    "source_bytes": landed.size,
                    # What changed between two deliveries of a day, at a glance.
                    "content_sha256": landed.sha256,
                    # Header names as written -> the contract's columns they were read as.
                    **({"renamed_columns": renamed} if renamed else {}),
                },
            )

        yield from each_day(context, day_of_raw_data)

    return raw_data
