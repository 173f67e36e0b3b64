"""The quality gate: a Great Expectations suite generated from the contract, and its verdict.

Great Expectations is the engine of record: every rule below is a GE expectation, validated by
GE; this module only builds the suite from the contract, reads GE's results and turns them into
sentences a person acts on, the rows to quarantine, and a rendered Data Docs page.

GE is imported on first use (it takes seconds) and its context and suite are built once per
process and contract, then reused for every partition through suite parameters. GE validates the
typed rows through `ge_frame`, which hands it numpy columns where that changes no rule's
verdict, so that its vectorised code paths apply.
"""

import dataclasses
import functools
import json
import sys
import unicodedata
from typing import Any

import pandas as pd

from ml_platform.contracts import ColumnSpec, Contract
from ml_platform.contracts.model import EVENT_TIME, LOCAL_EVENT_TIME, whole_pattern
from ml_platform.contracts.schema import expected_typed_dtypes
from ml_platform.validation.history import (
    Finding,
    HistoryWindow,
    Statistic,
    gated_statistics,
    history_finding,
    history_parameters,
    window_from_profiles,
)

# Dagster check names, one per family of expectations.
SCHEMA, COMPLETENESS, VALIDITY, UNIQUENESS, VOLUME, PARTITION_DAY, HISTORY = (
    "gx_schema",
    "gx_completeness",
    "gx_validity",
    "gx_uniqueness",
    "gx_volume",
    "gx_partition_day",
    "gx_history",
)
CHECKS = {
    SCHEMA: (
        "Columns and their order are those of the contract (their types are the typing's: it "
        "casts each column to its contract type or rejects the file, before this gate)."
    ),
    COMPLETENESS: "Columns that must be filled have no more missing values than tolerated.",
    VALIDITY: "Values are inside their declared ranges and allowed sets, and match their patterns.",
    UNIQUENESS: "Unique columns and the row key hold no duplicates.",
    VOLUME: "The day holds a plausible number of rows.",
    PARTITION_DAY: "Every row's event time falls on the partition's day.",
    HISTORY: (
        "Null shares, the label's labelled share and positive rate, the row count and distinct "
        "counts are within what the day's reference days show."
    ),
}
# Said in the suite's notes (Data Docs and every stored result show them): what the gate does
# not check because the step before it already guarantees it.
SUITE_NOTES = (
    "Column types are not expected here: the typing step casts every column to its contract "
    "type (contracts/schema.py `type_rows`) and rejects the file, naming the column and a value, "
    "when one does not cast, so every frame this suite sees already has the contract's types "
    "(one GE expectation per column would only re-check that: 21 of the 72 expectations the "
    "flights suite had)."
)
SAMPLE_ROWS = 5
UNIQUE_KINDS = ("expect_column_values_to_be_unique", "expect_compound_columns_to_be_unique")
FLOAT_MAX = sys.float_info.max


@dataclasses.dataclass(frozen=True)
class Failure:
    """One failed expectation, in words and numbers."""

    check: str
    expectation: str
    column: str | None
    sentence: str
    unexpected_count: int
    row_level: bool
    rows: list[int]  # positions of offending rows (row-level expectations)
    unexpected_values: list[Any]
    # A history failure: today's value, the history's range and the bounds.
    finding: Finding | None = None
    # A uniqueness failure: of `rows` (every copy), the first copy of each duplicated value,
    # which the quarantine keeps: only the later copies are the bad rows.
    first_copies: list[int] = dataclasses.field(default_factory=list)

    @property
    def quarantined_rows(self) -> list[int]:
        """The rows the quarantine sets aside for this failure: all of `rows` but first copies."""
        kept = set(self.first_copies)
        return [row for row in self.rows if row not in kept]


@dataclasses.dataclass(frozen=True)
class GateReport:
    """GE's verdict on one partition, read for people and for the quarantine."""

    rows: int
    failures: list[Failure]
    evaluated: int

    def of(self, check: str) -> list[Failure]:
        """Failures of one Dagster check."""
        return [f for f in self.failures if f.check == check]

    def quarantine_reasons(self) -> dict[int, list[str]]:
        """Row position -> reasons, for rows failing a row-level expectation."""
        reasons: dict[int, list[str]] = {}
        for failure in self.failures:
            if failure.row_level:
                for row in failure.quarantined_rows:
                    reasons.setdefault(row, []).append(f"{failure.expectation}({failure.column})")
        return reasons


