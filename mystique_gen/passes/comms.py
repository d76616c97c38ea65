"""Communication: lower ``c10d::*`` ops to torch.distributed calls, place their waits.

``record_param_comms`` nodes carry what the c10d op's own arguments do not: the
process group (by name, or by backend id in 1.0.2 traces), the collective's
sequence number, the rank and the world size. A ``record_param_comms`` named
"wait" outside any c10d op is where the program waited on a collective: it names
the collective by sequence number (1.0.1, 1.0.2), or not at all (then it takes the
oldest unwaited async collective of its thread). A collective recorded as async
with no recorded wait is waited on before the first later op that touches its
tensors or the next collective, or at the end of the iteration. Sends and recvs
without a recorded wait always run async (isend/irecv), waited only where their
tensors need them done, so that ranks pair them up in recorded order.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from mystique_gen import oprules
from mystique_gen.constants import HARNESS_SCOPE
from mystique_gen.errors import TraceError
from mystique_gen.ir import (
    Arg,
    Diagnostic,
    GroupName,
    ListValue,
    Literal,
    Op,
    Program,
    TensorValue,
    Value,
    iter_leaves,
    iter_tensors,
    not_replayed,
)
from mystique_gen.ir.dist import AFTER_THE_STEP, CommInfo, DistInfo, ProcessGroupSpec
from mystique_gen.ir.schema import SchemaError, Signature, parse_signature
from mystique_gen.oprules.base import CommRule
from mystique_gen.passes.lower import Unsupported, decode_value, list_element_types
from mystique_gen.passes.ranks import (
    CommScan,
    default_group_index,
    dist_info,
    group_index,
    is_int,
    recorded_groups,
    scan_trace,
    world_size,
)
from mystique_gen.passes.select import (
    Selected,
    SparseTensors,
    backend_worker_threads,
    collective_dispatch,
    is_collective,
    select_ops,
    subclass_dispatches,
)
from mystique_gen.sources.et import RawArg, RawTrace, raw_storage_ids


def lower_comm(sel: Selected, sig: Signature, index: int, scan: CommScan,
               groups: list[ProcessGroupSpec], default_group: int,
               member_of: frozenset[str] = frozenset(),
               sparse: SparseTensors | None = None) -> Op | Diagnostic:
    """One c10d op as an :class:`Op` carrying a :class:`CommInfo`; tensors stay IR values
    so the tensor pass gives them real dataflow bindings. ``member_of``: the names of
    the groups this trace's rank is in (for ops whose group is implied by their sizes:
    :func:`group_of_size`); ``sparse``: the trace's sparse tensors (DDP all-reduces a
    sparse embedding gradient as one)."""
    node = sel.node
    name = sig.qualified_name
    if name in oprules.COMM_NOT_REPLAYED:
        return not_replayed(node.id, name, oprules.COMM_NOT_REPLAYED[name])
    rule = oprules.COMM_OPS.get(name)
    if rule is None:
        return not_replayed(node.id, name, "no torch.distributed equivalent is known")
    raw = {spec.name: (i, spec, node.inputs[i]) for i, spec in enumerate(sig.args)
           if i < len(node.inputs)}
    args: list[Arg] = []
    try:
        for arg_name, form in rule.tensors:
            if arg_name not in raw:
                raise Unsupported(f"tensor argument {arg_name!r} not recorded")
            i, spec, rec = raw[arg_name]
            value = _decode_tensors(rec, spec.type, node.id, f"inputs[{i}]",
                                    partial(decode_value, sparse=sparse))
            _check_form(value, form)
            args.append(Arg(spec, value))
        for refused, why in oprules.REFUSED_ARGS.items():
            if refused in raw and not _none(raw[refused][2].value):
                raise Unsupported(why)
    except Unsupported as exc:
        return not_replayed(node.id, name, str(exc))

    facts = scan.ops.get(node.id)
    group = group_index(facts, groups)
    if group is None and rule.implies_group:
        group = group_of_size(implied_group_size(rule, {a.spec.name: a.value for a in args}),
                              groups, default_group, member_of)
    root = _int_arg(raw, rule.root, node.id) if rule.root else None
    tag = _int_arg(raw, "tag", node.id) if rule.tag else None
    recorded_async = any(raw[a][2].value is True for a in oprules.ASYNC_ARGS if a in raw)
    reduce_op = (oprules.reduce_op_name(raw[rule.reduce_op][2].value)
                 if rule.reduce_op and rule.reduce_op in raw else None)
    scalars = tuple((keyword, raw[arg][2].value) for arg, keyword in rule.scalars
                    if arg in raw and isinstance(raw[arg][2].value, (bool, int)))
    info = CommInfo(
        call=rule.call,
        group=default_group if group is None else group,
        root=root,
        root_keyword=rule.root_keyword,
        tag=tag,
        in_splits=_int_list_arg(raw, "input_split_sizes", node.id) if rule.splits else None,
        out_splits=_int_list_arg(raw, "output_split_sizes", node.id) if rule.splits else None,
        seq=facts.seq if facts else None,
        recorded_async=recorded_async,
        reduce_op=reduce_op,
        scalars=scalars,
    )
    return Op(index=index, node_id=node.id, signature=sig, args=args, outputs=[],
              thread=node.tid, scope=sel.scope, comm=info)


def implied_group_size(rule: CommRule, args: dict[str, Value]) -> int | None:
    """The size of the group an op ran on, as its tensors say (``rule.group_size``: the
    ratio of two tensors' element counts; ``rule.group_members``: the length of a list
    of one tensor per member); None where they do not say (a non-root rank's gather)."""
    if rule.group_size is not None:
        larger, smaller = (args.get(name) for name in rule.group_size)
        big = [t.meta.numel for t in iter_tensors(larger)] if larger is not None else []
        small = [t.meta.numel for t in iter_tensors(smaller)] if smaller is not None else []
        if not big or not small or small[0] <= 0 or big[0] % small[0]:
            return None
        return big[0] // small[0]
    members = args.get(rule.group_members) if rule.group_members else None
    while isinstance(members, ListValue) and members.items \
            and isinstance(members.items[0], ListValue):
        members = members.items[0]  # [[t0, t1]]: one list per call or input
    return len(members.items) if isinstance(members, ListValue) and members.items else None


def group_of_size(size: int | None, groups: list[ProcessGroupSpec], default_group: int,
                  member_of: frozenset[str]) -> int | None:
    """The group of ``size`` ranks an op ran on, where the trace does not record it:
    the default group where it has that size, else the first group of that size this
    rank is in (in creation order: a device mesh creates its groups dimension by
    dimension, so every rank picks the same dimension); None where no group fits."""
    if size is None:
        return None
    if groups[default_group].size == size:
        return default_group
    fits = [g.index for g in groups if g.size == size and g.name in member_of]
    return fits[0] if fits else None


def _none(value: Any) -> bool:
    return value is None or value == "<None>"


def _decode_tensors(rec: RawArg, type_str: str, node_id: int, where: str, decode) -> Value:
    if type_str == "List[List[Tensor]]":
        if not isinstance(rec.value, list):
            raise TraceError("expected a list of tensor lists", node_id=node_id, field=where)
        inner_types = list_element_types(rec.type, len(rec.value))
        shapes = rec.shape if isinstance(rec.shape, list) else []
        strides = rec.strides if isinstance(rec.strides, list) else None
        items = []
        for j, item in enumerate(rec.value):
            sub = RawArg(value=item, shape=shapes[j] if j < len(shapes) else [],
                         type=inner_types[j],
                         strides=strides[j] if strides is not None and j < len(strides) else None)
            items.append(decode(item, "List[Tensor]", sub, node_id, f"{where}[{j}]"))
        return ListValue(tuple(items))
    return decode(rec.value, type_str, rec, node_id, where)


def _check_form(value: Value, form: str) -> None:
    if form == "tensor":
        if isinstance(value, (ListValue, Literal)):
            raise Unsupported("expected one tensor")
        return
    if not isinstance(value, ListValue):
        raise Unsupported("expected a tensor list")
    if form == "one" and len(value.items) != 1:
        raise Unsupported(f"{len(value.items)} tensors in one call; torch.distributed takes one")
    if form == "inner_or_none" and not value.items:
        return  # a non-root rank's gather or scatter list: torch 2.x records []
    if form in ("inner", "inner_or_none") and len(value.items) != 1:
        raise Unsupported(f"{len(value.items)} tensor lists in one call; "
                          "torch.distributed takes one")
    if any(isinstance(t, Literal) for t in iter_leaves(value)):
        raise Unsupported("an undefined tensor in a collective")


def _int_arg(raw: dict[str, tuple[int, Any, RawArg]], name: str, node_id: int) -> int:
    if name not in raw:
        raise Unsupported(f"argument {name!r} not recorded")
    i, _spec, rec = raw[name]
    if not is_int(rec.value):
        raise TraceError("expected an integer", node_id=node_id, field=f"inputs[{i}]")
    return rec.value


def _int_list_arg(raw: dict[str, tuple[int, Any, RawArg]], name: str,
                  node_id: int) -> tuple[int, ...]:
    if name not in raw:
        return ()
    i, _spec, rec = raw[name]
    if not isinstance(rec.value, list) or not all(is_int(v) and v >= 0 for v in rec.value):
        raise TraceError("expected a list of split sizes", node_id=node_id, field=f"inputs[{i}]")
    return tuple(rec.value)


def place_waits(ops: list[Op], scan: CommScan, *, serial: bool = True) -> int:
    """Mark async collectives and the op index each one's wait precedes; returns the
    number of waits placed from the trace (the rest follow data dependencies).

    ``serial``: the replay runs every recorded thread's ops on one host thread. Then a
    blocking collective that another thread issued (a background thread's all-reduce
    on a side group) runs async, waited where its tensors are next used: issued in
    line, it blocked the step, and where another rank issued its calls in the other
    order, both waited on each other."""
    comm_ops = [op for op in ops if op.comm is not None]
    threads = Counter(op.thread for op in ops)
    main_thread = threads.most_common(1)[0][0] if threads else None
    by_seq = {op.comm.seq: op for op in comm_ops if op.comm and op.comm.seq is not None}
    from_trace = 0
    waited: set[int] = set()
    for wait in scan.waits:
        target = by_seq.get(wait.seq) if wait.seq is not None else None
        if target is not None and target.node_id > wait.node_id:
            target = None  # a wait on the previous iteration's collective
        if target is None and wait.seq is None:
            target = next((op for op in comm_ops if op.index not in waited
                           and op.thread == wait.thread and op.node_id < wait.node_id
                           and op.comm is not None and op.comm.recorded_async), None)
        if target is None or target.index in waited or target.comm is None:
            continue
        waited.add(target.index)
        target.comm.asynchronous = True
        target.comm.wait_recorded = True
        target.comm.wait_before = next((op.index for op in ops if op.node_id > wait.node_id),
                                       None)
        from_trace += 1
    for op in comm_ops:
        assert op.comm is not None
        rule = oprules.COMM_OPS[op.name]
        if op.index in waited:
            continue
        if rule.point_to_point:
            op.comm.asynchronous = True
            op.comm.wait_before = _point_to_point_wait(ops, op, rule.point_to_point)
            continue
        elsewhere = serial and op.thread != main_thread
        if not (op.comm.recorded_async or elsewhere) or rule.has_async_arg is False:
            continue
        op.comm.asynchronous = True
        op.comm.wait_before = _first_use(ops, op)
    return from_trace


def replace_inferred_waits(programs: Sequence[Program]) -> None:
    """Place again the waits no trace record placed (:func:`_first_use`), once the
    job's regroupings have settled each collective's group."""
    for program in programs:
        for op in program.ops:
            comm = op.comm
            if comm is None or not comm.asynchronous or comm.wait_recorded \
                    or oprules.COMM_OPS[op.name].point_to_point:
                continue
            comm.wait_before = _first_use(program.ops, op)


def mark_in_flight(program: Program, completed: dict[int, float],
                   starts: dict[int, float]) -> int:
    """Where the original's Kineto trace shows when each async collective's work
    completed (``completed``: node id -> time; ``starts``: each linked op's start),
    note the first later op it started after that (``CommInfo.done_by``), and place
    the waits the trace does not record again: a later collective on the group issued
    before then does not wait for it. Returns the collectives found in flight past
    their group's next one."""
    ops = program.ops
    found = 0
    for op in ops:
        comm = op.comm
        done = completed.get(op.node_id)
        if comm is None or done is None or not comm.asynchronous or comm.wait_recorded \
                or oprules.COMM_OPS[op.name].point_to_point:
            continue
        comm.done_by = next((o.node_id for o in ops[op.index + 1:]
                             if starts.get(o.node_id, -1.0) >= done), AFTER_THE_STEP)
        nxt = next((o for o in ops[op.index + 1:] if o.comm is not None
                    and o.comm.group == comm.group), None)
        found += nxt is not None and nxt.node_id < comm.done_by
    replace_inferred_waits([program])
    return found


def _point_to_point_wait(ops: list[Op], p2p: Op, kind: str) -> int | None:
    """Index of the op a send or recv is waited before: for a recv, the first later op
    that touches its tensor; for a send, the first that writes it (reads may overlap
    the transfer). Never merely the next collective: a peer may still be on its way to
    the matching call, and the original waited no earlier than it needed the data."""
    storages = {tv.storage_id for arg in p2p.args for tv in iter_tensors(arg.value)}
    for op in ops[p2p.index + 1:]:
        for arg in op.args:
            if kind == "send" and not _writes(op, arg):
                continue
            if any(tv.storage_id in storages for tv in iter_tensors(arg.value)):
                return op.index
    return None


def _writes(op: Op, arg: Arg) -> bool:
    """Whether ``op`` may write ``arg``'s tensors: by its schema (``Tensor(a!)``), or as
    a communication op's destination (every tensor argument but inputs and a send's)."""
    if op.comm is None:
        return arg.spec.writes
    if oprules.COMM_OPS[op.name].point_to_point == "send":
        return False
    return "input" not in arg.spec.name


def _nested_functional_waits(trace: RawTrace) -> dict[int, set[int]]:
    """Waits recorded inside another op: {selected op's node id: node ids of the
    functional collectives it waited for}. A DTensor or AsyncCollectiveTensor waits for
    a collective's result inside the dispatch of the op that first reads it, so the
    wait is a child of that op and names the collective's output storage. A wait inside
    a subclass's dispatch (below ``PythonSubclass``) is replayed itself, as the ops
    beside it are (passes/select.py)."""
    by_id = {n.id: n for n in trace.nodes}
    dispatched = subclass_dispatches(trace)
    produced: dict[int, int] = {}  # recorded output storage -> functional node id
    waits: dict[int, set[int]] = {}
    for node in trace.nodes:  # id order is start order
        namespace, _, name = node.name.partition("::")
        if namespace not in oprules.FUNCTIONAL_NAMESPACES:
            continue
        if name == "wait_tensor":
            top, parent = None, by_id.get(node.parent)
            while parent is not None and parent.id != parent.parent:
                if parent.op_schema and parent.id not in dispatched:
                    top = parent  # the outermost op with a schema is the selected one
                parent = by_id.get(parent.parent)
            storages = {s for arg in node.inputs for s in raw_storage_ids(arg)}
            if top is not None:
                waits.setdefault(top.id, set()).update(
                    produced[s] for s in storages if s in produced)
        elif name not in oprules.COLLECTIVE_HELPERS:
            for arg in node.outputs:
                for s in raw_storage_ids(arg):
                    produced[s] = node.id
    return waits


def place_functional_waits(ops: list[Op], nested: dict[int, set[int]]) -> None:
    """Wait for a functional collective's result where the original did: before the
    op that waited for it inside its own dispatch (``nested``), else before the first
    op that reads its data (views and the autograd wrap do not), unless that op is the
    trace's own wait_tensor."""
    index_of = {op.node_id: op.index for op in ops}
    for op in ops:
        for producer in sorted(nested.get(op.node_id, ())):
            if producer in index_of and index_of[producer] not in op.waits_on:
                op.waits_on.append(index_of[producer])
    for op in ops:
        if (op.signature.namespace not in oprules.FUNCTIONAL_NAMESPACES
                or op.signature.name in oprules.COLLECTIVE_HELPERS):
            continue
        storages = {tv.storage_id for value in op.outputs for tv in iter_tensors(value)}
        for later in ops[op.index + 1:]:
            if op.index in later.waits_on:
                break
            if any(tv.storage_id in storages
                   for arg in later.args for tv in iter_tensors(arg.value)):
                if later.signature.is_view or later.signature.name == "_wrap_tensor_autograd":
                    # Neither reads the result: an AsyncCollectiveTensor makes views
                    # without waiting, and the wrap is what makes one.
                    continue
                if later.signature.name != "wait_tensor":
                    later.waits_on.append(op.index)
                break


def _first_use(ops: list[Op], comm: Op) -> int | None:
    """Index of the first later op that reads or writes memory of the collective's
    tensors, or of the next collective on its group: a trace without wait records
    (gloo) nests every later op under a collective still in flight, and programs wait
    before their next one. Not before one on another group: a side group's call issued
    between (another rank issuing it first) would wait on this one, which that rank
    has not issued yet. A view reads no data, and another part of the same storage is
    other memory: bucketed gradients reduced from one flat buffer (ZeRO, Megatron's
    distributed optimizer) write the next bucket while the last is in flight, and a
    wait before the first slice of the buffer serialised backward with its comm."""
    assert comm.comm is not None
    spans = [_span(tv) for arg in comm.args for tv in iter_tensors(arg.value)]
    storages = {span[0] for span in spans}
    done_by = comm.comm.done_by
    for op in ops[comm.index + 1:]:
        # Not where the original had it still in flight as it issued that one (DDP's
        # buckets, ZeRO's broadcasts: in flight together), as its Kineto trace shows.
        if op.comm is not None and op.comm.group == comm.comm.group and (
                done_by is None or op.node_id >= done_by):
            return op.index
        if op.signature.is_view and op.comm is None:
            continue
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                if tv.storage_id in storages and any(
                        _overlap(span, _span(tv)) for span in spans):
                    return op.index
    return None


# A tensor's memory: (storage id, dtype, first element, end), the elements in its dtype;
# None for the range where it has no strided layout (sparse, MKLDNN).
MemorySpan = tuple[int, str, int | None, int | None]


def _span(tv: TensorValue) -> MemorySpan:
    meta = tv.meta
    if meta.storageless:
        return tv.storage_id, meta.dtype, None, None
    return tv.storage_id, meta.dtype, meta.offset, meta.extent


def _overlap(a: MemorySpan, b: MemorySpan) -> bool:
    """Whether two spans may share memory: on one storage, and where their dtypes or
    layouts leave their element ranges unknown to each other, taken as shared."""
    if a[0] != b[0]:
        return False
    if a[1] != b[1] or None in (a[2], a[3], b[2], b[3]):
        return True
    return a[2] < b[3] and b[2] < a[3]  # type: ignore[operator]


def _backend_divisors(trace: RawTrace) -> dict[int, int]:
    """Collective node id -> the integer a communication backend's worker thread divided
    that collective's data by in place (``aten::div_``): how gloo runs ``ReduceOp.AVG``,
    which torch 2.x records only as an opaque object. A worker thread's op belongs to the
    collective whose storages (or storages its earlier ops derived from them) it reads."""
    threads = trace.backend_threads
    if threads is None:
        threads = backend_worker_threads(trace)
    if not threads:
        return {}
    owner: dict[int, int] = {}  # storage id -> the collective whose data it holds
    divisors: dict[int, int] = {}
    # Ops inside a collective's dispatch on its own thread (gloo copies a
    # reduce-scatter's input to a scratch buffer there): their outputs are the
    # collective's data too.
    inside = collective_dispatch(trace)
    for node in trace.nodes:  # (sorted by id)
        if node.tid not in threads:
            if is_collective(node):
                for arg in (*node.inputs, *node.outputs):
                    for sid in raw_storage_ids(arg):
                        owner[sid] = node.id
                continue
            if node.id not in inside:
                continue
        if not node.op_schema:
            continue
        # The latest collective among those it reads: a reused scratch buffer (an
        # out= or copy_ destination, an input too) still maps to an earlier one.
        source = max((owner[sid] for arg in node.inputs for sid in raw_storage_ids(arg)
                      if sid in owner), default=None)
        if source is None:
            continue
        for arg in node.outputs:
            for sid in raw_storage_ids(arg):
                owner[sid] = source
        divisor = node.inputs[1].value if len(node.inputs) > 1 else None
        if (node.name == "aten::div_" and isinstance(divisor, int)
                and not isinstance(divisor, bool)):
            divisors[source] = divisor
    return divisors


class CommLowering:
    """The pipeline's communication hook for one trace: lowers c10d ops (given to
    :func:`~mystique_gen.passes.lower.lower_ops` as ``comm=``), then places waits and
    describes ranks and groups."""

    def __init__(self, trace: RawTrace, sparse: SparseTensors | None = None, *,
                 serial: bool = True):
        self.trace = trace
        self.sparse = sparse
        self.serial = serial  # every recorded thread's ops replay on one host thread
        self.scan = scan_trace(trace)
        self.groups = list(self.scan.groups or [])
        self.default_group = default_group_index(self.groups) if self.groups else 0
        self.world_size = world_size(self.scan.groups, list(self.scan.ops.values())) or 1
        self.nested_waits = _nested_functional_waits(trace)
        self.member_of = frozenset(g.name for g in recorded_groups(trace) or [])
        self.sized = 0  # collectives on the group their sizes imply
        self.group_ranks = _recorded_group_ranks(trace)
        # (tensor id, storage id) of each reduced result -> the collective that wrote it
        self.reduced: dict[tuple[int, int], int] = {}
        self.backend_divisors = _backend_divisors(trace)

    def lower(self, sel: Selected, sig: Signature, index: int) -> Op | Diagnostic:
        groups = self.groups or [ProcessGroupSpec(0, "0", "default_pg", None, 1)]
        op = lower_comm(sel, sig, index, self.scan, groups, self.default_group,
                        self.member_of, self.sparse)
        if not isinstance(op, Op) or op.comm is None:
            return op
        comm = op.comm
        if group_index(self.scan.ops.get(op.node_id), groups) is None:
            comm.group_recorded = False
            if comm.group != self.default_group:
                self.sized += 1
                comm.sized = True
                comm.group_rank = next(
                    (self.group_ranks[tv.storage_id] for arg in op.args
                     for tv in iter_tensors(arg.value) if tv.storage_id in self.group_ranks),
                    None)
        if (comm.group < len(self.groups)
                and not replayable(self.groups[comm.group], self.world_size)):
            comm.group = self.default_group
        if (comm.reduce_op is None and oprules.COMM_OPS[op.name].reduce_op
                and self.backend_divisors.get(op.node_id) == groups[comm.group].size):
            # The recorded ReduceOp is opaque, but the backend divided the result by the
            # group's size on its own thread: the collective averaged (gloo's AVG).
            comm.reduce_op = "AVG"
        self._follow_reductions(op, comm)
        return op

    def _follow_reductions(self, op: Op, comm: CommInfo) -> None:
        """Note which earlier collective reduced what a reduction whose group is not
        recorded reads (``CommInfo.reduces_result_of``), and remember what this one
        wrote."""
        rule = oprules.COMM_OPS[op.name]
        if rule.reduce_op is None or not op.args:
            return
        if not rule.implies_group and not comm.group_recorded:
            comm.reduces_result_of = next(
                (self.reduced[tv.trace_id, tv.storage_id] for arg in op.args
                 for tv in iter_tensors(arg.value)
                 if (tv.trace_id, tv.storage_id) in self.reduced), None)
        for tv in iter_tensors(op.args[0].value):
            self.reduced[tv.trace_id, tv.storage_id] = op.node_id

    def group_of(self, name: object) -> int:
        """The benchmark's group for a recorded pg_name (functional collectives name
        their group); the default group where the name is not among the recorded ones."""
        for g in self.groups:
            if g.name == name and replayable(g, self.world_size):
                return g.index
        return self.default_group

    def finish(self, ops: list[Op], program_notes: list[str]):
        """Place waits; return the trace's DistInfo (None without any communication)."""
        comm_ops = [op for op in ops if op.comm is not None]
        functional = any(op.signature.namespace in oprules.FUNCTIONAL_NAMESPACES
                         for op in ops)
        placed = place_waits(ops, self.scan, serial=self.serial)
        place_functional_waits(ops, self.nested_waits)
        info = dist_info(self.trace, list(self.scan.ops.values()),
                         bool(comm_ops) or functional)
        if info is None:
            return None
        if comm_ops:
            unknown = sum(1 for op in comm_ops if group_index(self.scan.ops.get(op.node_id),
                                                               info.groups) is None)
            if unknown and info.groups_recorded and len(info.groups) > 1:
                info.notes.append(
                    f"{unknown} collectives do not record their process group (no "
                    f"record_param_comms): {self.sized} run on the group their sizes "
                    "imply (the first of that size this rank is in), the others on the "
                    "default group, save where the job's ranks place them on a mesh "
                    "dimension (below)")
            unrecorded = _counts(op.name for op in comm_ops if op.comm is not None
                                 and oprules.COMM_OPS[op.name].reduce_op
                                 and op.comm.reduce_op is None)
            if unrecorded:
                info.notes.append("reduce op not recorded (ReduceOp is written as an "
                                  f"opaque object), SUM replayed: {unrecorded}")
            for name, count in Counter(op.name for op in comm_ops).items():
                if oprules.COMM_OPS[name].note:
                    info.notes.append(f"{name} x{count}: {oprules.COMM_OPS[name].note}")
            p2p = [op for op in comm_ops if op.comm and op.comm.asynchronous
                   and not op.comm.wait_recorded and oprules.COMM_OPS[op.name].point_to_point]
            asynchronous = [op for op in comm_ops if op.comm and op.comm.asynchronous
                            and op not in p2p]
            if asynchronous:
                info.notes.append(
                    f"{len(asynchronous)} collectives run async; {placed} waits placed where "
                    "the trace waits, the rest before the first op that uses their tensors "
                    "or the next collective on their group")
            if p2p:
                info.notes.append(
                    f"{len(p2p)} sends and recvs run as isend/irecv in recorded order, so "
                    "that ranks pair them up as recorded without waiting on each other; "
                    "each is waited before the first op that needs it done (a recv: uses "
                    "its tensor, a send: writes it), else at the end of the iteration")
        for g in info.groups:
            if not replayable(g, info.world_size):
                info.notes.append(f"process group {g.name!r} ({g.desc}) has {g.size} ranks "
                                  "but no member list: its collectives run on the default group")
        program_notes.extend(info.notes)
        return info


def _recorded_group_ranks(trace: RawTrace) -> dict[int, int]:
    """Storage id of each result of an op that records the rank within its group of
    the collective reading it (oprules.GROUP_RANK_ARGS) -> that rank."""
    found: dict[int, int] = {}
    for node in trace.nodes:
        arg_name = oprules.GROUP_RANK_ARGS.get(node.name)
        if arg_name is None or not node.op_schema:
            continue
        try:
            names = [a.name for a in parse_signature(node.op_schema).args]
        except SchemaError:
            continue
        k = names.index(arg_name) if arg_name in names else len(node.inputs)
        value = node.inputs[k].value if k < len(node.inputs) else None
        if isinstance(value, int) and not isinstance(value, bool):
            for arg in node.outputs:
                found.update((sid, value) for sid in raw_storage_ids(arg) if sid)
    return found


def regroup_sized_collectives(programs: Sequence[Program], ranks: Sequence[int]) -> int:
    """Put the collectives whose group only their sizes imply on one mesh dimension
    whose ranks issue them alike.

    Each rank picked the first group of the implied size it is in: on a device mesh,
    the first dimension's. Under torchtitan's ``("pp", "dp")`` layout FSDP2 gathers on
    ``dp``, and pipeline stages hold different parameters, so on the ``pp`` groups the
    gathers of two stages met with different sizes and gloo failed. The groups of one
    size form dimensions (disjoint groups covering every rank, created one after
    another); the first dimension in which every group's members issue the same calls
    with the same tensor sizes is chosen, the current one where it qualifies. Returns
    how many collectives moved."""
    by_rank = dict(zip(ranks, programs, strict=True))
    info = next((p.distributed for p in programs if p.distributed is not None), None)
    if info is None:
        return 0
    sized: dict[int, dict[int, list[Op]]] = {}  # group size -> rank -> its collectives
    for rank, program in by_rank.items():
        for op in program.ops:
            if op.comm is not None and op.comm.sized and op.comm.group < len(info.groups):
                size = info.groups[op.comm.group].size
                sized.setdefault(size, {}).setdefault(rank, []).append(op)
    # A gather's or scatter's other ranks pass no list, so no size: they go with the
    # roots' calls of the same tensor, and the roots' places choose the dimension.
    listless = {rank: [op for op in program.ops if _rooted(op) and not _lists_members(op)]
                for rank, program in by_rank.items()}
    moved = 0
    for size, sized_of in sized.items():
        calls = {_signature_of(op) for ops in sized_of.values() for op in ops if _rooted(op)}
        ops_of = {rank: sorted([*sized_of.get(rank, []), *(
            op for op in listless[rank] if _signature_of(op) in calls)], key=lambda op: op.index)
            for rank in by_rank}
        dimensions = _dimensions(info.groups, size, info.world_size)
        current = {op.comm.group for ops in sized_of.values() for op in ops if op.comm}
        dimensions.sort(key=lambda d: not current <= {g.index for g in d})
        chosen = next((d for d in dimensions if _issued_alike(d, ops_of)
                       and _at_recorded_places(d, ops_of)), None)
        if chosen is not None:
            moved += _move(ops_of, chosen)
        else:
            moved += _sized_on_overlapping_groups(info, size, ops_of)
    return moved


def _sized_on_overlapping_groups(info: DistInfo, size: int,
                                 ops_of: dict[int, list[Op]]) -> int:
    """Where no mesh dimension of ``size`` fits (groups of that size that overlap:
    ``new_group([0, 1])``, ``[1, 2]``, ``[0, 2]`` on 3 ranks), give each such group, in
    creation order, the calls its members issue alike, in order, among those not yet
    placed; only where every call then has a group (else nothing moves). Each rank had
    put every call on the first group of that size it is in: on 3 ranks, rank 0's
    all-gathers on ``[0, 2]`` went to ``[0, 1]``, rank 2's to ``[1, 2]``, and the replay
    hung. Returns how many moved."""
    candidates = [g for g in info.groups if g.size == size and g.ranks is not None]
    member_of = Counter(rank for g in candidates for rank in g.ranks or ())
    if not any(count > 1 for count in member_of.values()):
        return 0  # one group of that size per rank: the first is the only one
    taken, rest = _groups_take_common_calls(candidates, ops_of)
    if not taken or any(rest.values()):
        return 0
    return sum(_move(inside, [group]) for group, inside in taken)


def _rooted(op: Op) -> bool:
    """A gather or scatter whose group the trace does not record."""
    rule = oprules.COMM_OPS.get(op.name)
    return (op.comm is not None and rule is not None and rule.root is not None
            and rule.group_members is not None and not op.comm.group_recorded)


def _lists_members(op: Op) -> bool:
    """Whether a gather or scatter passes its list of one tensor per member (the
    root does)."""
    rule = oprules.COMM_OPS[op.name]
    return implied_group_size(rule, {a.spec.name: a.value for a in op.args}) is not None


def regroup_second_reductions(programs: Sequence[Program], ranks: Sequence[int]) -> int:
    """Run each reduction that records no group, of a result another collective
    reduced (``CommInfo.reduces_result_of``), on the mesh dimension that crosses the
    first one's group at each rank only.

    HSDP reduce-scatters gradients over the shard groups, then all-reduces each shard
    over the replicas; gloo records neither's group, and the all-reduce has no sizes
    to imply one, so it ran on the default group, summing the shard groups' results
    again. A second reduction over ranks that already hold the sum is never what a
    program means: the first dimension (in creation order) whose group at each rank
    meets the first reduction's group there only, and whose members issue the calls
    alike, is chosen. Run after :func:`regroup_sized_collectives`, which settles the
    first reductions' groups. Returns how many collectives moved."""
    by_rank = dict(zip(ranks, programs, strict=True))
    info = next((p.distributed for p in programs if p.distributed is not None), None)
    if info is None:
        return 0
    seconds: dict[int, list[tuple[Op, ProcessGroupSpec]]] = {}  # rank -> (op, first's group)
    for rank, program in by_rank.items():
        group_of_node = {op.node_id: op.comm.group for op in program.ops if op.comm}
        for op in program.ops:
            first = op.comm.reduces_result_of if op.comm else None
            if first is None or group_of_node.get(first, len(info.groups)) >= len(info.groups):
                continue
            seconds.setdefault(rank, []).append((op, info.groups[group_of_node[first]]))
    if not seconds:
        return 0
    ops_of = {rank: [op for op, _ in pairs] for rank, pairs in seconds.items()}

    def crosses(dimension: list[ProcessGroupSpec]) -> bool:
        return all(len(set(_group_at(dimension, rank).ranks or ())
                       & set(first.ranks or ())) == 1
                   for rank, pairs in seconds.items() for _, first in pairs)

    chosen = next((d for d in _mesh_dimensions(info)
                   if crosses(d) and _issued_alike(d, ops_of)), None)
    return 0 if chosen is None else _move(ops_of, chosen)


def regroup_unaligned_collectives(programs: Sequence[Program],
                                  ranks: Sequence[int]) -> int:
    """Move the collectives that record no group and sit on the default group to the
    first mesh dimension whose groups' members issue them alike, where the job's ranks
    do not issue them alike, or, where none fits, in part to a group over some ranks
    only (:func:`_regroup_on_partial_groups`).

    Data parallel over a mesh's ``dp`` groups beside pipeline stages of different
    sizes: gloo records no group for each stage's gradient all-reduce, and on the
    default group the stages' all-reduces met with different sizes, and gloo aborted.
    Where every rank issues the same calls with the same sizes, they stay (nothing
    tells which group was meant, and the default group runs them). Run after the other
    regroupings. Returns how many collectives moved."""
    found = _ungrouped_calls(programs, ranks)
    if found is None:
        return 0
    info, ops_of = found
    # The calls every rank issues alike, in order (a world all-reduce of a loss beside
    # the stages' gradients), stay on the default group: only the others move.
    unaligned = _common_sequence(ops_of)[0]
    for moving in (unaligned, ops_of):
        chosen = next((d for d in _mesh_dimensions(info) if _issued_alike(d, moving)), None)
        if chosen is not None:
            return _move(moving, chosen)
    return _regroup_on_partial_groups(info, unaligned)


def _ungrouped_calls(programs: Sequence[Program], ranks: Sequence[int]
                     ) -> tuple[DistInfo, dict[int, list[Op]]] | None:
    """The job's groups and, per rank, its collectives that record no group and sit on
    the default group, where the ranks do not issue them alike; else None."""
    info = next((p.distributed for p in programs if p.distributed is not None), None)
    if info is None:
        return None
    default = default_group_index(info.groups) if info.groups else 0
    ops_of = {rank: [op for op in program.ops if op.comm is not None
                     and not op.comm.group_recorded and op.comm.group == default
                     and not oprules.COMM_OPS[op.name].point_to_point]
              for rank, program in zip(ranks, programs, strict=True)}
    if len({tuple(_signature_of(op) for op in ops) for ops in ops_of.values()}) <= 1:
        return None
    return info, ops_of


def ambiguous_regrouping(programs: Sequence[Program], ranks: Sequence[int]) -> int:
    """How many calls :func:`regroup_unaligned_collectives` will keep on the default
    group (every rank issues them alike, in order) that a mesh dimension's members
    issue alike together with the calls that move: both placements fit what the ranks
    recorded, and gloo records no group to tell them apart. Size alone can match calls
    of different groups (an all-reduce of 4 elements on [0, 1] and another on [2, 3]
    met on the world group). 0 where the placement is unambiguous; call it before."""
    found = _ungrouped_calls(programs, ranks)
    if found is None:
        return 0
    info, ops_of = found
    unaligned = _common_sequence(ops_of)[0]
    kept = sum(len(ops_of[r]) - len(unaligned[r]) for r in ops_of)
    if not kept or not any(_issued_alike(d, unaligned) for d in _mesh_dimensions(info)):
        return 0
    return kept if any(_issued_alike(d, ops_of) for d in _mesh_dimensions(info)) else 0


def _regroup_on_partial_groups(info: DistInfo, unaligned: dict[int, list[Op]]) -> int:
    """Move the calls that the members of a recorded group over some ranks only issue
    alike (``new_group([0, 1])``; Megatron's embedding groups of each replica's first
    and last pipeline stage) to that group, where what is left then fits a mesh
    dimension or nothing is left. On the default group, the other ranks never issued
    them, and the members waited for those ranks forever. Groups take their calls in
    creation order; where what is left fits nothing, nothing moves. Returns how many
    moved."""
    partial = [g for g in info.groups
               if g.ranks is not None and 1 < len(g.ranks) < info.world_size]
    taken, rest = _groups_take_common_calls(partial, unaligned)
    if not taken:
        return 0
    moved = 0
    if any(rest.values()):
        dimension = next((d for d in _mesh_dimensions(info) if _issued_alike(d, rest)), None)
        if dimension is None:
            return 0
        moved += _move(rest, dimension)
    return moved + sum(_move(inside, [group]) for group, inside in taken)


def _groups_take_common_calls(groups: Sequence[ProcessGroupSpec], ops_of: dict[int, list[Op]]
                              ) -> tuple[list[tuple[ProcessGroupSpec, dict[int, list[Op]]]],
                                         dict[int, list[Op]]]:
    """Each of ``groups`` in turn takes, from what the groups before it left, the calls
    its members issue alike in one order (:func:`_common_sequence`): the groups that
    took some, each with its members' calls, and what is left per rank."""
    rest = {rank: list(ops) for rank, ops in ops_of.items()}
    taken: list[tuple[ProcessGroupSpec, dict[int, list[Op]]]] = []
    for group in groups:
        members = group.ranks
        if members is None or not all(rest.get(m) for m in members):
            continue
        inside = _common_sequence({m: rest[m] for m in members})[1]
        if not inside[members[0]]:
            continue
        moving = {id(op) for ops in inside.values() for op in ops}
        rest = {rank: [op for op in ops if id(op) not in moving] for rank, ops in rest.items()}
        taken.append((group, inside))
    return taken, rest


def _common_sequence(ops_of: dict[int, list[Op]]
                     ) -> tuple[dict[int, list[Op]], dict[int, list[Op]]]:
    """Per rank, its ops outside and inside a sequence of calls that every rank issues
    in that order with the same sizes (matched rank by rank with difflib's longest
    matching blocks: the longest common subsequence, near enough, in near-linear time)."""
    ranks = sorted(ops_of)
    common = [_signature_of(op) for op in ops_of[ranks[0]]]
    for rank in ranks[1:]:
        theirs = [_signature_of(op) for op in ops_of[rank]]
        matcher = difflib.SequenceMatcher(None, common, theirs, autojunk=False)
        common = [common[b.a + k] for b in matcher.get_matching_blocks()
                  for k in range(b.size)]
    outside: dict[int, list[Op]] = {}
    inside: dict[int, list[Op]] = {}
    for rank in ranks:
        ops = ops_of[rank]
        signatures = [_signature_of(op) for op in ops]
        matcher = difflib.SequenceMatcher(None, common, signatures, autojunk=False)
        matched = {b.b + k for b in matcher.get_matching_blocks() for k in range(b.size)}
        outside[rank] = [op for k, op in enumerate(ops) if k not in matched]
        inside[rank] = [op for k, op in enumerate(ops) if k in matched]
    return outside, inside


def _mesh_dimensions(info: DistInfo) -> list[list[ProcessGroupSpec]]:
    """Every mesh dimension of the job's groups (:func:`_dimensions`), in creation
    order; then each group over every rank but the default one (``new_group()`` for a
    side channel: gloo records no group, and its calls met the default group's in
    other orders on other ranks), as a dimension of its own."""
    sizes = sorted({g.size for g in info.groups if 1 < g.size < info.world_size})
    found = [d for size in sizes for d in _dimensions(info.groups, size, info.world_size)]
    default = default_group_index(info.groups) if info.groups else 0
    every = tuple(range(info.world_size))
    whole = [[replace(g, ranks=every)] for g in info.groups
             if g.index != default and g.size == info.world_size > 1
             and g.ranks in (None, every)]
    return sorted(found, key=lambda d: d[0].index) + whole


def _move(ops_of: dict[int, list[Op]], dimension: list[ProcessGroupSpec]) -> int:
    """Put each rank's ops on its group of ``dimension``; how many moved."""
    moved = 0
    for rank, ops in ops_of.items():
        if not ops:
            continue  # a rank outside a partial group's members issues none
        group = _group_at(dimension, rank).index
        for op in ops:
            assert op.comm is not None
            moved += op.comm.group != group
            op.comm.group = group
    return moved


def _group_at(dimension: list[ProcessGroupSpec], rank: int) -> ProcessGroupSpec:
    return next(g for g in dimension if rank in (g.ranks or ()))


def _issued_alike(dimension: list[ProcessGroupSpec], ops_of: dict[int, list[Op]]) -> bool:
    """Whether in every group of ``dimension`` the members issue the same collectives
    with the same tensor sizes."""
    return all(len({tuple(_signature_of(op) for op in ops_of.get(m, []))
                    for m in g.ranks or ()}) == 1 for g in dimension)


def _at_recorded_places(dimension: list[ProcessGroupSpec],
                        ops_of: dict[int, list[Op]]) -> bool:
    """Whether each rank sits in its group of ``dimension`` where its collectives'
    recorded group ranks (``CommInfo.group_rank``) put it, and each gather's or
    scatter's root (the rank that passes the list) at the recorded root's place."""
    for g in dimension:
        for place, rank in enumerate(g.ranks or ()):
            if any(op.comm is not None and (op.comm.group_rank not in (None, place) or (
                    _rooted(op) and (op.comm.root == place) != _lists_members(op)))
                   for op in ops_of.get(rank, [])):
                return False
    return True


def _dimensions(groups: Sequence[ProcessGroupSpec], size: int,
                world: int) -> list[list[ProcessGroupSpec]]:
    """The groups of ``size`` with member lists, as mesh dimensions: runs of disjoint
    groups, in creation order, that together hold every rank."""
    found: list[list[ProcessGroupSpec]] = []
    run: list[ProcessGroupSpec] = []
    for g in groups:
        if g.size != size or g.ranks is None:
            continue
        if any(set(g.ranks) & set(other.ranks or ()) for other in run):
            run = []
        run.append(g)
        if sum(len(other.ranks or ()) for other in run) == world:
            found.append(run)
            run = []
    return found


def _signature_of(op: Op) -> tuple[object, ...]:
    """A call and its sizes, as its group's members issue it alike (a gather or
    scatter by the tensor every member passes: only the root passes the list)."""
    assert op.comm is not None
    if _rooted(op):
        return (op.comm.call, *_own_payload(op))
    return (op.comm.call, *_payload(op))


def _own_payload(op: Op) -> list[tuple[int, str]]:
    """(elements, dtype) of what a gather sends or a scatter receives (its first
    argument): alike on the root and the other ranks."""
    return [(tv.meta.numel, tv.meta.dtype) for tv in iter_tensors(op.args[0].value)]


def _payload(op: Op) -> list[tuple[int, str]]:
    """(elements, dtype) of each tensor a communication op sends or receives."""
    return [(tv.meta.numel, tv.meta.dtype) for arg in op.args
            for tv in iter_tensors(arg.value)]


def place_rooted_collectives(programs: Sequence[Program], ranks: Sequence[int]) -> int:
    """Put a non-root rank's gather or scatter on its root's group.

    Gloo records no group for them, and only the root passes the list whose length is
    the group's size (:func:`implied_group_size`): on a subgroup, the root's call went
    to that subgroup and its peers' stayed on the default group, and the ranks waited
    for each other forever. Each rank's calls of unknown size are matched, in order,
    with the first unmatched call of a root that has the same call and tensor size, on
    a group holding both ranks, at whose recorded root place that root sits. Returns
    how many moved."""
    by_rank = dict(zip(ranks, programs, strict=True))
    info = next((p.distributed for p in programs if p.distributed is not None), None)
    if info is None:
        return 0

    roots = {r: [op for op in p.ops if _rooted(op) and _lists_members(op)]
             for r, p in by_rank.items()}
    taken: set[tuple[int, int]] = set()  # (id() of a root's call, rank) already paired
    moved = 0
    for rank, program in by_rank.items():
        for op in (op for op in program.ops if _rooted(op) and not _lists_members(op)):
            assert op.comm is not None
            match = next(((root, call) for root, calls in roots.items() if root != rank
                          for call in calls if (id(call), rank) not in taken
                          and _meets_its_root(op, call, rank, root, info)), None)
            if match is None:
                continue
            taken.add((id(match[1]), rank))
            assert match[1].comm is not None
            moved += op.comm.group != match[1].comm.group
            op.comm.group = match[1].comm.group
    return moved


def _meets_its_root(op: Op, call: Op, rank: int, root: int, info: DistInfo) -> bool:
    """Whether ``call``, the root ``root``'s, is the one ``op`` of ``rank`` joined."""
    assert op.comm is not None and call.comm is not None
    if _signature_of(op) != _signature_of(call) or op.comm.root != call.comm.root:
        return False
    group = info.groups[call.comm.group] if call.comm.group < len(info.groups) else None
    if group is None:
        return False
    members = _members(group, info.world_size)
    return (members is not None and rank in members and call.comm.root is not None
            and 0 <= call.comm.root < len(members) and members[call.comm.root] == root)


def _members(group: ProcessGroupSpec, world_size: int) -> tuple[int, ...] | None:
    """A group's global ranks in group order: recorded, or every rank for a group over
    the whole world; None where unknown."""
    if group.ranks is not None:
        return group.ranks
    return tuple(range(world_size)) if group.size == world_size else None


def pair_point_to_point(programs: Sequence[Program], ranks: Sequence[int]) -> int:
    """Put each send and its recv on one process group whose members pair them.

    A send's peer is a rank within its group (``group_dst``), and a gloo trace records
    no group: on the default group, a pipeline stage over a device mesh's ``pp``
    dimension sent to the wrong rank, or to itself. Each rank's sends are matched, in
    order, with the first unmatched recv of a peer that takes the same tensor and tag
    on a group holding both ranks where each names the other at its recorded place;
    the group already given is tried first. Both ends then run on that group. Returns
    how many sends and recvs moved to another group."""
    by_rank = dict(zip(ranks, programs, strict=True))
    p2p = {r: [op for op in prog.ops if op.comm is not None
               and oprules.COMM_OPS[op.name].point_to_point] for r, prog in by_rank.items()}
    matched: set[int] = set()  # id() of recvs already paired
    unpaired: list[tuple[int, Op]] = []  # sends no named recv takes, in rank order
    moved = 0
    for rank, ops in p2p.items():
        for send in ops:
            if oprules.COMM_OPS[send.name].point_to_point != "send":
                continue
            for group, peer in _peers(by_rank[rank], rank, send):
                recv = next((op for op in p2p.get(peer, ()) if id(op) not in matched
                             and oprules.COMM_OPS[op.name].point_to_point == "recv"
                             and _carries_the_same(send, op)
                             and (group, rank) in _peers(by_rank[peer], peer, op)), None)
                if recv is None:
                    continue
                matched.add(id(recv))
                for op in (send, recv):
                    assert op.comm is not None
                    moved += op.comm.group != group
                    op.comm.group = group
                break
            else:
                unpaired.append((rank, send))
    # Recvs from any source (``recv_any_source_``: no peer recorded): each takes, in
    # recorded order, the first send to its rank that no named recv paired, of the
    # same tensor and tag, on a group holding both; that sender is its peer for
    # unpaired_point_to_point (the call names none: it replays from any source).
    for rank, send in unpaired:
        info = by_rank[rank].distributed
        assert info is not None  # it has a send
        for group, peer in _peers(by_rank[rank], rank, send):
            members = _members(info.groups[group], info.world_size)
            if not members or peer not in by_rank:
                continue
            recv = next((op for op in p2p.get(peer, ()) if id(op) not in matched
                         and op.comm is not None and op.comm.root is None
                         and oprules.COMM_OPS[op.name].point_to_point == "recv"
                         and _carries_the_same(send, op)), None)
            if recv is None:
                continue
            matched.add(id(recv))
            assert recv.comm is not None and send.comm is not None
            moved += recv.comm.group != group
            send.comm.group = recv.comm.group = group
            recv.comm.root = members.index(rank)
            break
    return moved


def unpaired_point_to_point(programs: Sequence[Program],
                            ranks: Sequence[int]) -> list[tuple[int, int, str]]:
    """Where one rank sends another more or fewer tensors than that rank receives from
    it (after :func:`pair_point_to_point`): a filter that kept a recv but not its send
    (``--max-ops``) left the receiver waiting forever, and nothing said so. Per pair of
    ranks that differ: (program index, program index, message). Ranks the benchmark
    does not hold are not counted."""
    index = {rank: k for k, rank in enumerate(ranks)}
    counts: dict[tuple[int, int, str], int] = {}  # (from, to, "send"|"recv") -> calls
    for k, program in enumerate(programs):
        for op in program.ops:
            kind = oprules.COMM_OPS[op.name].point_to_point if op.comm is not None else None
            peer = _peer_of(program, ranks[k], op) if kind else None
            if peer is None or peer not in index:
                continue
            key = (ranks[k], peer, kind) if kind == "send" else (peer, ranks[k], str(kind))
            counts[key] = counts.get(key, 0) + 1
    found = []
    for src, dst in sorted({(a, b) for a, b, _ in counts}):
        sent, received = counts.get((src, dst, "send"), 0), counts.get((src, dst, "recv"), 0)
        if sent != received:
            found.append((index[src], index[dst], (
                f"rank {src} sends rank {dst} {sent} tensor(s), and rank {dst} receives "
                f"{received} from it: the benchmark would hang at the unpaired ones "
                "(a filter may have kept one end of a send and recv without the other)")))
    return found


def _peer_of(program: Program, rank: int, op: Op) -> int | None:
    """The global rank a send or recv addresses on the group it runs on."""
    group = op.comm.group if op.comm is not None else None
    return next((peer for g, peer in _peers(program, rank, op) if g == group), None)


def _peers(program: Program, rank: int, op: Op) -> list[tuple[int, int]]:
    """(group index, global rank) this send or recv may address: its recorded peer
    within each group holding ``rank``, never itself, the group it has first."""
    info, comm = program.distributed, op.comm
    if info is None or comm is None or comm.root is None:
        return []
    found = []
    for g in info.groups:
        members = _members(g, info.world_size)
        if members and rank in members and 0 <= comm.root < len(members) \
                and members[comm.root] != rank:
            found.append((g.index, members[comm.root]))
    found.sort(key=lambda pair: pair[0] != comm.group)
    return found


def _carries_the_same(send: Op, recv: Op) -> bool:
    assert send.comm is not None and recv.comm is not None
    return send.comm.tag == recv.comm.tag and _payload(send) == _payload(recv)


def rank_disagreements(programs: Sequence[Program],
                       ranks: Sequence[int]) -> list[tuple[int, int, str]]:
    """Where the ranks of one benchmark would not meet: on a process group, the member
    ranks' replayed collectives (c10d and functional; sends and recvs pair apart) must
    be the same calls in the same order, or each waits for the others forever. Per
    group that differs: (program index, program index, message) of the first two
    members that part, and where (an op one rank could not replay is named in its
    "Ops not replayed")."""
    sequences = [_collectives_by_group(p) for p in programs]
    found = []
    groups = sorted({g for seq in sequences for g in seq})
    for g in groups:
        members = [k for k, p in enumerate(programs) if _member(p, g, ranks[k])]
        if len(members) < 2:
            continue
        first = members[0]
        for k in members[1:]:
            a, b = sequences[first].get(g, []), sequences[k].get(g, [])
            if [(call, sizes) for call, _, sizes in a] == [(call, sizes) for call, _, sizes in b]:
                continue
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False))
                       if (x[0], x[2]) != (y[0], y[2])),
                      min(len(a), len(b)))
            sized_apart = at < min(len(a), len(b)) and a[at][0] == b[at][0]
            found.append((first, k, (
                f"ranks {ranks[first]} and {ranks[k]} replay different collectives on "
                f"process group {g} ({len(a)} against {len(b)}; collective "
                f"#{at + 1}: {_which(a, at)} against {_which(b, at)}"
                + (", with tensors of other sizes" if sized_apart else "")
                + "): the benchmark would hang or fail there; see each rank's ops not "
                "replayed")))
            break
    return found


