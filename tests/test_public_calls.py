"""Public bindings (passes/bindings.py): ops are called the way a model calls them
(``torch.add``), only where that provably dispatches the recorded overload."""

from __future__ import annotations

import pytest

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.backends.check import UnsafeCodeError, check_source
from mystique_gen.backends.single import reference_facts
from mystique_gen.driver import build_program, generate
from mystique_gen.ir import DeviceValue, ListValue, Literal, TensorMeta, TensorValue
from mystique_gen.options import BuildOptions
from mystique_gen.passes.public_calls import candidates, probe_value, public_chain_ok
from mystique_gen.sources.et import trace_from_document
from mystique_gen.tools.compare import op_multiset
from tests.conftest import last_json, run_benchmark
from tests.test_check import GOLDEN, inject_call
from tests.tracebuilder import ADD_, MM, RELU, TraceBuilder

MUL_SCALAR = "aten::mul.Scalar(Tensor self, Scalar other) -> Tensor"
MUL_TENSOR = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
SPLIT = "aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]"
ZEROS = ("aten::zeros(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, "
         "Device? device=None, bool? pin_memory=None) -> Tensor")


def _trace(tmp_path=None):
    b = TraceBuilder()
    x, w = b.tensor((4, 4)), b.tensor((4, 4))
    y = b.tensor((4, 4))
    b.op(MM, [x, w], [y])
    b.op(ADD_, [y, w, 1], [y])
    r = b.tensor((4, 4))
    b.op(RELU, [y], [r])
    s = b.tensor((4, 4))
    b.op(MUL_SCALAR, [r, 3.0], [s])
    m = b.tensor((4, 4))
    b.op(MUL_TENSOR, [s, x], [m])
    parts = [b.view(m, (2, 4)), b.view(m, (2, 4), offset=8)]
    b.op(SPLIT, [m, 2, 0], [parts])
    return b if tmp_path is None else b.write(tmp_path / "t.json")


def _bindings(options: BuildOptions | None = None) -> dict[str, str | None]:
    program = build_program(trace_from_document(_trace().doc(), name="t.json", sha256="0"),
                            options=options)
    return {op.signature.full_name: op.public_call for op in program.ops}


def test_each_op_gets_the_public_call_that_dispatches_its_overload():
    assert _bindings() == {
        "aten::mm.default": "torch.mm",
        "aten::add_.Tensor": "torch.Tensor.add_",  # in place: a method
        "aten::relu.default": "torch.relu",
        # torch.mul(x, 3.0) dispatches mul.Tensor (aten::mul.Scalar has no binding)
        "aten::mul.Scalar": None,
        "aten::mul.Tensor": "torch.mul",
        "aten::split.Tensor": None,  # torch.split and Tensor.split are Python functions
    }


def test_dispatcher_calls_keeps_torch_ops_everywhere():
    assert set(_bindings(BuildOptions(public_calls=False)).values()) == {None}


@pytest.mark.parametrize("chain", [
    "torch.add", "torch.mm", "torch._foreach_add_", "torch.Tensor.add_", "torch.Tensor.view",
    "torch.nn.functional.linear", "torch.linalg.vector_norm", "torch.special.erf",
])
def test_operator_bindings_are_public_calls(chain):
    assert public_chain_ok(chain)


@pytest.mark.parametrize("chain", [
    "torch.load", "torch.save", "torch.norm", "torch.split", "torch.Tensor.split",
    "torch.nn.functional.layer_norm", "torch.Tensor.__class__", "torch.os.system",
    "torch.ops.aten.add", "os.system", "torch.Tensor.__init__",
])
def test_python_functions_and_non_operators_are_not(chain):
    assert not public_chain_ok(chain)


def test_candidates_strip_the_aten_prefix_of_submodules():
    assert candidates("linalg_vector_norm") == ["torch.linalg.vector_norm"]
    assert candidates("add_") == ["torch.Tensor.add_"]
    assert candidates("load") == []


