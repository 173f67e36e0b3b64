"""Schema of landed files and typing of their rows, per the dataset contract.

Pure functions of frames: the raw schema check says which columns are missing, unexpected or of
the wrong type (with sample values); typing casts each column to its contract dtype, assembles
the local event time and derives the label.
"""

import dataclasses
import datetime as dt
import functools
import operator
import unicodedata
import zoneinfo

import numpy as np
import pandas as pd
from dateutil import parser as dateutil_parser

from ml_platform.contracts import ColumnSpec, Contract
from ml_platform.contracts.model import EVENT_TIME, LOCAL_EVENT_TIME

SAMPLE_SIZE = 5
PANDAS_DTYPES = {
    "int": "Int64",
    "float": "float64",
    "str": "str",
    "bool": "boolean",
    "datetime": "datetime64[ns]",
}
LABEL_OPS = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
TRUE_WORDS = {"true", "1", "yes", "t", "y"}
FALSE_WORDS = {"false", "0", "no", "f", "n"}
# The range of an int column's storage (Int64): a whole number outside it (1e308, say) does not
# fit, however integral it is, and would only fail later, inside the cast.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# pandas parses text through one Python string per value: about 120 MB held at once for 1M ISO
# times, 15 times the parsed column. Parsing slices of this many rows bounds that.
PARSE_ROWS = 100_000
# An ISO 8601 time that ends in a UTC offset: "Z", "+01:00", "+0100" or "-05".
WITH_OFFSET = r"\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s*(?:[zZ]|[+-]\d{2}(?::?\d{2})?)$"


class ContractViolationError(ValueError):
    """Rows of a partition cannot be made to fit the contract."""


@dataclasses.dataclass(frozen=True)
class SchemaReport:
    """How a frame's columns differ from the contract."""

    missing: list[str]
    unexpected: list[str]
    retyped: dict[str, str]  # column -> what was found instead of the contract dtype
    # Event-time column -> values that give no event time (an hour, a date, a zone name).
    unreadable: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the frame fits the contract's columns and types."""
        return not (self.missing or self.unexpected or self.retyped or self.unreadable)

    def describe(self) -> str:
        """The differences in words, or a statement that there are none."""
        parts = []
        if self.missing:
            parts.append(f"missing column(s) {', '.join(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected column(s) {', '.join(self.unexpected)}")
        parts.extend(f"column {col} {found}" for col, found in self.retyped.items())
        parts.extend(f"column {col} {found}" for col, found in self.unreadable.items())
        # A name that differs only by spaces, case or Unicode form (an accent written as a
        # letter and a combining mark, as macOS tools write it) looks the same in the list.
        near = {_near(name): name for name in self.unexpected}
        parts.extend(
            f"the file's {near[_near(name)]!r} is the contract's {name!r} but for spaces, case "
            "or Unicode form (NFC); rename it upstream"
            for name in self.missing
            if _near(name) in near
        )
        if any(";" in name for name in self.unexpected):
            parts.append("the header looks separated by ';', not ','; export it comma-separated")
        return "; ".join(parts) if parts else "columns and types match the contract"


def _near(name: str) -> str:
    """A column name without what a reader does not see: outer spaces, case, Unicode form."""
    return unicodedata.normalize("NFC", name.strip()).casefold()


def parse_times(series: pd.Series, errors: str) -> pd.Series:
    """ISO 8601 text to datetimes, as `pd.to_datetime(series, errors=errors, format="ISO8601")`.

    Times with different UTC offsets (a day that changes to or from summer time), which pandas
    refuses to hold in one column even when coercing, are each the instant they name, in UTC. A
    time without an offset among them names no instant: a bad value (NaT when coercing).
    """

    def parse(part: pd.Series) -> pd.Series:
        try:
            return pd.to_datetime(part, errors=errors, format="ISO8601")
        except ValueError:
            if part.dtype.kind == "M":
                raise
            aware = part.astype("str").str.strip().str.contains(WITH_OFFSET, regex=True)
            if not aware.any():
                raise
            if errors == "raise" and not aware.all():
                raise ValueError(
                    f"{int((~aware).sum())} time(s) without a UTC offset among times with one"
                ) from None
            return pd.to_datetime(part.where(aware), errors=errors, format="ISO8601", utc=True)

    if len(series) <= PARSE_ROWS:
        return parse(series)
    parts = [parse(series.iloc[i : i + PARSE_ROWS]) for i in range(0, len(series), PARSE_ROWS)]
    if len({part.dtype for part in parts}) > 1:
        # Slices that differ in time zone or resolution: the whole column is parsed at once,
        # not returned as a column of objects.
        return parse(series)
    return pd.concat(parts)


