"""Compare an original trace with the trace of its replay.

* op multisets of the two execution traces, by overload (the ops a benchmark
  replays; the harness's own work, labelled with its profiler scope, is left out);
* with Kineto traces of both: time per op category (:func:`oprules.op_category`) per
  iteration, original vs replay, and the end-to-end error.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from mystique_gen import oprules
from mystique_gen.constants import HARNESS_SCOPE, STEP_SCOPE
from mystique_gen.errors import MystiqueError
from mystique_gen.passes.filters import STEP_RE
from mystique_gen.passes.select import select_ops
from mystique_gen.sources.et import RawTrace, load_trace
from mystique_gen.sources.kineto import KinetoTrace, load_kineto


def op_multiset(trace: RawTrace | str | Path, *, by_overload: bool = False) -> Counter[str]:
    """The top-level operators (the ones a benchmark replays), with counts: by qualified
    name (``aten::mul``, what filters match), or ``by_overload`` (``aten::mul.Scalar``
    and ``aten::mul.Tensor`` differ)."""
    raw = trace if isinstance(trace, RawTrace) else load_trace(trace)
    ops = [s.node for s in select_ops(raw).ops if HARNESS_SCOPE not in s.scope]
    if by_overload:
        return Counter(overload_name(n.name, n.op_schema) for n in ops)
    return Counter(n.name for n in ops)


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
    """Per-iteration milliseconds by op category, from one Kineto trace."""

    categories: dict[str, float]
    span_ms: float  # first top-level op start to last end, per iteration
    ops: int  # top-level ops per iteration
    iterations: int
    device_time: bool  # True: GPU activity time; False: host time of top-level ops


def _top_level(events: list) -> list:
    """Outermost ops (``ns::name``) per thread, leaving out the harness's scope."""
    by_thread: dict[tuple, list] = {}
    for e in events:
        by_thread.setdefault((e.pid, e.tid), []).append(e)
    top = []
    for evs in by_thread.values():
        end = float("-inf")
        harness_end = float("-inf")
        for e in evs:  # sorted by (ts, -dur): parents first
            if e.name == HARNESS_SCOPE:
                harness_end = max(harness_end, e.end)
                continue
            # Ops are "ns::name"; annotations ("autograd::engine::evaluate_function:
            # MmBackward0", "ProfilerStep#3") are not, and their ops count instead.
            if "::" not in e.name or " " in e.name or e.ts < end or e.ts < harness_end:
                continue
            top.append(e)
            end = e.end
    return top


def marked_steps(trace: KinetoTrace) -> int:
    """The steps a Kineto trace marks: the capture's ``MystiqueProfiledStep``
    annotations, else torch.profiler's ``ProfilerStep#N`` (a benchmark's ``--profile``,
    a training loop profiled with a schedule); 0 where it marks none."""
    scoped = sum(e.name == STEP_SCOPE for e in trace.cpu_ops)
    return scoped or sum(STEP_RE.fullmatch(e.name) is not None for e in trace.cpu_ops)


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


