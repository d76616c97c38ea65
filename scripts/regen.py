"""Rebuild generated/ from examples/traces/: one benchmark per shipped example trace.

The command recorded in each file is the one a user would type from the repository
root, so regenerating is byte-for-byte reproducible (tests/test_golden.py checks it).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "examples" / "traces"
SUFFIX = ".et.json.gz"


def golden_pairs() -> list[tuple[str, str]]:
    """(trace, output) paths relative to the repository root."""
    return [
        (f"examples/traces/{p.name}", f"generated/{p.name[: -len(SUFFIX)]}.py")
        for p in sorted(TRACES.glob(f"*{SUFFIX}"))
    ]


def main() -> int:
    import os

    from mystique_gen.cli import main as cli_main

    os.chdir(ROOT)
    for trace, out in golden_pairs():
        rc = cli_main([trace, "-o", out])
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
