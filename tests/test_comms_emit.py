"""Unit tests of the communication emitters and rank helpers (no processes started)."""

from __future__ import annotations

import json

import pytest

from mystique_gen.backends.base import report_lines
from mystique_gen.backends.comms import RankBody, _splits, _tensor_arg, group_lines, rank_lines
from mystique_gen.backends.layout import Atom, flat
from mystique_gen.diagnostics import filter_applied, guarded, not_replayed, note
from mystique_gen.errors import OptionError
from mystique_gen.ir import ListValue, Literal, Program
from mystique_gen.ir.dist import DistInfo, ProcessGroupSpec
from mystique_gen.passes.comms import replayable
from mystique_gen.passes.ranks import (
    INIT_NODE,
    check_rank_set,
    job_groups,
    natural_key,
    order_ranks,
)
from mystique_gen.sources.et import RawTrace, trace_from_document
from tests.tracebuilder import RELU, TraceBuilder


def test_group_table_lists_members_and_what_can_be_created():
    info = DistInfo(world_size=4, rank=0, groups=[
        ProcessGroupSpec(0, "0", "default_pg", None, 4),
        ProcessGroupSpec(1, "1", "dp", (0, 2), 2),
        ProcessGroupSpec(2, "2", 'odd "q"', None, 2),
    ], groups_recorded=True)
    text = "\n".join(group_lines(info))
    assert text.startswith("PROCESS_GROUPS = [\n")
    assert '{"name": "1", "desc": "dp", "ranks": [0, 2], "size": 2, "create": True}' in text
    # Members unknown and smaller than the world: not created, its ops use the default.
    assert '"ranks": None, "size": 2, "create": False}' in text
    assert "'odd \"q\"'" in text  # trace text only ever as a literal


def test_rank_table_names_each_ranks_functions():
    bodies = [RankBody(r, f"rank-{r}.json", [], [], 10 + r) for r in (0, 1)]
    assert rank_lines(bodies) == [  # too long for one line: one rank per line, as black
        "RANKS = {",
        "    0: (make_inputs_rank0, replay_rank0, 10, None),",
        "    1: (make_inputs_rank1, replay_rank1, 11, None),",
        "}",
    ]
    assert rank_lines(bodies[:1]) == [
        "RANKS = {0: (make_inputs_rank0, replay_rank0, 10, None)}"]
    # A rank with a linked Kineto trace names its facts (ORIGINAL_RANK<N>).
    timed = RankBody(1, "rank-1.json", [], [], 3, ["ORIGINAL_RANK1 = {}"])
    assert rank_lines([timed]) == ["RANKS = {1: (make_inputs_rank1, replay_rank1, 3, "
                                   "ORIGINAL_RANK1)}"]


def test_tensor_argument_forms():
    def value_of(v):
        return Atom("LIST") if isinstance(v, ListValue) else Atom("T")

    one = ListValue((Literal(1),))
    assert flat(_tensor_arg(value_of, one, "one")) == "T"
    nested = ListValue((ListValue((Literal(1), Literal(2))),))
    assert flat(_tensor_arg(value_of, nested, "inner")) == "LIST"
    empty = ListValue((ListValue(()),))
    assert flat(_tensor_arg(value_of, empty, "inner_or_none")) == "None"  # non-root gather
    assert flat(_splits(())) == "None" and flat(_splits((1, 3))) == "[1, 3]"


def test_replayable_groups_and_natural_rank_order():
    assert replayable(ProcessGroupSpec(0, "0", "", None, 8), 8)
    assert not replayable(ProcessGroupSpec(1, "1", "", None, 4), 8)
    assert replayable(ProcessGroupSpec(1, "1", "", (0, 1, 2, 3), 4), 8)
    names = ["r10.json", "r9.json", "r0.json"]
    assert sorted(names, key=natural_key) == ["r0.json", "r9.json", "r10.json"]


def _rank_trace(name: str, groups: list[tuple[str, list[int]]], world: int,
                sha256: str = "") -> RawTrace:
    """A gloo rank's trace (no record_param_comms) listing ``groups`` (name, members) as
    its process_group:init node does, the default group first."""
    listed = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo",
               "ranks": [], "group_size": world, "group_count": 1}]
    listed += [{"pg_name": n, "pg_desc": "undefined", "backend_config": "cpu:gloo",
                "ranks": r, "group_size": len(r), "group_count": 1} for n, r in groups]
    tb = TraceBuilder()
    tb.op("", [json.dumps(listed)], [], name=INIT_NODE)
    tb.op(RELU, [tb.tensor((2,))], [tb.tensor((2,))])
    return trace_from_document(tb.doc(), name=name, sha256=sha256)