Issued = tuple[str, int, tuple[tuple[int, str], ...] | None]


def _collectives_by_group(program: Program) -> dict[int, list[Issued]]:
    """(call, node id, sizes) of each replayed collective, by process group index;
    sizes: (elements, dtype) of its tensors where every member passes the same
    (``CommRule.same_sizes``), else None."""
    out: dict[int, list[Issued]] = {}
    for op in program.ops:
        if op.comm is not None:
            rule = oprules.COMM_OPS[op.name]
            if rule.point_to_point:
                continue
            sizes = tuple(_payload(op)) if rule.same_sizes else None
            out.setdefault(op.comm.group, []).append((op.comm.call, op.node_id, sizes))
        elif (op.signature.namespace in oprules.FUNCTIONAL_NAMESPACES
              and op.signature.name not in oprules.COLLECTIVE_HELPERS):
            group = next((a.value.index for a in op.args if isinstance(a.value, GroupName)),
                         None)
            if group is not None:
                out.setdefault(group, []).append((op.signature.name, op.node_id, None))
    return out


def _member(program: Program, group: int, rank: int) -> bool:
    info = program.distributed
    if info is None or group >= len(info.groups):
        return False
    members = info.groups[group].ranks
    return members is None or rank in members


def _which(sequence: list[Issued], at: int) -> str:
    if at >= len(sequence):
        return "none"
    call, node_id, _ = sequence[at]
    return f"{call}, node {node_id}"


