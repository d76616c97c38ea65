"""IR for distributed replay: process groups, communication ops, rank sets.

Lowering fills :class:`CommInfo` on each communication :class:`~mystique_gen.ir.Op`;
:class:`DistInfo` on the :class:`~mystique_gen.ir.Program` says how many ranks the
trace was recorded on, which rank it is, and which process groups existed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProcessGroupSpec:
    """One process group of the ``## process_group:init ##`` node, in creation order."""

    index: int
    name: str  # pg_name as recorded ("0" is the default group)
    desc: str
    ranks: tuple[int, ...] | None  # global ranks; None: not listed (all, if size fits)
    size: int
    backend: str = ""
    backend_id: int | None = None  # 1.0.2 traces name groups by this id


@dataclass(frozen=True)
class ParamComms:
    """What a ``record_param_comms`` node says about one collective (or a wait)."""

    node_id: int
    thread: int
    collective: str
    seq: int | None
    group: str | int | None  # pg name (1.0.3+) or backend id (1.0.2); None: not recorded
    rank: int | None
    in_splits: tuple[int, ...]
    out_splits: tuple[int, ...]
    world_size: int | None


# CommInfo.done_by of a collective whose work completed after every op of the step.
AFTER_THE_STEP = 1 << 62


@dataclass
class CommInfo:
    """How one communication op is replayed with torch.distributed."""

    call: str  # torch.distributed function, e.g. "all_reduce"
    group: int  # index into the benchmark's process groups (0: default group)
    root: int | None = None  # group-local root/peer rank
    root_keyword: str | None = None  # "group_src" / "group_dst"
    tag: int | None = None
    in_splits: tuple[int, ...] | None = None
    out_splits: tuple[int, ...] | None = None
    asynchronous: bool = False
    wait_before: int | None = None  # op index the wait precedes; None: end of iteration
    seq: int | None = None
    recorded_async: bool = False  # the trace's async_op argument
    wait_recorded: bool = False  # a wait node in the trace placed the wait
    # Node id of the first later op the original started once this async collective's
    # work had completed (its Kineto trace; AFTER_THE_STEP: none did); None: not known.
    # A later collective on its group issued before then had both in flight at once.
    done_by: int | None = None
    # The ReduceOp member the trace records ("MAX"); None where the op does not reduce
    # or the trace does not say which (the call then reduces with SUM).
    reduce_op: str | None = None
    scalars: tuple[tuple[str, bool | int], ...] = ()  # (keyword, recorded value) passed on
    # False where the trace records no group for it (gloo: no record_param_comms); the
    # passes then place it (passes/comms.py), as ``sized`` and ``reduces_result_of`` say.
    group_recorded: bool = True
    # The trace records no group: the group is the one its sizes imply (passes/comms.py
    # group_by_size), of a mesh dimension chosen across ranks (regroup_sized_collectives).
    sized: bool = False
    # This rank's place in the group, as an op that made the collective's data recorded
    # it (oprules.GROUP_RANK_ARGS); None: not recorded.
    group_rank: int | None = None
    # An unrecorded group's reduction of a result another collective reduced (node id
    # of that one): HSDP all-reduces over the replicas what it reduce-scattered over
    # the shards (passes/comms.py regroup_second_reductions).
    reduces_result_of: int | None = None


@dataclass
class DistInfo:
    """The distributed facts of one rank's trace."""

    world_size: int
    rank: int | None  # as recorded; None: not recorded (taken from input order)
    groups: list[ProcessGroupSpec]
    groups_recorded: bool  # a process_group:init node was present
    notes: list[str] = field(default_factory=list)
