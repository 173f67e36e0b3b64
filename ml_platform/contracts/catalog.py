"""The contracts a code location serves: every contract in a directory, or one of them.

One code location serves every dataset whose contract is in the directory (the bundled
contracts by default); a filter keeps one, by its name or as a contract file of its own. A
command acting on one dataset picks it from them, and needs no choice when there is one.
"""

from collections.abc import Sequence
from pathlib import Path

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
    of a contract file (anywhere). Two files declaring the same dataset name are an error naming
    both.
    """
    folder = Path(directory) if directory else BUNDLED_DIR
    if only and Path(only).suffix in SUFFIXES:
        return [load_contract(only)]
    if not folder.is_dir():
        raise ContractError(str(folder), ["no such contracts directory"])
    by_name: dict[str, tuple[Path, Contract]] = {}
    for path in contract_files(folder):
        contract = load_contract(path)
        if contract.name in by_name:
            raise ContractError(
                str(path),
                [f"dataset name '{contract.name}' is also the name in {by_name[contract.name][0]}"],
            )
        by_name[contract.name] = (path, contract)
    if not by_name:
        raise ContractError(str(folder), ["the directory holds no contract (*.yaml, *.yml)"])
    contracts = [contract for _, contract in sorted(by_name.values(), key=lambda p: p[1].name)]
    if only is None:
        return contracts
    try:
        return [choose(contracts, only, where=str(folder))]
    except DatasetChoiceError as exc:
        # The filter comes from the environment (a stale .env, say), not from the command's
        # own --dataset, which the message would otherwise seem to be about.
        raise DatasetChoiceError(f"{DATASET_ENV}={only!r}: {exc}") from None


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
    folder = Path(directory) if directory else BUNDLED_DIR
    for path in contract_files(folder):
        if load_contract(path).name == name:
            return path
    raise DatasetChoiceError(f"{folder} holds no contract of a dataset named '{name}'")
