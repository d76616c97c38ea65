"""Unit tests of the passes on small synthetic traces."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
import torch

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.driver import build_program, compile_trace, generate
from mystique_gen.errors import OptionError, TraceError
from mystique_gen.ir import (
    DerivedView,
    FreshStorage,
    InputView,
    OpOutput,
    SparseLayout,
    StandInTensor,
    TensorMeta,
    TensorValue,
    TorchConstant,
    iter_tensors,
)
from mystique_gen.ir.schema import parse_signature
from mystique_gen.options import BuildOptions
from mystique_gen.passes import kernels
from mystique_gen.passes.lower import lower_ops
from mystique_gen.passes.select import select_ops, sparse_tensors
from mystique_gen.sources.et import RawArg, RawNode, load_trace, trace_from_document
from mystique_gen.tools.capture import capture
from mystique_gen.tools.compare import op_multiset
from tests.conftest import record_et, run_benchmark
from tests.tracebuilder import (
    ADD_,
    ALLREDUCE_,
    EMBEDDING,
    EMPTY,
    MM,
    RELU,
    T_OP,
    VIEW,
    Device,
    Object,
    T,
    TraceBuilder,
    Undefined,
)


def _program(builder: TraceBuilder):
    return build_program(trace_from_document(builder.doc(), name="t.json", sha256="0"))


def _tensor_args(op):
    return [a.value for a in op.args if isinstance(a.value, TensorValue)]


# -- load -------------------------------------------------------------------------


def test_loader_sorts_children_first_nodes_by_id(tmp_path):
    b = TraceBuilder()
    x = b.tensor((2, 2))
    b.op(RELU, [x], [b.tensor((2, 2))])
    trace = load_trace(b.write(tmp_path / "t.json.gz"))
    assert [n.id for n in trace.nodes] == sorted(n.id for n in trace.nodes)
    assert trace.schema.startswith("1.1.1")


def test_loader_reads_flat_1_0_1_layout():
    doc = {"schema": "1.0.1", "nodes": [
        {"name": "[pytorch|profiler|execution_graph|thread]", "id": 2, "parent": 1, "tid": 1,
         "op_schema": "", "inputs": [], "input_shapes": [], "input_types": [], "outputs": [],
         "output_shapes": [], "output_types": []},
        {"name": "aten::relu", "id": 3, "parent": 2, "tid": 1, "rf_id": 5,
         "op_schema": "aten::relu(Tensor self) -> Tensor",
         "inputs": [[10, 11, 0, 4, 4, "cuda:0"]], "input_shapes": [[2, 2]],
         "input_types": ["Tensor(float)"], "outputs": [[12, 13, 0, 4, 4, "cuda:0"]],
         "output_shapes": [[2, 2]], "output_types": ["Tensor(float)"]},
    ]}
    program = build_program(trace_from_document(doc, name="flat.json", sha256="0"))
    (op,) = program.ops
    (x,) = _tensor_args(op)
    assert x.meta.strides == (2, 1)  # no strides recorded: contiguous
    assert x.meta.device == "cuda" and program.primary_device == "cuda"


@pytest.mark.parametrize("doc,field", [
    ({"nodes": {}}, None),
    ({"nodes": [{"name": "x"}]}, None),
    ({"nodes": [{"id": 3, "name": 5}]}, "name"),
    ({"nodes": [{"id": 3, "name": "a", "ctrl_deps": "2"}]}, "ctrl_deps"),
    ({"nodes": [{"id": 3, "name": "a", "inputs": {"values": [1], "types": []}}]},
     "inputs.types"),
])
def test_loader_errors_name_the_node_and_field(doc, field):
    with pytest.raises(TraceError) as info:
        trace_from_document(doc, name="bad.json", sha256="0")
    assert info.value.field == field


def test_corrupt_gzip_is_a_clean_error(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b'{"nodes": []}')[:-8] + b"garbage!")
    with pytest.raises(TraceError):
        load_trace(path)


# -- select -----------------------------------------------------------------------


def test_selection_descends_wrappers_and_keeps_first_schema_node():
    b = TraceBuilder()
    step = b.annotation("ProfilerStep#3")
    x, w = b.tensor((4, 4)), b.tensor((4, 4))
    out = b.tensor((4, 4))
    mm = b.op(MM, [x, w], [out], parent=step)
    b.op(MM, [x, w], [out], parent=mm)  # the op's own implementation: not selected
    grad_fn = b.annotation("autograd::engine::evaluate_function: MmBackward0", parent=step)
    b.op(RELU, [out], [b.tensor((4, 4))], parent=grad_fn, tid=2)
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.name for s in sel.ops] == ["aten::mm", "aten::relu"]
    backward = "autograd::engine::evaluate_function: MmBackward0"
    assert sel.ops[1].scope == ("ProfilerStep#3", backward)
    assert sel.threads == [1, 2]


VIEW_AS = "aten::view_as(Tensor(a) self, Tensor other) -> Tensor(a)"


def test_selection_replays_what_a_tensor_subclass_ran():
    """An op on DTensors dispatches to Python (a ``PythonSubclass`` node) and runs on
    the local shards: the wrappers hold no data (all on one storage id) and have the
    global shape, so the ops below are the ones replayed, wherever the subclass
    dispatch sits (``view_as`` reaches it through ``view``)."""
    b = TraceBuilder()
    step = b.annotation("Optimizer.step#SGD.step")
    null = b.new_id()
    param, grad = b.tensor((8, 4), storage=null), b.tensor((8, 4), storage=null)
    local_param, local_grad = b.tensor((4, 4)), b.tensor((4, 4))
    outer = b.op(ADD_, [param, grad, -0.1], [param], parent=step)
    inner = b.op(ADD_, [local_param, local_grad, -0.1], [local_param],
                 parent=b.annotation("PythonSubclass", parent=outer))
    view_as = b.op(VIEW_AS, [param, param], [b.tensor((8, 4), storage=null)], parent=step)
    view = b.op(VIEW, [param, [8, 4]], [b.tensor((8, 4), storage=null)], parent=view_as)
    local_view = b.op(VIEW, [local_param, [4, 4]], [b.view(local_param, (4, 4))],
                      parent=b.annotation("PythonSubclass", parent=view))
    plain = b.op(RELU, [local_param], [b.tensor((4, 4))], parent=step)
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == [inner, local_view, plain]
    assert all(s.scope == ("Optimizer.step#SGD.step",) for s in sel.ops)
    program = _program(b)
    assert all(tv.meta.shape == (4, 4) for op in program.ops for tv in _tensor_args(op))

def test_an_async_scope_inside_an_op_shifts_nothing_after_it():
    """A backend's async scope (``gloo:all_reduce``) opened inside an ordinary op and
    closed on another thread: the observer then recorded every later op one level too
    deep, which hid one rank's all-gather inside FSDP2's copy-in op (its peers
    replayed theirs, and the replay deadlocked). What follows the scope goes back up
    a level; the ops inside the scope belong to the op it opened in."""
    b = TraceBuilder()
    gather = b.annotation("FSDP::all_gather (1)")
    copy_in = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))], parent=gather)
    split = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))], parent=copy_in)
    scope = b.annotation("gloo:all_reduce", parent=split)
    inside = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))], parent=scope)
    copies = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))], parent=split)  # copy_in's
    allgather = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))], parent=copy_in)  # gather's
    later = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))], parent=gather)  # top level
    trace = trace_from_document(b.doc(), name="t", sha256="0")
    first = [s.node.id for s in select_ops(trace).ops]
    assert first == [copy_in, allgather, later]
    parents = {n.id: n.parent for n in trace.nodes}
    assert (parents[inside], parents[copies], parents[allgather]) == (split, copy_in, gather)
    assert parents[later] == parents[gather]  # the thread's top level
    # Selections run many times per trace (compare, comms): the repair happens once.
    assert [s.node.id for s in select_ops(trace).ops] == first


def test_an_async_scope_whose_recorded_parent_started_after_it_shifts_nothing():
    """The observer can name as a scope's parent an op that started after the scope
    (DDP's bucket views right after a comm hook's all-reduce): every later op of the
    step was recorded inside that first view op and went unreplayed. That op is
    stale as well; what follows it is back at the top level."""
    b = TraceBuilder()
    b.op(RELU, [b.tensor((8,))], [b.tensor((8,))])  # the all-reduce's stand-in
    scope = b.annotation("gloo:all_reduce")
    first = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))])
    later = [b.op(RELU, [b.tensor((8,))], [b.tensor((8,))], parent=first) for _ in range(3)]
    doc = b.doc()
    next(n for n in doc["nodes"] if n["id"] == scope)["ctrl_deps"] = first
    selected = [s.node.id for s in select_ops(trace_from_document(doc, name="t", sha256="0")).ops]
    assert selected[-4:] == [first, *later]


def test_nesting_comes_from_when_ops_started_and_ended():
    """The observer numbers a node when it starts and writes it when it ends. An async
    scope's shift once recorded FSDP2's copy-in op inside the autograd wrap that ended
    before it started, and its ``_foreach_copy_`` beside it (replayed twice). In a file
    in the observer's order, each node's parent is the innermost node that started
    before it and ended after it, whatever parent was recorded."""
    b = TraceBuilder()
    # A step's other ops, each with one inside it: what tells the file's order.
    layers = [b.op(RELU, [b.tensor((8,))], [b.tensor((8,))]) for _ in range(12)]
    inner = [b.op(RELU, [b.tensor((8,))], [b.tensor((8,))], parent=op) for op in layers]
    reduce = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))])
    scope = b.annotation("gloo:all_reduce")
    wrap = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))])
    copy_in = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))])
    split = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))])
    foreach = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))])
    after = b.op(RELU, [b.tensor((8,))], [b.tensor((8,))])
    doc = b.doc()
    nodes = {n["id"]: n for n in doc["nodes"]}
    for node, recorded in ((scope, wrap), (copy_in, wrap), (split, copy_in), (foreach, wrap)):
        nodes[node]["ctrl_deps"] = recorded
    # Roots first, then each node as it ended (the scope ended on gloo's thread, late).
    ended = [i for pair in zip(inner, layers, strict=True) for i in pair]
    ended += [reduce, wrap, split, foreach, copy_in, after, scope]
    doc["nodes"] = [n for n in doc["nodes"] if n["id"] not in ended] + [nodes[i] for i in ended]
    trace = trace_from_document(doc, name="t", sha256="0")
    assert [s.node.id for s in select_ops(trace).ops] == [*layers, reduce, wrap, copy_in, after]
    parents = {n.id: n.parent for n in trace.nodes}
    assert (parents[split], parents[foreach], parents[scope]) == (copy_in, copy_in, b.thread)


REDUCE_SCATTER_ = ("c10d::_reduce_scatter_base_(Tensor output_tensor, Tensor input_tensor, "
                   "__torch__.torch.classes.c10d.ProcessGroup process_group, "
                   "__torch__.torch.classes.c10d.ReduceOp reduce_op, bool async_op=True, "
                   "int timeout=-1) -> (Tensor, __torch__.torch.classes.c10d.Work)")
MONITORED_BARRIER_ = ("c10d::monitored_barrier_(Tensor tensor, __torch__.torch.classes.c10d."
                      "ProcessGroup process_group, int[] device_ids, int timeout, "
                      "bool wait_all_ranks) -> ()")
CLONE = "aten::clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor"
CHUNK = "aten::chunk(Tensor(a -> *) self, int chunks, int dim=0) -> Tensor(a)[]"
COPY_ = "aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)"
DIV_ = "aten::div_.Scalar(Tensor(a!) self, Scalar other) -> Tensor(a!)"


def _thread(b: TraceBuilder, tid: int) -> int:
    return b._node("[pytorch|profiler|execution_trace|thread]", b.process, tid=tid)


def test_what_a_backend_thread_ran_for_a_collective_is_not_replayed():
    """gloo copies an all-reduce's result on a worker thread of its own, recorded as
    ops of that thread: the replayed collective runs them again, so they are listed,
    not replayed. A thread of the program's own (one that ran before any collective,
    or works on other tensors) is replayed."""
    b = TraceBuilder()
    x, other = b.tensor((8,)), b.tensor((8,))
    early = b.op(RELU, [other], [b.tensor((8,))], tid=3, parent=_thread(b, 3))
    allreduce = b.op(ALLREDUCE_, [[x], Object(), Object(), None, True, -1], [[x], Object()])
    worker = _thread(b, 2)
    flat = b.op(VIEW, [b.view(x, (2, 4)), [8]], [b.view(x, (8,))], tid=2, parent=worker)
    user = _thread(b, 4)
    mine = b.op(RELU, [other], [b.tensor((8,))], tid=4, parent=user)
    late = b.op(RELU, [other], [b.tensor((8,))], tid=3, parent=early - 1)
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == [early, allreduce, mine, late]
    assert [(d.node_id, d.name) for d in sel.not_replayed] == [(flat, "aten::view")]
    assert "backend's worker thread" in sel.not_replayed[0].reason


def test_future_callbacks_on_a_backend_thread_are_the_programs():
    """A ``Future.then`` callback runs on gloo's worker thread (DDP's fp16 hook
    decompresses its bucket there): an op that makes or writes what the program reads
    later is replayed, as the reading thread's op, in recorded order, with the callback
    op whose result it read. What gloo ran itself stays out: copies into the
    collective's outputs, and a division of a buffer the collective made (gloo's
    average), even where the program reads that address again later."""
    b = TraceBuilder()
    grads, bucket = b.tensor((8,)), b.tensor((8,))
    half = b.tensor((8,), dtype="float16")
    compress = b.op(CLONE, [grads, None], [half])
    allreduce = b.op(ALLREDUCE_, [[half], Object(), Object(), None, True, -1],
                     [[half], Object()])
    shard, full = b.tensor((4,)), b.tensor((8,))
    reduce = b.op(REDUCE_SCATTER_, [shard, full, Object(), Object(), True, -1],
                  [shard, Object()])
    private = b.tensor((8,))
    b.op(CLONE, [full, None], [private], parent=reduce)
    worker = _thread(b, 2)
    gloo = b.op(COPY_, [half, b.tensor((8,), dtype="float16"), False], [half], tid=2,
                parent=worker)
    average = b.op(DIV_, [private, 2], [private], tid=2, parent=worker)
    scaled = b.tensor((8,))
    mul = b.op(MUL, [half, b.tensor(())], [scaled], tid=2, parent=worker)
    decompress = b.op(COPY_, [bucket, scaled, False], [bucket], tid=2, parent=worker)
    use = b.op(RELU, [bucket], [b.tensor((8,))])
    reused = b.op(RELU, [b.tensor((8,), storage=private.storage_id)], [b.tensor((8,))])
    trace = trace_from_document(b.doc(), name="t", sha256="0")
    sel = select_ops(trace)
    assert [s.node.id for s in sel.ops] == [compress, allreduce, reduce, mul, decompress,
                                            use, reused]
    assert {s.node.tid for s in sel.ops} == {1}  # the main thread's
    assert sorted(d.node_id for d in sel.not_replayed) == [gloo, average]


def test_a_callback_that_writes_the_collectives_tensor_is_the_programs():
    """DDP's documented hook, ``fut.then(lambda f: f.value()[0].div_(world))``: on
    gloo's worker it writes the all-reduced bucket in place, reading only a number;
    it was taken for gloo's own copy into its output and dropped (and kept on a rank
    whose future had completed before ``then``: the ranks replayed different
    programs). gloo's copy reads a buffer no program op made, and stays gloo's."""
    b = TraceBuilder()
    bucket = b.tensor((8,))
    allreduce = b.op(ALLREDUCE_, [[bucket], Object(), Object(), None, True, -1],
                     [[bucket], Object()])
    worker = _thread(b, 2)
    gloo = b.op(COPY_, [bucket, b.tensor((8,)), False], [bucket], tid=2, parent=worker)
    average = b.op("aten::div_.Tensor(Tensor(a!) self, Tensor other) -> Tensor(a!)",
                   [bucket, b.tensor((), dtype="int64")], [bucket], tid=2, parent=worker)
    use = b.op(RELU, [bucket], [b.tensor((8,))])
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == [allreduce, average, use]
    assert [d.node_id for d in sel.not_replayed] == [gloo]


MATMUL = "aten::matmul(Tensor self, Tensor other) -> Tensor"


def test_a_callback_op_whose_kernel_allocates_its_result_is_the_programs():
    """A callback's ``f.value()[0] @ w`` on gloo's worker: its result is allocated by
    the ``mm`` below it, which read as a new allocation between the op and its reader,
    and the matmul was dropped ("the replayed collective runs it again") while the
    ``tanh`` after it replayed on a stand-in."""
    b = TraceBuilder()
    x, w = b.tensor((8, 8)), b.tensor((8, 8))
    allreduce = b.op(ALLREDUCE_, [[x], Object(), Object(), None, True, -1], [[x], Object()])
    worker = _thread(b, 2)
    product, activated = b.tensor((8, 8)), b.tensor((8, 8))
    matmul = b.op(MATMUL, [x, w], [product], tid=2, parent=worker)
    b.op(MM, [x, w], [product], tid=2, parent=matmul)
    tanh = b.op(RELU, [product], [activated], tid=2, parent=worker)
    use = b.op(RELU, [activated], [b.tensor((8, 8))])
    trace = trace_from_document(b.doc(), name="t", sha256="0")
    assert [s.node.id for s in select_ops(trace).ops] == [allreduce, matmul, tanh, use]


def test_a_collectives_completion_work_is_its_own():
    """gloo's reduce-scatter reduces a private clone, then chunks it and copies this
    rank's part into the output on the waiting thread, after its async scope: those
    ops read a buffer no program code can reach, so they are the collective's (the
    replayed one runs them again). The next op, on the output, is the program's."""
    b = TraceBuilder()
    out, grads = b.tensor((4,)), b.tensor((8,))
    rs = b.op(REDUCE_SCATTER_, [out, grads, Object(), Object(), True, -1], [out, Object()])
    private = b.tensor((8,))
    b.op(CLONE, [grads, None], [private], parent=rs)
    b.annotation("gloo:all_reduce")
    parts = [b.view(private, (4,)), b.view(private, (4,), offset=4)]
    chunk = b.op(CHUNK, [private, 2, 0], [parts])
    copy = b.op(COPY_, [out, parts[0], False], [out])
    after = b.op(RELU, [out], [b.tensor((4,))])
    trace = trace_from_document(b.doc(), name="t", sha256="0")
    assert [s.node.id for s in select_ops(trace).ops] == [rs, after]
    parents = {n.id: n.parent for n in trace.nodes}
    assert parents[chunk] == parents[copy] == rs


