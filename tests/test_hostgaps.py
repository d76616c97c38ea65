"""Host gaps from the capture's profile-only steps (passes/hostgaps.py) and the
benchmark's subtraction of its own per-op host time (``_calibrate_gaps``)."""

from __future__ import annotations

import json
import re
import statistics
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import (
    ExecutionTraceObserver,
    ProfilerActivity,
    profile,
    schedule,
    tensorboard_trace_handler,
)

from mystique_gen.constants import STEP_SCOPE
from mystique_gen.driver import compile_trace, generate
from mystique_gen.harness import runtime
from mystique_gen.ir.dist import CommInfo
from mystique_gen.ir.program import OpTiming
from mystique_gen.options import BuildOptions
from mystique_gen.passes.hostgaps import (
    _match,
    _observed,
    profile_gaps,
    remove_peer_waits,
    typical_step_total,
    work_completions,
)
from mystique_gen.passes.select import select_ops
from mystique_gen.sources.et import load_trace, trace_from_document
from mystique_gen.sources.kineto import (
    CpuEvent,
    GpuEvent,
    KinetoTrace,
    RuntimeEvent,
    load_kineto,
    profile_beside,
)
from mystique_gen.tools.capture import capture
from mystique_gen.tools.compare import compare_traces, kineto_times, op_multiset
from tests.conftest import last_json, run_benchmark
from tests.golden_cases import kineto_doc, two_stream
from tests.models import MODELS
from tests.tracebuilder import MM, RELU, TraceBuilder


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("gaps")
    result = capture(MODELS["mlp_sgd"](), out, name="mlp", timing_iters=1, profile_steps=3)
    return result


def _ev(index: int, name: str, ts: float, dur: float, tid: int = 1,
        annotation: bool = False) -> CpuEvent:
    return CpuEvent(index, name, 0, tid, ts, dur, None, None, annotation)


def test_gaps_add_up_to_a_median_steps_host_time():
    """Three steps, each slow in a different gap: every gap's median is 2 us, but a
    typical step spends 2 + 2 + 8 = 12 us between its ops, not 6."""
    assert typical_step_total([12.0, 12.0, 12.0], 6.0) == 12.0  # twice the medians' 6
    # Two of three steps stalled 4 ms at different places: the per-gap medians (1.5 ms)
    # describe the quietest step, whose total is the program's, not the median's stall
    # spread over every gap (3.7x before).
    assert typical_step_total([1500.0, 5500.0, 5500.0], 1500.0) == 1500.0
    # A step slow throughout (this VM's two speeds) is no stall: the medians lie above
    # the quietest step, and the median step stays.
    assert typical_step_total([2.0, 6.0, 4.0], 4.0) == 4.0


def test_gaps_scale_by_the_skew_of_gaps_not_by_stalls(captured):
    """Every profiled step stalled 1 ms at a different place (a busy machine): the
    per-gap medians drop the stalls and every step adds up to far more than they do.
    The gaps scale by at most the skew measured on the zoo (10%), not by the stalls
    (3.6x here): the eager step does not repeat them."""
    trace = load_trace(captured.et_path)
    nodes = [s.node for s in select_ops(trace).ops]
    events, t = [], 0.0
    for stalled in (3, 7, 11):
        start = t
        for k, node in enumerate(nodes):
            events.append(_ev(len(events), node.name, t, 1.0))
            t += 1.0 + 10.0 + (1000.0 if k == stalled else 0.0)
        events.append(_ev(len(events), STEP_SCOPE, start - 0.5, t - start))
        t += 100.0
    found = profile_gaps(trace, sorted(events, key=lambda e: (e.ts, -e.dur)))
    assert found is not None and found.typical_total is not None
    medians = sum(found.gaps.values()) / 1.1 + found.tail / 1.1
    assert min(found.step_totals) > 3 * medians
    assert found.gaps[nodes[5].id] == pytest.approx(11.0)  # 10 us, scaled by 1.1
    assert found.typical_total == pytest.approx(1.1 * medians)


def test_match_skips_children_and_needs_every_name():
    events = [_ev(0, "a", 0, 10), _ev(1, "b", 2, 3), _ev(2, "b", 12, 2), _ev(3, "c", 20, 1)]
    assert [e.index for e in _match(["a", "b", "c"], events)] == [0, 2, 3]
    assert _match(["a", "d"], events) is None


def test_profile_gaps_median_over_steps(captured):
    trace = load_trace(captured.et_path)
    nodes = [s.node for s in select_ops(trace).ops]
    assert len({n.tid for n in nodes}) == 1
    events, t = [], 0.0
    for gap in (2.0, 6.0, 4.0):  # the median step gap is 4 us
        start = t
        for node in nodes:
            events.append(_ev(len(events), node.name, t, 1.0))
            t += 1.0 + gap
        events.append(_ev(len(events), STEP_SCOPE, start - 0.5, t - start))
        t += 100.0
    found = profile_gaps(trace, sorted(events, key=lambda e: (e.ts, -e.dur)))
    assert found is not None
    gaps, steps, tail = found.gaps, found.steps, found.tail
    assert steps == 3 and set(found.events.values()) == {0} and found.tail_events == 0
    # The first op's gap is the step's own host time before it (0.5 us after the
    # step began); the tail is the time from the last op's end to the step's end.
    assert gaps == {nodes[0].id: pytest.approx(0.5),
                    **{n.id: pytest.approx(4.0) for n in nodes[1:]}}
    assert tail == pytest.approx(3.5)  # per step: gap - 0.5 us, median of 1.5, 5.5, 3.5
    # Each step's gaps in total, the first op's and the tail included: how far the
    # steps disagree is the recording's noise (a same-session pair weighs it).
    n = len(nodes)
    assert found.step_totals == pytest.approx(
        [0.5 + (n - 1) * gap + gap - 0.5 for gap in (2.0, 6.0, 4.0)])
    # An op missing from the first step: the other two give the gaps; from two of the
    # three, one step is too few.
    partial = profile_gaps(trace, events[1:])
    assert partial is not None and (partial.steps, partial.profiled) == (2, 3)
    second = len(nodes) + 1  # the second step's first op
    assert profile_gaps(trace, events[1:second] + events[second + 1:]) is None


