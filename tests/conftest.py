from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = ROOT.parent / "shared" / "traces"

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
