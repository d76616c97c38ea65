"""Lowering and emission of c10d collectives from synthetic traces: coalesced tensor
collectives, monitored_barrier_, reduce ops where the trace records them, and sends and
recvs issued async (issue 13)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from mystique_gen import oprules
from mystique_gen.backends.base import GenerateOptions
from mystique_gen.driver import compile_paths, generate
from mystique_gen.ir import Arg, ListValue, Op, Program, TensorMeta, TensorValue, Value
from mystique_gen.ir.dist import CommInfo, DistInfo, ProcessGroupSpec
from mystique_gen.ir.schema import parse_signature
from mystique_gen.passes.comms import (
    ambiguous_regrouping,
    collective_sequence,
    group_of_size,
    implied_group_size,
    mark_in_flight,
    pair_point_to_point,
    place_rooted_collectives,
    rank_disagreements,
    regroup_second_reductions,
    regroup_sized_collectives,
    regroup_unaligned_collectives,
    settle_unrecorded_groups,
    unpaired_point_to_point,
)
from mystique_gen.passes.ranks import INIT_NODE, is_multi_rank_set
from mystique_gen.sources.et import load_trace
from tests.conftest import last_json, run_benchmark
from tests.tracebuilder import ADD_, ALLREDUCE_, MM, RELU, Object, TraceBuilder

OBJECT = Object()  # a process group, a reduce op: what the observer cannot write
PG = "__torch__.torch.classes.c10d.ProcessGroup process_group"
WORK = "__torch__.torch.classes.c10d.Work"
REDUCE_OP = "__torch__.torch.classes.c10d.ReduceOp reduce_op"
# Schemas as torch 2.13 records them; ALLREDUCE_INT as torch 1.13 did (an int reduce op).
ALLGATHER_COALESCED = (f"c10d::allgather_into_tensor_coalesced_(Tensor[] outputs, "
                       f"Tensor[] inputs, {PG}, bool async_op=True) -> {WORK}")
REDUCE_SCATTER_COALESCED = (f"c10d::reduce_scatter_tensor_coalesced_(Tensor[] outputs, "
                            f"Tensor[] inputs, {PG}, {REDUCE_OP}, bool async_op=True, "
                            f"int timeout=-1) -> {WORK}")
ALLREDUCE_COALESCED = (f"c10d::allreduce_coalesced_(Tensor[] tensors, {PG}, {REDUCE_OP}, "
                       f"bool async_op=True, int timeout=-1) -> {WORK}")
ALLREDUCE = (f"c10d::allreduce_(Tensor[] tensors, {PG}, {REDUCE_OP}, Tensor? sparse_indices, "
             f"bool async_op=True, int timeout=-1) -> (Tensor[], {WORK})")
ALLREDUCE_INT = (f"c10d::allreduce_(Tensor[] tensors, {PG}, int reduce_op, int timeout) -> "
                 f"(Tensor[], {WORK})")
MONITORED_BARRIER = (f"c10d::monitored_barrier_(Tensor tensor, {PG}, int[] device_ids, "
                     "int timeout, bool wait_all_ranks) -> ()")
ALLTOALL_BASE = (f"c10d::alltoall_base_(Tensor output, Tensor input, {PG}, "
                 "int[] output_split_sizes, int[] input_split_sizes, bool async_op=True, "
                 f"int timeout=-1) -> {WORK}")
SEND = f"c10d::send(Tensor[] tensors, {PG}, int dst, int tag) -> {WORK}"
RECV = f"c10d::recv_(Tensor[] tensors, {PG}, int src, int tag) -> {WORK}"
RECV_ANY = f"c10d::recv_any_source_(Tensor[] tensors, {PG}, int tag) -> {WORK}"
ALLGATHER = (f"c10d::allgather_(Tensor[][] output_tensors, Tensor[] input_tensors, {PG}, "
             f"bool async_op=True, int timeout=-1) -> (Tensor[][], {WORK})")
GATHER = (f"c10d::gather_(Tensor[][] output_tensors, Tensor[] input_tensors, {PG}, "
          f"int root_rank, bool async_op=True, int timeout=-1) -> {WORK}")


def _trace(tmp_path: Path, *, asynchronous: bool = False) -> Path:
    """One rank (no process groups recorded: a one-rank job), sizes that fit it."""
    b = TraceBuilder()
    shards = [b.tensor((4,)), b.tensor((6,))]
    gathered = [b.tensor((4,)), b.tensor((6,))]
    parts = [b.tensor((4,)), b.tensor((6,))]
    b.op(ALLGATHER_COALESCED, [gathered, shards, OBJECT, asynchronous], [OBJECT])
    b.op(REDUCE_SCATTER_COALESCED, [parts, gathered, OBJECT, OBJECT, False, -1], [OBJECT])
    b.op(ALLREDUCE_COALESCED, [parts, OBJECT, OBJECT, False, -1], [OBJECT])
    b.op(ALLREDUCE_INT, [[parts[0]], OBJECT, 4, -1], [[parts[0]], OBJECT])  # 4: MAX
    b.op(ALLREDUCE, [[parts[1]], OBJECT, OBJECT, None, False, -1], [[parts[1]], OBJECT])
    b.op(MONITORED_BARRIER, [b.tensor((0,)), OBJECT, [], 1800000, True], [])
    return b.write(tmp_path / "comm.json")


def _generate(tmp_path: Path, **kwargs: bool) -> tuple[Path, str, str]:
    """(benchmark, its text, its replay function with whitespace removed)."""
    bench = tmp_path / "bench.py"
    text = generate(_trace(tmp_path, **kwargs), bench, GenerateOptions(command_line="test"))
    body = text.split("def replay_rank0(")[1].split("\nRANKS = ")[0]
    return bench, text, re.sub(r"\s+", "", body)


def test_coalesced_collectives_replay_as_one_call_on_the_recorded_lists(tmp_path):
    _bench, text, body = _generate(tmp_path)
    assert "Ops not replayed:\n  - none" in text
    gather = re.search(r"_all_gather_into_tensor_coalesced\(\[(\w+),(\w+)\],\[(\w+),(\w+)\],"
                       r"group=_GROUPS\[0\]\)", body)
    assert gather, body
    scatter = re.search(r"_reduce_scatter_tensor_coalesced\(\[(\w+),(\w+)\],\[(\w+),(\w+)\],"
                        r"group=_GROUPS\[0\]\)", body)
    assert scatter, body
    # The gathered tensors are what the reduce-scatter reads: data flows as recorded.
    assert scatter.group(3, 4) == gather.group(1, 2)
    assert re.search(r"_all_reduce_coalesced\(\[\w+,\w+\],group=_GROUPS\[0\]\)", body)


def test_no_collective_replays_by_a_call_torch_deprecates():
    """torch 2.13 deprecates all_gather_into_tensor, reduce_scatter_tensor (renamed
    all_gather_single, reduce_scatter_single) and all_reduce_coalesced: called, they
    warned on every rank of every replay (FutureWarning), and a later torch drops
    them. Those ops replay by the harness's calls, which take the current names where
    torch has them. all_gather_coalesced is deprecated too, but nothing else issues
    c10d::allgather_coalesced_ (a coalescing manager takes no list all_gather)."""
    dist = torch.distributed
    deprecated = {call for rule in oprules.COMM_OPS.values() if not rule.harness
                  for call in {rule.call, rule.async_call} - {None}
                  if getattr(getattr(dist, str(call), None), "__deprecated__", None)}
    assert deprecated <= {"all_gather_coalesced"}, deprecated
    harness = {rule.call for rule in oprules.COMM_OPS.values() if rule.harness}
    assert {"_all_gather_single", "_reduce_scatter_single", "_all_reduce_coalesced"} <= harness


def test_a_recorded_async_coalesced_collective_is_waited_on(tmp_path):
    _bench, _text, body = _generate(tmp_path, asynchronous=True)
    work = re.search(r"(work\d*)=_all_gather_into_tensor_coalesced\(.*?async_op=True\)", body)
    assert work, body
    # Waited before the next collective (gloo traces record no wait).
    assert body.index(f"_wait_work({work.group(1)})") < body.index(
        "_reduce_scatter_tensor_coalesced(")


def test_reduce_ops_replay_where_recorded_and_the_header_lists_the_rest(tmp_path):
    _bench, text, body = _generate(tmp_path)
    # torch 1.13 recorded the reduce op as an int: 4 is MAX.
    assert "torch.distributed.all_reduce(" in body
    assert body.count("op=torch.distributed.ReduceOp.MAX") == 1
    assert body.count("ReduceOp.") == 1  # the opaque ones reduce with the default, SUM
    header = " ".join(text.split('"""')[1].split())
    assert ("reduce op not recorded (ReduceOp is written as an opaque object), SUM "
            "replayed: c10d::reduce_scatter_tensor_coalesced_ x1, "
            "c10d::allreduce_coalesced_ x1, c10d::allreduce_ x1") in header


