"""Two datasets in one code location: one instance, separate lakes and registries, and no run
of one dataset waiting for the other's limit on a day."""

import datetime as dt
import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ml_platform import cli
from ml_platform.automation.alerts import Notifier
from ml_platform.automation.jobs import DATASET_PARTITION_TAG
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.definitions import DAILY_JOB, build_definitions
from ml_platform.ingestion.landing import LANDED_FILE_TAG, LandingZone, land_days
from ml_platform.platform.datasets import asset_key, dataset_name
from ml_platform_tests.conftest import REPO, day_files, lake_registry

FIRST, DAY = "2013-01-01", "2013-01-02"
INSTANCE_FILES = [REPO / "dagster.yaml", REPO / "deploy" / "dagster.yaml"]


def sales_contract(directory: Path) -> Contract:
    """The synthetic dataset renamed `sales`, starting on the first day of the flights data."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["name"] = "sales"
    document["landing"]["file_pattern"] = "sales_{date}.csv"
    document["partitions"]["start_date"] = "2013-01-01"
    path = directory / "sales.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_contract(path)


@pytest.fixture
def location(tmp_path):
    """Flights and sales served together, both with DAY landed in one landing zone."""
    contracts = [load_contract("flights"), sales_contract(tmp_path)]
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    defs = build_definitions(contracts, landing_dir=str(landing), lake_dir=str(lake))
    zone = LandingZone(base_dir=str(landing))
    for contract in contracts:
        list(land_days(contract, zone, [dt.date.fromisoformat(d) for d in (FIRST, DAY)]))
    return defs, landing, lake


def landing_requests(defs: dg.Definitions, dataset: str) -> list[dg.RunRequest]:
    """One tick of the dataset's landing sensor, as the daemon evaluates it."""
    sensor = defs.resolve_sensor_def(dataset_name(dataset, "landing_sensor"))
    with dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(),
        resources={"landing": defs.resources["landing"], "notifier": Notifier()},
    ) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return list(result.run_requests or [])


def held_together(limit: dict, first: dict[str, str], second: dict[str, str]) -> bool:
    """Whether two runs count against the same slot of a tag concurrency limit.

    Dagster's rule: a limit counts the runs that carry its key; with a value, only those whose
    tag has that value; with `applyLimitPerUniqueValue`, each value of the tag separately.
    """
    key, value = limit["key"], limit.get("value")
    if key not in first or key not in second:
        return False
    if isinstance(value, dict) and value.get("applyLimitPerUniqueValue"):
        return first[key] == second[key]
    return value is None or first[key] == value == second[key]


