"""Compare an original trace with the trace of its replay.

* op multisets of the two execution traces, by overload (the ops a benchmark
  replays; the harness's own work, labelled with its profiler scope, is left out);
* with Kineto traces of both: time per op category (:func:`oprules.op_category`) per
  iteration, original vs replay, and the end-to-end error.
"""

from __future__ import annotations

import bisect
import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from mystique_gen import oprules
from mystique_gen.constants import HARNESS_SCOPE, STEP_SCOPE, equivalent_of
from mystique_gen.errors import MystiqueError
from mystique_gen.options import BuildOptions
from mystique_gen.passes.filters import STEP_RE, filter_selection, kineto_steps
from mystique_gen.passes.link import exclusive_times
from mystique_gen.passes.select import select_ops
from mystique_gen.sources.et import RawTrace, load_trace
from mystique_gen.sources.kineto import CpuEvent, KinetoTrace, load_kineto, sidecar_beside


def op_multiset(trace: RawTrace | str | Path, *, by_overload: bool = False,
                iteration: str | None = None,
                profiled_steps: frozenset[int] = frozenset()) -> Counter[str]:
    """The top-level operators (the ones a benchmark replays), with counts: by qualified
    name (``aten::mul``, what filters match), or ``by_overload`` (``aten::mul.Scalar``
    and ``aten::mul.Tensor`` differ). ``iteration`` (``auto``, ``all`` or ``N``): only
    the ops of the step the generator's ``--iteration`` keeps, ``profiled_steps`` the
    steps its Kineto trace holds; None: every op."""
    raw = trace if isinstance(trace, RawTrace) else load_trace(trace)
    selection = select_ops(raw)
    if iteration is not None:
        # A trace `mystique-gen capture` recorded is one step, as the generator takes it.
        one_step = not isinstance(trace, RawTrace) and bool(sidecar_beside(trace))
        selection, _ = filter_selection(raw, selection, BuildOptions(iteration=iteration),
                                        profiled_steps, one_step=one_step)
    ops = [s.node for s in selection.ops if HARNESS_SCOPE not in s.scope
           and not any(equivalent_of(scope) for scope in s.scope)]
    # A replay ran an op it could not call as its portable equivalent, in a scope that
    # names it: the op counts once, not the torch ops that computed it.
    ported = [key for key in map(equivalent_of, (n.name for n in raw.nodes)) if key]
    if by_overload:
        return Counter([overload_name(n.name, n.op_schema) for n in ops] + ported)
    return Counter([n.name for n in ops] + [key.rsplit(".", 1)[0] for key in ported])


def overload_name(name: str, schema: str) -> str:
    """``aten::mul.Scalar`` from a node's schema; ``.default`` where it names none; the
    node's name where no schema was recorded."""
    head = schema.split("(", 1)[0].strip()
    if not head:
        return name
    return head if "." in head.split("::", 1)[-1] else head + ".default"


def multiset_match(original: Counter[str], replay: Counter[str]) -> float:
    """Fraction of the original's ops that the replay matches one for one."""
    total = sum(original.values())
    if total == 0:
        return 1.0 if not replay else 0.0
    common = sum((original & replay).values())
    extra = sum((replay - original).values())
    return max(0.0, (common - extra) / total)


@dataclass
class KinetoTimes:
    """Milliseconds per iteration by op category, from one Kineto trace: medians over
    its annotated steps where it has them, else totals divided by ``iterations``."""

    categories: dict[str, float]
    span_ms: float  # first top-level op start to last end, per iteration
    ops: int  # top-level ops per iteration
    iterations: int
    device_time: bool  # True: GPU activity time; False: host time of top-level ops
    step_spans_ms: list[float] = field(default_factory=list)  # per annotated step used
    cold_steps_dropped: int = 0
    # Steps recorded with the ET observer attached, left out for steps without it.
    observed_steps_dropped: int = 0
    # Every step used was recorded with the observer: its op times include its work.
    observed: bool = False


