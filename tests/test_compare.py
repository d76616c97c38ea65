"""``compare``'s Kineto figures: per-step medians over annotated steps (never a cold
first step), and the check of its end-to-end span against the measured clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mystique_gen.cli import main as cli_main
from mystique_gen.constants import EQUIVALENT_SCOPE, STEP_SCOPE
from mystique_gen.errors import MystiqueError
from mystique_gen.tools.compare import (
    compare_traces,
    format_comparison,
    kineto_times,
    read_clock,
    step_json_beside,
)
from tests.tracebuilder import TraceBuilder

MM = "aten::mm(Tensor self, Tensor mat2) -> Tensor"
RELU = "aten::relu(Tensor self) -> Tensor"


def _kineto(path: Path, steps: list[tuple[float, float]], step_name: str | None,
            t0: float = 1000.0) -> Path:
    """A Kineto trace of one mm (``mm_us``) then one relu (``relu_us``) per step, each
    step in a ``step_name`` annotation (numbered ``ProfilerStep#N`` as torch does)."""
    events = []
    t = t0
    for n, (mm_us, relu_us) in enumerate(steps):
        start = t
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                       "ts": t + 1, "dur": mm_us, "args": {}})
        t += 1 + mm_us
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1,
                       "tid": 1, "ts": t + 1, "dur": relu_us, "args": {}})
        t += 1 + relu_us + 1
        if step_name is not None:
            name = f"{step_name}{n}" if step_name.endswith("#") else step_name
            events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1,
                           "tid": 1, "ts": start, "dur": t - start, "args": {}})
        t += 50  # between steps: not part of any step's op span
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.mark.parametrize("step_name", [STEP_SCOPE, "ProfilerStep#"])
def test_per_step_medians_leave_out_a_cold_first_step(tmp_path, step_name):
    # A cold first step ten times slower, then steps of 100 + 10 us (one 120 + 10).
    path = _kineto(tmp_path / "k.json", [(1000, 100), (100, 10), (120, 10), (100, 10)],
                   step_name)
    times = kineto_times(path, None)
    assert times.iterations == 3 and times.cold_steps_dropped == 1
    assert times.ops == 2
    assert times.categories["matmul"] == pytest.approx(0.100)
    assert times.step_spans_ms == pytest.approx([0.111, 0.131, 0.111])
    assert times.span_ms == pytest.approx(0.111)


def test_two_steps_keep_both_and_unannotated_traces_divide(tmp_path):
    two = kineto_times(_kineto(tmp_path / "a.json", [(100, 10), (300, 10)], STEP_SCOPE),
                       None)
    assert (two.iterations, two.cold_steps_dropped) == (2, 0)
    assert two.categories["matmul"] == pytest.approx(0.200)
    flat = _kineto(tmp_path / "b.json", [(100, 10), (300, 10)], None)
    assert kineto_times(flat, None).iterations == 1
    halves = kineto_times(flat, 2)
    assert halves.iterations == 2 and halves.categories["matmul"] == pytest.approx(0.200)


def _ets(tmp_path: Path) -> tuple[Path, Path]:
    paths = []
    for name in ("orig.json", "replay.json"):
        b = TraceBuilder()
        x = b.tensor((4, 4))
        b.op(MM, [x, b.tensor((4, 4))], [b.tensor((4, 4))])
        b.op(RELU, [x], [b.tensor((4, 4))])
        paths.append(b.write(tmp_path / name))
    return paths[0], paths[1]


