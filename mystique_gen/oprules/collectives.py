"""Collectives: how each c10d operator replays as a torch.distributed call."""

from __future__ import annotations

import re

from mystique_gen.oprules.base import CommRule, OpFamily

COMMUNICATION_NAMESPACES = frozenset({"c10d", "c10d_functional", "_c10d_functional",
                                      "_c10d_functional_autograd"})
# Functional collectives (torch.distributed._functional_collectives, DTensor, tensor
# parallel) replay as themselves, through torch.ops, on the recorded group; their
# wait_tensor waits as the original did. The c10d op each one ran inside is covered.
FUNCTIONAL_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd"})
# The record-function scope a backend opens for its async work ("gloo:all_reduce"): it
# closes on the backend's thread, so the ET nests later ops of the step inside it.
ASYNC_SCOPE = re.compile(r"^(gloo|nccl|ucc|mpi|xccl|hccl):")


# Gloo's scope of the work of some c10d ops names the algorithm it runs them with (a
# reduce-scatter is an all-reduce there; seen on torch 2.13).
_SCOPE_ALIASES = {"reducescatter": frozenset({"reducescatter", "allreduce"})}
# Forms of one collective: what names the same work in a c10d op and in a scope.
_COLLECTIVE_FORMS = re.compile(r"base|coalesced|intotensor|tensor|sparse")


def scope_runs_op(scope: str, op: str) -> bool:
    """Whether a backend's scope of async work (``gloo:all_gather``) can be the work of
    a c10d op (``c10d::_allgather_base_``): their names agree, underscores, namespaces
    and a collective's forms (base, coalesced, into-tensor, sparse) aside."""
    def bare(name: str) -> str:
        return _COLLECTIVE_FORMS.sub("", name.rsplit(":", 1)[-1].replace("_", "").lower())

    kind = bare(op)
    return bare(scope) in _SCOPE_ALIASES.get(kind, frozenset({kind}))


# Bookkeeping ops of functional collectives: not collectives themselves.
COLLECTIVE_HELPERS = frozenset({"wait_tensor", "_wrap_tensor_autograd"})
# Arguments that name a process group (by its recorded pg_name).
GROUP_NAME_ARGS = frozenset({"group_name"})
FUNCTIONAL_GUARD = ("a functional collective: needs the recorded process groups "
                    "(run under torchrun, or a one-rank trace)")
# Reduce ops, by the code c10d::ReduceOp::RedOpType gives them: what a trace holds where
# a c10d op's schema takes the reduce op as an int (torch 1.13; later traces write the
# ReduceOp object as "<Object>", so it is not recorded). PREMUL_SUM (8) needs its
# factor, which no trace holds: it is not reproducible, like an unrecorded op.
REDUCE_OP_CODES = {0: "SUM", 1: "AVG", 2: "PRODUCT", 3: "MIN", 4: "MAX", 5: "BAND",
                   6: "BOR", 7: "BXOR"}
# The same by name: functional collectives spell them "sum", "max", ... (str reduce_op).
REDUCE_OP_NAMES = {name.lower(): name for name in REDUCE_OP_CODES.values()} | {
    "prod": "PRODUCT"}