def _fits_int64(numbers: pd.Series) -> pd.Series:
    """Whether each number is a whole number within Int64's range."""
    if pd.api.types.is_integer_dtype(numbers):
        # Only an unsigned column (numbers above 2**63 - 1) can hold one that does not fit.
        return numbers <= INT64_MAX if numbers.dtype.kind == "u" else numbers == numbers
    # As floats, -2**63 and 2**63 are exact and every float below 2**63 is at most 2**63 - 1024.
    return (numbers % 1 == 0) & (numbers >= float(INT64_MIN)) & (numbers < -float(INT64_MIN))


def _numbers_that_fit(series: pd.Series, spec: ColumnSpec) -> bool:
    """Whether every value is of a numeric dtype the contract's one holds as it is.

    Any signed integer or float is a float; any signed integer fits Int64. Most landed number
    columns are such, and need no value-by-value look.
    """
    kind = series.dtype.kind
    return (spec.dtype == "float" and kind in "if") or (spec.dtype == "int" and kind == "i")


def _bad_values(series: pd.Series, spec: ColumnSpec) -> pd.Series:
    """Non-null values of `series` that cannot be cast to the column's contract dtype."""
    if spec.dtype == "str" or _numbers_that_fit(series, spec):
        return series.iloc[0:0]
    present = series.dropna()
    if present.empty:
        return present.iloc[0:0]
    if spec.dtype in ("int", "float"):
        if pd.api.types.is_bool_dtype(present):
            return present
        numbers = pd.to_numeric(present, errors="coerce")
        bad = numbers.isna()
        if spec.dtype == "int":
            bad |= numbers.notna() & ~_fits_int64(numbers)
        return present[bad]
    if spec.dtype == "bool":
        if pd.api.types.is_bool_dtype(present):
            return present.iloc[0:0]
        # 1/0 with a blank among them is read as 1.0/0.0: as text, "1" and "0".
        words = _as_text(present).str.lower()
        return present[~words.isin(TRUE_WORDS | FALSE_WORDS)]
    parsed = parse_times(present, "coerce")
    return present[parsed.isna()]


def raw_schema(frame: pd.DataFrame, contract: Contract) -> SchemaReport:
    """Compare a landed frame's columns and value types with the contract."""
    expected = contract.column_names
    missing = [c for c in expected if c not in frame.columns]
    unexpected = (
        [] if contract.allow_extra_columns else [str(c) for c in frame.columns if c not in expected]
    )
    retyped = {}
    for spec in contract.columns:
        if spec.name not in frame.columns:
            continue
        bad = _bad_values(frame[spec.name], spec)
        if not bad.empty:
            sample = ", ".join(repr(v) for v in bad.astype(str).unique()[:SAMPLE_SIZE])
            retyped[spec.name] = (
                f"should be {spec.dtype} but {len(bad)} of {len(frame)} value(s) are not, "
                f"e.g. {sample}"
            )
    unreadable = {
        name: found
        for name, found in _event_time_misfits(frame, contract).items()
        if name not in retyped and name not in missing
    }
    return SchemaReport(
        missing=missing, unexpected=unexpected, retyped=retyped, unreadable=unreadable
    )


# Two defaults that differ in every date field: a field a text leaves out takes the default's,
# so parsing it with both tells which fields it gave.
_DEFAULTS = (dt.datetime(2000, 1, 1), dt.datetime(2001, 2, 2))


