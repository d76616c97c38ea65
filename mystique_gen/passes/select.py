"""Operator selection: on every root-to-leaf path, the first node with an op schema.

Wrappers without a schema (``ProfilerStep#N``, ``## forward ##``,
``autograd::engine::evaluate_function: ...``, ``Optimizer.step#...``, user
annotations) are descended into; a node with a schema is replayed whole, so its
children (its implementation) are not. All host threads are kept, in node-id order,
which is the order in which the operators started.

One exception: an op whose dispatch reached a Python tensor subclass (DTensor,
AsyncCollectiveTensor; the observer records a ``PythonSubclass`` node below it) ran
on wrappers that hold no data, at their global shape; what the process really ran
is below it, on the plain tensors the subclass holds (a rank's local shard), and
that is what is replayed (:func:`subclass_dispatches`).

And one more: a communication backend's worker thread (gloo copies an all-gather's
result out of its buffer, divides a reduce-scatter's by the group size) records the
ops of a collective's implementation on a thread of its own. The replayed collective
runs them again on the replay's own backend threads, so they are not replayed
(:func:`backend_worker_threads`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Iterator, Set
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from mystique_gen import oprules
from mystique_gen.constants import in_backward
from mystique_gen.errors import TraceError
from mystique_gen.ir import Diagnostic, SparseLayout, TensorMeta, not_replayed
from mystique_gen.ir.schema import ArgSpec, SchemaError, is_op_name, parse_signature
from mystique_gen.passes import kernels
from mystique_gen.sources.et import (
    RawArg,
    RawNode,
    RawTrace,
    raw_storage_ids,
    tensor_records,
    tensor_records_with_ranks,
)

ROOT_PREFIXES = ("[pytorch|profiler|execution_trace|", "[pytorch|profiler|execution_graph|")
SUBCLASS_DISPATCH = "PythonSubclass"  # the observer's node for __torch_dispatch__
FOREIGN_NOTE = ("its namespace is not loaded by the benchmark (torch alone): replayed as "
                "its recorded children")
NEWER_NOTE = "not an operator of this PyTorch (a newer one's): replayed as its recorded children"
BACKEND_THREAD_NOTE = ("a communication backend's worker thread ran it for a collective; "
                       "the replayed collective runs it again")
# AOTAutograd's autograd.Function around a torch.compile'd graph, forward and backward.
COMPILED_FUNCTIONS = frozenset({"CompiledFunction", "CompiledFunctionBackward"})
# Dynamo's annotation around a compiled frame; an inference graph runs in it with no
# CompiledFunction (no autograd) around its kernels.
COMPILED_REGION = "Torch-Compiled Region"
COMPILED_NOTE = ("torch.compile's kernels, not in the trace (the torch ops it called "
                 "replay); --kineto with --host-gaps recorded replays their time")
# Dynamo's annotation of each call of a compiled frame, before its region; where the
# lookup misses, Dynamo compiles the frame between the two.
CACHE_LOOKUP = "TorchDynamo Cache Lookup"
COMPILING = "Dynamo compiling a frame"
COMPILING_NOTE = ("the recorded step compiled a frame (a first call or a recompile): "
                  "tracing on fake tensors, not the step's work")

# What Inductor's C++ wrapper (cpp_wrapper, AOTInductor) records where its kernels are
# profiled (TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1): each fused C++ kernel, and each
# aten op it calls through the C shim (aoti_torch_cpu_addmm_out), whose dispatch the
# observer does not record (no arguments, no schema), only the ops it calls inside (an
# addmm's bias copy, attention's transposes), which replay as a compiled region's do.
# Without the profile even those names are missing (README, Known limits).
INDUCTOR_CPP_CALL = re.compile(r"(graph_\d+_)?cpp_fused_|aoti_torch_[a-z]+_")
INDUCTOR_CPP_NOTE = ("Inductor's C++ wrapper called it (cpp_wrapper, AOTInductor): no "
                     "arguments recorded (the torch ops it called inside replay); --kineto "
                     "with --host-gaps recorded replays its time")

# (tensor, storage, element size, dims, dtype)
TensorKey = tuple[int, int, int, int | None, str | None]
# Each tensor's dtype in a recorded argument's type ("Tensor(float)", a list's
# "GenericList[Tensor(float),Tensor(long int)]"), in order.
_TENSOR_DTYPE = re.compile(r"Tensor\(([^)]*)\)")


# A value domain of one tensor: ("positive" | "range", low, high, why).
Domain = tuple[str, float, float, str]


def recorded_domains(nodes: Iterable[RawNode],
                     suffix: str = "") -> dict[tuple[int, int], Domain]:
    """The value domains (``oprules.POSITIVE_ARGS``, ``FLOAT_RANGES``) that the rules of
    ``nodes`` put on the tensors they read, by (trace id, storage id); the first node
    to name a tensor wins. ``suffix`` ends each reason."""
    wanted: dict[tuple[int, int], Domain] = {}
    for node in nodes:
        positive = oprules.POSITIVE_ARGS.get(node.name, ())
        ranges = oprules.FLOAT_RANGES.get(node.name, {})
        if not (positive or ranges) or not node.op_schema:
            continue
        try:
            names = [spec.name for spec in parse_signature(node.op_schema).args]
        except SchemaError:
            continue
        scalars = {name: raw.value for name, raw in zip(names, node.inputs, strict=False)
                   if type(raw.value) is int}
        for name, raw in zip(names, node.inputs, strict=False):  # trailing defaults
            value = raw.value
            if not (isinstance(value, list) and len(value) >= 2
                    and all(type(v) is int for v in value[:2])):
                continue
            why = f"{node.name} {name}{suffix}"
            bounds = oprules.float_range(ranges[name], scalars) if name in ranges else None
            if bounds is not None:
                wanted.setdefault((value[0], value[1]), ("range", *bounds, why))
            elif name in positive:
                low, high = oprules.POSITIVE_FLOATING[1:]
                wanted.setdefault((value[0], value[1]), ("positive", low, high, why))
    return wanted


@dataclass(frozen=True)
class Selected:
    node: RawNode
    scope: tuple[str, ...]  # enclosing annotation names, outermost first
    # Arguments that required grad, as a recorded child showed (oprules.GRAD_REVEALED_BY).
    requires_grad_args: tuple[str, ...] = ()
    # Whether the op (or an op inside it) created an autograd node: None where the trace
    # records no seq_ids (:func:`grad_node_makers`).
    made_grad_node: bool | None = None
    # The composite ops it ran inside, innermost first, that are replayed as their
    # children (:func:`escaping_composites`): their arguments' domains hold for the
    # same tensors it reads (passes/lower.py ``inherited_domains``).
    composites: tuple[RawNode, ...] = ()
    # What its recorded children show about its inputs' values (oprules.KERNEL_PATHS).
    kernel_path: tuple | None = None
    # The value domains its recorded children's rules put on the tensors it reads
    # itself ((trace id, storage id), (kind, low, high, why)): an alias or wrapper
    # (``true_divide``, ``special_logit``) calls the op the rule names with the same
    # tensors (:func:`recorded_domains`).
    child_domains: tuple[tuple[tuple[int, int], Domain], ...] = ()


@dataclass
class Selection:
    ops: list[Selected]
    not_replayed: list[Diagnostic]
    threads: list[int]
    covered: list[RawNode] = field(default_factory=list)  # nodes inside selected ops
    step: int | None = None  # the N of the ProfilerStep#N the filters kept, if one


def is_root(node: RawNode) -> bool:
    return node.name.startswith(ROOT_PREFIXES)


def thread_roots(trace: RawTrace) -> dict[int, int]:
    """Each host thread's root node (the observer's ``[...|thread]``): tid -> node id."""
    return {n.tid: n.id for n in trace.nodes
            if is_root(n) and "thread" in n.name and n.parent != n.id}


def children_of(trace: RawTrace) -> dict[int, list[RawNode]]:
    """Each node's children, in node order, as the parent links stand now."""
    children: dict[int, list[RawNode]] = {}
    for node in trace.nodes:
        if node.parent != node.id:
            children.setdefault(node.parent, []).append(node)
    return children


def _below(node_id: int, children: dict[int, list[RawNode]]) -> Iterator[RawNode]:
    """Every node under ``node_id`` (its implementation), in no particular order."""
    stack = list(children.get(node_id, []))
    while stack:
        node = stack.pop()
        stack.extend(children.get(node.id, []))
        yield node


def repair_async_nesting(trace: RawTrace) -> None:
    """Give back to their real parent the ops an async collective's scope swallowed.

    A collective's record-function scope (``gloo:all_reduce``) opens on the issuing
    thread and closes on the backend's, so the observer's stack keeps it, or the
    collective itself, open: later ops of the step are then recorded inside it. What a
    communication op really contains: whatever runs before its own c10d call (a
    functional collective copies its input first) and that call; a c10d op runs no
    other collective.
    From the first child that is not its own, the children belong to its parent.
    In place, once per trace (:func:`_repair_stale_scopes` would shift twice)."""
    if trace.nesting_repaired:
        return
    trace.nesting_repaired = True
    by_id = {n.id: n for n in trace.nodes}
    if restore_nesting(trace, by_id):  # every parent is right: what follows has nothing to undo
        _adopt_completion_work(trace, by_id)
        return
    _repair_stale_scopes(trace, by_id)
    children = children_of(trace)
    for node in trace.nodes:
        namespace = node.name.partition("::")[0]
        if not node.op_schema or namespace not in oprules.COMMUNICATION_NAMESPACES:
            continue
        outer = node.parent
        while outer in by_id and by_id[outer].name.partition("::")[0] in \
                oprules.COMMUNICATION_NAMESPACES and by_id[outer].parent != outer:
            outer = by_id[outer].parent  # out of every enclosing collective
        _lift_foreign(node, outer, children, namespace != "c10d")
        for kid in children.get(node.id, []):
            if oprules.ASYNC_SCOPE.match(kid.name):  # the backend's async work scope:
                # it runs no op; what the observer put inside it, or after it inside
                # the collective, came later on the issuing thread.
                for inner in children.get(kid.id, []):
                    if inner.op_schema:
                        inner.parent = outer
                kids = children.get(node.id, [])
                for later in kids[kids.index(kid) + 1:]:
                    later.parent = outer
                break
    _adopt_completion_work(trace, by_id)


