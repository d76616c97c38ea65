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
from dataclasses import dataclass, field, replace
from typing import Any

from mystique_gen.errors import OptionError, TraceError
from mystique_gen.ir.dist import DistInfo, ParamComms, ProcessGroupSpec
from mystique_gen.passes.filters import is_communication
from mystique_gen.sources.et import RawNode, RawTrace

INIT_NODE = "## process_group:init ##"


def init_node(trace: RawTrace) -> RawNode | None:
    return next((n for n in trace.nodes if n.name == INIT_NODE), None)


def read_groups(trace: RawTrace) -> list[ProcessGroupSpec] | None:
    """The process groups in creation order: the job's, where the driver merged a rank
    set's (:func:`job_groups`), else the trace's own; None where it has no init node."""
    if trace.job_groups is not None:
        return trace.job_groups
    return recorded_groups(trace)


def recorded_groups(trace: RawTrace) -> list[ProcessGroupSpec] | None:
    """The groups the trace's own init node lists; None where it has none."""
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


def job_groups(traces: Sequence[RawTrace]) -> list[list[ProcessGroupSpec]] | None:
    """Per trace, the process groups of the whole job, in creation order; None unless
    every trace records groups and they agree.

    Each rank records only the groups it is a member of (rank 0 of a 2 x 2 mesh lists
    the default group, dp [0, 2] and tp [0, 1]; rank 1 lists dp [1, 3] and tp [0, 1]),
    but ``new_group`` must be called by every rank for every group, in the order the
    job created them. A group's name (``pg_name``) is the same on every rank; numbered
    names are the creation order. Each trace's copy keeps its own ``backend_id``s
    (per-process ids that 1.0.2 collectives name their group by).
    """
    recorded = [recorded_groups(t) for t in traces]
    if any(r is None for r in recorded):
        return None
    merged: dict[str, ProcessGroupSpec] = {}
    for groups in recorded:
        assert groups is not None
        for g in groups:
            seen = merged.setdefault(g.name, g)
            if (seen.desc, seen.ranks, seen.size) != (g.desc, g.ranks, g.size):
                return None
    names = _creation_order([[g.name for g in groups or ()] for groups in recorded])
    result = []
    for groups in recorded:
        assert groups is not None
        own = {g.name: g for g in groups}
        result.append([replace(merged[n], index=i,
                               backend_id=own[n].backend_id if n in own else None)
                       for i, n in enumerate(names)])
    return result


def _creation_order(orders: Sequence[Sequence[str]]) -> list[str]:
    """The job's group names in creation order, from each rank's own (each lists its
    groups in the order it created them). Numbered names count every ``new_group``
    call, so they follow their numbers; hashed names (members-only groups,
    ``use_local_synchronization=True``, ``split_group``) have no number and go where
    the ranks that list them created them. Placed by first mention instead, rank 0's
    groups all came first: one mesh dimension's groups were not one after another
    (the halves [0, 1] and [2, 3] around [0, 2]), and a gather on the half [2, 3]
    ran on [0, 2], the first group of its size that rank 2 was in, and hung."""
    first: dict[str, int] = {}
    after: dict[str, set[str]] = {}
    for order in orders:
        for k, name in enumerate(order):
            first.setdefault(name, len(first))
            after.setdefault(name, set()).update(order[:k])
    numbered = sorted((n for n in first if n.isdigit()), key=int)
    for k, name in enumerate(numbered):
        after[name].update(numbered[:k])
    placed: list[str] = []
    while len(placed) < len(first):
        ready = [n for n in first if n not in placed and after[n] <= set(placed)]
        if not ready:  # the ranks' orders disagree: keep the order of first mention
            return list(first)
        placed.append(min(ready, key=first.__getitem__))
    return placed


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

    Their process groups must agree (:func:`job_groups`: each rank lists its own) with
    a default group of one rank per trace, or, for traces without that description
    (schema 1.0.1), all hold collectives whose recorded world size is the number of
    traces.
    """
    if len(traces) < 2:
        return False
    if any(recorded_groups(t) is not None for t in traces):
        merged = job_groups(traces)
        if merged is None:
            return False
        groups = merged[0]
        return groups[default_group_index(groups)].size == len(traces)
    sizes = {world_size(None, scan_trace(t).ops.values()) for t in traces}
    if sizes == {None}:
        # Nothing records the job's size: gloo writes no record_param_comms, and an
        # observer started before init_process_group no group description (Chakra's
        # whole-run collection). Traces that all communicate are then its ranks, one
        # each: --compose refuses them, so they had no reading at all.
        return all(communicates(t) for t in traces)
    return sizes == {len(traces)}


def communicates(trace: RawTrace) -> bool:
    """Whether the trace issued a collective (c10d's or a functional one)."""
    return any(is_communication(n.name) for n in trace.nodes)


_RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE)