def reduce_op_name(value: object) -> str | None:
    """The torch.distributed.ReduceOp member a recorded reduce-op argument names
    (an int code, or a name such as "max" or "ReduceOp.MAX"); None where the trace
    does not say (an opaque "<Object>") or names one that cannot be replayed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return REDUCE_OP_CODES.get(value)
    if isinstance(value, str):
        return REDUCE_OP_NAMES.get(value.rpartition(".")[2].strip().lower())
    return None


# The schema argument that says a collective ran async (1.1.x broadcast_ spells it asyncOp).
ASYNC_ARGS = ("async_op", "asyncOp")
# Arguments whose recorded value (when not None) makes a collective unreplayable.
REFUSED_ARGS = {"sparse_indices": "sparse all_reduce is not replayed"}

# Dtypes every backend moves (gloo too). A collective that only moves data, of tensors
# of another dtype (float8, int16, uint16, uint32: a trace recorded on NCCL replayed on
# CPU), sends them as bytes on gloo (harness/dist.py `_bytewise`); a reduction reduces
# wider copies (`_widened`).
WIRE_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "complex64",
                         "complex128", "int64", "int32", "int8", "uint8", "bool"})


def wire_form(dtypes: set[str], reduces: bool) -> str | None:
    """How a collective of tensors of `dtypes` reaches gloo: None where every dtype is
    one gloo sends; else "reduce" (a reduction: on wider copies) or "bytes" (it only
    moves data: as bytes). The harness does each: `_widened` and `_bytewise` around a
    c10d call, `_on_wire` around a functional one."""
    if dtypes <= WIRE_DTYPES:
        return None
    return "reduce" if reduces else "bytes"


def functional_reduces(name: str) -> bool:
    """Whether functional collective `name` (all_reduce_, reduce_scatter_tensor, ...,
    against all_gather_into_tensor, all_to_all_single, broadcast) reduces."""
    return "reduce" in name

MONITORED_BARRIER_NOTE = ("monitored_barrier on gloo, a plain barrier on other backends "
                          "(only gloo implements it); the recorded timeout is not passed on")

FAMILY = OpFamily(
    name="collectives",
    # HSDP's mesh (replicate, shard): gathers of one size fit both dimensions alike;
    # the copy-in's rank is the shard group's.
    group_rank_args={"fsdp::all_gather_copy_in": "rank"},
    comm_ops={
        "c10d::allreduce_": CommRule("all_reduce", (("tensors", "one"),), reduce_op="reduce_op"),
        # all_gather_single, reduce_scatter_single, a coalescing manager of all_reduce:
        # the harness's, torch 2.13's calls (the older ones warn as deprecated there).
        "c10d::allreduce_coalesced_": CommRule(
            "_all_reduce_coalesced", (("tensors", "list"),), reduce_op="reduce_op",
            harness=True),
        "c10d::broadcast_": CommRule("broadcast", (("tensors", "one"),), "root_rank", "group_src"),
        "c10d::reduce_": CommRule("reduce", (("tensors", "one"),), "root_rank", "group_dst",
                                  reduce_op="reduce_op"),
        "c10d::allgather_": CommRule(
            "all_gather", (("output_tensors", "inner"), ("input_tensors", "one")),
            group_members="output_tensors"),
        "c10d::_allgather_base_": CommRule(
            "_all_gather_single", (("output_tensor", "tensor"), ("input_tensor", "tensor")),
            harness=True, group_size=("output_tensor", "input_tensor")),
        "c10d::allgather_coalesced_": CommRule(
            "all_gather_coalesced", (("output_lists", "list"), ("input_list", "list")),
            group_members="output_lists"),
        # Coalesced tensor collectives (FSDP, torch.distributed._coalescing_manager): one
        # call of the harness issues them through a coalescing manager, which torch
        # sends as this op again.
        "c10d::allgather_into_tensor_coalesced_": CommRule(
            "_all_gather_into_tensor_coalesced", (("outputs", "list"), ("inputs", "list")),
            harness=True, group_size=("outputs", "inputs")),
        "c10d::reduce_scatter_": CommRule(
            "reduce_scatter", (("output_tensors", "one"), ("input_tensors", "inner")),
            reduce_op="reduce_op", group_members="input_tensors"),
        "c10d::_reduce_scatter_base_": CommRule(
            "_reduce_scatter_single", (("output_tensor", "tensor"), ("input_tensor", "tensor")),
            reduce_op="reduce_op", harness=True, group_size=("input_tensor", "output_tensor")),
        "c10d::reduce_scatter_tensor_coalesced_": CommRule(
            "_reduce_scatter_tensor_coalesced", (("outputs", "list"), ("inputs", "list")),
            reduce_op="reduce_op", harness=True, group_size=("inputs", "outputs")),
        "c10d::alltoall_": CommRule(
            "all_to_all", (("output_tensors", "list"), ("input_tensors", "list")),
            same_sizes=False, group_members="output_tensors"),
        "c10d::alltoall_base_": CommRule(
            "all_to_all_single", (("output", "tensor"), ("input", "tensor")), splits=True,
            same_sizes=False),
        "c10d::gather_": CommRule(
            "gather", (("input_tensors", "one"), ("output_tensors", "inner_or_none")),
            "root_rank", "group_dst", same_sizes=False, group_members="output_tensors"),
        "c10d::scatter_": CommRule(
            "scatter", (("output_tensors", "one"), ("input_tensors", "inner_or_none")),
            "root_rank", "group_src", same_sizes=False, group_members="input_tensors"),
        # Point-to-point: the trace cannot say whether the program sent with send or
        # isend (batch_isend_irecv, pipeline schedules); issued in recorded order but
        # async, they pair up across ranks as recorded, where blocking calls could wait
        # on each other (1F1B: a send of the next forward against one of a backward).
        "c10d::send": CommRule("send", (("tensors", "one"),), "dst", "group_dst", tag=True,
                               async_call="isend", has_async_arg=False,
                               point_to_point="send", same_sizes=False),
        "c10d::recv_": CommRule("recv", (("tensors", "one"),), "src", "group_src", tag=True,
                                async_call="irecv", has_async_arg=False,
                                point_to_point="recv", same_sizes=False),
        # A recv from any source (``dist.recv(t)`` without ``src``) replays as one, as
        # recorded (no root keyword: the peer pair_point_to_point infers, the rank
        # whose send to this one no named recv pairs, only counts the pairs).
        "c10d::recv_any_source_": CommRule("recv", (("tensors", "one"),), tag=True,
                                           async_call="irecv", has_async_arg=False,
                                           point_to_point="recv", same_sizes=False),
        "c10d::barrier": CommRule("barrier", ()),
        "c10d::monitored_barrier_": CommRule(
            "_monitored_barrier", (), harness=True, has_async_arg=False,
            scalars=(("wait_all_ranks", "wait_all_ranks"),), note=MONITORED_BARRIER_NOTE),
    },
    comm_not_replayed={},
)
