"""Promotion by evidence (a paired bootstrap of the improvement over the champion) and a rejected
candidate as the day's outcome: the run succeeds, the champion stays, rejections in a row warn."""

import datetime as dt
import errno
import json
import logging
import re
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest
import yaml
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import PERMISSION_DENIED

from ml_platform import cli
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.evaluation.metrics import (
    compare_with_champion,
    holdout_of,
    judge,
    plots,
    recorded_scores,
    render_comparison,
    render_report,
    score_model,
    score_predictions,
    stored_draws,
)
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.platform.formats import deserialise, serialise
from ml_platform.platform.storage import LocalStorage
from ml_platform.platform.tracking import MlflowStores
from ml_platform.registry.assets import outcome_line, rejected_in_a_row
from ml_platform.registry.chain import RecordedChain
from ml_platform.registry.store import ModelRegistry, ModelRegistryResource
from ml_platform.training.model import TrainedModel, train_model
from ml_platform_tests.conftest import DAILY_ASSETS, Platform, days_from, lake_registry
from ml_platform_tests.test_backfill_range import evaluations, materialize_range
from ml_platform_tests.test_training import features_of

pytestmark = pytest.mark.slow

FLIGHTS = load_contract("flights")
DAYS = days_from("2024-01-01", 4)
SAMPLES = 200
SEED = 0


@pytest.fixture(scope="module")
def flights_case() -> tuple[TrainedModel, object]:
    """A real flights model and the two days' hold-out rows it never trained on."""
    window = {
        day: features_of(flights_for_day(dt.date.fromisoformat(day)), FLIGHTS, day)
        for day in ("2013-01-01", "2013-01-02")
    }
    model = train_model(window, FLIGHTS)
    return model, holdout_of(model, window, FLIGHTS)


def labels(model: TrainedModel, holdout) -> np.ndarray:
    return holdout[model.label].astype("int64").to_numpy()


def test_an_identical_champion_is_a_tie_and_never_promotes(flights_case):
    model, holdout = flights_case
    candidate = score_model(model, holdout, SAMPLES, SEED)
    champion = score_model(model, holdout, SAMPLES, SEED)

    verdict = judge(FLIGHTS, candidate, champion)

    assert verdict.passes_values, verdict.reasons
    assert verdict.improvements == {"roc_auc": (0.0, 0.0, 0.0)}
    assert verdict.decision == "challenger"
    assert "improvement +0.0000 (95 % interval +0.0000 to +0.0000)" in verdict.cause
    assert "does not clear the least of +0.01" in verdict.cause
    # Even at a threshold of 0 a tie does not promote; a negative one tolerates a loss, and
    # then the tie clears it.
    at_zero = FLIGHTS.model_copy(
        update={
            "evaluation": FLIGHTS.evaluation.model_copy(
                update={"change_thresholds": {"roc_auc": 0.0}}
            )
        }
    )
    assert judge(at_zero, candidate, champion).decision == "challenger"
    tolerant = FLIGHTS.model_copy(
        update={
            "evaluation": FLIGHTS.evaluation.model_copy(
                update={"change_thresholds": {"roc_auc": -0.01}}
            )
        }
    )
    assert judge(tolerant, candidate, champion).decision == "promote"


def test_a_clearly_better_candidate_is_promoted_with_its_interval_in_the_report(flights_case):
    model, holdout = flights_case
    y = labels(model, holdout)
    candidate = score_model(model, holdout, SAMPLES, SEED)
    # The champion predicts noise on the same rows, scored on the same bootstrap samples.
    noise = np.random.default_rng(1).random(len(y))
    champion = score_predictions(
        "classification", y, (noise > 0.5).astype("int64"), noise, SAMPLES, SEED
    )
    assert champion.pairing == candidate.pairing

    verdict = judge(FLIGHTS, candidate, champion)

    gain, low, high = verdict.improvements["roc_auc"]
    assert verdict.decision == "promote", verdict.reasons
    assert gain == pytest.approx(candidate.values["roc_auc"] - champion.values["roc_auc"])
    assert 0.0 < low < gain < high
    report = render_report(
        "2013-01-02",
        model,
        candidate,
        champion,
        "daily-2013-01-01",
        verdict,
        plots(model, candidate),
    )
    assert "**Verdict: promote.**" in report
    assert "improvement (paired 95 % interval)" in report
    assert f"| roc_auc | {candidate.values['roc_auc']:.4f} " in report
    assert f"{gain:+.4f} ({low:+.4f} – {high:+.4f}) |" in report


