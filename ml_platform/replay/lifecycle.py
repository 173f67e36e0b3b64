"""Switching to a replay's contract, and removing a replay with everything it wrote."""

import dataclasses
import shutil
import time
from pathlib import Path

import dagster as dg

from ml_platform.contracts.editing import editable_contract
from ml_platform.platform.storage import LakeStorage
from ml_platform.platform.tracking import MLFLOW_PREFIX, MlflowStores
from ml_platform.replay.replays import Replay


def promote_replay(replay: Replay, live_file: Path) -> Path:
    """Make the replay's contract the live dataset's: `live_file` becomes its bytes.

    Only the file changes, a change a person reviews (and commits); the live chain runs it from
    its next day on, through its ordinary rules. The replay itself stays until removed.
    """
    target = editable_contract(live_file)
    shutil.copyfile(replay.contract_file, target)
    return target


@dataclasses.dataclass(frozen=True)
class Removed:
    """What removing a replay took away."""

    assets: int
    lake_objects: int
    registered_model: bool
    experiment: bool


def remove_replay(
    replay: Replay,
    instance: dg.DagsterInstance,
    asset_keys: list[dg.AssetKey],
    lake: LakeStorage,
    stores: MlflowStores,
) -> Removed:
    """Remove the replay's records, lake files, MLflow entries and folder.

    Everything of the replay carries its own dataset name, so no live record, file or entry is
    touched.
    """
    instance.wipe_assets(asset_keys)
    prefixes = (f"{replay.dataset}/", f"{MLFLOW_PREFIX}/artifacts/{replay.dataset}/")
    keys = [key for prefix in prefixes for key in lake.list_keys(prefix)]
    for key in keys:
        lake.delete(key)
    client = stores.client()
    registered = client.search_registered_models(f"name = '{replay.dataset}'")
    if registered:
        client.delete_registered_model(replay.dataset)
    experiment = client.get_experiment_by_name(replay.dataset)
    if experiment is not None:
        # MLflow keeps a deleted experiment's name taken: renamed first, a replay of the same
        # name can be made again.
        client.rename_experiment(
            experiment.experiment_id, f"{replay.dataset} (removed {time.strftime('%Y%m%dT%H%M%S')})"
        )
        client.delete_experiment(experiment.experiment_id)
    shutil.rmtree(replay.folder)
    return Removed(len(asset_keys), len(keys), bool(registered), experiment is not None)
