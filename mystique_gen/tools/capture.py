"""Capture an execution trace (and its Kineto trace) of one step of a PyTorch program.

The answer to "how do I capture a trace that replays?": warm up first (so lazy
initialisation and allocator growth are not recorded), record integral tensor
ranges (and, optionally, the values of index tensors), record the ET and the Kineto
trace of the same step (so they link by ``rf_id``), and measure the eager step time
beside them.

Two entry points:

* :func:`capture` takes a ``step_fn`` (Python API);
* :func:`capture_script` runs a foreign training script (``mystique-gen capture -- python
  train.py``) and takes its optimizer steps as the step boundary, through
  ``torch.optim``'s global step hooks: step *k* is everything between the end of
  optimizer step *k-1* and the end of step *k* (data loading, forward, backward, the
  update). The script stops once the recorded step is written.
"""

from __future__ import annotations

import atexit
import ctypes
import difflib
import dis
import faulthandler
import functools
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import CodeType, FrameType

import torch
import torch.multiprocessing
from torch._C._profiler import _disable_execution_trace_observer
from torch._ops import HigherOrderOperator
from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from mystique_gen import oprules
from mystique_gen.constants import ET_SUFFIX, KINETO_SUFFIX, STEP_SCOPE
from mystique_gen.harness.runtime import _host_probe_us, _trace_peaks
from mystique_gen.passes.values import CapturedInputs, integer_key

RANGE_ENV = "ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_RANGE"
DATA_ENV = "ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_DATA"
# Inductor's C++ wrapper and AOTInductor call aten ops through a C shim the observer
# does not see; with the kernel profile on (read as Inductor's config is imported) each
# call and fused kernel is recorded by name, and the header lists them (README).
KERNEL_PROFILE_ENV = "TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"
# The capture's settings, for the Python processes a captured command or script starts
# (tools/bootstrap/sitecustomize.py starts a capture in each: _capture_this_process).
JOB_ENV = "MYSTIQUE_GEN_CAPTURE"
BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap"


@dataclass
class CaptureResult:
    et_path: Path
    kineto_path: Path | None
    sidecar_path: Path
    step_ms_median: float
    step_ms_min: float


@contextmanager
def _env(values: dict[str, str | None]):
    """Set environment variables (None: leave alone) for the duration of a block."""
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is not None:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in values.items():
            if v is None:
                continue
            if old[k] is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old[k]  # type: ignore[assignment]


def _sync() -> None:

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_step(step_fn: Callable[[], object], *, warmup: int = 2, iters: int = 5
              ) -> tuple[list[float], list[float]]:
    """Milliseconds per call of ``step_fn`` after ``warmup`` untimed calls: wall clock,
    and the calling thread's CPU time (``host_share``)."""
    for _ in range(warmup):
        step_fn()
    _sync()
    times, cpu = [], []
    for _ in range(iters):
        start, start_cpu = time.perf_counter(), time.thread_time()
        step_fn()
        _sync()
        times.append((time.perf_counter() - start) * 1000.0)
        cpu.append((time.thread_time() - start_cpu) * 1000.0)
    return times, cpu


def host_share(times: list[float], cpu: list[float]) -> float | None:
    """The median share of each timed step's wall clock in which the step's thread had
    the CPU: about 1 for a step on a host to itself (its thread runs the ops, or spins
    waiting for intra-op workers), well below where other processes took the core (an
    MLP step beside two busy processes on its core: 0.34, 108 ms against 34 ms idle).
    Steps shorter than a scheduler slice are rarely preempted and stay near 1; what a
    hypervisor steals or another core's traffic costs is not seen."""
    shares = [c / t for t, c in zip(times, cpu, strict=False) if t > 0]
    return statistics.median(shares) if shares else None


def index_ops() -> str:
    """Ops whose integral inputs torch should save (the ops with value rules)."""

    return ",".join(sorted(set(oprules.INDEX_RULES) | set(oprules.SHAPE_RULES)))


class _Recorder:
    """Records the ET (and Kineto trace) between :meth:`start` and :meth:`stop`."""

    def __init__(self, out: Path, name: str, *, kineto: bool, integral_ranges: bool,
                 integral_data: bool, resolve: bool = False):
        self.out, self.base, self.resolve = out, name, resolve
        self._name(name, kineto)
        self.integral_data = integral_data
        self.integral_ranges = integral_ranges
        self.env = self._environment()
        self.prof = None
        self.observer = None
        self.script_profiles = False  # the script started a torch.profiler of its own
        self.step_peak_bytes: int | None = None
        self.probes: list[float] = []  # the host's speed beside each profile-only step

    def _name(self, name: str, kineto: bool) -> None:
        self.name = name
        self.et_path = self.out / f"{name}{ET_SUFFIX}"
        self.kineto_path = self.out / f"{name}{KINETO_SUFFIX}" if kineto else None
        # The ET observer slows every op down, so the Kineto trace recorded beside it
        # (linked to the ET by rf_id) does not time the step faithfully; a second step
        # is profiled without it, for `mystique-gen compare --kineto-original`.
        self.profile_path = self.out / f"{name}.profile.json" if kineto else None

    def _environment(self):  # noqa: ANN202 (a context manager)
        return _env({RANGE_ENV: "1" if self.integral_ranges else None,
                     DATA_ENV: index_ops() if self.integral_data else None})

    def without_ranges(self) -> None:
        """Record no integral ranges: the observer computing one of an integral tensor
        of a subclass (an integer DTensor) raises, and records nothing more of the step
        (the Kineto trace neither): a 239-op FSDP2 + tensor-parallel step became 12."""
        if self.integral_ranges:
            print("mystique-gen: warning: the step passes integral tensors of a tensor "
                  "subclass (DTensor) to its ops: recording without integral tensor "
                  "ranges, whose computation stops the ET observer on them (index "
                  "inputs are filled from their readers' bounds instead)", file=sys.stderr)
        self.integral_ranges = False
        self.env = self._environment()

    def probe(self) -> None:
        """Time the harness's Python probe next to a profile-only step (outside its
        scope): what ``--host-gaps scaled`` compares its own host's speed with."""
        self.probes.append(_host_probe_us())

    def start(self) -> None:
        if self.resolve:
            # The rank is known once the script set up its process group: Lightning's
            # ranks have no RANK (LOCAL_RANK, NODE_RANK), and its rank 0 had taken the
            # job's plain name while rank 1 wrote nothing.
            self._name(rank_stem(self.base), self.kineto_path is not None)
        _JOB.register()
        self.env = self._environment()  # (a generator's context: once per start)
        self.env.__enter__()
        if self.kineto_path is not None:
            self._may_profile()
        self.observer = ExecutionTraceObserver()
        self.observer.register_callback(str(self.et_path))
        _RECORDING.append(self.observer)
        if self.integral_data:
            self.observer.set_extra_resource_collection(True)
        if self.kineto_path is not None:
            # profile_memory: the step's peak allocation (step.json), beside its ET.
            try:
                self.prof = profile(activities=_activities(), profile_memory=True,
                                    execution_trace_observer=self.observer)
            except TypeError:  # torch before 2.2 attaches no observer: started beside it
                self.prof = profile(activities=_activities(), profile_memory=True)
                self.prof.start()
                self.observer.start()
            else:
                self.prof.start()
        else:
            self.observer.start()

    def _without_kineto(self, why: str) -> None:
        """Go on with the ET alone: only one profiler session runs at a time, and the
        script's own ended or would end the capture's (which then crashed exporting)."""
        if self.kineto_path is not None:
            print(f"mystique-gen: warning: {why}: recording the execution trace only, "
                  "without its Kineto trace and profile-only steps (host gaps and "
                  "`compare`'s times need them; run the script without its profiler)",
                  file=sys.stderr)
        self.kineto_path = self.profile_path = None

    def _may_profile(self) -> bool:
        """Whether the capture may start a profiler session: not beside the script's
        own (then it goes on without Kineto)."""
        if self.script_profiles or _profiler_running():
            self._without_kineto("the script runs its own torch.profiler")
            return False
        return True

    def _session_lost(self) -> bool:
        """Whether the script's own profiler ended the capture's session (then it goes
        on without Kineto)."""
        if _profiler_running():
            return False
        self._without_kineto("the script's own torch.profiler ended the capture's "
                             "profiling session")
        return True

    def start_profile(self) -> bool:
        """Profile (Kineto only, no ET) the next step; False where the script's own
        profiler runs (then the capture has no profile-only steps)."""
        if not self._may_profile():
            return False
        self.prof = profile(activities=_activities())
        self.prof.start()
        return True

    def stop_profile(self) -> None:
        assert self.prof is not None
        _sync()
        if self._session_lost():
            return
        self.prof.stop()
        assert self.profile_path is not None
        self.prof.export_chrome_trace(str(self.profile_path))

    def set_aside(self) -> list[Path]:
        """Rename the ET and Kineto trace of a step the script never finished (it raised,
        exited or ended inside the recorded step) to ``*.incomplete``: under their own
        names they were a capture's files, and the generator made a benchmark of rank 0's
        forward alone (4 ops) that hung against rank 1's all-reduce."""
        moved = []
        for path in (self.et_path, self.kineto_path):
            if path is not None and path.exists():
                target = path.with_name(path.name + ".incomplete")
                path.replace(target)
                moved.append(target)
        return moved

    def stop(self) -> None:
        assert self.observer is not None
        _sync()
        try:
            if self.prof is not None and self._session_lost():
                self.prof = None
            if self.prof is not None:
                self.observer.stop()  # (the profiler stops one it was given, too)
                self.prof.stop()
                assert self.kineto_path is not None
                self.prof.export_chrome_trace(str(self.kineto_path))
                self.step_peak_bytes = _step_peak(self.kineto_path)
            else:
                self.observer.stop()
            self.observer.unregister_callback()
        finally:
            _RECORDING.clear()
            self.prof = None
            self.env.__exit__(None, None, None)


