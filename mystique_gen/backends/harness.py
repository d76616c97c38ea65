"""The harness modules' source, as it is inlined into generated files.

A generated file holds ``harness/equivalents.py`` and ``harness/runtime.py``, in that
order (and, when distributed, ``harness/dist.py``) verbatim, less three things: the
module docstrings, the import statements (the file imports what runtime.py imports,
once, at its top) and the block between the ``# <generated-file>`` markers, which the
file itself provides.

Then :func:`shaken` keeps of it what the file uses, as a compiler links only the
functions a program calls: the top-level statements whose names the file's own code
reads, directly or through other kept statements, and of the tables of operators'
equivalents (``PORTABLE``, ``_EQUIVALENTS``) the entries of operators the file calls.
An MLP's benchmark held 4,485 lines, 2,100 of them kernels for cuDNN, FlashAttention,
torchvision and fbgemm that it never runs.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from types import ModuleType

from mystique_gen.harness import dist, equivalents, runtime

BEGIN, END = "# <generated-file>", "# </generated-file>"


@dataclass(frozen=True)
class HarnessSource:
    imports: list[str]  # runtime.py's import block, line by line
    runtime: list[str]  # equivalents.py's code, then runtime.py's
    dist: list[str]  # dist.py's code


@lru_cache(maxsize=1)
def harness_source() -> HarnessSource:
    imports, body = _split(runtime)
    (kernel_imports, kernels), (dist_imports, dist_body) = _split(equivalents), _split(dist)
    for name, theirs in (("equivalents", kernel_imports), ("dist", dist_imports)):
        missing = set(theirs) - set(imports)
        if missing:  # a bug of this package, caught by the tests
            raise AssertionError(f"harness/{name}.py imports what runtime.py does not: "
                                 f"{missing}")
    # The equivalents first: runtime.py's top level reads their tables.
    return HarnessSource(imports, [*kernels, "", "", *body], dist_body)


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
    if BEGIN in lines:  # (equivalents.py provides nothing of the file's)
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


# Tables of operators' equivalents, by operator name ("ns::name.overload"): a file keeps
# the entries of the operators it calls.
OP_TABLES = frozenset({"PORTABLE", "_EQUIVALENTS"})
# The names a file's own code may read of the harness: every one starts with "_" or a
# capital, or is one of the few entry points (main) always kept. Scanning for those
# only (an "_" then word characters: a literal to search for) reads a 1M-op file's
# text 3x faster than every identifier, and does not build millions of strings.
_PRIVATE, _CAPITAL = re.compile(r"_\w+"), re.compile(r"[A-Z]\w*")
_OP_NAME = re.compile(r'"([A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*)\.')


@dataclass(frozen=True)
class _Entry:
    """One ``"ns::name.overload": value`` entry of an operator table."""

    op: str  # "ns::name", any overload of which keeps the entry
    lines: tuple[str, ...]  # its source lines, the comments just above it included
    uses: frozenset[str]


@dataclass(frozen=True)
class _Unit:
    """A top-level statement of harness code with the lines above it (comments, blank
    lines), the names it binds and the names it reads."""

    lines: tuple[str, ...]
    binds: frozenset[str]
    uses: frozenset[str]
    table: tuple[_Entry, ...] | None = None  # an operator table's entries


def _names(node: ast.AST) -> frozenset[str]:
    return frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))


def _binds(node: ast.stmt) -> frozenset[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return frozenset({node.name})
    targets = (node.targets if isinstance(node, ast.Assign) else
               [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
    return frozenset(n.id for t in targets for n in ast.walk(t)
                     if isinstance(n, ast.Name))


@lru_cache(maxsize=4)
def _units(code: tuple[str, ...]) -> tuple[_Unit, ...]:
    """``code`` (harness lines) as top-level units, in order."""
    tree = ast.parse("\n".join(code))
    units: list[_Unit] = []
    start = 0
    for node in tree.body:
        end = node.end_lineno or node.lineno
        binds = _binds(node)
        if binds & OP_TABLES and isinstance(node, ast.Assign) \
                and isinstance(node.value, ast.Dict):
            # (a table's own lines end at its first, `NAME = {`; its entries follow)
            units.append(_Unit(tuple(code[start:node.lineno]), binds, frozenset(),
                               _table(code, node.value)))
        else:
            units.append(_Unit(tuple(code[start:end]), binds, _names(node)))
        start = end
    return tuple(units)


def _table(code: tuple[str, ...], table: ast.Dict) -> tuple[_Entry, ...]:
    """The entries of an operator table written one (or one wrapped) per line, each with
    the comment lines just above it."""
    ops: list[str] = []
    starts: list[int] = []  # each entry's first line (1-based), its comments included
    for key in table.keys:
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)
                and "::" in key.value):
            raise AssertionError(f"harness: an operator table's key is no operator name "
                                 f"(line {getattr(key, 'lineno', '?')})")
        ops.append(key.value.rpartition(".")[0])
        first = key.lineno
        while code[first - 2].lstrip().startswith("#"):
            first -= 1
        starts.append(first)
    # An entry runs to the next one's first line, the last to the table's `}` (a value
    # in parentheses ends after its node).
    ends = starts[1:] + [table.end_lineno or 0]
    return tuple(_Entry(op, tuple(code[start - 1:end - 1]), _names(value))
                 for op, value, start, end in zip(ops, table.values, starts, ends,
                                                  strict=True))


def called_ops(text: str) -> frozenset[str]:
    """The operators (``ns::name``) a generated file's code names in string literals,
    as its operator handles do (``_op(..., "aten::relu.default")``)."""
    return frozenset(_OP_NAME.findall(text))


def shaken(code: list[str], also: list[str], text: str) -> tuple[list[str], list[str]]:
    """Of the harness lines ``code`` (runtime.py's) and ``also`` (dist.py's, or none),
    what a file whose own code is ``text`` uses: each top-level statement that binds a
    name the file reads, or a kept statement reads, or that binds none (it runs for
    its effect); each operator table with the entries of the operators ``text`` names.
    The names read are every name of the harness in ``text``, comments and strings
    included: at worst a statement more is kept."""
    parts = [_units(tuple(code)), _units(tuple(also))]
    ops = called_ops(text)
    binders: dict[str, list[_Unit]] = {}
    for unit in (u for units in parts for u in units):
        for name in unit.binds:
            binders.setdefault(name, []).append(unit)
    kept: set[int] = set()
    todo = [u for units in parts for u in units if not u.binds]
    found = (set(_PRIVATE.findall(text)) | set(_CAPITAL.findall(text))) & binders.keys()
    named = {name for name in found if _a_word_in(name, text)}
    named |= {name for name in binders if not name.startswith("_") and not name[0].isupper()}
    todo += [u for name in named for u in binders.get(name, ())]
    while todo:
        unit = todo.pop()
        if id(unit) in kept:
            continue
        kept.add(id(unit))
        uses = unit.uses if unit.table is None else frozenset().union(
            *(e.uses for e in unit.table if e.op in ops))
        todo += [u for name in uses for u in binders.get(name, ())]
    return _lines(parts[0], kept, ops), _lines(parts[1], kept, ops)


def _a_word_in(name: str, text: str) -> bool:
    """Whether ``name`` stands in ``text`` as a word of its own, not as a part of one
    (``_stream`` in ``two_stream.et.json``, ``_fit`` in ``_fit_mask``)."""
    def word(i: int) -> bool:
        return 0 <= i < len(text) and (text[i].isalnum() or text[i] == "_")

    return any(not word(m.start() - 1) and not word(m.end())
               for m in re.finditer(re.escape(name), text))


def _lines(units: tuple[_Unit, ...], kept: set[int], ops: frozenset[str]) -> list[str]:
    lines: list[str] = []
    for unit in units:
        if id(unit) not in kept:
            continue
        if unit.table is None:
            lines += unit.lines
            continue
        entries = [line for e in unit.table if e.op in ops for line in e.lines]
        if entries:
            lines += [*unit.lines, *entries, "}"]
        else:  # (black writes an empty table on one line)
            lines += [*unit.lines[:-1], unit.lines[-1].rstrip() + "}"]
    code = re.sub(r"\n{4,}", "\n\n\n", "\n".join(lines).strip("\n"))
    return code.splitlines()


def shaken_source(source: HarnessSource, text: str, *, dist: bool) -> HarnessSource:
    """``source`` with only what the file whose own code is ``text`` uses (dist.py's
    code too where ``dist``, else none of it)."""
    runtime_lines, dist_lines = shaken(source.runtime, source.dist if dist else [], text)
    return replace(source, runtime=runtime_lines, dist=dist_lines)


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
    for module in (equivalents, runtime, dist):
        for node in ast.parse(inspect.getsource(module)).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)
