"""Wrapped Python numbers (passes/numbers.py): a 0-d tensor argument that type
promotion shows was a Python number replays as one, so no result changes dtype."""

from __future__ import annotations

import pytest

from mystique_gen.driver import build_program, generate_source
from mystique_gen.ir import Literal, TensorValue
from mystique_gen.sources.et import trace_from_document
from tests.conftest import run_benchmark
from tests.tracebuilder import TraceBuilder

MUL = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
MM = "aten::mm(Tensor self, Tensor mat2) -> Tensor"
ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"


def _program(b: TraceBuilder):
    return build_program(trace_from_document(b.doc(), name="t.json", sha256="0"))


def _router(b: TraceBuilder, result_dtype: str, scalar_dtype: str = "float64") -> None:
    """mask * 0.5 (int64 mask, a wrapped float) then a float32 matmul of the product."""
    mask = b.tensor((4, 4), dtype="int64")
    scaled = b.tensor((4, 4), dtype=result_dtype)
    b.op(MUL, [mask, b.tensor((), dtype=scalar_dtype)], [scaled])
    b.op(MM, [scaled, b.tensor((4, 4), dtype=result_dtype)],
         [b.tensor((4, 4), dtype=result_dtype)])


def _other(program) -> object:
    mul = next(op for op in program.ops if op.name == "aten::mul")
    return mul.args[1].value


def test_a_wrapped_float_replays_as_a_number_and_keeps_float32(tmp_path):
    b = TraceBuilder()
    _router(b, "float32")
    program = _program(b)
    assert _other(program) == Literal(1.0)
    assert any("wrapped Python numbers" in d.reason for d in program.diagnostics)
    bench = tmp_path / "bench.py"
    bench.write_text(generate_source(program))
    # As a float64 tensor the product would be float64, and mm would refuse it.
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("result_dtype,scalar_dtype", [
    ("float64", "float64"),  # a real 0-d float64 tensor: its dtype won
    ("float32", "float32"),  # not a wrapped number's dtype
])
def test_tensors_that_promote_as_tensors_stay_tensors(result_dtype, scalar_dtype):
    b = TraceBuilder()
    _router(b, result_dtype, scalar_dtype)
    assert isinstance(_other(_program(b)), TensorValue)


def test_a_scalar_some_op_made_stays_a_tensor():
    b = TraceBuilder()
    made = b.tensor((), dtype="float64")
    b.op(ADD, [b.tensor((), dtype="float64"), b.tensor((), dtype="float64")], [made])
    mask = b.tensor((4,), dtype="int64")
    b.op(MUL, [mask, made], [b.tensor((4,), dtype="float32")])
    assert isinstance(_other(_program(b)), TensorValue)


@pytest.mark.parametrize("result_dtype,wrapped", [
    ("float32", True),  # a wrapped float beside a 0-d float32 tensor keeps float32
    ("float64", False),  # a real 0-d float64 tensor won
])
def test_a_float_times_a_0d_tensor_keeps_the_tensors_dtype(tmp_path, result_dtype, wrapped):
    """All tensors 0-d (a loss term times -0.5): they promote among themselves, so a
    float32 result proves the float64 one was a Python number. As a tensor it made the
    loss float64, and the backward then refused a float32 gradient beside it."""
    b = TraceBuilder()
    loss = b.tensor((), dtype="float32")
    b.op(MUL, [loss, b.tensor((), dtype="float64")], [b.tensor((), dtype=result_dtype)])
    other = _other(_program(b))
    assert isinstance(other, Literal) is wrapped


@pytest.mark.parametrize("count_dtype,result_dtype,wrapped", [
    ("int64", "float32", True),  # a count times a float: the default dtype
    ("int64", "float64", False),  # a real 0-d float64 tensor won
    ("bool", "float32", True),
])
def test_a_float_times_a_0d_integral_tensor_is_a_wrapped_number(count_dtype, result_dtype,
                                                                 wrapped):
    """All tensors 0-d, the other one integral (D-FINE's loss: a box count times 0.5,
    then its square root): an int64 0-d tensor times a 0-d float64 tensor is float64, a
    wrapped float makes float32. As a tensor it made the loss float64, and the
    backward's nll_loss refused it ("expected scalar type Float but found Double")."""
    b = TraceBuilder()
    count = b.tensor((), dtype=count_dtype)
    b.op(MUL, [count, b.tensor((), dtype="float64")], [b.tensor((), dtype=result_dtype)])
    other = _other(_program(b))
    assert isinstance(other, Literal) is wrapped


