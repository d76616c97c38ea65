"""The driver: the one path every trace takes, from files to a written benchmark.

    sources (ET, Kineto) -> front end, per trace (select, filter, lower, rename
    storages, retarget) -> compose/repeat -> PASSES, in order -> backend -> write

A single trace, composed traces (``--compose``) and the ranks of one job all take this
path: a rank set runs the passes once per rank and hands every rank's Program to the
distributed backend. Each pass is a function ``(Program, Build) -> Program``; ``Build``
carries what the passes read besides the Program (the loaded sources, the options and
what the front end learnt of each trace), so no pass loads a file or calls another
stage.
"""

from __future__ import annotations

import copy
import os
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from mystique_gen import oprules, progress
from mystique_gen.backends import distributed as dist_backend
from mystique_gen.backends import single as single_backend
from mystique_gen.backends.base import GenerateOptions
from mystique_gen.constants import ET_SUFFIX, KINETO_SUFFIX, SIDECAR_SUFFIX
from mystique_gen.errors import MystiqueError, OptionError
from mystique_gen.harness import runtime
from mystique_gen.ir import (
    Diagnostic,
    Literal,
    Op,
    Program,
    ProgramTiming,
    TraceInfo,
    filter_applied,
    guarded,
    iter_tensors,
    note,
)
from mystique_gen.options import BuildOptions
from mystique_gen.passes import autograd, frees, hostgaps, link, public_calls, streams
from mystique_gen.passes.comms import (
    CommLowering,
    ambiguous_regrouping,
    mark_in_flight,
    pair_point_to_point,
    place_rooted_collectives,
    rank_disagreements,
    regroup_second_reductions,
    regroup_sized_collectives,
    regroup_unaligned_collectives,
    replace_inferred_waits,
    settle_unrecorded_groups,
    unpaired_point_to_point,
)
from mystique_gen.passes.compose import (
    combined_info,
    inner_allocations,
    place_in_parallel,
    rename_storages,
    storage_lifetimes,
    storages_of,
)
from mystique_gen.passes.filters import (
    filter_selection,
    kineto_steps,
    step_listing,
    steps,
    steps_apart,
    unmarked_steps,
)
from mystique_gen.passes.lower import COMPLEX_STAND_IN, lower_ops
from mystique_gen.passes.numbers import EPSILON_STAND_IN, replay_wrapped_numbers, restore_epsilons
from mystique_gen.passes.ranks import (
    check_kineto_count,
    check_rank_set,
    is_multi_rank_set,
    job_groups,
    match_kineto,
    natural_key,
    order_ranks,
)
from mystique_gen.passes.retarget import retarget_dtype
from mystique_gen.passes.select import (
    release_covered_arguments,
    select_ops,
    trace_sparse_tensors,
)
from mystique_gen.passes.tensors import peak_bytes, plan_tensors
from mystique_gen.passes.values import (
    CapturedInputs,
    RecordedValues,
    assign_values,
    mark_only_guarded_readers,
    recorded_values,
    resources_dir,
)
from mystique_gen.sources.et import RawTrace, load_trace, unfinished_note
from mystique_gen.sources.jsonstream import document_kind
from mystique_gen.sources.kineto import (
    KinetoTrace,
    host_probe_of,
    host_share_of,
    literals_of,
    load_kineto,
    profile_beside,
    scalars_of,
    sidecar_beside,
    step_ms_of,
    threads_of,
)

TRACE_SUFFIXES = (".json", ".json.gz")


# -- sources ------------------------------------------------------------------------------
@dataclass
class Source:
    """One loaded trace and what was read beside it."""

    trace: RawTrace
    resources: Path | None = None  # <name>_resources/: saved integral data
    kineto: KinetoTrace | None = None  # the profiler trace of the same run (--kineto)
    profile: KinetoTrace | None = None  # profile-only steps beside it (host gaps)
    host_probe_us: float | None = None  # the capture host's speed while profiling them
    step_ms: float | None = None  # the eager step the capture timed (its step.json)
    # the share of those steps in which the step's thread had the CPU (step.json)
    host_share: float | None = None
    num_threads: int | None = None  # intra-op CPU threads the capture ran with (step.json)
    # the values of 0-d floating arguments and of the literals each step built alike,
    # which the capture recorded beside the trace (step.json)
    captured: CapturedInputs = field(default_factory=CapturedInputs)
    # Recorded as one step by `mystique-gen capture` (a step.json beside it): however
    # many optimizer steps it holds, it is not cut into iterations.
    one_step: bool = False


def load_source(path: str | Path, kineto: str | Path | None = None) -> Source:
    """A trace file, its resources folder and, with ``kineto``, the Kineto trace and the
    capture's profile-only trace named beside it."""
    sidecar = sidecar_beside(path)
    source = Source(load_trace(path), resources_dir(path),
                    captured=CapturedInputs(scalars_of(sidecar), literals_of(sidecar),
                                            scalars_of(sidecar, "integer_scalars")),
                    num_threads=threads_of(sidecar), one_step=bool(sidecar))
    if kineto is not None:
        link_source(source, load_kineto(kineto), kineto)
    return source


def link_source(source: Source, kineto: KinetoTrace, path: str | Path) -> None:
    """Give ``source`` its Kineto trace (read from ``path``) and the profile-only trace
    named beside that file, if any."""
    sidecar = sidecar_beside(path)
    profile = profile_beside(path, sidecar)
    source.kineto = kineto
    source.profile = load_kineto(profile) if profile is not None else None
    source.host_probe_us = host_probe_of(sidecar) if profile is not None else None
    source.step_ms = step_ms_of(sidecar)
    source.host_share = host_share_of(sidecar)


