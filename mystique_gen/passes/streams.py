"""Stream and host-thread schedule: which stream and thread each op is issued on, and
the waits that keep the recorded data dependencies between them.

Two steps, both on the IR:

* :func:`assign_streams` reads the Kineto facts (``Op.timing.kernels``): the stream
  that ran the most kernels becomes the replay's current ("main") stream; an op
  whose kernels ran mostly on another stream gets ``Op.stream`` = that stream id.
* :func:`plan_schedule` derives the waits from the tensor dataflow, for any
  assignment of ``Op.stream`` and ``Op.thread`` (Kineto's, or another pass's such as
  ``--compose``): an op that reads a storage last written on another stream waits
  for that writer's event (``Op.stream_waits``); with ``threaded`` an op that reads
  a value defined or written on another host thread waits for that op to have run
  (``Op.thread_waits``). Waits implied by an earlier wait are left out. In-order
  replay stays the default (``threaded=False``), where only stream waits matter.

Only read-after-write dependencies are tracked: a write that races an earlier read
on another stream is not ordered (the recorded program ordered it by timing).
"""

from __future__ import annotations

from collections import Counter

from mystique_gen.ir import (
    Binding,
    DerivedView,
    OpOutput,
    Program,
    StreamInfo,
    iter_tensors,
)
from mystique_gen.passes.tensors import binding_key, binding_root, output_paths


def assign_streams(program: Program) -> None:
    """Set ``Op.stream`` from the recorded kernels and list the streams in the program."""
    kernels: Counter[int] = Counter()
    for op in program.ops:
        if op.timing is not None:
            kernels.update(k.stream for k in op.timing.kernels)
    if not kernels:
        return
    main = max(kernels, key=lambda s: (kernels[s], -s))
    ops_on: Counter[int] = Counter()
    for op in program.ops:
        if op.timing is None or not op.timing.kernels:
            continue
        mine = Counter(k.stream for k in op.timing.kernels)
        stream = max(mine, key=lambda s: (mine[s], s == main, -s))
        ops_on[stream] += 1
        op.stream = None if stream == main else stream
    program.streams = [StreamInfo(s, ops_on[s], kernels[s], s == main)
                       for s in sorted(kernels, key=lambda s: (s != main, s))]


def side_streams(program: Program) -> list[int]:
    """Stream ids other than the current one, in order of first use."""
    seen: dict[int, None] = {}
    for op in program.ops:
        if op.stream is not None:
            seen.setdefault(op.stream, None)
    return list(seen)


def plan_schedule(program: Program, *, threaded: bool = False) -> None:
    """Fill ``stream_waits``/``thread_waits`` (and, threaded, release shared values at
    the end of the iteration instead of in one thread)."""
    ops = program.ops
    program.threaded = threaded and len({op.thread for op in ops}) > 1
    if not program.streams and side_streams(program):
        program.streams = [StreamInfo(s, sum(op.stream == s for op in ops), 0, False)
                           for s in side_streams(program)]
    last_writer: dict[int, int] = {}  # id(storage) -> op index
    defined_by: dict[object, int] = {}  # variable key -> op index that binds it
    # What a consumer has already waited for: (its stream, its thread, producer stream,
    # producer thread) -> highest producer index. Ops on one stream issued by one thread
    # run in order, so waiting for a later op covers the earlier ones.
    stream_seen: dict[tuple[object, ...], int] = {}
    thread_seen: dict[tuple[int, int], int] = {}
    for op in ops:
        data: set[int] = set()
        names: set[int] = set()
        for view in op.derive_before:
            base = binding_key(binding_root(view.base))
            if base in defined_by:
                names.add(defined_by[base])
            defined_by[binding_key(view)] = op.index
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                if tv.storage is not None and id(tv.storage) in last_writer:
                    data.add(last_writer[id(tv.storage)])
                if tv.binding is None:
                    continue
                key = binding_key(binding_root(tv.binding))
                if key in defined_by:
                    names.add(defined_by[key])
        data.discard(op.index)
        names.discard(op.index)

        stream_waits = []
        for p in sorted(data, reverse=True):
            producer = ops[p]
            if producer.stream == op.stream:
                continue
            seen = (op.stream, op.thread, producer.stream, producer.thread)
            if stream_seen.get(seen, -1) >= p:
                continue
            stream_seen[seen] = p
            stream_waits.append(p)
        op.stream_waits = sorted(stream_waits)

        thread_waits = []
        if program.threaded:
            for p in sorted(data | names | set(stream_waits), reverse=True):
                producer = ops[p]
                if producer.thread == op.thread:
                    continue
                if thread_seen.get((op.thread, producer.thread), -1) >= p:
                    continue
                thread_seen[(op.thread, producer.thread)] = p
                thread_waits.append(p)
        op.thread_waits = sorted(thread_waits)

        for path, tv in output_paths(op.outputs):
            # A view (``t``, ``detach``, ``view`` of a shared weight) writes no data:
            # counted as its storage's writer, later readers of the base on other
            # threads or streams waited for it, an order the program never had.
            if tv.storage is not None and not op.signature.is_view:
                last_writer[id(tv.storage)] = op.index
            defined_by.setdefault(binding_key(OpOutput(op.index, path[:1])), op.index)

    if program.threaded:
        shared = {binding_key(b) for b in shared_roots(program)}
        for op in ops:
            op.free_after = [b for b in op.free_after if binding_key(binding_root(b)) not in shared]


def shared_roots(program: Program) -> list[Binding]:
    """Variables that more than one host thread binds or reads (threaded replay)."""
    if not program.threaded:
        return []
    users: dict[object, set[int]] = {}
    roots: dict[object, Binding] = {}
    for op in program.ops:
        for view in op.derive_before:
            for b in (binding_root(view.base), view):
                users.setdefault(binding_key(b), set()).add(op.thread)
                roots.setdefault(binding_key(b), b)
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                if tv.binding is not None and not _is_input(tv.binding):
                    b = binding_root(tv.binding)
                    users.setdefault(binding_key(b), set()).add(op.thread)
                    roots.setdefault(binding_key(b), b)
        for path, _tv in output_paths(op.outputs):
            b = OpOutput(op.index, path[:1])
            users.setdefault(binding_key(b), set()).add(op.thread)
            roots.setdefault(binding_key(b), b)
    return [roots[k] for k, threads in users.items() if len(threads) > 1]


def _is_input(binding: Binding) -> bool:
    return not isinstance(binding, (OpOutput, DerivedView))