def test_monitored_barrier_becomes_a_barrier_and_says_why(tmp_path):
    _bench, text, body = _generate(tmp_path)
    assert "_monitored_barrier(wait_all_ranks=True,group=_GROUPS[0])" in body
    header = " ".join(text.split('"""')[1].split())
    assert "c10d::monitored_barrier_ x1: monitored_barrier on gloo, a plain barrier" in header


def test_reduce_op_names():
    assert oprules.reduce_op_name(4) == "MAX" and oprules.reduce_op_name(0) == "SUM"
    assert oprules.reduce_op_name("max") == "MAX" and oprules.reduce_op_name("avg") == "AVG"
    assert oprules.reduce_op_name("ReduceOp.MIN") == "MIN"
    assert oprules.reduce_op_name("prod") == "PRODUCT"
    # Not recorded, or not reproducible (PREMUL_SUM needs its factor): None, SUM replays.
    for value in ("<Object>", 8, True, None, "premul_sum", 99):
        assert oprules.reduce_op_name(value) is None


def test_sends_and_recvs_run_async_and_wait_where_their_tensors_need_it(tmp_path):
    b = TraceBuilder()
    sent, got = b.tensor((4,)), b.tensor((4,))
    b.op(SEND, [[sent], OBJECT, 1, 0], [OBJECT])
    b.op(RECV, [[got], OBJECT, 1, 3], [OBJECT])
    b.op(RELU, [sent], [b.tensor((4,))])  # reads what is being sent: no wait needed
    b.op(RELU, [got], [b.tensor((4,))])  # uses what was received: wait for the recv
    b.op(ADD_, [sent, got, 1], [sent])  # overwrites what was sent: wait for the send
    text = generate(b.write(tmp_path / "p2p.json"), tmp_path / "bench.py",
                    GenerateOptions(command_line="test"))
    body = re.sub(r"\s+", "", text.split("def replay_rank0(")[1].split("\nRANKS = ")[0])
    send = re.search(r"(work\d*)=torch\.distributed\.isend\((\w+),group_dst=1,tag=0,"
                     r"group=_GROUPS\[0\]\)", body)
    recv = re.search(r"(work\d*)=torch\.distributed\.irecv\((\w+),group_src=1,tag=3,"
                     r"group=_GROUPS\[0\]\)", body)
    assert send and recv, body
    relus = [m.start() for m in re.finditer(r"aten_relu\(", body)]
    wait_recv = body.index(f"_wait_work({recv.group(1)})")
    wait_send = body.index(f"_wait_work({send.group(1)})")
    assert recv.end() <= relus[0] < wait_recv < relus[1] < wait_send < body.index("add_")
    assert "2 sends and recvs run as isend/irecv in recorded order" in " ".join(text.split())


