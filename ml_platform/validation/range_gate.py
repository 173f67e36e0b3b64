"""The quality gate of a range of days: one Great Expectations screen shares GE's fixed cost.

GE's cost per validation is mostly its bookkeeping per expectation (a few milliseconds each, 72
of them for flights), whatever the rows: 30 real flights days concatenated validate in about
the time of one day. A range therefore screens its days together, in two GE validations per
chunk of days: one over the days' rows concatenated with a day column (the row-level rules;
uniqueness within a day as uniqueness of the key with the day; each row's event time between
its own day's bounds), one over a frame of one row per day (the table-level rules: the row
count, tolerated missing values, and each history statistic against that day's own bounds).
GE judges both; its failing rows name the days.

The screen is sound, never lenient: a day it passes passes its own validation, and gets the
result its own validation would have returned (every expectation of the day's suite successful,
with the day's parameters and observed values), stored and rendered as Data Docs as before. A
day the screen does not pass, or whose history turns out other than the screen assumed (a
reference day in the range failed), is validated on its own (`QualityGate.validate`): its
failures, offending rows, quarantine and page are exactly those of a one-day run.
"""

import copy
import datetime as dt
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.model import EVENT_TIME, LOCAL_EVENT_TIME
from ml_platform.drift.reference import reference_days
from ml_platform.platform.storage import LakeStorage, MissingPartitionError
from ml_platform.validation.expectations import (
    GE_TYPES,
    GateReport,
    QualityGate,
    quality_gate,
    whole_value,
)
from ml_platform.validation.history import (
    HistoryWindow,
    day_profile,
    gated_statistics,
    stored_profile,
    window_from_profiles,
)
from ml_platform.validation.schema import (
    ContractViolationError,
    expected_typed_dtypes,
)

# Columns the screen adds to the concatenated days: each row's partition day and its bounds.
DAY, DAY_START, DAY_END = "__day", "__day_start", "__day_end"
VALUE, LOW, HIGH = "value", "low", "high"
# A chunk of days screened together holds at most this many rows, so that memory stays bounded
# by a chunk whatever the range; GE's fixed cost is shared by the chunk's days.
MAX_SCREEN_ROWS = 250_000
# The screen judges a table-level statistic against bounds narrowed by this much (relative), so
# that a rounding difference between its statistic and GE's own metric cannot pass a day that
# its own validation would fail by a hair: such a day is validated on its own instead.
MARGIN = 1e-9
NO_EXCEPTION = {"raised_exception": False, "exception_traceback": None, "exception_message": None}