def restore_nesting(trace: RawTrace, by_id: dict[int, RawNode]) -> bool:
    """Rebuild every node's parent from when it started and when it ended; returns
    whether the trace allowed it.

    The observer numbers a node when it starts and writes it when it ends, so on one
    host thread, where ops nest properly, a node lies inside every earlier-numbered
    node written after it, and its parent is the innermost of those. The parents it
    records are only as good as its stack, which a backend's async scope
    (``gloo:all_reduce``: opened on this thread, closed on the backend's) shifts, so
    that ops of the step are recorded one level too deep or too shallow, differently
    run to run (FSDP2's ``_foreach_copy_`` once came out of its copy-in op and was
    replayed twice). An async scope is no one's parent: it belongs to the innermost op
    open when it started and still open at the next node.

    Only a file in the observer's order tells when nodes ended
    (:func:`_written_in_end_order`); another tool's rewrite (nodes sorted by id) keeps
    its recorded parents, and the repairs below make what they can of them."""
    if not _written_in_end_order(trace, by_id):
        return False
    roots = thread_roots(trace)
    by_thread: dict[int, list[RawNode]] = {}
    for node in trace.nodes:  # id order: the order they started
        if not is_root(node):
            by_thread.setdefault(node.tid, []).append(node)
    if any(tid not in roots for tid in by_thread):
        return False  # a thread without its root node: not the observer's layout
    for tid, nodes in by_thread.items():
        open_ops: list[RawNode] = []
        scopes: list[RawNode] = []  # async scopes started since the last node
        for node in nodes:
            if oprules.ASYNC_SCOPE.match(node.name):
                scopes.append(node)
                continue
            while open_ops and open_ops[-1].written < node.written:
                open_ops.pop()  # ended before this one did, so before it started
            parent = open_ops[-1].id if open_ops else roots[tid]
            for scope in scopes:
                scope.parent = parent
            scopes.clear()
            node.parent = parent
            open_ops.append(node)
        for scope in scopes:
            scope.parent = open_ops[-1].id if open_ops else roots[tid]
    return True


def _written_in_end_order(trace: RawTrace, by_id: dict[int, RawNode]) -> bool:
    """Whether the file lists nodes as the observer ends them: of the recorded
    parent-child pairs on one thread (below its root), most have the child written
    first, and of consecutive siblings (top-level ops too), most are written in the
    order they started. A file sorted by id has no child first, a reversed one no
    sibling in order; a shifted stack leaves a few of each."""
    pairs = children_first = siblings = in_order = 0
    last_child: dict[int, RawNode] = {}
    for node in trace.nodes:
        parent = by_id.get(node.parent)
        if node.written < 0 or parent is None or parent is node or is_root(node):
            continue
        if not is_root(parent) and parent.tid == node.tid:  # roots are written first
            pairs += 1
            children_first += node.written < parent.written
        before = last_child.get(parent.id)
        if before is not None:
            siblings += 1
            in_order += before.written < node.written
        last_child[parent.id] = node
    return (pairs > 0 and children_first * 2 > pairs
            and (siblings == 0 or in_order * 2 > siblings))


def _repair_stale_scopes(trace: RawTrace, by_id: dict[int, RawNode]) -> None:
    """Undo the shift a backend's async scope leaves in the observer's stack where it
    opened inside an ordinary op.

    A ``gloo:all_reduce`` scope (an earlier async collective's work) can open on the
    issuing thread inside any op and close on the backend's thread; each later end on
    the issuing thread then pops the entry above its own, so the op it opened in, and
    that op's ancestors in turn, stay open one op too long. Every node recorded after
    the scope with one of them as its parent really belongs one level up (FSDP2's
    ``_foreach_copy_`` under ``split_with_sizes``, its all-gather under
    ``all_gather_copy_in``: one rank hid a collective its peers replayed, and the
    replay deadlocked). Ops recorded inside the scope belong to the op it opened in.
    The shift ends where a node is recorded at the thread's top level again. The op
    the scope names as its parent may have started after the scope did (DDP's
    bucket views after a comm hook's all-reduce: every later op of the step sat
    inside the first ``as_strided``); it is stale too, not the end of the shift."""
    for scope in trace.nodes:
        opened_in = by_id.get(scope.parent)
        if (not oprules.ASYNC_SCOPE.match(scope.name) or opened_in is None
                or not opened_in.op_schema
                or opened_in.name.partition("::")[0] in oprules.COMMUNICATION_NAMESPACES):
            continue
        stale: set[int] = set()
        cur: RawNode | None = opened_in
        while cur is not None and cur.parent != cur.id and not is_root(cur):
            stale.add(cur.id)
            cur = by_id.get(cur.parent)
        for node in trace.nodes:
            if node.id <= scope.id or node.tid != scope.tid or node.id in stale:
                continue
            if node.parent == scope.id:
                node.parent = opened_in.id
            elif node.parent in stale:
                node.parent = by_id[node.parent].parent
            elif node.parent in by_id and is_root(by_id[node.parent]):
                break  # back at the top level: the stack is whole again


def _adopt_completion_work(trace: RawTrace, by_id: dict[int, RawNode]) -> None:
    """Give back to a c10d collective the ops its completion ran on the issuing thread.

    A backend may finish a collective on the thread that waits for it (gloo's
    reduce-scatter reduces a private clone of its input, then chunks it and copies
    the rank's part into the output). Those ops read a buffer the collective made and
    never returned, which no program code can reach: they are its implementation,
    and the replayed collective runs them again. They are recorded after the
    collective's own node or after its async scope, or where an async collective's
    ``wait()`` ran, after program ops and other collectives issued meanwhile (up to an
    op that allocates at the buffer's address: it was freed), or,
    for a functional collective, inside the wait_tensor that waits for its result
    (:func:`_completion_in_wait`)."""
    children = children_of(trace)
    waits = _functional_waits(trace)
    for k, node in enumerate(trace.nodes):
        if node.name.partition("::")[0] != "c10d" or not is_collective(node):
            continue
        own = {sid for arg in (*node.inputs, *node.outputs) for sid in raw_storage_ids(arg)}
        rule = oprules.COMM_OPS.get(node.name)
        if rule is not None and not rule.tensors:
            _adopt_front_end_tensor(trace.nodes, k, own)
        private = {t for inner in _below(node.id, children) for t in _made(inner, own)}
        if not private:
            continue
        # Its parent, every op enclosing that (an async collective issued in a hook,
        # inside autograd's AccumulateGrad, is waited after backward, at the step's
        # top level: its completion was replayed as program ops), and async scopes
        # opened after it at any of those levels.
        levels = {node.parent}
        outer = by_id.get(node.parent)
        while outer is not None and outer.parent != outer.id and not is_root(outer):
            levels.add(outer.parent)
            outer = by_id.get(outer.parent)
        run: list[RawNode] = []
        reached, skipped = set(private), False
        for j in range(k + 1, len(trace.nodes)):  # (no slice: a copy per collective)
            later = trace.nodes[j]
            if later.tid != node.tid or later.parent not in levels:
                continue  # another thread's, or inside an op already seen
            if oprules.ASYNC_SCOPE.match(later.name):
                levels.add(later.id)
                continue
            if is_collective(later):
                # A collective completes none of its peers, but two may be in flight:
                # gloo finished the first of two async reduce-scatters after the
                # second began (its chunk and copy were replayed as program ops).
                skipped = True
                continue
            if not _reads(later, reached):
                if run or {t[1] for t in reached} & _allocated(later, children):
                    break  # its completion ran, or the buffer is gone
                skipped = True  # program work between an async collective and its wait
                continue
            run.append(later)
            reached.update(_made(later, own))
        # Past program work, only a run that finishes into the collective's own tensors
        # is its completion (not a program op at an address the buffer had).
        if run and (not skipped or any(_reads_storage(op, own) for op in run)):
            for op in run:
                op.parent = node.id
            private = reached
        issuer = by_id.get(node.parent)
        if issuer is None or issuer.name.partition("::")[0] \
                not in oprules.FUNCTIONAL_NAMESPACES:
            continue  # only a functional collective's result is waited for by an op
        ranked = waits.get(node.tid, [])
        for w in ranked[bisect.bisect_right(ranked, k):]:
            if any(sid in own for arg in trace.nodes[w].inputs
                   for sid in raw_storage_ids(arg)):
                _completion_in_wait(trace.nodes, w, node, private, own)
                break


def _functional_waits(trace: RawTrace) -> dict[int, list[int]]:
    """Positions in ``trace.nodes`` of the functional wait_tensor ops, per thread."""
    found: dict[int, list[int]] = {}
    for k, node in enumerate(trace.nodes):
        namespace, _, name = node.name.partition("::")
        if name == "wait_tensor" and namespace in oprules.FUNCTIONAL_NAMESPACES:
            found.setdefault(node.tid, []).append(k)
    return found