def test_a_collective_issued_in_a_hook_completes_where_it_is_waited():
    """ZeRO by hand: a post-accumulate-grad hook issues an async reduce-scatter inside
    autograd's AccumulateGrad, and the step waits for it after backward, at its top
    level, where gloo chunks its clone and copies into the output. Looked for at the
    hook's level only, those ops were replayed as the program's (an extra chunk and
    copy, the output overwritten with a stand-in's values)."""
    b = TraceBuilder()
    hook = b.annotation("torch::autograd::AccumulateGrad",
                        b.annotation("autograd::engine::evaluate_function: "
                                     "torch::autograd::AccumulateGrad"))
    out, flat = b.tensor((4,)), b.tensor((8,))
    rs = b.op(REDUCE_SCATTER_, [out, flat, Object(), Object(), True, -1], [out, Object()],
              parent=hook)
    private = b.tensor((8,))
    b.op(CLONE, [flat, None], [private], parent=rs)
    backward = b.op(RELU, [b.tensor((4,))], [b.tensor((4,))],
                    parent=b.annotation("autograd::engine::evaluate_function: ReluBackward0"))
    b.annotation("gloo:all_reduce")
    parts = [b.view(private, (4,)), b.view(private, (4,), offset=4)]
    chunk = b.op(CHUNK, [private, 2, 0], [parts])
    copy = b.op(COPY_, [out, parts[0], False], [out])
    after = b.op(RELU, [out], [b.tensor((4,))])
    trace = trace_from_document(b.doc(), name="t", sha256="0")
    assert [s.node.id for s in select_ops(trace).ops] == [rs, backward, after]
    parents = {n.id: n.parent for n in trace.nodes}
    assert parents[chunk] == parents[copy] == rs


def test_two_collectives_in_flight_each_complete_their_own():
    """Two async reduce-scatters in flight: gloo finished the first (chunked its clone
    and copied into its output) after the second began, and those ops, recorded past
    another collective, were replayed as the program's: an extra chunk and copy
    overwrote the first output with a stand-in's values."""
    b = TraceBuilder()
    outs, privates, scatters = [], [], []
    for _ in range(2):
        out, flat = b.tensor((4,)), b.tensor((8,))
        rs = b.op(REDUCE_SCATTER_, [out, flat, Object(), Object(), True, -1],
                  [out, Object()])
        private = b.tensor((8,))
        b.op(CLONE, [flat, None], [private], parent=rs)
        outs.append(out)
        privates.append(private)
        scatters.append(rs)
    completions = []
    for out, private in zip(outs, privates, strict=True):
        parts = [b.view(private, (4,)), b.view(private, (4,), offset=4)]
        chunk = b.op(CHUNK, [private, 2, 0], [parts])
        copy = b.op(COPY_, [out, parts[0], False], [out])
        completions.append((chunk, copy))
    after = b.op(RELU, [outs[0]], [b.tensor((4,))])
    trace = trace_from_document(b.doc(), name="t", sha256="0")
    assert [s.node.id for s in select_ops(trace).ops] == [*scatters, after]
    parents = {n.id: n.parent for n in trace.nodes}
    for rs, (chunk, copy) in zip(scatters, completions, strict=True):
        assert parents[chunk] == parents[copy] == rs


@pytest.mark.parametrize("recorded", [True, False])
def test_program_ops_at_a_freed_private_buffers_address_stay_the_programs(recorded):
    """A collective's private buffer is freed when it completes; the allocator may then
    hand its address to the program: to a ``_to_copy`` inside ``mul`` (recorded, below
    the op), or to a wrapped Python scalar that no op records (its storage id, but not
    its tensor id or size). An op that reads the collective's input and a tensor at
    that address is the program's, and a collective is never another's completion
    work: on one rank of 12 captures, ``x * r`` and the ``scatter`` of its result were
    taken for a gather's completion, and the ranks replayed different collectives."""
    b = TraceBuilder()
    out, grads = b.tensor((4,)), b.tensor((8,))
    rs = b.op(REDUCE_SCATTER_, [out, grads, Object(), Object(), True, -1], [out, Object()])
    private = b.tensor((8,))
    b.op(CLONE, [grads, None], [private], parent=rs)
    b.annotation("gloo:reduce_scatter")
    first = b.op(MUL, [grads, b.tensor(())], [b.tensor((8,))])
    if recorded:
        b.op(CLONE, [b.tensor(()), None], [b.tensor((), storage=private.storage_id)],
             parent=first)
    product = b.tensor((8,))
    mul = b.op(MUL, [grads, b.tensor((), storage=private.storage_id)], [product])
    allreduce = b.op(ALLREDUCE_, [[product], Object(), Object(), None, True, -1],
                     [[product], Object()])
    selected = [s.node.id for s in select_ops(trace_from_document(b.doc(), name="t",
                                                                  sha256="0")).ops]
    assert selected == [rs, first, mul, allreduce]


def test_the_tensor_a_barrier_is_given_is_the_barriers():
    """A barrier's call takes no tensor: the process group makes an empty one just
    before its c10d op, and the replayed call makes its own. An empty tensor the
    program made and used elsewhere stays."""
    b = TraceBuilder()
    kept = b.tensor((0,))
    mine = b.op(EMPTY, [[0], 6, 0, Device("cpu"), False, None], [kept])
    use = b.op(RELU, [kept], [b.tensor((0,))])
    token = b.tensor((0,))
    b.op(EMPTY, [[0], 6, 0, Device("cpu"), False, None], [token])
    barrier = b.op(MONITORED_BARRIER_, [token, Object(), [], 1000, False], [])
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == [mine, use, barrier]


def test_an_op_with_an_undefined_optional_tensor_is_replayed_whole():
    """An undefined tensor (nll_loss_backward's weight=None) is recorded like vmap's
    batched wrappers, with no storage and device "": only its type tells them apart.
    The op is replayed whole, not descended into as a vmap level."""
    b = TraceBuilder()
    nll_backward = ("aten::nll_loss_backward(Tensor grad_output, Tensor self, Tensor "
                    "target, Tensor? weight, int reduction, SymInt ignore_index, Tensor "
                    "total_weight) -> Tensor")
    grad, logp, total = b.tensor(()), b.tensor((8, 5)), b.tensor(())
    out = b.tensor((8, 5))
    target = b.tensor((8,), dtype="int64")
    undefined = Undefined(b.new_id())
    op = b.op(nll_backward, [grad, logp, target, undefined, 1, -100, total], [out])
    b.op("aten::zero_(Tensor(a!) self) -> Tensor(a!)", [out], [out], parent=op)
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == [op]


