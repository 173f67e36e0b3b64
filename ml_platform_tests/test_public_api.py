"""The platform, its tests and its benchmarks use the public API of Dagster, GE and scikit-learn.

Private modules (`dagster._core`, `dagster_aws._...`, `great_expectations.core._x`,
`sklearn.utils._param_validation`) change without notice between releases, so code that reaches
into them breaks silently on an upgrade. Nor does the platform replace what a library computes:
no Great Expectations metric provider is subclassed or registered again, no GE function is
unwrapped from its decorators, no attribute of Dagster, GE or scikit-learn is assigned. A
result a library reports is then one that library produced by its own code. The code is parsed,
not grepped: a comment or a string that names a private module is not a use of it.
"""

import ast
from collections.abc import Callable

import pytest

from ml_platform_tests.conftest import REPO

CHECKED = ("ml_platform", "ml_platform_tests", "benchmarks")
# GE's metric providers: subclassing one registers (or replaces) a metric in GE's registry.
GE_METRICS = "great_expectations.expectations.metrics"
GE_REGISTRY = "great_expectations.expectations.registry"


def is_dagster(module: str) -> bool:
    """Whether a dotted name lies in Dagster or one of its integrations (dagster_aws, ...)."""
    top = module.split(".")[0]
    return top == "dagster" or top.startswith("dagster_")


def is_ge(module: str) -> bool:
    """Whether a dotted name lies in Great Expectations."""
    return module.split(".")[0] == "great_expectations"


def is_sklearn(module: str) -> bool:
    """Whether a dotted name lies in scikit-learn."""
    return module.split(".")[0] == "sklearn"


def is_library(module: str) -> bool:
    """Whether a dotted name lies in one of the libraries whose public API alone is used."""
    return is_dagster(module) or is_ge(module) or is_sklearn(module)


