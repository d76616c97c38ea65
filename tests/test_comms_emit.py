"""Unit tests of the communication emitters and rank helpers (no processes started)."""

from __future__ import annotations

from mystique_gen.backends.comms import RankBody, _splits, _tensor_arg, group_lines, rank_lines
from mystique_gen.backends.layout import Atom, flat
from mystique_gen.ir import ListValue, Literal
from mystique_gen.ir.dist import DistInfo, ProcessGroupSpec
from mystique_gen.passes.comms import replayable
from mystique_gen.passes.ranks import natural_key


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