def _counts(names: Iterable[str]) -> str:
    """``c10d::allreduce_ x3, c10d::reduce_ x1`` in order of first appearance."""
    return ", ".join(f"{name} x{count}" for name, count in Counter(names).items())


def replayable(group: ProcessGroupSpec, world: int) -> bool:
    """new_group can rebuild it: its members are listed, or it spans the world."""
    return group.ranks is not None or group.size == world


def collective_sequence(trace: RawTrace) -> list[tuple[str, tuple[object, ...], tuple[str, ...]]]:
    """(op, recorded tensor shapes, string arguments) of every top-level collective (c10d
    and functional; waits left out), in order: what a replay must reproduce rank by rank (compare a
    replay's trace with its original). The strings are a functional collective's reduce
    op and group name: a replay creates the recorded groups in their recorded order, so
    its group names are the recorded ones."""
    out = []
    for sel in select_ops(trace).ops:
        node = sel.node
        collective = node.name.split("::", 1)[0] in ("c10d", *oprules.FUNCTIONAL_NAMESPACES)
        # A wait is not a collective: where the original waited inside the op that read
        # the result (DTensor), the replay waits just before that op, at top level.
        if not collective or node.name.endswith("wait_tensor") or HARNESS_SCOPE in sel.scope:
            continue
        shapes = tuple(_freeze(a.shape) for a in node.inputs if a.type.startswith(
            ("Tensor", "GenericList[Tensor", "GenericList[GenericList[Tensor")))
        strings = tuple(a.value for a in node.inputs
                        if a.type == "String" and isinstance(a.value, str))
        out.append((node.name, shapes, strings))
    return out


