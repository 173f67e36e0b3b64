"""The code location loads every contract of its directory, each dataset under its own names.

Each asset names its owners, dataset and stage, a code version and where its code is.
"""

import ast
import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ml_platform.automation.alert_sensors import ALERT_SENSORS
from ml_platform.automation.freshness import FRESHNESS_SENSOR
from ml_platform.automation.lake_sweep import LAKE_SWEEP_CANCELED_SENSOR, LAKE_SWEEP_SENSOR
from ml_platform.cli import main
from ml_platform.contracts import load_contract, load_contracts
from ml_platform.contracts.catalog import contract_file
from ml_platform.contracts.model import bundled_contracts
from ml_platform.definitions import DAILY_JOB, build_definitions, defs
from ml_platform.platform.datasets import asset_key, dataset_name, source_version, writer_pool
from ml_platform.platform.pools import PoolLimitError, pools_of, store_pool_limits
from ml_platform.platform.settings import Settings
from ml_platform.registry.store import ModelRegistryResource
from ml_platform.validation.expectations import CHECKS
from ml_platform_tests.conftest import ALL_ASSETS, REPO

GRAPH = [
    *ALL_ASSETS,
    "registered_model",
    "champion_performance",
    "full_model",
    "full_evaluation_report",
    "rejected_days",
]
PER_DATASET_JOBS = ["daily_pipeline_job", "weekly_retrain_job", "ingestion_job"]
PER_DATASET_SCHEDULES = ["daily_pipeline_schedule", "weekly_retrain_schedule"]
STAGES = ["ingestion", "validation", "features", "drift", "training", "evaluation", "registry"]
# The stage tag of each asset: its stage package, or its module when that is a stage of its own.
STAGE_OF = {
    "raw_data": "ingestion",
    "validated_data": "validation",
    "features": "features",
    "drift_report": "drift",
    "model": "training",
    "full_model": "training",
    "evaluation_report": "evaluation",
    "full_evaluation_report": "evaluation",
    "registered_model": "registry",
    "champion_performance": "monitoring",
    "rejected_days": "rejected_days",
}
GIT_VARIABLES = ["ML_PLATFORM_GIT_URL", "ML_PLATFORM_GIT_BRANCH", "ML_PLATFORM_GIT_COMMIT"]


@pytest.mark.parametrize("dataset", ["flights", "synthetic"])
def test_definitions_load_for_each_bundled_dataset(monkeypatch, dataset):
    monkeypatch.setenv("ML_PLATFORM_DATASET", dataset)
    loaded = defs()
    graph = loaded.resolve_asset_graph()
    contract = load_contract(dataset)

    keys = set(graph.get_all_asset_keys())
    assert keys == {asset_key(dataset, name) for name in GRAPH}
    for key in keys:
        node = graph.get(key)
        assert node.description, f"{key.to_user_string()} has no docstring for the UI"
        if key.path[-1] == "rejected_days":
            # One page of the dataset's rejected days, after the days' records it lists.
            assert node.partitions_def is None
            assert node.parent_keys == {
                asset_key(dataset, "raw_data"),
                asset_key(dataset, "validated_data"),
            }
            continue
        assert isinstance(node.partitions_def, dg.DailyPartitionsDefinition)
        assert node.partitions_def.start.date() == contract.partitions.start_date
    assert loaded.resolve_job_def(dataset_name(dataset, DAILY_JOB)) is not None
    model = graph.get(asset_key(dataset, "model"))
    assert model.parent_keys == {asset_key(dataset, "features")}
    report = graph.get(asset_key(dataset, "evaluation_report"))
    # The report judges the candidate alone: no champion, no day before.
    assert report.parent_keys == {asset_key(dataset, "model"), asset_key(dataset, "features")}
    # The registry is the chain: the day before's registrations leave the champion a day meets,
    # and it takes the weekly candidate of the day before too.
    registered = graph.get(asset_key(dataset, "registered_model"))
    assert registered.parent_keys == {
        asset_key(dataset, name)
        for name in (
            "model",
            "evaluation_report",
            "features",
            "full_model",
            "full_evaluation_report",
            "registered_model",
        )
    }