def _activities() -> list[ProfilerActivity]:
    """What the capture profiles: the host, and the GPU where there is one."""
    if torch.cuda.is_available():
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    return [ProfilerActivity.CPU]


def _profiler_running() -> bool:
    """Whether a profiler session (Kineto's, one per process) is running."""
    return bool(torch._C._autograd._profiler_enabled())


# The ET observer while it records. A process forked meanwhile (a DataLoader worker
# started in the recorded step) inherits it and the open trace file, and appended its
# own ops to the parent's trace ("extra data after the document", duplicate node ids).
_RECORDING: list[ExecutionTraceObserver] = []


# How to detach each capture of a script live in this process (:meth:`_ScriptCapture.run`).
# A child forked meanwhile (a rank started with the fork method, a DataLoader worker)
# inherited its step hooks and its first step's dispatch mode: two ranks forked by
# ``start_processes(..., start_method="fork")`` stepped the parent's clock, both
# recorded into the parent's files at once, and exited with the parent's stop.
_LIVE: list[Callable[[], None]] = []


def _silence_forked_child() -> None:
    """In a forked child: record nothing into the parent's files (never finalise the
    parent's ET, which the observer's own finaliser would), and drop the parent's step
    hooks (a rank the child runs is captured by a capture of its own,
    :class:`_SpawnedRank`)."""
    for observer in _RECORDING:
        with suppress(Exception):
            _disable_execution_trace_observer()
            observer._execution_trace_running = False
            observer._registered = False
    _RECORDING.clear()
    for detach in _LIVE:
        with suppress(Exception):
            detach()
    _LIVE.clear()


os.register_at_fork(after_in_child=_silence_forked_child)


class _StepMode(TorchDispatchMode):
    """A dispatch mode the capture runs a step of the program under: it sees each op
    the step runs (:meth:`see`), those in the bodies of higher-order ops included."""

    # Without it, a step calling a higher-order op (``torch.cond``, ``while_loop``,
    # flex attention's eager path) failed the capture: "There was no rule registered
    # for HigherOrderOperator cond and mode".
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Under a mode that does not, Dynamo skips compiled frames, and kept skipping
        # them after the mode exited: a torch.compile'd model ran eager in every later
        # step (the profile-only steps timed the eager model). Compiled code's ops are
        # also what the ET records of it.
        return True

    def see(self, func, args: tuple, kwargs: dict) -> None:  # noqa: ANN001
        """Look at one op the step runs, before it runs."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if isinstance(func, HigherOrderOperator):
            return func(*(self._under_mode(a) for a in args), **kwargs)
        self.see(func, args, kwargs)
        return func(*args, **kwargs)

    def _under_mode(self, value: object) -> object:
        """A higher-order op's function argument (a branch, a loop body, a score
        modifier), made to run its ops under this mode again, as the ET records them:
        the op runs with the mode popped, and the ops of its bodies, which the ET holds
        as ops of the step, would go unseen (the literals and 0-d values recorded in
        call order would then be matched to the wrong nodes). Where another mode is
        active, the op is tracing the function (autograd derives its backward from a
        graph), not running it, and it runs as it is."""
        if not callable(value) or isinstance(value, torch.Tensor):
            return value

        @functools.wraps(value)
        def run(*args: object, **kwargs: object) -> object:
            if _get_current_dispatch_mode() is not None:
                return value(*args, **kwargs)
            with self:
                return value(*args, **kwargs)

        return run


class _ScalarRecorder(_StepMode):
    """Records, over one or more steps (:meth:`next_step` between them):

    * in the first step, the value of every 0-d floating tensor argument of every op, by
      op overload and tensor ordinal (the ET's: every tensor among the inputs, list
      elements included, in schema order), in call order. The ET records a tensor's
      metadata, not its values, and 0-d floating tensors are mostly Python numbers
      wrapped by the argument parser: model constants (the -8.0 of RecurrentGemma's
      gate, ``-8.0 * gate * softplus(a)``, whose square root of ``1 - exp(2x)`` a
      positive stand-in turns to NaN), optimizer betas and step sizes; and of every
      0-d integral one apart (:meth:`recorded` with ``integers``: wrapped Python ints,
      the 2 and 1 of a Normal's ``icdf``, ``erfinv(2 * p - 1)``, which at random
      left erfinv's domain);
    * in every step, the values of each tensor the step builds from Python data
      (``aten::lift_fresh``: ``torch.tensor([0.5, 2.0])``, the index of ``x[:, [0, 2]]``)
      of at most :data:`MAX_LITERAL_ELEMENTS` elements, in call order
      (:meth:`literals`).

    The values pass fills those inputs with these (passes/values.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, dict[int, list[float]]] = {}
        self.integers: dict[str, dict[int, list[int]]] = {}
        self.steps: list[list[list[float | int] | None]] = [[]]  # literals, per step

    def next_step(self) -> None:
        self.steps.append([])

    def see(self, func, args: tuple, kwargs: dict) -> None:  # noqa: ANN001
        with suppress(Exception):  # recording never fails the step it watches
            if func.name() in oprules.ASSIGNED_LITERALS:  # aten::lift_fresh
                self.steps[-1].append(_literal_values(args[0]))
            if len(self.steps) == 1:
                self._record(func, args, kwargs)

    def literals(self) -> list[list[float | int] | None]:
        """Each literal's values where every complete step built the same ones in the
        same call (the model's constants), else None (data the step built from Python
        lists, different every step, is not recorded); [] unless at least two steps
        completed and built as many literals."""
        done = self.steps[:-1] if len(self.steps) > 1 else []
        if len(done) < 2 or len({len(step) for step in done}) != 1:
            return []
        return [first if all(step[k] == first for step in done[1:]) else None
                for k, first in enumerate(done[0])]

    def _record(self, func, args, kwargs) -> None:  # noqa: ANN001
        schema = func._schema
        key = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        ordinal = 0
        first: str | None = None  # the dtype of the op's first tensor argument
        for i, spec in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(spec.name)
            if "Tensor" not in str(spec.type):
                continue
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if first is None and not isinstance(value, (list, tuple)) \
                        and isinstance(item, (torch.Tensor, int, float, bool)):
                    first = _wrapped_dtype(item)
                # A wrapped number reaches __torch_dispatch__ as the Python number;
                # the ET records it as a 0-d tensor, at this ordinal.
                number = isinstance(item, float) or (
                    isinstance(item, torch.Tensor) and item.dim() == 0
                    and item.is_floating_point() and item.device.type == "cpu")
                if number:
                    self.values.setdefault(key, {}).setdefault(ordinal, []).append(
                        float(item.detach() if isinstance(item, torch.Tensor) else item))
                integer = (isinstance(item, int) and not isinstance(item, bool)) or (
                    isinstance(item, torch.Tensor) and item.dim() == 0
                    and not item.is_floating_point() and not item.is_complex()
                    and item.dtype != torch.bool and item.device.type == "cpu")
                if integer:
                    with suppress(Exception):  # (a subclass's value: the others still)
                        self.integers.setdefault(integer_key(key, first), {}).setdefault(
                            ordinal, []).append(
                            int(item.detach() if isinstance(item, torch.Tensor) else item))
                if number or isinstance(item, (torch.Tensor, int, bool, complex)):
                    ordinal += 1

    def recorded(self, integers: bool = False) -> dict[str, dict[str, list[float]]]:
        """What was recorded, as the sidecar stores it:
        ``{"aten::mul.Tensor": {"1": [values...]}}``; ``integers``: the integral ones."""
        return {op: {str(k): v for k, v in sorted(by.items())}
                for op, by in sorted((self.integers if integers else self.values).items())}

    def captured(self) -> CapturedInputs:
        """Everything recorded, as the values pass takes it."""
        return CapturedInputs(self.recorded(), self.literals(), self.recorded(integers=True))


def _wrapped_dtype(item: torch.Tensor | int | float | bool) -> str:
    """``item``'s dtype as the ET names it (passes/values.py ``integer_key``): a
    Python number's, the parser's wrapping."""
    if isinstance(item, torch.Tensor):
        return str(item.dtype).removeprefix("torch.")
    return "bool" if isinstance(item, bool) else "int64" if isinstance(item, int) \
        else "float64"


class _SubclassProbe(_StepMode):
    """Sees whether the step passes an integral tensor of a tensor subclass (an integer
    DTensor) to an op (:meth:`_Recorder.without_ranges`)."""

    def __init__(self) -> None:
        super().__init__()
        self.found = False

    def see(self, func, args: tuple, kwargs: dict) -> None:  # noqa: ANN001
        if not self.found:
            self.found = any(_integral_subclass(a) for a in (*args, *kwargs.values()))


def _integral_subclass(value: object) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_integral_subclass(v) for v in value)
    return isinstance(value, torch.Tensor) and type(value) not in (
        torch.Tensor, torch.nn.Parameter) and not value.is_floating_point() \
        and not value.is_complex()


def uses_integral_subclasses(step_fn: Callable[[], object]) -> bool:
    """Run ``step_fn`` once (a warm-up step) under :class:`_SubclassProbe`."""
    probe = _SubclassProbe()
    with probe:
        step_fn()
    return probe.found