def _parsed_twice(text: str) -> tuple[dt.datetime, dt.datetime] | None:
    try:
        first, second = (dateutil_parser.parse(text, default=d) for d in _DEFAULTS)
    except (ValueError, OverflowError):
        return None
    return first, second


@functools.lru_cache(maxsize=4096)
def _time_of_day(text: str) -> pd.Timedelta | None:
    """The time of day an hour value names ("6", "6am", "18:00", "6 PM"), or None."""
    if text.isdigit():
        # dateutil reads a lone number as a day of the month; in an hour column it is the hour.
        hour = int(text)
        return pd.Timedelta(hours=hour) if hour <= 23 else None
    parsed = _parsed_twice(text)
    if parsed is None or parsed[0].tzinfo is not None:
        return None
    first, second = parsed
    if (first.date(), second.date()) != tuple(d.date() for d in _DEFAULTS):
        return None  # the text holds a date, so it is no hour of the day
    return pd.Timedelta(hours=first.hour, minutes=first.minute, seconds=first.second)


@functools.lru_cache(maxsize=4096)
def _calendar_date(text: str) -> pd.Timestamp | None:
    """The date a text names in full ("2024-03-05", "03/05/2024", "March 5, 2024"), or None."""
    parsed = _parsed_twice(text)
    if parsed is None or parsed[0] != parsed[1]:
        return None  # no date, or one missing its year, month or day
    if parsed[0].tzinfo is not None or parsed[0].time() != dt.time(0):
        return None  # a time of day here would contradict the hour column
    return pd.Timestamp(parsed[0])


def _by_value(values: pd.Series, parse) -> pd.Series:
    """`parse` of each value's text, computed once per distinct value (a day repeats them)."""
    text = _as_text(values)
    distinct = {v: parse(v) for v in text.dropna().unique()}
    return text.map(distinct)


def _as_text(values: pd.Series) -> pd.Series:
    """Values as stripped text, missing where missing; whole floats (6.0) lose their '.0'."""
    if pd.api.types.is_float_dtype(values):
        whole = values.dropna() % 1 == 0
        if whole.all():
            values = values.astype("Int64")
    return values.astype("str").where(values.notna()).str.strip()


def time_of_day(values: pd.Series) -> pd.Series:
    """Each hour value as a time of day (timedelta64); NaT where missing or no hour."""
    return pd.to_timedelta(_by_value(values, _time_of_day))


def calendar_dates(values: pd.Series) -> pd.Series:
    """Each date text as a date at midnight (datetime64); NaT where missing or no full date."""
    return pd.to_datetime(_by_value(values, _calendar_date)).astype("datetime64[ns]")


@functools.cache
def known_zones() -> frozenset[str]:
    """The IANA timezone names this machine's zone database holds."""
    return frozenset(zoneinfo.available_timezones())


def _sample(values: pd.Series, limit: int = SAMPLE_SIZE) -> str:
    return ", ".join(repr(v) for v in values.astype(str).unique()[:limit])


def _times(values: pd.Series) -> pd.Series:
    """Each event-time text as the typing parses it; NaT where it gives no time."""
    return parse_times(values, "coerce")


