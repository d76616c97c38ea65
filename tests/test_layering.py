"""The package's imports go one way: each layer imports only the layers below it.

    harness < core (errors, diagnostics, constants, options, progress) < ir < sources < oprules
    < passes < backends < driver < tools < cli

No module imports inside a function (except optional dependencies such as
matplotlib), so the module graph read here is the whole graph, and it has no cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mystique_gen"

# Lowest first. A module's layer is its first path component under mystique_gen/.
LAYERS: list[set[str]] = [
    {"harness"},
    {"__init__", "errors", "diagnostics", "constants", "options", "progress"},
    {"ir"},
    {"sources"},
    {"oprules"},
    {"passes"},
    {"backends"},
    {"driver"},
    {"tools"},
    {"cli", "__main__"},
]
OPTIONAL = {"matplotlib"}  # optional dependencies may be imported where they are used
LEAVES = {"harness"}  # run inside generated files: the standard library and torch only


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): p
            for p in PACKAGE.rglob("*.py")}


def _layer(module: str) -> int:
    head = module.split(".")[1] if "." in module else "__init__"
    for rank, names in enumerate(LAYERS):
        if head in names:
            return rank
    raise AssertionError(f"{module}: not in any layer of tests/test_layering.py")


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) of every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, nested) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                base = child.module
                found.append((base, child.lineno, nested))
                found.extend((f"{base}.{a.name}", child.lineno, nested)
                             for a in child.names)
            visit(child, inner)

    visit(tree, False)
    return found


def _graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target, _line, _nested in _imports(path):
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)


def test_layers_import_downwards_only():
    bad = [f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
           for a, b in _graph().edges if _layer(b) > _layer(a)]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    cycles = list(nx.simple_cycles(_graph()))
    assert not cycles, cycles[:5]


# Run as a `sitecustomize` by every process a capture starts, not imported by the
# package: it imports the capture from the folder it is given, once it knows it.
BOOTSTRAP = PACKAGE / "tools" / "bootstrap" / "sitecustomize.py"


def test_no_imports_inside_functions():
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
           for path in _modules().values() if path != BOOTSTRAP
           for target, line, nested in _imports(path)
           if nested and target.split(".")[0] not in OPTIONAL]
    assert not bad, "\n".join(bad)


def test_every_package_is_installed():
    """pyproject.toml lists the packages a wheel holds: a subpackage missing there is
    absent from a non-editable install (`pip install .`), and importing the CLI fails."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    packages = {".".join(p.parent.relative_to(PACKAGE.parent).parts)
                for p in PACKAGE.rglob("__init__.py")}
    assert packages - listed == set(), "add them to [tool.setuptools] packages"


def test_harness_imports_only_the_standard_library_and_torch():
    harness = [p for m, p in _modules().items() if m.split(".")[1:2] == ["harness"]]
    if not harness:
        pytest.skip("no harness package yet")
    for path in harness:
        for target, line, _nested in _imports(path):
            top = target.split(".")[0]
            assert top == "torch" or top in _stdlib() or target.startswith(
                "mystique_gen.harness"), f"{path.name}:{line} imports {target}"


def _stdlib() -> frozenset[str]:
    return frozenset(sys.stdlib_module_names) | {"__future__"}


def test_the_checker_sees_a_real_violation(tmp_path):
    """The AST reader finds imports at every depth (so the tests above can fail)."""
    path = tmp_path / "m.py"
    path.write_text("import os\ndef f():\n    from mystique_gen import driver\n")
    assert _imports(path) == [("os", 1, False), ("mystique_gen", 3, True),
                              ("mystique_gen.driver", 3, True)]
