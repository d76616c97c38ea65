"""Parallel training steps as production code writes them, one ET per rank and mode.

Run under torchrun (gloo on CPU): ``python -m torch.distributed.run --standalone
--nproc-per-node 2 tests/parallel_workload.py OUT_DIR MODE...``. Modes:

* ``functional``: torch.distributed._functional_collectives (all_reduce, all_gather,
  reduce_scatter, wait_tensor), as compiled and DTensor code issues them;
* ``tp``: tensor parallel on DTensor (ColwiseParallel + RowwiseParallel MLP, SGD);
* ``fsdp2``: fully_shard on two blocks and the root, AdamW (fsdp:: copy-in/out ops);
* ``fsdp2_dim1``: FSDP2 with parameters sharded on dim 1 (``shard_placement_fn``):
  each copy-out ends in ``cat(out=)`` into a no_grad view of the buffer the unsharded
  nn.Parameter lives on;
* ``coalesced``: c10d's coalesced tensor collectives as FSDP and
  torch.distributed._coalescing_manager issue them (allgather_into_tensor_coalesced_
  async and waited, reduce_scatter_tensor_coalesced_, allreduce_coalesced_ with MAX),
  and a functional all_reduce_coalesced;
* ``reductions``: MAX and MIN reductions, by c10d (the trace does not record the op)
  and by functional collectives (it does), and a monitored_barrier;
* ``pipeline``: a 2-stage pipeline (torch.distributed.pipelining, 1F1B over 4
  microbatches, one stage per rank, SGD): sends and recvs that cross (a rank sends the
  next forward while its peer sends a backward);
* ``mesh2d``: a 2 x 2 device mesh (dp x tp, 4 ranks): collectives on each mesh
  dimension's subgroup, functional and c10d, as 2-D parallel training issues them,
  list forms (``all_gather`` into a list, list ``reduce_scatter``, ``all_to_all``) and
  a ``gather`` to a subgroup's first rank;
* ``pipeline_mesh``: pipeline stages over a 2 x 2 mesh's ``pp`` dimension (GPipe) with
  FSDP2 over ``dp`` (4 ranks), torchtitan's layout: sends and recvs whose peers are
  pp-group ranks, and FSDP2 collectives of different sizes on the two stages;
* ``hsdp``: FSDP2 on a 2 x 2 (replicate, shard) mesh (4 ranks);
* ``stage_dp``: gradients all-reduced by hand over a (pp, dp) mesh's dp groups, the
  stages of different sizes (4 ranks);
* ``fsdp2_tp``: 2-D parallel training on that mesh (4 ranks): tensor parallel
  (Colwise/Rowwise) on ``tp``, FSDP2 on ``dp``, gradients clipped by their total
  norm, AdamW foreach;
* ``seqpar``: sequence parallel on DTensor (a LayerNorm sharded on the sequence, then
  Colwise/Rowwise with sharded input and output): functional all-gathers and
  reduce-scatters whose AsyncCollectiveTensor results are viewed before they are
  waited for, gloo finishing each reduce-scatter inside the wait;
* ``expert``: expert parallel as mixture-of-experts code writes it: top-2 routing,
  token counts exchanged and read back (``.tolist()``), tokens dispatched and combined
  by ``all_to_all_single`` with uneven splits inside an autograd Function, each
  rank's experts run per received chunk;
* ``expert_grouped``: the same dispatch, the received tokens permuted to expert order
  and every local expert run in one ``torch._grouped_mm``, its group ends the received
  counts cumulated (torchtitan's expert parallel);
* ``rooted``: collectives with a root, as evaluation and logging code calls them:
  gather and scatter (a non-root rank passes no list), a list all_gather and a
  broadcast from rank 1 of a strided slice;
* ``vocab``: tensor parallel as LLM training shards its ends: a vocabulary-parallel
  embedding (RowwiseParallel on nn.Embedding: each rank masks the ids outside its rows
  and shifts the rest by its first row, a Python int the trace holds no value of) and
  a class-sharded cross entropy under ``loss_parallel`` (the same masking for the
  targets);
* ``sparse``: DDP over a model with a sparse embedding (``sparse=True``), as DLRM's
  reference trains: its gradient, a sparse COO tensor, is all-reduced as one (gloo
  coalesces it on its worker thread), the dense ones in buckets; SGD;
* ``hooks``: DDP with ``fp16_compress_hook``, whose decompression runs in a
  ``Future.then`` callback on gloo's worker thread;
* ``objects``: Python objects exchanged as training loops log and configure:
  ``all_gather_object`` and ``broadcast_object_list`` (pickles in byte tensors, which
  ``aten::set_`` puts on a storage of the pickle's bytes).

Set-ups as torchtitan and torch's docs write them, each replayed with the same
collectives per rank (``make test`` runs none of them: run them by name):

* FSDP2: ``fsdp2_mp`` (MixedPrecisionPolicy, bf16 parameters, fp32 reductions),
  ``fsdp2_mp_out`` (and fp32 outputs, dropout under checkpointing), ``fsdp2_noreshard``
  (``reshard_after_forward=False``), ``fsdp2_ac`` (non-reentrant activation
  checkpointing per block), ``fsdp2_sac`` (selective checkpointing, matmuls saved),
  ``fsdp2_accum`` (gradient accumulation, ``set_requires_gradient_sync``),
  ``fsdp2_offload`` (CPUOffloadPolicy), ``fsdp2_uneven`` (dimensions the world does
  not divide, bf16 reductions), ``fsdp2_prefetch`` (explicit forward and backward
  prefetching, an async ``unshard``), ``fsdp2_lora`` (frozen base weights beside LoRA
  adapters, a tied embedding and head), and FSDP1 as ``fsdp1`` (FullyShardedDataParallel
  wrapping each block, ``use_orig_params``, bf16 with fp32 reductions, its clipping);
  on 4 ranks ``hsdp_accum`` (HSDP accumulating,
  ``set_requires_all_reduce``) and ``fsdp2_hpz`` (``reshard_after_forward=2``);
* pipelines of two stages per rank and a loss_fn: ``pipeline_interleaved``
  (Interleaved1F1B), ``pipeline_izb`` (InterleavedZeroBubble), ``pipeline_zbv``
  (ZBVZeroBubble), ``pipeline_dualpipev`` (DualPipeV), ``pipeline_bfs`` (LoopedBFS),
  ``pipeline_losses`` (the losses read back, gradients clipped); on 4 ranks
  ``pp_fsdp`` (Interleaved1F1B over ``pp``, FSDP2 over ``dp``) and ``pp_zb_fsdp``
  (the same under InterleavedZeroBubble);
* DDP: ``ddp_static`` (``static_graph``, ``gradient_as_bucket_view``), ``ddp_ckpt``
  (those with reentrant checkpointing, small buckets), ``ddp_nosync`` (accumulation
  under ``no_sync()``), ``ddp_unused`` (``find_unused_parameters``), ``ddp_join``
  (uneven inputs under Join), ``ddp_autocast`` (CPU autocast to bf16),
  ``ddp_powersgd`` (the PowerSGD hook), ``contrastive`` (a CLIP loss over embeddings
  gathered by torch.distributed.nn.functional.all_gather), ``zero`` and ``zero_bucket``
  (ZeroRedundancyOptimizer, the second with ``parameters_as_bucket_view``);
* DTensor by hand: ``dtensor`` (distribute_tensor, Shard/Replicate/Partial to
  Replicate, full_tensor), ``dtensor_uneven`` (uneven shards, Shard(0) -> Shard(1), an
  async redistribute), ``dtensor_partial`` (Partial -> Shard, Partial("max"),
  distribute_module); on 4 ranks ``titan_2d`` (sequence and tensor parallel on ``tp``,
  checkpointing, FSDP2 in bf16 on ``dp``, clipping);
* under torch.compile: ``compiled_ddp`` (DDPOptimizer's graph, DDP's hooks),
  ``compiled_fsdp2`` (FSDP2's hooks between compiled regions), ``compiled_tp``
  (functional collectives inside the compiled graph).

* parallelism by hand, as Megatron-LM, DeepSpeed and research code write it:
  ``megatron_tp`` (tensor and sequence parallel through Megatron's autograd regions,
  column/row-parallel linears, vocab-parallel cross entropy, AdamW: the backward's
  collectives on the autograd engine's thread), ``megatron_async`` (Megatron's
  overlapped backward: async all-gathers and reduce-scatters beside the gradient
  GEMMs, gradients accumulated into ``main_grad``), ``zero_by_hand`` (ZeRO-2: a flat
  buffer, post-accumulate-grad hooks launching async reduce-scatters per bucket,
  Adam on each rank's shard, async all-gathers waited before the next forward),
  ``zero3_by_hand`` (ZeRO-3 by an autograd Function: each weight gathered for forward
  and backward, freed by resizing its storage to nothing, its gradient
  reduce-scattered),
  ``tp_decode`` (tensor-parallel greedy decoding under inference_mode with a KV
  cache, the next token broadcast from rank 0), ``ring_by_hand`` (ring attention:
  K/V passed round by ``batch_isend_irecv``, online softmax, backward passing the
  K/V gradients round too) and ``odd_collectives`` (``new_subgroups``, a PRODUCT
  all-reduce, a reduce to a non-zero root, a list ``all_to_all``; 2 or 4 ranks).

* transformers' own parallelism (``from_pretrained(distributed_config=...)``, a tiny
  model saved from its config): ``hf_tp`` (tensor parallel, Llama), ``hf_fsdp`` (FSDP2,
  Llama), ``hf_ep`` (expert parallel, Qwen3-MoE: tokens to their experts' ranks by
  ``all_to_all_single``; ``make test`` runs it) and ``hf_pp`` (pipeline stages serving
  greedy generation). Loading with a parallel plan needs ``accelerate``.

Context parallel (``context_parallel`` with SDPA) does not run on CPU in torch 2.13:
SDPA dispatches to ``_scaled_dot_product_flash_attention_for_cpu``, which has no
DTensor sharding strategy; nor does SyncBatchNorm under DDP ("SyncBatchNorm layers
only work with GPU modules").

Writes ``OUT_DIR/<mode>-rank-<N>.json``. With ``--kineto`` before the modes, each rank
captures its step as :func:`mystique_gen.tools.capture.capture` captures one process:
``<mode>-rank-<N>.et.json`` with the Kineto trace of the same step
(``.kineto.json``, linked by rf_id, recording the rank in ``distributedInfo``), three
steps profiled without the observer (``.profile.json``) and the ``.step.json`` sidecar
(eager step times over ``WORKLOAD_TIMING_ITERS`` steps, default 2: tests need the
trace, the bench the time; ``WORKLOAD_PROFILE_STEPS`` profiled steps, default 3).
With ``--profiled`` instead, as other tools capture (``_profiled``): ``OUT_DIR/<mode>/``
holds ``et_rank<N>.json`` and two cycles' ``<host>_<pid>.<time>.pt.trace.json`` per rank.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)
from torch.profiler import (
    ExecutionTraceObserver,
    ProfilerActivity,
    profile,
    schedule,
    tensorboard_trace_handler,
)

from mystique_gen.tools.capture import capture


def functional() -> Callable[[], object]:
    x = torch.ones(8) * (dist.get_rank() + 1)

    def step() -> object:
        y = fc.all_reduce(x, "sum", dist.group.WORLD)
        z = fc.all_gather_tensor(y, 0, dist.group.WORLD)
        w = fc.reduce_scatter_tensor(z, "sum", 0, dist.group.WORLD)
        return (fc.wait_tensor(w) * 2).sum()

    return step


def _train_step(model: torch.nn.Module, inputs: torch.Tensor,
                opt: torch.optim.Optimizer) -> Callable[[], None]:
    """One training step of ``model`` on ``inputs`` by ``opt`` (the loss: the output's
    sum)."""

    def step() -> None:
        opt.zero_grad()
        model(inputs).sum().backward()
        opt.step()

    return step


def _sgd_step(model: torch.nn.Module, inputs: torch.Tensor) -> Callable[[], None]:
    """One SGD training step of ``model`` on ``inputs`` (the loss: its output's sum)."""
    return _train_step(model, inputs, torch.optim.SGD(model.parameters(), lr=0.1))


def tensor_parallel() -> Callable[[], object]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return _sgd_step(model, torch.randn(4, 16))


def fsdp2(shard_placement_fn: Callable[[torch.nn.Parameter], Shard] | None = None
          ) -> Callable[[], object]:
    model = _sharded_blocks(_blocks(), shard_placement_fn=shard_placement_fn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    return _train_step(model, torch.randn(4, 16), opt)


def fsdp2_dim1() -> Callable[[], object]:
    """FSDP2 sharding the weights on dim 1 (``shard_placement_fn``), as torchtitan's
    MoE and column-sharded layers do: each unsharded parameter is an nn.Parameter over
    the buffer its copy-out writes under no_grad (chunk, then ``cat(out=)`` into a view
    of that buffer in the parameter's layout)."""
    return fsdp2(lambda param: Shard(1) if param.ndim == 2 else Shard(0))


def coalesced() -> Callable[[], object]:
    world, rank = dist.get_world_size(), dist.get_rank()
    shards = [torch.full((4,), float(rank + 1)), torch.arange(6.0)]
    gathered = [torch.empty(4 * world), torch.empty(6 * world)]
    grads = [torch.ones(2 * world), torch.arange(3.0 * world)]
    reduced = [torch.empty(2), torch.empty(3)]

    def step() -> object:
        with dist._coalescing_manager(async_ops=True) as manager:
            for out, shard in zip(gathered, shards, strict=True):
                dist.all_gather_into_tensor(out, shard)
        manager.wait()
        total = gathered[0].sum() + gathered[1].sum()
        with dist._coalescing_manager():
            for out, grad in zip(reduced, grads, strict=True):
                dist.reduce_scatter_tensor(out, grad)
        with dist._coalescing_manager():
            for tensor in reduced:
                dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        low = fc.all_reduce_coalesced(reduced, "min", dist.group.WORLD)
        return total + sum(fc.wait_tensor(t).sum() for t in low)

    return step


def reductions() -> Callable[[], object]:
    x = torch.arange(8.0) + dist.get_rank()

    def step() -> object:
        y = x.clone()
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        dist.all_reduce(y, op=dist.ReduceOp.MIN)
        dist.reduce(y, 0, op=dist.ReduceOp.MAX)
        part = torch.empty(8 // dist.get_world_size())
        dist.reduce_scatter_tensor(part, y, op=dist.ReduceOp.MIN)
        # Async, with program work before its wait: gloo finishes it where wait() runs
        # (a chunk of its private buffer copied into the output), after that work.
        late = torch.empty(8 // dist.get_world_size())
        work = dist.reduce_scatter_tensor(late, y * 2, async_op=True)
        part = part + y.relu().sum()
        work.wait()
        part = part + late
        high = fc.wait_tensor(fc.all_reduce(y, "max", dist.group.WORLD))
        low = fc.wait_tensor(fc.all_reduce(high * 2, "min", dist.group.WORLD))
        dist.monitored_barrier()
        return low.sum() + part.sum()

    return step


def _pipeline_step(schedule: object, opt: torch.optim.Optimizer, first: bool, last: bool,
                   x: torch.Tensor, target: torch.Tensor) -> Callable[[], None]:
    """One training step of a pipeline schedule: the rank holding the first stage feeds
    the inputs, the one holding the last the targets, then the optimizer steps."""

    def step() -> None:
        opt.zero_grad()
        kwargs: dict[str, object] = {}
        if last:
            kwargs.update(target=target, losses=[])
        if first:
            schedule.step(x, **kwargs)  # type: ignore[attr-defined]
        else:
            schedule.step(**kwargs)  # type: ignore[attr-defined]
        opt.step()

    return step


def pipeline() -> Callable[[], object]:
    rank, world = dist.get_rank(), dist.get_world_size()
    stage_module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=4,
                            loss_fn=lambda y, target: ((y - target) ** 2).mean())
    opt = torch.optim.SGD(stage_module.parameters(), lr=0.1)
    x, target = torch.randn(4, 16), torch.randn(4, 16)
    return _pipeline_step(schedule, opt, rank == 0, rank == world - 1, x, target)


def pipeline_mesh() -> Callable[[], object]:
    """torchtitan's 2-D layout: pipeline stages over a mesh's ``pp`` dimension (GPipe,
    2 microbatches), FSDP2 over ``dp``: each send names its peer within the pp group."""
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("pp", "dp"))
    stage_index = mesh["pp"].get_local_rank()
    # Stages hold different layers, as a model's first and last stages do: FSDP2's
    # gathers of the two stages have different sizes.
    stage_module = (torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                        torch.nn.Linear(32, 16)) if stage_index == 0
                    else torch.nn.Sequential(torch.nn.Linear(16, 16)))
    fully_shard(stage_module, mesh=mesh["dp"])
    stage = PipelineStage(stage_module, stage_index, 2, torch.device("cpu"),
                          group=mesh.get_group("pp"))
    schedule = ScheduleGPipe(stage, n_microbatches=2,
                             loss_fn=lambda y, target: ((y - target) ** 2).mean())
    opt = torch.optim.AdamW(stage_module.parameters(), lr=1e-3)
    x, target = torch.randn(4, 16), torch.randn(4, 16)
    return _pipeline_step(schedule, opt, stage_index == 0, stage_index == 1, x, target)


def hsdp() -> Callable[[], object]:
    """HSDP: FSDP2 on a 2 x 2 (replicate, shard) mesh: gathers and reduce-scatters on
    the shard groups, an all-reduce over the replicas."""
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("replicate", "shard"))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return _train_step(model, torch.randn(4, 16), opt)


