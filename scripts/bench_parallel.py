"""`make bench` section: parallel training steps, eager against replay, under torchrun.

For each mode of tests/parallel_workload.py (tensor parallel on DTensor, FSDP2, a
2-stage 1F1B pipeline, coalesced collectives, and transformers' own tensor, FSDP2 and
expert parallel plans, on 2 gloo ranks; collectives on a 2 x 2 device mesh, and FSDP2
+ tensor parallel on that mesh, on 4), every rank captures its step as
``mystique_gen.tools.capture`` does (ET + Kineto + profile-only steps + the measured
eager step time), one benchmark is generated with every rank's Kineto trace
(``--kineto`` per rank), and it runs under torchrun with host gaps off and
``recorded``. Eager = the slowest rank's median
captured step; replay = the benchmark's ``iter_ms_median`` (each iteration timed to
its slowest rank); error = replay / eager - 1. ``collectives``: ranks whose replay
issues the recorded collectives in order with the recorded sizes (``--et``), of all
trials. Eager steps are timed over 20 steps per rank and gaps taken from 5 profiled
steps; each trial captures, generates and replays afresh (PARALLEL_TRIALS, default 3),
and the table prints the median error with its range. Reported, not judged.
Run alone: `python scripts/bench.py parallel` (PARALLEL_ONLY=tp,fsdp2).
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

from mystique_gen.passes.comms import collective_sequence  # noqa: E402
from mystique_gen.sources.et import load_trace  # noqa: E402
from tests.launch import launch_env, torchrun  # noqa: E402

WORKLOAD = ROOT / "tests" / "parallel_workload.py"
CASES = {"tp": 2, "fsdp2": 2, "pipeline": 2, "coalesced": 2, "mesh2d": 4, "fsdp2_tp": 4,
         "hf_tp": 2, "hf_fsdp": 2, "hf_ep": 2}


def _env() -> dict[str, str]:
    return launch_env(keep_pythonpath=True, WORKLOAD_TIMING_ITERS="20",
                      WORKLOAD_PROFILE_STEPS="5")


def _torchrun(ranks: int, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return torchrun(ranks, *args, cwd=cwd, timeout=900, env=_env())


def _last_json(text: str) -> dict[str, object]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line in the benchmark's output")


def run_case(mode: str, ranks: int, work: Path) -> dict[str, object]:
    out = work / mode
    out.mkdir()
    proc = _torchrun(ranks, str(WORKLOAD), str(out), "--kineto", mode, cwd=out)
    if proc.returncode:
        raise RuntimeError(f"capture: {proc.stderr.strip().splitlines()[-1:]}")
    ets = [out / f"{mode}-rank-{r}.et.json" for r in range(ranks)]
    kinetos = [out / f"{mode}-rank-{r}.kineto.json" for r in range(ranks)]
    eager = max(json.loads((out / f"{mode}-rank-{r}.step.json").read_text())["step_ms_median"]
                for r in range(ranks))
    bench = out / "bench.py"
    gen = subprocess.run([sys.executable, "-m", "mystique_gen", *map(str, ets), "--kineto",
                          *map(str, kinetos), "-o", str(bench)], capture_output=True,
                         text=True, cwd=out, env=_env())
    if gen.returncode:
        raise RuntimeError(f"generate: {gen.stderr.strip().splitlines()[-1:]}")
    row: dict[str, object] = {"mode": mode, "ranks": ranks, "eager_ms": eager}
    for gaps in ("off", "recorded"):
        run = _torchrun(ranks, str(bench), "--device", "cpu", "--warmup", "2", "--iters",
                        "10", "--json", "--host-gaps", gaps, "--et",
                        str(out / f"replay-{gaps}.json"), cwd=out)
        if run.returncode:
            raise RuntimeError(f"replay ({gaps}): {run.stderr.strip().splitlines()[-1:]}")
        ms = float(_last_json(run.stdout)["iter_ms_median"])  # type: ignore[arg-type]
        row[f"{gaps}_ms"], row[f"{gaps}_error"] = ms, ms / eager - 1
    row["matched"] = sum(
        collective_sequence(load_trace(out / f"replay-off.rank{r}.json"))
        == collective_sequence(load_trace(et)) for r, et in enumerate(ets))
    return row


def _median(rows: list[dict[str, object]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)  # type: ignore[arg-type]


def _cell(values: list[float]) -> str:
    """Median error with its range over the trials, in percent."""
    if len(values) == 1:
        return f"{values[0] * 100:+.1f}%"
    return (f"{statistics.median(values) * 100:+.1f}% "
            f"[{min(values) * 100:+.0f},{max(values) * 100:+.0f}]")


def main() -> int:
    only = [m for m in os.environ.get("PARALLEL_ONLY", "").split(",") if m]
    trials = max(1, int(os.environ.get("PARALLEL_TRIALS", "3")))
    print(f"{'mode':<10} {'ranks':>5} {'eager ms':>9} {'off ms':>8} {'err off':>19} "
          f"{'gaps ms':>8} {'err gaps':>19} {'collectives':>11}", flush=True)
    failed = []
    with tempfile.TemporaryDirectory(prefix="parallel-") as tmp:
        for mode, ranks in CASES.items():
            if only and mode not in only:
                continue
            rows = []
            try:
                for t in range(trials):
                    work = Path(tmp) / f"trial{t}"
                    work.mkdir(exist_ok=True)
                    rows.append(run_case(mode, ranks, work))
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                failed.append(mode)
                print(f"{mode:<10} {ranks:>5} FAILED {exc}"[:200], flush=True)
                continue
            matched = sum(int(r["matched"]) for r in rows)  # type: ignore[call-overload]
            print(f"{mode:<10} {ranks:>5} {_median(rows, 'eager_ms'):>9.3f} "
                  f"{_median(rows, 'off_ms'):>8.3f} "
                  f"{_cell([float(r['off_error']) for r in rows]):>19} "  # type: ignore[arg-type]
                  f"{_median(rows, 'recorded_ms'):>8.3f} "
                  f"{_cell([float(r['recorded_error']) for r in rows]):>19} "  # type: ignore[arg-type]
                  f"{matched:>7}/{ranks * trials}", flush=True)
    print(f"eager: the slowest rank's median captured step (20 steps); off/gaps: the "
          f"benchmark under torchrun, host gaps off / recorded per rank; error = replay / "
          f"eager - 1, median [range] over {trials} trials; collectives: ranks replaying "
          f"the recorded collective sequence, over all trials")
    print(f"failed: {len(failed)}" + (f" ({', '.join(failed)})" if failed else ""))
    return 0

if __name__ == "__main__":
    sys.exit(main())
