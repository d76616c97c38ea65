"""Safety check of a generated file: it parses, and every call goes to torch or the harness.

A trace is untrusted input; the emitter writes its values only as literals. This
check is the second line of defence, run on every file :func:`render` produces:

* the file parses (checked piece by piece, see below);
* every ``import`` is one the template itself makes;
* every call target is one of: a public attribute of ``torch`` that loads nothing
  (:func:`torch_chain_ok`; ``torch.ops.<namespace>.<op>[.<overload>]`` included), a
  top-level definition of the template (the harness: derived from the template
  itself, so harness functions added later are allowed automatically), an operator
  handle (a module-level name bound by calling a harness function on a lambda that
  returns a ``torch.ops`` attribute chain or a public name of an operator's C++
  binding, see :func:`~mystique_gen.passes.public_calls.public_chain_ok`), a
  ``torch.Tensor`` method, a call the template itself makes (``print``,
  ``parser.add_argument``, ...), or ``float`` of ``"inf"``/``"-inf"``/``"nan"``.

Parsing a whole 35,000-line file builds an AST of about a hundred times the text's
size, so the file is parsed in pieces of at most :data:`PIECE_BYTES`: top-level
statements, and big function bodies split at statement boundaries (each body piece
parsed under ``if True:``). A cut in the wrong place (inside a string, before
``else:``) makes a piece fail to parse; it is then merged with the next piece. So
nothing whole-file parsing rejects is accepted; the converse holds for files whose
big functions have no line at column 0, which the emitter never writes.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from mystique_gen.errors import MystiqueError
from mystique_gen.ir.schema import op_attribute_ok
from mystique_gen.passes.public_calls import public_chain_ok

PIECE_BYTES = 16 * 1024
# Lines that may start a statement at the top level, and inside a function body; never
# before a clause that continues the previous statement (a piece cannot start with it).
_CONTINUATION = r"(?!(?:elif|else|except|finally)\b)"
_TOP_CUT = re.compile(_CONTINUATION + r"[A-Za-z_@#\"']")
_BODY_CUT = re.compile(r"    " + _CONTINUATION + r"[A-Za-z_#]")
_FLOAT_SPECIALS = frozenset({"inf", "-inf", "nan"})


class UnsafeCodeError(MystiqueError):
    """The generated text failed the safety check: a generator bug, reported as such."""


@dataclass
class Facts:
    """What one file defines and calls, gathered piece by piece."""

    defs: set[str] = field(default_factory=set)  # top-level def/class names
    imports: set[str] = field(default_factory=set)  # "os", "torch.profiler:profile"
    handles: set[str] = field(default_factory=set)  # operator handle names
    calls: list[tuple[int, tuple[str, str], ast.Call | None]] = field(default_factory=list)


def check_source(text: str, reference: Facts) -> None:
    """Raise :class:`UnsafeCodeError` unless ``text`` parses and calls only allowed targets.

    ``reference`` is the facts of the backend's own template rendered for a program of
    no ops (``reference_facts()`` of backends/single.py and backends/distributed.py).
    """
    facts = gather(text)
    for imp in sorted(facts.imports - reference.imports):
        raise UnsafeCodeError(f"internal error: generated code imports {imp}")
    allowed_names = reference.defs | facts.handles
    template_calls = {desc for _line, desc, _node in reference.calls}
    for line, desc, node in facts.calls:
        if not _allowed(desc, node, allowed_names, template_calls, reference.imports):
            raise UnsafeCodeError(
                f"internal error: generated code line {line} calls {desc[1][:60]!r}, "
                "which is neither torch nor the harness")


def gather(text: str) -> Facts:
    """Parse ``text`` piecewise and collect its definitions, imports and calls."""
    facts = Facts()
    for offset, tree, top in _pieces(text):
        if top:
            _top_level(tree, facts)
        for node in _walk(tree):
            if isinstance(node, ast.Call):
                facts.calls.append((node.lineno + offset, describe(node.func),
                                    node if _needs_node(node) else None))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                facts.imports.update(_import_names(node))
    return facts


_LEAVES = (ast.Constant, ast.Name, ast.expr_context, ast.alias, ast.operator,
           ast.unaryop, ast.cmpop, ast.boolop)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _walk(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that may be or hold a call or an import: ``ast.walk`` without
    descending into leaves (names, constants, contexts), three times faster on the
    long lists of constants a generated file is mostly made of."""
    stack = [tree]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        node = pop()
        yield node
        cls = node.__class__
        fields = _FIELDS.get(cls)
        if fields is None:
            fields = _FIELDS[cls] = tuple(f for f in cls._fields if f not in ("ctx", "op"))
        for name in fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                extend(v for v in value if isinstance(v, ast.AST) and not isinstance(v, _LEAVES))
            elif isinstance(value, ast.AST) and not isinstance(value, _LEAVES):
                push(value)


