"""Composition helpers: storage renaming, parallel placement, combined trace info.

The driver (:mod:`mystique_gen.driver`) lowers each trace on its own, renames its
storages here, then concatenates the traces' op lists and repeats the whole list
(``--repeat K``) before one tensor pass. ``--compose sequence`` replays the
list in order; ``--compose parallel`` puts each trace on a host thread (and stream)
of its own, and the threaded schedule of :mod:`streams` runs them at once.

Storage ids are renamed to one id per (trace, recorded storage lifetime). Lifetimes
are counted on the *unfiltered* selection, with the tensor pass's rule (an output
whose storage id none of the op's inputs carries starts a new lifetime) and those the
tensor pass cannot apply (a different tensor with other recorded values on an unwritten
storage, memory allocated again by no recorded op: see :func:`storage_lifetimes`), so a kept
op never aliases a buffer that a dropped op had replaced, and two traces never share
a tensor. With nothing filtered the renaming changes no lifetime.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field

from mystique_gen import oprules
from mystique_gen.ir import Op, Storage, TraceInfo, iter_tensors
from mystique_gen.ir.schema import SchemaError, Signature, parse_signature
from mystique_gen.passes.lower import list_element_types
from mystique_gen.passes.select import Selected, Selection, nearest_selected
from mystique_gen.passes.tensors import output_paths
from mystique_gen.passes.values import _parse_range
from mystique_gen.sources.et import RawArg, raw_storage_ids, tensor_records


def place_in_parallel(op_lists: list[list[Op]]) -> None:
    """Trace k's ops on host thread k + 1 (in recorded order, whatever threads recorded
    them) and, but for the first trace, on side stream k; the schedule (passes/streams.py,
    threaded) then issues each list from its own thread."""
    for k, ops in enumerate(op_lists):
        for op in ops:
            op.thread = k + 1
            op.stream = k if k else None


# -- storage lifetimes ---------------------------------------------------------------

Lifetimes = dict[int, tuple[dict[int, int], dict[int, int]]]


RawView = tuple[int, tuple, tuple, str]  # offset, shape, strides, element type
# The types the Python argument parser wraps a number as (double, int64, bool, complex
# double): a 0-d tensor of another type (a float32 median a backward reads back, a
# learnable temperature) is no wrapped number, whichever tensor id it is read under.
WRAPPED_NUMBER_TYPES = frozenset({"Tensor(double)", "Tensor(long int)", "Tensor(bool)",
                                  "Tensor(c10::complex<double>)"})


def _input_tensors(raw_inputs: list[RawArg]) -> Iterator[tuple[int, list, RawView]]:
    """(tensor ordinal, record, view) of every input tensor, numbered as ``tensor_range``
    numbers them (passes/values.py ``_ordinals``: top-level tensors and list elements)."""
    k = 0
    for raw in raw_inputs:
        if raw.type.startswith("Tensor"):
            items = [(raw.value, raw.shape, raw.strides, raw.type)]
        elif "List[" in raw.type and isinstance(raw.value, list):
            types = list_element_types(raw.type, len(raw.value))
            shapes = raw.shape if isinstance(raw.shape, list) else []
            strides = raw.strides if isinstance(raw.strides, list) else []
            items = [(v, shapes[j] if j < len(shapes) else None,
                      strides[j] if j < len(strides) else None, types[j])
                     for j, v in enumerate(raw.value)]
        else:
            continue
        for value, shape, strides, type_str in items:
            if not type_str.startswith("Tensor"):
                continue
            if (isinstance(value, list) and len(value) >= 6 and isinstance(value[0], int)
                    and isinstance(value[1], int)):
                yield k, value, (value[2], _frozen(shape), _frozen(strides), type_str)
            k += 1


def _frozen(value: object) -> object:
    if not isinstance(value, list):
        return value
    # A list comprehension, no generator per level: called for every tensor read.
    return tuple([_frozen(v) if isinstance(v, list) else v for v in value])


def _signature(schema: str) -> Signature | None:
    """The recorded schema's signature; None where there is none or it does not parse."""
    try:
        return parse_signature(schema) if schema else None
    except SchemaError:
        return None