def run_limits(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["concurrency"]["runs"]["tag_concurrency_limits"]


def test_each_landing_sensor_runs_its_own_files_of_a_shared_zone_tagged_by_dataset(location):
    defs, _, _ = location
    requests = {dataset: landing_requests(defs, dataset) for dataset in ("flights", "sales")}

    for dataset, made in requests.items():
        # The other dataset's files are its own sensor's: neither run nor reported here.
        assert [r.partition_key for r in made] == [FIRST, DAY], dataset
        assert all(Path(r.tags[LANDED_FILE_TAG]).name.startswith(f"{dataset}_") for r in made)
        assert [r.tags[DATASET_PARTITION_TAG] for r in made] == [
            f"{dataset}:{FIRST}",
            f"{dataset}:{DAY}",
        ]


@pytest.mark.parametrize("instance_file", INSTANCE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_same_day_of_two_datasets_is_not_held_by_the_one_run_per_day_limit(
    location, instance_file
):
    defs, _, _ = location
    job = {d: defs.resolve_job_def(dataset_name(d, "ingestion_job")) for d in ("flights", "sales")}
    # What each run of DAY carries: its job's tags, the partition Dagster tags every run of a
    # partition with, and the sensor's request tags.
    runs = {
        dataset: {**job[dataset].tags, "dagster/partition": request.partition_key, **request.tags}
        for dataset in ("flights", "sales")
        for request in landing_requests(defs, dataset)
        if request.partition_key == DAY
    }
    assert runs["flights"]["dagster/partition"] == runs["sales"]["dagster/partition"] == DAY
    limits = run_limits(instance_file)
    one_at_a_time = [limit for limit in limits if limit["limit"] == 1]

    # Two datasets' runs of the same day take no common slot: they may start together.
    def holding(first: dict[str, str], second: dict[str, str]) -> list[str]:
        return [limit["key"] for limit in one_at_a_time if held_together(limit, first, second)]

    assert holding(runs["flights"], runs["sales"]) == []
    # Two runs of one dataset's day (a sensor run and a schedule run, say) still queue.
    rerun = dict(runs["sales"])
    assert holding(runs["sales"], rerun) == [DATASET_PARTITION_TAG]
    # A limit per unique `dagster/partition`, the day alone, would have held them together.
    day_limit = {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}}
    assert held_together(day_limit, runs["flights"], runs["sales"])


@pytest.mark.slow
def test_a_day_of_each_dataset_materialises_in_one_instance_into_its_own_lake_and_registry(
    location,
):
    defs, _, lake = location
    instance = dg.DagsterInstance.ephemeral()
    for dataset in ("sales", "flights"):
        job = defs.resolve_job_def(dataset_name(dataset, DAILY_JOB))
        for day in (FIRST, DAY):
            result = job.execute_in_process(
                partition_key=day, instance=instance, raise_on_error=False
            )
            assert result.success, (dataset, day)

    for dataset in ("flights", "sales"):
        # Every asset of the dataset is recorded under its own key, stored in its own folder.
        report = instance.get_materialized_partitions(asset_key(dataset, "evaluation_report"))
        assert report == {FIRST, DAY}
        assert day_files(lake, dataset, "raw_data", DAY)
    assert sorted(p.name for p in lake.iterdir()) == ["flights", "mlflow", "sales"]
    # Each registry holds its own dataset's models, with manifests naming the dataset: a
    # regressor for sales, a classifier for flights (whose small first days may be rejected).
    registries = {d: lake_registry(lake, d) for d in ("flights", "sales")}
    assert registries["sales"].versions()
    for dataset, task in [("flights", "classification"), ("sales", "regression")]:
        for version in registries[dataset].versions():
            assert registries[dataset].load(version).task == task
            assert registries[dataset].manifest(version)["dataset"] == dataset


def test_commands_take_the_dataset_and_list_the_choices_when_there_are_several(
    location, monkeypatch, capsys
):
    _, landing, _ = location
    contracts = landing.parent  # the sales contract's directory; flights joins it
    shutil.copy(bundled_contracts()["flights"], contracts / "flights.yaml")
    monkeypatch.setenv("ML_PLATFORM_CONTRACTS", str(contracts))
    monkeypatch.delenv("ML_PLATFORM_DATASET", raising=False)

    assert cli.main(["landing-status", "--landing-dir", str(landing)]) == 2
    error = capsys.readouterr().err
    assert "serves several datasets; choose one with --dataset: flights, sales" in error
    assert cli.main(["landing-status", "--dataset", "weather", "--landing-dir", str(landing)]) == 2
    error = capsys.readouterr().err
    assert "no dataset named 'weather'; the datasets are: flights, sales" in error

    # The sales files in the shared zone are the sales dataset's, not misfits of flights.
    assert cli.main(["landing-status", "--dataset", "flights", "--landing-dir", str(landing)]) == 0
    assert "2 day file(s) of flights (2013-01-01 to 2013-01-02)" in capsys.readouterr().out
    # One dataset served: it is the default, and the sales files, no dataset's now, misfit.
    monkeypatch.setenv("ML_PLATFORM_DATASET", "flights")
    assert cli.main(["landing-status", "--landing-dir", str(landing)]) == 1
    out, error = capsys.readouterr()
    assert "2 day file(s) of flights" in out
    assert "sales_2013-01-02.csv belongs to no partition" in error
