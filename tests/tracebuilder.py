"""Build small synthetic execution traces (nested 1.1.x layout) for unit tests.

Real traces come from capturing real models (see tests/models.py) or from
../shared/traces; synthetic ones are for pinning down one behaviour at a time
(id reuse, aliasing, a malformed field, a two-stream schedule, ...).
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mystique_gen.ir import contiguous_strides

C10_NAMES = {
    "float32": "float",
    "float64": "double",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
    "int64": "long int",
    "int32": "int",
    "uint8": "unsigned char",
    "bool": "bool",
    "int16": "short int",
    "uint16": "unsigned short",
    "float8_e4m3fn": "c10::Float8_e4m3fn",
    "complex64": "c10::complex<float>",
}


@dataclass
class T:
    """A tensor record: ids, view metadata, dtype (torch name) and device."""

    tensor_id: int
    storage_id: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0
    dtype: str = "float32"
    device: str = "cpu"

    def value(self) -> list[Any]:
        numel = 1
        for n in self.shape:
            numel *= n
        itemsize = {"float64": 8, "int64": 8, "float16": 2, "bfloat16": 2, "uint8": 1,
                    "bool": 1, "int16": 2, "uint16": 2, "float8_e4m3fn": 1,
                    "complex64": 8}.get(self.dtype, 4)
        return [self.tensor_id, self.storage_id, self.offset, numel, itemsize, self.device]

    def type(self) -> str:
        return f"Tensor({C10_NAMES[self.dtype]})"


@dataclass(frozen=True)
class Undefined:
    """An undefined tensor (an optional one left out), as the observer writes it: a
    tensor id, no storage, device "" (the same record as a vmap wrapper's) and the
    type ``Tensor(nullptr (uninitialized))``."""

    tensor_id: int


@dataclass(frozen=True)
class Device:
    name: str


@dataclass(frozen=True)
class Object:
    """A TorchScript object argument (a process group, a reduce op), written as the
    observer writes it: ``"<Object>"``."""


class TraceBuilder:
    def __init__(self, schema: str = "1.1.1-chakra.0.0.4"):
        self.schema = schema
        self.nodes: list[dict[str, Any]] = []
        self._next = 1
        self._rf = 0
        self.process = self._node("[pytorch|profiler|execution_trace|process]", None, tid=0)
        self.thread = self._node("[pytorch|profiler|execution_trace|thread]", self.process)

    def new_id(self) -> int:
        self._next += 1
        return self._next - 1

    def tensor(self, shape: tuple[int, ...], *, dtype: str = "float32", device: str = "cpu",
               storage: int | None = None, offset: int = 0,
               strides: tuple[int, ...] | None = None) -> T:
        shape = tuple(shape)
        strides = tuple(strides) if strides is not None else contiguous_strides(shape)
        tensor_id = self.new_id()
        storage_id = storage if storage is not None else self.new_id()
        return T(tensor_id, storage_id, shape, strides, offset, dtype, device)

    def view(self, base: T, shape: tuple[int, ...], strides: tuple[int, ...] | None = None,
             offset: int = 0) -> T:
        """Another tensor on ``base``'s storage."""
        shape = tuple(shape)
        strides = tuple(strides) if strides is not None else contiguous_strides(shape)
        return T(self.new_id(), base.storage_id, shape, strides, offset, base.dtype,
                 base.device)

    def annotation(self, name: str, parent: int | None = None) -> int:
        return self._node(name, parent if parent is not None else self.thread)

    def op(self, schema: str, inputs: list[Any], outputs: list[Any], *,
           parent: int | None = None, tid: int = 1, name: str | None = None,
           attrs: dict[str, Any] | None = None) -> int:
        node_name = name if name is not None else schema.split("(", 1)[0].split(".")[0]
        return self._node(node_name, parent if parent is not None else self.thread,
                          schema=schema, inputs=inputs, outputs=outputs, tid=tid, attrs=attrs)

    def _node(self, name: str, parent: int | None, *, schema: str = "",
              inputs: list[Any] | None = None, outputs: list[Any] | None = None, tid: int = 1,
              attrs: dict[str, Any] | None = None) -> int:
        node_id = self.new_id()
        self._rf += 1
        node = {
            "id": node_id,
            "name": name,
            "ctrl_deps": parent if parent is not None else node_id,
            "inputs": _args(inputs or []),
            "outputs": _args(outputs or []),
            "attrs": [
                {"name": "rf_id", "type": "uint64", "value": self._rf},
                {"name": "tid", "type": "uint64", "value": tid},
                {"name": "op_schema", "type": "string", "value": schema},
            ] + [{"name": k, "type": "string", "value": v} for k, v in (attrs or {}).items()],
        }
        self.nodes.append(node)
        return node_id

    def doc(self) -> dict[str, Any]:
        # Children are written before parents in real traces: mimic that order.
        return {"schema": self.schema, "pid": 1, "time": "2026-01-01 00:00:00",
                "start_ts": 0, "finish_ts": 1, "nodes": list(reversed(self.nodes))}

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        data = json.dumps(self.doc()).encode()
        path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
        return path


def _encode(value: Any) -> tuple[Any, Any, Any, str]:
    """(value, shape, strides, type) of one argument as the ET observer writes it."""
    if isinstance(value, T):
        return value.value(), list(value.shape), list(value.strides), value.type()
    if isinstance(value, Undefined):
        return [value.tensor_id, 0, 0, 0, 0, ""], [], [], "Tensor(nullptr (uninitialized))"
    if value is None:
        return "<None>", [], [], "None"
    if isinstance(value, bool):
        return value, [], [], "Bool"
    if isinstance(value, int):
        return value, [], [], "Int"
    if isinstance(value, float):  # (the observer writes "-inf", "inf" and "nan" so)
        return (value if math.isfinite(value) else str(value)), [], [], "Double"
    if isinstance(value, str):
        return value, [], [], "String"
    if isinstance(value, Device):
        return value.name, [], [], "Device"
    if isinstance(value, Object):
        return "<Object>", [], [], "Object"
    if isinstance(value, list):
        parts = [_encode(v) for v in value]
        return ([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts],
                "GenericList[" + ",".join(p[3] for p in parts) + "]")
    raise TypeError(type(value))


def _args(values: list[Any]) -> dict[str, list[Any]]:
    parts = [_encode(v) for v in values]
    return {"values": [p[0] for p in parts], "shapes": [p[1] for p in parts],
            "strides": [p[2] for p in parts], "types": [p[3] for p in parts]}


MM = "aten::mm(Tensor self, Tensor mat2) -> Tensor"
ADD_ = "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)"
RELU = "aten::relu(Tensor self) -> Tensor"
VIEW = "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)"
T_OP = "aten::t(Tensor(a) self) -> Tensor(a)"
EMBEDDING = ("aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, "
             "bool scale_grad_by_freq=False, bool sparse=False) -> Tensor")
EMPTY = ("aten::empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, "
         "Layout? layout=None, Device? device=None, bool? pin_memory=None, "
         "MemoryFormat? memory_format=None) -> Tensor")
ALLREDUCE_ = ("c10d::allreduce_(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup "
              "process_group, __torch__.torch.classes.c10d.ReduceOp reduce_op, Tensor? "
              "sparse_indices, bool async_op=True, int timeout=-1) -> (Tensor[], "
              "__torch__.torch.classes.c10d.Work)")
