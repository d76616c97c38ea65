"""Launching multi-rank workloads and their benchmarks under torchrun, for the tests
and the bench scripts alike.

Each launch starts from this process's environment without the launcher's own
variables: a test or bench run from inside another torchrun job would otherwise hand
its rank and rendezvous to the children, and they would join the outer job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# What torchrun sets for its workers (and a worker's child must not inherit).
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launch_env(keep_pythonpath: bool = False, **extra: str) -> dict[str, str]:
    """This process's environment for a launch: one thread per rank (the ranks share
    this machine's cores), without the launcher's variables, and without PYTHONPATH
    unless kept (a generated benchmark must run with nothing of this project on its
    path)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    for key in LAUNCHER_VARIABLES if keep_pythonpath else (*LAUNCHER_VARIABLES, "PYTHONPATH"):
        env.pop(key, None)
    return env


def torchrun_command(ranks: int, *args: str,
                     rendezvous: tuple[str, ...] = ("--standalone",)) -> list[str]:
    """``python -m torch.distributed.run`` with ``ranks`` processes running ``args``;
    by default a standalone rendezvous, on a free local port, so that concurrent
    launches never meet (``rendezvous`` gives other options: several nodes' ids)."""
    return [sys.executable, "-m", "torch.distributed.run", *rendezvous,
            "--nproc-per-node", str(ranks), *args]


def torchrun(ranks: int, *args: str, cwd: Path, timeout: float,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``args`` on ``ranks`` local processes and wait (its output captured)."""
    return subprocess.run(torchrun_command(ranks, *args), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=launch_env() if env is None else env,
                          check=False)
