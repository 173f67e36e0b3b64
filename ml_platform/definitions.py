"""The code location: the asset graph of every dataset's contract, wired by the settings.

Each dataset has the whole graph under its own names (`flights/raw_data`, group
`flights_ingestion`, `flights_daily_pipeline_job`, ...; see `ml_platform.platform.datasets`);
the datasets share the storage resources, the IO manager (which stores by asset key) and the
alert sensors, which watch every run.
"""

from collections.abc import Sequence

import dagster as dg

from ml_platform.automation.alert_sensors import build_alert_sensors
from ml_platform.automation.alerts import Notifier
from ml_platform.automation.freshness import build_freshness_sensors, with_freshness_policy
from ml_platform.automation.jobs import (
    DAILY_JOB,
    TRAINING_TAGS,
    WEEKLY_RETRAIN_JOB,
    build_ingestion_job,
)
from ml_platform.automation.lake_sweep import build_lake_sweep_sensors
from ml_platform.automation.landing_sensor import build_landing_sensor
from ml_platform.automation.schedules import build_daily_schedule, build_weekly_retrain_schedule
from ml_platform.contracts import Contract, load_contracts
from ml_platform.drift.assets import build_drift_report
from ml_platform.evaluation.assets import build_evaluation_report
from ml_platform.features.assets import build_features_asset
from ml_platform.ingestion.assets import build_raw_data
from ml_platform.ingestion.zones import landing_store
from ml_platform.platform.datasets import asset_key, catalogued, dataset_name
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.locations import lake_storage, s3_resource
from ml_platform.platform.partitions import daily_partitions
from ml_platform.platform.settings import CELERY_BROKER_ENV, Location, Settings
from ml_platform.platform.tracking import MlflowStores
from ml_platform.registry.assets import build_registered_model
from ml_platform.registry.monitoring import build_champion_performance
from ml_platform.registry.store import ModelRegistryResource
from ml_platform.replay.assets import REPLAY_COMPARISON_JOB, build_replay_comparison
from ml_platform.replay.replays import Replay, load_replays
from ml_platform.training.assets import build_model
from ml_platform.validation.assets import build_validated_data
from ml_platform.validation.rejected_days import build_rejected_days


def dataset_definitions(
    contract: Contract,
    sensor_interval_seconds: int,
    served: Sequence[Contract] = (),
    code_links: tuple[str, str] | None = None,
    replay: Replay | None = None,
) -> dg.Definitions:
    """The daily graph of one dataset with its jobs, schedules and landing sensor.

    `served` are the contracts of every dataset of the code location: files named for one of
    the others are left to that dataset's landing sensor. `code_links` (repository URL, branch)
    turns the assets' code references into links to the repository. A `replay`'s graph runs
    only when launched: no sensor, schedule or freshness policy, and its comparison with the
    live chain beside it.
    """
    dataset = contract.name
    partitions = daily_partitions(contract)
    daily = [
        build(contract, partitions)
        for build in (
            build_raw_data,
            build_validated_data,
            build_features_asset,
            # The drift verdict of each day, which the model reads when a feature is blocking.
            build_drift_report,
            build_model,
            build_evaluation_report,
            build_registered_model,
            # The serving champion on each day's labelled rows: tells when to retrain.
            build_champion_performance,
        )
    ]
    daily = catalogued(daily, dataset, contract.owners, code_links)
    if replay is None:
        # The UI shows the dataset overdue when raw_data missed the contract's deadline.
        daily = with_freshness_policy(daily, contract)
    full_days = contract.training.full_window_days
    # The weekly full retrain: a longer window, its candidate judged alone like the daily one.
    # It registers nothing itself: registered_model, the one step that moves the champion,
    # takes it on the next day's registration, before that day's own candidate.
    full_retrain = [
        # A rejected Sunday is one more hole of its 90-day window: the week is still retrained.
        build_model(
            contract, partitions, name="full_model", window_days=full_days, own_day_required=False
        ),
        build_evaluation_report(
            contract,
            partitions,
            name="full_evaluation_report",
            model_name="full_model",
            window_days=full_days,
            kind="full",
        ),
    ]
    full_retrain = catalogued(full_retrain, dataset, contract.owners, code_links)
    # The dataset's rejected days on one page: not partitioned, recomputed by every daily run
    # after the day's records (and once at the end of a backfill that selects it).
    summaries = catalogued([build_rejected_days(contract)], dataset, contract.owners, code_links)
    daily_job = dataset_name(dataset, DAILY_JOB)
    retrain_job = dataset_name(dataset, WEEKLY_RETRAIN_JOB)
    jobs = [
        # Both train: the instance runs one training job at a time (dagster.yaml).
        dg.define_asset_job(daily_job, selection=daily + summaries, tags=TRAINING_TAGS),
        dg.define_asset_job(retrain_job, selection=full_retrain, tags=TRAINING_TAGS),
        build_ingestion_job(dataset),
    ]
    if replay is not None:
        comparison = catalogued([build_replay_comparison(replay)], dataset, contract.owners)
        compare_job = dg.define_asset_job(
            dataset_name(dataset, REPLAY_COMPARISON_JOB), selection=comparison
        )
        return dg.Definitions(
            assets=daily + summaries + full_retrain + comparison, jobs=[*jobs, compare_job]
        )
    return dg.Definitions(
        assets=daily + summaries + full_retrain,
        jobs=jobs,
        schedules=[
            build_daily_schedule(
                dataset, partitions, daily_job, [a.key for a in daily], contract.freshness
            ),
            build_weekly_retrain_schedule(
                dataset,
                partitions,
                retrain_job,
                asset_key(dataset, "features"),
                contract.freshness,
            ),
        ],
        sensors=[
            build_landing_sensor(
                contract,
                partitions,
                daily_job,
                minimum_interval_seconds=sensor_interval_seconds,
                other_datasets=served,
            ),
            *build_freshness_sensors(contract, minimum_interval_seconds=sensor_interval_seconds),
        ],
    )


