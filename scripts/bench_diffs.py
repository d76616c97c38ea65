"""`make bench` section: how much of a generated benchmark a small model change rewrites.

Pairs of MLPs trained one step (tests/workload_pairs.py): one layer inserted, one layer
widened, the batch size doubled, SGD swapped for AdamW, and the same model captured
twice. Each side is captured (ET only), generated, and the two files compared as a
reviewer's diff would: lines removed and added outside the docstring and the trace's
identity fields, against the file's net growth. Targets (issue 15): inserting a layer
changes at most 1.5x the lines the new ops and inputs occupy (here: the net growth);
a batch-size change touches only lines whose numbers change; capturing the same model
twice changes no code line. Medians of TRIALS captures per pair, with their range.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.workload_pairs import PAIRS, benchmark_of, code_changes, masked  # noqa: E402

TRIALS = int(os.environ.get("DIFFS_TRIALS", "3"))


def main() -> int:
    print(f"{'pair':18} {'removed':>8} {'added':>6} {'growth':>7} {'ratio':>6} "
          f"{'numbers only':>13}  (median of {TRIALS}; range)")
    for name, (make_a, make_b) in PAIRS.items():
        rows = []
        for trial in range(TRIALS):
            with tempfile.TemporaryDirectory() as work:
                old = benchmark_of(make_a, Path(work), f"a{trial}")
                new = benchmark_of(make_b, Path(work), f"b{trial}")
            removed, added = code_changes(old, new)
            growth = len(new.splitlines()) - len(old.splitlines())
            ratio = (len(removed) + len(added)) / growth if growth > 0 else float("nan")
            rows.append((len(removed), len(added), growth, ratio,
                         masked(removed) == masked(added)))
        med = [statistics.median(r[k] for r in rows) for k in range(4)]
        spread = f"{min(r[3] for r in rows):.2f}-{max(r[3] for r in rows):.2f}"
        numbers_only = sum(r[4] for r in rows)
        print(f"{name:18} {med[0]:8.0f} {med[1]:6.0f} {med[2]:7.0f} {med[3]:6.2f} "
              f"{numbers_only:>10}/{TRIALS}  ratio range {spread}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
