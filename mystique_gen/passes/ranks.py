"""Ranks and process groups: read ``## process_group:init ##`` and order rank traces.

The init node lists every process group in creation order (name, description,
member ranks, size). A benchmark recreates them with ``new_group`` in that order on
every rank, so collectives on a sub-group meet the same peers as in the original.
Traces without the node (schema 1.0.1) fall back to the default group.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from mystique_gen.errors import TraceError
from mystique_gen.ir.dist import DistInfo, ParamComms, ProcessGroupSpec
from mystique_gen.sources.et import RawNode, RawTrace

INIT_NODE = "## process_group:init ##"
DEFAULT_GROUP_NAMES = ("0", "default_pg")


def init_node(trace: RawTrace) -> RawNode | None:
    return next((n for n in trace.nodes if n.name == INIT_NODE), None)


def read_groups(trace: RawTrace) -> list[ProcessGroupSpec] | None:
    """The recorded process groups in creation order; None where the trace has no init node."""
    node = init_node(trace)
    if node is None:
        return None
    if not node.inputs or not isinstance(node.inputs[0].value, str):
        raise TraceError("expected a JSON string of process groups", node_id=node.id,
                         field="inputs[0]")
    try:
        items = json.loads(node.inputs[0].value)
    except json.JSONDecodeError as exc:
        raise TraceError(f"process groups are not valid JSON: {exc.msg}", node_id=node.id,
                         field="inputs[0]") from None
    if not isinstance(items, list):
        raise TraceError("expected a list of process groups", node_id=node.id,
                         field="inputs[0]")
    return [_group(item, i, node.id) for i, item in enumerate(items)]


def _group(item: Any, index: int, node_id: int) -> ProcessGroupSpec:
    where = f"inputs[0][{index}]"
    if not isinstance(item, dict):
        raise TraceError("expected an object", node_id=node_id, field=where)
    size = item.get("group_size")
    ranks = item.get("ranks", [])
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise TraceError("group_size is not a positive integer", node_id=node_id,
                         field=f"{where}.group_size")
    if not isinstance(ranks, list) or not all(
        isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks
    ):
        raise TraceError("ranks is not a list of ranks", node_id=node_id, field=f"{where}.ranks")
    backend_id = item.get("backend_id")
    return ProcessGroupSpec(
        index=index,
        name=str(item.get("pg_name", index)),
        desc=str(item.get("pg_desc", "")),
        # An empty list is how the recorder writes "every rank of the world".
        ranks=tuple(ranks) if ranks else None,
        size=size,
        backend=str(item.get("backend_config", "")),
        backend_id=backend_id if isinstance(backend_id, int) else None,
    )


def default_group_index(groups: Sequence[ProcessGroupSpec]) -> int:
    for g in groups:
        if g.name == "0" or g.desc == "default_pg":
            return g.index
    return 0


def group_description(trace: RawTrace) -> tuple[tuple[object, ...], ...] | None:
    """What every rank of one job records alike about its groups (no per-process ids)."""
    groups = read_groups(trace)
    if groups is None:
        return None
    return tuple((g.name, g.desc, g.ranks, g.size) for g in groups)


def world_size(groups: list[ProcessGroupSpec] | None, comms: Sequence[ParamComms]) -> int | None:
    """Ranks of the recorded job: the default group's size, else what collectives say."""
    if groups:
        return groups[default_group_index(groups)].size
    sizes = [c.world_size for c in comms if c.world_size] + [
        len(s) for c in comms for s in (c.in_splits, c.out_splits) if s
    ]
    return max(sizes) if sizes else None


def recorded_rank(comms: Sequence[ParamComms]) -> int | None:
    """The rank the trace was recorded on, where record_param_comms wrote it."""
    ranks = {c.rank for c in comms if c.rank is not None and c.collective != "wait"}
    return ranks.pop() if len(ranks) == 1 else None


def is_multi_rank_set(traces: Sequence[RawTrace]) -> bool:
    """True when the traces are the ranks of one job: the meaning of several inputs.

    They must share one process group description whose default group has one rank
    per trace, or, for traces without that description (schema 1.0.1), all hold
    collectives whose recorded world size is the number of traces.
    """
    from mystique_gen.passes.comms import scan_trace

    if len(traces) < 2:
        return False
    descriptions = {group_description(t) for t in traces}
    if len(descriptions) != 1:
        return False
    groups = read_groups(traces[0])
    if groups is not None:
        return groups[default_group_index(groups)].size == len(traces)
    sizes = {world_size(None, scan_trace(t).ops.values()) for t in traces}
    return sizes == {len(traces)}


def order_ranks(traces: Sequence[RawTrace]) -> tuple[list[int], str]:
    """Rank of each trace and how it was found: recorded ranks, else input order."""
    from mystique_gen.passes.comms import scan_trace

    recorded = [recorded_rank(list(scan_trace(t).ops.values())) for t in traces]
    if all(r is not None for r in recorded) and sorted(recorded) == list(range(len(traces))):
        return [r for r in recorded if r is not None], "ranks as recorded by record_param_comms"
    return list(range(len(traces))), "ranks in input order (file names sorted naturally)"


def natural_key(name: str) -> list[object]:
    """Sort key that puts ``rank-10`` after ``rank-9``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def dist_info(trace: RawTrace, comms: Sequence[ParamComms], has_comm_ops: bool) -> DistInfo | None:
    """Distributed facts of one trace; None for a trace with no communication at all."""
    groups = read_groups(trace)
    if groups is None and not has_comm_ops:
        return None
    notes: list[str] = []
    recorded = groups is not None
    if groups is None:
        notes.append("no process_group:init node: every collective runs on the default group")
        groups = []
    size = world_size(groups, comms) or 1
    if not groups:
        groups = [ProcessGroupSpec(0, "0", "default_pg", None, size)]
    return DistInfo(world_size=size, rank=recorded_rank(comms), groups=groups,
                    groups_recorded=recorded, notes=notes)