KinetoPaths = str | Path | Sequence[str | Path] | None


# tensorboard_trace_handler names each file <worker>.<time>.pt.trace.json[.gz].
TENSORBOARD_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
KINETO_SUFFIXES = (KINETO_SUFFIX, KINETO_SUFFIX + ".gz")
SIDECARS = (SIDECAR_SUFFIX, SIDECAR_SUFFIX + ".gz")
NOT_KINETO_SUFFIXES = (ET_SUFFIX, ET_SUFFIX + ".gz", *SIDECARS)


def _named_files(kineto: KinetoPaths) -> list[Path]:
    """The files ``--kineto`` names as such (not found in a directory it names)."""
    named = [] if kineto is None else [kineto] if isinstance(kineto, (str, Path)) \
        else list(kineto)
    return [Path(p) for p in named if Path(p).is_file()]


def kineto_paths(kineto: KinetoPaths) -> list[Path]:
    """``--kineto`` as files: one path or several, a directory standing for its Kineto
    traces (its ``*.kineto.json`` files where it has any, see :func:`expand_inputs`)."""
    if kineto is None:
        return []
    out: list[Path] = []
    for p in map(Path, [kineto] if isinstance(kineto, (str, Path)) else list(kineto)):
        found = expand_inputs([p], KINETO_SUFFIX)
        if p.is_dir() and not any(f.name.endswith(KINETO_SUFFIXES) for f in found):
            # No capture's naming: tensorboard_trace_handler's (*.pt.trace.json.gz)
            # where it has any; the ET, an ET+ or a step.json written beside them (as
            # HTA's and PARAM's recipes write them into one folder) are no Kineto trace
            # (they were counted as ones: "4 Kineto traces (eager.json, et.json, ...)").
            # Named by no convention (PARAM's and HTA's et_rank0.json beside
            # kineto_rank0.json): the files that hold an ET are none, by what they hold.
            found = [f for f in found if f.name.endswith(TENSORBOARD_SUFFIXES)] or \
                [f for f in found if not f.name.endswith(NOT_KINETO_SUFFIXES)
                 and document_kind(f) != "et"]
        out.extend(found)
    return out


def one_kineto(path: str | Path | None, trace: str | Path | None = None,
               iteration: str = "auto") -> Path | None:
    """One Kineto trace: a file, or a directory holding one (``inspect``, ``compare``
    and ``diff`` take one, as generation does per trace), or with ``trace`` (one ET
    file) the cycle of a repeating schedule's that holds the step to replay, as
    generation picks it (:func:`kineto_of_cycle`)."""
    if path is None:
        return None
    found = kineto_paths(path)
    if len(found) > 1 and trace is not None and Path(trace).is_file():
        cycle = kineto_of_cycle(load_trace(trace), found, iteration)
        if cycle is not None:
            return cycle[0]
    if len(found) != 1:
        raise MystiqueError(f"{Path(path).name}: {len(found)} Kineto traces in this "
                            f"directory ({', '.join(f.name for f in found)}); give one")
    return found[0]


def expand_inputs(paths: Sequence[str | Path], named: str = ET_SUFFIX) -> list[Path]:
    """Paths as given; a directory stands for its trace files, sorted naturally: those
    whose names end with ``named`` (``.et.json``: a capture's naming, beside its Kineto,
    profile-only and sidecar files) where it has any, else all of them."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted((f for f in p.iterdir()
                            if f.is_file() and f.name.endswith(TRACE_SUFFIXES)),
                           key=lambda f: natural_key(f.name))
            if not found:
                raise MystiqueError(f"{p.name}: no .json or .json.gz traces in this directory")
            chosen = [f for f in found if f.name.endswith((named, named + ".gz"))]
            if not chosen and named == ET_SUFFIX:
                # One folder for an ET and its Kineto traces, as HTA's and PARAM's
                # recipes write (tensorboard_trace_handler's files beside the ET): the
                # Kineto traces and sidecars are no ETs ("no 'nodes' field").
                # Nor are the Kineto traces whose names say nothing (PARAM's and HTA's
                # et_rank0.json beside kineto_rank0.json): by what they hold.
                chosen = [f for f in found if not f.name.endswith(
                    TENSORBOARD_SUFFIXES + KINETO_SUFFIXES + SIDECARS)
                    and document_kind(f) != "kineto"]
            out.extend(chosen or found)
        else:
            out.append(p)
    return out


# -- what the passes read besides the Program -----------------------------------------------
@dataclass
class Part:
    """One trace's ops, lowered under the options, before the tensor pass."""

    info: TraceInfo
    ops: list[Op]
    not_replayed: list[Diagnostic]
    threads: list[int]
    filters: list[str]
    recorded: RecordedValues
    comm: CommLowering
    notes: list[str] = field(default_factory=list)


@dataclass
class Build:
    sources: list[Source]
    options: BuildOptions
    consume: bool = False  # the driver owns the traces: lowering may release arguments
    parts: list[Part] = field(default_factory=list)
    # (part, ops) in replay order: the parts, then their copies for --repeat
    blocks: list[tuple[Part, list[Op]]] = field(default_factory=list)
    links: link.Links | None = None  # ET node -> Kineto event (link_kineto)


Pass = Callable[[Program, Build], Program]


