"""Tensor management: storage lifetimes, aliasing, dataflow and last use.

Trace ids are reused once memory is freed, so a storage id names a *lifetime*, not a
buffer: an op that outputs a storage id that none of its inputs carries starts a new
lifetime of that id, and so does a literal lifted from a tensor the lifetime has not
held, or lifted a second time (``aten::lift_fresh`` of ``torch.tensor(1.0)``: each
literal is lifted once, just after the step built it, and it may sit where a freed
tensor sat, on its storage id). Within a lifetime:

* a storage first seen as an input is *materialised*: one buffer, sized to cover
  every view of it in the lifetime, built before timing (weights, inputs, optimizer
  state); its views are ``as_strided`` views, so aliasing and in-place updates
  behave as in the original;
* a storage first seen as an output is *produced*: its value flows from the op that
  made it to its consumers (real dataflow); a view of it that no replayed op
  returned is derived with ``as_strided`` from the producer's result.

A storage id need not be memory. Tensor subclasses that wrap others (DTensor,
AsyncCollectiveTensor: ``_make_wrapper_subclass``) hold a storage without data, so the
observer records every one of them under the storage id of the null data pointer
(which zero-size tensors share too), with the offset of the tensor they wrap. Read as
one buffer, an FSDP2 optimizer's sharded parameters, gradients and states became
overlapping views of it, and ``_foreach_lerp_`` refused to write one while reading
another. Such a storage gives itself away: an op writes one of its tensors while
reading another that partially overlaps it, which PyTorch refuses on real memory, so
the original kept them apart (:func:`storages_without_memory`). Before planning, each
tensor on such a storage gets a storage id of its own, per tensor id and lifetime
(:func:`split_storages_without_memory`).

Afterwards every binding knows the last op that reads it, so the emitter can free
it there and peak memory follows the original.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from mystique_gen import oprules
from mystique_gen.ir import (
    Binding,
    DerivedView,
    InputView,
    Op,
    OpOutput,
    SparseLayout,
    Storage,
    TensorMeta,
    TensorValue,
    Value,
    contiguous_strides,
    iter_tensors,
)

ViewKey = tuple[int, tuple[int, ...], tuple[int, ...], str]


def view_key(meta: TensorMeta) -> ViewKey:
    return (meta.offset, meta.shape, meta.strides, meta.dtype)


@dataclass
class _Lifetime:
    storage: Storage
    views: dict[ViewKey, Binding] = field(default_factory=dict)
    handle: Binding | None = None  # a produced tensor whose storage this is
    known_extent: int = 0  # elements a produced buffer is known to hold
    # Results of oprules.DISTINCT_ALIASES ops, by trace tensor id: (view, binding). A
    # reader of that tensor reads the op's result, not the view it aliases.
    distinct: dict[int, tuple[ViewKey, Binding]] = field(default_factory=dict)
    # The trace tensor id of each replayed op's result in ``views`` on a materialised
    # storage: a reader of another tensor of that view (one no replayed op made) reads
    # a leaf of its own on the same memory (:func:`plan_tensors`).
    made_by: dict[ViewKey, int] = field(default_factory=dict)
    # The trace tensor ids read or made on it (a literal lifted from another is fresh).
    tensor_ids: set[int] = field(default_factory=set)
    lifted: bool = False  # an oprules.ASSIGNED_LITERALS op has read it


@dataclass
class TensorPlan:
    storages: list[Storage]
    notes: list[str]


def output_paths(outputs: list[Value]) -> list[tuple[tuple[int, ...], TensorValue]]:
    """(path, tensor) for every tensor an op returns; path indexes the op's result."""
    found = []
    for i, value in enumerate(outputs):
        if isinstance(value, TensorValue):
            found.append(((i,), value))
        else:
            for j, t in enumerate(iter_tensors(value)):
                found.append(((i, j), t))
    return found