def test_a_composite_whose_inner_result_is_read_later_replays_as_its_children():
    """cross_entropy_loss keeps log_softmax's result for the backward: replayed whole,
    it would compute and drop it, and the backward would read a buffer made before
    timing (other values, memory the step never allocates). It is replayed as its
    children. Views of what an op read (linear's t() of its weight) and a later
    tensor that only reuses an inner result's addresses (a wrapped double scalar where
    a float temporary was) are not inner results."""
    b = TraceBuilder()
    ce = ("aten::cross_entropy_loss(Tensor self, Tensor target, Tensor? weight=None, int "
          "reduction=Mean, SymInt ignore_index=-100, float label_smoothing=0.0) -> Tensor")
    log_softmax = "aten::log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor"
    logits, target, loss = b.tensor((8, 5)), b.tensor((8,), dtype="int64"), b.tensor(())
    kept = b.tensor((8, 5))
    composite = b.op(ce, [logits, target, None, 1, -100, 0.0], [loss])
    inner = b.op(log_softmax, [logits, 1, None], [kept], parent=composite)
    nll = b.op(RELU, [kept], [loss], parent=composite)  # (nll_loss_forward) the loss
    temp = b.tensor(())  # a float temporary inside, its addresses reused below
    inner_relu = b.op(RELU, [loss], [temp], parent=composite)
    w = b.tensor((4, 4))
    linear = b.op("aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor",
                  [b.tensor((2, 4)), w, None], [b.tensor((2, 4))])
    wt = b.view(w, (4, 4), strides=(1, 4))
    b.op(T_OP, [w], [wt], parent=linear)
    backward = b.op(RELU, [kept], [b.tensor((8, 5))])
    b.op(RELU, [wt], [b.tensor((4, 4))])  # reads the view: the weight's storage
    wrapped = T(temp.tensor_id, temp.storage_id, (), (), dtype="float64")
    b.op(RELU, [wrapped], [b.tensor(())])
    ids = [s.node.id for s in select_ops(trace_from_document(b.doc(), name="t",
                                                             sha256="0")).ops]
    assert ids[:4] == [inner, nll, inner_relu, linear] and backward in ids
    assert composite not in ids


def test_an_op_whose_own_kernel_makes_its_result_stays_whole():
    """Adam's ``exp_avg_sq.mul_(beta2)`` on a 0-d parameter's state records only the
    cast of the wrapped float below it; when a later tensor reuses that cast's
    addresses (a capture in three, here), it looked like an escaping inner result, and
    the replay ran the cast alone: the multiply was lost."""
    b = TraceBuilder()
    mul_ = "aten::mul_.Tensor(Tensor(a!) self, Tensor other) -> Tensor(a!)"
    to = ("aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, "
          "bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a)")
    state, beta = b.tensor(()), b.tensor((), dtype="float64")
    op = b.op(mul_, [state, beta], [state])
    cast = b.tensor(())
    b.op(to, [beta, 6, False, False, None], [cast], parent=op)
    later = b.op(RELU, [cast], [b.tensor(())])  # the cast's addresses, reused
    ids = [s.node.id for s in select_ops(trace_from_document(b.doc(), name="t",
                                                             sha256="0")).ops]
    assert ids == [op, later]


def test_an_inner_results_addresses_allocated_anew_are_not_that_result():
    """A composite's temporary is freed, and a later op allocates at its storage; the
    backward then unpacks that new tensor into a TensorImpl at the temporary's old
    address, so the read carries the temporary's very key. It is not the composite's
    result: the composite stays whole (the selection flipped between captures of one
    training step with its allocations)."""
    b = TraceBuilder()
    bce = ("aten::binary_cross_entropy_with_logits(Tensor self, Tensor target, Tensor? "
           "weight=None, Tensor? pos_weight=None, int reduction=1) -> Tensor")
    exp = "aten::exp(Tensor self) -> Tensor"
    poisson = ("aten::poisson_nll_loss(Tensor input, Tensor target, bool log_input, bool "
               "full, float eps, int reduction) -> Tensor")
    logits, target = b.tensor((16, 4)), b.tensor((16, 4))
    loss, buffer = b.tensor(()), b.tensor((16, 4))
    composite = b.op(bce, [logits, target, None, None, 1], [loss])
    b.op(RELU, [logits], [buffer], parent=composite)  # its temporary, then freed
    at_buffer = T(b.new_id(), buffer.storage_id, (16, 4), (4, 1))
    later = b.op(poisson, [logits, target, True, False, 1e-8, 1], [b.tensor(())])
    b.op(exp, [logits], [at_buffer], parent=later)  # allocates at the freed storage
    unpacked = T(buffer.tensor_id, buffer.storage_id, (16, 4), (4, 1))
    backward = b.op(RELU, [unpacked], [b.tensor((16, 4))])
    ids = [s.node.id for s in select_ops(trace_from_document(b.doc(), name="t",
                                                             sha256="0")).ops]
    assert ids == [composite, later, backward]


def test_attention_replays_as_its_kernel_where_the_backward_reads_its_logsumexp():
    """Attention keeps its logsumexp for the backward: kept whole, the backward read a
    logsumexp filled before timing, and exp(scores - logsumexp) overflowed timm's
    VOLO training replay to inf within three iterations. Its child is a backend's
    kernel (CUDA's flash attention), but one the harness has a portable equivalent
    of, which runs wherever the kernel cannot: it replays as that child."""
    b = TraceBuilder()
    sdpa = ("aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, "
            "Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, "
            "float? scale=None, bool enable_gqa=False) -> Tensor")
    flash = ("aten::_scaled_dot_product_flash_attention(Tensor query, Tensor key, Tensor "
             "value, float dropout_p=0.0, bool is_causal=False, bool return_debug_mask="
             "False, *, float? scale=None) -> (Tensor output, Tensor logsumexp)")
    q, out, lse = b.tensor((1, 2, 4, 8)), b.tensor((1, 2, 4, 8)), b.tensor((1, 2, 4))
    whole = b.op(sdpa, [q, q, q, None, 0.0, False, None, False], [out])
    kernel = b.op(flash, [q, q, q, 0.0, False, False, None], [out, lse], parent=whole)
    backward = b.op(RELU, [lse], [b.tensor((1, 2, 4))])
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == [kernel, backward]


def test_a_composite_stays_whole_where_a_child_has_no_portable_equivalent():
    """MIOpen's CTC loss returns the gradient the backward reads, but the harness has
    no portable equivalent of it: descending would make a CUDA trace's replay skip
    the loss on any other device, so the portable composite is replayed whole."""
    b = TraceBuilder()
    ctc = ("aten::ctc_loss.IntList(Tensor log_probs, Tensor targets, int[] input_lengths, "
           "int[] target_lengths, int blank=0, int reduction=1, bool zero_infinity=False) "
           "-> Tensor")
    miopen = ("aten::miopen_ctc_loss(Tensor log_probs, Tensor targets, int[] input_lengths, "
              "int[] target_lengths, int blank, bool deterministic, bool zero_infinity) -> "
              "(Tensor, Tensor)")
    probs, targets = b.tensor((6, 2, 5)), b.tensor((2, 3), dtype="int64")
    loss, grad = b.tensor((2,)), b.tensor((6, 2, 5))
    whole = b.op(ctc, [probs, targets, [6, 6], [3, 3], 0, 0, False], [loss])
    b.op(miopen, [probs, targets, [6, 6], [3, 3], 0, True, False], [loss, grad],
         parent=whole)
    backward = b.op(RELU, [grad], [b.tensor((6, 2, 5))])
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == [whole, backward]


MUL = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
EMPTY_LIKE = ("aten::empty_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, "
              "Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None)"
              " -> Tensor")


@pytest.mark.parametrize("name,child,descends,scoped", [
    ("mylib::scale", MUL, True, False),  # a model's own op: replayed as what it ran
    # custom_op with register_autograd: its body runs inside a GeneratedBackwardFor_ scope
    ("mylib::scale", MUL, True, True),
    # its own kernel did the work: kept whole, guarded
    ("mylib::scale", EMPTY_LIKE, False, True),
    ("mylib::scale", EMPTY_LIKE, False, False),
    # torch registers it when the benchmark imports its module
    ("fsdp::scale", MUL, False, False),
    ("aten::relu", MUL, False, False),  # a composite of torch's own: whole, as ever
    # an op of a newer PyTorch (aten::linalg_polar of 2.14 on 2.13): as its children
    ("aten::scale", MUL, True, False),
])
def test_an_op_the_benchmark_cannot_load_replays_as_its_recorded_children(
        name, child, descends, scoped):
    """A model's ``torch.library`` op (the benchmark imports torch alone, never the
    model) stood in for with an empty result: its compute was lost. Its recorded
    children are the compute it ran, on torch's own kernels, also where a scope with
    no schema sits between them (the op was then skipped at run time). So are those of
    an op the generating PyTorch does not have (a newer PyTorch's trace)."""
    b = TraceBuilder()
    x, out = b.tensor((4, 4)), b.tensor((4, 4))
    op = b.op(f"{name}(Tensor x) -> Tensor", [x], [out])
    body = b.annotation("GeneratedBackwardFor_mylib_scale_default", parent=op) \
        if scoped else op
    inner = b.op(child, [x, x] if child == MUL else [x, None, None, None, None, None],
                 [out], parent=body)
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == ([inner] if descends else [op])
    notes = [d.reason for d in sel.not_replayed]
    assert any("replayed as its recorded children" in n for n in notes) == descends


def test_a_models_own_op_that_calls_another_replays_both_as_their_children():
    """A model's op whose body calls another of its ops: the inner one is not torch's
    (it would not load either), yet it replays as its own children, so the outer one
    does too. It was kept whole and skipped at run time."""
    b = TraceBuilder()
    x, out = b.tensor((4, 4)), b.tensor((4, 4))
    outer = b.op("mylib::outer(Tensor x) -> Tensor", [x], [out])
    inner = b.op("mylib::inner(Tensor x) -> Tensor", [x], [out], parent=outer)
    mul = b.op(MUL, [x, x], [out], parent=inner)
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == [mul]


CLAMP_ = "aten::clamp_(Tensor(a!) self, Scalar? min=None, Scalar? max=None) -> Tensor(a!)"


@pytest.mark.parametrize("body,descends", [
    (CLAMP_, True),  # mutates_args=("x",): the body's in-place op is its work
    (VIEW_AS, False),  # only a view below it: its own kernel wrote x
])
def test_a_models_own_op_that_mutates_its_argument_replays_its_in_place_body(
        body, descends):
    """``torch.library.custom_op(..., mutates_args=("x",))`` returns nothing and
    writes ``x``: its body (``x.clamp_(min=0)``) wrote in place, which no result
    shows. Kept whole, the op was skipped at run time and ``x`` never changed."""
    b = TraceBuilder()
    x = b.tensor((4, 4))
    op = b.op("mylib::relu_inplace(Tensor(a!) x) -> ()", [x], [])
    inner = b.op(body, [x, 0.0, None] if body == CLAMP_ else [x, x],
                 [x if body == CLAMP_ else b.view(x, (4, 4))], parent=op)
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == ([inner] if descends else [op])


ABS = "aten::abs(Tensor self) -> Tensor"
ZERO_ = "aten::zero_(Tensor(a!) self) -> Tensor(a!)"


@pytest.mark.parametrize("write,descends", [
    (COPY_, True),  # out = empty_like(x); out.copy_(x.abs()): the body wrote its result
    (ZERO_, False),  # a fill only prepares it: its own kernel computed it
    # quantized::linear_dynamic: its own gemm wrote the result, then a dispatched add_
    # of the bias read and wrote it; replayed as its children it lost the gemm
    (ADD_, False),
])
def test_a_models_own_op_that_writes_its_result_in_place_replays_its_body(write, descends):
    """A model's Python op that allocates its result and writes it in place returns a
    tensor no child computed: it was kept whole and skipped at run time. A fill of the
    result is not its work, as for torch's own ops, nor a write that reads what was
    there (the op's own kernel put it there)."""
    b = TraceBuilder()
    x, out, tmp = b.tensor((4, 4)), b.tensor((4, 4)), b.tensor((4, 4))
    op = b.op("mylib::abs_into(Tensor x) -> Tensor", [x], [out])
    b.op(EMPTY_LIKE, [x, None, None, None, None, None], [out], parent=op)
    inner = b.op(ABS, [x], [tmp], parent=op)
    b.op(write, {COPY_: [out, tmp, False], ADD_: [out, tmp, 1]}.get(write, [out]), [out],
         parent=op)
    selected = [s.node.id for s in select_ops(trace_from_document(b.doc(), name="t",
                                                                   sha256="0")).ops]
    assert (inner in selected) == descends and (op in selected) != descends


def test_an_op_on_storageless_tensors_that_only_allocates_below_is_no_vmap_level():
    """A vmap level calls an op on the level below; an op on tensors recorded without
    storage (oneDNN's prepacked MKLDNN weights) below which only its result was
    allocated ran its own kernel. Taken for a vmap level, it replayed as that
    allocation (a PT2E-quantized CNN's convolutions and linears), and no header said
    so. A level whose op runs below still descends."""
    b = TraceBuilder()
    x, out = b.tensor((4, 4)), b.tensor((4, 4))
    packed = T(b.new_id(), 0, (4, 4), (4, 1), device="")  # no storage recorded
    own = b.op("onednn::qlinear_fancy(Tensor x, Tensor w) -> Tensor", [x, packed], [out])
    b.op(EMPTY, [[4, 4], 6, 0, Device("cpu"), False, None], [out], parent=own)
    wrapper, below = T(b.new_id(), 0, (4,), (1,), device=""), b.tensor((3, 4))
    level = b.op(RELU, [wrapper], [T(b.new_id(), 0, (4,), (1,), device="")])
    inner = b.op(RELU, [below], [b.tensor((3, 4))], parent=level)
    selected = [s.node.id for s in select_ops(trace_from_document(b.doc(), name="t",
                                                                   sha256="0")).ops]
    assert own in selected  # replayed whole, not as its allocation
    assert inner in selected and level not in selected  # vmap's level descends