def _freeze(value: Any) -> object:
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


# The most positions the search of :func:`settle_unrecorded_groups` visits before it
# gives up (each is one set of how far every rank got; dead ends are remembered).
SETTLE_BUDGET = 50_000


def settle_unrecorded_groups(programs: Sequence[Program], ranks: Sequence[int]
                             ) -> tuple[int, list[str]]:
    """Check, after the other regroupings, that the collectives whose group the trace
    does not record meet: on each group, its members issue the same calls in the same
    order, and no rank blocks in one group's call while a peer blocks in another's
    that waits on it. Where they would not, search for a placement that does, each
    call on a group of the size its tensors imply (else any group over two ranks or
    more holding its rank), its rank at its recorded place and a gather's root at the
    root's: the ranks' calls are fired as the original ran them, one group's call at
    a time, on a group whose every member issues it next (depth first, the current
    groups tried first, dead ends remembered).

    The regroupings place calls by their sizes and a common order: on groups of one
    size that overlap (``new_group([0, 1])``, ``[1, 2]``, ``[0, 2]`` on 3 ranks) two
    pairs' gathers of one size all went to ``[0, 1]`` on ranks 0 and 1 and to
    ``[1, 2]`` on rank 2, and a world all-reduce of a pair's size was taken for the
    pair's call: the replay hung. Returns how many calls moved, and a warning per
    rank set where no placement fits (naming where the ranks stop), so that the
    generator says so rather than emit a benchmark that hangs without a word."""
    info = next((p.distributed for p in programs if p.distributed is not None), None)
    if info is None:
        return 0, []
    members = {g.index: _members(g, info.world_size) for g in info.groups}
    ops_of = {rank: [op for op in program.ops if op.comm is not None
                     and not op.comm.group_recorded and op.comm.group in members
                     and members[op.comm.group] is not None
                     and not oprules.COMM_OPS[op.name].point_to_point]
              for rank, program in zip(ranks, programs, strict=True)}
    if not any(ops_of.values()) or _meet(ops_of, members):
        return 0, []
    choices = {rank: [_group_choices(op, rank, info, members) for op in ops]
               for rank, ops in ops_of.items()}
    placed, stuck = _fire(ops_of, choices, members)
    if placed is None:
        where = "; ".join(f"rank {rank}: {op.comm.call if op.comm else op.name}, node "
                          f"{op.node_id}" for rank, op in stuck)
        return 0, [f"no placement of the collectives that record no process group (gloo "
                   "records none) lets every group's members issue them in one order: "
                   f"the replay would hang or fail where the ranks stop ({where})"]
    moved = 0
    for ops in ops_of.values():
        for op in ops:
            assert op.comm is not None
            moved += op.comm.group != placed[id(op)]
            op.comm.group = placed[id(op)]
    return moved, []