def test_clock_is_read_beside_the_capture_and_checked(tmp_path, capsys):
    """The README flow's compare: the eager step time from <name>.step.json beside the
    capture's profile, the benchmark's iteration time from its --json output. A Kineto
    span that disagrees with the clock by more than 5% says so."""
    orig, replay = _ets(tmp_path)
    k1 = _kineto(tmp_path / "tr.profile.json", [(1000, 100)] + [(100, 10)] * 4, STEP_SCOPE)
    k2 = _kineto(tmp_path / "replay.json.kineto", [(100, 10)] * 3, "ProfilerStep#")
    (tmp_path / "tr.step.json").write_text(json.dumps({"step_ms_median": 0.2,
                                                       "step_peak_bytes": 4000}))
    bench_out = tmp_path / "bench.out"
    bench_out.write_text("warming up\n" + json.dumps({"iter_ms_median": 0.113,
                                                     "peak_step_bytes": 4200}) + "\n")
    assert step_json_beside(k1) == tmp_path / "tr.step.json"
    assert read_clock(bench_out, "iter_ms_median") == pytest.approx(0.113)
    assert cli_main(["compare", str(orig), str(replay), "--kineto-original", str(k1),
                     "--kineto-replay", str(k2), "--bench-json", str(bench_out),
                     "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["original_step_ms"] == 0.2 and report["replay_iter_ms"] == 0.113
    assert report["clock_error"] == pytest.approx(0.113 / 0.2 - 1)
    assert report["replay_iterations"] == 2  # three ProfilerSteps, the cold one left out
    assert report["peak_step_bytes"] == {"original": 4000, "replay": 4200,
                                         "error": pytest.approx(0.05)}
    shares = {k: (v["original_share"], v["replay_share"])
              for k, v in report["category_ms"].items() if v["original"]}
    # mm 100 us and relu 10 us per step on both sides: the same shares.
    assert shares["matmul"] == pytest.approx((100 / 110, 100 / 110))
    notes = " ".join(report["notes"])
    assert "original: the Kineto span" in notes  # 0.111 ms against 0.2 ms measured
    assert "replay: the Kineto span" not in notes  # 0.111 against 0.113: agrees


def test_an_original_profile_of_unmarked_steps_is_divided_into_them(tmp_path):
    """A plain profile of several steps, taken apart from the ET, marks none: its
    totals were read as one step (five steps: the replay read -83%). It is taken as
    many iterations as it holds the ET's top-level ops, and the report says so."""
    orig, replay = _ets(tmp_path)
    k1 = _kineto(tmp_path / "plain.json", [(100, 10)] * 5, None)
    k2 = _kineto(tmp_path / "replay.json.kineto", [(100, 10)] * 3, "ProfilerStep#")
    result = compare_traces(orig, replay, kineto_original=k1, kineto_replay=k2)
    assert result.original_times is not None and result.original_times.iterations == 5
    assert result.original_times.categories["matmul"] == pytest.approx(0.100)
    assert any("marks no steps: taken as 5 iterations" in n for n in result.notes)
    one = compare_traces(orig, replay, kineto_original=_kineto(
        tmp_path / "one.json", [(100, 10)], None), kineto_replay=k2)
    assert one.original_times is not None and one.original_times.iterations == 1


def test_clock_errors_name_the_file(tmp_path):
    bad = tmp_path / "out.txt"
    bad.write_text("no json here\n")
    with pytest.raises(MystiqueError, match="out.txt"):
        read_clock(bad, "iter_ms_median")


def test_format_shows_the_measured_errors(tmp_path):
    orig, replay = _ets(tmp_path)
    c = compare_traces(orig, replay, original_step_ms=2.0, replay_iter_ms=2.1,
                       original_peak_bytes=2 * 2**20, replay_peak_bytes=2**20)
    text = format_comparison(c)
    assert "measured: eager step 2.000 ms, benchmark 2.100 ms, error +5.0%" in text
    assert ("peak memory of one step above its inputs: original 2.00 MiB, replay "
            "1.00 MiB, error -50.0%") in text


def test_categories_count_what_ran_at_any_granularity(tmp_path):
    """A composite op the original ran whole and the replay as its children (attention
    whose softmax a backward reads) is categorised by what ran on both sides: each
    op's exclusive time, not the outermost op's name."""
    def trace(path: Path, whole: bool) -> Path:
        ops = [("aten::bmm", 10, 40), ("aten::_softmax", 50, 30), ("aten::bmm", 80, 20)]
        events = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1,
                   "ts": ts, "dur": dur, "args": {}} for name, ts, dur in ops]
        if whole:  # the composite around them, 10 us of its own
            events.append({"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 5,
                           "name": "aten::scaled_dot_product_attention", "dur": 100,
                           "args": {}})
        path.write_text(json.dumps({"traceEvents": events}))
        return path

    original = kineto_times(trace(tmp_path / "o.json", whole=True), 1)
    replay = kineto_times(trace(tmp_path / "r.json", whole=False), 1)
    assert original.categories["matmul"] == pytest.approx((60 + 10) / 1000)
    assert original.categories["reduction"] == pytest.approx(30 / 1000)
    assert replay.categories["matmul"] == pytest.approx(60 / 1000)
    assert replay.categories["reduction"] == pytest.approx(30 / 1000)


def test_an_equivalents_time_counts_as_the_op_it_ran_for(tmp_path):
    """A replay runs torchvision's roi_align as torch ops (an embedding_bag, index
    arithmetic) inside a scope naming the op: its time is the op's (a reduction, as
    the original's kernel), counted once, not spread over the categories of the ops
    that computed it."""
    scope = EQUIVALENT_SCOPE.format("torchvision::roi_align.default")
    events = [{"ph": "X", "cat": "user_annotation", "name": scope, "pid": 1, "tid": 1,
               "ts": 10, "dur": 100, "args": {}}]
    events += [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts,
                "dur": 30, "args": {}}
               for name, ts in (("aten::mul", 12), ("aten::embedding_bag", 50),
                                ("aten::mm", 120))]
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"traceEvents": events}))
    times = kineto_times(path, 1)
    assert times.ops == 2  # roi_align and the mm after it
    assert times.categories["reduction"] == pytest.approx(100 / 1000)
    assert times.categories["elementwise"] == 0
    assert times.categories["matmul"] == pytest.approx(30 / 1000)
