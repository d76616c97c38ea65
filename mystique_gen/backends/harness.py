"""The harness modules' source, as it is inlined into generated files.

A generated file holds ``harness/runtime.py`` (and, when distributed, ``harness/dist.py``)
verbatim, less three things: the module docstring, the import statements (the file
imports what runtime.py imports, once, at its top) and the block between the
``# <generated-file>`` markers, which the file itself provides.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

from mystique_gen.harness import dist, runtime

BEGIN, END = "# <generated-file>", "# </generated-file>"


@dataclass(frozen=True)
class HarnessSource:
    imports: list[str]  # runtime.py's import block, line by line
    runtime: list[str]  # runtime.py's code
    dist: list[str]  # dist.py's code


@lru_cache(maxsize=1)
def harness_source() -> HarnessSource:
    imports, body = _split(runtime)
    dist_imports, dist_body = _split(dist)
    missing = set(dist_imports) - set(imports)
    if missing:  # a bug of this package, caught by the tests
        raise AssertionError(f"harness/dist.py imports what runtime.py does not: {missing}")
    return HarnessSource(imports, body, dist_body)


def _split(module: ModuleType) -> tuple[list[str], list[str]]:
    """(import lines, code lines) of a harness module."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    tree = ast.parse(source)
    dropped: set[int] = set()  # 0-based line numbers
    imports: list[str] = []
    for k, node in enumerate(tree.body):
        span = range(node.lineno - 1, (node.end_lineno or node.lineno))
        docstring = (k == 0 and isinstance(node, ast.Expr)
                     and isinstance(node.value, ast.Constant))
        if docstring or isinstance(node, (ast.Import, ast.ImportFrom)):
            dropped.update(span)
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
                isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "mystique_gen")):  # one harness module's of the other: inlined
            imports.append("\n".join(lines[i] for i in span))
    begin, end = lines.index(BEGIN), lines.index(END)
    dropped.update(range(begin, end + 1))
    code = "\n".join(line for i, line in enumerate(lines) if i not in dropped)
    code = re.sub(r"\n{4,}", "\n\n\n", code.strip("\n"))  # at most two blank lines
    return _grouped(imports), code.splitlines()


def _grouped(statements: list[str]) -> list[str]:
    """Import lines: the standard library's, then torch's, a blank line between (as
    isort and black lay them out)."""
    torch_ones = [s for s in statements if s.startswith(("import torch", "from torch"))]
    stdlib = [s for s in statements if s not in torch_ones]
    blank = [""] if stdlib and torch_ones else []
    return "\n".join(stdlib + blank + torch_ones).splitlines()


# Module-level names of the generated file besides the harness's own (templates).
FILE_NAMES = frozenset({"GENERATOR", "TRACE", "OPS", "RECORDED_DEVICE", "DEFAULT_DEVICE",
                        "REQUIRED_BYTES", "HOST_BYTES", "ORIGINAL", "_FALLBACKS",
                        "_INPUTS_ONLY_FOR", "_JOB", "WORLD_SIZE",
                        "PROCESS_GROUPS", "RANKS", "make_inputs", "replay"})


@lru_cache(maxsize=1)
def reserved_names() -> frozenset[str]:
    """Every module-level name of a generated file (the harness's definitions and
    imports, the template's constants): a local of the same name would shadow it."""
    names = set(FILE_NAMES)
    for module in (runtime, dist):
        for node in ast.parse(inspect.getsource(module)).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)
