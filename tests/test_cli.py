from __future__ import annotations

import json

from mystique_gen.cli import command_line, main
from tests.conftest import last_json, run_benchmark
from tests.tracebuilder import MM, RELU, TraceBuilder


def _trace(tmp_path):
    b = TraceBuilder()
    x, w = b.tensor((4, 4)), b.tensor((4, 4))
    y = b.tensor((4, 4))
    b.op(MM, [x, w], [y])
    b.op(RELU, [y], [b.tensor((4, 4))])
    b.op("c10d::barrier(Tensor tensor) -> ()", [x], [])
    return b.write(tmp_path / "tiny.json")


def test_generate_writes_a_benchmark(tmp_path, capsys):
    out = tmp_path / "sub" / "bench.py"
    assert main([str(_trace(tmp_path)), "-o", str(out)]) == 0
    text = out.read_text()
    assert "aten_mm(mm_x, mm_mat2)" in text
    assert "Command: mystique-gen tiny.json -o bench.py" in text
    assert str(tmp_path) not in text  # no absolute paths


def test_inspect_json_reports_selection_and_skips(tmp_path, capsys):
    assert main(["inspect", str(_trace(tmp_path)), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # The barrier is replayed with torch.distributed (issue 5), not skipped.
    assert summary["selected_ops"] == 3
    assert summary["ops_by_name"] == {"aten::mm": 1, "aten::relu": 1, "c10d::barrier": 1}
    assert summary["communication_ops"] == {"c10d::barrier": 1}
    assert summary["not_replayed"] == []


def test_inspect_text(tmp_path, capsys):
    assert main(["inspect", str(_trace(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "aten::mm" in out and "not replayed:" in out


def test_inspect_refuses_a_directory_in_words(tmp_path, capsys):
    """A directory of rank traces read as 'no such trace file' before."""
    _trace(tmp_path)
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a directory of rank traces" in err[0]


def test_missing_trace_is_one_line_exit_2_and_no_output(tmp_path, capsys):
    out = tmp_path / "bench.py"
    assert main([str(tmp_path / "nope.json"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mystique-gen: error:")
    assert not out.exists()


def test_command_line_strips_absolute_paths():
    assert command_line(["/home/me/t.json", "-o", "out/b.py"]) == "mystique-gen t.json -o out/b.py"


def test_the_benchmark_runs_the_threads_asked_and_names_the_captures(tmp_path):
    """An ET does not record the intra-op threads its CPU ops ran with; the capture's
    step.json does. The benchmark keeps torch's default count unless --threads says
    (--num-threads) otherwise, and says on stderr where a CPU run's count differs from the capture's
    (its ops' times follow it)."""
    b = TraceBuilder()
    x, w = b.tensor((4, 4)), b.tensor((4, 4))
    b.op(MM, [x, w], [b.tensor((4, 4))])
    trace = b.write(tmp_path / "tiny.et.json")
    (tmp_path / "tiny.step.json").write_text(json.dumps({"threads": 3}))
    bench = tmp_path / "bench.py"
    assert main([str(trace), "-o", str(bench)]) == 0
    assert '"num_threads": 3' in bench.read_text()
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1",
                         "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert last_json(proc.stdout)["num_threads"] == 1  # OMP_NUM_THREADS=1, as run here
    assert "the capture ran with 3 intra-op CPU threads, this run with 1: " \
        "--num-threads 3 to match" in proc.stderr
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1",
                         "--json", "--num-threads", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert last_json(proc.stdout)["num_threads"] == 2
    assert "intra-op" not in proc.stderr
