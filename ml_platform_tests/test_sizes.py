"""Step sizes: the contract's `resources:`, the executors' op tags, Fargate's pairs, the advice.

The slow test materialises real days and runs `ml-platform resources` over their records.
"""

import json
import re
import shutil
from pathlib import Path

import dagster as dg
import pytest

from ml_platform import cli
from ml_platform.contracts import Contract, ContractError, load_contract
from ml_platform.contracts.editing import editable_contract, replace_resources, section_lines
from ml_platform.contracts.model import BUNDLED_DIR, DEFAULT_SIZES, STAGES, StageSize
from ml_platform.definitions import build_definitions, defs, step_executor
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.settings import Settings
from ml_platform.platform.sizes import (
    FARGATE_MEMORY,
    REQUEST_CPU_KEY,
    REQUEST_MEMORY_KEY,
    cpu_request,
    fargate_pair,
    memory_request_mb,
    recommend,
    step_tags,
    worker_pool,
)
from ml_platform_tests.conftest import DAILY_ASSETS, Platform

SYNTHETIC_TEXT = (BUNDLED_DIR / "synthetic.yaml").read_text()
TRAINING = {"model", "full_model"}
PROBLEM = re.compile(r"^line (\d+): (\S+): (.+)$", re.DOTALL)


def problems_of(tmp_path: Path, text: str) -> dict[tuple[int, str], str]:
    """(line, path) -> reason of each problem loading the contract `text`."""
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ContractError) as info:
        load_contract(path)
    found = {}
    for problem in info.value.problems:
        match = PROBLEM.match(problem)
        assert match, problem
        found[(int(match[1]), match[2])] = match[3]
    return found


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def tags_of(loaded: dg.Definitions, dataset: str) -> dict[str, dict]:
    """Each stage's op tags, the Kubernetes config parsed back from the JSON Dagster keeps."""
    tags = {}
    for stage in STAGES:
        op_tags = dict(loaded.resolve_assets_def(asset_key(dataset, stage)).op.tags)
        op_tags["dagster-k8s/config"] = json.loads(op_tags["dagster-k8s/config"])
        op_tags.pop("dagster-celery/queue", None)
        tags[stage] = op_tags
    return tags


def expected_tags(size: StageSize) -> dict:
    return {
        "ecs/cpu": str(int(size.cpu * 1024)),
        "ecs/memory": str(size.memory),
        "dagster-k8s/config": {
            "container_config": {
                "resources": {
                    "requests": {"cpu": f"{int(size.cpu * 1000)}m", "memory": f"{size.memory}Mi"},
                    "limits": {"memory": f"{size.memory}Mi"},
                }
            }
        },
    }


@pytest.mark.parametrize("dataset", ["flights", "synthetic"])
def test_each_asset_carries_the_executors_tags_of_its_contract_size(monkeypatch, dataset):
    monkeypatch.setenv("ML_PLATFORM_DATASET", dataset)
    loaded = defs()
    contract = load_contract(dataset)
    tags = tags_of(loaded, dataset)
    for stage in STAGES:
        size = contract.resources.size(stage)
        # The bundled sizes are Fargate pairs: the ECS tags are the contract's numbers.
        assert tags[stage] == expected_tags(size), stage
        spec = loaded.resolve_assets_def(asset_key(dataset, stage)).specs_by_key[
            asset_key(dataset, stage)
        ]
        assert spec.metadata[REQUEST_CPU_KEY] == size.cpu
        assert spec.metadata[REQUEST_MEMORY_KEY] == size.memory
    # Training gets the big worker; every other step a small one.
    for stage in set(STAGES) - TRAINING:
        for training in TRAINING:
            assert int(tags[training]["ecs/memory"]) > int(tags[stage]["ecs/memory"])
            assert int(tags[training]["ecs/cpu"]) > int(tags[stage]["ecs/cpu"])


