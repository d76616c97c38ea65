"""``mystique-gen inspect``: what a trace holds and what a benchmark of it would replay."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mystique_gen import oprules
from mystique_gen.driver import check_trace_count, load_source, run_passes
from mystique_gen.errors import OptionError
from mystique_gen.ir import Level, Program, iter_tensors
from mystique_gen.ir.schema import is_op_name
from mystique_gen.options import BuildOptions
from mystique_gen.passes.deps import critical_path_length, dependency_graph
from mystique_gen.passes.link import timing_summary
from mystique_gen.sources.et import RawTrace


def inspect_paths(paths: Sequence[str | Path], options: BuildOptions, *,
                  kineto: str | Path | None = None) -> dict[str, Any]:
    """The summary of what ``options`` keep of the traces (several need --compose), with
    the Kineto link where ``kineto`` is given."""
    for path in paths:
        if Path(path).is_dir():
            raise OptionError(f"{Path(path).name}: inspect reads trace files, not a directory "
                              "of rank traces; inspect one rank's file")
    check_trace_count(len(paths), options)
    sources = [load_source(p, kineto) for p in paths]
    # inspect writes no code: no need to probe which public function calls each op.
    program = run_passes(sources, replace(options, public_calls=False))
    if len(sources) == 1:
        trace = sources[0].trace
    else:
        info = program.trace
        trace = RawTrace(info.name, info.sha256, info.schema,
                         [n for s in sources for n in s.trace.nodes], {})
    summary = summarize(trace, program)
    if kineto is not None:
        summary.update(timing_summary(program))
    return summary


def summarize(trace: RawTrace, program: Program) -> dict[str, Any]:
    names = Counter(n.name for n in trace.nodes)
    graph = dependency_graph(program.ops)
    dtypes: Counter[str] = Counter()
    for op in program.ops:
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                dtypes[tv.meta.dtype] += 1
    comm = Counter(
        n.name for n in trace.nodes
        if is_op_name(n.name) and n.name.split("::")[0] in oprules.COMMUNICATION_NAMESPACES
    )
    return {
        "trace": trace.name,
        "sha256": trace.sha256,
        "schema": trace.schema,
        "nodes": trace.node_count,
        "distinct_node_names": len(names),
        "selected_ops": len(program.ops),
        "ops_by_name": dict(sorted(Counter(op.name for op in program.ops).items())),
        "threads": program.threads,
        "devices": program.devices,
        "dtypes": dict(sorted(dtypes.items())),
        "communication_ops": dict(sorted(comm.items())),
        "materialised_inputs": sum(1 for s in program.storages if s.materialised),
        "dependency_edges": graph.number_of_edges(),
        "critical_path_ops": critical_path_length(graph),
        "estimated_peak_bytes": program.peak_bytes,  # on the recorded primary device
        "estimated_host_peak_bytes": program.host_peak_bytes,  # host tensors beside it
        "not_replayed": [
            {"node_id": s.node_id, "name": s.name, "reason": s.reason}
            for s in program.not_replayed
        ],
        "guarded_ops": dict(sorted(Counter(d.name for d in program.diagnostics
                                           if d.level is Level.GUARDED).items())),
        "filters": program.filters,  # what --mode/--include/--compose/... kept and changed
        "notes": program.notes,
    }


def format_summary(summary: dict[str, Any]) -> str:
    lines = [
        f"trace      {summary['trace']} (schema {summary['schema']}, {summary['nodes']} nodes)",
        f"selected   {summary['selected_ops']} ops on threads {summary['threads']}",
        f"devices    {', '.join(summary['devices']) or '-'}",
        f"dtypes     {', '.join(f'{k} x{v}' for k, v in summary['dtypes'].items()) or '-'}",
        f"inputs     {summary['materialised_inputs']} materialised storages, "
        f"peak ~{summary['estimated_peak_bytes'] / 2**20:.1f} MiB"
        + (f" on the device, ~{summary['estimated_host_peak_bytes'] / 2**20:.1f} MiB "
           "on the host" if summary["estimated_host_peak_bytes"] else ""),
        f"deps       {summary['dependency_edges']} edges, critical path "
        f"{summary['critical_path_ops']} of {summary['selected_ops']} ops",
        "",
    ]
    if summary.get("filters"):
        lines += ["filters applied:"] + [f"  {f}" for f in summary["filters"]] + [""]
    lines += [
        "ops by name:",
    ]
    width = max((len(k) for k in summary["ops_by_name"]), default=0)
    lines += [f"  {k:<{width}}  {v}" for k, v in summary["ops_by_name"].items()]
    if summary["communication_ops"]:
        lines += ["", "communication ops:"]
        lines += [f"  {k}  {v}" for k, v in summary["communication_ops"].items()]
    lines += ["", "not replayed:"]
    reasons = Counter((s["name"], s["reason"]) for s in summary["not_replayed"])
    lines += [f"  {n} x{c}: {r}" for (n, r), c in reasons.items()] or ["  none"]
    if summary["guarded_ops"]:
        lines += ["", "guarded (where unavailable at run time: ported or skipped):"]
        lines += [f"  {k}  {v}" for k, v in summary["guarded_ops"].items()]
    if summary["notes"]:
        lines += ["", "notes:"] + [f"  {n}" for n in summary["notes"]]
    return "\n".join(lines)
