"""Emit the replay body with its schedule: streams, events, host threads, host gaps.

The IR says where each op runs (``Op.stream``, ``Op.thread`` when
``Program.threaded``) and what it waits for (``Op.stream_waits``,
``Op.thread_waits``); see :mod:`mystique_gen.passes.streams`. This module turns that
into statements that call the template's schedule helpers:

* ``st0 = _stream(0)``: side stream 0, forked from the current stream at the start
  of the iteration; ``_join(st0)`` at the end makes the current stream wait for it;
* ``with _on(st0):`` around consecutive ops on that stream;
* ``ev0 = _record()`` after an op other streams wait for, ``_wait(ev0)`` before them;
* threaded: one nested function per host thread, ``_signal(i)`` after an op another
  thread waits for and ``_await(i)`` before the waiting op, all run by
  ``_run_threads``; values that cross threads are bound in ``replay`` (``nonlocal``);
* ``_host_gap(12.5, before=7)`` before op 7 where a host gap was recorded
  (microseconds); ``_host_gap(12.5, 2, before=7)`` where the profiler recorded two
  scopes of its own in it; after the op's waits for collectives, whose time the gap
  holds.

On CPU every helper is a no-op except the threads and the (opt-in) host gaps.
"""

from __future__ import annotations

from typing import Protocol

from mystique_gen.backends import exprs
from mystique_gen.backends.layout import INDENT, Atom, Group, Node, lay_out, names_statement
from mystique_gen.backends.names import Namespace
from mystique_gen.ir import Binding, Op, OpOutput, Program
from mystique_gen.passes.streams import shared_roots, side_streams
from mystique_gen.passes.tensors import binding_key


class Builder(Protocol):
    """What this module needs from the context builder."""

    program: Program
    ns: Namespace
    grad_state: bool | None
    saves_state: bool

    def wait_lines(self, op: Op, depth: int = 1) -> list[str]: ...

    def op_statement(self, op: Op, depth: int = 1, *, waits: bool = True) -> list[str]: ...

    def end_grad_mode(self, depth: int) -> list[str]: ...


def uses_schedule(program: Program) -> bool:
    """True when the replay needs more than straight-line statements."""
    return bool(program.threaded or side_streams(program) or _has_gaps(program))


def helper_call(callee: str, args: list[str], depth: int, target: str = "") -> list[str]:
    """``[target = ]callee(args)`` laid out at ``depth``."""
    return lay_out(f"{target} = " if target else "", exprs.call(callee, [Atom(a) for a in args]),
                   depth)


def gap_literal(us: float | None) -> str | None:
    """The recorded gap, rounded to 0.1 us, or None where there is nothing to wait."""
    if us is None:
        return None
    rounded = round(us, 1)
    return exprs.float_literal(rounded) if rounded > 0 else None


def _has_gaps(program: Program) -> bool:
    return _tail_gap(program) is not None or any(
        op.timing is not None and gap_literal(op.timing.gap_us) for op in program.ops
    )


def _tail_gap(program: Program) -> str | None:
    return gap_literal(program.timing.tail_gap_us) if program.timing is not None else None


def replay_lines(b: Builder) -> list[str]:
    program = b.program
    streams = {sid: b.ns.numbered(("stream", sid), "st") for sid in side_streams(program)}
    events = {p for op in program.ops for p in op.stream_waits}
    flags = {p: i for i, p in enumerate(sorted({p for op in program.ops
                                                for p in op.thread_waits}))}
    lines = [line for i, name in enumerate(streams.values())
             for line in helper_call("_stream", [str(i)], 1, name)]
    if not program.threaded:
        lines += _unit(b, program.ops, 1, streams, events, flags)
    else:
        lines += _threads(b, streams, events, flags)
    for name in streams.values():
        lines += helper_call("_join", [name], 1)
    tail = _tail_gap(program)
    if tail is not None:  # the step's host time after its last op
        assert program.timing is not None
        lines += helper_call(
            "_host_gap", gap_args(tail, program.timing.tail_gap_events, len(program.ops),
                                  program.timing.tail_gap_calls,
                                  program.timing.tail_gap_annotations), 1)
    return lines


