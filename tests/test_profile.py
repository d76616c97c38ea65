"""What a benchmark measures besides time: the peak memory of one step (`peak_bytes` in
--json) and an HTA-readable --profile (one ProfilerStep#N per timed iteration), and
how compare reads such a profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mystique_gen.cli import main as cli_main
from mystique_gen.constants import HARNESS_SCOPE
from mystique_gen.sources.kineto import kineto_from_document, load_kineto
from mystique_gen.tools.compare import kineto_times, step_windows
from tests.conftest import last_json, run_benchmark
from tests.tracebuilder import MM, RELU, TraceBuilder

HTA_MISSING = "HolisticTraceAnalysis is not installed (pip install 'mystique-gen[hta]')"


def _benchmark(tmp_path: Path, n: int) -> Path:
    """mm then relu of n x n float32 tensors: inputs 2 n^2, peak 4 n^2 elements."""
    b = TraceBuilder()
    x, w = b.tensor((n, n)), b.tensor((n, n))
    y = b.tensor((n, n))
    b.op(MM, [x, w], [y])
    b.op(RELU, [y], [b.tensor((n, n))])
    bench = tmp_path / f"mm{n}.py"
    assert cli_main([str(b.write(tmp_path / f"mm{n}.json")), "-o", str(bench)]) == 0
    return bench


def _profiler_steps(path: Path) -> list[str]:
    events = json.loads(path.read_text())["traceEvents"]
    return [e["name"] for e in events if e.get("ph") == "X" and e.get("cat") ==
            "user_annotation" and e["name"].startswith("ProfilerStep#")]


def test_peak_bytes_is_measured_and_grows_with_the_traces_tensors(tmp_path):
    peaks = {}
    for n in (64, 256):
        proc = run_benchmark(_benchmark(tmp_path, n), "--device", "cpu", "--warmup", "0",
                             "--iters", "1", "--json")
        assert proc.returncode == 0, proc.stderr[-2000:]
        result = last_json(proc.stdout)
        # Measured: the inputs, then mm's and relu's outputs live at once.
        assert result["peak_bytes"] >= 4 * n * n * 4
        assert result["peak_bytes"] < 4 * n * n * 4 + 65536
        assert result["estimated_peak_bytes"] == 4 * n * n * 4
        peaks[n] = result["peak_bytes"]
    assert 0 < peaks[64] < peaks[256]


def test_profile_marks_each_timed_iteration_as_a_profiler_step(tmp_path):
    bench = _benchmark(tmp_path, 32)
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "2", "--iters", "3", "--json",
                         "--profile", str(tmp_path / "prof"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    path = tmp_path / "prof" / "kineto_trace.json"
    assert last_json(proc.stdout)["profile"] == str(path)
    # The profiler's warm-up steps (--warmup) are run but not recorded.
    assert _profiler_steps(path) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    trace = load_kineto(path)
    # Warmed up by the schedule: no cold step to leave out.
    assert step_windows(trace.cpu_ops) == (step_windows(trace.cpu_ops)[0], False)
    assert len(step_windows(trace.cpu_ops)[0]) == 3
    times = kineto_times(trace, None)
    assert times.iterations == 3 and times.ops == 2  # mm and relu per iteration
    assert times.cold_steps_dropped == 0

    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "2",
                         "--profile", str(tmp_path / "prof0"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _profiler_steps(tmp_path / "prof0" / "kineto_trace.json") == [
        "ProfilerStep#0", "ProfilerStep#1"]


def test_hta_reads_the_replay_profile(tmp_path):
    analysis = pytest.importorskip("hta.trace_analysis", reason=HTA_MISSING)
    proc = run_benchmark(_benchmark(tmp_path, 32), "--device", "cpu", "--warmup", "1",
                         "--iters", "3", "--profile", str(tmp_path / "prof"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    # HTA leaves the last step out unless told (it may be cut short in a training run).
    hta = analysis.TraceAnalysis(trace_dir=str(tmp_path / "prof"),
                                 include_last_profiler_step=True)
    assert list(hta.t.traces) == [0]  # no process group: HTA takes it as rank 0
    assert sorted(int(i) for i in hta.t.get_trace(0)["iteration"].unique()) == [1, 2, 3]


def _event(name: str, cat: str, ts: float, dur: float, **args: object) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def test_compare_counts_device_work_of_the_workload_only():
    """Device time leaves out annotations (a ProfilerStep spans the step on the GPU
    too) and what the harness launched (input resets, the barrier)."""
    events = []
    for step in range(2):
        t = step * 100.0
        events += [
            _event(f"ProfilerStep#{step}", "user_annotation", t, 90),
            _event(HARNESS_SCOPE, "user_annotation", t + 1, 10),
            _event("cudaMemcpyAsync", "cuda_runtime", t + 2, 1, correlation=10 + step),
            _event("Memcpy DtoD", "gpu_memcpy", t + 3, 5, correlation=10 + step, stream=7),
            _event("aten::mm", "cpu_op", t + 20, 10),
            _event("cudaLaunchKernel", "cuda_runtime", t + 21, 1, correlation=20 + step),
            _event("sm90_gemm", "kernel", t + 22, 30, correlation=20 + step, stream=7),
            _event(f"ProfilerStep#{step}", "gpu_user_annotation", t + 2, 60,
                   correlation=30 + step, stream=7),
        ]
    trace = kineto_from_document({"traceEvents": events}, name="replay.json")
    times = kineto_times(trace, None)
    assert times.iterations == 2 and times.device_time
    assert times.categories["matmul"] == pytest.approx(0.030)
    assert sum(times.categories.values()) == pytest.approx(0.030)