def test_a_stall_in_one_of_two_steps_is_not_half_replayed(captured):
    """A schedule's ``active=2`` records two steps: a median of two is their mean, so a
    recorder's stall of milliseconds in one step went half into its gap, and the
    step's total (a mean too) passed the stall check (an MLP's Adam step with
    ``with_stack``: 19.0 and 2.1 ms of gaps, 10.5 ms replayed against a 5 ms eager
    step). Of two samples, one a spike against the other, the other is kept."""
    trace = load_trace(captured.et_path)
    nodes = [s.node for s in select_ops(trace).ops]
    stalled = nodes[len(nodes) // 2].id
    events, t = [], 0.0
    for step in range(2):
        start = t
        for node in nodes:
            if step == 1 and node.id == stalled:
                t += 8000.0  # the stall, before this op in the second step
            events.append(_ev(len(events), node.name, t, 1.0))
            t += 1.0 + (4.0 if step == 0 else 6.0)
        events.append(_ev(len(events), STEP_SCOPE, start - 0.5, t - start))
        t += 100.0
    found = profile_gaps(trace, sorted(events, key=lambda e: (e.ts, -e.dur)))
    assert found is not None and found.steps == 2
    assert found.gaps[stalled] < 10.0  # 4 us (before: 4005 us, half the stall)
    # Gaps that differ by less than a spike keep their median of two (5 us).
    others = [g for nid, g in found.gaps.items() if nid not in (stalled, nodes[0].id)]
    assert all(4.0 <= g <= 6.0 * 1.1 for g in others)
    # The gaps add up to about the quiet step's, not to half the stall (4195 us).
    assert found.typical_total is not None and \
        found.typical_total < min(found.step_totals) * 1.5


def test_profile_gaps_count_the_profilers_own_scopes(captured):
    """A backward op's gap holds the autograd engine's scopes, recorded only while
    profiling: each gap says how many began in it (children of ops do not count), and
    apart from them how many Python record_function scopes (an optimizer's step), whose
    recording costs the ET observer about twice as much."""
    trace = load_trace(captured.et_path)
    nodes = [s.node for s in select_ops(trace).ops]
    events, t = [], 0.0
    for scopes_in_second_gap in (1, 2, 2):  # median 2
        start = t
        for k, node in enumerate(nodes):
            if k == 1:
                for j in range(scopes_in_second_gap):
                    events.append(_ev(len(events), "autograd::engine::evaluate_function: "
                                      "MmBackward0", t - 2.0 + j * 0.5, 0.2))
            if k == 2:
                events.append(_ev(len(events), "Optimizer.step#SGD.step", t - 1.0, 3.0,
                                  annotation=True))
            events.append(_ev(len(events), node.name, t, 1.0))
            events.append(_ev(len(events), "aten::empty", t + 0.2, 0.1))  # a child
            t += 5.0
        events.append(_ev(len(events), STEP_SCOPE, start - 0.5, t - start))
        t += 100.0
    found = profile_gaps(trace, sorted(events, key=lambda e: (e.ts, -e.dur)))
    assert found is not None
    assert found.events[nodes[1].id] == 2
    assert all(found.events[n.id] == 0 for n in nodes if n is not nodes[1])
    assert found.annotations == {nodes[2].id: 1}


def test_capture_profile_is_found_and_used(captured):
    profile = profile_beside(captured.kineto_path)
    assert profile is not None and profile.name == "mlp.profile.json"
    doc = json.loads(profile.read_text())
    scopes = [e for e in doc["traceEvents"] if e.get("name") == STEP_SCOPE]
    assert len(scopes) == 3
    program = compile_trace(captured.et_path, kineto=captured.kineto_path)
    assert program.timing is not None
    assert program.timing.host_gaps == "mlp.profile.json (median of 3 profiled steps)"
    timed = [op for op in program.ops if op.timing is not None]
    # Every op has a gap, the first one from the step's start; and a tail after the last.
    assert all(op.timing.gap_us is not None for op in timed)
    assert program.timing.tail_gap_us is not None and program.timing.tail_gap_us >= 0


def test_gaps_come_from_the_profiled_steps_of_the_recorded_kind(tmp_path):
    """A script whose steps differ (an evaluation every other step, a GAN's halves):
    the profiled steps that hold the recorded step's ops give its gaps. One step of
    another kind among them dropped every profiled gap for the linked ones, which carry
    the ET observer."""
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = iter(range(1_000))

    def step() -> None:
        opt.zero_grad()
        out = model(torch.randn(4, 16))
        # steps of two kinds in turn (the ops of neither are a part of the other's)
        out = torch.tanh(out) if next(calls) % 2 else torch.sigmoid(out)
        out.sum().backward()
        opt.step()

    result = capture(step, tmp_path, name="alt", timing_iters=1, profile_steps=4)
    program = compile_trace(result.et_path, kineto=result.kineto_path)
    assert program.timing is not None
    assert program.timing.host_gaps == ("alt.profile.json (median of 2 profiled steps; "
                                        "2 other profiled steps ran other ops)")
    assert all(op.timing is not None and op.timing.gap_us is not None
               for op in program.ops)


def test_a_profile_whose_steps_run_other_ops_is_named_not_denied(tmp_path):
    """The profile-only steps beside the trace each ran other ops than the recorded
    one (here: one add fewer per step; an HSDP step, the all-reduce's division on
    another gloo thread each step), so its gaps stay the linked ones: the header said
    there were "no profile-only steps beside it", though the capture wrote them."""
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = iter(range(1_000))

    def step() -> None:
        opt.zero_grad()
        out = model(torch.randn(4, 16))
        for _ in range(max(0, 30 - next(calls))):
            out = out + 1
        out.sum().backward()
        opt.step()

    result = capture(step, tmp_path, name="grow", timing_iters=1, profile_steps=2)
    program = compile_trace(result.et_path, kineto=result.kineto_path)
    assert program.timing is not None and program.timing.observer_in_gaps
    text = " ".join(" ".join(str(d) for d in program.diagnostics).split())
    assert "the profile-only steps of grow.profile.json beside it did not run" in text
    assert "no profile-only steps beside it" not in text


def test_without_sidecar_gaps_stay_linked(captured, tmp_path):
    kineto = tmp_path / "other.kineto.json"
    kineto.write_bytes(captured.kineto_path.read_bytes())
    assert profile_beside(kineto) is None
    program = compile_trace(captured.et_path, kineto=kineto)
    assert program.timing is not None and program.timing.host_gaps == "linked"


def test_same_session_gaps_calibrate_the_observer_out(captured, tmp_path):
    """An ET + Kineto pair from one profiler session (linked by id, no profile-only
    steps beside it), as PARAM, Chakra and HTA capture them: the observer's work is
    in every recorded gap. The header says so, and the benchmark's calibration runs
    with an observer attached so that its share cancels; with the profile-only steps
    beside the trace, neither happens."""
    kineto = tmp_path / "session.json"
    kineto.write_bytes(captured.kineto_path.read_bytes())
    bench = tmp_path / "bench.py"
    text = generate(captured.et_path, bench, kineto=kineto)
    assert '"observer_in_gaps": True' in text
    # Calibrated under the same recorders: the capture records memory events beside
    # the ET, and its observer computes integral tensors' ranges.
    assert '"memory_in_gaps": True' in text and '"observer_ranges": True' in text
    assert "with the ET observer attached (linked by id" in " ".join(text.split())
    assert "slowing of the original's Python between ops is not corrected" in " ".join(
        text.split())
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                         "--json", "--host-gaps", "recorded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc.stdout)
    assert out["host_gap_observer"] is True
    # Replayed, with the replay's own time measured, unless a loaded machine's
    # calibration put the observer's cost past the trust bound (the refusal below),
    # which it then names, replaying no gaps (own time 0: nothing is subtracted).
    # Or where the replay's own time, the observer's share calibrated out, exceeds the
    # recorded gaps in all (no gap would wait): then it says that, and keeps its own time.
    if out["host_gaps_replayed"] or "exceeds the recorded gaps by" in proc.stderr:
        assert out["host_gap_own_us"] > 0
    else:
        assert "left to wait" in proc.stderr and out["host_gap_own_us"] == 0
    # The observer's own cost in the replay's gaps, measured against a pass without it.
    assert out["host_gap_observer_us"] > 0 and out["host_gap_wait_us"] >= 0
    # Its slowing of the original's Python, which no calibration sees, is bounded and
    # said wherever the gaps replay, with the way to capture gaps free of it.
    if out["host_gaps_replayed"]:
        assert 0 <= out["host_gap_doubt_us"] < out["host_gap_wait_us"] or (
            out["host_gap_wait_us"] == out["host_gap_doubt_us"] == 0)
        said = " ".join(proc.stderr.split())
        assert "also slowed the original's Python between ops" in said
        assert "steps without the observer" in said
    else:
        assert out["host_gap_doubt_us"] is None

    # Where that cost dwarfs what is left to wait, the correction is mostly the
    # observer's (which costs the original more than the replay): no gaps, and why.
    refused, stderr = _run_recorded(
        tmp_path / "tiny_gaps.py", re.sub(r"_host_gap\([\d.e+-]+", "_host_gap(0.0", text))
    assert refused["host_gaps_replayed"] is False and refused["host_gap_wait_us"] == 0
    assert "left to wait" in stderr and "host gaps off" in stderr

    # The scopes begun in each linked gap (autograd's around backward ops): the
    # benchmark subtracts their recording cost, measured with the observer attached.
    program = compile_trace(captured.et_path, kineto=kineto)
    counted = [op.timing.gap_events for op in program.ops if op.timing is not None]
    assert max(counted) > 0
    assert out["host_gap_event_us"] > 0
    # The optimizer's step annotation (a Python record_function scope) is counted apart,
    # passed to its gap's call, and subtracted at its own measured cost.
    assert any(op.timing.gap_annotations for op in program.ops if op.timing is not None)
    assert re.search(r"_host_gap\([\d.]+, (\d+, )?before=\d+, annotations=1\)", text)
    assert out["host_gap_annotation_us"] > 0

    # Gaps recorded under another observer (another schema: another implementation,
    # as a trace from an older torch has) are not corrected with this one's cost:
    # the benchmark says so and replays no gaps rather than inflated ones.
    schema = load_trace(captured.et_path).schema
    assert f'"observer_schema": "{schema}"' in text
    other = tmp_path / "other_observer.py"
    other.write_text(text.replace(f'"observer_schema": "{schema}"', '"observer_schema": "1.0.1"'))
    proc = run_benchmark(other, "--device", "cpu", "--warmup", "1", "--iters", "2",
                         "--json", "--host-gaps", "recorded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["host_gaps_replayed"] is False
    assert f"writes schema {schema}, not the trace's 1.0.1" in proc.stderr
    assert "host gaps off" in proc.stderr

    beside = generate(captured.et_path, tmp_path / "b2.py", kineto=captured.kineto_path)
    assert '"observer_in_gaps": False' in beside
    assert '"memory_in_gaps": False' in beside and '"observer_ranges": False' in beside
    assert "with the ET observer attached (linked by id" not in " ".join(beside.split())


def test_gaps_asked_of_an_et_without_kineto_are_reported_off(captured, tmp_path):
    """An ET alone (another tool's capture without its Kineto trace) has no gaps:
    --host-gaps recorded said so on stderr while --json's host_gaps_replayed read true
    (on every rank of a job too)."""
    bench = tmp_path / "et_only.py"
    generate(captured.et_path, bench)
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                         "--json", "--host-gaps", "recorded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no host gaps recorded (use --kineto): host gaps off" in proc.stderr
    assert last_json(proc.stdout)["host_gaps_replayed"] is False


def test_recorded_gaps_subtract_the_replays_own_host_time(captured, tmp_path):
    bench = tmp_path / "bench.py"
    text = generate(captured.et_path, bench, kineto=captured.kineto_path)
    assert '"host_gaps": "mlp.profile.json (median of 3 profiled steps)"' in text
    own = {}
    for mode in ("off", "recorded"):
        proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                             "--json", "--host-gaps", mode)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = last_json(proc.stdout)
        own[mode] = (out["host_gap_own_us"], out["host_gap_event_us"])
    assert own["off"] == (0.0, 0.0)  # no calibration without recorded gaps
    assert 0.0 < own["recorded"][0] < 1000.0
    # The replay's own time was measured in each gap (the profiler's clock placed
    # every `_host_gap` mark in its iteration), not only as a mean.
    assert out["host_gaps_measured"] == text.count("_host_gap(") - text.count("def _host_gap(")
    assert 0.0 <= own["recorded"][1] < 100.0  # the profiler's cost per recorded event


def test_scaled_gaps_follow_the_hosts_speed_over_the_captures(captured, tmp_path):
    """The capture times the harness's Python probe beside its profile-only steps; the
    benchmark embeds it, and with --host-gaps scaled times the same probe before each
    iteration and scales the recorded gaps by the ratio. A trace with no probe (another
    tool's, a same-session pair) replays its gaps unscaled, and says so."""
    probe = json.loads(captured.sidecar_path.read_text())["host_probe_us"]
    assert probe > 0
    bench = tmp_path / "bench.py"
    text = generate(captured.et_path, bench, kineto=captured.kineto_path)
    assert f'"host_probe_us": {round(probe, 3)!r}' in text
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "3",
                         "--json", "--host-gaps", "scaled")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc.stdout)
    assert out["host_probe_us"] > 0
    if out["host_gaps_replayed"]:
        assert out["host_gap_scale"] is not None and out["host_gap_scale"] > 0
    else:  # a loaded machine's calibration: its own time past the gaps, and it says so
        assert "exceeds the recorded gaps by" in proc.stderr, proc.stderr[-3000:]

    session = tmp_path / "session.json"
    session.write_bytes(captured.kineto_path.read_bytes())
    unscaled = tmp_path / "unscaled.py"
    assert '"host_probe_us": None' in generate(captured.et_path, unscaled, kineto=session)
    proc = run_benchmark(unscaled, "--device", "cpu", "--warmup", "1", "--iters", "2",
                         "--json", "--host-gaps", "scaled")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc.stdout)
    assert out["host_gap_scale"] is None
    # Said only where gaps replay: where the calibration refused them (a same-session
    # pair whose observer cost more than the wait), it said that, and no more.
    assert ("records no host speed" in proc.stderr) is out["host_gaps_replayed"]