def kineto_times(path: str | Path | KinetoTrace, iterations: int | None = 1) -> KinetoTimes:
    """Category times of a Kineto trace, divided by ``iterations`` (None: the steps it
    marks, :func:`marked_steps`; one where it marks none).

    Device time counts GPU activity, less annotations (``ProfilerStep#N`` spans a whole
    step on the device too) and less what the harness launched."""

    trace = path if isinstance(path, KinetoTrace) else load_kineto(path)
    if iterations is None:
        iterations = marked_steps(trace) or 1
    top = _top_level(trace.cpu_ops)
    categories = dict.fromkeys(oprules.CATEGORY_ORDER, 0.0)
    if trace.gpu:
        harness = _harness_correlations(trace)
        for g in trace.gpu:
            if g.category == "gpu_user_annotation" or g.correlation in harness:
                continue
            cat = "memory" if "mem" in g.category else oprules.op_category(g.name)
            categories[cat] = categories.get(cat, 0.0) + g.dur
    else:
        for e in top:
            cat = oprules.op_category(e.name)
            categories[cat] = categories.get(cat, 0.0) + e.dur
    n = max(iterations, 1)
    span = (max(e.end for e in top) - min(e.ts for e in top)) if top else 0.0
    return KinetoTimes(
        categories={k: v / 1000.0 / n for k, v in categories.items()},
        span_ms=span / 1000.0 / n, ops=len(top) // n, iterations=n,
        device_time=bool(trace.gpu),
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
            out["category_ms"] = {
                k: {"original": self.original_times.categories.get(k, 0.0),
                    "replay": self.replay_times.categories.get(k, 0.0)}
                for k in _categories(self)
            }
            out["original_ms"] = self.original_times.span_ms
            out["replay_ms"] = self.replay_times.span_ms
            out["replay_iterations"] = self.replay_times.iterations
            out["e2e_error"] = self.e2e_error
        out["notes"] = self.notes
        return out


def _categories(c: Comparison) -> list[str]:
    assert c.original_times and c.replay_times
    extra = sorted((set(c.original_times.categories) | set(c.replay_times.categories))
                   - set(oprules.CATEGORY_ORDER))
    return list(oprules.CATEGORY_ORDER) + extra


def compare_traces(original: str | Path, replay: str | Path, *,
                   kineto_original: str | Path | None = None,
                   kineto_replay: str | Path | None = None,
                   replay_iterations: int | None = None) -> Comparison:
    """Compare two ETs and, where both are given, their Kineto traces.

    The replay's Kineto trace usually covers several iterations (the benchmark's
    ``--profile``, one ``ProfilerStep#N`` each); unless ``replay_iterations`` says how
    many, they are the steps it marks, or where it marks none (a profile written before
    benchmarks marked steps), the ratio of the two traces' top-level op counts.
    """
    a, b = op_multiset(original, by_overload=True), op_multiset(replay, by_overload=True)
    names = sorted(set(a) | set(b))
    diffs = [(n, a[n], b[n]) for n in names if a[n] != b[n]]
    diffs.sort(key=lambda d: (-abs(d[1] - d[2]), d[0]))
    result = Comparison(multiset_match(a, b), sum(a.values()), sum(b.values()), diffs)
    if (kineto_original is None) != (kineto_replay is None):
        raise MystiqueError("give both --kineto-original and --kineto-replay, or neither")
    if kineto_original is not None and kineto_replay is not None:
        result.original_times = kineto_times(kineto_original, None)
        replay = load_kineto(kineto_replay)
        iters = replay_iterations or marked_steps(replay)
        if not iters:
            once = kineto_times(replay)
            iters = max(1, round(once.ops / max(result.original_times.ops, 1)))
            result.notes.append(f"replay Kineto trace taken as {iters} iteration(s) "
                                "(ratio of top-level op counts)")
        result.replay_times = kineto_times(replay, iters)
    return result


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
        lines.append(f"time per iteration by category, ms ({what}):")
        lines.append(f"  {'category':<14} {'original':>10} {'replay':>10} {'error':>8}")
        for k in _categories(c):
            x, y = o.categories.get(k, 0.0), r.categories.get(k, 0.0)
            if x == 0 and y == 0:
                continue
            err = f"{(y - x) / x * 100:+.1f}%" if x else "n/a"
            lines.append(f"  {k:<14} {x:>10.3f} {y:>10.3f} {err:>8}")
        e2e = c.e2e_error
        lines.append(f"end to end: original {o.span_ms:.3f} ms, replay {r.span_ms:.3f} ms"
                     + (f", error {e2e * 100:+.1f}%" if e2e is not None else ""))
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)


def plot_comparison(c: Comparison, out: str | Path) -> None:
    """Side-by-side bars of per-category time, original vs replay (needs matplotlib)."""
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
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats)), 4))
    ax.bar([x - 0.2 for x in xs], [c.original_times.categories.get(k, 0) for k in cats],
           width=0.4, label=f"original ({c.original_times.span_ms:.2f} ms)")
    ax.bar([x + 0.2 for x in xs], [c.replay_times.categories.get(k, 0) for k in cats],
           width=0.4, label=f"replay ({c.replay_times.span_ms:.2f} ms)")
    ax.set_xticks(list(xs), cats)
    ax.set_ylabel("ms per iteration")
    ax.set_title(f"op-multiset match {c.match * 100:.1f}%")
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(out))
    plt.close(fig)