def test_an_op_whose_children_only_prepare_and_allocate_its_result_stays_whole():
    """``quantized::conv2d`` records a copy of its input to channels-last and the
    allocation of its result below it; its own kernel convolves. Replayed as those
    children, the replay allocated and copied and never convolved (the header said
    "replayed as its recorded children"). An allocation makes an op's result only where
    the op itself allocates. (It reads its input's scale and zero point below it too.)"""
    b = TraceBuilder()
    contiguous = ("aten::contiguous(Tensor(a) self, *, MemoryFormat memory_format=0) -> "
                  "Tensor(a)")
    clone = "aten::clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor"
    x, out = b.tensor((2, 3, 8, 8)), b.tensor((2, 8, 6, 6))
    op = b.op("myq::conv2d(Tensor qx, float scale) -> Tensor", [x, 0.1], [out])
    copy = b.op(contiguous, [x, 2], [b.tensor((2, 3, 8, 8))], parent=op)
    b.op(clone, [x, 2], [b.tensor((2, 3, 8, 8))], parent=copy)  # computes: not the result
    b.op(EMPTY_LIKE, [out, None, None, None, None, None], [out], parent=op)
    b.op("aten::q_scale(Tensor self) -> float", [x], [0.1], parent=op)  # reads a number
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert [s.node.id for s in sel.ops] == [op]


@pytest.mark.parametrize("layout", ["strided", "_mkldnn"])
def test_a_recorded_layout_decodes_to_the_layout_torch_wrote(layout, tmp_path):
    """The ET writes a Layout argument as c10's enum value, in which Mkldnn (3) comes
    before the compressed sparse layouts. Decoded with them in another order, a
    frozen TorchScript model's ``to_mkldnn`` allocated its result as sparse CSC, and
    the benchmark failed ("Only batched sparse compressed ... tensors are
    supported")."""
    from torch.profiler import ExecutionTraceObserver

    path = tmp_path / "et.json"
    observer = ExecutionTraceObserver().register_callback(str(path))
    observer.start()
    torch.ops.aten.empty.memory_format([2, 2], dtype=torch.float32,
                                       layout=getattr(torch, layout))
    observer.stop()
    observer.unregister_callback()
    program = build_program(load_trace(path))
    first = program.ops[0]  # (a sparse one allocates its parts below it)
    assert first.signature.qualified_name == "aten::empty"
    given = next(a.value for a in first.args if a.spec.name == "layout")
    assert isinstance(given, TorchConstant) and given.name == layout


def test_parent_cycle_is_an_error_with_node_and_field():
    b = TraceBuilder()
    a = b.annotation("a")
    doc = b.doc()
    for node in doc["nodes"]:
        if node["id"] == a:
            node["ctrl_deps"] = a + 1
    doc["nodes"].append({"id": a + 1, "name": "b", "ctrl_deps": a, "attrs": []})
    with pytest.raises(TraceError) as info:
        select_ops(trace_from_document(doc, name="t", sha256="0"))
    assert info.value.field == "ctrl_deps"


def test_a_tensor_set_onto_a_storage_it_was_handed_is_an_input_with_valid_values():
    """A DataLoader with worker processes: the main process rebuilds each batch from
    shared memory (``empty``, then ``set_`` onto the worker's storage, which no
    recorded op made), so its values were written outside recorded ops. Replayed onto a
    new storage they were garbage (the labels out of nll_loss's range: IndexError).
    The storage is built before timing, its values within the rows ``index`` takes."""
    b = TraceBuilder()
    table = b.tensor((10, 4))
    empty = b.tensor((0,), dtype="int64")
    rows = T(empty.tensor_id, b.new_id(), (3,), (1,), 0, "int64", "cpu")
    b.op(EMPTY, [[0], 4, 0, Device("cpu"), False, None], [empty])
    b.op(SET_STORAGE, [empty, "<Storage>", 0, [3], [1]], [rows])
    b.op(INDEX, [table, [rows]], [b.tensor((3, 4))], attrs={"tensor_range": '{"1":[2,5]}'})
    doc = b.doc()
    doc["nodes"][1]["inputs"]["types"][1] = "Storage"  # (the set_: nodes are reversed)
    program = build_program(trace_from_document(doc, name="t.json", sha256="0"))
    index_rows = program.ops[-1].args[1].value.items[0]
    assert isinstance(index_rows.binding, InputView)
    assert index_rows.storage.materialised
    assert (index_rows.storage.init.low, index_rows.storage.init.high) == (2, 5)


# -- lower --------------------------------------------------------------------------


SET_STORAGE = ("aten::set_.source_Storage_storage_offset(Tensor(a!) self, Storage source, "
               "SymInt storage_offset, SymInt[] size, SymInt[] stride=[]) -> Tensor(a!)")


def test_a_storage_argument_is_a_new_storage_as_large_as_the_result(tmp_path):
    """The observer writes a Storage argument as "<Storage>" (all_gather_object's
    set_ of a pickle's bytes); the result it made says how large it is: here 3 floats
    from element 4 on, 28 bytes. The benchmark runs the set_ onto a new storage."""
    b = TraceBuilder()
    empty = b.tensor((0,))
    result = b.tensor((3,), offset=4)
    b.op(SET_STORAGE, [empty, "<Storage>", 4, [3], []],
         [T(empty.tensor_id, result.storage_id, (3,), (1,), 4, "float32", "cpu")])
    doc = b.doc()
    doc["nodes"][0]["inputs"]["types"][1] = "Storage"
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(doc))
    program = build_program(load_trace(trace))
    (op,) = program.ops
    assert op.args[1].value == FreshStorage(nbytes=28, kind="cpu")
    bench = tmp_path / "bench.py"
    generate(trace, bench, GenerateOptions(command_line="test"))
    assert "_storage(28, device)" in bench.read_text()
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]


IS_SAME_SIZE = "aten::is_same_size(Tensor self, Tensor other) -> bool"


def test_an_op_reading_only_metadata_replays_on_a_stand_in_for_a_tensor_without_storage(
        tmp_path):
    """Under torch.func's transforms (hessian, jacrev) the autograd engine checks each
    gradient's size with ``is_same_size`` on a vmap wrapper, which the trace records
    without storage but with its shape: a third of a hessian step's ops were listed as
    not replayed. An op that only reads metadata runs on a stand-in of that shape; an
    op that computes on the wrapper is still not replayed (its values are unknown)."""
    b = TraceBuilder()
    x = b.tensor((4, 3))
    wrapper = T(b.new_id(), 0, (4, 3), (3, 1), device="")
    b.op(IS_SAME_SIZE, [x, wrapper], [True])
    b.op(RELU, [wrapper], [b.tensor((4, 3))])
    trace = b.write(tmp_path / "t.json")
    program = build_program(load_trace(trace))
    (op,) = program.ops
    assert op.args[1].value == StandInTensor(TensorMeta((4, 3), (3, 1), 0, "float32", ""))
    (skipped,) = program.not_replayed
    assert skipped.name == "aten::relu" and "without storage" in skipped.reason
    bench = tmp_path / "bench.py"
    generate(trace, bench, GenerateOptions(command_line="test"))
    replay_et = tmp_path / "replay.json"
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "2",
                         "--et", str(replay_et))
    assert proc.returncode == 0, proc.stderr[-2000:]
    # The stand-in is harness work: the replay's ops are the original's, less relu.
    assert op_multiset(replay_et) == op_multiset(trace) - Counter({"aten::relu": 1})


TO_DTYPE = ("aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, "
            "bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a)")
ADD_BATCH_DIM = "aten::_add_batch_dim(Tensor self, int batch_dim, int level) -> Tensor"


def test_an_op_between_wrappers_alone_replays_on_stand_ins_but_not_vmaps_own_machinery(
        tmp_path):
    """Under ``vmap(grad(mse_loss))`` a cast of a wrapper to the dtype it had returns
    it, and ``broadcast_tensors`` of equal shapes returns its inputs: they ran on no
    tensor below them (no child to replay), and were listed as not replayed (5 of a
    per-sample-gradient step's 51 ops). An op that touches no real tensor replays on
    stand-ins; one that turns a real tensor into a wrapper (vmap's own
    ``_add_batch_dim``) is still not replayed."""
    b = TraceBuilder()
    wrapper = T(b.new_id(), 0, (4, 3), (3, 1), device="")
    b.op(TO_DTYPE, [wrapper, 6, False, False, None], [wrapper])
    x = b.tensor((4, 3))
    b.op(ADD_BATCH_DIM, [x, 0, 1], [T(b.new_id(), 0, (3,), (1,), device="")])
    trace = b.write(tmp_path / "t.json")
    program = build_program(load_trace(trace))
    (op,) = program.ops
    assert op.name == "aten::to" and isinstance(op.args[0].value, StandInTensor)
    assert isinstance(op.outputs[0], StandInTensor)
    assert [d.name for d in program.not_replayed] == ["aten::_add_batch_dim"]
    bench = tmp_path / "bench.py"
    generate(trace, bench, GenerateOptions(command_line="test"))
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]


MAKE_DUAL = "aten::_make_dual(Tensor(a) primal, Tensor tangent, int level) -> Tensor(a)"
UNPACK_DUAL = ("aten::_unpack_dual(Tensor(a) dual, int level) -> "
               "(Tensor(a) primal, Tensor tangent)")


def test_forward_ad_ops_replay_inside_the_dual_level_they_name(tmp_path):
    """``forward_ad.dual_level()`` enters a level by a call no trace records, and
    ``_make_dual`` replayed outside it raised ("a forward AD level with an invalid
    index"). The iteration keeps the levels the ops name live; the dual tensor is read
    as itself (not as the primal it aliases), so its readers compute tangents again,
    and the tangent unpacked at the end is defined."""
    b = TraceBuilder()
    x, t = b.tensor((4, 4)), b.tensor((4, 4))
    dual = b.view(x, (4, 4))
    b.op(MAKE_DUAL, [x, t, 0], [dual])
    y = b.tensor((4, 4))
    b.op(RELU, [dual], [y])
    primal, tangent = b.view(y, (4, 4)), b.tensor((4, 4))
    b.op(UNPACK_DUAL, [y, 0], [primal, tangent])
    b.op(RELU, [tangent], [b.tensor((4, 4))])
    trace = b.write(tmp_path / "t.json")
    program = build_program(load_trace(trace))
    assert program.dual_levels == 1
    assert _tensor_args(program.ops[1])[0].binding == OpOutput(0, (0,))
    bench = tmp_path / "bench.py"
    text = generate(trace, bench, GenerateOptions(command_line="test"))
    assert "_dual_levels(1)" in text
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_lowering_decodes_by_schema_type():
    b = TraceBuilder()
    empty = ("aten::empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, "
             "Layout? layout=None, Device? device=None, bool? pin_memory=None, "
             "MemoryFormat? memory_format=None) -> Tensor")
    b.op(empty, [[2, 3], 6, 0, Device("cuda:0"), False, None], [b.tensor((2, 3), device="cuda")])
    program = _program(b)
    (op,) = program.ops
    values = {a.spec.name: a.value for a in op.args}
    assert values["dtype"].name == "float32"
    assert values["layout"].name == "strided"
    assert values["device"].kind == "cuda"
    assert op.args[0].spec.kwarg_only is False and values["dtype"] is not None


def test_unsupported_ops_become_values_not_crashes():
    b = TraceBuilder()
    stream_op = "aten::record_stream(Tensor(a!) self, Stream s) -> ()"
    b.op(stream_op, [b.tensor((2,)), 7], [])
    b.op("not an op(", [], [])
    program = _program(b)
    assert program.ops == []
    reasons = {s.name: s.reason for s in program.not_replayed}
    assert "aten::record_stream" in reasons
    assert any("not a valid operator name" in r for r in reasons.values())


def test_too_many_recorded_inputs_is_not_replayed():
    b = TraceBuilder()
    x = b.tensor((2,))
    b.op(RELU, [x, x], [b.tensor((2,))])
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    ops, skipped = lower_ops(sel.ops)
    assert not ops and "schema takes 1" in skipped[0].reason


# -- tensors ----------------------------------------------------------------------


def test_outputs_of_one_op_on_one_storage_are_each_read_as_returned():
    """torch.where returns its index tensors as rows of one buffer (one storage id).
    Each is its own output: a reader of the first reads ``where[0]``, not a view the
    harness derives by storage offset from the second (which broke when the buffer was
    fitted to its recorded size, and cost a harness op per reader)."""
    b = TraceBuilder()
    mask = b.tensor((6, 2), dtype="bool")
    rows = b.tensor((4,), dtype="int64")
    cols = b.view(rows, (4,), offset=4)
    where = "aten::where(Tensor condition) -> Tensor[]"
    b.op(where, [mask], [[rows, cols]])
    x = b.tensor((6, 8))
    b.op("aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor", [x, [rows]],
         [b.tensor((4, 8))])
    b.op("aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor", [x, [cols]],
         [b.tensor((4, 8))])
    ops = _program(b).ops
    read = [next(iter_tensors(op.args[1].value)).binding for op in ops[1:]]
    assert read == [OpOutput(0, (0, 0)), OpOutput(0, (0, 1))]
    assert not any(op.derive_before for op in ops)