def _completion_in_wait(nodes: list[RawNode], wait: int, collective: RawNode,
                        private: set[TensorRecord], own: set[int]) -> None:
    """Adopt the ops that finish ``collective`` inside its wait (at position ``wait``):
    they start right after the wait does, each reading the collective's private
    buffers. The observer's stack is shifted by the backend's scope there, so their
    recorded parent is any level; the first other op on the thread ends them."""
    adopted: set[int] = set()
    for j in range(wait + 1, len(nodes)):
        later = nodes[j]
        if later.tid != collective.tid:
            continue
        if later.parent in adopted:
            adopted.add(later.id)  # inside an adopted op: its own implementation
            continue
        if oprules.ASYNC_SCOPE.match(later.name):
            continue
        if not later.op_schema or not _reads(later, private):
            return
        later.parent = collective.id
        adopted.add(later.id)
        private.update(_made(later, own))


# One recorded tensor whole: (tensor id, storage id, offset, numel, itemsize, device).
# A collective's private buffers are followed as these, not as storage ids: once one is
# freed, the program's next tensor at its address (a wrapped Python scalar, which no
# op records) has its storage id but not its size or tensor id.
TensorRecord = tuple[object, ...]


def _records(args: list[RawArg]) -> set[TensorRecord]:
    return {tuple(record[:6]) for arg in args for record in tensor_records(arg)}


def _reads(node: RawNode, tensors: set[TensorRecord]) -> bool:
    return bool(node.op_schema) and not _records(node.inputs).isdisjoint(tensors)


def _reads_storage(node: RawNode, storages: set[int]) -> bool:
    return bool(node.op_schema) and any(
        sid in storages for arg in node.inputs for sid in raw_storage_ids(arg))


def _made(node: RawNode, own: set[int]) -> set[TensorRecord]:
    """The tensors an op returned that are not on the collective's own storages."""
    return {t for t in _records(node.outputs) if t[1] not in own}


def _allocated(node: RawNode, children: dict[int, list[RawNode]]) -> set[int]:
    """The storages ``node`` and every op below it returned: an allocation at any depth
    (mul's ``_to_copy`` of a wrapped scalar) at a private buffer's address means the
    buffer was freed, and later readers of that address read the program's tensor."""
    found = {t[1] for t in _records(node.outputs)}
    for inner in _below(node.id, children):
        found |= {t[1] for t in _records(inner.outputs)}
    return found


def _adopt_front_end_tensor(nodes: list[RawNode], k: int, own: set[int]) -> None:
    """A collective whose call takes no tensor (``barrier``, ``monitored_barrier``) gets
    one from the process group's front end, made just before its c10d op (an
    ``aten::empty`` of no elements); the replayed call makes its own, so the op that
    made it belongs to the collective."""
    node = nodes[k]
    for j in range(k - 1, -1, -1):
        before = nodes[j]
        if before.tid != node.tid or before.parent != node.parent:
            continue
        made = {sid for arg in before.outputs for sid in raw_storage_ids(arg)}
        reads = {sid for arg in before.inputs for sid in raw_storage_ids(arg)}
        if before.op_schema and made and made <= own and not reads:
            before.parent = node.id
        return


def _lift_foreign(node: RawNode, to: int, children: dict[int, list[RawNode]],
                  functional: bool) -> None:
    """Re-parent to ``to`` the children of ``node`` from the first one not its own."""
    called = False
    kids = children.get(node.id, [])
    for k, kid in enumerate(kids):
        if not kid.op_schema:
            # A wrapper (the autograd kernel's GeneratedBackwardFor... scope, when an
            # input requires grad) may hold the functional collective's c10d call.
            called = called or (functional and _holds_c10d(kid, children))
            continue
        namespace, _, name = kid.name.partition("::")
        if functional:  # owns what precedes its c10d call and the call. The rest is
            # the program's: _wrap_tensor_autograd is a Python op that funcol calls on
            # the result, and a wait_tensor after the call is the program's later wait
            # (an AsyncCollectiveTensor's, whose PythonSubclass dispatch must not pass
            # for the collective's own).
            foreign = called
            called = called or namespace == "c10d"
        else:  # a c10d op (or a scope inside one) runs no other collective
            foreign = (namespace in oprules.COMMUNICATION_NAMESPACES
                       and name not in oprules.COLLECTIVE_HELPERS)
        if foreign:
            for lifted in kids[k:]:
                lifted.parent = to
            return


def _holds_c10d(wrapper: RawNode, children: dict[int, list[RawNode]]) -> bool:
    """Whether a c10d op runs inside ``wrapper``, through wrappers only."""
    stack = list(children.get(wrapper.id, []))
    while stack:
        node = stack.pop()
        if node.op_schema:
            if node.name.partition("::")[0] == "c10d":
                return True
        else:
            stack.extend(children.get(node.id, []))
    return False


def subclass_dispatches(trace: RawTrace) -> set[int]:
    """Node ids of the ops with a schema whose dispatch reached a Python tensor subclass:
    every one above a ``PythonSubclass`` node (``aten::view_as`` on a DTensor calls
    ``aten::view``, which DTensor dispatches). Their arguments are wrappers without data
    (every one on the null pointer's storage id) at the global shape; the ops below
    ran on the local tensors. The selection descends into them.

    The same holds for an op on functorch's batched tensors (``vmap``, which
    transformers builds attention masks with): the observer records it on a wrapper
    with no storage (device ""), once per vmap level, each level calling the op on
    the level below, down to the one on real tensors."""
    if trace.subclass_dispatched is not None:
        return trace.subclass_dispatched
    repair_async_nesting(trace)  # (once: the nesting every selection reads)
    by_id = {n.id: n for n in trace.nodes}
    found: set[int] = set()
    walked: set[int] = set()
    # A vmap level calls the op (or its batching rule's ops) on the level below; an op
    # below which only its outputs were allocated ran its own kernel, on tensors the
    # observer records without storage for another reason (oneDNN's prepacked MKLDNN
    # weights, read by an op MKLDNN_OPS does not list, replayed as that allocation).
    has_op_child = {n.parent for n in trace.nodes if n.op_schema and n.parent != n.id
                    and n.name not in oprules.UNINITIALISED_OUTPUTS}
    sparse = trace_sparse_tensors(trace)  # without storage too, but no wrappers
    for node in trace.nodes:
        if node.op_schema and node.id in has_op_child and _on_storageless(node, sparse):
            found.add(node.id)  # a vmap level: the op below ran one level down
        if node.name != SUBCLASS_DISPATCH:
            continue
        cur = by_id.get(node.parent) if node.parent != node.id else None
        while cur is not None and cur.id not in walked:
            walked.add(cur.id)
            if cur.op_schema:
                found.add(cur.id)
            cur = by_id.get(cur.parent) if cur.parent != cur.id else None
    trace.subclass_dispatched = found
    return found


# What autocast casts an argument with before it dispatches the op again.
AUTOCAST_CASTS = frozenset({"aten::to", "aten::_to_copy"})


def _tensor_dtypes(args: list[RawArg]) -> list[str]:
    return [arg.type for arg in args if arg.type.startswith("Tensor(")]


def autocast_dispatches(trace: RawTrace, children: dict[int, list[RawNode]]) -> set[int]:
    """Node ids of the ops that ``torch.autocast`` dispatched again: it casts the
    arguments (``aten::to`` children: to bfloat16 for a matmul or a convolution, to
    float32 for a softmax or a loss) and calls the same op on the casts (a child of
    the same name whose tensor arguments have other dtypes). The op's recorded
    arguments are the uncast ones: replayed whole, without the autocast context the
    step ran in, it would run its kernel in the uncast dtype (a float32 GEMM for a
    bfloat16 one) and hand every op after it tensors of another dtype. The selection
    descends into them: the casts and the op on the cast tensors, what the step ran."""
    found: set[int] = set()
    for node in trace.nodes:
        if not node.op_schema or node.name in AUTOCAST_CASTS:
            continue
        kids = _op_children(node.id, children)
        if not any(k.name in AUTOCAST_CASTS for k in kids):
            continue
        own = _tensor_dtypes(node.inputs)
        if any(k.name == node.name and k.op_schema == node.op_schema
               and _tensor_dtypes(k.inputs) != own for k in kids):
            found.add(node.id)
    return found


def _on_storageless(node: RawNode, sparse: SparseTensors) -> bool:
    """Whether a tensor argument of the node has no storage (recorded device "") and is
    no sparse or MKLDNN tensor. An undefined tensor (an optional weight left out) is recorded the
    same way; only its type tells it apart ("Tensor(nullptr (uninitialized))")."""
    return any(record[5] == "" and record[0] not in sparse and record[0] not in sparse.mkldnn
               for arg in (*node.inputs, *node.outputs)
               if "nullptr" not in arg.type for record in tensor_records(arg))


