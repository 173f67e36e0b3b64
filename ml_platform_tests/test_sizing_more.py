"""Sizing on shapes nobody designed for: a day run many times, a cap below the need, bounds no
Fargate task fits, advice or a request no worker pool holds, days without CPU figures.

The recorded use is reported to a real (ephemeral) Dagster instance as the steps record it:
materialisations of a stage's days with `step_*` metadata.
"""

import dagster as dg
import pytest

from ml_platform.contracts import Contract, ContractError, load_contract
from ml_platform.contracts.model import BUNDLED_DIR, StageSize
from ml_platform.definitions import build_definitions
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.sizes import recommend
from ml_platform.troubleshooting.sizing import advised_resources, render, stage_uses


def bounded(contract: Contract, stages: dict | None = None, **bounds) -> Contract:
    resources = contract.resources.model_copy(
        update={**bounds, **({"stages": stages} if stages is not None else {})}
    )
    return contract.model_copy(update={"resources": resources})


def record(instance: dg.DagsterInstance, contract: Contract, stage: str, day: str, peak: float):
    """One computation of `stage` on `day`, as `steps.day_metrics` records it."""
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key=asset_key(contract.name, stage),
            partition=day,
            metadata={
                "step_peak_rss_mb": peak,
                "step_cpu_seconds": 1.0,
                "step_wall_seconds": 2.0,
            },
        )
    )


def use_of(instance: dg.DagsterInstance, contract: Contract, stage: str):
    return next(use for use in stage_uses(instance, contract, 30) if use.stage == stage)


def test_a_day_run_many_times_counts_once_in_the_percentiles():
    contract = load_contract("synthetic")
    with dg.DagsterInstance.ephemeral() as instance:
        # The first day retried and re-run while someone looked into it: forty small runs.
        for _ in range(40):
            record(instance, contract, "features", "2024-01-01", 400)
        for day in ("2024-01-02", "2024-01-03", "2024-01-04"):
            record(instance, contract, "features", day, 400)
        record(instance, contract, "features", "2024-01-05", 3000)
        use = use_of(instance, contract, "features")
    assert len(use.days) == 5
    # One figure a day: the newest run of each (a re-delivered day's current data).
    assert len(use.peaks_mb) == len(use.cpus) == 5
    # The large day is one of five days, not one of 44 runs: the advice holds it.
    assert use.advice(contract).memory >= 3000


def test_a_day_recorded_again_unchanged_keeps_its_computed_figures():
    contract = load_contract("synthetic")
    key = asset_key(contract.name, "features")
    with dg.DagsterInstance.ephemeral() as instance:
        for day in ("2024-01-01", "2024-01-02", "2024-01-03"):
            record(instance, contract, "features", day, 700)
        # The newest record of a day computed nothing (recorded unchanged): the day's figures
        # are those of its newest computation.
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key=key, partition="2024-01-03", metadata={"x": 1})
        )
        use = use_of(instance, contract, "features")
    assert use.peaks_mb == [700, 700, 700] and len(use.days) == 3


def test_a_cap_below_the_recorded_need_never_lowers_a_request_that_holds_it():
    # Someone raised the stage's request by hand past the bound after out-of-memory ends.
    contract = bounded(
        load_contract("synthetic"), stages={"features": StageSize(cpu=4, memory=24_576)}
    )
    assert contract.resources.max_memory_mb == 8192
    with dg.DagsterInstance.ephemeral() as instance:
        for day in ("2024-01-01", "2024-01-02", "2024-01-03"):
            record(instance, contract, "features", day, 20_000)
        uses = stage_uses(instance, contract, 30)
    features = next(use for use in uses if use.stage == "features")
    # Writing 8 GiB would end every day's step that peaked at 20,000 MiB.
    assert features.advice(contract) == StageSize(cpu=4, memory=24_576)
    assert advised_resources(contract, uses).stages["features"].memory == 24_576
    row = next(line for line in render(contract, uses, 30).splitlines() if "features" in line)
    assert "max_memory_mb 8192" in row and "25024 MiB" in row, row


def test_a_cap_below_the_recorded_need_is_said_where_it_is_still_advised():
    contract = load_contract("synthetic")  # features requests 1 GiB, max_memory_mb 8192
    with dg.DagsterInstance.ephemeral() as instance:
        for day in ("2024-01-01", "2024-01-02", "2024-01-03"):
            record(instance, contract, "features", day, 20_000)
        uses = stage_uses(instance, contract, 30)
    features = next(use for use in uses if use.stage == "features")
    # The most the bound allows is still more than the request: advised, and said to be short.
    assert features.advice(contract).memory == 8192
    row = next(line for line in render(contract, uses, 30).splitlines() if "features" in line)
    assert "max_memory_mb 8192" in row and "25024 MiB" in row, row