def undefined_reads(ops: list[Op]) -> set[tuple[int, tuple[int, ...]]]:
    """(op index, output path) of every uninitialised output (oprules.
    UNINITIALISED_OUTPUTS, or a result on a storage an op was handed) whose values a
    recorded op reads before any recorded op writes them: the original defined them
    outside recorded ops, so the replay must build them as inputs. An op that returns a
    tensor on the same storage (a view, ``to`` or ``lift_fresh`` without a copy) reads
    no values; an argument the op writes defines them (``copy_``, ``fill_``, an
    ``out=``), unless it only changes metadata."""
    pending: dict[int, tuple[int, tuple[int, ...]]] = {}  # storage id -> its empty output
    found: set[tuple[int, tuple[int, ...]]] = set()
    for op in ops:
        outputs = output_paths(op.outputs)
        if pending:
            out_sids = {tv.storage_id for _p, tv in outputs}
            for arg in op.args:
                for tv in iter_tensors(arg.value):
                    sid = tv.storage_id
                    if sid not in pending or op.name in oprules.NO_VALUE_WRITES:
                        continue
                    if arg.spec.writes:
                        del pending[sid]  # defined by a recorded op
                    elif sid not in out_sids:
                        found.add(pending.pop(sid))  # values read
        if op.name in oprules.UNINITIALISED_OUTPUTS or _given_a_storage(op):
            for path, tv in outputs:
                pending[tv.storage_id] = (op.index, path)
    return found


def _given_a_storage(op: Op) -> bool:
    """Whether ``op`` puts its result on a storage the trace does not say how was made
    (``set_`` onto a DataLoader worker's shared memory, or a pickle's bytes): its
    values were written outside recorded ops."""
    return any(arg.spec.type == "Storage" for arg in op.args)