def describe(func: ast.expr) -> tuple[str, str]:
    """A call target as ``(kind, text)``: ("name", "print"), ("attr", "torch.ops.aten.mm"),
    ("method", "splitlines") for a method of a computed value, or ("expr", node type)."""
    if isinstance(func, ast.Name):
        return ("name", func.id)
    if isinstance(func, ast.Attribute):
        chain = _chain(func)
        if chain is not None:
            return ("attr", chain)
        return ("method", func.attr)
    return ("expr", type(func).__name__)


def _chain(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def torch_chain_ok(chain: str) -> bool:
    """Whether a ``torch.`` attribute chain is a call generated code may make.

    Under ``torch.ops``: ``<namespace>.<name>[.<overload>]`` where Python's own
    attributes of the namespace objects are refused (``load_library``, ``__class__``;
    a dunder operator name such as ``aten::__and__`` is real). Elsewhere: public
    attributes only, and nothing that loads code or data from outside the file
    (``torch.load``, ``torch.hub``, ``torch.utils.cpp_extension`` ...)."""
    parts = chain.split(".")
    if parts[0] != "torch" or len(parts) < 2:
        return False
    if parts[1] == "ops":
        if len(parts) < 4 or len(parts) > 5 or parts[2] in _OPS_ATTRIBUTES:
            return False
        return op_attribute_ok(parts[2], parts[3], parts[4] if len(parts) == 5 else None)
    return not any(p.startswith("_") or p in _LOADERS for p in parts[1:])


# torch.ops's own methods: not operator namespaces.
_OPS_ATTRIBUTES = frozenset({"load_library", "import_module", "loaded_libraries"})
# Entry points that load code or pickled data: never called by generated code.
_LOADERS = frozenset({"load", "load_library", "load_inline", "hub", "package",
                      "cpp_extension", "serialization", "rpc", "from_file", "import_module",
                      "compile", "export"})


def _allowed(desc: tuple[str, str], node: ast.Call | None, names: set[str],
             template_calls: set[tuple[str, str]], imports: set[str]) -> bool:
    kind, text = desc
    if kind == "name":
        if text == "float":  # only float("inf"), float("-inf"), float("nan"), wherever used
            return node is not None and _float_special(node)
        return text in names or desc in template_calls
    if kind == "attr":
        if desc in template_calls:
            return True
        if text.split(".", 1)[0] == "torch":
            return torch_chain_ok(text)
        root, method = text.split(".", 1)[0], text.rsplit(".", 1)[1]
        modules = {i.split(":", 1)[0].split(".", 1)[0] for i in imports}
        if root in modules or root in names or "." in text.split(".", 1)[1]:
            return False  # a module's function the template never calls
        return _tensor_method(method)
    if kind == "method":
        return desc in template_calls or _tensor_method(text)
    return desc in template_calls


def _tensor_method(name: str) -> bool:
    return not name.startswith("_") and callable(getattr(torch.Tensor, name, None))


def _needs_node(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Name) and node.func.id == "float"


def _float_special(node: ast.Call) -> bool:
    return (len(node.args) == 1 and not node.keywords
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in _FLOAT_SPECIALS)


def _import_names(node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"
    else:
        for alias in node.names:
            yield f"{'.' * node.level}{node.module or ''}:{alias.name}"


def _top_level(tree: ast.Module, facts: Facts) -> None:
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            facts.defs.add(stmt.name)
        elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
              and isinstance(stmt.targets[0], ast.Name) and _is_handle(stmt.value)):
            facts.handles.add(stmt.targets[0].id)


def _is_handle(value: ast.expr) -> bool:
    """``_op(lambda: torch.ops.ns.name.overload, "ns::name.overload")``-like bindings, or
    ``_op(lambda: torch.add, ...)`` where ``torch.add`` is an operator's C++ binding."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
        return False
    lambdas = [a for a in value.args if isinstance(a, ast.Lambda)]
    if len(lambdas) != 1 or value.keywords:
        return False
    body = lambdas[0].body
    chain = _chain(body) if isinstance(body, ast.Attribute) else None
    others_constant = all(isinstance(a, (ast.Lambda, ast.Constant)) for a in value.args)
    if chain is None or not others_constant:
        return False
    if chain.startswith("torch.ops."):
        return torch_chain_ok(chain)
    return public_chain_ok(chain)


def _pieces(text: str) -> Iterator[tuple[int, ast.Module, bool]]:
    """(line offset, parsed piece, is_module_level) for the whole text, in order."""
    lines = text.splitlines(keepends=True)
    ends = [0]
    for line in lines:
        ends.append(ends[-1] + len(line))
    first = 0
    if text.startswith('"""'):  # no statement starts inside the module docstring
        close = text.find('"""', 3)
        first = next((i for i, e in enumerate(ends) if e > close), 0) if close > 0 else 0
    cuts = [i for i in range(first + 1, len(lines)) if _TOP_CUT.match(lines[i])]
    cuts.append(len(lines))
    s, k = 0, 0
    while s < len(lines):
        e = cuts[k]
        if lines[s].startswith("def ") and ends[e] - ends[s] > PIECE_BYTES:
            # A big function (the replay): its header with the first statement, then
            # body pieces parsed under ``if True:``, never the whole body at once.
            body_cuts = [i for i in range(s + 1, e) if _BODY_CUT.match(lines[i])]
            for ps, _pe, piece in _merged(lines, ends, s, e, body_cuts[1:], grow=True):
                yield (ps, piece, True) if ps == s else (ps - 1, piece, False)
        else:
            for ps, pe, piece in _merged(lines, ends, s, len(lines), cuts[k:], grow=False):
                yield ps, piece, True
                e = pe
                break
            k = cuts.index(e, k)
        s = e
        k += 1


def _merged(lines: list[str], ends: list[int], start: int, end: int, cuts: list[int],
            grow: bool) -> Iterator[tuple[int, int, ast.Module]]:
    """Consecutive ranges [s, e) of ``lines[start:end]`` with their parse trees.

    Ranges end at a cut candidate; with ``grow`` they take as many candidates as fit in
    PIECE_BYTES. A range that does not parse is extended to the next candidate; at
    ``end`` its parse error is final. Ranges after the first are parsed under
    ``if True:`` when ``grow`` is set (they are pieces of a function body).
    """
    cuts = [c for c in cuts if start < c < end] + [end]
    s, k = start, 0
    while s < end:
        if grow:
            while k + 1 < len(cuts) and ends[cuts[k + 1]] - ends[s] <= PIECE_BYTES:
                k += 1
        wrap = "if True:\n" if grow and s != start else ""
        while True:
            e = cuts[k]
            source = wrap + "".join(lines[s:e])
            if e == end:
                tree = _parse(source, s - (1 if wrap else 0))
                break
            tree = _try_parse(source)
            if tree is not None:
                break
            k += 1
        yield s, e, tree
        s = e
        k += 1


def _try_parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, RecursionError, MemoryError):
        return None


def _parse(piece: str, offset: int) -> ast.Module:
    try:
        return ast.parse(piece)
    except SyntaxError as exc:
        line = (exc.lineno or 0) + offset
        raise UnsafeCodeError(
            f"internal error: generated code does not parse at line {line}: {exc.msg}"
        ) from None
    except (RecursionError, MemoryError):
        raise UnsafeCodeError("internal error: generated code nests too deeply") from None
