"""Capture an execution trace (and its Kineto trace) of one step of a PyTorch program.

The answer to "how do I capture a trace that replays?": warm up first (so lazy
initialisation and allocator growth are not recorded), record integral tensor
ranges, record the ET and the Kineto trace of the same step (so they link by
``rf_id``), and measure the eager step time beside them.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

RANGE_ENV = "ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_RANGE"


@dataclass
class CaptureResult:
    et_path: Path
    kineto_path: Path | None
    sidecar_path: Path
    step_ms_median: float
    step_ms_min: float


@contextmanager
def _env(name: str, value: str | None):
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_step(step_fn: Callable[[], object], *, warmup: int = 2, iters: int = 5) -> list[float]:
    """Milliseconds per call of ``step_fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        step_fn()
    _sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step_fn()
        _sync()
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def capture(
    step_fn: Callable[[], object],
    out_dir: str | Path,
    *,
    name: str = "trace",
    warmup: int = 2,
    timing_iters: int = 5,
    kineto: bool = True,
    integral_ranges: bool = True,
) -> CaptureResult:
    """Run ``step_fn`` ``warmup`` times, then record one call of it.

    Writes ``<name>.et.json`` (execution trace), ``<name>.kineto.json`` (profiler trace
    of the same step, when ``kineto``) and ``<name>.step.json`` (eager step times).
    """
    import torch
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    times = time_step(step_fn, warmup=warmup, iters=timing_iters)
    et_path = out / f"{name}.et.json"
    kineto_path = out / f"{name}.kineto.json" if kineto else None
    with _env(RANGE_ENV, "1" if integral_ranges else None):
        observer = ExecutionTraceObserver()
        observer.register_callback(str(et_path))
        if kineto:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            with profile(activities=activities, execution_trace_observer=observer) as prof:
                step_fn()
                _sync()
            assert kineto_path is not None
            prof.export_chrome_trace(str(kineto_path))
        else:
            observer.start()
            step_fn()
            _sync()
            observer.stop()
        observer.unregister_callback()
    sidecar = out / f"{name}.step.json"
    summary = {
        "step_ms_median": statistics.median(times),
        "step_ms_min": min(times),
        "step_ms": times,
        "warmup": warmup,
        "torch": torch.__version__,
        "et": et_path.name,
        "kineto": kineto_path.name if kineto_path else None,
    }
    sidecar.write_text(json.dumps(summary, indent=2) + "\n")
    result = CaptureResult(et_path, kineto_path, sidecar, summary["step_ms_median"],
                           summary["step_ms_min"])
    return result


def result_dict(result: CaptureResult) -> dict[str, object]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(result).items()}
