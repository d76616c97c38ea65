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

Then what the observer leaves in the host gaps between ops, which a same-session ET +
Kineto pair records (``OBSERVER_STEPS`` steps in one profiler session, the observer
started and stopped by hand for every other pair of them, so that the steps with it
and without it share the machine's speed): per top-level op gap on the step's thread,
its median with the observer less without = c + s x without, a least-squares line
over the gaps. c is the observer's own work in a gap, which the benchmark's
calibration measures; s, by how much the original's Python between ops ran slower,
it cannot see, and bounds at ``OBSERVER_PYTHON_SLOWDOWN`` (harness/runtime.py).
Run alone: `python scripts/bench.py capture` (CAPTURE_ONLY=gpt2,bert, CAPTURE_ROUNDS=N).
"""

from __future__ import annotations

import json
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

from mystique_gen.harness.runtime import OBSERVER_PYTHON_SLOWDOWN  # noqa: E402

ROUNDS = int(os.environ.get("CAPTURE_ROUNDS", "4"))
TRIALS = int(os.environ.get("CAPTURE_TRIALS", "3"))
BLOCK = 5
OBSERVER_STEPS = int(os.environ.get("CAPTURE_OBSERVER_STEPS", "12"))
# A line through fewer gaps tells c from s by chance: the recommender's 8-op inference
# step read s 0.75 and 1.96 with c 18 and -2 us in two runs, about 11 us a gap both.
FIT_GAPS = 20
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


def _top_level_gaps(events: list[dict], scope: dict) -> tuple[list[str], list[float]]:
    """The top-level ops inside ``scope`` on its thread (names) and the host gaps
    between them (us), from a Chrome trace's complete events."""
    inside = sorted((e for e in events if e.get("cat") == "cpu_op"
                     and e["tid"] == scope["tid"] and scope["ts"] < e["ts"]
                     and e["ts"] + e["dur"] <= scope["ts"] + scope["dur"]),
                    key=lambda e: (e["ts"], -e["dur"]))
    top: list[dict] = []
    for e in inside:
        if not top or e["ts"] >= top[-1]["ts"] + top[-1]["dur"]:
            top.append(e)
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(top, top[1:], strict=False)]
    return [e["name"] for e in top], gaps


def _observer_in_gaps(step: Callable[[], object], work: Path) -> tuple[float, ...] | str:
    """(plain gaps us, observed gaps us, c, s) of one step (see the module docstring),
    or why not."""
    for _ in range(3):
        step()
    observer = ExecutionTraceObserver()
    observer.register_callback(str(work / "paired.et.json"))
    flags = [k % 4 in (0, 3) for k in range(OBSERVER_STEPS)]  # on, off, off, on, ...
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 profile_memory=True) as prof:
        step()
        for k, observed in enumerate(flags):
            if observed:
                observer.start()
            with torch.profiler.record_function(f"mystique::paired{k}"):
                step()
            if observed:
                observer.stop()
    observer.unregister_callback()
    trace = work / "paired.json"
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    scopes = sorted((e for e in events if e["name"].startswith("mystique::paired")),
                    key=lambda e: e["ts"])
    steps = [_top_level_gaps(events, scope) for scope in scopes]
    if len(steps) != len(flags) or any(names != steps[0][0] for names, _ in steps):
        return "its steps ran different ops"
    if len(steps[0][1]) < FIT_GAPS:
        return "fewer gaps than the fit needs"

    def medians(observed: bool) -> list[float]:
        runs = [gaps for (_, gaps), on in zip(steps, flags, strict=True) if on == observed]
        return [statistics.median(column) for column in zip(*runs, strict=True)]

    plain, with_observer = medians(False), medians(True)
    extra = [b - a for a, b in zip(plain, with_observer, strict=True)]
    s, c = statistics.linear_regression(plain, extra)
    return sum(plain), sum(with_observer), c, s


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
    print(f"\n{'model':<22} {'gaps us':>9} {'observed':>9} {'c us':>7} {'s':>6}", flush=True)
    slopes = []
    with tempfile.TemporaryDirectory(prefix="paired-") as tmp:
        for name in [m for m in MODELS if not only or m in only]:
            for train in (True, False):
                label = f"{name}/{'train' if train else 'infer'}"
                torch.manual_seed(0)
                found = _observer_in_gaps(MODELS[name](train), Path(tmp))
                if isinstance(found, str):
                    print(f"{label:<22} not measured: {found}")
                    continue
                plain, observed, c, s = found
                slopes.append((s, label))
                print(f"{label:<22} {plain:>9.0f} {observed:>9.0f} {c:>7.2f} {s:>6.3f}",
                      flush=True)
    if slopes:
        over = [label for s, label in slopes if s > OBSERVER_PYTHON_SLOWDOWN]
        print(f"the observer in the host gaps: c + s x gap, s median "
              f"{statistics.median(s for s, _ in slopes):.3f} "
              f"(range {min(slopes)[0]:.3f}..{max(slopes)[0]:.3f}); above the bound "
              f"same-session benchmarks report ({OBSERVER_PYTHON_SLOWDOWN:g}): "
              f"{', '.join(over) if over else 'none'}")
    print(f"gaps: top-level op gaps of one step, medians over {OBSERVER_STEPS // 2} steps "
          "with the observer and as many without, in one profiler session; c, s: the "
          "least-squares line of observed - plain against plain, per gap")
    return 0


if __name__ == "__main__":
    sys.exit(main())