# -- the front end: each trace on its own, then one op list ---------------------------------
def lower_sources(program: Program, build: Build) -> Program:
    """Select, filter, lower, rename and retarget every trace; compose and repeat."""
    options = build.options
    names: dict[tuple[int, int, int], int] = {}
    parts = [_lower_part(k, s.trace, s.resources, options, names, build.consume,
                         s.captured, kineto_steps(s.kineto) if k == 0 else frozenset(),
                         one_step=s.one_step)
             for k, s in enumerate(build.sources)]
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
    blocks = [(p, p.ops) for p in parts]
    if options.repeat > 1:
        once = sum(len(p.ops) for p in parts)
        for _ in range(options.repeat - 1):
            blocks += [(p, copy.deepcopy(p.ops)) for p in parts]
        lines.append(f"repeat {options.repeat}: the op list {options.repeat} times per "
                     f"iteration: {once} -> {once * options.repeat} replayed ops")
    build.parts, build.blocks = parts, blocks
    ops = [op for _, block in blocks for op in block]
    for i, op in enumerate(ops):
        op.index = i
    if options.compose == "parallel":
        threads = sorted({op.thread for op in ops})
    else:
        threads = sorted({t for p in parts for t in p.threads})
    info = parts[0].info if len(parts) == 1 else combined_info([p.info for p in parts])
    captured_threads = {s.num_threads for s in build.sources}
    if len(captured_threads) == 1:  # the benchmark runs one count for all of them
        info = replace(info, num_threads=captured_threads.pop())
    reported = [filter_applied(line) for line in lines]
    reported += [s for p in parts for s in p.not_replayed]
    reported += [guarded(op.node_id, op.name, op.guard) for op in ops if op.guard]
    reported += [note(n) for p in parts for n in p.notes]
    return replace(program, trace=info, ops=ops, threads=threads,
                   diagnostics=program.diagnostics + reported)


def _lower_part(k: int, trace: RawTrace, resources: Path | None, options: BuildOptions,
                names: dict[tuple[int, int, int], int], consume: bool,
                captured: CapturedInputs | None = None,
                profiled_steps: frozenset[int] = frozenset(), *, one_step: bool = False
                ) -> Part:
    """``consume``: the caller no longer needs the trace's recorded arguments, so
    lowering may release them as it goes. ``profiled_steps``, ``one_step``: see
    filter_selection."""
    strides = trace.records_strides  # before any recorded argument is released
    selection = select_ops(trace)
    sparse = trace_sparse_tensors(trace)  # read below ops whose arguments are released
    # Before covered arguments go: it reads the backend worker threads' ops (AVG).
    comm = CommLowering(trace, sparse, serial=not options.threaded)
    inner = inner_allocations(selection)
    release_covered_arguments(selection)
    kept, lines = filter_selection(trace, selection, options, profiled_steps,
                                   one_step=one_step)
    several = None if one_step else unmarked_steps(trace, kept)
    # Everything that reads recorded arguments runs before lowering releases them.
    lifetimes = storage_lifetimes(selection.ops, inner)
    recorded = recorded_values(trace, resources, captured)
    ops, lowering_skips = lower_ops(kept.ops, comm=comm, release=consume, sparse=sparse)
    rename_storages(ops, lifetimes, k, names)
    part_notes = [several] if several else []
    if trace.cut is not None:
        part_notes.append(unfinished_note(trace))
    numbers = replay_wrapped_numbers(ops, recorded)
    if numbers:
        part_notes.append(f"{numbers} wrapped Python numbers (0-d tensor arguments whose "
                          "recorded result dtype shows scalar type promotion) replay as "
                          "Python numbers")
    epsilons = restore_epsilons(ops)
    if epsilons:
        part_notes.append(f"{epsilons} eps arguments recorded as 0.0 (the trace writes "
                          f"doubles with six decimals) replay as {EPSILON_STAND_IN:g}")
    stand_ins = sum(1 for op in ops for arg in op.args
                    if isinstance(arg.value, Literal) and arg.value.value is COMPLEX_STAND_IN)
    if stand_ins:
        part_notes.append(f"{stand_ins} complex scalar arguments replay as "
                          f"{COMPLEX_STAND_IN}: the trace records their type, not their "
                          "value")
    if trace.device_nodes:
        part_notes.append(f"an ET+ (Chakra trace_link): {len(trace.device_nodes)} device "
                          "activities below the ops that launched them are not ops; "
                          f"--kineto {trace.name} links their times and the ops'")
    if options.dtype is not None:
        lines.append(retarget_dtype(ops, options.dtype))
    not_replayed = sorted(kept.not_replayed + lowering_skips, key=lambda s: s.node_id)
    if options.compose is not None:
        # Node ids of different traces overlap: say which trace each one is from.
        not_replayed = [replace(s, name=f"trace {k + 1}: {s.name}") for s in not_replayed]
    if not strides:
        views = sum(1 for op in ops if op.name in oprules.STRIDE_DEPENDENT_VIEWS)
        part_notes.append("the trace records no strides (torch 2.3 or older): every tensor "
                          "is taken to be row-major" + (
                              f", and its {views} views copy their input only where this "
                              "device's kernels lay it out so that they cannot view it"
                              if views else ""))
    info = TraceInfo(trace.name, trace.sha256, trace.schema, trace.node_count,
                     strides_recorded=strides, step=kept.step)
    return Part(info, ops, not_replayed, kept.threads, lines, recorded, comm, part_notes)