def named_rank(name: str) -> int | None:
    """The rank a trace's file name gives (``step-rank-3.et.json``: 3, as the capture
    names each rank's files), else None."""
    found = _RANK_IN_NAME.findall(name)
    return int(found[-1]) if found else None


def check_rank_set(traces: Sequence[RawTrace]) -> None:
    """Refuse several traces of one job that are not one trace of each of its ranks:
    fewer than its default group's ranks (a glob that missed one: "combine them with
    --compose", which refuses traces that communicate), or a trace given twice, which
    replayed one rank's ops on two processes and none of another's, without a word."""
    if len(traces) < 2 or all(recorded_groups(t) is None for t in traces):
        return
    merged = job_groups(traces)
    if merged is None:
        return
    size = merged[0][default_group_index(merged[0])].size
    names = [named_rank(t.name) for t in traces]
    if 1 < size != len(traces):
        gone = sorted(set(range(size)) - set(names)) if None not in names else []
        missing = (f"; missing, by their file names: rank(s) {', '.join(map(str, gone))}"
                   if gone else "")
        raise OptionError(
            f"{len(traces)} traces ({', '.join(t.name for t in traces)}) of a job of "
            f"{size} ranks (its default process group's size): a benchmark of the job "
            f"needs one trace per rank{missing}")
    seen: dict[str, str] = {}
    for t in traces:
        if t.sha256 and t.sha256 in seen:
            raise OptionError(f"{seen[t.sha256]} and {t.name} are the same trace: each "
                              "rank of the job needs its own")
        seen[t.sha256] = t.name


def order_ranks(traces: Sequence[RawTrace],
                paths: Sequence[str] | None = None) -> tuple[list[int], str]:
    """Rank of each trace and how it was found: recorded ranks, else the natural order
    of their paths (``paths``, as given; else the traces' file names), where the file
    names give each rank once or none."""
    recorded = [recorded_rank(list(scan_trace(t).ops.values())) for t in traces]
    if all(r is not None for r in recorded) and sorted(recorded) == list(range(len(traces))):
        return [r for r in recorded if r is not None], "ranks as recorded by record_param_comms"
    # Gloo records no rank: the file names tell it. A shell glob (traces/step-rank-*.json)
    # gives them in text order, rank-10 before rank-2: in input order the rank-2
    # process replayed rank 10's ops, and a 12-rank job with a subgroup hung.
    named = [named_rank(t.name) for t in traces]
    if None not in named and sorted(named) != list(range(len(traces))):
        # Local ranks (each node's files numbered from 0) or a rank given twice: which
        # file is which rank cannot be told.
        raise OptionError(
            "the file names give ranks "
            f"{', '.join(f'{t.name} {r}' for t, r in zip(traces, named, strict=True))}, "
            f"not each of 0 to {len(traces) - 1} once: name each rank's trace by its "
            "global rank (RANK, as mystique-gen capture does)")
    # Whole paths: node0/trace.json before node1/trace.json, as given.
    keys = list(paths) if paths is not None else [t.name for t in traces]
    order = sorted(range(len(traces)), key=lambda k: natural_key(keys[k]))
    ranks = [0] * len(traces)
    for rank, k in enumerate(order):
        ranks[k] = rank
    return ranks, "ranks in the order of their file paths, sorted naturally"


def check_kineto_count(trace_names: Sequence[str], kineto_names: Sequence[str]) -> None:
    """One Kineto trace per rank trace, or a one-line error naming both sets of files."""
    if len(kineto_names) != len(trace_names):
        # tensorboard_trace_handler under a repeating schedule writes one file per rank
        # and cycle into one folder.
        cycles = (" (a profiler whose schedule repeats writes one per rank and cycle: "
                  "give one cycle's)" if len(kineto_names) > len(trace_names) else "")
        raise OptionError(
            f"{len(trace_names)} rank traces ({', '.join(trace_names)}) but "
            f"{len(kineto_names)} Kineto trace(s) ({', '.join(kineto_names)}): --kineto "
            f"takes one Kineto trace per rank trace{cycles}")