@dataclass
class SparseTensor:
    """What the trace says of one sparse COO tensor id (:func:`sparse_tensors`); facts
    not recorded take the most common case: sparse in every dimension, uncoalesced."""

    sparse_dim: int | None = None
    nnz: int | None = None
    coalesced: bool | None = None
    device: str | None = None
    learned: bool = False  # a sparse op read or made it
    nnz_node: int | None = None  # the node that stated nnz

    def meta(self, shape: tuple[int, ...], dtype: str) -> TensorMeta:
        sparse_dim = len(shape) if self.sparse_dim is None else min(self.sparse_dim, len(shape))
        layout = SparseLayout(sparse_dim, self.nnz, bool(self.coalesced))
        return TensorMeta(shape=shape, strides=(0,) * len(shape), offset=0, dtype=dtype,
                          device=self.device or "cpu", sparse=layout)

    def learn(self, what: str, node: RawNode) -> None:
        """Take the facts of one op that read this tensor's parts or made it
        (oprules.SPARSE_FACTS); the first op to state a fact wins: it saw the tensor as
        the trace began."""
        self.learned = True
        out = node.outputs[0] if node.outputs else None
        value = out.value if out is not None else None
        nnz = _stated_nnz(what, node)
        if self.nnz is None and nnz is not None:
            self.nnz, self.nnz_node = nnz, node.id
        if what == "made":
            if len(node.inputs) > 3 and type(node.inputs[0].value) is int \
                    and self.sparse_dim is None:
                self.sparse_dim = node.inputs[0].value
        elif what == "sparse_dim" and type(value) is int and self.sparse_dim is None:
            self.sparse_dim = value
        elif what == "coalesced" and isinstance(value, bool) and self.coalesced is None:
            self.coalesced = value
        elif what in ("indices", "values") and out is not None:
            shape = out.shape if isinstance(out.shape, list) else []
            records = list(tensor_records(out))
            if records and self.device is None and records[0][5]:
                self.device = records[0][5].split(":", 1)[0]
            if what == "indices" and len(shape) == 2 and all(type(n) is int for n in shape):
                self.sparse_dim = shape[0] if self.sparse_dim is None else self.sparse_dim


class SparseTensors:
    """The trace's sparse COO tensors: per tensor id, one :class:`SparseTensor` per
    lifetime. The observer keys tensor ids by TensorImpl address, which the allocator
    reuses, and a sparse tensor has no storage id to tell two apart: SparseAdam's
    coalesce returned its gradient's id again, with 18 entries where the gradient had
    24. A lifetime begins at an op that returns the id without reading it, unless an
    op that began the current one encloses it (a constructor's own constructor)."""

    def __init__(self) -> None:
        # tensor id -> [(node id that began the lifetime, its facts)], in start order
        self._lives: dict[int, list[tuple[int, SparseTensor]]] = {}
        self._sparse: set[int] = set()  # ids some sparse op read or made
        # Ids of MKLDNN tensors, the other layout without storage (:func:`mkldnn_tensors`).
        self.mkldnn: frozenset[int] = frozenset()

    def __contains__(self, tid: object) -> bool:
        return tid in self._sparse

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._sparse))

    def __len__(self) -> int:
        return len(self._sparse)

    def at(self, tid: int, node_id: int) -> SparseTensor | None:
        """Tensor ``tid`` as node ``node_id`` saw it; None where it is no sparse
        tensor (a vmap wrapper) there."""
        lives = self._lives.get(tid) if tid in self._sparse else None
        if not lives:
            return None
        k = bisect.bisect_right([start for start, _ in lives], node_id) - 1
        found = lives[max(k, 0)][1]  # before every start: a tensor from before the trace
        return found if found.learned else None

    def _current(self, tid: int) -> tuple[int, SparseTensor] | None:
        lives = self._lives.get(tid)
        return lives[-1] if lives else None

    def _begin(self, tid: int, node_id: int) -> None:
        self._lives.setdefault(tid, []).append((node_id, SparseTensor()))

    def _learn(self, tid: int, what: str, node: RawNode) -> None:
        if self._current(tid) is None:
            self._begin(tid, -1)
        self._lives[tid][-1][1].learn(what, node)
        self._sparse.add(tid)


def _stated_nnz(what: str, node: RawNode) -> int | None:
    """The number of entries one fact-stating op (oprules.SPARSE_FACTS) records of the
    sparse tensor it reads or makes, where it records one: ``_nnz``'s result, the
    entries of ``_values``, or those of indices ``[sparse_dim, nnz]`` (``_indices``,
    or _sparse_coo_tensor_with_dims_and_tensors(sparse_dim, dense_dim, size, indices,
    values), where every constructor ends)."""
    if what == "nnz":
        value = node.outputs[0].value if node.outputs else None
        return value if type(value) is int else None
    if what == "made" and len(node.inputs) > 3 and type(node.inputs[0].value) is int:
        shape, index = node.inputs[3].shape, 1
    elif what in ("indices", "values") and node.outputs:
        shape, index = node.outputs[0].shape, (1 if what == "indices" else 0)
    else:
        return None
    if not isinstance(shape, list) or (len(shape) != 2 if index else not shape):
        return None  # indices are [sparse_dim, nnz]; values [nnz, ...]
    if what == "indices" and not all(type(n) is int for n in shape):
        return None
    return shape[index] if type(shape[index]) is int else None


def _storageless_ids(args: list[RawArg]) -> set[int]:
    return {r[0] for arg in args for r in tensor_records(arg)
            if r[5] == "" and isinstance(r[0], int) and not isinstance(r[0], bool)}


def trace_sparse_tensors(trace: RawTrace) -> SparseTensors:
    """:func:`sparse_tensors` of a whole trace, found once (while every node still has
    its arguments: the first selection finds it)."""
    if not isinstance(trace.storageless, SparseTensors):
        trace.storageless = sparse_tensors(trace.nodes)
    return trace.storageless


def sparse_tensors(nodes: list[RawNode]) -> SparseTensors:
    """Tensor ids of the trace's sparse COO tensors, with their recorded structure.

    A sparse tensor has no storage, so the observer records it as it records a vmap
    wrapper: ``[id, 0, 0, 0, 0, ""]``. What tells them apart is the ops around it
    (oprules.SPARSE_FACTS): a sparse kernel reads the tensor's parts (``_nnz``,
    ``_indices``), and a constructor made it. Their results give its structure, per
    lifetime of the id (:class:`SparseTensors`)."""
    found = SparseTensors()
    parent = {n.id: n.parent for n in nodes}
    by_id = {n.id: n for n in nodes}
    # Each node's storageless reads, found only where asked: most traces have no
    # tensor without storage, and a set per node cost a tenth of loading a trace.
    read_sets: dict[int, set[int]] = {}

    def reads(node_id: int) -> set[int]:
        found_ids = read_sets.get(node_id)
        if found_ids is None:
            node = by_id.get(node_id)
            found_ids = read_sets[node_id] = \
                _storageless_ids(node.inputs) if node is not None else set()
        return found_ids

    written: dict[int, int] = {}  # tensor id -> the last node that returned it

    def encloses(outer: int, node_id: int) -> bool:
        seen: set[int] = set()
        cur = node_id
        while cur in parent and cur not in seen:
            if cur == outer:
                return True
            seen.add(cur)
            cur = parent[cur] if parent[cur] != cur else -1
        return False

    def reader_above(tid: int, node_id: int, after: int) -> int:
        """The outermost op enclosing ``node_id`` (itself included) that reads ``tid``
        and starts after node ``after``: where a tensor it reads begins."""
        start, cur = node_id, parent.get(node_id)
        while cur is not None and cur != start and cur > after and tid in reads(cur):
            start, cur = cur, parent.get(cur)
        return start

    for node in sorted(nodes, key=lambda n: n.id):  # start order
        if node.op_schema and node.outputs:
            for tid in _storageless_ids(node.outputs):
                written[tid] = node.id
                if tid in reads(node.id):
                    continue
                current = found._current(tid)
                if current is None or not encloses(current[0], node.id):
                    found._begin(tid, node.id)
        what = oprules.SPARSE_FACTS.get(node.name)
        if what is None:
            continue
        arg = node.outputs[0] if what == "made" and node.outputs else \
            node.inputs[0] if node.inputs else None
        records = list(tensor_records(arg)) if arg is not None else []
        if len(records) != 1 or records[0][5] != "" or not isinstance(records[0][0], int):
            continue  # not one tensor without storage
        tid = records[0][0]
        current = found._current(tid)
        nnz = _stated_nnz(what, node) if what != "made" else None
        if current is not None and nnz is not None and current[1].nnz is not None \
                and nnz != current[1].nnz and current[1].nnz_node is not None \
                and written.get(tid, -1) < current[1].nnz_node:
            # Another count of entries, with nothing returning the id since the first
            # was recorded: another tensor at a reused address. Autograd unpacks a
            # saved sparse tensor at a new address and no op returns it: the backward
            # of coalesce().values() read the original tensor (24 entries) on the id
            # of the freed coalesce result (17 entries).
            found._begin(tid, reader_above(tid, node.id, current[1].nnz_node))
        found._learn(tid, what, node)
    found.mkldnn = mkldnn_tensors(nodes, found)
    return found


def _layout_arg(node: RawNode) -> object:
    """The value recorded for the node's ``layout`` argument; None where it has none."""
    try:
        names = [spec.name for spec in parse_signature(node.op_schema).args]
    except SchemaError:
        return None
    k = names.index("layout") if "layout" in names else len(node.inputs)
    return node.inputs[k].value if k < len(node.inputs) else None


def mkldnn_tensors(nodes: list[RawNode], sparse: SparseTensors) -> frozenset[int]:
    """Ids of the tensors recorded without storage that are MKLDNN tensors
    (oprules/mkldnn.py): those an MKLDNN op reads or returns, or an op given
    ``layout=torch._mkldnn`` returns, and, closed over the ops that read one, the other
    tensors without storage such an op reads or returns (a ``relu_`` on one, an
    ``add`` of two). A vmap wrapper or a sparse tensor never meets one there."""
    def storageless(args: list[RawArg]) -> set[int]:
        return {tid for tid in _storageless_ids(args) if tid not in sparse}

    found: set[int] = set()
    ops = [n for n in nodes if n.op_schema]
    for node in ops:
        if node.name in oprules.MKLDNN_OPS:
            found |= storageless(node.inputs) | storageless(node.outputs)
        elif "Layout" in node.op_schema and _layout_arg(node) == oprules.MKLDNN_LAYOUT:
            found |= storageless(node.outputs)
    changed = bool(found)
    while changed:
        changed = False
        for node in ops:
            reads = storageless(node.inputs)
            if reads & found:
                more = (reads | storageless(node.outputs)) - found
                if more:
                    found |= more
                    changed = True
    return frozenset(found)