# -- the passes over one Program ------------------------------------------------------------
def plan_storage(program: Program, build: Build) -> Program:
    """Storages, views, dataflow and frees (passes/tensors.py); devices and peak memory."""
    plan = plan_tensors(program.ops, strides_recorded=program.trace.strides_recorded)
    devices = Counter(tv.meta.device for op in program.ops for arg in op.args
                      for tv in iter_tensors(arg.value))
    accelerators = [d for d in devices if d != "cpu"]
    primary = max(accelerators, key=lambda d: devices[d]) if accelerators else "cpu"
    # Beside an accelerator, the host's tensors stay on the host: estimated apart.
    on_host = primary != "cpu"
    peak = peak_bytes(program.ops, plan.storages,
                      (lambda s: s.device != "cpu") if on_host else None)
    host_peak = peak_bytes(program.ops, plan.storages,
                           lambda s: s.device == "cpu") if on_host else 0
    return replace(program, storages=plan.storages, devices=sorted(devices),
                   primary_device=primary, peak_bytes=peak, host_peak_bytes=host_peak,
                   diagnostics=program.diagnostics + [note(n) for n in plan.notes])


def fill_values(program: Program, build: Build) -> Program:
    """Input values each consumer accepts (passes/values.py), per trace."""
    for part, block in build.blocks:
        storages = program.storages if len(build.blocks) == 1 else storages_of(block)
        assign_values(block, storages, part.recorded)
    mark_only_guarded_readers(program.ops, program.storages)
    return program


def replay_autograd(program: Program, build: Build) -> Program:
    autograd.plan_autograd(program.ops)
    program.dual_levels = autograd.dual_levels(program.ops)
    return program


def call_public_functions(program: Program, build: Build) -> Program:
    if build.options.public_calls:
        public_calls.choose_public_calls(program.ops)
    return program


def place_comm_waits(program: Program, build: Build) -> Program:
    """Waits of each block's collectives; the one communicating trace's DistInfo."""
    infos = {}
    notes: list[str] = []
    for part, block in build.blocks:
        first = id(part) not in infos
        # Each copy places its own waits; notes are the trace's, said once.
        info = part.comm.finish(block, notes if first else [])
        if first:
            infos[id(part)] = info
    found = [(part.info.name, infos[id(part)]) for part, _ in build.blocks[:len(infos)]
             if infos[id(part)] is not None]
    if len(found) > 1:
        raise OptionError("--compose: more than one trace communicates "
                          f"({', '.join(name for name, _ in found)}); composing distributed "
                          "traces is not supported")
    return replace(program, diagnostics=program.diagnostics + [note(n) for n in notes],
                   distributed=found[0][1] if found else None)


def link_kineto(program: Program, build: Build) -> Program:
    """Per-op timing, kernels and host gaps from the Kineto trace (passes/link.py)."""
    source = build.sources[0]
    if source.kineto is not None:
        build.links = link.attach_timing(program, source.trace, source.kineto,
                                         serial=not build.options.threaded)
        if build.links.other_process is not None:
            et_pid, kineto_pid = build.links.other_process
            # Not the ET's own recording: another run's times and gaps (its profiler
            # settings, its machine's load) stand in for this one's. Said on stderr
            # too, as every other pair that is not one recording is: in the header
            # alone, another run's Kineto trace given by mistake went unnoticed.
            message = (
                f"{source.kineto.name} was recorded by another process (pid {kineto_pid}) "
                f"than the ET (pid {et_pid}): ids are not shared, so ops link by name "
                "and order, and its times and host gaps are another run's")
            program = _said(program, message)
        elif source.kineto.without_observer and any(n.rf_id for n in source.trace.nodes):
            # No op of it carries a record function id, while the ET's nodes do: the
            # observer was not attached while it profiled, so it holds other steps than
            # the ET's (an observer started by hand before the profiler's active
            # window). Its External ids count from 1 as the ET's rf_ids do and linked
            # by id by chance, which the header called the recorded step, silently.
            message = (
                f"{source.kineto.name} was profiled without the ET observer attached (no "
                "op of it carries a record function id): it recorded other steps than "
                "the ET, and its times and host gaps are those steps' (ops link by "
                "name, and by ids that agree by chance); the Kineto trace of the "
                "profiler session the observer ran in links the ET's own step")
            program = _said(program, message)
        loaded = _loaded_host(program, source)
        if loaded:
            program = _said(program, loaded)
        if program.timing is not None:
            program.timing.measured_step_ms = source.step_ms
            linked, total = program.timing.linked_ops, len(program.ops)
            unprofiled = _unprofiled_threads(program)
            # A host thread the profiler never saw (a Python thread, without
            # profile_all_threads) is unlinked as a whole however many ops others link:
            # its times and gaps are missing, so say so whatever the share.
            if linked * 2 < total or unprofiled:
                held = step_listing(sorted(kineto_steps(source.kineto))) or "none annotated"
                incoherent = build.links.incoherent if build.links else None
                why = (f"{unprofiled} of them run on host threads of which it holds no op "
                       "(threads the profiler did not follow: without "
                       "profile_all_threads=True it records only the thread that "
                       "started it and those torch starts itself)" if unprofiled else
                       f"it recorded other ops, not this trace's ({incoherent}; "
                       "another program?), and links by name and order are not used"
                       if incoherent else
                       f"it recorded other steps or another run (its steps: {held})")
                message = (
                    f"only {linked} of the {total} replayed ops are found in "
                    f"{source.kineto.name}: {why}; times, gaps and the "
                    "original step time stand for the linked ops only (--iteration N "
                    "picks a step it holds)")
                program = _said(program, message)
    return program


