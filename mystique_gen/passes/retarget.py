"""Retargeting: rewrite the lowered ops for another element type (``--dtype``).

Runs after lowering and before the tensor pass, so storages, fills, stand-ins and the
peak-memory estimate all follow the new type. Strides and offsets count elements, not
bytes, so views keep their meaning. The float8 formats are left alone: they come with
scales that a plain recast would not honour.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from mystique_gen.ir import ListValue, Op, TensorValue, TorchConstant, Value

RECAST = frozenset({"float16", "bfloat16", "float32", "float64"})


def retarget_dtype(ops: list[Op], dtype: str) -> str:
    """Recast every floating tensor and ``ScalarType`` argument to ``dtype``; one line
    saying what changed."""
    tensors: Counter[str] = Counter()
    constants: Counter[str] = Counter()

    def recast(value: Value, scalar_type: bool) -> Value:
        if isinstance(value, TensorValue):
            if value.meta.dtype in RECAST and value.meta.dtype != dtype:
                tensors[value.meta.dtype] += 1
                value.meta = replace(value.meta, dtype=dtype)
            return value
        if isinstance(value, TorchConstant):
            if scalar_type and value.name in RECAST and value.name != dtype:
                constants[value.name] += 1
                return TorchConstant(dtype)
            return value
        if isinstance(value, ListValue):
            return ListValue(tuple(recast(v, scalar_type) for v in value.items))
        return value

    for op in ops:
        for arg in op.args:
            arg.value = recast(arg.value, "ScalarType" in arg.spec.type)
        op.outputs = [recast(v, False) for v in op.outputs]
    was = ", ".join(f"{name} x{count}" for name, count in sorted(tensors.items())) or "none"
    args = sum(constants.values())
    return (f"dtype {dtype}: {sum(tensors.values())} floating tensor uses recast ({was}), "
            f"{args} dtype argument(s); {len(ops)} -> {len(ops)} ops")
