"""Dataset contracts: the YAML files that describe a dataset, and their loader."""

from ml_platform.contracts.catalog import DatasetChoiceError, choose, load_contracts
from ml_platform.contracts.model import (
    ColumnSpec,
    Contract,
    ContractError,
    FeatureSpec,
    bundled_contracts,
    load_contract,
)

__all__ = [
    "ColumnSpec",
    "Contract",
    "ContractError",
    "DatasetChoiceError",
    "FeatureSpec",
    "bundled_contracts",
    "choose",
    "load_contract",
    "load_contracts",
]