def test_dataflow_aliasing_and_id_reuse():
    b = TraceBuilder()
    x, w = b.tensor((4, 4)), b.tensor((4, 4))
    y = b.tensor((4, 4))
    b.op(MM, [x, w], [y])                                 # 0: y produced
    yt = b.view(y, (4, 4), strides=(1, 4))
    b.op(T_OP, [y], [yt])                                 # 1: view of y
    b.op(ADD_, [yt, x, 1], [yt])                          # 2: in-place on the view
    reused = b.tensor((8,), storage=y.storage_id)         # 3: y's storage id reused
    b.op(RELU, [x], [reused])
    b.op(RELU, [reused], [b.tensor((8,))])                # 4: reads the new lifetime
    program = _program(b)
    ops = program.ops
    mm_out = ops[0].outputs[0]
    assert isinstance(mm_out.binding, OpOutput)
    assert _tensor_args(ops[1])[0].binding is mm_out.binding
    assert _tensor_args(ops[2])[0].binding == OpOutput(1, (0,))
    assert ops[2].outputs[0].binding == OpOutput(1, (0,))  # returns its input: no new name
    assert _tensor_args(ops[4])[0].binding == OpOutput(3, (0,))
    assert _tensor_args(ops[4])[0].storage is not mm_out.storage
    materialised = [s for s in program.storages if s.materialised]
    assert len(materialised) == 2  # x and w only


def test_materialised_storage_covers_every_view():
    b = TraceBuilder()
    base = b.tensor((10,))
    head = b.view(base, (4,), offset=0)
    tail = b.view(base, (3,), offset=7)
    b.op(RELU, [head], [b.tensor((4,))])
    b.op(RELU, [tail], [b.tensor((3,))])
    program = _program(b)
    (storage,) = [s for s in program.storages if s.materialised]
    assert storage.extent == 10
    bindings = [_tensor_args(op)[0].binding for op in program.ops]
    assert all(isinstance(v, InputView) and v.storage is storage for v in bindings)


def test_view_of_a_produced_tensor_is_derived_and_freed():
    b = TraceBuilder()
    x = b.tensor((4, 4))
    y = b.tensor((4, 4))
    b.op(RELU, [x], [y])
    row = b.view(y, (4,), offset=4)
    b.op(RELU, [row], [b.tensor((4,))])
    program = _program(b)
    (derived,) = program.ops[1].derive_before
    assert isinstance(derived, DerivedView) and derived.meta.offset == 4
    assert derived in program.ops[1].free_after


TO = ("aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, "
      "bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a)")
LIFT_FRESH = "aten::lift_fresh(Tensor(a) self) -> Tensor(a)"
DETACH_ = "aten::detach_(Tensor(a!) self) -> Tensor(a!)"
FILL_ = "aten::fill_.Scalar(Tensor(a!) self, Scalar value) -> Tensor(a!)"
INDEX = "aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor"


def _index_from_python_list(written: bool) -> TraceBuilder:
    """``x[torch.tensor([2, 5, 3])]``: torch.tensor records empty, to, lift_fresh and
    detach_; the data is copied in by C++ code the observer does not see."""
    b = TraceBuilder()
    table = b.tensor((10, 4))
    rows = b.tensor((3,), dtype="int64")
    b.op(EMPTY, [[3], 4, 0, Device("cpu"), False, None], [rows])
    if written:
        b.op(FILL_, [rows, 1], [rows])
    b.op(TO, [rows, 4, False, False, None], [rows])
    b.op(LIFT_FRESH, [rows], [rows])
    b.op(DETACH_, [rows], [rows])
    b.op(INDEX, [table, [rows]], [b.tensor((3, 4))],
         attrs={"tensor_range": '{"1":[2,5]}'})
    return b


def test_tensor_built_from_python_data_is_an_input_with_valid_values(tmp_path):
    """Replayed, aten::empty returns garbage, and aten::index read it as indices. The
    storage is built before timing instead (from the recorded range, within the rows
    the index op accepts); every op still replays, the empty call's result unused."""
    program = _program(_index_from_python_list(written=False))
    assert [op.name for op in program.ops] == [
        "aten::empty", "aten::to", "aten::lift_fresh", "aten::detach_", "aten::index"]
    (rows,) = [s for s in program.storages if s.dtype == "int64"]
    assert rows.materialised and not rows.requires_grad
    assert (rows.init.kind, rows.init.low, rows.init.high) == ("span", 2, 5)
    index_rows = program.ops[-1].args[1].value.items[0]
    assert isinstance(index_rows.binding, InputView) and index_rows.storage is rows
    assert isinstance(program.ops[0].outputs[0].binding, InputView)

    bench = tmp_path / "bench.py"
    generate(_index_from_python_list(written=False).write(tmp_path / "t.json"), bench,
             GenerateOptions(command_line="test"))
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_tensor_a_recorded_op_writes_stays_produced():
    program = _program(_index_from_python_list(written=True))
    (rows,) = [s for s in program.storages if s.dtype == "int64"]
    assert not rows.materialised
    assert program.ops[-1].args[1].value.items[0].binding == OpOutput(0, (0,))


SET_ = "aten::set_.source_Tensor(Tensor(a!) self, Tensor source) -> Tensor(a!)"
FOREACH_MUL_ = "aten::_foreach_mul_.Scalar(Tensor(a!)[] self, Scalar scalar) -> ()"
FOREACH_LERP_ = ("aten::_foreach_lerp_.Scalar(Tensor(a!)[] self, Tensor[] tensors1, "
                 "Scalar weight) -> ()")


def _wrapper_subclass_optimizer() -> TraceBuilder:
    """The first foreach ops of an FSDP2 AdamW step as the observer records DTensors: a
    wrapper subclass holds no data, so every one is on the null data pointer's storage
    id, at the offset of the local tensor it wraps (the gradients wrap views of one
    reduce-scatter output: offsets 0, 4, 8)."""
    b = TraceBuilder()
    null = b.new_id()
    shapes = [(4,), (4,), (4, 4)]
    params = [b.tensor(s, storage=null) for s in shapes]
    exp_avgs = [b.tensor(s, storage=null) for s in shapes]
    grads = [b.tensor(s, storage=null, offset=o) for s, o in zip(shapes, (0, 4, 8), strict=True)]
    b.op(FOREACH_MUL_, [params, 0.99], [])
    b.op(FOREACH_LERP_, [exp_avgs, grads, 0.1], [])
    return b


def test_tensors_an_op_kept_apart_get_buffers_of_their_own(tmp_path):
    """_foreach_lerp_ writes exp_avgs[2] (16 elements at 0) while reading grads[2] (16
    at 8) on the same storage id: partially overlapping, which PyTorch refuses, so the
    original kept them apart and the id is no memory. Read as one buffer they replayed
    as overlapping views and the benchmark died ("some elements of the input tensor and
    the written-to tensor refer to a single memory location")."""
    program = _program(_wrapper_subclass_optimizer())
    mul, lerp = program.ops
    tensors = [tv for op in (mul, lerp) for a in op.args for tv in iter_tensors(a.value)]
    assert len(tensors) == 9
    assert len({id(tv.storage) for tv in tensors}) == 9  # a buffer each
    assert all(tv.storage.materialised and isinstance(tv.binding, InputView)
               for tv in tensors)
    assert any("cannot be one memory" in d.reason for d in program.diagnostics)

    bench = tmp_path / "bench.py"
    generate(_wrapper_subclass_optimizer().write(tmp_path / "t.json"), bench,
             GenerateOptions(command_line="test"))
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]


FUNCTIONAL_ALL_REDUCE = ("_c10d_functional::all_reduce(Tensor input, str reduce_op, "
                         "str group_name) -> Tensor")
MUL_SCALAR_ = "aten::mul_.Scalar(Tensor(a!) self, Scalar other) -> Tensor(a!)"


def _empty_beside_a_wrapper() -> TraceBuilder:
    """An FSDP2 rank's SGD step as the observer records it: the functional all-reduce
    of a gradient norm returns an AsyncCollectiveTensor, a wrapper on the null data
    pointer's storage id, and the rank's empty shard of a momentum buffer, no elements,
    sits on that id too."""
    b = TraceBuilder()
    null = b.new_id()
    norm = b.tensor((18,))
    reduced = b.tensor((18,), storage=null)
    b.op(FUNCTIONAL_ALL_REDUCE, [norm, "sum", "0"], [reduced])
    b.op(MUL_SCALAR_, [reduced, 0.5], [reduced])
    empty = b.tensor((0, 1), storage=null)
    b.op(MUL_SCALAR_, [empty, 0.9], [empty])
    return b


def test_a_tensor_of_no_elements_shares_no_memory():
    """An empty tensor on the id another tensor holds is no view of it: the replay of
    a random model under FSDP2 (scripts/random_strategies.py, seed 102, recorded in a
    profiler session) made the empty momentum shard a view of the all-reduce's result,
    and SGD's ``mul_`` on it waited on the collective: an extra ``wait_tensor``."""
    program = _program(_empty_beside_a_wrapper())
    reduced = program.ops[0].outputs[0]
    empty = program.ops[2].args[0].value
    assert empty.storage is not reduced.storage
    assert empty.storage.materialised and isinstance(empty.binding, InputView)


def test_tensors_that_may_share_memory_still_alias():
    """Only a value write onto a partial overlap proves two tensors apart:
    ``x.add_(alias)`` with another tensor on exactly the same elements (a full overlap,
    which PyTorch accepts), reads of partially overlapping views, and ``set_`` pointing
    a view at an overlapping one (it writes no values) keep one buffer."""
    b = TraceBuilder()
    x = b.tensor((4, 4))
    alias = b.view(x, (4, 4))
    b.op(ADD_, [x, alias, 1], [x])
    head, rows = b.view(x, (8,)), b.view(x, (2, 4), offset=4)
    b.op(MM, [rows, b.view(x, (4, 4))], [b.tensor((2, 4))])
    b.op(RELU, [head], [b.tensor((8,))])
    tail = b.view(x, (8,), offset=4)
    b.op(SET_, [head, tail], [T(head.tensor_id, x.storage_id, (8,), (1,), offset=4)])
    program = _program(b)
    (storage,) = [s for s in program.storages if s.materialised]
    assert all(tv.storage is storage for op in program.ops for tv in _tensor_args(op))
    assert not any("cannot be one memory" in d.reason for d in program.diagnostics)


# -- values -----------------------------------------------------------------------


def test_embedding_indices_are_bounded_by_table_rows():
    b = TraceBuilder()
    table = b.tensor((1000, 8))
    ids = b.tensor((32,), dtype="int64")
    b.op(EMBEDDING, [table, ids, -1, False, False], [b.tensor((32, 8))])
    program = _program(b)
    init = _tensor_args(program.ops[0])[1].storage.init
    assert (init.kind, init.low, init.high) == ("randint", 0, 1000)
    assert _tensor_args(program.ops[0])[0].storage.init.kind == "uniform"


def test_bag_offsets_are_sorted_offsets_over_the_indices():
    b = TraceBuilder()
    bag = ("aten::embedding_bag(Tensor weight, Tensor indices, Tensor offsets, "
           "bool scale_grad_by_freq=False, int mode=0, bool sparse=False, "
           "Tensor? per_sample_weights=None, bool include_last_offset=False) -> "
           "(Tensor, Tensor, Tensor, Tensor)")
    weight, indices, offsets = b.tensor((50, 4)), b.tensor((20,), dtype="int64"), b.tensor(
        (5,), dtype="int64")
    outs = [b.tensor((5, 4)), b.tensor((0,), dtype="int64"), b.tensor((5,), dtype="int64"),
            b.tensor((5,), dtype="int64")]
    b.op(bag, [weight, indices, offsets, False, 0, False, None, False], outs)
    program = _program(b)
    args = _tensor_args(program.ops[0])
    assert args[1].storage.init.high == 50
    assert (args[2].storage.init.kind, args[2].storage.init.high) == ("offsets", 20)


def test_json_round_trip_of_builder():
    b = TraceBuilder()
    b.op(RELU, [b.tensor((2,))], [b.tensor((2,))])
    assert json.loads(json.dumps(b.doc()))["nodes"]


# -- dependency graph -----------------------------------------------------------------


def test_dependency_graph_orders_reads_and_writes():
    from mystique_gen.passes.deps import critical_path_length, dependency_graph

    b = TraceBuilder()
    x, w = b.tensor((4, 4)), b.tensor((4, 4))
    y = b.tensor((4, 4))
    b.op(MM, [x, w], [y])                       # 0 writes y
    b.op(RELU, [x], [b.tensor((4, 4))])          # 1 independent of 0
    b.op(RELU, [y], [b.tensor((4, 4))])          # 2 reads y (after 0)
    b.op(ADD_, [x, w, 1], [x])                   # 3 writes x (after 0 and 1 read it)
    graph = dependency_graph(_program(b).ops)
    assert graph.has_edge(0, 2) and graph.edges[0, 2]["kind"] == "raw"
    assert graph.has_edge(0, 3) and graph.has_edge(1, 3)
    assert graph.edges[1, 3]["kind"] == "war"
    assert not graph.has_edge(0, 1) and not graph.has_edge(2, 3)
    assert critical_path_length(graph) == 2


