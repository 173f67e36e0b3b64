"""Rerun a failed run's asset for its partition, in this process, on a sample of its real inputs.

The inputs are the partitions the failed run read, loaded from the lake by the same IO manager,
cut to a sample so the rerun takes seconds. The exception the asset raises propagates out of
`reproduce` unchanged, with its traceback ending in the asset's own code, so `pdb.post_mortem`
(`ml-platform reproduce --pdb`) stops where it broke.

Nothing the rerun writes reaches the real lake (local or S3) or instance: writes go to a
scratch directory layered over the lake (reads see the scratch first, then the lake), and the
run is recorded in an ephemeral instance. So a reproduced training run cannot leave a
checkpoint that a real run would resume from.
"""

import dataclasses
import logging
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.diagnose import diagnose_run
from ml_platform.observability import row_count
from ml_platform.storage import LakeIOManager, LakeStorage, LocalStorage

DEFAULT_SAMPLE_ROWS = 100
python_logger = logging.getLogger("ml_platform.reproduce")


class NothingToReproduceError(RuntimeError):
    """The run has no failed asset step that the definitions know."""


class OverlayStorage(LakeStorage):
    """The lake read-only, with writes going to `write_dir` (and read back from there first)."""

    lake: LakeStorage
    write_dir: str

    def _scratch(self) -> LocalStorage:
        return LocalStorage(base_dir=self.write_dir)

    def uri(self, key: str) -> str:
        """Where the object is read from: the scratch copy if written, else the lake."""
        scratch = self._scratch()
        return scratch.uri(key) if scratch.exists(key) else self.lake.uri(key)

    def exists(self, key: str) -> bool:
        """Whether the scratch directory or the lake holds `key`."""
        return self._scratch().exists(key) or self.lake.exists(key)

    def write_bytes(self, key: str, data: bytes) -> None:
        """Store in the scratch directory; the lake is never written."""
        self._scratch().write_bytes(key, data)

    def read_bytes(self, key: str) -> bytes:
        """The scratch copy if there is one, else the lake's."""
        scratch = self._scratch()
        return scratch.read_bytes(key) if scratch.exists(key) else self.lake.read_bytes(key)

    def delete(self, key: str) -> None:
        """Remove the scratch copy only."""
        self._scratch().delete(key)

    def list_keys(self, prefix: str) -> list[str]:
        """Keys in the lake and in the scratch directory."""
        return sorted(set(self.lake.list_keys(prefix)) | set(self._scratch().list_keys(prefix)))


def sample(value: Any, rows: int) -> Any:
    """`rows` rows of a frame (a fixed random sample, kept in order); other values as they are."""
    if isinstance(value, pd.DataFrame) and len(value) > rows:
        return value.sample(n=rows, random_state=0).sort_index()
    if isinstance(value, dict):
        return {key: sample(item, rows) for key, item in value.items()}
    return value


class SampleIOManager(LakeIOManager):
    """The lake IO manager, handing each input partition to the asset as a sample of its rows."""

    sample_rows: int

    def load_input(self, context: dg.InputContext) -> Any:
        """The real input, sampled to `sample_rows` rows per partition."""
        value = super().load_input(context)
        sampled = sample(value, self.sample_rows)
        python_logger.info(
            f"input {context.name} ({context.asset_key.to_user_string()}): "
            f"{row_count(sampled)} of {row_count(value)} rows"
        )
        return sampled


@dataclasses.dataclass(frozen=True)
class Target:
    """What to rerun: the failed asset and its partition."""

    run_id: str
    asset: dg.AssetsDefinition
    partition: str | None


def failed_target(instance: dg.DagsterInstance, run_id: str, defs: dg.Definitions) -> Target:
    """The first failed asset step of the run, as an asset of `defs`."""
    diagnosis = diagnose_run(instance, run_id)
    if not diagnosis.failed_steps:
        raise NothingToReproduceError(
            f"run {run_id} is {diagnosis.status} and has no failed step to reproduce"
        )
    step = diagnosis.failed_steps[0].step
    for asset in defs.assets or []:
        if isinstance(asset, dg.AssetsDefinition) and asset.op.name == step:
            return Target(run_id=run_id, asset=asset, partition=diagnosis.outcome.partition)
    raise NothingToReproduceError(
        f"run {run_id} failed in step {step}, which is no asset of these definitions "
        "(another code location, or the asset was renamed since)"
    )


def reproduce(
    instance: dg.DagsterInstance,
    run_id: str,
    defs: dg.Definitions,
    scratch_dir: Path,
    sample_rows: int = DEFAULT_SAMPLE_ROWS,
) -> Target:
    """Rerun the run's failed asset on sampled real inputs; its exception propagates as raised.

    Returns the target when the rerun succeeds (the sample did not reproduce the failure).
    """
    target = failed_target(instance, run_id, defs)
    resources = dict(defs.resources or {})
    lake = resources.get("lake")
    io_manager = resources.get("io_manager")
    if not isinstance(lake, LakeStorage) or not isinstance(io_manager, LakeIOManager):
        raise NothingToReproduceError(
            "reproduce needs the lake storage and the LakeIOManager in the definitions"
        )
    overlay = OverlayStorage(lake=lake.process_config_and_initialize(), write_dir=str(scratch_dir))
    resources["lake"] = overlay
    resources["io_manager"] = SampleIOManager(
        storage=overlay, dataset=io_manager.dataset, sample_rows=sample_rows
    )
    python_logger.info(
        f"reproducing run {run_id}: {target.asset.key.to_user_string()} partition "
        f"{target.partition or '-'} on {sample_rows} rows per input partition"
    )
    with dg.DagsterInstance.ephemeral() as scratch_instance:
        dg.materialize(
            [a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition)],
            selection=[target.asset.key],
            partition_key=target.partition,
            resources=resources,
            instance=scratch_instance,
            raise_on_error=True,
        )
    return target