def stage_dp() -> Callable[[], object]:
    """Data parallel by hand over a 2 x 2 (pp, dp) mesh's ``dp`` groups, the stages of
    different sizes: each gradient all-reduced on its dp group (gloo records no group).
    The first and the last rank also share a tied weight, all-reduced on a group of the
    two (Megatron's embedding group): the other ranks issue nothing there."""
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("pp", "dp"))
    ends = [0, dist.get_world_size() - 1]
    tied_group = dist.new_group(ends)  # every rank creates it
    stage_index = mesh["pp"].get_local_rank()
    layer = torch.nn.Linear(16, 32 if stage_index == 0 else 8)
    tied = torch.nn.Parameter(torch.randn(12))
    opt = torch.optim.SGD([*layer.parameters(), tied], lr=1e-3)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        (layer(x).sum() + tied.square().sum()).backward()
        for p in layer.parameters():
            dist.all_reduce(p.grad, group=mesh.get_group("dp"))
        if dist.get_rank() in ends:
            dist.all_reduce(tied.grad, group=tied_group)
        opt.step()

    return step


def mesh2d() -> Callable[[], object]:
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("dp", "tp"))
    x = torch.ones(8) * (dist.get_rank() + 1)
    weight = torch.randn(8, 8)

    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    tp_root = dist.get_process_group_ranks(tp)[0]

    def step() -> object:
        y = fc.wait_tensor(fc.all_reduce(x @ weight, "sum", mesh["tp"]))
        z = fc.wait_tensor(fc.all_gather_tensor(y, 0, mesh["dp"]))
        dist.all_reduce(z, group=dp)
        # Calls with one tensor per member, whose list length is the group's size (gloo
        # records no group), and a gather whose non-root ranks pass no list.
        parts = [torch.empty(8) for _ in range(2)]
        dist.all_gather(parts, y, group=dp)
        mine = torch.empty(8)
        dist.reduce_scatter(mine, list(z.chunk(2)), group=tp)
        swapped = [torch.empty(4) for _ in range(2)]
        dist.all_to_all(swapped, list(y.chunk(2)), group=tp)
        rooted = [torch.empty(8) for _ in range(2)] if dist.get_rank() == tp_root else None
        dist.gather(mine, rooted, group_dst=0, group=tp)
        return (z * 2).sum() + sum(p.sum() for p in parts + swapped)

    return step


