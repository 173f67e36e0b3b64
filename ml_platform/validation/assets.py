"""validated_data: the accepted layer, the typed rows of each day that passed the GE gate.

It judges the delivery raw_data recorded for the day. A day that fails is a data verdict
(`platform.steps`): recorded as rejected, with its failed checks, and the rejected parse kept
in the day's quarantine; an earlier accepted version of the day stays the day's.
"""

import datetime as dt
import functools
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.reference import reference_days
from ml_platform.contracts.schema import ContractViolationError, type_rows
from ml_platform.ingestion.assets import keep_rejected, rejected_key
from ml_platform.platform.datasets import asset_key, dataset_name, writer_pool
from ml_platform.platform.formats import FORMAT_KEY, serialise
from ml_platform.platform.inputs import DailyInput
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.observability import table_schema
from ml_platform.platform.records import version_metadata
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.platform.runbook import check_description
from ml_platform.platform.sizes import request_metadata, step_tags
from ml_platform.platform.steps import (
    DataVerdict,
    Verdict,
    daily_backfill_policy,
    daily_check_spec,
    each_day,
    previous_day_input,
)
from ml_platform.platform.storage import LakeStorage
from ml_platform.validation.expectations import (
    CHECKS,
    HISTORY,
    SAMPLE_ROWS,
    Failure,
    GateReport,
    quality_gate,
    render_data_docs,
    result_bytes,
)
from ml_platform.validation.history import (
    HISTORY_TABLE_COLUMNS,
    PROFILE_KEY,
    HistoryWindow,
    day_profile,
    findings_text,
    gated_statistics,
    history_table,
    history_window,
)
from ml_platform.validation.range_gate import (
    MAX_SCREEN_ROWS,
    ScreenedDay,
    range_screen,
    range_validations,
    screen_range,
)

QUARANTINE_REASONS = "quarantine_reasons"
# One ERROR check per day that says whether the day's delivery was accepted: its Partitions tab
# is the list of rejected days, each with its reason.
DELIVERY_CHECK = "delivery_accepted"
DELIVERY_TEXT = (
    "The day's delivery was accepted: it was landed, readable, of the contract's schema and "
    "passed the quality gate. Fails with the reason when the day was rejected."
)
# From this many rows a day's raw frame is emptied once typed; below, the memory it frees is
# small beside what deleting its columns one by one costs (milliseconds a day).
FREE_RAW_ROWS = 100_000


def quarantine_allowed(contract: Contract, report: GateReport) -> bool:
    """Whether the rows failing row-level expectations may be set aside instead of failing."""
    policy = contract.quality.bad_rows
    share = len(report.quarantine_reasons()) / max(report.rows, 1)
    return policy.policy == "quarantine" and share <= policy.max_fraction


def ordered(failures: list[Failure]) -> list[Failure]:
    """Failures worst first.

    History findings by `Finding.sort_key`; the others table-level (columns, types, row count)
    first, then by the rows they affect.
    """
    return sorted(
        failures,
        key=lambda f: (
            (0, *f.finding.sort_key()) if f.finding else (1, f.row_level, -f.unexpected_count)
        ),
    )


def findings_description(failures: list[Failure], history: HistoryWindow | None) -> str:
    """The worst failure in one sentence, then one short line per further failure."""
    findings = [f.finding for f in failures if f.finding is not None]
    if history is not None and findings and len(findings) == len(failures):
        return findings_text(findings, history)
    first, *rest = ordered(failures)
    return "\n".join([first.sentence, *(f"- {f.sentence}" for f in rest)])


def history_description(
    contract: Contract, report: GateReport, where: str, history: HistoryWindow | None
) -> str:
    """What the history check found, and what to do when it failed."""
    failures = report.of(HISTORY)
    if history is None:
        return (
            f"{where}: the history gate is off in the contract (quality.history.enabled is "
            "false, or its statistics are empty); nothing was compared with the days before."
        )
    if not failures:
        if history.too_short:
            return f"{where}: passes, as {history.note()}."
        judged = len(history.bounds)
        return (
            f"{where}: all {judged} history statistics are within their bounds from "
            f"{history.note()}."
        )
    spec = contract.quality.history
    return (
        f"{where}: {findings_description(failures, history)}\n"
        f"{history.reference_line()} Every statistic is in the metadata (history_table).\n"
        "If the file is broken or incomplete, fix it upstream and re-land it. If the change is "
        f"real and lasting, tune quality.history in the contract (spread {spec.spread}, "
        f"share_floor {spec.share_floor}, count_floor {spec.count_floor}) or leave the "
        "statistic out of `statistics`: a failed day never becomes history."
    )


