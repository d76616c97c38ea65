"""`make bench` section: random programs with collectives, and random models under
random parallel strategies, on gloo ranks under torchrun.

``scripts/features_random.py`` draws programs nobody wrote; here they also talk to
each other (``rand_<seed>``), or run as the blocks of a model wrapped by DDP, FSDP2,
tensor parallel or a pipeline schedule (``strat_<seed>``,
``scripts/random_strategies.py``). Every rank draws the same program from a seed (the
same collectives in the same order; its data inputs are then shifted by rank, so that
counts and selections differ between ranks as data-parallel batches make them), with
collectives among its ops: all-reduces (sum, max, asynchronous and waited later,
functional), all-gathers, reduce-scatters, broadcasts, all-to-alls at counts exchanged
and read back with ``.tolist()``, and a ring of sends and receives. Each rank records
its third step with a plain ``ExecutionTraceObserver``; one benchmark is generated from
every rank's trace and replayed under torchrun (``--warmup 0 --iters 3 --reset-inputs
off --et``, with ``mystique_gen`` unimportable). Compared per rank: the top-level ops
by overload with their tensor arguments' shapes and strides (as the features section
compares them) and the collective sequence (``passes/comms.collective_sequence``),
and no input the replay writes may end NaN or inf.

Outcomes: ``capture error`` (the program does not run here), ``gen error``, ``run
error``, ``op mismatch``, ``shape mismatch``, ``layout mismatch``, ``collectives``
(another sequence), ``nonfinite``, ``pass``.

Environment: RANDOM_PARALLEL=N programs of each kind (default 12) from seed
RANDOM_PARALLEL_FROM=K (default 0), RANDOM_PARALLEL_KINDS (``collectives``,
``strategies``: ``scripts/random_strategies.py``'s models under DDP, FSDP2, tensor
parallel, pipelines and on 4 ranks 2-D meshes; both by default), RANDOM_PARALLEL_RANKS
(default 2), RANDOM_PARALLEL_TIMEOUT=seconds per launch (default 300),
RANDOM_PARALLEL_KINETO=1 (each rank records as other tools do, the ET observer inside
a profiler session, and the benchmark is generated with both ranks' Kineto traces).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(SCRIPTS))

from bench_features import last_error_line, mismatch  # noqa: E402
from features_random import program  # noqa: E402
from random_strategies import strategy_program  # noqa: E402

from mystique_gen.passes.comms import collective_sequence  # noqa: E402
from mystique_gen.sources.et import load_trace  # noqa: E402
from tests.conftest import record_et  # noqa: E402
from tests.launch import launch_env, torchrun  # noqa: E402

# each kind of program, and the prefix of its names
KINDS = {"collectives": "rand", "strategies": "strat"}
OUTCOMES = ("capture error", "gen error", "run error", "op mismatch", "shape mismatch",
            "layout mismatch", "collectives", "nonfinite", "pass")


def worker(out_dir: str, kind: str, seed: int) -> int:
    """One rank: build the program (``kind``: a collective program, or a model under
    a strategy), run it twice, record the third step."""
    torch.set_num_threads(1)
    # (a rank whose program raised leaves the others waiting: a minute, not gloo's 30)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if kind == "strategies":
        described, step = strategy_program(seed, rank, world)
        if rank == 0:
            (Path(out_dir) / "described.txt").write_text(described)
    else:
        step = program(seed, collectives=True, rank=rank)
    for _ in range(2):
        step()
    et = Path(out_dir) / f"rank-{rank}.json"
    if os.environ.get("RANDOM_PARALLEL_KINETO") == "1":
        _profiled(step, et, Path(out_dir) / f"rank-{rank}.kineto.json")
    else:
        record_et(step, et)
    dist.destroy_process_group()
    return 0


def _profiled(step: Callable[[], object], et: Path, kineto: Path) -> None:
    """``step`` recorded as other tools record it: the ET observer handed to a profiler
    whose schedule warms up one step and records the next, its Kineto trace exported
    from the same session."""
    observer = ExecutionTraceObserver().register_callback(str(et))
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=0, warmup=1, active=1),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(kineto)),
                 execution_trace_observer=observer) as prof:
        for _ in range(2):
            step()
            prof.step()


def _raised(text: str) -> str:
    """The error a rank raised (the first: the others' follow from it), else the last
    line that names one."""
    raised = [line for line in text.splitlines()
              if line.startswith("[rank") and "Error:" in line]
    return raised[0][:160] if raised else last_error_line(text)


def run_one(kind: str, seed: int, ranks: int, work: Path, timeout: float
            ) -> tuple[str, str]:
    env = launch_env(keep_pythonpath=True)
    proc = torchrun(ranks, str(Path(__file__).resolve()), "--worker", str(work), kind,
                    str(seed), cwd=work, timeout=timeout, env=env)
    ets = [work / f"rank-{r}.json" for r in range(ranks)]
    if proc.returncode or not all(et.exists() for et in ets):
        return "capture error", _raised(proc.stderr)
    bench = work / "bench.py"
    kinetos = [work / f"rank-{r}.kineto.json" for r in range(ranks)]
    linked = ["--kineto", *map(str, kinetos)] if all(k.exists() for k in kinetos) else []
    proc = subprocess.run([sys.executable, "-m", "mystique_gen", *map(str, ets), *linked,
                           "-o", str(bench)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    if proc.returncode:
        return "gen error", last_error_line(proc.stderr)
    proc = torchrun(ranks, str(bench), "--device", "cpu", "--warmup", "0", "--iters", "3",
                    "--reset-inputs", "off", "--json", "--et", str(work / "replay.json"),
                    cwd=work, timeout=timeout, env=launch_env())
    if proc.returncode:
        return "run error", _raised(proc.stderr)
    for rank, et in enumerate(ets):
        replay = work / f"replay.rank{rank}.json"
        found = mismatch(et, replay)
        if found is not None:
            return found[0], f"rank {rank}: {found[1]}"[:160]
        if collective_sequence(load_trace(replay)) != collective_sequence(load_trace(et)):
            return "collectives", f"rank {rank} issues another sequence"
    result = json.loads(next(line for line in reversed(proc.stdout.strip().splitlines())
                             if line.startswith("{")))
    if result.get("nonfinite_inputs"):
        return "nonfinite", str(result["nonfinite_inputs"])[:160]
    described = work / "described.txt"
    return "pass", described.read_text() if described.exists() else ""


def main() -> int:
    first = int(os.environ.get("RANDOM_PARALLEL_FROM", "0"))
    count = int(os.environ.get("RANDOM_PARALLEL", "12"))
    ranks = int(os.environ.get("RANDOM_PARALLEL_RANKS", "2"))
    timeout = float(os.environ.get("RANDOM_PARALLEL_TIMEOUT", "300"))
    kinds = os.environ.get("RANDOM_PARALLEL_KINDS", ",".join(KINDS)).split(",")
    totals: Counter = Counter()
    print(f"{'program':16s} {'outcome':16s} {'s':>5s}  detail", flush=True)
    with tempfile.TemporaryDirectory(prefix="random-parallel-") as tmp:
        for kind in kinds:
            for seed in range(first, first + count):
                name = f"{KINDS[kind]}_{seed}"
                work = Path(tmp) / name
                work.mkdir()
                start = time.perf_counter()
                try:
                    outcome, detail = run_one(kind, seed, ranks, work, timeout)
                except subprocess.TimeoutExpired:
                    outcome, detail = "run error", f"timed out after {timeout:.0f} s"
                totals[outcome] += 1
                print(f"{name:16s} {outcome:16s} {time.perf_counter() - start:5.0f}  "
                      f"{detail}", flush=True)
    print(f"totals over {count * len(kinds)} programs on {ranks} ranks: "
          + ", ".join(f"{o} {totals[o]}" for o in OUTCOMES))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        code = worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # (gloo's threads may abort the interpreter's teardown)
    sys.exit(main())