def _said(program: Program, message: str) -> Program:
    """``program`` with ``message`` in its header's notes, said on stderr as well (the
    CLI prints warnings there): what a user must see before running the benchmark."""
    warnings.warn(message, stacklevel=3)
    return replace(program, diagnostics=program.diagnostics + [note(message)])


# Below this share of its steps' wall clock on the CPU, the capture's host was loaded.
LOADED_HOST_SHARE = 0.8


def _loaded_host(program: Program, source: Source) -> str | None:
    """Where the capture's host was busy with other work, what that means. Its timed
    steps measure the step thread's CPU time beside the wall clock (step.json's
    ``host_share``): on a host to itself the thread has the CPU through a CPU step, and
    spins for its intra-op workers. Other processes on its core stretch every op and
    every gap alike; the benchmark, on a quiet host, replays the ops at their own speed
    but waits the stretched gaps (an MLP step captured beside two busy processes on its
    core: share 0.34, 108 ms against 34 ms on the idle core). A step on an accelerator
    waits for it in syncs, which may sleep: not judged."""
    share = source.host_share
    if share is None or share >= LOADED_HOST_SHARE or program.primary_device != "cpu":
        return None
    return (f"the capture's host was loaded: its step's thread had the CPU {share:.0%} of "
            "each timed step (step.json's host_share), so its recorded host gaps and "
            "step time are those of a busy host; --host-gaps recorded replays them as "
            "such (capture on an idle host, or pin the job to a core of its own)")


def _unprofiled_threads(program: Program) -> int:
    """How many replayed ops run on host threads none of whose ops a linked Kineto
    trace holds, where other threads' ops it does hold (0 otherwise)."""
    linked_threads = {op.thread for op in program.ops if op.timing is not None}
    if not linked_threads:
        return 0
    return sum(1 for op in program.ops if op.thread not in linked_threads)


def recorded_frees(program: Program, build: Build) -> Program:
    """Frees where the original's memory events put them, and no history held across a
    backward (passes/frees.py)."""
    kineto = build.sources[0].kineto
    held = 0
    if kineto is not None and build.links is not None and kineto.memory:
        held = frees.follow_recorded_frees(program, build.links.events, kineto.memory)
    frees.drop_history_at_backward(program)
    if not held or kineto is None:
        return program
    return replace(program, diagnostics=program.diagnostics + [note(
        f"frees as recorded: {held} values are held past their last read until the op "
        f"after which the original freed them ({kineto.name}'s memory events)")])


def profiled_host_gaps(program: Program, build: Build) -> Program:
    """Host gaps from the capture's profile-only steps where present, else, for a
    same-session pair, from all its steps the observer recorded (passes/hostgaps.py)."""
    source = build.sources[0]
    serial = not build.options.threaded
    if source.profile is not None:
        hostgaps.apply_profile_gaps(program, source.trace, source.profile,
                                    source.host_probe_us, serial=serial)
    # A Kineto trace of another process shares no ids with the ET: its steps cannot
    # be told apart by them (passes/link.py other_process).
    elsewhere = build.links is not None and build.links.other_process is not None
    steps = 0
    if source.kineto is not None and source.profile is None and not elsewhere:
        steps = hostgaps.apply_session_steps(program, source.trace, source.kineto,
                                             build.links.offset if build.links else None,
                                             serial=serial)
    program = _peer_waits(program, build)
    if steps and program.timing is not None and not program.timing.observer_in_gaps:
        # The observer was started and stopped by hand inside a longer profile: the
        # steps it did not record gave the gaps (passes/hostgaps.py), which the header
        # said nowhere but in ORIGINAL.
        program = replace(program, diagnostics=program.diagnostics + [note(
            f"host gaps from {program.timing.host_gaps}: the steps the ET observer did "
            "not record, in the same profile, so no observer's cost is in them")])
    if program.timing is not None and program.timing.observer_in_gaps:
        why = "its record function ids show one" if elsewhere else "linked by id"
        # A capture's profile-only trace beside it whose steps did not run the step's
        # ops (on every thread, in hostgaps.MATCHING_STEPS steps) gave no gaps.
        beside = ("no profile-only steps beside it" if source.profile is None else
                  f"the profile-only steps of {source.profile.name} beside it did not run "
                  "the recorded step's ops on every host thread")
        # Medians over several steps need no damping.
        damped = hostgaps.damp_spikes(program, serial=serial) if steps < 2 else 0
        if damped:
            program = replace(program, diagnostics=program.diagnostics + [note(
                f"host gaps of one recorded step: {damped} above {hostgaps.SPIKE_RATIO:g}x "
                "the median of their kind (the same two ops, seen 3 times or more) are "
                "replayed at that median, as the machine's, not the program's")])
        program = replace(program, diagnostics=program.diagnostics + [note(
            f"host gaps from {program.timing.host_gaps if steps else program.timing.kineto}, "
            f"recorded with the ET observer attached ({why}; {beside}): with --host-gaps "
            "recorded the benchmark calibrates the observer's cost out, or replays no "
            "gaps where it cannot (no observer there, or one that writes another schema "
            f"than the trace's {program.timing.observer_schema or 'unknown'})"), note(
            "same-session gaps replay only where that correction can be trusted: the "
            f"observer's estimated cost at most {runtime.OBSERVER_TRUST:g}x what is left "
            "to wait, and the median recorded step's gaps above the quietest step's by "
            f"at most that{_stalled(program.timing)}; else stderr "
            "says which. The observer's slowing of the original's Python between ops "
            "is not corrected: where the gaps replay, stderr bounds it")])
    if not program.ops:  # (every op a compiled kernel the trace does not hold, say)
        waits = program.timing is not None and program.timing.tail_gap_us is not None
        message = f"no op of {source.trace.name} replays (see the header's ops not " + (
            "replayed): with --host-gaps recorded the benchmark waits the recorded "
            "step's host time, and times nothing else" if waits else
            "replayed): the benchmark times nothing; --kineto with the step's Kineto "
            "trace and --host-gaps recorded replay its recorded time")
        program = _said(program, message)
    return program