def _expectations(contract: Contract) -> list[Any]:
    import great_expectations as gx

    e = gx.expectations
    dtypes = expected_typed_dtypes(contract)
    suite: list[Any] = [
        e.ExpectTableColumnsToMatchOrderedList(column_list=list(dtypes), meta={"check": SCHEMA}),
        e.ExpectTableRowCountToBeBetween(
            min_value=contract.quality.row_count.min,
            max_value=contract.quality.row_count.max,
            meta={"check": VOLUME},
        ),
        # With a timezone column the event time is in UTC: a row's day is that of its local
        # time, as the day file holds each place's own day.
        e.ExpectColumnValuesToBeBetween(
            column=EVENT_TIME if contract.event_time.timezone_column is None else LOCAL_EVENT_TIME,
            min_value={"$PARAMETER": "day_start"},
            max_value={"$PARAMETER": "day_end"},
            meta={"check": PARTITION_DAY},
        ),
        # A row without an event time (a date part missing, or no such date) is on no day.
        e.ExpectColumnValuesToNotBeNull(column=EVENT_TIME, meta={"check": PARTITION_DAY}),
    ]
    for col in contract.columns:
        if not col.nullable:
            mostly = 1.0 - (col.max_null_fraction or 0.0)
            suite.append(
                e.ExpectColumnValuesToNotBeNull(
                    column=col.name, mostly=mostly, meta={"check": COMPLETENESS}
                )
            )
        bounds = value_bounds(col)
        if bounds is not None:
            suite.append(
                e.ExpectColumnValuesToBeBetween(
                    column=col.name,
                    min_value=bounds[0],
                    max_value=bounds[1],
                    meta={"check": VALIDITY},
                )
            )
        if col.allowed_values is not None:
            suite.append(
                e.ExpectColumnValuesToBeInSet(
                    column=col.name, value_set=col.allowed_values, meta={"check": VALIDITY}
                )
            )
        if col.pattern is not None:
            suite.append(
                e.ExpectColumnValuesToMatchRegex(
                    column=col.name, regex=whole_value(col.pattern), meta={"check": VALIDITY}
                )
            )
        if col.unique:
            suite.append(
                e.ExpectColumnValuesToBeUnique(column=col.name, meta={"check": UNIQUENESS})
            )
    key = contract.quality.row_key
    if len(key) == 1:
        # GE's compound uniqueness needs two columns or more; one column is a unique column.
        suite.append(e.ExpectColumnValuesToBeUnique(column=key[0], meta={"check": UNIQUENESS}))
    elif key:
        suite.append(e.ExpectCompoundColumnsToBeUnique(column_list=key, meta={"check": UNIQUENESS}))
    if contract.quality.history.enabled:
        suite += [_history_expectation(stat) for stat in gated_statistics(contract)]
    return suite


def value_bounds(col: ColumnSpec) -> tuple[float | None, float | None] | None:
    """The range a column's values must fall in; None when any value will do.

    A float column is finite whatever its contract range: a CSV can carry `inf`, which no
    model can learn from or be scored on, so an unbounded side is the largest finite float.
    """
    low, high = col.min, col.max
    if col.dtype == "float":
        low = -FLOAT_MAX if low is None else low
        high = FLOAT_MAX if high is None else high
    return None if low is None and high is None else (low, high)


def whole_value(pattern: str) -> str:
    """A contract pattern as GE's regex: GE searches values, the contract matches them whole.

    The contract's loader checks the pattern in this very form (`whole_pattern`).
    """
    return whole_pattern(pattern)


