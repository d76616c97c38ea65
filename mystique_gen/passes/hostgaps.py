"""Host gaps as medians over recorded steps: a capture's profile-only steps, else the
steps of a same-session pair.

The Kineto trace recorded beside the execution trace times every op with the ET
observer attached, and the observer's per-op work lands in the gaps between ops too
(measured: gpt2 training step, 556 top-level ops, 4.6 ms of gaps with the observer
against 3.2 ms in a profile-only step). :func:`mystique_gen.tools.capture` therefore also
profiles a few more steps without the observer (``<name>.profile.json``, named in the
``<name>.step.json`` sidecar). Where that file is found beside the ``--kineto`` trace,
the gap before each selected op is taken from it instead: the ops of each step are
matched to the ET's selected ops by name, in order, per host thread, and the median
over the steps is kept (a single step on a busy machine is noisy), scaled so that the
gaps add up to the host time of a median step (:func:`_typical_step_scale`).

What remains in the recorded gaps is the original's host time plus Kineto's own
per-op cost; the benchmark subtracts its own per-op host time, measured the same way
at run time (``_calibrate_gaps`` in the template), so the profiler's share cancels.
Scopes that only the profiler records (the autograd engine's, around every backward
op) also cost recording time inside the gaps; each gap carries their count, and the
benchmark subtracts them at its measured cost per recorded event.

A pair recorded in one profiler session (no profile-only steps beside it) keeps the
observer's work in its gaps, and the benchmark calibrates it out under an observer of
its own; where its Kineto trace marks several steps the observer recorded, each gap is
its median over them (:func:`apply_session_steps`), and a single step's spikes are
damped (:func:`damp_spikes`). Where the same Kineto trace also holds steps the observer
did not record, those serve as the profile-only steps.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field, replace

from mystique_gen import oprules
from mystique_gen.constants import STEP_SCOPE
from mystique_gen.ir import Op, OpTiming, Program
from mystique_gen.passes.filters import STEP_RE
from mystique_gen.passes.select import select_ops
from mystique_gen.sources.et import RawTrace
from mystique_gen.sources.kineto import (
    CpuEvent,
    KinetoTrace,
    annotation_starts,
    begun_in,
    gap_begins,
    host_gaps,
    starts_by_thread,
)


def _steps(events: list[CpuEvent], scopes: list[CpuEvent]) -> list[list[CpuEvent]]:
    """Events split by the step annotations (one step when there are none)."""
    if not scopes:
        return [events]
    return [[e for e in events if s.ts <= e.ts and e.end <= s.end] for s in scopes]


# Profiled steps of the recorded step's kind needed for their gaps (fewer where fewer
# were profiled): one step's gaps carry its stalls, which a median over two drops.
MATCHING_STEPS = 2


def _count(runs: list[list[CpuEvent] | None]) -> int:
    return sum(run is not None for run in runs)


def _match(names: list[str], events: list[CpuEvent]) -> list[CpuEvent] | None:
    """The events of ``names`` in order, each the next event of that name that starts
    after the previous match ended (so children of a matched op are skipped)."""
    found: list[CpuEvent] = []
    i, end = 0, float("-inf")
    for name in names:
        while i < len(events) and (events[i].name != name or events[i].ts < end):
            i += 1
        if i == len(events):
            return None
        found.append(events[i])
        end = events[i].end
        i += 1
    return found


@dataclass
class ProfileGaps:
    """Host gaps of the profile-only steps: medians over the steps, in microseconds."""

    gaps: dict[int, float]  # ET node id -> gap before it
    events: dict[int, int]  # ET node id -> profiler-only scopes recorded in that gap
    steps: int  # the profiled steps that held the recorded step's ops
    profiled: int  # the profiled steps, of any kind
    tail: float | None  # host time after the last op to the step's end
    tail_events: int = 0
    calls: dict[int, int] = field(default_factory=dict)  # ET node id -> Python calls traced
    tail_calls: int = 0
    # ET node id -> of its scopes, the Python record_function ones (not in ``events``)
    annotations: dict[int, int] = field(default_factory=dict)
    tail_annotations: int = 0
    # Each step's gaps in total (the tail included), where every gap has one per step,
    # and the total the gaps above add up to (``typical_step_total``).
    step_totals: tuple[float, ...] = ()
    typical_total: float | None = None
    # Each kept step's span (its scope's duration), where the steps are scopes: what
    # the program's step took with no ET observer attached (``profiled_step_ms``).
    step_spans_us: tuple[float, ...] = ()


def profile_gaps(trace: RawTrace, profile_events: list[CpuEvent],
                 scopes: list[CpuEvent] | None = None,
                 span: tuple[int, int] | None = None,
                 python_calls: list[CpuEvent] | None = None, *,
                 serial: bool = True) -> ProfileGaps | None:
    """Gaps before each selected op over the profiled steps that hold every thread's
    selected ops; None where fewer than :data:`MATCHING_STEPS` of them do (or the only
    step does not). A script's steps differ: an evaluation every few steps, a periodic
    SWA update, a GAN's alternate halves; the steps of the recorded step's kind give
    its gaps, and one other kind among the profiled steps dropped them all for the
    linked ones, which carry the ET observer (an 8 ms stall in that one step replayed
    at 5x the eager step). The steps are the ``scopes`` given,
    else the capture's ``MystiqueProfiledStep`` annotations; the ops, the ET's selected
    ops, within the node ids ``span`` where given (the one step the program replays of
    an ET that recorded several). Each step's gaps are
    :func:`~mystique_gen.sources.kineto.host_gaps` of its ops, ``serial`` as there.

    On the thread that ran the step itself, the first op's gap is the host time from
    the step's start (the step function's own Python before its first op) and the
    tail is the host time after the last op (on any thread, ``serial``) to the step's
    end: both are part of the original step.

    Each gap also counts the events that begin in it: scopes that exist only while the
    profiler records (the autograd engine's ``evaluate_function`` and node scopes
    around every backward op, an optimizer's step annotation). Their recording cost is
    part of the gap but not of an unprofiled step; the benchmark subtracts it at its
    own measured cost per event (``_calibrate_gaps``). So does each Python call that
    the profiler's Python tracer recorded (``python_calls``, with ``with_stack``)."""
    selected = [s.node for s in select_ops(trace).ops
                if span is None or span[0] <= s.node.id <= span[1]]
    per_tid: dict[int, list] = defaultdict(list)
    for node in selected:
        per_tid[node.tid].append(node)
    if scopes is None:
        scopes = [e for e in profile_events if e.name == STEP_SCOPE]
    scope_ids = {e.index for e in scopes}
    by_thread: dict[object, list[CpuEvent]] = defaultdict(list)
    for e in profile_events:
        if e.index not in scope_ids and e.name != STEP_SCOPE:
            by_thread[e.tid].append(e)
    # Each recorded thread's ops matched per step (None: not in that step).
    threads: list[tuple[list, list[list[CpuEvent] | None]]] = []
    taken: set[object] = set()
    for nodes in per_tid.values():
        names = [n.name for n in nodes]
        # Thread ids differ between the traces: the thread, not yet matched to
        # another, whose steps match most often (the first where all do).
        best: tuple[object, list[list[CpuEvent] | None]] | None = None
        for tid, events in by_thread.items():
            if tid in taken:
                continue
            runs = [_match(names, step) for step in _steps(events, scopes)]
            if runs and (best is None or _count(runs) > _count(best[1])):
                best = (tid, runs)
                if _count(runs) == len(runs):
                    break
        if best is None or not _count(best[1]):
            return None
        taken.add(best[0])
        threads.append((nodes, best[1]))
    # No op replays (every one a compiled kernel the trace does not hold): each step
    # is all tail, and the benchmark waits it (it timed nothing before).
    profiled = len(threads[0][1]) if threads else len(scopes) if not selected else 0
    kept = [i for i in range(profiled) if all(runs[i] is not None for _, runs in threads)]
    if len(kept) < min(MATCHING_STEPS, profiled):
        return None
    if scopes:
        scopes = [scopes[i] for i in kept]
    # step -> node id -> event, over the steps kept
    steps: list[dict[int, CpuEvent]] = [{} for _ in kept]
    for nodes, runs in threads:
        for found, i in zip(steps, kept, strict=True):
            run = runs[i]
            assert run is not None
            found.update((n.id, ev) for n, ev in zip(nodes, run, strict=True))
    every = [e for events in by_thread.values() for e in events]
    starts, annotated = starts_by_thread(every), annotation_starts(every)
    traced = starts_by_thread(python_calls or [])
    samples: dict[int, list[float]] = defaultdict(list)
    counts: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # events, calls, notes
    tails: list[tuple[float, tuple[int, int, int]]] = []
    for i, found in enumerate(steps):
        order = [(n.id, n.tid, found[n.id]) for n in selected]
        for nid, gap in host_gaps(order, starts, traced, serial=serial,
                                  annotated=annotated).items():
            samples[nid].append(gap.us)
            counts[nid].append((gap.events, gap.calls, gap.annotations))
        if not scopes:
            continue
        scope = scopes[i]
        if not order:  # no op replays: the whole step is its tail
            tails.append((scope.dur, begun_in(((scope.pid, scope.tid),), scope.ts,
                                              scope.end + 1e-3, starts, traced, annotated)))
            continue
        first = order[0][2]
        if scope.tid != first.tid:  # the step's own Python is on another thread
            continue
        on_step = ((first.pid, first.tid),)  # the step's own thread
        samples[order[0][0]].append(max(0.0, first.ts - scope.ts))
        counts[order[0][0]].append(begun_in(on_step, scope.ts, first.ts, starts, traced,
                                            annotated))
        last = max((ev for _, tid, ev in order if serial or tid == selected[0].tid),
                   key=lambda ev: ev.end)
        tails.append((max(0.0, scope.end - last.end),
                      begun_in(on_step, last.end, scope.end + 1e-3, starts, traced,
                               annotated)))
    gaps = {nid: _central(v) for nid, v in samples.items()}
    tail = _central([t for t, _ in tails]) if tails else None
    series = list(samples.values()) + [[t for t, _ in tails]]
    totals = _step_totals(series, len(steps))
    medians = sum(_central(s) for s in series if s)
    step_total = typical_step_total(totals, medians) if totals else None
    scale = min(step_total / medians, MAX_SKEW) \
        if step_total is not None and medians > 0 else 1.0
    if step_total is not None:
        step_total = medians * scale

    def typical(kind: int) -> dict[int, int]:  # each gap's median count of one kind
        return {nid: _central_count(samples[nid], [c[kind] for c in v])
                for nid, v in counts.items()}

    def tail_count(kind: int) -> int:
        return _central_count([t for t, _ in tails], [c[kind] for _, c in tails]) \
            if tails else 0

    return ProfileGaps(
        gaps={nid: gap * scale for nid, gap in gaps.items()},
        events=typical(0),
        steps=len(steps),
        profiled=profiled,
        tail=None if tail is None else tail * scale,
        tail_events=tail_count(0),
        calls={nid: n for nid, n in typical(1).items() if any(c[1] for c in counts[nid])},
        tail_calls=tail_count(1),
        annotations={nid: n for nid, n in typical(2).items() if n},
        tail_annotations=tail_count(2),
        step_totals=tuple(totals or ()),
        typical_total=step_total,
        step_spans_us=tuple(scope.dur for scope in scopes or ()),
    )


def _spike_of_two(values: list[float]) -> int | None:
    """Of two samples of a gap, the index of the smaller where the other is a spike
    against it (above ``SPIKE_RATIO`` times it and ``SPIKE_MIN_US`` above it), else
    None. A median of two is their mean: a stall in one of two steps (a schedule's
    ``active=2``, the common choice) went half into the gap, and no check caught it
    (an MLP's Adam step recorded with ``with_stack``: gaps of 19.0 and 2.1 ms in its
    two steps, 10.5 ms replayed against a 5 ms eager step). With three or more, the
    median drops one step's spike by itself."""
    if len(values) != 2:
        return None
    low = 0 if values[0] <= values[1] else 1
    lo, hi = values[low], values[1 - low]
    return low if hi > SPIKE_RATIO * lo and hi > lo + SPIKE_MIN_US else None


def _central(values: list[float]) -> float:
    """A gap's typical value over the steps: the median, save that of two samples one
    of which is a spike against the other, the other (:func:`_spike_of_two`)."""
    low = _spike_of_two(values)
    return values[low] if low is not None else statistics.median(values)


def _central_count(values: list[float], counts: list[int]) -> int:
    """The events (or calls, or annotations) counted in the gap :func:`_central` keeps:
    the kept sample's where it drops a spike, else their median."""
    low = _spike_of_two(values)
    return counts[low] if low is not None else round(statistics.median(counts))


# The most the gaps are scaled by to add up to a typical step: the skew of gaps measured
# on the zoo models (their medians add up to 3-10% less than a median step's). More is
# stalls, which the eager step does not repeat: on a busy machine every profiled step
# of an HF Trainer step stalled a few ms somewhere, the quietest 1.5x the medians'
# sum, and scaling every gap 2.4x replayed 31 ms against an 18 ms eager step (at the
# medians, 18.5 ms).
MAX_SKEW = 1.1
# A step whose gaps add up to more than this times the quietest step's stalled.
STALLED_STEP = 1.5
# The per-gap medians describe the quietest step where they add up to within this of it.
QUIETEST_MATCH = 1.1


def typical_step_total(totals: list[float], medians: float) -> float:
    """The host time between ops of a typical step, which the replayed gaps add up to
    (``medians``: the per-gap medians' sum).

    Each gap's median over the steps is robust to one step's spike, but gaps are
    skewed (a few slow samples, none much faster), so their medians add up to less
    than a typical step spends: 3 to 10% of the gaps on zoo models, 1 to 4% of the
    step, and the replay ran that much fast. The median of the steps' totals keeps
    both, save where steps stalled: where the median step exceeds the quietest one by
    more than ``STALLED_STEP`` and the per-gap medians describe that quietest step
    (a scheduler's 4 ms in two of three steps, at different places), the quietest
    step's total is the program's (the median's, spread over every gap, replayed 5x
    the eager step). A step slow throughout is no stall: its gaps' medians lie above
    the quietest step."""
    typical = statistics.median(totals)
    quietest = min(totals)
    if typical > STALLED_STEP * quietest and \
            medians / QUIETEST_MATCH <= quietest <= medians * QUIETEST_MATCH:
        return quietest
    return typical


def _step_totals(samples: list[list[float]], steps: int) -> list[float] | None:
    """Each step's gaps added up; None unless every gap has one sample per step."""
    series = [s for s in samples if s]
    if steps < 2 or any(len(s) != steps for s in series):
        return None
    return [sum(s[i] for s in series) for i in range(steps)]


def apply_profile_gaps(program: Program, trace: RawTrace, profile: KinetoTrace,
                       host_probe_us: float | None = None, *, serial: bool = True) -> None:
    """Replace the linked host gaps by the profile-only ones of ``profile`` (the capture's
    ``<name>.profile.json``) and say so in ``program.timing.host_gaps``;
    ``host_probe_us``: the capture host's Python speed while it profiled them, which
    ``--host-gaps scaled`` compares its own with."""
    if program.timing is None:
        return
    found = profile_gaps(trace, profile.cpu_ops, python_calls=profile.python_calls,
                         serial=serial)
    if found is None:
        return
    _replace_observer_free(program, found, profile,
                           f"profiled step{'s' if found.steps != 1 else ''}")
    assert program.timing is not None
    program.timing.host_probe_us = host_probe_us


def _replace_observer_free(program: Program, found: ProfileGaps, profile: KinetoTrace,
                           what: str) -> None:
    """Gaps from steps profiled without the ET observer: nothing of it to calibrate
    out, only the profiler's own share (and its memory events, where recorded)."""
    _replace_gaps(program, found)
    assert program.timing is not None
    # The steps whose gaps replay are the program's step as it ran without the
    # observer: their median span is the step time to compare with, not the recorded
    # step's (a span that carries the observer: 69 ms against 12.6 ms for a mixture of
    # experts' step whose observer was started and stopped inside a longer profile).
    spans = found.step_spans_us
    program.timing = replace(program.timing, observer_in_gaps=False,
                             profiled_step_ms=statistics.median(spans) / 1000.0
                             if spans else None,
                             memory_in_gaps=bool(profile.memory), observer_ranges=False,
                             observer_schema="",
                             profiler_options=tuple(sorted(profile.options)))
    others = found.profiled - found.steps
    program.timing.host_gaps = f"{profile.name} (median of {found.steps} {what}" + (
        f"; {others} other profiled step{'s' if others != 1 else ''} ran other ops)"
        if others > 0 else ")")


def _replace_gaps(program: Program, found: ProfileGaps) -> None:
    """Each linked op's gap (and scopes begun in it) and the step's tail from ``found``."""
    for op in program.ops:
        if op.timing is not None:  # unlinked ops have no recorded facts to amend
            op.timing = replace(op.timing, gap_us=found.gaps.get(op.node_id),
                                gap_events=found.events.get(op.node_id, 0),
                                gap_calls=found.calls.get(op.node_id, 0),
                                gap_annotations=found.annotations.get(op.node_id, 0))
    assert program.timing is not None
    program.timing = replace(program.timing, tail_gap_us=found.tail,
                             tail_gap_events=found.tail_events,
                             tail_gap_calls=found.tail_calls,
                             tail_gap_annotations=found.tail_annotations,
                             step_gap_totals_us=found.step_totals,
                             gap_steps=found.steps,
                             step_gap_typical_us=found.typical_total)


def apply_session_steps(program: Program, trace: RawTrace, kineto: KinetoTrace,
                        id_offset: int | None = None, *, serial: bool = True) -> int:
    """Host gaps of a same-session pair (``observer_in_gaps``) from every step of its
    Kineto trace that the ET observer recorded; returns how many (0: none annotated,
    the linked gaps stay).

    torch.profiler's schedule marks each step ``ProfilerStep#N``, and a profiler with
    ``execution_trace_observer`` records the observer in all its active steps. One
    step's gaps moved by a quarter between captures on a shared machine, and by twice
    that where the whole step ran slow; each gap's median over the steps is what
    :func:`profile_gaps` takes from a capture's profile-only steps. A step counts
    where most of its ops carry ids of the ET's nodes (``id_offset``: the constant
    External id - rf_id that linked the trace, if any). With one step, the gaps before
    its first op and after its last (its own Python at either end) are the step's as
    well, as in a profile-only capture.

    Steps the observer did not record (it was started and stopped by hand inside a
    longer profile, as Chakra's and PARAM's collection scripts do) are profile-only
    steps of the same process: where they hold the replayed ops, the gaps come from
    them instead, with no observer's cost to calibrate out (``observer_in_gaps``
    off; the observer costs 10-20 us per op on CPU, far more than what remains of a
    gap once it is subtracted)."""
    if program.timing is None or not program.timing.observer_in_gaps:
        return 0
    # Record functions get ids only while a callback asks for them (the observer's);
    # the profiler writes 0 for the rest, and the ET's root nodes carry 0 as well.
    ids = {n.rf_id for n in trace.nodes if n.rf_id}
    offset = id_offset or 0
    replayed = [op.node_id for op in program.ops]
    span = (min(replayed), max(replayed)) if replayed else None
    steps = [e for e in kineto.cpu_ops if STEP_RE.fullmatch(e.name)] \
        or _unannotated_steps(trace, kineto.cpu_ops, ids, offset, span)
    observed = [s for s in steps if _observed(s, kineto.cpu_ops, ids, offset)]
    if not observed:
        return 0
    unobserved = [s for s in steps if s not in observed]
    free = profile_gaps(trace, kineto.cpu_ops, unobserved, span, kineto.python_calls,
                        serial=serial) if unobserved else None
    if free is not None:
        _replace_observer_free(program, free, kineto, "steps profiled without the ET "
                               "observer" if free.steps > 1 else
                               "step profiled without the ET observer")
        program.timing.profiler_warm = _profiler_ran_before(unobserved, steps)
        return free.steps
    found = profile_gaps(trace, kineto.cpu_ops, observed, span, kineto.python_calls,
                         serial=serial)
    if found is None:
        return 0
    _replace_gaps(program, found)
    program.timing.profiler_warm = _profiler_ran_before(observed, steps)
    program.timing.host_gaps = (
        f"{kineto.name} (median of {found.steps} recorded steps)" if found.steps > 1
        else f"{kineto.name} (its one recorded step, from the step's start to its end)")
    return found.steps


def _profiler_ran_before(used: list[CpuEvent], steps: list[CpuEvent]) -> bool:
    """Whether the profiler recorded, or warmed up on, a step before the first of the
    steps ``used`` (whose gaps are replayed): a step of the trace starts before it, or
    it is ``ProfilerStep#N`` with N >= 1 (a schedule's waiting or warm-up steps ran
    first, which the trace does not hold). Else the profiler started cold at it."""
    first = min(used, key=lambda s: s.ts)
    number = STEP_RE.fullmatch(first.name)
    return any(s.ts < first.ts for s in steps) or (number is not None
                                                     and int(number.group(1)) > 0)


def _unannotated_steps(trace: RawTrace, events: list[CpuEvent], ids: set[int], offset: int,
                       span: tuple[int, int] | None) -> list[CpuEvent]:
    """Steps of a profile that marks none (``prof.step()`` without a schedule writes
    no ``ProfilerStep#N``; the observer started and stopped by hand around one step, as
    PARAM's and Chakra's collection scripts do): the step the observer recorded (the
    span of the ops that carry the ET's ids) and each run, before or after it, of the
    same top-level ops in order on that thread. Each step runs from its first op to
    the end of its last: what runs between steps is not the step's (the observer's
    start, and its stop writing the ET, sit there: taken from the end of the step
    before, a CNN's gaps replayed 4x its eager step). Synthetic events (negative
    index); none where the recorded step is not found or repeats nowhere."""
    nodes = [sel.node for sel in select_ops(trace).ops
             if span is None or span[0] <= sel.node.id <= span[1]]
    if not nodes:
        return []
    main = max({n.tid for n in nodes}, key=lambda t: sum(1 for n in nodes if n.tid == t))
    names = [n.name for n in nodes if n.tid == main]

    def known(e: CpuEvent) -> bool:
        return (e.rf_id in ids if e.rf_id is not None
                else e.external_id is not None and e.external_id - offset in ids)

    linked = [e for e in events if known(e)]
    if not linked:
        return []
    thread = max({e.tid for e in linked}, key=lambda t: sum(1 for e in linked if e.tid == t))
    on_thread = sorted((e for e in events if e.tid == thread), key=lambda e: (e.ts, e.index))
    mine = [e for e in linked if e.tid == thread]
    start, end = min(e.ts for e in mine), max(e.end for e in mine)
    runs: list[tuple[float, float]] = []
    for part in ([e for e in on_thread if e.end <= start], [e for e in on_thread if e.ts >= end]):
        while part:
            found = _match(names, part)
            if found is None:
                break
            runs.append((found[0].ts, found[-1].end))
            part = [e for e in part if e.ts >= found[-1].end]
    if not runs:
        return []
    runs.append((start, end))
    return [CpuEvent(-1 - k, "step", events[0].pid, thread, first, last - first, None, None)
            for k, (first, last) in enumerate(sorted(runs))]


def _observed(step: CpuEvent, events: list[CpuEvent], ids: set[int], offset: int) -> bool:
    """Whether most ops in ``step`` (on its thread) are nodes of the ET, by id: the
    record function id where the trace writes one (torch >= 2.4; its External ids
    count something else), else the External id less ``offset``."""
    inside = [e for e in events if e.tid == step.tid and step.ts <= e.ts
              and e.end <= step.end and e.index != step.index]
    known = sum(1 for e in inside
                if (e.rf_id in ids if e.rf_id is not None
                    else e.external_id is not None and e.external_id - offset in ids))
    return bool(inside) and known * 2 > len(inside)


# A gap of one recorded step this far above the median of its kind is taken for the
# machine's (preemption, an interrupt), not the program's: the scheduler's time slices
# are milliseconds, the Python between two given ops is not.
SPIKE_RATIO = 4.0
SPIKE_MIN_US = 200.0
SPIKE_KIND_MIN = 3


def damp_spikes(program: Program, *, serial: bool = True) -> int:
    """Replay at their kind's median the gaps of a single recorded step that are
    spikes; returns how many.

    Gaps taken from one step (the ET-linked trace itself, with no profile-only steps
    beside it) keep every spike of the machine it ran on: one 4 ms gap doubled a 2 ms
    inference step's replay. A gap's kind is its pair of ops in replay order on its
    replay thread (the op before, the op after, by name); a kind seen at least
    ``SPIKE_KIND_MIN`` times (the layers of a model repeat it) has a median, and a gap
    above ``SPIKE_RATIO`` times that median and ``SPIKE_MIN_US`` above it is a spike.
    Kinds seen fewer times keep their gaps: nothing tells their noise from their
    work."""
    kinds: dict[tuple[int, str, str], list[tuple[Op, OpTiming, float]]] = defaultdict(list)
    previous: dict[int, str] = {}  # per replay thread (one where ``serial``)
    for op in program.ops:
        thread = 0 if serial else op.thread
        timing = op.timing
        if timing is not None and timing.gap_us is not None and thread in previous:
            kinds[(thread, previous[thread], op.name)].append((op, timing, timing.gap_us))
        previous[thread] = op.name
    damped = 0
    for members in kinds.values():
        if len(members) < SPIKE_KIND_MIN:
            continue
        median = statistics.median(gap for _op, _timing, gap in members)
        for op, timing, gap in members:
            if gap > SPIKE_RATIO * median and gap > median + SPIKE_MIN_US:
                op.timing = replace(timing, gap_us=median)
                damped += 1
    return damped


@dataclass(frozen=True)
class PeerWaits:
    """What :func:`remove_peer_waits` took out of the recorded gaps."""

    gaps: int = 0  # gaps that held a wait for a peer
    us: float = 0.0  # their wait, in all


class _WorkScopes:
    """When the work an op issued completed, from one Kineto trace: the backend's
    async-work scopes (``gloo:recv``), by start, per thread and (keyed by pid and
    None) per process, and each thread's event starts. The backend opens a scope when
    it starts the work an op issued (a send's or recv's on the issuing thread, a
    collective's on the backend's worker) and closes it when the work completes, so
    its end is when a peer's data arrived (or a peer took ours)."""

    def __init__(self, events: list[CpuEvent], blocking: set[int] = frozenset()) -> None:
        """`blocking`: the event indices of c10d ops whose thread waited for their work
        (no async_op), whose work therefore started before that thread went on."""
        self.scopes: dict[tuple[object, object], list[CpuEvent]] = defaultdict(list)
        self.starts: dict[tuple[object, object], list[float]] = defaultdict(list)
        for e in events:  # (sorted by start)
            self.starts[(e.pid, e.tid)].append(e.ts)
            if oprules.ASYNC_SCOPE.match(e.name):
                self.scopes[(e.pid, e.tid)].append(e)
                self.scopes[(e.pid, None)].append(e)
        for scopes in self.scopes.values():
            scopes.sort(key=lambda e: e.ts)
        self.queued = self._queued_work(events, blocking)

    def _own_scope(self, issued: CpuEvent) -> CpuEvent | None:
        """The first backend scope opened on the issuing thread within the op's span
        (a send's or recv's, or NCCL's)."""
        found = self.scopes.get((issued.pid, issued.tid), [])
        k = bisect_left(found, issued.ts, key=lambda e: e.ts)
        return found[k] if k < len(found) and found[k].ts <= issued.end else None

    def _queued_work(self, events: list[CpuEvent], blocking: set[int]
                     ) -> dict[int, CpuEvent]:
        """Each c10d op's scope on the backend's worker threads (event index -> scope),
        paired in queue order. Gloo queues a collective's work and its workers take it
        first in, first out; on a busy host they start it after the issuing thread has
        issued the next ones (ZeRO's four broadcasts issued back to back, their scopes
        opened one after another after the fourth returned), so no scope opens within
        an op's span or before its thread's next event. Per process, the ops (those
        without a scope of their own on their thread), in issue order, each take the
        first scope not yet taken, on a thread that issues no c10d op, that opened
        after the op and whose name agrees (gloo runs a reduce-scatter as an
        all-reduce); a blocking op's thread waited for its work, so its scope opened
        before that thread went on, or the trace does not show its work."""
        ops: dict[object, list[CpuEvent]] = defaultdict(list)
        issuing: set[tuple[object, object]] = set()
        for e in events:
            if e.name.startswith("c10d::"):
                issuing.add((e.pid, e.tid))
                if self._own_scope(e) is None:
                    ops[e.pid].append(e)
        paired: dict[int, CpuEvent] = {}
        taken: set[int] = set()
        for pid, issued in ops.items():
            workers = [s for s in self.scopes.get((pid, None), [])
                       if (pid, s.tid) not in issuing]
            for op in issued:  # (in issue order: events are sorted by start)
                latest = self._resumed(op) if op.index in blocking else float("inf")
                for k in range(bisect_left(workers, op.ts, key=lambda e: e.ts),
                               len(workers)):
                    scope = workers[k]
                    if scope.ts > latest:
                        break
                    if scope.index not in taken \
                            and oprules.scope_runs_op(scope.name, op.name):
                        paired[op.index] = scope
                        taken.add(scope.index)
                        break
        return paired

    def _resumed(self, issued: CpuEvent) -> float:
        """When the op's thread began its next event (inf where none)."""
        own = self.starts.get((issued.pid, issued.tid), [])
        j = bisect_left(own, issued.end)
        return own[j] if j < len(own) else float("inf")

    def completed(self, issued: CpuEvent) -> float | None:
        """When the work a c10d op (its linked event `issued`) started completed: the
        end of the first backend scope opened on its thread within its span (a send's
        or recv's, NCCL's), else of its scope on the backend's worker (gloo runs a
        collective's work, ``gloo:all_reduce``, there, :meth:`_queued_work`); None if
        the trace shows neither."""
        own_scope = self._own_scope(issued)
        if own_scope is not None:
            return own_scope.end
        queued = self.queued.get(issued.index)
        return queued.end if queued is not None else None


def _blocking(ops: list[Op], events: dict[int, CpuEvent]) -> set[int]:
    """The linked events of the communication ops whose thread waited for their work."""
    return {events[op.node_id].index for op in ops
            if op.comm is not None and not op.comm.asynchronous and op.node_id in events}


def remove_peer_waits(program: Program, events: dict[int, CpuEvent],
                      kineto: KinetoTrace, *, serial: bool = True) -> PeerWaits:
    """Take out of each recorded gap the time its thread waited for a peer.

    A wait on communication (``work.wait()`` of an isend/irecv or of an async
    collective, or the one a blocking c10d call makes after its op) is no op, so the
    Kineto trace leaves it in a gap: a pipeline stage's gap before the op that reads
    a received tensor held its wait for the previous stage (5 ms of a 5.2 ms gap), and
    the replay busy-waited it as host time, on top of the wait its own comm makes.
    The backend's scope of the work (``gloo:recv``) ends when the work completed;
    where that falls inside a gap, after the work was issued, the thread resumed
    then, so of the gap only the time from the last such completion to the op is host
    work (what ran before the wait began cannot be told from the wait, and is taken
    as none). Measured in the linked step, with the gap
    ``host_gaps`` measures there (``serial`` as it does); a median gap from several
    steps is cut to that host time where it exceeds it."""
    work = _WorkScopes(kineto.cpu_ops, _blocking(program.ops, events))
    # Per replay thread: (issue end, completion) of its async comms not yet complete
    # at its latest gap (gap starts only grow on a thread, so the rest are dropped).
    issued: dict[int | None, list[tuple[float, float]]] = defaultdict(list)
    gaps, removed = 0, 0.0
    order = [(op, op.thread, events.get(op.node_id)) for op in program.ops]
    for op, ev, prev, begin in gap_begins(order, serial=serial):
        lane = None if serial else op.thread
        timing = op.timing
        if prev is not None and timing is not None and timing.gap_us is not None:
            pending = issued[lane] = [(s, d) for s, d in issued[lane] if d > begin]
            ends = [done for start, done in pending if start <= begin and done <= ev.ts]
            host = ev.ts - max(ends) if ends else timing.gap_us
            if host < timing.gap_us:
                gaps += 1
                removed += timing.gap_us - host
                op.timing = replace(timing, gap_us=host)
        # A blocking c10d call waits too: torch.distributed issues the c10d op and
        # calls ``work.wait()`` after it returns, outside any op (gloo's blocking
        # all-reduces in tensor-parallel decoding left 3-4 ms peer waits in the gaps
        # after them: replayed as host time, 85 ms against a 27 ms eager step).
        if op.comm is not None and (op.comm.asynchronous or op.name.startswith("c10d::")):
            done = work.completed(ev)
            if done is not None:
                issued[lane].append((ev.end, done))
    return PeerWaits(gaps, removed)


def work_completions(ops: list[Op], events: dict[int, CpuEvent], kineto: KinetoTrace
                     ) -> dict[int, float]:
    """When each linked communication op's work completed in the original (node id ->
    Kineto time): its backend's scope of the work (gloo,
    :meth:`_WorkScopes.completed`), else the end of the last device activity launched
    within the op (NCCL's kernel); ops whose completion the trace does not show are
    left out."""
    work = _WorkScopes(kineto.cpu_ops, _blocking(ops, events))
    device_end = {g.correlation: g.ts + g.dur for g in kineto.gpu}
    launches: dict[object, list[tuple[float, int]]] = defaultdict(list)
    for r in kineto.runtime:  # (sorted by start)
        if r.correlation in device_end:
            launches[r.tid].append((r.ts, r.correlation))
    found: dict[int, float] = {}
    for op in ops:
        ev = events.get(op.node_id)
        if op.comm is None or ev is None:
            continue
        done = work.completed(ev)
        if done is None:
            on_thread = launches.get(ev.tid, [])
            k = bisect_left(on_thread, (ev.ts, -1))
            ends = [device_end[c] for ts, c in on_thread[k:] if ts <= ev.end]
            done = max(ends) if ends else None
        if done is not None:
            found[op.node_id] = done
    return found
