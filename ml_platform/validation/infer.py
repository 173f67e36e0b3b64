"""A draft contract inferred from sample day files, as TFDV's `infer_schema` drafts a schema.

The machine reads what the samples show: each column's type, its nulls (with the share seen),
numeric ranges and day volumes that catch gross errors, the values seen of low-cardinality text,
a row key, the file name pattern and the day it carries, how the event time is built (a datetime
column, or a date column and an hour column), a column of timezone names, and the columns that
hold one value all day. What it cannot know, which column is the label, which columns leak it
and whether a text column's values are a closed set, it leaves as commented choices: the draft
is a starting point a person edits, and `check-contract` passes once the label line is
uncommented.
"""

import dataclasses
import datetime as dt
import io
import itertools
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from ml_platform.contracts.model import EVENT_TIME, LOCAL_EVENT_TIME
from ml_platform.contracts.schema import (
    FALSE_WORDS,
    TRUE_WORDS,
    WITH_OFFSET,
    calendar_dates,
    known_zones,
    parse_times,
    time_of_day,
)
from ml_platform.ingestion.assets import LandingFileError, read_landed_file

# The day as landing.file_pattern's {date} writes it.
FILE_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
FLOAT_MAX = sys.float_info.max
# Text with at most this many distinct values (seen five times each on average) gets its values
# seen written out, for a person to make allowed_values of. Not drafted as allowed_values: no
# number of samples shows a set is closed (a value of 1 in N rows is missing from N sample
# rows one time in three), and a value too rare for the samples would reject a later day for
# one row; a new value is the drift check's (unseen categories) and the history gate's
# (distinct counts).
MAX_ALLOWED_VALUES = 20
# An hour column holds at most 24 hours in a few spellings each ('6am', '6 AM', '06:00').
MAX_HOUR_SPELLINGS = 24 * 6
MAX_DATE_SPELLINGS = 3
# A drafted range catches gross errors (a unit changed x1000, a sign flipped, a sentinel such as
# -999 or 99999), not an unusual day: an ordinary day beyond a few samples' range (a heavy tail,
# one of 150 columns) would be rejected for one row, and the history gate and the drift check
# judge a day against the days before it. A column of one sign keeps its sign, and its far end
# may reach this many times the farthest value seen (an order of magnitude: in log space, as
# money and counts spread);
RANGE_GROWTH = 10
# a column of both signs may go this many times its span beyond each end.
RANGE_SPANS = 2
# A day's row count may go this many times below the fewest and above the most rows seen: an
# empty or truncated export, or a file appended to itself, is a gross error; a weekend of a
# weekday-only sample, or a busy day, is not (the history gate judges the count against the
# days before it).
ROW_COUNT_GROWTH = 10
# An int column unique within each day is an identifier when at least this share of each day's
# numbers is above all of the day before's.
MIN_COUNTED_ON = 0.9
# An int column is an identifier, whatever its order (ids counting down, or drawn at random),
# when no value repeats in the samples, each sample day holds at least this many rows, and each
# day's values are spread evenly over the day's range, as a block of numbers given in turn or
# drawn at random is. Measurements whose whole numbers never repeat (bytes, cents) bunch
# (normal, skewed), and a day of fewer rows shows too little of that.
MIN_ID_ROWS = 300
# A day's values are evenly spread when the Kolmogorov-Smirnov test does not tell them from the
# uniform over the day's range at this level. Measured on 4000 draws of 300 rows: ids drawn at
# random pass 99 % of days, ids counting down all; a normal measurement none, a triangular one
# (flatter) 0.6 % (100 rows: 14 % and 73 %).
EVEN_SPREAD_ALPHA = 0.01
# A text header without a comma but with one of these is a file separated otherwise.
SEPARATORS = {";": "';'", "\t": "tabs", "|": "'|'"}
# Text columns with more distinct values than this share of the rows are identifiers, no feature.
MAX_CATEGORICAL_SHARE = 0.5