def fsdp2_tp() -> Callable[[], object]:
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("dp", "tp"))
    model = torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        for _ in range(2)])
    for block in model:
        parallelize_module(block, mesh["tp"], {"0": ColwiseParallel(),
                                               "2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        # The total norm over both mesh dimensions: DTensor all-reduces on each.
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def seqpar() -> Callable[[], object]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 16))
    parallelize_module(model, mesh, {"0": SequenceParallel(sequence_dim=0),
                                     "1": ColwiseParallel(input_layouts=Shard(0)),
                                     "3": RowwiseParallel(output_layouts=Shard(0))})
    return _sgd_step(model, torch.randn(8, 16))


class _AllToAll(torch.autograd.Function):
    """Tokens to the ranks that hold their experts; the gradient goes back the same way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int],  # type: ignore[override]
                in_splits: list[int]) -> torch.Tensor:
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None


def _expert_parallel(experts: list[torch.nn.Parameter] | torch.nn.Module,
                     run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                     per_rank: int = 2, dim: int = 16) -> Callable[[], object]:
    """Top-2 routing over ``per_rank`` experts per rank, the token counts exchanged and
    read back, tokens dispatched and combined by ``all_to_all_single``;
    ``run(tokens, received)`` runs this rank's experts on the tokens it received, in
    order of source rank then expert, ``received`` counting them (world x per_rank)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    gate = torch.nn.Linear(dim, per_rank * world)
    params = experts.parameters() if isinstance(experts, torch.nn.Module) else experts
    opt = torch.optim.AdamW([*params, *gate.parameters()], lr=1e-3)
    torch.manual_seed(rank)  # each rank routes its own tokens: uneven splits
    x = torch.randn(24, dim)

    def step() -> None:
        opt.zero_grad()
        weights, chosen = gate(x).softmax(-1).topk(2, dim=-1)
        order = chosen.flatten().argsort()
        tokens = x.repeat_interleave(2, dim=0)[order]
        counts = torch.bincount(chosen.flatten(), minlength=per_rank * world)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts)
        send = counts.view(world, -1).sum(1).tolist()
        got_splits = received.view(world, per_rank).sum(1).tolist()
        got = _AllToAll.apply(tokens, got_splits, send)
        back = _AllToAll.apply(run(got, received.view(world, per_rank)), send, got_splits)
        combined = torch.empty_like(back)
        combined[order] = back
        (combined.view(-1, 2, dim) * weights.unsqueeze(-1)).sum(1).pow(2).mean().backward()
        opt.step()

    return step


def expert() -> Callable[[], object]:
    experts = torch.nn.ModuleList(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)) for _ in range(2))

    def run(got: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
        outputs, start = [], 0
        for row in received.tolist():
            for e, n in enumerate(row):
                outputs.append(experts[e](got[start:start + n]))
                start += n
        return torch.cat(outputs)

    return _expert_parallel(experts, run)


def expert_grouped() -> Callable[[], object]:
    """Expert parallel as torchtitan runs it: the received tokens permuted from source
    rank order to expert order, then every local expert in one grouped GEMM
    (``torch._grouped_mm``) whose group ends are the received counts, cumulated."""
    w1 = torch.nn.Parameter(torch.randn(2, 16, 32) * 0.1)
    w2 = torch.nn.Parameter(torch.randn(2, 32, 16) * 0.1)

    def run(got: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
        expert_of = torch.arange(received.shape[1]).repeat(received.shape[0])
        perm = expert_of.repeat_interleave(received.flatten()).argsort(stable=True)
        ends = received.sum(0).cumsum(0).to(torch.int32)
        hidden = torch.nn.functional.silu(torch._grouped_mm(got[perm], w1, offs=ends))
        out = torch._grouped_mm(hidden, w2, offs=ends)
        return torch.empty_like(out).index_copy(0, perm, out)

    return _expert_parallel([w1, w2], run)


def rooted() -> Callable[[], object]:
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.arange(4.0) + rank

    def step() -> object:
        gathered = [torch.empty(4) for _ in range(world)] if rank == 0 else None
        dist.gather(x, gathered, dst=0)
        part = torch.empty(4)
        dist.scatter(part, [x * r for r in range(world)] if rank == 0 else None, src=0)
        every = [torch.empty(4) for _ in range(world)]
        dist.all_gather(every, part)
        strided = x[::2].clone()
        dist.broadcast(strided, 1)
        return sum(t.sum() for t in every) + strided.sum()

    return step


def objects() -> Callable[[], object]:
    rank, world = dist.get_rank(), dist.get_world_size()
    loss = torch.randn(8)

    def step() -> object:
        logged: list[object] = [None] * world
        dist.all_gather_object(logged, {"rank": rank, "loss": float(loss.sum())})
        config = [{"lr": 0.1, "step": 3}] if rank == 0 else [None]
        dist.broadcast_object_list(config, 0)
        return loss * len(logged)

    return step


def vocab() -> Callable[[], object]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 64))
    parallelize_module(model, mesh, {
        "0": RowwiseParallel(input_layouts=Replicate()),
        "1": ColwiseParallel(),
        "3": RowwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (4, 8))
    target = torch.randint(0, 64, (4 * 8,))

    def step() -> None:
        opt.zero_grad()
        with loss_parallel():
            logits = model(ids).flatten(0, 1)
            torch.nn.functional.cross_entropy(logits, target).backward()
        opt.step()

    return step


def sparse_ddp() -> Callable[[], object]:
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(100, 8, sparse=True)
            self.head = torch.nn.Linear(8, 1)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embedding(ids).mean(1))

    model = torch.nn.parallel.DistributedDataParallel(Model())
    return _sgd_step(model, torch.randint(0, 100, (8, 3)))


def compressed_ddp() -> Callable[[], object]:
    """DDP with torch's fp16 compression hook: the bucket is all-reduced in half
    precision and decompressed in a Future.then callback (on gloo's worker thread)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    model.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    return _sgd_step(model, torch.randn(4, 16))


def side_group() -> Callable[[], object]:
    """A second group over every rank beside the default one (gloo records neither):
    rank 0 issues an async all-reduce on it before a default-group all-reduce, rank 1
    after; then a background thread all-reduces on it while the step computes and
    all-reduces on the default group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    side = dist.new_group(list(range(world)))
    a = torch.randn(32, 32)

    def step() -> object:
        t, z = torch.ones(4), torch.ones(3)
        if rank == 0:
            work = dist.all_reduce(t, group=side, async_op=True)
            dist.all_reduce(z)
        else:
            dist.all_reduce(z)
            work = dist.all_reduce(t, group=side, async_op=True)
        work.wait()
        u = torch.ones(5) * rank
        thread = threading.Thread(target=dist.all_reduce, args=(u,), kwargs={"group": side})
        thread.start()
        y = a @ a
        v = torch.ones(2)
        dist.all_reduce(v)
        thread.join()
        return y.sum() + t.sum() + z.sum() + u.sum() + v.sum()

    return step


def _blocks(n: int = 2) -> torch.nn.Sequential:
    return torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.LayerNorm(16), torch.nn.Linear(16, 32), torch.nn.GELU(),
        torch.nn.Linear(32, 16)) for _ in range(n)])


def _sharded_blocks(model: torch.nn.Sequential, **kwargs: object) -> torch.nn.Sequential:
    """``model`` with fully_shard(``kwargs``) on each block, then on the root, as FSDP2
    wraps a transformer's layers."""
    for block in model:
        fully_shard(block, **kwargs)  # type: ignore[arg-type]
    fully_shard(model, **kwargs)  # type: ignore[arg-type]
    return model


def _fsdp2_step(model: torch.nn.Sequential, x: torch.Tensor | None = None,
                **kwargs: object) -> Callable[[], object]:
    """fully_shard on each block and the root with ``kwargs``, AdamW foreach, on ``x``
    (a batch of 4 x 16 where not given)."""
    _sharded_blocks(model, **kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(4, 16) if x is None else x

    def step() -> None:
        opt.zero_grad()
        model(x).float().sum().backward()
        opt.step()

    return step


def fsdp2_mp() -> Callable[[], object]:
    """FSDP2 in mixed precision as LLM training runs it: bf16 parameters in compute,
    gradients reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return _fsdp2_step(_blocks(), mp_policy=MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32))


def fsdp2_noreshard() -> Callable[[], object]:
    """FSDP2 keeping the gathered parameters from forward to backward (ZeRO-2)."""
    return _fsdp2_step(_blocks(), reshard_after_forward=False)


def fsdp2_ac() -> Callable[[], object]:
    """FSDP2 with activation checkpointing on each block (non-reentrant), as torchtitan
    wraps them: the backward recomputes each block's forward, gathering again."""
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.inner, x, use_reentrant=False)

    return _fsdp2_step(torch.nn.Sequential(*[Checkpointed(b) for b in _blocks()]))


