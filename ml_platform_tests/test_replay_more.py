"""Replays on shapes nobody designed for: promoting a change of the champion's features, a
replay compared again once the live contract took its change.

The comparison is materialised from the code location's own graph over records reported to a
real instance as the day assets record them (metadata only, no data).
"""

import datetime as dt
from pathlib import Path

import dagster as dg
import pytest

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import LabelRule, LabelSpec, bundled_contracts
from ml_platform.platform.datasets import asset_key
from ml_platform.replay.comparison import target_change
from ml_platform.replay.lifecycle import promote_replay
from ml_platform.replay.replays import ReplayError, create_replay, load_replays
from ml_platform_tests.conftest import days_from, fill, tmpfs
from ml_platform_tests.test_replay_shapes import compare

START = dt.date(2024, 2, 1)
LOG_AMOUNT = "  - {name: log_amount, kind: numeric, source: amount, transform: log1p}\n"
HOUR = "  - {name: hour, kind: numeric, source: event_time, transform: hour}\n"


def promoted(tmp_path, edit):
    """Promote a replay of synthetic whose contract is `edit` of the live one; the live file."""
    text = bundled_contracts()["synthetic"].read_text()
    live_file = tmp_path / "contracts" / "synthetic.yaml"
    live_file.parent.mkdir()
    live_file.write_text(text)
    changed = tmp_path / "changed.yaml"
    changed.write_text(edit(text))
    live = load_contract(live_file)
    made = create_replay(
        tmp_path / "replays", changed, live, "change", START, 3, live_file=live_file
    )
    promote_replay(made, live_file)
    return live_file


@pytest.mark.parametrize(
    "edit, said",
    [
        (
            lambda t: t.replace(LOG_AMOUNT, LOG_AMOUNT.replace("log1p", "identity")),
            r"it learnt the feature log_amount as numeric log1p\(amount\), which the contract "
            r"now computes as numeric identity\(amount\)",
        ),
        (lambda t: t.replace(HOUR, ""), r"it needs the feature\(s\) \['hour'\], which the"),
    ],
    ids=["transform", "dropped"],
)
def test_promote_refuses_a_change_the_live_champion_could_not_be_scored_under(tmp_path, edit, said):
    # Promoted, the live chain's registered_model and champion_performance would stop every
    # day from the next with ChampionFeaturesError: said before the live file is written.
    text = bundled_contracts()["synthetic"].read_text()
    with pytest.raises(ReplayError, match=said) as refused:
        promoted(tmp_path, edit)
    assert "ChampionFeaturesError" in str(refused.value)
    assert "a new `name`" in str(refused.value)
    assert (tmp_path / "contracts" / "synthetic.yaml").read_text() == text


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace(
            HOUR, HOUR + "  - {name: month, kind: numeric, source: event_time, transform: month}\n"
        ),
        lambda t: t.replace(HOUR, HOUR.replace("numeric", "categorical")),
    ],
    ids=["added", "numeric_made_categorical"],
)
def test_promote_writes_a_change_the_live_champion_is_still_scored_under(tmp_path, edit):
    live_file = promoted(tmp_path, edit)
    assert live_file.read_text() == edit(bundled_contracts()["synthetic"].read_text())


def comparison_verdict(tmp_path: Path, live_file: Path, scores: dict[str, float]) -> str:
    """The verdict of the replay kept under tmp_path, served beside `live_file`'s contract."""
    live = load_contract(live_file)
    [replay] = load_replays(tmp_path / "replays", [live])
    instance = dg.DagsterInstance.ephemeral()
    for dataset, score in (("flights", scores["live"]), (replay.dataset, scores["replay"])):
        for day in days_from("2013-03-01", 10):
            event = dg.AssetMaterialization(
                asset_key(dataset, "champion_performance"),
                partition=day,
                metadata={"champion_roc_auc": score},
            )
            instance.report_runless_asset_event(event)
    return str(compare(tmp_path, replay, instance, live)["metadata"]["verdict"].value)