def history_metadata(
    report: GateReport, history: HistoryWindow | None, profile: dict[str, float | None] | None
) -> dict[str, Any]:
    """The numbers behind the history check: reference days, each statistic and each failure.

    `profile` is the day's own (`day_profile`), for the table of every statistic judged.
    """
    if history is None:
        return {}
    failures = report.of(HISTORY)
    table: dict[str, Any] = {}
    if profile is not None:
        failed = {f.finding.statistic.key for f in failures if f.finding is not None}
        rows = history_table(history, profile, failed)
        table["history_table"] = dg.MetadataValue.table(
            records=[dg.TableRecord(row) for row in rows],
            schema=dg.TableSchema(
                columns=[dg.TableColumn(name, "string") for name in HISTORY_TABLE_COLUMNS]
            ),
        )
    return {
        "history_reference_days": history.stored,
        "history_missing_days": [d for d in history.wanted if d not in history.stored],
        "history_days_needed": history.needed,
        "history_statistics_judged": len(history.bounds),
        # An expectation GE could not evaluate has no numbers, only its error.
        "history_failures": {
            f.finding.statistic.key if f.finding else f"{f.expectation}({f.column})": (
                f.finding.details() if f.finding else {"error": f.sentence}
            )
            for f in failures
        },
        **table,
    }


def check_passes(contract: Contract, report: GateReport, name: str) -> bool:
    """Whether check `name` passes: nothing failed, or only rows the quarantine may take."""
    failures = report.of(name)
    row_level_only = all(f.row_level for f in failures)
    return not failures or (row_level_only and quarantine_allowed(contract, report))


def findings_table(failures: list[Failure]) -> dg.MetadataValue:
    """Every failed expectation of a check: rule, column, rows affected, examples, in words."""
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "expectation": f.expectation,
                    "column": f.column,
                    "unexpected_rows": f.unexpected_count,
                    "examples": ", ".join(repr(v) for v in f.unexpected_values),
                    "finding": f.sentence,
                }
            )
            for f in ordered(failures)
        ],
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn("expectation", "string"),
                dg.TableColumn("column", "string"),
                dg.TableColumn("unexpected_rows", "int"),
                dg.TableColumn("examples", "string"),
                dg.TableColumn("finding", "string"),
            ]
        ),
    )


def check_results(
    contract: Contract,
    report: GateReport,
    typed: pd.DataFrame,
    where: str,
    links: dict[str, dg.MetadataValue],
    history: HistoryWindow | None = None,
    profile: dict[str, float | None] | None = None,
    reference_versions: dict[str, Any] | None = None,
) -> list[dg.AssetCheckResult]:
    """One blocking check per family of expectations, each saying what failed and where.

    `profile` is the day's profile when the history gate is on (its table of statistics);
    `reference_versions` names the version of each of its reference days
    (`records.version_metadata`), in the history check's metadata.
    """
    results = []
    for name in CHECKS:
        failures = report.of(name)
        passed = check_passes(contract, report, name)
        rows = sorted({row for f in failures for row in f.rows})
        extra = history_metadata(report, history, profile) if name == HISTORY else {}
        if name == HISTORY and history is not None:
            extra.update(reference_versions or {})
        if failures and name != HISTORY:
            extra["findings"] = findings_table(failures)
        if name == HISTORY:
            description = history_description(contract, report, where, history)
        elif not failures:
            description = f"{where}: all {name} expectations pass."
        elif passed:
            quarantined = {row for f in failures for row in f.quarantined_rows}
            # A duplicated row's first copy is the row as delivered: it stays in the day.
            copies = (
                " (of each duplicated row its later copies; the first copy is kept)"
                if any(f.first_copies for f in failures)
                else ""
            )
            description = (
                f"{where}: {findings_description(failures, None)}\nThese {len(quarantined)} "
                f"row(s) were quarantined with their reasons{copies}; the day passes because "
                "their share is within the contract's limit."
            )
        else:
            description = (
                f"{where}: {findings_description(failures, None)}\nFix the upstream file and "
                "re-land it, or change the contract if this is the new normal."
            )
        sample = typed.iloc[rows[:SAMPLE_ROWS]] if rows else typed.iloc[0:0]
        results.append(
            dg.AssetCheckResult(
                check_name=name,
                passed=passed,
                severity=dg.AssetCheckSeverity.ERROR,
                description=description,
                metadata={
                    "failed_expectations": [f.expectation for f in failures],
                    "unexpected_rows": len(rows),
                    "unexpected_values": {
                        f.column or f.expectation: [str(v) for v in f.unexpected_values]
                        for f in failures
                        if f.unexpected_values
                    },
                    "offending_rows": dg.MetadataValue.md(
                        markdown_cells(sample).to_markdown(index=True) if len(sample) else "none"
                    ),
                    **extra,
                    **links,
                },
            )
        )
    return results