def gap_args(gap: str, events: int, before: int, calls: int = 0,
             annotations: int = 0) -> list[str]:
    """``_host_gap``'s arguments: the gap, the profiler-only scopes recorded in it where
    there were any (the benchmark subtracts their recording cost), the index of the op
    it precedes (the op count for the step's tail), by which the benchmark measures its
    own time in this very gap, the Python calls the profiler traced in it, and the
    Python record_function scopes begun in it (not among the scopes: each costs the
    recorders another amount), where any (their cost is subtracted too)."""
    return [gap, *([str(int(events))] if events > 0 else []), f"before={int(before)}",
            *([f"calls={int(calls)}"] if calls > 0 else []),
            *([f"annotations={int(annotations)}"] if annotations > 0 else [])]


def _threads(b: Builder, streams: dict[int, str], events: set[int],
             flags: dict[int, int]) -> list[str]:
    program = b.program
    order = list(dict.fromkeys(op.thread for op in program.ops))
    # A thread may read a value or event another thread's body (emitted later) binds:
    # name them all first, in op order.
    for root in shared_roots(program):
        b.ns.numbered(binding_key(root), "t" if isinstance(root, OpOutput) else "v")
    for p in sorted(events):
        b.ns.numbered(("event", p), "ev")
    bodies = {}
    for tid in order:
        mine = [op for op in program.ops if op.thread == tid]
        bodies[tid] = (b.ns.numbered(("thread", tid), "thread_"),
                       _unit(b, mine, 2, streams, events, flags))
    # Names bound in one thread and read in another live in replay(): each thread that
    # binds one declares it nonlocal.
    thread_of_event = {p: program.ops[p].thread for p in events}
    readers = {p: {op.thread for op in program.ops if p in op.stream_waits} for p in events}
    shared: list[tuple[str, int]] = []
    for root in shared_roots(program):
        key = binding_key(root)
        if key in b.ns:
            shared.append((b.ns.get(key), _binder(program, root)))
    for p in sorted(events):
        if readers[p] - {thread_of_event[p]}:
            shared.append((b.ns.get(("event", p)), thread_of_event[p]))
    lines = [f"    {name} = None" for name, _ in shared]
    for tid in order:
        name, body = bodies[tid]
        lines += ["", f"    def {name}():"]
        lines += names_statement("nonlocal", [n for n, t in shared if t == tid], 2)
        lines += body
    lines.append("")
    lines += helper_call("_run_threads", [str(len(flags))] + [bodies[t][0] for t in order], 1)
    return lines


def _binder(program: Program, root: Binding) -> int:
    """The host thread whose statement binds a variable."""
    if isinstance(root, OpOutput):
        return program.ops[root.op_index].thread
    for op in program.ops:
        if any(view is root for view in op.derive_before):
            return op.thread
    raise AssertionError("variable without a binding statement")


def _unit(b: Builder, ops: list[Op], depth: int, streams: dict[int, str], events: set[int],
          flags: dict[int, int]) -> list[str]:
    """Statements of one host thread's ops, grouping consecutive ops on one stream."""
    lines: list[str] = []
    current: int | None = None
    previous_scope: tuple[str, ...] | None = None
    b.grad_state = None  # grad mode is per host thread
    b.saves_state = True  # as are saved-tensor hooks
    for op in ops:
        if op.stream != current:
            current = op.stream
            if current is not None:
                lines.append(f"{INDENT * depth}with _on({streams[current]}):")
        inner = depth + (current is not None)
        if op.scope != previous_scope and op.scope:
            lines.append(INDENT * inner + exprs.comment(op.scope[-1]))
        previous_scope = op.scope
        for p in op.thread_waits:
            lines += helper_call("_await", [str(flags[p])], inner)
        # Waits for peers first: the recorded gap holds them (`_waited_for_peers`).
        lines += b.wait_lines(op, inner)
        gap = gap_literal(op.timing.gap_us) if op.timing is not None else None
        if gap is not None:
            assert op.timing is not None
            lines += helper_call("_host_gap", gap_args(gap, op.timing.gap_events, op.index,
                                                       op.timing.gap_calls,
                                                       op.timing.gap_annotations), inner)
        for p in op.stream_waits:
            lines += helper_call("_wait", [b.ns.get(("event", p))], inner)
        lines += b.op_statement(op, inner, waits=False)
        if op.index in events:
            lines += helper_call("_record", [], inner, b.ns.numbered(("event", op.index), "ev"))
        if op.index in flags:
            lines += helper_call("_signal", [str(flags[op.index])], inner)
    lines += b.end_grad_mode(depth)
    return lines