def fsdp2_accum() -> Callable[[], object]:
    """FSDP2 with gradient accumulation over 3 microbatches: no reduce-scatter but on
    the last (set_requires_gradient_sync)."""
    model = _sharded_blocks(_blocks())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    xs = torch.randn(3, 4, 16)

    def step() -> None:
        opt.zero_grad()
        for i, x in enumerate(xs):
            model.set_requires_gradient_sync(i == len(xs) - 1)  # type: ignore[operator]
            model(x).sum().backward()
        opt.step()

    return step


def fsdp2_offload() -> Callable[[], object]:
    """FSDP2 with CPUOffloadPolicy: sharded parameters, gradients and the optimizer
    step on the host (pinned memory off: CPU only)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    return _fsdp2_step(_blocks(), offload_policy=CPUOffloadPolicy(pin_memory=False))


def _multi_stage(schedule_cls: type, stage_ids: Callable[[int, int], list[int]]
                 ) -> Callable[[], object]:
    """Two stages per rank (``stage_ids(rank, world)``) under ``schedule_cls``, 4
    microbatches, an MSE loss_fn, SGD."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n_stages = 2 * world
    ids = stage_ids(rank, world)
    modules = [torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()) for _ in ids]
    stages = [PipelineStage(m, i, n_stages, torch.device("cpu"))
              for m, i in zip(modules, ids, strict=True)]
    schedule = schedule_cls(stages, n_microbatches=4,
                            loss_fn=lambda y, target: ((y - target) ** 2).mean())
    opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.1)
    x, target = torch.randn(4, 16), torch.randn(4, 16)
    return _pipeline_step(schedule, opt, 0 in ids, n_stages - 1 in ids, x, target)


def _looped(rank: int, world: int) -> list[int]:
    return [rank, rank + world]


def _v_shape(rank: int, world: int) -> list[int]:
    return [rank, 2 * world - 1 - rank]


def pipeline_interleaved() -> Callable[[], object]:
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    return _multi_stage(ScheduleInterleaved1F1B, _looped)


def pipeline_izb() -> Callable[[], object]:
    from torch.distributed.pipelining import ScheduleInterleavedZeroBubble

    return _multi_stage(ScheduleInterleavedZeroBubble, _looped)


def pipeline_zbv() -> Callable[[], object]:
    from torch.distributed.pipelining import ScheduleZBVZeroBubble

    return _multi_stage(ScheduleZBVZeroBubble, _v_shape)


def pipeline_dualpipev() -> Callable[[], object]:
    from torch.distributed.pipelining import ScheduleDualPipeV

    return _multi_stage(ScheduleDualPipeV, _v_shape)


def pipeline_bfs() -> Callable[[], object]:
    from torch.distributed.pipelining import ScheduleLoopedBFS

    return _multi_stage(ScheduleLoopedBFS, _looped)


def compiled_ddp() -> Callable[[], object]:
    """torch.compile over DDP: dynamo's DDPOptimizer compiles the model between bucket
    boundaries (a model this small is one bucket), DDP's hooks all-reduce."""
    model = torch.nn.parallel.DistributedDataParallel(_blocks())
    return _sgd_step(torch.compile(model), torch.randn(4, 16))


def compiled_fsdp2() -> Callable[[], object]:
    """torch.compile over FSDP2 (its hooks run eagerly between compiled regions)."""
    model = torch.compile(_sharded_blocks(_blocks()))
    return _train_step(model, torch.randn(4, 16), torch.optim.AdamW(model.parameters()))


def compiled_tp() -> Callable[[], object]:
    """torch.compile over tensor parallel on DTensor: the collectives are functional
    ones inside the compiled graph."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 16))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return _sgd_step(torch.compile(model), torch.randn(4, 16))


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


def ddp_static() -> Callable[[], object]:
    """DDP with static_graph=True and gradient_as_bucket_view=True."""
    model = torch.nn.parallel.DistributedDataParallel(
        _mlp(), static_graph=True, gradient_as_bucket_view=True)
    return _sgd_step(model, torch.randn(4, 16))


def ddp_nosync() -> Callable[[], object]:
    """DDP gradient accumulation: the first microbatches under no_sync()."""
    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = torch.randn(3, 4, 16)

    def step() -> None:
        opt.zero_grad()
        with model.no_sync():
            for x in xs[:-1]:
                model(x).sum().backward()
        model(xs[-1]).sum().backward()
        opt.step()

    return step


def zero() -> Callable[[], object]:
    """DDP with ZeroRedundancyOptimizer (Adam states sharded; parameters broadcast)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                  lr=1e-3)
    return _train_step(model, torch.randn(4, 16), opt)


def dtensor() -> Callable[[], object]:
    """DTensor by hand: distribute_tensor with Shard and Replicate, redistribute
    Shard -> Replicate and Partial -> Replicate, full_tensor()."""
    from torch.distributed.tensor import Partial, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    a = torch.randn(8, 16)
    b = torch.randn(16, 4)

    def step() -> object:
        da = distribute_tensor(a, mesh, [Shard(0)])
        db = distribute_tensor(b, mesh, [Replicate()])
        out = (da @ db).redistribute(mesh, [Replicate()])
        # A row-sharded contraction: each rank's product is a partial sum.
        dk = distribute_tensor(a, mesh, [Shard(1)])
        dw = distribute_tensor(b, mesh, [Shard(0)])
        partial = dk @ dw
        summed = partial.redistribute(mesh, [Replicate()])
        p = distribute_tensor(torch.ones(4), mesh, [Partial()])
        return out.to_local().sum() + summed.full_tensor().sum() + p.full_tensor().sum()

    return step


def fsdp2_uneven() -> Callable[[], object]:
    """FSDP2 over dimensions the world size does not divide (FSDP2 pads each shard),
    in bf16 with gradients reduced in bf16 too."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    model = torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.LayerNorm(17), torch.nn.Linear(17, 33), torch.nn.GELU(),
        torch.nn.Linear(33, 17)) for _ in range(2)])
    return _fsdp2_step(model, torch.randn(5, 17),
                       mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))


def fsdp2_prefetch() -> Callable[[], object]:
    """FSDP2 with explicit prefetching as torchtitan sets it: each block unshards the
    next one in forward and the previous one in backward; the first unshard async."""
    model = _sharded_blocks(_blocks(3))
    blocks = list(model)
    for prev, nxt in zip(blocks, blocks[1:], strict=False):
        prev.set_modules_to_forward_prefetch([nxt])  # type: ignore[operator]
        nxt.set_modules_to_backward_prefetch([prev])  # type: ignore[operator]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        handle = blocks[0].unshard(async_op=True)  # type: ignore[operator]
        model(x).sum().backward()
        if handle is not None:
            handle.wait()
        opt.step()

    return step


def fsdp2_sac() -> Callable[[], object]:
    """FSDP2 with selective activation checkpointing (torchtitan's op-level policy):
    matmul outputs saved, the rest recomputed in backward."""
    from functools import partial

    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    def policy(ctx: object, op: object, *args: object, **kwargs: object) -> object:
        return (CheckpointPolicy.MUST_SAVE if op in (torch.ops.aten.mm.default,
                                                     torch.ops.aten.addmm.default)
                else CheckpointPolicy.PREFER_RECOMPUTE)

    class Checkpointed(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.inner, x, use_reentrant=False,
                              context_fn=partial(create_selective_checkpoint_contexts,
                                                 policy))

    return _fsdp2_step(torch.nn.Sequential(*[Checkpointed(b) for b in _blocks()]))


def dtensor_uneven() -> Callable[[], object]:
    """DTensor over a dimension the world size does not divide: distribute_tensor,
    from_local, Shard(0) -> Shard(1) (an all-to-all), an async redistribute, and
    full_tensor() of uneven shards (padded gathers)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    a = torch.randn(7, 6)
    local = torch.randn(3, 5) + dist.get_rank()

    def step() -> object:
        da = distribute_tensor(a, mesh, [Shard(0)])
        cols = da.redistribute(mesh, [Shard(1)])
        whole = (cols * 2).full_tensor()
        dl = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        rep = dl.redistribute(mesh, [Replicate()], async_op=True)
        return whole.sum() + rep.to_local().sum()

    return step


def ddp_unused() -> Callable[[], object]:
    """DDP with find_unused_parameters=True over a model one branch of which the step
    does not use."""
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = _mlp(), torch.nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    model = torch.nn.parallel.DistributedDataParallel(Model(), find_unused_parameters=True)
    return _sgd_step(model, torch.randn(4, 16))


def titan_2d() -> Callable[[], object]:
    """torchtitan's 2-D recipe on a 2 x 2 (dp, tp) mesh (4 ranks): per block, a
    sequence-parallel norm and Colwise/Rowwise linears on ``tp``, activation
    checkpointing, then FSDP2 on ``dp`` in bf16 with fp32 reductions; gradients
    clipped by their total norm, AdamW foreach."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.utils.checkpoint import checkpoint

    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("dp", "tp"))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(16)
            self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self._forward, x, use_reentrant=False)

        def _forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    model = torch.nn.Sequential(Block(), Block())
    for block in model:
        parallelize_module(block, mesh["tp"], {
            "norm": SequenceParallel(sequence_dim=0),
            "up": ColwiseParallel(input_layouts=Shard(0)),
            "down": RowwiseParallel(output_layouts=Shard(0))})
        fully_shard(block, mesh=mesh["dp"], mp_policy=mp)
    fully_shard(model, mesh=mesh["dp"], mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(8, 16)

    def step() -> None:
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def _pp_over_fsdp(schedule_cls: type) -> Callable[[], object]:
    """Pipeline stages over a 2 x 2 (pp, dp) mesh's ``pp`` (4 ranks), two per pp rank
    (4 microbatches, a loss_fn), each fully_shard on ``dp`` without resharding after
    forward (as torchtitan does under PP), scheduled by ``schedule_cls``."""
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("pp", "dp"))
    pp_rank = mesh["pp"].get_local_rank()
    ids = [pp_rank, pp_rank + 2]
    modules = [torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()) for _ in ids]
    for m in modules:
        fully_shard(m, mesh=mesh["dp"], reshard_after_forward=False)
    stages = [PipelineStage(m, i, 4, torch.device("cpu"), group=mesh.get_group("pp"))
              for m, i in zip(modules, ids, strict=True)]
    schedule = schedule_cls(
        stages, n_microbatches=4, loss_fn=lambda y, target: ((y - target) ** 2).mean())
    opt = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=1e-3)
    x, target = torch.randn(4, 16), torch.randn(4, 16)
    return _pipeline_step(schedule, opt, 0 in ids, 3 in ids, x, target)


def pp_fsdp() -> Callable[[], object]:
    """torchtitan's PP + FSDP: Interleaved1F1B over ``pp``, FSDP2 on ``dp`` (4 ranks)."""
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    return _pp_over_fsdp(ScheduleInterleaved1F1B)


def fsdp2_mp_out() -> Callable[[], object]:
    """FSDP2 mixed precision with fp32 outputs (``output_dtype``) over blocks with
    dropout under activation checkpointing: the recompute replays the RNG state."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.utils.checkpoint import checkpoint

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                             torch.nn.Dropout(0.1), torch.nn.Linear(32, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.inner, x, use_reentrant=False)

    model = torch.nn.Sequential(Block(), Block())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                              output_dtype=torch.float32)
    return _fsdp2_step(model, mp_policy=mp)


def ddp_ckpt() -> Callable[[], object]:
    """DDP with static_graph=True for reentrant activation checkpointing (the case it
    is for), small buckets (several all-reduces, each bucket a view of its grads)."""
    from torch.utils.checkpoint import checkpoint

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = _mlp(), torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(checkpoint(self.a, x, use_reentrant=True))

    model = torch.nn.parallel.DistributedDataParallel(
        Model(), static_graph=True, gradient_as_bucket_view=True, bucket_cap_mb=0.001)
    return _sgd_step(model, torch.randn(4, 16, requires_grad=True))


def ddp_join() -> Callable[[], object]:
    """DDP under the Join context manager (uneven inputs): each rank runs its own
    number of microbatches; the joined rank shadows its peer's all-reduces."""
    from torch.distributed.algorithms.join import Join

    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = torch.randn(2 + dist.get_rank(), 4, 16)

    def step() -> None:
        with Join([model]):
            for x in xs:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()

    return step


def pipeline_losses() -> Callable[[], object]:
    """Interleaved 1F1B whose last stage reads its microbatches' losses back, as
    training loops log them (a stack, a mean and ``.item()``)."""
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    rank, world = dist.get_rank(), dist.get_world_size()
    ids = _looped(rank, world)
    modules = [torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in ids]
    stages = [PipelineStage(m, i, 2 * world, torch.device("cpu"))
              for m, i in zip(modules, ids, strict=True)]
    schedule = ScheduleInterleaved1F1B(
        stages, n_microbatches=4, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=1e-3)
    x, target = torch.randn(8, 16), torch.randn(8, 16)

    def step() -> object:
        opt.zero_grad()
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=target, losses=losses)
        torch.nn.utils.clip_grad_norm_([p for m in modules for p in m.parameters()], 1.0)
        opt.step()
        return torch.stack(losses).mean().item() if losses else None

    return step