class InferenceError(ValueError):
    """The sample files cannot give a draft contract; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """One sample day file, read as text as the landing zone reads it."""

    path: Path
    day: dt.date
    frame: pd.DataFrame


@dataclasses.dataclass
class Column:
    """What the samples show of one column."""

    name: str
    dtype: str
    null_share: float
    values: pd.Series  # non-null values of every sample, as text
    constant_within_day: bool = False
    numbers: pd.Series | None = None


def file_pattern(paths: Sequence[Path]) -> tuple[str, list[dt.date]]:
    """The landing file pattern shared by the samples' names, and the day each name carries."""
    patterns, days = set(), []
    for path in paths:
        found = FILE_DATE.findall(path.name)
        if len(found) != 1:
            raise InferenceError(
                f"{path.name}: a day file's name must carry its day once as YYYY-MM-DD "
                f"(found {len(found)}), e.g. sales_2024-03-05.csv"
            )
        try:
            days.append(dt.date.fromisoformat(found[0]))
        except ValueError as exc:
            raise InferenceError(f"{path.name}: '{found[0]}' is no date: {exc}") from exc
        patterns.add(path.name.replace(found[0], "{date}"))
    if len(patterns) != 1:
        raise InferenceError(f"the samples' names follow different patterns: {sorted(patterns)}")
    if len(set(days)) != len(days):
        raise InferenceError("two sample files carry the same day: give one file per day")
    return patterns.pop(), days


def read_samples(paths: Sequence[Path]) -> tuple[str, list[Sample]]:
    """The file pattern and each sample, every column read as text."""
    if not paths:
        raise InferenceError("give at least one sample day file")
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise InferenceError(f"no such sample file: {', '.join(missing)}")
    pattern, days = file_pattern(paths)
    samples = []
    for path, day in zip(paths, days, strict=True):
        data = path.read_bytes()
        separator = _separator(data)
        if separator:
            # pandas reads such a file as one column named by the whole header, and the draft
            # would hold no event time: refused as the landing zone refuses it.
            raise InferenceError(
                f"{path.name} (partition {day}) is not a readable CSV file: its header is "
                f"separated by {separator}, not ','; export it comma-separated"
            )
        try:
            header = list(pd.read_csv(io.BytesIO(data), nrows=0).columns)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
            header = []  # no header to read: reading the file next says why, naming it
        try:
            frame = read_landed_file(data, path.name, day.isoformat(), text_columns=header)
        except LandingFileError as exc:
            # As the landing zone would reject it: the file, its day and why.
            raise InferenceError(str(exc)) from exc
        if frame.empty:
            raise InferenceError(f"{path.name} holds no rows")
        samples.append(Sample(path, day, frame))
    columns = [list(s.frame.columns) for s in samples]
    if any(c != columns[0] for c in columns):
        raise InferenceError(
            "the samples have different columns: "
            + "; ".join(f"{s.path.name}: {list(s.frame.columns)}" for s in samples)
        )
    return pattern, sorted(samples, key=lambda s: s.day)


def _separator(data: bytes) -> str:
    """The separator (as words) of a header that holds no comma but another separator, or ''."""
    header = data.removeprefix(b"\xef\xbb\xbf").splitlines()[:1]
    if not header or b"," in header[0]:
        return ""
    found = [words for sep, words in SEPARATORS.items() if sep.encode() in header[0]]
    return found[0] if found else ""


def _dtype(values: pd.Series) -> tuple[str, pd.Series | None]:
    """The contract dtype of non-null text values, and their numbers if numeric."""
    if values.empty:
        return "str", None
    words = values.str.strip().str.lower()
    if words.isin(TRUE_WORDS | FALSE_WORDS).all() and not words.isin({"0", "1"}).all():
        return "bool", None
    numbers = pd.to_numeric(values, errors="coerce")
    if numbers.notna().all():
        if _whole_numbers(values) and _zero_padded(values) is not None:
            # Codes ('00123', a zip code): as numbers every later day would lose the zeros.
            return "str", None
        # pandas reads whole numbers above Int64's range as unsigned or as floats.
        if pd.api.types.is_signed_integer_dtype(numbers):
            return "int", numbers
        if _whole_numbers(values):
            # Whole numbers no Int64 holds (64-bit ids, hashes): the typing rejects them as
            # int, and as floats they lose their last digits, so two ids would read the same.
            return "str", None
        return "float", numbers
    # As the typing reads them: times of a day whose UTC offset changes (summer time) too.
    times = parse_times(values, "coerce")
    # A column of midnights is a column of dates: text, read as the event time's date.
    if times.notna().all() and (times.dt.floor("D") != times).any():
        return "datetime", None
    return "str", None