def _written_inputs(schema: str) -> tuple[int, ...] | None:
    """Positions of the arguments an op writes; None: unknown (all)."""
    sig = _signature(schema)
    return sig.written if sig is not None else None


@dataclass
class _Uses:
    """Which ops of a selection carry each storage id: the look-ahead
    :func:`_reallocated_unrecorded` needs."""

    selected: list[Selected]
    at: dict[int, list[int]]  # storage id -> the selection indices whose ops carry it
    # Per op index, as needed: storage id -> (tensor ids read, tensor ids returned)
    tensors_of: dict[int, dict[int, tuple[set[int], set[int]]]] = field(
        default_factory=dict)

    @classmethod
    def of(cls, selected: list[Selected]) -> _Uses:
        at: dict[int, list[int]] = {}
        for i, s in enumerate(selected):
            for raws in (s.node.inputs, s.node.outputs):
                for raw in raws:
                    for record in tensor_records(raw):
                        sids = at.setdefault(record[1], [])
                        if not sids or sids[-1] != i:
                            sids.append(i)
        return cls(selected, at)

    def from_(self, sid: int, start: int) -> list[int]:
        """The indices of the ops that carry storage ``sid``, from op ``start`` on."""
        at = self.at.get(sid, [])
        return at[bisect_left(at, start):]

    def read_again(self, sid: int, tensor_ids: set[int], start: int) -> bool:
        """Whether any of these tensors on storage ``sid`` is read from op ``start`` on
        before an op makes a tensor of its id there anew (the observer's tensor ids are
        TensorImpl addresses, which the allocator hands out again: a later view of the
        same memory often carries an earlier tensor's id)."""
        pending = set(tensor_ids)
        for j in self.from_(sid, start):
            read, returned = self.tensors_at(j).get(sid, (set(), set()))
            if pending & read:
                return True
            pending -= returned
            if not pending:
                return False
        return False

    def tensors_at(self, index: int) -> dict[int, tuple[set[int], set[int]]]:
        found = self.tensors_of.get(index)
        if found is None:
            found = {}
            node = self.selected[index].node
            for k, raws in enumerate((node.inputs, node.outputs)):
                for raw in raws:
                    for record in tensor_records(raw):
                        found.setdefault(record[1], (set(), set()))[k].add(record[0])
            self.tensors_of[index] = found
        return found


def _overwritten_before_read(selected: list[Selected], uses: _Uses, start: int, sid: int,
                             span: tuple[int, int]) -> bool:
    """Whether, from op ``start`` on, the first op to use the values of storage ``sid``
    replaces elements ``span`` of it whole without reading them: an ``out=`` argument,
    or what an oprules.OVERWRITES op writes (``copy_``). Views and metadata queries read
    nothing."""
    for j in uses.from_(sid, start):
        node = selected[j].node
        sig = _signature(node.op_schema)
        covered = False
        for i, raw in enumerate(node.inputs):
            spec = sig.args[i] if sig is not None and i < len(sig.args) else None
            for record in tensor_records(raw):
                if record[1] != sid:
                    continue
                if spec is not None and spec.writes and (
                        spec.name.startswith("out") or node.name in oprules.OVERWRITES):
                    if record[2] <= span[0] and record[2] + record[3] >= span[1]:
                        covered = True
                        continue
                    return False  # a part of it written: the rest keeps its values
                if sig is None or not (sig.is_view or node.name in oprules.METADATA_ONLY):
                    return False  # read, or written by an op that reads it (add_)
        if covered:
            return True
        if not uses.tensors_at(j).get(sid, (set(), set()))[0]:
            return False  # allocated anew by a recorded op
    return False


