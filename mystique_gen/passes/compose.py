"""Composition helpers: storage renaming, parallel placement, combined trace info.

The pipeline (:mod:`mystique_gen.pipeline`) lowers each trace on its own, renames its
storages here, then concatenates the traces' op lists and repeats the whole list
(``--repeat K``) before one tensor pass. ``--compose sequence`` replays the
list in order; ``--compose parallel`` puts each trace on a host thread (and stream)
of its own, and the threaded schedule of :mod:`streams` runs them at once.

Storage ids are renamed to one id per (trace, recorded storage lifetime). Lifetimes
are counted on the *unfiltered* selection, with the tensor pass's rule (an output
whose storage id none of the op's inputs carries starts a new lifetime), so a kept
op never aliases a buffer that a dropped op had replaced, and two traces never share
a tensor. With nothing filtered the renaming changes no lifetime.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from mystique_gen.ir import Op, Storage, TraceInfo, iter_tensors
from mystique_gen.passes.select import Selected
from mystique_gen.passes.tensors import output_paths
from mystique_gen.sources.et import RawArg


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


def _raw_storage_ids(raw: RawArg) -> Iterator[int]:
    """Storage ids of the tensors in one recorded argument (nested lists included)."""

    def walk(value: object) -> Iterator[int]:
        if not isinstance(value, list):
            return
        if len(value) >= 6 and isinstance(value[1], int) and isinstance(value[5], str):
            yield value[1]  # [tensor id, storage id, offset, numel, itemsize, device]
        else:
            for item in value:
                yield from walk(item)

    if "Tensor" in raw.type:
        yield from walk(raw.value)


def storage_lifetimes(selected: list[Selected]) -> Lifetimes:
    """Per node id: the lifetime number of each storage id it reads, and of each it writes."""
    current: dict[int, int] = {}
    result: Lifetimes = {}
    for s in selected:
        reads_ids = {sid for raw in s.node.inputs for sid in _raw_storage_ids(raw)}
        reads = {sid: current.get(sid, 0) for sid in reads_ids}
        writes: dict[int, int] = {}
        for raw in s.node.outputs:
            for sid in _raw_storage_ids(raw):
                if sid not in reads_ids and sid not in writes:
                    current[sid] = current.get(sid, 0) + 1
                writes[sid] = current.get(sid, 0)
        result[s.node.id] = (reads, writes)
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
                tv.storage_id = rename(tv.storage_id, reads.get(tv.storage_id, 0))
        for _path, tv in output_paths(op.outputs):
            sid = tv.storage_id
            tv.storage_id = rename(sid, writes.get(sid, reads.get(sid, 0)))


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
                     sum(i.node_count for i in infos))