def test_a_candidates_stored_draws_compare_with_a_champion_exactly_as_its_fresh_scores(
    flights_case,
):
    """registered_model pairs the evaluation's stored draws instead of scoring the candidate."""
    model, holdout = flights_case
    y = labels(model, holdout)
    candidate = score_model(model, holdout, SAMPLES, SEED)
    noise = np.random.default_rng(1).random(len(y))
    champion = score_predictions(
        "classification", y, (noise > 0.5).astype("int64"), noise, SAMPLES, SEED
    )
    # The evaluation's value as the lake stores it (JSON, keys sorted).
    evaluation = {
        "metrics": candidate.values,
        "intervals": candidate.intervals,
        "paired": stored_draws(candidate),
    }
    recorded = recorded_scores(deserialise(serialise(evaluation, "json"), "json"))
    assert recorded is not None and recorded.pairing == champion.pairing

    assert compare_with_champion(FLIGHTS, recorded, champion) == compare_with_champion(
        FLIGHTS, candidate, champion
    )
    comparison = compare_with_champion(FLIGHTS, candidate, champion)
    assert render_comparison("daily-x", recorded, champion, "daily-y", comparison) == (
        render_comparison("daily-x", candidate, champion, "daily-y", comparison)
    )
    # An evaluation stored without its draws is scored again.
    assert recorded_scores({"metrics": candidate.values, "intervals": {}}) is None


def test_the_reports_charts_keep_titles_axis_labels_legends_and_a_line_per_series(flights_case):
    from ml_platform_tests.test_plots import line, svg_of, texts, vertices

    model, holdout = flights_case
    candidate = score_model(model, holdout, SAMPLES, SEED)
    roc, pr, matrix = plots(model, candidate)
    auc = f"candidate (AUC = {candidate.values['roc_auc']:.2f})"
    for markdown, title, axes, names in [
        (roc, "ROC curve", ["false positive rate", "true positive rate"], [auc]),
        (pr, "Precision-recall curve", ["recall", "precision"], ["candidate (AP = "]),
    ]:
        root = svg_of(markdown, title)
        drawn = texts(root)
        assert {title, *axes, "0.0", "1.0"} <= set(drawn)
        assert all(any(text.startswith(name) for text in drawn) for name in names)
        assert any(text.startswith("chance level") for text in drawn)
        # One path per series: the model's curve with its points, the chance line straight.
        for series in (0, 1):
            group = root.find(f".//{{http://www.w3.org/2000/svg}}g[@id='series-{series}']")
            assert len(list(group.iter("{http://www.w3.org/2000/svg}path"))) == 1
        assert len(vertices(line(root, 0)["d"])) > 10 and len(vertices(line(root, 1)["d"])) == 2
    y = labels(model, holdout)
    counts = np.bincount(2 * y + candidate.predicted.astype("int64"), minlength=4)
    drawn = texts(svg_of(matrix, "Confusion matrix"))
    assert {"Confusion matrix", "Predicted label", "True label"} <= set(drawn)
    assert {str(count) for count in counts} <= set(drawn)


def test_a_small_gain_inside_the_noise_stays_challenger(flights_case):
    model, holdout = flights_case
    y = labels(model, holdout)
    predicted, score = model.predictions(holdout)
    champion = score_predictions("classification", y, predicted, score, SAMPLES, SEED)
    # The champion's scores with a little noise: a different ranking, no better model.
    jitter = np.random.default_rng(4).normal(0.0, 0.005, len(y))
    nudged = np.clip(score + jitter, 0.0, 1.0)
    candidate = score_predictions("classification", y, predicted, nudged, SAMPLES, SEED)

    verdict = judge(FLIGHTS, candidate, champion)

    gain, low, high = verdict.improvements["roc_auc"]
    # Better on the whole hold-out, which the former rule (improvement >= 0) promoted.
    assert gain > 0
    assert low < 0 < high
    assert verdict.decision == "challenger"


def test_lower_is_better_metrics_count_a_smaller_error_as_an_improvement():
    contract = load_contract("synthetic")  # change threshold on rmse, value bounds r2 and rmse
    rng = np.random.default_rng(0)
    y = rng.normal(0.0, 3.0, 500)
    good = y + rng.normal(0.0, 0.3, len(y))
    worse = y + rng.normal(0.0, 0.9, len(y))
    better = score_predictions("regression", y, good, good, SAMPLES, SEED)
    champion = score_predictions("regression", y, worse, worse, SAMPLES, SEED)

    promoted = judge(contract, better, champion)
    kept = judge(contract, champion, better)

    assert promoted.decision == "promote"
    assert promoted.improvements["rmse"][1] > 0
    assert kept.decision == "challenger"
    assert kept.improvements["rmse"][2] < 0