def _whole_numbers(values: pd.Series) -> bool:
    """Whether every text value is a whole number in digits."""
    return bool(len(values)) and bool(values.str.strip().str.fullmatch(r"[+-]?\d+").all())


def _zero_padded(values: pd.Series) -> str | None:
    """The first text value that is a whole number written with leading zeros, or None."""
    padded = values[values.str.strip().str.fullmatch(r"[+-]?0\d+")]
    return None if padded.empty else str(padded.iloc[0])


def profile(samples: Sequence[Sample]) -> list[Column]:
    """Each column's dtype, null share and values over all samples."""
    profiled = []
    total = sum(len(s.frame) for s in samples)
    for name in samples[0].frame.columns:
        per_day = [s.frame[name] for s in samples]
        values = pd.concat(per_day).dropna().astype("str")
        dtype, numbers = _dtype(values)
        nulls = sum(int(v.isna().sum()) for v in per_day)
        distinct_per_day = [v.nunique(dropna=True) for v in per_day]
        # Only a day of two rows or more shows whether a column moves within it.
        constant = (
            len(samples) > 1
            and any(len(v) > 1 for v in per_day)
            and nulls == 0
            and all(n == 1 for n in distinct_per_day)
            and values.nunique() > 1
        )
        profiled.append(Column(name, dtype, nulls / total, values, constant, numbers))
    return profiled


@dataclasses.dataclass(frozen=True)
class EventTimeGuess:
    """How the event time is built, and the sentence saying why, for the draft's comment."""

    spec: dict[str, Any]
    why: str
    sources: tuple[str, ...]


def _is_date_column(column: Column, samples: Sequence[Sample]) -> bool:
    # A day file's date column holds its day (a handful of spellings at most): checking that
    # first spares parsing each distinct value of an identifier column.
    if column.dtype != "str" or column.values.nunique() > MAX_DATE_SPELLINGS * len(samples):
        return False
    for sample in samples:
        dates = calendar_dates(sample.frame[column.name].dropna())
        if dates.empty or dates.isna().any() or (dates.dt.date != sample.day).any():
            return False
    return True


def _is_hour_column(column: Column) -> bool:
    distinct = column.values.nunique()
    if column.dtype not in ("int", "str") or not 2 <= distinct <= MAX_HOUR_SPELLINGS:
        return False
    # Any small whole number reads as an hour, zero-padded text ('03', a month) too: only a
    # named one is a guess.
    numbers = column.dtype == "int" or _whole_numbers(column.values)
    if numbers and "hour" not in column.name.lower():
        return False
    return bool(time_of_day(column.values).notna().all())


def guess_event_time(columns: Sequence[Column], samples: Sequence[Sample]) -> EventTimeGuess:
    """A datetime column; else a date column (the file's day) and an hour column."""
    for column in columns:
        if column.dtype == "datetime":
            return EventTimeGuess(
                {"column": column.name},
                f"'{column.name}' holds date and time",
                (column.name,),
            )
    dates = [c for c in columns if _is_date_column(c, samples)]
    hours = sorted(
        (c for c in columns if _is_hour_column(c) and c not in dates),
        key=lambda c: (c.dtype != "str", "hour" not in c.name.lower()),
    )
    if dates and hours:
        date, hour = dates[0], hours[0]
        return EventTimeGuess(
            {"column": date.name, "hour": hour.name},
            f"'{date.name}' holds each file's day and '{hour.name}' the hour",
            (date.name, hour.name),
        )
    # Alone, the event time column is read as ISO 8601 (only an hour column's date may be
    # spelled otherwise, 'Mar 05, 2024'): a date spelled otherwise would reject every day.
    iso = [c for c in dates if parse_times(c.values, "coerce").notna().all()]
    if iso:
        return EventTimeGuess(
            {"column": iso[0].name},
            f"'{iso[0].name}' holds each file's day, and no column holds an hour: every "
            "row's event time is midnight",
            (iso[0].name,),
        )
    spelled = (
        f" ('{dates[0].name}' holds each file's day, but not as ISO 8601 dates, which a "
        "date column without an hour must hold)"
        if dates
        else ""
    )
    return EventTimeGuess(
        {"column": None},
        f"no column holds the event time (a datetime, or a date and an hour){spelled}: give "
        "`column` (a datetime column) or `parts` (year, month, day, hhmm int columns)",
        (),
    )