def test_a_contract_without_resources_gets_the_defaults_the_model_larger(tmp_path):
    start = SYNTHETIC_TEXT.index("# What each stage's step asks")
    path = tmp_path / "synthetic.yaml"
    path.write_text(SYNTHETIC_TEXT[:start])
    contract = load_contract(path)
    assert {stage: contract.resources.size(stage) for stage in STAGES} == DEFAULT_SIZES
    assert DEFAULT_SIZES["model"].memory > DEFAULT_SIZES["raw_data"].memory
    assert DEFAULT_SIZES["model"].cpu > DEFAULT_SIZES["raw_data"].cpu


def test_an_unknown_stage_or_a_nonsense_size_is_a_clear_contract_error(tmp_path):
    text = edit(
        SYNTHETIC_TEXT,
        "    model:                  {cpu: 1, memory: 2048}",
        "    trainer:                {cpu: 1, memory: 2048}",
    )
    text = edit(
        text,
        "    features:               {cpu: 0.5, memory: 1024}",
        "    features:               {cpu: lots, memory: -5}",
    )
    text = edit(text, "  max_memory_mb: 8192", "  max_memory_mb: 8192\n  min_memory_mb: 9000")
    problems = problems_of(tmp_path, text)
    stage_line = text.splitlines().index("    trainer:                {cpu: 1, memory: 2048}") + 1
    assert (
        "'trainer' is not a stage of the graph"
        in problems[(stage_line, "resources.stages.trainer")]
    )
    assert "model" in problems[(stage_line, "resources.stages.trainer")]
    features_line = stage_line - 2
    assert "valid number" in problems[(features_line, "resources.stages.features.cpu")]
    assert "greater than 0" in problems[(features_line, "resources.stages.features.memory")]
    bounds_line = text.splitlines().index("  min_memory_mb: 9000") + 1
    assert "above max_memory_mb 8192" in problems[(bounds_line, "resources.min_memory_mb")]


@pytest.mark.parametrize(
    ("cpu", "memory", "pair"),
    [
        (0.25, 512, (256, 512)),
        (0.25, 1, (256, 512)),  # below Fargate's least memory
        (0.25, 513, (256, 1024)),
        (0.25, 2048, (256, 2048)),
        (0.25, 2049, (512, 3072)),  # more memory than 0.25 vCPU takes: a bigger CPU
        (0.3, 512, (512, 1024)),  # between CPU sizes: up, with that size's least memory
        (0.5, 4097, (1024, 5120)),
        (1, 8193, (2048, 9216)),
        (2, 16385, (4096, 17408)),
        (4, 30721, (8192, 32768)),  # 8 vCPU: by 4 GiB
        (8, 61441, (16384, 65536)),  # 16 vCPU: by 8 GiB
        (16, 122880, (16384, 122880)),
    ],
)
def test_a_request_rounds_up_to_the_smallest_fargate_pair_holding_it(cpu, memory, pair):
    assert fargate_pair(cpu, memory) == pair
    units, mib = pair
    assert mib in FARGATE_MEMORY[units]


@pytest.mark.parametrize(("cpu", "memory"), [(16, 122881), (17, 512), (32, 1024)])
def test_past_the_largest_fargate_task_is_an_error(cpu, memory):
    with pytest.raises(ValueError, match="largest is 16 vCPU, 120 GiB"):
        fargate_pair(cpu, memory)


def test_every_rounded_pair_is_a_fargate_pair_at_least_the_request():
    for cpu in [0.1, 0.25, 0.4, 0.5, 0.9, 1, 1.5, 2, 3, 4, 6, 8, 12, 16]:
        for memory in range(64, 122_880 + 1, 1000):
            try:
                units, mib = fargate_pair(cpu, memory)
            except ValueError:
                assert memory > max(FARGATE_MEMORY[16384])
                continue
            assert mib in FARGATE_MEMORY[units]
            assert units >= cpu * 1024 and mib >= memory


