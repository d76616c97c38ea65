"""What an op's autograd node saves (passes/saved.py), and the frees pass's use of it:
an op in grad mode saves nothing where the original freed an input its node would
have saved, and replays as it is where its node saves none of what was freed."""

from __future__ import annotations

import pytest

from mystique_gen.driver import build_program
from mystique_gen.ir import Op
from mystique_gen.passes.frees import _save_nothing_freed
from mystique_gen.passes.saved import saved_arguments
from mystique_gen.sources.et import trace_from_document
from tests.tracebuilder import MM, TraceBuilder

ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
MUL = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
TANH = "aten::tanh(Tensor self) -> Tensor"
MATMUL = "aten::matmul(Tensor self, Tensor other) -> Tensor"
UNFOLD = "aten::unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)"
CAT = "aten::cat(Tensor[] tensors, int dim=0) -> Tensor"


def _ops() -> list[Op]:
    b = TraceBuilder()
    x, y = b.tensor((4, 4)), b.tensor((4, 4))
    added, multiplied, tanh = b.tensor((4, 4)), b.tensor((4, 4)), b.tensor((4, 4))
    b.op(ADD, [x, y, 1], [added])
    b.op(MUL, [added, y], [multiplied])
    b.op(TANH, [multiplied], [tanh])
    b.op(MATMUL, [tanh, x], [b.tensor((4, 4))])  # a composite: mm's node saves both
    b.op(MM, [x, y], [b.tensor((4, 4))])
    b.op(UNFOLD, [x, 1, 2, 2], [b.tensor((4, 2, 2))])  # a view: sizes only
    b.op(CAT, [[x, y], 0], [b.tensor((8, 4))])
    program = build_program(trace_from_document(b.doc(), name="s.json", sha256="0"))
    return program.ops


def test_each_node_saves_the_arguments_its_backward_reads():
    ops = _ops()
    saved = saved_arguments(ops)
    assert {op.name: saved[op.index] for op in ops} == {
        "aten::add": frozenset(),
        "aten::mul": {"self", "other"},
        "aten::tanh": frozenset(),  # its result, which is no argument
        "aten::matmul": {"self", "other"},
        "aten::mm": {"self", "mat2"},
        "aten::unfold": frozenset(),
        "aten::cat": frozenset(),
    }


def test_an_op_whose_node_saves_nothing_freed_keeps_saving():
    """The original freed x, the sum and the product in the forward, before any
    backward: only ops whose node would save one of them replay saving nothing, so no
    other op pays for switching the saved-tensor hooks off and on."""
    ops = _ops()
    for op in ops:
        op.records_grad = True
    by_name = {op.name: op for op in ops}
    x = by_name["aten::add"].args[0].value
    freed = [x, by_name["aten::add"].outputs[0], by_name["aten::mul"].outputs[0]]
    # storage -> (its maker, the op after which the original freed it: the first)
    free_at = {tv.storage.index: (-1, ops[0].index) for tv in freed}
    _save_nothing_freed(ops, free_at)
    assert {op.name for op in ops if not op.keeps_saved} == {
        "aten::mul",  # saves the sum
        "aten::matmul",  # saves x
        "aten::mm",  # saves x
    }  # add, unfold and cat read x, tanh the product, and save none of them


def _chain() -> list[Op]:
    """p = x * y; t = tanh(p); q = x @ y: mul and mm save x."""
    b = TraceBuilder()
    x, y = b.tensor((4, 4)), b.tensor((4, 4))
    p, t, q = b.tensor((4, 4)), b.tensor((4, 4)), b.tensor((4, 4))
    b.op(MUL, [x, y], [p])
    b.op(TANH, [p], [t])
    b.op(MM, [x, y], [q])
    ops = build_program(trace_from_document(b.doc(), name="c.json", sha256="0")).ops
    for op in ops:
        op.records_grad = op.made_grad_node = True
    return ops


@pytest.mark.parametrize(("tanh_freed", "mm_node", "saving_nothing"), [
    # tanh's result, and with it the nodes of tanh and mul, gone before x: as an
    # inference step in grad mode frees them; mm's result goes with x
    (True, True, set()),
    # tanh's result lives on, and its node points at mul's, which held no x
    (False, True, {"aten::mul"}),
    # mm made no node (nothing it read required grad): nothing to save
    (False, False, {"aten::mul"}),
])
def test_a_node_that_may_have_gone_before_the_free_keeps_saving(tanh_freed, mm_node,
                                                                saving_nothing):
    """The original freed x after mm; a node that saves x and lived on past that
    cannot have saved it, so the replay's saves nothing either. One whose every
    holder (its results, and the results of the ops whose nodes point at it) was freed
    by then may have saved it and gone: the replay frees them at the same points, and
    switching saving off and on around it would cost host time for nothing."""
    ops = _chain()
    mul, tanh, mm = ops
    mm.made_grad_node = mm_node
    x = mul.args[0].value
    free_at = {x.storage.index: (-1, mm.index),
               mul.outputs[0].storage.index: (mul.index, tanh.index),
               mm.outputs[0].storage.index: (mm.index, mm.index)}
    if tanh_freed:
        free_at[tanh.outputs[0].storage.index] = (tanh.index, tanh.index)
    _save_nothing_freed(ops, free_at)
    assert {op.name for op in ops if not op.keeps_saved} == saving_nothing
