"""Select, filter, combine and retarget (issue 6): each flag's replay against the original.

Every replay test generates with the CLI, runs the file standalone for one iteration
with ``--et`` and compares the replay's top-level op multiset with the original's,
filtered here independently of the implementation (from ``select_ops`` scopes and
plain name matching).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.cli import main
from mystique_gen.driver import build_program, generate, generate_source
from mystique_gen.errors import OptionError
from mystique_gen.ir import InputView, OpOutput, TensorMeta, TensorValue
from mystique_gen.options import BuildOptions
from mystique_gen.passes.filters import filter_selection
from mystique_gen.passes.select import select_ops
from mystique_gen.sources.et import load_trace, trace_from_document
from mystique_gen.tools.capture import capture
from mystique_gen.tools.compare import op_multiset
from tests.conftest import last_json, record_et, run_benchmark
from tests.models import MODELS
from tests.tracebuilder import MM, RELU, VIEW, TraceBuilder

NEG = "aten::neg(Tensor self) -> Tensor"
COPY_ = "aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)"
MUL_OUT = "aten::mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)"
FIRST_STEP = 4


# -- fixtures: traces captured once per module ------------------------------------


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("captures")
    found = {}
    for name in ("mlp_sgd", "embedding_bag"):
        result = capture(MODELS[name](), out, name=name, kineto=False, timing_iters=1)
        found[name] = result.et_path
    found["steps"] = _capture_steps(out / "steps.et.json")
    found["dist"] = _capture_distributed(out)
    return found


def _annotated_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step() -> None:
        opt.zero_grad()
        with torch.profiler.record_function("## forward ##"):
            loss = model(x).pow(2).mean()
        with torch.profiler.record_function("## backward ##"):
            loss.backward()
        opt.step()

    return step


def _capture_steps(path: Path) -> Path:
    """One step cut off (no annotation, as when recording starts mid-step), then
    ProfilerStep#4..#6 as torch.profiler names them."""
    from torch.profiler import ExecutionTraceObserver, record_function

    step = _annotated_step()
    step()
    step()
    observer = ExecutionTraceObserver()
    observer.register_callback(str(path))
    observer.start()
    step()
    for n in range(FIRST_STEP, FIRST_STEP + 3):
        with record_function(f"ProfilerStep#{n}"):
            step()
    observer.stop()
    observer.unregister_callback()
    return path


def _capture_distributed(out: Path) -> Path | None:
    """A one-rank gloo job with an all_reduce between compute ops (None without gloo)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return None
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        w, x = torch.randn(16, 16), torch.randn(4, 16)

        def step() -> None:
            y = torch.relu(x @ w)
            dist.all_reduce(y)
            y.sum()

        return capture(step, out, name="dist", kineto=False, timing_iters=1).et_path
    finally:
        dist.destroy_process_group()


# -- helpers ----------------------------------------------------------------------


def _generate(tmp_path: Path, *args: str, name: str = "bench.py") -> Path:
    out = tmp_path / name
    assert main([*args, "-o", str(out)]) == 0
    return out


def _replay(bench: Path, *extra: str) -> tuple[Counter[str], dict]:
    """Run one iteration standalone; the replay's op multiset and the JSON result."""
    et = bench.with_suffix(".replay.json")
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1", "--json",
                         "--et", str(et), *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    return op_multiset(bench.parent / Path(result["et"]).name), result


def _scoped(path: Path, *annotations: str) -> Counter[str]:
    """Top-level ops whose scope holds every one of ``annotations``."""
    return Counter(s.node.name for s in select_ops(load_trace(path)).ops
                   if all(a in s.scope for a in annotations))


def _docstring(bench: Path) -> str:
    text = bench.read_text()
    return text[: text.index('"""', 3)]


# -- filters ------------------------------------------------------------------------


@pytest.mark.slow
def test_iteration_default_is_first_complete_step(traces, tmp_path):
    expected = _scoped(traces["steps"], f"ProfilerStep#{FIRST_STEP}")
    assert expected and expected != op_multiset(traces["steps"])
    bench = _generate(tmp_path, str(traces["steps"]))
    assert f"iteration ProfilerStep#{FIRST_STEP} (default: the first complete" in \
        _docstring(bench)
    replayed, _ = _replay(bench)
    assert replayed == expected