@pytest.mark.slow
def test_one_rank_replay_runs_the_coalesced_ops_and_the_monitored_barrier(tmp_path):
    bench, _text, _body = _generate(tmp_path, asynchronous=True)
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "1", "--json",
                         "--et", str(tmp_path / "replay.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["distributed"] is True
    replayed = collective_sequence(load_trace(tmp_path / "replay.rank0.json"))
    recorded = collective_sequence(load_trace(tmp_path / "comm.json"))
    assert replayed == recorded


def test_a_collectives_group_is_the_one_its_sizes_imply():
    """Gloo records no group for c10d collectives; an all-gather's output over its
    input is the group's size, and so is the length of a list collective's list of one
    tensor per member (all_gather into a list, all_to_all, a root's gather). A 2 x 2
    mesh: the world has 4 ranks, this rank is in dp [0, 2] (created first) and tp
    [0, 1], not in dp [1, 3]."""
    groups = [ProcessGroupSpec(0, "0", "default_pg", None, 4),
              ProcessGroupSpec(1, "1", "mesh_dp", (0, 2), 2),
              ProcessGroupSpec(2, "2", "mesh_dp", (1, 3), 2),
              ProcessGroupSpec(3, "3", "mesh_tp", (0, 1), 2)]

    def tensor(n: int) -> TensorValue:
        return TensorValue(0, 0, TensorMeta((n,), (1,), 0, "float32", "cpu"))

    def listed(*items: Value) -> ListValue:
        return ListValue(tuple(items))

    member = frozenset({"0", "1", "3"})

    def group(name: str, args: dict[str, Value], member_of: frozenset[str] = member):
        size = implied_group_size(oprules.COMM_OPS[name], args)
        return group_of_size(size, groups, 0, member_of)

    def gather_base(big: int, small: int) -> dict[str, Value]:
        return {"output_tensor": tensor(big), "input_tensor": tensor(small)}

    assert group("c10d::_allgather_base_", gather_base(16, 8)) == 1
    assert group("c10d::_allgather_base_", gather_base(32, 8)) == 0  # the world
    assert group("c10d::_allgather_base_", gather_base(24, 8)) is None  # no such group
    assert group("c10d::_allgather_base_", gather_base(16, 8), frozenset({"0", "2"})) == 2
    pair, four = listed(tensor(8), tensor(8)), listed(*[tensor(8)] * 4)
    assert group("c10d::allgather_", {"output_tensors": listed(pair)}) == 1
    assert group("c10d::allgather_", {"output_tensors": listed(four)}) == 0
    assert group("c10d::alltoall_", {"output_tensors": pair}) == 1
    assert group("c10d::reduce_scatter_", {"input_tensors": listed(pair)}) == 1
    assert group("c10d::allgather_coalesced_", {"output_lists": listed(pair, pair)}) == 1
    assert group("c10d::gather_", {"output_tensors": listed(pair)}) == 1  # the root
    assert group("c10d::gather_", {"output_tensors": listed()}) is None  # another rank


def _rank_program(rank: int, calls: list[str], members: tuple[int, ...] | None = None):
    """A rank's program of collectives ``calls`` on group 1 (``members``), and one
    all_reduce on the default group."""
    signature = parse_signature(ALLREDUCE_INT)
    ops = [Op(index=i, node_id=10 + i, signature=signature, args=[], outputs=[], thread=1,
              scope=(), comm=CommInfo(call=call, group=1 if i else 0))
           for i, call in enumerate(["all_reduce", *calls])]
    program = Program.empty()
    program.ops = ops
    program.distributed = DistInfo(world_size=3, rank=rank, groups=[
        ProcessGroupSpec(0, "0", "default", None, 3),
        ProcessGroupSpec(1, "1", "sub", members, 2 if members else 3)], groups_recorded=True)
    return program


def test_ranks_that_would_not_meet_on_a_group_are_named():
    """One rank that could not replay a collective its peers replay would hang them
    all: the generator says which ranks, which group and where they part."""
    agree = [_rank_program(r, ["broadcast", "all_reduce"]) for r in range(3)]
    assert rank_disagreements(agree, [0, 1, 2]) == []
    apart = [_rank_program(0, ["broadcast", "all_reduce"]),
             _rank_program(1, ["broadcast", "all_reduce"]),
             _rank_program(2, ["all_reduce"])]
    ((first, other, message),) = rank_disagreements(apart, [0, 1, 2])
    assert (first, other) == (0, 2)
    assert "ranks 0 and 2" in message and "process group 1" in message
    assert "#1: broadcast, node 11 against all_reduce, node 11" in message
    # Rank 2 is not in the sub-group: its collectives there are not expected.
    subgroup = [_rank_program(0, ["broadcast"], (0, 1)), _rank_program(1, ["broadcast"], (0, 1)),
                _rank_program(2, [], (0, 1))]
    assert rank_disagreements(subgroup, [0, 1, 2]) == []


def test_ranks_that_pass_other_sizes_to_one_collective_are_named():
    """gloo fails a collective whose members pass tensors of other sizes: named as
    ranks that part, where every member must pass the same sizes (not all-to-all)."""
    def rank(r: int, numel: int, schema: str = ALLREDUCE_INT, call: str = "all_reduce"):
        program = _pipeline_rank(r, [])
        program.ops = [_comm_op(0, schema, numel, CommInfo(call=call, group=0))]
        return program

    apart = [rank(r, 32 if r < 2 else 8) for r in range(4)]
    ((first, other, message),) = rank_disagreements(apart, [0, 1, 2, 3])
    assert (first, other) == (0, 2) and "with tensors of other sizes" in message
    assert rank_disagreements([rank(r, 16) for r in range(4)], [0, 1, 2, 3]) == []
    uneven = [rank(r, 8 * (r + 1), ALLTOALL_BASE, "all_to_all_single") for r in range(4)]
    assert rank_disagreements(uneven, [0, 1, 2, 3]) == []



def _comm_op(index: int, schema: str, numel: int, comm: CommInfo) -> Op:
    """A communication op of one float32 tensor of ``numel`` elements."""
    tensor = TensorValue(index, index, TensorMeta((numel,), (1,), 0, "float32", "cpu"))
    signature = parse_signature(schema)
    return Op(index=index, node_id=10 + index, signature=signature,
              args=[Arg(signature.args[0], ListValue((tensor,)))], outputs=[], thread=1,
              scope=(), comm=comm)


def _pipeline_rank(rank: int, calls: list[tuple[str, int, int]]) -> Program:
    """A rank of a 2 x 2 mesh (pp groups [0, 2] and [1, 3], dp groups [0, 1] and
    [2, 3]) whose sends and recvs (kind, recorded peer, elements) all sit on the default
    group, as a gloo trace leaves them: it records no group."""
    program = Program.empty()
    program.ops = [_comm_op(i, SEND if kind == "send" else RECV, numel,
                            CommInfo(call=kind, group=0, root=peer, tag=0))
                   for i, (kind, peer, numel) in enumerate(calls)]
    program.distributed = DistInfo(world_size=4, rank=rank, groups=[
        ProcessGroupSpec(0, "0", "default", None, 4),
        ProcessGroupSpec(1, "1", "pp", (0, 2), 2), ProcessGroupSpec(2, "2", "pp", (1, 3), 2),
        ProcessGroupSpec(3, "3", "dp", (0, 1), 2), ProcessGroupSpec(4, "4", "dp", (2, 3), 2)],
        groups_recorded=True)
    return program


def test_sends_and_recvs_run_on_the_group_that_pairs_them():
    """Pipeline stages over a mesh's pp dimension: each send names its peer within the
    pp group (1), which on the default group is rank 1 for rank 0, and rank 1 itself for
    rank 1 (gloo: "Pair is not connected"). Each send and its recv move to the group on
    which both name each other; a peer's recv of another size does not pair."""
    stage0 = [("send", 1, 8), ("recv", 1, 8)]
    stage1 = [("recv", 0, 8), ("send", 0, 8)]
    programs = [_pipeline_rank(r, stage0 if r < 2 else stage1) for r in range(4)]
    assert pair_point_to_point(programs, [0, 1, 2, 3]) == 8
    groups = [[op.comm.group for op in p.ops] for p in programs]
    assert groups == [[1, 1], [2, 2], [1, 1], [2, 2]]
    # Already paired: nothing moves. A recv of other sizes pairs with no send.
    assert pair_point_to_point(programs, [0, 1, 2, 3]) == 0
    odd = [_pipeline_rank(0, [("send", 1, 8)]), _pipeline_rank(1, []),
           _pipeline_rank(2, [("recv", 0, 4)]), _pipeline_rank(3, [])]
    assert pair_point_to_point(odd, [0, 1, 2, 3]) == 0
    assert odd[0].ops[0].comm.group == 0


def test_a_send_without_its_recv_is_reported():
    """A filter that keeps a recv but not its send (``--max-ops``) left the receiver
    waiting forever, without a word: each pair of ranks whose sends and recvs to each
    other differ in number is reported."""
    stage0 = [("send", 1, 8), ("recv", 1, 8)]
    stage1 = [("recv", 0, 8), ("send", 0, 8)]
    programs = [_pipeline_rank(r, stage0 if r < 2 else stage1) for r in range(4)]
    pair_point_to_point(programs, [0, 1, 2, 3])
    assert unpaired_point_to_point(programs, [0, 1, 2, 3]) == []
    programs[2].ops = programs[2].ops[:1]  # rank 2 receives, but never sends back
    found = unpaired_point_to_point(programs, [0, 1, 2, 3])
    assert [(a, b) for a, b, _ in found] == [(2, 0)]
    assert "rank 2 sends rank 0 0 tensor(s), and rank 0 receives 1 from it" in found[0][2]


def test_a_recv_from_any_source_pairs_with_the_send_no_named_recv_takes():
    """``dist.recv(t)`` without ``src`` (``recv_any_source_``) was not replayed, and its
    senders' isends waited forever (the job hung; the generator blamed a filter). It
    replays as a recv from any source, and each pairs with a send to its rank that no
    named recv takes, so that no pair is reported unpaired."""
    def rank(r: int) -> Program:
        program = _pipeline_rank(r, [("send", 0, 8)] if r else [])
        if r == 0:  # rank 0 receives from ranks 1 and 2 (any source), 3 by name
            program.ops = [_comm_op(i, RECV_ANY, 8, CommInfo(call="recv", group=0, tag=0))
                           for i in range(2)]
            program.ops.append(_comm_op(2, RECV, 8, CommInfo(call="recv", group=0,
                                                             root=3, tag=0)))
        return program

    programs = [rank(r) for r in range(4)]
    pair_point_to_point(programs, [0, 1, 2, 3])
    assert unpaired_point_to_point(programs, [0, 1, 2, 3]) == []
    assert [op.comm.root for op in programs[0].ops] == [1, 2, 3]
    programs[2].ops = []  # rank 2 sends nothing: one recv from any source is left
    programs[0].ops[1].comm.root = None
    programs[0].ops[0].comm.root = None
    pair_point_to_point(programs, [0, 1, 2, 3])
    assert [op.comm.root for op in programs[0].ops] == [1, None, 3]


def _gather_rank(rank: int, root: bool, group: int, groups: list[ProcessGroupSpec],
                 world: int) -> Program:
    """A rank's gather of 8 elements to the group's first rank, as a gloo trace lowers
    it: the root passes its list (and sits on a group of that size), the others none."""
    signature = parse_signature(GATHER)
    mine = TensorValue(1, 1, TensorMeta((8,), (1,), 0, "float32", "cpu"))
    parts = [TensorValue(k, k, TensorMeta((8,), (1,), 0, "float32", "cpu")) for k in (2, 3)]
    listed = ListValue((ListValue(tuple(parts)),) if root else ())
    op = Op(index=0, node_id=10, signature=signature,
            args=[Arg(signature.args[1], ListValue((mine,))), Arg(signature.args[0], listed)],
            outputs=[], thread=1, scope=(),
            comm=CommInfo(call="gather", group=group, root=0, group_recorded=False,
                          sized=root))
    program = Program.empty()
    program.ops = [op]
    program.distributed = DistInfo(world_size=world, rank=rank, groups=groups,
                                   groups_recorded=True)
    return program


def test_a_gathers_other_ranks_join_their_roots_group():
    """Gloo records no group, and only a gather's root passes the list whose length is
    the group's size: the other ranks' calls stayed on the default group while the
    root's went to a subgroup, and the job hung. On a 2 x 2 mesh the roots (ranks 0
    and 2, each first in its dp group) picked pp, the first dimension of size 2, where
    rank 2 is second: dp, where each root is first, is chosen, with the other ranks.
    On a group over some ranks only, the other member joins its root's group."""
    mesh = _pipeline_rank(0, []).distributed.groups  # pp [0, 2], [1, 3]; dp [0, 1], [2, 3]
    ranks = [_gather_rank(r, r in (0, 2), 1 if r in (0, 2) else 0, mesh, 4) for r in range(4)]
    assert regroup_sized_collectives(ranks, [0, 1, 2, 3]) == 4
    assert [p.ops[0].comm.group for p in ranks] == [3, 3, 4, 4]
    partial = [ProcessGroupSpec(0, "0", "default", None, 3),
               ProcessGroupSpec(1, "1", "pair", (1, 2), 2)]
    pair = [_gather_rank(1, True, 1, partial, 3), _gather_rank(2, False, 0, partial, 3)]
    assert regroup_sized_collectives(pair, [1, 2]) == 0  # not a mesh dimension
    assert place_rooted_collectives(pair, [1, 2]) == 1
    assert [p.ops[0].comm.group for p in pair] == [1, 1]


def test_sized_collectives_run_on_the_mesh_dimension_whose_ranks_issue_them_alike():
    """FSDP2 on a ("pp", "dp") mesh: each rank picked the first group of the gathers'
    size it is in (pp), but the two pipeline stages gather different sizes, which met
    on a pp group. The dp dimension, whose groups' members gather alike, is chosen."""
    def rank(r: int, numel: int) -> Program:
        program = _pipeline_rank(r, [])
        program.ops = [_comm_op(0, ALLREDUCE_INT, numel, CommInfo(
            call="all_gather_into_tensor", group=1 if r in (0, 2) else 2, sized=True))]
        return program

    stages = [rank(r, 32 if r < 2 else 8) for r in range(4)]  # stage 0: ranks 0, 1
    assert regroup_sized_collectives(stages, [0, 1, 2, 3]) == 4
    assert [p.ops[0].comm.group for p in stages] == [3, 3, 4, 4]
    alike = [rank(r, 16) for r in range(4)]  # the first dimension works: it stays
    assert regroup_sized_collectives(alike, [0, 1, 2, 3]) == 0
    assert [p.ops[0].comm.group for p in alike] == [1, 2, 1, 2]
    # Both dimensions gather alike (HSDP), but the copy-in recorded each rank's place
    # in the gather's group: rank 2 is first in dp's [2, 3], second in pp's [0, 2].
    hinted = [rank(r, 16) for r in range(4)]
    for r, program in enumerate(hinted):
        program.ops[0].comm.group_rank = r % 2
    assert regroup_sized_collectives(hinted, [0, 1, 2, 3]) == 4
    assert [p.ops[0].comm.group for p in hinted] == [3, 3, 4, 4]


def test_sized_collectives_on_overlapping_groups_of_one_size_run_where_members_meet():
    """``new_group([0, 1])``, ``[1, 2]`` and ``[0, 2]`` on 3 ranks, an all-gather on
    each: gloo records no group, and each rank put every gather on the first group of
    the gathers' size it is in (rank 0's gather on [0, 2] on [0, 1], rank 2's on
    [1, 2]); no mesh dimension fits, nothing moved, and the replay hung. Each group,
    in creation order, takes the gathers its members issue alike."""
    groups = [ProcessGroupSpec(0, "0", "default", None, 3),
              ProcessGroupSpec(1, "1", "p01", (0, 1), 2),
              ProcessGroupSpec(2, "2", "p12", (1, 2), 2),
              ProcessGroupSpec(3, "3", "p02", (0, 2), 2)]
    own = {0: [(1, 8), (3, 24)], 1: [(1, 8), (2, 16)], 2: [(2, 16), (3, 24)]}

    def rank(r: int) -> Program:
        first = next(g.index for g in groups[1:] if r in g.ranks)
        program = Program.empty()
        program.ops = [_comm_op(i, ALLREDUCE_INT, numel, CommInfo(
            call="all_gather_into_tensor", group=first, sized=True))
            for i, (_, numel) in enumerate(own[r])]
        program.distributed = DistInfo(world_size=3, rank=r, groups=groups,
                                       groups_recorded=True)
        return program

    programs = [rank(r) for r in range(3)]
    assert regroup_sized_collectives(programs, [0, 1, 2]) == 3
    assert [[op.comm.group for op in p.ops] for p in programs] == \
        [[g for g, _ in own[r]] for r in range(3)]
    # What the groups' members do not issue alike has no group: nothing moves.
    odd = [rank(r) for r in range(3)]
    odd[2].ops.pop()
    assert regroup_sized_collectives(odd, [0, 1, 2]) == 0


def test_a_reduction_of_a_reduced_result_crosses_the_first_group():
    """HSDP on a 2 x 2 mesh: each rank reduce-scatters over its dp group ([0, 1] or
    [2, 3]), then all-reduces that shard; gloo records the all-reduce's group nowhere,
    and on the default group it would sum over the dp peers again. It moves to the
    dimension whose group meets the dp group at the rank alone: pp ([0, 2], [1, 3])."""
    def rank(r: int, linked: bool) -> Program:
        program = _pipeline_rank(r, [])
        scatter = _comm_op(0, ALLREDUCE_INT, 8, CommInfo(
            call="reduce_scatter_tensor", group=3 if r < 2 else 4, sized=True))
        second = _comm_op(1, ALLREDUCE_INT, 8, CommInfo(
            call="all_reduce", group=0, reduces_result_of=scatter.node_id if linked else None))
        program.ops = [scatter, second]
        return program

    hsdp = [rank(r, True) for r in range(4)]
    assert regroup_second_reductions(hsdp, [0, 1, 2, 3]) == 4
    assert [p.ops[1].comm.group for p in hsdp] == [1, 2, 1, 2]
    assert [p.ops[0].comm.group for p in hsdp] == [3, 3, 4, 4]  # the first stays
    unlinked = [rank(r, False) for r in range(4)]
    assert regroup_second_reductions(unlinked, [0, 1, 2, 3]) == 0
    assert [p.ops[1].comm.group for p in unlinked] == [0, 0, 0, 0]
    # A first reduction on the default group: no dimension crosses it at one rank.
    world = [rank(r, True) for r in range(4)]
    for program in world:
        program.ops[0].comm.group = 0
    assert regroup_second_reductions(world, [0, 1, 2, 3]) == 0
    # Only some ranks reduce again: the members would not issue the calls alike.
    partial = [rank(r, r != 3) for r in range(4)]
    assert regroup_second_reductions(partial, [0, 1, 2, 3]) == 0


def test_unrecorded_collectives_the_ranks_issue_unalike_move_to_a_dimension_that_fits():
    """Stages of a (pp, dp) mesh all-reduce gradients of their own sizes with no
    recorded group: on the default group they would meet with different sizes. The
    first dimension whose members issue them alike (dp) takes them; where every rank
    issues the same, or no dimension fits, they stay."""
    def rank(r: int, numel: int) -> Program:
        program = _pipeline_rank(r, [])
        program.ops = [_comm_op(0, ALLREDUCE_INT, numel, CommInfo(
            call="all_reduce", group=0, group_recorded=False))]
        return program

    stages = [rank(r, 32 if r < 2 else 8) for r in range(4)]
    assert regroup_unaligned_collectives(stages, [0, 1, 2, 3]) == 4
    assert [p.ops[0].comm.group for p in stages] == [3, 3, 4, 4]
    alike = [rank(r, 16) for r in range(4)]
    assert regroup_unaligned_collectives(alike, [0, 1, 2, 3]) == 0
    assert [p.ops[0].comm.group for p in alike] == [0, 0, 0, 0]
    unfit = [rank(r, 8 * (r + 1)) for r in range(4)]
    assert regroup_unaligned_collectives(unfit, [0, 1, 2, 3]) == 0
    recorded = [rank(r, 32 if r < 2 else 8) for r in range(4)]
    for program in recorded:
        program.ops[0].comm.group_recorded = True  # the trace named the default group
    assert regroup_unaligned_collectives(recorded, [0, 1, 2, 3]) == 0


def test_collectives_every_rank_issues_alike_stay_beside_those_that_move():
    """Beside the stages' gradient all-reduces (sizes of their own), every rank
    all-reduces a loss on the world group: that one stays on the default group, in
    its place between the others; only the stages' move to dp."""
    def rank(r: int) -> Program:
        program = _pipeline_rank(r, [])
        grads = 32 if r < 2 else 8
        program.ops = [_comm_op(k, ALLREDUCE_INT, numel, CommInfo(
            call="all_reduce", group=0, group_recorded=False))
            for k, numel in enumerate((grads, 2, grads // 2))]
        return program

    stages = [rank(r) for r in range(4)]
    # The loss's all-reduce would fit dp as well: the header says the choice is a guess.
    assert ambiguous_regrouping(stages, [0, 1, 2, 3]) == 4
    assert regroup_unaligned_collectives(stages, [0, 1, 2, 3]) == 8
    assert [[op.comm.group for op in p.ops] for p in stages] == [
        [3, 0, 3], [3, 0, 3], [4, 0, 4], [4, 0, 4]]
    assert ambiguous_regrouping(stages, [0, 1, 2, 3]) == 0  # nothing left to place


def test_a_placement_that_sizes_alone_decide_is_reported_as_a_guess():
    """Ranks 0 and 1 all-reduce 4, 2 and 4 elements, ranks 2 and 3 2, 4 and 8: the 2 on
    the world group and the rest on [0, 1] and [2, 3] in truth, but by size the 4s
    line up as well, and two of them were kept on the world group without a word. Both
    placements fit what gloo recorded; the count of calls placed by guess is reported,
    and none where the stages' sizes leave one placement only."""
    def rank(r: int, sizes: tuple[int, ...]) -> Program:
        program = _pipeline_rank(r, [])
        program.ops = [_comm_op(k, ALLREDUCE_INT, numel, CommInfo(
            call="all_reduce", group=0, group_recorded=False))
            for k, numel in enumerate(sizes)]
        return program

    mixed = [rank(r, (4, 2, 4) if r < 2 else (2, 4, 8)) for r in range(4)]
    assert ambiguous_regrouping(mixed, [0, 1, 2, 3]) == 8
    lone = [rank(r, (32,) if r < 2 else (8,)) for r in range(4)]
    assert ambiguous_regrouping(lone, [0, 1, 2, 3]) == 0


def test_collectives_only_some_ranks_issue_run_on_the_group_of_those_ranks():
    """On 6 ranks, the members of groups over some ranks only ([0, 1] and [2, 3], no
    mesh dimension) all-reduce what the others never do, each pair its own size (a
    tied embedding per pipeline replica). On the default group the members waited for
    ranks that never came; each pair's calls run on its group. Where a group's members
    do not issue the same calls, nothing moves (the generator warns instead)."""
    groups = [ProcessGroupSpec(0, "0", "default_pg", None, 6),
              ProcessGroupSpec(1, "1", "tied", (0, 1), 2),
              ProcessGroupSpec(2, "2", "tied", (2, 3), 2)]

    def rank(r: int, sizes: dict[int, list[int]]) -> Program:
        program = Program.empty()
        program.ops = [_comm_op(k, ALLREDUCE_INT, numel, CommInfo(
            call="all_reduce", group=0, group_recorded=False))
            for k, numel in enumerate(sizes.get(r, []))]
        program.distributed = DistInfo(world_size=6, rank=r, groups=groups,
                                       groups_recorded=True)
        return program

    pairs = [rank(r, {0: [12], 1: [12], 2: [20, 4], 3: [20, 4]}) for r in range(6)]
    assert regroup_unaligned_collectives(pairs, list(range(6))) == 6
    assert [[op.comm.group for op in p.ops] for p in pairs] == [[1], [1], [2, 2], [2, 2],
                                                               [], []]
    apart = [rank(r, {0: [12], 1: [12], 2: [20], 3: [24]}) for r in range(6)]
    assert regroup_unaligned_collectives(apart, list(range(6))) == 0


ALLGATHER_BASE = (f"c10d::_allgather_base_(Tensor output_tensor, Tensor input_tensor, {PG}, "
                  f"bool async_op=False, int timeout=-1) -> (Tensor, {WORK})")
BROADCAST = (f"c10d::broadcast_(Tensor[] tensors, {PG}, int root_rank, int root_tensor, "
             f"bool asyncOp, int timeout=-1) -> (Tensor[], {WORK})")


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "int16", "uint16"])
def test_collectives_of_dtypes_gloo_cannot_send_move_their_bytes(tmp_path, dtype):
    """A trace recorded on NCCL (an FP8 all-gather, int16 data), replayed on CPU: gloo
    sends none of these dtypes ("Invalid scalar type"). Collectives that only move data
    send the tensors' bytes, and a reduction reduces wider copies (an async one, then
    waited, included); the replay runs the recorded collectives with their shapes."""
    b = TraceBuilder()
    shard, full = b.tensor((4, 3), dtype=dtype), b.tensor((4, 3), dtype=dtype)
    single, summed = b.tensor((5,), dtype=dtype), b.tensor((2, 3), dtype=dtype)
    b.op(ALLGATHER_BASE, [full, shard, OBJECT, False, -1], [full, OBJECT])
    b.op(BROADCAST, [[single], OBJECT, 0, 0, False, -1], [[single], OBJECT])
    b.op(ALLREDUCE, [[summed], OBJECT, OBJECT, None, True, -1], [[summed], OBJECT])
    trace = b.write(tmp_path / "comm.json")
    bench = tmp_path / "bench.py"
    text = generate(trace, bench, GenerateOptions(command_line="test"))
    assert text.count("_bytewise(_all_gather_single)") == 1
    assert text.count("_bytewise(torch.distributed.broadcast)") == 1
    assert text.count("_widened(torch.distributed.all_reduce)") == 1  # gloo cannot sum it
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "1", "--json",
                         "--et", str(tmp_path / "replay.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Each tensor went as its bytes: the recorded shape and a last dimension of them.
    itemsize = getattr(torch, dtype).itemsize
    replayed = collective_sequence(load_trace(tmp_path / "replay.rank0.json"))
    recorded = collective_sequence(load_trace(trace))
    assert [(name, _bytes_off(shapes)) for name, shapes, _ in replayed[:2]] == \
        [(name, shapes) for name, shapes, _ in recorded[:2]]
    assert _last_dims(tuple(shapes for _, shapes, _ in replayed[:2])) == {itemsize}
    assert replayed[2][:2] == recorded[2][:2]  # the reduction: the shape, wider


FUNCTIONAL = "_c10d_functional::"
GATHER_F = (f"{FUNCTIONAL}all_gather_into_tensor(Tensor input, int group_size, "
            "str group_name) -> Tensor")
REDUCE_F = f"{FUNCTIONAL}all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor"
REDUCE_F_ = (f"{FUNCTIONAL}all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> "
             "Tensor(a!)")
ALL_TO_ALL_F = (f"{FUNCTIONAL}all_to_all_single(Tensor input, SymInt[] output_split_sizes, "
                "SymInt[] input_split_sizes, str group_name) -> Tensor")
WAIT_F = f"{FUNCTIONAL}wait_tensor(Tensor tensor) -> Tensor"
GATHER_CF = (f"{FUNCTIONAL}all_gather_into_tensor_coalesced(Tensor[] inputs, int group_size, "
             "str group_name) -> Tensor[]")
REDUCE_CF = (f"{FUNCTIONAL}all_reduce_coalesced(Tensor[] inputs, str reduce_op, "
             "str group_name) -> Tensor[]")


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "int16"])
def test_functional_collectives_of_dtypes_gloo_cannot_send_move_their_bytes(tmp_path, dtype):
    """DTensor and tensor parallel issue functional collectives: recorded on NCCL in a
    dtype gloo cannot send, each failed on CPU ("Invalid scalar type"). Those that only
    move data move the tensors' bytes, reductions (out of place and in place) reduce
    wider copies; every recorded collective and wait replays, with the recorded shapes
    (and a last dimension of bytes where bytes moved)."""
    b = TraceBuilder()
    x, gathered, moved = (b.tensor((4, 3), dtype=dtype) for _ in range(3))
    summed, inplace = b.tensor((4, 3), dtype=dtype), b.tensor((2, 3), dtype=dtype)
    b.op(GATHER_F, [x, 1, "0"], [gathered])
    b.op(WAIT_F, [gathered], [gathered])
    b.op(ALL_TO_ALL_F, [gathered, [4], [4], "0"], [moved])
    b.op(WAIT_F, [moved], [moved])
    b.op(REDUCE_F, [moved, "max", "0"], [summed])
    b.op(WAIT_F, [summed], [summed])
    b.op(REDUCE_F_, [inplace, "sum", "0"], [inplace])
    b.op(WAIT_F, [inplace], [inplace])
    pair, gathered_pair, reduced_pair = ([b.tensor((2, 3), dtype=dtype) for _ in range(2)]
                                         for _ in range(3))
    b.op(GATHER_CF, [pair, 1, "0"], [gathered_pair])
    b.op(REDUCE_CF, [gathered_pair, "min", "0"], [reduced_pair])
    for t in reduced_pair:
        b.op(WAIT_F, [t], [t])
    trace = b.write(tmp_path / "functional.json")
    bench = tmp_path / "bench.py"
    text = generate(trace, bench, GenerateOptions(command_line="test"))
    body = " ".join(text.split("def replay_rank0(")[1].split("\ndef ")[0].split())
    assert body.count('_on_wire(') == 6  # coalesced ones too
    assert body.count('"bytes")') == 3 and body.count('"reduce")') == 3
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "1", "--json",
                         "--et", str(tmp_path / "replay.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["skipped_at_runtime"] == []
    itemsize = getattr(torch, dtype).itemsize
    replayed = collective_sequence(load_trace(tmp_path / "replay.rank0.json"))
    recorded = collective_sequence(load_trace(trace))
    moved = [0, 1, 4]  # the gathers and the all-to-all, as bytes; the reductions wider
    assert [(name, _bytes_off(shapes), strings) for k, (name, shapes, strings)
            in enumerate(replayed) if k in moved] == [recorded[k] for k in moved]
    assert _last_dims(tuple(replayed[k][1] for k in moved)) == {itemsize}
    assert [replayed[k] for k in (2, 3, 5)] == [recorded[k] for k in (2, 3, 5)]
    # Dtypes gloo sends are never wrapped; the op's name says whether it reduces.
    assert oprules.wire_form({"float32", "bfloat16"}, reduces=True) is None
    assert oprules.wire_form({"int16"}, oprules.functional_reduces("reduce_scatter_tensor")) \
        == "reduce"
    assert oprules.wire_form({"uint32"}, oprules.functional_reduces("broadcast_")) == "bytes"


def _is_shape(value: object) -> bool:
    return isinstance(value, tuple) and all(isinstance(n, int) for n in value) and bool(value)


def _bytes_off(shapes: object) -> object:
    """Recorded shapes (nested as the arguments' lists are) without their last dimension."""
    if _is_shape(shapes):
        return shapes[:-1]
    return tuple(_bytes_off(s) for s in shapes) if isinstance(shapes, tuple) else shapes


def _last_dims(shapes: object) -> set[int]:
    if _is_shape(shapes):
        return {shapes[-1]}
    return set().union(*(_last_dims(s) for s in shapes)) if isinstance(shapes, tuple) else set()


# 3 gloo ranks, a group per pair ([0, 1], [1, 2], [0, 2]: groups 1, 2, 3), as each
# rank's calls ran in the original, in an order that meets (p01, p12, world, p02):
# (group, list all-gather of that many, or None: an all-reduce; elements).
PAIRS = {"1": [0, 1], "2": [1, 2], "3": [0, 2]}
SAME_SIZE_GATHERS = {0: [("1", 2, 4), ("0", 3, 4), ("3", 2, 4)],
                     1: [("1", 2, 4), ("2", 2, 4), ("0", 3, 4)],
                     2: [("2", 2, 4), ("0", 3, 4), ("3", 2, 4)]}
# Gathers to each pair's first member: only the root passes the list.
GATHERS_TO_FIRST = {0: [("1", "root", 4), ("3", "root", 4)],
                    1: [("1", "leaf", 4), ("2", "root", 4)],
                    2: [("2", "leaf", 4), ("3", "leaf", 4)]}
WORLD_REDUCE_OF_A_PAIRS_SIZE = {0: [("1", None, 4), ("0", None, 4), ("3", None, 8)],
                                1: [("1", None, 4), ("2", None, 8), ("0", None, 4)],
                                2: [("2", None, 8), ("0", None, 4), ("3", None, 8)]}


def _pairs_rank(tmp_path: Path, rank: int, calls: list[tuple[str, int | str | None, int]]
                ) -> Path:
    """One gloo rank's trace of ``calls`` (no record_param_comms: no group recorded),
    listing the default group and the pairs it is in: (group, a list all-gather of
    that many, a gather's "root" or other "leaf", or None: an all-reduce; elements)."""
    listed = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo",
               "ranks": [], "group_size": 3, "group_count": 1}]
    listed += [{"pg_name": name, "pg_desc": "undefined", "backend_config": "cpu:gloo",
                "ranks": members, "group_size": 2, "group_count": 1}
               for name, members in PAIRS.items() if rank in members]
    b = TraceBuilder()
    b.op("", [json.dumps(listed)], [], name=INIT_NODE)
    for _, gathered, numel in calls:
        mine = b.tensor((numel,))
        if gathered is None:
            b.op(ALLREDUCE, [[mine], OBJECT, OBJECT, None, False, -1], [[mine], OBJECT])
        elif isinstance(gathered, str):
            parts = [[b.tensor((numel,)) for _ in range(2)]] if gathered == "root" else []
            b.op(GATHER, [parts, [mine], OBJECT, 0, False, -1], [OBJECT])
        else:
            parts = [b.tensor((numel,)) for _ in range(gathered)]
            b.op(ALLGATHER, [[parts], [mine], OBJECT, False, -1], [[parts], OBJECT])
    return b.write(tmp_path / f"pairs-rank-{rank}.json")