def match_kineto(trace_ranks: Sequence[int], kineto_ranks: Sequence[int | None],
                 trace_names: Sequence[str], kineto_names: Sequence[str]
                 ) -> tuple[list[int], str]:
    """For each rank trace, the index of its Kineto trace, and how they were matched.

    By the rank each Kineto trace records (``distributedInfo.rank``) where every one of
    them records one; otherwise in the order given, the k-th Kineto trace with the k-th
    rank trace, and a rank that a Kineto trace does record must then agree. Any other
    pairing is refused: timing linked to another rank's trace would be wrong silently.
    """
    check_kineto_count(trace_names, kineto_names)
    if all(r is not None for r in kineto_ranks):
        if sorted(r for r in kineto_ranks if r is not None) != sorted(trace_ranks):
            recorded = ", ".join(f"{n} rank {r}" for n, r in zip(kineto_names, kineto_ranks,
                                                               strict=True))
            raise OptionError(
                "the Kineto traces record other ranks than the rank traces' "
                f"({', '.join(map(str, sorted(trace_ranks)))}): {recorded}")
        where = {r: k for k, r in enumerate(kineto_ranks)}
        return ([where[r] for r in trace_ranks],
                "Kineto traces matched to ranks by the rank each records (distributedInfo)")
    for k, (rank, recorded) in enumerate(zip(trace_ranks, kineto_ranks, strict=True)):
        if recorded is not None and recorded != rank:
            raise OptionError(
                f"{kineto_names[k]} records rank {recorded} but goes with {trace_names[k]} "
                f"(rank {rank}) by order: give the Kineto traces in the order of the rank "
                "traces")
    return list(range(len(trace_names))), "Kineto traces matched to ranks in the order given"


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


# -- record_param_comms: what each collective's own arguments do not say ----------------
PARAM_COMMS = "record_param_comms"


@dataclass
class CommScan:
    """The trace's record_param_comms facts: per c10d op, and the waits in node order."""

    ops: dict[int, ParamComms] = field(default_factory=dict)  # c10d node id -> facts
    waits: list[ParamComms] = field(default_factory=list)
    groups: list[ProcessGroupSpec] | None = None


def scan_trace(trace: RawTrace) -> CommScan:
    by_id = {n.id: n for n in trace.nodes}
    scan = CommScan(groups=read_groups(trace))
    for node in trace.nodes:
        if node.name != PARAM_COMMS:
            continue
        facts = read_param_comms(node)
        if facts is None:
            continue
        parent = by_id.get(node.parent)
        if parent is not None and parent.name.startswith("c10d::"):
            scan.ops.setdefault(parent.id, facts)
        elif facts.collective == "wait":
            scan.waits.append(facts)
    return scan


def read_param_comms(node: RawNode) -> ParamComms | None:
    """Parse one record_param_comms node; None where it names no collective.

    Positional layout around the collective name (the first ``String`` input), the
    same in every schema: ``[tensors], seq, pg, rank, NAME, in_splits, out_splits,
    ..., world_size``. Attributes (1.0.3 and later) take precedence where present.
    """
    values = [a.value for a in node.inputs]
    types = [a.type for a in node.inputs]
    i = next((k for k, t in enumerate(types) if t == "String" and isinstance(values[k], str)),
             None)
    attrs = node.attrs
    name = attrs.get("collective_name") or (values[i] if i is not None else None)
    if not isinstance(name, str) or not name:
        return None

    def at(k: int) -> Any:
        return values[k] if i is not None and 0 <= k < len(values) else None

    seq = at(i - 3) if i is not None else None
    group = attrs.get("pg_name") if attrs.get("pg_name") not in (None, "") else at(i - 2)
    if isinstance(group, list):  # (pg_name, pg_desc)
        group = group[0] if group and isinstance(group[0], str) else None
    if group == "" or isinstance(group, bool) or not isinstance(group, (str, int)):
        group = None
    rank = at(i - 1) if i is not None else None
    world = attrs.get("pg_size")
    if world is None and i is not None:
        tail = [v for v in values[i + 3:] if isinstance(v, int) and not isinstance(v, bool)]
        world = tail[-1] if tail else None
    return ParamComms(
        node_id=node.id,
        thread=node.tid,
        collective=name,
        seq=seq if is_int(seq) and seq >= 0 else None,
        group=group,
        rank=rank if is_int(rank) and rank >= 0 else None,
        in_splits=_splits(attrs.get("in_split_size"), at(i + 1) if i is not None else None,
                          node.id, "in_split_size"),
        out_splits=_splits(attrs.get("out_split_size"), at(i + 2) if i is not None else None,
                           node.id, "out_split_size"),
        world_size=world if is_int(world) and world > 0 else None,
    )


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _splits(attr: Any, positional: Any, node_id: int, field_name: str) -> tuple[int, ...]:
    value = positional
    if isinstance(attr, str) and attr:
        try:
            value = json.loads(attr)
        except json.JSONDecodeError:
            raise TraceError("split sizes are not a JSON list", node_id=node_id,
                             field=field_name) from None
    if not isinstance(value, list) or not all(is_int(v) and v >= 0 for v in value):
        return ()
    return tuple(value)


def group_index(facts: ParamComms | None, groups: list[ProcessGroupSpec]) -> int | None:
    """The benchmark's group index for a collective; None where the trace does not say."""
    if facts is None or facts.group is None:
        return None
    for g in groups:
        if isinstance(facts.group, str) and g.name == facts.group:
            return g.index
        if isinstance(facts.group, int) and g.backend_id == facts.group:
            return g.index
    return None