def _reallocated_unrecorded(selected: list[Selected], uses: _Uses, index: int,
                            record: list, lifetime_tensors: set[int]) -> bool:
    """Whether a tensor read at ``index`` on a storage that a recorded op allocated, a
    tensor that no recorded op returned or read on it in this lifetime, sits on new
    memory that the allocator placed at a freed buffer's address, by an allocation the
    trace does not record. FSDP2 frees a parameter's unsharded storage after each use
    and allocates it again before the next all-gather with
    ``untyped_storage().resize_()``, which is no op: read as the same lifetime, the
    second micro-batch's unsharded bias became a view of the first micro-batch's
    activation, and autograd refused the all-gather's in-place copy into it.

    Other unrecorded aliases of live memory are common (``.data``, autograd unpacking a
    saved result) and must stay aliases, so this holds only where nothing of the
    lifetime so far is seen again and the first use of the storage from here replaces
    the tensor's elements whole: whether or not the memory was new, the replay then
    computes the same values."""
    sid = record[1]
    if uses.read_again(sid, lifetime_tensors, index):
        return False
    return _overwritten_before_read(selected, uses, index, sid,
                                    (record[2], record[2] + record[3]))


def inner_allocations(selection: Selection) -> dict[int, frozenset[int]]:
    """Per selected node id: the storage ids ops inside it allocated (an output on a
    storage that op did not read) and it neither reads nor returns. A composite replayed
    whole (attention, whose kernel's logsumexp its backward reads later) leaves them
    unmade; the ids' earlier tensors were freed before, so a later read is of another
    tensor than the one last seen there (a rotary embedding's, in a Llama: the
    backward read it as its logsumexp). Read the covered nodes' arguments before they
    are released."""
    selected_above = nearest_selected({s.node.id for s in selection.ops}, selection.covered)
    made: dict[int, set[int]] = {}
    for node in selection.covered:
        reads = {sid for raw in node.inputs for sid in raw_storage_ids(raw)}
        fresh = {sid for raw in node.outputs for sid in raw_storage_ids(raw)} - reads - {0}
        above = selected_above(node.id) if fresh else None
        if above is not None:
            made.setdefault(above, set()).update(fresh)
    found: dict[int, frozenset[int]] = {}
    for s in selection.ops:
        own = {sid for raw in (*s.node.inputs, *s.node.outputs)
               for sid in raw_storage_ids(raw)}
        inner = made.get(s.node.id, set()) - own
        if inner:
            found[s.node.id] = frozenset(inner)
    return found