def _history_expectation(stat: Statistic) -> Any:
    """The GE expectation of one history statistic; its bounds arrive as suite parameters."""
    import great_expectations as gx

    e = gx.expectations
    bounds: dict[str, Any] = {
        "min_value": {"$PARAMETER": stat.parameter("min")},
        "max_value": {"$PARAMETER": stat.parameter("max")},
        "meta": {"check": HISTORY, "statistic": stat.key},
    }
    if stat.kind == "row_count":
        return e.ExpectTableRowCountToBeBetween(**bounds)
    column = stat.column
    assert column is not None, "every other statistic is of one column"
    if stat.kind in ("null_share", "labelled_share"):
        # GE measures the share of values present; a null share's bounds are turned around.
        return e.ExpectColumnProportionOfNonNullValuesToBeBetween(column=column, **bounds)
    if stat.kind == "positive_rate":
        # The label is 0/1 with nulls for unlabelled rows, which the mean leaves out.
        return e.ExpectColumnMeanToBeBetween(column=column, **bounds)
    return e.ExpectColumnUniqueValueCountToBeBetween(column=column, **bounds)


class QualityGate:
    """A contract's GE suite with its (ephemeral) context, ready to validate partitions."""

    def __init__(self, contract: Contract):
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.contract = contract
        self.context = gx.get_context(mode="ephemeral")
        # Progress bars would land in every run's logs.
        self.context.variables.progress_bars = ProgressBarsConfig(
            globally=False, metric_calculations=False
        )
        asset = self.context.data_sources.add_pandas("lake").add_dataframe_asset("partition")
        self.batch_definition = asset.add_batch_definition_whole_dataframe("day")
        # Added whole: a suite in the context stores itself again on each expectation added
        # to it, which for flights' then 72 expectations took about a second of every run.
        self.suite = self.context.suites.add(
            gx.ExpectationSuite(
                name=f"{contract.name}_gate",
                expectations=_expectations(contract),
                meta={"notes": SUITE_NOTES},
            )
        )

    @property
    def expectation_count(self) -> int:
        """Number of expectations in the suite."""
        return len(self.suite.expectations)

    def parameters(self, day: str, history: HistoryWindow | None) -> dict[str, Any]:
        """The suite parameters of one day: its bounds in time and its history's bounds."""
        start, end = day_bounds(day)
        parameters: dict[str, Any] = {"day_start": start, "day_end": end}
        if self.contract.quality.history.enabled:
            parameters.update(history_parameters(gated_statistics(self.contract), history))
        return parameters

    def validate(
        self, typed: pd.DataFrame, day: str, history: HistoryWindow | None = None
    ) -> tuple[GateReport, Any]:
        """Validate one day's typed rows; return the report and GE's own result object.

        `history` holds the bounds of the history expectations; without it (or with too short
        a history) they are unbounded and pass.

        GE's result is stored as GE returns it. A day every expectation passes is validated
        once with BASIC results (each expectation's verdict, observed value and unexpected
        count, which Data Docs show), which skips building the lists of unexpected rows: about
        half of GE's cost of a real flights day. A day with a failing expectation is validated
        again with COMPLETE results, and that result is the one returned: every expectation in
        full for a failing one's sentence and its offending rows (the quarantine). Either lists
        at most SAMPLE_ROWS unexpected values per expectation. An expectation's verdict does not
        depend on the result format, so the second validation fails the same ones.
        """
        # Positions, not labels, identify offending rows in GE's index lists.
        frame = ge_frame(typed.reset_index(drop=True))
        parameters = self.parameters(day, history)
        batch = self.batch_definition.get_batch(batch_parameters={"dataframe": frame})

        def validated(kind: str) -> Any:
            fmt = {"result_format": kind, "partial_unexpected_count": SAMPLE_ROWS}
            return batch.validate(self.suite, expectation_parameters=parameters, result_format=fmt)

        result = validated("BASIC")
        if not result.success:
            result = validated("COMPLETE")
        for r in result.results:
            # GE's Data Docs renderer parses repr() of an observed number, which for a numpy
            # scalar under numpy 2 ("np.float64(0.5)") is no number: it would drop the row.
            if r.result and "observed_value" in r.result:
                r.result["observed_value"] = _plain(r.result["observed_value"])
        # Without a history every history statistic is unbounded, yet GE fails one whose value
        # it cannot measure (no rows): such a failure is told against an empty history.
        judged = history if history is not None else window_from_profiles(self.contract, day, {})
        failures = [_failure(r, frame, judged) for r in result.results if not r.success]
        report = GateReport(rows=len(frame), failures=failures, evaluated=len(result.results))
        return report, result