# Literals of at most this many elements are recorded: a model's constants are short
# (a normalisation's mean, an index list); a batch built from Python lists is data.
MAX_LITERAL_ELEMENTS = 64


def _literal_values(tensor: object) -> list[float | int] | None:
    """A literal's values, flattened in row-major order, where it is a short real or
    boolean tensor on the host."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" \
            or tensor.numel() > MAX_LITERAL_ELEMENTS or tensor.is_complex() \
            or tensor.layout != torch.strided:
        return None
    values = tensor.detach().reshape(-1).tolist()
    if tensor.dtype == torch.bool:
        return [int(v) for v in values]
    if tensor.is_floating_point():
        return [_shortest(v, tensor.dtype) for v in values]
    return values


def _shortest(value: float, dtype: torch.dtype) -> float:
    """The shortest decimal that is ``value`` in ``dtype``: the file says 0.485, as the
    code did, not float32's 0.48500001430511475."""
    if not math.isfinite(value):
        return value
    for digits in range(1, 18):
        near = float(f"{value:.{digits}g}")
        if torch.tensor(near, dtype=dtype).item() == value:
            return near
    return value


def record_scalars(step_fn: Callable[[], object]) -> CapturedInputs:
    """The 0-d floating arguments of one call of ``step_fn`` and the literals that two
    calls build alike (:class:`_ScalarRecorder`)."""
    recorder = _ScalarRecorder()
    try:
        with recorder:
            step_fn()
            recorder.next_step()
            step_fn()
            recorder.next_step()
    except Exception:  # noqa: BLE001 (a step that cannot run under a mode: no values)
        if len(recorder.steps) == 1:
            return CapturedInputs()
    return recorder.captured()


def _step_peak(trace: Path) -> int:
    """What the recorded step allocated at once above what was live before it, on the
    accelerator where it allocated any, else on the CPU: the original's side of the
    benchmark's ``peak_step_bytes`` (the same measure, harness/runtime.py)."""
    peaks = _trace_peaks(trace)  # one read of the trace for both devices
    return peaks.get(int(torch.autograd.DeviceType.CUDA)) or \
        peaks.get(int(torch.autograd.DeviceType.CPU), 0)


def _write_sidecar(out: Path, name: str, times: list[float], cpu: list[float], warmup: int,
                   recorder: _Recorder, extra: dict[str, object]) -> CaptureResult:

    sidecar = out / f"{name}.step.json"
    summary = {
        "step_ms_median": statistics.median(times),
        "step_ms_min": min(times),
        "step_ms": times,
        "step_cpu_ms": cpu,
        "host_share": host_share(times, cpu),
        "warmup": warmup,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "et": recorder.et_path.name,
        "kineto": recorder.kineto_path.name if recorder.kineto_path else None,
        "profile": recorder.profile_path.name if recorder.profile_path else None,
        "step_peak_bytes": recorder.step_peak_bytes,
        "host_probe_us": statistics.median(recorder.probes) if recorder.probes else None,
        **extra,
    }
    sidecar.write_text(json.dumps(summary, indent=2) + "\n")
    return CaptureResult(recorder.et_path, recorder.kineto_path, sidecar,
                         summary["step_ms_median"], summary["step_ms_min"])


def capture(
    step_fn: Callable[[], object],
    out_dir: str | Path,
    *,
    name: str = "trace",
    warmup: int = 2,
    timing_iters: int = 5,
    kineto: bool = True,
    integral_ranges: bool = True,
    integral_data: bool = False,
    profile_steps: int = 9,
) -> CaptureResult:
    """Run ``step_fn`` ``warmup`` times, time ``timing_iters`` calls, record one more.

    Writes ``<name>.et.json`` (execution trace), ``<name>.kineto.json`` (profiler trace
    of the same step, when ``kineto``), ``<name>.profile.json`` (profiler trace of
    ``profile_steps`` more steps without the ET observer, each in a ``MystiqueProfiledStep``
    annotation: the host gaps of the benchmark come from it, see passes/hostgaps.py),
    ``<name>.step.json`` (eager step times) and,
    with ``integral_data``, ``<name>.et_resources/`` (values of index tensors).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = rank_stem(name)
    recorder = _Recorder(out, name, kineto=kineto, integral_ranges=integral_ranges,
                         integral_data=integral_data)
    if integral_ranges and uses_integral_subclasses(step_fn):  # (one more warm-up step)
        recorder.without_ranges()
    times, cpu = time_step(step_fn, warmup=warmup, iters=timing_iters)
    recorder.start()
    try:
        step_fn()
    finally:
        recorder.stop()
    # Two more steps, under a dispatch mode that slows them: the values the ET leaves out.
    inputs = record_scalars(step_fn)
    if recorder.profile_path is not None and recorder.start_profile():
        try:
            for _ in range(max(1, profile_steps)):
                recorder.probe()
                with record_function(STEP_SCOPE):
                    step_fn()
        finally:
            recorder.stop_profile()
    return _write_sidecar(out, name, times, cpu, warmup, recorder,
                          {"boundary": "step_fn call", "profile_steps": max(1, profile_steps),
                           **inputs.sidecar_fields()})


class CaptureDone(BaseException):
    """Raised from the optimizer hook once the step is recorded: ends the script early.

    A BaseException, so the script's own ``except Exception`` handlers let it through.
    """


class ScriptError(Exception):
    """The script could not be run, or ended before the step could be recorded."""


@dataclass
class _StepClock:
    """Optimizer-step boundaries: warm-up, timed steps, one recorded step, two under
    the scalar recorder (:func:`record_scalars`), then (with Kineto) ``profile_steps``
    steps profiled without the ET observer, each in a
    ``MystiqueProfiledStep`` annotation as :func:`capture` profiles them, so that
    ``compare`` and the host gaps see warm steps one by one."""

    warmup: int
    timing_iters: int
    recorder: _Recorder
    profile_steps: int = 9
    steps: int = 0
    last: float | None = None
    last_cpu: float = 0.0
    recording: bool = False
    profiling: bool = False
    profiled: int = 0  # annotated steps completed
    done: bool = False  # CaptureDone raised: the capture is complete
    # What ends a process captured from its start (_capture_this_process), instead of
    # CaptureDone: its files written, it exits.
    on_done: Callable[[], None] | None = None
    said_done: bool = False

    def __post_init__(self) -> None:
        self.times: list[float] = []
        self.cpu_times: list[float] = []  # the step thread's CPU time (host_share)
        self.scope: record_function | None = None
        self.probe: _SubclassProbe | None = None  # the first step's (start_probe)
        # The optimizers in the order they first stepped, and the last of them
        # (the one whose steps end the script's steps), once one steps again.
        self.cycle: list[tuple[int, ...]] = []
        self.last_in_cycle: tuple[int, ...] | None = None
        self.previous: tuple[int, ...] | None = None  # the last optimizer to step
        self.repeated = False  # the last in the cycle stepped twice in a row since ...
        self.evidence = 0  # ... and another stepped after such a run, so many times
        self._keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # The two steps after the recorded one run under it (record_scalars).
        self.scalar_mode: _ScalarRecorder | None = None
        self.inputs = CapturedInputs()
        self.thread = threading.get_ident()  # the script's: the one CaptureDone stops

    def on_step(self, optimizer: object = None) -> None:
        if self.done and threading.get_ident() != self.thread:
            raise CaptureDone  # a worker's later step: the script's thread is stopping
        if self.done:
            # The script caught CaptureDone (a bare ``except:`` around its step, to
            # skip a bad batch) and went on: the clock started over, recorded and
            # profiled again, and timed those steps (a 0.4 ms step's median read
            # 7.8 ms). It changes nothing now, and stops the script at each step.
            if not self.said_done:
                self.said_done = True
                print("mystique-gen: warning: the script caught the capture's stop (a "
                      "bare except?) and goes on: its further steps are not recorded",
                      file=sys.stderr)
            raise CaptureDone
        self.finish_probe()
        if not self._ends_a_step(optimizer):
            return
        _sync()
        now = time.perf_counter()
        self.steps += 1
        if self.profiling:
            self._close_scope()
            self.profiled += 1
            if self.profiled >= self.profile_steps:
                self.finish_profile()
                self.stop()
            self.recorder.probe()
            self._open_scope()
            return
        if self.recording:
            self.recorder.stop()
            self.recording = False
            self.scalar_mode = _ScalarRecorder()
            self.scalar_mode.__enter__()
            return
        if self.scalar_mode is not None:
            self.scalar_mode.next_step()
            if len(self.scalar_mode.steps) < 3:
                return
            self.finish_scalars()
            if self.recorder.profile_path is None or not self.recorder.start_profile():
                self.stop()
            self.profiling = True
            self.recorder.probe()
            self._open_scope()
            return
        if self.steps > self.warmup and self.last is not None:
            self.times.append((now - self.last) * 1000.0)
            self.cpu_times.append((time.thread_time() - self.last_cpu) * 1000.0)
        if len(self.times) >= self.timing_iters:
            self.recorder.start()
            self.recording = True
        self.last, self.last_cpu = time.perf_counter(), time.thread_time()

    def stop(self) -> None:
        """The capture is complete: stop the script (``on_done``, else
        :class:`CaptureDone`), once the job's other captures have written their files."""
        self.done = True
        if self.on_done is not None:
            self.on_done()
        _JOB.finished()
        if threading.get_ident() != self.thread and self.on_done is None:
            # The step ran on a worker thread (a request queue's): CaptureDone there
            # ended the worker alone, and the script's thread waited for it forever.
            # The script's thread gets it when it next runs Python code.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread),
                                                       ctypes.py_object(CaptureDone))
        raise CaptureDone

    def start_probe(self) -> None:
        """Watch the script's first step for integral tensors of a subclass."""
        if self.recorder.integral_ranges:
            self.probe = _SubclassProbe()
            self.probe.__enter__()

    def finish_probe(self) -> None:
        """Leave the probe after the first step (where it is still the innermost mode:
        a mode the script entered since stays on top) and record without ranges where
        it found one."""
        if self.probe is None:
            return
        if threading.get_ident() != self.thread:
            # A step on a worker thread: the probe is a mode of the script's thread (a
            # thread's own stack), which leaves it when the capture ends; dropped here,
            # it stayed on there, and every later ET of this process was empty.
            return
        if _get_current_dispatch_mode() is self.probe:
            self.probe.__exit__(None, None, None)
        if self.probe.found:
            self.recorder.without_ranges()
        self.probe = None

    def drop_probe(self) -> None:
        """Leave the probe without using what it found (a forked child's copy of its
        parent's clock)."""
        if self.probe is not None and _get_current_dispatch_mode() is self.probe:
            self.probe.__exit__(None, None, None)
        self.probe = None

    def _ends_a_step(self, optimizer: object) -> bool:
        """Whether this ``optimizer.step()`` ends a step of the script: a step of the
        optimizer that steps last in the script's cycle of optimizers (the order they
        first step in, up to the first that steps again; one that first steps later
        joins it, last, and where the last steps several times in a row between
        another's steps, that other's steps end the steps). A GAN steps its
        discriminator's and its generator's in turn, and each ended a step: the
        recorded step was half an iteration, and the timed ones alternated halves.
        With one optimizer, every step of it ends one."""
        key = self._key(optimizer)
        previous, self.previous = self.previous, key
        if self.last_in_cycle is None:
            if key not in self.cycle:
                self.cycle.append(key)
                self.steps += 1  # a warm-up step of its own, until the cycle is known
                return False
            self.last_in_cycle = self.cycle[-1]
        if key == self.last_in_cycle:
            # Twice in a row, where another optimizer steps too: it steps several
            # times an iteration (a WGAN's critic, after its generator's step).
            self.repeated = self.repeated or (previous == key and len(self.cycle) > 1)
        elif key in self.cycle:
            if self.repeated:
                # Another steps after such a run: a step ends at its step where it
                # did so twice (a GradScaler's skipped step is one run of one).
                self.repeated = False
                self.evidence += 1
                if self.evidence >= 2:
                    self.last_in_cycle = key
                    self._restart()
        else:
            # An optimizer that had not stepped when the cycle was fixed: a WGAN's
            # generator, after its critic's n_critic steps (each critic step ended a
            # step: the recorded step was a critic step alone), or a second phase's
            # (a linear probe, then fine-tuning: its steps ended none, and the script
            # "made 5 optimizer steps"). It steps last in the cycle now; the steps
            # timed or recorded so far were not whole iterations: start again.
            self.cycle.append(key)
            self.last_in_cycle = key
            self._restart()
        return key == self.last_in_cycle

    def _key(self, optimizer: object) -> tuple[int, ...]:
        """An optimizer, by the parameters it updates: one re-created over the same
        parameters (every iteration, or per epoch) is the same optimizer, where its
        ``id`` changes or, freed, comes back as another's."""
        try:
            return self._keys[optimizer]
        except (KeyError, TypeError):
            pass
        try:
            key = tuple(id(p) for group in optimizer.param_groups  # type: ignore[attr-defined]
                        for p in group["params"]) or (id(optimizer),)
        except Exception:  # noqa: BLE001 (not a torch.optim optimizer as it should be)
            key = (id(optimizer),)
        with suppress(TypeError):
            self._keys[optimizer] = key
        return key

    def _restart(self) -> None:
        """Warm up, time and record again from this step on (the cycle changed):
        a recording or profile in progress is dropped (its files are written again)."""
        print(f"mystique-gen: note: another optimizer stepped after {self.steps} steps: "
              "steps end at its steps now; warming up again", file=sys.stderr)
        if self.recording:
            self.recorder.stop()
            self.recording = False
        if self.scalar_mode is not None:
            self.scalar_mode.__exit__(None, None, None)
            self.scalar_mode = None
        if self.profiling:
            self.finish_profile()
            self.profiled = 0
        self.recorder.probes.clear()
        self.repeated, self.evidence = False, 0
        self.steps, self.last = 0, None
        self.times, self.cpu_times = [], []

    def finish_scalars(self) -> None:
        """Leave the scalar recorder's mode and keep what it recorded."""
        if self.scalar_mode is not None:
            self.scalar_mode.__exit__(None, None, None)
            self.inputs = self.scalar_mode.captured()
            self.scalar_mode = None

    def finish_profile(self) -> None:
        """Stop profiling; a step the script did not finish is not annotated."""
        if self.scope is not None:
            # Stopped first, so the unfinished step leaves no event behind.
            self.recorder.stop_profile()
            self._close_scope()
        else:
            self.recorder.stop_profile()
        self.profiling = False

    def _open_scope(self) -> None:
        self.scope = record_function(STEP_SCOPE)
        self.scope.__enter__()

    def _close_scope(self) -> None:
        if self.scope is not None:
            self.scope.__exit__(None, None, None)
            self.scope = None