def test_probe_arguments_keep_types_but_hold_nothing():
    """A probe runs at generation time: whatever sizes a trace declares, it allocates
    nothing (a zeros of 10^12 elements is probed as a zeros of none)."""
    big = TensorValue(1, 1, TensorMeta((10**6, 10**6), (10**6, 1), 0, "float32", "cpu"))
    tensor = probe_value(big)
    assert tuple(tensor.shape) == (0, 0) and str(tensor.dtype) == "torch.float32"
    assert probe_value(ListValue((Literal(10**12), Literal(7)))) == [0, 0]
    assert probe_value(Literal(2.5)) == 0.0 and isinstance(probe_value(Literal(2.5)), float)
    assert probe_value(Literal(True)) is True
    assert str(probe_value(DeviceValue("cuda"))) == "cpu"
    b = TraceBuilder()
    b.op(ZEROS, [[10**6, 10**6], 6, None, None, None], [b.tensor((10**6, 10**6))])
    program = build_program(trace_from_document(b.doc(), name="z.json", sha256="0"))
    assert [op.public_call for op in program.ops] == ["torch.zeros"]


TO_DTYPE = ("aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, "
            "bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a)")
ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
SUM_DIM = ("aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, "
           "ScalarType? dtype=None) -> Tensor")


def _casts(tmp_path=None):
    """Casts as models make them (``x.double()``): the schema has ``memory_format``
    fourth, ``Tensor.to`` takes it by keyword only."""
    b = TraceBuilder()
    x = b.tensor((4, 4))
    b.op(TO_DTYPE, [x, 7, False, False, None], [b.tensor((4, 4), dtype="float64")])
    b.op(TO_DTYPE, [x, 7, False, True, None], [b.tensor((4, 4), dtype="float64")])
    b.op(SUM_DIM, [x, [0], True, None], [b.tensor((1, 4))])
    b.op(ADD, [x, x, 1], [b.tensor((4, 4))])
    b.op(ADD, [x, x, 2], [b.tensor((4, 4))])
    return b if tmp_path is None else b.write(tmp_path / "casts.json")


def test_a_public_call_leaves_out_what_it_passes_as_the_schemas_defaults():
    """A public call leaves out the arguments recorded at their schema's default where
    the probe saw the binding dispatch that default in their place (each argument the
    parser reads costs host time), and where the binding takes them no other way:
    ``Tensor.to`` takes ``memory_format`` by keyword only, and every cast through
    torch.ops cost 1.2 us more host time. An argument off its default stays."""
    program = build_program(trace_from_document(_casts().doc(), name="c.json", sha256="0"))
    assert [(op.public_call, op.public_omits) for op in program.ops] == [
        ("torch.Tensor.to", ("copy", "memory_format", "non_blocking")),
        ("torch.Tensor.to", ("memory_format",)),  # copy=True is said
        ("torch.sum", ("dtype",)),  # keepdim=True is said
        ("torch.add", ("alpha",)),
        ("torch.add", ()),  # alpha=2
    ]


def test_defaults_a_binding_passes_otherwise_are_said(monkeypatch):
    """A binding that passes another value than the schema's default in the place of
    an argument left out fails its probe: the call keeps every argument."""
    from mystique_gen.passes import public_calls as bindings

    real = bindings._defaults_seen
    monkeypatch.setattr(bindings, "_defaults_seen", lambda op, omits, event: (
        ["!alpha=2"] if op.signature.name == "add" else real(op, omits, event)))
    program = build_program(trace_from_document(_casts().doc(), name="c.json", sha256="0"))
    assert [op.public_omits for op in program.ops if op.name == "aten::add"] == [(), ()]


def _replayed(trace, tmp_path) -> tuple[str, dict]:
    """The benchmark generated from ``trace`` (its text) and its ``--json`` after one
    iteration, whose execution trace dispatched exactly the recorded overloads."""
    bench = tmp_path / "bench.py"
    text = generate(trace, bench, GenerateOptions(command_line="test"))
    replay_et = tmp_path / "replay.et.json"
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1", "--json",
                         "--et", str(replay_et))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert op_multiset(replay_et, by_overload=True) == op_multiset(trace, by_overload=True)
    return text, last_json(proc.stdout)


@pytest.mark.slow
def test_calls_without_their_defaults_replay_the_recorded_overloads(tmp_path):
    text, _ = _replayed(_casts(tmp_path), tmp_path)
    assert "    aten_to_dtype(to_x, torch.float64)\n" in text
    assert "aten_to_dtype(to_x, torch.float64, False, True)\n" in text
    assert "aten_sum_dim_IntList(to_x, [0], True)\n" in text
    assert "aten_add_Tensor(to_x, to_x)\n" in text
    assert "aten_add_Tensor(to_x, to_x, alpha=2)\n" in text