def is_non_overlapping_and_dense(meta: TensorMeta) -> bool:
    """PyTorch's ``is_non_overlapping_and_dense``: some order of the dimensions is
    contiguous (dimensions of size 1 take any stride)."""
    expected = 1
    for stride, size in sorted((s, n) for n, s in zip(meta.shape, meta.strides, strict=True)
                               if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def partially_overlap(a: TensorMeta, b: TensorMeta) -> bool:
    """Two views of one storage that PyTorch's ``get_overlap_status`` calls PARTIAL: the
    overlap its in-place and ``out=`` ops refuse ("some elements of the input tensor and
    the written-to tensor refer to a single memory location"). The same elements with
    the same strides are a FULL overlap (``x.add_(x)``), which they accept; views it
    cannot judge cheaply (not dense) it lets through, and so does this."""
    if (a.dtype, a.device) != (b.dtype, b.device) or a.numel == 0 or b.numel == 0:
        return False
    if not (is_non_overlapping_and_dense(a) and is_non_overlapping_and_dense(b)):
        return False
    a_end, b_end = a.offset + a.numel, b.offset + b.numel
    if (a.offset, a_end) == (b.offset, b_end):
        return a.strides != b.strides
    return a.offset < b_end and b.offset < a_end


def _checked_pairs(op: Op) -> Iterator[tuple[TensorValue, TensorValue]]:
    """(written, read) tensors of one op that PyTorch checks for partial overlap: each
    tensor an argument the op writes holds (``Tensor(a!)``, ``out=``) with each tensor of
    every other argument; a foreach op's lists of one length pair by position, as the
    op works on them one position at a time."""
    if op.name in oprules.NO_VALUE_WRITES:
        return
    groups = [(arg.spec.writes, list(iter_tensors(arg.value))) for arg in op.args]
    for i, (writes, written) in enumerate(groups):
        if not writes:
            continue
        for j, (_other_writes, other) in enumerate(groups):
            if j == i:
                continue
            if len(written) > 1 and len(other) == len(written):
                yield from zip(written, other, strict=True)
            else:
                yield from ((w, r) for w in written for r in other)


def storages_without_memory(ops: list[Op]) -> set[int]:
    """Storage ids the original cannot have used as one memory: an op wrote a tensor on
    one while reading another tensor on it that partially overlaps the first. PyTorch
    refuses that, so the two were apart: the id is not an allocation but, in practice,
    the null data pointer's, which tensor subclass wrappers (DTensor) record."""
    found: set[int] = set()
    for op in ops:
        for written, read in _checked_pairs(op):
            if written.storage_id == read.storage_id and partially_overlap(written.meta,
                                                                           read.meta):
                found.add(written.storage_id)
    return found


def split_storages_without_memory(ops: list[Op]) -> int:
    """Give every tensor on a storage without memory (:func:`storages_without_memory`)
    a storage id of its own, per tensor id and lifetime: an op's output whose tensor id
    none of its inputs on that storage carries is a new tensor (the observer's tensor
    ids are TensorImpl addresses, which are reused too). Nothing on such a storage shares
    memory with anything else in the replay. Sparse tensors have no storage at all (all
    on id 0) and are split alike, and so are tensors of no elements, on any id. Returns
    the number of dense tensors given one on storages without memory."""
    without_memory = storages_without_memory(ops)
    flagged = without_memory | {tv.storage_id for op in ops for tv in _tensors_of(op)
                                if tv.meta.storageless}
    if not flagged and not any(tv.meta.numel == 0 for op in ops for tv in _tensors_of(op)):
        return 0

    def split(tv: TensorValue) -> bool:
        # A tensor of no elements shares no memory, whatever id its (null, or any)
        # data pointer gave it: an FSDP2 rank's empty shard of SGD's momentum sat on
        # the null pointer's id with a functional all-reduce's AsyncCollectiveTensor,
        # and its replay, a view of that result, waited on the collective.
        return tv.storage_id in flagged or tv.meta.numel == 0
    next_id = 1 + max(tv.storage_id for op in ops for tv in _tensors_of(op))
    current: dict[tuple[int, int], int] = {}
    dense: set[int] = set()  # new ids given to tensors on storages without memory
    layouts: dict[tuple[int, int], SparseLayout] = {}  # a sparse tensor's, as last seen

    def assign(tv: TensorValue, key: tuple[int, int]) -> None:
        nonlocal next_id
        if tv.meta.sparse is not None:
            if layouts.get(key, tv.meta.sparse) != tv.meta.sparse:
                # Another lifetime of the id (passes/select.sparse_tensors), that no op
                # returned: autograd's unpacking of a saved tensor at a reused address.
                current.pop(key, None)
            layouts[key] = tv.meta.sparse
        if key not in current:
            current[key] = next_id
            if key[0] in without_memory:
                dense.add(next_id)
            next_id += 1
        tv.storage_id = current[key]

    for op in ops:
        read: set[tuple[int, int]] = set()
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                if split(tv):
                    key = (tv.storage_id, tv.trace_id)
                    read.add(key)
                    assign(tv, key)
        for _path, tv in output_paths(op.outputs):
            if split(tv):
                key = (tv.storage_id, tv.trace_id)
                if key not in read:
                    current.pop(key, None)  # a new tensor that reuses the id
                assign(tv, key)
    return len(dense)


def _tensors_of(op: Op) -> Iterator[TensorValue]:
    for value in [a.value for a in op.args] + list(op.outputs):
        yield from iter_tensors(value)


def plan_tensors(ops: list[Op], strides_recorded: bool = True) -> TensorPlan:
    split = split_storages_without_memory(ops)
    undefined = undefined_reads(ops)
    current: dict[int, _Lifetime] = {}
    shadows: dict[tuple[int, str, str], _Lifetime] = {}
    storages: list[Storage] = []
    notes: list[str] = []
    dtype_mismatches = 0
    overruns = 0

    def new_lifetime(meta: TensorMeta, materialised: bool) -> _Lifetime:
        storage = Storage(index=len(storages), dtype=meta.dtype, device=meta.device,
                          extent=0, materialised=materialised)
        storages.append(storage)
        return _Lifetime(storage)

    def begin(storage_id: int, meta: TensorMeta, materialised: bool) -> _Lifetime:
        """A new tensor's memory at ``storage_id``: what reinterpreted the old one, in
        another dtype, does not reinterpret it."""
        for skey in [k for k in shadows if k[0] == storage_id and k[2] == meta.device]:
            del shadows[skey]
        life = current[storage_id] = new_lifetime(meta, materialised)
        return life

    def materialised_view(life: _Lifetime, tv: TensorValue) -> Binding:
        life.storage.extent = max(life.storage.extent, tv.meta.extent)
        key = view_key(tv.meta)
        binding = life.views.get(key)
        if binding is None:
            binding = life.views[key] = InputView(life.storage, tv.meta)
        return binding

    for op in ops:
        input_sids: set[int] = set()
        input_tids: set[int] = set()
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                input_sids.add(tv.storage_id)
                input_tids.add(tv.trace_id)
                life = current.get(tv.storage_id)
                lifts = op.name in oprules.ASSIGNED_LITERALS
                if life is None or (lifts and (life.lifted
                                               or tv.trace_id not in life.tensor_ids)):
                    # (a literal is lifted once, just after the step built it from
                    # Python data: one lifted before, or another tensor object than
                    # those the lifetime held, is a literal the allocator put where a
                    # freed tensor was, on its storage id)
                    life = begin(tv.storage_id, tv.meta, materialised=True)
                life.lifted = life.lifted or lifts
                life.tensor_ids.add(tv.trace_id)
                if (life.storage.dtype, life.storage.device) != (tv.meta.dtype, tv.meta.device):
                    # Memory read as another dtype: a reinterpreting view's result
                    # (``view(torch.int32)``, ``view_as_real``) where a replayed op made
                    # it, else a buffer of its own.
                    skey = (tv.storage_id, tv.meta.dtype, tv.meta.device)
                    shadow = shadows.get(skey)
                    if shadow is None:
                        dtype_mismatches += 1
                        shadow = shadows[skey] = new_lifetime(tv.meta, materialised=True)
                    life = shadow
                tv.storage = life.storage
                distinct = life.distinct.get(tv.trace_id)
                if distinct is not None and distinct[0] == view_key(tv.meta):
                    tv.binding = distinct[1]
                    continue
                if life.storage.materialised:
                    key = view_key(tv.meta)
                    made_by = life.made_by.get(key)
                    if made_by is not None and made_by != tv.trace_id:
                        # Another tensor object on the memory and in the layout of an
                        # op's result, made by no replayed op: FSDP2's unsharded
                        # parameter (an nn.Parameter over the buffer it all-gathers
                        # into), ``.data``. It is a tensor of its own, here a leaf over
                        # the same memory: read as the op's result (a view made under
                        # no_grad and then written in place, as FSDP2's copy-out of a
                        # Shard(1) parameter writes it), the grad-mode op that read the
                        # parameter failed in autograd.
                        tv.binding = InputView(life.storage, tv.meta)
                        life.storage.extent = max(life.storage.extent, tv.meta.extent)
                        life.distinct[tv.trace_id] = (key, tv.binding)
                        continue
                    tv.binding = materialised_view(life, tv)
                    continue
                key = view_key(tv.meta)
                binding = life.views.get(key)
                if binding is None:
                    if tv.meta.extent <= life.known_extent and life.handle is not None:
                        binding = DerivedView(life.handle, tv.meta)
                        op.derive_before.append(binding)
                    else:
                        # The view reaches past what the producer returned: the replayed
                        # buffer may be smaller, so this view gets a buffer of its own.
                        overruns += 1
                        skey = (tv.storage_id, tv.meta.dtype, f"overrun{id(life)}")
                        shadow = shadows.get(skey) or shadows.setdefault(
                            skey, new_lifetime(tv.meta, materialised=True))
                        tv.storage = shadow.storage
                        tv.binding = materialised_view(shadow, tv)
                        continue
                    life.views[key] = binding
                tv.binding = binding

        made_here: set[int] = set()  # storages this op's earlier outputs made
        for path, tv in output_paths(op.outputs):
            life = current.get(tv.storage_id)
            # Outputs on one storage share it: an input's (an in-place op, a view), or
            # one this op made for several of them (torch.where's index tensors are the
            # rows of one buffer, and each reader must read its own row).
            aliasing = (
                (tv.storage_id in input_sids or tv.storage_id in made_here)
                and life is not None
                and (life.storage.dtype, life.storage.device) == (tv.meta.dtype, tv.meta.device)
            )
            if not aliasing and (op.index, path) in undefined:
                # Values the original wrote outside recorded ops: built before timing,
                # and every reader reads that buffer (the op's own result goes unused).
                life = begin(tv.storage_id, tv.meta, materialised=True)
                life.tensor_ids.add(tv.trace_id)
                tv.storage = life.storage
                tv.binding = materialised_view(life, tv)
                continue
            if not aliasing and tv.storage_id in input_sids and life is not None:
                # An input's memory in another dtype (``x.view(torch.int32)``): the op
                # makes that view, and the input's own dtype lives on beside it (read
                # as a buffer of its own, a later ``x`` took the place of what the
                # step computed).
                skey = (tv.storage_id, tv.meta.dtype, tv.meta.device)
                life = shadows[skey] = new_lifetime(tv.meta, materialised=False)
            elif not aliasing:
                life = begin(tv.storage_id, tv.meta, materialised=False)
                made_here.add(tv.storage_id)
            assert life is not None
            life.tensor_ids.add(tv.trace_id)
            key = view_key(tv.meta)
            tv.storage = life.storage
            existing = life.views.get(key)
            if existing is not None and aliasing:
                # The same view, but a tensor of its own: a view op's new tensor (not
                # its input returned, as ``to`` and ``lift_fresh`` may): an older one of
                # a multi-output view, split's before an in-place write to their base,
                # fails autograd where the original read the new one.
                if op.name in oprules.DISTINCT_ALIASES or (
                        op.signature.is_view and tv.trace_id not in input_tids):
                    tv.binding = OpOutput(op.index, path)
                    life.distinct[tv.trace_id] = (key, tv.binding)
                    continue
                tv.binding = existing  # e.g. an in-place op returning its input
                continue
            binding = OpOutput(op.index, path)
            life.views[key] = binding
            tv.binding = binding
            if life.storage.materialised:
                life.made_by[key] = tv.trace_id
                life.storage.extent = max(life.storage.extent, tv.meta.extent)
            else:
                life.storage.extent = max(life.storage.extent, tv.meta.extent)
                if life.handle is None or tv.meta.extent > life.known_extent:
                    life.handle = binding
                life.known_extent = max(life.known_extent, tv.meta.extent)

    if split:
        notes.append(f"{split} tensors are on storages that cannot be one memory (an op "
                     "wrote one while reading another that partially overlaps it: tensor "
                     "subclass wrappers such as DTensor); each reads a buffer of its own")
    if dtype_mismatches:
        notes.append(f"{dtype_mismatches} tensor uses reinterpret a storage as another dtype; "
                     "they read a buffer of their own (no aliasing)")
    if overruns:
        notes.append(f"{overruns} views reach past the tensor their producer returned; they "
                     "read a buffer of their own (no aliasing)")
    for op in ops:
        for view in op.derive_before:
            base = view.base
            if isinstance(base, OpOutput):
                ops[base.op_index].outputs_viewed_by_offset = True
    keep_viewed_layouts(ops, strides_recorded)
    _plan_frees(ops)
    return TensorPlan(storages=storages, notes=notes)


def keep_viewed_layouts(ops: list[Op], strides_recorded: bool = True) -> None:
    """Mark the kernel outputs (``Op.keep_layout``) that a stride-dependent view reads
    through views and in-place ops only, where the kernel may lay them out otherwise
    on the replay's device: its recorded layout is not contiguous (a layout the kernel
    chose), or the kernel lays its output out by backend. A view that cannot view the
    other layout stops the replay ("view size is not compatible with input tensor's
    size and stride"), and the model's ``.contiguous()`` before it, a no-op where the
    trace was made, left no record that would copy.

    Where the trace recorded no strides (``strides_recorded`` False), the layout each
    such view read is unknown (a torch 2.1 attention's output was laid out by its
    sequence): the view copies its input where it cannot view it
    (``Op.copy_if_unviewable``), and no guessed layout is imposed."""
    for op in ops:
        if op.name not in oprules.STRIDE_DEPENDENT_VIEWS or not op.args:
            continue
        if not strides_recorded:
            op.copy_if_unviewable = True
            continue
        tv = next(iter_tensors(op.args[0].value), None)
        while tv is not None and isinstance(tv.binding, OpOutput) \
                and len(tv.binding.path) == 1 and tv.binding.op_index < op.index:
            producer = ops[tv.binding.op_index]
            # A view or an in-place op: the layout is its input's.
            source = next((t for arg in producer.args for t in iter_tensors(arg.value)
                           if t.storage_id == tv.storage_id and t is not tv), None)
            if source is not None:
                tv = source
                continue
            made = producer.outputs[tv.binding.path[0]]
            if isinstance(made, TensorValue) and not made.meta.storageless and (
                    producer.name in oprules.LAYOUT_BY_BACKEND
                    or not _contiguous(made.meta)):
                producer.keep_layout = tuple(sorted({*producer.keep_layout,
                                                     tv.binding.path[0]}))
            break


def _contiguous(meta: TensorMeta) -> bool:
    """Row-major contiguous (dimensions of size 1 take any stride)."""
    return all(size == 1 or stride == row_major for size, stride, row_major
               in zip(meta.shape, meta.strides, contiguous_strides(meta.shape), strict=True))


def binding_key(binding: Binding) -> object:
    """A hashable key naming one variable: an op's output by (op, path), a view by identity."""
    if isinstance(binding, OpOutput):
        return ("out", binding.op_index, binding.path)
    return ("view", id(binding))


def binding_root(binding: Binding) -> Binding:
    """The variable that holds a binding's value: an op result's first index, or itself."""
    if isinstance(binding, OpOutput):
        return OpOutput(binding.op_index, binding.path[:1])
    return binding


def _plan_frees(ops: list[Op]) -> None:
    """Record on each op the variables it reads for the last time."""
    last_use: dict[object, tuple[int, Binding]] = {}

    def use(binding: Binding, index: int) -> None:
        if isinstance(binding, InputView):
            return  # inputs live across iterations
        root = binding_root(binding)
        key = _root_key(root)
        last_use[key] = (index, root)

    for op in ops:
        for view in op.derive_before:
            use(view.base, op.index)
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                if tv.binding is not None:
                    use(tv.binding, op.index)
        # An output nobody reads is still a variable until its op returns.
        for _path, tv in output_paths(op.outputs):
            if isinstance(tv.binding, OpOutput) and tv.binding.op_index == op.index:
                key = _root_key(binding_root(tv.binding))
                last_use.setdefault(key, (op.index, binding_root(tv.binding)))
    for index, root in last_use.values():
        ops[index].free_after.append(root)


def _root_key(root: Binding) -> object:
    if isinstance(root, OpOutput):
        return ("out", root.op_index, root.path)
    return ("view", id(root))


def peak_bytes(ops: list[Op], storages: list[Storage],
               on: Callable[[Storage], bool] | None = None) -> int:
    """Materialised bytes plus the most produced bytes alive at once (estimate), of
    the storages ``on`` accepts (all by default)."""

    def size(storage: Storage) -> int:
        return storage.nbytes if on is None or on(storage) else 0

    fixed = sum(size(s) for s in storages if s.materialised)
    birth: dict[int, int] = {}
    death: dict[int, int] = {}
    for op in ops:
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                if tv.storage is not None and not tv.storage.materialised:
                    death[tv.storage.index] = op.index
        for _p, tv in output_paths(op.outputs):
            if tv.storage is not None and not tv.storage.materialised:
                birth.setdefault(tv.storage.index, op.index)
                death.setdefault(tv.storage.index, op.index)
    delta = [0] * (len(ops) + 2)
    for index, born in birth.items():
        nbytes = size(storages[index])
        delta[born] += nbytes
        delta[death[index] + 1] -= nbytes
    live = peak = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return fixed + peak