# The step callback of the capture in progress; the wrappers below call it.
_ACTIVE: list[Callable[[object], None]] = []


def _step_wrapper(on_step: Callable[[object], None]) -> Callable[[], None]:
    """Call ``on_step`` after each ``optimizer.step()`` returns, outside its profiler
    scope: starting or stopping the profiler inside an open ``record_function`` scope
    (where torch.optim's own post hooks run) corrupts the profiler's state. Optimizer
    classes set up before the first capture fall back to the global post hook.
    Returns the function that ends this capture's claim on the steps."""

    _ACTIVE[:] = [on_step]
    original = Optimizer.profile_hook_step
    if getattr(original, "_mystique", False):
        return _ACTIVE.clear

    def profile_hook_step(func: Callable[..., object]) -> Callable[..., object]:
        inner = original(func)

        @functools.wraps(inner)
        def step(*args: object, **kwargs: object) -> object:
            out = inner(*args, **kwargs)
            if _ACTIVE:
                _ACTIVE[0](args[0] if args else None)  # the optimizer
            return out

        step._mystique = True  # type: ignore[attr-defined]
        return step

    profile_hook_step._mystique = True  # type: ignore[attr-defined]
    Optimizer.profile_hook_step = staticmethod(profile_hook_step)  # type: ignore[method-assign]
    return _ACTIVE.clear


def parse_step_at(target: str) -> tuple[str, list[str]]:
    """``--step-at [MODULE:]NAME[.NAME...]`` as (module, attribute path): a module-level
    function or a class's method, of the script (``__main__``, the default) or of a
    module it imports (``transformers.generation.utils:GenerationMixin.generate``)."""
    module, _, qualname = target.rpartition(":")
    parts = qualname.split(".")
    if not all(p.isidentifier() for p in parts) or \
            (module and not all(p.isidentifier() for p in module.split("."))):
        raise ScriptError(f"--step-at {target}: not [MODULE:]NAME[.NAME...] (a function "
                          "defined at a module's top level, or a method of a class there)")
    return module or "__main__", parts