def test_safety_check_accepts_public_bindings_only():
    ok = GOLDEN.replace("\n\n# Operators,", '\nh = _op(lambda: torch.Tensor.add_, "x")\n'
                        "\n# Operators,", 1)
    check_source(inject_call(ok, "h(1, 2)"), reference_facts())
    for target in ("torch.load", "torch.norm", "torch.Tensor.split"):
        bad = GOLDEN.replace("\n\n# Operators,", f'\nh = _op(lambda: {target}, "x")\n'
                             "\n# Operators,", 1)
        with pytest.raises(UnsafeCodeError, match="'h'"):
            check_source(inject_call(bad, "h(1)"), reference_facts())


@pytest.mark.slow
def test_replay_dispatches_the_recorded_overloads(tmp_path):
    text, out = _replayed(_trace(tmp_path), tmp_path)
    assert 'lambda: torch.mm, "aten::mm.default"' in text
    assert "lambda: torch.ops.aten.mul.Scalar" in text
    assert out["ops"] == 6


def test_a_crashing_probe_leaves_every_op_on_torch_ops(monkeypatch):
    """Probes run in a child process: a kernel that crashes there (here: the child is
    killed) costs the public calls, never the generation."""
    import os
    import signal

    from mystique_gen.passes import public_calls as bindings

    monkeypatch.setattr(bindings, "_probe_here",
                        lambda probes, on_start=None: os.kill(os.getpid(), signal.SIGKILL))
    assert set(_bindings().values()) == {None}


def test_a_probe_that_crashes_costs_only_its_own_op(monkeypatch):
    """A kernel that kills the process on the probe's empty arguments leaves that op on
    torch.ops; the other ops keep the public calls they dispatch exactly."""
    import os
    import signal

    from mystique_gen.passes import public_calls as bindings

    real_call = bindings._call

    def call(chain, op, omits=()):
        if op.signature.name == "relu":
            return lambda: os.kill(os.getpid(), signal.SIGKILL)
        return real_call(chain, op, omits)

    expected = _bindings()
    monkeypatch.setattr(bindings, "_call", call)
    assert _bindings() == {**expected, "aten::relu.default": None}


def test_a_probe_that_hangs_costs_only_its_own_op(monkeypatch):
    import time

    from mystique_gen.passes import public_calls as bindings

    real_call = bindings._call

    def call(chain, op, omits=()):
        if op.signature.name == "relu":
            return lambda: time.sleep(600)
        return real_call(chain, op, omits)

    expected = _bindings()
    monkeypatch.setattr(bindings, "_call", call)
    monkeypatch.setattr(bindings, "PROBE_TIMEOUT_S", 1.0)
    assert _bindings() == {**expected, "aten::relu.default": None}


WEIGHT_NORM = ("aten::_weight_norm_interface(Tensor v, Tensor g, int dim=0) "
               "-> (Tensor, Tensor)")


def test_ops_beside_a_kernel_that_crashes_on_empty_tensors_keep_their_public_calls():
    """torch's _weight_norm_interface divides by a zero size on empty tensors (SIGFPE,
    which took down the probes of every wav2vec2 trace); the ops around it still get
    their public calls."""
    b = TraceBuilder()
    v, g = b.tensor((8, 4, 3)), b.tensor((1, 1, 3))
    w, norms = b.tensor((8, 4, 3)), b.tensor((1, 1, 3))
    b.op(WEIGHT_NORM, [v, g, 2], [w, norms])
    x, y = b.tensor((4, 4)), b.tensor((4, 4))
    b.op(MM, [x, x], [y])
    r = b.tensor((4, 4))
    b.op(RELU, [y], [r])
    program = build_program(trace_from_document(b.doc(), name="t.json", sha256="0"))
    calls = {op.signature.full_name: op.public_call for op in program.ops}
    assert calls["aten::mm.default"] == "torch.mm"
    assert calls["aten::relu.default"] == "torch.relu"


def test_probes_in_process_where_the_platform_cannot_fork(monkeypatch):
    forked = _bindings()
    monkeypatch.setattr("sys.platform", "win32")
    assert _bindings() == forked