def day_bounds(day: str) -> tuple[pd.Timestamp, pd.Timestamp]:
    """The first and the last instant of a day.

    To the nanosecond, as event times are held (datetime64[ns]): a day ending at its last
    microsecond would put a row at 23:59:59.9999995 on no day.
    """
    start = pd.Timestamp(day).as_unit("ns")
    return start, start + pd.Timedelta(days=1) - pd.Timedelta(nanoseconds=1)


def ge_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` as GE validates it: each nullable integer column without missing values as numpy.

    GE's pandas range metric (`column_values.between`) compares a numpy int64 or float64 column
    in one vectorised step, and any other dtype value by value in Python (about 1.2 s per column
    at 1M rows, docs/benchmarks.md). A nullable integer column (`Int64`, `Int8`) that holds no
    missing value holds the same numbers as its numpy twin, of the same scalar type, which GE's
    type rule reads (`int64`, `int8`): every rule of the gate reaches the same verdict on it,
    with the same observed values. A column with missing values keeps its nullable dtype and
    GE's per-value path: as floats it would fail its type rule.
    """
    numpy = {
        name: column.to_numpy(dtype=column.dtype.numpy_dtype)
        for name, column in frame.items()
        if isinstance(column.dtype, pd.api.extensions.ExtensionDtype)
        and pd.api.types.is_integer_dtype(column.dtype)
        and not column.hasnans
    }
    return frame.assign(**numpy) if numpy else frame


@functools.cache
def _gate_for(contract_json: str) -> QualityGate:
    return QualityGate(Contract.model_validate_json(contract_json))


def quality_gate(contract: Contract) -> QualityGate:
    """The gate of a contract, built once per process."""
    return _gate_for(contract.model_dump_json())


def _what(kind: str, kwargs: dict) -> str:
    if kind == "expect_column_values_to_not_be_null" and kwargs.get("column") == EVENT_TIME:
        return "have no event time (a date or time part is missing, or names no such date)"
    if kind == "expect_column_values_to_not_be_null":
        tolerated = 1.0 - kwargs.get("mostly", 1.0)
        return "are missing" + (f" (tolerated: {tolerated:.1%})" if tolerated > 0 else "")
    if kind == "expect_column_values_to_be_between":
        low, high = (
            "the largest finite float" if isinstance(v, float) and abs(v) == FLOAT_MAX else v
            for v in (kwargs.get("min_value"), kwargs.get("max_value"))
        )
        if low == high == "the largest finite float":
            return "are not finite numbers"
        return f"are outside [{low}, {high}]"
    if kind == "expect_column_values_to_be_in_set":
        return "are not among the contract's allowed values"
    if kind == "expect_column_values_to_match_regex":
        return f"do not match the contract's pattern {kwargs.get('regex')}"
    if kind in UNIQUE_KINDS:
        return "are duplicates"
    return "fail the expectation"


def _failure(result: Any, frame: pd.DataFrame, history: HistoryWindow | None = None) -> Failure:
    total = len(frame)
    config = result.expectation_config
    kind, kwargs = config.type, dict(config.kwargs)
    check = (config.meta or {}).get("check", SCHEMA)
    column = kwargs.get("column") or ", ".join(kwargs.get("column_list", []) or []) or None
    info = result.result or {}
    raised = bool(result.exception_info and result.exception_info.get("raised_exception"))
    if check == HISTORY and history is not None and not raised:
        observed = info.get("observed_value")
        finding = history_finding(
            history, config.meta["statistic"], None if observed is None else float(observed), total
        )
        return Failure(check, kind, column, f"{finding.line()}.", 0, False, [], [], finding)
    if raised:
        message = result.exception_info.get("exception_message")
        return Failure(
            check,
            kind,
            column,
            f"{kind} on {column} could not be evaluated: {message}.",
            0,
            False,
            [],
            [],
        )
    if "unexpected_count" in info:
        count = int(info["unexpected_count"])
        values = [c["value"] for c in info.get("partial_unexpected_counts", [])]
        where = f"column {column}" if "column" in kwargs else f"columns ({column})"
        sentence = (
            f"{kind} failed on {where}: {count} of {total} rows "
            f"({count / max(total, 1):.1%}) {_what(kind, kwargs)}"
            + (f", e.g. {', '.join(repr(_plain(v)) for v in values)}." if values else ".")
        )
        if kind == "expect_column_values_to_be_in_set":
            sentence += _other_unicode_forms(values, kwargs.get("value_set") or [])
        rows = [int(i) for i in info.get("unexpected_index_list") or []]
        first: list[int] = []
        if kind in UNIQUE_KINDS:
            columns = [kwargs["column"]] if "column" in kwargs else list(kwargs["column_list"])
            first = first_copies(frame, columns, rows)
        return Failure(check, kind, column, sentence, count, True, rows, values, None, first)
    observed = info.get("observed_value")
    if kind == "expect_table_row_count_to_be_between":
        sentence = (
            f"the file holds {observed} rows, expected between {kwargs.get('min_value')} "
            f"and {kwargs.get('max_value') or 'any number'}."
        )
    elif kind == "expect_table_columns_to_match_ordered_list":
        sentence = f"columns are {observed}, expected {kwargs.get('column_list')}."
    else:
        sentence = f"{kind} failed on {column}: observed {observed}."
    return Failure(check, kind, column, sentence, 0, False, [], [])


def first_copies(frame: pd.DataFrame, columns: list[str], rows: list[int]) -> list[int]:
    """Of the duplicated rows at positions `rows`, the first copy of each value of `columns`.

    GE names every copy of a duplicated value; the first one in the file is the row as
    delivered, the later ones its repetitions.
    """
    ordered = sorted(rows)
    later = frame.iloc[ordered].duplicated(subset=columns, keep="first").to_numpy()
    return [row for row, repeated in zip(ordered, later, strict=True) if not repeated]


def _other_unicode_forms(values: list[Any], allowed: list[Any]) -> str:
    """What to say of unexpected values that are allowed ones written in another Unicode form.

    'Zürich' with its accent as a separate character (NFD, as macOS and some exports write
    text) is not the contract's 'Zürich' (NFC), yet both print alike: without this the sentence
    would show a value that looks allowed.
    """
    forms = {unicodedata.normalize("NFC", str(v)) for v in allowed}
    alike = [
        repr(v) for v in values if isinstance(v, str) and unicodedata.normalize("NFC", v) in forms
    ]
    if not alike:
        return ""
    return (
        f" Of these, {', '.join(alike)} read as allowed values but are written in another "
        "Unicode form than the contract's (accents as separate characters, NFD): have the "
        "source write its text in NFC, or convert the file to NFC and re-land it."
    )


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


@functools.cache
def _data_docs_renderer() -> tuple[Any, Any]:
    """GE's page renderer and HTML view, made once per process.

    The view's Jinja environment compiles GE's templates the first time they are used and keeps
    them: a new view per page compiled them again, about 70 % of a page's cost.
    """
    from great_expectations.render.renderer import ValidationResultsPageRenderer
    from great_expectations.render.view import DefaultJinjaPageView

    view = DefaultJinjaPageView()
    # GE's templates are files of the installed package: checking them for changes (a stat of
    # each template a page includes, hundreds a page) cannot find any within a process.
    view.env.auto_reload = False
    return ValidationResultsPageRenderer(), view


def render_data_docs(result: Any) -> str:
    """GE's own Data Docs page (HTML) of one validation result."""
    renderer, view = _data_docs_renderer()
    return str(view.render(renderer.render(result)))


def result_bytes(result: Any) -> bytes:
    """A GE validation result as stored: its JSON (`to_json_dict()`), indented UTF-8.

    Serialised only where it is stored: GE's `to_json_dict` walks every value of the result,
    which costs as much as a tenth of a validation.
    """
    return json.dumps(result.to_json_dict(), indent=2, default=str).encode()