@pytest.mark.slow
def test_iteration_n_keeps_that_step(traces, tmp_path):
    expected = _scoped(traces["steps"], f"ProfilerStep#{FIRST_STEP + 2}")
    bench = _generate(tmp_path, str(traces["steps"]), "--iteration", str(FIRST_STEP + 2))
    replayed, _ = _replay(bench)
    assert replayed == expected


@pytest.mark.slow
def test_subgraph_within_the_default_step(traces, tmp_path):
    # The cut-off step's "## forward ##" comes first, but --iteration keeps step 4 only.
    expected = _scoped(traces["steps"], f"ProfilerStep#{FIRST_STEP}", "## forward ##")
    bench = _generate(tmp_path, str(traces["steps"]), "--subgraph", "forward")
    assert "subgraph 'forward': '## forward ##'" in _docstring(bench)
    replayed, _ = _replay(bench)
    assert replayed == expected


@pytest.mark.slow
def test_include_then_exclude(traces, tmp_path):
    original = op_multiset(traces["mlp_sgd"])
    include = [re.compile("aten::(addmm|mm|t)$"), re.compile("relu")]
    exclude = re.compile("aten::t$")
    expected = Counter({n: c for n, c in original.items()
                        if any(p.search(n) for p in include) and not exclude.search(n)})
    assert expected and expected != original
    bench = _generate(tmp_path, str(traces["mlp_sgd"]), "--include", "aten::(addmm|mm|t)$",
                      "--include", "relu", "--exclude", "aten::t$")
    replayed, _ = _replay(bench)
    assert replayed == expected


@pytest.mark.slow
def test_max_ops_keeps_the_first_n(traces, tmp_path):
    expected = Counter(s.node.name for s in select_ops(load_trace(traces["mlp_sgd"])).ops[:7])
    bench = _generate(tmp_path, str(traces["mlp_sgd"]), "--max-ops", "7")
    replayed, result = _replay(bench)
    assert replayed == expected and result["ops"] == 7


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["compute", "comm"])
def test_mode(traces, tmp_path, mode):
    if traces["dist"] is None:
        pytest.skip("torch.distributed with gloo is not available")
    original = op_multiset(traces["dist"])
    comm = Counter({n: c for n, c in original.items() if n.startswith("c10d::")})
    assert comm and comm != original
    expected = original - comm if mode == "compute" else comm
    bench = _generate(tmp_path, str(traces["dist"]), "--mode", mode)
    replayed, _ = _replay(bench)
    assert replayed == expected


# -- composition --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sequence", "parallel"])
def test_compose_is_the_sum_of_both(traces, tmp_path, how):
    a, b = traces["mlp_sgd"], traces["embedding_bag"]
    bench = _generate(tmp_path, str(a), str(b), "--compose", how)
    doc = _docstring(bench)
    assert f"compose {how}: 2 traces" in doc
    for path in (a, b):
        assert load_trace(path).sha256 in doc
    replayed, _ = _replay(bench)
    assert replayed == op_multiset(a) + op_multiset(b)
    if how == "parallel":
        assert "on 2 host thread(s)" in doc


@pytest.mark.slow
def test_repeat_replays_the_list_k_times(traces, tmp_path):
    original = op_multiset(traces["embedding_bag"])
    bench = _generate(tmp_path, str(traces["embedding_bag"]), "--repeat", "3")
    assert "repeat 3: the op list 3 times per iteration" in _docstring(bench)
    replayed, _ = _replay(bench)
    assert replayed == original + original + original


# -- retargeting --------------------------------------------------------------------


@pytest.mark.slow
def test_dtype_recasts_floating_tensors(traces, tmp_path):
    original = op_multiset(traces["mlp_sgd"])
    bench = _generate(tmp_path, str(traces["mlp_sgd"]), "--dtype", "bfloat16")
    replayed, result = _replay(bench)
    assert replayed == original
    types = Counter()
    for s in select_ops(load_trace(bench.parent / Path(result["et"]).name)).ops:
        types.update(arg.type for arg in s.node.inputs if arg.type.startswith("Tensor("))
    assert types["Tensor(c10::BFloat16)"] > 0
    assert not [t for t in types if t in ("Tensor(float)", "Tensor(double)")]


