"""The quality gate of a range of days: one Great Expectations screen shares GE's fixed cost.

GE's cost per validation is mostly its bookkeeping per expectation (a few milliseconds each, 72
of them for flights), whatever the rows: 30 real flights days concatenated validate in about
the time of one day. A range therefore screens its days together, in two GE validations per
chunk of days: one over the days' rows concatenated with a day column (`__day`: the row-level
rules; uniqueness within a day as uniqueness of the key with the day; each row's event time
between its own day's bounds), one over a frame of one row per day and table-level rule
(`day`, `rule`, `value`, `low`, `high`: the row count, tolerated missing values, and each
history statistic against that day's own bounds). GE judges both; when an expectation fails,
the same suite is validated again with complete results, whose failing rows name their days.

Each validation's result is stored as GE returned it, with its Data Docs page, once per range
(`RangeValidation.key`); a day the screen passes stores no result of its own and links to these
two, naming its day value in them (`ScreenedDay.description`). The screen is sound, never
lenient: a day it passes passes its own validation. A day the screen does not pass, or whose
history turns out other than the screen assumed (a reference day in the range failed), is
validated on its own (`QualityGate.validate`): its failures, offending rows, quarantine, GE
result and page are exactly those of a one-day run.
"""

import dataclasses
import datetime as dt
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.model import EVENT_TIME, LOCAL_EVENT_TIME
from ml_platform.contracts.reference import reference_days
from ml_platform.contracts.schema import (
    ContractViolationError,
    expected_typed_dtypes,
)
from ml_platform.platform.storage_errors import MissingPartitionError
from ml_platform.validation.expectations import (
    SUITE_NOTES,
    GateReport,
    QualityGate,
    day_bounds,
    ge_frame,
    quality_gate,
    value_bounds,
    whole_value,
)
from ml_platform.validation.history import (
    HistoryWindow,
    day_profile,
    gated_statistics,
    window_from_profiles,
)

# Columns the screen adds to the concatenated days: each row's partition day and its bounds.
DAY, DAY_START, DAY_END = "__day", "__day_start", "__day_end"
# Columns of the frame of table-level rules: one row per day and rule.
RULE_DAY, RULE, VALUE, LOW, HIGH = "day", "rule", "value", "low", "high"
# A chunk of days screened together holds at most this many rows, so that memory stays bounded
# by a chunk whatever the range; GE's fixed cost is shared by the chunk's days.
MAX_SCREEN_ROWS = 250_000
# The screen judges a table-level statistic against bounds narrowed by this much (relative), so
# that a rounding difference between its statistic and GE's own metric cannot pass a day that
# its own validation would fail by a hair: such a day is validated on its own instead.
MARGIN = 1e-9


def _narrow(low: float | None, high: float | None) -> tuple[float | None, float | None]:
    """Share bounds narrowed by MARGIN, but for 0 and 1, which no share passes by rounding."""
    if low is not None and low > 0.0:
        low = low + MARGIN * max(1.0, abs(low))
    if high is not None and high < 1.0:
        high = high - MARGIN * max(1.0, abs(high))
    return low, high


@dataclasses.dataclass(eq=False)
class RangeValidation:
    """One GE validation of the range's screen, with GE's result as GE returned it.

    `kind` is `rows` (the row-level rules over the days' rows), `days` (the table-level rules,
    one row per day and rule) or `days-2`, `days-3`... (the table-level rules of the days whose
    history changed once the days failing the round before were known). `chunk` is the first
    and last day of the chunk of days screened together; `days` the days the validated frame
    holds; `failed` the days GE found failing (every day of the frame when GE cannot say which).
    """

    kind: str
    chunk: tuple[str, str]
    days: list[str]
    result: Any
    failed: set[str]

    def key(self, contract: Contract, run_id: str) -> str:
        """Where the run stores the result (`.json`) and its Data Docs page (`.html`)."""
        first, last = self.chunk
        return f"{contract.name}/quality/validated_data/range/{first}..{last}/{run_id}.{self.kind}"