def _workload_ops(events: list[CpuEvent]) -> list[CpuEvent]:
    """Ops (``ns::name``) outside the harness's scope, in the events' order.
    Annotations ("autograd::engine::evaluate_function: MmBackward0", "ProfilerStep#3")
    are not ops; their ops count instead. A portable equivalent's scope counts as the
    op it ran for (its time in that op's category), and the ops inside it do not."""
    skip_until: dict[tuple, float] = defaultdict(lambda: float("-inf"))
    found = []
    for e in events:  # sorted by (ts, -dur): parents first
        thread = (e.pid, e.tid)
        if e.ts < skip_until[thread]:
            continue
        ported = equivalent_of(e.name)
        if e.name == HARNESS_SCOPE or ported:
            skip_until[thread] = max(skip_until[thread], e.end)
            if ported:
                found.append(replace(e, name=ported))
        elif "::" in e.name and " " not in e.name:
            found.append(e)
    return found


def _top_level(ops: list[CpuEvent]) -> list[CpuEvent]:
    """The outermost of ``ops`` (:func:`_workload_ops`) per thread."""
    end: dict[tuple, float] = defaultdict(lambda: float("-inf"))
    top = []
    for e in ops:
        if e.ts >= end[(e.pid, e.tid)]:
            top.append(e)
            end[(e.pid, e.tid)] = e.end
    return top


def step_windows(events: list) -> tuple[list[tuple[float, float]], bool]:
    """(start, end) in microseconds of each annotated step, in time order, and whether
    the first is the profiler's cold first step: the capture's ``MystiqueProfiledStep``
    scopes (the profiler starts with the first), or torch.profiler's ``ProfilerStep#N``
    (a benchmark's ``--profile``, a training loop profiled with a schedule), cold where
    the first is ``ProfilerStep#0`` (no schedule warm-up before it)."""
    ours = [(e.ts, e.end) for e in events if e.name == STEP_SCOPE]
    if ours:
        return sorted(ours), True
    marked = sorted((e.ts, e.end, e.name) for e in events
                    if STEP_RE.fullmatch(e.name) is not None)
    cold = bool(marked) and marked[0][2].endswith("#0")
    return [(start, end) for start, end, _name in marked], cold


def _harness_correlations(trace: KinetoTrace) -> set[int]:
    """Correlation ids of the device work the harness launched (inside its scope: the
    input resets, the barrier before each iteration), which the workload did not."""
    spans: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for e in trace.cpu_ops:
        if e.name == HARNESS_SCOPE:
            spans[(e.pid, e.tid)].append((e.ts, e.end))
    merged: dict[tuple, list[tuple[float, float]]] = {}
    for key, found in spans.items():
        out: list[tuple[float, float]] = []
        for start, end in sorted(found):
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        merged[key] = out
    inside = set()
    for call in trace.runtime:
        out = merged.get((call.pid, call.tid), [])
        i = bisect.bisect_right(out, (call.ts, float("inf"))) - 1
        if i >= 0 and call.ts <= out[i][1]:
            inside.add(call.correlation)
    return inside


def _self_times(ops: list[CpuEvent]) -> list[tuple[CpuEvent, float]]:
    """(op, exclusive microseconds) for every one of ``ops`` (:func:`_workload_ops`), at
    every depth: its duration less its child ops' (passes/link.py's
    :func:`exclusive_times`).

    Time is categorised by what ran, not by the outermost op's name: a replay runs a
    composite op as its children where later ops read its inner results
    (``scaled_dot_product_attention``'s softmax, ``dropout``'s mask), and an inclusive
    time per top-level op put the whole attention under matmul in the original and
    a third of it under elementwise in the replay (17 points apart on one encoder's
    training step). Exclusive times agree at any granularity."""
    exclusive = exclusive_times(ops)
    return [(e, exclusive[e.index]) for e in ops]


def _category_times(ops: list[tuple[CpuEvent, float]], gpu: list) -> dict[str, float]:
    """Microseconds by category: GPU activity where there is any (annotations left
    out: ``ProfilerStep#N`` spans a whole step on the device too), else host ops'
    exclusive time (:func:`_self_times`)."""
    categories = dict.fromkeys(oprules.CATEGORY_ORDER, 0.0)
    if gpu:
        for g in gpu:
            if g.category == "gpu_user_annotation":
                continue
            cat = "memory" if "mem" in g.category else oprules.op_category(g.name)
            categories[cat] = categories.get(cat, 0.0) + g.dur
    else:
        for e, self_us in ops:
            cat = oprules.op_category(e.name)
            categories[cat] = categories.get(cat, 0.0) + self_us
    return categories


def _span(ops: list) -> float:
    return (max(e.end for e in ops) - min(e.ts for e in ops)) if ops else 0.0