def is_private(name: str) -> bool:
    """`_core`, not `__version__`: one leading underscore marks a private module or member."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class Names:
    """The library modules and members a source binds to local names, and its dotted names."""

    def __init__(self, tree: ast.AST, library: Callable[[str], bool]):
        # Local name -> the library module or member it is bound to, over the whole file: an
        # import inside a function binds the name there just as well.
        self.bound: dict[str, str] = {}
        self.imports: list[tuple[int, str]] = []  # every library name imported, with its line
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if library(alias.name):
                        self.imports.append((node.lineno, alias.name))
                        top = alias.name.split(".")[0]
                        self.bound[alias.asname or top] = alias.name if alias.asname else top
            elif isinstance(node, ast.ImportFrom) and node.module and library(node.module):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    self.imports.append((node.lineno, full))
                    self.bound[alias.asname or alias.name] = full

    def dotted(self, node: ast.expr) -> str | None:
        """The library dotted name an expression spells (`dg.x.y`), if it spells one."""
        if isinstance(node, ast.Name):
            return self.bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None


def called_name(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def private_uses(
    source: str, filename: str = "<source>", library: Callable[[str], bool] = is_library
) -> list[str]:
    """`line: dotted name` of every private module or member of a `library` the source uses.

    Counted: `import dagster._x`, `from dagster._x import y`, `from dagster import _x`,
    attributes reached from a library module (`dg._core.events`, after `import dagster as dg`),
    and `importlib.import_module("dagster._x")` or `getattr(dg, "_x")`.
    """
    tree = ast.parse(source, filename)
    names = Names(tree, library)
    uses = [
        (line, name)
        for line, name in names.imports
        if any(is_private(part) for part in name.split("."))
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            name = names.dotted(node)
            if name:
                uses.append((node.lineno, name))
        elif isinstance(node, ast.Call) and node.args:
            called, first = called_name(node), node.args[0]
            if called in ("import_module", "__import__") and isinstance(first, ast.Constant):
                module = str(first.value)
                if library(module) and any(is_private(p) for p in module.split(".")):
                    uses.append((node.lineno, module))
            if called == "getattr" and len(node.args) > 1:
                base, attr = names.dotted(first), node.args[1]
                if base and isinstance(attr, ast.Constant) and is_private(str(attr.value)):
                    uses.append((node.lineno, f"{base}.{attr.value}"))
    return [f"{line}: {name}" for line, name in sorted(set(uses))]


def private_dagster_uses(source: str, filename: str = "<source>") -> list[str]:
    """`line: dotted name` of every private Dagster module or member the source uses."""
    return private_uses(source, filename, is_dagster)


def replacements(source: str, filename: str = "<source>") -> list[str]:
    """`line: what` of every place the source replaces what a library computes.

    Counted: a class that subclasses a GE metric provider (any class of `GE_METRICS`, or named
    `...MetricProvider`), which registers its metric in GE's registry, over GE's own if the
    name is taken; a call of a registering function of GE's registry; `inspect.unwrap` of, or
    `__wrapped__` on, a GE object (its implementation below GE's decorators); an assignment to
    an attribute of a Dagster, GE or scikit-learn module or member (`gx.x.y = ...`,
    `setattr(ColumnValuesBetween, ...)`, `del sklearn.x.y`).
    """
    tree = ast.parse(source, filename)
    names = Names(tree, is_library)
    found: list[tuple[int, str]] = []

    def ge(node: ast.expr) -> str | None:
        name = names.dotted(node)
        return name if name and is_ge(name) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = ge(base)
                if name and (name.startswith(f"{GE_METRICS}.") or name.endswith("MetricProvider")):
                    found.append((node.lineno, f"class {node.name}({name})"))
        elif isinstance(node, ast.Call):
            called = called_name(node)
            target = names.dotted(node.func)
            if target and target.startswith(f"{GE_REGISTRY}.") and "register" in target:
                found.append((node.lineno, f"{target}(...)"))
            if called == "unwrap" and node.args and ge(node.args[0]):
                found.append((node.lineno, f"unwrap({ge(node.args[0])})"))
            if called in ("setattr", "delattr") and isinstance(node.func, ast.Name) and node.args:
                name = names.dotted(node.args[0])
                if name:
                    found.append((node.lineno, f"{called}({name}, ...)"))
        elif isinstance(node, ast.Attribute) and node.attr == "__wrapped__" and ge(node.value):
            found.append((node.lineno, f"{ge(node.value)}.__wrapped__"))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and names.dotted(target.value):
                    found.append((node.lineno, f"{names.dotted(target)} assigned"))
    return [f"{line}: {what}" for line, what in sorted(set(found))]


@pytest.mark.parametrize(
    "source, found",
    [
        ("from dagster._core.x import y", ["1: dagster._core.x.y"]),
        ("import dagster._utils", ["1: dagster._utils"]),
        ("import dagster._utils as u", ["1: dagster._utils"]),
        ("from dagster import _check", ["1: dagster._check"]),
        ("from dagster_aws._s3 import client", ["1: dagster_aws._s3.client"]),
        ("import dagster\ndagster._core.events.ASSET_EVENTS", ["2: dagster._core"]),
        ("import dagster as dg\n\ndef f():\n    return dg._core.events", ["4: dagster._core"]),
        ("from dagster import AssetKey as K\nK._private", ["2: dagster.AssetKey._private"]),
        ("import importlib\nimportlib.import_module('dagster._grpc')", ["2: dagster._grpc"]),
        ("import dagster as dg\ngetattr(dg, '_serdes')", ["2: dagster._serdes"]),
    ],
)
def test_a_private_dagster_use_is_found(source, found):
    assert private_dagster_uses(source) == found


@pytest.mark.parametrize(
    "source, found",
    [
        (
            "from great_expectations.core._docs_decorators import public_api",
            ["1: great_expectations.core._docs_decorators.public_api"],
        ),
        (
            "import great_expectations as gx\ngx._docs_decorators",
            ["2: great_expectations._docs_decorators"],
        ),
        (
            "from great_expectations.expectations.metrics.column_map_metrics."
            "column_values_between import ColumnValuesBetween as B\nB._pandas",
            [
                "2: great_expectations.expectations.metrics.column_map_metrics."
                "column_values_between.ColumnValuesBetween._pandas"
            ],
        ),
        ("from sklearn.utils._testing import x", ["1: sklearn.utils._testing.x"]),
        ("import sklearn.linear_model._sgd_fast", ["1: sklearn.linear_model._sgd_fast"]),
        ("from sklearn.base import _fit_context", ["1: sklearn.base._fit_context"]),
        ("import importlib\nimportlib.import_module('sklearn._config')", ["2: sklearn._config"]),
        ("import sklearn\ngetattr(sklearn.utils, '_mask')", ["2: sklearn.utils._mask"]),
    ],
)
def test_a_private_ge_or_sklearn_use_is_found(source, found):
    assert private_uses(source) == found


def test_comments_strings_public_names_and_other_packages_are_not_uses():
    source = """
import dagster as dg
import great_expectations as gx
import pandas as pd
from sklearn.linear_model import SGDClassifier
# from dagster._core.events import ASSET_EVENTS
MESSAGE = "dagster._core.definitions.events.Failure: a.csv"
dg.Definitions(assets=[]).__class__
gx.__version__
SGDClassifier().coef_
pd.DataFrame()._mgr
"""
    assert private_uses(source) == []


BETWEEN = "great_expectations.expectations.metrics.column_map_metrics.column_values_between"


@pytest.mark.parametrize(
    "source, found",
    [
        (
            f"from {BETWEEN} import ColumnValuesBetween\nclass Mine(ColumnValuesBetween): pass",
            [f"2: class Mine({BETWEEN}.ColumnValuesBetween)"],
        ),
        (
            "from great_expectations.expectations.metrics import ColumnMapMetricProvider as P\n"
            "class Mine(P):\n    condition_metric_name = 'x'",
            ["2: class Mine(great_expectations.expectations.metrics.ColumnMapMetricProvider)"],
        ),
        (
            "import great_expectations as gx\n"
            "class Mine(gx.expectations.metrics.MetricProvider): pass",
            ["2: class Mine(great_expectations.expectations.metrics.MetricProvider)"],
        ),
        (
            f"import inspect\nfrom {BETWEEN} import ColumnValuesBetween as B\n"
            "inspect.unwrap(B._pandas)",
            [f"3: unwrap({BETWEEN}.ColumnValuesBetween._pandas)"],
        ),
        (
            f"from {BETWEEN} import ColumnValuesBetween as B\nB.x.__wrapped__",
            [f"2: {BETWEEN}.ColumnValuesBetween.x.__wrapped__"],
        ),
        (
            "from great_expectations.expectations.registry import register_metric\n"
            "register_metric('column_values.between', 'pandas', None, None, None)",
            ["2: great_expectations.expectations.registry.register_metric(...)"],
        ),
        (
            "import great_expectations.expectations.registry as r\nr._registered_metrics = {}",
            ["2: great_expectations.expectations.registry._registered_metrics assigned"],
        ),
        (
            f"from {BETWEEN} import ColumnValuesBetween as B\nsetattr(B, 'f', None)",
            [f"2: setattr({BETWEEN}.ColumnValuesBetween, ...)"],
        ),
        (
            "import sklearn.linear_model as lm\nlm.SGDClassifier.fit = None",
            ["2: sklearn.linear_model.SGDClassifier.fit assigned"],
        ),
        ("import dagster as dg\ndel dg.AssetKey", ["2: dagster.AssetKey assigned"]),
    ],
)
def test_a_replaced_library_computation_is_found(source, found):
    assert replacements(source) == found


def test_using_a_library_is_not_replacing_it():
    source = """
import great_expectations as gx
from great_expectations.render.view import DefaultJinjaPageView
from sklearn.linear_model import SGDClassifier

class Gate:
    def __init__(self):
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = None
        view = DefaultJinjaPageView()
        view.env.auto_reload = False
        model = SGDClassifier()
        model.coef_ = None

class Expectation(gx.expectations.ExpectColumnValuesToBeBetween):
    pass
"""
    assert replacements(source) == []


def checked_files() -> list:
    files = sorted(f for folder in CHECKED for f in (REPO / folder).rglob("*.py"))
    assert len(files) > 50, "the checked folders moved: point CHECKED at the code"
    return files


def test_no_private_module_of_dagster_ge_or_sklearn_is_used_anywhere():
    uses = {
        str(path.relative_to(REPO)): private_uses(path.read_text(), str(path))
        for path in checked_files()
    }
    assert {path: found for path, found in uses.items() if found} == {}


def test_no_library_computation_is_replaced_anywhere():
    found = {
        str(path.relative_to(REPO)): replacements(path.read_text(), str(path))
        for path in checked_files()
    }
    assert {path: f for path, f in found.items() if f} == {}