@dataclasses.dataclass(frozen=True)
class ScreenedDay:
    """A day the screen passed: the history it was judged against, and GE's two validations."""

    history: HistoryWindow | None
    rows: RangeValidation
    table: RangeValidation

    def description(self, day: str) -> str:
        """Where the day's verdict comes from, for a person who opens the linked results."""
        first, last = self.rows.chunk
        others = [v for v in (self.rows, self.table) if not v.result.success]
        return (
            f"{day} was judged in the range's Great Expectations validations of {first}..{last} "
            f"({len(self.rows.days)} days screened together), not in one of its own: its rows "
            f"are those whose {DAY} is {day} in validation_result (the row-level rules); its "
            f"row count, tolerated missing values and history statistics are the rows whose "
            f"{RULE_DAY} is {day} in table_validation_result. No failing row of the day was found"
            + (
                "; the failures those results list are other days' (each failing row names its "
                "day)."
                if others
                else "."
            )
        )


class RangeScreen:
    """The screen of a contract's gate: its two GE suites, sharing the gate's context."""

    def __init__(self, gate: QualityGate):
        import great_expectations as gx

        self.gate = gate
        contract = gate.contract
        self.contract = contract
        self.statistics = gated_statistics(contract) if contract.quality.history.enabled else []
        self.tolerated = {
            c.name: 1.0 - c.max_null_fraction
            for c in contract.columns
            if not c.nullable and c.max_null_fraction
        }
        source = gate.context.data_sources.add_pandas("range")
        self.rows_batch = source.add_dataframe_asset("rows").add_batch_definition_whole_dataframe(
            "days"
        )
        self.days_batch = source.add_dataframe_asset("days").add_batch_definition_whole_dataframe(
            "days"
        )
        self.rows_suite = gate.context.suites.add(
            gx.ExpectationSuite(
                name=f"{contract.name}_range_rows",
                expectations=self._rows(),
                meta={"notes": SUITE_NOTES},
            )
        )
        self.days_suite = gate.context.suites.add(
            gx.ExpectationSuite(name=f"{contract.name}_range_days", expectations=self._days())
        )

    def _rows(self) -> list[Any]:
        """The row-level rules of the gate, over the days' rows with their day column."""
        import great_expectations as gx

        e = gx.expectations
        contract = self.contract
        dtypes = expected_typed_dtypes(contract)
        event = EVENT_TIME if contract.event_time.timezone_column is None else LOCAL_EVENT_TIME
        rows: list[Any] = [
            e.ExpectTableColumnsToMatchOrderedList(column_list=[*dtypes, DAY, DAY_START, DAY_END]),
            # Missing event times are the not-null rule's; here each row meets its own day.
            e.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A=event,
                column_B=DAY_START,
                or_equal=True,
                ignore_row_if="either_value_is_missing",
            ),
            e.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A=DAY_END,
                column_B=event,
                or_equal=True,
                ignore_row_if="either_value_is_missing",
            ),
            e.ExpectColumnValuesToNotBeNull(column=EVENT_TIME),
        ]
        for col in contract.columns:
            if not col.nullable and col.name not in self.tolerated:
                rows.append(e.ExpectColumnValuesToNotBeNull(column=col.name))
            bounds = value_bounds(col)
            if bounds is not None:
                rows.append(
                    e.ExpectColumnValuesToBeBetween(
                        column=col.name, min_value=bounds[0], max_value=bounds[1]
                    )
                )
            if col.allowed_values is not None:
                rows.append(
                    e.ExpectColumnValuesToBeInSet(column=col.name, value_set=col.allowed_values)
                )
            if col.pattern is not None:
                rows.append(
                    e.ExpectColumnValuesToMatchRegex(
                        column=col.name, regex=whole_value(col.pattern)
                    )
                )
            if col.unique:
                rows.append(e.ExpectCompoundColumnsToBeUnique(column_list=[col.name, DAY]))
        if contract.quality.row_key:
            rows.append(
                e.ExpectCompoundColumnsToBeUnique(column_list=[*contract.quality.row_key, DAY])
            )
        return rows

    def _days(self) -> list[Any]:
        """The table-level rules of the gate, over one row per day and rule.

        Each row holds the rule's value on its day and that day's bounds; a missing bound is an
        unbounded side, which the pair then does not judge, as in the gate.
        """
        import great_expectations as gx

        e = gx.expectations
        return [
            e.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A=VALUE, column_B=LOW, or_equal=True, ignore_row_if="either_value_is_missing"
            ),
            e.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A=HIGH,
                column_B=VALUE,
                or_equal=True,
                ignore_row_if="either_value_is_missing",
            ),
        ]

    def _day_rows(
        self,
        day: str,
        typed: pd.DataFrame,
        history: HistoryWindow | None,
        profile: Mapping[str, float | None],
    ) -> list[tuple[str, float | None, float | None, float | None]]:
        """(rule, value, low, high) of each table-level rule of the day.

        The row count, each tolerated share of missing values (as the present share), each
        history statistic (from the day's profile, as GE measures it).
        """
        quality = self.contract.quality
        rows: list[tuple[str, float | None, float | None, float | None]] = [
            ("row_count", float(len(typed)), quality.row_count.min, quality.row_count.max)
        ]
        rows += [
            (f"present_share({name})", float(typed[name].notna().sum()) / len(typed), least, None)
            for name, least in self.tolerated.items()
        ]
        parameters = self.gate.parameters(day, history)
        for stat in self.statistics:
            low, high = parameters[stat.parameter("min")], parameters[stat.parameter("max")]
            if stat.is_share:
                low, high = _narrow(low, high)
            value, rule = profile[stat.key], f"history {stat.key}"
            if stat.kind == "null_share":
                # GE measures the present share
                value, rule = (None if value is None else 1.0 - value), f"{rule} as present share"
            rows.append((rule, value, low, high))
        return rows

    def screen_rows(
        self, days: Mapping[str, pd.DataFrame], chunk: tuple[str, str]
    ) -> tuple[set[str], RangeValidation | None]:
        """The days among `days` (day -> typed rows) that pass every row-level rule.

        With GE's validation of their rows; None when no day could be judged together.
        """
        signature = {
            day: tuple(zip(frame.columns, map(str, frame.dtypes), strict=True))
            for day, frame in days.items()
        }
        # Days typed alike are screened together; a day typed otherwise is validated alone.
        common = max(set(signature.values()), key=list(signature.values()).count, default=None)
        judged = [day for day, frame in days.items() if signature[day] == common and len(frame)]
        if not judged:
            return set(), None

        def with_day(day: str) -> pd.DataFrame:
            start, end = day_bounds(day)
            return days[day].assign(**{DAY: day, DAY_START: start, DAY_END: end})

        rows = pd.concat([with_day(day) for day in judged], ignore_index=True)
        # BASIC: GE's Data Docs renderer reads the observed column list of the table's rule.
        validation = self._validate(
            "rows", chunk, judged, self.rows_batch, self.rows_suite, ge_frame(rows), [DAY], "BASIC"
        )
        return set(judged) - validation.failed, validation

    def screen_tables(
        self,
        days: Mapping[str, pd.DataFrame],
        histories: Mapping[str, HistoryWindow | None],
        profiles: Mapping[str, Mapping[str, float | None]],
        chunk: tuple[str, str],
        kind: str = "days",
    ) -> tuple[set[str], RangeValidation | None]:
        """The days among `days` that pass every table-level rule against their `histories`.

        With GE's validation of their rules (`kind` names it); None when no day could be
        judged. `profiles` holds each day's profile (`day_profile`) when the history gate is on.
        """
        table = {
            day: self._day_rows(day, frame, histories[day], profiles.get(day, {}))
            for day, frame in days.items()
            if len(frame)
        }
        # A statistic the day does not define (no labelled row) is judged by the day's own
        # validation, bounded or not (GE fails a value it cannot measure): the screen's pair
        # would leave it out.
        judged = [
            day for day, rows in table.items() if not any(value is None for _, value, _, _ in rows)
        ]
        if not judged:
            return set(), None
        per_day = pd.DataFrame(
            [(day, *row) for day in judged for row in table[day]],
            columns=[RULE_DAY, RULE, VALUE, LOW, HIGH],
        ).astype({VALUE: "float64", LOW: "float64", HIGH: "float64"})
        validation = self._validate(
            kind,
            chunk,
            judged,
            self.days_batch,
            self.days_suite,
            per_day,
            [RULE_DAY, RULE],
            "BOOLEAN_ONLY",
        )
        return set(judged) - validation.failed, validation

    @staticmethod
    def _validate(
        kind: str,
        chunk: tuple[str, str],
        days: list[str],
        definition: Any,
        suite: Any,
        frame: pd.DataFrame,
        names: list[str],
        result_format: str,
    ) -> RangeValidation:
        """GE's validation of `frame` (the rows of `days`; `names[0]` is the day column).

        A first validation asks GE for little detail (`result_format`: whether each expectation
        holds, and the observed values of table-level ones with BASIC), which skips the lists
        of unexpected rows. When an expectation fails, the suite is validated again with
        complete results, each failing row named by the `names` columns (its day, and its rule
        in the frame of table-level rules); that result is the one kept. A table-level failure,
        or a failure whose rows GE does not list, fails every day of the frame.
        """
        batch = definition.get_batch(batch_parameters={"dataframe": frame})
        result = batch.validate(suite, result_format=result_format)
        failed: set[str] = set()
        if not result.success:
            result = batch.validate(
                suite,
                result_format={"result_format": "COMPLETE", "unexpected_index_column_names": names},
            )
            for r in result.results:
                if r.success:
                    continue
                indexes = (r.result or {}).get("unexpected_index_list")
                if not indexes or not all(isinstance(i, dict) for i in indexes):
                    failed = set(days)
                    break
                failed.update(str(i[names[0]]) for i in indexes)
        return RangeValidation(kind, chunk, days, result, failed)

    def passed_report(self, typed: pd.DataFrame) -> GateReport:
        """The report of a day the screen passed: no failure, each rule of the gate judged.

        Its rules were judged in the range's validations, whose results are the range's: the
        day has no GE result of its own.
        """
        return GateReport(rows=len(typed), failures=[], evaluated=self.gate.expectation_count)