def comms_in_flight(program: Program, build: Build) -> Program:
    """Async collectives the original had in flight together, by when its Kineto trace
    shows each one's work completed, each waited where its data is needed instead of
    before its group's next one (passes/comms.py mark_in_flight)."""
    kineto = build.sources[0].kineto
    if kineto is None or build.links is None or program.distributed is None:
        return program
    events = build.links.events
    completed = hostgaps.work_completions(program.ops, events, kineto)
    found = mark_in_flight(program, completed, {i: e.ts for i, e in events.items()}) \
        if completed else 0
    if found:
        program.diagnostics.append(note(
            f"{found} async collectives were still in flight in the original when the "
            f"next collective on their group was issued ({kineto.name}): each is waited "
            "where its data is needed, not before that one"))
    return program


def _peer_waits(program: Program, build: Build) -> Program:
    """Gaps less the waits for peers they held (passes/hostgaps.py remove_peer_waits),
    said on stderr: before the spikes are damped, which such a wait would be."""
    kineto = build.sources[0].kineto
    if kineto is None or build.links is None or program.timing is None:
        return program
    found = hostgaps.remove_peer_waits(program, build.links.events, kineto,
                                       serial=not build.options.threaded)
    if not found.gaps:
        return program
    who = f"rank {kineto.rank}'s" if kineto.rank is not None else "the"
    return _said(program, (
        f"{found.us:.0f} us of {who} recorded gaps ({found.gaps} gaps) were waits for "
        "its peers (until the backend's work completed): not replayed as host time; "
        "the replay's own communication waits its own"))


def _stalled(timing: ProgramTiming) -> str:
    """How far the step a same-session pair's gaps add up to exceeds its quietest's,
    for its note (what the benchmark's calibration weighs against the wait)."""
    totals = timing.step_gap_totals_us
    if len(totals) < 2:
        return ""
    stalled = runtime._stalled_us(totals, timing.step_gap_typical_us)
    return (f" (these {len(totals)} steps' gaps: the median step's {stalled:.0f} us above "
            "the quietest's)")


def assign_streams(program: Program, build: Build) -> Program:
    if build.sources[0].kineto is not None:
        streams.assign_streams(program)
    return program


def plan_schedule(program: Program, build: Build) -> Program:
    """Stream and thread waits; composed parallel traces get a host thread each."""
    streams.plan_schedule(program, threaded=build.options.threaded)
    if build.options.compose == "parallel":
        program.threaded_by = "--compose parallel"
    return program


PASSES: tuple[Pass, ...] = (
    lower_sources,
    plan_storage,
    fill_values,
    replay_autograd,
    call_public_functions,
    place_comm_waits,
    link_kineto,
    comms_in_flight,
    recorded_frees,
    profiled_host_gaps,
    assign_streams,
    plan_schedule,
)


def run_passes(sources: list[Source], options: BuildOptions, *,
               consume: bool = False) -> Program:
    """Every pass, in order, over the traces ``sources`` (one, or several composed)."""
    check_trace_count(len(sources), options)
    if any(s.kineto is not None for s in sources) and len(sources) > 1:
        raise OptionError("--kineto links one trace; it cannot go with --compose")
    build = Build(sources, options, consume)
    program = Program.empty()
    for step in PASSES:
        program = step(program, build)
    return program


def check_trace_count(count: int, options: BuildOptions) -> None:
    """Several traces need ``--compose``; ``--compose`` needs several traces."""
    if count > 1 and options.compose is None:
        raise OptionError(f"{count} traces given: combine them with --compose sequence "
                          "(several ranks of one job are replayed together only when their "
                          "traces share a process group description)")
    if count < 2 and options.compose is not None:
        raise OptionError(f"--compose {options.compose} combines several traces; "
                          f"{count} given")


# -- entry points -----------------------------------------------------------------------------
@dataclass
class Compiled:
    """What the backend gets: one Program, or one per rank of a job (rank order)."""

    programs: list[Program]
    ranks: list[int]
    rank_source: str = ""  # how the ranks were found

    @property
    def distributed(self) -> bool:
        return any(p.distributed is not None for p in self.programs)


def build_program(trace: RawTrace, resources: Path | None = None,
                  options: BuildOptions | None = None, *, kineto: KinetoTrace | None = None,
                  consume: bool = False) -> Program:
    """One in-memory trace through every pass (default options: the first step)."""
    return run_passes([Source(trace, resources, kineto)], options or BuildOptions(),
                      consume=consume)


def compile_trace(path: str | Path, *, kineto: str | Path | None = None,
                  options: BuildOptions | None = None) -> Program:
    """One trace file (``kineto``: the profiler trace of the same run)."""
    return run_passes([load_source(path, kineto)], options or BuildOptions(), consume=True)