ORIGINAL_COMMENT = ("# The linked Kineto trace (mystique-gen --kineto): end-to-end step time "
                    "and per-op facts.")


def original_lines(program: Program, rank: int | None = None) -> list[str]:
    """``ORIGINAL``: the linked Kineto trace's facts, or None; with them ``ORIGINAL_OPS``,
    one row per replayed op. For one ``rank`` of a distributed file:
    ``ORIGINAL_RANK<N>`` and ``ORIGINAL_OPS_RANK<N>``, and nothing without facts."""
    suffix = "" if rank is None else f"_RANK{int(rank)}"
    timing = program.timing
    if timing is None:
        return [] if rank is not None else [ORIGINAL_COMMENT, "ORIGINAL = None"]
    fields = (
        ("kineto", exprs.str_literal(exprs.docstring_line(timing.kineto, 200))),
        ("sha256", exprs.str_literal(timing.sha256)),
        ("step_ms", exprs.float_literal(round(timing.step_ms, 4))),
        ("step_ms_from", exprs.str_literal(timing.step_ms_from)),
        ("linked_ops", str(timing.linked_ops)),
        ("host_gaps", exprs.str_literal(exprs.docstring_line(timing.host_gaps, 200))),
        ("observer_in_gaps", str(timing.observer_in_gaps)),
        ("memory_in_gaps", str(timing.memory_in_gaps)),
        ("observer_ranges", str(timing.observer_ranges)),
        ("observer_schema", exprs.str_literal(timing.observer_schema)),
        ("profiler_options",
         exprs.list_display([Atom(exprs.str_literal(o)) for o in timing.profiler_options])),
        # The linked ops' recorded time: what the observer cost them, against its
        # cost to the replay's, calibrates its share of same-session gaps.
        ("op_cpu_us", _us(sum(op.timing.cpu_us for op in program.ops
                              if op.timing is not None))),
        ("host_probe_us", "None" if timing.host_probe_us is None
         else exprs.float_literal(round(timing.host_probe_us, 3))),
        ("step_gaps_us", exprs.list_display([Atom(_us(t)) for t in timing.step_gap_totals_us])),
        ("gap_steps", str(timing.gap_steps)),
        ("profiler_warm", str(timing.profiler_warm)),
        ("step_gaps_typical_us", "None" if timing.step_gap_typical_us is None
         else _us(timing.step_gap_typical_us)),
    )
    # A list's entry splits as black splits it (a capture's many or long step gaps ran
    # past 88 columns on one line).
    items = [exprs.dict_entry(k, v if isinstance(v, Group) else Atom(v)) for k, v in fields]
    lines = [ORIGINAL_COMMENT if rank is None else
             f"# Rank {int(rank)}'s linked Kineto trace: step time and per-op facts."]
    lines += lay_out(f"ORIGINAL{suffix} = ", Group("{", tuple(items), "}", literal=True), 0)
    lines.append("# Per replayed op: [CPU us, exclusive CPU us, GPU us, host gap us before it]")
    lines += lay_out(f"ORIGINAL_OPS{suffix} = ",
                     exprs.list_display([_timing_row(op) for op in program.ops]), 0)
    return lines


def _timing_row(op: Op) -> Node:
    t = op.timing
    if t is None:
        return Atom("None")
    values = (t.cpu_us, t.cpu_self_us, t.gpu_us, t.gap_us)
    return exprs.list_display([Atom(_us(v)) for v in values])


def _us(value: float | None) -> str:
    return "None" if value is None else exprs.float_literal(round(float(value), 1))
