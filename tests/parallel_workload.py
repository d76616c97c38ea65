"""Parallel training steps as production code writes them, one ET per rank and mode.

Run under torchrun (gloo on CPU): ``python -m torch.distributed.run --standalone
--nproc-per-node 2 tests/parallel_workload.py OUT_DIR MODE...``. Modes:

* ``functional``: torch.distributed._functional_collectives (all_reduce, all_gather,
  reduce_scatter, wait_tensor), as compiled and DTensor code issues them;
* ``tp``: tensor parallel on DTensor (ColwiseParallel + RowwiseParallel MLP, SGD);
* ``fsdp2``: fully_shard on two blocks and the root, AdamW (fsdp:: copy-in/out ops);
* ``mesh2d``: a 2 x 2 device mesh (dp x tp, 4 ranks): collectives on each mesh
  dimension's subgroup, functional and c10d, as 2-D parallel training issues them.

Writes ``OUT_DIR/<mode>-rank-<N>.json``. With ``--kineto`` before the modes, each rank
captures its step as :func:`mystique_gen.tools.capture.capture` captures one process:
``<mode>-rank-<N>.et.json`` with the Kineto trace of the same step
(``.kineto.json``, linked by rf_id, recording the rank in ``distributedInfo``), three
steps profiled without the observer (``.profile.json``) and the ``.step.json`` sidecar.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
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


def tensor_parallel() -> Callable[[], object]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    return step


def fsdp2() -> Callable[[], object]:
    model = torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.LayerNorm(16), torch.nn.Linear(16, 32), torch.nn.GELU(),
        torch.nn.Linear(32, 16)) for _ in range(2)])
    for block in model:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    return step


def mesh2d() -> Callable[[], object]:
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("dp", "tp"))
    x = torch.ones(8) * (dist.get_rank() + 1)
    weight = torch.randn(8, 8)

    def step() -> object:
        y = fc.wait_tensor(fc.all_reduce(x @ weight, "sum", mesh["tp"]))
        z = fc.wait_tensor(fc.all_gather_tensor(y, 0, mesh["dp"]))
        dist.all_reduce(z, group=mesh.get_group("dp"))
        return (z * 2).sum()

    return step


MODES = {"functional": functional, "tp": tensor_parallel, "fsdp2": fsdp2, "mesh2d": mesh2d}


def main(out_dir: str, modes: list[str]) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kineto = modes[:1] == ["--kineto"]
    for mode in modes[1:] if kineto else modes:
        torch.manual_seed(0)
        step = MODES[mode]()
        if kineto:  # every rank runs the same steps: the collectives meet
            capture(step, out_dir, name=f"{mode}-rank-{rank}", warmup=2, timing_iters=2,
                    profile_steps=3)
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
    sys.exit(main(sys.argv[1], sys.argv[2:]))