class _StepAt:
    """Each return from a function (``--step-at``) ends a step, instead of an optimizer's
    step: an inference script, or a step function that steps several optimizers. The
    function is wrapped where it is bound (its module's global, its class's attribute);
    a call inside another call of it (recursion, a method calling its base's) is part
    of the outer one. A function of the script itself is wrapped as soon as its
    definition has run: until then, only the script's top-level frame is traced, line
    by line (no frame of the step is: the trace stops once it is wrapped)."""

    def __init__(self, target: str, on_return: Callable[[object], None]) -> None:
        self.target = target
        self.module, self.path = parse_step_at(target)
        self.on_return = on_return
        self.undo: list[Callable[[], None]] = []
        self.unwrap: list[Callable[[], None]] = []  # (undone where the name is rebound)
        self.wrapped = False
        self.bound: object = None  # what the namespace bound to path[0] when wrapped
        self.called = False  # a step began: stop watching the script's definitions
        self.stop_watching: Callable[[], None] = _no_op
        self.seen: dict[str, object] | None = None  # the script's namespace, as watched

    def install(self, script_running: bool, script: str | None = None
                ) -> Callable[[], None]:
        """Wrap now, or once the script's definition has run (``script_running``: this
        process runs the script as its ``__main__`` already, as a launcher's worker
        does; else the script is yet to start in this process); ``script``: the file it
        runs (known from the module otherwise). Returns the undo."""
        if self.module != "__main__" and self._is_script(script_running, script):
            # ``pkg.serve:serve`` of ``python -m pkg.serve``: the script runs as
            # __main__, a module of its own; importing pkg.serve would run its code a
            # second time, as another module whose function the loop never calls.
            self.module = "__main__"
        if self.module != "__main__":
            try:
                namespace = vars(importlib.import_module(self.module))
            except ImportError as exc:
                raise ScriptError(f"--step-at {self.target}: {exc}") from None
            if not self._wrap(namespace):
                raise ScriptError(f"--step-at {self.target}: {self.module} has no "
                                  f"{'.'.join(self.path)}")
        else:
            self._watch_main(script_running)
        return self.uninstall

    def _is_script(self, script_running: bool, script: str | None) -> bool:
        """Whether the module named is the script's own file (run as ``__main__``)."""
        if script_running:
            main = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
            script = getattr(main, "__file__", None)
        if script is None or self.module in sys.modules:
            return False
        try:
            spec = importlib.util.find_spec(self.module)
        except (ImportError, ValueError):
            return False
        origin = getattr(spec, "origin", None)
        return origin is not None and Path(origin).resolve() == Path(script).resolve()

    def uninstall(self) -> None:
        for undo in reversed(self.unwrap + self.undo):
            undo()
        self.unwrap.clear()
        self.undo.clear()

    def unbound(self) -> str:
        """Why the script never returned from the function, where its name was never
        bound in the script (a typo): the script's names closest to it."""
        if self.wrapped or self.module != "__main__" or self.seen is None:
            return ""
        names = [n for n, v in self.seen.items() if callable(v) and not n.startswith("__")]
        close = difflib.get_close_matches(self.path[0], names, n=3)
        return (f"; the script never bound {self.path[0]}"
                + (f" (did you mean {', '.join(close)}?)" if close else ""))

    def _rewrap(self, namespace: dict[str, object]) -> None:
        """Wrap the definition ``namespace`` binds now, where the script bound another
        since (``def serve`` twice: the loop calls the last)."""
        if namespace.get(self.path[0]) is self.bound:
            return
        for undo in reversed(self.unwrap):
            undo()
        self.unwrap.clear()
        self.wrapped = False
        self._wrap(namespace)

    def _wrap(self, namespace: dict[str, object]) -> bool:
        """Wrap the function where ``namespace`` binds it; False where it is not bound."""
        if self.wrapped:
            return True
        owner: object = None
        for name in self.path[:-1]:
            owner = namespace.get(name) if owner is None else getattr(owner, name, None)
            if owner is None:
                return False
        name = self.path[-1]
        if owner is None:
            if name not in namespace:
                return False
            raw = namespace[name]
        else:
            try:
                raw = inspect.getattr_static(owner, name)
            except AttributeError:
                return False
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        function = raw.__func__ if kind is not None else raw  # type: ignore[union-attr]
        if not callable(function):
            raise ScriptError(f"--step-at {self.target}: not a function "
                              f"({type(function).__name__})")
        wrapper = self._wrapper(function)
        bound = kind(wrapper) if kind is not None else wrapper
        if owner is None:
            # Also where the function's module code ran, if that is another dict: a
            # spawned rank's __mp_main__ is a copy of the namespace its functions read
            # their globals from (multiprocessing's fix-up of the script's run_path).
            home = getattr(function, "__globals__", namespace)
            for where in [namespace] + ([home] if home is not namespace
                                        and home.get(name) is raw else []):
                where[name] = bound
                self.unwrap.append(functools.partial(_unbind, where, name, bound, raw))
        else:
            setattr(owner, name, bound)
            self.unwrap.append(lambda: setattr(owner, name, raw))
        self.wrapped = True
        self.bound = namespace.get(self.path[0])
        return True

    def _wrapper(self, function: Callable[..., object]) -> Callable[..., object]:
        inside = threading.local()
        on_return = self.on_return
        home = threading.get_ident()  # the script's thread

        @functools.wraps(function)
        def step(*args: object, **kwargs: object) -> object:
            if getattr(inside, "active", False):  # a call within the step's own call
                return function(*args, **kwargs)
            if not self.called:  # (no frame of a step is traced)
                self.called = True
                self.stop_watching()
            inside.active = True
            try:
                return function(*args, **kwargs)
            finally:  # (a call that raised ends its step too: an iterator's last)
                inside.active = False
                try:
                    on_return(None)
                except CaptureDone:
                    # A worker thread's step: the worker returns and goes on (the
                    # script's thread, which the clock stops, may wait on its reply).
                    if threading.get_ident() == home:
                        raise

        return step

    def _watch_main(self, script_running: bool) -> None:
        """Wrap the script's function where it is defined already (``script_running``),
        else trace the script's top-level frame until its definition has run: the frame
        running now (``script_running``) or the next to start."""
        # A spawned rank imported the script as __mp_main__; a forked one holds it as
        # __main__ (runpy's module, defined up to the fork).
        for name in ("__mp_main__", "__main__") if script_running else ():
            module = sys.modules.get(name)
            if module is not None and self._wrap(vars(module)):
                return

        def script_frame(frame: FrameType) -> bool:
            return frame.f_code.co_name == "<module>" and \
                frame.f_globals.get("__name__") == "__main__"

        previous = sys.gettrace()  # a debugger's or coverage's, given back after

        home = threading.get_ident()
        watched: list[FrameType] = []

        def stop_watching() -> None:
            for frame in watched:
                frame.f_trace = None
            if threading.get_ident() == home:
                sys.settrace(previous)
        self.stop_watching = stop_watching

        def lines(frame: FrameType, event: str, arg: object):  # noqa: ANN202
            if frame not in watched:
                watched.append(frame)
                self.seen = frame.f_globals
            if self.wrapped:
                self._rewrap(frame.f_globals)
            if self._wrap(frame.f_globals) and (
                    self.called or _stores(frame.f_code, self.path[0]) < 2):
                stop_watching()
                return None
            # Bound more than once (``def serve`` twice): the last definition before
            # the first call is the one wrapped, so the watch goes on until that call.
            return lines

        def calls(frame: FrameType, event: str, arg: object):  # noqa: ANN202
            if self.called:  # (a step began on another thread)
                sys.settrace(previous)
                return None
            return lines if event == "call" and script_frame(frame) else None

        running: FrameType | None = sys._getframe(1) if script_running else None
        while running is not None and not script_frame(running):
            running = running.f_back
        if running is not None:
            running.f_trace = lines
            watched.append(running)
        sys.settrace(calls)

        def stop() -> None:
            if sys.gettrace() is calls:
                sys.settrace(previous)
            if running is not None:
                running.f_trace = None
            for frame in watched:
                frame.f_trace = None
        self.undo.append(stop)


def _unbind(namespace: dict[str, object], name: str, bound: object, raw: object) -> None:
    """Give ``name`` back its function where it still binds the wrapper (not where the
    script has bound another since)."""
    if namespace.get(name) is bound:
        namespace[name] = raw


@functools.lru_cache(maxsize=64)
def _stores(code: CodeType, name: str) -> int:
    """How many times the module code ``code`` binds ``name`` (a ``def`` or ``class``
    statement, an assignment)."""
    return sum(1 for i in dis.get_instructions(code)
               if i.opname in ("STORE_NAME", "STORE_GLOBAL") and i.argval == name)


def rank_stem(name: str) -> str:
    """``name`` for this process's files: ``<name>-rank-<RANK>`` where a launcher started
    it as one rank of several (its initialised process group's rank and size, else
    ``RANK`` and ``WORLD_SIZE`` > 1 in the environment: torchrun, srun with torchrun)
    and ``name`` does not already end with its rank. Every rank runs the same command
    line (``mystique-gen capture -o traces -- python train.py``), so with one name the
    ranks wrote one set of files at once: an ET that was no JSON (two ranks' text
    interleaved), a Kineto trace of either rank
    and no profile (one rank renamed the other's). A directory of the ranks' files is
    then one job's traces (``mystique-gen traces/ --kineto traces/``)."""
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    with suppress(Exception):  # the process group, once set up, knows (Lightning: no RANK)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = str(torch.distributed.get_rank())
            world = str(torch.distributed.get_world_size())
    if not (rank.isdigit() and world.isdigit()) or int(world) <= 1:
        return name
    if re.search(rf"rank[-_.]?0*{int(rank)}$", name):
        return name
    return f"{name}-rank-{int(rank)}"


def capture_script(
    argv: list[str],
    out_dir: str | Path,
    *,
    name: str = "trace",
    warmup: int = 3,
    timing_iters: int = 5,
    kineto: bool = True,
    integral_ranges: bool = True,
    integral_data: bool = False,
    profile_steps: int = 9,
    step_at: str | None = None,
) -> CaptureResult:
    """Run ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) in this process and
    record one optimizer step after ``warmup`` + ``timing_iters`` steps; with
    ``kineto``, then profile up to ``profile_steps`` more (at least one), as
    :func:`capture` does. ``step_at`` (``[MODULE:]NAME``): each return from that
    function ends a step instead (:class:`_StepAt`)."""
    if step_at is not None:
        parse_step_at(step_at)  # its form, before the script runs

    if argv and Path(argv[0]).name.startswith("python"):
        argv = _interpreter_options(argv[1:])
    if not argv:
        raise ScriptError("no script given: mystique-gen capture -o DIR -- python train.py")
    if _launched(argv):
        capture = _ScriptCapture(Path(out_dir), warmup, timing_iters, kineto,
                                 integral_ranges, integral_data, max(1, profile_steps),
                                 tuple(argv), step_at)
        capture.out.mkdir(parents=True, exist_ok=True)
        return _capture_command(argv, capture, name)
    module = None
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ScriptError("-m needs a module name")
        module, argv = argv[1], argv[1:]
    elif not Path(argv[0]).is_file():
        raise ScriptError(f"no such script: {argv[0]}")
    # As python puts them first: the script's folder, or for -m the working directory.
    search = str(Path(argv[0]).resolve().parent) if module is None else os.getcwd()
    if module is not None:
        sys.path.insert(0, search)
        try:
            found = _find_module(module)
        finally:
            sys.path.remove(search)
        if found is None:
            raise ScriptError(f"no module named {module!r} (from {search})")
    if module is None:
        script: str | None = argv[0]
    else:  # (a package's __main__, where -m names a package)
        spec = found if not getattr(found, "submodule_search_locations", None) \
            else _find_module(f"{module}.__main__")
        script = getattr(spec, "origin", None)
    capture = _ScriptCapture(Path(out_dir), warmup, timing_iters, kineto, integral_ranges,
                             integral_data, max(1, profile_steps), tuple(argv), step_at,
                             script)
    capture.out.mkdir(parents=True, exist_ok=True)

    def run_script() -> None:
        if module is None:
            runpy.run_path(argv[0], run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)

    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = list(argv)
    sys.path.insert(0, search)
    started = time.time()
    try:
        with _job_environment(capture, name):
            run = capture.run(name, run_script, spawns_as=name, resolve=True)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    if run.raised is not None and not isinstance(run.raised, (SystemExit, ScriptError)):
        traceback.print_exception(run.raised)
    if run.clock.steps == 0 and not run.clock.cycle and not run.spawned:
        # Trained in processes it started otherwise (Lightning's ddp re-runs the script
        # as its ranks): those captured themselves.
        results = _captured_since(capture.out, name, started)
        if results and run.raised is None:
            _say_ranks(capture.out, results, "process(es) the script started")
            return _result_of(capture.out, results[0])
        short = _captured_since(capture.out, name, started, whole=False)
        if short and run.raised is None:  # not "none captured": each said what it kept
            raise ScriptError(
                f"none of the {len(short)} process(es) the script started was captured "
                f"whole ({', '.join(n for n, _, _ in short)}: each said why above)")
    result = capture.finish(run)
    others = [] if run.spawned else [r for r in _captured_since(capture.out, name, started)
                                     if r[1] != result.sidecar_path]
    if others:  # (rank 0 in this process, the others in the processes it started)
        _say_ranks(capture.out, [(run.recorder.name, result.sidecar_path, {})] + others,
                   "ranks (this process and those it started)")
    return result