def test_one_code_location_serves_every_bundled_dataset_under_its_own_names(monkeypatch):
    monkeypatch.delenv("ML_PLATFORM_DATASET", raising=False)
    monkeypatch.delenv("ML_PLATFORM_CONTRACTS", raising=False)
    loaded = defs()
    graph = loaded.resolve_asset_graph()
    datasets = ["flights", "synthetic"]

    assert set(graph.get_all_asset_keys()) == {
        asset_key(dataset, name) for dataset in datasets for name in GRAPH
    }
    # Each dataset is its own set of groups; no asset of one depends on the other's.
    for dataset in datasets:
        groups = {graph.get(asset_key(dataset, name)).group_name for name in GRAPH}
        assert groups == {dataset_name(dataset, stage) for stage in STAGES}
        for name in GRAPH:
            parents = graph.get(asset_key(dataset, name)).parent_keys
            assert all(parent.path[0] == dataset for parent in parents), (dataset, name)
    repository = loaded.get_repository_def()
    assert {job.name for job in repository.get_all_jobs()} >= {
        dataset_name(dataset, job) for dataset in datasets for job in PER_DATASET_JOBS
    }
    assert {s.name for s in repository.schedule_defs} == {
        dataset_name(dataset, schedule)
        for dataset in datasets
        for schedule in PER_DATASET_SCHEDULES
    }
    # The alert sensors watch every run once, whichever dataset's; one sweep serves the lake.
    assert {s.name for s in repository.sensor_defs} == {
        *(dataset_name(dataset, "landing_sensor") for dataset in datasets),
        # Only flights has a `freshness:` section, so only it has a freshness sensor.
        dataset_name("flights", FRESHNESS_SENSOR),
        *ALERT_SENSORS,
        LAKE_SWEEP_SENSOR,
        LAKE_SWEEP_CANCELED_SENSOR,
    }
    # Each dataset's daily job targets its own graph only.
    flights_job = loaded.resolve_job_def(dataset_name("flights", DAILY_JOB))
    assert {k.path[0] for k in flights_job.asset_layer.executable_asset_keys} == {"flights"}


def test_a_contracts_directory_is_served_and_the_dataset_variable_keeps_one(monkeypatch, tmp_path):
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["name"] = "sales"
    (tmp_path / "sales.yaml").write_text(yaml.safe_dump(document))
    shutil.copy(bundled_contracts()["flights"], tmp_path / "flights.yaml")
    monkeypatch.setenv("ML_PLATFORM_CONTRACTS", str(tmp_path))
    monkeypatch.delenv("ML_PLATFORM_DATASET", raising=False)

    keys = defs().resolve_asset_graph().get_all_asset_keys()
    assert {key.path[0] for key in keys} == {"flights", "sales"}

    monkeypatch.setenv("ML_PLATFORM_DATASET", "sales")
    keys = defs().resolve_asset_graph().get_all_asset_keys()
    assert {key.path[0] for key in keys} == {"sales"}


def test_two_contracts_of_one_dataset_name_fail_naming_both_files(monkeypatch, tmp_path):
    for copy in ("a.yaml", "b.yaml"):
        shutil.copy(bundled_contracts()["synthetic"], tmp_path / copy)
    monkeypatch.setenv("ML_PLATFORM_CONTRACTS", str(tmp_path))
    monkeypatch.delenv("ML_PLATFORM_DATASET", raising=False)
    with pytest.raises(ValueError, match=r"(?s)b\.yaml.*'synthetic' is also the name in .*a\.yaml"):
        defs()


def test_a_yml_contract_is_served_and_hidden_files_beside_the_contracts_are_not(
    monkeypatch, tmp_path
):
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["name"] = "sales"
    (tmp_path / "sales.yml").write_text(yaml.safe_dump(document))
    shutil.copy(bundled_contracts()["flights"], tmp_path / "flights.yaml")
    # Emacs's lock file while flights.yaml is open (a link to nowhere), and the metadata file
    # macOS writes beside a copied one: neither is a contract.
    (tmp_path / ".#flights.yaml").symlink_to("someone@host.1234:1700000000")
    (tmp_path / "._flights.yaml").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")
    monkeypatch.setenv("ML_PLATFORM_CONTRACTS", str(tmp_path))
    monkeypatch.delenv("ML_PLATFORM_DATASET", raising=False)

    keys = defs().resolve_asset_graph().get_all_asset_keys()
    assert {key.path[0] for key in keys} == {"flights", "sales"}
    assert contract_file(tmp_path, "sales") == tmp_path / "sales.yml"


