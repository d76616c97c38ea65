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

Writes ``OUT_DIR/<mode>-rank-<N>.json``. With ``--kineto`` before the modes, each rank
captures its step as :func:`mystique_gen.tools.capture.capture` captures one process:
``<mode>-rank-<N>.et.json`` with the Kineto trace of the same step
(``.kineto.json``, linked by rf_id, recording the rank in ``distributedInfo``), three
steps profiled without the observer (``.profile.json``) and the ``.step.json`` sidecar
(eager step times over ``WORKLOAD_TIMING_ITERS`` steps, default 2: tests need the
trace, the bench the time; ``WORKLOAD_PROFILE_STEPS`` profiled steps, default 3).
"""

from __future__ import annotations

import os
import sys
import threading
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
from torch.profiler import ExecutionTraceObserver

from mystique_gen.tools.capture import capture


def functional() -> Callable[[], object]:
    x = torch.ones(8) * (dist.get_rank() + 1)

    def step() -> object:
        y = fc.all_reduce(x, "sum", dist.group.WORLD)
        z = fc.all_gather_tensor(y, 0, dist.group.WORLD)
        w = fc.reduce_scatter_tensor(z, "sum", 0, dist.group.WORLD)
        return (fc.wait_tensor(w) * 2).sum()

    return step


def _sgd_step(model: torch.nn.Module, inputs: torch.Tensor) -> Callable[[], None]:
    """One SGD training step of ``model`` on ``inputs`` (the loss: its output's sum)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        opt.zero_grad()
        model(inputs).sum().backward()
        opt.step()

    return step


def tensor_parallel() -> Callable[[], object]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return _sgd_step(model, torch.randn(4, 16))


def fsdp2(shard_placement_fn: Callable[[torch.nn.Parameter], Shard] | None = None
          ) -> Callable[[], object]:
    model = torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.LayerNorm(16), torch.nn.Linear(16, 32), torch.nn.GELU(),
        torch.nn.Linear(32, 16)) for _ in range(2)])
    for block in model:
        fully_shard(block, shard_placement_fn=shard_placement_fn)
    fully_shard(model, shard_placement_fn=shard_placement_fn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    return step


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


def pipeline() -> Callable[[], object]:
    rank, world = dist.get_rank(), dist.get_world_size()
    stage_module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=4,
                            loss_fn=lambda y, target: ((y - target) ** 2).mean())
    opt = torch.optim.SGD(stage_module.parameters(), lr=0.1)
    x, target = torch.randn(4, 16), torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=target, losses=[])
        opt.step()

    return step


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

    def step() -> None:
        opt.zero_grad()
        if stage_index == 0:
            schedule.step(x)
        else:
            schedule.step(target=target, losses=[])
        opt.step()

    return step


def hsdp() -> Callable[[], object]:
    """HSDP: FSDP2 on a 2 x 2 (replicate, shard) mesh: gathers and reduce-scatters on
    the shard groups, an all-reduce over the replicas."""
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("replicate", "shard"))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    return step


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


def expert() -> Callable[[], object]:
    world, rank = dist.get_world_size(), dist.get_rank()
    per_rank, dim = 2, 16
    experts = torch.nn.ModuleList(torch.nn.Sequential(
        torch.nn.Linear(dim, 32), torch.nn.GELU(), torch.nn.Linear(32, dim))
        for _ in range(per_rank))
    gate = torch.nn.Linear(dim, per_rank * world)
    opt = torch.optim.AdamW([*experts.parameters(), *gate.parameters()], lr=1e-3)
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
        per_expert = received.view(world, per_rank).tolist()
        got = _AllToAll.apply(tokens, [sum(row) for row in per_expert], send)
        outputs, start = [], 0
        for row in per_expert:
            for e, n in enumerate(row):
                outputs.append(experts[e](got[start:start + n]))
                start += n
        back = _AllToAll.apply(torch.cat(outputs), send, [sum(r) for r in per_expert])
        combined = torch.empty_like(back)
        combined[order] = back
        (combined.view(-1, 2, dim) * weights.unsqueeze(-1)).sum(1).pow(2).mean().backward()
        opt.step()

    return step


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


MODES = {"functional": functional, "tp": tensor_parallel, "fsdp2": fsdp2,
         "fsdp2_dim1": fsdp2_dim1,
         "coalesced": coalesced, "reductions": reductions, "pipeline": pipeline,
         "mesh2d": mesh2d, "fsdp2_tp": fsdp2_tp, "seqpar": seqpar, "expert": expert,
         "rooted": rooted, "objects": objects, "vocab": vocab,
         "pipeline_mesh": pipeline_mesh, "hsdp": hsdp, "sparse": sparse_ddp,
         "stage_dp": stage_dp, "side": side_group, "hooks": compressed_ddp}


def main(out_dir: str, modes: list[str]) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kineto = modes[:1] == ["--kineto"]
    for mode in modes[1:] if kineto else modes:
        torch.manual_seed(0)
        step = MODES[mode]()
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