# -- autograd -------------------------------------------------------------------------


def test_autograd_modes_follow_the_recorded_seq_ids():
    bn = ("aten::batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, "
          "Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled)"
          " -> Tensor")
    b = TraceBuilder()
    x, w = b.tensor((4, 4)), b.tensor((4, 4))
    gamma, beta, mean, var = (b.tensor((4,)) for _ in range(4))
    y, z = b.tensor((4, 4)), b.tensor((4, 4))
    b.op(MM, [x, w], [y], attrs={"seq_id": 0})                                       # 0
    b.op(bn, [y, gamma, beta, mean, var, True, 0.1, 1e-5, False], [z],
         attrs={"seq_id": 1})                                                          # 1
    b.op(RELU, [z], [b.tensor((4, 4))], attrs={"seq_id": -1})                          # 2
    other = b.tensor((4, 4))
    b.op(RELU, [other], [b.tensor((4, 4))], attrs={"seq_id": -1})                      # 3
    program = _program(b)
    modes = [op.grad_mode for op in program.ops]
    assert modes == [True, True, False, None]
    args = {a.spec.name: a.value for a in program.ops[1].args}
    assert args["weight"].storage.requires_grad and args["bias"].storage.requires_grad
    assert not args["running_mean"].storage.requires_grad  # PyTorch refuses it
    assert _tensor_args(program.ops[0])[1].storage.requires_grad  # the mm's weight


def test_only_ops_that_made_an_autograd_node_mark_parameters():
    """An op in grad mode records the next autograd number, which moves only when a node
    is made: of the ops that recorded one number, the last made the node. Ops before it
    read no tensor that required grad (a quantization observer's buffers): their reads
    are not parameters, or the scale they compute would require grad."""
    mul = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
    b = TraceBuilder()
    running_max, eps = b.tensor((4, 4)), b.tensor((4, 4))
    x, w, y = b.tensor((4, 4)), b.tensor((4, 4)), b.tensor((4, 4))
    b.op(mul, [running_max, eps], [b.tensor((4, 4))], attrs={"seq_id": 5})  # no node
    b.op(MM, [x, w], [y], attrs={"seq_id": 5})                               # node 5
    b.op(RELU, [y], [b.tensor((4, 4))], attrs={"seq_id": 6})                 # node 6
    program = _program(b)
    assert [op.made_grad_node for op in program.ops] == [False, True, True]
    assert [op.grad_mode for op in program.ops] == [True, True, True]
    assert not any(t.storage.requires_grad for t in _tensor_args(program.ops[0]))
    assert _tensor_args(program.ops[1])[1].storage.requires_grad


def test_a_thread_whose_autograd_number_never_moved_made_no_node():
    """An inference step run in grad mode, reading nothing that requires grad, records
    one autograd number throughout: no op made a node, so none of its reads become
    parameters (the replay built a graph each iteration the original never made)."""
    b = TraceBuilder()
    x, w, y = b.tensor((4, 4)), b.tensor((4, 4)), b.tensor((4, 4))
    b.op(MM, [x, w], [y], attrs={"seq_id": 7})
    b.op(RELU, [y], [b.tensor((4, 4))], attrs={"seq_id": 7})
    program = _program(b)
    assert [op.made_grad_node for op in program.ops] == [False, False]
    assert [op.grad_mode for op in program.ops] == [True, True]
    assert not any(t.storage.requires_grad for op in program.ops for t in _tensor_args(op))


def test_after_a_backward_the_last_number_is_taken_only_where_the_backward_names_it():
    """In a training step the backward names the forward's numbers: an op after the
    loss that recorded the next number and that no backward names (a metric over the
    batch's labels) made no node; the loss, named by the backward, did."""
    mul = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
    b = TraceBuilder()
    x, w, y, loss = b.tensor((4, 4)), b.tensor((4, 4)), b.tensor((4, 4)), b.tensor((4, 4))
    labels, scale = b.tensor((4, 4)), b.tensor((4, 4))
    b.op(MM, [x, w], [y], attrs={"seq_id": 3})                                 # node 3
    b.op(RELU, [y], [loss], attrs={"seq_id": 4})                               # node 4
    b.op(RELU, [b.tensor((4, 4))], [b.tensor((4, 4))],
         attrs={"seq_id": 4, "fw_tid": 1})                                     # its backward
    b.op(mul, [labels, scale], [b.tensor((4, 4))], attrs={"seq_id": 5})       # no node
    program = _program(b)
    assert [op.made_grad_node for op in program.ops][:2] == [True, True]
    assert program.ops[-1].made_grad_node is False
    assert _tensor_args(program.ops[0])[1].storage.requires_grad
    assert not any(t.storage.requires_grad for t in _tensor_args(program.ops[-1]))


def test_a_detached_tensor_is_read_as_itself_not_as_the_view_it_aliases():
    """``x.detach()`` has ``x``'s storage and view: bound to ``x``, its readers would
    record autograd nodes the original did not (and a fake-quantize scale computed from
    it would require grad, which its kernel refuses)."""
    detach = "aten::detach(Tensor(a) self) -> Tensor(a)"
    b = TraceBuilder()
    x, w, y = b.tensor((4, 4)), b.tensor((4, 4)), b.tensor((4, 4))
    b.op(MM, [x, w], [y], attrs={"seq_id": 0})
    loose = b.view(y, (4, 4))
    b.op(detach, [y], [loose], attrs={"seq_id": 1})
    b.op(RELU, [loose], [b.tensor((4, 4))], attrs={"seq_id": 1})
    b.op(RELU, [y], [b.tensor((4, 4))], attrs={"seq_id": 1})
    program = _program(b)
    detached = program.ops[1].outputs[0].binding
    assert isinstance(detached, OpOutput) and detached.op_index == 1
    assert _tensor_args(program.ops[2])[0].binding == detached
    assert _tensor_args(program.ops[3])[0].binding == OpOutput(0, (0,))


def test_another_tensor_on_a_view_ops_memory_is_a_leaf_of_its_own():
    """FSDP2 keeps each unsharded parameter as an nn.Parameter over the buffer it
    all-gathers into; for a Shard(1) parameter its copy-out writes that buffer under
    no_grad through a view op whose result has the parameter's layout. The parameter
    is another tensor that no op made: read as the view op's result (a view made
    under no_grad, then written in place), the forward's mm failed in autograd. Read as
    a leaf on the same memory, it is what the original read; the view's own readers
    still read the view."""
    copy_ = "aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)"
    b = TraceBuilder()
    flat, src, x = b.tensor((64,)), b.tensor((8, 8)), b.tensor((4, 8))
    view = b.view(flat, (8, 8))
    b.op(VIEW, [flat, [8, 8]], [view], attrs={"seq_id": -1})              # no_grad
    b.op(copy_, [view, src, False], [view], attrs={"seq_id": -1})
    param = b.view(flat, (8, 8))  # same memory and layout, another tensor
    y = b.tensor((4, 8))
    b.op(MM, [x, param], [y], attrs={"seq_id": 0})                        # forward
    b.op(RELU, [y], [b.tensor((4, 8))], attrs={"seq_id": 1})
    b.op(RELU, [view], [b.tensor((8, 8))], attrs={"seq_id": -1})
    program = _program(b)
    made = OpOutput(0, (0,))
    assert _tensor_args(program.ops[1])[0].binding == made
    leaf = _tensor_args(program.ops[2])[1].binding
    assert isinstance(leaf, InputView) and leaf.storage is program.ops[0].args[0].value.storage
    assert leaf.storage.requires_grad and program.ops[2].grad_mode
    assert _tensor_args(program.ops[4])[0].binding == made


def test_a_parameter_over_a_buffer_written_through_a_no_grad_view_replays(tmp_path):
    """The same as a real step (FSDP2's Shard(1) copy-out, one process): the benchmark
    runs, and replays the recorded ops."""
    buf = torch.empty(512)
    param = torch.nn.Parameter(buf.view(16, 32))
    src, x = torch.randn(32, 16), torch.randn(4, 32)
    opt = torch.optim.SGD([param], lr=0.1)

    def step() -> None:
        opt.zero_grad()
        with torch.no_grad():
            torch.cat(src.chunk(2, 0), dim=1, out=buf.view(16, 32))
        torch.nn.functional.linear(x, param).sum().backward()
        opt.step()

    step()
    trace = record_et(step, tmp_path / "t.json")
    bench = tmp_path / "bench.py"
    generate(trace, bench, GenerateOptions(command_line="test"))
    replay = tmp_path / "replay.json"
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                         "--et", str(replay))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert op_multiset(replay) == op_multiset(trace)


def test_a_tensor_read_after_a_view_of_its_bits_is_the_computed_one(tmp_path):
    """``h.view(torch.int32)`` (bf16 truncation, stochastic rounding) reads h's memory
    in another dtype. The view's result took h's memory over, so the later ``bits * h``
    read h as an input filled before timing: U(-1, 1) noise instead of the step's h,
    and the training replay's parameter went to inf. The view is one beside h."""
    weight = torch.nn.Parameter(torch.randn(8))
    opt = torch.optim.SGD([weight], lr=0.1)

    def step() -> None:
        opt.zero_grad()
        h = torch.exp(weight)
        bits = (h.detach().view(torch.int32) & -65536).view(torch.float32)
        (bits * h).sum().backward()
        opt.step()

    step()
    trace = record_et(step, tmp_path / "t.json")
    program = build_program(load_trace(trace))
    inputs = [s for s in program.storages if s.materialised and s.extent > 1]
    assert len(inputs) == 1  # the parameter, and nothing the step computes
    bench = tmp_path / "bench.py"
    generate(trace, bench, GenerateOptions(command_line="test"))
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "3",
                         "--reset-inputs", "off", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reinterpret" not in bench.read_text()


def test_a_view_made_without_grad_of_a_tensor_that_requires_grad_requires_grad():
    """DTensor's from_local views an activation under no_grad, and a view of a tensor
    that requires grad requires grad in any mode: the pipeline's backward mm that read
    it must replay with grad off. Left in grad mode, it built a graph, the gradient it
    accumulated required grad, and gloo refused to reduce-scatter it (8 ranks, pp x
    FSDP2 x TP)."""
    view_as = "aten::view_as(Tensor(a) self, Tensor other) -> Tensor(a)"
    b = TraceBuilder()
    x, w, y, z = b.tensor((4, 4)), b.tensor((4, 4)), b.tensor((4, 4)), b.tensor((4, 4))
    b.op(MM, [x, w], [y], attrs={"seq_id": 0})                           # forward
    b.op(RELU, [y], [z], attrs={"seq_id": 1})
    v = b.view(z, (4, 4))
    b.op(view_as, [z, z], [v], attrs={"seq_id": -1})                     # no_grad view
    grad = b.tensor((4, 4))
    b.op(MM, [grad, v], [b.tensor((4, 4))], attrs={"seq_id": -1})        # backward
    b.op(RELU, [grad], [b.tensor((4, 4))], attrs={"seq_id": -1})         # reads no such
    program = _program(b)
    assert [op.grad_mode for op in program.ops] == [True, True, False, False, None]


def test_trace_without_autograd_replays_with_grad_off():
    b = TraceBuilder()
    x = b.tensor((2, 2))
    b.op(RELU, [x], [b.tensor((2, 2))], attrs={"seq_id": -1})
    program = _program(b)
    assert [op.grad_mode for op in program.ops] == [False]
    assert not any(s.requires_grad for s in program.storages)


def test_trace_without_seq_ids_leaves_grad_mode_alone():
    b = TraceBuilder()
    b.op(RELU, [b.tensor((2, 2))], [b.tensor((2, 2))])
    assert [op.grad_mode for op in _program(b).ops] == [None]


@pytest.mark.parametrize("schema, view", [
    ("aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)", True),
    ("aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
     True),
    ("aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
     False),
    ("aten::sum(Tensor self, *, ScalarType? dtype=None) -> Tensor", False),
    ("aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)", False),
])
def test_signature_knows_views(schema, view):
    """A view reads no data: an AsyncCollectiveTensor's view does not wait."""
    assert parse_signature(schema).is_view is view


def _raw(node_id: int, name: str, inputs: list[RawArg], outputs: list[RawArg]) -> RawNode:
    return RawNode(node_id, name, 1, 1, None, f"{name}(...) -> ...", inputs, outputs)