def compile_paths(paths: Sequence[str | Path], options: BuildOptions | None = None, *,
                  kineto: KinetoPaths = None, consume: bool = True) -> Compiled:
    """Trace files (or directories of rank traces): one trace, a composition, or the ranks
    of one job, each rank through the same passes. ``kineto``: the Kineto trace of one
    trace, or one per rank trace (matched by the rank each records, else in order)."""
    options = options or BuildOptions()
    files = expand_inputs(paths)
    # A --kineto directory that also holds the ET (one folder for both): not a Kineto
    # trace. The trace named as its own --kineto is one: an ET+ carries its times (a
    # plain ET is then refused for holding none; both had been dropped without a word).
    given = {f.resolve() for f in files} - {k.resolve() for k in _named_files(kineto)}
    kinetos = [k for k in kineto_paths(kineto) if k.resolve() not in given]
    if kinetos and options.compose is not None:
        raise OptionError("--kineto links one trace; it cannot go with --compose")
    sources = [load_source(p) for p in files]
    if len(sources) > 1 and options.compose is None:
        check_rank_set([s.trace for s in sources])
    if (len(sources) > 1 and options.compose is None
            and is_multi_rank_set([s.trace for s in sources])):
        return _compile_ranks(sources, options, consume, kinetos, [str(f) for f in files])
    check_trace_count(len(sources), options)
    cycle = None
    if len(kinetos) > 1:
        cycle = kineto_of_cycle(sources[0].trace, kinetos, options.iteration)
        if cycle is None:
            raise OptionError(f"{len(kinetos)} Kineto traces "
                              f"({', '.join(k.name for k in kinetos)}) for one trace "
                              f"({files[0].name}): --kineto takes one Kineto trace per "
                              "trace (a profiler whose schedule repeats writes one per "
                              "cycle: give one cycle's, that of the step to replay)")
        link_source(sources[0], cycle[1], cycle[0])
    elif kinetos:
        link_source(sources[0], load_kineto(kinetos[0]), kinetos[0])
    program = run_passes(sources, options, consume=consume)
    if cycle is not None:
        program.diagnostics.append(note(
            f"--kineto: {cycle[0].name}, of {len(kinetos)} Kineto traces (one per cycle "
            f"of a repeating schedule), the one holding step #{cycle[2]}"))
    rank = program.distributed.rank or 0 if program.distributed is not None else 0
    return Compiled([program], [rank])


def kineto_of_cycle(trace: RawTrace, kinetos: list[Path],
                    iteration: str) -> tuple[Path, KinetoTrace, int] | None:
    """Of a repeating schedule's Kineto traces, one per cycle (a tensorboard_trace_handler
    directory: ``schedule(..., repeat=2)`` writes one file per cycle, while its ET
    observer writes every cycle into one ET), the one that holds the step to replay:
    ``--iteration N``'s, else the ET's first step that any of them holds (the step the
    default iteration then takes). Only where every trace holds some of the ET's
    ``ProfilerStep#N`` and no step is in two (ranks', or another run's, traces share
    step numbers): else None, and the caller refuses the set. Before, any such directory
    was refused, though it is what HTA's and PARAM's recipes write."""
    if iteration == "all":
        return None
    et_steps = [number for number, _ in steps(trace)]
    if not et_steps:
        return None
    loaded = [(path, load_kineto(path)) for path in kinetos]
    held = [kineto_steps(k) for _, k in loaded]
    if any(not h & set(et_steps) for h in held) or \
            sum(len(h) for h in held) != len(frozenset().union(*held)):
        return None
    wanted = int(iteration) if iteration.isdigit() else \
        next((n for n in et_steps if any(n in h for h in held)), None)
    for (path, kineto), h in zip(loaded, held, strict=True):
        if wanted in h:
            return path, kineto, wanted
    return None


