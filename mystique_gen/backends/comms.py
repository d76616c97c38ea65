"""Emit communication: torch.distributed calls, their waits, and the rank tables.

A collective is emitted as a direct ``torch.distributed`` call on the recorded
tensors (their names come from the tensor pass's bindings, so data flows as in the
original), under ``if _RUNTIME["comm"]:`` so that a multi-rank benchmark run
without a launcher can replay its compute alone. An async collective binds its
``Work`` to a ``work<N>`` variable and ``_wait_work(work<N>)`` is emitted where the trace
waited (see passes/comms.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mystique_gen import oprules
from mystique_gen.backends import exprs
from mystique_gen.backends.layout import INDENT, Atom, Group, Node, lay_out
from mystique_gen.ir import ListValue, Op, Program, Value, iter_tensors
from mystique_gen.ir.dist import DistInfo, ProcessGroupSpec
from mystique_gen.passes.comms import replayable

GUARD = 'if _RUNTIME["comm"]:'


@dataclass
class RankBody:
    """One rank's functions in a distributed benchmark."""

    rank: int
    trace: str  # file name of the rank's trace
    input_lines: list[str]
    replay_lines: list[str]
    op_count: int
    # ORIGINAL_RANK<N> and ORIGINAL_OPS_RANK<N>: its linked Kineto trace's facts, if any
    original_lines: list[str] = field(default_factory=list)

    @property
    def original(self) -> str:
        """What the rank table holds for its Kineto facts."""
        return f"ORIGINAL_RANK{self.rank}" if self.original_lines else "None"


@dataclass
class DistContext:
    """Template facts of a distributed benchmark (None for a plain one)."""

    world_size: int
    ranks: list[RankBody] = field(default_factory=list)
    group_lines: list[str] = field(default_factory=list)  # PROCESS_GROUPS = [...]
    rank_lines: list[str] = field(default_factory=list)  # RANKS = {...}


def group_row(group: ProcessGroupSpec, world: int) -> Node:
    """``{"name": ..., "desc": ..., "ranks": [...] | None, "size": N, "create": bool}``."""
    ranks: Node = exprs.int_list(group.ranks) if group.ranks is not None else Atom("None")
    items = [
        Atom(f'"name": {exprs.str_literal(exprs.docstring_line(group.name, 60))}'),
        Atom(f'"desc": {exprs.str_literal(exprs.docstring_line(group.desc, 60))}'),
        exprs.dict_entry("ranks", ranks),  # splits as black splits a long list
        Atom(f'"size": {int(group.size)}'),
        Atom(f'"create": {replayable(group, world)!r}'),
    ]
    return Group("{", tuple(items), "}", literal=True)


def group_lines(info: DistInfo) -> list[str]:
    rows = [group_row(g, info.world_size) for g in info.groups]
    return lay_out("PROCESS_GROUPS = ", exprs.list_display(rows), 0)


def rank_lines(ranks: list[RankBody]) -> list[str]:
    """``RANKS = {0: (make_inputs_rank0, replay_rank0, OPS, ORIGINAL_RANK0), ...}``, the
    last None where the rank has no linked Kineto trace."""
    items = [
        Atom(f"{r.rank}: (make_inputs_rank{r.rank}, replay_rank{r.rank}, {r.op_count}, "
             f"{r.original})")
        for r in ranks
    ]
    return lay_out("RANKS = ", Group("{", tuple(items), "}", literal=True), 0)


def _work_name(builder: Any, op: Op) -> str:
    return builder.ns.numbered(("work", id(op)), "work")


