from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch.profiler import ExecutionTraceObserver

from mystique_gen.passes.comms import collective_sequence
from mystique_gen.sources.et import load_trace
from mystique_gen.tools.compare import op_multiset

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = ROOT.parent / "shared" / "traces"

def record_et(step, path: Path) -> Path:
    """One call of ``step`` under a plain ExecutionTraceObserver (no Kineto, no
    recorded ranges), as most users capture: the trace written to ``path``."""
    observer = ExecutionTraceObserver().register_callback(str(path))
    observer.start()
    try:
        step()
    finally:
        observer.stop()
        observer.unregister_callback()
    return path


# Run a generated benchmark with mystique_gen made unimportable: the file must stand alone.
_RUNNER = (
    "import runpy, sys; sys.modules['mystique_gen'] = None; "
    "path = sys.argv[1]; sys.argv = sys.argv[1:]; runpy.run_path(path, run_name='__main__')"
)


def run_benchmark(path: Path, *args: str, timeout: float = 900,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    full_env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-c", _RUNNER, str(path), *args],
        capture_output=True, text=True, timeout=timeout, cwd=path.parent, env=full_env,
    )


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"shared traces not found at {SHARED_TRACES} (they sit beside the repo)")
    return SHARED_TRACES


def assert_rank_replays(original: Path, replay: Path) -> None:
    """One rank's replay against its original (issue 13): the same collectives (c10d
    and _c10d_functional) in the same order, with the same sizes and groups, and the
    same top-level ops. Neither side counts what gloo ran for a collective (its worker
    threads' copies, the chunk and copy_ that finish a reduce-scatter, the empty
    tensor a barrier is given): each collective runs those itself. Waits are compared
    in the sequence, not as ops: how many a wait on an AsyncCollectiveTensor records
    at top level depends on where the observer nested a gloo scope, run to run."""
    traces = [load_trace(original), load_trace(replay)]
    recorded = collective_sequence(traces[0])
    assert recorded and collective_sequence(traces[1]) == recorded, replay.name
    ops = [op_multiset(trace, by_overload=True) for trace in traces]
    for counts in ops:
        counts.pop("_c10d_functional::wait_tensor.default", None)
    assert ops[1] == ops[0], (replay.name, ops[0] - ops[1], ops[1] - ops[0])

