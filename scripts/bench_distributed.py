"""`make bench` section: a 4-rank gloo job on CPU, eager vs its generated benchmark.

Captures tests/dist_workload.py (DDP step + all_reduce, broadcast, all_gather,
reduce_scatter, all_to_all, an async all_reduce on a new_group, barrier) under
torchrun with 4 ranks, generates ONE benchmark from the 4 rank traces, replays it
under torchrun with 4 ranks and prints, side by side: the eager step time (slowest
rank per step, median), the replay's iteration time (same definition), their ratio,
and whether every rank's replay trace has its original's collectives, in order, with
the same sizes. Run alone: `python scripts/bench.py distributed` (DIST_RANKS=N).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mystique_gen.cli import main as cli_main  # noqa: E402
from mystique_gen.passes.comms import collective_sequence  # noqa: E402
from mystique_gen.sources.et import load_trace  # noqa: E402
from tests.launch import launch_env, torchrun  # noqa: E402

RANKS = int(os.environ.get("DIST_RANKS", "4"))
TIMED = 10


def _torchrun(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return torchrun(RANKS, *args, cwd=cwd, timeout=900, env=env)


def main() -> int:
    env = launch_env(DIST_WORKLOAD_TIMED=str(TIMED))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        proc = _torchrun(str(ROOT / "tests" / "dist_workload.py"), str(out), cwd=out, env=env)
        if proc.returncode:
            print(proc.stderr[-2000:])
            return 1
        per_rank = [json.loads((out / f"rank-{r}.step.json").read_text()) for r in range(RANKS)]
        eager = statistics.median(max(col) for col in zip(*per_rank, strict=True))
        traces = [str(out / f"rank-{r}.json") for r in range(RANKS)]
        bench = out / "bench.py"
        if cli_main([*traces, "-o", str(bench)]):
            return 1
        proc = _torchrun(str(bench), "--device", "cpu", "--warmup", "3", "--iters", str(TIMED),
                         "--json", "--et", str(out / "replay.json"), cwd=out, env=env)
        if proc.returncode:
            print(proc.stderr[-2000:])
            return 1
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        same = [collective_sequence(load_trace(out / f"rank-{r}.json"))
                == collective_sequence(load_trace(out / f"replay.rank{r}.json"))
                for r in range(RANKS)]
        count = len(collective_sequence(load_trace(out / "rank-0.json")))
    replay = result["iter_ms_median"]
    print(f"{'ranks':>5} {'eager ms':>10} {'replay ms':>10} {'ratio':>7}  collectives/rank  "
          "same order+sizes")
    print(f"{RANKS:>5} {eager:>10.3f} {replay:>10.3f} {replay / eager:>7.2f}  {count:>16}  "
          f"{sum(same)}/{RANKS} ranks")
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