def storage_lifetimes(selected: list[Selected],
                      inner: dict[int, frozenset[int]] | None = None) -> Lifetimes:
    """Per node id: the lifetime number of each storage id it reads, and of each it writes.

    An output whose storage id none of the op's inputs carries starts a new lifetime
    (the id was freed and reused). So does an input on the same view of a storage
    that no recorded op wrote since the last read, where their recorded
    ``tensor_range`` differ: the same bytes cannot hold two values, so the first
    tensor was freed and the allocator handed its address to the second (two Python
    scalars wrapped as 0-d tensors, 0 and 8, one after the other: without this they
    got one buffer filled over 0..8, and a relative-position bucket overflowed its
    embedding). Tensors created outside recorded ops (wrapped scalars) are seen only as
    inputs, so nothing else tells their lifetimes apart, and the tensor id does not
    either: the observer keys tensor ids by TensorImpl address, which the allocator
    reuses as well. (Should an unrecorded write have changed a live tensor, its reads
    still get fills matching what each read saw.) A read of another tensor on a storage
    a recorded op allocated starts one too where the allocator gave that memory out
    again without a recorded op (:func:`_reallocated_unrecorded`), and so does a
    storage an op inside a selected one allocated (``inner``, :func:`inner_allocations`).
    """
    current: dict[int, int] = {}
    # Per storage id, since its last write: view -> recorded range.
    seen: dict[int, dict[RawView, tuple[int, int]]] = {}
    # 0-d tensors no recorded op made or wrote: the node that last read each.
    scalars: dict[int, int] = {}
    defined: set[int] = set()  # storage ids a recorded op made or wrote
    # Per tensor id a recorded op returned: the storage id and view it returned it on.
    returned: dict[int, tuple[int, RawView]] = {}
    allocated: set[int] = set()  # storage ids whose lifetime a recorded op's output began
    dtypes: dict[int, set[str]] = {}  # per storage id: the tensor types it was seen as
    tensors: dict[int, set[int]] = {}  # per storage id: the tensor ids seen on it
    wrote: set[int] = set()  # storage ids a recorded op wrote in place
    # Per storage id: the tensor ids seen on it in its current lifetime.
    live: dict[int, set[int]] = {}
    uses: _Uses | None = None  # built at the first tensor that needs the look-ahead
    result: Lifetimes = {}

    def begin(sid: int) -> None:
        """A lifetime the trace records no allocation of begins at this read."""
        current[sid] = current.get(sid, 0) + 1
        seen.pop(sid, None)
        scalars.pop(sid, None)
        for known in (defined, allocated, wrote):
            known.discard(sid)
        dtypes.pop(sid, None)
        tensors.pop(sid, None)
        live[sid] = set()

    for index, s in enumerate(selected):
        node = s.node
        read_tensors = list(_input_tensors(node.inputs))
        made_tensors = list(_input_tensors(node.outputs))
        ranges = _parse_range(node.attrs.get("tensor_range"), node.id)
        written = _written_inputs(node.op_schema) if "!" in node.op_schema else ()
        reads_ids = {sid for raw in node.inputs for sid in raw_storage_ids(raw)}
        # A 0-d tensor that no recorded op made or wrote is a Python number the
        # argument parser wrapped for one call: another op reading the same storage id
        # read another number, whose allocation reused the address. Whether it did
        # varies from capture to capture, so each call's scalar is a lifetime of its own.
        made_here = {sid for i in range(len(node.inputs)) if written is None or i in written
                     for sid in raw_storage_ids(node.inputs[i])}
        # (An op returning its input, lift_fresh's or a view's, did not make it: the
        # scalar it reads is still the number some call wrapped.)
        made_here.update(sid for raw in node.outputs for sid in raw_storage_ids(raw)
                         if sid not in reads_ids)
        for _k, record, view in read_tensors:
            sid = record[1]
            if view[1] != () or sid in made_here or view[3] not in WRAPPED_NUMBER_TYPES:
                continue
            # (``lift_fresh`` reads a literal Python just made, ``x[m] = -1``, never one
            # read before, even at a reused tensor id and address)
            literal = node.name in oprules.ASSIGNED_LITERALS
            if sid in defined:
                if not literal and (returned.get(record[0]) == (sid, view) or (
                        sid not in allocated and view[3] in dtypes.get(sid, ())
                        and (sid in wrote or record[0] in tensors.get(sid, ())))):
                    continue
                # No recorded op returned this tensor as it is read now (same storage,
                # same view), yet its storage id is one a recorded op allocated, or its
                # bytes, which no recorded op wrote, were never seen as this tensor or
                # only as another dtype (a reinterpretation or a view is a recorded
                # op): a wrapped number whose data reused a freed address (a clipped
                # gradient norm's divisor, at a freed FSDP2 all-gather buffer's; a
                # shard's offset, at the torch.tensor(0) an earlier shard put at its
                # masked ids).
                begin(sid)
            elif scalars.get(sid, node.id) != node.id:
                current[sid] = current.get(sid, 0) + 1
                seen.pop(sid, None)
                live[sid] = set()
            scalars[sid] = node.id
        for _k, record, _view in read_tensors:
            sid = record[1]
            if sid in allocated and record[0] not in live[sid]:
                uses = uses or _Uses.of(selected)
                if _reallocated_unrecorded(selected, uses, index, record, live[sid]):
                    begin(sid)
        if ranges:
            for k, record, view in read_tensors:
                span = ranges.get(k)
                if span is None:
                    continue
                sid = record[1]
                earlier = seen.setdefault(sid, {}).get(view)
                if earlier is not None and earlier != span:
                    current[sid] = current.get(sid, 0) + 1
                    seen[sid] = {}
                    live[sid] = set()
                seen[sid][view] = span
        for tensors_of_node in (read_tensors, made_tensors):
            for _k, record, view in tensors_of_node:
                dtypes.setdefault(record[1], set()).add(view[3])
                tensors.setdefault(record[1], set()).add(record[0])
                live.setdefault(record[1], set()).add(record[0])
        reads = {sid: current.get(sid, 0) for sid in reads_ids}
        returned.update((record[0], (record[1], view))
                        for _k, record, view in made_tensors)
        writes: dict[int, int] = {}
        for raw in node.outputs:
            for sid in raw_storage_ids(raw):
                if sid not in reads_ids and sid not in writes:
                    current[sid] = current.get(sid, 0) + 1
                    allocated.add(sid)
                    live[sid] = set()
                writes[sid] = current.get(sid, 0)
                seen.pop(sid, None)
                scalars.pop(sid, None)
                defined.add(sid)
        # Values the op writes in place (its Tensor(a!) arguments) are new values; what
        # it only reads (add_'s `other`) keeps its recorded values to compare against.
        for i in range(len(node.inputs)) if written is None else written:
            if i < len(node.inputs):
                for sid in raw_storage_ids(node.inputs[i]):
                    seen.pop(sid, None)
                    scalars.pop(sid, None)
                    defined.add(sid)
                    wrote.add(sid)
        for _k, record, _view in made_tensors:
            live[record[1]].add(record[0])
        for sid in (inner or {}).get(node.id, ()):
            begin(sid)  # allocated inside the op, which the replay does not make
        result[node.id] = (reads, writes)
    return result