@dataclass
class _Run:
    """One process's run of the script (or of a spawned rank's function) under the
    capture's hooks."""

    name: str
    clock: _StepClock
    recorder: _Recorder
    raised: BaseException | None = None  # the script's error, or a non-zero exit
    spawned: list[str] = field(default_factory=list)  # names of the ranks it spawned
    detached: bool = False  # its hooks dropped: a forked child's copy, or yielded to a rank's
    detach: Callable[[], None] = lambda: None
    undo: Callable[[], None] = lambda: None
    step_at: _StepAt | None = None  # --step-at's wrapper (what it found)


@dataclass(frozen=True)
class _ScriptCapture:
    """The capture of a script's optimizer steps (:func:`capture_script`): in its own
    process, and in each rank it starts with ``torch.multiprocessing.spawn``
    (:class:`_SpawnedRank`), as torchrun's ranks are captured one by one."""

    out: Path
    warmup: int
    timing_iters: int
    kineto: bool
    integral_ranges: bool
    integral_data: bool
    profile_steps: int
    command: tuple[str, ...]
    step_at: str | None = None  # --step-at: each return of it ends a step
    script: str | None = None  # the file the script runs as __main__ (where known)

    @property
    def boundary(self) -> str:
        """What ends a step, in words."""
        return "optimizer step" if self.step_at is None else f"return from {self.step_at}"

    def run(self, name: str, body: Callable[[], object],
            spawns_as: str | None = None, resolve: bool = False,
            script_running: bool = False) -> _Run:
        """Run ``body`` with the step hooks set; ``spawns_as``: the name whose
        ``-rank-<i>`` the ranks it spawns take (None: spawned ranks are not followed);
        ``resolve``: ``name`` takes the process's rank when it first records;
        ``script_running``: see :meth:`begin`."""
        run = self.begin(name, spawns_as, resolve, script_running)
        try:
            with _env({KERNEL_PROFILE_ENV: os.environ.get(KERNEL_PROFILE_ENV, "1")}):
                body()
        except CaptureDone:
            pass
        except SystemExit as exc:
            if exc.code not in (0, None):
                run.raised = exc
        except Exception as exc:  # noqa: BLE001 (the script's own error, reported)
            run.raised = exc
        finally:
            self.end(run)
            _JOB.leave()
        return run

    def begin(self, name: str, spawns_as: str | None = None, resolve: bool = False,
              script_running: bool = False) -> _Run:
        """Set the step hooks of a run (:meth:`end` takes them off); ``script_running``:
        this process runs the script as its ``__main__`` already (a launcher's worker)."""
        recorder = _Recorder(self.out, name, kineto=self.kineto,
                             integral_ranges=self.integral_ranges,
                             integral_data=self.integral_data, resolve=resolve)
        clock = _StepClock(self.warmup, self.timing_iters, recorder, self.profile_steps)
        run = _Run(name, clock, recorder)
        if self.step_at is None:
            handle = register_optimizer_step_post_hook(
                lambda opt, *_: None if getattr(type(opt).step, "_mystique", False)
                else clock.on_step(opt)).remove
            restore = _step_wrapper(clock.on_step)
        else:  # optimizers step inside the function, or not at all
            run.step_at = _StepAt(self.step_at, clock.on_step)
            handle = run.step_at.install(script_running, self.script)
            restore = _no_op
        unwatch = _watch_script_profilers(recorder)
        unpatch_inference = _modes_survive_inference_mode()
        unwatch_spawn = _watch_spawned_processes(
            run.spawned, None if spawns_as is None else (self, spawns_as), clock)
        clock.start_probe()

        def detach() -> None:  # in a forked child, or where a rank's own capture starts
            run.detached = True
            handle()
            restore()
            clock.drop_probe()

        def undo() -> None:
            handle()
            restore()
            unwatch()
            unpatch_inference()
            unwatch_spawn()
        run.detach, run.undo = detach, undo
        _LIVE.append(detach)
        return run

    def end(self, run: _Run) -> None:
        """Take the run's hooks off, and close what it left open."""
        clock, recorder = run.clock, run.recorder
        with suppress(ValueError):
            _LIVE.remove(run.detach)
        run.undo()
        clock.finish_probe()
        if clock.recording:
            recorder.stop()
            moved = recorder.set_aside()
            if moved:
                print("mystique-gen: note: the script ended inside the recorded step "
                      f"(after {clock.steps} optimizer steps): its partial trace is not "
                      f"a step, set aside as {', '.join(p.name for p in moved)}",
                      file=sys.stderr)
        clock.finish_scalars()
        if clock.profiling:
            clock.finish_profile()

    def finish(self, run: _Run) -> CaptureResult:
        """The run's step.json and result, or the error that says why it has none."""
        clock, recorder, argv = run.clock, run.recorder, list(self.command)
        # The recorded step, two for the scalars' and literals' values and, with Kineto,
        # at least one profiled step; the script may end before all of those.
        recorded = 4 if recorder.kineto_path is not None else 3  # (the script's profiler
        # may have taken Kineto away)
        needed = self.warmup + self.timing_iters + recorded
        if isinstance(run.raised, ScriptError):
            # The capture's own (--step-at names no function), raised in the script's
            # frame where the definition ran: not the script's error.
            raise run.raised
        if run.raised is not None:
            raised = (f"the script exited with status {run.raised.code}"
                      if isinstance(run.raised, SystemExit)
                      else f"the script raised {type(run.raised).__name__}: {run.raised}")
            raise ScriptError(raised + _kept_after_recording(
                self.out, recorder.name, clock, recorder, argv, self.boundary))
        if clock.steps == 0 and not clock.cycle and run.spawned:
            return self._spawned_result(run.spawned)
        if clock.steps == 0 and not clock.cycle and self.step_at is not None:
            raise ScriptError(
                f"the script never returned from {self.step_at} in this process"
                + (run.step_at.unbound() if run.step_at is not None else "")
                + " (--step-at names a function defined at a module's top level, or a "
                "method of a class there, as [MODULE:]NAME; the module is the script's own "
                "by default)")
        if clock.steps == 0 and not clock.cycle:
            raise ScriptError(
                "the script made no optimizer step in this process: a script without a "
                "torch.optim optimizer (inference) has no step boundary; name the function "
                "one call of which is a step with --step-at (or capture it with the Python "
                "API, mystique_gen.tools.capture.capture(step_fn, DIR)); no Python process "
                "the script started was captured either")
        if clock.steps < needed:
            made = "optimizer steps" if self.step_at is None else \
                f"returns from {self.step_at}"
            raise ScriptError(
                f"the script made {clock.steps} {made}; capture needs {needed} "
                f"(--warmup {self.warmup} + --timing-iters {self.timing_iters} + {recorded} "
                "recorded)" + _kept_after_recording(self.out, recorder.name, clock, recorder,
                                                    argv, self.boundary))
        return _write_sidecar(self.out, recorder.name, clock.times, clock.cpu_times, self.warmup,
                              recorder, _sidecar_extra(clock, recorder, argv, self.boundary))

    def _spawned_result(self, names: list[str]) -> CaptureResult:
        """The first captured rank's result, where the script trained in ranks it
        spawned (each wrote its own files, or said on stderr why it could not)."""
        results = []  # (name, step.json, what it holds) of each rank captured whole
        for name in names:
            sidecar = self.out / f"{name}.step.json"
            summary = json.loads(sidecar.read_text()) if sidecar.exists() else {}
            if summary and summary.get("complete", True):
                results.append((name, sidecar, summary))
        if not results:
            raise ScriptError(
                f"the script trained in {len(names)} processes it started with "
                "torch.multiprocessing, and none was captured whole (each rank said why "
                "above)")
        print(f"mystique-gen: captured {len(results)} of the {len(names)} ranks the script "
              f"spawned: {', '.join(n for n, _, _ in results)} (one benchmark replays them: "
              f"mystique-gen {self.out} --kineto {self.out} -o bench.py)", file=sys.stderr)
        _, sidecar, summary = results[0]
        kineto = summary.get("kineto")
        return CaptureResult(self.out / summary["et"], self.out / kineto if kineto else None,
                             sidecar, summary["step_ms_median"], summary["step_ms_min"])


