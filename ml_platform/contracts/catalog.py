"""The contracts a code location serves: every contract in a directory, or one of them.

One code location serves every dataset whose contract is in the directory (the bundled
contracts by default); a filter keeps one, by its name or as a contract file of its own. A
command acting on one dataset picks it from them, and needs no choice when there is one.
"""

from collections.abc import Sequence
from pathlib import Path

import yaml

from ml_platform.contracts.model import BUNDLED_DIR, Contract, ContractError, load_contract
from ml_platform.platform.settings import DATASET_ENV

# The names a contract file may have; `load_contracts` takes a path with either as one file.
SUFFIXES = (".yaml", ".yml")


def contract_files(folder: Path) -> list[Path]:
    """The contract files of `folder`, by name: `*.yaml` and `*.yml`, hidden files left out.

    A hidden name is no one's contract: an editor's lock file (`.#flights.yaml`, a link to
    nowhere while the file is open in Emacs) or the metadata macOS writes beside a copied file
    (`._flights.yaml`); loading one would take every dataset of the code location down.
    None in a folder that does not exist, as in an empty one.
    """
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.suffix in SUFFIXES and not path.name.startswith(".")
    )


def load_contracts(directory: str | Path | None = None, only: str | None = None) -> list[Contract]:
    """The contracts (`contract_files`) of `directory` (default: the bundled ones), by name.

    `only` (ML_PLATFORM_DATASET) keeps one: the name of a contract in the directory, or the path
    of a contract file (anywhere); the other files are not loaded (see `_named`). Two files
    declaring the same dataset name are an error naming both, and so are two whose
    `landing.file_pattern` is the same: both datasets' sensors would ingest every such file.
    """
    folder = Path(directory) if directory else BUNDLED_DIR
    if only and Path(only).suffix in SUFFIXES:
        return [load_contract(only)]
    if not folder.is_dir():
        raise ContractError(str(folder), ["no such contracts directory"])
    if only is not None:
        try:
            return [_named(folder, only)[1]]
        except DatasetChoiceError as exc:
            # The filter comes from the environment (a stale .env, say), not from the command's
            # own --dataset, which the message would otherwise seem to be about.
            raise DatasetChoiceError(f"{DATASET_ENV}={only!r}: {exc}") from None
    by_name: dict[str, tuple[Path, Contract]] = {}
    by_pattern: dict[str, tuple[Path, Contract]] = {}
    for path in contract_files(folder):
        contract = load_contract(path)
        if contract.name in by_name:
            raise ContractError(
                str(path),
                [f"dataset name '{contract.name}' is also the name in {by_name[contract.name][0]}"],
            )
        pattern = contract.landing.file_pattern
        if pattern in by_pattern:
            other_path, other = by_pattern[pattern]
            raise ContractError(
                str(path),
                [
                    f"landing.file_pattern '{pattern}' of dataset '{contract.name}' is also the "
                    f"pattern of dataset '{other.name}' in {other_path}: both datasets would "
                    "ingest every file of that name; give each dataset a pattern of its own"
                ],
            )
        by_name[contract.name] = by_pattern[pattern] = (path, contract)
    if not by_name:
        raise ContractError(str(folder), ["the directory holds no contract (*.yaml, *.yml)"])
    return [contract for _, contract in sorted(by_name.values(), key=lambda p: p[1].name)]


def _declared_name(path: Path) -> str | None:
    """The `name` a contract file declares, read without checking the rest; None: unreadable."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    name = document.get("name") if isinstance(document, dict) else None
    return name if isinstance(name, str) else None


def _named(folder: Path, name: str) -> tuple[Path, Contract]:
    """The file of `folder` that declares dataset `name`, and its contract.

    Only the files that declare `name`, or whose name cannot be read, are loaded: a mistake in
    the contract of a dataset not chosen must not stop the one chosen. The chosen one's mistakes
    are raised; so are those of a file whose name cannot be read, when no other file declares
    `name` (it may be the one meant). Two files declaring `name` are an error naming both.
    """
    found: list[tuple[Path, Contract]] = []
    unreadable: list[ContractError] = []
    declared: list[str] = []
    for path in contract_files(folder):
        said = _declared_name(path)
        if said is not None:
            declared.append(said)
        if said not in (name, None):
            continue
        try:
            contract = load_contract(path)
        except ContractError as exc:
            if said == name:
                raise
            unreadable.append(exc)
            continue
        if contract.name == name:
            found.append((path, contract))
    if len(found) > 1:
        raise ContractError(
            str(found[1][0]), [f"dataset name '{name}' is also the name in {found[0][0]}"]
        )
    if found:
        return found[0]
    if unreadable:
        raise unreadable[0]
    if not declared:
        raise ContractError(str(folder), ["the directory holds no contract (*.yaml, *.yml)"])
    names = ", ".join(sorted(set(declared)))
    raise DatasetChoiceError(f"{folder} has no dataset named '{name}'; the datasets are: {names}")


class DatasetChoiceError(ValueError):
    """No dataset of that name, or several and none chosen; the message lists the choices."""


def choose(
    contracts: Sequence[Contract], name: str | None, where: str = "the code location"
) -> Contract:
    """The contract named `name`; without a name, the only one (an error lists the choices)."""
    names = ", ".join(c.name for c in contracts)
    if name is None:
        if len(contracts) == 1:
            return contracts[0]
        raise DatasetChoiceError(
            f"{where} serves several datasets; choose one with --dataset: {names}"
        )
    for contract in contracts:
        if contract.name == name:
            return contract
    raise DatasetChoiceError(f"{where} has no dataset named '{name}'; the datasets are: {names}")


def contract_file(directory: str | Path | None, name: str) -> Path:
    """The file in `directory` (default: the bundled contracts) that declares dataset `name`."""
    return _named(Path(directory) if directory else BUNDLED_DIR, name)[0]