def test_scores_of_other_samples_cannot_be_paired(flights_case):
    model, holdout = flights_case
    candidate = score_model(model, holdout, SAMPLES, SEED)
    other_seed = score_model(model, holdout, SAMPLES, SEED + 1)
    with pytest.raises(ValueError, match="not scored on the same bootstrap samples"):
        judge(FLIGHTS, candidate, other_seed)


def synthetic_contract(tmp_path: Path, name: str, **evaluation) -> Contract:
    """The synthetic contract with evaluation settings overridden."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["evaluation"].update(evaluation)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_contract(path)


# No model reaches it: every candidate is rejected.
UNREACHABLE = {"value_thresholds": {"r2": 0.9999}}


def champion_state(platform: Platform) -> tuple[str | None, tuple, dict]:
    """Where champion points, its MLflow model version and files' checksum, and the aliases."""
    registry = lake_registry(platform.lake_dir, "synthetic")
    champion = registry.alias("champion")
    found = registry.model_version(str(champion))
    return champion, (found.version, found.source, found.tags), registry.aliases()


def test_a_rejected_day_succeeds_and_keeps_the_champion_in_a_one_day_run(tmp_path):
    normal = Platform(synthetic_contract(tmp_path, "normal"), tmp_path / "root")
    strict = Platform(synthetic_contract(tmp_path, "strict", **UNREACHABLE), tmp_path / "root")
    # One lake, one instance: the strict run reads the records of the normal one's days.
    strict.instance = normal.instance
    normal.land(DAYS[0], 2)
    first = normal.materialize(DAYS[0])
    assert first.success
    before = champion_state(normal)
    assert before[0] == f"daily-{DAYS[0]}"

    result = strict.materialize(DAYS[1])

    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert not checks["promotion_verdict"].passed
    assert checks["promotion_verdict"].severity == dg.AssetCheckSeverity.WARN
    assert checks["rejection_streak"].passed  # one rejection in a row
    # The evaluation judged the candidate alone: no champion, no registry read.
    stored = json.loads(strict.stored("evaluation_report", DAYS[1], "json").read_text())
    assert stored["decision"] == "reject" and stored["version"] == f"daily-{DAYS[1]}"
    assert not {"champion_version", "champion_metrics", "improvements"} & set(stored)
    assert "champion" not in stored["report_markdown"]
    registered = json.loads(strict.stored("registered_model", DAYS[1], "json").read_text())
    assert registered["registered"] is False and registered["version"] is None
    assert re.fullmatch(r"r2 0\.\d{4} misses the bound \(at least 0\.9999\)", registered["reason"])
    assert registered["outcome"] == f"rejected: {registered['reason']}"
    # The registry met the champion and left it in place, without scoring a rejected model.
    assert registered["champion_met"] == registered["champion_after"] == before[0]
    assert "improvements" not in registered
    assert strict.materialized("registered_model") == {DAYS[0], DAYS[1]}
    assert champion_state(strict) == before


