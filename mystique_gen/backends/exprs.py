"""Emitter functions: every expression string in a generated file comes from here.

Each function is small and unit-tested; values from a trace are data and are only
ever written as literals (``repr``-safe strings, checked numbers), never as code.
"""

from __future__ import annotations

import math
import re

from mystique_gen.backends.layout import Atom, Group, Keyword, Node

_SAFE_COMMENT = re.compile(r"[^A-Za-z0-9 _.,:;#@<>()\[\]{}|/+*=!?&%$~^'\"-]")


def str_literal(text: str) -> str:
    """A string literal quoted as black would: double quotes unless that needs more
    escapes than the single-quoted form."""
    r = repr(text)
    if r.startswith('"'):
        return r  # repr chose double quotes: the text has ' but no "
    body = r[1:-1]
    swapped = body.replace("\\'", "'").replace('"', '\\"')
    if swapped.count('\\"') > body.count("\\'"):
        return r
    return '"' + swapped + '"'


def float_literal(value: float) -> str:
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else '-float("inf")'
    return repr(value).replace("e+", "e")


def scalar_literal(value: object) -> str:
    """A Python literal for a recorded scalar: None, bool, int, float, complex or str."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        return float_literal(value)
    if isinstance(value, complex):
        return complex_literal(value)
    if isinstance(value, str):
        return str_literal(value)
    raise TypeError(f"not a scalar literal: {type(value).__name__}")


def complex_literal(value: complex) -> str:
    """``(1.0 + 0.5j)``, spaced as black spaces it; the imaginary part must be finite."""
    if not math.isfinite(value.imag):
        raise ValueError(f"no literal for a complex number with imaginary part {value.imag}")
    sign = "-" if value.imag < 0 else "+"
    return f"({float_literal(value.real)} {sign} {float_literal(abs(value.imag))}j)"


def int_list(values: tuple[int, ...] | list[int]) -> Node:
    return Group("[", tuple(Atom(repr(int(v))) for v in values), "]", literal=True)


def int_tuple(values: tuple[int, ...] | list[int]) -> Node:
    """A tuple display of ints, ``(3, 0)``; one item keeps its comma, ``(3,)``."""
    items = [repr(int(v)) for v in values]
    return Atom("(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")")


def list_display(items: list[Node] | tuple[Node, ...]) -> Node:
    return Group("[", tuple(items), "]", literal=True)


def call(callee: str, args: list[Node] | tuple[Node, ...]) -> Group:
    return Group(callee + "(", tuple(args), ")")


def keyword(name: str, value: Node) -> Node:
    return Keyword(name, value)


def dict_entry(key: str, value: Node) -> Node:
    """``"key": value`` in a dict display: the value splits as black splits it."""
    return Keyword(str_literal(key), value, ": ")


def torch_attr(name: str) -> str:
    if not name.isidentifier():
        raise ValueError(f"not a torch attribute: {name!r}")
    return f"torch.{name}"


def comment(text: str, limit: int = 76) -> str:
    """A one-line comment: trace text reduced to a safe character set, never a newline."""
    clean = _SAFE_COMMENT.sub("?", text.replace("\n", " "))
    if len(clean) > limit:
        clean = clean[: limit - 3] + "..."
    return "# " + clean


def docstring_line(text: str, limit: int = 84) -> str:
    """Text for the module docstring: printable ASCII, no quotes that could end it."""
    clean = _SAFE_COMMENT.sub("?", text.replace("\n", " ")).replace('"""', "'''")
    clean = clean.replace("\\", "/")
    if len(clean) > limit:
        clean = clean[: limit - 3] + "..."
    return clean.rstrip()


def without_history(name: str, storageless: bool = False) -> str:
    """The same tensor without its autograd history: ``.data`` records no op (a
    ``detach()`` would add one to the replay's trace); a sparse or MKLDNN tensor's
    does (its shallow copy's empty indices and values), so it is the harness's work
    there (``_without_history``)."""
    return f"_without_history({name})" if storageless else f"{name}.data"
