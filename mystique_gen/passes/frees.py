"""Free each produced buffer where the original freed it, from the profiler's memory events.

The tensor pass frees every variable after its last read (passes/tensors.py). The
original frees a buffer when Python drops its last reference: a module's local
variables live until its forward returns, a layer's output until the next layer
replaces it, a value kept for the caller until the step ends. Freed at last read, an
inference step of a HuggingFace encoder held 0.67 MB at its peak against the original's
1.05 MB.

A Kineto trace recorded with ``profile_memory=True`` (``mystique-gen capture`` records
one) holds every allocation and free with its address and time. The pass pairs them by
address, takes the allocations made inside each replayed op's span that outlive it,
and matches them to the storages the op is the first to produce (by size in bytes;
where one of each is left, the two). A storage's variable is then freed after the last
replayed op that began before the original's free (at the end of the step where the
original did not free it while recording), never before its last read.

Results of ops that recorded an autograd node are held as well, but without their
history after their last read (``Op.drop_history_after``: ``x = x.data``, which records
no op). The replay runs the forward in grad mode and the backward as explicit ops, so
such a result holds the autograd graph behind it and every tensor the graph saved,
where the original's backward released them node by node: a training step's loss held
to the end of the step with its history, as the original holds it, held every
activation to the end (+50 % peak).

An op in grad mode that reads a variable the original freed before the next backward
began saved none of it for its backward: activation checkpointing's pack hook kept
nothing, or saved tensors went to the CPU. The replay's
autograd node would save it and hold it until the graph goes, in the backward (a
checkpointed MLP's peak replayed as the unchecked one's, +95 %): such ops replay
saving nothing (``Op.keeps_saved``); what the explicit backward reads it holds itself.
Only where the node would save that variable (passes/saved.py asks torch) and outlived
its free: a node whose results were all freed by then may have saved it and gone.

The original's backward releases what each node saved as it runs it (retain_graph is
off), so a result held across a backward holds an empty graph from there on. The
replay's would hold its whole history: a Trainer's step reads its loss again after the
backward (``loss.detach()``), and the loss, written in place by a grad-mode op, held
every saved activation of the model to that read (T5: +10 % peak). Results of ops in
grad mode that live across a backward's start lose their history just before it
(``drop_history_at_backward``), with or without memory events. An op in grad mode
that reads one later (a GAN's generator step reading its fake batch) reads it without
requiring grad, where the original's read it requiring grad with an empty graph: its
node saves what the other inputs' gradients need, not what this one's would.

Only a program replayed on one host thread is changed: a threaded replay frees values
that several threads share by its own rule (passes/streams.py).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from mystique_gen.constants import in_backward
from mystique_gen.ir import Binding, Op, OpOutput, Program, TensorValue, iter_tensors
from mystique_gen.passes.saved import saved_arguments
from mystique_gen.passes.tensors import binding_key, output_paths
from mystique_gen.sources.kineto import CpuEvent, MemoryEvent

NEVER = float("inf")


@dataclass(frozen=True)
class Allocation:
    tid: int | str
    ts: float
    nbytes: int
    freed: float  # the free's time; NEVER where the trace holds none


def allocations(memory: Iterable[MemoryEvent]) -> list[Allocation]:
    """Each allocation with the time of its free: events paired by device and address,
    in time order (an address is reused only after its free)."""
    open_: dict[tuple[tuple[int, int], int], MemoryEvent] = {}
    found: list[Allocation] = []
    for ev in sorted(memory, key=lambda e: e.ts):
        key = (ev.device, ev.addr)
        if ev.nbytes > 0:
            if key in open_:  # its free went unrecorded: take it as freed here
                old = open_[key]
                found.append(Allocation(old.tid, old.ts, old.nbytes, ev.ts))
            open_[key] = ev
        elif key in open_:
            alloc = open_.pop(key)
            found.append(Allocation(alloc.tid, alloc.ts, alloc.nbytes, ev.ts))
    found.extend(Allocation(a.tid, a.ts, a.nbytes, NEVER) for a in open_.values())
    found.sort(key=lambda a: a.ts)
    return found


def follow_recorded_frees(program: Program, events: dict[int, CpuEvent],
                          memory: list[MemoryEvent]) -> int:
    """Move each produced storage's free to where the original freed it (module
    docstring). ``events``: ET node id -> its linked Kineto CPU event. Returns how many
    variables are now held past their last read."""
    ops = program.ops
    if program.threaded or not memory or not ops:
        return 0
    node_counts: dict[int, int] = defaultdict(int)
    for op in ops:
        node_counts[op.node_id] += 1
    linked = [(events[op.node_id], op) for op in ops
              if op.node_id in events and node_counts[op.node_id] == 1]
    if not linked:
        return 0
    free_at = _recorded_free_points(ops, linked, allocations(memory))
    held = _hold(ops, free_at)
    _save_nothing_freed(ops, free_at)
    return held


def _recorded_free_points(ops: list[Op], linked: list[tuple[CpuEvent, Op]],
                          allocs: list[Allocation]) -> dict[int, tuple[int, int]]:
    """Storage index -> (the op that produced it, the op after which the original
    freed it), by op index."""
    by_thread: dict[object, list[Allocation]] = defaultdict(list)
    for alloc in allocs:
        by_thread[alloc.tid].append(alloc)
    starts = {tid: [a.ts for a in found] for tid, found in by_thread.items()}
    # Replayed ops by start time, each with the latest op index begun by then.
    timeline = sorted((ev.ts, op.index) for ev, op in linked)
    begun = [t for t, _ in timeline]
    latest: list[int] = []
    for _, index in timeline:
        latest.append(max(index, latest[-1]) if latest else index)
    last_op = ops[-1].index

    def op_before(ts: float) -> int:
        if ts == NEVER:
            return last_op
        i = bisect.bisect_right(begun, ts) - 1
        return latest[i] if i >= 0 else -1

    first_producer: dict[int, int] = {}
    for op in ops:
        for _path, tv in output_paths(op.outputs):
            storage = tv.storage
            if storage is not None and not storage.materialised and \
                    isinstance(tv.binding, OpOutput) and tv.binding.op_index == op.index:
                first_producer.setdefault(storage.index, op.index)
    free_at: dict[int, tuple[int, int]] = {}
    for ev, op in linked:
        produced = {tv.storage.index: tv.storage.nbytes for _p, tv in output_paths(op.outputs)
                    if tv.storage is not None and first_producer.get(tv.storage.index)
                    == op.index}
        if not produced:
            continue
        thread, times = by_thread.get(ev.tid, []), starts.get(ev.tid, [])
        lo, hi = bisect.bisect_left(times, ev.ts), bisect.bisect_right(times, ev.end)
        outliving = [a for a in thread[lo:hi] if a.freed > ev.end]
        for storage, alloc in _match(produced, outliving):
            free_at[storage] = (op.index, op_before(alloc.freed))
    return free_at


def _match(produced: dict[int, int], outliving: list[Allocation]
           ) -> list[tuple[int, Allocation]]:
    """Storages paired with allocations: equal sizes first, in order; then the one left
    of each, where exactly one is."""
    left = list(outliving)
    pairs: list[tuple[int, Allocation]] = []
    unmatched: list[int] = []
    for storage, nbytes in produced.items():
        same = next((a for a in left if a.nbytes == nbytes), None)
        if same is None:
            unmatched.append(storage)
        else:
            left.remove(same)
            pairs.append((storage, same))
    if len(unmatched) == 1 and len(left) == 1:
        pairs.append((unmatched[0], left[0]))
    return pairs


def _hold(ops: list[Op], free_at: dict[int, tuple[int, int]]) -> int:
    """Move the free of each variable that holds a storage its op produced to the
    storage's recorded point, where that is later (views of it made by later ops keep
    their frees: the producer's variable keeps the memory)."""
    by_index = {op.index: op for op in ops}
    position = {op.index: k for k, op in enumerate(ops)}
    moves: list[tuple[Op, Binding, Op]] = []
    for op in ops:
        for root in op.free_after:
            if not isinstance(root, OpOutput):
                continue
            producer = by_index.get(root.op_index)
            if producer is None:
                continue
            value = producer.outputs[root.path[0]]
            if producer.records_grad and not isinstance(value, TensorValue):
                continue  # a list of results has no one history to drop
            target = max((free_at[tv.storage.index][1] for tv in iter_tensors(value)
                          if tv.storage is not None and tv.storage.index in free_at
                          and free_at[tv.storage.index][0] == root.op_index), default=-1)
            if target in position and position[target] > position[op.index]:
                moves.append((op, root, by_index[target]))
    for source, root, target in moves:
        key = binding_key(root)
        source.free_after = [b for b in source.free_after if binding_key(b) != key]
        target.free_after.append(root)
        if by_index[root.op_index].records_grad:
            source.drop_history_after.append(root)
    return len(moves)