def _meet(ops_of: dict[int, list[Op]], members: dict[int, tuple[int, ...] | None]) -> bool:
    """Whether the ranks' calls, on their current groups, meet: the same calls in one
    order on each group's members, and every rank gets past each blocking call (an
    async one does not block its rank)."""
    on: dict[int, dict[int, list[tuple[object, ...]]]] = {}
    for rank, ops in ops_of.items():
        for op in ops:
            assert op.comm is not None
            on.setdefault(op.comm.group, {}).setdefault(rank, []).append(_matching(op))
    for g, calls in on.items():
        if len({tuple(calls.get(m, ())) for m in members[g] or ()}) > 1:
            return False
    issued: dict[int, Counter[int]] = {g: Counter() for g in on}
    pos = dict.fromkeys(ops_of, 0)
    waiting: dict[int, tuple[int, int] | None] = dict.fromkeys(ops_of)
    progress = True
    while progress:
        progress = False
        for rank, ops in ops_of.items():
            while True:
                wait = waiting[rank]
                if wait is not None:
                    g, k = wait
                    if any(issued[g][m] < k for m in members[g] or ()):
                        break
                    waiting[rank] = None
                if pos[rank] == len(ops):
                    break
                op = ops[pos[rank]]
                assert op.comm is not None
                pos[rank] += 1
                progress = True
                issued[op.comm.group][rank] += 1
                if not op.comm.asynchronous:
                    waiting[rank] = (op.comm.group, issued[op.comm.group][rank])
    return all(pos[r] == len(ops) and waiting[r] is None for r, ops in ops_of.items())


