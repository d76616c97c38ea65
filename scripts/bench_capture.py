"""`make bench` section: what capture costs a training or inference step.

The question users ask before they turn capture on in production ("lightweight
collection"): how much slower is a step while the execution trace observer records
it, alone and together with a Kineto trace (``profile(execution_trace_observer=...)``,
as PARAM, Chakra and HTA capture)? For each model of the fidelity zoo
(scripts/bench_fidelity.py), on CPU with one thread, the plain step and the step under
each capture mode are timed side by side: every round runs each mode (order rotated)
as one untimed step then ``BLOCK`` timed ones, the observers started before the block
and stopped after it, so what is timed is the recording itself and not start-up or
the file written at the end. Overhead = mode / plain - 1, the median over
``CAPTURE_TRIALS`` trials (their range printed). No target: the figure is reported.
Run alone: `python scripts/bench.py capture` (CAPTURE_ONLY=gpt2,bert, CAPTURE_ROUNDS=N).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_fidelity import MODELS  # noqa: E402

ROUNDS = int(os.environ.get("CAPTURE_ROUNDS", "4"))
TRIALS = int(os.environ.get("CAPTURE_TRIALS", "3"))
BLOCK = 5
Mode = Callable[[Path], AbstractContextManager[object]]


@contextmanager
def _et_only(path: Path) -> Iterator[None]:
    observer = ExecutionTraceObserver()
    observer.register_callback(str(path))
    observer.start()
    try:
        yield
    finally:
        observer.stop()
        observer.unregister_callback()


@contextmanager
def _et_and_kineto(path: Path) -> Iterator[None]:
    observer = ExecutionTraceObserver()
    observer.register_callback(str(path))
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=observer):
        yield


MODES: dict[str, Mode] = {"plain": lambda _path: nullcontext(), "et": _et_only,
                          "et+kineto": _et_and_kineto}


def _time_modes(step: Callable[[], object], work: Path) -> dict[str, float]:
    """Median ms per step under each mode, timed side by side in rotating blocks."""
    for _ in range(3):
        step()
    names = list(MODES)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(ROUNDS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            with MODES[name](work / f"{name}-{r}.json"):
                step()
                for _ in range(BLOCK):
                    start = time.perf_counter()
                    step()
                    times[name].append((time.perf_counter() - start) * 1000.0)
    return {n: statistics.median(t) for n, t in times.items()}


def main() -> int:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: pip install -e '.[bench]' (make bench does)")
        return 1
    only = [m for m in os.environ.get("CAPTURE_ONLY", "").split(",") if m]
    print(f"{'model':<22} {'plain ms':>9} {'et':>8} {'range':>15} {'et+kineto':>10} "
          f"{'range':>15}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="capture-") as tmp:
        for name in [m for m in MODELS if not only or m in only]:
            for train in (True, False):
                label = f"{name}/{'train' if train else 'infer'}"
                trials = []
                for _ in range(TRIALS):
                    torch.manual_seed(0)
                    ms = _time_modes(MODELS[name](train), Path(tmp))
                    trials.append({k: v / ms["plain"] - 1 for k, v in ms.items()}
                                  | {"plain_ms": ms["plain"]})
                row = {k: statistics.median(t[k] for t in trials) for k in trials[0]}
                rows.append(row)
                cells = []
                for mode in ("et", "et+kineto"):
                    spread = [t[mode] * 100 for t in trials]
                    cells.append(f"{row[mode] * 100:>+7.1f}% "
                                 f"{min(spread):>+6.1f}..{max(spread):>+5.1f}%")
                print(f"{label:<22} {row['plain_ms']:>9.3f} {cells[0]} {cells[1]}",
                      flush=True)
    for mode in ("et", "et+kineto"):
        if rows:
            median = statistics.median(r[mode] for r in rows) * 100
            worst = max(r[mode] for r in rows) * 100
            print(f"capture overhead, {mode}: median {median:+.1f}%, worst {worst:+.1f}% "
                  f"over {len(rows)} steps")
    print(f"overhead = step under the mode / plain step - 1, the median of {TRIALS} "
          "trials (their range); no target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