def test_compare_reads_the_profile_per_step(captured):

    profile = profile_beside(captured.kineto_path)
    assert profile is not None
    per_step, whole = kineto_times(profile, None), kineto_times(profile, 1)
    # Three profiled steps: medians over the two warm ones.
    assert (per_step.iterations, per_step.cold_steps_dropped) == (2, 1)
    assert whole.ops == 3 * per_step.ops and len(per_step.step_spans_ms) == 2


def test_a_single_steps_spikes_are_replayed_at_their_kinds_median(tmp_path):
    """Gaps of one recorded step (a same-session pair, no profile-only steps) keep the
    machine's spikes. Six relu -> relu gaps of 10 us and one of 2 ms: the 2 ms one is
    the machine's and replays at 10 us; the one mm -> relu gap of 500 us has no kind to
    compare with and stays."""
    tb = TraceBuilder()
    x, w = tb.tensor((4, 4)), tb.tensor((4, 4))
    values = [tb.tensor((4, 4)) for _ in range(9)]
    nodes = [tb.op(MM, [x, w], [values[0]])]
    nodes += [tb.op(RELU, [values[k]], [values[k + 1]]) for k in range(8)]
    gaps = [None, 500.0, 10.0, 10.0, 2000.0, 10.0, 10.0, 10.0, 10.0]
    spans, ts = {}, 0.0
    for node, gap in zip(nodes, gaps, strict=True):
        ts += gap or 0.0
        spans[node] = (ts, 5.0, [])
        ts += 5.0
    et = tb.write(tmp_path / "spiky.et.json")
    kineto = tmp_path / "spiky.kineto.json"
    kineto.write_text(json.dumps(kineto_doc(tb, spans)))
    program = compile_trace(et, kineto=kineto)
    assert program.timing is not None and program.timing.observer_in_gaps
    assert [op.timing.gap_us for op in program.ops] == [
        None, 500.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]
    assert any("1 above 4x the median of their kind" in d.reason
               for d in program.diagnostics)


