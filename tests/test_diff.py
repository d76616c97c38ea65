"""``mystique-gen diff A B``: workload diffs of traces and generated benchmarks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mystique_gen.cli import main
from mystique_gen.tools.capture import capture
from mystique_gen.tools.diff import align
from tests.tracebuilder import ADD_, MM, RELU, TraceBuilder


# -- synthetic traces -------------------------------------------------------------------------
def _trace(path: Path, *, shift: int = 0, widths: tuple[int, ...] = (8, 16, 4),
           extra_relu: bool = False) -> Path:
    """x @ w1 -> relu -> @ w2 -> relu under "## forward ##", then an SGD-like update.
    ``shift`` offsets every op, tensor and storage id; ``extra_relu`` adds one op at the end
    of the forward pass that nothing reads."""
    b = TraceBuilder()
    b._next += shift
    fwd = b.annotation("## forward ##")
    x = b.tensor((4, widths[0]))
    weights = []
    for n_in, n_out in zip(widths, widths[1:], strict=False):
        w = b.tensor((n_in, n_out))
        y, z = b.tensor((4, n_out)), b.tensor((4, n_out))
        b.op(MM, [x, w], [y], parent=fwd)
        b.op(RELU, [y], [z], parent=fwd)
        weights.append(w)
        x = z
    if extra_relu:
        b.op(RELU, [x], [b.tensor(x.shape)], parent=fwd)
    opt = b.annotation("Optimizer.step#SGD.step")
    for w in weights:
        g = b.tensor(w.shape)
        b.op(ADD_, [w, g, -0.1], [w], parent=opt)
    return b.write(path)


def _diff_json(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(["diff", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_same_trace_with_shifted_ids_is_no_difference(tmp_path, capsys):
    a = _trace(tmp_path / "a.json")
    b = _trace(tmp_path / "b.json", shift=1000)
    assert main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "no differences" in out and "\n+ " not in out and "\n- " not in out
    rc, report = _diff_json(capsys, str(a), str(b))
    assert rc == 0 and report["same"] and report["scopes"] == []
    assert report["added"] == report["removed"] == report["changed"] == 0


def test_one_inserted_op_is_listed_as_added(tmp_path, capsys):
    a = _trace(tmp_path / "a.json")
    b = _trace(tmp_path / "b.json", shift=7, extra_relu=True)
    rc, report = _diff_json(capsys, str(a), str(b))
    assert rc == 1 and not report["same"]
    assert (report["added"], report["removed"], report["changed"]) == (1, 0, 0)
    [group] = report["scopes"]
    assert group["scope"] == "## forward ##"
    [change] = group["changes"]
    assert change["kind"] == "added" and change["new"]["op"] == "aten::relu.default"
    assert change["new"]["args"] == {"self": "f32[4,4]"} and change["index_b"] == 4
    assert main(["diff", str(a), str(b)]) == 1
    text = capsys.readouterr().out
    assert "@@ ## forward ##\n+ aten::relu.default(f32[4,4])\n" in text
    assert "1 added, 0 removed, 0 changed" in text


def test_widened_matmul_is_listed_as_changed_old_to_new(tmp_path, capsys):
    a = _trace(tmp_path / "a.json")
    b = _trace(tmp_path / "b.json", widths=(8, 16, 6))
    rc, report = _diff_json(capsys, str(a), str(b))
    assert rc == 1 and report["added"] == report["removed"] == 0
    changes = [c for g in report["scopes"] for c in g["changes"]]
    mm = [c for c in changes if c["old"]["op"] == "aten::mm.default"]
    assert len(mm) == 1 and mm[0]["kind"] == "changed"
    assert mm[0]["changed_args"] == [{"arg": "mat2", "old": "f32[16,4]", "new": "f32[16,6]"}]
    # The relu after it and the update of its weight change with it; the first layer not.
    assert sorted(c["old"]["op"] for c in changes) == [
        "aten::add_.Tensor", "aten::mm.default", "aten::relu.default"]
    main(["diff", str(a), str(b)])
    assert "~ aten::mm.default  mat2: f32[16,4] -> f32[16,6]" in capsys.readouterr().out


def test_json_report_fields(tmp_path, capsys):
    a = _trace(tmp_path / "a.json")
    b = _trace(tmp_path / "b.json", widths=(8, 32, 4))
    rc, report = _diff_json(capsys, str(a), str(b))
    assert rc == 1
    assert set(report) >= {"a", "b", "same", "compared_by", "added", "removed", "changed",
                           "scopes", "totals", "notes"}
    assert report["a"] == {"name": "a.json", "kind": "trace", "ops": 6}
    assert report["compared_by"] == "signature"
    totals = report["totals"]
    assert set(totals) == {"ops", "ops_by_category", "flops", "bytes", "peak_bytes"}
    # mm flops: 2*4*8*16 + 2*4*16*4 = 1536 -> 2*4*8*32 + 2*4*32*4 = 3072; relus and adds
    # one per element: 4*16 + 4*4 + 8*16 + 16*4 = 272 -> 4*32 + 4*4 + 8*32 + 32*4 = 528.
    assert totals["flops"] == {"a": 1536 + 272, "b": 3072 + 528, "delta": 1792}
    assert totals["ops_by_category"]["matmul"] == {"a": 2, "b": 2, "delta": 0}
    assert totals["bytes"]["delta"] > 0 and totals["peak_bytes"]["delta"] > 0
    change = report["scopes"][0]["changes"][0]
    assert set(change) == {"kind", "index_a", "index_b", "old", "new", "changed_args"}
    assert set(change["old"]) == {"op", "args", "category"}


def test_selection_flags_apply_to_both_sides(tmp_path, capsys):
    a = _trace(tmp_path / "a.json")
    b = _trace(tmp_path / "b.json", widths=(8, 16, 6))
    # Only the first layer's mm is kept on both sides: it did not change.
    rc, report = _diff_json(capsys, str(a), str(b), "--include", "aten::mm", "--max-ops", "1")
    assert rc == 0 and report["a"]["ops"] == 1


def test_align_anchors_exact_matches_before_pairing_by_name():
    # An inserted "L" between two others: exact keys keep L1 and L3 in place; the new L2
    # is an insertion, not a change of L3 followed by an inserted L3.
    a = [("L", 1), ("R", 0), ("L", 3)]
    b = [("L", 1), ("R", 0), ("L", 2), ("G", 0), ("L", 3)]
    ops = align(a, b, [k[0] for k in a], [k[0] for k in b])
    assert [op for op in ops if op[0] != "equal"] == [("insert", 2, 2, 2, 4)]
    # Same names, other arguments: paired.
    assert align([("L", 1)], [("L", 2)], ["L"], ["L"]) == [("pair", 0, 1, 0, 1)]


# -- generated benchmarks -------------------------------------------------------------------
def _bench(trace: Path, out: Path) -> Path:
    assert main([str(trace), "-o", str(out), "--dispatcher-calls"]) == 0
    return out


def test_benchmarks_compare_by_overload_sequence(tmp_path, capsys):
    a = _bench(_trace(tmp_path / "a.json"), tmp_path / "a.py")
    b = _bench(_trace(tmp_path / "b.json", extra_relu=True), tmp_path / "b.py")
    wide = _bench(_trace(tmp_path / "w.json", widths=(8, 32, 4)), tmp_path / "w.py")
    capsys.readouterr()
    rc, report = _diff_json(capsys, str(a), str(b))
    assert rc == 1 and report["compared_by"] == "overload"
    assert (report["added"], report["removed"], report["changed"]) == (1, 0, 0)
    [group] = report["scopes"]
    assert group["scope"] == "## forward ##"
    assert group["changes"][0]["new"] == {"op": "aten::relu.default", "args": {},
                                          "category": "elementwise"}
    assert report["totals"]["flops"] == {"a": None, "b": None, "delta": None}
    assert report["totals"]["peak_bytes"]["a"] > 0
    # Shapes are not in the file: a widened layer is the same overload sequence.
    rc, report = _diff_json(capsys, str(a), str(wide))
    assert rc == 0 and report["notes"]


def test_selection_flags_are_refused_for_benchmarks(tmp_path, capsys):
    """A benchmark's ops are already selected: --include on two files was ignored."""
    a = _bench(_trace(tmp_path / "a.json"), tmp_path / "a.py")
    b = _bench(_trace(tmp_path / "b.json", extra_relu=True), tmp_path / "b.py")
    capsys.readouterr()
    assert main(["diff", str(a), str(b), "--include", "aten::mm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "selection flags" in err[0]
    assert main(["diff", str(a), str(b), "--dispatcher-calls"]) == 1  # no selection
    with pytest.raises(SystemExit) as exit_:  # each side is one workload: no --compose
        main(["diff", str(a), str(b), "--compose", "sequence"])
    assert exit_.value.code == 2


@pytest.mark.parametrize("case", ["mixed", "missing", "not_a_benchmark", "one_kineto"])
def test_errors_are_one_line_exit_2(tmp_path, capsys, case):
    trace = _trace(tmp_path / "a.json")
    other = {"mixed": _bench(trace, tmp_path / "a.py"),
             "missing": tmp_path / "nope.json",
             "not_a_benchmark": tmp_path / "x.py",
             "one_kineto": trace}[case]
    (tmp_path / "x.py").write_text("print('hello')\n")
    capsys.readouterr()
    extra = ["--kineto-a", str(trace)] if case == "one_kineto" else []
    sides = [str(other), str(other)] if case == "not_a_benchmark" else [str(trace), str(other)]
    assert main(["diff", *sides, *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mystique-gen: error: ")


# -- real models, captured at test time -------------------------------------------------------
def _mlp(hidden: tuple[int, ...] = (64,), *, batch: int = 16, optimizer: str = "sgd",
         extra_gelu: bool = False) -> Callable[[], None]:
    """tests/models.mlp_sgd, with knobs: hidden widths, batch size, optimizer, and one
    more Linear+GELU after the first hidden layer."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    widths = (32, *hidden)
    for n_in, n_out in zip(widths, widths[1:], strict=False):
        layers += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
        if extra_gelu and not any(isinstance(m, torch.nn.GELU) for m in layers):
            layers += [torch.nn.Linear(n_out, n_out), torch.nn.GELU()]
    layers.append(torch.nn.Linear(widths[-1], 10))
    model = torch.nn.Sequential(*layers)
    opt: torch.optim.Optimizer = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optimizer == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-3))
    x, y = torch.randn(batch, 32), torch.randint(0, 10, (batch,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Callable[..., tuple[Path, Path]]:
    """(ET, Kineto trace) of ``_mlp(**knobs)``, captured once per knob set and name."""
    root = tmp_path_factory.mktemp("diff_models")
    done: dict[str, tuple[Path, Path]] = {}

    def get(name: str, **knobs) -> tuple[Path, Path]:
        if name not in done:
            result = capture(_mlp(**knobs), root, name=name, warmup=1, timing_iters=1,
                             profile_steps=1)
            done[name] = (Path(result.et_path), root / f"{name}.kineto.json")
        return done[name]

    return get


def _real_diff(capsys, a: Path, b: Path, *extra: str) -> tuple[int, dict]:
    capsys.readouterr()
    return _diff_json(capsys, str(a), str(b), *extra)


def _ops(report: dict, kind: str) -> list[str]:
    side = "old" if kind == "removed" else "new"
    return [c[side]["op"] for g in report["scopes"] for c in g["changes"] if c["kind"] == kind]


@pytest.mark.slow
def test_real_mlp_captured_twice_is_the_same(captured, capsys):
    (a, _), (b, _) = captured("base"), captured("base_again")
    rc, report = _real_diff(capsys, a, b)
    assert rc == 0 and report["same"] and report["a"]["ops"] == report["b"]["ops"] > 30


@pytest.mark.slow
def test_real_mlp_inserted_linear_gelu_lists_the_new_ops(captured, capsys):
    (a, _), (b, _) = captured("base"), captured("gelu", extra_gelu=True)
    rc, report = _real_diff(capsys, a, b)
    assert rc == 1 and report["removed"] == 0 and report["changed"] == 0
    added = _ops(report, "added")
    assert added.count("aten::linear.default") == 1 and "aten::gelu.default" in added
    assert "aten::gelu_backward.default" in added and "aten::mm.default" in added
    # The update of the new layer's weight and bias.
    assert report["totals"]["ops_by_category"]["matmul"]["delta"] > 0
    assert report["totals"]["flops"]["delta"] > 0


@pytest.mark.slow
def test_real_mlp_widened_layer_is_changed(captured, capsys):
    (a, _), (b, _) = captured("base"), captured("wide", hidden=(96,))
    rc, report = _real_diff(capsys, a, b)
    assert rc == 1 and report["added"] == report["removed"] == 0
    linears = [c for g in report["scopes"] for c in g["changes"]
               if c["new"]["op"] == "aten::linear.default"]
    assert [c["changed_args"] for c in linears][0] == [
        {"arg": "weight", "old": "f32[64,32]", "new": "f32[96,32]"},
        {"arg": "bias", "old": "f32[64]", "new": "f32[96]"}]
    assert report["totals"]["ops"]["delta"] == 0 and report["totals"]["flops"]["delta"] > 0


@pytest.mark.slow
def test_real_mlp_batch_size(captured, capsys):
    (a, _), (b, _) = captured("base"), captured("batch32", batch=32)
    rc, report = _real_diff(capsys, a, b)
    assert rc == 1 and report["added"] == report["removed"] == 0 and report["changed"] > 0
    first = report["scopes"][0]["changes"][0]
    assert first["changed_args"][0] == {"arg": "input", "old": "f32[16,32]",
                                        "new": "f32[32,32]"}


@pytest.mark.slow
def test_real_mlp_sgd_to_adamw(captured, capsys):
    (a, ka), (b, kb) = captured("base"), captured("adamw", optimizer="adamw")
    rc, report = _real_diff(capsys, a, b, "--kineto-a", str(ka), "--kineto-b", str(kb))
    assert rc == 1
    scopes = {g["scope"] for g in report["scopes"]}
    assert "Optimizer.step#SGD.step" in scopes and "Optimizer.step#AdamW.step" in scopes
    # Forward and backward did not change.
    assert scopes <= {"Optimizer.step#SGD.step", "Optimizer.step#AdamW.step"}
    # AdamW's per-parameter update is more elementwise ops than SGD's.
    assert report["totals"]["ops_by_category"]["elementwise"]["delta"] > 0
    times = report["totals"]["time_ms_by_category"]
    assert set(times) >= {"matmul", "elementwise"} and report["totals"]["time_ms"]["a"] > 0