def _observed(ops: list[CpuEvent]) -> bool:
    """Whether most of ``ops`` carry a record function id: the profiler writes one only
    while a callback asks for them (the ET observer's), else 0 (torch >= 2.4)."""
    known = [e.rf_id for e in ops if e.rf_id is not None]
    return bool(known) and sum(1 for i in known if i) * 2 > len(known)


def kineto_times(path: str | Path | KinetoTrace, iterations: int | None = 1) -> KinetoTimes:
    """Category times of a Kineto trace per iteration; device time leaves out what the
    harness launched.

    ``iterations=None``: per annotated step (:func:`step_windows`), the median of each
    figure over the steps, leaving out a cold first step where there are three or
    more (the profiler's first step pays for its warm-up and cold caches), and steps
    the ET observer recorded where others were profiled without it (the observer costs
    10-20 us per op on CPU, in the ops and between them); a trace without step
    annotations is one iteration. A number: totals divided by it.
    """
    trace = path if isinstance(path, KinetoTrace) else load_kineto(path)
    ops = _workload_ops(trace.cpu_ops)
    top = _top_level(ops)
    timed = [] if trace.gpu else _self_times(ops)  # host time only where no device time
    harness = _harness_correlations(trace) if trace.gpu else set()
    workload = [g for g in trace.gpu if g.correlation not in harness]
    windows, cold = step_windows(trace.cpu_ops) if iterations is None else ([], False)
    if not windows:
        n = max(iterations or 1, 1)
        categories = _category_times(timed, workload)
        return KinetoTimes(
            categories={k: v / 1000.0 / n for k, v in categories.items()},
            span_ms=_span(top) / 1000.0 / n, ops=len(top) // n, iterations=n,
            device_time=bool(trace.gpu), observed=_observed(top))
    dropped = 1 if cold and len(windows) >= 3 else 0
    windows = windows[dropped:]
    outers = [(start, end, [e for e in top if start <= e.ts < end]) for start, end in windows]
    free = [w for w in outers if not _observed(w[2])]
    observed_dropped = len(outers) - len(free) if free else 0
    windows = free or outers
    launched = {r.correlation: r.ts for r in trace.runtime}
    steps = []
    for start, end, outer in windows:
        gpu = [g for g in workload if start <= launched.get(g.correlation, -1.0) < end]
        inside = [(e, t) for e, t in timed if start <= e.ts < end]
        steps.append((outer, _category_times(inside, gpu)))
    names = {k for _ops, cats in steps for k in cats}
    return KinetoTimes(
        categories={k: statistics.median(c.get(k, 0.0) for _o, c in steps) / 1000.0
                    for k in names},
        span_ms=statistics.median(_span(ops) for ops, _c in steps) / 1000.0,
        ops=round(statistics.median(len(ops) for ops, _c in steps)),
        iterations=len(windows), device_time=bool(trace.gpu),
        step_spans_ms=[_span(ops) / 1000.0 for ops, _c in steps],
        cold_steps_dropped=dropped, observed_steps_dropped=observed_dropped,
        observed=not free,
    )