def is_collective(node: RawNode) -> bool:
    namespace, _, name = node.name.partition("::")
    return (bool(node.op_schema) and namespace in oprules.COMMUNICATION_NAMESPACES
            and name not in oprules.COLLECTIVE_HELPERS)


def collective_dispatch(trace: RawTrace) -> set[int]:
    """The ids of the collectives and of the ops their dispatch ran, which work on the
    collective's data too: gloo's reduce-scatter copies its input to a scratch buffer
    there, which its worker thread then divides (AVG)."""
    inside: set[int] = set()
    for node in trace.nodes:  # (sorted by id: parents before children)
        if node.parent in inside or is_collective(node):
            inside.add(node.id)
    return inside


def backend_worker_threads(trace: RawTrace) -> set[int]:
    """Host threads on which a communication backend ran parts of collectives that
    other threads issued.

    Such a thread issues no collective and opens no annotation of its own; it records
    nothing before the process's first collective; and its ops work on the tensors of
    collectives issued elsewhere (at least one of its ops reads or writes a storage
    that such a collective took or returned). A user's own thread (a pin-memory
    thread, the autograd engine's device threads, ``--compose parallel``) fails one of
    these, and is replayed."""
    by_id = {n.id: n for n in trace.nodes}
    issuing: set[int] = set()
    comm_storages: dict[int, set[int]] = {}  # storage id -> threads whose collectives use it
    first: int | None = None  # the first collective's node id
    inside = collective_dispatch(trace)
    for node in trace.nodes:
        if node.id not in inside:
            continue
        if is_collective(node):
            issuing.add(node.tid)
            first = node.id if first is None else first
        for arg in (*node.inputs, *node.outputs):
            for sid in raw_storage_ids(arg):
                comm_storages.setdefault(sid, set()).add(node.tid)
    if first is None:
        return set()
    disqualified = set(issuing)
    touches: set[int] = set()
    for node in trace.nodes:
        tid = node.tid
        if tid in disqualified or is_root(node):
            continue
        parent = by_id.get(node.parent)
        top_level = parent is None or is_root(parent)
        if not node.op_schema and node.name != "record_param_comms":
            disqualified.add(tid)  # an annotation: the program's own code
        elif top_level and node.id < first:
            disqualified.add(tid)  # ran before any collective existed
        elif any(sid in comm_storages and comm_storages[sid] - {tid}
                 for arg in (*node.inputs, *node.outputs) for sid in raw_storage_ids(arg)):
            touches.add(tid)
    return touches - disqualified


def future_callbacks(trace: RawTrace, workers: set[int]) -> dict[int, int]:
    """The program's ops among those a communication backend's worker thread ran:
    node id -> the thread whose code reads what they made.

    A ``Future.then`` callback of an async collective runs on the thread that completes
    the work, gloo's worker (DDP's fp16 compression hook decompresses the bucket
    there; ``fut.then(lambda f: f.value()[0].mul(0.5))``). What gloo runs itself only
    fills the collective's tensors and its own buffers; a callback's op makes or writes
    a tensor that the program reads later on another thread (or that a later callback
    op of the program reads), before anything else is allocated there. Those ops are
    replayed, as ops of the reading thread, in recorded order. A write into a buffer a
    collective made is the backend's, whoever reads that address later."""
    if not workers:
        return {}
    collective = {sid for node in trace.nodes if is_collective(node)
                  for arg in (*node.inputs, *node.outputs) for sid in raw_storage_ids(arg)}
    by_id = {n.id: n for n in trace.nodes}
    in_collective: dict[int, bool] = {}

    def inside_collective(node: RawNode) -> bool:
        """Whether an op is part of a collective (its completion work included)."""
        chain: list[int] = []  # the ids walked up, answered alike
        cur: RawNode | None = node
        found = False
        while cur is not None:
            if cur.id in in_collective:
                found = in_collective[cur.id]
                break
            chain.append(cur.id)
            if is_collective(cur):
                found = True
                break
            if is_root(cur) or cur.parent == cur.id:
                break
            cur = by_id.get(cur.parent)
        in_collective.update(dict.fromkeys(chain, found))
        return found

    made_at: dict[int, list[int]] = {}  # storage -> ids of the ops that allocated it
    read_by: dict[int, list[tuple[int, int]]] = {}  # storage -> (id, thread) of readers
    for node in trace.nodes:
        if not node.op_schema:
            continue
        reads = {sid for arg in node.inputs for sid in raw_storage_ids(arg) if sid}
        for sid in {sid for arg in node.outputs for sid in raw_storage_ids(arg)} - reads:
            made_at.setdefault(sid, []).append(node.id)
        if node.tid not in workers and not inside_collective(node):
            for sid in reads:
                read_by.setdefault(sid, []).append((node.id, node.tid))
    candidates = [n for n in trace.nodes if n.tid in workers and n.op_schema
                  and (n.parent not in by_id or is_root(by_id[n.parent]))]

    def of_the_program(node: RawNode, sid: int) -> bool:
        """Whether a write into the collective's tensor ``sid`` is a callback's: it
        reads nothing but that tensor, numbers (0-d tensors) and what the program's
        threads made (DDP's documented hook, ``f.value()[0].div_(world)``); gloo's own
        copies into its outputs read buffers it made on its worker."""
        try:
            written = parse_signature(node.op_schema).written
        except SchemaError:
            return False
        if not any(sid in raw_storage_ids(node.inputs[i]) for i in written
                   if i < len(node.inputs)):
            return False  # (a view of it, say: no write at all)
        for arg in node.inputs:
            sids = set(raw_storage_ids(arg))
            if not sids or sid in sids or arg.shape == []:
                continue
            made = [m for other in sids for m in made_at.get(other, ()) if m < node.id]
            maker = by_id[max(made)] if made else None
            if maker is None or maker.tid in workers or inside_collective(maker):
                return False
        return True

    owners: dict[int, int] = {}
    for node in sorted(candidates, key=lambda n: n.id, reverse=True):  # readers first
        written = {sid for arg in node.outputs for sid in raw_storage_ids(arg)
                   if sid and (sid not in collective or of_the_program(node, sid))}
        for sid in written:
            made = [m for m in made_at.get(sid, ()) if m <= node.id]
            if made and inside_collective(by_id[max(made)]):
                continue  # a buffer the collective made (gloo's average divides it)
            reader = next(((at, tid) for at, tid in sorted(read_by.get(sid, ()))
                           if at > node.id), None)
            # (an allocation below the op is its own result's: matmul's mm)
            if reader is not None and not any(node.id < m < reader[0]
                                              and not _descends_from(by_id, m, node.id)
                                              for m in made_at.get(sid, ())):
                owners[node.id] = reader[1]
                break
        if node.id in owners:  # what it read on the worker, a callback op made
            for sid in {sid for arg in node.inputs for sid in raw_storage_ids(arg) if sid}:
                read_by.setdefault(sid, []).append((node.id, owners[node.id]))
    return owners


def _descends_from(by_id: dict[int, RawNode], node_id: int, ancestor: int) -> bool:
    """Whether node ``node_id`` lies below node ``ancestor`` (ids grow downwards)."""
    cur = by_id.get(node_id)
    while cur is not None and cur.id > ancestor and cur.parent != cur.id:
        if cur.parent == ancestor:
            return True
        cur = by_id.get(cur.parent)
    return False


def _adopt_callbacks(trace: RawTrace, owners: dict[int, int]) -> None:
    """Make each callback op an op of the thread that reads its result (top level)."""
    roots = thread_roots(trace)
    for node in trace.nodes:
        if node.id in owners and owners[node.id] in roots:
            node.tid, node.parent = owners[node.id], roots[owners[node.id]]


def select_ops(trace: RawTrace) -> Selection:
    repair_async_nesting(trace)
    by_id = {n.id: n for n in trace.nodes}
    if trace.descended is None or trace.backend_threads is None \
            or trace.compiling is None:
        # Once per trace, while every node still has its arguments (the driver
        # releases covered ones after the first selection): later selections of the
        # same trace (comms, link, compare) then select the same ops.
        trace.backend_threads = backend_worker_threads(trace)
        _adopt_callbacks(trace, future_callbacks(trace, trace.backend_threads))
        children = children_of(trace)
        trace.compiling = compile_time_nodes(trace, children)
        descend = subclass_dispatches(trace) | foreign_composites(trace, children) \
            | autocast_dispatches(trace, children)
        keys: dict[int, tuple[set[TensorKey], set[TensorKey]]] = {}  # shared by rounds
        fresh: dict[int, tuple[int, ...]] = {}  # so are the storages each node allocates
        facts = _node_facts(trace, by_id)  # the rounds change no node: found once
        while True:
            selection = _select(trace, by_id, descend, trace.backend_threads, facts)
            more = escaping_composites(trace, selection.ops, by_id, children, keys,
                                       fresh) - descend
            if not more:
                break
            descend |= more
        trace.descended = descend
        return selection
    return _select(trace, by_id, trace.descended, trace.backend_threads,
                   _node_facts(trace, by_id))


