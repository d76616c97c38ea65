"""Rebuild the golden benchmarks: generated/ from examples/traces/, and tests/golden/
from the small deterministic traces of tests/golden_cases.py (one per backend).

The command recorded in each file is the one a user would type, so regenerating is
byte-for-byte reproducible (tests/test_golden.py checks it).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mystique_gen.cli import main as cli_main  # noqa: E402
from tests.golden_cases import CASES, GOLDEN, SHARED, render_case  # noqa: E402

TRACES = ROOT / "examples" / "traces"
SUFFIX = ".et.json.gz"


def golden_pairs() -> list[tuple[str, str]]:
    """(trace, output) paths relative to the repository root."""
    return [
        (f"examples/traces/{p.name}", f"generated/{p.name[: -len(SUFFIX)]}.py")
        for p in sorted(TRACES.glob(f"*{SUFFIX}"))
    ]


def main() -> int:
    os.chdir(ROOT)
    for trace, out in golden_pairs():
        rc = cli_main([trace, "-o", out])
        if rc:
            return rc
    GOLDEN.mkdir(exist_ok=True)
    for name, case in CASES.items():
        if case.needs_shared and not SHARED.is_dir():
            print(f"skipped tests/golden/{name}.py: {SHARED} is absent", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory() as work:
            (GOLDEN / f"{name}.py").write_text(render_case(name, Path(work)))
        print(f"wrote tests/golden/{name}.py", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