def test_every_read_of_another_asset_or_the_registry_is_in_the_graph(tmp_path):
    """What a step reads is what the UI's lineage and resources show it reading."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["drift"].setdefault("features", {})["x2"] = {"blocking": True}
    (tmp_path / "synthetic.yaml").write_text(yaml.safe_dump(document))
    blocking = load_contract(tmp_path / "synthetic.yaml")
    loaded = build_definitions(
        [blocking, load_contract("flights")], landing_dir="landing", lake_dir="lake"
    )
    graph = loaded.resolve_asset_graph()

    def parents(dataset: str, name: str) -> set[str]:
        return {key.path[-1] for key in graph.get(asset_key(dataset, name)).parent_keys}

    # The drift verdict a model trains by: an input where a feature is blocking, and where
    # nothing is blocking the model reads no drift at all.
    for name in ("model", "full_model"):
        assert parents("synthetic", name) == {"features", "drift_report"}, name
        assert parents("flights", name) == {"features"}, name
    assert parents("synthetic", "drift_report") == {"features"}
    # validated_data judges the delivery raw_data recorded, through its input.
    validated = loaded.get_assets_def(asset_key("synthetic", "validated_data"))
    assert validated.keys_by_input_name["raw_data"] == asset_key("synthetic", "raw_data")
    # The champion comes from the registry resource, the same one the registry's writer uses;
    # neither reaches into the lake's files for it.
    assert isinstance(loaded.resources["model_registry"], ModelRegistryResource)
    for name in ("registered_model", "champion_performance"):
        required = loaded.get_assets_def(asset_key("synthetic", name)).required_resource_keys
        assert "model_registry" in required and "lake" not in required, (name, required)


def test_quality_gates_reject_days_as_verdicts_without_blocking_the_steps_after_them():
    loaded = defs()
    graph = loaded.resolve_asset_graph()
    specs = [graph.get_check_spec(key) for key in graph.asset_check_keys]
    gates = {"raw_schema", "delivery_accepted", "finite_weights", *CHECKS}
    assert gates <= {spec.name for spec in specs}
    # A gate that fails records the day's verdict, which the assets after it record in turn
    # ("no accepted input"); a blocking check would fail their steps instead. The drift verdict
    # a model waits for is its input (drift_report), not a blocking check.
    assert [s.name for s in specs if s.blocking] == []
    datasets = {key.path[0] for key in graph.get_all_asset_keys()}
    assert datasets
    for dataset in datasets:
        # validated_data reads the day's delivery as an input, so a rejected delivery reaches
        # it as a day without accepted input rather than as a missing file.
        validated = loaded.get_assets_def(asset_key(dataset, "validated_data"))
        assert validated.keys_by_input_name["raw_data"] == asset_key(dataset, "raw_data")


@pytest.mark.parametrize("dataset", ["flights", "synthetic"])
def test_every_check_of_a_daily_asset_has_a_result_per_day(monkeypatch, dataset):
    monkeypatch.setenv("ML_PLATFORM_DATASET", dataset)
    graph = defs().resolve_asset_graph()
    unpartitioned = [
        key.to_user_string()
        for key in graph.asset_check_keys
        if not isinstance(graph.get_check_spec(key).partitions_def, dg.DailyPartitionsDefinition)
    ]
    assert graph.asset_check_keys and unpartitioned == []


def test_an_unknown_dataset_fails_with_the_served_names(monkeypatch):
    monkeypatch.delenv("ML_PLATFORM_CONTRACTS", raising=False)
    monkeypatch.setenv("ML_PLATFORM_DATASET", "weather")
    with pytest.raises(ValueError, match="no dataset named 'weather'; the datasets are: flights"):
        defs()


def test_a_stale_dataset_variable_is_named_when_a_command_asks_for_another_dataset(
    monkeypatch, capsys
):
    monkeypatch.delenv("ML_PLATFORM_CONTRACTS", raising=False)
    monkeypatch.setenv("ML_PLATFORM_DATASET", "weather")

    code = main(["landing-status", "--dataset", "flights", "--landing-dir", "."])

    # The command asked for flights: the message says where 'weather' comes from.
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ML_PLATFORM_DATASET='weather': "), err
    assert "no dataset named 'weather'; the datasets are: flights, synthetic" in err, err


def code_references(loaded: dg.Definitions, key: dg.AssetKey) -> list:
    """The code references the UI shows for the asset."""
    spec = next(s for s in loaded.get_assets_def(key).specs if s.key == key)
    return spec.metadata["dagster/code_references"].code_references


def test_every_asset_names_its_owners_dataset_stage_code_version_and_source(monkeypatch):
    for variable in ["ML_PLATFORM_CONTRACTS", "ML_PLATFORM_DATASET", *GIT_VARIABLES]:
        monkeypatch.delenv(variable, raising=False)
    loaded = defs()
    graph = loaded.resolve_asset_graph()
    versions: dict[str, set[str]] = {}
    for key in graph.get_all_asset_keys():
        dataset, name = key.path
        node = graph.get(key)
        assert node.owners == load_contract(dataset).owners != [], key
        # The builders' kinds stay beside the catalog's tags.
        assert node.tags["dataset"] == dataset and node.tags["stage"] == STAGE_OF[name], node.tags
        assert any(tag.startswith("dagster/kind/") for tag in node.tags), node.tags
        [reference] = code_references(loaded, key)
        assert isinstance(reference, dg.LocalFileCodeReference)
        source = Path(reference.file_path)
        # The line starts the function that computes the asset: its @dg.asset decorator.
        [compute] = [
            function
            for function in ast.walk(ast.parse(source.read_text()))
            if isinstance(function, ast.FunctionDef)
            and function.decorator_list
            and function.decorator_list[0].lineno == reference.line_number
        ]
        assert ast.unparse(compute.decorator_list[0]).startswith("dg.asset("), key
        assert name.endswith(compute.name.lstrip("_")), (key, compute.name)
        versions.setdefault(str(source.relative_to(REPO)), set()).add(node.code_version)
    # One version per module of compute, whatever the dataset; another module, another version.
    assert all(len(found) == 1 for found in versions.values()), versions
    assert len({v for found in versions.values() for v in found}) == len(versions) == 9


def test_a_code_version_follows_the_modules_an_asset_runs_not_the_platform_layer(tmp_path):
    package = tmp_path / "shop"
    modules = {
        "__init__.py": "",
        "orders.py": "from shop.prices import price\nfrom shop.platform import storage\n",
        "prices.py": "def price():\n    return 1\n",
        "platform/__init__.py": "",
        "platform/storage.py": "def save(value):\n    return value\n",
    }
    for name, text in modules.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    first = source_version(package / "orders.py", package)

    # Where the package is installed does not matter.
    moved = shutil.copytree(package, tmp_path / "elsewhere" / "shop")
    assert source_version(moved / "orders.py", moved) == first
    # How values are stored is not what the asset computes.
    (package / "platform" / "storage.py").write_text("def save(value):\n    return [value]\n")
    assert source_version(package / "orders.py", package) == first
    # A module the asset's module imports is its code.
    (package / "prices.py").write_text("def price():\n    return 2\n")
    assert source_version(package / "orders.py", package) != first


def test_code_references_open_the_repository_when_its_url_is_set(monkeypatch):
    for variable in GIT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ML_PLATFORM_DATASET", "synthetic")
    local = defs()
    repository = "https://github.com/example-org/ml-platform"
    monkeypatch.setenv("ML_PLATFORM_GIT_URL", repository)
    monkeypatch.setenv("ML_PLATFORM_GIT_COMMIT", "0123abc")
    linked = defs()
    for key in linked.resolve_asset_graph().get_all_asset_keys():
        [file] = code_references(local, key)
        path = Path(file.file_path).relative_to(REPO).as_posix()
        # Without a branch, the links open the commit the code runs from.
        assert code_references(linked, key) == [
            dg.UrlCodeReference(url=f"{repository}/tree/0123abc/{path}#L{file.line_number}")
        ]

    monkeypatch.delenv("ML_PLATFORM_GIT_COMMIT")
    with pytest.raises(ValueError, match="ML_PLATFORM_GIT_URL is set: set ML_PLATFORM_GIT_BRANCH"):
        defs()
    elsewhere = {"ML_PLATFORM_GIT_URL": "https://git.example.org/ml", "ML_PLATFORM_GIT_BRANCH": "x"}
    with pytest.raises(ValueError, match="git.example.org/ml': code references link to GitHub"):
        _ = Settings(elsewhere).code_links


def test_the_pools_limits_are_stored_once_for_every_asset_an_operators_limit_kept():
    # ml_platform/platform/pools.py: the limits the queue would otherwise meet too late.
    definitions = defs()
    pools = pools_of(definitions)
    datasets = {contract.name for contract in load_contracts(Settings().contracts_dir)}
    assert pools == {writer_pool(dataset, name) for dataset in datasets for name in GRAPH}
    limits = {"concurrency": {"pools": {"default_limit": 1, "granularity": "run"}}}
    with dg.instance_for_test(overrides=limits) as instance:
        storage = instance.event_log_storage
        # As `dagster instance concurrency set flights.model 2` or the UI sets it.
        storage.set_concurrency_slots("flights.model", 2)
        assert set(store_pool_limits(instance, pools)) == pools - {"flights.model"}
        stored = {limit.name: limit for limit in storage.get_pool_limits()}
        assert (stored["flights.model"].limit, stored["flights.model"].from_default) == (2, False)
        # The others follow the instance's default, as those the queue stores itself.
        assert all(
            (stored[pool].limit, stored[pool].from_default) == (1, True)
            for pool in pools - {"flights.model"}
        )
        assert store_pool_limits(instance, pools) == []


def test_pools_on_an_instance_that_holds_no_limits_is_an_error_saying_what_to_run():
    with pytest.raises(PoolLimitError, match="run `dagster instance migrate` on it"):
        store_pool_limits(dg.DagsterInstance.ephemeral(), {"flights.model"})
    # An instance whose dagster.yaml sets no default limit: nothing would be stored.
    with dg.instance_for_test() as instance:
        with pytest.raises(PoolLimitError, match="sets no `concurrency: pools: default_limit`"):
            store_pool_limits(instance, {"flights.model"})
        assert instance.event_log_storage.get_concurrency_keys() == set()