BN_IMPL_INDEX = ("aten::_batch_norm_impl_index(Tensor input, Tensor? weight, Tensor? bias, "
                 "Tensor? running_mean, Tensor? running_var, bool training, "
                 "float momentum, float eps, bool cudnn_enabled) -> (Tensor, Tensor, "
                 "Tensor, Tensor, int)")
CUDNN_BN_BACKWARD = ("aten::cudnn_batch_norm_backward(Tensor input, Tensor grad_output, "
                     "Tensor weight, Tensor? running_mean, Tensor? running_var, "
                     "Tensor? save_mean, Tensor? save_var, float epsilon, "
                     "Tensor reserveSpace) -> (Tensor, Tensor, Tensor)")
ADD_ = "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)"


def _cudnn_batch_norm_step(dtype: str):
    """Batch norm forward (as torch.batch_norm calls it) and cuDNN's backward, then an
    SGD update of its weight."""
    tb = TraceBuilder()
    cuda = {"device": "cuda", "dtype": dtype}
    x, y, dy, dx = (tb.tensor((8, 4, 2, 2), **cuda) for _ in range(4))
    w, b, mean, var = (tb.tensor((4,), **cuda) for _ in range(4))
    save_mean, save_var, dw, db = (tb.tensor((4,), **cuda) for _ in range(4))
    reserve = tb.tensor((0,), dtype="uint8", device="cuda")
    tb.op(BN_IMPL_INDEX, [x, w, b, mean, var, True, 0.1, 1e-5, True],
          [y, save_mean, save_var, reserve, 1])
    tb.op(CUDNN_BN_BACKWARD, [x, dy, w, mean, var, save_mean, save_var, 1e-5, reserve],
          [dx, dw, db])
    tb.op(ADD_, [w, dw, -0.1], [w])
    return trace_from_document(tb.doc(), name="bn.json", sha256="0" * 64)


def test_a_reduced_dtype_keeps_batch_norm_statistics_in_float32():
    """Batch norm's weights and statistics stay float32 beside half or bfloat16 inputs,
    as mixed-precision training keeps them (cuDNN's kernels take nothing else, and the
    native ones no mix of the two): those tensors, every other use of their storages
    (the optimizer's update of the weight) and the kernels' float32 results (saved
    statistics, weight and bias grads) stay as recorded; activations and their grads
    are recast. A recast of a float64 trace to float32 keeps nothing back."""
    program = build_program(_cudnn_batch_norm_step("float32"),
                            options=BuildOptions(dtype="bfloat16"))
    forward, backward, _update = program.ops
    args = {op.name: {a.spec.name: a.value.meta.dtype for a in op.args
                      if isinstance(a.value, TensorValue)} for op in program.ops}
    assert args["aten::_batch_norm_impl_index"] == {
        "input": "bfloat16", "weight": "float32", "bias": "float32",
        "running_mean": "float32", "running_var": "float32"}
    assert [v.meta.dtype for v in forward.outputs[:4]] == ["bfloat16", "float32",
                                                            "float32", "uint8"]
    assert args["aten::cudnn_batch_norm_backward"] == {
        "input": "bfloat16", "grad_output": "bfloat16", "weight": "float32",
        "running_mean": "float32", "running_var": "float32", "save_mean": "float32",
        "save_var": "float32", "reserveSpace": "uint8"}
    assert [v.meta.dtype for v in backward.outputs] == ["bfloat16", "float32", "float32"]
    assert args["aten::add_"] == {"self": "float32", "other": "float32"}
    assert any("kept as recorded (batch-norm weights and statistics" in line
               for line in program.filters)
    wide = build_program(_cudnn_batch_norm_step("float64"),
                         options=BuildOptions(dtype="float32"))
    assert {a.value.meta.dtype for op in wide.ops for a in op.args
            if isinstance(a.value, TensorValue) and a.value.meta.dtype != "uint8"} == {
        "float32"}