def _counts_on(column: Column, samples: Sequence[Sample]) -> bool:
    """Whether an int column numbers rows on from day to day (an order id, a ticket number).

    Unique within every sample day, and each day's numbers above the day before's but for a few
    (an order placed before midnight, paid after it): every later day's fall beyond the samples'
    range, so no range holds them, and a number given in turn is neither a label nor a feature.
    Whichever key `row_key` picks, such a column is an identifier; one row a day, or one day,
    shows nothing of that.
    """
    if (
        column.dtype != "int"
        or column.null_share > 0
        or len(samples) < 2
        or not any(len(s.frame) > 1 for s in samples)
    ):
        return False
    previous = None
    for sample in samples:  # sorted by day
        numbers = pd.to_numeric(sample.frame[column.name])
        if numbers.duplicated().any():
            return False
        if previous is not None and (numbers > previous).mean() < MIN_COUNTED_ON:
            return False
        previous = numbers.max()
    return True


def _spread_like_ids(column: Column, samples: Sequence[Sample]) -> bool:
    """Whether an int column's values never repeat and spread evenly, as ids do (`MIN_ID_ROWS`).

    An id counting down, or drawn at random, is no label and no feature: as a feature it drifts
    every day (counting down), or teaches noise (at random).
    """
    if (
        column.dtype != "int"
        or column.null_share > 0
        or len(samples) < 2
        or any(len(s.frame) < MIN_ID_ROWS for s in samples)
        or column.numbers is None
        or column.numbers.duplicated().any()
    ):
        return False
    for sample in samples:
        numbers = np.sort(pd.to_numeric(sample.frame[column.name]).to_numpy(dtype=float))
        spread = (numbers - numbers[0]) / (numbers[-1] - numbers[0])
        if stats.kstest(spread, "uniform").pvalue < EVEN_SPREAD_ALPHA:
            return False
    return True


def _timezone_column(columns: Sequence[Column]) -> Column | None:
    zones = known_zones()
    for column in columns:
        if column.dtype == "str" and len(column.values) and column.values.isin(zones).all():
            return column
    return None


def _bounds(column: Column) -> tuple[float, float, str] | None:
    """The drafted range of the finite values seen, and the note saying what it holds.

    None for one value (no spread).
    """
    assert column.numbers is not None
    finite = column.numbers[np.isfinite(column.numbers)]
    if finite.empty:
        return None
    low, high = float(finite.min()), float(finite.max())
    if low == high:
        return None
    # As written in the files (15 digits): 6 would show 1234.5678 as 1234.57, beyond its max.
    seen = f"seen {low:.15g} to {high:.15g}"
    if column.dtype == "int" and finite.nunique() == 2:
        # A 0/1 flag or a code of two values: a third value is a new coding, not a wider range.
        return int(low), int(high), f"{seen}; two values: drafted to them"
    # Beyond the largest float a side is the largest float (a span of -1e308 to 1e308 is inf).
    if low >= 0:
        wide_low, wide_high = 0.0, min(RANGE_GROWTH * high, FLOAT_MAX)
        why = f"never negative, at most {RANGE_GROWTH}x the largest"
    elif high <= 0:
        wide_low, wide_high = max(RANGE_GROWTH * low, -FLOAT_MAX), 0.0
        why = f"never positive, at least {RANGE_GROWTH}x the smallest"
    else:
        margin = RANGE_SPANS * (high - low)
        wide_low, wide_high = max(low - margin, -FLOAT_MAX), min(high + margin, FLOAT_MAX)
        why = f"{RANGE_SPANS}x the span beyond each end"
    note = f"{seen}; drafted {why} (gross errors only)"
    if column.dtype == "int":
        # Whole units, outwards: a widened side of a whole-number column moves by 1 at least
        # (10x a positive whole number, or twice a span of 1 or more).
        return math.floor(wide_low), math.ceil(wide_high), note
    # Rounded outwards: to the nearest, tiny or close values would lose the samples' own range
    # (1e-8 to 2e-7 became [0, 0]).
    return _outwards(wide_low, math.floor), _outwards(wide_high, math.ceil), note