@pytest.mark.parametrize(
    "bounds", ["  min_memory_mb: 256\n  max_memory_mb: 256\n", "  min_cpu: 0.1\n  max_cpu: 0.1\n"]
)
def test_bounds_no_fargate_task_fits_are_a_contract_error_not_a_traceback(tmp_path, bounds):
    # Bounds the contract's validation accepts, below Fargate's smallest task (0.25, 512 MiB).
    text = (BUNDLED_DIR / "synthetic.yaml").read_text()
    path = tmp_path / "synthetic.yaml"
    path.write_text(text.replace("  max_memory_mb: 8192\n", bounds))
    contract = load_contract(path)
    with dg.DagsterInstance.ephemeral() as instance:
        for day in ("2024-01-01", "2024-01-02", "2024-01-03"):
            record(instance, contract, "features", day, 200)
        uses = stage_uses(instance, contract, 30)
    with pytest.raises(ContractError, match="admit no Fargate task") as info:
        render(contract, uses, 30)
    assert info.value.source == "synthetic"
    with pytest.raises(ContractError, match="admit no Fargate task"):
        advised_resources(contract, uses)


def record_cpu(instance: dg.DagsterInstance, contract: Contract, stage: str, day: str, cpu: float):
    """A day of `stage` that kept `cpu` cores busy and peaked at 500 MiB."""
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key=asset_key(contract.name, stage),
            partition=day,
            metadata={
                "step_peak_rss_mb": 500.0,
                "step_cpu_seconds": cpu * 10,
                "step_wall_seconds": 10.0,
            },
        )
    )


def test_advice_no_worker_pool_holds_is_refused_before_it_breaks_the_code_location(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("ML_PLATFORM_WORKER_POOLS", "small=1024,large=3072")
    contract = load_contract("synthetic")
    with dg.DagsterInstance.ephemeral() as instance:
        # Training kept two cores busy: 2 vCPU, whose least Fargate memory is 4 GiB.
        for day in ("2024-01-01", "2024-01-02", "2024-01-03"):
            record_cpu(instance, contract, "model", day, 2.0)
        uses = stage_uses(instance, contract, 30)
    assert next(use for use in uses if use.stage == "model").advice(contract).memory == 4096
    # Written, the contract would not load: no pool's workers hold the model's step.
    with pytest.raises(ContractError, match=r"model.*4096 MiB.*large=3072") as info:
        advised_resources(contract, uses)
    assert info.value.source == "synthetic"
    # With a pool that holds it, the advice is written as it is.
    monkeypatch.setenv("ML_PLATFORM_WORKER_POOLS", "small=1024,large=4096")
    assert advised_resources(contract, uses).stages["model"] == StageSize(cpu=2, memory=4096)


def test_a_memory_cap_between_fargate_sizes_keeps_the_cpu_nearest_the_use():
    # 7,680 MiB x 1.25 = 9,600 MiB, past a 10,000 MiB cap's largest Fargate memory (9 GiB),
    # which 2 and 4 vCPU both take: a quarter of a core's step gets the 2, not the 4.
    contract = bounded(load_contract("synthetic"), max_memory_mb=10_000)
    assert recommend(7680, 0.25, contract).size == StageSize(cpu=2, memory=9216)
    assert recommend(7680, 3.5, contract).size == StageSize(cpu=4, memory=9216)


def test_a_request_no_pool_holds_names_its_dataset(tmp_path, monkeypatch):
    # Several datasets are served at once: the error names which contract asks too much.
    monkeypatch.setenv("ML_PLATFORM_WORKER_POOLS", "small=1024,large=1536")
    with pytest.raises(ContractError, match=r"model: stage model asks for 2048 MiB") as info:
        build_definitions(
            load_contract("synthetic"),
            landing_dir=str(tmp_path / "landing"),
            lake_dir=str(tmp_path / "lake"),
        )
    assert info.value.source == "synthetic"


def test_days_without_cpu_figures_keep_the_requests_cpu():
    contract = load_contract("synthetic")  # model: 1 vCPU, 2 GiB
    with dg.DagsterInstance.ephemeral() as instance:
        # Days whose records have the peak but no CPU or wall time (a wall time of 0 s, or
        # figures recorded before the CPU ones were): nothing says the step uses less CPU.
        for day in ("2024-01-01", "2024-01-02", "2024-01-03"):
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    asset_key=asset_key(contract.name, "model"),
                    partition=day,
                    metadata={"step_peak_rss_mb": 1500.0, "step_wall_seconds": 0.0},
                )
            )
        use = use_of(instance, contract, "model")
    assert use.cpus == []
    assert use.advice(contract) == StageSize(cpu=1, memory=2048)