def _save_nothing_freed(ops: list[Op], free_at: dict[int, tuple[int, int]]) -> None:
    """Mark the ops that made an autograd node and read a value the original freed
    before the next backward began, while that node lived on, where the node would
    save it: it saved none of it (module docstring). A node that saved it would have held
    it into that backward; a layer's local variables (a decoder layer's residual) are
    freed at its return, after their last read. Which arguments a node saves, the
    installed torch says (passes/saved.py): an op that would save none of them
    replays as it is. Nor does a node that may have gone first (`_node_lives`): an
    inference step in grad mode frees a result, and with it its node, as it frees the
    node's inputs, and the replay frees them at the same points."""
    position = {op.index: k for k, op in enumerate(ops)}
    backward = [k for k, op in enumerate(ops) if in_backward(op.scope)]
    lives = _node_lives(ops, free_at, position)
    reading: list[tuple[Op, set[str]]] = []  # each op and the freed values it reads
    for k, op in enumerate(ops):
        if not _makes_node(op):
            continue
        following = bisect.bisect_right(backward, k)
        # before the next backward, and while its node lived
        before = min(backward[following] if following < len(backward) else len(ops),
                     lives[op.index])
        freed_args = set()
        for arg in op.args:
            freed = [free_at[tv.storage.index][1] for tv in iter_tensors(arg.value)
                     if tv.storage is not None and tv.storage.index in free_at]
            # Recorded frees only: without one the original may have held it longer.
            if any(position.get(f, len(ops)) < before for f in freed):
                freed_args.add(arg.spec.name)
        if freed_args:
            reading.append((op, freed_args))
    saves = saved_arguments([op for op, _ in reading])
    for op, freed_args in reading:
        kept = saves.get(op.index)
        if kept is None or kept & freed_args:
            op.keeps_saved = False


