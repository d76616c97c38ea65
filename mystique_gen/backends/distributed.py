"""The distributed backend: every rank of a job in one file (distributed.py.j2).

Each rank's Program becomes its own ``make_inputs_rank<N>`` and ``replay_rank<N>``;
operator handles, names and the harness are shared, and under torchrun each process
replays its own rank. A single trace with communication is a one-rank set.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from mystique_gen.backends import comms as emit_comms
from mystique_gen.backends import exprs, schedule
from mystique_gen.backends.base import BenchmarkContext, CodeGen, GenerateOptions, wrap
from mystique_gen.backends.check import Facts, check_source, gather
from mystique_gen.backends.render import render_text
from mystique_gen.errors import MystiqueError
from mystique_gen.ir import Program
from mystique_gen.ir.dist import DistInfo, ProcessGroupSpec

TEMPLATE = "distributed.py.j2"  # extends benchmark.py.j2


def render(programs: list[Program], ranks: list[int], options: GenerateOptions,
           rank_source: str = "") -> str:
    """One checked file for the ranks ``ranks`` (their Programs in the same order)."""
    context = build_distributed_context(programs, ranks, options, rank_source)
    text = render_text(context, TEMPLATE)
    check_source(text, reference_facts())
    return text


@lru_cache(maxsize=1)
def reference_facts() -> Facts:
    """The harness of distributed files: their template for one rank of no ops."""
    facts = gather(render_text(reference_context(), TEMPLATE, whole_harness=True))
    facts.handles.clear()
    return facts


def build_distributed_context(programs: list[Program], ranks: list[int],
                              options: GenerateOptions | None = None,
                              rank_source: str = "") -> BenchmarkContext:
    """Every rank's functions in one context; header, TRACE and harness from rank 0."""
    options = options or GenerateOptions()
    infos = [p.distributed for p in programs if p.distributed is not None]
    if not infos:
        raise MystiqueError("internal error: a distributed benchmark of traces without "
                            "communication")
    info = infos[0]
    world = max(i.world_size for i in infos)
    if len(programs) > 1:
        world = max(world, len(programs))
    builder = CodeGen(programs[0], options)
    bodies: list[emit_comms.RankBody] = []
    first: BenchmarkContext | None = None
    last: BenchmarkContext | None = None
    for program, rank in zip(programs, ranks, strict=True):
        builder.start_program(program)
        last = builder.build()
        first = first or last
        bodies.append(emit_comms.RankBody(rank, program.trace.name, last.input_lines,
                                          last.replay_lines, len(program.ops),
                                          schedule.original_lines(program, rank)))
    assert first is not None and last is not None
    dist_info = dataclasses.replace(info, world_size=world)
    if not info.groups_recorded:  # the default group alone, which is the job's world
        dist_info = dataclasses.replace(dist_info, groups=[
            dataclasses.replace(g, size=world) for g in info.groups])
    dist = emit_comms.DistContext(
        world_size=world,
        ranks=bodies,
        group_lines=emit_comms.group_lines(dist_info),
        rank_lines=emit_comms.rank_lines(bodies),
    )
    docstring = builder.docstring_of_ranks(programs, ranks) + _rank_docstring(
        programs, ranks, world, rank_source, dist_info)
    # Each rank's Kineto facts sit beside its functions; the job picks its own (RANKS).
    original = first.original_lines if not any(b.original_lines for b in bodies) else [
        "# The linked Kineto traces (mystique-gen --kineto), one per rank: "
        "ORIGINAL_RANK<N> below.",
        "ORIGINAL = None",
    ]
    # From rank 0's context: REQUIRED_BYTES and the inputs its memory check leaves out.
    return dataclasses.replace(first, docstring=docstring, op_lines=last.op_lines,
                               fallbacks=last.fallbacks, dist=dist, original_lines=original)


def _rank_docstring(programs: list[Program], ranks: list[int], world: int,
                    rank_source: str, info: DistInfo) -> list[str]:
    """The ranks this file replays and the process groups it creates (``info``: the
    job's, with the default group's size the job's world where none was recorded)."""
    d = exprs.docstring_line
    held = ", ".join(str(r) for r in ranks)
    lines = [
        "",
        f"Distributed: recorded on {world} rank(s); this file replays rank(s) {held}",
        f"  run: torchrun --nproc-per-node {world} THIS_FILE [--backend gloo|nccl]",
    ]
    if world > 1:
        lines.append("  without a launcher it replays rank "
                     f"{min(ranks)}'s compute only, without communication")
    if rank_source and len(programs) > 1:
        lines.append(f"  {rank_source}")
    for program, rank in zip(programs, ranks, strict=True):
        t = program.trace
        comm = sum(1 for op in program.ops if op.comm is not None)
        lines.append(f"  rank {rank}: {d(t.name, 60)}")
        lines.append(f"    sha256 {t.sha256}, schema {d(t.schema, 40)}, {t.node_count} nodes")
        lines.append(f"    {len(program.ops)} replayed ops ({comm} collectives), "
                     f"{len(program.not_replayed)} not replayed")
        timing = program.timing
        if timing is not None:
            lines.append(f"    Kineto {d(timing.kineto, 60)} (sha256 {timing.sha256}): "
                         f"{timing.linked_ops} ops linked, step "
                         f"{round(timing.step_ms, 4)} ms ({d(timing.step_ms_from, 80)}); "
                         "host gaps: "
                         f"{d(timing.host_gaps, 80)}"
                         + (" (with the ET observer attached)" if timing.observer_in_gaps
                            else ""))
    lines.append("Process groups (new_group on every rank, in this order):")
    for g in info.groups:
        members = (f"ranks {list(g.ranks)}" if g.ranks is not None
                   else f"{g.size} rank(s), members not listed")
        lines.append(f"  - {d(g.name, 30)} ({d(g.desc, 30) or 'no description'}): "
                     f"{members}")
    if not info.groups_recorded:
        lines.append("  (not recorded: the default group only)")
    return wrap(lines)


def reference_context() -> BenchmarkContext:
    """The distributed template for a trace with no nodes (the safety check's harness)."""
    program = Program.empty()
    program.distributed = DistInfo(1, 0, [ProcessGroupSpec(0, "0", "default_pg", None, 1)],
                                   True)
    return build_distributed_context([program], [0])

