"""Build a program under build options: filter, retarget, compose and repeat.

For each trace: select, filter (:mod:`filters`), lower, rename storages, retarget
(:mod:`retarget`). Then the traces' op lists are concatenated and the whole list
repeated (``--repeat K``) before one tensor pass. ``--compose sequence`` replays the
list in order; ``--compose parallel`` puts each trace on a host thread (and stream)
of its own, and the threaded schedule of :mod:`streams` runs them at once.

Storage ids are renamed to one id per (trace, recorded storage lifetime). Lifetimes
are counted on the *unfiltered* selection, with the tensor pass's rule (an output
whose storage id none of the op's inputs carries starts a new lifetime), so a kept
op never aliases a buffer that a dropped op had replaced, and two traces never share
a tensor. With nothing filtered the renaming changes no lifetime.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mystique_gen.ir import NotReplayed, Op, Program, Storage, TraceInfo, iter_tensors
from mystique_gen.load.et import RawArg, RawTrace
from mystique_gen.options import BuildOptions, OptionError
from mystique_gen.passes.comms import CommLowering
from mystique_gen.passes.filters import filter_selection
from mystique_gen.passes.lower import lower_ops
from mystique_gen.passes.retarget import retarget_dtype
from mystique_gen.passes.select import Selected, select_ops
from mystique_gen.passes.tensors import output_paths, plan_tensors
from mystique_gen.passes.values import RecordedValues, assign_values, recorded_values

TraceInput = tuple[RawTrace, Path | None]  # a trace and its resources folder, if any


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


def build_composed(traces: list[TraceInput], options: BuildOptions) -> Program:
    from mystique_gen.pipeline import program_of

    check_trace_count(len(traces), options)
    names: dict[tuple[int, int, int], int] = {}
    parts = [_lower_part(k, trace, resources, options, names)
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
        storages = plan.storages if len(blocks) == 1 else _storages_of(block)
        assign_values(block, storages, part.recorded)
    info = parts[0].info if len(parts) == 1 else _combined_info([p.info for p in parts])
    not_replayed = [s for p in parts for s in p.not_replayed]
    if options.compose == "parallel":
        threads = sorted({op.thread for op in ops})
    else:
        threads = sorted({t for p in parts for t in p.threads})
    program = program_of(info, ops, plan, not_replayed, threads, lines)
    program.distributed = _distributed(blocks, program.notes)
    return program


def place_in_parallel(op_lists: list[list[Op]]) -> None:
    """Trace k's ops on host thread k + 1 (in recorded order, whatever threads recorded
    them) and, but for the first trace, on side stream k; the schedule (passes/streams.py,
    threaded) then issues each list from its own thread."""
    for k, ops in enumerate(op_lists):
        for op in ops:
            op.thread = k + 1
            op.stream = k if k else None


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
                names: dict[tuple[int, int, int], int]) -> _Part:
    selection = select_ops(trace)
    kept, lines = filter_selection(trace, selection, options)
    comm = CommLowering(trace)
    ops, lowering_skips = lower_ops(kept.ops, comm=comm.lower)
    rename_storages(ops, storage_lifetimes(selection.ops), k, names)
    if options.dtype is not None:
        lines.append(retarget_dtype(ops, options.dtype))
    not_replayed = sorted(kept.not_replayed + lowering_skips, key=lambda s: s.node_id)
    if options.compose is not None:
        # Node ids of different traces overlap: say which trace each one is from.
        not_replayed = [NotReplayed(s.node_id, f"trace {k + 1}: {s.name}", s.reason)
                        for s in not_replayed]
    info = TraceInfo(trace.name, trace.sha256, trace.schema, trace.node_count)
    return _Part(info, ops, not_replayed, kept.threads, lines,
                 recorded_values(trace, resources), comm)


# -- storage lifetimes ---------------------------------------------------------------

Lifetimes = dict[int, tuple[dict[int, int], dict[int, int]]]


def _raw_storage_ids(raw: RawArg) -> Iterator[int]:
    """Storage ids of the tensors in one recorded argument (nested lists included)."""

    def walk(value: object) -> Iterator[int]:
        if not isinstance(value, list):
            return
        if len(value) >= 6 and isinstance(value[1], int) and isinstance(value[5], str):
            yield value[1]  # [tensor id, storage id, offset, numel, itemsize, device]
        else:
            for item in value:
                yield from walk(item)

    if "Tensor" in raw.type:
        yield from walk(raw.value)


def storage_lifetimes(selected: list[Selected]) -> Lifetimes:
    """Per node id: the lifetime number of each storage id it reads, and of each it writes."""
    current: dict[int, int] = {}
    result: Lifetimes = {}
    for s in selected:
        reads_ids = {sid for raw in s.node.inputs for sid in _raw_storage_ids(raw)}
        reads = {sid: current.get(sid, 0) for sid in reads_ids}
        writes: dict[int, int] = {}
        for raw in s.node.outputs:
            for sid in _raw_storage_ids(raw):
                if sid not in reads_ids and sid not in writes:
                    current[sid] = current.get(sid, 0) + 1
                writes[sid] = current.get(sid, 0)
        result[s.node.id] = (reads, writes)
    return result


def rename_storages(ops: list[Op], lifetimes: Lifetimes, part: int,
                    names: dict[tuple[int, int, int], int]) -> None:
    """Give every tensor the id of its (trace, storage, lifetime); ``names`` is shared by
    all traces of a program, so ids never collide."""

    def rename(sid: int, lifetime: int) -> int:
        return names.setdefault((part, sid, lifetime), len(names))

    for op in ops:
        reads, writes = lifetimes.get(op.node_id, ({}, {}))
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                tv.storage_id = rename(tv.storage_id, reads.get(tv.storage_id, 0))
        for _path, tv in output_paths(op.outputs):
            sid = tv.storage_id
            tv.storage_id = rename(sid, writes.get(sid, reads.get(sid, 0)))


def _storages_of(ops: list[Op]) -> list[Storage]:
    found: dict[int, Storage] = {}
    for op in ops:
        for value in [a.value for a in op.args] + list(op.outputs):
            for tv in iter_tensors(value):
                if tv.storage is not None:
                    found.setdefault(tv.storage.index, tv.storage)
    return [found[i] for i in sorted(found)]


def _combined_info(infos: list[TraceInfo]) -> TraceInfo:
    """One TraceInfo for a composition: names joined, sha256 of the traces' sha256s."""
    digest = hashlib.sha256("\n".join(i.sha256 for i in infos).encode()).hexdigest()
    schemas = list(dict.fromkeys(i.schema for i in infos))
    return TraceInfo(" + ".join(i.name for i in infos), digest, " + ".join(schemas),
                     sum(i.node_count for i in infos))


def load_traces(paths: list[str | Path], options: BuildOptions) -> list[TraceInput]:
    """Load every trace (and its resources folder) once the count is known to be valid."""
    from mystique_gen.load.et import load_trace
    from mystique_gen.passes.values import resources_dir

    check_trace_count(len(paths), options)
    return [(load_trace(p), resources_dir(p)) for p in paths]


def inspect_traces(paths: list[str | Path], options: BuildOptions) -> tuple[RawTrace, Program]:
    """The program ``options`` build, and one RawTrace holding every trace's nodes (for
    ``mystique-gen inspect``'s counts by name; a composition's nodes are not id-sorted)."""
    loaded = load_traces(paths, options)
    program = build_composed(loaded, options)
    if len(loaded) == 1:
        return loaded[0][0], program
    info = program.trace
    nodes = [n for trace, _ in loaded for n in trace.nodes]
    return RawTrace(info.name, info.sha256, info.schema, nodes, {}), program
