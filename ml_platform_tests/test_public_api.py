"""The platform, its tests and its benchmarks use Dagster's public API only.

Private modules (`dagster._core`, `dagster_aws._...`) change without notice between releases, so
code that reaches into them breaks silently on an upgrade. The code is parsed, not grepped: a
comment or a string that names a private module is not a use of it.
"""

import ast

import pytest

from ml_platform_tests.conftest import REPO

CHECKED = ("ml_platform", "ml_platform_tests", "benchmarks")


def is_dagster(module: str) -> bool:
    """Whether a dotted name lies in Dagster or one of its integrations (dagster_aws, ...)."""
    top = module.split(".")[0]
    return top == "dagster" or top.startswith("dagster_")


def is_private(name: str) -> bool:
    """`_core`, not `__version__`: one leading underscore marks a private module or member."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_dagster_uses(source: str, filename: str = "<source>") -> list[str]:
    """`line: dotted name` of every private Dagster module or member the source uses.

    Counted: `import dagster._x`, `from dagster._x import y`, `from dagster import _x`,
    attributes reached from a Dagster module (`dg._core.events`, after `import dagster as dg`),
    and `importlib.import_module("dagster._x")` or `getattr(dg, "_x")`.
    """
    tree = ast.parse(source, filename)
    # Local name -> the Dagster module or member it is bound to, over the whole file: an
    # import inside a function binds the name there just as well.
    bound: dict[str, str] = {}
    uses: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_dagster(alias.name):
                    if any(is_private(part) for part in alias.name.split(".")):
                        uses.append((node.lineno, alias.name))
                    top = alias.name.split(".")[0]
                    bound[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and is_dagster(node.module):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if any(is_private(part) for part in full.split(".")):
                    uses.append((node.lineno, full))
                bound[alias.asname or alias.name] = full

    def dotted(node: ast.expr) -> str | None:
        """The Dagster dotted name an expression spells (`dg.x.y`), if it spells one."""
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            name = dotted(node)
            if name:
                uses.append((node.lineno, name))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if called in ("import_module", "__import__") and isinstance(first, ast.Constant):
                module = str(first.value)
                if is_dagster(module) and any(is_private(p) for p in module.split(".")):
                    uses.append((node.lineno, module))
            if called == "getattr" and len(node.args) > 1:
                base, attr = dotted(first), node.args[1]
                if base and isinstance(attr, ast.Constant) and is_private(str(attr.value)):
                    uses.append((node.lineno, f"{base}.{attr.value}"))
    return [f"{line}: {name}" for line, name in sorted(set(uses))]


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


def test_comments_strings_public_names_and_other_packages_are_not_uses():
    source = """
import dagster as dg
import pandas as pd
# from dagster._core.events import ASSET_EVENTS
MESSAGE = "dagster._core.definitions.events.Failure: a.csv"
dg.Definitions(assets=[]).__class__
pd.DataFrame()._mgr
"""
    assert private_dagster_uses(source) == []


def test_no_private_dagster_module_is_used_anywhere():
    files = sorted(f for folder in CHECKED for f in (REPO / folder).rglob("*.py"))
    assert len(files) > 50, "the checked folders moved: point CHECKED at the code"
    uses = {
        str(path.relative_to(REPO)): private_dagster_uses(path.read_text(), str(path))
        for path in files
    }
    assert {path: found for path, found in uses.items() if found} == {}