class _SpawnedRank:
    """What ``torch.multiprocessing.spawn`` runs in each child in place of the script's
    function: that function under a capture of its own, whose files are named for the
    child's index (``<name>-rank-<i>``), as torchrun's ranks name theirs. A spawned
    child is a fresh interpreter: without this, the script trained in its ranks to the
    end and the capture saw no step. Picklable, as spawn needs."""

    def __init__(self, fn: Callable[..., object], capture: _ScriptCapture, name: str,
                 nprocs: int) -> None:
        self.fn, self.capture, self.name, self.nprocs = fn, capture, name, nprocs

    def __call__(self, index: int, *args: object) -> None:
        # A rank that dies of a signal inside torch says where, on its stderr (two
        # spawned ranks died so in CI, with no trace of where).
        if not faulthandler.is_enabled():
            faulthandler.enable()
        # The capture this interpreter started for itself (a spawned child imports the
        # bootstrap as any Python process of the job does) yields to the rank's.
        for detach in list(_LIVE):
            detach()
        _LIVE.clear()
        name = _spawned_name(self.name, index, self.nprocs)
        run = self.capture.run(name, lambda: self.fn(index, *args), script_running=True)
        try:
            self.capture.finish(run)
        except ScriptError as exc:
            print(f"mystique-gen: rank {index} ({name}): {exc}", file=sys.stderr)
        if run.raised is not None:
            raise run.raised  # the rank's own error: spawn reports it to the script
        if run.clock.done:
            # Its files written, the rank leaves as a launched worker's capture does,
            # without the interpreter's teardown (that of a process group whose peer
            # has stopped): a spawned serving rank aborted once in CI, "terminate
            # called without an active exception", and spawn failed the capture.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def _no_op() -> None:
    pass


def _spawned_name(name: str, index: int, nprocs: int) -> str:
    """The files' name of the ``index``-th of ``nprocs`` ranks a script spawned."""
    return f"{name}-rank-{index}" if nprocs > 1 else name


def _sidecar_extra(clock: _StepClock, recorder: _Recorder, argv: list[str],
                   boundary: str = "optimizer step") -> dict[str, object]:
    extra: dict[str, object] = {"boundary": boundary, "command": argv,
                                **clock.inputs.sidecar_fields()}
    if recorder.kineto_path is not None:
        extra["profile_steps"] = clock.profiled
    return extra


def _kept_after_recording(out: Path, name: str, clock: _StepClock, recorder: _Recorder,
                          argv: list[str], boundary: str = "optimizer step") -> str:
    """Where the script stopped after its recorded step (it raised, exited or ran out of
    steps while the capture recorded scalars or profiled), write the step.json of what
    was measured and say what the capture lacks: the ET and Kineto trace hold the whole
    step, and without a step.json the benchmark had no eager time to compare with.
    Returns the sentence to add to the error; empty where no step was recorded whole."""
    if clock.recording or not recorder.et_path.exists() or not clock.times:
        return ""
    missing = []
    if clock.steps - clock.warmup - clock.timing_iters < 3:  # the recorded step, then two
        missing.append("the literals the step builds (from the two steps after it)")
    if recorder.kineto_path is not None and not clock.profiled:
        missing.append("profile-only steps (host gaps come from the ET's own Kineto trace)")
        if recorder.profile_path is not None:
            recorder.profile_path.unlink(missing_ok=True)  # holds no whole step
            recorder.profile_path = None
    extra = {**_sidecar_extra(clock, recorder, argv, boundary), "complete": False}
    sidecar = _write_sidecar(out, name, clock.times, clock.cpu_times, clock.warmup,
                             recorder, extra).sidecar_path
    kept = ", ".join(p.name for p in (recorder.et_path, recorder.kineto_path) if p)
    lacking = f", without {' or '.join(missing)}" if missing else ""
    return (f"; the recorded step is whole: {kept} and {sidecar.name} (its eager times"
            f"{lacking}) make a benchmark")


# Interpreter options that take a value (``-W ignore``, ``-X dev``), and those that
# change nothing a capture sees (the script runs in the capture's interpreter).
_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")
_HARMLESS_OPTIONS = set("uBsqEIPb")


def _interpreter_options(argv: list[str]) -> list[str]:
    """``argv`` after ``python``, without the interpreter's own options (``python -u
    train.py``, ``python -W ignore -m pkg.train``): the first was taken for the script
    ("no such script: -u"). ``-W`` filters apply; the others that would change the run
    (``-O``, ``-X``) are said to be ignored; ``-mpkg`` is ``-m pkg``."""
    argv = list(argv)
    while argv and argv[0].startswith("-") and argv[0] not in ("-", "-m"):
        option = argv.pop(0)
        if option == "--":
            break
        if option.startswith("-c"):
            raise ScriptError("python -c is not captured: put the code in a script")
        if option.startswith("-m"):  # -mpkg.train
            return ["-m", option[2:], *argv]
        value = None
        if option in _OPTIONS_WITH_VALUE:
            if not argv:
                raise ScriptError(f"python {option} needs a value")
            value = argv.pop(0)
        elif option[:2] in ("-W", "-X"):
            option, value = option[:2], option[2:]
        if option == "-W":
            with suppress(Exception):
                warnings._processoptions([value])  # type: ignore[attr-defined]
        elif not set(option[1:]) <= _HARMLESS_OPTIONS:
            shown = option if value is None else f"{option} {value}"
            print(f"mystique-gen: note: python option {shown} is ignored: the script runs "
                  "in the capture's own interpreter", file=sys.stderr)
    return argv


def _modes_survive_inference_mode() -> Callable[[], None]:
    """Keep the dispatch keys of Python modes in step with the mode stack where an
    ``inference_mode`` scope ends: it restores the thread's dispatch key set as it was
    when it began, and a step that ends inside it (``--step-at`` generate, called under
    a serving loop's ``inference_mode``) enters or leaves the capture's modes there.
    Left there, the restored set still named a mode that was gone, and the script's
    next factory op (``torch.randint(..., generator=g)``) failed "Hit Python dispatch
    key but no arguments had PyInterpreter"; entered there, the mode missed every op
    after the scope. Returns the undo."""
    cls = torch.autograd.grad_mode.inference_mode
    original = cls.__exit__

    def exit_(self: object, *exc: object) -> None:
        original(self, *exc)
        moded = torch._C._len_torch_dispatch_stack() > 0
        for key in (torch._C.DispatchKey.Python, torch._C.DispatchKey.PythonTLSSnapshot):
            if torch._C._dispatch_tls_is_dispatch_key_included(key) != moded:
                torch._C._dispatch_tls_set_dispatch_key_included(key, moded)

    cls.__exit__ = exit_  # type: ignore[method-assign]
    return lambda: setattr(cls, "__exit__", original)


def _watch_script_profilers(recorder: _Recorder) -> Callable[[], None]:
    """Mark ``recorder`` once the script starts a ``torch.profiler.profile`` of its own
    (a scheduled one starts its sessions later, in ``step()``): one profiler session
    runs at a time, and either the script's ended the capture's (which then crashed
    exporting it) or the capture's made the script's fail to start. Returns the undo."""
    cls = torch.profiler.profile
    original = cls.start

    def start(self: profile) -> None:
        if self is not recorder.prof:
            recorder.script_profiles = True
        original(self)

    cls.start = start  # type: ignore[method-assign]
    return lambda: setattr(cls, "start", original)


def _watch_spawned_processes(
        spawned: list[str], follow: tuple[_ScriptCapture, str] | None,
        clock: _StepClock | None = None) -> Callable[[], None]:
    """Capture each rank the script starts with ``torch.multiprocessing.spawn`` or
    ``start_processes`` (any start method: spawn, fork, forkserver) as a rank of its own,
    under ``follow``'s capture and name (:class:`_SpawnedRank`), and note their names in
    ``spawned``. A second start, or one from a rank itself, is not followed: that is
    said at once. Once the followed ranks have ended, and one of them was captured, the
    script is stopped too: its ranks stopped mid-training, and what it does next waited
    for what they never sent (Lightning's ``ddp_spawn`` reads rank 0's results from a
    queue, forever). Returns the undo."""
    spawn_module = sys.modules.get("torch.multiprocessing.spawn")
    owners = [m for m in (torch.multiprocessing, spawn_module) if hasattr(m, "start_processes")]
    originals = [(m, m.start_processes) for m in owners]
    original = torch.multiprocessing.start_processes

    @functools.wraps(original)
    def start_processes(fn, args=(), nprocs=1, join=True, daemon=False,  # noqa: ANN001
                        start_method="spawn"):  # noqa: ANN001
        if follow is None or spawned:
            print(f"mystique-gen: warning: the script starts {nprocs} processes with "
                  f"torch.multiprocessing ({start_method}): the capture does not record "
                  "what they run (launch ranks with torchrun, or start them once with "
                  "torch.multiprocessing, to capture each)", file=sys.stderr)
            return original(fn, args, nprocs, join, daemon, start_method)
        capture, name = follow
        names = [_spawned_name(name, i, nprocs) for i in range(nprocs)]
        spawned.extend(names)
        started = time.time()
        context = original(_SpawnedRank(fn, capture, name, int(nprocs)), args, nprocs,
                           join, daemon, start_method)
        if join:
            _stop_after_ranks(capture.out, names, started, clock)
            return context
        wait = context.join

        @functools.wraps(wait)
        def joined(*a: object, **k: object) -> bool:
            ended = wait(*a, **k)
            if ended:
                _stop_after_ranks(capture.out, names, started, clock)
            return ended
        context.join = joined
        return context

    for module in owners:
        module.start_processes = start_processes

    def undo() -> None:
        for module, function in originals:
            module.start_processes = function
    return undo


