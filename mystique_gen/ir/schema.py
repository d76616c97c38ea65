"""Operator schemas: validate operator names and parse recorded schema strings.

The parser is PyTorch's own (``torch._C.parse_schema``), the same one the dispatcher
uses, so every schema the recording PyTorch could write is read exactly. Operator
names are checked against the operator-name grammar *before* anything else, because
they end up in generated code.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
OP_NAME_RE = re.compile(rf"^({IDENT})::({IDENT})(?:\.({IDENT}))?$")


@dataclass(frozen=True)
class ArgSpec:
    name: str
    type: str  # the real type, e.g. "Optional[ScalarType]", "List[Tensor]"
    kwarg_only: bool
    writes: bool  # annotated Tensor(a!)
    has_default: bool
    # The schema's default where it is a plain Python value (``bool non_blocking=False``,
    # ``MemoryFormat? memory_format=None``), which a call may leave out
    # (passes/public_calls.py); has_scalar_default says whether there is one.
    scalar_default: bool | int | float | str | None = None
    has_scalar_default: bool = False


@dataclass(frozen=True)
class Signature:
    namespace: str
    name: str
    overload: str  # "default" where the schema names none
    args: tuple[ArgSpec, ...]
    returns: tuple[str, ...]
    # Every return aliases an argument it does not write (``Tensor(a) self ->
    # Tensor(a)``): a view, which reads no data.
    is_view: bool = False

    # Cached (signatures are shared and immutable): Op.name asks for it millions of
    # times on a big trace.
    @cached_property
    def qualified_name(self) -> str:
        return f"{self.namespace}::{self.name}"

    @property
    def full_name(self) -> str:
        return f"{self.namespace}::{self.name}.{self.overload}"

    @cached_property
    def written(self) -> tuple[int, ...]:
        """Positions of the arguments the op writes (``Tensor(a!)``)."""
        return tuple(i for i, a in enumerate(self.args) if a.writes)


class SchemaError(ValueError):
    pass


def split_op_name(name: str) -> tuple[str, str, str | None]:
    """``'aten::add_.Tensor'`` -> ``('aten', 'add_', 'Tensor')``; SchemaError if not an op name."""
    m = OP_NAME_RE.fullmatch(name)  # not match: "$" also matches before a final newline
    if not m or not op_attribute_ok(m.group(1), m.group(2), m.group(3)):
        raise SchemaError(f"{name[:80]!r} is not a valid operator name")
    return m.group(1), m.group(2), m.group(3)


# Attributes Python itself finds on a ``torch.ops`` namespace (a module subclass) before
# the dispatcher is asked: ``torch.ops.aten.__class__`` is a class, not an operator.
_PYTHON_ATTRIBUTES = frozenset(dir(types.ModuleType)) | frozenset(dir(object)) | {
    "__dict__", "__name__", "__doc__", "__package__", "__loader__", "__spec__", "__file__",
    "__path__", "__builtins__", "__globals__", "__all__", "__wrapped__", "__self__",
    "__func__", "__code__", "__closure__", "__origin__",
}


def op_attribute_ok(namespace: str, name: str, overload: str | None) -> bool:
    """Whether ``torch.ops.<namespace>.<name>[.<overload>]`` names an operator and not a
    Python attribute. Dunder names are real operators (``aten::__and__``) but never
    namespaces or overloads."""
    if namespace.startswith("__") or (overload or "").startswith("__"):
        return False
    return name not in _PYTHON_ATTRIBUTES


def is_op_name(name: str) -> bool:
    try:
        split_op_name(name)
    except SchemaError:
        return False
    return True


def _arg_spec(a: torch.Argument) -> ArgSpec:
    scalar = _is_scalar_default(a)
    return ArgSpec(
        name=a.name,
        type=str(a.real_type),
        kwarg_only=a.kwarg_only,
        writes=bool(a.alias_info is not None and a.alias_info.is_write),
        has_default=a.default_value is not None or str(a.real_type).startswith("Optional["),
        scalar_default=a.default_value if scalar else None,
        has_scalar_default=scalar,
    )


def _is_scalar_default(argument: torch.Argument) -> bool:
    """Whether a schema argument has a default that is a plain Python value of its own
    type: not an enum the parser gives as an int (``MemoryFormat memory_format=
    contiguous_format`` reads 0), not a list."""
    if not argument.has_default_value():
        return False
    value, kind = argument.default_value, str(argument.real_type).removeprefix("Optional[")
    if value is None:
        return True
    kind = kind.rstrip("]")
    if kind == "number":  # a Scalar: an int or a float, as the default says
        return type(value) in (int, float)
    expected = {"bool": bool, "int": int, "float": float, "str": str}.get(kind)
    return expected is not None and type(value) is expected


@lru_cache(maxsize=4096)
def parse_signature(schema: str) -> Signature:
    """Parse a recorded ``op_schema`` string; SchemaError for anything unusable."""
    head = schema.split("(", 1)[0].strip()
    namespace, name, overload = split_op_name(head)
    try:
        parsed = torch._C.parse_schema(schema)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "parse error"
        raise SchemaError(f"unparsable schema: {first[:120]}") from None
    args = tuple(_arg_spec(a) for a in parsed.arguments)
    for a in args:
        if not re.fullmatch(IDENT, a.name):
            raise SchemaError(f"argument name {a.name[:40]!r} is not an identifier")
    returns = tuple(str(r.real_type) for r in parsed.returns)
    is_view = bool(parsed.returns) and not any(a.writes for a in args) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in parsed.returns)
    return Signature(namespace, name, overload or "default", args, returns, is_view)