def escaping_composites(trace: RawTrace, ops: list[Selected], by_id: dict[int, RawNode],
                        children: dict[int, list[RawNode]] | None = None,
                        keys: dict[int, tuple[set[TensorKey], set[TensorKey]]] | None = None,
                        fresh: dict[int, tuple[int, ...]] | None = None) -> set[int]:
    """Selected ops with a result of their own implementation that a later op reads.

    A composite op returns some of what its children computed and keeps the rest,
    yet autograd saves some of that rest for the backward: ``cross_entropy_loss``'s
    ``log_softmax`` result and ``nll_loss_forward``'s total weight, ``layer_norm``'s
    mean and rstd, ``dropout``'s mask, attention's logsumexp. Replayed whole, the op
    computes them and drops them, and the backward reads a buffer made before timing:
    not the values the forward computed, and memory the step never allocates. Such an
    op is replayed as its children (:func:`select_ops` descends into it), which return
    those tensors, where they can run wherever the op can (:func:`_portable_children`).
    Collectives are kept whole (their insides are the backend's).
    Only what autograd saved outlives the op, and a saved result lives until the
    backward reads it: an op that made no autograd node (``bincount``'s ``min`` and
    ``max``) keeps nothing, and a 0-d read outside the backward scopes is not taken
    for a saved result, since the argument parser wraps each Python number as a 0-d
    tensor that no op records allocating, and the allocator may put it at a freed
    temporary's TensorImpl and data addresses, of the same dtype too (``step += 1``
    in Adam, at ``bincount``'s freed ``min``: replayed as its children in one capture
    of many).
    A tensor is known by (tensor id, storage id, element size), and the allocator
    reuses both addresses: a later key is the inner result only while its storage
    lives. A node that allocates at a storage id (an output on no storage it read)
    shows that whatever was there before is gone, even where the key returns later on
    another new tensor (a saved result unpacked for the backward, a TensorImpl at the
    address of a freed inner one: a BCE's buffer, read back as a Poisson loss's exp,
    flipped between captures of one step)."""
    children = children if children is not None else children_of(trace)
    keys = keys if keys is not None else {}
    fresh = fresh if fresh is not None else {}
    owner: dict[TensorKey, int] = {}  # inner result -> the op that kept it
    at_storage: dict[int, set[TensorKey]] = {}  # storage id -> owned keys

    def keys_of(node: RawNode) -> tuple[set[TensorKey], set[TensorKey]]:
        """The keys a node reads and returns (:func:`select_ops` asks again for every
        node each round, so they are kept)."""
        found = keys.get(node.id)
        if found is None:
            found = keys[node.id] = (
                {key for arg in node.inputs for key in _tensor_keys(arg)},
                {key for arg in node.outputs for key in _tensor_keys(arg)})
        return found

    def allocated(node: RawNode) -> None:
        """Forget the inner results at the storages that `node` allocates anew."""
        sids = fresh.get(node.id)
        if sids is None:  # kept, as keys are: every round asks again for every node
            reads, returns = keys_of(node)
            read = {key[1] for key in reads}
            sids = fresh[node.id] = tuple(key[1] for key in returns if key[1] not in read)
        for sid in sids:
            for gone in at_storage.pop(sid, ()):
                owner.pop(gone, None)

    found: set[int] = set()
    for sel in ops:
        node = sel.node
        reads, returns = keys_of(node)
        # A 0-d tensor read outside the backward may be a wrapped Python number, made
        # where the observer records nothing, at a freed inner result's addresses.
        backward = in_backward(sel.scope)
        found.update(owner[key] for key in reads
                     if key in owner and (backward or key[3] != 0))
        own = reads | returns
        for key in own:
            owner.pop(key, None)
        inside = list(_below(node.id, children))
        for allocating in (node, *inside):
            allocated(allocating)
        # An op that made no autograd node saved nothing: its inner results are freed.
        if node.name.partition("::")[0] in oprules.COMMUNICATION_NAMESPACES \
                or sel.made_grad_node is False:
            continue
        # Views of what the op read or returned (linear's t() of its weight) are not
        # results of its own: a later read of one reads that storage, as it is.
        storages = {key[1] for key in own}
        for inner in inside:
            for key in keys_of(inner)[1]:
                if key[1] not in storages:
                    owner[key] = node.id
                    at_storage.setdefault(key[1], set()).add(key)
    return {i for i in found if _portable_children(_op_children(i, children))
            and _children_return_its_results(by_id[i], children)}


def foreign_composites(trace: RawTrace, children: dict[int, list[RawNode]]) -> set[int]:
    """Ops of a namespace the benchmark does not load (a model's own ``torch.library``
    ops, an extension's: the file imports torch alone), or that this PyTorch does not
    have (a newer one's: ``aten::linalg_polar`` of a 2.14 trace), whose recorded
    children all run on torch's own kernels, and compute: they are replayed as those children,
    which are what the op ran. Ops without such children (a C++ or Triton kernel of
    their own) stay whole, guarded: they run where their library is loaded, and stand
    in elsewhere. An op that mutates its arguments (``mutates_args``) computes by
    writing in place: ``x.clamp_(min=0)`` is its body's work. One that calls another
    such op replays as well, the inner one as its own children."""
    candidates = {node.id: _op_children(node.id, children) for node in trace.nodes
                  if _foreign(node) and _children_return_its_results(node, children, True)}
    candidates = {i: kids for i, kids in candidates.items()
                  if any(_computes(kid) or _writes_in_place(kid) for kid in kids)}
    found: set[int] = set()
    while True:  # inner ops first: one pass per level of nesting
        more = {i for i, kids in candidates.items()
                if i not in found and _portable_children(kids, found)}
        if not more:
            return found
        found |= more


def _op_children(node_id: int, children: dict[int, list[RawNode]]) -> list[RawNode]:
    """The ops an op called, in node order: its children, seen through the scopes
    between them (``torch.library.custom_op`` records its autograd wrapper's
    ``GeneratedBackwardFor_<op>`` scope around the Python body's ops), which is where
    selection lands when it descends into the op."""
    found: list[RawNode] = []
    stack = list(reversed(children.get(node_id, [])))
    while stack:  # depth first, in node order, without recursion (scopes nest deep)
        kid = stack.pop()
        if kid.op_schema:
            found.append(kid)
        else:
            stack.extend(reversed(children.get(kid.id, [])))
    return found


def _children_return_its_results(node: RawNode, children: dict[int, list[RawNode]],
                                 in_place: bool = False) -> bool:
    """Whether every result of ``node`` is one its recorded children returned: else its
    own kernel made it (``mul_`` by a wrapped Python float records only the float's
    cast below it), and its children alone would not compute the op. Views and fills
    below an op only prepare its result: ``index_reduce_`` with ``include_self=False``
    fills the rows it reduces into (``index_fill_``) and selects one, then its kernel
    reduces. An allocation below an op makes its result only where the op itself
    allocates: ``quantized::conv2d`` allocates its quantized result
    (``_empty_affine_quantized``) and makes its input contiguous, then its own kernel
    convolves into it. ``in_place``: a write that overwrites a tensor
    (``out.copy_(x.abs())`` into an ``empty_like``, an ``out=`` variant) makes it too,
    as a model's own Python op writes its result. Not a write that reads what it
    writes: ``quantized::linear_dynamic`` allocates, ``resize_``s, computes its gemm in
    its own kernel, then adds the bias with a dispatched ``add_``. (For torch's own
    ops, a copy below a kernel can only prepare what the kernel then computes.)"""
    fill = node.name in oprules.FILLS
    allocates = node.name in oprules.UNINITIALISED_OUTPUTS
    made = {sid for inner in _below(node.id, children)
            if (_computes(inner) or (allocates and inner.name in oprules.UNINITIALISED_OUTPUTS)
                or (in_place and _overwrites(inner)))
            and (fill or inner.name not in oprules.FILLS)
            for arg in inner.outputs for sid in raw_storage_ids(arg)}
    return all(sid in made for arg in node.outputs for sid in raw_storage_ids(arg) if sid)


def _foreign(node: RawNode) -> bool:
    namespace, _, rest = node.name.partition("::")
    if not (node.op_schema and rest):
        return False
    qualified = node.op_schema.split("(", 1)[0].strip()
    if namespace in oprules.CORE_NAMESPACES:  # one of a newer PyTorch's
        return kernels.unknown_here(qualified)
    # A library's op (torchvision::roi_align) that the harness writes with torch ops
    # replays whole: its recorded children are only the allocations around its kernel.
    return namespace not in oprules.COMMUNICATION_NAMESPACES \
        and namespace not in oprules.NAMESPACE_MODULES \
        and namespace not in oprules.TORCH_NATIVE_NAMESPACES \
        and not oprules.has_portable_equivalent(qualified)


def _computes(node: RawNode) -> bool:
    """Whether a recorded op computes values: not an allocation, a view or an alias."""
    return bool(node.op_schema) and node.name not in oprules.UNINITIALISED_OUTPUTS \
        and "-> Tensor(a" not in node.op_schema


def _written_args(node: RawNode) -> tuple[ArgSpec, ...]:
    """The arguments a recorded op writes (``Tensor(a!)``); none where its schema does
    not parse."""
    try:
        signature = parse_signature(node.op_schema)
    except SchemaError:
        return ()
    return tuple(signature.args[i] for i in signature.written)


def _writes_in_place(node: RawNode) -> bool:
    """Whether a recorded op writes a tensor it was given: a fill is one, and so is
    ``clamp_``."""
    return bool(_written_args(node))