@pytest.mark.slow
def test_a_cnn_recast_to_bfloat16_trains_its_batch_norm_in_mixed_precision(tmp_path):
    """A CNN's training step recast to bfloat16 runs every op, its batch norms with
    bfloat16 activations and float32 weights and statistics (the native kernels take
    that mix only where every one of them is float32)."""
    torch.set_num_threads(1)
    result = capture(MODELS["cnn_batchnorm"](), tmp_path, name="cnn", kineto=False,
                     timing_iters=1)
    bench = _generate(tmp_path, str(result.et_path), "--dtype", "bfloat16")
    replayed, out = _replay(bench)
    assert replayed == op_multiset(result.et_path)
    assert out["skipped_at_runtime"] == [] and out["nonfinite_inputs"] == []
    norms = [s.node for s in select_ops(load_trace(bench.parent / Path(out["et"]).name)).ops
             if "batch_norm" in s.node.name and "backward" not in s.node.name]
    assert norms and all([a.type for a in n.inputs[:5]] == [
        "Tensor(c10::BFloat16)"] + ["Tensor(float)"] * 4 for n in norms), [
        (n.name, [a.type for a in n.inputs[:5]]) for n in norms]


@pytest.mark.slow
def test_device_default_and_cuda_graph_on_cpu(traces, tmp_path):
    bench = _generate(tmp_path, str(traces["mlp_sgd"]), "--device", "cpu")
    assert 'DEFAULT_DEVICE = "cpu"' in bench.read_text()
    assert "device: the benchmark's --device defaults to cpu" in _docstring(bench)
    proc = run_benchmark(bench, "--warmup", "0", "--iters", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["device"] == "cpu"
    if not torch.cuda.is_available():
        proc = run_benchmark(bench, "--cuda-graph", "--warmup", "0", "--iters", "1")
        assert proc.returncode != 0
        assert "--cuda-graph is unavailable on cpu" in proc.stderr


def test_device_must_be_a_device(traces, tmp_path, capsys):
    assert main([str(traces["mlp_sgd"]), "--device", "cuda; import os", "-o",
                 str(tmp_path / "x.py")]) == 2
    assert "is not a device" in capsys.readouterr().err
    # A well-formed name of no device type PyTorch has: refused here, not at run time.
    assert main([str(traces["mlp_sgd"]), "--device", "tpu", "-o",
                 str(tmp_path / "x.py")]) == 2
    assert "is not a device type PyTorch knows" in capsys.readouterr().err


def test_filters_that_leave_no_op_are_refused(traces, tmp_path, capsys):
    """A benchmark that times nothing (an --include that matches no op) was written
    without a word; it is an error naming the filters."""
    assert main([str(traces["mlp_sgd"]), "--include", "zzz", "-o",
                 str(tmp_path / "x.py")]) == 2
    assert "the filters leave no op of" in capsys.readouterr().err
    assert not (tmp_path / "x.py").exists()


@pytest.mark.slow
def test_the_benchmark_refuses_a_device_or_count_it_cannot_run(traces, tmp_path):
    """--device cuda on a build without CUDA, an unknown device, and negative counts
    ended in tracebacks or ran with nonsense (--iters -1 reported 0 iterations): one
    line each, and a nonzero exit."""
    bench = _generate(tmp_path, str(traces["mlp_sgd"]))
    bad = [("--device", "bogus"), ("--iters", "-1"), ("--warmup", "-2")]
    if not torch.cuda.is_available():
        bad.append(("--device", "cuda"))
    for flag, value in bad:
        proc = run_benchmark(bench, flag, value, "--iters", "1") if flag != "--iters" \
            else run_benchmark(bench, flag, value)
        assert proc.returncode != 0, (flag, value)
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert f"{flag} {value}" in proc.stderr or f"{flag} must be" in proc.stderr


# -- generation-level checks ---------------------------------------------------------


def test_no_options_change_nothing(traces, tmp_path):
    """The CLI (always with build options) writes what the library writes by default."""
    path = traces["embedding_bag"]
    bench = _generate(tmp_path, str(path))
    options = GenerateOptions(command_line="x")
    text = bench.read_text()
    library = generate(path, tmp_path / "lib.py", options)
    assert text.split('"""', 2)[2] == library.split('"""', 2)[2]
    assert "Filters applied:\n  - none" in text


def test_inspect_takes_the_same_flags(traces, capsys):
    original = op_multiset(traces["mlp_sgd"])
    assert main(["inspect", str(traces["mlp_sgd"]), "--json", "--include", "aten::mm",
                 "--repeat", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ops_by_name"] == {"aten::mm": 2 * original["aten::mm"]}
    assert summary["filters"][0].startswith("include 'aten::mm':")
    assert main(["inspect", str(traces["mlp_sgd"]), "--exclude", "aten::t$"]) == 0
    text = capsys.readouterr().out
    by_name = text.split("ops by name:\n")[1].split("\n\n")[0]
    names = {line.split()[0] for line in by_name.splitlines()}
    assert "filters applied:" in text
    assert names == set(original) - {"aten::t"}


@pytest.mark.parametrize("args,message", [
    (["{mlp}", "{emb}"], "2 traces given: combine them with --compose"),
    (["{mlp}", "--compose", "sequence"], "combines several traces; 1 given"),
    (["{steps}", "--iteration", "99"], "has no ProfilerStep#99; it has #4, #5, #6"),
    (["{mlp}", "--iteration", "1"], "has no ProfilerStep#N annotations"),
    (["{steps}", "--subgraph", "nowhere"], "no annotation around the kept ops contains it"),
    (["{mlp}", "--include", "aten::("], "is not a regular expression"),
])
def test_bad_options_exit_2(traces, tmp_path, capsys, args, message):
    paths = {"mlp": traces["mlp_sgd"], "emb": traces["embedding_bag"], "steps": traces["steps"]}
    argv = [a.format(**paths) for a in args]
    assert main([*argv, "-o", str(tmp_path / "x.py")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.py").exists()


def test_resnet_iteration_keeps_one_step(shared_traces, tmp_path):
    path = shared_traces / "param/resnet50_1gpu_et.json.gz"
    trace = load_trace(path)
    ops = select_ops(trace).ops
    steps = {n.name: n.id for n in trace.nodes if n.name.startswith("ProfilerStep#")}
    assert sorted(steps) == ["ProfilerStep#6", "ProfilerStep#7", "ProfilerStep#8"]
    # Step 7: its forward/optimizer ops, and the autograd thread's ops between #7 and #8.
    lo, hi = steps["ProfilerStep#7"], steps["ProfilerStep#8"]
    expected = sum(1 for s in ops if "ProfilerStep#7" in s.scope
                   or (not any(a.startswith("ProfilerStep#") for a in s.scope)
                       and lo < s.node.id < hi))
    assert 0 < expected < len(ops) / 2
    bench = _generate(tmp_path, str(path), "--iteration", "7")
    doc = _docstring(bench)
    assert f"iteration ProfilerStep#7 (of 3 steps #6, #7, #8): {len(ops)} -> {expected} ops" \
        in doc.replace("\n      ", " ")
    assert "ProfilerStep#6" not in bench.read_text().split('"""', 2)[2]
    # The kept step's number travels as a field (the ranks of a job are compared on it).
    for iteration, kept in (("7", 7), ("auto", 6), ("all", None)):
        assert filter_selection(trace, select_ops(trace), BuildOptions(iteration=iteration)
                                )[0].step == kept


# -- tensors a dropped op would have produced -----------------------------------------


def _program(builder: TraceBuilder, options: BuildOptions | None):
    return build_program(trace_from_document(builder.doc(), name="t.json", sha256="0"),
                         options=options)


def test_dropped_producer_output_is_materialised_as_recorded():
    b = TraceBuilder()
    x = b.tensor((3, 2), dtype="float16")
    # A strided view at an offset: shape (2, 3), strides (1, 2), offset 2, float16.
    y = b.tensor((2, 3), strides=(1, 2), offset=2, dtype="float16")
    b.op(RELU, [x], [y])
    b.op(MM, [y, x], [b.tensor((2, 2), dtype="float16")])
    kept = _program(b, None)
    assert isinstance(kept.ops[1].args[0].value.binding, OpOutput)

    program = _program(b, BuildOptions(exclude=("relu",)))
    (op,) = program.ops
    y_in = op.args[0].value
    assert isinstance(y_in, TensorValue) and isinstance(y_in.binding, InputView)
    assert y_in.meta == TensorMeta((2, 3), (1, 2), 2, "float16", "cpu")
    assert y_in.storage.materialised and y_in.storage.extent >= 2 + 1 * 1 + 2 * 2 + 1
    assert program.filters == ["exclude 'relu': 2 -> 1 ops"]
    text = generate_source(program, GenerateOptions(command_line="x"))
    assert "as_strided([2, 3], [1, 2], 2)" in text and "torch.float16" in text


def test_dropped_op_that_reused_a_storage_id_does_not_alias():
    b = TraceBuilder()
    x = b.tensor((4, 4))
    a = b.tensor((4, 4), storage=900)
    b.op(RELU, [x], [a])  # kept: produces storage 900
    b.op(MM, [a, x], [b.tensor((4, 4))])
    c = b.tensor((4, 4), storage=900)
    b.op(NEG, [x], [c])  # dropped: a new lifetime of storage 900
    b.op(MM, [c, x], [b.tensor((4, 4))])
    program = _program(b, BuildOptions(exclude=("neg",)))
    assert [op.name for op in program.ops] == ["aten::relu", "aten::mm", "aten::mm"]
    last = program.ops[2].args[0].value
    # Not the relu's result: the tensor the dropped op made is an input of its own.
    assert isinstance(last.binding, InputView) and last.storage.materialised
    first = program.ops[1].args[0].value.binding
    assert isinstance(first, OpOutput) and first.op_index == 0


# -- memory the allocator handed out again without a recorded op -------------------


def _reallocated_trace(variant: str) -> TraceBuilder:
    """An activation's storage, freed after its last read, then the same storage id on
    another tensor (another view) that no recorded op made: FSDP2's unsharded parameter,
    allocated again with ``untyped_storage().resize_()`` at the activation's address and
    filled by its all-gather's copy-out. ``variant`` changes one fact that says the
    memory may still be the activation's."""
    b = TraceBuilder()
    x, w = b.tensor((4, 8)), b.tensor((8, 8))
    act = b.tensor((4, 8))
    b.op(RELU, [x], [act])
    b.op(MM, [act, w], [b.tensor((4, 8))])  # the activation's last read
    param = b.tensor((32,), storage=act.storage_id)  # unsharded: another tensor, another view
    rows = b.view(param, (4, 8))
    b.op(VIEW, [param, [4, 8]], [rows])
    if variant == "read first":
        b.op(MM, [rows, w], [b.tensor((4, 8))])
    if variant == "part written":
        half = b.view(param, (2, 8))
        b.op(MUL_OUT, [b.tensor((2, 8)), b.tensor((2, 8)), half], [half])
    else:  # the all-gather's copy-out
        b.op(COPY_, [rows, b.tensor((4, 8)), False], [rows])
    if variant == "activation read after":
        b.op(MM, [act, w], [b.tensor((4, 8))])
    b.op(MM, [rows, w], [b.tensor((4, 8))])
    return b


@pytest.mark.parametrize("variant", ["reallocated", "read first", "part written",
                                     "activation read after"])
def test_a_storage_id_reused_by_an_unrecorded_allocation_is_new_memory(variant):
    program = _program(_reallocated_trace(variant), None)
    activation = program.ops[0].outputs[0]
    param = next(op for op in program.ops if op.name == "aten::view").args[0].value
    last_read = program.ops[-1].args[0].value
    assert isinstance(param, TensorValue) and isinstance(last_read, TensorValue)
    assert last_read.storage is param.storage
    if variant == "reallocated":
        # Nothing of the activation is read again and the new tensor is replaced whole
        # before anything reads it: a buffer of its own, not a view of the activation.
        assert isinstance(param.binding, InputView) and param.storage.materialised
        assert param.storage is not activation.storage
    else:
        # Its values may be the activation's (an unrecorded alias: ``.data``, autograd
        # unpacking a saved result): the memory stays one.
        assert last_read.storage is activation.storage


def test_a_tensor_moved_onto_a_dead_activation_and_overwritten_is_no_view_of_it(tmp_path):
    """The same with a real capture: ``p.data = ...`` records no op (the observer sees
    only the metadata query before it), as FSDP2's ``resize_`` records none. The replay
    must not write the activation that autograd recorded, as the original did not."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    x, w = torch.randn(4, 16), torch.randn(4, 16)
    p = torch.empty(64)

    def step() -> None:
        h = lin(x).relu()
        h.sum().backward()
        p.data = h.data.view(-1)  # p's storage is now h's, which nothing reads again
        p.copy_(w.view(-1))  # replaced whole
        (lin(x) * p.view(4, 16)).sum().backward()

    step()
    path = record_et(step, tmp_path / "moved.et.json")
    program = build_program(load_trace(path))
    relu = next(op for op in program.ops if op.name == "aten::relu").outputs[0]
    copy = next(op for op in program.ops if op.name == "aten::copy_")
    written = copy.args[0].value
    assert isinstance(relu, TensorValue) and isinstance(written, TensorValue)
    assert written.storage is not relu.storage and written.storage.materialised
    bench = tmp_path / "moved.py"
    generate(path, bench)
    proc = run_benchmark(bench, "--iters", "2", "--warmup", "0", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = last_json(proc.stdout)
    assert result["ops"] == len(program.ops) and not result["skipped_at_runtime"]


def test_options_validate():
    with pytest.raises(OptionError):
        BuildOptions(mode="gpu")
    with pytest.raises(OptionError):
        BuildOptions(iteration="first")
    with pytest.raises(OptionError):
        BuildOptions(repeat=0)


def _grouped_attention_step() -> callable:
    """A training step of grouped-query attention (4 query heads, 2 key/value heads)
    whose scores' mask is filled with float32's lowest value, as HF models fill it,
    with noise made inside the step (``torch.randn``, default dtype)."""
    torch.manual_seed(0)
    q_proj, kv_proj = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
    params = [*q_proj.parameters(), *kv_proj.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)
    x = torch.randn(2, 8, 32)
    causal = torch.ones(8, 8, dtype=torch.bool).triu(1)

    def step() -> None:
        q = q_proj(x).view(2, 8, 4, 8).transpose(1, 2)
        k, v = kv_proj(x).view(2, 8, 4, 8).transpose(1, 2).chunk(2, dim=1)
        scores = (q @ k.repeat_interleave(2, dim=1).transpose(-1, -2)).masked_fill(
            causal, torch.finfo(torch.float32).min)
        mixed = scores.softmax(-1) @ v.repeat_interleave(2, dim=1)
        fused = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True)
        loss = (mixed + fused + torch.randn(mixed.shape) * 1e-3).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_attention_recast_to_half_precision_runs_every_op(tmp_path, dtype):
    """Recast to half precision, a step stopped where the recorded numbers or tensors
    kept float32's meaning: a mask filled with float32's lowest value ("value cannot
    be converted to type c10::Half without overflow"), noise made at the default
    dtype (float32 meeting half weights), and the fused attention's logsumexp, which
    its backward takes only as float32. The number saturates at the type's largest,
    factory ops name the type, logsumexp stays float32; every op runs, finite."""
    torch.set_num_threads(1)
    result = capture(_grouped_attention_step(), tmp_path, name="attn", kineto=False,
                     timing_iters=1)
    program = build_program(load_trace(result.et_path), options=BuildOptions(dtype=dtype))
    (line,) = [f for f in program.filters if f.startswith(f"dtype {dtype}")]
    assert "1 number(s) beyond its range saturated at its largest" in line
    assert "factory op(s) given the type" in line and "storages kept as recorded" in line
    bench = _generate(tmp_path, str(result.et_path), "--dtype", dtype)
    replayed, out = _replay(bench)
    assert replayed == op_multiset(result.et_path)
    assert out["skipped_at_runtime"] == [] and out["equivalents_at_runtime"] == []
    assert out["nonfinite_inputs"] == []
