"""Steps whose ops run on several host threads: their schedule and their Kineto links."""

from __future__ import annotations

import json

import pytest

from mystique_gen.driver import compile_trace
from mystique_gen.options import BuildOptions
from tests.test_kineto import kineto_doc
from tests.tracebuilder import MM, RELU, T_OP, TraceBuilder


def test_view_on_another_thread_is_no_write(tmp_path):
    """A view of a shared weight on thread 2 (``w.t()``) writes no data: thread 1's
    later read of the weight does not wait for it."""
    tb = TraceBuilder()
    w, x = tb.tensor((4, 4)), tb.tensor((4, 4))
    wt, a, b = tb.view(w, (4, 4), (1, 4)), tb.tensor((4, 4)), tb.tensor((4, 4))
    tb.op(T_OP, [w], [wt], tid=2)  # worker: w.t()
    tb.op(RELU, [wt], [a], tid=2)  # worker reads its view
    tb.op(MM, [x, w], [b], tid=1)  # main: reads w, written by nobody in the step
    et = tb.write(tmp_path / "t.et.json")
    program = compile_trace(et, options=BuildOptions(threads=True))
    assert program.threaded
    assert [op.thread_waits for op in program.ops] == [[], [], []]


def test_a_whole_unprofiled_thread_warns_below_half(tmp_path):
    """A Python thread's ops, absent from Kineto (no profile_all_threads), warn even
    where the other thread links more than half of the ops."""

    tb = TraceBuilder()
    x, a, b, c = (tb.tensor((4, 4)) for _ in range(4))
    n1 = tb.op(RELU, [x], [a], tid=1)
    n2 = tb.op(RELU, [a], [b], tid=1)
    tb.op(RELU, [x], [c], tid=2)  # the worker: the ET observer saw it, Kineto did not
    et = tb.write(tmp_path / "t.et.json")
    kineto = tmp_path / "t.kineto.json"
    kineto.write_text(json.dumps(kineto_doc(tb, {n1: (0, 5, []), n2: (10, 5, [])})))
    with pytest.warns(UserWarning, match="host threads of which it holds no op"):
        program = compile_trace(et, kineto=kineto)
    assert program.timing is not None and program.timing.linked_ops == 2