def _overwrites(node: RawNode) -> bool:
    """Whether a recorded op writes a tensor without reading its old values: a copy
    into it, or an ``out=`` variant (its written argument keyword-only)."""
    return node.name == "aten::copy_" or any(a.kwarg_only for a in _written_args(node))


def _portable_children(kids: list[RawNode], replayed_as_children: Set[int] = frozenset()
                       ) -> bool:
    """Whether an op's children can replay wherever the op can: a backend's kernel
    (``_scaled_dot_product_flash_attention``, CUDA only) can where the harness has its
    portable equivalent (equivalents.PORTABLE), which runs wherever the kernel cannot; a
    child without one would be skipped there, so its op stays whole. Attention is
    the case: kept whole, its backward read a logsumexp filled before timing, not
    the forward's, and exp(scores - logsumexp) overflowed a training replay to inf
    (timm's VOLO). A child in ``replayed_as_children`` (a model's own op that
    replays as its own children) can."""
    ops = [k for k in kids if k.op_schema]

    def portable(kid: RawNode) -> bool:
        qualified = kid.op_schema.split("(", 1)[0].strip()
        return (kernels.guard_reason(qualified) is None
                or oprules.has_portable_equivalent(qualified))

    return bool(ops) and all(
        k.id in replayed_as_children or portable(k) for k in ops if "::" in k.name)


def _tensor_keys(arg: RawArg) -> list[TensorKey]:
    """(tensor id, storage id, element size, dimensions, dtype) of the tensors of one
    recorded argument that have a storage: the allocator reuses a small temporary's
    TensorImpl and data addresses together, for a wrapped Python scalar too, whose
    wrapping records no op that allocates (a double where the temporary was a float;
    a 0-d long where ``matrix_exp``'s decomposition had freed a [1] long, and the
    forward was replayed as its decomposition, whose degree buckets left NaN; a 0-d
    double where a bool ``sum``'s upcast had freed a 0-d long, and the ``sum`` was
    replayed as its children in one capture of five). The dtype is None where the
    argument's type does not name one per tensor."""
    records = tensor_records_with_ranks(arg)
    dtypes: list[str | None] = list(_TENSOR_DTYPE.findall(arg.type))
    if len(dtypes) != len(records):
        dtypes = [None] * len(records)
    return [(r[0], r[1], r[4], rank, dtype)
            for (r, rank), dtype in zip(records, dtypes, strict=True)
            if r[1] and isinstance(r[0], int)]


class _NodeFacts(NamedTuple):
    """What :func:`_select` reads of the nodes besides the ops it descends into, which
    every round of :func:`select_ops` would otherwise find again."""

    has_children: set[int]
    launched: set[int]  # above a recorded compiled kernel
    autograd_wrapped: set[int]  # above a compiled autograd function
    grad_makers: set[int] | None  # :func:`grad_node_makers`


def _node_facts(trace: RawTrace, by_id: dict[int, RawNode]) -> _NodeFacts:
    return _NodeFacts(
        {n.parent for n in trace.nodes if n.parent != n.id},
        _above(trace.nodes, by_id, lambda n: bool(n.attrs.get("kernel_backend"))),
        _above(trace.nodes, by_id, lambda n: n.name in COMPILED_FUNCTIONS),
        grad_node_makers(trace.nodes))


def _select(trace: RawTrace, by_id: dict[int, RawNode], dispatched: set[int],
            backend_threads: set[int], facts: _NodeFacts) -> Selection:
    # scope_of[id] is None when an ancestor (or the node) is selected, else the annotation path.
    scope_of: dict[int, tuple[str, ...] | None] = {}

    def resolve(node: RawNode) -> tuple[str, ...] | None:
        """Scope a node's children inherit; None if the node or an ancestor is an op."""
        chain: list[RawNode] = []
        on_chain: set[int] = set()
        cur: RawNode | None = node
        while cur is not None and cur.id not in scope_of:
            if cur.id in on_chain:
                raise TraceError("parent links form a cycle", node_id=cur.id, field="ctrl_deps")
            on_chain.add(cur.id)
            chain.append(cur)
            parent = by_id.get(cur.parent) if cur.parent != cur.id else None
            cur = parent
        inherited = scope_of[cur.id] if cur is not None else ()
        for n in reversed(chain):
            if inherited is None or (n.op_schema and n.id not in dispatched):
                scope_of[n.id] = None
            elif is_root(n) or n.id in dispatched or n.name == SUBCLASS_DISPATCH:
                scope_of[n.id] = inherited  # not an annotation: no scope of its own
            else:
                scope_of[n.id] = (*inherited, n.name)
            inherited = scope_of[n.id]
        return scope_of[node.id]

    has_children, launched, autograd_wrapped = \
        facts.has_children, facts.launched, facts.autograd_wrapped
    compiling = trace.compiling or {}
    selected: list[Selected] = []
    covered: list[RawNode] = []
    skipped: list[Diagnostic] = []
    threads: set[int] = set()
    for node in trace.nodes:
        if node.id in compiling:
            if compiling[node.id] is not None:  # once per compile, at its cache lookup
                skipped.append(not_replayed(compiling[node.id], COMPILING, COMPILING_NOTE))
            continue
        parent = by_id.get(node.parent) if node.parent != node.id else None
        outer = resolve(parent) if parent is not None else ()
        if outer is None:
            covered.append(node)  # inside a selected op: its implementation
            continue
        resolve(node)
        if node.tid in backend_threads:
            if node.op_schema:
                skipped.append(not_replayed(node.id, node.name, BACKEND_THREAD_NOTE))
            continue
        if node.op_schema and node.id not in dispatched:
            selected.append(Selected(node, outer, composites=_composites(parent, by_id,
                                                                         dispatched)))
            threads.add(node.tid)
        elif node.op_schema and _foreign(node):
            core = node.name.partition("::")[0] in oprules.CORE_NAMESPACES
            skipped.append(not_replayed(node.id, node.name, NEWER_NOTE if core else FOREIGN_NOTE))
        elif node.attrs.get("kernel_backend"):
            backend = str(node.attrs.get("kernel_backend"))[:40]
            skipped.append(not_replayed(
                node.id, _display(node.name),
                f"{backend} kernel compiled for the recording machine; not portable"))
        elif node.id not in launched and (
                node.name in COMPILED_FUNCTIONS
                or (node.name.startswith(COMPILED_REGION) and node.id not in autograd_wrapped)):
            # Inductor's C++ kernels (CPU) are not recorded; Triton ones are, below.
            skipped.append(not_replayed(node.id, _display(node.name), COMPILED_NOTE))
        elif INDUCTOR_CPP_CALL.match(node.name):
            name = node.name if node.name.startswith("aoti_") else "Inductor C++ kernel"
            skipped.append(not_replayed(node.id, name, INDUCTOR_CPP_NOTE))
        elif node.name == "record_param_comms":
            pass  # metadata of the enclosing communication op
        elif is_op_name(node.name) and node.id not in has_children:
            skipped.append(not_replayed(node.id, node.name, "no operator schema recorded"))
    _reveal_grad(selected, covered)
    _read_kernel_paths(selected, covered)
    _read_child_domains(selected, covered)
    _reveal_fold(selected, covered)
    _mark_grad_node_makers(selected, facts.grad_makers, by_id)
    return Selection(selected, skipped, sorted(threads), covered)


def compile_time_nodes(trace: RawTrace, children: dict[int, list[RawNode]]
                       ) -> dict[int, int | None]:
    """The nodes Dynamo ran while compiling a frame inside the recorded step.

    A shape the warm-up did not see (a last, smaller batch; a new sequence length)
    makes Dynamo compile again in the recorded step, and the observer records the
    compiler's tracing: ops on fake and meta tensors, sizes as ``<SymInt>``. They are
    not the program's work, and their arguments do not decode. Each call of a compiled
    frame records a cache lookup, then the frame's region as the next sibling; a miss
    compiles in between. A lookup followed by no region (Dynamo fell back to running
    the frame eagerly) encloses nothing. Maps each node of such a span, and everything
    under it, to its lookup's id where it is the span's first node, else None."""
    siblings: dict[tuple[int, int], list[RawNode]] = {}
    for node in trace.nodes:
        if node.parent != node.id:
            siblings.setdefault((node.parent, node.tid), []).append(node)
    span: dict[int, int | None] = {}
    for nodes in siblings.values():
        lookup: RawNode | None = None
        pending: list[RawNode] = []
        for node in sorted(nodes, key=lambda n: n.id):
            if node.name == CACHE_LOOKUP:
                lookup, pending = node, []
            elif lookup is not None and node.name.startswith(COMPILED_REGION):
                for k, inner in enumerate(pending):
                    span[inner.id] = lookup.id if k == 0 else None
                lookup, pending = None, []
            elif lookup is not None:
                pending.append(node)
    for node_id in list(span):
        for inner in _below(node_id, children):
            span[inner.id] = None
    return span


def _composites(parent: RawNode | None, by_id: dict[int, RawNode],
                dispatched: set[int]) -> tuple[RawNode, ...]:
    """The ops above a selected node that were descended into, innermost first."""
    found: list[RawNode] = []
    while parent is not None and parent.op_schema and parent.id in dispatched:
        found.append(parent)
        parent = by_id.get(parent.parent) if parent.parent != parent.id else None
    return tuple(found)


