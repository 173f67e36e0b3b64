"""Switching to a replay's contract, and removing a replay with everything it wrote."""

import dataclasses
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

import dagster as dg

from ml_platform.automation.alert_sensors import BACKFILL_ENDED
from ml_platform.automation.jobs import DATASET_JOBS, IN_FLIGHT
from ml_platform.contracts import ContractError, load_contract
from ml_platform.contracts.editing import editable_contract
from ml_platform.platform.datasets import MLFLOW_PREFIX, dataset_name
from ml_platform.platform.storage import LakeStorage
from ml_platform.platform.tracking import MlflowStores
from ml_platform.registry.chain import unfed_definitions
from ml_platform.replay.assets import REPLAY_COMPARISON_JOB
from ml_platform.replay.replays import BrokenReplay, Replay, ReplayError, file_sha256

# A run still writing: one in flight, or one being cancelled (its step may still be writing).
STILL_WRITING = [*IN_FLIGHT, dg.DagsterRunStatus.CANCELING]
# The jobs of a replay's dataset a run may be launched by name from, without an asset selection.
REPLAY_JOBS = (*DATASET_JOBS, REPLAY_COMPARISON_JOB)


def promote_replay(replay: Replay | BrokenReplay, live_file: Path) -> Path:
    """Make the replay's contract the live dataset's: `live_file` becomes its bytes.

    Only the file changes, a change a person reviews (and commits); the live chain runs it from
    its next day on, through its ordinary rules. The replay itself stays until removed. A
    replay that cannot be read is not promoted: what it ran is no longer what its folder says.
    Nor is one whose live contract file changed since it was made (its recorded digest): the
    replay's contract is a change of the live contract as it was, and copying it would undo
    what changed since, unseen. Nor is one that no longer feeds the live champion what it
    learnt (`registry.chain.unfed_definitions`, on the live contract's features): the live
    chain would stop from its next day, unseen until then.
    """
    if isinstance(replay, BrokenReplay):
        raise ReplayError(
            f"replay '{replay.name}' cannot be read ({replay.reason}): it is not served and not "
            f"promoted; run `ml-platform replay remove {replay.name}`"
        )
    target = editable_contract(live_file)
    if target.read_bytes() == replay.contract_file.read_bytes():
        # Promoted already: the live file is the replay's contract, nothing to undo.
        return target
    if replay.live_sha256 is None:
        raise ReplayError(
            f"replay '{replay.name}' records no digest of the live contract it was made against "
            f"(made by an older version), so whether {target} changed since cannot be told: "
            f"compare them, and copy {replay.contract_file} over it by hand if it did not"
        )
    if file_sha256(target) != replay.live_sha256:
        raise ReplayError(
            f"{target} changed since replay '{replay.name}' was made: its contract changes the "
            "live contract as it was, and copying it would undo what changed since. Make the "
            f"replay again from the live contract as it is (`ml-platform replay remove "
            f"{replay.name}`, then `ml-platform replay CONTRACT`), or merge the change by hand"
        )
    try:
        live = load_contract(target)
    except ContractError as exc:
        raise ReplayError(f"{target} cannot be read as the live contract: {exc}") from exc
    if unfed := unfed_definitions(live.task, live.feature_definitions, replay.contract):
        # The champion moves only by the registry's rule, which must score it first: promoted,
        # the live chain's registry and monitoring stop every day from the next, for good.
        raise ReplayError(
            f"replay '{replay.name}' is not promoted: the live champion of {replay.live}, "
            f"trained under {target}, could no longer be scored under the replay's contract "
            f"({'; '.join(unfed)}). Promoted, the live chain's registered_model and "
            "champion_performance would stop every day from the next with "
            "ChampionFeaturesError, and its champion could be neither scored nor replaced. Put "
            "the feature(s) back in the replay's contract, or make the change a dataset of its "
            "own (a contract with a new `name`: its registry starts empty); if the live chain "
            f"has no champion yet, copy {replay.contract_file} over {target} by hand"
        )
    _write_whole(target, replay.contract_file.read_bytes())
    return target


def _write_whole(target: Path, data: bytes) -> None:
    """`target` holds `data`, or, when writing fails, what it held: never a part of either.

    The live contract is what the code location loads: a copy cut short (a full disk, the
    command killed) would leave a file no dataset loads from, and a reload meanwhile would read
    half of one. The bytes go to a hidden file beside it (no contract, `contract_files`), then
    take its place at once; a link is followed, so the file it points to is the one replaced.
    """
    real = target.resolve()
    written = real.with_name(f".{real.name}.promoting")
    try:
        with written.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        shutil.copymode(real, written)
        os.replace(written, real)
    except OSError as exc:
        written.unlink(missing_ok=True)
        raise ReplayError(
            f"{target} could not be written ({exc}): it is as it was; once that is fixed, "
            "promote again"
        ) from exc


@dataclasses.dataclass(frozen=True)
class Removed:
    """What removing a replay took away."""

    assets: int
    lake_objects: int
    registered_model: bool
    experiment: bool