def test_an_eligible_day_is_judged_against_the_champion_by_the_registry(tmp_path):
    platform = Platform(synthetic_contract(tmp_path, "normal"), tmp_path / "root")
    platform.land(DAYS[0], 2)
    assert platform.materialize(DAYS[0]).success

    result = platform.materialize(DAYS[1])

    assert result.success
    report = json.loads(platform.stored("evaluation_report", DAYS[1], "json").read_text())
    assert report["decision"] == "eligible"
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["promotion_verdict"].passed
    assert (checks["promotion_verdict"].description or "").startswith(
        "eligible: meets the value thresholds and beats the trivial baseline."
    )
    # registered_model scored the champion on the candidate's held-out rows, paired.
    metadata = result.asset_materializations_for_node(platform.node("registered_model"))[0].metadata
    gain, low, high = (metadata[f"improvement_rmse{end}"].value for end in ("", "_low", "_high"))
    # Metadata shows 4 significant digits: the difference is exact to within their rounding.
    champion = metadata["champion_rmse"].value
    assert gain == pytest.approx(champion - report["metrics"]["rmse"], abs=1e-3 * champion)
    assert low <= gain <= high
    assert metadata["champion_met"].value == f"daily-{DAYS[0]}"
    registered = json.loads(platform.stored("registered_model", DAYS[1], "json").read_text())
    # The stored decision keeps full precision; the metadata shows it to 4 significant digits.
    improvement = registered["improvements"]["rmse"]
    assert improvement["threshold"] == 0.0
    for key, shown in (("improvement", gain), ("low", low), ("high", high)):
        assert shown == pytest.approx(improvement[key], rel=5e-4), key
    assert registered["metrics"] == report["metrics"]
    assert registered["decision"] == ("promote" if improvement["low"] > 0.0 else "challenger")
    assert registered["outcome"] == outcome_line(registered["decision"], registered["reason"])
    assert registered["champion_before"] == f"daily-{DAYS[0]}"
    assert registered["champion_after"] == (
        f"daily-{DAYS[1]}" if registered["decision"] == "promote" else f"daily-{DAYS[0]}"
    )
    markdown = registered["comparison_markdown"]
    assert f"| rmse | {report['metrics']['rmse']:.4f} " in markdown
    assert f"{gain:+.4f} ({low:+.4f} – {high:+.4f}) |" in markdown


def test_a_rejected_range_succeeds_keeps_the_champion_and_warns_on_the_third_day(tmp_path):
    normal = Platform(synthetic_contract(tmp_path, "normal"), tmp_path / "root")
    strict = Platform(synthetic_contract(tmp_path, "strict", **UNREACHABLE), tmp_path / "root")
    # One lake, one instance: the strict run reads the records of the normal one's days.
    strict.instance = normal.instance
    normal.land(DAYS[0], 4)
    assert normal.materialize(DAYS[0]).success
    before = champion_state(normal)

    result = materialize_range(strict, DAYS[1], DAYS[3])

    assert result.success
    assert (
        evaluations(strict, "evaluation_report", "promotion_verdict")
        == {
            DAYS[0]: True,  # the normal contract's first day
            **{day: False for day in DAYS[1:]},
        }
    )
    # The third rejection in a row (the contract's default rejection_streak) warns.
    assert evaluations(strict, "registered_model", "rejection_streak") == {
        DAYS[0]: True,
        DAYS[1]: True,
        DAYS[2]: True,
        DAYS[3]: False,
    }
    for day in DAYS[1:]:
        registered = json.loads(strict.stored("registered_model", day, "json").read_text())
        assert registered["registered"] is False
        assert registered["outcome"].startswith("rejected: r2 ")
    assert champion_state(strict) == before


def test_the_rejection_streak_fails_on_the_nth_rejected_day_of_one_day_runs(tmp_path):
    strict = Platform(
        synthetic_contract(tmp_path, "strict", rejection_streak=2, **UNREACHABLE), tmp_path
    )
    strict.land(DAYS[0], 2)
    streaks = []
    for day in DAYS[:2]:
        result = strict.materialize(day)
        assert result.success
        [check] = [
            c for c in result.get_asset_check_evaluations() if c.check_name == "rejection_streak"
        ]
        streaks.append(check)
    assert streaks[0].passed
    assert not streaks[1].passed
    assert streaks[1].severity == dg.AssetCheckSeverity.WARN
    description = streaks[1].description or ""
    assert f"2 candidates in a row were rejected ({DAYS[0]} to {DAYS[1]})" in description
    assert "so there is no champion; the last one: r2 " in description
    assert "retrain on a longer window" in description
    assert streaks[1].metadata["rejected_in_a_row"].value == 2


def test_a_tombstoned_day_neither_counts_nor_ends_the_streak_and_an_accepted_one_ends_it():
    decisions = {
        "2024-01-01": "reject",
        "2024-01-02": "reject",
        # 2024-01-03 a tombstone: its data was rejected, nothing registered
        "2024-01-04": "reject",
        "2024-01-05": "challenger",
        "2024-01-06": "reject",
        "2024-01-07": "reject",
        "2024-01-09": "promote",
    }

    def streak(day: str, decision: str = "reject", limit: int = 3) -> list[str]:
        return rejected_in_a_row(decisions.get, day, decision, limit)

    assert streak("2024-01-02") == ["2024-01-01", "2024-01-02"]
    assert streak("2024-01-04") == ["2024-01-01", "2024-01-02", "2024-01-04"]
    assert streak("2024-01-04", limit=5) == ["2024-01-01", "2024-01-02", "2024-01-04"]
    assert streak("2024-01-07") == ["2024-01-06", "2024-01-07"]
    assert streak("2024-01-08") == ["2024-01-06", "2024-01-07", "2024-01-08"]
    assert streak("2024-01-08", "challenger") == []
    assert streak("2024-01-10") == ["2024-01-10"]
    # The look-back is bounded: 4 times the limit in days, tombstones included.
    far = {"2024-01-01": "reject"}
    assert rejected_in_a_row(far.get, "2024-01-13", "reject", 3) == ["2024-01-01", "2024-01-13"]
    assert rejected_in_a_row(far.get, "2024-01-14", "reject", 3) == ["2024-01-14"]