def _matching(op: Op) -> tuple[object, ...]:
    """What the members of a group issue alike for one call: the call, its root's
    place in the group and, where every member passes the same (``CommRule.same_sizes``:
    not an all-to-all's uneven splits), its sizes."""
    assert op.comm is not None
    if _rooted(op) or oprules.COMM_OPS[op.name].same_sizes:
        return (op.comm.root, *_signature_of(op))
    return (op.comm.root, op.comm.call)


def _group_choices(op: Op, rank: int, info: DistInfo,
                   members: dict[int, tuple[int, ...] | None]) -> tuple[int, ...]:
    """The groups a call that records none may have run on, its current one first:
    those of the size its tensors imply (any of two ranks or more where they imply
    none) that hold its rank at its recorded place and, for a gather or scatter, its
    root where the root passes the list and another rank where it does not."""
    assert op.comm is not None
    size = info.groups[op.comm.group].size if op.comm.sized else None
    found = [op.comm.group]
    for g in info.groups:
        ranks = members[g.index]
        if g.index == op.comm.group or ranks is None or rank not in ranks:
            continue
        if (size is not None and g.size != size) or (size is None and len(ranks) < 2):
            continue
        if op.comm.group_rank is not None and ranks.index(rank) != op.comm.group_rank:
            continue
        root = op.comm.root
        if root is not None and not 0 <= root < len(ranks):
            continue
        if _rooted(op) and (ranks[root] == rank) != _lists_members(op):  # type: ignore[index]
            continue
        found.append(g.index)
    return tuple(found)