def remove_replay(
    replay: Replay | BrokenReplay,
    instance: dg.DagsterInstance,
    asset_keys: list[dg.AssetKey],
    lake: LakeStorage,
    stores: MlflowStores,
) -> Removed:
    """Remove the replay's records, lake files, MLflow entries and folder.

    Everything of the replay carries its own dataset name, so no live record, file or entry is
    touched. The records are those of `asset_keys` and of every key of the replay's dataset the
    instance holds: a replay that cannot be read is not served, so the code location's asset
    graph no longer names the assets it recorded while it was. `lake` and `stores` may be the
    code location's own resources, whose settings stay `EnvVar`s until a run resolves them:
    removing is no run (`ml-platform replay remove`), so they are resolved here.

    Nothing is removed while a backfill or run of the replay is in progress (`running`): what
    it wrote after would be left behind, records that a new replay of the same name would read
    as its own past.
    """
    going = running(instance, replay.dataset)
    if going:
        raise ReplayError(
            f"replay '{replay.name}' is running: {'; '.join(going)} write(s) its assets. Cancel "
            "it in the UI (Backfills, Runs) or wait for it to end, then remove the replay: "
            "removed now, what it writes after would be left behind"
        )
    recorded = _recorded(instance, replay.dataset)
    asset_keys = [*asset_keys, *(k for k in recorded if k not in asset_keys)]
    instance.wipe_assets(asset_keys)
    with dg.build_resources({"lake": lake, "mlflow": stores}) as resolved:
        objects = _remove_stored(replay.dataset, resolved.lake, resolved.mlflow)
    # A replay whose folder was deleted by hand (`find_replay` given what it left) has none.
    if replay.folder.exists():
        shutil.rmtree(replay.folder)
    return Removed(len(asset_keys), *objects)


def _recorded(instance: dg.DagsterInstance, dataset: str) -> list[dg.AssetKey]:
    """The keys of `dataset`'s assets the instance holds records of (a wiped one's it does not)."""
    return [k for k in instance.get_asset_keys(prefix=[dataset]) if k.path[0] == dataset]


def _lake_prefixes(dataset: str) -> tuple[str, str]:
    """Where `dataset` keeps its lake files: its folder, and its MLflow artifacts."""
    return f"{dataset}/", f"{MLFLOW_PREFIX}/artifacts/{dataset}/"


def left_behind(
    dataset: str, instance: dg.DagsterInstance, lake: LakeStorage, stores: MlflowStores
) -> list[str]:
    """What a replay dataset named `dataset` has in the instance, the lake and MLflow, in words.

    A new replay of that dataset would read it as its own past: the registry's chain of recorded
    days, the champion alias of its registered model, the comparison's records. `lake` and
    `stores` may be unresolved resources (see `remove_replay`).
    """
    said = []
    recorded = _recorded(instance, dataset)
    if recorded:
        said.append(f"records of {len(recorded)} asset(s) in the Dagster instance")
    with dg.build_resources({"lake": lake, "mlflow": stores}) as resolved:
        prefixes = _lake_prefixes(dataset)
        objects = sum(len(resolved.lake.list_keys(prefix)) for prefix in prefixes)
        client = resolved.mlflow.client()
        registered = client.search_registered_models(f"name = '{dataset}'")
        experiment = client.get_experiment_by_name(dataset)
    if objects:
        said.append(f"{objects} lake object(s) under {' and '.join(prefixes)}")
    if registered:
        said.append(f"MLflow's registered model '{dataset}'")
    if experiment is not None:
        deleted = experiment.lifecycle_stage == "deleted"
        said.append(
            f"MLflow's experiment '{dataset}'"
            + (" (deleted, its name still taken)" if deleted else "")
        )
    return said


def running(instance: dg.DagsterInstance, dataset: str) -> list[str]:
    """The backfills and runs in progress that write `dataset`'s assets, each in words.

    A backfill launches its runs one after another (the daemon's), so between two of them only
    the backfill says the replay is still running.
    """

    def ours(keys: Iterable[dg.AssetKey] | None) -> bool:
        return any(key.path[0] == dataset for key in keys or ())

    said = [
        f"backfill {backfill.backfill_id} ({backfill.status.value})"
        for backfill in instance.get_backfills()
        if backfill.status.value not in BACKFILL_ENDED and ours(backfill.asset_selection)
    ]
    jobs = {dataset_name(dataset, job) for job in REPLAY_JOBS}
    records = instance.get_run_records(filters=dg.RunsFilter(statuses=STILL_WRITING))
    said += [
        f"run {run.run_id} ({run.status.value})"
        for run in (record.dagster_run for record in records)
        if ours(run.asset_selection) or run.job_name in jobs
    ]
    return said


def _remove_stored(dataset: str, lake: LakeStorage, stores: MlflowStores) -> tuple[int, bool, bool]:
    """Remove `dataset`'s lake files and MLflow entries.

    The number of lake objects removed, and whether its registered model and experiment were
    there.
    """
    keys = [key for prefix in _lake_prefixes(dataset) for key in lake.list_keys(prefix)]
    for key in keys:
        lake.delete(key)
    client = stores.client()
    registered = client.search_registered_models(f"name = '{dataset}'")
    if registered:
        client.delete_registered_model(dataset)
    experiment = client.get_experiment_by_name(dataset)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            # Deleted in MLflow's UI or API, its name still taken: MLflow renames only an active
            # experiment, so it is restored for the rename.
            client.restore_experiment(experiment.experiment_id)
        # MLflow keeps a deleted experiment's name taken: renamed first, a replay of the same
        # name can be made again.
        client.rename_experiment(
            experiment.experiment_id, f"{dataset} (removed {time.strftime('%Y%m%dT%H%M%S')})"
        )
        client.delete_experiment(experiment.experiment_id)
    return len(keys), bool(registered), experiment is not None