def _profiled_pair(tmp_path, stem: str, active: int, observed_step: int | None = None,
                   scheduled: bool = True, **options: bool):
    """An ET and a Kineto trace of mlp_sgd steps under torch.profiler's schedule (one
    warm-up step, ``active`` recorded ones): the observer attached to the profiler, or
    started and stopped by hand around step ``observed_step`` alone; ``options``: the
    profiler's (record_shapes, with_stack); without ``scheduled``, no schedule (every
    step profiled, none marked ``ProfilerStep#N``)."""
    torch.set_num_threads(1)
    step = MODELS["mlp_sgd"]()
    et_path, kineto = tmp_path / f"{stem}.et.json", tmp_path / f"{stem}.json"
    observer = ExecutionTraceObserver()
    observer.register_callback(str(et_path))
    attached = {"execution_trace_observer": observer} if observed_step is None else {}
    when = {"schedule": schedule(wait=0, warmup=1, active=active),
            "on_trace_ready": lambda p: p.export_chrome_trace(str(kineto))} if scheduled else {}
    with profile(activities=[ProfilerActivity.CPU], acc_events=True,
                 **when, **attached, **options) as prof:
        for k in range(active + 1):
            if k == observed_step:
                observer.start()
            step()
            if k == observed_step:
                observer.stop()
            prof.step()
    if not scheduled:
        prof.export_chrome_trace(str(kineto))
    if observed_step is not None:
        observer.unregister_callback()
    return et_path, kineto


def test_same_session_pair_of_several_steps_replays_each_gaps_median(tmp_path):
    """torch.profiler's schedule with the ET observer (as PyTorch documents it) records
    every active step, each a ``ProfilerStep#N``, in both traces: each gap is its
    median over those steps, and the step's own host time before its first op and
    after its last is replayed too."""
    et_path, kineto = _profiled_pair(tmp_path, "pair", active=3)
    program = compile_trace(et_path, kineto=kineto)
    timing = program.timing
    assert timing is not None and timing.observer_in_gaps
    assert timing.host_gaps == "pair.json (median of 3 recorded steps)"
    assert timing.tail_gap_us is not None
    gaps = [op.timing.gap_us for op in program.ops if op.timing is not None]
    assert gaps[0] is not None and all(g is not None and g >= 0 for g in gaps)
    assert len(timing.step_gap_totals_us) == 3
    assert timing.gap_steps == 3 and timing.profiler_warm  # a warm-up step ran first
    # The gaps add up to a typical step: the median one, or less where its gaps exceed
    # the per-gap medians by more than their skew (MAX_SKEW).
    typical = timing.step_gap_typical_us
    assert typical is not None and sum(gaps) + timing.tail_gap_us == pytest.approx(typical)
    assert typical <= sorted(timing.step_gap_totals_us)[1] + 1e-6
    text = generate(et_path, tmp_path / "bench.py", kineto=kineto)
    assert "median of 3 recorded steps" in " ".join(text.split())
    assert "the median recorded step's gaps above the quietest step's by at most that " \
        "(these 3 steps' gaps: the median step's" in " ".join(text.split())

    # A median step whose gaps exceed the quietest step's by more than what is left to
    # wait once the observer's cost is subtracted (the observer's and the Python
    # tracer's stalls of milliseconds: an MLP's gaps read 8.8, 11.8 and 2.9 ms in three
    # steps, its eager step's 0.5 ms): the stall would replay as the program's, so no
    # gaps, and why.
    def with_totals(totals: str, typical: str) -> str:
        changed = re.sub(r'"step_gaps_us": \[[^]]*\]', f'"step_gaps_us": {totals}', text)
        return re.sub(r'"step_gaps_typical_us": [^,]*,', f'"step_gaps_typical_us": {typical},',
                      changed)

    out, stderr = _run_recorded(tmp_path / "noisy.py", with_totals("[1e9, 1.4e9, 1.4e9]", "1.4e9"))
    assert out["host_gaps_replayed"] is False
    assert "its median recorded step's gaps exceed its quietest step's by" in stderr
    assert "host gaps off" in stderr
    # A stall in one step of three drops out of the per-gap medians, and stalls in two
    # where the medians describe the quietest step (the gaps add up to its total, not
    # the median's: passes/hostgaps.py): neither spread refuses anything.
    for name, totals, typical in (("one_stall", "[1.0, 1.0, 1e9]", "1.0"),
                                  ("two_stalls", "[1.0, 1e9, 1e9]", "1.0")):
        out, stderr = _run_recorded(tmp_path / f"{name}.py", with_totals(totals, typical))
        assert "exceed its quietest step's" not in stderr


def test_a_one_step_pairs_facts_say_its_recorders_started_at_that_step(tmp_path):
    """A profiler session starts its recorders at its first recorded step, which runs
    them cold (an MLP's first step's gaps 10-15% over its next ones where a schedule's
    warm-up step had run the profiler, 30-40% where nothing had), and one recorded
    step is all first step: the facts say how many steps the gaps are medians over and
    whether the profiler ran before them, which the benchmark's calibration mirrors
    (harness `_cold_steps`)."""
    for stem, scheduled, warm in (("scheduled", True, True), ("plain", False, False)):
        et_path, kineto = _profiled_pair(tmp_path, stem, active=1 if scheduled else 0,
                                         scheduled=scheduled)
        timing = compile_trace(et_path, kineto=kineto).timing
        assert timing is not None and timing.observer_in_gaps
        assert (timing.gap_steps, timing.profiler_warm) == (1, warm)
        text = generate(et_path, tmp_path / f"{stem}.py", kineto=kineto)
        assert '"gap_steps": 1,' in text and f'"profiler_warm": {warm},' in text