def _outwards(value: float, rounding: Callable[[float], int]) -> float:
    """`value` rounded to 6 decimals by `rounding` (floor or ceil).

    From 2**53 on every float is a whole number already, and scaled up one near the largest
    would overflow: such a value is kept as it is.
    """
    if abs(value) >= 2**53:
        return value
    scale = 10**6
    return rounding(value * scale) / scale


def _low_cardinality(column: Column) -> bool:
    """Whether a text column's few values may be a set (a column never filled has none)."""
    distinct = column.values.nunique()
    return 1 <= distinct <= MAX_ALLOWED_VALUES and len(column.values) >= 5 * distinct


def row_key(
    columns: Sequence[Column], samples: Sequence[Sample], event_time: EventTimeGuess
) -> list[str] | None:
    """The fewest columns (one or two; the event time counts as one) unique within each day."""
    units: dict[str, list[str]] = {}
    if event_time.sources:
        units[EVENT_TIME] = list(event_time.sources)
    for column in columns:
        keyable = column.dtype != "float" and column.null_share == 0
        if keyable and not column.constant_within_day and column.name not in event_time.sources:
            units[column.name] = [column.name]
    for size in (1, 2):
        for combo in itertools.combinations(units, size):
            fields = [f for unit in combo for f in units[unit]]
            if all(not s.frame.duplicated(subset=fields).any() for s in samples):
                return list(combo)
    return None


def _flow(mapping: dict[str, Any]) -> str:
    """One mapping as a one-line YAML flow mapping."""
    text = yaml.safe_dump(mapping, default_flow_style=True, sort_keys=False, width=10_000)
    return text.strip()


def _value(value: Any) -> str:
    """One value as YAML text (quoted where YAML needs it)."""
    return _flow({"v": value})[len("{v: ") : -1]


def _one_line(values: Sequence[str]) -> str:
    """Text values as a YAML flow list on one line, for a comment.

    A value holding a line break is written double-quoted, its breaks escaped: as YAML quotes
    it otherwise ('said "hi"', a break, 'then left'), the rest would leave the comment.
    """
    items = []
    for value in values:
        item = _value(value)
        if len(item.splitlines()) > 1:
            quoted = yaml.safe_dump(
                {"v": value}, default_style='"', default_flow_style=True, width=10_000
            )
            item = quoted.strip()[len('{"v": ') : -1]
        items.append(item)
    return f"[{', '.join(items)}]"


def _label_choice(column: Column, landed: set[str]) -> str:
    name = f"{column.name}_label"
    while name in landed:
        name += "_"
    if column.dtype == "bool":
        return _flow({"name": name, "task": "classification", "source": column.name})
    assert column.numbers is not None
    if column.numbers.nunique() == 2:
        rule = {"op": "==", "value": float(column.numbers.max())}
        spec = {"name": name, "task": "classification", "source": column.name, "rule": rule}
        return _flow(spec)
    return _flow({"name": name, "task": "regression", "source": column.name})


