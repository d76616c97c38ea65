"""The compiler pipeline, one direction.

load -> select -> filter -> lower -> rename storages -> retarget -> [compose, repeat]
-> tensors -> values -> autograd -> public bindings -> communication waits
-> (schedule: streams, threads, timing)

Every trace goes through the same steps whether it is compiled alone, filtered, or
combined with others (``--compose``): :func:`build_programs` is the one path.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from mystique_gen.ir import NotReplayed, Op, Program, TraceInfo, iter_tensors
from mystique_gen.options import BuildOptions, OptionError
from mystique_gen.passes.autograd import plan_autograd
from mystique_gen.passes.bindings import choose_bindings
from mystique_gen.passes.comms import CommLowering
from mystique_gen.passes.compose import (
    combined_info,
    place_in_parallel,
    rename_storages,
    storage_lifetimes,
    storages_of,
)
from mystique_gen.passes.filters import filter_selection
from mystique_gen.passes.lower import lower_ops
from mystique_gen.passes.retarget import retarget_dtype
from mystique_gen.passes.select import release_covered_arguments, select_ops
from mystique_gen.passes.tensors import TensorPlan, plan_tensors
from mystique_gen.passes.values import (
    RecordedValues,
    assign_values,
    recorded_values,
    resources_dir,
)
from mystique_gen.sources.et import RawTrace, load_trace

TraceInput = tuple[RawTrace, Path | None]  # a trace and its resources folder, if any


def build_program(trace: RawTrace, resources: Path | None = None,
                  options: BuildOptions | None = None, *, consume: bool = False) -> Program:
    """One trace; ``resources``: its ``<name>_resources/`` folder of saved integral data;
    ``options``: filters and rewrites (default: the first complete step, as recorded)."""
    return build_programs([(trace, resources)], options or BuildOptions(), consume=consume)


@dataclass
class _Part:
    """One trace's ops, lowered under the options, before the tensor pass."""

    info: TraceInfo
    ops: list[Op]
    not_replayed: list[NotReplayed]
    threads: list[int]
    filters: list[str]
    recorded: RecordedValues
    comm: CommLowering


def check_trace_count(count: int, options: BuildOptions) -> None:
    """Several traces need ``--compose``; ``--compose`` needs several traces."""
    if count > 1 and options.compose is None:
        raise OptionError(f"{count} traces given: combine them with --compose sequence "
                          "(several ranks of one job are replayed together only when their "
                          "traces share a process group description)")
    if count < 2 and options.compose is not None:
        raise OptionError(f"--compose {options.compose} combines several traces; "
                          f"{count} given")


def build_programs(traces: list[TraceInput], options: BuildOptions, *,
                   consume: bool = False) -> Program:
    """The pipeline: every trace selected, filtered, lowered and renamed on its own, then
    one op list (composed, repeated) through the tensor and value passes."""
    check_trace_count(len(traces), options)
    names: dict[tuple[int, int, int], int] = {}
    parts = [_lower_part(k, trace, resources, options, names, consume)
             for k, (trace, resources) in enumerate(traces)]
    lines: list[str] = []
    if len(parts) > 1:
        counts = " + ".join(str(len(p.ops)) for p in parts)
        total = sum(len(p.ops) for p in parts)
        how = ("one after another in each iteration" if options.compose == "sequence" else
               "at once, each on its own host thread (and its own stream on GPU)")
        lines.append(f"compose {options.compose}: {len(parts)} traces {how}, each with its "
                     f"own tensors: {counts} -> {total} replayed ops")
        if options.compose == "parallel":
            place_in_parallel([p.ops for p in parts])
        for k, p in enumerate(parts, 1):
            lines.append(f"trace {k} of {len(parts)}: {p.info.name} (sha256 {p.info.sha256}, "
                         f"schema {p.info.schema}, {p.info.node_count} nodes): "
                         f"{len(p.ops)} replayed ops")
            lines += [f"trace {k}: {line}" for line in p.filters]
    else:
        lines += parts[0].filters
    # Blocks: (part, ops) in replay order; copies of the op list for --repeat.
    blocks = [(p, p.ops) for p in parts]
    if options.repeat > 1:
        once = sum(len(p.ops) for p in parts)
        for _ in range(options.repeat - 1):
            blocks += [(p, copy.deepcopy(p.ops)) for p in parts]
        lines.append(f"repeat {options.repeat}: the op list {options.repeat} times per "
                     f"iteration: {once} -> {once * options.repeat} replayed ops")
    ops = [op for _, block in blocks for op in block]
    for i, op in enumerate(ops):
        op.index = i
    plan = plan_tensors(ops)
    for part, block in blocks:
        storages = plan.storages if len(blocks) == 1 else storages_of(block)
        assign_values(block, storages, part.recorded)
    plan_autograd(ops)
    if options.public_calls:
        choose_bindings(ops)
    info = parts[0].info if len(parts) == 1 else combined_info([p.info for p in parts])
    not_replayed = [s for p in parts for s in p.not_replayed]
    if options.compose == "parallel":
        threads = sorted({op.thread for op in ops})
    else:
        threads = sorted({t for p in parts for t in p.threads})
    program = program_of(info, ops, plan, not_replayed, threads, lines)
    program.distributed = _distributed(blocks, program.notes)
    return program


