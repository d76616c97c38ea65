"""Compare an original trace with the trace of its replay."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from mystique_gen.emit.exprs import HARNESS_SCOPE
from mystique_gen.load.et import RawTrace, load_trace
from mystique_gen.passes.select import select_ops


def op_multiset(trace: RawTrace | str | Path) -> Counter[str]:
    """Names of the top-level operators (the ones a benchmark replays), with counts."""
    raw = trace if isinstance(trace, RawTrace) else load_trace(trace)
    return Counter(s.node.name for s in select_ops(raw).ops if HARNESS_SCOPE not in s.scope)


def multiset_match(original: Counter[str], replay: Counter[str]) -> float:
    """Fraction of the original's ops that the replay matches one for one."""
    total = sum(original.values())
    if total == 0:
        return 1.0 if not replay else 0.0
    common = sum((original & replay).values())
    extra = sum((replay - original).values())
    return max(0.0, (common - extra) / total)