@functools.cache
def _screen_for(contract_json: str) -> RangeScreen:
    return RangeScreen(quality_gate(Contract.model_validate_json(contract_json)))


def range_screen(contract: Contract) -> RangeScreen:
    """The range screen of a contract's gate, built once per process."""
    return _screen_for(contract.model_dump_json())


def assumed_window(
    profile_of: Callable[[str], dict[str, float | None] | None],
    contract: Contract,
    day: str,
    passing: Mapping[str, dict[str, float | None]],
) -> HistoryWindow:
    """The history of `day` if the range's days before it in `passing` pass the gate.

    Each such day's profile is the one it records on passing; the other reference days' are
    those `profile_of` gives. Whether the assumption held is known only when `day` is judged:
    the day compares it with its actual history then (`history_window`).
    """
    date = dt.date.fromisoformat(day)
    profiles = {}
    for reference in reference_days(
        contract.history_reference, date, contract.partitions.start_date
    ):
        key = reference.isoformat()
        profile = passing[key] if key in passing else profile_of(key)
        if profile is not None:
            profiles[key] = profile
    return window_from_profiles(contract, day, profiles)


def screen_range(
    profile_of: Callable[[str], dict[str, float | None] | None],
    contract: Contract,
    days: Sequence[str],
    rows_of: Callable[[str], int],
    typed_of: Callable[[str], pd.DataFrame],
    history_on: bool,
    profiles: dict[str, dict[str, float | None]] | None = None,
) -> dict[str, ScreenedDay]:
    """The days of a range the screen passes, each with its history and GE's validations.

    With the history gate, `profiles` (when given) receives each screened day's `day_profile`.

    Days are screened in order, in chunks of at most MAX_SCREEN_ROWS rows. A day larger than
    a quarter of that is not screened: GE's fixed cost is small beside its rows, and the day
    is validated on its own. A day whose parse cannot be read or typed is not screened either:
    judged on its own, it fails with its reason, as it would in a one-day run.

    With the history gate, a day's history holds the range's days before it that pass. The
    screen first assumes every day of the chunk passes; the days it does not pass are then
    assumed to fail, and the days whose history that changes are screened again against it, in
    rounds until no day's history changes.
    """
    screen = range_screen(contract)
    passed: dict[str, ScreenedDay] = {}
    profiles = {} if profiles is None else profiles
    chunk: dict[str, pd.DataFrame] = {}

    def histories(
        passing: Iterable[str],
        changed: set[str] | None = None,
        previous: dict[str, HistoryWindow | None] | None = None,
    ) -> dict[str, HistoryWindow | None]:
        """Each chunk day's history if the `passing` days pass.

        The `previous` history is kept where none of its reference days is `changed`.
        """
        if not history_on:
            return dict.fromkeys(chunk)
        assumed = {day: profiles[day] for day in passing}
        windows: dict[str, HistoryWindow | None] = {}
        for day in chunk:
            window = None if previous is None else previous[day]
            if window is None or changed is None or changed & set(window.wanted):
                window = assumed_window(profile_of, contract, day, assumed)
            windows[day] = window
        return windows

    def judge_chunk() -> None:
        if not chunk:
            return
        bounds = (next(iter(chunk)), next(reversed(chunk)))
        earlier = [day for day in passed if day in profiles]
        # Row-level verdicts do not depend on history: only the table-level rules are judged
        # again when the history changes.
        first = histories([*earlier, *chunk])
        rows_pass, rows = screen.screen_rows(chunk, bounds)
        clean, table = screen.screen_tables(
            {d: chunk[d] for d in chunk if d in rows_pass}, first, profiles, bounds
        )
        # Each day the screen passed, with the history it was judged against and the validation.
        verdicts = {day: (first[day], table) for day in chunk if day in clean}
        judged, dropped, rounds = first, set(chunk) - clean, 1
        # The days it did not pass are assumed to fail; the days whose history that changes are
        # judged again against it, until no history changes (each round drops a day or ends).
        while history_on and dropped:
            current = histories([*earlier, *verdicts], changed=dropped, previous=judged)
            changed = {
                day: chunk[day]
                for day in chunk
                if day in verdicts and current[day] != verdicts[day][0]
            }
            if not changed:
                break
            rounds += 1
            again, table_again = screen.screen_tables(
                changed, current, profiles, bounds, kind=f"days-{rounds}"
            )
            for day in changed:
                if day in again:
                    assert table_again is not None
                    verdicts[day] = (current[day], table_again)
                else:
                    del verdicts[day]
            judged, dropped = current, set(changed) - again
        for day, (history, validation) in verdicts.items():
            assert rows is not None and validation is not None
            passed[day] = ScreenedDay(history, rows, validation)
        chunk.clear()

    for day in days:
        if rows_of(day) > MAX_SCREEN_ROWS // 4:
            continue
        try:
            typed = typed_of(day)
        except (MissingPartitionError, ContractViolationError):
            continue  # the day's own validation raises this again, naming file and partition
        if history_on:
            profiles[day] = day_profile(typed, contract)
        chunk[day] = typed
        if sum(map(len, chunk.values())) >= MAX_SCREEN_ROWS:
            judge_chunk()
    judge_chunk()
    return passed


def range_validations(screened: Mapping[str, ScreenedDay]) -> list[RangeValidation]:
    """The screen's GE validations the `screened` days link to, each once, in order."""
    found: dict[int, RangeValidation] = {}
    for entry in screened.values():
        for validation in (entry.rows, entry.table):
            found.setdefault(id(validation), validation)
    return list(found.values())