def test_a_repeating_schedules_pair_replays_a_step_of_its_kineto_cycle(tmp_path):
    """An observer handed to a profiler whose schedule repeats records the active steps
    of every cycle into one ET, while each cycle's Kineto trace (here as
    ``tensorboard_trace_handler`` writes it, gzipped) holds that cycle's steps only.
    The default step is one the Kineto trace holds; the original step time spans that
    step's ops, not every step the trace linked; a step it does not hold is said so."""
    torch.set_num_threads(1)
    step = MODELS["mlp_sgd"]()
    et_path, logs = tmp_path / "cycles.et.json", tmp_path / "logs"
    observer = ExecutionTraceObserver()
    observer.register_callback(str(et_path))
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=2),
                 on_trace_ready=tensorboard_trace_handler(str(logs), use_gzip=True),
                 execution_trace_observer=observer) as prof:
        for _ in range(6):
            step()
            prof.step()
    cycles = sorted(logs.glob("*.pt.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    assert len(cycles) == 2
    second = load_kineto(cycles[1])
    held = {e.name: e for e in second.cpu_ops if e.name.startswith("ProfilerStep#")}
    et_steps = sorted(int(n.name.split("#")[1]) for n in load_trace(et_path).nodes
                      if n.name.startswith("ProfilerStep#"))
    assert len(et_steps) == 4 and len(held) == 2

    program = compile_trace(et_path, kineto=cycles[1])
    timing = program.timing
    first_held = min(held, key=lambda name: int(name.split("#")[1]))
    assert any(f"iteration {first_held} " in d.reason for d in program.diagnostics)
    assert timing is not None and timing.linked_ops == len(program.ops)
    assert timing.host_gaps.endswith("(median of 2 recorded steps)")
    # Inside the one replayed step (the two linked steps spanned twice that and more).
    assert 0 < timing.original_ms * 1000 <= held[first_held].dur

    with pytest.warns(UserWarning, match=f"only 0 of the {len(program.ops)} replayed ops"):
        other = compile_trace(et_path, kineto=cycles[1],
                              options=BuildOptions(iteration=str(et_steps[0])))
    assert other.timing is not None and other.timing.original_ms == 0


def test_compare_reads_a_same_session_pair_per_replayed_step_and_says_it_is_observed(
        tmp_path):
    """``compare`` on a pair that recorded several steps: the original's ops are those
    of the step the generator replays, not every step's (a 3-step ET read 33%
    against its one-step replay); its Kineto times, inflated by the observer, are
    said to be; where the profile holds steps without the observer, those count."""
    et_path, kineto = _profiled_pair(tmp_path, "pair", active=3)
    program = compile_trace(et_path, kineto=kineto)
    step = op_multiset(et_path, by_overload=True, iteration="auto")
    assert sum(step.values()) == len(program.ops)
    assert sum(op_multiset(et_path, by_overload=True).values()) == 3 * len(program.ops)
    bench, replay = tmp_path / "bench.py", tmp_path / "replay.et.json"
    generate(et_path, bench, kineto=kineto)
    assert run_benchmark(bench, "--warmup", "0", "--iters", "1", "--et",
                         str(replay)).returncode == 0
    # The replay's Kineto side here is the original's: only how each side is read matters.
    result = compare_traces(et_path, replay, kineto_original=kineto, kineto_replay=kineto)
    assert result.match == 1.0 and result.original_ops == len(program.ops)
    assert result.original_times is not None and result.original_times.observed
    assert any("recorded with the ET observer attached" in n for n in result.notes)
    # The step named as the generator's --iteration names it: the replay has no steps.
    first = next(d.reason.split()[1] for d in program.diagnostics
                 if d.reason.startswith("iteration ProfilerStep#"))
    named = compare_traces(et_path, replay, iteration=first.split("#")[1])
    assert named.match == 1.0 and named.original_ops == len(program.ops)

    et_path, kineto = _profiled_pair(tmp_path, "manual", active=5, observed_step=3)
    times = kineto_times(kineto, None)
    assert not times.observed and times.observed_steps_dropped == 1
    assert times.iterations == 4
    result = compare_traces(et_path, et_path, kineto_original=kineto, kineto_replay=kineto)
    assert not any("recorded with the ET observer attached" in n for n in result.notes)
    assert any("1 the ET observer recorded, left out" in n for n in result.notes)


def _run_recorded(path: Path, text: str) -> tuple[dict, str]:
    """Write ``text`` to ``path`` and run it with --host-gaps recorded: its JSON, stderr."""
    path.write_text(text)
    proc = run_benchmark(path, "--device", "cpu", "--warmup", "1", "--iters", "2",
                         "--json", "--host-gaps", "recorded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json(proc.stdout), proc.stderr


def test_gaps_recorded_with_shapes_and_stacks_are_calibrated_under_them(tmp_path):
    """HTA's and PARAM's capture recipes turn on ``record_shapes`` and ``with_stack``:
    each costs host time in the gaps, and the Python tracer also costs each Python
    call it records (0.2 us here), which no replayed op makes. The Kineto trace shows
    both options; the benchmark calibrates under them and subtracts every traced call
    in a gap at the cost it measures per call."""
    # The observer on one step: the gaps come from the others, with no observer's
    # cost to calibrate out (whose trust bound a loaded machine can trip).
    # with_modules shows in no event: read from the file's header (torch 2.6 and on).
    et_path, kineto = _profiled_pair(tmp_path, "stack", active=3, observed_step=1,
                                     record_shapes=True, with_stack=True, with_modules=True)
    assert load_kineto(kineto).options == {"record_shapes", "with_stack", "with_modules"}
    program = compile_trace(et_path, kineto=kineto)
    assert program.timing is not None
    assert program.timing.profiler_options == ("record_shapes", "with_modules",
                                               "with_stack")
    assert not program.timing.observer_in_gaps
    # The modules' forward calls between ops, counted per gap.
    assert sum(op.timing.gap_calls for op in program.ops if op.timing is not None) > 0
    bench = tmp_path / "bench.py"
    text = generate(et_path, bench, kineto=kineto)
    assert '"profiler_options": ["record_shapes", "with_modules", "with_stack"]' in text
    assert re.search(r"_host_gap\([\d.]+[^)]*calls=\d+", text)
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                         "--json", "--host-gaps", "recorded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc.stdout)
    assert out["host_gap_call_us"] > 0 and out["host_gap_own_us"] > 0

    plain_et, plain = _profiled_pair(tmp_path, "plain", active=2)
    assert load_kineto(plain).options == frozenset()
    plain_text = generate(plain_et, tmp_path / "plain.py", kineto=plain)
    assert '"profiler_options": []' in plain_text
    assert not re.search(r"_host_gap\([\d.]+[^)]*calls=\d+", plain_text)


def test_a_profile_of_other_steps_is_not_taken_for_a_same_session_pair(tmp_path):
    """An ET of one step and, after it, a plain torch.profiler session of three more:
    the profile's External ids count from 1 as the ET's rf_ids do, so the first
    profiled step links by id, and was taken for a same-session pair. Its gaps hold
    no observer's work (every "Record function id" is 0: none was attached), and
    calibrating one out shrank them or turned them off. The generator says that the
    pair is of two windows (an observer started by hand before a schedule's active
    step, probed under torchrun: linked silently)."""
    torch.set_num_threads(1)
    step = MODELS["mlp_sgd"]()
    for _ in range(2):
        step()
    et_path, kineto = tmp_path / "apart.et.json", tmp_path / "apart.json"
    observer = ExecutionTraceObserver()
    observer.register_callback(str(et_path))
    observer.start()
    step()
    observer.stop()
    observer.unregister_callback()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
    prof.export_chrome_trace(str(kineto))
    assert load_kineto(kineto).without_observer
    # Nor silently linked as the ET's own step (the header called it the recorded one).
    with pytest.warns(UserWarning, match="apart.json was profiled without the ET observer "
                      "attached .*: it recorded other steps than the ET"):
        program = compile_trace(et_path, kineto=kineto)
    assert any("it recorded other steps than the ET" in n for n in program.notes)
    timing = program.timing
    assert timing is not None and not timing.observer_in_gaps and timing.linked_ops
    assert any(op.timing is not None and op.timing.gap_us for op in program.ops)


def test_steps_profiled_without_the_observer_serve_as_profile_only_steps(tmp_path):
    """Chakra's and PARAM's collection scripts start and stop the ET observer by hand
    for one step inside a longer profile: the profile's other steps hold the same ops
    without the observer's 10-20 us per op, so the gaps come from them and there is
    nothing to calibrate out."""
    et_path, kineto = _profiled_pair(tmp_path, "manual", active=5, observed_step=3)
    program = compile_trace(et_path, kineto=kineto)
    timing = program.timing
    assert timing is not None and not timing.observer_in_gaps
    assert timing.host_gaps == "manual.json (median of 4 steps profiled without the ET observer)"
    assert timing.gap_steps == 4 and timing.profiler_warm  # the schedule's warm-up ran
    gaps = [op.timing.gap_us for op in program.ops if op.timing is not None]
    assert all(g is not None and g >= 0 for g in gaps)
    # The gaps are the other steps', not the step the observer recorded (whose gaps
    # hold its work; which is larger is timing, left to make bench on a loaded machine).
    trace, events = load_trace(et_path), load_kineto(kineto).cpu_ops
    ids = {n.rf_id for n in trace.nodes if n.rf_id}
    recorded = [e for e in events if e.name.startswith("ProfilerStep#")
                and _observed(e, events, ids, 0)]
    assert len(recorded) == 1
    observed = profile_gaps(trace, events, recorded)
    assert observed is not None
    assert gaps != [observed.gaps.get(op.node_id) for op in program.ops
                    if op.timing is not None]
    # The step to compare with is theirs too: their median span, not the recorded
    # step's, which carries the observer (a mixture of experts' step captured so under
    # torchrun: 69 ms recorded, 12.6 ms profiled alone, and the replay read 2.4x fast).
    alone = [e.dur for e in events if e.name.startswith("ProfilerStep#")
             and not _observed(e, events, ids, 0)]
    assert len(alone) == 4
    assert timing.step_ms == pytest.approx(statistics.median(alone) / 1000.0)
    assert timing.step_ms_from == ("median Kineto span of 4 steps profiled without the "
                                   "ET observer")
    text = generate(et_path, tmp_path / "bench.py", kineto=kineto)
    assert "steps profiled without the ET observer" in " ".join(text.split())
    assert '"observer_in_gaps": False' in text
    assert f'"step_ms": {round(timing.step_ms, 4)},' in text
    # The header says where the gaps came from, not only ORIGINAL.
    header = " ".join(text.split('"""')[1].split())
    assert "steps profiled without the ET observer" in header


def test_unmarked_steps_profiled_without_the_observer_serve_as_well(tmp_path):
    """Without a schedule the profiler marks no ``ProfilerStep#N`` (torch 2.13), and
    PARAM's recipe starts the observer by hand around one step of such a profile: the
    other steps are the runs of the recorded step's ops before and after it. From the
    one observed step instead, a CNN's gaps replayed at +89% (a probe)."""
    et_path, kineto = _profiled_pair(tmp_path, "plain", active=4, observed_step=2,
                                     scheduled=False)
    events = load_kineto(kineto).cpu_ops
    assert not any(e.name.startswith("ProfilerStep#") for e in events)
    program = compile_trace(et_path, kineto=kineto)
    timing = program.timing
    assert timing is not None and not timing.observer_in_gaps
    # Four steps beside the observed one; the first, cold, may run ops of its own.
    assert re.fullmatch(r"plain\.json \(median of [34] steps profiled without the ET "
                        r"observer\)", timing.host_gaps), timing.host_gaps
    assert all(op.timing is not None and op.timing.gap_us is not None
               and op.timing.gap_us >= 0 for op in program.ops[1:])
    # Those steps' median span is the step to compare with, not the observed one's.
    assert timing.profiled_step_ms is not None and timing.step_ms == timing.profiled_step_ms
    assert timing.step_ms != timing.original_ms
    assert re.fullmatch(r"median Kineto span of [34] steps profiled without the ET "
                        r"observer", timing.step_ms_from), timing.step_ms_from


def test_a_step_counts_where_the_observer_recorded_its_ops():
    """Steps of a longer profile that the ET observer did not record (started and
    stopped by hand inside it) have smaller gaps: their ops' ids are none of the
    ET's, and they are left out of the medians."""
    def ev(index, ts, rf_id, external_id=None):
        return CpuEvent(index, "aten::mm", 0, 1, ts, 1.0, rf_id, external_id)

    step_a = CpuEvent(0, "ProfilerStep#1", 0, 1, 0.0, 10.0, None, None)
    step_b = CpuEvent(10, "ProfilerStep#2", 0, 1, 20.0, 10.0, None, None)
    events = [step_a, ev(1, 1.0, 101), ev(2, 3.0, 102), ev(3, 5.0, 999),
              step_b, ev(11, 21.0, 201, 101), ev(12, 23.0, 202, 102)]
    ids = {101, 102, 103}
    assert _observed(step_a, events, ids, 0)
    # (Where a record function id is written, an External id counts something else.)
    assert not _observed(step_b, events, ids, 0)
    # Linked by a constant External id offset: the ids are the ET's plus that offset.
    shifted = [CpuEvent(e.index, e.name, 0, 1, e.ts, e.dur, None, (e.rf_id or 0) + 50)
               for e in events if e.index < 10]
    assert _observed(step_a, shifted, ids, 50) and not _observed(step_a, shifted, ids, 0)


def _handoff(tmp_path: Path) -> tuple[Path, Path, list[int]]:
    """A step whose thread waits while a second thread runs two ops, as a CUDA training
    step waits in ``backward()`` while the autograd engine's device thread runs the
    backward ops: main ops at 0-10 and 20-30, the other thread's at 40-50 and 60-70,
    main again at 100-110. That thread's engine scope begins at 35, in the hand-off."""
    tb = TraceBuilder()
    x, w = tb.tensor((4, 4)), tb.tensor((4, 4))
    a, b, c, d, e = (tb.tensor((4, 4)) for _ in range(5))
    ids = [tb.op(MM, [x, w], [a]), tb.op(RELU, [a], [b]),
           tb.op(MM, [b, w], [c], tid=2), tb.op(RELU, [c], [d], tid=2),
           tb.op(RELU, [d], [e])]
    spans = dict(zip(ids, [(0, 10, []), (20, 10, []), (40, 10, []), (60, 10, []),
                           (100, 10, [])], strict=True))
    doc = kineto_doc(tb, spans)
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 102, "ts": 35,
                               "dur": 1, "name": "autograd::engine::evaluate_function: X"})
    et = tb.write(tmp_path / "handoff.et.json")
    kineto = tmp_path / "handoff.kineto.json"
    kineto.write_text(json.dumps(doc))
    return et, kineto, ids


def _gaps(program) -> dict[int, tuple[float | None, int]]:
    return {op.node_id: (op.timing.gap_us, op.timing.gap_events) for op in program.ops}


def test_a_thread_waiting_on_another_does_not_replay_that_threads_work_as_its_gap(tmp_path):
    """Replayed on one thread, the waiting thread's 70 us gap holds the other thread's
    two ops and the gap between them, which the replay runs anyway: what is left is
    the hand-off each way (10 us there, 30 us back). Every gap adds up to the step's
    host time outside ops, as recorded (110 - 50 us)."""
    et, kineto, (n1, n2, n3, n4, n5) = _handoff(tmp_path)
    serial = _gaps(compile_trace(et, kineto=kineto))
    assert serial == {n1: (None, 0), n2: (10.0, 0), n3: (10.0, 1), n4: (10.0, 0),
                      n5: (30.0, 0)}
    assert sum(gap for gap, _ in serial.values() if gap) == 110 - 50
    # A replay thread per recorded thread waits its own gaps beside the other thread.
    threaded = _gaps(compile_trace(et, kineto=kineto, options=BuildOptions(threads=True)))
    assert threaded == {n1: (None, 0), n2: (10.0, 0), n3: (None, 0), n4: (10.0, 0),
                        n5: (70.0, 0)}


def test_profiled_steps_gaps_leave_out_another_threads_work_as_well(tmp_path):
    """The same step profiled three times (without the observer): each gap's median
    follows the replay's thread model too. The first op's gap is the step's own
    Python before it (5 us), the tail the host time after the last op (15 us)."""
    et, _, (n1, n2, n3, n4, n5) = _handoff(tmp_path)
    trace = load_trace(et)
    names = {n.id: n.name for n in trace.nodes}
    events: list[CpuEvent] = []
    for base in (0.0, 1000.0, 2000.0):
        for node, ts, tid in [(n1, 0, 1), (n2, 20, 1), (n3, 40, 2), (n4, 60, 2),
                              (n5, 100, 1)]:
            events.append(_ev(len(events), names[node], base + ts, 10.0, tid))
        events.append(_ev(len(events), STEP_SCOPE, base - 5.0, 130.0))
    events.sort(key=lambda e: (e.ts, -e.dur))
    serial = profile_gaps(trace, events)
    assert serial is not None and serial.steps == 3
    assert serial.gaps == {n1: 5.0, n2: 10.0, n3: 10.0, n4: 10.0, n5: 30.0}
    assert serial.tail == pytest.approx(15.0)
    threaded = profile_gaps(trace, events, serial=False)
    assert threaded is not None
    assert threaded.gaps == {n1: 5.0, n2: 10.0, n4: 10.0, n5: 70.0}


def test_gaps_recorded_with_a_devices_activity_are_calibrated_under_it(tmp_path):
    """A CUDA capture's profiler traces every launch (CUPTI), which costs host time in
    the gaps; calibrating under the CPU's activity alone left that in (on an H200, a
    CNN training step's profiled gaps added up to 1.3 ms where its eager step left
    0.5 ms outside the replayed ops). The Kineto trace's runtime events show the
    activity was on, and the benchmark profiles its calibration with it where it runs
    on that device."""
    et, kineto = two_stream(tmp_path)
    assert load_kineto(kineto).options == {"cuda_activity"}
    text = generate(et, tmp_path / "bench.py", kineto=kineto)
    assert '"profiler_options": ["cuda_activity"]' in text
    saved = runtime._RUNTIME.get("device")
    try:
        for device, wanted in (("cpu", [ProfilerActivity.CPU]),
                               ("cuda:1", [ProfilerActivity.CPU, ProfilerActivity.CUDA])):
            runtime._RUNTIME["device"] = device
            assert runtime._activities(("cuda_activity", "with_stack")) == wanted
            assert runtime._activities(("with_stack",)) == [ProfilerActivity.CPU]
    finally:
        runtime._RUNTIME["device"] = saved


def test_a_step_with_no_replayable_op_is_all_tail():
    """Profiled steps whose ops none replays (a compiled step's fused kernels): each
    step's time is its tail, where there was no gap to hold it."""
    b = TraceBuilder()
    b.annotation("Torch-Compiled Region: 0/0")
    trace = trace_from_document(b.doc(), name="compiled.et.json", sha256="")
    assert not select_ops(trace).ops
    events = []
    for k, dur in enumerate((300.0, 340.0, 320.0)):
        start = 1000.0 * k
        events.append(_ev(len(events), STEP_SCOPE, start, dur))
        events.append(_ev(len(events), "Torch-Compiled Region: 0/0", start + 5.0, dur - 10.0,
                          annotation=True))
    found = profile_gaps(trace, events)
    assert found is not None and found.steps == 3 and not found.gaps
    assert found.tail == pytest.approx(320.0) and found.tail_annotations == 1


@pytest.mark.slow
def test_a_compiled_step_whose_kernels_the_trace_lacks_replays_its_recorded_time(tmp_path):
    """Inductor's fused C++ kernels are not in the trace, and this step has nothing
    else: its benchmark timed nothing (0.5 us against 330 us) where the header
    promised that --host-gaps recorded replays a compiled region's time. The step's
    profiled time replays as its tail, and the generator says what is left."""
    torch.set_num_threads(1)
    x = torch.randn(256, 256)
    fused = torch.compile(lambda t: (t.sin() * t.cos()).exp().sum(1))

    def step() -> None:
        with torch.no_grad():
            fused(x)

    result = capture(step, tmp_path, name="fused", timing_iters=5, profile_steps=3)
    bench = tmp_path / "bench.py"
    with pytest.warns(UserWarning, match="no op of fused.et.json replays"):
        generate(result.et_path, bench, kineto=result.kineto_path)
    out = last_json(run_benchmark(bench, "--warmup", "1", "--iters", "3", "--json",
                                  "--host-gaps", "recorded").stdout)
    assert out["ops"] == 0 and out["host_gaps_replayed"]
    assert "records no strides" not in bench.read_text()  # it has no tensor to lack them
    assert out["iter_ms_median"] > 0.5 * result.step_ms_median


def test_a_capture_on_a_loaded_host_is_said_to_be_one(captured, tmp_path):
    """Other processes on the capture's core stretch its ops and gaps alike; the
    benchmark on a quiet host replays its ops at their speed but waits the stretched
    gaps (an MLP step beside two busy processes on its core: 108 ms against 34 ms
    idle). The capture measures the step thread's CPU time beside the wall clock, and
    the generator says where the thread had the CPU for less than 80% of a step."""
    sidecar = json.loads(captured.sidecar_path.read_text())
    assert len(sidecar["step_cpu_ms"]) == len(sidecar["step_ms"])
    assert 0 < sidecar["host_share"] <= 1.5  # intra-op workers' spinning is not the thread's
    for share, warned in ((0.55, True), (0.95, False)):
        out = tmp_path / str(share)
        out.mkdir()
        for path in captured.et_path.parent.glob("mlp.*"):
            (out / path.name).write_bytes(path.read_bytes())
        (out / "mlp.step.json").write_text(json.dumps({**sidecar, "host_share": share}))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            program = compile_trace(out / "mlp.et.json", kineto=out / "mlp.kineto.json")
        said = [str(w.message) for w in seen if "host was loaded" in str(w.message)]
        assert bool(said) == warned
        assert any("host was loaded" in d.reason for d in program.diagnostics) == warned


@pytest.mark.parametrize(("asynchronous", "tid", "opened"),
                         [(False, 1, 25.0), (False, 2, 25.0), (False, 2, 40.0),
                          (True, 2, 40.0), (False, 2, 1005.0)])
def test_the_wait_after_a_blocking_collective_is_no_host_time(asynchronous, tid, opened):
    """``dist.all_reduce(t)`` issues its c10d op and waits for the work after the op
    returns, outside any op: the gap after it held the wait for the peers (3-4 ms per
    all-reduce of a tensor-parallel decode on gloo), which --host-gaps recorded
    busy-waited on top of the replayed call's own wait. The backend's scope ends when
    the work completed, and only what follows is host time, as for an async call's;
    gloo opens a collective's scope on its worker thread (``tid`` 2), on a busy host
    after the op returned (``opened`` at 40). One opened after the thread went on (at
    1005, past the next op's start) is not this op's."""
    events = {1: _ev(0, "aten::mm", 0.0, 10.0), 2: _ev(1, "c10d::allreduce_", 20.0, 10.0),
              3: _ev(3, "aten::mm", 1001.0, 10.0)}
    scope = _ev(2, "gloo:all_reduce", opened, 991.0 - opened, tid=tid)  # closes at 991
    kineto = KinetoTrace("k", "0", sorted([*events.values(), scope], key=lambda e: e.ts),
                         [], [])
    comm = CommInfo("all_reduce", 0, asynchronous=asynchronous)
    ops = [SimpleNamespace(node_id=n, thread=1, name=events[n].name,
                           comm=comm if n == 2 else None,
                           timing=OpTiming(10.0, 10.0, gap_us=None if n == 1 else 10.0))
           for n in events]
    ops[2].timing = OpTiming(10.0, 10.0, gap_us=971.0)
    found = remove_peer_waits(SimpleNamespace(ops=ops), events, kineto)  # type: ignore[arg-type]
    if opened > 1001.0:
        assert (found.gaps, ops[2].timing.gap_us) == (0, 971.0)
        return
    assert (found.gaps, found.us) == (1, 961.0)
    assert ops[2].timing.gap_us == 10.0 and ops[1].timing.gap_us == 10.0


def test_a_collectives_completion_is_its_backends_scope_or_its_kernels_end():
    """When the original's collective work completed, for placing waits
    (passes/comms.py mark_in_flight): gloo's scope of it on its worker thread, or the
    end of the device kernel (NCCL's) launched within the op; unknown otherwise."""
    events = {1: _ev(0, "c10d::allreduce_", 0.0, 10.0), 2: _ev(1, "c10d::allgather_", 20.0, 10.0),
              3: _ev(2, "c10d::broadcast_", 40.0, 10.0), 4: _ev(3, "aten::mm", 60.0, 10.0)}
    gloo = _ev(4, "gloo:all_reduce", 5.0, 90.0, tid=2)  # on the worker: ends at 95
    kineto = KinetoTrace("k", "0", sorted([*events.values(), gloo], key=lambda e: e.ts),
                         [RuntimeEvent("cudaLaunchKernel", 0, 1, 22.0, 7)],
                         [GpuEvent("ncclKernel_AllGather", "kernel", 7, 30.0, 50.0, 7)])
    ops = [SimpleNamespace(node_id=n, comm=None if n == 4 else CommInfo("x", 0))
           for n in events]
    assert work_completions(ops, events, kineto) == {1: 95.0, 2: 80.0}  # 3: not shown


def test_collectives_gloo_starts_after_their_thread_moved_on_complete_in_queue_order():
    """ZeRO's broadcasts issued back to back: gloo's workers took them first in, first
    out, after the fourth had returned, so no scope opened before the issuing thread's
    next op, and 1 of the 4 completions was found (the last). Its scopes pair with the
    ops in queue order, where their names agree (gloo runs a reduce-scatter as an
    all-reduce), and an op whose work the trace does not show takes none: a scope of
    another kind is left to the op of that kind."""
    issued = [(1, "c10d::broadcast_"), (2, "c10d::_reduce_scatter_base_"),
              (3, "c10d::broadcast_"), (4, "c10d::_allgather_base_")]
    events = {n: _ev(n, name, 10.0 * n, 5.0) for n, name in issued}
    worker = [_ev(10, "gloo:broadcast", 60.0, 10.0, tid=2),
              _ev(11, "gloo:all_reduce", 70.0, 10.0, tid=3),
              _ev(12, "gloo:broadcast", 80.0, 20.0, tid=2)]  # none of the all-gather
    kineto = KinetoTrace("k", "0", sorted([*events.values(), *worker], key=lambda e: e.ts),
                         [], [])
    ops = [SimpleNamespace(node_id=n, comm=CommInfo("x", 0, asynchronous=True))
           for n in events]
    assert work_completions(ops, events, kineto) == {1: 70.0, 2: 80.0, 3: 100.0}
    # Blocking, the first broadcast's thread waited for its work before issuing the
    # next op: a scope opened after that is another op's, and the trace does not show
    # this one's.
    ops[0].comm = CommInfo("x", 0)
    assert work_completions(ops, events, kineto) == {2: 80.0, 3: 70.0}
