"""Load a Kineto (PyTorch profiler, Chrome trace format) trace: CPU ops, runtime calls
and GPU activity as plain records.

Only the facts the linker needs are kept. Field names follow what
``torch.profiler``'s ``export_chrome_trace`` writes:

* CPU ops (``cat`` ``cpu_op``/``user_annotation``, ``ph`` ``X``) carry
  ``args["Record function id"]`` (PyTorch >= 2.4, equals the ET ``rf_id``) and
  ``args["External id"]`` (older traces: often equals the ET ``rf_id``);
* runtime calls (``cuda_runtime``, ``cuda_driver``, ...) and GPU activity
  (``kernel``, ``gpu_memcpy``, ``gpu_memset``, ...) share ``args["correlation"]``;
  GPU activity names its ``args["stream"]``;
* with ``profile_memory=True``, every allocation and free is an instant event named
  ``[memory]`` (``ph`` ``i``) with ``args["Addr"]``, ``args["Bytes"]`` (negative for a
  free) and ``args["Device Type"]``/``args["Device Id"]``;
* with ``record_shapes=True`` (or ``with_flops``, which implies it), CPU ops carry
  ``args["Input Dims"]``; with ``with_flops``, some carry ``args["flops"]``;
* with ``with_stack=True``, the Python tracer records every Python call as an event
  of category ``python_function``;
* a trace recorded while torch.distributed was initialised names its process's rank
  in the top-level ``distributedInfo`` metadata (``{"rank": 0, "world_size": 2, ...}``),
  which matches the Kineto traces of a job to their ranks' execution traces.

Timestamps and durations are microseconds, as in the file.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mystique_gen.constants import DEVICE_CATEGORIES, ET_SUFFIX, KINETO_SUFFIX, SIDECAR_SUFFIX
from mystique_gen.errors import TraceError
from mystique_gen.sources.et import RawTrace, parse_json_bytes, trace_from_document

CPU_CATEGORIES = frozenset({"cpu_op", "operator", "user_annotation"})
PYTHON_CATEGORY = "python_function"
# The torch.profiler.profile options a CPU-op argument shows were on (with_stack shows
# as python_function events); the harness's _recorded_as sets them again.
_OPTION_ARGS = {"Input Dims": "record_shapes", "flops": "with_flops"}
# The options torch 2.6 and later write at the top of the file where they were on:
# read first (with_modules shows in no event argument).
_HEADER_OPTIONS = ("record_shapes", "with_flops", "with_stack", "with_modules")
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime", "hip_runtime",
                                "privateuse1_runtime", "xpu_runtime"})
# A device activity the profiler recorded, as the option _recorded_as turns on again:
# tracing it (CUPTI's callbacks on CUDA and ROCm) costs host time in every op and gap,
# which a CPU-only calibration misses. On an H200, a CNN training step's profiled gaps
# added up to 1.3 ms where its unprofiled step left 0.5 ms outside the replayed ops.
_ACTIVITY_OF_RUNTIME = {"xpu_runtime": "xpu_activity",
                        "privateuse1_runtime": "privateuse1_activity"}
_CUDA_ACTIVITY = "cuda_activity"  # CUDA's and ROCm's runtime categories


@dataclass(frozen=True)
class CpuEvent:
    index: int  # position in the file, for stable ordering
    name: str
    pid: int | str
    tid: int | str
    ts: float
    dur: float
    rf_id: int | None  # "Record function id"
    external_id: int | None  # "External id"
    # A Python record_function scope (``cat`` ``user_annotation``: an optimizer's step,
    # a user's label), not one the C++ runtime opens (the autograd engine's): under the
    # ET observer it costs about twice as much to record (`_host_gap`'s annotations).
    annotation: bool = False

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True)
class RuntimeEvent:
    name: str
    pid: int | str
    tid: int | str
    ts: float
    correlation: int


@dataclass(frozen=True)
class GpuEvent:
    name: str
    category: str
    stream: int
    ts: float
    dur: float
    correlation: int


@dataclass(frozen=True)
class MemoryEvent:
    """One allocation (``nbytes`` > 0) or free (< 0) the profiler recorded."""

    tid: int | str
    ts: float
    addr: int
    nbytes: int
    device: tuple[int, int]  # (Device Type, Device Id)


@dataclass
class KinetoTrace:
    name: str
    sha256: str
    cpu_ops: list[CpuEvent]  # sorted by (ts, -dur, index): parents before children
    runtime: list[RuntimeEvent]
    gpu: list[GpuEvent]
    rank: int | None = None  # distributedInfo.rank, where recorded
    memory: list[MemoryEvent] = field(default_factory=list)  # by time; profile_memory only
    # The torch.profiler.profile options the trace shows were on, beside memory
    # (record_shapes, with_flops, with_stack): each costs host time per op or per
    # Python call in its gaps.
    options: frozenset[str] = frozenset()
    python_calls: list[CpuEvent] = field(default_factory=list)  # with_stack: by start

    @property
    def with_observer(self) -> bool:
        """Recorded with an ET observer attached: some CPU op has a record function id
        (torch 2.4 and later write one; see without_observer)."""
        return any(e.rf_id for e in self.cpu_ops)

    @property
    def without_observer(self) -> bool:
        """Recorded without an ET observer: every CPU op writes "Record function id"
        as 0. Torch draws those ids only for a callback that asks for them, as the
        observer does; a trace of an older torch (no such field) cannot tell."""
        return bool(self.cpu_ops) and all(e.rf_id == 0 for e in self.cpu_ops)


def load_kineto(path: str | Path) -> KinetoTrace:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"no such Kineto trace file: {path.name}")
    raw = path.read_bytes()
    doc = parse_json_bytes(raw, path.name)
    return kineto_from_document(doc, name=path.name, sha256=hashlib.sha256(raw).hexdigest())


def kineto_from_document(doc: Any, *, name: str, sha256: str = "") -> KinetoTrace:
    if isinstance(doc, dict) and "nodes" in doc and "traceEvents" not in doc:
        return linked_kineto(trace_from_document(doc, name=name, sha256=sha256))
    if isinstance(doc, list):  # the bare-array form of the Chrome trace format
        events = doc
    elif isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events = doc["traceEvents"]
    else:
        raise TraceError(f"{name}: no 'traceEvents' list; is this a Kineto trace?")
    cpu: list[CpuEvent] = []
    runtime: list[RuntimeEvent] = []
    gpu: list[GpuEvent] = []
    memory: list[MemoryEvent] = []
    python: list[CpuEvent] = []
    options = {key for key in _HEADER_OPTIONS
               if isinstance(doc, dict) and doc.get(key) in (1, True)}
    for i, ev in enumerate(events):
        if isinstance(ev, dict) and ev.get("ph") == "i" and ev.get("name") == "[memory]":
            found = _memory_event(ev, f"traceEvents[{i}]")
            if found is not None:
                memory.append(found)
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue  # metadata, flow arrows, counters
        cat = str(ev.get("cat", "")).lower()
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        where = f"traceEvents[{i}]"
        if cat == PYTHON_CATEGORY:
            python.append(CpuEvent(
                index=i, name=str(ev.get("name", "")), pid=ev.get("pid", 0),
                tid=ev.get("tid", 0), ts=_number(ev, "ts", where), dur=_number(ev, "dur", where),
                rf_id=None, external_id=None))
            continue
        if cat in CPU_CATEGORIES:
            options.update(opt for key, opt in _OPTION_ARGS.items() if key in args)
            cpu.append(CpuEvent(
                index=i, name=str(ev.get("name", "")), pid=ev.get("pid", 0),
                tid=ev.get("tid", 0), ts=_number(ev, "ts", where), dur=_number(ev, "dur", where),
                rf_id=_optional_int(args.get("Record function id")),
                external_id=_optional_int(args.get("External id")),
                annotation=cat == "user_annotation",
            ))
        elif cat in RUNTIME_CATEGORIES:
            options.add(_ACTIVITY_OF_RUNTIME.get(cat, _CUDA_ACTIVITY))
            corr = _optional_int(args.get("correlation"))
            if corr is not None:
                runtime.append(RuntimeEvent(str(ev.get("name", "")), ev.get("pid", 0),
                                            ev.get("tid", 0), _number(ev, "ts", where), corr))
        elif cat in DEVICE_CATEGORIES:
            corr = _optional_int(args.get("correlation"))
            stream = _optional_int(args.get("stream"))
            if corr is not None and stream is not None:
                gpu.append(GpuEvent(str(ev.get("name", "")), cat, stream,
                                    _number(ev, "ts", where), _number(ev, "dur", where), corr))
    cpu.sort(key=lambda e: (e.ts, -e.dur, e.index))
    runtime.sort(key=lambda e: e.ts)
    memory.sort(key=lambda e: e.ts)
    python.sort(key=lambda e: (e.ts, e.index))
    if python:
        options.add("with_stack")
    return KinetoTrace(name=name, sha256=sha256, cpu_ops=cpu, runtime=runtime, gpu=gpu,
                       rank=_recorded_rank(doc), memory=memory, options=frozenset(options),
                       python_calls=python)


def linked_kineto(trace: RawTrace) -> KinetoTrace:
    """The Kineto times an ET+ (Chakra's trace_link) carries, as a Kineto trace: each op
    node's ``ts`` and ``inclusive_dur`` a CPU event with its ``rf_id``, and each device
    activity node a GPU event launched from within the op below which trace_link put
    it (a runtime call at that op's start, on its thread)."""
    if not trace.linked_timing:
        raise TraceError(f"{trace.name}: an execution trace (no 'traceEvents') without "
                         "linked Kineto times (no node has 'ts' and 'inclusive_dur'); pass "
                         "its Kineto trace")
    by_id = {n.id: n for n in trace.nodes}
    cpu: list[CpuEvent] = []
    for i, node in enumerate(trace.nodes):
        ts, dur = node.attrs.get("ts"), node.attrs.get("inclusive_dur")
        if _is_number(ts) and _is_number(dur):
            cpu.append(CpuEvent(index=i, name=node.name, pid=0, tid=node.tid, ts=float(ts),
                                dur=float(dur), rf_id=node.rf_id, external_id=None))
    runtime: list[RuntimeEvent] = []
    gpu: list[GpuEvent] = []
    for correlation, device in enumerate(trace.device_nodes, start=1):
        launcher = by_id.get(device.parent)
        ts, dur = device.attrs.get("ts"), device.attrs.get("inclusive_dur")
        start = launcher.attrs.get("ts") if launcher is not None else None
        stream = device.attrs.get("stream")
        if launcher is None or not (_is_number(ts) and _is_number(dur) and _is_number(start)):
            continue
        runtime.append(RuntimeEvent("launch", 0, launcher.tid, float(start), correlation))
        gpu.append(GpuEvent(device.name, str(device.attrs.get("cat")),
                            stream if isinstance(stream, int) else 0, float(ts), float(dur),
                            correlation))
    cpu.sort(key=lambda e: (e.ts, -e.dur, e.index))
    runtime.sort(key=lambda e: e.ts)
    return KinetoTrace(name=trace.name, sha256=trace.sha256, cpu_ops=cpu, runtime=runtime,
                       gpu=gpu)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _memory_event(ev: dict[str, Any], where: str) -> MemoryEvent | None:
    """A ``[memory]`` instant event, or None where it lacks an address or a size."""
    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
    addr, nbytes = _optional_int(args.get("Addr")), _optional_int(args.get("Bytes"))
    if addr is None or not nbytes:
        return None
    device = (_optional_int(args.get("Device Type")) or 0,
              _optional_int(args.get("Device Id")) or 0)
    return MemoryEvent(ev.get("tid", 0), _number(ev, "ts", where), addr, nbytes, device)


def _recorded_rank(doc: Any) -> int | None:
    """``distributedInfo.rank`` of the document, where it is a rank (a non-negative int)."""
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    if isinstance(info, str):  # written as a JSON string by some exporters
        try:
            info = json.loads(info)
        except ValueError:
            return None
    rank = _optional_int(info.get("rank")) if isinstance(info, dict) else None
    return rank if rank is not None and rank >= 0 else None


def _number(ev: dict[str, Any], key: str, where: str) -> float:
    value = ev.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(f"{where}: '{key}' is {type(value).__name__}, expected a number")
    return float(value)


def _optional_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def sidecar_beside(trace: str | Path) -> dict[str, Any]:
    """The capture's ``<name>.step.json`` next to ``trace`` (its ``<name>.kineto.json``
    or ``<name>.et.json``), or an empty dict where there is none (another tool's
    trace)."""
    trace = Path(trace)
    suffix = next((s for s in (KINETO_SUFFIX, ET_SUFFIX) if trace.name.endswith(s)), None)
    if suffix is None:
        return {}
    sidecar = trace.with_name(trace.name[: -len(suffix)] + SIDECAR_SUFFIX)
    try:
        doc = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def profile_beside(kineto: str | Path, sidecar: dict[str, Any] | None = None) -> Path | None:
    """The profile-only trace named by the capture sidecar next to ``kineto`` (read
    here unless given), if any."""
    name = (sidecar_beside(kineto) if sidecar is None else sidecar).get("profile")
    if not isinstance(name, str):
        return None
    path = Path(kineto).with_name(name)
    return path if path.is_file() else None


def host_probe_of(sidecar: dict[str, Any]) -> float | None:
    """The capture host's Python speed while it profiled its profile-only steps (the
    sidecar's ``host_probe_us``: ``_host_probe_us`` of harness/runtime.py), if any."""
    return _positive(sidecar, "host_probe_us")


def threads_of(sidecar: dict[str, Any]) -> int | None:
    """The intra-op CPU threads the capture ran with (the sidecar's ``threads``), if
    recorded."""
    value = sidecar.get("threads")
    return value if type(value) is int and value > 0 else None


def host_share_of(sidecar: dict[str, Any]) -> float | None:
    """The median share of the capture's timed steps in which the step's thread had
    the CPU (the sidecar's ``host_share``, ``tools/capture.host_share``), if any."""
    return _positive(sidecar, "host_share")


def step_ms_of(sidecar: dict[str, Any]) -> float | None:
    """The eager step time the capture measured without any recorder attached (the
    sidecar's ``step_ms_median``), if any: the clock a replay is compared with."""
    return _positive(sidecar, "step_ms_median")


def scalars_of(sidecar: dict[str, Any], key: str = "scalars"
               ) -> dict[str, dict[str, list[float]]]:
    """The values of 0-d floating arguments the capture recorded (the sidecar's
    ``scalars``: op overload -> tensor ordinal -> values in call order; ``key``
    ``integer_scalars``: of 0-d integral ones), if any."""
    found = sidecar.get(key)
    if not isinstance(found, dict):
        return {}
    return {op: {str(k): [float(v) for v in values if isinstance(v, (int, float))]
                 for k, values in by.items() if isinstance(values, list)}
            for op, by in found.items() if isinstance(op, str) and isinstance(by, dict)}


def literals_of(sidecar: dict[str, Any]) -> list[list[float | int] | None]:
    """The values of the literals the capture recorded (the sidecar's ``literals``: per
    ``aten::lift_fresh`` call, in call order, its values flattened, or None where it
    recorded none), if any."""
    found = sidecar.get("literals")
    if not isinstance(found, list):
        return []
    return [values if isinstance(values, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) else None
        for values in found]


def _positive(sidecar: dict[str, Any], key: str) -> float | None:
    value = sidecar.get(key)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def begun_between(starts: list[float], begin: float, end: float) -> int:
    """How many of the sorted start times lie in [begin, end): the scopes begun in a
    host gap (passes/link.py, passes/hostgaps.py count them the same way)."""
    return bisect_left(starts, end) - bisect_left(starts, begin)


@dataclass(frozen=True)
class HostGap:
    """The host time before one op that no replayed op spans, in microseconds, with
    the profiler scopes begun in it (``events``: the C++ runtime's; ``annotations``:
    Python record_function scopes) and its traced Python calls (``calls``)."""

    us: float
    events: int = 0
    calls: int = 0
    annotations: int = 0


Thread = tuple[object, object]  # (pid, tid) of a Kineto thread
Key = TypeVar("Key")


def annotation_starts(events: list[CpuEvent]) -> dict[Thread, list[float]]:
    """:func:`starts_by_thread` of the Python record_function scopes among ``events``."""
    return starts_by_thread([e for e in events if e.annotation])


def begun_in(threads: set[Thread] | tuple[Thread, ...], begin: float, end: float,
             starts: dict[Thread, list[float]], calls: dict[Thread, list[float]],
             annotated: dict[Thread, list[float]]) -> tuple[int, int, int]:
    """What began in [begin, end) on ``threads``, as :class:`HostGap` counts it: the
    scopes the C++ runtime opened (``starts`` less ``annotated``), the traced Python
    calls, and the Python record_function scopes."""

    def count(found: dict[Thread, list[float]]) -> int:
        return sum(begun_between(found.get(t, []), begin, end) for t in threads)

    notes = count(annotated)
    return count(starts) - notes, count(calls), notes


def starts_by_thread(events: list[CpuEvent]) -> dict[Thread, list[float]]:
    """Each thread's event start times, sorted (for :func:`begun_between`)."""
    starts: dict[Thread, list[float]] = defaultdict(list)
    for e in events:
        starts[(e.pid, e.tid)].append(e.ts)
    for found in starts.values():
        found.sort()
    return starts


def host_gaps(order: list[tuple[int, int, CpuEvent | None]],
              starts: dict[Thread, list[float]], calls: dict[Thread, list[float]], *,
              serial: bool, annotated: dict[Thread, list[float]]) -> dict[int, HostGap]:
    """The gap before each op of ``order`` (node id, its recorded thread, its linked
    event or None), given in the order the benchmark replays them; an op with no gap
    is left out (the first, one unlinked, one after an unlinked op).

    ``serial`` (one replay thread): the time since the latest end of any earlier op,
    on any thread. On CUDA the autograd engine runs backward on a thread of its own
    while the step's thread waits, so that thread's gap before the optimizer holds the
    whole backward pass, which a serial replay runs as ops already; counted per thread
    it replayed a transformer's training step 2.3 times slower than the original.
    Otherwise (a host thread per recorded thread): the time since the previous op on
    the same thread, as each replay thread waits its own gaps beside the others.

    ``starts`` and ``calls``: sorted start times per thread of every profiler scope and
    traced Python call; those begun in a gap, on its op's thread or on the thread of
    the op before it, are counted in it; ``annotated``: the starts among ``starts``
    of Python record_function scopes (:func:`annotation_starts`), counted apart."""
    found: dict[int, HostGap] = {}
    for node_id, ev, prev, begin in gap_begins(order, serial=serial):
        if prev is not None:
            threads = {(ev.pid, ev.tid), (prev.pid, prev.tid)}
            found[node_id] = HostGap(max(0.0, ev.ts - begin),
                                     *begun_in(threads, begin, ev.ts, starts, calls, annotated))
    return found


def gap_begins(order: Iterable[tuple[Key, int, CpuEvent | None]], *, serial: bool
               ) -> Iterator[tuple[Key, CpuEvent, CpuEvent | None, float]]:
    """Each linked op of ``order`` (a key, its recorded thread, its linked event or
    None, in replay order), its event, the event its gap follows and where that gap
    begins (see :func:`host_gaps`); no event before it (the first op, or one after an
    unlinked op): it has no gap."""
    last: dict[int | None, CpuEvent | None] = {}  # previous op's event (per thread)
    latest_end = float("-inf")
    for key, thread, ev in order:
        lane = None if serial else thread
        prev = last.get(lane)
        if ev is not None:
            begin = float("-inf") if prev is None else \
                max(latest_end, prev.end) if serial else prev.end
            yield key, ev, prev, begin
            latest_end = max(latest_end, ev.end)
        last[lane] = ev
