"""The lake keeps only what Dagster records, also after a run worker was killed.

A step that fails deletes the files it stored (`platform.steps.each_day`), but a worker killed
by the kernel (out of memory, `kill -9`, a lost node) deletes nothing: the day files it stored
before recording them stay, unread (readers read the version Dagster records). Run monitoring
(dagster.yaml) records such a run failed, the UI's Terminate a run canceled; a sensor is then
handed it and deletes the files of the run's assets and days that no materialisation records
(`LakeIOManager.sweep`). The next run
of those days would delete them too; this does it without waiting for one. An asset it cannot
sweep (a folder the lake refuses, a storage error) does not stop it sweeping the run's others;
the tick then fails naming each one and why.
"""

import logging

import dagster as dg

from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.partitions import run_days

LAKE_SWEEP_SENSOR = "lake_sweep_sensor"
LAKE_SWEEP_CANCELED_SENSOR = "lake_sweep_canceled_sensor"


class LakeSweepError(Exception):
    """Some assets of an ended run could not be swept: each named, with the error it met."""


def sweep_run(
    instance: dg.DagsterInstance,
    io_manager: LakeIOManager,
    run: dg.DagsterRun,
    ended: str,
    log: logging.Logger | dg.DagsterLogManager,
) -> None:
    """Delete what the ended run `run` stored of its assets' days without recording it.

    `ended` says how it ended, in the log's words ("failed", "was canceled"). Each asset is swept
    on its own; `LakeSweepError` at the end names each that could not be, and why.
    """
    days = run_days(run.tags)
    # The assets the run planned to materialise (a run of an asset job, or of a selection).
    planned = instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    ).records
    events = [r.event_log_entry.dagster_event for r in planned]
    keys = {event.asset_key for event in events if event is not None}
    keys |= set(run.asset_selection or [])
    # Dagster moves past an ended run whether or not its tick raised: an asset that cannot be
    # swept (a refused folder, a storage hiccup) must not leave the others' files too.
    unswept: list[str] = []
    first: Exception | None = None
    for key in sorted((k for k in keys if k is not None), key=lambda k: k.to_user_string()):
        try:
            deleted_keys = io_manager.sweep(instance, key, days) if days else []
        except Exception as exc:
            span = f"{days[0]}...{days[-1]}" if len(days) > 1 else days[0]
            unswept.append(f"{key.to_user_string()} ({span}): {exc}")
            first = first or exc
            continue
        for deleted in deleted_keys:
            log.info(
                f"run {run.run_id} {ended} without recording {io_manager.storage.uri(deleted)}: "
                "deleted"
            )
    if unswept:
        raise LakeSweepError(
            f"run {run.run_id} {ended}; its unrecorded files of "
            + "; ".join(unswept)
            + " were not deleted. The next run of those days deletes them once the lake "
            "lets it (each step sweeps its days first)"
        ) from first


def build_lake_sweep_sensors(*, minimum_interval_seconds: int = 30) -> list[dg.SensorDefinition]:
    """The sensors that delete what a failed or canceled run stored without recording it.

    Both start RUNNING: a run ended by its failure (a worker killed, found by run monitoring)
    and one canceled (the UI's Terminate, whose force option kills the step at once) leave the
    same files.
    """
    description = (
        "Deletes the day files a {} run stored but never recorded (a killed worker's), so the "
        "lake holds only what Dagster records; see docs/models.md#storage."
    )

    @dg.run_failure_sensor(
        name=LAKE_SWEEP_SENSOR,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=description.format("failed"),
    )
    def lake_sweep_sensor(
        context: dg.RunFailureSensorContext, io_manager: dg.ResourceParam[LakeIOManager]
    ) -> None:
        sweep_run(context.instance, io_manager, context.dagster_run, "failed", context.log)

    @dg.run_status_sensor(
        run_status=dg.DagsterRunStatus.CANCELED,
        name=LAKE_SWEEP_CANCELED_SENSOR,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=description.format("canceled"),
    )
    def lake_sweep_canceled_sensor(
        context: dg.RunStatusSensorContext, io_manager: dg.ResourceParam[LakeIOManager]
    ) -> None:
        sweep_run(context.instance, io_manager, context.dagster_run, "was canceled", context.log)

    return [lake_sweep_sensor, lake_sweep_canceled_sensor]