def flights_files(tmp_path: Path, rule: str) -> tuple[Path, Path]:
    """The live flights contract in a file of its own, and a copy labelled by `rule`."""
    text = bundled_contracts()["flights"].read_text()
    live_file = tmp_path / "contracts" / "flights.yaml"
    live_file.parent.mkdir()
    live_file.write_text(text)
    changed = tmp_path / "flights_changed.yaml"
    changed.write_text(text.replace('rule: {op: ">", value: 15}', rule))
    return live_file, changed


def test_a_label_change_promoted_then_compared_again_still_gives_no_verdict(tmp_path):
    # The live chain's records of the replayed days were judged on the label of the day the
    # replay was made: once the replay's label is promoted, the two contracts agree, not the
    # two chains' targets.
    live_file, changed = flights_files(tmp_path, 'rule: {op: ">", value: 30}')
    live = load_contract(live_file)
    made = create_replay(
        tmp_path / "replays", changed, live, "late30", dt.date(2013, 3, 1), 10, live_file=live_file
    )
    promote_replay(made, live_file)
    said = comparison_verdict(tmp_path, live_file, {"live": 0.60, "replay": 0.80})
    assert said.startswith("the two chains are measured on different targets (label rule > 15 ")
    assert "the live label changed since the replay was made (label rule > 15 -> > 30)" in said
    assert said.endswith("no verdict") and "better" not in said


def test_a_live_label_changed_since_the_replay_was_made_gives_no_verdict(tmp_path):
    # A replay of the estimator alone, then the live label moved: a live day rerun since is
    # judged on the new label, the replay's on the old one.
    live_file, changed = flights_files(tmp_path, 'rule: {op: ">", value: 15}')
    changed.write_text(changed.read_text() + "# the same contract, compared again\n")
    live = load_contract(live_file)
    create_replay(
        tmp_path / "replays", changed, live, "same", dt.date(2013, 3, 1), 10, live_file=live_file
    )
    live_file.write_text(
        live_file.read_text().replace('rule: {op: ">", value: 15}', 'rule: {op: ">", value: 30}')
    )
    said = comparison_verdict(tmp_path, live_file, {"live": 0.60, "replay": 0.80})
    assert said == (
        "the two chains are measured on different targets (the live label changed since the "
        "replay was made (label rule > 15 -> > 30): the live chain's records of these days may "
        "be on either target): their roc_auc cannot be compared, no verdict"
    )


def test_a_replay_that_cannot_be_written_whole_keeps_nothing(tmp_path):
    # A replays directory out of room: a contract copied in part would be a folder that holds
    # the name (`a replay named ... exists`) and no replay, and the command a traceback.
    text = bundled_contracts()["synthetic"].read_text()
    live_file = tmp_path / "synthetic.yaml"
    live_file.write_text(text)
    changed = tmp_path / "synthetic_sgd.yaml"
    notes = "".join(f"# why SGD, reason {i}: measured on an earlier replay\n" for i in range(400))
    changed.write_text(text.replace("  estimator: linear\n", "  estimator: sgd\n") + notes)
    live = load_contract(live_file)
    with tmpfs(tmp_path / "replays", "1m") as replays:
        filler = fill(replays, 2)
        with pytest.raises(ReplayError, match=r"could not be written .*nothing is kept"):
            create_replay(replays, changed, live, "sgd", START, 3, live_file=live_file)
        assert [p.name for p in replays.iterdir()] == ["filler"]
        # Room again: the name is free, and the replay is kept whole.
        filler.unlink()
        made = create_replay(replays, changed, live, "sgd", START, 3, live_file=live_file)
        assert made.contract_file.read_bytes() == changed.read_bytes()
        assert load_replays(replays, [live]) == [made]


def test_label_rules_apart_in_the_seventh_digit_are_different_targets():
    # A transaction is "large" from one million, then from one million and one: few rows
    # move, but the two chains' metrics are on different targets all the same.
    def label(value: float) -> LabelSpec:
        rule = LabelRule(op=">=", value=value)
        return LabelSpec(name="large", task="classification", source="amount", rule=rule)

    assert target_change(label(1_000_000), label(1_000_001)) == (
        "label rule >= 1000000 -> >= 1000001"
    )
    assert target_change(label(15), label(15.0)) is None
    assert target_change(label(0.1), label(0.25)) == "label rule >= 0.1 -> >= 0.25"
