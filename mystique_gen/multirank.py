"""One benchmark for every rank of a distributed job.

``mystique-gen rank-0.json rank-1.json ... -o bench.py`` (or a directory of per-rank
traces) compiles each rank's trace into its own ``make_inputs_rank<N>`` and
``replay_rank<N>``, all in one file that shares operator handles and the harness;
under torchrun each process replays its own rank. A single trace with
communication goes the same way, as a one-rank set.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mystique_gen.backends import comms as emit_comms
from mystique_gen.backends import exprs
from mystique_gen.backends.context import BenchmarkContext, GenerateOptions
from mystique_gen.errors import MystiqueError
from mystique_gen.ir import Program
from mystique_gen.options import BuildOptions
from mystique_gen.passes.ranks import is_multi_rank_set, natural_key, order_ranks
from mystique_gen.sources.et import RawTrace, load_trace

TRACE_SUFFIXES = (".json", ".json.gz")


def expand_inputs(paths: list[str | Path]) -> list[Path]:
    """Paths as given; a directory stands for its trace files, sorted naturally."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted((f for f in p.iterdir()
                            if f.is_file() and f.name.endswith(TRACE_SUFFIXES)),
                           key=lambda f: natural_key(f.name))
            if not found:
                raise MystiqueError(f"{p.name}: no .json or .json.gz traces in this directory")
            out.extend(found)
        else:
            out.append(p)
    return out


def load_rank_set(paths: list[Path], build: BuildOptions | None) -> list[RawTrace] | None:
    """The traces, when several are given without --compose and they are the ranks of
    one job (see :func:`~mystique_gen.passes.ranks.is_multi_rank_set`); else None."""
    if len(paths) < 2 or (build is not None and build.compose is not None):
        return None
    traces = [load_trace(p) for p in paths]
    return traces if is_multi_rank_set(traces) else None


def compile_ranks(traces: list[RawTrace], paths: list[Path], build: BuildOptions | None,
                  threads: bool = False) -> tuple[list[Program], list[int], str]:
    """One program per rank, with the rank numbers and how they were found."""
    from mystique_gen.passes.streams import schedule_program
    from mystique_gen.passes.values import resources_dir
    from mystique_gen.pipeline import build_program

    ranks, how = order_ranks(traces)
    programs = []
    for trace, path in zip(traces, paths, strict=True):
        program = build_program(trace, resources_dir(path), build)
        programs.append(schedule_program(program, trace, None, threaded=threads))
    order = sorted(range(len(ranks)), key=lambda k: ranks[k])
    return [programs[k] for k in order], [ranks[k] for k in order], how


def build_distributed_context(programs: list[Program], ranks: list[int],
                              options: GenerateOptions | None = None,
                              rank_source: str = "") -> BenchmarkContext:
    """Every rank's functions in one context; header, TRACE and harness from rank 0."""
    from mystique_gen.backends.context import _ContextBuilder

    options = options or GenerateOptions()
    infos = [p.distributed for p in programs if p.distributed is not None]
    if not infos:
        raise MystiqueError("internal error: a distributed benchmark of traces without "
                            "communication")
    info = infos[0]
    world = max(i.world_size for i in infos)
    if len(programs) > 1:
        world = max(world, len(programs))
    builder = _ContextBuilder(programs[0], options)
    bodies: list[emit_comms.RankBody] = []
    first: BenchmarkContext | None = None
    last: BenchmarkContext | None = None
    for program, rank in zip(programs, ranks, strict=True):
        builder.start_program(program)
        last = builder.build()
        first = first or last
        bodies.append(emit_comms.RankBody(rank, program.trace.name, last.input_lines,
                                          last.replay_lines, len(program.ops)))
    assert first is not None and last is not None
    dist_info = dataclasses.replace(info, world_size=world)
    dist = emit_comms.DistContext(
        world_size=world,
        ranks=bodies,
        group_lines=emit_comms.group_lines(dist_info),
        rank_lines=emit_comms.rank_lines(bodies),
    )
    docstring = first.docstring + _rank_docstring(programs, ranks, world, rank_source)
    return dataclasses.replace(first, docstring=docstring, op_lines=last.op_lines,
                               fallbacks=last.fallbacks, dist=dist)


def _rank_docstring(programs: list[Program], ranks: list[int], world: int,
                    rank_source: str) -> list[str]:
    from mystique_gen.backends.context import _wrap

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
    info = programs[0].distributed
    if info is not None:
        lines.append("Process groups (new_group on every rank, in this order):")
        for g in info.groups:
            members = (f"ranks {list(g.ranks)}" if g.ranks is not None
                       else f"{g.size} rank(s), members not listed")
            lines.append(f"  - {d(g.name, 30)} ({d(g.desc, 30) or 'no description'}): "
                         f"{members}")
        if not info.groups_recorded:
            lines.append("  (not recorded: the default group only)")
    return _wrap(lines)


def generate_ranks(traces: list[RawTrace], paths: list[Path], out: str | Path,
                   options: GenerateOptions | None, build: BuildOptions | None,
                   threads: bool = False) -> str:
    from mystique_gen.backends.render import render
    from mystique_gen.generate import write_atomic

    programs, ranks, how = compile_ranks(traces, paths, build, threads)
    if all(p.distributed is None for p in programs):
        raise MystiqueError("these traces hold no communication; combine them with --compose")
    text = render(build_distributed_context(programs, ranks, options, how))
    write_atomic(Path(out), text)
    return text


def reference_context() -> BenchmarkContext:
    """The distributed template for a trace with no nodes (the safety check's harness)."""
    from mystique_gen.ir.dist import DistInfo, ProcessGroupSpec
    from mystique_gen.pipeline import build_program
    from mystique_gen.sources.et import RawTrace as Trace

    program = build_program(Trace(name="reference", sha256="0" * 64, schema="", nodes=[],
                                  metadata={}))
    program.distributed = DistInfo(1, 0, [ProcessGroupSpec(0, "0", "default_pg", None, 1)],
                                   True)
    return build_distributed_context([program], [0])