def _node_lives(ops: list[Op], free_at: dict[int, tuple[int, int]],
                position: dict[int, int]) -> dict[int, int]:
    """Per op that made an autograd node: the position of the op after which the
    original freed the last tensor that held that node, at the latest (the number of
    ops where one lived on, or its free was not recorded): its results, and the
    results of every op that read them and made a node, which points at it."""
    end = len(ops)
    readers: dict[int, list[int]] = defaultdict(list)
    for op in ops:
        if _makes_node(op):
            for arg in op.args:
                for tv in iter_tensors(arg.value):
                    if isinstance(tv.binding, OpOutput):
                        readers[tv.binding.op_index].append(op.index)
    lives: dict[int, int] = {}
    for op in reversed(ops):
        if not _makes_node(op):
            continue
        frees = [position.get(free_at[tv.storage.index][1], end)
                 if tv.storage is not None and tv.storage.index in free_at else end
                 for _path, tv in output_paths(op.outputs)]
        lives[op.index] = max([*frees, *(lives.get(r, end) for r in readers[op.index])],
                              default=end)
    return lives


def drop_history_at_backward(program: Program) -> int:
    """Drop, just before each backward begins, the autograd history of the results
    of ops in grad mode that live across its start (module docstring). Returns how many
    variables lose it there."""
    ops = program.ops
    if program.threaded or not ops:
        return 0
    # Where each backward begins, after an op that is not in one (one that begins
    # the program has nothing before it to drop).
    starts = [k for k in range(1, len(ops))
              if in_backward(ops[k].scope) and not in_backward(ops[k - 1].scope)]
    if not starts:
        return 0
    freed: dict[object, int] = {}
    for k, op in enumerate(ops):
        for root in op.free_after:
            freed[binding_key(root)] = k
    # Variables that hold a result with history, by the position of the op making it
    # (or of the first op in grad mode writing it in place: the loss scaled by ``mul_``).
    # A list of results has no one history to drop (``x = x.data``).
    singles = {binding_key(OpOutput(op.index, (i,))) for op in ops
               for i, value in enumerate(op.outputs) if isinstance(value, TensorValue)}
    made: dict[object, tuple[int, OpOutput]] = {}
    for k, op in enumerate(ops):
        if not _makes_node(op):
            continue
        roots = [OpOutput(op.index, (i,)) for i in range(len(op.outputs))]
        roots += [arg.value.binding for arg in op.args if arg.spec.writes
                  and isinstance(arg.value, TensorValue)
                  and isinstance(arg.value.binding, OpOutput)
                  and len(arg.value.binding.path) == 1]
        for root in roots:
            if binding_key(root) in singles:
                made.setdefault(binding_key(root), (k, root))
    dropped = 0
    for start in starts:
        before = ops[start - 1]
        held = {binding_key(b) for b in before.drop_history_after}
        for key, (k, root) in made.items():
            if k >= start or freed.get(key, len(ops)) < start or key in held:
                continue
            before.drop_history_after.append(root)
            dropped += 1
    return dropped


def _makes_node(op: Op) -> bool:
    """Whether ``op`` ran in grad mode and made an autograd node (where the trace
    does not tell, that it may have)."""
    return bool(op.records_grad) and op.made_grad_node is not False
