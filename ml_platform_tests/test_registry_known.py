"""What the registry and the evaluation decide in the cases a review found: a hold-out too small to
judge on, and reruns of past days (alone or in a range) against the champion that serves."""

import json
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import yaml

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.evaluation.assets import verdict_check
from ml_platform.evaluation.metrics import judge, judge_candidate, score_predictions
from ml_platform_tests.conftest import Platform, days_from

pytestmark = pytest.mark.slow

SYNTHETIC = load_contract("synthetic")
DAYS = days_from("2024-01-01", 3)
SAMPLES, SEED = 200, 0
# Any eligible candidate clears a change threshold this tolerant: each day promotes.
TOLERANT = {"change_thresholds": {"rmse": -10.0}}
# No improvement clears it: a good candidate stays challenger.
UNBEATABLE = {"change_thresholds": {"rmse": 10.0}}


def synthetic_contract(tmp_path: Path, name: str, rows: int = 1000, **evaluation) -> Contract:
    """The synthetic contract with `rows` rows a day and evaluation settings overridden."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["source"]["rows_per_day"] = rows
    document["quality"]["row_count"] = {"min": 1, "max": rows + 1}
    document["evaluation"].update(evaluation)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_contract(path)


def regression(y: list[float], predicted: list[float]):
    labels, values = np.asarray(y), np.asarray(predicted)
    return score_predictions("regression", labels, values, values, SAMPLES, SEED)


def test_a_candidate_on_one_held_out_row_is_not_eligible():
    # One held-out row: every bootstrap sample draws it, so each interval has zero width and
    # the candidate "beats" the baseline and the champion with certainty.
    contract = SYNTHETIC.model_copy(
        update={
            "evaluation": SYNTHETIC.evaluation.model_copy(
                update={"value_thresholds": {"rmse": 1.0}}
            )
        }
    )
    candidate, baseline = regression([5.0], [5.1]), regression([5.0], [3.0])
    champion = regression([5.0], [4.0])
    assert judge(contract, candidate, champion).improvements["rmse"][1:] == pytest.approx(
        (0.9, 0.9)
    )

    alone = judge_candidate(contract, candidate, baseline)
    verdict = judge(contract, candidate, champion, baseline)

    assert alone.decision == "reject" and verdict.decision == "reject"
    assert alone.cause.startswith(
        "1 held-out row is too few to judge a model on (at least 30, contract "
        "evaluation.min_holdout_rows)"
    )
    description = verdict_check(alone, "daily-2024-01-01").description or ""
    assert description.startswith(f"reject: {alone.cause}. Not registered")
    assert "longer training window" in description
    # One row fewer than the least is too few; the least itself is judged on its values.
    rng = np.random.default_rng(1)
    y = rng.normal(5.0, 1.0, contract.evaluation.min_holdout_rows)
    mean = [5.0] * len(y)
    short = judge_candidate(
        contract, regression(list(y[:-1]), list(y[:-1] + 0.1)), regression(list(y[:-1]), mean[1:])
    )
    enough = judge_candidate(
        contract, regression(list(y), list(y + 0.1)), regression(list(y), mean)
    )
    assert short.decision == "reject"
    assert enough.decision == "eligible", enough.cause


def test_a_day_of_a_few_rows_is_evaluated_as_too_few_to_judge_not_promoted(tmp_path):
    # Five rows a day, one day's window: four training rows and one held-out row.
    platform = Platform(
        synthetic_contract(tmp_path, "tiny", rows=5, value_thresholds={"rmse": 5.0}),
        tmp_path / "root",
    )
    platform.land(DAYS[0], 1)

    result = platform.materialize(DAYS[0])

    assert result.success
    report = json.loads(platform.stored("evaluation_report", DAYS[0], "json").read_text())
    assert report["holdout_rows"] == 1
    assert report["decision"] == "reject", report["cause"]
    assert "1 held-out row is too few to judge a model on" in report["cause"]
    registered = json.loads(platform.stored("registered_model", DAYS[0], "json").read_text())
    assert registered["registered"] is False and registered["champion_after"] is None
    assert platform.registry().aliases() == {"champion": None, "challenger": None}


def materialize_range(platform: Platform, first: str, last: str) -> dg.ExecuteInProcessResult:
    """One run of registered_model over first..last, as a backfill's range runs it."""
    return dg.materialize(
        list(platform.defs.assets or []),
        resources=platform.defs.resources,
        instance=platform.instance,
        selection=[platform.key("registered_model")],
        tags={
            "dagster/asset_partition_range_start": first,
            "dagster/asset_partition_range_end": last,
        },
        raise_on_error=False,
    )


def registered(platform: Platform, day: str) -> dict:
    return json.loads(platform.stored("registered_model", day, "json").read_text())


def champion_number(platform: Platform) -> str:
    """The MLflow model version the champion alias serves."""
    return str(platform.registry().client.get_registered_model("synthetic").aliases["champion"])