def test_tensors_without_storage_are_sparse_where_their_parts_are_read():
    """A sparse COO tensor and a vmap wrapper are both recorded ``[id, 0, 0, 0, 0, ""]``.
    The ops reading a sparse tensor's parts tell it apart, and state its structure: the
    first to state a fact wins (the tensor as the step found it)."""
    no_storage = [7, 0, 0, 0, 0, ""]
    sparse = RawArg(no_storage, [1000, 16], "Tensor(float)", [0, 0])
    wrapper = RawArg([9, 0, 0, 0, 0, ""], [4, 4], "Tensor(float)", [0, 0])
    nodes = [
        _raw(1, "aten::add", [wrapper, wrapper], [wrapper]),
        _raw(2, "aten::_nnz", [sparse], [RawArg(269, [], "Int", None)]),
        _raw(3, "aten::_indices", [sparse],
             [RawArg([11, 5, 0, 269, 8, "cuda:0"], [1, 269], "Tensor(long int)", [269, 1])]),
        _raw(4, "aten::is_coalesced", [sparse], [RawArg(True, [], "Bool", None)]),
        _raw(5, "aten::_nnz", [sparse], [RawArg(300, [], "Int", None)]),  # a later tensor
    ]
    found = sparse_tensors(nodes)
    assert set(found) == {7}
    meta = found.at(7, 4).meta((1000, 16), "float32")
    assert meta.sparse == SparseLayout(sparse_dim=1, nnz=269, coalesced=True)
    assert meta.device == "cuda" and meta.extent == 269 * 16
    # Another count with nothing returning the id since: another tensor at the reused
    # address (autograd unpacking a saved sparse tensor), which node 5 reads.
    assert found.at(7, 5).nnz == 300 and found.at(7, 3).nnz == 269
    # Made by a constructor and never read: sparse in every dimension, nnz from indices.
    made = RawArg([8, 0, 0, 0, 0, ""], [30, 30], "Tensor(float)", [0, 0])
    indices = RawArg([12, 6, 0, 80, 8, "cpu"], [2, 40], "Tensor(long int)", [40, 1])
    built = sparse_tensors([_raw(6, "aten::_sparse_coo_tensor_with_dims_and_tensors",
                                 [RawArg(2, [], "Int", None), RawArg(0, [], "Int", None),
                                  RawArg([30, 30], [[], []], "GenericList[Int,Int]", None),
                                  indices], [made])])
    assert built.at(8, 6).meta((30, 30), "float32").sparse == SparseLayout(2, 40, False)


def test_a_saved_sparse_tensor_unpacked_at_a_reused_id_is_another_tensor():
    """Autograd unpacks a saved sparse tensor at a new address and no op returns it:
    the backward of ``sparse_coo_tensor(i, v).coalesce().values()`` read the original
    (24 entries) on the id of the freed coalesce result (17). Its own count, with
    nothing returning the id since the first was recorded, begins another tensor, from
    the outermost op that reads it (sparse_mask, whose child states the count)."""
    def sparse(tid: int) -> RawArg:
        return RawArg([tid, 0, 0, 0, 0, ""], [50, 8], "Tensor(float)", [0, 0])

    def count(node_id: int, tid: int, nnz: int, parent: int) -> RawNode:
        return RawNode(node_id, "aten::_nnz", parent, 1, None, "aten::_nnz(Tensor self) -> int",
                       [sparse(tid)], [RawArg(nnz, [], "Int", None)])

    mask = RawNode(3, "aten::sparse_mask", 100, 1, None,
                   "aten::sparse_mask(Tensor self, Tensor mask) -> Tensor",
                   [sparse(8), sparse(7)], [sparse(9)])
    found = sparse_tensors([count(1, 7, 17, 100), count(2, 8, 24, 100), mask,
                            count(4, 8, 24, 3), count(5, 7, 24, 3)])
    assert found.at(7, 1).nnz == 17
    assert found.at(7, 3).nnz == 24  # the mask sparse_mask reads
    # Where something returned the id in between (an in-place op on it), its count
    # may change: the same tensor, and the first count stands.
    add = RawNode(2, "aten::add_", 100, 1, None, "aten::add_(Tensor(a!) self, ...) -> "
                  "Tensor(a!)", [sparse(7), sparse(8)], [sparse(7)])
    kept = sparse_tensors([count(1, 7, 17, 100), add, count(5, 7, 24, 100)])
    assert kept.at(7, 5).nnz == 17


def test_a_sparse_tensor_id_returned_anew_is_another_tensor():
    """The observer keys tensor ids by address, which the allocator reuses, and a
    sparse tensor has no storage id: SparseAdam's coalesce returned its gradient's id
    again with 18 entries where the gradient had 24. An op that returns the id without
    reading it begins a new tensor; one enclosed by the op that made it does not."""
    def sparse(tid: int) -> RawArg:
        return RawArg([tid, 0, 0, 0, 0, ""], [50, 8], "Tensor(float)", [0, 0])

    def indices(nnz: int) -> RawArg:
        return RawArg([20 + nnz, 9, 0, nnz, 8, "cpu"], [1, nnz], "Tensor(long int)", [nnz, 1])

    def op(node_id: int, name: str, inputs: list[RawArg], outputs: list[RawArg],
           parent: int = 100) -> RawNode:  # 100: the thread's node
        return RawNode(node_id, name, parent, 1, None, f"{name}(...) -> ...", inputs, outputs)

    sizes = [RawArg(1, [], "Int", None), RawArg(1, [], "Int", None),
             RawArg([50, 8], [[], []], "GenericList[Int,Int]", None)]
    nodes = [
        op(1, "aten::embedding_backward", [], [sparse(54)]),
        op(2, "aten::_sparse_coo_tensor_with_dims_and_tensors", [*sizes, indices(24)],
           [sparse(54)], parent=1),
        op(3, "aten::_indices", [sparse(54)], [indices(24)]),
        op(4, "aten::clone", [sparse(54)], [sparse(71)]),
        op(5, "aten::coalesce", [sparse(71)], [sparse(54)]),  # the id again
        op(6, "aten::_indices", [sparse(54)], [indices(18)]),
    ]
    found = sparse_tensors(nodes)
    assert found.at(54, 3).nnz == 24 and found.at(54, 4).nnz == 24
    assert found.at(54, 6).nnz == 18


@pytest.mark.parametrize("kernel", ["", "triton"])
@pytest.mark.parametrize("graph", ["training", "inference"])
def test_compiled_regions_say_their_unrecorded_kernels_are_not_replayed(kernel, graph,
                                                                       tmp_path):
    """On CPU, the observer records a torch.compile'd region's extern calls (``mm``) but
    not Inductor's own C++ kernels: the header says so, once per region. A training
    graph runs in AOTAutograd's CompiledFunction inside Dynamo's region, an inference
    graph in the region alone. Triton kernels are recorded below it and listed on their
    own, so then the region adds nothing."""
    b = TraceBuilder()
    region = b.annotation("Torch-Compiled Region: 0/0")
    if graph == "training":
        region = b.annotation("CompiledFunction", parent=region)
    x = b.tensor((4, 4))
    b.op(RELU, [x], [b.tensor((4, 4))], parent=region)
    if kernel:
        b.op("", [], [], parent=region, name="triton_poi_fused_0",
             attrs={"kernel_backend": kernel})
    program = build_program(load_trace(b.write(tmp_path / "t.json")))
    assert [op.name for op in program.ops] == ["aten::relu"]
    listed = {d.name for d in program.diagnostics if "torch.compile's kernels" in d.reason}
    expected = "CompiledFunction" if graph == "training" else "Torch-Compiled Region: 0/0"
    assert listed == (set() if kernel else {expected})


def test_a_frame_compiled_inside_the_recorded_step_is_not_replayed(tmp_path):
    """A shape the warm-up did not see makes Dynamo compile in the recorded step,
    between the frame's cache lookup and its region: the compiler's tracing on fake
    tensors (sizes as ``<SymInt>``, which did not decode: generation failed) is not the
    step's work, and is listed once. A lookup that Dynamo answered by running the
    frame eagerly (no region after it) encloses nothing: those ops replay."""
    b = TraceBuilder()
    x = b.tensor((4, 4))
    lookup = b.annotation("TorchDynamo Cache Lookup")
    fake = b.op(EMPTY, [["<SymInt>", 4], None, None, Device("meta"), None, None],
                [b.tensor((0,), device="meta")])
    b.op(RELU, [b.tensor((4, 4), device="meta")], [b.tensor((4, 4), device="meta")],
         parent=fake)
    region = b.annotation("CompiledFunction",
                          parent=b.annotation("Torch-Compiled Region: 0/1"))
    b.op(RELU, [x], [b.tensor((4, 4))], parent=region)
    b.annotation("TorchDynamo Cache Lookup")  # the frame skipped: it runs eagerly
    b.op(RELU, [x], [b.tensor((4, 4))])
    program = build_program(load_trace(b.write(tmp_path / "t.json")))
    assert [op.name for op in program.ops] == ["aten::relu", "aten::relu"]
    assert [d.node_id for d in program.not_replayed
            if d.name == "Dynamo compiling a frame"] == [lookup]


def test_inductor_cpp_wrapper_calls_are_listed(tmp_path):
    """AOTInductor and cpp_wrapper call aten ops through the C shim, whose dispatch the
    observer does not record: only what the op calls inside (an addmm's bias copy),
    which replays. With kernel profiling each call and fused C++ kernel is a named
    node: each is listed (the header said none was missing: an AOTInductor model's
    GEMMs and attention went unmentioned)."""
    b = TraceBuilder()
    x = b.tensor((4, 4))
    b.annotation("graph_0_cpp_fused_native_layer_norm_0")
    shim = b.annotation("aoti_torch_cpu_addmm_out")
    b.op(RELU, [x], [b.tensor((4, 4))], parent=shim)
    b.op(RELU, [x], [b.tensor((4, 4))])
    program = build_program(load_trace(b.write(tmp_path / "t.json")))
    assert [op.name for op in program.ops] == ["aten::relu", "aten::relu"]
    assert {d.name for d in program.not_replayed} == {"Inductor C++ kernel",
                                                      "aoti_torch_cpu_addmm_out"}


def test_an_op_without_a_kernel_for_every_device_is_guarded():
    """The generating PyTorch's dispatcher tells which aten ops have no kernel for
    every device (SyncBatchNorm's, CUDA only); a trace's op is guarded by that, not
    only by name, and says whether it has a portable equivalent."""
    assert kernels.guard_reason("aten::relu.default") is None
    assert kernels.guard_reason("aten::add.Tensor") is None
    assert kernels.guard_reason("aten::batch_norm_stats.default") == (
        "kernels for some devices only, with a portable equivalent")
    assert kernels.guard_reason("aten::_spsolve.default") == "kernels for some devices only"
    assert kernels.guard_reason("aten::cudnn_batch_norm.default") == (
        "backend-specific kernel, with a portable equivalent")


def test_an_et_of_several_unmarked_steps_replays_one_optimizer_step(tmp_path):
    """An observer started and stopped by hand around three optimizer steps marks no
    ProfilerStep#N: the three replayed as one iteration, three steps long (an MLP's
    iteration read 1.5x its eager step). An iteration now runs from the end of one
    optimizer step to the end of the next, as ``mystique-gen capture`` cuts a step;
    the second by default (the first may begin before the observer did, or hold the
    optimizer's lazy initialisation), any with --iteration K, all with --iteration
    all, which says they replay as one."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(2, 4)

    def steps(count: int) -> None:
        for _ in range(count):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()

    def kept(trace, iteration: str) -> tuple[Counter, str]:
        program = build_program(trace, options=BuildOptions(iteration=iteration))
        notes = " ".join(" ".join(n.split()) for n in program.notes)
        return Counter(op.name for op in program.ops), notes

    steps(1)  # the optimizer's state is made in its first step
    one = load_trace(record_et(lambda: steps(1), tmp_path / "one.json"))
    step, notes = kept(one, "auto")
    assert step["aten::mm"] >= 1 and "marks no ProfilerStep" not in notes
    three = load_trace(record_et(lambda: steps(3), tmp_path / "three.json"))
    for iteration in ("auto", "1", "2", "3"):
        ops, notes = kept(three, iteration)
        assert ops == step, iteration  # forward, backward, the update: one step's
        assert "marks no ProfilerStep" not in notes
    everything, notes = kept(three, "all")
    assert everything == Counter({k: 3 * v for k, v in step.items()})
    assert "the trace holds 3 steps of each optimizer and marks no ProfilerStep#N" in notes
    with pytest.raises(OptionError, match="its optimizer steps make 3 iterations: 1 to 3"):
        kept(three, "4")


def test_a_captured_step_is_one_iteration_whatever_optimizer_steps_it_takes(tmp_path):
    """``mystique-gen capture`` records one call of the step function: a step function
    that steps its optimizer twice (two micro-steps a call) is one step, timed as one
    in its step.json, and is not cut into iterations; ``compare`` keeps it whole too."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)

    def two_updates() -> None:
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()

    result = capture(two_updates, tmp_path, name="two", kineto=False, timing_iters=1)
    program = compile_trace(result.et_path)
    assert program.filters == []
    assert Counter(op.name for op in program.ops)["aten::add_"] >= 2  # both updates
    assert op_multiset(result.et_path, iteration="auto") == op_multiset(result.et_path)
    cut = build_program(load_trace(result.et_path))  # the same trace, no step.json
    assert "iteration 2 of 2" in " ".join(cut.filters)