def test_each_days_line_says_what_it_did_to_the_registry(tmp_path):
    # The line `ml-platform materialize` prints for a day, read from the run's records: three
    # versions of one dataset's contract over one instance and lake, a day each.
    contracts = {
        "normal": synthetic_contract(tmp_path, "normal"),
        # No improvement can clear it: a good candidate stays challenger.
        "unbeatable": synthetic_contract(tmp_path, "unbeatable", change_thresholds={"rmse": 10.0}),
        "strict": synthetic_contract(tmp_path, "strict", **UNREACHABLE),
    }
    platforms = {name: Platform(c, tmp_path / "root") for name, c in contracts.items()}
    instance = platforms["normal"].instance
    platforms["normal"].land(DAYS[0], 3)

    def line(contract: str, day: str) -> tuple[str, bool]:
        platform = platforms[contract]
        platform.instance = instance
        result = platform.materialize(day)
        assert result.success
        return cli.day_outcome(instance, result.run_id, "synthetic")

    assert {c.name for c in contracts.values()} == {"synthetic"}
    assert line("normal", DAYS[0]) == ("promoted", False)
    assert line("unbeatable", DAYS[1]) == ("kept champion (challenger)", False)
    # A rejected candidate is an outcome of an accepted day: the day is not rejected.
    outcome, day_rejected = line("strict", DAYS[2])
    assert not day_rejected
    assert re.fullmatch(r"rejected: r2 0\.\d{4} misses the bound \(at least 0\.9999\)", outcome)


def promoting(tmp_path: Path) -> Platform:
    """A synthetic platform on which each day promotes (see TOLERANT)."""
    return Platform(synthetic_contract(tmp_path, "tolerant", **TOLERANT), tmp_path / "root")


def test_an_alias_never_moves_back_to_an_older_days_model(tmp_path):
    platform = promoting(tmp_path)
    platform.land(DAYS[0], 2)
    for day in DAYS[:2]:
        assert platform.materialize(day).success
    registry = lake_registry(platform.lake_dir, "synthetic")
    assert registry.alias("champion") == f"daily-{DAYS[1]}"
    aliases = {alias: registry.alias(alias) for alias in ("champion", "challenger")}

    # The first day re-landed (here: run again) is retrained after a later day's promotion.
    result = platform.materialize(DAYS[0])

    assert result.success
    registered = json.loads(platform.stored("registered_model", DAYS[0], "json").read_text())
    assert registered["decision"] == "superseded" and registered["registered"] is False
    assert registered["outcome"] == (
        f"not promoted: the champion daily-{DAYS[1]} is a later day's model than "
        f"daily-{DAYS[0]}, and an alias never moves back to an older day's model"
    )
    metadata = result.asset_materializations_for_node(platform.node("registered_model"))[0].metadata
    assert metadata["outcome"].value == registered["outcome"]
    assert metadata["version"].value == "none: not promoted, a later day's model is champion"
    # The live champion stays the later day's; the chain after the first day stays what its
    # first run left, which served the second day.
    assert registry.alias("champion") == f"daily-{DAYS[1]}"
    assert registered["champion_after"] == f"daily-{DAYS[0]}"
    assert {alias: registry.alias(alias) for alias in aliases} == aliases
    # The serving champion of the second day is still the one the first day left.
    monitored = json.loads(platform.stored("champion_performance", DAYS[1], "json").read_text())
    assert monitored["champion_version"] == f"daily-{DAYS[0]}"
    # Dagster's record says the same: the first day's first run left it, the second day's moved it.
    chain = RecordedChain(platform.instance, platform.key("registered_model"), DAYS[0])
    assert chain.before(DAYS[1])["champion"] == f"daily-{DAYS[0]}"
    assert chain.before(DAYS[0])["champion"] is None


