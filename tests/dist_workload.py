"""A small distributed training step, captured as one execution trace per rank.

Run under torchrun (gloo on CPU): ``python -m torch.distributed.run --nproc-per-node 2
tests/dist_workload.py OUT_DIR``. Without a launcher it runs as a one-rank job (a
HashStore group), as DDP on one GPU would. Writes ``OUT_DIR/rank-<N>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ExecutionTraceObserver


def main(out_dir: str) -> int:
    torch.set_num_threads(1)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    sub = dist.new_group(list(range(world)))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 8)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        y = torch.full((6,), float(rank + 1))
        dist.all_reduce(y)
        dist.broadcast(y, 0)
        gathered = [torch.empty(6) for _ in range(world)]
        dist.all_gather(gathered, y)
        part = torch.empty(3)
        dist.reduce_scatter_tensor(part, torch.ones(3 * world))
        exchanged = torch.empty(2 * world)
        dist.all_to_all_single(exchanged, torch.arange(2.0 * world))
        work = dist.all_reduce(y, group=sub, async_op=True)
        x.sum()  # compute that overlaps the async collective
        work.wait()
        dist.barrier()

    for _ in range(2):  # warm up: lazy initialisation is not part of the step
        step()
    times = []
    for _ in range(int(os.environ.get("DIST_WORKLOAD_TIMED", "0"))):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1000.0)
    if times:  # eager step times, for scripts/bench_distributed.py
        with open(os.path.join(out_dir, f"rank-{rank}.step.json"), "w") as f:
            json.dump(times, f)
    observer = ExecutionTraceObserver()
    observer.register_callback(os.path.join(out_dir, f"rank-{rank}.json"))
    observer.start()
    step()
    observer.stop()
    observer.unregister_callback()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1])
    # As the benchmark's ranks do (harness/dist.py): gloo's threads, kept alive by the
    # observer after destroy_process_group, aborted the interpreter's teardown now and
    # then ("terminate called without an active exception"): the traces are written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