def _distributed(blocks: list[tuple[_Part, list[Op]]], notes: list[str]):
    """Waits of each block's collectives; the one trace's DistInfo (None: no communication)."""
    infos = {}
    for part, block in blocks:
        first = id(part) not in infos
        # Each copy places its own waits; notes are the trace's, said once.
        info = part.comm.finish(block, notes if first else [])
        if first:
            infos[id(part)] = info
    found = [(part.info.name, infos[id(part)]) for part, _ in blocks[:len(infos)]
             if infos[id(part)] is not None]
    if len(found) > 1:
        raise OptionError("--compose: more than one trace communicates "
                          f"({', '.join(name for name, _ in found)}); composing distributed "
                          "traces is not supported")
    return found[0][1] if found else None


def _lower_part(k: int, trace: RawTrace, resources: Path | None, options: BuildOptions,
                names: dict[tuple[int, int, int], int], consume: bool) -> _Part:
    """``consume``: the caller no longer needs the trace's recorded arguments (it loaded
    the trace for this build), so lowering may release them as it goes."""
    selection = select_ops(trace)
    release_covered_arguments(selection)
    kept, lines = filter_selection(trace, selection, options)
    # Everything that reads recorded arguments runs before lowering releases them.
    lifetimes = storage_lifetimes(selection.ops)
    recorded = recorded_values(trace, resources)
    comm = CommLowering(trace)
    ops, lowering_skips = lower_ops(kept.ops, comm=comm.lower, release=consume)
    rename_storages(ops, lifetimes, k, names)
    if options.dtype is not None:
        lines.append(retarget_dtype(ops, options.dtype))
    not_replayed = sorted(kept.not_replayed + lowering_skips, key=lambda s: s.node_id)
    if options.compose is not None:
        # Node ids of different traces overlap: say which trace each one is from.
        not_replayed = [NotReplayed(s.node_id, f"trace {k + 1}: {s.name}", s.reason)
                        for s in not_replayed]
    info = TraceInfo(trace.name, trace.sha256, trace.schema, trace.node_count)
    return _Part(info, ops, not_replayed, kept.threads, lines, recorded, comm)


def load_traces(paths: list[str | Path], options: BuildOptions) -> list[TraceInput]:
    """Load every trace (and its resources folder) once the count is known to be valid."""
    from mystique_gen.passes.values import resources_dir
    from mystique_gen.sources.et import load_trace

    check_trace_count(len(paths), options)
    return [(load_trace(p), resources_dir(p)) for p in paths]


def inspect_traces(paths: list[str | Path], options: BuildOptions) -> tuple[RawTrace, Program]:
    """The program ``options`` build, and one RawTrace holding every trace's nodes (for
    ``mystique-gen inspect``'s counts by name; a composition's nodes are not id-sorted)."""
    loaded = load_traces(paths, options)
    # inspect writes no code: no need to probe which public function calls each op.
    program = build_programs(loaded, replace(options, public_calls=False))
    if len(loaded) == 1:
        return loaded[0][0], program
    info = program.trace
    nodes = [n for trace, _ in loaded for n in trace.nodes]
    return RawTrace(info.name, info.sha256, info.schema, nodes, {}), program


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
    ``options``: filters and rewrites (options.py)."""
    from mystique_gen.passes.streams import schedule_program

    trace = load_trace(path)
    program = build_program(trace, resources_dir(path), options, consume=True)
    return schedule_program(program, trace, kineto, threaded=threads)


def compile_traces(paths: list[str | Path], options: BuildOptions, *,
                   threads: bool = False) -> Program:
    """Several traces combined as ``options.compose`` says (one trace: compile_trace)."""
    from mystique_gen.passes.streams import schedule_program

    if len(paths) == 1:
        return compile_trace(paths[0], threads=threads, options=options)
    loaded = load_traces(paths, options)
    program = build_programs(loaded, options, consume=True)
    threaded = threads or options.compose == "parallel"  # one host thread per trace
    return schedule_program(program, loaded[0][0], None, threaded=threaded)
