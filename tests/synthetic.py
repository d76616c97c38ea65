"""Synthetic execution traces of any size, written as a stream (for scale benchmarks).

The shape and text layout follow real nested (1.1.x) traces as the observer writes
them (so sizes and memory ratios are comparable with real traces): a process and a thread root, one
``ProfilerStep#N`` annotation per step, and top-level operators that each have one
child (their implementation, which the generator must skip). Tensors flow from op to
op (``h = relu(h @ w + b)``, with a ``view`` in between), storage ids are reused as
in real traces, and the weights are read many times. Nodes are written children
first, as the observer does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

MM = "aten::mm(Tensor self, Tensor mat2) -> Tensor"
ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
RELU = "aten::relu(Tensor self) -> Tensor"
VIEW = "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)"
EMPTY = ("aten::empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, "
         "Layout? layout=None, Device? device=None, bool? pin_memory=None, "
         "MemoryFormat? memory_format=None) -> Tensor")
MUL = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"

NODES_PER_LAYER = 8  # four top-level ops, each with one child
LAYERS_PER_STEP = 100


class _Writer:
    def __init__(self, out: IO[str], dim: int):
        self.out = out
        self.dim = dim
        self.next_id = 1
        self.rf = 0
        self.count = 0
        self.first = True

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def tensor(self, shape: tuple[int, ...], storage: int | None = None) -> dict[str, Any]:
        numel = 1
        for n in shape:
            numel *= n
        strides = []
        acc = 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        sid = storage if storage is not None else self.new_id()
        return {"value": [self.new_id(), sid, 0, numel, 4, "cuda:0"], "shape": list(shape),
                "strides": strides[::-1], "type": "Tensor(float)"}

    def node(self, node_id: int, name: str, parent: int, schema: str = "",
             inputs: list[Any] | None = None, outputs: list[Any] | None = None) -> None:
        self.rf += 1
        attrs = [("rf_id", "uint64", self.rf), ("fw_parent", "uint64", 0),
                 ("seq_id", "int64", -1), ("scope", "uint64", 0), ("tid", "uint64", 1),
                 ("fw_tid", "uint64", 0), ("op_schema", "string", schema),
                 ("kernel_backend", "string", ""), ("kernel_file", "string", "")]
        # The observer's own layout: one line per field group, ", " and ": " separators.
        dumps = json.dumps
        self.out.write(
            ("" if self.first else ",\n")
            + f'    {{\n      "id": {node_id}, "name": {dumps(name)}, "ctrl_deps": {parent},\n'
            f'      "inputs": {dumps(_args(inputs or []))},\n'
            f'      "outputs": {dumps(_args(outputs or []))},\n'
            '      "attrs": ['
            + ",".join(dumps({"name": n, "type": t, "value": v}) for n, t, v in attrs)
            + "]\n    }")
        self.first = False
        self.count += 1

    def op(self, schema: str, parent: int, inputs: list[Any], outputs: list[Any]) -> None:
        """A top-level op and its child (written first, as the observer does)."""
        op_id = self.new_id()
        child = self.new_id()
        self.node(child, "aten::empty", op_id, EMPTY,
                  [[self.dim], 6, "<None>", "cuda:0", False, "<None>"],
                  [self.tensor((self.dim,))])
        self.node(op_id, schema.split("(", 1)[0].split(".")[0], parent, schema,
                  inputs, outputs)


def _args(values: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"values": [], "shapes": [], "strides": [], "types": []}
    for v in values:
        if isinstance(v, dict):
            out["values"].append(v["value"])
            out["shapes"].append(v["shape"])
            out["strides"].append(v["strides"])
            out["types"].append(v["type"])
        else:
            out["values"].append(v)
            out["shapes"].append([[] for _ in v] if isinstance(v, list) else [])
            out["strides"].append([[] for _ in v] if isinstance(v, list) else [])
            out["types"].append(_scalar_type(v))
    return out


def _scalar_type(v: Any) -> str:
    if isinstance(v, bool):
        return "Bool"
    if isinstance(v, int):
        return "Int"
    if isinstance(v, list):
        return "GenericList[" + ",".join("Int" for _ in v) + "]"
    if v == "<None>":
        return "None"
    return "Device" if isinstance(v, str) else "Double"


def write_synthetic(path: str | Path, nodes: int, dim: int = 16) -> int:
    """Write a trace of about ``nodes`` nodes to ``path`` (plain JSON); return the count."""
    with open(path, "w", encoding="utf-8") as out:
        out.write('{"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": [\n')
        w = _Writer(out, dim)
        process, thread = w.new_id(), w.new_id()
        weights = [w.tensor((dim, dim)) for _ in range(4)]
        bias = w.tensor((dim,))
        h = w.tensor((dim, dim))
        step = layer = 0
        step_id = w.new_id()
        step_open = True
        while w.count + NODES_PER_LAYER + 3 <= nodes:
            if layer and layer % LAYERS_PER_STEP == 0:
                w.node(step_id, f"ProfilerStep#{step}", thread)
                step += 1
                step_id = w.new_id()
            weight = weights[layer % len(weights)]
            y = w.tensor((dim, dim))
            w.op(MM, step_id, [h, weight], [y])
            z = w.tensor((dim, dim))
            w.op(ADD, step_id, [y, bias, 1], [z])
            flat = w.tensor((dim * dim,), storage=z["value"][1])
            w.op(VIEW, step_id, [z, [dim * dim]], [flat])
            # The old activation's storage id is free again: reuse it, as PyTorch does.
            r = w.tensor((dim * dim,), storage=h["value"][1])
            w.op(RELU, step_id, [flat], [r])
            h = {**r, "shape": [dim, dim], "strides": [dim, 1]}
            layer += 1
        if step_open:
            w.node(step_id, f"ProfilerStep#{step}", thread)
        w.node(thread, "[pytorch|profiler|execution_trace|thread]", process)
        w.node(process, "[pytorch|profiler|execution_trace|process]", process)
        out.write("\n]}\n")
        return w.count
