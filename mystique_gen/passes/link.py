"""Link execution-trace nodes with the Kineto trace of the same run.

An ET node and its Kineto CPU event are matched, in this order of preference:

1. ``Record function id`` == ``rf_id`` (PyTorch >= 2.4 writes both);
2. ``External id`` == ``rf_id`` (older traces, e.g. HTA's test pair);
3. ``External id`` == ``rf_id`` + a constant offset, the offset being the most common
   difference between equally named nodes taken in order (traces whose counters
   started apart);
4. order: the k-th unmatched node of a name with the k-th unmatched event of that
   name, by time.

Names must agree for every method. Each linked, selected op then gets its inclusive
and exclusive CPU time, the GPU activity it launched (runtime calls inside its time
span on its thread, joined to GPU events by correlation id) and the host gap before
it (:func:`~mystique_gen.sources.kineto.host_gaps`). The facts go into the IR
(:class:`OpTiming`, :class:`ProgramTiming`), so emitters and templates only format
them.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass

from mystique_gen.ir import KernelRecord, OpTiming, Program, ProgramTiming
from mystique_gen.passes.filters import STEP_RE, node_steps
from mystique_gen.passes.select import is_root, select_ops
from mystique_gen.sources.et import RawNode, RawTrace
from mystique_gen.sources.kineto import (
    CpuEvent,
    GpuEvent,
    KinetoTrace,
    annotation_starts,
    host_gaps,
    starts_by_thread,
)

METHODS = ("record_function_id", "external_id", "external_id_offset", "order")


@dataclass
class Links:
    events: dict[int, CpuEvent]  # ET node id -> Kineto CPU event
    methods: dict[int, str]  # ET node id -> how it was linked
    offset: int | None  # the constant id offset used by method 3, if any
    # (ET's process id, Kineto's) where they differ: no id is shared, all link by order.
    other_process: tuple[int, int] | None = None
    # Why the links by order were dropped (they did not pair the ET with a recording of
    # the same ops: another program's trace), else None.
    incoherent: str | None = None


def other_process(trace: RawTrace, kineto: KinetoTrace) -> tuple[int, int] | None:
    """(the ET's process id, the Kineto trace's) where both name their process and they
    differ, else None. Ids agree only within one process: in two processes both count
    from the same start, and a torch before 2.4, whose Kineto trace writes no record
    function id, would link the same step's ops by id by chance and take a separate
    profile for one recorded with the observer attached."""
    pid = trace.metadata.get("pid")
    pids = {e.pid for e in kineto.cpu_ops if type(e.pid) is int and e.pid > 0}
    if type(pid) is not int or pid <= 0 or not pids or pid in pids:
        return None
    return pid, min(pids)


def link_nodes(trace: RawTrace, kineto: KinetoTrace) -> Links:
    steps_of_nodes, event_steps = node_steps(trace), _event_steps(kineto)
    # (Only where the two share step numbers: a Kineto trace of another session,
    # numbered otherwise, still links by order.)
    held = set(event_steps.values()) & set(steps_of_nodes.values())
    if not held:
        steps_of_nodes, event_steps = {}, {}
    # Where both mark their steps (ProfilerStep#N), a node of a step the Kineto trace
    # does not hold links to nothing, and a node links only to an event of its own step:
    # a repeating schedule's observer writes every cycle into one ET, each cycle's Kineto
    # trace holds its own, and before torch 2.4 the ET's rf_ids and the Kineto trace's
    # External ids drift apart between cycles; taken in order, the first cycle's nodes
    # met the second cycle's events, their difference won the offset vote, and the
    # step the Kineto trace holds was left with nothing linked.
    nodes = [n for n in trace.nodes if not is_root(n)
             and (not held or steps_of_nodes.get(n.id) is None or steps_of_nodes[n.id] in held)]
    events: dict[int, CpuEvent] = {}
    methods: dict[int, str] = {}
    used: set[int] = set()

    def take(node: RawNode, ev: CpuEvent | None, method: str) -> None:
        step, ev_step = steps_of_nodes.get(node.id), \
            (event_steps.get(ev.index) if ev is not None else None)
        if step is not None and ev_step is not None and step != ev_step:
            return
        if ev is not None and ev.index not in used and ev.name == node.name:
            events[node.id] = ev
            methods[node.id] = method
            used.add(ev.index)

    elsewhere = other_process(trace, kineto)
    by_rf = _unique_index(kineto.cpu_ops, lambda e: e.rf_id) if elsewhere is None else {}
    by_ext = _unique_index(kineto.cpu_ops, lambda e: e.external_id) \
        if elsewhere is None else {}
    for node in nodes:
        if node.rf_id is not None:
            take(node, by_rf.get(node.rf_id), METHODS[0])
    for node in nodes:
        if node.id not in events and node.rf_id is not None:
            take(node, by_ext.get(node.rf_id), METHODS[1])

    offset = None if elsewhere is not None else _common_offset(
        [n for n in nodes if n.id not in events and n.rf_id is not None],
        [e for e in kineto.cpu_ops if e.index not in used and e.external_id is not None])
    if offset is not None:
        for node in nodes:
            if node.id not in events and node.rf_id is not None:
                take(node, by_ext.get(node.rf_id + offset), METHODS[2])

    pending_nodes = _by_name(n for n in nodes if n.id not in events)
    pending_events = _by_name(e for e in kineto.cpu_ops if e.index not in used)
    for name, group in pending_nodes.items():
        for node, ev in zip(group, pending_events.get(name, []), strict=False):
            take(node, ev, METHODS[3])
    incoherent = _incoherent_order_links(nodes, events, methods, kineto)
    if incoherent is not None:
        for node_id in [i for i, m in methods.items() if m == METHODS[3]]:
            del events[node_id], methods[node_id]
    return Links(events, methods, offset, elsewhere, incoherent)


# Links by order pair the k-th node of a name with the k-th event of that name, which
# any two traces sharing op names (aten::linear, aten::add_) satisfy. A recording of the
# ET's own ops keeps their order (node ids count up as ops start, on each thread) and
# holds few ops between them that the ET lacks; another program's trace does neither.
ORDER_INVERSIONS_MAX = 0.05  # of consecutive order-linked pairs on a thread
WINDOW_LINKED_MIN = 0.5  # of the Kineto ops in the linked span, on the linked threads


def _incoherent_order_links(nodes: list[RawNode], events: dict[int, CpuEvent],
                            methods: dict[int, str], kineto: KinetoTrace) -> str | None:
    """Why the order links do not pair the ET with a recording of its own ops, or None."""
    ordered = [n for n in nodes if methods.get(n.id) == METHODS[3]]
    if len(ordered) < 2:
        return None
    by_thread: dict[int, list[CpuEvent]] = defaultdict(list)
    for node in sorted(ordered, key=lambda n: n.id):
        by_thread[node.tid].append(events[node.id])
    pairs = sum(max(0, len(evs) - 1) for evs in by_thread.values())
    inversions = sum(1 for evs in by_thread.values() for a, b in zip(evs, evs[1:], strict=False)
                     if b.ts < a.ts)
    if pairs and inversions > ORDER_INVERSIONS_MAX * pairs:
        return (f"{inversions} of {pairs} consecutive ops linked by name and order run "
                "in another order there")
    linked = [events[n.id] for n in ordered]
    lo, hi = min(e.ts for e in linked), max(e.end for e in linked)
    threads = {(e.pid, e.tid) for e in linked}
    used = {e.index for e in events.values()}
    window = [e for e in kineto.cpu_ops if lo <= e.ts < hi and (e.pid, e.tid) in threads
              and not e.annotation]
    found = sum(1 for e in window if e.index in used)
    if window and found < WINDOW_LINKED_MIN * len(window):
        return (f"only {found} of the {len(window)} ops it recorded in the span the ET's "
                "ops link to are the ET's")
    return None


def _event_steps(kineto: KinetoTrace) -> dict[int, int]:
    """Kineto CPU event index -> the N of the ``ProfilerStep#N`` event whose span holds
    its start on its thread, where one does."""
    spans: dict[tuple[object, object], list[tuple[float, float, int]]] = defaultdict(list)
    for e in kineto.cpu_ops:
        m = STEP_RE.fullmatch(e.name)
        if m:
            spans[(e.pid, e.tid)].append((e.ts, e.end, int(m.group(1))))
    if not spans:
        return {}
    starts = {k: [s for s, _, _ in sorted(v)] for k, v in spans.items()}
    ordered = {k: sorted(v) for k, v in spans.items()}
    found: dict[int, int] = {}
    for e in kineto.cpu_ops:
        key = (e.pid, e.tid)
        if key not in ordered:
            continue
        i = bisect.bisect_right(starts[key], e.ts) - 1
        if i >= 0 and e.ts <= ordered[key][i][1]:
            found[e.index] = ordered[key][i][2]
    return found


def _unique_index(events: list[CpuEvent], key) -> dict[int, CpuEvent]:
    """id -> event for ids that occur once (an id seen twice identifies nothing)."""
    counts = Counter(key(e) for e in events)
    return {key(e): e for e in events if key(e) is not None and counts[key(e)] == 1}


def _by_name(items) -> dict[str, list]:
    groups: dict[str, list] = defaultdict(list)
    for item in items:
        groups[item.name].append(item)
    return groups


def _common_offset(nodes: list[RawNode], events: list[CpuEvent]) -> int | None:
    """The most common External id - rf_id over equally named pairs taken in order."""
    node_groups, event_groups = _by_name(nodes), _by_name(events)
    diffs: Counter[int] = Counter()
    for name, group in node_groups.items():
        for node, ev in zip(group, event_groups.get(name, []), strict=False):
            assert node.rf_id is not None and ev.external_id is not None
            diffs[ev.external_id - node.rf_id] += 1
    if not diffs:
        return None
    offset, count = max(diffs.items(), key=lambda kv: (kv[1], -abs(kv[0])))
    # One agreeing pair proves nothing: require a clear majority of at least two.
    return offset if count >= 2 and count * 2 > sum(diffs.values()) else None


def exclusive_times(cpu_ops: list[CpuEvent]) -> dict[int, float]:
    """Event index -> duration minus its direct child CPU events (same pid and tid)."""
    children: dict[int, float] = defaultdict(float)
    stacks: dict[tuple[object, object], list[CpuEvent]] = defaultdict(list)
    for ev in cpu_ops:  # sorted by start, longer first: parents precede children
        stack = stacks[(ev.pid, ev.tid)]
        while stack and ev.ts >= stack[-1].end:
            stack.pop()
        if stack:
            children[stack[-1].index] += ev.dur
        stack.append(ev)
    return {ev.index: max(0.0, ev.dur - children[ev.index]) for ev in cpu_ops}


def _kernels_by_event(kineto: KinetoTrace, launchers: list[CpuEvent]
                      ) -> dict[int, list[GpuEvent]]:
    """Launcher event index -> GPU activity whose runtime call lies in its span."""
    gpu_by_corr: dict[int, list[GpuEvent]] = defaultdict(list)
    for g in kineto.gpu:
        gpu_by_corr[g.correlation].append(g)
    spans: dict[tuple[object, object], list[CpuEvent]] = defaultdict(list)
    for ev in sorted(launchers, key=lambda e: e.ts):
        spans[(ev.pid, ev.tid)].append(ev)
    starts = {k: [e.ts for e in v] for k, v in spans.items()}
    found: dict[int, list[GpuEvent]] = defaultdict(list)
    for call in kineto.runtime:
        key = (call.pid, call.tid)
        if key not in spans or call.correlation not in gpu_by_corr:
            continue
        i = bisect.bisect_right(starts[key], call.ts) - 1
        if i >= 0 and call.ts <= spans[key][i].end:
            found[spans[key][i].index].extend(gpu_by_corr[call.correlation])
    return found


def attach_timing(program: Program, trace: RawTrace, kineto: KinetoTrace, *,
                  serial: bool = True) -> Links:
    """Link ``program``'s ops to ``kineto`` and record the timing facts in the IR;
    ``serial``: the benchmark replays every recorded thread's ops on one thread
    (:func:`~mystique_gen.sources.kineto.host_gaps` says what that changes)."""
    links = link_nodes(trace, kineto)
    selected = [s.node for s in select_ops(trace).ops]
    launchers = [links.events[n.id] for n in selected if n.id in links.events]
    exclusive = exclusive_times(kineto.cpu_ops)
    kernels = _kernels_by_event(kineto, launchers)

    found = host_gaps([(n.id, n.tid, links.events.get(n.id)) for n in selected],
                      starts_by_thread(kineto.cpu_ops),
                      starts_by_thread(kineto.python_calls), serial=serial,
                      annotated=annotation_starts(kineto.cpu_ops))

    linked = 0
    for op in program.ops:
        ev = links.events.get(op.node_id)
        if ev is None:
            continue
        linked += 1
        gap = found.get(op.node_id)
        op.timing = OpTiming(
            cpu_us=ev.dur, cpu_self_us=exclusive.get(ev.index, ev.dur),
            gap_us=None if gap is None else gap.us,
            gap_events=0 if gap is None else gap.events,
            gap_calls=0 if gap is None else gap.calls,
            gap_annotations=0 if gap is None else gap.annotations,
            kernels=tuple(KernelRecord(g.name, g.stream, g.dur)
                          for g in sorted(kernels.get(ev.index, []), key=lambda g: g.ts)),
        )
    # The replayed ops' span: the trace may hold more steps than the one replayed.
    replayed = [links.events[op.node_id] for op in program.ops if op.node_id in links.events]
    spans = [(ev.ts, ev.end) for ev in replayed]
    spans += [(g.ts, g.ts + g.dur) for ev in replayed for g in kernels.get(ev.index, [])]
    original_ms = (max(e for _, e in spans) - min(s for s, _ in spans)) / 1000.0 if spans \
        else 0.0
    used_methods = Counter(links.methods[op.node_id] for op in program.ops
                           if op.node_id in links.methods)
    # Ids agree only within one process and profiler session: a trace linked mostly by
    # id was recorded together with the ET, so the observer's work is in its gaps;
    # unless the Kineto trace shows no observer was attached (a profile of other steps
    # whose External ids, counted from 1 as the ET's rf_ids are, matched by chance).
    by_id = sum(used_methods[m] for m in METHODS if m != "order")
    observed = (by_id * 2 > linked or links.other_process is not None
                and kineto.with_observer) and not kineto.without_observer
    program.timing = ProgramTiming(
        kineto=kineto.name, sha256=kineto.sha256, original_ms=original_ms, linked_ops=linked,
        link_methods={m: used_methods[m] for m in METHODS if used_methods[m]},
        observer_in_gaps=observed, memory_in_gaps=bool(kineto.memory),
        # (An observer that computes no ranges still writes the attribute, empty.)
        observer_ranges=observed and any(n.attrs.get("tensor_range") for n in trace.nodes),
        observer_schema=trace.schema if observed else "",
        profiler_options=tuple(sorted(kineto.options)),
    )
    return links


def timing_summary(program: Program) -> dict[str, object]:
    """``inspect --kineto`` fields: how many ops linked, and how, and the streams."""
    timing = program.timing
    kernels = sum(len(op.timing.kernels) for op in program.ops if op.timing is not None)
    return {
        "kineto": timing.kineto if timing else None,
        "linked_ops": timing.linked_ops if timing else 0,
        "link_methods": timing.link_methods if timing else {},
        "original_ms": timing.original_ms if timing else None,
        # What a benchmark's original_ratio divides by, and where it comes from.
        "step_ms": timing.step_ms if timing else None,
        "step_ms_from": timing.step_ms_from if timing else None,
        "kernels": kernels,
        "streams": [{"stream": s.stream, "ops": s.ops, "kernels": s.kernels, "main": s.main}
                    for s in program.streams],
        "stream_waits": sum(len(op.stream_waits) for op in program.ops),
    }