def _placed(tmp_path: Path, plan: dict[int, list[tuple[str, int | str | None, int]]]
            ) -> tuple[list[list[str]], list[str]]:
    """Each rank's collectives' groups, by name, as the generator places them, and its
    warnings."""
    paths = [_pairs_rank(tmp_path, rank, calls) for rank, calls in plan.items()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = compile_paths(paths)
    groups = [[p.distributed.groups[op.comm.group].name for op in p.ops if op.comm]
              for p in compiled.programs]
    return groups, [str(w.message) for w in caught]


@pytest.mark.parametrize("plan", [SAME_SIZE_GATHERS, WORLD_REDUCE_OF_A_PAIRS_SIZE,
                                  GATHERS_TO_FIRST],
                         ids=["same-size-gathers", "world-reduce-of-a-pairs-size",
                              "gathers-to-first"])
def test_collectives_on_overlapping_pairs_run_where_their_members_meet(tmp_path, plan):
    """Gloo records no group. Two pairs' all-gathers of one size went to [0, 1] on
    ranks 0 and 1 and to [1, 2] on rank 2 (the common order of [0, 1]'s members took
    both); a world all-reduce of a pair's size was taken for the pair's on rank 0 and
    left rank 2's pair call on the world group; rank 2's gathers to its pairs' first
    members, which pass no list, found no root's call to join: the replays hung. The
    ranks' calls are placed where each group's members issue them in one order and
    meet."""
    groups, warned = _placed(tmp_path, plan)
    assert groups == [[group for group, _, _ in plan[r]] for r in range(3)]
    assert not [w for w in warned if "hang" in w], warned


def test_collectives_no_placement_meets_are_named(tmp_path):
    """Where no group of their sizes lets the members meet (rank 2 lost its last call:
    a filter), the generator says so, naming where the ranks stop, rather than
    emitting a benchmark that hangs without a word."""
    plan = {r: list(calls) for r, calls in SAME_SIZE_GATHERS.items()}
    plan[2].pop()
    _, warned = _placed(tmp_path, plan)
    (message,) = [w for w in warned if w.startswith("no placement")]
    assert re.search(r"rank 0: all_gather, node \d+", message), message


def test_collectives_that_would_wait_on_each_other_in_a_cycle_are_placed_again():
    """Each pair's members issue the same calls on it, but rank 0 blocks on [0, 1]
    while rank 1 blocks on [1, 2] and rank 2 on [0, 2]: each waits on a peer blocked
    elsewhere. Fired as blocking calls meet, the calls get groups that let every rank
    get past each; async calls do not block their rank, so such a cycle meets."""
    groups = [ProcessGroupSpec(0, "0", "default", None, 3),
              ProcessGroupSpec(1, "1", "p01", (0, 1), 2),
              ProcessGroupSpec(2, "2", "p12", (1, 2), 2),
              ProcessGroupSpec(3, "3", "p02", (0, 2), 2)]
    cycle = {0: [1, 3], 1: [2, 1], 2: [3, 2]}

    def rank(r: int, asynchronous: bool = False) -> Program:
        program = Program.empty()
        program.ops = [_comm_op(i, ALLREDUCE_INT, 8, CommInfo(
            call="all_gather_into_tensor", group=g, sized=True, group_recorded=False,
            asynchronous=asynchronous)) for i, g in enumerate(cycle[r])]
        program.distributed = DistInfo(world_size=3, rank=r, groups=groups,
                                       groups_recorded=True)
        return program

    programs = [rank(r) for r in range(3)]
    # Rank 1's calls swap groups: [0, 1] meets first, then [0, 2], then [1, 2].
    assert settle_unrecorded_groups(programs, [0, 1, 2]) == (2, [])
    assert [[op.comm.group for op in p.ops] for p in programs] == [[1, 3], [1, 2], [3, 2]]
    issued_async = [rank(r, True) for r in range(3)]
    assert settle_unrecorded_groups(issued_async, [0, 1, 2]) == (0, [])


def test_collectives_whose_members_pass_other_sizes_meet_as_they_are():
    """An all-to-all's splits differ rank by rank (a mixture of experts' tokens per
    expert): its members meet with other sizes, so the check that the ranks' calls
    meet does not compare them (it warned that nothing met, where all did)."""
    def rank(r: int) -> Program:
        program = _pipeline_rank(r, [])
        program.ops = [_comm_op(0, ALLTOALL_BASE, 8 * (r + 1), CommInfo(
            call="all_to_all_single", group=0, group_recorded=False))]
        return program

    uneven = [rank(r) for r in range(4)]
    assert settle_unrecorded_groups(uneven, [0, 1, 2, 3]) == (0, [])


def test_ranks_that_record_no_size_are_one_job(tmp_path):
    """gloo writes no record_param_comms, and an ET observer started before
    init_process_group (Chakra's whole-run collection) writes no process group
    description: nothing in either rank's trace says the job's size. Traces that all
    communicate are its ranks (they were refused: "combine them with --compose
    sequence", which refuses traces that communicate), and the default group, which is
    all the trace knows, is the job's world (it was described as 1 rank)."""
    paths = []
    for rank in (0, 1):
        tb = TraceBuilder()
        x, w, a = tb.tensor((4, 4)), tb.tensor((4, 4)), tb.tensor((4, 4))
        tb.op(MM, [x, w], [a])
        tb.op(ALLREDUCE_, [[a], Object(), Object(), None, False, -1], [[a], Object()])
        paths.append(tb.write(tmp_path / f"et_rank{rank}.json"))
    traces = [load_trace(p) for p in paths]
    assert is_multi_rank_set(traces)
    compiled = compile_paths(paths)
    assert compiled.ranks == [0, 1] and len(compiled.programs) == 2
    text = generate(paths, tmp_path / "bench.py")
    assert "0 (default_pg): 2 rank(s), members not listed" in text
    assert '"size": 2, "create": True' in text
    # A trace that does not communicate is no rank of it.
    tb = TraceBuilder()
    x, w, a = tb.tensor((4, 4)), tb.tensor((4, 4)), tb.tensor((4, 4))
    tb.op(MM, [x, w], [a])
    alone = load_trace(tb.write(tmp_path / "compute.json"))
    assert not is_multi_rank_set([traces[0], alone])


REDUCE_SCATTER_BASE = (f"c10d::_reduce_scatter_base_(Tensor output_tensor, Tensor "
                       f"input_tensor, {PG}, {REDUCE_OP}, bool async_op=True, "
                       f"int timeout=-1) -> (Tensor, {WORK})")
SLICE = ("aten::slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? "
         "end=None, SymInt step=1) -> Tensor(a)")
COPY_ = "aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)"


def test_an_async_collective_on_part_of_a_buffer_waits_for_a_use_of_that_part(tmp_path):
    """Bucketed gradients reduced from one flat buffer (ZeRO, Megatron's distributed
    optimizer): the first bucket's reduce-scatter is in flight while backward slices
    the buffer and writes the next bucket. A view reads nothing and the other bucket
    is other memory: the wait (gloo records none) waited before the first slice and
    serialised backward with the collective; it belongs before the op that reads the
    collective's output."""
    b = TraceBuilder()
    flat, out = b.tensor((16,)), b.tensor((4,))
    first = b.view(flat, (8,))
    b.op(REDUCE_SCATTER_BASE, [out, first, OBJECT, OBJECT, True, -1], [out, OBJECT])
    second = b.view(flat, (8,), offset=8)
    b.op(SLICE, [flat, 0, 8, 16, 1], [second])
    b.op(COPY_, [second, b.tensor((8,)), False], [second])
    b.op(RELU, [out], [b.tensor((4,))])
    text = generate(b.write(tmp_path / "zero.json"), tmp_path / "bench.py",
                    GenerateOptions(command_line="test"))
    body = re.sub(r"\s+", "", text.split("def replay_rank0(")[1].split("\nRANKS = ")[0])
    work = re.search(r"(work\d*)=_reduce_scatter_single\(", body)
    assert work, body
    wait = body.index(f"_wait_work({work.group(1)})")
    assert body.index("aten_copy_(") < wait < body.index("aten_relu("), body


@pytest.mark.parametrize("completed_at, waited_at", [(5.0, "allreduce_"), (20.0, "relu"),
                                                      (500.0, "relu")])
def test_collectives_the_original_had_in_flight_together_are_not_waited_one_by_one(
        tmp_path, completed_at, waited_at):
    """A trace without wait records (gloo) leaves an async collective's wait to be
    guessed: before its group's next collective, where programs often wait. DDP's
    buckets and ZeRO's broadcasts are in flight together instead, and waited one by
    one the replay serialised them (on NCCL, every kernel after the wait waited for
    the comm). Where the Kineto trace shows the work still running as the next one was
    issued (at 10 here), the wait goes where its data is needed (the relu, at 40),
    however late the work completed."""
    b = TraceBuilder()
    shards, gathered = [b.tensor((4,))], [b.tensor((4,))]
    other = b.tensor((4,))
    b.op(ALLGATHER_COALESCED, [gathered, shards, OBJECT, True], [OBJECT])
    b.op(ALLREDUCE, [[other], OBJECT, OBJECT, None, True, -1], [[other], OBJECT])
    b.op(RELU, [gathered[0]], [b.tensor((4,))])
    program = compile_paths([b.write(tmp_path / "t.json")]).programs[0]
    gather, reduce, relu = program.ops
    assert gather.comm is not None and gather.comm.wait_before == reduce.index  # the guess
    starts = {gather.node_id: 0.0, reduce.node_id: 10.0, relu.node_id: 40.0}
    # Counted (the header says so) where the original had it past the next one.
    assert mark_in_flight(program, {gather.node_id: completed_at}, starts) == \
        (completed_at > starts[reduce.node_id])
    waited = program.ops[gather.comm.wait_before] if gather.comm.wait_before is not None \
        else None
    assert (waited.name.split("::")[1].split(".")[0] if waited else None) == waited_at


def _averaging_rank(rank: int, port: int, out: str) -> None:
    """One gloo rank: a reduce-scatter that averages (gloo divides on its worker
    thread) and an all-reduce that sums, under the ET observer."""
    import torch.distributed as dist

    from tests.conftest import record_et

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    x = torch.ones(8) * (rank + 1)
    out_t = torch.empty(4)

    def step() -> None:
        dist.reduce_scatter_tensor(out_t, x, op=dist.ReduceOp.AVG)
        dist.all_reduce(out_t)

    step()
    record_et(step, Path(out) / f"rank-{rank}.json")
    dist.destroy_process_group()


def test_a_reduction_the_backend_averaged_replays_as_avg(tmp_path):
    """Torch 2.x records c10d's ReduceOp as an opaque object; gloo runs AVG as a sum
    then an in-place division by the group size on its worker thread, which the trace
    does record: that collective replays with AVG, the summing one with SUM."""
    import torch.multiprocessing as mp

    from tests.test_mesh import free_port

    mp.spawn(_averaging_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    out = tmp_path / "bench.py"
    generate([str(tmp_path / "rank-0.json"), str(tmp_path / "rank-1.json")], out)
    text = out.read_text()
    assert text.count("op=torch.distributed.ReduceOp.AVG") == 2  # once per rank
    flat = re.sub(r"\s+", " ", text)
    assert "SUM replayed: c10d::allreduce_ x1 " in flat  # the note, alike on both ranks
    # The worker thread's division is the collective's own work, not the step's.
    assert "aten::div_ x1: a communication backend's worker thread ran it" in flat