def test_a_rejected_re_delivery_of_a_promoted_day_keeps_its_promotion(tmp_path):
    platform = promoting(tmp_path)
    platform.land(DAYS[0], 3)
    for day in DAYS[:2]:
        assert platform.materialize(day).success
    registry = lake_registry(platform.lake_dir, "synthetic")
    promoted = f"daily-{DAYS[1]}"
    assert registry.alias("champion") == promoted
    number = registry.client.get_registered_model("synthetic").aliases["champion"]

    # The second day delivered again, without its last column: the gate rejects it and every
    # asset after it records the day unchanged.
    landed = platform.landing_dir / f"synthetic_{DAYS[1]}.csv"
    lines = landed.read_text().splitlines()
    landed.write_text("".join(line.rsplit(",", 1)[0] + "\n" for line in lines))
    result = platform.materialize(DAYS[1])

    assert result.success
    record = result.asset_materializations_for_node(platform.node("registered_model"))[0]
    assert record.metadata["verdict"].value == "unchanged"
    # The aliases are what the latest recorded day (this one) left: nothing to warn about.
    messages = [e.user_message for e in platform.instance.all_logs(result.run_id)]
    assert not [m for m in messages if "which no recorded day left" in m]
    # The day's promotion stands: in MLflow, in the record, and for the day after it.
    assert registry.alias("champion") == promoted
    assert registry.client.get_registered_model("synthetic").aliases["champion"] == number
    assert record.metadata["champion"].value == promoted
    chain = RecordedChain(platform.instance, platform.key("registered_model"), DAYS[0])
    assert chain.before(DAYS[2])["champion"] == promoted
    assert platform.materialize(DAYS[2]).success
    met = json.loads(platform.stored("registered_model", DAYS[2], "json").read_text())
    assert met["champion_met"] == promoted


def test_a_day_judged_while_the_day_before_never_ran_is_said_to_be_out_of_order(tmp_path):
    platform = promoting(tmp_path)
    platform.land(DAYS[0], 3)
    assert platform.materialize(DAYS[0]).success
    # The second day's registry step failed (its data and model are there); the third day
    # runs as scheduled.
    upstream = [a for a in DAILY_ASSETS if a not in ("registered_model", "champion_performance")]
    assert platform.materialize(DAYS[1], selection=upstream).success
    result = platform.materialize(DAYS[2])

    assert result.success
    third = json.loads(platform.stored("registered_model", DAYS[2], "json").read_text())
    assert third["champion_met"] == f"daily-{DAYS[0]}"
    warned = [
        e.user_message
        for e in platform.instance.all_logs(result.run_id)
        if e.step_key and e.step_key.endswith("registered_model") and e.level >= logging.WARNING
    ]
    assert [m for m in warned if m.startswith(f"registered_model: {DAYS[1]} has no record")], warned
    assert f"To judge the days in order, run {DAYS[1]} first" in "".join(warned)
    # The first day's own run says nothing of the kind: nothing comes before it.
    first = platform.instance.get_runs()[-1]
    told = [e.user_message for e in platform.instance.all_logs(first.run_id)]
    assert not [m for m in told if "has no record" in m]


class FlakyRegistry(ModelRegistryResource):
    """The registry, whose registration of one version, or the move of the aliases to it, fails
    once, as a dropped write does (the move after the champion moved, before the challenger).

    Dagster builds the resource again from its fields for each run, so the one failure is kept
    on disk: it happens while the `armed` file exists, which it removes.
    """

    fails_on: str
    armed: str
    at: str  # "registration" or "alias move"

    def for_dataset(self, dataset: str) -> ModelRegistry:
        return FlakyVersions(self.stores, dataset, self.fails_on, Path(self.armed), self.at)


class FlakyVersions(ModelRegistry):
    def __init__(self, stores: MlflowStores, dataset: str, fails_on: str, armed: Path, at: str):
        super().__init__(stores, dataset)
        self.fails_on, self.armed, self.at = fails_on, armed, at

    def fail(self, at: str, version: str | None) -> bool:
        if at == self.at and version == self.fails_on and self.armed.exists():
            self.armed.unlink()
            return True
        return False

    def upsert(self, version, *args, **kwargs):
        if self.fail("registration", version):
            raise OSError(errno.EIO, "Input/output error")
        return super().upsert(version, *args, **kwargs)

    def set_aliases(self, aliases):
        if self.fail("alias move", aliases.get("champion")):
            super().set_aliases({"champion": aliases["champion"]})
            raise OSError(errno.EIO, "Input/output error")
        super().set_aliases(aliases)