def _event_time_misfits(frame: pd.DataFrame, contract: Contract) -> dict[str, str]:
    """Event-time columns whose values give no event time, with how many and a sample."""
    spec = contract.event_time
    found = {}
    checks = []
    if spec.hour is not None:
        checks.append((spec.hour, time_of_day, "an hour of the day (0-23, '6am', '18:00', '6 PM')"))
        if spec.column is not None:
            checks.append((spec.column, calendar_dates, "a full date (e.g. 2024-03-05)"))
    elif spec.column is not None and contract.column(spec.column).dtype == "str":
        # A datetime column's values are checked as its type; a text one is the event time's
        # only as the typing parses it, which must not meet a value it cannot read.
        checks.append((spec.column, _times, "an ISO 8601 time (e.g. 2024-03-05T10:00:00)"))
    for name, parse, wanted in checks:
        if name not in frame.columns:
            continue
        values = frame[name]
        bad = values[values.notna() & parse(values).isna()]
        if not bad.empty:
            found[name] = (
                f"should hold {wanted} but {len(bad)} of {len(frame)} value(s) do not, "
                f"e.g. {_sample(bad)}"
            )
    zones = spec.timezone_column
    if zones is not None and zones in frame.columns:
        names = _as_text(frame[zones]).dropna()
        unknown = sorted(set(names.unique()) - known_zones())
        if unknown:
            count = int(names.isin(unknown).sum())
            found[zones] = (
                f"should hold IANA timezone names (e.g. Europe/Paris) but {count} of "
                f"{len(frame)} row(s) name unknown zones: {', '.join(map(repr, unknown[:20]))}"
                + (f" and {len(unknown) - 20} more" if len(unknown) > 20 else "")
            )
    return found


def _cast(series: pd.Series, spec: ColumnSpec, where: str) -> pd.Series:
    try:
        return _cast_values(series, spec)
    except (TypeError, ValueError, OverflowError) as exc:
        # raw_schema admits only castable values, so this is a value it did not foresee: named
        # with its column and file, as a data error, not as a crash of the step.
        bad = _bad_values(series, spec)
        example = f", e.g. {bad.iloc[0]!r}" if not bad.empty else ""
        raise ContractViolationError(
            f"{where}: column {spec.name} does not cast to {spec.dtype}{example}: {exc}"
        ) from exc


def _cast_values(series: pd.Series, spec: ColumnSpec) -> pd.Series:
    if spec.dtype == "str":
        # A text column (most are, as landed) is only stripped: its missing values stay so.
        text = series if series.dtype == "str" else series.astype("str").where(series.notna())
        text = text.str.strip()
        return text.mask(text == "").astype("str")
    if spec.dtype in ("int", "float"):
        return pd.to_numeric(series, errors="raise").astype(PANDAS_DTYPES[spec.dtype])
    if spec.dtype == "bool":
        words = _as_text(series).str.lower()
        return words.isin(TRUE_WORDS).astype("boolean").mask(series.isna())
    parsed = parse_times(series, "raise")
    if getattr(parsed.dt, "tz", None) is not None:
        parsed = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    return parsed.astype("datetime64[ns]")


