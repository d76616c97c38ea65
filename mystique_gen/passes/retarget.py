"""Retargeting: rewrite the lowered ops for another element type (``--dtype``).

Runs after lowering and before the tensor pass, so storages, fills, stand-ins and the
peak-memory estimate all follow the new type. Strides and offsets count elements, not
bytes, so views keep their meaning. The float8 formats are left alone: they come with
scales that a plain recast would not honour. Nor are the tensors an op family keeps
in full precision beside half or bfloat16 inputs (``oprules.FULL_PRECISION``: batch
norm's weights and statistics), with every other tensor of their storages, so that
all views of one buffer keep one type.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import torch

from mystique_gen.ir import (
    ListValue,
    Literal,
    Op,
    TensorValue,
    TorchConstant,
    Value,
    iter_tensors,
)
from mystique_gen.oprules import FULL_PRECISION

RECAST = frozenset({"float16", "bfloat16", "float32", "float64"})
REDUCED = frozenset({"float16", "bfloat16"})
# The largest finite value of each reduced type.
_LARGEST = {name: torch.finfo(getattr(torch, name)).max for name in REDUCED}


def _numeric(type_: str) -> bool:
    """A Scalar or float argument (schema types "number", "float", optional or not)."""
    return type_.removeprefix("Optional[").removesuffix("]") in ("number", "float", "Scalar")


def full_precision_storages(ops: list[Op]) -> set[int]:
    """Storage ids of the tensors that ops keep in full precision beside reduced
    inputs (``FULL_PRECISION``: arguments by name, outputs by position)."""
    kept: set[int] = set()
    for op in ops:
        rule = FULL_PRECISION.get(op.name)
        if rule is None:
            continue
        names, positions = rule
        values = [arg.value for arg in op.args if arg.spec.name in names]
        values += [op.outputs[k] for k in positions if k < len(op.outputs)]
        kept.update(tv.storage_id for value in values for tv in iter_tensors(value))
    return kept


def retarget_dtype(ops: list[Op], dtype: str) -> str:
    """Recast every floating tensor and ``ScalarType`` argument to ``dtype``; one line
    saying what changed."""
    tensors: Counter[str] = Counter()
    constants: Counter[str] = Counter()
    kept = full_precision_storages(ops) if dtype in REDUCED else set()
    held = 0
    changed: set[int] = set()  # id() of the tensor values recast (outputs are shared)

    def recast(value: Value, scalar_type: bool) -> Value:
        nonlocal held
        if isinstance(value, TensorValue):
            if value.storage_id in kept and value.meta.dtype in RECAST:
                held += value.meta.dtype != dtype
            elif value.meta.dtype in RECAST and value.meta.dtype != dtype:
                tensors[value.meta.dtype] += 1
                value.meta = replace(value.meta, dtype=dtype)
                changed.add(id(value))
            return value
        if isinstance(value, TorchConstant):
            if scalar_type and value.name in RECAST and value.name != dtype:
                constants[value.name] += 1
                return TorchConstant(dtype)
            return value
        if isinstance(value, ListValue):
            return ListValue(tuple(recast(v, scalar_type) for v in value.items))
        return value

    limit = _LARGEST.get(dtype)
    explicit = clamped = 0
    for op in ops:
        for arg in op.args:
            arg.value = recast(arg.value, "ScalarType" in arg.spec.type)
        op.outputs = [recast(v, False) for v in op.outputs]
        if not any(id(tv) in changed for v in op.outputs for tv in iter_tensors(v)):
            continue
        for arg in op.args:
            # A factory op that made the default dtype (``torch.randn(...)``, dtype None)
            # still would: it now names the recast type, as its readers expect.
            if arg.spec.name == "dtype" and "ScalarType" in arg.spec.type \
                    and isinstance(arg.value, Literal) and arg.value.value is None:
                arg.value = TorchConstant(dtype)
                explicit += 1
            # A number the recorded type held but the new one cannot (masks filled with
            # ``torch.finfo(torch.float32).min``: "value cannot be converted to type
            # c10::Half without overflow") saturates at the new type's largest finite.
            elif limit is not None and _numeric(arg.spec.type) \
                    and isinstance(arg.value, Literal) and isinstance(arg.value.value, float) \
                    and math.isfinite(arg.value.value) and abs(arg.value.value) > limit:
                arg.value = Literal(math.copysign(limit, arg.value.value))
                clamped += 1
    was = ", ".join(f"{name} x{count}" for name, count in sorted(tensors.items())) or "none"
    args = sum(constants.values())
    kept_line = (f"; {held} uses of {len(kept)} storages kept as recorded (batch-norm "
                 "weights and statistics, fused attention's logsumexp: what mixed "
                 "precision keeps and the kernels take)" if held else "")
    made = f"; {explicit} factory op(s) given the type" if explicit else ""
    saturated = (f"; {clamped} number(s) beyond its range saturated at its largest"
                 if clamped else "")
    return (f"dtype {dtype}: {sum(tensors.values())} floating tensor uses recast ({was}), "
            f"{args} dtype argument(s){kept_line}{made}{saturated}; "
            f"{len(ops)} -> {len(ops)} ops")
