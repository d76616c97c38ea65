"""The compiler pipeline, one direction: load -> select -> lower -> tensors -> values."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from mystique_gen.ir import NotReplayed, Op, Program, TraceInfo, iter_tensors
from mystique_gen.load.et import RawTrace, load_trace
from mystique_gen.options import BuildOptions
from mystique_gen.passes.comms import CommLowering
from mystique_gen.passes.lower import lower_ops
from mystique_gen.passes.select import select_ops
from mystique_gen.passes.tensors import TensorPlan, plan_tensors
from mystique_gen.passes.values import assign_values, recorded_values, resources_dir


def build_program(trace: RawTrace, resources: Path | None = None,
                  options: BuildOptions | None = None) -> Program:
    """``resources``: the trace's ``<name>_resources/`` folder of saved integral data;
    ``options``: filters and rewrites (passes/compose.py), None for the whole trace as is."""
    if options is not None:
        from mystique_gen.passes.compose import build_composed

        return build_composed([(trace, resources)], options)
    selection = select_ops(trace)
    comm = CommLowering(trace)
    ops, lowering_skips = lower_ops(selection.ops, comm=comm.lower)
    not_replayed = sorted(selection.not_replayed + lowering_skips, key=lambda s: s.node_id)
    plan = plan_tensors(ops)
    assign_values(ops, plan.storages, recorded_values(trace, resources))
    info = TraceInfo(trace.name, trace.sha256, trace.schema, trace.node_count)
    program = program_of(info, ops, plan, not_replayed, selection.threads)
    program.distributed = comm.finish(ops, program.notes)
    return program


def program_of(info: TraceInfo, ops: list[Op], plan: TensorPlan,
               not_replayed: list[NotReplayed], threads: list[int],
               filters: list[str] | None = None) -> Program:
    """Wrap planned ops in a Program: devices, primary device, memory estimate."""
    devices = Counter(
        tv.meta.device for op in ops for arg in op.args for tv in iter_tensors(arg.value)
    )
    accelerators = [d for d in devices if d != "cpu"]
    primary = max(accelerators, key=lambda d: devices[d]) if accelerators else "cpu"
    return Program(
        trace=info,
        ops=ops,
        storages=plan.storages,
        not_replayed=not_replayed,
        threads=threads,
        devices=sorted(devices),
        primary_device=primary,
        peak_bytes=plan.peak_bytes,
        filters=list(filters or []),
        notes=plan.notes,
    )


def compile_trace(path: str | Path, *, kineto: str | Path | None = None,
                  threads: bool = False, options: BuildOptions | None = None) -> Program:
    """``kineto``: the profiler trace of the same run (timing, streams, host gaps);
    ``threads``: replay each recorded host thread on its own thread (passes/streams.py);
    ``options``: filters and rewrites (passes/compose.py)."""
    from mystique_gen.passes.streams import schedule_program

    trace = load_trace(path)
    program = build_program(trace, resources_dir(path), options)
    return schedule_program(program, trace, kineto, threaded=threads)


def compile_traces(paths: list[str | Path], options: BuildOptions, *,
                   threads: bool = False) -> Program:
    """Several traces combined as ``options.compose`` says (one trace: compile_trace)."""
    from mystique_gen.passes.compose import build_composed, load_traces
    from mystique_gen.passes.streams import schedule_program

    if len(paths) == 1:
        return compile_trace(paths[0], threads=threads, options=options)
    loaded = load_traces(paths, options)
    program = build_composed(loaded, options)
    threaded = threads or options.compose == "parallel"  # one host thread per trace
    return schedule_program(program, loaded[0][0], None, threaded=threaded)