@dataclass
class Comparison:
    match: float
    original_ops: int
    replay_ops: int
    differences: list[tuple[str, int, int]]  # (op, original count, replay count)
    original_times: KinetoTimes | None = None
    replay_times: KinetoTimes | None = None
    notes: list[str] = field(default_factory=list)
    original_step_ms: float | None = None  # the clock: eager step, measured
    replay_iter_ms: float | None = None  # the clock: benchmark iteration, measured
    # What one step allocates at once above its inputs, measured on both sides (the
    # capture's step_peak_bytes, the benchmark's peak_step_bytes).
    original_peak_bytes: float | None = None
    replay_peak_bytes: float | None = None

    @property
    def memory_error(self) -> float | None:
        if not self.original_peak_bytes or self.replay_peak_bytes is None:
            return None
        return self.replay_peak_bytes / self.original_peak_bytes - 1.0

    def shares(self) -> dict[str, tuple[float, float]]:
        """Per category, its share of the categorised time: (original, replay)."""
        assert self.original_times and self.replay_times
        o, r = self.original_times.categories, self.replay_times.categories
        total_o, total_r = sum(o.values()) or 1.0, sum(r.values()) or 1.0
        return {k: (o.get(k, 0.0) / total_o, r.get(k, 0.0) / total_r)
                for k in _categories(self)}

    @property
    def clock_error(self) -> float | None:
        """(replay - original) / original of the measured step times."""
        if not self.original_step_ms or self.replay_iter_ms is None:
            return None
        return self.replay_iter_ms / self.original_step_ms - 1.0

    @property
    def e2e_error(self) -> float | None:
        """(replay - original) / original of the per-iteration span."""
        o, r = self.original_times, self.replay_times
        if o is None or r is None or o.span_ms <= 0:
            return None
        return (r.span_ms - o.span_ms) / o.span_ms

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "op_multiset_match": self.match,
            "original_ops": self.original_ops,
            "replay_ops": self.replay_ops,
            "differences": [{"op": n, "original": a, "replay": b}
                            for n, a, b in self.differences],
        }
        if self.original_times and self.replay_times:
            shares = self.shares()
            out["category_ms"] = {
                k: {"original": self.original_times.categories.get(k, 0.0),
                    "replay": self.replay_times.categories.get(k, 0.0),
                    "original_share": shares[k][0], "replay_share": shares[k][1]}
                for k in _categories(self)
            }
            out["original_ms"] = self.original_times.span_ms
            out["replay_ms"] = self.replay_times.span_ms
            out["replay_iterations"] = self.replay_times.iterations
            out["e2e_error"] = self.e2e_error
            out["original_step_spans_ms"] = self.original_times.step_spans_ms
            out["replay_step_spans_ms"] = self.replay_times.step_spans_ms
        if self.original_step_ms is not None:
            out["original_step_ms"] = self.original_step_ms
        if self.replay_iter_ms is not None:
            out["replay_iter_ms"] = self.replay_iter_ms
        out["clock_error"] = self.clock_error
        if self.original_peak_bytes is not None or self.replay_peak_bytes is not None:
            out["peak_step_bytes"] = {"original": self.original_peak_bytes,
                                      "replay": self.replay_peak_bytes,
                                      "error": self.memory_error}
        out["notes"] = self.notes
        return out


def _categories(c: Comparison) -> list[str]:
    assert c.original_times and c.replay_times
    extra = sorted((set(c.original_times.categories) | set(c.replay_times.categories))
                   - set(oprules.CATEGORY_ORDER))
    return list(oprules.CATEGORY_ORDER) + extra


CLOCK_TOLERANCE = 0.05  # Kineto span vs the measured step: beyond this, say so