def dtensor_partial() -> Callable[[], object]:
    """DTensor partial sums as they resolve: Partial -> Shard(0) (a reduce-scatter),
    a Partial("max") -> Replicate, and distribute_module with a Replicate input."""
    from torch.distributed.tensor import DTensor, Partial, distribute_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    part = torch.randn(8, 4) + dist.get_rank()
    module = distribute_module(
        torch.nn.Linear(4, 4), mesh,
        input_fn=lambda mod, inputs, device_mesh: tuple(
            DTensor.from_local(t, device_mesh, [Replicate()]) for t in inputs))

    def step() -> object:
        p = DTensor.from_local(part, mesh, [Partial()])
        rows = p.redistribute(mesh, [Shard(0)])
        m = DTensor.from_local(part, mesh, [Partial("max")]).redistribute(mesh, [Replicate()])
        y = module(rows.full_tensor())
        return y.to_local().sum() + m.to_local().sum()

    return step


def ddp_autocast() -> Callable[[], object]:
    """DDP under CPU autocast to bf16 (the linears in bf16, fp32 gradients)."""
    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()

    return step


def zero_bucket() -> Callable[[], object]:
    """ZeroRedundancyOptimizer with its parameters in flat buckets
    (``parameters_as_bucket_view``): one broadcast per rank's bucket."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                  parameters_as_bucket_view=True, lr=1e-3)
    return _train_step(model, torch.randn(4, 16), opt)


def ddp_powersgd() -> Callable[[], object]:
    """DDP with the PowerSGD comm hook (rank-1 approximation, past its warm-up): the
    P and Q all-reduces chained in Future callbacks."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2, min_compression_rate=0.5)
    model.register_comm_hook(state, powersgd.powerSGD_hook)
    return _sgd_step(model, torch.randn(4, 16))


def hsdp_accum() -> Callable[[], object]:
    """HSDP on a 2 x 2 (replicate, shard) mesh (4 ranks) in bf16 with fp32 reductions,
    accumulating over 2 microbatches as torchtitan does: reduce-scatters on every
    microbatch, the all-reduce over replicas on the last only."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("replicate", "shard"))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = _sharded_blocks(_blocks(), mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    xs = torch.randn(2, 4, 16)

    def step() -> None:
        opt.zero_grad()
        for i, x in enumerate(xs):
            model.set_requires_all_reduce(i == len(xs) - 1)  # type: ignore[operator]
            model(x).float().sum().backward()
        opt.step()

    return step


def fsdp2_hpz() -> Callable[[], object]:
    """FSDP2 resharding to 2 ranks after forward (``reshard_after_forward=2``, 4 ranks):
    the forward gathers over all 4 ranks, the backward over pairs."""
    return _fsdp2_step(_blocks(), reshard_after_forward=2)


def contrastive() -> Callable[[], object]:
    """A CLIP-style contrastive loss over every rank's embeddings, gathered with the
    autograd-aware torch.distributed.nn.functional.all_gather (its backward reduces
    the gradients back), under DDP."""
    from torch.distributed.nn.functional import all_gather

    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        local = torch.nn.functional.normalize(model(x), dim=-1)
        everyone = torch.cat(all_gather(local))
        logits = local @ everyone.T / 0.07
        labels = torch.arange(4) + 4 * rank
        torch.nn.functional.cross_entropy(logits, labels).backward()
        opt.step()

    return step


def fsdp2_lora() -> Callable[[], object]:
    """FSDP2 fine-tuning with LoRA adapters, as torchtune shards it: each block's base
    weights frozen (requires_grad=False) beside trainable low-rank adapters, the
    embedding and output head tied (one parameter, sharded with the root)."""
    class LoRALinear(torch.nn.Module):
        def __init__(self, n_in: int, n_out: int) -> None:
            super().__init__()
            self.base = torch.nn.Linear(n_in, n_out)
            self.base.requires_grad_(False)
            self.a = torch.nn.Linear(n_in, 4, bias=False)
            self.b = torch.nn.Linear(4, n_out, bias=False)
            torch.nn.init.zeros_(self.b.weight)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + self.b(self.a(x)) * 2.0

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(32, 16)
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(LoRALinear(16, 16), torch.nn.GELU()) for _ in range(2))
            self.head = torch.nn.Linear(16, 32, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.embed(ids)
            for block in self.blocks:
                h = block(h)
            return self.head(h)

    model = Model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids, target = torch.randint(0, 32, (4, 8)), torch.randint(0, 32, (32,))

    def step() -> None:
        opt.zero_grad()
        logits = model(ids).flatten(0, 1)
        torch.nn.functional.cross_entropy(logits, target).backward()
        opt.step()

    return step


def fsdp1() -> Callable[[], object]:
    """FSDP1 (FullyShardedDataParallel, flat parameters) as Hugging Face Accelerate
    wraps a model: each block a unit (ModuleWrapPolicy), original parameters kept
    (``use_orig_params``), bf16 compute with fp32 reductions, AdamW."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = FullyShardedDataParallel(
        _blocks(), auto_wrap_policy=ModuleWrapPolicy({torch.nn.Sequential}),
        use_orig_params=True, device_id=torch.device("cpu"),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16,
                                       reduce_dtype=torch.float32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        model(x).float().sum().backward()
        model.clip_grad_norm_(1.0)
        opt.step()

    return step


def pp_zb_fsdp() -> Callable[[], object]:
    """Interleaved zero-bubble over ``pp``, FSDP2 on ``dp`` (4 ranks): weight gradients
    computed apart from input gradients, then reduce-scattered."""
    from torch.distributed.pipelining import ScheduleInterleavedZeroBubble

    return _pp_over_fsdp(ScheduleInterleavedZeroBubble)


# Parallelism written by hand, as Megatron-LM, DeepSpeed and research code write it:
# autograd Functions around c10d calls, gradient hooks launching async collectives.


