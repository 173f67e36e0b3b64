"""The contracts a code location serves: every contract in a directory, or one of them.

One code location serves every dataset whose contract is in the directory (the bundled
contracts by default); a filter keeps one, by its name or as a contract file of its own. A
command acting on one dataset picks it from them, and needs no choice when there is one.
"""

from collections.abc import Sequence
from pathlib import Path

from ml_platform.contracts.model import BUNDLED_DIR, Contract, ContractError, load_contract


def load_contracts(directory: str | Path | None = None, only: str | None = None) -> list[Contract]:
    """The contracts (`*.yaml`) of `directory` (default: the bundled ones), sorted by name.

    `only` keeps one: the name of a contract in the directory, or the path of a contract file
    (anywhere). Two files declaring the same dataset name are an error naming both.
    """
    folder = Path(directory) if directory else BUNDLED_DIR
    if only and Path(only).suffix in {".yaml", ".yml"}:
        return [load_contract(only)]
    if not folder.is_dir():
        raise ContractError(str(folder), ["no such contracts directory"])
    by_name: dict[str, tuple[Path, Contract]] = {}
    for path in sorted(folder.glob("*.yaml")):
        contract = load_contract(path)
        if contract.name in by_name:
            raise ContractError(
                str(path),
                [f"dataset name '{contract.name}' is also the name in {by_name[contract.name][0]}"],
            )
        by_name[contract.name] = (path, contract)
    if not by_name:
        raise ContractError(str(folder), ["the directory holds no contract (*.yaml)"])
    contracts = [contract for _, contract in sorted(by_name.values(), key=lambda p: p[1].name)]
    if only is None:
        return contracts
    return [choose(contracts, only, where=str(folder))]


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
    for path in sorted(folder.glob("*.yaml")):
        if load_contract(path).name == name:
            return path
    raise DatasetChoiceError(f"{folder} holds no contract of a dataset named '{name}'")