def step_executor(settings: Settings) -> dg.ExecutorDefinition:
    """The executor ML_PLATFORM_EXECUTOR names; each reads the steps' size tags its own way.

    in_process (the default): a day is ~1k rows, and one process per step would spend more
    time importing pandas and scikit-learn than computing, so a run's steps share its process.
    multiprocess: a process each on the run's machine. ecs: dagster-aws's `ecs_executor`, an ECS
    task each, sized by `ecs/cpu` and `ecs/memory` (with `EcsRunLauncher`, deploy/). celery:
    dagster-celery's executor, each step a task on a worker of the pool its size asks for
    (`platform/sizes.py`), through the broker at ML_PLATFORM_CELERY_BROKER, which also holds
    the tasks' results.
    """
    kind = settings.executor
    if kind == "multiprocess":
        return dg.multiprocess_executor
    if kind == "ecs":
        from dagster_aws.ecs import ecs_executor

        return ecs_executor
    if kind == "celery":
        # Imported only when chosen: every other process would pay for importing Celery.
        from dagster_celery import celery_executor

        broker = {"env": CELERY_BROKER_ENV}
        return celery_executor.configured({"broker": broker, "backend": broker})
    return dg.in_process_executor


def build_definitions(
    contracts: Contract | Sequence[Contract],
    settings: Settings | None = None,
    *,
    landing_dir: str | None = None,
    lake_dir: str | None = None,
    replays: Sequence[Replay] = (),
) -> dg.Definitions:
    """The graphs of `contracts` (one or several), their storage and automation as `settings` say.

    Each of `replays` (of datasets among `contracts`) is served as a dataset of its own, whose
    alerts page no one.

    `settings` defaults to the environment's; `landing_dir` and `lake_dir` (tests) put the
    landing zone or the lake in a directory whatever the settings say.
    """
    contracts = [contracts] if isinstance(contracts, Contract) else list(contracts)
    settings = settings or Settings()
    landing = Location.directory(landing_dir) if landing_dir else settings.landing
    lake_location = Location.directory(lake_dir) if lake_dir else settings.lake
    # One S3 client configuration for the landing zone and the lake, where either is on S3.
    s3 = s3_resource(settings) if "s3" in (landing.kind, lake_location.kind) else None
    lake = lake_storage(lake_location, settings, s3)
    interval = settings.sensor_interval_seconds
    mlflow = MlflowStores(lake=lake, ui_url=settings.mlflow_ui_url, **settings.mlflow_config)
    shared = dg.Definitions(
        sensors=[
            *build_alert_sensors(minimum_interval_seconds=interval),
            *build_lake_sweep_sensors(minimum_interval_seconds=interval),
        ],
        resources={
            **({"s3": s3} if s3 is not None else {}),
            "landing": landing_store(landing, settings, s3),
            "notifier": Notifier(
                **settings.notifier_config,
                owners={c.name: c.owners for c in [*contracts, *(r.contract for r in replays)]},
                paging={c.name: c.alerts.page for c in contracts if c.alerts.page},
                silent=[r.dataset for r in replays],
            ),
            "lake": lake,
            # Every dataset's registered model and runs, in MLflow (its stores from the settings).
            "mlflow": mlflow,
            "model_registry": ModelRegistryResource(stores=mlflow),
            # Keys start with the dataset, so one IO manager stores every dataset in its folder.
            "io_manager": LakeIOManager(storage=lake),
        },
        executor=step_executor(settings),
    )
    return dg.Definitions.merge(
        *(dataset_definitions(c, interval, contracts, settings.code_links) for c in contracts),
        *(
            dataset_definitions(r.contract, interval, contracts, settings.code_links, replay=r)
            for r in replays
        ),
        shared,
    )


@dg.definitions
def defs() -> dg.Definitions:
    """Every dataset of ML_PLATFORM_CONTRACTS, or the one ML_PLATFORM_DATASET names.

    ML_PLATFORM_CONTRACTS is a directory of contracts (default: the bundled ones);
    ML_PLATFORM_DATASET is the name of one of them, or a contract file's path. The replays of
    those datasets in the replays directory (`ml-platform replay`) are served beside them.
    """
    settings = Settings()
    contracts = load_contracts(settings.contracts_dir, settings.dataset)
    replays = load_replays(settings.replays_dir, contracts)
    return build_definitions(contracts, settings, replays=replays)