def test_unmarked_iterations_end_where_the_last_optimizer_of_a_cycle_steps(tmp_path):
    """A GAN's two Adams share the optimizer's name: told apart by the tensors they
    update, an iteration ends at the generator's step (the one that first steps
    last), each holding both updates; a critic's three steps per generator step are
    inside one iteration."""
    gen, disc = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    opt_g = torch.optim.Adam(gen.parameters())
    opt_d = torch.optim.Adam(disc.parameters())
    z = torch.randn(2, 4)

    def iterations(count: int, critic_steps: int) -> None:
        for _ in range(count):
            for _ in range(critic_steps):
                disc(gen(z).detach()).mean().backward()
                opt_d.step()
                opt_d.zero_grad()
            (-disc(gen(z)).mean()).backward()
            opt_g.step()
            opt_g.zero_grad()

    for critic_steps in (1, 3, 4):
        trace = load_trace(record_et(lambda c=critic_steps: iterations(3, c),
                                     tmp_path / f"gan{critic_steps}.json"))
        program = build_program(trace)
        filters = " ".join(" ".join(line.split()) for line in program.filters)
        assert (f"iteration 2 of 3, up to the end of every {critic_steps + 1} "
                "optimizer steps") in filters, filters
        updates = Counter(op.name for op in program.ops)["aten::addcdiv_"]
        single = load_trace(record_et(lambda c=critic_steps: iterations(1, c),
                                      tmp_path / f"one{critic_steps}.json"))
        one_iteration = build_program(single)
        assert updates == Counter(op.name for op in one_iteration.ops)[
            "aten::addcdiv_"] > 0
        # One iteration's steps are of two optimizers, not one's steps in a row
        # (helper probe: a Lightning GAN captured by mystique-gen capture was said to
        # hold "2 steps of optimizer Adam").
        assert not any("marks no ProfilerStep" in n for n in one_iteration.notes)
        assert one_iteration.filters == []  # four critic steps are not two iterations


def test_unmarked_steps_whose_ops_differ_replay_as_one_iteration(tmp_path):
    """Steps whose ops differ (a batch that changes the path the step takes) repeat no
    iteration to cut: they replay whole, and the header says why."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def steps() -> None:
        for k in range(3):
            out = model(torch.randn(2, 4))
            (out.relu() if k % 2 else out.tanh()).sum().backward()
            opt.step()
            opt.zero_grad()

    program = build_program(load_trace(record_et(steps, tmp_path / "differ.json")))
    assert program.filters == []
    notes = " ".join(" ".join(n.split()) for n in program.notes)
    assert "the trace holds 3 steps of each optimizer and marks no ProfilerStep#N" in notes
    assert "their ops differ from step to step" in notes


SDPA = ("aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, "
        "Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, "
        "float? scale=None, bool enable_gqa=False) -> Tensor")
FLASH_CPU = ("aten::_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, "
             "Tensor value, float dropout_p=0.0, bool is_causal=False, *, Tensor? "
             "attn_mask=None, float? scale=None) -> (Tensor output, Tensor logsumexp)")


CTC = ("aten::ctc_loss.IntList(Tensor log_probs, Tensor targets, int[] input_lengths, "
       "int[] target_lengths, int blank=0, int reduction=1, bool zero_infinity=False) "
       "-> Tensor")
MIOPEN_CTC = ("aten::miopen_ctc_loss(Tensor log_probs, Tensor targets, int[] input_lengths, "
              "int[] target_lengths, int blank, bool deterministic, bool zero_infinity) -> "
              "(Tensor, Tensor)")


@pytest.mark.parametrize("attention", [True, False])
def test_a_storage_allocated_inside_a_composite_is_not_an_earlier_tensor(attention):
    """A composite's kernel makes a result the backward reads (attention's logsumexp),
    on memory a freed tensor had (a rotary embedding's, in a Llama). Replayed whole,
    the backward read that embedding as its logsumexp: wrong values, and under --dtype
    float16 a half tensor where the kernel takes float32 only. Attention now replays
    as its kernel (the harness has its portable equivalent), whose result the backward
    reads; a composite that stays whole (MIOpen's CTC loss: no portable equivalent)
    still must not hand out the earlier tensor. A storage an op inside a replayed one
    allocated begins a new lifetime there: a later read is an input."""
    b = TraceBuilder()
    x = b.tensor((2, 4, 16))
    rope = b.tensor((2, 4, 16))
    b.op(RELU, [x], [rope])
    b.op(RELU, [rope], [b.tensor((2, 4, 16))])
    saved = b.tensor((2, 4, 16), storage=rope.storage_id)  # the freed rope's memory
    if attention:
        q, out = b.tensor((2, 4, 16, 8)), b.tensor((2, 4, 16, 8))
        whole = b.op(SDPA, [q, q, q, None, 0.0, True, None, False], [out])
        b.op(FLASH_CPU, [q, q, q, 0.0, True, None, None], [out, saved], parent=whole)
    else:
        probs, targets, loss = b.tensor((2, 4, 16)), b.tensor((4, 3), dtype="int64"), \
            b.tensor((4,))
        whole = b.op(CTC, [probs, targets, [2] * 4, [1] * 4, 0, 0, False], [loss])
        b.op(MIOPEN_CTC, [probs, targets, [2] * 4, [1] * 4, 0, True, False], [loss, saved],
             parent=whole)
    b.op(RELU, [saved], [b.tensor((2, 4, 16))])
    program = build_program(trace_from_document(b.doc(), name="t.json", sha256=""))
    reader = program.ops[-1]
    names = [o.name for o in program.ops]
    (arg,) = [tv for a in reader.args for tv in iter_tensors(a.value)]
    assert reader.name == "aten::relu"
    if attention:
        assert "aten::scaled_dot_product_attention" not in names
        assert arg.binding == OpOutput(len(program.ops) - 2, (1,)), arg.binding
    else:
        assert names.count("aten::ctc_loss") == 1
        assert isinstance(arg.binding, InputView), arg.binding


MATRIX_EXP = "aten::matrix_exp(Tensor self) -> Tensor"
LINALG_MATRIX_EXP = "aten::linalg_matrix_exp(Tensor self) -> Tensor"
ZEROS_OP = ("aten::zeros(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, "
            "Device? device=None, bool? pin_memory=None) -> Tensor")
ADD_TENSORS = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"


@pytest.mark.parametrize("read_as", ["wrapped 0-d", "the inner [1]"])
def test_a_wrapped_number_at_a_freed_inner_results_address_is_not_that_result(read_as):
    """The argument parser wraps a Python int for ``add(Tensor, Tensor)`` as a 0-d long
    tensor and records no op that allocates it: the allocator put it at the TensorImpl
    and data addresses that a [1] long of ``matrix_exp``'s decomposition had freed. The
    op was taken for one whose inner result a later op reads and replayed as its
    decomposition, whose degree buckets left NaN (an OpInfo gradient sample, in one
    capture of two). A read at those addresses with another number of dimensions is
    another tensor; one with the inner result's shape is still that result."""
    b = TraceBuilder()
    x, out = b.tensor((5, 5)), b.tensor((5, 5))
    inner = b.tensor((1,), dtype="int64")
    whole = b.op(MATRIX_EXP, [x], [out])
    b.op(ZEROS_OP, [[1], 4, None, None, None], [inner], parent=whole)
    b.op(LINALG_MATRIX_EXP, [x], [out], parent=whole)
    read = T(inner.tensor_id, inner.storage_id, () if read_as == "wrapped 0-d" else (1,),
             () if read_as == "wrapped 0-d" else (1,), dtype="int64")
    scalar = b.tensor(())
    b.op(ADD_TENSORS, [scalar, read, 1], [b.tensor(())])
    names = [sel.node.name for sel in select_ops(
        trace_from_document(b.doc(), name="t.json", sha256="")).ops]
    if read_as == "wrapped 0-d":
        assert names == ["aten::matrix_exp", "aten::add"]
    else:
        assert "aten::matrix_exp" not in names and "aten::linalg_matrix_exp" in names


@pytest.mark.parametrize("dtype,read_in", [("float64", "forward"), ("int64", "forward"),
                                           ("int64", "backward")])
def test_a_wrapped_number_at_a_freed_0d_inner_results_address(dtype, read_in):
    """A bool ``sum`` upcasts its input to a 0-d long inside (``to``), then frees it;
    a Python float wrapped for ``mul(Tensor, Tensor)`` (a 0-d double, the same size
    and rank, and no op records its allocation) took its TensorImpl and data
    addresses: the ``sum`` was replayed as its children in one capture of five (a
    transformers I-BERT training step). Of the same dtype too: Adam's ``step += 1``
    wraps a 0-d long, which took ``bincount``'s freed ``min`` (a GCN's step, in one
    capture of many). A saved result lives until the backward reads it, so a 0-d read
    at those addresses outside the backward is another tensor, whatever its dtype;
    the autograd engine's read of one is still that result."""
    b = TraceBuilder()
    x, out = b.tensor((5, 5)), b.tensor((5, 5))
    inner = b.tensor((), dtype="int64")
    whole = b.op(MATRIX_EXP, [x], [out])
    b.op(ZEROS_OP, [[], 4, None, None, None], [inner], parent=whole)
    b.op(LINALG_MATRIX_EXP, [x], [out], parent=whole)
    read = T(inner.tensor_id, inner.storage_id, (), (), dtype=dtype)
    parent = (b.annotation("autograd::engine::evaluate_function: MatrixExpBackward0")
              if read_in == "backward" else None)
    b.op(ADD_TENSORS, [b.tensor(()), read, 1], [b.tensor(())], parent=parent)
    names = [sel.node.name for sel in select_ops(
        trace_from_document(b.doc(), name="t.json", sha256="")).ops]
    if read_in == "forward":
        assert names == ["aten::matrix_exp", "aten::add"]
    else:
        assert "aten::matrix_exp" not in names and "aten::linalg_matrix_exp" in names


@pytest.mark.parametrize("made_node", [True, False])
def test_an_op_that_made_no_autograd_node_keeps_no_inner_result(made_node):
    """Only autograd keeps a composite's inner result past the op, and it keeps one
    only for an op that made an autograd node. A ``bincount`` on indices (its
    ``min``, ``max`` and ``zeros`` inside) made none, as the recorded sequence numbers
    show: a later read at its freed temporary's addresses is another tensor, and the
    op replays whole. A differentiable op's read result is still kept."""
    b = TraceBuilder()
    x, out = b.tensor((5, 5)), b.tensor((5, 5))
    inner = b.tensor((1,), dtype="int64")
    seq = 3 if made_node else 4  # the next op records 4: 3 was taken only if made
    whole = b.op(MATRIX_EXP, [x], [out], attrs={"seq_id": seq})
    b.op(ZEROS_OP, [[1], 4, None, None, None], [inner], parent=whole,
         attrs={"seq_id": -1})
    b.op(LINALG_MATRIX_EXP, [x], [out], parent=whole, attrs={"seq_id": -1})
    b.op(ADD_TENSORS, [b.tensor((1,)), inner, 1], [b.tensor((1,))], attrs={"seq_id": 4})
    b.op(RELU, [out], [b.tensor((5, 5))], attrs={"seq_id": 4})
    b.op(RELU, [out], [b.tensor((5, 5))], attrs={"seq_id": 5})
    sel = select_ops(trace_from_document(b.doc(), name="t.json", sha256=""))
    names = [s.node.name for s in sel.ops]
    assert ("aten::matrix_exp" in names) is not made_node
    assert ("aten::linalg_matrix_exp" in names) is made_node


def test_cudnn_ctc_loss_replays_as_its_children_whose_grad_the_backward_reads():
    """cuDNN's CTC loss computes the grad in its forward, which the backward only
    scales: with its portable equivalent (and _use_cudnn_ctc_loss's), a CUDA trace's
    ctc_loss replays as its children, so the backward reads the grad the replay
    computed, and the replay does the grad's work."""
    b = TraceBuilder()
    use = ("aten::_use_cudnn_ctc_loss(Tensor log_probs, Tensor targets, int[] input_lengths, "
           "int[] target_lengths, int blank) -> bool")
    cudnn = ("aten::_cudnn_ctc_loss(Tensor log_probs, Tensor targets, int[] input_lengths, "
             "int[] target_lengths, int blank, bool deterministic, bool zero_infinity) -> "
             "(Tensor, Tensor)")
    probs, targets = b.tensor((6, 2, 5)), b.tensor((6,), dtype="int32")
    loss, grad = b.tensor((2,)), b.tensor((6, 2, 5))
    whole = b.op(CTC, [probs, targets, [6, 6], [3, 3], 0, 0, False], [loss])
    b.op(use, [probs, targets, [6, 6], [3, 3], 0], [True], parent=whole)
    kernel = b.op(cudnn, [probs, targets, [6, 6], [3, 3], 0, True, False], [loss, grad],
                  parent=whole)
    backward = b.op(RELU, [grad], [b.tensor((6, 2, 5))])
    sel = select_ops(trace_from_document(b.doc(), name="t", sha256="0"))
    assert kernel in [s.node.id for s in sel.ops] and whole not in [s.node.id for s in sel.ops]
    assert [s.node.id for s in sel.ops][-1] == backward