def _fire(ops_of: dict[int, list[Op]], choices: dict[int, list[tuple[int, ...]]],
          members: dict[int, tuple[int, ...] | None]
          ) -> tuple[dict[int, int] | None, list[tuple[int, Op]]]:
    """Fire the ranks' calls one group's call at a time, as blocking collectives meet:
    a group fires where each member's next call may run on it and all match. Depth
    first over which group fires, the groups every member's call is on now first;
    positions that lead nowhere are remembered. Returns the group of each call (by
    ``id``) where every call fired, else None and the calls the ranks stopped at in
    the furthest position reached."""
    order = sorted(ops_of)
    at = {rank: k for k, rank in enumerate(order)}
    lengths = tuple(len(ops_of[r]) for r in order)
    signatures = {r: [_matching(op) for op in ops_of[r]] for r in order}

    def ready(state: tuple[int, ...]) -> list[int]:
        heads = {r: choices[r][state[at[r]]] for r in order if state[at[r]] < lengths[at[r]]}
        found: list[tuple[bool, int]] = []
        for g in sorted({g for options in heads.values() for g in options}):
            ranks = members[g] or ()
            if not all(m in heads and g in heads[m] for m in ranks):
                continue
            if len({signatures[m][state[at[m]]] for m in ranks}) != 1:
                continue
            found.append((not all(heads[m][0] == g for m in ranks), g))
        return [g for _, g in sorted(found)]

    start = tuple(0 for _ in order)
    stack: list[tuple[tuple[int, ...], list[int], int]] = [(start, ready(start), 0)]
    fired: list[tuple[tuple[int, ...], int]] = []  # (position, group) leading to each frame
    dead: set[tuple[int, ...]] = set()
    furthest = start
    visited = 0
    while stack:
        state, options, k = stack[-1]
        if state == lengths:
            placed: dict[int, int] = {}
            for before, g in fired:
                for m in members[g] or ():
                    placed[id(ops_of[m][before[at[m]]])] = g
            return placed, []
        if sum(state) > sum(furthest):
            furthest = state
        if k == len(options) or visited > SETTLE_BUDGET:
            dead.add(state)
            stack.pop()
            if fired:
                fired.pop()
            continue
        stack[-1] = (state, options, k + 1)
        g = options[k]
        nxt = tuple(s + (order[i] in (members[g] or ())) for i, s in enumerate(state))
        if nxt in dead:
            continue
        visited += 1
        fired.append((state, g))
        stack.append((nxt, ready(nxt), 0))
    stuck = [(r, ops_of[r][furthest[at[r]]]) for r in order if furthest[at[r]] < lengths[at[r]]]
    return None, stuck