def call_lines(builder: Any, op: Op, depth: int) -> list[str]:
    """``if _RUNTIME["comm"]:`` + the torch.distributed call of one c10d op."""
    info = op.comm
    assert info is not None
    rule = oprules.COMM_OPS[op.name]
    by_name = {a.spec.name: a.value for a in op.args}
    args: list[Node] = [
        _tensor_arg(builder.value, by_name[name], form) for name, form in rule.tensors
    ]
    if info.root is not None and info.root_keyword:
        args.append(exprs.keyword(info.root_keyword, Atom(str(int(info.root)))))
    if rule.splits:
        args.append(exprs.keyword("output_split_sizes", _splits(info.out_splits)))
        args.append(exprs.keyword("input_split_sizes", _splits(info.in_splits)))
    if info.reduce_op is not None and info.reduce_op != "SUM":  # SUM: every call's default
        args.append(exprs.keyword("op", Atom(reduce_op_expr(info.reduce_op))))
    if info.tag is not None:
        args.append(exprs.keyword("tag", Atom(str(int(info.tag)))))
    for keyword, scalar in info.scalars:
        args.append(exprs.keyword(keyword, Atom(repr(scalar if isinstance(scalar, bool)
                                                     else int(scalar)))))
    args.append(exprs.keyword("group", Atom(f"_GROUPS[{int(info.group)}]")))
    name = rule.call
    prefix = ""
    if info.asynchronous:
        name = rule.async_call or rule.call
        if rule.has_async_arg:
            args.append(exprs.keyword("async_op", Atom("True")))
        prefix = f"{_work_name(builder, op)} = "
    callee = name if rule.harness else f"torch.distributed.{name}"
    wire = wire_form(op, rule.reduce_op is not None)
    if wire:  # gloo cannot send this dtype: its bytes, or for a reduction a wider copy
        callee = f"_{'bytewise' if wire == 'bytes' else 'widened'}({callee})"
    call = exprs.call(callee, args)
    return [INDENT * depth + GUARD, *lay_out(prefix, call, depth + 1)]


def wire_form(op: Op, reduces: bool) -> str | None:
    """How the collective `op` reaches gloo, by its tensors' dtypes
    (:func:`oprules.wire_form`)."""
    dtypes = {tv.meta.dtype for arg in op.args for tv in iter_tensors(arg.value)}
    return oprules.wire_form(dtypes, reduces)


def reduce_op_expr(name: str) -> str:
    """``torch.distributed.ReduceOp.MAX``: only members of the known table, never trace
    text (oprules.reduce_op_name maps what the trace says onto them)."""
    assert name in oprules.REDUCE_OP_NAMES.values(), name
    return f"torch.distributed.ReduceOp.{name}"


def _splits(values: tuple[int, ...] | None) -> Node:
    return exprs.int_list(values) if values else Atom("None")


def _tensor_arg(value_of: Any, value: Value, form: str) -> Node:
    if form in ("one", "inner", "inner_or_none"):
        assert isinstance(value, ListValue)
        inner = value.items[0] if value.items else ListValue(())
        if form == "inner_or_none" and isinstance(inner, ListValue) and not inner.items:
            return Atom("None")
        return value_of(inner)
    return value_of(value)


def _due(program: Program) -> dict[int | None, list[Op]]:
    """Async collectives by the op index their wait precedes (None: end of iteration)."""
    due: dict[int | None, list[Op]] = {}
    for c in program.ops:
        if c.comm is not None and c.comm.asynchronous:
            due.setdefault(c.comm.wait_before, []).append(c)
    return due


def waits_before(builder: Any, op: Op, depth: int) -> list[str]:
    """``_wait_work(workN)`` for every async collective whose wait precedes ``op``."""
    if builder.program.distributed is None:
        return []
    if getattr(builder, "_comm_due", (None,))[0] is not builder.program:
        builder._comm_due = (builder.program, _due(builder.program))
    return _wait_lines(builder, builder._comm_due[1].get(op.index, []), depth)


def waits_at_end(builder: Any, op: Op, depth: int) -> list[str]:
    """After the last op: waits no later op placed (every work is done per iteration)."""
    ops = builder.program.ops
    if builder.program.distributed is None or op.index != len(ops) - 1:
        return []
    return _wait_lines(builder, _due(builder.program).get(None, []), depth)


def _wait_lines(builder: Any, due: list[Op], depth: int) -> list[str]:
    if not due:
        return []
    return [INDENT * depth + GUARD] + [
        f"{INDENT * (depth + 1)}_wait_work({_work_name(builder, c)})" for c in due
    ]


def is_distributed(program: Program) -> bool:
    return program.distributed is not None