def _above(nodes: list[RawNode], by_id: dict[int, RawNode],
           wanted: Callable[[RawNode], bool]) -> set[int]:
    """Ids of the nodes above one that is ``wanted`` (a recorded compiled kernel: its
    ``kernel_backend`` set)."""
    found: set[int] = set()
    for node in nodes:
        if not wanted(node):
            continue
        cur = by_id.get(node.parent) if node.parent != node.id else None
        while cur is not None and cur.id not in found:
            found.add(cur.id)
            cur = by_id.get(cur.parent) if cur.parent != cur.id else None
    return found


def grad_node_makers(nodes: list[RawNode]) -> set[int] | None:
    """Ids of the op nodes whose dispatch created an autograd node; None where no node
    records a ``seq_id``.

    An op dispatched in grad mode records the next autograd sequence number of its
    thread (``seq_id``), which only moves when a node is created. So every op that read
    no tensor requiring grad (a quantization observer's min/max of its buffers, a mask
    built from ids) records the number the next real node takes, and of the ops that
    recorded one number, the last to start made the node (a composite's children start
    after it; a kernel's record -1). The backward's autograd functions record their
    forward's number (``fw_tid`` set) and are skipped; so are annotations (no schema),
    which make no nodes.

    A number was taken only where a later op of its thread recorded a higher one, or
    a backward function its own. A thread's last number shows neither: it was taken
    only where a backward ran on that thread's numbers (then it names it) or, with
    none, where the thread made other nodes (a forward in grad mode, its last op
    the loss). An inference step run in grad mode records one number throughout: no
    op made a node, and crediting its last op would make its inputs parameters."""
    last: dict[tuple[int, int], int] = {}  # (thread, seq_id) -> last node that recorded it
    backward: set[tuple[int, int]] = set()  # (forward thread, seq_id) a backward recorded
    recorded = False
    for node in nodes:
        seq = node.attrs.get("seq_id")
        if not isinstance(seq, int) or isinstance(seq, bool):
            continue
        recorded = True
        if seq < 0 or not node.op_schema:
            continue
        fw_tid = node.attrs.get("fw_tid")
        if fw_tid:
            backward.add((fw_tid, seq))
        else:
            last[(node.tid, seq)] = node.id
    if not recorded:
        return None
    highest: dict[int, int] = {}  # thread -> its highest number
    count: dict[int, int] = {}  # thread -> how many numbers it recorded
    for tid, seq in last:
        highest[tid] = max(seq, highest.get(tid, seq))
        count[tid] = count.get(tid, 0) + 1
    differentiated = {tid for tid, _seq in backward}
    taken = set()
    for (tid, seq), node_id in last.items():
        if seq < highest[tid] or (tid, seq) in backward or (
                tid not in differentiated and count[tid] > 1):
            taken.add(node_id)
    return taken


def _mark_grad_node_makers(selected: list[Selected], makers: set[int] | None,
                           by_id: dict[int, RawNode]) -> None:
    """Set each selected op's ``made_grad_node``: it, or an op inside it, made one
    (``makers``: :func:`grad_node_makers` of the trace's nodes)."""
    if makers is None:
        return
    position = {sel.node.id: k for k, sel in enumerate(selected)}
    made: set[int] = set()
    for node_id in makers:
        seen: set[int] = set()
        while node_id not in position and node_id in by_id and node_id not in seen:
            seen.add(node_id)
            node_id = by_id[node_id].parent
        if node_id in position:
            made.add(node_id)
    for node_id, k in position.items():
        selected[k] = replace(selected[k], made_grad_node=node_id in made)


def _reveal_grad(selected: list[Selected], covered: list[RawNode]) -> None:
    """Mark the arguments of ops whose recorded child shows they required grad."""
    revealing = {sel.node.id: k for k, sel in enumerate(selected)
                 if sel.node.name in oprules.GRAD_REVEALED_BY}
    if not revealing:
        return
    for node in covered:
        k = revealing.get(node.parent)
        if k is None:
            continue
        child, args = oprules.GRAD_REVEALED_BY[selected[k].node.name]
        if node.name == child:
            selected[k] = replace(selected[k], requires_grad_args=args)


def _read_kernel_paths(selected: list[Selected], covered: list[RawNode]) -> None:
    """Keep what the recorded children of ops whose kernel path their values decide
    show about those values (oprules.KERNEL_PATHS), read from every node below them
    in node order."""
    reading = {sel.node.id: k for k, sel in enumerate(selected)
               if sel.node.name in oprules.KERNEL_PATHS}
    if not reading:
        return
    below = _by_owner(set(reading), covered, covered)
    for node_id, k in reading.items():
        node = selected[k].node
        nodes = sorted(below.get(node_id, []), key=lambda n: n.id)
        selected[k] = replace(selected[k], kernel_path=oprules.KERNEL_PATHS[node.name].read(
            node, nodes))


def _read_child_domains(selected: list[Selected], covered: list[RawNode]) -> None:
    """Keep, for each op replayed whole, the domains its recorded children's rules put
    on tensors it reads itself (``Selected.child_domains``). The rules name canonical
    ops; an alias or a wrapper records its own name above the op it calls, with the
    same tensors: ``torch.true_divide`` of booleans divided by False (inf), and
    ``torch.special.logit`` read values outside (0, 1)."""
    ruled = [n for n in covered if n.name in oprules.POSITIVE_ARGS
             or n.name in oprules.FLOAT_RANGES]
    if not ruled:
        return
    index = {sel.node.id: k for k, sel in enumerate(selected)}
    for node_id, nodes in _by_owner(set(index), ruled, covered).items():
        k = index[node_id]
        reads = {tuple(record[:2]) for arg in selected[k].node.inputs
                 for record in tensor_records(arg)}
        found = {key: domain for key, domain in recorded_domains(
            sorted(nodes, key=lambda n: n.id), " (recorded inside it)").items()
            if key in reads}
        if found:
            selected[k] = replace(selected[k], child_domains=tuple(found.items()))


def _by_owner(selected: set[int], nodes: list[RawNode], covered: list[RawNode]
              ) -> dict[int, list[RawNode]]:
    """``nodes`` (of ``covered``) grouped by the selected op each lies in, in order."""
    owner = nearest_selected(selected, covered)
    below: dict[int, list[RawNode]] = {}
    for node in nodes:
        found = owner(node.parent)
        if found is not None:
            below.setdefault(found, []).append(node)
    return below


def nearest_selected(selected: set[int], covered: list[RawNode]
                     ) -> Callable[[int], int | None]:
    """A lookup: the id of the selected op a node is (one of ``selected``) or lies in
    (through the parents of ``covered``, the nodes inside selected ops), else None;
    each walk's nodes remembered, so that all the covered nodes' lookups cost one
    pass."""
    parent_of = {n.id: n.parent for n in covered}
    owner: dict[int, int | None] = {}

    def lookup(node_id: int) -> int | None:
        chain: dict[int, None] = {}  # (ordered; a parent cycle ends the walk)
        while node_id not in selected and node_id not in owner and node_id in parent_of \
                and node_id not in chain:
            chain[node_id] = None
            node_id = parent_of[node_id]
        found = node_id if node_id in selected else owner.get(node_id)
        for visited in chain:
            owner[visited] = found
        return found

    return lookup


def _reveal_fold(selected: list[Selected], covered: list[RawNode]) -> None:
    """Mark the operand of a matmul (selected, or inside a selected ``linear`` or other
    composite) whose recorded ``mm`` shows it required grad
    (``oprules.matmul_grad_operand``), by the selected op's argument on the same
    storage."""
    position = {sel.node.id: k for k, sel in enumerate(selected)}
    nodes = {node.id: node for node in covered}
    nodes.update((sel.node.id, sel.node) for sel in selected)
    owner_of = nearest_selected(set(position), covered)
    folded = {node.parent for node in covered if node.name in ("aten::mm", "aten::mv")}
    for node_id in folded:
        matmul = nodes.get(node_id)
        if matmul is None or matmul.name != "aten::matmul":
            continue
        if len(matmul.inputs) < 2:
            continue
        a, b = matmul.inputs[0], matmul.inputs[1]
        operand = oprules.matmul_grad_operand(a.shape, a.strides, b.shape, b.strides)
        if operand is None:
            continue
        storages = set(raw_storage_ids(matmul.inputs[operand])) - {0}
        owner = owner_of(matmul.id)
        k = position.get(owner) if owner is not None else None
        if k is None or not storages:
            continue
        sel = selected[k]
        names = [spec.name for spec, raw in zip(_arg_specs(sel), sel.node.inputs, strict=False)
                 if storages & set(raw_storage_ids(raw))]
        if names:
            selected[k] = replace(sel, requires_grad_args=tuple(
                dict.fromkeys(sel.requires_grad_args + tuple(names))))


def _arg_specs(sel: Selected) -> list:
    """The selected op's argument specs, in recorded order (empty if unknown)."""
    try:
        return list(parse_signature(sel.node.op_schema).args)
    except SchemaError:
        return []


# Covered nodes whose arguments later passes read (passes/comms.py): collectives'
# metadata, and the waits a functional collective's consumer ran inside its dispatch.
KEEP_ARGUMENTS = frozenset({"record_param_comms", "_c10d_functional::wait_tensor"})


def release_covered_arguments(selection: Selection) -> None:
    """Drop the recorded arguments of nodes inside selected ops.

    They are never lowered, yet they are most of a loaded trace's memory; releasing
    them before lowering keeps peak memory near the IR's own size.
    """
    for node in selection.covered:
        if node.name not in KEEP_ARGUMENTS:
            node.inputs = node.outputs = []


def _display(name: str) -> str:
    return name if len(name) <= 80 else name[:77] + "..."