LAYER_NORM = ("aten::native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? "
              "weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)")
ADD_SCALAR_ = "aten::add_.Scalar(Tensor(a!) self, Scalar other, Scalar alpha=1) -> Tensor(a!)"


def test_an_eps_the_trace_wrote_as_zero_replays_small_and_positive():
    """The observer writes doubles with six decimals: BERT's LayerNorm eps 1e-12 and
    Adam's 1e-8 read 0.0, and at 0 a constant row or a zero gradient divides by zero.
    An eps argument (oprules epsilon_args) recorded as 0.0 replays as 1e-8, and the
    header says how many; other values, and an integer 0, stay as recorded."""
    b = TraceBuilder()
    x, denom = b.tensor((2, 4)), b.tensor((4,))
    b.op(LAYER_NORM, [x, [4], None, None, 0.0],
         [b.tensor((2, 4)), b.tensor((2, 1)), b.tensor((2, 1))])
    b.op(ADD_SCALAR_, [denom, 0.0, 1], [denom])  # Adam's denom.add_(eps)
    b.op(ADD_SCALAR_, [denom, 0.25, 1], [denom])
    b.op(ADD_SCALAR_, [denom, 0, 1], [denom])
    program = _program(b)
    eps = [op.args[4].value for op in program.ops if op.name == "aten::native_layer_norm"]
    added = [op.args[1].value for op in program.ops if op.name == "aten::add_"]
    assert eps == [Literal(1e-8)]
    assert added == [Literal(1e-8), Literal(0.25), Literal(0)]
    assert any("2 eps arguments recorded as 0.0" in d.reason for d in program.diagnostics)


VECTOR_NORM = ("aten::linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, "
               "bool keepdim=False, *, ScalarType? dtype=None) -> Tensor")
CLAMP_MIN = "aten::clamp_min(Tensor self, Scalar min) -> Tensor"
UNSQUEEZE = "aten::unsqueeze(Tensor(a) self, int dim) -> Tensor(a)"


@pytest.mark.parametrize("floored,replayed", [
    ("norm", 1e-8),  # F.normalize's clamp_min(norm, 1e-12)
    ("viewed norm", 1e-8),  # x.norm(dim=-1).unsqueeze(-1).clamp(min=1e-12)
    ("activation", 0.0),  # x.clamp(min=0.0): a floor that does something
])
def test_a_floor_of_zero_under_a_value_never_negative_was_an_eps(floored, replayed):
    """``F.normalize`` divides by ``clamp_min(norm, 1e-12)``, which the trace writes as
    0.0: an all-zero row of a replay (a mask, a fitted selection) then divided 0 by 0
    where eager divides by 1e-12. Flooring a norm at 0 is a no-op nobody writes, so
    there the floor replays as 1e-8; a floor under any other value stays 0.0."""
    b = TraceBuilder()
    x = b.tensor((2, 4))
    norm = b.tensor((2, 1))
    if floored == "activation":
        norm = x
    else:
        made = b.tensor((2,) if floored == "viewed norm" else (2, 1))
        b.op(VECTOR_NORM, [x, 2, [-1], floored == "norm", None], [made])
        if floored == "viewed norm":
            b.op(UNSQUEEZE, [made, -1], [norm := b.view(made, (2, 1))])
        else:
            norm = made
    b.op(CLAMP_MIN, [norm, 0.0], [b.tensor(tuple(norm.shape))])
    program = _program(b)
    clamp = next(op for op in program.ops if op.name == "aten::clamp_min")
    assert clamp.args[1].value == Literal(replayed)