def _narrow(low: float | None, high: float | None) -> tuple[float | None, float | None]:
    """Share bounds narrowed by MARGIN, but for 0 and 1, which no share passes by rounding."""
    if low is not None and low > 0.0:
        low = low + MARGIN * max(1.0, abs(low))
    if high is not None and high < 1.0:
        high = high - MARGIN * max(1.0, abs(high))
    return low, high


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
            gx.ExpectationSuite(name=f"{contract.name}_range_rows", expectations=self._rows())
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
        rows += [
            e.ExpectColumnValuesToBeOfType(column=name, type_=GE_TYPES[dtype])
            for name, dtype in dtypes.items()
        ]
        for col in contract.columns:
            if not col.nullable and col.name not in self.tolerated:
                rows.append(e.ExpectColumnValuesToNotBeNull(column=col.name))
            if col.min is not None or col.max is not None:
                rows.append(
                    e.ExpectColumnValuesToBeBetween(
                        column=col.name, min_value=col.min, max_value=col.max
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
        """The table-level rules of the gate, over one row per day and statistic.

        Each row holds the statistic's value on its day and that day's bounds; a missing bound
        is an unbounded side, which the pair then does not judge, as in the gate.
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
    ) -> list[tuple[float | None, float | None, float | None]]:
        """(value, low, high) of each table-level rule of the day.

        The row count, each tolerated share of missing values (as the present share), each
        history statistic (from the day's profile, as GE measures it).
        """
        quality = self.contract.quality
        rows: list[tuple[float | None, float | None, float | None]] = [
            (float(len(typed)), quality.row_count.min, quality.row_count.max)
        ]
        rows += [
            (float(typed[name].notna().sum()) / len(typed), least, None)
            for name, least in self.tolerated.items()
        ]
        parameters = self.gate.parameters(day, history)
        for stat in self.statistics:
            low, high = parameters[stat.parameter("min")], parameters[stat.parameter("max")]
            if stat.is_share:
                low, high = _narrow(low, high)
            else:
                # GE's count expectations hold their bounds as integers (it truncates them);
                # a count is an integer, so these bounds are exact.
                low, high = (None if b is None else float(int(b)) for b in (low, high))
            value = profile[stat.key]
            if value is not None and stat.kind == "null_share":
                value = 1.0 - value  # GE measures the present share
            rows.append((value, low, high))
        return rows

    def screen_rows(self, days: Mapping[str, pd.DataFrame]) -> set[str]:
        """The days among `days` (day -> typed rows) that pass every row-level rule."""
        signature = {
            day: tuple(zip(frame.columns, map(str, frame.dtypes), strict=True))
            for day, frame in days.items()
        }
        # Days typed alike are screened together; a day typed otherwise is validated alone.
        common = max(set(signature.values()), key=list(signature.values()).count, default=None)
        judged = [day for day, frame in days.items() if signature[day] == common and len(frame)]
        if not judged:
            return set()
        rows = pd.concat(
            [
                days[day].assign(
                    **{
                        DAY: day,
                        DAY_START: (start := pd.Timestamp(day)),
                        DAY_END: start + pd.Timedelta(days=1) - pd.Timedelta(microseconds=1),
                    }
                )
                for day in judged
            ],
            ignore_index=True,
        )
        return set(judged) - self._suspects(self.rows_batch, self.rows_suite, rows, list(rows[DAY]))

    def screen_tables(
        self,
        days: Mapping[str, pd.DataFrame],
        histories: Mapping[str, HistoryWindow | None],
        profiles: Mapping[str, Mapping[str, float | None]],
    ) -> set[str]:
        """The days among `days` that pass every table-level rule against their `histories`.

        `profiles` holds each day's profile (`day_profile`) when the history gate is on.
        """
        table = {
            day: self._day_rows(day, frame, histories[day], profiles.get(day, {}))
            for day, frame in days.items()
            if len(frame)
        }
        # A statistic the day does not define (no labelled row) is judged by the day's own
        # validation when it has bounds: the screen's pair would leave it out.
        judged = [
            day
            for day, rows in table.items()
            if not any(value is None and (low, high) != (None, None) for value, low, high in rows)
        ]
        if not judged:
            return set()
        per_day = pd.DataFrame(
            [row for day in judged for row in table[day]],
            columns=[VALUE, LOW, HIGH],
            dtype="float64",
        )
        owners = [day for day in judged for _ in table[day]]
        return set(judged) - self._suspects(self.days_batch, self.days_suite, per_day, owners)

    @staticmethod
    def _suspects(definition: Any, suite: Any, frame: pd.DataFrame, day_of: list[str]) -> set[str]:
        """The days of `frame`'s rows (their day in `day_of`) that fail an expectation of `suite`.

        A table-level failure, or one whose rows GE does not list, makes every day a suspect.
        """
        import great_expectations as gx

        batch = definition.get_batch(batch_parameters={"dataframe": frame})
        result = batch.validate(suite, result_format="BOOLEAN_ONLY")
        failed = [r for r in result.results if not r.success]
        if not failed:
            return set()
        ids = {r.expectation_config.id for r in failed}
        detail = gx.ExpectationSuite(
            name=f"{suite.name}_detail",
            expectations=[copy.copy(e) for e in suite.expectations if e.id in ids],
        )
        complete = batch.validate(detail, result_format={"result_format": "COMPLETE"})
        suspects: set[str] = set()
        for r in complete.results:
            if r.success:
                continue
            indexes = (r.result or {}).get("unexpected_index_list")
            if indexes is None:
                return set(day_of)
            suspects.update(day_of[int(i)] for i in indexes)
        return suspects

    @functools.cached_property
    def _passing_template(self) -> list[tuple[Any, dict[str, Any]]]:
        """Each expectation of the gate's suite, in GE's order, with its JSON when it passes.

        A passing day's result differs from another's only in its parameters (its time and
        history bounds) and observed table values: GE serialises the rest once.
        """
        from great_expectations.core import ExpectationValidationResult

        template = []
        for config in _validation_order(e.configuration for e in self.gate.suite.expectations):
            if config.type.startswith("expect_table_"):
                # The gate's table-level results come from its detail pass, whose copies of the
                # expectations carry no id.
                config = type(config)(
                    type=config.type,
                    kwargs=config.kwargs,
                    meta=config.meta,
                    severity=config.severity,
                )
            config.kwargs = {"batch_id": self.batch_id, **config.kwargs}
            passed = ExpectationValidationResult(
                success=True, expectation_config=config, exception_info=NO_EXCEPTION
            )
            template.append((config, passed.to_json_dict()))
        return template

    @functools.cached_property
    def batch_id(self) -> str:
        """The id GE gives a batch of the gate's whole-dataframe asset."""
        asset = self.gate.batch_definition.data_asset
        return f"{asset.datasource.name}-{asset.name}"

    def passing_result(
        self, typed: pd.DataFrame, day: str, history: HistoryWindow | None
    ) -> tuple[GateReport, Any]:
        """The result the day's own validation returns when every expectation passes."""
        from great_expectations import __version__ as ge_version
        from great_expectations.core import (
            ExpectationSuiteValidationResult,
            ExpectationValidationResult,
        )
        from great_expectations.util import convert_to_json_serializable

        parameters = self.gate.parameters(day, history)
        observed = {
            "expect_table_columns_to_match_ordered_list": list(typed.columns),
            "expect_table_row_count_to_be_between": len(typed),
        }
        results, documents = [], []
        for template, document in self._passing_template:
            kwargs = _substituted(template.kwargs, parameters)
            value = observed.get(template.type)
            observation = {} if value is None else {"observed_value": value}
            if kwargs != template.kwargs or observation:
                # Through GE's expectation model, which coerces the arguments (an integer row
                # count bound, say) as its validation does.
                config = (
                    type(template)(
                        type=template.type,
                        kwargs=kwargs,
                        meta=template.meta,
                        severity=template.severity,
                        id=template.id,
                    )
                    .to_domain_obj()
                    .configuration
                )
                kwargs = config.kwargs
                document = {
                    **document,
                    "expectation_config": {
                        **document["expectation_config"],
                        "kwargs": convert_to_json_serializable(kwargs),
                    },
                    "result": convert_to_json_serializable(observation),
                }
            else:
                config = template
            results.append(
                ExpectationValidationResult(
                    success=True,
                    expectation_config=config,
                    result=observation,
                    exception_info=NO_EXCEPTION,
                )
            )
            documents.append(document)
        count = len(results)
        statistics = {
            "evaluated_expectations": count,
            "successful_expectations": count,
            "unsuccessful_expectations": 0,
            "success_percent": 100.0,
        }
        # Says where the verdict came from: the range's screen, not a validation of the day.
        meta = {"great_expectations_version": ge_version, "judged_in_range_screen": True}
        suite = self.gate.suite.name
        result = ExpectationSuiteValidationResult(
            success=True,
            results=results,
            suite_name=suite,
            suite_parameters={},
            statistics=statistics,
            meta=meta,
        )
        result_json = {
            "success": True,
            "results": documents,
            "suite_name": suite,
            "suite_parameters": {},
            "statistics": statistics,
            "meta": meta,
            "id": None,
        }
        report = GateReport(rows=len(typed), failures=[], result_json=result_json, evaluated=count)
        return report, result


def _substituted(kwargs: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    """Expectation arguments with suite parameters put in; an unset one is left out, as in GE."""
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, dict) and set(value) == {"$PARAMETER"}:
            value = parameters[value["$PARAMETER"]]
            if value is None:
                continue
        out[key] = value
    return out


def _validation_order(configs: Iterable[Any]) -> list[Any]:
    """Expectations in the order GE's validator evaluates and reports them: by column."""
    groups: dict[str, list[Any]] = {}
    for config in configs:
        column = config.kwargs.get("column")
        groups.setdefault(column if isinstance(column, str) else "", []).append(config)
    return [config for group in groups.values() for config in group]


@functools.cache
def _screen_for(contract_json: str) -> RangeScreen:
    return RangeScreen(quality_gate(Contract.model_validate_json(contract_json)))


def range_screen(contract: Contract) -> RangeScreen:
    """The range screen of a contract's gate, built once per process."""
    return _screen_for(contract.model_dump_json())


def assumed_window(
    lake: LakeStorage,
    contract: Contract,
    day: str,
    passing: Mapping[str, dict[str, float | None]],
) -> HistoryWindow:
    """The history of `day` if the range's days before it in `passing` pass the gate.

    Each such day's profile is the one it stores on passing; the other reference days are
    those stored. Whether the assumption held is known only when `day` is judged: the day
    compares it with its actual history then (`history_window`).
    """
    date = dt.date.fromisoformat(day)
    profiles = {}
    for reference in reference_days(
        contract.history_reference, date, contract.partitions.start_date
    ):
        key = reference.isoformat()
        profile = passing[key] if key in passing else stored_profile(lake, contract, key)
        if profile is not None:
            profiles[key] = profile
    return window_from_profiles(contract, day, profiles)


def screen_range(
    lake: LakeStorage,
    contract: Contract,
    days: Sequence[str],
    rows_of: Callable[[str], int],
    typed_of: Callable[[str], pd.DataFrame],
    history_on: bool,
    profiles: dict[str, dict[str, float | None]] | None = None,
) -> dict[str, HistoryWindow | None]:
    """The days of a range the screen passes, each with the history it was judged against.

    With the history gate, `profiles` (when given) receives each screened day's `day_profile`.

    Days are screened in order, in chunks of at most MAX_SCREEN_ROWS rows. A day larger than
    a quarter of that is not screened: GE's fixed cost is small beside its rows, and the day
    is validated on its own. A day whose parse cannot be read or typed is not screened either:
    judged on its own, it fails with its reason, as it would in a one-day run.

    With the history gate, a day's history holds the range's days before it that pass. The
    screen first assumes every day of the chunk passes; the days it does not pass are then
    assumed to fail, and the days whose history that changes are screened again against it.
    """
    screen = range_screen(contract)
    passed: dict[str, HistoryWindow | None] = {}
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
                window = assumed_window(lake, contract, day, assumed)
            windows[day] = window
        return windows

    def judge_chunk() -> None:
        earlier = [day for day in passed if day in profiles]
        # Row-level verdicts do not depend on history: only the table-level rules are judged
        # again when the history changes.
        first = histories([*earlier, *chunk])
        rows_pass = screen.screen_rows(chunk)
        clean = screen.screen_tables({d: chunk[d] for d in rows_pass}, first, profiles)
        second = histories([*earlier, *clean], changed=set(chunk) - clean, previous=first)
        changed = {day: chunk[day] for day in clean if second[day] != first[day]}
        again = screen.screen_tables(changed, second, profiles) if changed else set()
        passed.update({day: first[day] for day in clean if day not in changed})
        passed.update({day: second[day] for day in again})
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
