"""The lake keeps only what Dagster records, also after a run worker was killed.

A step that fails deletes the files it stored (`platform.steps.each_day`), but a worker killed
by the kernel (out of memory, `kill -9`, a lost node) deletes nothing: the day files it stored
before recording them stay, unread (readers read the version Dagster records). Run monitoring
(dagster.yaml) records such a run failed; this sensor is then handed it and deletes the files of
the run's assets and days that no materialisation records (`LakeIOManager.sweep`). The next run
of those days would delete them too; this does it without waiting for one. An asset it cannot
sweep (a folder the lake refuses, a storage error) does not stop it sweeping the run's others;
the tick then fails naming each one and why.
"""

import dagster as dg

from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.partitions import run_days

LAKE_SWEEP_SENSOR = "lake_sweep_sensor"


class LakeSweepError(Exception):
    """Some assets of a failed run could not be swept: each named, with the error it met."""


def build_lake_sweep_sensor(*, minimum_interval_seconds: int = 30) -> dg.SensorDefinition:
    """The sensor that deletes what a failed run stored without recording; starts RUNNING."""

    @dg.run_failure_sensor(
        name=LAKE_SWEEP_SENSOR,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Deletes the day files a failed run stored but never recorded (a killed worker's), "
            "so the lake holds only what Dagster records; see docs/models.md#storage."
        ),
    )
    def lake_sweep_sensor(
        context: dg.RunFailureSensorContext, io_manager: dg.ResourceParam[LakeIOManager]
    ) -> None:
        run = context.dagster_run
        days = run_days(run.tags)
        # The assets the run planned to materialise (a run of an asset job, or of a selection).
        planned = context.instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
        ).records
        events = [r.event_log_entry.dagster_event for r in planned]
        keys = {event.asset_key for event in events if event is not None}
        keys |= set(run.asset_selection or [])
        # Dagster moves past a failed run whether or not its tick raised: an asset that cannot
        # be swept (a refused folder, a storage hiccup) must not leave the others' files too.
        unswept: list[str] = []
        first: Exception | None = None
        for key in sorted((k for k in keys if k is not None), key=lambda k: k.to_user_string()):
            try:
                deleted_keys = io_manager.sweep(context.instance, key, days) if days else []
            except Exception as exc:
                span = f"{days[0]}...{days[-1]}" if len(days) > 1 else days[0]
                unswept.append(f"{key.to_user_string()} ({span}): {exc}")
                first = first or exc
                continue
            for deleted in deleted_keys:
                context.log.info(
                    f"run {run.run_id} failed without recording {io_manager.storage.uri(deleted)}: "
                    "deleted"
                )
        if unswept:
            raise LakeSweepError(
                f"run {run.run_id} failed; its unrecorded files of "
                + "; ".join(unswept)
                + " were not deleted. The next run of those days deletes them once the lake "
                "lets it (each step sweeps its days first)"
            ) from first

    return lake_sweep_sensor