def compare_traces(original: str | Path, replay: str | Path, *,
                   kineto_original: str | Path | None = None,
                   kineto_replay: str | Path | None = None,
                   replay_iterations: int | None = None,
                   original_step_ms: float | None = None,
                   replay_iter_ms: float | None = None,
                   original_peak_bytes: float | None = None,
                   replay_peak_bytes: float | None = None,
                   iteration: str = "auto") -> Comparison:
    """Compare two ETs and, where both are given, their Kineto traces.

    Kineto figures are per-step medians where a trace annotates its steps (a capture's
    profile, a benchmark's ``--profile``). A replay trace without annotations is taken
    as ``replay_iterations`` iterations, or else as many as the ratio of the two traces'
    top-level op counts. ``original_step_ms`` (the capture's ``<name>.step.json``) and
    ``replay_iter_ms`` (the benchmark's ``--json`` ``iter_ms_median``) are the clock:
    the Kineto spans are checked against them, and their ratio is reported beside.
    ``original_peak_bytes`` and ``replay_peak_bytes`` (the same files'
    ``step_peak_bytes`` and ``peak_step_bytes``) compare one step's memory. Of an ET
    that recorded several steps, the ops of the step the generator keeps by default
    count (``iteration``: its ``--iteration``); the replay's ET is one iteration.
    """
    if (kineto_original is None) != (kineto_replay is None):
        raise MystiqueError("give both --kineto-original and --kineto-replay, or neither")
    original_kineto = load_kineto(kineto_original) if kineto_original is not None else None
    a = op_multiset(original, by_overload=True, iteration=iteration,
                    profiled_steps=kineto_steps(original_kineto))
    b = op_multiset(replay, by_overload=True)  # the benchmark records one iteration
    names = sorted(set(a) | set(b))
    diffs = [(n, a[n], b[n]) for n in names if a[n] != b[n]]
    diffs.sort(key=lambda d: (-abs(d[1] - d[2]), d[0]))
    result = Comparison(multiset_match(a, b), sum(a.values()), sum(b.values()), diffs,
                        original_step_ms=original_step_ms, replay_iter_ms=replay_iter_ms,
                        original_peak_bytes=original_peak_bytes,
                        replay_peak_bytes=replay_peak_bytes)
    if original_kineto is not None and kineto_replay is not None:
        times = result.original_times = kineto_times(original_kineto, None)
        steps = round(times.ops / result.original_ops) if result.original_ops else 1
        if not times.step_spans_ms and steps >= 2:
            # No step annotations (a plain profile of several steps taken apart from
            # the ET): its totals were read as one step, five steps as one.
            times = result.original_times = kineto_times(original_kineto, steps)
            result.notes.append(
                f"original Kineto trace marks no steps: taken as {steps} iterations "
                f"(its {times.ops * steps} top-level ops against the ET's "
                f"{result.original_ops})")
        left_out = [what for what, n in (("the first, cold", times.cold_steps_dropped),
                                         (f"{times.observed_steps_dropped} the ET observer "
                                          "recorded", times.observed_steps_dropped)) if n]
        if left_out:
            result.notes.append(
                f"original: medians over {times.iterations} profiled steps "
                f"({' and '.join(left_out)}, left out)")
        if times.observed:
            result.notes.append(
                "original: recorded with the ET observer attached (a same-session pair "
                "or a capture's .kineto.json): its op times and gaps include the "
                "observer's work, so the replay reads fast against it; compare against "
                "steps profiled without it (a capture's .profile.json) or the clock "
                "(--step-json, --bench-json)")
        result.replay_times = _replay_times(kineto_replay, replay_iterations,
                                            result.original_times, result.notes)
        for side, times, clock, where in (
                ("original", result.original_times, original_step_ms, "step.json"),
                ("replay", result.replay_times, replay_iter_ms, "iter_ms_median")):
            if clock and times.span_ms > 0:
                off = times.span_ms / clock - 1.0
                if abs(off) > CLOCK_TOLERANCE:
                    result.notes.append(
                        f"{side}: the Kineto span ({times.span_ms:.3f} ms) and the "
                        f"measured step ({clock:.3f} ms, {where}) differ by "
                        f"{off * 100:+.1f}%: trust the clock's error")
    return result


def _replay_times(path: str | Path, iterations: int | None, original: KinetoTimes,
                  notes: list[str]) -> KinetoTimes:
    trace = load_kineto(path)  # read once, whichever way it is divided
    if iterations is not None:
        return kineto_times(trace, iterations)
    stepped = kineto_times(trace, None)
    if stepped.step_spans_ms:
        dropped = " (the first, cold, left out)" if stepped.cold_steps_dropped else ""
        notes.append(f"replay: medians over {stepped.iterations} profiled steps{dropped}")
        return stepped
    # No step annotations: ``stepped`` is the whole trace as one iteration.
    iters = max(1, round(stepped.ops / max(original.ops, 1)))
    notes.append(f"replay Kineto trace taken as {iters} iteration(s) "
                 "(ratio of top-level op counts)")
    return kineto_times(trace, iters)


def read_clock(path: str | Path, key: str) -> float:
    """``key`` from a JSON file: a capture's ``<name>.step.json``, or a benchmark's
    ``--json`` output (its last line that parses as a JSON object)."""
    value = read_number(path, key)
    if value is None:
        raise MystiqueError(f"{Path(path).name}: no JSON object with a numeric {key!r}")
    return value