def _compile_ranks(sources: list[Source], options: BuildOptions, consume: bool,
                   kinetos: list[Path], paths: list[str]) -> Compiled:
    ranks, how = order_ranks([s.trace for s in sources], paths)
    merged = job_groups([s.trace for s in sources])
    if merged is not None:
        for source, groups in zip(sources, merged, strict=True):
            source.trace.job_groups = groups
    if kinetos:
        # Refused before any Kineto trace is read (they can be large).
        check_kineto_count([s.trace.name for s in sources], [k.name for k in kinetos])
        loaded = [load_kineto(k) for k in kinetos]
        pick, matched = match_kineto(ranks, [k.rank for k in loaded],
                                     [s.trace.name for s in sources], [k.name for k in loaded])
        for source, k in zip(sources, pick, strict=True):
            link_source(source, loaded[k], kinetos[k])
        how = f"{how}; {matched}"
    programs = [run_passes([s], options, consume=consume) for s in sources]
    if all(p.distributed is None for p in programs):
        raise MystiqueError("these traces hold no communication; combine them with --compose")
    regrouped = regroup_sized_collectives(programs, ranks)
    rooted = place_rooted_collectives(programs, ranks)
    crossed = regroup_second_reductions(programs, ranks)
    ambiguous = ambiguous_regrouping(programs, ranks)
    aligned = regroup_unaligned_collectives(programs, ranks)
    settled, unsettled = settle_unrecorded_groups(programs, ranks)
    moved = pair_point_to_point(programs, ranks)
    replace_inferred_waits(programs)
    notes = []
    if regrouped:
        notes.append(f"{regrouped} collectives of this job whose group their sizes imply "
                     "run on the mesh dimension whose ranks issue them with the same sizes "
                     "(the first dimension's did not)")
    if rooted:
        notes.append(f"{rooted} gathers and scatters of this job on a non-root rank, which "
                     "records neither their group nor its size, run on the group of their "
                     "root's matching call")
    if crossed:
        notes.append(f"{crossed} reductions of this job that record no group, of results "
                     "another collective reduced (HSDP's all-reduce over the replicas of "
                     "what it reduce-scattered over the shards), run on the mesh "
                     "dimension that crosses that collective's group at each rank only")
    if aligned:
        notes.append(f"{aligned} collectives of this job that record no group, which the "
                     "ranks do not issue alike (so the default group could not run them), "
                     "run on the first mesh dimension, or group over some ranks only, "
                     "whose members issue them with the same sizes")
    if ambiguous:
        notes.append(f"{ambiguous} collectives of this job that record no group stay on "
                     "the default group, as every rank issues them alike, though the mesh "
                     "dimension that takes the others would fit them too: nothing "
                     "recorded tells the two placements apart, so this one is a guess")
    if settled:
        notes.append(f"{settled} collectives of this job that record no group run on "
                     "another group (of the size their tensors imply, where they imply "
                     "one), so that on every group its members issue the same calls in "
                     "one order and none waits on a peer blocked elsewhere (sizes alone "
                     "had lined them up with calls of another group, and the replay "
                     "hung): which of several fitting groups ran a call is not recorded, "
                     "so this placement is one that meets, a guess")
    if moved:
        notes.append(f"{moved} sends and recvs of this job run on the process group whose "
                     "members name each other at their recorded peers (the trace records "
                     "no group for them): on the default group a peer was another rank")
    for program in programs:
        program.diagnostics.extend(note(n) for n in notes)
    apart = steps_apart({r: p.trace.step for r, p in zip(ranks, programs, strict=True)})
    for message in [apart, *unsettled] if apart else unsettled:
        warnings.warn(message, stacklevel=2)  # the CLI prints it on stderr
        for program in programs:
            program.diagnostics.append(note(message))
    disagreements = rank_disagreements(programs, ranks) + \
        unpaired_point_to_point(programs, ranks)
    for first, other, message in disagreements:
        warnings.warn(message, stacklevel=2)  # the CLI prints it on stderr
        for k in (first, other):
            programs[k].diagnostics.append(note(message))
    order = sorted(range(len(ranks)), key=lambda k: ranks[k])
    return Compiled([programs[k] for k in order], [ranks[k] for k in order], how)


def render(compiled: Compiled, options: GenerateOptions | None = None) -> str:
    """The benchmark's text from the backend that fits: distributed where any rank
    communicates, single-process otherwise."""
    backend = dist_backend if compiled.distributed else single_backend
    progress.phase("rendering and checking")
    return backend.render(compiled.programs, compiled.ranks, options or GenerateOptions(),
                          compiled.rank_source)


def generate_source(program: Program, options: GenerateOptions | None = None) -> str:
    rank = program.distributed.rank or 0 if program.distributed is not None else 0
    return render(Compiled([program], [rank]), options)


def generate(trace: str | Path | list[str | Path], out: str | Path,
             options: GenerateOptions | None = None, *, kineto: KinetoPaths = None,
             threads: bool = False, build: BuildOptions | None = None) -> str:
    """Compile ``trace`` (one path, a list of paths or a directory of rank traces) and
    write the benchmark to ``out`` atomically; returns its text. ``kineto``: the Kineto
    trace of one trace, or of each rank trace (see :func:`compile_paths`)."""
    build = build or BuildOptions()
    if threads:
        build = replace(build, threads=True)
    paths = trace if isinstance(trace, list) else [trace]
    writable(Path(out))
    text = render(compile_paths(paths, build, kineto=kineto), options)
    write_atomic(Path(out), text)
    return text


def _temporary_in(folder: Path, path: Path, flag: str) -> tuple[int, str]:
    """A temporary file in ``folder`` (made where missing) toward writing ``path``, or an
    OptionError naming ``flag`` and why it cannot be written (/proc, no permission, a
    folder where a file is asked for)."""
    if path.is_dir() and folder != path:
        raise OptionError(f"{flag} {path}: is a folder; name the file to write")
    if folder == path and path.exists() and not path.is_dir():
        raise OptionError(f"{flag} {path}: is a file; name the folder to write into")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OptionError(f"{flag} {path}: {exc.strerror or exc}") from None


def writable(path: Path, flag: str = "-o", *, folder: bool = False) -> None:
    """Raise an OptionError where the file ``path`` (with ``folder``, files in the folder
    ``path``) cannot be written: tried by writing, as permissions do not tell (root,
    /proc). Before the work: a large trace compiled for minutes, a script captured,
    and the write then raised a traceback."""
    fd, tmp = _temporary_in(path if folder else path.parent, path, flag)
    os.close(fd)
    os.unlink(tmp)


def write_atomic(path: Path, text: str, flag: str = "-o") -> None:
    """Write via a temporary file in the same folder, so no partial file is ever left."""
    fd, tmp = _temporary_in(path.parent, path, flag)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)  # mkstemp makes the file 0600; give it the usual mode
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # a full disk: one line, as for any other output
            raise MystiqueError(f"{flag} {path}: {exc.strerror or exc}") from None
        raise