def local_event_times(raw: pd.DataFrame, typed: pd.DataFrame, contract: Contract) -> pd.Series:
    """Local (wall-clock, naive) event time of each row, per the contract.

    A zone-aware source (e.g. '...Z') is converted to the contract's timezone; a naive one is
    taken as local time already. It is parsed from the raw column because typing stores
    datetime columns as naive UTC.
    """
    spec = contract.event_time
    if spec.hour is not None:
        assert spec.column is not None, "the contract loader allows an hour with a column only"
        local = calendar_dates(raw[spec.column]) + time_of_day(raw[spec.hour])
        return local.astype("datetime64[ns]")
    if spec.parts is not None:
        p = spec.parts
        # A missing part or an impossible date (February 30) gives no event time, which
        # gx_partition_day reports for the row, instead of an error that names nothing.
        dates = pd.to_datetime(
            pd.DataFrame(
                {"year": typed[p.year], "month": typed[p.month], "day": typed[p.day]}
            ).astype("float64"),
            errors="coerce",
        )
        if p.hhmm is not None:
            hhmm = typed[p.hhmm].astype("float64")
            dates += pd.to_timedelta(hhmm // 100 * 60 + hhmm % 100, unit="min")
        # A year nanosecond times cannot hold (0, 99999) names no day either: no event time.
        dates = dates.where((dates >= pd.Timestamp.min) & (dates <= pd.Timestamp.max))
        return dates.astype("datetime64[ns]")
    assert spec.column is not None
    source = parse_times(raw[spec.column], "raise")
    if getattr(source.dt, "tz", None) is not None:
        source = source.dt.tz_convert(spec.timezone).dt.tz_localize(None)
    return source.astype("datetime64[ns]")


def _per_zone(times: pd.Series, zones: pd.Series, convert) -> pd.Series:
    """`convert(times_of_one_zone, zone)` for each zone named in `zones` (NaT where none is)."""
    out = pd.Series(pd.NaT, index=times.index, dtype="datetime64[ns]")
    for zone, rows in times.groupby(_as_text(zones), sort=False).groups.items():
        out.loc[rows] = convert(times.loc[rows], str(zone)).astype("datetime64[ns]")
    return out


def utc_times(local: pd.Series, zones: pd.Series) -> pd.Series:
    """Naive UTC time of each row's naive local time in its own zone (NaT where none is named).

    A wall-clock time the autumn change repeats is taken in summer time (its first
    occurrence); one the spring change skips is moved forward by the gap, as clocks did.
    """

    def to_utc(times: pd.Series, zone: str) -> pd.Series:
        summer = np.ones(len(times), dtype=bool)
        aware = times.dt.tz_localize(zone, ambiguous=summer, nonexistent="shift_forward")
        return aware.dt.tz_convert("UTC").dt.tz_localize(None)

    return _per_zone(local, zones, to_utc)


def zoned_event_times(
    raw: pd.DataFrame, typed: pd.DataFrame, contract: Contract
) -> tuple[pd.Series, pd.Series]:
    """With a timezone column: each row's event time in UTC, and its local wall-clock time."""
    spec = contract.event_time
    assert spec.timezone_column is not None
    zones = typed[spec.timezone_column]
    if spec.column is not None and spec.hour is None:
        source = parse_times(raw[spec.column], "raise")
        if getattr(source.dt, "tz", None) is not None:
            # An instant already (its zone is in the text): the row's zone gives its local time.
            utc = source.dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]")

            def to_local(times: pd.Series, zone: str) -> pd.Series:
                return times.dt.tz_localize("UTC").dt.tz_convert(zone).dt.tz_localize(None)

            return utc, _per_zone(utc, zones, to_local)
    local = local_event_times(raw, typed, contract)
    return utc_times(local, zones), local


def derive_label(typed: pd.DataFrame, contract: Contract) -> pd.Series:
    """The label of each row; missing where its source is missing (such rows are not trained on)."""
    label = contract.label
    source = typed[label.source]
    if label.task == "regression":
        return source.astype("float64")
    if label.rule is None:
        return source.astype("Int8")
    positive = LABEL_OPS[label.rule.op](source.astype("float64"), label.rule.value)
    return positive.astype("Int8").mask(source.isna())


def type_rows(raw: pd.DataFrame, contract: Contract, where: str) -> pd.DataFrame:
    """Rows of a landed frame cast to contract dtypes, in contract order, with event time and label.

    `where` names the file and partition in any error raised.
    """
    report = raw_schema(raw, contract)
    if not report.ok:
        raise ContractViolationError(f"{where}: {report.describe()}")
    typed = pd.DataFrame(
        {spec.name: _cast(raw[spec.name], spec, where) for spec in contract.columns}
    )
    if contract.event_time.timezone_column is None:
        typed[EVENT_TIME] = local_event_times(raw, typed, contract)
    else:
        typed[EVENT_TIME], typed[LOCAL_EVENT_TIME] = zoned_event_times(raw, typed, contract)
    typed[contract.label_name] = derive_label(typed, contract)
    return typed


def expected_typed_dtypes(contract: Contract) -> dict[str, str]:
    """Column name -> pandas dtype of a validated frame."""
    dtypes = {spec.name: PANDAS_DTYPES[spec.dtype] for spec in contract.columns}
    dtypes[EVENT_TIME] = "datetime64[ns]"
    if contract.event_time.timezone_column is not None:
        dtypes[LOCAL_EVENT_TIME] = "datetime64[ns]"
    dtypes[contract.label_name] = "float64" if contract.task == "regression" else "Int8"
    return dtypes