def read_number(path: str | Path, key: str) -> float | None:
    """As :func:`read_clock`, None where no JSON object in the file holds ``key``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise MystiqueError(f"cannot read {path}: {exc.strerror}") from None
    candidates = [text] + [line for line in reversed(text.splitlines()) if line.strip()]
    for chunk in candidates:
        try:
            doc = json.loads(chunk)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get(key), int | float):
            return float(doc[key])
    return None


def step_json_beside(kineto: str | Path) -> Path | None:
    """The capture's ``<name>.step.json`` next to its ``<name>.profile.json`` or
    ``<name>.kineto.json``, if there is one."""
    path = Path(kineto)
    for suffix in (".profile.json", ".kineto.json"):
        if path.name.endswith(suffix):
            candidate = path.with_name(path.name[: -len(suffix)] + ".step.json")
            return candidate if candidate.is_file() else None
    return None


def format_comparison(c: Comparison) -> str:
    lines = [f"op-multiset match: {c.match * 100:.2f}% "
             f"({c.original_ops} original ops, {c.replay_ops} replayed)"]
    if c.differences:
        lines.append("op count differences (original -> replay):")
        width = max(len(n) for n, _, _ in c.differences[:30])
        for n, a, b in c.differences[:30]:
            lines.append(f"  {n:<{width}}  {a:>6} -> {b:<6} ({b - a:+d})")
        if len(c.differences) > 30:
            lines.append(f"  ... {len(c.differences) - 30} more")
    o, r = c.original_times, c.replay_times
    if o and r:
        what = "device" if o.device_time else "host time of top-level ops"
        lines.append(f"time per iteration by category, ms ({what}), and share of the time:")
        lines.append(f"  {'category':<14} {'original':>10} {'replay':>10} {'error':>8} "
                     f"{'share':>7} {'share':>7}")
        shares = c.shares()
        for k in _categories(c):
            x, y = o.categories.get(k, 0.0), r.categories.get(k, 0.0)
            if x == 0 and y == 0:
                continue
            err = f"{(y - x) / x * 100:+.1f}%" if x else "n/a"
            a, b = shares[k]
            lines.append(f"  {k:<14} {x:>10.3f} {y:>10.3f} {err:>8} {a * 100:>6.1f}% "
                         f"{b * 100:>6.1f}%")
        e2e = c.e2e_error
        lines.append(f"end to end: original {o.span_ms:.3f} ms, replay {r.span_ms:.3f} ms"
                     + (f", error {e2e * 100:+.1f}%" if e2e is not None else ""))
    clock = c.clock_error
    if clock is not None:
        assert c.original_step_ms is not None and c.replay_iter_ms is not None
        lines.append(f"measured: eager step {c.original_step_ms:.3f} ms, benchmark "
                     f"{c.replay_iter_ms:.3f} ms, error {clock * 100:+.1f}%")
    if c.original_peak_bytes is not None and c.replay_peak_bytes is not None:
        err = c.memory_error
        lines.append(f"peak memory of one step above its inputs: original "
                     f"{c.original_peak_bytes / 2**20:.2f} MiB, replay "
                     f"{c.replay_peak_bytes / 2**20:.2f} MiB"
                     + (f", error {err * 100:+.1f}%" if err is not None else ""))
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)


def plot_comparison(c: Comparison, out: str | Path) -> list[str]:
    """Side-by-side bars of per-category time, original vs replay, and of one step's
    peak memory where both are known (needs matplotlib). Returns the panels' titles."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MystiqueError("--plot needs matplotlib: pip install 'mystique-gen[plot]'") \
            from None
    if not (c.original_times and c.replay_times):
        raise MystiqueError("--plot needs --kineto-original and --kineto-replay")
    cats = [k for k in _categories(c)
            if c.original_times.categories.get(k) or c.replay_times.categories.get(k)]
    xs = range(len(cats))
    memory = c.original_peak_bytes is not None and c.replay_peak_bytes is not None
    fig, axes = plt.subplots(1, 2 if memory else 1, squeeze=False,
                             figsize=(max(6, 1.2 * len(cats)) + (2.5 if memory else 0), 4),
                             gridspec_kw={"width_ratios": [max(len(cats), 1), 1.5]}
                             if memory else None)
    ax = axes[0][0]
    ax.bar([x - 0.2 for x in xs], [c.original_times.categories.get(k, 0) for k in cats],
           width=0.4, label=f"original ({c.original_times.span_ms:.2f} ms)")
    ax.bar([x + 0.2 for x in xs], [c.replay_times.categories.get(k, 0) for k in cats],
           width=0.4, label=f"replay ({c.replay_times.span_ms:.2f} ms)")
    ax.set_xticks(list(xs), cats)
    ax.set_ylabel("ms per iteration")
    ax.set_title(f"op-multiset match {c.match * 100:.1f}%")
    if memory:  # one step's peak above its inputs, side by side
        mem = axes[0][1]
        peaks = [float(c.original_peak_bytes or 0) / 2**20,
                 float(c.replay_peak_bytes or 0) / 2**20]
        mem.bar([0, 1], peaks, color=["C0", "C1"], width=0.6)
        mem.set_xticks([0, 1], ["original", "replay"])
        mem.set_ylabel("MiB")
        mem.set_title("peak memory of one step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(out))
    titles = [a.get_title() for a in axes[0]]
    plt.close(fig)
    return titles