def _offset_warning(event_time: EventTimeGuess, samples: Sequence[Sample]) -> list[str]:
    """Comment lines for times that carry a UTC offset and leave their file's day in UTC.

    Such times name instants: read in the draft's UTC, a row just after local midnight falls on
    the day before its file's, which the quality gate rejects. Only a person knows the zone the
    files' days are in.
    """
    column = event_time.spec.get("column")
    if column is None or "hour" in event_time.spec:
        return []
    left = total = 0
    offsets: set[str] = set()
    for sample in samples:
        text = sample.frame[column].dropna().astype("str").str.strip()
        aware = text[text.str.contains(WITH_OFFSET, regex=True)]
        times = parse_times(aware, "coerce").dropna()
        if times.empty or getattr(times.dt, "tz", None) is None:
            continue
        offsets.update(aware.str.extract(r"([zZ]|[+-]\d{2}(?::?\d{2})?)$")[0].dropna())
        total += len(times)
        left += int((times.dt.tz_convert("UTC").dt.date != sample.day).sum())
    if not left:
        return []
    return [
        f"  # The times carry UTC offsets ({', '.join(sorted(offsets))}): in UTC, {left} of "
        f"{total} sample row(s)",
        "  # fall on another day than their file's, which the quality gate rejects. Set the",
        "  # zone the files' days are in (e.g. Europe/Paris for +01:00 and +02:00).",
    ]


def _other_day_warning(event_time: EventTimeGuess, samples: Sequence[Sample]) -> list[str]:
    """Comment lines for local times (no UTC offset) on another day than their file's name.

    A file named by the day it was exported, the morning after its events, holds no row of
    its day: the quality gate rejects every day, and no zone changes a local time's day. Times
    with an offset are `_offset_warning`'s.
    """
    column = event_time.spec.get("column")
    if column is None or "hour" in event_time.spec:
        return []
    left = total = 0
    example = ""
    for sample in samples:
        text = sample.frame[column].dropna().astype("str").str.strip()
        local = text[~text.str.contains(WITH_OFFSET, regex=True)]
        if local.empty:
            continue
        times = parse_times(local, "coerce")
        other = times.notna() & (times.dt.date != sample.day)
        total += int(times.notna().sum())
        left += int(other.sum())
        if other.any() and not example:
            example = f"{sample.path.name} holds {local[other].iloc[0]}"
    if not left:
        return []
    return [
        f"  # {left} of {total} sample row(s) have an event time on another day than their "
        f"file's name carries ({example}):",
        "  # the quality gate rejects a day holding such rows. Name each file by the day of its",
        "  # events (the partition day), or build the event time from other columns.",
    ]


