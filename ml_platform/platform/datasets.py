"""One dataset's definitions in a code location that serves several datasets: names and catalog.

Every dataset has the same graph, so each name carries the dataset: asset keys are prefixed
by it (`flights/raw_data`), which also makes the lake folder of a partition
`<lake>/<dataset>/<asset>/<day>/` (the IO manager stores by asset key), and groups, jobs,
sensors, schedules and pools start with it (`flights_daily_pipeline_job`, pool `flights.model`).

In the catalog (`catalogued`) every asset names its contract's owners, carries the tags
`dataset` and `stage`, a code version, and a link to the function that computes it.
"""

import ast
import functools
import hashlib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import dagster as dg

import ml_platform

PACKAGE = Path(ml_platform.__file__).parent
# Layers that run, store, schedule and describe the steps; they compute no stored value. A code
# version counting them would mark every day of every asset stale at each storage or alert fix.
UNVERSIONED_LAYERS = frozenset({"automation", "platform", "troubleshooting"})
DATASET_TAG = "dataset"
# The dataset name of a replay: `<live>__replay_<name>` (ml_platform/replay/replays.py).
REPLAY_MARK = "__replay_"
# The lake's folder of the embedded MLflow store and every dataset's artifacts, beside the
# datasets' own folders (`<lake>/<dataset>/`): no dataset may be called so.
MLFLOW_PREFIX = "mlflow"
STAGE_TAG = "stage"


def asset_key(dataset: str, name: str) -> dg.AssetKey:
    """The key of the dataset's asset `name`."""
    return dg.AssetKey([dataset, name])


def dataset_name(dataset: str, name: str) -> str:
    """A group, job, sensor or schedule name of the dataset (a pool's is `writer_pool`)."""
    return f"{dataset}_{name}"


def writer_pool(dataset: str, name: str) -> str:
    """The concurrency pool of the dataset's asset `name`: the runs that write the asset.

    dagster.yaml gives every pool a limit of one run (`concurrency: pools:`, granularity `run`),
    so the queue starts a run only when no run in progress writes any of its assets: two runs
    never write a day at once, whether they hold one day or a range, and whoever launched them.
    The two parts are joined by a dot, which no dataset or asset name holds (Dagster takes any
    pool name without spaces): with `_`, dataset `x`'s `registered_model` and dataset
    `x_registered`'s `model` would be one pool, and each dataset's runs would wait for the other's.
    """
    return f"{dataset}.{name}"


def op_name(dataset: str, name: str) -> str:
    """The op Dagster names for the dataset's asset `name`: the key's path joined by `__`."""
    return f"{dataset}__{name}"


def catalogued(
    assets: Sequence[dg.AssetsDefinition],
    dataset: str,
    owners: Sequence[str],
    git: tuple[str, str] | None = None,
) -> list[dg.AssetsDefinition]:
    """`assets` of `dataset` with their owners, tags, code versions and code references.

    Each asset links to the function that computes it: a local file and line, or, with `git`
    (repository URL, branch or commit), that file's page in the GitHub or GitLab repository.
    The tags are the asset's own (catalog filters), not its runs'. Tags the builders set are
    kept.
    """
    # Both are marked beta in Dagster 1.13; they are the public way to link an asset's source.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        # They return what they are given; their signatures name every kind they accept.
        referenced = cast(list[dg.AssetsDefinition], dg.with_source_code_references(assets))
        described = dg.map_asset_specs(lambda spec: _describe(spec, dataset, owners), referenced)
        if git is None:
            return list(described)
        url, ref = git
        return cast(
            list[dg.AssetsDefinition],
            dg.link_code_references_to_git(
                described,
                git_url=url,
                git_branch=ref,
                file_path_mapping=dg.AnchorBasedFilePathMapping(
                    local_file_anchor=PACKAGE / "__init__.py",
                    file_anchor_path_in_repository=f"{PACKAGE.name}/__init__.py",
                ),
            ),
        )


def _describe(spec: dg.AssetSpec, dataset: str, owners: Sequence[str]) -> dg.AssetSpec:
    source = _compute_file(spec)
    return spec.merge_attributes(
        owners=list(owners), tags={DATASET_TAG: dataset, STAGE_TAG: stage_of(source)}
    ).replace_attributes(code_version=source_version(source))


def _compute_file(spec: dg.AssetSpec) -> Path:
    """The file of the function that computes the asset, as `with_source_code_references` found."""
    references = spec.metadata.get("dagster/code_references")
    local = [
        reference.file_path
        for reference in (
            references.code_references
            if isinstance(references, dg.CodeReferencesMetadataValue)
            else []
        )
        if isinstance(reference, dg.LocalFileCodeReference)
    ]
    if not local:
        raise ValueError(f"{spec.key.to_user_string()}: Dagster found no source file for it")
    return Path(local[-1])


def stage_of(source: Path) -> str:
    """The pipeline stage a compute module belongs to, from where it lives in the package.

    A stage package's assets module is the stage (`training/assets.py`: training); another
    module holding an asset is a stage of its own (`registry/monitoring.py`: monitoring).
    """
    relative = source.relative_to(PACKAGE)
    return relative.parent.name if relative.stem == "assets" else relative.stem


def source_version(source: Path, package: Path = PACKAGE) -> str:
    """A short hash of the module at `source` and of the modules of `package` it imports.

    What an asset computes is decided by the module of its function and by the modules that
    module imports, directly or through others: a change to any of them may change the stored
    values, so it changes the version, and Dagster shows the days materialised before as stale.
    The hash covers paths relative to the package's parent and file contents, so the version
    is the same wherever the package is installed.
    """
    sources: dict[str, bytes] = {}
    pending = [source]
    while pending:
        module = pending.pop()
        name = module.relative_to(package.parent).as_posix()
        if name not in sources:
            sources[name] = module.read_bytes()
            pending.extend(_imported_modules(sources[name], package))
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(f"{name}\0{len(sources[name])}\0".encode())
        digest.update(sources[name])
    return digest.hexdigest()[:12]


@functools.cache
def _imported_modules(source: bytes, package: Path) -> tuple[Path, ...]:
    """Files of the modules of `package` that `source` imports, but `UNVERSIONED_LAYERS`'."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from package.stage import module` imports a module too.
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    files = []
    for name in names:
        parts = name.split(".")
        if parts[0] != package.name or (len(parts) > 1 and parts[1] in UNVERSIONED_LAYERS):
            continue
        path = package.parent.joinpath(*parts)
        files += [f for f in (path.with_suffix(".py"), path / "__init__.py") if f.is_file()][:1]
    return tuple(files)