def test_advice_rounds_memory_up_with_headroom_and_cpu_to_the_nearest_size():
    assert memory_request_mb(100) == 128
    assert memory_request_mb(512) == 640
    assert [cpu_request(c) for c in (0.0, 0.1, 0.3, 0.7, 0.75, 1.0, 1.3, 3.0, 40.0)] == [
        0.25,
        0.25,
        0.25,
        0.5,
        1.0,
        1.0,
        1.0,
        4.0,
        16.0,
    ]
    contract = load_contract("synthetic")
    # 490 MiB x 1.25 = 613 -> 640 MiB; 0.6 of a core -> 0.5 vCPU; Fargate: 0.5 vCPU, 1 GiB.
    advice = recommend(490, 0.6, contract)
    assert advice.size == StageSize(cpu=0.5, memory=1024) and not advice.clamped
    # The contract's max_memory_mb (8192) and max_cpu (default 4) bound the advice.
    advice = recommend(20_000, 10, contract)
    assert advice.size == StageSize(cpu=4, memory=8192) and advice.clamped

    def bounded(**bounds) -> Contract:
        return contract.model_copy(
            update={"resources": contract.resources.model_copy(update=bounds)}
        )

    # Rounding up to a Fargate pair never goes past a bound: a vCPU needs 2 GiB, which a
    # 1 GiB cap does not allow, so half a vCPU with its 1 GiB.
    advice = recommend(300, 1.0, bounded(max_memory_mb=1024))
    assert advice.size == StageSize(cpu=0.5, memory=1024) and advice.clamped
    # 3 vCPU is no Fargate size: 4 would pass the bound, so 2.
    advice = recommend(20_000, 10, bounded(max_cpu=3.0, max_memory_mb=8192))
    assert advice.size == StageSize(cpu=2, memory=8192) and advice.clamped


def test_replacing_the_section_keeps_every_other_byte():
    before = "name: x\n# about training\ntraining: {window_days: 3}\n"
    after = "# the model, explained\n\nmodel:\n  estimator: sgd\n# tail comment\n"
    old = "resources:\n  stages:\n    model: {cpu: 1, memory: 2048}\n  # note\n  max_cpu: 2\n"
    new = "resources:\n  stages:\n    model: {cpu: 2, memory: 4096}\n"
    assert replace_resources(before + old + after, new) == before + new + after
    # The section last, and a file without it: it goes at the end.
    assert replace_resources(before + old, new) == before + new
    assert replace_resources(before + after, new) == before + after + new
    assert replace_resources("name: x", new) == "name: x\n" + new
    assert section_lines(before + after) is None


def test_only_the_repositorys_own_bundled_contract_is_written(tmp_path):
    bundled = BUNDLED_DIR / "synthetic.yaml"
    # An installed package (no project file beside it) refuses: the next install would undo it.
    with pytest.raises(ContractError, match="copy it into a contracts directory of your own"):
        editable_contract(bundled, source_tree_marker=tmp_path / "no-pyproject.toml")
    assert editable_contract(bundled) == bundled  # this checkout: the repository's own file
    mine = tmp_path / "synthetic.yaml"
    assert editable_contract(mine, source_tree_marker=tmp_path / "none") == mine


