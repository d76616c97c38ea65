"""`make bench`: run every benchmark section (scripts/bench_*.py) and print its table.

Each section measures side by side in one run (ratios, not absolute numbers, are the
targets), because this machine is shared and noisy. Sections:
pass one or more names to run only those, e.g. `python scripts/bench.py fidelity`.
"""

from __future__ import annotations

import runpy
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
        saved, sys.argv = sys.argv, [str(path)]  # a section parses its own (empty) argv
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                failed.append(name)
        except Exception as exc:  # report and go on: one broken section must not hide the rest
            print(f"section {name} failed: {type(exc).__name__}: {exc}", flush=True)
            failed.append(name)
        finally:
            sys.argv = saved
        print(f"--- {name}: {time.perf_counter() - start:.1f} s", flush=True)
    if failed:
        print(f"\nfailed sections: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
