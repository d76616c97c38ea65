"""Input values: how each materialised storage is filled.

Index tensors get values the consuming op accepts (rows of the embedding table, the
size of the indexed dimension, the class count of a loss), bag offsets are sorted
and start at 0, denominators and variances are positive. Rules live in
:mod:`mystique_gen.oprules`; this pass applies them and intersects the bounds when
one storage feeds several ops.
"""

from __future__ import annotations

from mystique_gen import oprules
from mystique_gen.dtypes import FLOATING, INTEGRAL
from mystique_gen.ir import Init, ListValue, Literal, Op, Storage, TensorValue, iter_tensors


def _arg_facts(op: Op) -> dict[str, object]:
    """Argument name -> shape (tensors) or literal value (scalars)."""
    facts: dict[str, object] = {}
    for arg in op.args:
        v = arg.value
        if isinstance(v, TensorValue):
            facts[arg.spec.name] = v.meta.shape
        elif isinstance(v, Literal):
            facts[arg.spec.name] = v.value
    return facts


def assign_values(ops: list[Op], storages: list[Storage]) -> None:
    upper: dict[int, tuple[int, str]] = {}  # storage index -> (exclusive bound, why)
    offsets: dict[int, tuple[int, str]] = {}  # storage index -> (indices count, why)
    positive: dict[int, str] = {}

    def bound(tv: TensorValue, high: int, why: str) -> None:
        s = tv.storage
        if s is None or not s.materialised or s.dtype not in INTEGRAL:
            return
        high = max(int(high), 1)
        if s.index not in upper or high < upper[s.index][0]:
            upper[s.index] = (high, why)

    for op in ops:
        rules = oprules.INDEX_RULES.get(op.name)
        names = oprules.POSITIVE_ARGS.get(op.name, ())
        if not rules and not names:
            continue
        facts = _arg_facts(op)
        by_name = {a.spec.name: a.value for a in op.args}
        for arg_name, rule in (rules or {}).items():
            value = by_name.get(arg_name)
            if value is None:
                continue
            if rule == "offsets":
                indices = by_name.get("indices")
                if isinstance(indices, TensorValue) and isinstance(value, TensorValue):
                    s = value.storage
                    if s is not None and s.materialised and s.dtype in INTEGRAL:
                        offsets[s.index] = (indices.meta.numel, f"{op.name} offsets")
                continue
            if isinstance(rule, oprules.PerDim):
                shape = facts.get(rule.tensor)
                if isinstance(value, ListValue) and isinstance(shape, tuple):
                    for dim, item in enumerate(value.items):
                        if isinstance(item, TensorValue) and dim < len(shape):
                            bound(item, shape[dim], f"{op.name} {arg_name}[{dim}]")
                continue
            assert isinstance(rule, oprules.Bound)
            high = rule.upper(facts)
            if high is not None:
                for tv in iter_tensors(value):
                    bound(tv, high, f"{op.name} {arg_name}")
        for arg_name in names:
            value = by_name.get(arg_name)
            if value is not None:
                for tv in iter_tensors(value):
                    if tv.storage is not None:
                        positive.setdefault(tv.storage.index, f"{op.name} {arg_name}")

    for s in storages:
        if not s.materialised:
            continue
        if s.index in offsets:
            total, why = offsets[s.index]
            s.init = Init("offsets", 0, total, why)
        elif s.index in upper:
            high, why = upper[s.index]
            s.init = Init("randint", 0, high, why + f" < {high}")
        elif s.dtype == "bool":
            s.init = Init("bool", 0, 1)
        elif s.dtype in INTEGRAL:
            kind, low, high = oprules.DEFAULT_INTEGRAL
            s.init = Init(kind, low, high)
        elif s.dtype in FLOATING or s.dtype.startswith("complex"):
            kind, low, high = (oprules.POSITIVE_FLOATING if s.index in positive
                               else oprules.DEFAULT_FLOATING)
            s.init = Init(kind, low, high, positive.get(s.index, ""))
        else:
            s.init = Init("zeros")