def test_a_rerun_of_a_past_champions_day_leaves_the_served_version_as_its_record_says(tmp_path):
    tolerant = Platform(synthetic_contract(tmp_path, "tolerant", **TOLERANT), tmp_path / "root")
    unbeatable = Platform(
        synthetic_contract(tmp_path, "unbeatable", **UNBEATABLE), tmp_path / "root"
    )
    # One lake, one instance: the first day promotes, the second stays challenger.
    unbeatable.instance = tolerant.instance
    tolerant.land(DAYS[0], 2)
    assert tolerant.materialize(DAYS[0]).success
    assert unbeatable.materialize(DAYS[1]).success
    assert registered(unbeatable, DAYS[1])["decision"] == "challenger"
    served = champion_number(tolerant)
    aliases = {"champion": f"daily-{DAYS[0]}", "challenger": f"daily-{DAYS[1]}"}
    assert tolerant.registry().aliases() == aliases

    # The first day rerun alone (a fixed feature, say): the second day is registered already.
    result = tolerant.materialize(DAYS[0])

    assert result.success
    rerun = registered(tolerant, DAYS[0])
    # Registering the day's model again would have moved the champion alias to the new version
    # of its name, behind a record that says no alias moved: the live champion stays.
    assert champion_number(tolerant) == served
    assert tolerant.registry().aliases() == aliases
    assert rerun["decision"] == "superseded" and rerun["registered"] is False
    assert rerun["alias"] is None
    assert rerun["outcome"] == (
        f"not promoted: daily-{DAYS[0]} is the live champion, as a later day ({DAYS[1]}) "
        "left it, and a rerun of a past day never changes what the aliases serve"
    )
    metadata = result.asset_materializations_for_node(tolerant.node("registered_model"))[0].metadata
    assert metadata["version"].value == "none: not registered again, its model serves as champion"
    # The day keeps what its first run left, which the second day met.
    assert rerun["champion_after"] == f"daily-{DAYS[0]}"
    assert registered(tolerant, DAYS[1])["champion_met"] == f"daily-{DAYS[0]}"


def test_a_past_days_decision_is_the_same_rerun_alone_or_at_the_start_of_a_range(tmp_path):
    platform = Platform(synthetic_contract(tmp_path, "tolerant", **TOLERANT), tmp_path / "root")
    platform.land(DAYS[0], 2)
    for day in DAYS[:2]:
        assert platform.materialize(day).success
    assert platform.registry().alias("champion") == f"daily-{DAYS[1]}"
    first_run = {day: registered(platform, day) for day in DAYS[:2]}

    # The first day alone: the champion is a later day's model.
    assert platform.materialize(DAYS[0]).success
    alone = registered(platform, DAYS[0])
    assert alone["decision"] == "superseded"

    # The same day at the start of a range that reruns the latest day too.
    assert materialize_range(platform, DAYS[0], DAYS[1]).success

    ranged = registered(platform, DAYS[0])
    assert ranged["decision"] == alone["decision"] == "superseded"
    assert ranged["outcome"] == alone["outcome"]
    assert ranged["registered"] is False and ranged["alias"] is None
    assert ranged["champion_after"] == first_run[DAYS[0]]["champion_after"]
    # The latest day meets what the first day's record says, as its first run did, and moves
    # the champion again, as it records.
    latest = registered(platform, DAYS[1])
    assert latest["champion_met"] == first_run[DAYS[1]]["champion_met"] == f"daily-{DAYS[0]}"
    assert latest["decision"] == "promote" and latest["alias"] == "champion"
    assert platform.registry().alias("champion") == f"daily-{DAYS[1]}"


# No model reaches it: every candidate is rejected.
UNREACHABLE = {"value_thresholds": {"r2": 0.9999}}
UPSTREAM = ["raw_data", "validated_data", "features", "drift_report", "model", "evaluation_report"]
CHAIN = ["registered_model", "champion_performance"]


def test_a_rerun_of_the_day_a_weekly_retrain_became_champion_meets_what_its_first_run_met(
    tmp_path,
):
    tolerant = Platform(synthetic_contract(tmp_path, "tolerant", **TOLERANT), tmp_path / "root")
    strict = Platform(synthetic_contract(tmp_path, "strict", **UNREACHABLE), tmp_path / "root")
    strict.instance = tolerant.instance
    tolerant.land(DAYS[0], 3)
    assert tolerant.materialize(DAYS[0]).success
    # The weekly job retrains on the first day; the next days' own candidates are rejected, so
    # the weekly retrain, promoted on the second day, is the live champion.
    assert tolerant.materialize(DAYS[0], selection=["full_model", "full_evaluation_report"]).success
    for day in DAYS[1:]:
        assert strict.materialize(day, selection=UPSTREAM).success
        assert tolerant.materialize(day, selection=CHAIN).success
    first = registered(tolerant, DAYS[1])
    weekly = f"full-{DAYS[0]}"
    assert [c["decision"] for c in first["candidates"]] == ["promote", "reject"]
    assert first["champion_met"] == weekly and first["champion_after"] == weekly
    served = champion_number(tolerant)

    # The second day's registry rerun: the weekly retrain serves, so it is not registered again.
    assert tolerant.materialize(DAYS[1], selection=["registered_model"]).success

    rerun = registered(tolerant, DAYS[1])
    assert [c["decision"] for c in rerun["candidates"]] == ["superseded", "reject"]
    assert champion_number(tolerant) == served
    # The day's own candidate meets what it met on the day's first run, as the days after did.
    assert rerun["champion_met"] == first["champion_met"] == weekly
    assert rerun["champion_after"] == weekly


def test_a_contracts_own_least_of_held_out_rows_decides_and_too_low_a_one_is_refused():
    contract = SYNTHETIC.model_copy(
        update={
            "evaluation": SYNTHETIC.evaluation.model_copy(
                update={"value_thresholds": {"rmse": 1.0}, "min_holdout_rows": 50}
            )
        }
    )
    rng = np.random.default_rng(2)
    y = rng.normal(5.0, 1.0, 40)
    forty = judge_candidate(
        contract, regression(list(y), list(y + 0.1)), regression(list(y), [5.0] * 40)
    )
    assert forty.decision == "reject"
    assert forty.cause.startswith("40 held-out rows are too few to judge a model on (at least 50")
    with pytest.raises(ValueError, match="min_holdout_rows"):
        type(SYNTHETIC.evaluation).model_validate({"min_holdout_rows": 1})