def test_gloo_ranks_follow_the_file_names_not_a_globs_text_order():
    """A shell glob lists rank-10 before rank-2, and gloo records no rank: in that order
    the rank-2 process replayed rank 10's ops (a 12-rank job with a subgroup hung)."""
    names = sorted(f"step-rank-{r}.json" for r in range(12))  # as the shell expands *
    traces = [_rank_trace(n, [], 12) for n in names]
    ranks, how = order_ranks(traces)
    assert ranks == [int(n.split("-")[-1].split(".")[0]) for n in names]
    assert "sorted naturally" in how


def test_members_only_groups_take_their_place_in_the_creation_order():
    """Groups made by their members only (use_local_synchronization, split_group) have
    hashed names, no number: each rank lists its own where it created it. Placed by
    first mention, rank 0's came first and the halves [0, 1] and [2, 3] were no mesh
    dimension (a gather on [2, 3] ran on [0, 2] and hung)."""
    lists = {0: [("h01", [0, 1]), ("1", [0, 2]), ("3", [0, 3])],
             1: [("h01", [0, 1]), ("2", [1, 3])],
             2: [("h23", [2, 3]), ("1", [0, 2])],
             3: [("h23", [2, 3]), ("2", [1, 3]), ("3", [0, 3])]}
    merged = job_groups([_rank_trace(f"rank-{r}.json", g, 4) for r, g in lists.items()])
    assert merged is not None
    assert [g.name for g in merged[0]] == ["0", "h01", "h23", "1", "2", "3"]


def test_a_rank_set_missing_a_rank_or_giving_one_twice_is_refused():
    """3 of a 4-rank job's traces were told to combine with --compose (which refuses
    traces that communicate); rank 0's trace given twice replayed it on two processes,
    without a word; each node's files named by local rank replayed other ranks' ops."""
    three = [_rank_trace(f"step-rank-{r}.json", [], 4, f"h{r}") for r in (0, 1, 3)]
    with pytest.raises(OptionError, match=r"job of 4 ranks.*missing, by their file "
                                          r"names: rank\(s\) 2$"):
        check_rank_set(three)
    twice = [_rank_trace(f"step-rank-{r}.json", [], 4, f"h{r}") for r in (0, 0, 1, 2)]
    with pytest.raises(OptionError, match="are the same trace"):
        check_rank_set(twice)
    local = [_rank_trace(f"trace-rank-{r % 2}.json", [], 4, f"h{r}") for r in range(4)]
    check_rank_set(local)
    with pytest.raises(OptionError, match="name each rank's trace by its global rank"):
        order_ranks(local, [f"node{r // 2}/trace-rank-{r % 2}.json" for r in range(4)])
    # Names that give no rank: their paths' natural order, node by node.
    plain = [_rank_trace("trace.json", [], 4, f"h{r}") for r in range(4)]
    paths = [f"node{n}/trace.json" for n in (1, 0, 3, 2)]
    assert order_ranks(plain, paths)[0] == [1, 0, 3, 2]


def test_a_multi_rank_header_lists_every_ranks_facts_naming_the_ranks_they_hold_on():
    """The header listed rank 0's filters, skipped ops and notes only: an op rank 1
    did not replay was in no header, against the contract (every op not replayed, with
    its reason)."""
    programs = [Program.empty(f"rank-{r}.json") for r in range(3)]
    for rank, program in enumerate(programs):
        program.diagnostics += [filter_applied("iteration ProfilerStep#3"),
                                note("job-wide"), note(f"rank {rank}'s own"),
                                not_replayed(7, "aten::shared", "same on all")]
    programs[1].diagnostics += [not_replayed(9, "aten::odd", "only here"),
                                guarded(4, "aten::g", "may not run")]
    programs[2].diagnostics += [not_replayed(8, "aten::shared", "same on all")]
    lines = report_lines(list(enumerate(programs)), ["include 'mm'"])
    text = "\n".join(lines)
    assert "  - include 'mm'\n  - iteration ProfilerStep#3\n" in text
    assert "  - job-wide" in lines and "  - rank 1: rank 1's own" in lines
    assert "  - rank 1: aten::odd x1: only here" in lines
    assert "  - rank 1: aten::g x1: may not run" in lines
    # The same skipped node on every rank once; where the nodes differ, per rank.
    assert "  - rank 2: aten::shared x2: same on all" in lines
    assert "  - rank 0: aten::shared x1: same on all" in lines
    alike = report_lines([(0, programs[0]), (1, programs[0])], [])
    assert "  - aten::shared x1: same on all" in alike
    assert not any(line.startswith(("  - rank 0: ", "  - rank 1: ")) for line in alike)