def _stop_after_ranks(out: Path, names: list[str], started: float,
                      clock: _StepClock | None) -> None:
    """Stop the script (``clock``'s ``on_done``, else :class:`CaptureDone`) where a rank
    it started wrote its capture's step.json since ``started``."""
    for name in names:
        with suppress(OSError):
            if (out / f"{name}.step.json").stat().st_mtime >= started - 1.0:
                break
    else:
        return
    if clock is not None and clock.on_done is not None:
        clock.done = True
        clock.on_done()  # (a process captured from its start: it reports, and exits 0)
    raise CaptureDone


class _Job:
    """The captures of one ``mystique-gen capture`` command across the processes it
    starts (the script's own, Lightning's re-run ranks, a launcher's workers): each
    registers in the job's folder once it records, and one that has its step leaves
    it and waits for the others to leave before it stops its script. Lightning's rank
    0 stopped first, and its launcher killed rank 1 mid-write (an ET without its
    Kineto trace, or none); a rank that stops unregistered (the folder named in
    ``JOB_ENV``, none: a plain capture) waits for nothing."""

    WAIT_S = 60.0

    def __init__(self) -> None:
        self.pid: int | None = None  # the registered process (a fork's copy is not)

    @staticmethod
    def _folder() -> Path | None:
        with suppress(Exception):
            folder = json.loads(os.environ[JOB_ENV])["job"]
            return Path(folder) if folder and Path(folder).is_dir() else None
        return None

    def register(self) -> None:
        folder = self._folder()
        if folder is None or self.pid == os.getpid():
            return
        with suppress(OSError):
            (folder / str(os.getpid())).touch()
            self.pid = os.getpid()

    def leave(self) -> Path | None:
        """Unregister this process (its files are written); its folder, None where it
        was not registered."""
        folder = self._folder()
        if folder is None or self.pid != os.getpid():
            return None
        self.pid = None
        (folder / str(os.getpid())).unlink(missing_ok=True)
        return folder

    def finished(self) -> None:
        """Unregister, then wait for the job's other recording processes to finish."""
        folder = self.leave()
        if folder is None:
            return
        deadline = time.monotonic() + self.WAIT_S
        while time.monotonic() < deadline:
            with suppress(OSError):
                if not [p for p in folder.iterdir() if _alive(p.name)]:
                    return
            time.sleep(0.05)
        print("mystique-gen: warning: other processes of the job were still recording "
              f"after {self.WAIT_S:.0f} s: stopping this one's script anyway",
              file=sys.stderr)


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


_JOB = _Job()


@contextmanager
def _job_environment(capture: _ScriptCapture, name: str):  # noqa: ANN202
    """The environment of a captured command or script: every Python process it starts
    (a launcher's workers, a script that re-runs itself as ranks) imports the bootstrap,
    which captures it as :func:`capture_script` captures this one."""
    folder = tempfile.mkdtemp(prefix="mystique-capture-")
    settings = {"out": str(capture.out.resolve()), "name": name, "warmup": capture.warmup,
                "timing_iters": capture.timing_iters, "kineto": capture.kineto,
                "integral_ranges": capture.integral_ranges,
                "integral_data": capture.integral_data,
                "profile_steps": capture.profile_steps, "command": list(capture.command),
                "step_at": capture.step_at,
                "job": folder, "root": str(Path(__file__).resolve().parents[2])}
    path = os.environ.get("PYTHONPATH")
    try:
        with _env({JOB_ENV: json.dumps(settings),
                   "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP)] + ([path] if path else []))}):
            yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _capture_this_process() -> None:
    """Capture this process as a rank of the job whose settings ``JOB_ENV`` holds (the
    bootstrap calls it as the interpreter starts): the script's optimizer steps, as
    :func:`capture_script` captures them, into ``<name>-rank-<RANK>`` (its process
    group's rank). Once its files are written the process exits with status 0, as a
    worker that finished does (an uncaught stop was a failure that made torchrun end
    the other ranks); one that steps too few times says why as it exits."""
    settings = json.loads(os.environ[JOB_ENV])
    capture = _ScriptCapture(Path(settings["out"]), settings["warmup"],
                             settings["timing_iters"], settings["kineto"],
                             settings["integral_ranges"], settings["integral_data"],
                             settings["profile_steps"], tuple(settings["command"]),
                             settings.get("step_at"))
    name = settings["name"]
    # A process without a rank follows the ranks it starts (as the script's own does).
    try:
        run = capture.begin(name, spawns_as=name if rank_stem(name) == name else None,
                            resolve=True, script_running=True)
    except ScriptError as exc:  # --step-at names what this process cannot find
        print(f"mystique-gen: process {os.getpid()}: {exc}", file=sys.stderr)
        return
    pid = os.getpid()

    def report() -> CaptureResult | None:
        capture.end(run)
        try:
            return capture.finish(run)
        except ScriptError as exc:
            print(f"mystique-gen: {run.recorder.name} (process {pid}): {exc}",
                  file=sys.stderr)
            return None

    def done() -> None:
        report()
        _JOB.finished()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def at_exit() -> None:
        if os.getpid() != pid or run.detached or run.clock.done:
            return
        if run.clock.steps or run.clock.cycle or run.spawned:
            report()
        else:
            capture.end(run)
        _JOB.leave()

    run.clock.on_done = done
    atexit.register(at_exit)


def _launched(argv: list[str]) -> bool:
    """Whether ``argv`` is a launcher's command (``torchrun ...``, ``accelerate launch
    ...``, a shell script) rather than a Python script to run in this process."""
    if Path(argv[0]).name.startswith("python") or argv[0] == "-m":
        return False
    if shutil.which(argv[0]) is None:
        return False
    path = Path(argv[0])
    if not path.is_file() or path.suffix == ".py":
        return not path.is_file()
    with suppress(OSError):
        with path.open("rb") as f:
            first = f.readline(200)
        return not (first.startswith(b"#!") and b"python" in first)
    return True


def _captured_since(out: Path, name: str, started: float, whole: bool = True
                    ) -> list[tuple[str, Path, dict]]:
    """The captures of ``name`` (or its ranks) whose step.json was written since
    ``started``, in rank order: whole ones, or with ``whole`` False those short of
    steps too."""
    found = []
    for sidecar in out.glob(f"{glob_escape(name)}*.step.json"):
        stem = sidecar.name[: -len(".step.json")]
        if stem != name and not re.fullmatch(rf"{re.escape(name)}-rank-\d+", stem):
            continue
        with suppress(OSError, ValueError):
            if sidecar.stat().st_mtime < started - 1.0:
                continue
            summary = json.loads(sidecar.read_text())
            if summary.get("complete", True) or not whole:
                found.append((stem, sidecar, summary))
    return sorted(found, key=lambda f: [int(t) if t.isdigit() else t
                                        for t in re.split(r"(\d+)", f[0])])


def glob_escape(text: str) -> str:
    return re.sub(r"([*?[])", r"[\1]", text)


def _say_ranks(out: Path, results: list[tuple[str, Path, dict]], of: str) -> None:
    print(f"mystique-gen: captured {len(results)} {of}: "
          f"{', '.join(n for n, _, _ in results)} (one benchmark replays them: "
          f"mystique-gen {out} --kineto {out} -o bench.py)", file=sys.stderr)


def _result_of(out: Path, found: tuple[str, Path, dict]) -> CaptureResult:
    _, sidecar, summary = found
    kineto = summary.get("kineto")
    return CaptureResult(out / summary["et"], out / kineto if kineto else None,
                         sidecar, summary["step_ms_median"], summary["step_ms_min"])


def _capture_command(argv: list[str], capture: _ScriptCapture, name: str) -> CaptureResult:
    """Run a launcher's command (``torchrun ...``, ``accelerate launch ...``) with every
    Python process it starts captured (:func:`_capture_this_process`); the first rank's
    result. Before, only ``python SCRIPT`` ran ("no such script: torchrun")."""
    started = time.time()
    with _job_environment(capture, name):
        try:
            code = subprocess.run(argv, check=False).returncode
        except OSError as exc:
            raise ScriptError(f"{argv[0]} could not run: {exc}") from None
    results = _captured_since(capture.out, name, started)
    if not results:
        raise ScriptError(
            f"{argv[0]} exited with status {code}, and none of the Python processes it "
            "started was captured whole (each said why above; a process that made no "
            "optimizer step says nothing)")
    _say_ranks(capture.out, results, f"process(es) of {argv[0]}")
    if code != 0:
        print(f"mystique-gen: warning: {argv[0]} exited with status {code}",
              file=sys.stderr)
    return _result_of(capture.out, results[0])


def _find_module(name: str) -> object | None:
    """``name``'s module spec, or None where neither it nor a parent package exists."""
    try:
        return importlib.util.find_spec(name)
    except ImportError:  # a parent package that does not exist
        return None


def result_dict(result: CaptureResult) -> dict[str, object]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(result).items()}