@pytest.mark.slow
def test_resources_prints_recorded_use_and_write_changes_only_the_section(
    tmp_path, monkeypatch, capsys
):
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.delenv("ML_PLATFORM_CONTRACTS", raising=False)
    monkeypatch.delenv("ML_PLATFORM_DATASET", raising=False)
    platform = Platform(load_contract("synthetic"), tmp_path / "synthetic")
    # The command reads the instance of DAGSTER_HOME, as after real runs.
    platform.instance = dg.DagsterInstance.get()
    # The fewest recorded days `--write` advises from (ADVICE_MIN_DAYS).
    platform.land("2024-01-01", 3)
    for day in ["2024-01-01", "2024-01-02", "2024-01-03"]:
        assert platform.materialize(day).success

    assert cli.main(["resources", "--dataset", "synthetic", "--days", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[3:]}
    assert set(rows) == set(STAGES)
    for stage in DAILY_ASSETS:
        # request, 3 days, memory median / p95, CPU median / p95, recommendation
        cells = rows[stage].split()
        assert cells[5] == "3", rows[stage]
        assert cells[7] == "/" and cells[9] == "MiB" and cells[11] == "/" and cells[13] == "vCPU"
        assert 50 < float(cells[6]) <= float(cells[8]) < 4096
        assert cells[-1] == "MiB" and cells[-3] == "vCPU"
    assert rows["full_model"].endswith("no recorded run: keeps its request")

    contract_path = tmp_path / "synthetic.yaml"
    shutil.copy(BUNDLED_DIR / "synthetic.yaml", contract_path)
    argv = ["resources", "--dataset", "synthetic", "--days", "1", "--write"]
    assert cli.main([*argv, "--contract", str(contract_path)]) == 0
    assert f"wrote the resources: section of {contract_path}" in capsys.readouterr().out
    written = contract_path.read_text()
    # Every byte before and after the section is the bundled file's; between, the section.
    start = SYNTHETIC_TEXT.index("\nresources:\n") + 1
    end = SYNTHETIC_TEXT.index("\nevaluation:\n") + 1
    assert written[:start] == SYNTHETIC_TEXT[:start]
    assert written.endswith(SYNTHETIC_TEXT[end:])
    section = written[start : len(written) - len(SYNTHETIC_TEXT) + end]
    assert section.startswith("resources:\n  # Advised by `ml-platform resources --write`")
    assert all(line.startswith("  ") for line in section.splitlines()[1:])
    assert section.endswith("  max_memory_mb: 8192\n")  # the bound the file set, kept

    rewritten = load_contract(contract_path)
    loaded = build_definitions(
        rewritten, landing_dir=str(platform.landing_dir), lake_dir=str(platform.lake_dir)
    )
    tags = tags_of(loaded, "synthetic")
    for stage in STAGES:
        size = rewritten.resources.size(stage)
        printed = rows[stage].split()
        if stage in DAILY_ASSETS:
            assert (printed[-4], printed[-2]) == (f"{size.cpu:g}", str(size.memory)), stage
        else:
            assert size == load_contract("synthetic").resources.size(stage)
        assert tags[stage] == expected_tags(size), stage


def test_a_step_goes_to_the_smallest_pool_whose_workers_hold_its_request():
    pools = {"small": 1024, "large": 4096}
    assert worker_pool(512, pools, "features") == "small"
    assert worker_pool(1024, pools, "features") == "small"
    assert worker_pool(1025, pools, "model") == "large"
    with pytest.raises(
        ValueError, match="stage full_model asks for 8192 MiB, more than .*large=4096"
    ):
        worker_pool(8192, pools, "full_model")
    flights = load_contract("flights")
    assert "dagster-celery/queue" not in step_tags(flights, "model", pools={})


@pytest.mark.parametrize("dataset", ["flights", "synthetic"])
def test_with_pools_declared_training_is_queued_to_the_large_pool_the_rest_to_the_small(
    monkeypatch, dataset
):
    monkeypatch.setenv("ML_PLATFORM_DATASET", dataset)
    monkeypatch.setenv("ML_PLATFORM_WORKER_POOLS", "small=1024,large=3072")
    loaded = defs()
    for stage in STAGES:
        queue = loaded.resolve_assets_def(asset_key(dataset, stage)).op.tags["dagster-celery/queue"]
        assert queue == ("large" if stage in TRAINING else "small"), stage


def test_the_executor_is_the_one_the_settings_name():
    broker = {"ML_PLATFORM_CELERY_BROKER": "redis://127.0.0.1:6379/0"}
    names = {
        kind: step_executor(Settings({"ML_PLATFORM_EXECUTOR": kind, **broker})).name
        for kind in ("in_process", "multiprocess", "ecs", "celery")
    }
    assert names == {
        "in_process": "in_process",
        "multiprocess": "multiprocess",
        "ecs": "ecs",
        "celery": "celery",
    }
    assert step_executor(Settings({})).name == "in_process"
