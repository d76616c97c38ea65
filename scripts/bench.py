"""`make bench`: run every benchmark section (scripts/bench_*.py) and print its table.

Each section measures side by side in one run (ratios, not absolute numbers, are the
targets), because this machine is shared and noisy, and runs in a process of its own.
Pass one or more names to run only those, e.g. `python scripts/bench.py fidelity`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    sections = sorted(HERE.glob("bench_*.py"))
    wanted = set(argv)
    failed = []
    for path in sections:
        name = path.stem.removeprefix("bench_")
        if wanted and name not in wanted:
            continue
        print(f"\n=== {name} ({path.name}) ===", flush=True)
        start = time.perf_counter()
        # A fresh process per section: one section's threads, allocator state and
        # imports (gloo, transformers) must not bias another's timings.
        proc = subprocess.run([sys.executable, str(path)], check=False)
        if proc.returncode != 0:
            print(f"section {name} failed (exit {proc.returncode})", flush=True)
            failed.append(name)
        print(f"--- {name}: {time.perf_counter() - start:.1f} s", flush=True)
    if failed:
        print(f"\nfailed sections: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