def rename_storages(ops: list[Op], lifetimes: Lifetimes, part: int,
                    names: dict[tuple[int, int, int], int]) -> None:
    """Give every tensor the id of its (trace, storage, lifetime); ``names`` is shared by
    all traces of a program, so ids never collide."""

    def rename(sid: int, lifetime: int) -> int:
        return names.setdefault((part, sid, lifetime), len(names))

    for op in ops:
        reads, writes = lifetimes.get(op.node_id, ({}, {}))
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                lifetime = reads.get(tv.storage_id, 0) if not tv.meta.storageless else 0
                tv.storage_id = rename(tv.storage_id, lifetime)
        for _path, tv in output_paths(op.outputs):
            sid = tv.storage_id
            # A sparse or MKLDNN tensor has no storage (id 0 for all): its lifetimes are
            # its tensor id's (passes/tensors.py split_storages_without_memory).
            lifetime = writes.get(sid, reads.get(sid, 0)) if not tv.meta.storageless else 0
            tv.storage_id = rename(sid, lifetime)


def storages_of(ops: list[Op]) -> list[Storage]:
    found: dict[int, Storage] = {}
    for op in ops:
        for value in [a.value for a in op.args] + list(op.outputs):
            for tv in iter_tensors(value):
                if tv.storage is not None:
                    found.setdefault(tv.storage.index, tv.storage)
    return [found[i] for i in sorted(found)]


def combined_info(infos: list[TraceInfo]) -> TraceInfo:
    """One TraceInfo for a composition: names joined, sha256 of the traces' sha256s."""
    digest = hashlib.sha256("\n".join(i.sha256 for i in infos).encode()).hexdigest()
    schemas = list(dict.fromkeys(i.schema for i in infos))
    return TraceInfo(" + ".join(i.name for i in infos), digest, " + ".join(schemas),
                     sum(i.node_count for i in infos),
                     strides_recorded=all(i.strides_recorded for i in infos))


