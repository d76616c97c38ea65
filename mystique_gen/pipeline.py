"""The compiler pipeline, one direction: load -> select -> lower -> tensors -> values."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from mystique_gen.ir import Program, TraceInfo, iter_tensors
from mystique_gen.load.et import RawTrace, load_trace
from mystique_gen.passes.lower import lower_ops
from mystique_gen.passes.select import select_ops
from mystique_gen.passes.tensors import plan_tensors
from mystique_gen.passes.values import assign_values


def build_program(trace: RawTrace) -> Program:
    selection = select_ops(trace)
    ops, lowering_skips = lower_ops(selection.ops)
    not_replayed = sorted(selection.not_replayed + lowering_skips, key=lambda s: s.node_id)
    plan = plan_tensors(ops)
    assign_values(ops, plan.storages)
    devices = Counter(
        tv.meta.device for op in ops for arg in op.args for tv in iter_tensors(arg.value)
    )
    accelerators = [d for d in devices if d != "cpu"]
    primary = max(accelerators, key=lambda d: devices[d]) if accelerators else "cpu"
    return Program(
        trace=TraceInfo(trace.name, trace.sha256, trace.schema, trace.node_count),
        ops=ops,
        storages=plan.storages,
        not_replayed=not_replayed,
        threads=selection.threads,
        devices=sorted(devices),
        primary_device=primary,
        peak_bytes=plan.peak_bytes,
        notes=plan.notes,
    )


def compile_trace(path: str | Path) -> Program:
    return build_program(load_trace(path))