def markdown_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with its text cells escaped for a markdown table.

    An offending value is whatever the file held: a '|' in it would start a column of its own,
    a line break a row.
    """

    def cell(value: object) -> object:
        if not isinstance(value, str):
            return value
        return value.replace("|", "\\|").replace("\r", " ").replace("\n", " ")

    text = frame.select_dtypes(include=["object", "string"]).columns
    return frame.assign(**{str(name): frame[name].map(cell) for name in text})


def verdict_reason(where: str, checks: list[dg.AssetCheckResult], report: GateReport) -> str:
    """Why a day failed the gate, short: each failed check's worst finding, in check order."""
    names = ", ".join(str(c.check_name) for c in checks)
    worst = []
    for check in checks:
        failures = report.of(str(check.check_name))
        if failures:
            first = ordered(failures)[0]
            text = first.finding.line() if first.finding else first.sentence.rstrip(".")
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            worst.append(f"{text}{more}")
    return f"{where} failed the quality gate ({names}): {'; '.join(worst)}."


def build_validated_data(
    contract: Contract, partitions: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    """The validated_data asset of a dataset."""
    history_on = contract.quality.history.enabled and bool(gated_statistics(contract))
    raw_asset = asset_key(contract.name, "raw_data")
    validated_asset = asset_key(contract.name, "validated_data")

    @dg.asset(
        name="validated_data",
        key_prefix=contract.name,
        pool=writer_pool(contract.name, "validated_data"),
        partitions_def=partitions,
        backfill_policy=daily_backfill_policy(),
        retry_policy=STORAGE_RETRY_POLICY,
        group_name=dataset_name(contract.name, "validation"),
        kinds={"pandas", "parquet", "greatexpectations"},
        metadata={FORMAT_KEY: "parquet", **request_metadata(contract, "validated_data")},
        op_tags=step_tags(contract, "validated_data"),
        ins={
            "raw_data": dg.AssetIn(raw_asset),
            # A day is judged against the accepted days before it (the history gate): the day
            # before must be judged first, so a backfill's chunks run in day order, whatever
            # their size, and a day's verdict does not depend on how the range was split.
            "prev": previous_day_input(validated_asset),
        },
        check_specs=[
            daily_check_spec(
                name,
                asset_key(contract.name, "validated_data"),
                partitions,
                description=check_description(name, text),
            )
            for name, text in {**CHECKS, DELIVERY_CHECK: DELIVERY_TEXT}.items()
        ],
    )
    def validated_data(
        context: dg.AssetExecutionContext, raw_data: Any, lake: LakeStorage
    ) -> Iterator:
        """Rows of day D, typed per the contract, that passed the Great Expectations gate.

        Each row gets its event time (local; or UTC, beside each row's local time, when the contract
        names a timezone column) and its label. The gate is generated from the contract and checks
        columns and types, missing values, ranges and allowed values, duplicates, row count and that
        every row falls on day D (by its local time), and compares the day's null shares, labelled
        share, positive rate, row count and distinct counts with those of its reference days that
        are accepted (the history gate: each passing day records its profile, `history_profile`).
        It judges the delivery raw_data recorded. A day that fails is recorded rejected with the
        reason (a data verdict, not a failure of the step); an earlier accepted version of the day
        is kept, and the rejected file's parse is kept in the day's quarantine. The GE result and
        a Data Docs page are stored either way.
        Under the `quarantine` policy, rows failing a row-level expectation are set aside with their
        reasons and the day passes if they are few enough. Rows without a label yet (a cancelled
        flight) are kept and counted. A range run screens its days together first, in a few GE
        validations instead of one a day, whose results and Data Docs pages are stored once for
        the range; each day still gets its own verdict and checks, the same as a run of that day
        alone. A day the screen passed links to the range's results (naming its day in them); any
        other day is validated on its own and stores its own result and page.
        """

        def where_of(day: str) -> str:
            return f"{contract.landing.file_name(day)} (partition {day})"

        store: LakeIOManager = context.resources.io_manager
        instance = context.instance
        days = context.partition_keys
        # The deliveries raw_data records for the step's days, read through the input only:
        # by the range's screen, by each day, and again for a rejected parse.
        deliveries: DailyInput = raw_data
        # The rows of each delivery as raw_data recorded them, which size the range's screen.
        delivered_rows = {
            day: record.accepted_rows or 0
            for day, record in store.records(instance, raw_asset, days).items()
            if record.accepted
        }

        def load_raw(day: str) -> pd.DataFrame:
            """The day's delivery, loaded through the input's loader but not kept in its cache.

            For the range's screen (which keeps what it needs itself) and for a rejected parse,
            whose frame the day emptied once typed (FREE_RAW_ROWS).
            """
            frame: pd.DataFrame = deliveries.cache.load(day)
            return frame

        # History is the accepted days Dagster records, and the days this step accepts.
        step_profiles: dict[str, dict[str, float | None]] = {}
        references = sorted(
            {
                reference.isoformat()
                for day in days
                for reference in reference_days(
                    contract.history_reference,
                    dt.date.fromisoformat(day),
                    contract.partitions.start_date,
                )
            }
            if history_on
            else set()
        )
        history_records = store.records(instance, validated_asset, references)

        @functools.lru_cache(maxsize=64)
        def recorded_profile(day: str) -> dict[str, float | None] | None:
            record = history_records.get(day)
            if record is None or not record.accepted:
                return None
            profile: dict[str, float | None] | None = record.metadata.get(PROFILE_KEY)
            if profile is not None:
                return profile
            # A day that kept an earlier version, or was recorded before profiles were.
            key = store.recorded_key(record, validated_asset, day, "parquet")
            if not lake.exists(key):
                return None
            return day_profile(store.load_key(key, "parquet"), contract)

        def profile_of(day: str) -> dict[str, float | None] | None:
            return step_profiles[day] if day in step_profiles else recorded_profile(day)

        def day_of_validated_data(day: str, raw_data: pd.DataFrame) -> Iterator:
            where = where_of(day)
            # The screen typed this very parse already (the step reads it from the same key).
            typed = screen_typed.pop(day, None)
            if typed is None:
                try:
                    typed = type_rows(raw_data, contract, where=where).reset_index(drop=True)
                except ContractViolationError as exc:
                    # The file does not fit the contract: a verdict on the day, not a failure.
                    raise DataVerdict(Verdict.SCHEMA_MISMATCH, str(exc)) from exc
            rejected = rejected_key(contract, day, context.run.run_id)
            # The raw frame is the step's input, which Dagster and `each_day` keep referenced
            # until the day ends; emptying it here frees its columns (88 MB at 1M rows) before
            # the gate and the parquet write. Its index stays, so `rows_in` still counts it.
            if len(raw_data) >= FREE_RAW_ROWS:
                for column in list(raw_data.columns):
                    del raw_data[column]
            history = history_window(profile_of, contract, day) if history_on else None
            entry = screened.get(day)
            links: dict[str, dg.MetadataValue]
            if entry is not None and entry.history == history:
                # The range's validations passed the day against this very history: their
                # results, stored once for the range, are the day's.
                report = range_screen(contract).passed_report(typed)
                links = range_links(day, entry)
            else:
                report, result = quality_gate(contract).validate(typed, day, history)
                prefix = f"{contract.name}/quality/validated_data/{day}/{context.run.run_id}"
                lake.write_bytes(f"{prefix}.json", result_bytes(result))
                lake.write_bytes(f"{prefix}.html", render_data_docs(result).encode())
                links = {
                    "validation_result": dg.MetadataValue.path(lake.uri(f"{prefix}.json")),
                    "data_docs": dg.MetadataValue.path(lake.uri(f"{prefix}.html")),
                }
            reasons = report.quarantine_reasons()
            if reasons and contract.quality.bad_rows.policy == "quarantine":
                rows = sorted(reasons)
                quarantined = typed.iloc[rows].assign(
                    **{QUARANTINE_REASONS: ["; ".join(reasons[r]) for r in rows]}
                )
                key = f"{contract.name}/quarantine/{day}/{context.run.run_id}.parquet"
                lake.write_bytes(key, serialise(quarantined, "parquet"))
                links["quarantine"] = dg.MetadataValue.path(lake.uri(key))

            if not all(check_passes(contract, report, name) for name in CHECKS):
                # Typing emptied the raw frame; the staged (or published) parse is what failed.
                links["rejected_parse"] = keep_rejected(lake, rejected, load_raw(day))
            # The day's profile: the table of its history statistics, and its record as history
            # if it passes (the screen profiled the same rows already).
            today = screen_profiles.pop(day, None) if history_on else None
            if history_on and today is None:
                today = day_profile(typed, contract)
            versions = (
                version_metadata(
                    "history_reference_",
                    {d: history_records[d] for d in history.stored if d not in step_profiles},
                    this_run=[d for d in history.stored if d in step_profiles],
                    run_id=context.run.run_id,
                )
                if history is not None
                else None
            )
            checks = check_results(contract, report, typed, where, links, history, today, versions)
            yield from checks
            failed = [c for c in checks if not c.passed]
            if failed:
                raise DataVerdict(
                    Verdict.QUALITY_GATE,
                    f"{verdict_reason(where, failed, report)} Each check's description has the "
                    "rest. An earlier accepted version of the day, if any, is kept with "
                    f"everything after it; the file's parse is kept at {lake.uri(rejected)}.",
                    links,
                )
            kept = typed.drop(index=sorted(reasons)).reset_index(drop=True) if reasons else typed
            if history_on:
                # Only a day that passed becomes history for the days after it: its rows less
                # any quarantined.
                profile = day_profile(kept, contract) if reasons or today is None else today
                step_profiles[day] = profile
                links[PROFILE_KEY] = dg.MetadataValue.json(profile)
            yield dg.MaterializeResult(
                value=kept,
                metadata={
                    "dagster/row_count": len(kept),
                    "dagster/column_schema": table_schema(kept),
                    "rows_without_label": int(kept[contract.label_name].isna().sum()),
                    "quarantined_rows": len(reasons),
                    "expectations_evaluated": report.evaluated,
                    **links,
                },
            )

        # A range shares GE's fixed cost: its days are screened together first (see
        # `ml_platform.validation.range_gate`); a day the screen passes against the history it
        # then has needs no validation of its own: it links to the screen's stored results.
        screened: dict[str, ScreenedDay] = {}
        stored_at: dict[int, str] = {}  # id of each of the screen's validations -> its key

        def range_links(day: str, entry: ScreenedDay) -> dict[str, dg.MetadataValue]:
            """The metadata of a day the screen passed: the range's results and its day in them."""
            rows, table = stored_at[id(entry.rows)], stored_at[id(entry.table)]
            return {
                "validation_result": dg.MetadataValue.path(lake.uri(f"{rows}.json")),
                "data_docs": dg.MetadataValue.path(lake.uri(f"{rows}.html")),
                "table_validation_result": dg.MetadataValue.path(lake.uri(f"{table}.json")),
                "table_data_docs": dg.MetadataValue.path(lake.uri(f"{table}.html")),
                "judged_in_range": dg.MetadataValue.text(entry.description(day)),
            }

        # The days' typed rows the screen made, kept for their own day (which takes its entry out)
        # up to MAX_SCREEN_ROWS rows in all, so that memory stays bounded by about two screen
        # chunks; a day beyond that is typed again. Typing costs more than GE's screen of the day.
        screen_typed: dict[str, pd.DataFrame] = {}
        screen_profiles: dict[str, dict[str, float | None]] = {}

        def typed_for_screen(day: str) -> pd.DataFrame:
            typed = type_rows(load_raw(day), contract, where=where_of(day)).reset_index(drop=True)
            if sum(map(len, screen_typed.values())) + len(typed) <= MAX_SCREEN_ROWS:
                screen_typed[day] = typed
            return typed

        if len(context.partition_keys) > 1:
            screened = screen_range(
                profile_of,
                contract,
                context.partition_keys,
                rows_of=lambda day: delivered_rows.get(day, 0),
                typed_of=typed_for_screen,
                history_on=history_on,
                profiles=screen_profiles,
            )
            # GE's results of the screen, as GE returned them, with their Data Docs pages.
            for validation in range_validations(screened):
                key = validation.key(contract, context.run.run_id)
                lake.write_bytes(f"{key}.json", result_bytes(validation.result))
                lake.write_bytes(f"{key}.html", render_data_docs(validation.result).encode())
                stored_at[id(validation)] = key
            context.log.info(
                f"validated_data: {len(screened)} of {len(context.partition_keys)} days passed "
                "the range's screen; the others are validated one by one"
            )
        yield from each_day(
            context, day_of_validated_data, verdict_check=DELIVERY_CHECK, raw_data=raw_data
        )

    return validated_data