def draft_contract(paths: Sequence[Path], name: str) -> str:
    """The YAML text of a draft contract for the sample day files at `paths`."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise InferenceError(
            f"'{name}' is no dataset name: use lowercase letters, digits and _, e.g. shop_sales"
        )
    pattern, samples = read_samples(paths)
    columns = profile(samples)
    event_time = guess_event_time(columns, samples)
    zones = _timezone_column(columns)
    key = row_key(columns, samples, event_time)
    key_columns = set(key or [])
    counted = {c.name for c in columns if _counts_on(c, samples)}
    spread_ids = {c.name for c in columns if _spread_like_ids(c, samples)} - counted
    identifiers = counted | spread_ids
    rows = [len(s.frame) for s in samples]
    sources = set(event_time.sources)
    label_candidates = [
        c
        for c in columns
        if c.dtype in ("int", "float", "bool")
        and c.name not in sources
        and not c.constant_within_day
        and c.name not in (key or [])
        and c.name not in identifiers
    ]
    landed = {c.name for c in columns}
    names = ", ".join(s.path.name for s in samples)

    out = [
        f"# Draft contract inferred by `ml-platform init-contract` from {len(samples)} sample "
        f"file(s): {names}.",
        "# Read every line: the machine guessed what the samples show; choose the label below,",
        "# then run `ml-platform check-contract` on this file.",
        f"name: {name}",
        f"description: {_value(f'Daily files {pattern}.')}",
        "# Who answers for this dataset: teams as team:<name>, people by e-mail. Every asset",
        "# carries them and every alert names them.",
        'owners: []  # e.g. ["team:sales-analytics", "ana@example.com"]',
        "source:",
        "  # Files are delivered to the landing zone by your system.",
        "  kind: external",
        "partitions:",
        f"  start_date: {samples[0].day.isoformat()}",
        "landing:",
        f"  # Each sample's name carries its day: {samples[0].path.name} is {samples[0].day}.",
        f"  file_pattern: {_value(pattern)}",
        "  format: csv",
        "# When a day's file is due: by expected_by (HH:MM, the event time's timezone) the next",
        "# morning, late grace_minutes after. Uncomment to be alerted when a delivery is late.",
        '# freshness: {expected_by: "06:00", grace_minutes: 60}',
        "event_time:",
        f"  # Guess: {event_time.why}.",
        *_other_day_warning(event_time, samples),
    ]
    for field, value in event_time.spec.items():
        out.append(f"  {field}: {_value(value)}")
    if zones is not None:
        out += [
            f"  # '{zones.name}' holds IANA timezone names: each row's local time is in its own",
            "  # zone, and the event time is stored in UTC.",
            f"  timezone_column: {zones.name}",
        ]
    else:
        out += [
            "  # No column holds timezone names: set the zone of the local times (IANA name).",
            *_offset_warning(event_time, samples),
            "  timezone: UTC",
        ]
    out.append("columns:")
    for column in columns:
        spec: dict[str, Any] = {"name": column.name, "dtype": column.dtype}
        notes = []
        if column.null_share > 0:
            spec["nullable"] = True
            notes.append(f"{column.null_share:.1%} null in the samples")
        else:
            notes.append("no nulls in the samples")
        if column.name in counted:
            notes.append(
                "unique within every sample day and counts on from day to day: an identifier, "
                "no range, label or feature"
            )
        elif column.name in identifiers:
            notes.append(
                f"each of the {len(column.values)} sample values distinct, spread evenly over "
                "each day's range as ids are: an identifier, no range, label or feature (if "
                "it is a measurement, give it a range and a feature)"
            )
        # A key's values (ticket numbers) move on from day to day: no range holds them.
        if (
            column.numbers is not None
            and column.name not in sources
            and column.name not in key_columns
            and column.name not in identifiers
        ):
            finite = column.numbers[np.isfinite(column.numbers)]
            bounds = _bounds(column)
            if bounds is None:
                notes.append(
                    f"always {finite.min():.15g} in the samples: no range guessed"
                    if len(finite)
                    else "no finite value in the samples: no range guessed"
                )
            else:
                spec["min"], spec["max"], note = bounds
                notes.append(note)
            if len(finite) < len(column.numbers):
                notes.append(
                    f"{len(column.numbers) - len(finite)} infinite value(s) in the samples, "
                    "which the quality gate rejects (no model learns from them)"
                )
        if (
            column.dtype == "str"
            and column.name not in sources
            and column is not zones
            and _low_cardinality(column)
        ):
            seen_values = sorted(column.values.unique().tolist())
        else:
            seen_values = []
        padded = _zero_padded(column.values) if column.dtype == "str" else None
        if padded is not None and _whole_numbers(column.values):
            notes.append(f"whole numbers with leading zeros ({padded!r}): text, which keeps them")
        elif column.dtype == "str" and _whole_numbers(column.values):
            notes.append("whole numbers beyond 64 bits: text, which holds every digit")
        if key == [column.name]:
            spec["unique"] = True
        if column.constant_within_day and column.name not in sources:
            spec["constant_within_day"] = True
            notes.append("one value all day in every sample, drift does not test it")
        if seen_values:
            # Last on the line, ready to copy into the mapping.
            notes.append(
                f"{len(seen_values)} value{'s' if len(seen_values) > 1 else ''} seen, none "
                "drafted as allowed (a value too rare for the samples would reject a day; the "
                "drift check and the history gate judge new values); if these are all there "
                f"can be, add allowed_values: {_one_line(seen_values)}"
            )
        out.append(f"  - {_flow(spec)}  # {'; '.join(notes)}")
    out += [
        "# The label: uncomment the ONE line of the column to predict (each line's task is a",
        "# guess: two values read as classification), and uncomment its column's feature below",
        "# only if it is not the label.",
    ]
    if label_candidates:
        out += [f"# label: {_label_choice(c, landed)}" for c in label_candidates]
    else:
        out.append("# (no numeric or bool column: add one to predict)")
    out += [
        "# Columns known only after the label (they would leak it): list them, e.g. [col_a].",
        "leakage_columns: []",
        "features:",
    ]
    time_features = [("hour", "numeric", "hour"), ("day_of_week", "categorical", "day_of_week")]
    # Hours and weekdays as people live them: with a zone per row, of each row's local time.
    clock = EVENT_TIME if zones is None else LOCAL_EVENT_TIME
    for feature_name, kind, transform in time_features:
        spec = {"name": feature_name, "kind": kind, "source": clock, "transform": transform}
        out.append(f"  - {_flow(spec)}")
    feature_names = {"hour", "day_of_week"}

    def feature_name_of(column: Column) -> str:
        name = column.name
        while name in feature_names:
            name += "_"
        feature_names.add(name)
        return name

    for column in columns:
        if (
            column.name in sources
            or column.name in (key or [])
            or column.name in identifiers
            or column in label_candidates
        ):
            continue
        if column.values.empty:
            # Nothing to learn from, and its first real values would read as a change of
            # coding to the drift check: a person adds it once its values are known.
            feature = {
                "name": feature_name_of(column),
                "kind": "categorical",
                "source": column.name,
            }
            out.append(
                f"  # - {_flow(feature)}  # empty in every sample: no feature until its values "
                "are known"
            )
            continue
        if column.dtype in ("int", "float"):
            kind = "numeric"
        elif column.dtype in ("str", "bool"):
            if column.values.nunique() > MAX_CATEGORICAL_SHARE * max(len(column.values), 1):
                continue  # an identifier, not a category
            kind = "categorical"
        else:
            continue
        feature = {"name": feature_name_of(column), "kind": kind, "source": column.name}
        out.append(f"  - {_flow(feature)}")
    if label_candidates:
        out.append("  # Features of the label candidates: uncomment all but the label's.")
        for column in label_candidates:
            kind = "categorical" if column.dtype == "bool" else "numeric"
            feature = {"name": feature_name_of(column), "kind": kind, "source": column.name}
            out.append(f"  # - {_flow(feature)}")
    out += [
        "drift:",
        "  # Each day against the 28 days before it. The check also learns from them how far",
        "  # each feature moves from one ordinary day to the next (a feature that moves with the",
        "  # weather drifts only beyond that): with 7 days an ordinary day looks like drift on 1",
        "  # day in 8.",
        "  reference: {mode: previous_days, days: 28}",
        "quality:",
        f"  # The samples hold {min(rows)} to {max(rows)} rows a day; drafted a tenth of the "
        "fewest (1 at least) to",
        f"  # {ROW_COUNT_GROWTH}x the most (gross errors only: an empty or truncated export, a "
        "file appended to",
        "  # itself). The history gate (gx_history) judges each day's count against the days",
        "  # before it: if the volume follows the weekday (fewer rows at weekends), let it judge",
        "  # each day against the same weekdays, or it rejects the first weekend after weekdays",
        "  # only (and a rejected day never becomes history):",
        "  # history: {reference: {mode: previous_days, days: 28, same_weekday: true}}",
        "  row_count: "
        + _flow(
            {
                "min": max(1, min(rows) // ROW_COUNT_GROWTH),
                "max": max(rows) * ROW_COUNT_GROWTH,
            }
        ),
    ]
    if key is not None:
        out.append(
            f"  # A guess: {' + '.join(key)} is unique within every sample day; check that the "
            "source system keys rows so."
        )
        out.append(f"  row_key: {_value(key)}")
    else:
        out += [
            "  # No column, or pair of columns, is unique within every sample day: rows have no",
            "  # key, so duplicated rows are not detected. Name the key columns if there is one.",
            "  row_key: []",
        ]
    out += [
        "# Each stage's request (vCPUs, MiB) for the ECS and Kubernetes step executors: the",
        "# defaults (docs/contracts.md) until `ml-platform resources --write` puts the sizes the",
        "# steps' recorded peaks advise here.",
        "resources: {}",
    ]
    text = "\n".join(out) + "\n"
    yaml.safe_load(text)  # the draft must stay valid YAML whatever the samples hold
    return text