class _CopyToRegion(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region: identity forward, the
    gradient all-reduced (on the autograd engine's thread)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class _ReduceFromRegion(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: all-reduce forward,
    identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


def _gather_seq(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))
    dist.all_gather_into_tensor(out, x.contiguous())
    return out


def _reduce_scatter_seq(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
    dist.reduce_scatter_tensor(out, x.contiguous())
    return out


class _GatherFromSequenceRegion(torch.autograd.Function):
    """Megatron's gather_from_sequence_parallel_region: all-gather along the sequence
    (dim 0) forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _gather_seq(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _reduce_scatter_seq(grad)


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    """Megatron's reduce_scatter_to_sequence_parallel_region: reduce-scatter forward,
    all-gather backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _reduce_scatter_seq(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _gather_seq(grad)


class _ScatterToSequenceRegion(torch.autograd.Function):
    """Megatron's scatter_to_sequence_parallel_region: this rank's slice of the
    sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        chunk = x.shape[0] // dist.get_world_size()
        return x[dist.get_rank() * chunk:(dist.get_rank() + 1) * chunk].contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _gather_seq(grad)


class _ColumnParallelLinear(torch.nn.Module):
    """Megatron's ColumnParallelLinear: this rank's rows of the weight; the input
    gathered from the sequence shards (sequence parallel) or copied to the region."""

    def __init__(self, n_in: int, n_out: int, sequence_parallel: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_out // dist.get_world_size(), n_in) * 0.1)
        self.bias = torch.nn.Parameter(torch.zeros(n_out // dist.get_world_size()))
        self.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (_GatherFromSequenceRegion.apply(x) if self.sequence_parallel
             else _CopyToRegion.apply(x))
        return torch.nn.functional.linear(x, self.weight, self.bias)


class _RowParallelLinear(torch.nn.Module):
    """Megatron's RowParallelLinear: this rank's columns of the weight; the partial
    outputs reduce-scattered to sequence shards or all-reduced, then the bias."""

    def __init__(self, n_in: int, n_out: int, sequence_parallel: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_out, n_in // dist.get_world_size()) * 0.1)
        self.bias = torch.nn.Parameter(torch.zeros(n_out))
        self.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(x, self.weight.t())
        out = (_ReduceScatterToSequenceRegion.apply(out) if self.sequence_parallel
               else _ReduceFromRegion.apply(out))
        return out + self.bias


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron's vocab_parallel_cross_entropy: each rank holds a slice of the
    vocabulary's logits; the max, the target's logit and the sum of exponentials are
    all-reduced (MAX, SUM, SUM); the gradient is local."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits_max = logits.max(dim=-1)[0]
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
        logits = logits - logits_max.unsqueeze(-1)
        part = logits.shape[-1]
        first = dist.get_rank() * part
        mask = (target < first) | (target >= first + part)
        local = (target - first).masked_fill(mask, 0)
        predicted = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(mask, 0.0)
        dist.all_reduce(predicted)
        exp = logits.exp()
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp)
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, local, mask)
        return torch.log(sum_exp) - predicted

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        softmax, local, mask = ctx.saved_tensors
        grad_input = softmax.clone()
        hit = 1.0 - mask.float()
        grad_input.scatter_add_(-1, local.unsqueeze(-1), -hit.unsqueeze(-1))
        return grad_input * grad.unsqueeze(-1), None


class _LinearWithAsyncComm(torch.autograd.Function):
    """Megatron's LinearWithGradAccumulationAndAsyncCommunication under sequence
    parallel: forward all-gathers the input's sequence shards; backward all-gathers
    them again async while the input gradient is computed, reduce-scatters that
    gradient async while the weight gradient is computed, and accumulates the weight
    gradient into the parameter's ``main_grad`` (gradient accumulation fusion)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        return torch.matmul(_gather_seq(x), weight.t())

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        full = x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))
        gather = dist.all_gather_into_tensor(full, x.contiguous(), async_op=True)
        grad_input = grad.matmul(weight)
        gather.wait()
        shard = grad_input.new_empty((x.shape[0], *grad_input.shape[1:]))
        scatter = dist.reduce_scatter_tensor(shard, grad_input.contiguous(), async_op=True)
        weight.main_grad.add_(grad.flatten(0, -2).t().matmul(full.flatten(0, -2)))
        scatter.wait()
        return shard, None


def megatron_async() -> Callable[[], object]:
    """Megatron-LM's overlapped tensor-parallel communication: column-parallel linears
    whose backward overlaps async all-gathers and reduce-scatters with the gradient
    GEMMs, gradients accumulated into ``main_grad`` buffers (the parameters' ``.grad``
    stays None) that an async all-reduce over the data-parallel ranks (here the
    world, after backward) averages, then SGD on ``main_grad`` by hand."""
    world = dist.get_world_size()
    dim, seq = 16, 8
    weights = [torch.nn.Parameter(torch.randn(dim // world, dim) * 0.1) for _ in range(2)]
    heads = [torch.nn.Parameter(torch.randn(dim, dim // world) * 0.1) for _ in range(2)]
    for p in (*weights, *heads):
        p.main_grad = torch.zeros_like(p)  # type: ignore[attr-defined]
    x = torch.randn(seq // world, 2, dim)

    def step() -> None:
        for p in (*weights, *heads):
            p.main_grad.zero_()  # type: ignore[attr-defined]
        h = x
        for w, head in zip(weights, heads, strict=True):
            out = torch.nn.functional.gelu(_LinearWithAsyncComm.apply(h, w))
            h = h + _ReduceScatterToSequenceRegion.apply(out.matmul(head.t()))
        h.square().mean().backward()
        for head in heads:  # the row-parallel weights' gradients, by autograd
            head.main_grad.add_(head.grad)  # type: ignore[attr-defined]
            head.grad = None
        works = [dist.all_reduce(p.main_grad, async_op=True)  # type: ignore[attr-defined]
                 for p in (*weights, *heads)]
        for work in works:
            work.wait()
        with torch.no_grad():
            for p in (*weights, *heads):
                p.sub_(p.main_grad, alpha=0.1 / world)  # type: ignore[attr-defined]

    return step


def megatron_tp() -> Callable[[], object]:
    """Megatron-LM's tensor and sequence parallel by hand: a vocabulary-parallel
    embedding, LayerNorms on sequence shards, column/row-parallel attention and MLP
    through Megatron's autograd regions (their collectives in backward on the
    autograd engine's thread), a column-parallel head, vocab-parallel cross entropy,
    AdamW."""
    world, rank = dist.get_world_size(), dist.get_rank()
    vocab, dim, seq = 32, 16, 8

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = torch.nn.LayerNorm(dim)
            self.qkv = _ColumnParallelLinear(dim, 3 * dim, True)
            self.proj = _RowParallelLinear(dim, dim, True)
            self.norm2 = torch.nn.LayerNorm(dim)
            self.fc1 = _ColumnParallelLinear(dim, 4 * dim, True)
            self.fc2 = _RowParallelLinear(4 * dim, dim, True)

        def forward(self, h: torch.Tensor) -> torch.Tensor:  # h: [seq/world, batch, dim]
            q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)
            heads = 2 // world if world <= 2 else 1
            s, b = q.shape[:2]
            q, k, v = (t.reshape(s, b * heads, -1).transpose(0, 1) for t in (q, k, v))
            att = torch.softmax(q @ k.transpose(1, 2) / 4.0, dim=-1) @ v
            h = h + self.proj(att.transpose(0, 1).reshape(s, b, -1))
            return h + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(h))))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Parameter(torch.randn(vocab // world, dim) * 0.1)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(2))
            self.head = _ColumnParallelLinear(dim, vocab, True)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            part = vocab // world
            mask = (ids < rank * part) | (ids >= (rank + 1) * part)
            local = (ids - rank * part).masked_fill(mask, 0)
            h = torch.nn.functional.embedding(local, self.embed).masked_fill(
                mask.unsqueeze(-1), 0.0)
            h = _ReduceScatterToSequenceRegion.apply(h)  # [seq/world, batch, dim]
            for block in self.blocks:
                h = block(h)
            return self.head(h)  # [seq, batch, vocab/world]

    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids, target = torch.randint(0, vocab, (seq, 2)), torch.randint(0, vocab, (seq, 2))

    def step() -> None:
        opt.zero_grad()
        loss = _VocabParallelCrossEntropy.apply(model(ids), target).mean()
        loss.backward()
        opt.step()

    return step


def zero_by_hand() -> Callable[[], object]:
    """DeepSpeed's ZeRO-2 by hand: the parameters views of one flat buffer in two
    buckets, a post-accumulate-grad hook on each copying its gradient into the
    bucket's flat gradient and, once the bucket is full, launching an async
    reduce-scatter of it during backward; the handles waited at the end of backward,
    each rank's shard of each bucket stepped by Adam, then async all-gathers of the
    updated shards into the flat buffer the parameters live on, waited before the
    next forward."""
    world, rank = dist.get_world_size(), dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16))
    params = list(model.parameters())
    buckets = [[2, 3], [0, 1]]  # backward reaches the last layer first
    sizes = [sum(params[i].numel() for i in b) for b in buckets]
    padded = [-(-n // world) * world for n in sizes]
    starts = [sum(padded[:j]) for j in range(len(buckets))]
    flat, flat_grad = torch.zeros(sum(padded)), torch.zeros(sum(padded))
    where: dict[int, tuple[int, int]] = {}  # parameter -> (bucket, offset in flat)
    for j, bucket in enumerate(buckets):
        off = starts[j]
        for i in bucket:
            n = params[i].numel()
            flat[off:off + n].copy_(params[i].detach().flatten())
            params[i].data = flat[off:off + n].view_as(params[i])
            where[i] = (j, off)
            off += n
    chunks = [n // world for n in padded]
    shards = [torch.nn.Parameter(flat[s + rank * c:s + (rank + 1) * c].clone())
              for s, c in zip(starts, chunks, strict=True)]
    opt = torch.optim.Adam(shards, lr=1e-3)
    arrived = [0] * len(buckets)
    pending: list[tuple[dist.Work, torch.Tensor, int]] = []
    gathers: list[dist.Work] = []

    def hook(p: torch.Tensor) -> None:
        j, off = where[next(i for i, q in enumerate(params) if q is p)]
        flat_grad[off:off + p.numel()].copy_(p.grad.flatten())
        p.grad = None
        arrived[j] += 1
        if arrived[j] == len(buckets[j]):
            out = torch.empty(chunks[j])
            bucket = flat_grad[starts[j]:starts[j] + padded[j]]
            pending.append((dist.reduce_scatter_tensor(out, bucket, async_op=True), out, j))

    for p in params:
        p.register_post_accumulate_grad_hook(hook)
    x = torch.randn(8, 16)

    def step() -> None:
        for work in gathers:  # the last step's parameters, before they are read
            work.wait()
        gathers.clear()
        opt.zero_grad()
        arrived[:] = [0] * len(buckets)
        model(x).sum().backward()
        for work, out, j in pending:
            work.wait()
            shards[j].grad = out.div_(world)
        pending.clear()
        opt.step()
        for j, shard in enumerate(shards):
            gathers.append(dist.all_gather_into_tensor(
                flat[starts[j]:starts[j] + padded[j]], shard.detach(), async_op=True))

    return step


class _GatheredLinear(torch.autograd.Function):
    """ZeRO-3 by hand: the weight lives as this rank's shard; forward all-gathers the
    full weight, uses it and frees it (its storage resized to nothing); backward
    gathers it again, and reduce-scatters the weight gradient back to the shard."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        full = shard.new_empty((shard.shape[0] * dist.get_world_size(), *shard.shape[1:]))
        dist.all_gather_into_tensor(full, shard)
        out = torch.nn.functional.linear(x, full)
        full.untyped_storage().resize_(0)
        ctx.save_for_backward(x, shard)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x, shard = ctx.saved_tensors
        full = shard.new_empty((shard.shape[0] * dist.get_world_size(), *shard.shape[1:]))
        work = dist.all_gather_into_tensor(full, shard, async_op=True)
        grad_weight = grad.flatten(0, -2).t().matmul(x.flatten(0, -2))
        work.wait()
        grad_input = grad.matmul(full)
        full.untyped_storage().resize_(0)
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter_tensor(grad_shard, grad_weight)
        return grad_input, grad_shard.div_(dist.get_world_size())


def zero3_by_hand() -> Callable[[], object]:
    """ZeRO-3 (fully sharded) by hand, as research code writes it before FSDP: each
    linear's weight a shard, gathered for forward and again for backward by an
    autograd Function, freed after each use by resizing its storage to nothing, the
    weight gradient reduce-scattered back; Adam on the shards."""
    world = dist.get_world_size()
    shards = [torch.nn.Parameter(torch.randn(16 // world, 16) * 0.2) for _ in range(3)]
    opt = torch.optim.Adam(shards, lr=1e-3)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        h = x
        for shard in shards:
            h = torch.relu(_GatheredLinear.apply(h, shard))
        h.sum().backward()
        opt.step()

    return step


def tp_decode() -> Callable[[], object]:
    """Tensor-parallel inference of a tiny causal LM by hand, under inference_mode:
    attention heads and MLP split column/row-wise, an all-reduce after each
    row-parallel linear, a vocab-parallel head whose logits are all-gathered; a KV
    cache written in place, a prompt prefilled and 3 tokens decoded greedily in one
    step, each next token broadcast from rank 0."""
    world = dist.get_world_size()
    vocab, dim, heads, layers, max_len = 32, 16, 4, 2, 8  # heads: 1 per rank on 4
    local_heads, head_dim = heads // world, dim // heads

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape) * 0.2

    embed = rand(vocab, dim)
    blocks = [{"qkv": rand(3 * local_heads * head_dim, dim),
               "proj": rand(dim, local_heads * head_dim),
               "fc1": rand(4 * dim // world, dim), "fc2": rand(dim, 4 * dim // world),
               "k": torch.zeros(1, local_heads, max_len, head_dim),
               "v": torch.zeros(1, local_heads, max_len, head_dim)} for _ in range(layers)]
    head = rand(vocab // world, dim)
    prompt = torch.randint(0, vocab, (1, 4))

    def forward(ids: torch.Tensor, pos: int) -> torch.Tensor:
        h = torch.nn.functional.embedding(ids, embed)
        n = ids.shape[1]
        for b in blocks:
            x = torch.nn.functional.layer_norm(h, (dim,))
            q, k, v = torch.nn.functional.linear(x, b["qkv"]).view(
                1, n, 3 * local_heads, head_dim).transpose(1, 2).chunk(3, dim=1)
            b["k"][:, :, pos:pos + n] = k
            b["v"][:, :, pos:pos + n] = v
            keys, values = b["k"][:, :, :pos + n], b["v"][:, :, :pos + n]
            att = torch.nn.functional.scaled_dot_product_attention(
                q, keys, values, is_causal=n > 1)
            out = torch.nn.functional.linear(att.transpose(1, 2).reshape(1, n, -1), b["proj"])
            dist.all_reduce(out)
            h = h + out
            x = torch.nn.functional.layer_norm(h, (dim,))
            out = torch.nn.functional.linear(
                torch.nn.functional.gelu(torch.nn.functional.linear(x, b["fc1"])), b["fc2"])
            dist.all_reduce(out)
            h = h + out
        local = torch.nn.functional.linear(
            torch.nn.functional.layer_norm(h[:, -1], (dim,)), head)
        logits = torch.empty(world, vocab // world)  # local: [1, vocab // world]
        dist.all_gather_into_tensor(logits, local)
        return logits.reshape(1, vocab)

    def step() -> object:
        with torch.inference_mode():
            tokens = [prompt]
            nxt = forward(prompt, 0).argmax(-1, keepdim=True)
            pos = prompt.shape[1]
            for _ in range(3):
                dist.broadcast(nxt, 0)
                tokens.append(nxt)
                nxt = forward(nxt, pos).argmax(-1, keepdim=True)
                pos += 1
            return torch.cat(tokens, dim=1)

    return step


def _ring_exchange(send: torch.Tensor) -> torch.Tensor:
    """``send`` to the next rank of the ring, the previous rank's block back, by
    batch_isend_irecv, waited."""
    world, rank = dist.get_world_size(), dist.get_rank()
    recv = torch.empty_like(send)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
           dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return recv


class _RingAttention(torch.autograd.Function):
    """Ring attention by hand: K/V blocks go round the ring, each hop's partial
    attention merged by online softmax (running max and sum); backward recomputes
    each hop's probabilities from the saved log-sum-exp, the K/V gradients travelling
    round the ring with their blocks and arriving home after the last hop."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        world, scale = dist.get_world_size(), q.shape[-1] ** -0.5
        m = torch.full(q.shape[:-1], float("-inf"))
        s_sum, acc = torch.zeros(q.shape[:-1]), torch.zeros_like(q)
        kv = torch.stack([k, v])
        for hop in range(world):
            nxt = _ring_exchange(kv) if hop < world - 1 else kv
            scores = q @ kv[0].transpose(-1, -2) * scale
            m_new = torch.maximum(m, scores.amax(-1))
            p = torch.exp(scores - m_new.unsqueeze(-1))
            corr = torch.exp(m - m_new)
            s_sum = s_sum * corr + p.sum(-1)
            acc = acc * corr.unsqueeze(-1) + p @ kv[1]
            m, kv = m_new, nxt
        out = acc / s_sum.unsqueeze(-1)
        ctx.save_for_backward(q, k, v, out, m + torch.log(s_sum))
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        world, scale = dist.get_world_size(), q.shape[-1] ** -0.5
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        kv, dkv = torch.stack([k, v]), torch.zeros(2, *k.shape)
        for hop in range(world):
            scores = q @ kv[0].transpose(-1, -2) * scale
            p = torch.exp(scores - lse.unsqueeze(-1))
            ds = p * (dout @ kv[1].transpose(-1, -2) - delta)
            dq += ds @ kv[0] * scale
            dkv = dkv + torch.stack([ds.transpose(-1, -2) @ q * scale,
                                     p.transpose(-1, -2) @ dout])
            if hop < world - 1:
                kv = _ring_exchange(kv)
            dkv = _ring_exchange(dkv)  # after the last hop: home
        return dq, dkv[0], dkv[1]


def ring_by_hand() -> Callable[[], object]:
    """Context parallel by hand (ring attention): each rank holds a slice of the
    sequence, projects its Q/K/V, attends over every rank's K/V passed round the ring
    (batch_isend_irecv), and the replicated projections' gradients are all-reduced
    by hand; SGD."""
    world = dist.get_world_size()
    qkv, proj = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)
    params = [*qkv.parameters(), *proj.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    x = torch.randn(2, 8 // world, 16)

    def step() -> None:
        opt.zero_grad()
        q, k, v = qkv(x).chunk(3, dim=-1)
        proj(_RingAttention.apply(q, k, v)).square().mean().backward()
        for p in params:
            dist.all_reduce(p.grad)
            p.grad.div_(world)
        opt.step()

    return step



def odd_collectives() -> Callable[[], object]:
    """Collectives as less common code calls them: an all-reduce on a group of
    ``dist.new_subgroups()`` (pairs of ranks on 4), a PRODUCT all-reduce, a reduce to
    the last rank (a non-zero root) and a list ``all_to_all`` (of equal chunks: gloo
    refuses uneven ones, "invalid tensor size")."""
    world, rank = dist.get_world_size(), dist.get_rank()
    sub, _ = dist.new_subgroups(group_size=max(1, world // 2))
    x = torch.full((4,), rank + 1.0)
    sent = [torch.full((3, 2), float(rank * world + j)) for j in range(world)]
    got = [torch.empty(3, 2) for _ in range(world)]

    def step() -> object:
        pair, product, reduced = x.clone(), x.clone(), x.clone()
        dist.all_reduce(pair, group=sub)
        dist.all_reduce(product, op=dist.ReduceOp.PRODUCT)
        dist.reduce(reduced, dst=world - 1)
        dist.all_to_all(got, sent)
        return pair.sum() + product.sum() + reduced.sum() + torch.cat(got).sum()

    return step

# How long rank 0 of ``late_send`` computes (sleeps) before it sends.
LATE_SEND_S = 0.05


def late_send() -> Callable[[], object]:
    """Rank 0 is busy LATE_SEND_S before it sends; rank 1 posts its recv at once and
    waits for it, no op open, before the matmul that reads it: a peer wait in rank 1's
    gap, of a known length."""
    rank = dist.get_rank()
    weight = torch.randn(32, 32)

    def step() -> object:
        if rank == 0:
            time.sleep(LATE_SEND_S)
            dist.isend(weight @ weight, 1).wait()
            return None
        buf = torch.empty(32, 32)
        dist.irecv(buf, 0).wait()
        return buf @ weight

    return step



def _hf_causal_lm(arch: str, parallel: dict[str, object], **sizes: int) -> torch.nn.Module:
    """A tiny transformers causal LM (``arch``, its default config with ``sizes``)
    loaded with transformers' own parallelism, ``DistributedConfig(**parallel)``: rank 0
    saves it from its config (no weights are downloaded), and every rank loads it with
    ``from_pretrained``, the path that applies the model's TP, FSDP2, EP and PP plans."""
    import shutil
    import tempfile

    from transformers import AutoConfig, AutoModelForCausalLM, DistributedConfig

    shared = os.path.join(tempfile.gettempdir(),
                          f"mystique-hf-{os.environ.get('MASTER_PORT', '0')}-{arch}")
    if dist.get_rank() == 0:
        config = AutoConfig.for_model(
            arch, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=64, **sizes)
        AutoModelForCausalLM.from_config(config).save_pretrained(shared)
    dist.barrier()
    model = AutoModelForCausalLM.from_pretrained(
        shared, distributed_config=DistributedConfig(**parallel), dtype=torch.float32)
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(shared, ignore_errors=True)
    return model


def _hf_train_step(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    """One AdamW step of a causal LM on ``ids`` as its own labels."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def hf_tp() -> Callable[[], object]:
    """transformers' tensor parallel: a Llama loaded with ``tp_size`` = world, its
    ``base_model_tp_plan`` on DTensor (functional all-reduces), AdamW."""
    model = _hf_causal_lm("llama", {"tp_size": dist.get_world_size()})
    return _hf_train_step(model, torch.randint(0, 256, (2, 16)))


def hf_fsdp() -> Callable[[], object]:
    """transformers' FSDP2: a Llama loaded with ``fsdp_size`` = world (its
    ``fsdp_plan``), each rank training on its own batch."""
    model = _hf_causal_lm("llama", {"fsdp_size": dist.get_world_size()})
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(
        dist.get_rank()))
    return _hf_train_step(model, ids)


def hf_ep() -> Callable[[], object]:
    """transformers' expert parallel: a Qwen3-MoE (4 experts, top 2) loaded with
    ``ep_size`` = world and no TP rules: each rank holds half the experts, and the
    routed tokens go to them and back by ``all_to_all_single`` (their counts
    exchanged first), forward and backward; AdamW."""
    world = dist.get_world_size()
    model = _hf_causal_lm("qwen3_moe", {"ep_size": world, "tp_size": world, "tp_plan": {}},
                          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          head_dim=16)
    return _hf_train_step(model, torch.randint(0, 256, (2, 16)))


def hf_pp() -> Callable[[], object]:
    """transformers' pipeline parallel, which serves generation: a Llama's layers split
    over ``pp_size`` = world stages, hidden states sent stage to stage and the logits
    (their shape first) broadcast from the last; 4 tokens decoded greedily."""
    model = _hf_causal_lm("llama", {"pp_size": dist.get_world_size()}).eval()
    prompt = torch.randint(1, 256, (2, 8))

    def step() -> torch.Tensor:
        with torch.no_grad():
            return model.generate(input_ids=prompt, max_new_tokens=4, do_sample=False,
                                  pad_token_id=0)

    return step


MODES = {"functional": functional, "tp": tensor_parallel, "fsdp2": fsdp2,
         "fsdp2_dim1": fsdp2_dim1,
         "coalesced": coalesced, "reductions": reductions, "pipeline": pipeline,
         "mesh2d": mesh2d, "fsdp2_tp": fsdp2_tp, "seqpar": seqpar, "expert": expert,
         "expert_grouped": expert_grouped,
         "rooted": rooted, "objects": objects, "vocab": vocab,
         "pipeline_mesh": pipeline_mesh, "hsdp": hsdp, "sparse": sparse_ddp,
         "stage_dp": stage_dp, "side": side_group, "hooks": compressed_ddp,
         "fsdp2_mp": fsdp2_mp, "fsdp2_noreshard": fsdp2_noreshard, "fsdp2_ac": fsdp2_ac,
         "fsdp2_accum": fsdp2_accum, "fsdp2_offload": fsdp2_offload,
         "pipeline_interleaved": pipeline_interleaved, "pipeline_izb": pipeline_izb,
         "pipeline_zbv": pipeline_zbv, "ddp_static": ddp_static, "ddp_nosync": ddp_nosync,
         "zero": zero, "dtensor": dtensor, "fsdp2_uneven": fsdp2_uneven,
         "fsdp2_prefetch": fsdp2_prefetch, "fsdp2_sac": fsdp2_sac,
         "dtensor_uneven": dtensor_uneven, "ddp_unused": ddp_unused,
         "pipeline_dualpipev": pipeline_dualpipev, "pipeline_bfs": pipeline_bfs,
         "titan_2d": titan_2d, "pp_fsdp": pp_fsdp,
         "fsdp2_mp_out": fsdp2_mp_out, "ddp_ckpt": ddp_ckpt, "ddp_join": ddp_join,
         "pipeline_losses": pipeline_losses, "dtensor_partial": dtensor_partial,
         "ddp_autocast": ddp_autocast, "zero_bucket": zero_bucket,
         "ddp_powersgd": ddp_powersgd, "hsdp_accum": hsdp_accum,
         "fsdp2_hpz": fsdp2_hpz,
         "contrastive": contrastive,
         "fsdp2_lora": fsdp2_lora, "fsdp1": fsdp1,
         "pp_zb_fsdp": pp_zb_fsdp, "compiled_ddp": compiled_ddp,
         "compiled_fsdp2": compiled_fsdp2, "compiled_tp": compiled_tp,
         "late_send": late_send, "megatron_tp": megatron_tp,
         "zero_by_hand": zero_by_hand, "tp_decode": tp_decode,
         "ring_by_hand": ring_by_hand, "odd_collectives": odd_collectives,
         "megatron_async": megatron_async, "zero3_by_hand": zero3_by_hand,
         "hf_tp": hf_tp, "hf_fsdp": hf_fsdp, "hf_ep": hf_ep, "hf_pp": hf_pp}


def _profiled(step: Callable[[], object], out_dir: str, rank: int) -> None:
    """``step`` captured as PARAM's, HTA's and torchtitan's recipes capture it: an ET
    observer handed to a profiler whose schedule repeats (wait 1, warm-up 1, active 1,
    two cycles), ``tensorboard_trace_handler`` writing each cycle's Kineto trace per
    rank, the observer every active step into ``et_rank<N>.json``."""
    os.makedirs(out_dir, exist_ok=True)
    observer = ExecutionTraceObserver().register_callback(
        os.path.join(out_dir, f"et_rank{rank}.json"))
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=1, warmup=1, active=1, repeat=2),
                 on_trace_ready=tensorboard_trace_handler(out_dir),
                 execution_trace_observer=observer) as prof:
        for _ in range(6):
            step()
            prof.step()


def main(out_dir: str, modes: list[str]) -> int:
    torch.set_num_threads(1)
    os.makedirs(out_dir, exist_ok=True)  # the observer writes nothing into a missing one
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kineto = modes[:1] == ["--kineto"]
    profiled = modes[:1] == ["--profiled"]
    for mode in modes[1:] if kineto or profiled else modes:
        torch.manual_seed(0)
        step = MODES[mode]()
        if profiled:
            _profiled(step, os.path.join(out_dir, mode), rank)
            continue
        if kineto:  # every rank runs the same steps: the collectives meet
            capture(step, out_dir, name=f"{mode}-rank-{rank}", warmup=2,
                    timing_iters=int(os.environ.get("WORKLOAD_TIMING_ITERS", "2")),
                    profile_steps=int(os.environ.get("WORKLOAD_PROFILE_STEPS", "3")))
            continue
        for _ in range(2):  # warm up: lazy initialisation is not part of the step
            step()
        observer = ExecutionTraceObserver()
        observer.register_callback(os.path.join(out_dir, f"{mode}-rank-{rank}.json"))
        observer.start()
        step()
        observer.stop()
        observer.unregister_callback()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1], sys.argv[2:])
    # As the benchmark's ranks do (harness/dist.py): gloo's threads, kept alive by the
    # observer after destroy_process_group, aborted the interpreter's teardown now and
    # then ("terminate called without an active exception"): the traces are written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