def registrations_of(platform: Platform) -> tuple[list[tuple], dict[str, str]]:
    """Each day's decision, the champion it met, the alias it moved and where the aliases were
    after it, as recorded; and where the registry's aliases are now."""
    fields = ("decision", "champion_met", "alias", "champion_after", "challenger_after")
    recorded = [
        (day, *(value[f] for f in fields))
        for day in DAYS
        for value in [json.loads(platform.stored("registered_model", day, "json").read_text())]
    ]
    return recorded, platform.registry().aliases()


# Any eligible candidate clears a change threshold this tolerant: each day moves the champion,
# so a failed attempt leaves the champion on a later day's model than its retry judges.
TOLERANT = {"change_thresholds": {"rmse": -10.0}}
UPSTREAM = ["raw_data", "validated_data", "features", "model", "evaluation_report"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[list[tuple], dict[str, str]]:
    """The registrations of the range run without a fault: the same for each fault's retry."""
    root = tmp_path_factory.mktemp("uninterrupted")
    clean = Platform(synthetic_contract(root, "tolerant", **TOLERANT), root / "clean")
    clean.land(DAYS[0], len(DAYS))
    assert materialize_range(clean, DAYS[0], DAYS[-1], UPSTREAM).success
    assert materialize_range(clean, DAYS[0], DAYS[-1], ["registered_model"]).success
    return registrations_of(clean)


@pytest.mark.parametrize("at", ["registration", "alias move"])
def test_a_retry_after_a_failed_registration_decides_every_day_as_the_uninterrupted_run(
    tmp_path, at, uninterrupted
):
    faulty = Platform(synthetic_contract(tmp_path, "tolerant", **TOLERANT), tmp_path / "faulty")
    faulty.land(DAYS[0], len(DAYS))
    assert materialize_range(faulty, DAYS[0], DAYS[-1], UPSTREAM).success

    # The registry drops the last day's registration once; or the move of the aliases to it,
    # after the champion moved to it: the failed attempt leaves the champion on the last day's
    # model, against which its retry would judge the first days as superseded.
    armed = tmp_path / "armed"
    armed.touch()
    stores = MlflowStores(lake=LocalStorage(base_dir=str(faulty.lake_dir)))
    registry = FlakyRegistry(stores=stores, fails_on=f"daily-{DAYS[-1]}", armed=str(armed), at=at)
    result = materialize_range(
        faulty, DAYS[0], DAYS[-1], ["registered_model"], model_registry=registry
    )

    assert result.success
    retry = dg.DagsterEventType.STEP_UP_FOR_RETRY
    retried = [e for e in result.all_events if e.event_type == retry]
    assert len(retried) == 1, "the storage fault should have failed the first attempt"
    assert "Input/output error" in str(retried[0].event_specific_data.error)
    # An attempt that failed after moving the aliases is told by the retry, which moves them
    # back to what the records say.
    told = [e.user_message for e in faulty.instance.all_logs(result.run_id)]
    moved = [m for m in told if "which no recorded day left" in m]
    assert bool(moved) == (at == "alias move"), moved
    assert registrations_of(faulty) == uninterrupted
    promoted = [row[3] for row in uninterrupted[0]]
    assert promoted == ["champion"] * len(DAYS)
    # A rerun of the range meets what the record says. Its days before the latest are a rerun
    # of the past, decided as each would be rerun alone: the champion is a later day's model,
    # so they are not promoted and keep what their records say. The latest decides the same
    # again, and the aliases end where they were.
    assert materialize_range(faulty, DAYS[0], DAYS[-1], ["registered_model"]).success
    recorded, aliases = registrations_of(faulty)
    assert [row[1] for row in recorded] == ["superseded"] * (len(DAYS) - 1) + ["promote"]
    assert [row[2:3] + row[4:] for row in recorded] == [
        row[2:3] + row[4:] for row in uninterrupted[0]
    ]
    assert recorded[-1] == uninterrupted[0][-1] and aliases == uninterrupted[1]


class RefusingRegistry(ModelRegistryResource):
    """The registry, whose store refuses every new model version (a permission revoked)."""

    def for_dataset(self, dataset: str) -> ModelRegistry:
        return RefusingVersions(self.stores, dataset)


class RefusingVersions(ModelRegistry):
    def upsert(self, version, *args, **kwargs):
        raise MlflowException(f"permission denied to register {version}", PERMISSION_DENIED)


def test_aliases_an_attempt_moved_without_a_record_are_set_back_though_the_next_one_fails(
    tmp_path,
):
    platform = promoting(tmp_path)
    platform.land(DAYS[0], 2)
    assert platform.materialize(DAYS[0]).success
    assert platform.materialize(DAYS[1], selection=UPSTREAM).success
    recorded = {"champion": f"daily-{DAYS[0]}", "challenger": None}
    registry = platform.registry()
    assert registry.aliases() == recorded
    # An attempt at the second day registered its model and moved the champion to it, then
    # its process died before Dagster recorded the day (its model here: any whole one).
    example = pd.read_parquet(platform.stored("features", DAYS[1], "parquet")).head(5)
    model = registry.load(f"daily-{DAYS[0]}")
    registry.upsert(f"daily-{DAYS[1]}", model, {"partition": DAYS[1]}, example)
    registry.set_aliases({"champion": f"daily-{DAYS[1]}"})

    # The next attempt fails too, on an error of the registry's store that no retry fixes.
    refusing = RefusingRegistry(
        stores=MlflowStores(lake=LocalStorage(base_dir=str(platform.lake_dir)))
    )
    result = dg.materialize(
        list(platform.defs.assets or []),
        partition_key=DAYS[1],
        resources={**(platform.defs.resources or {}), "model_registry": refusing},
        instance=platform.instance,
        selection=[platform.key("registered_model")],
        raise_on_error=False,
    )

    assert not result.success
    assert "permission denied to register" in str(
        result.failure_data_for_node(platform.node("registered_model")).error
    )
    assert DAYS[1] not in platform.materialized("registered_model")
    # Serving is back on what the recorded days chose, not on the unrecorded attempt's model.
    assert registry.aliases() == recorded


def test_a_past_day_judged_after_a_gap_is_said_to_meet_the_champion_it_does_meet(tmp_path):
    platform = promoting(tmp_path)
    platform.land(DAYS[0], 3)
    # The first day's registry step never ran; the next two days did, each promoting.
    assert platform.materialize(DAYS[0], selection=UPSTREAM).success
    for day in DAYS[1:3]:
        assert platform.materialize(day).success
    assert platform.registry().alias("champion") == f"daily-{DAYS[2]}"

    # The second day again: a rerun of the past, after a day with no record.
    result = platform.materialize(DAYS[1])

    assert result.success
    rerun = json.loads(platform.stored("registered_model", DAYS[1], "json").read_text())
    assert rerun["champion_met"] is None
    warned = [
        e.user_message
        for e in platform.instance.all_logs(result.run_id)
        if e.step_key and e.step_key.endswith("registered_model") and e.level >= logging.WARNING
    ]
    [gap] = [m for m in warned if m.startswith(f"registered_model: {DAYS[0]} has no record")]
    # The champion it met, not the one the later day left live.
    assert "the latest recorded day before it left (none)" in gap, gap


class ForbiddenRegistry(ModelRegistryResource):
    """The registry, whose store refuses even to read the registered model (a revoked token)."""

    def for_dataset(self, dataset: str) -> ModelRegistry:
        return ForbiddenAliases(self.stores, dataset)


class ForbiddenAliases(ModelRegistry):
    def aliases(self):
        raise MlflowException(f"permission denied to read '{self.name}'", PERMISSION_DENIED)


def test_a_registry_store_error_that_waiting_cannot_fix_fails_the_step_at_once(tmp_path):
    platform = promoting(tmp_path)
    platform.land(DAYS[0], 1)
    assert platform.materialize(DAYS[0], selection=UPSTREAM).success
    forbidden = ForbiddenRegistry(
        stores=MlflowStores(lake=LocalStorage(base_dir=str(platform.lake_dir)))
    )

    result = dg.materialize(
        list(platform.defs.assets or []),
        partition_key=DAYS[0],
        resources={**(platform.defs.resources or {}), "model_registry": forbidden},
        instance=platform.instance,
        selection=[platform.key("registered_model")],
        raise_on_error=False,
    )

    assert not result.success
    retry = dg.DagsterEventType.STEP_UP_FOR_RETRY
    assert [e for e in result.all_events if e.event_type == retry] == []
    failure = result.failure_data_for_node(platform.node("registered_model"))
    assert failure is not None
    assert "permission denied to read 'synthetic'" in str(failure.error)
