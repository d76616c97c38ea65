"""The intermediate representation: what the benchmark replays, as typed dataclasses.

Lowering turns selected trace nodes into :class:`Op` records whose arguments are
:data:`Value` trees. The tensor pass then gives every tensor a :class:`Storage`
(one buffer per recorded storage lifetime) and a binding that says where its value
comes from at run time. Templates read only this module's types, through the
emitter.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from math import prod

from mystique_gen.diagnostics import Diagnostic, Level
from mystique_gen.errors import MystiqueError
from mystique_gen.harness.fills import FillKind
from mystique_gen.ir.dist import CommInfo, DistInfo
from mystique_gen.ir.dtypes import ITEM_SIZES
from mystique_gen.ir.schema import ArgSpec, Signature


@dataclass(frozen=True, slots=True)
class SparseLayout:
    """A sparse COO tensor's structure, which the observer does not record with it (it
    has no storage: ``[id, 0, 0, 0, 0, ""]``) but the ops reading its parts do
    (``_nnz``, ``_indices``, ``sparse_dim``, ``is_coalesced``: passes/select.py
    ``sparse_tensors``)."""

    sparse_dim: int
    nnz: int | None  # None: no op recorded it
    coalesced: bool


@dataclass(frozen=True, slots=True)  # slots: a million-op program holds millions
class TensorMeta:
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: str  # torch attribute name: "float32"
    device: str  # device kind as recorded: "cpu", "cuda", ...
    sparse: SparseLayout | None = None  # a sparse COO tensor; strides mean nothing then
    mkldnn: bool = False  # an MKLDNN (oneDNN) tensor: opaque, host only, no strides

    @property
    def storageless(self) -> bool:
        """A layout without storage (sparse COO, MKLDNN): its memory is no view of a
        storage the trace names (all such tensors are on storage id 0)."""
        return self.sparse is not None or self.mkldnn

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def extent(self) -> int:
        """Elements of storage this view needs: offset + largest index + 1; for a sparse
        tensor, its values (``nnz`` rows of its dense dimensions)."""
        if self.sparse is not None:
            return (self.sparse.nnz or 0) * prod(self.shape[self.sparse.sparse_dim:])
        if self.numel == 0:
            return self.offset
        spans = zip(self.shape, self.strides, strict=True)
        return self.offset + sum((n - 1) * abs(s) for n, s in spans) + 1


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Init:
    """How a materialised storage is filled: a kind the harness implements
    (harness/fills.py); a kind it does not know is an error here, never zeros later."""

    kind: FillKind
    low: float | int = 0
    high: float | int = 1
    why: str = ""  # provenance, e.g. "aten::embedding_bag indices < 1000 rows"
    data: bytes = b""  # kind "data": recorded values, little-endian ints of ``low`` bytes
    values: tuple[float | int, ...] = ()  # kind "values": a recorded literal's elements

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", FillKind(self.kind))
        except ValueError:
            raise MystiqueError(f"internal error: unknown fill kind {self.kind!r}") from None


@dataclass(eq=False)
class Storage:
    """One recorded storage over one lifetime (storage ids are reused after frees)."""

    index: int  # order of first appearance
    dtype: str
    device: str
    extent: int  # elements
    materialised: bool  # True: built before timing; False: produced by a replayed op
    init: Init | None = None
    requires_grad: bool = False  # a parameter: its views are leaves that require grad
    # An input only guarded ops read (passes/values.py): their indices. The file makes
    # it only where one of them resolves (a DLRM rank's 5.1 GB of embedding weights
    # that only its fbgemm:: lookup reads).
    only_guarded_readers: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        return self.extent * ITEM_SIZES.get(self.dtype, 4)


# Where a tensor's value comes from at run time.
@dataclass(frozen=True, eq=False, slots=True)
class InputView:
    """A view of a materialised storage, built once before timing."""

    storage: Storage
    meta: TensorMeta


@dataclass(frozen=True, slots=True)
class OpOutput:
    """Returned by a replayed op: ``path`` indexes into the op's result."""

    op_index: int
    path: tuple[int, ...]


@dataclass(frozen=True, eq=False, slots=True)
class DerivedView:
    """A view of a produced storage that no replayed op returned: ``as_strided`` of ``base``."""

    base: Binding
    meta: TensorMeta


Binding = InputView | OpOutput | DerivedView


@dataclass(eq=False, slots=True)
class TensorValue:
    trace_id: int
    storage_id: int
    meta: TensorMeta
    binding: Binding | None = None  # set by the tensor pass
    storage: Storage | None = None


@dataclass(frozen=True, slots=True)
class Literal:
    value: int | float | complex | bool | str | None


@dataclass(frozen=True, slots=True)
class TorchConstant:
    """``torch.<name>``: a dtype, layout or memory format."""

    name: str


@dataclass(frozen=True, slots=True)
class DeviceValue:
    """A device argument, by kind ("cpu", "cuda"); the trace's main kind becomes the
    benchmark's ``--device`` and "cpu" stays on the host."""

    kind: str


@dataclass(frozen=True, slots=True)
class ListValue:
    items: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class GroupName:
    """A process group's name at run time (functional collectives name their group):
    the benchmark's group ``index``, whatever name the replay's group gets."""

    index: int


@dataclass(frozen=True, slots=True)
class FreshStorage:
    """A ``Storage`` argument, which the trace writes as ``"<Storage>"``: a new untyped
    storage of ``nbytes`` on a device of ``kind``, what the op's result then lies on
    (``aten::set_`` wrapping a pickle's bytes in ``all_gather_object``)."""

    nbytes: int
    kind: str


@dataclass(frozen=True, slots=True)
class StandInTensor:
    """A tensor the trace recorded without storage (a vmap wrapper, a tensor subclass),
    read by an op that only asks its metadata (``aten::is_same_size`` in the autograd
    engine under ``torch.func``): a new tensor of the recorded shape, strides and dtype
    on the benchmark's device, made at the call."""

    meta: TensorMeta


@dataclass(frozen=True, slots=True)
class PackedLinear:
    """A quantized linear op's packed weight (``LinearPackedParamsBase``), which the
    trace writes as ``"<Object>"``: a weight of ``out_features`` x ``in_features``,
    packed as ``packing`` ("int8" or "fp16") once per op, ``key`` (its op's index)."""

    key: int
    out_features: int
    in_features: int
    packing: str


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A weight an op takes packed in a backend's opaque format, which the trace
    records without storage and random values cannot stand for (MKL's packed GEMM
    weight reads a header from it): packed at the op's first call by ``packer`` from
    the op's own arguments named ``sources``, once per ``key`` (its op's index)."""

    key: int
    packer: str  # the packing op: "mkl::_mkl_reorder_linear_weight"
    sources: tuple[str, ...]


Value = (Literal | TorchConstant | DeviceValue | ListValue | TensorValue | GroupName
         | FreshStorage | StandInTensor | PackedLinear | PackedWeight)


@dataclass(eq=False, slots=True)
class Arg:
    spec: ArgSpec
    value: Value


@dataclass(eq=False, slots=True)
class Op:
    index: int  # position in replay order
    node_id: int
    signature: Signature
    args: list[Arg]
    outputs: list[Value]  # one per schema return
    thread: int
    scope: tuple[str, ...]  # names of the enclosing annotations, outermost first
    guard: str | None = None  # why this op may be unavailable at run time
    derive_before: list[DerivedView] = field(default_factory=list)  # views made just before
    # A later view is derived from this op's outputs by storage offset (passes/tensors.py):
    # a data-dependent list result keeps its tensors as rows of one buffer when fitted.
    outputs_viewed_by_offset: bool = False
    # Boolean results a data-dependent op later reads as its mask, by output position: the
    # true elements that op recorded (passes/values.py). Replayed values decide a
    # computed mask, so it is fitted to that count where it is made, and every reader
    # (the forward's x[mask], the backward's index_put_ with it) sees one mask.
    true_counts: dict[int, int] = field(default_factory=dict)
    # Integer results a later op reads in a form replayed values miss, by output
    # position: (fill kind, a, b) as the reader's fill states it. ``descending`` (the
    # rows they add up to, the longest): lengths ``pack_padded_sequence`` reads, from
    # ``(tokens != 0).sum(1)``; ``ends`` (the alignment, the total): a grouped
    # matmul's group ends, from token counts a replayed router or all_to_all gave.
    # Computed from replayed values, they are fitted where they are made, as masks are.
    fit_values: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    # Of those, the lengths a data-dependent op's recorded children showed, longest
    # first (oprules.KERNEL_PATHS: a pack's blocks): fitted to these exactly.
    recorded_lengths: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # What the file fits after this op (its data-dependent outputs, the masks above) is
    # made by it and written by no later op (passes/values.py): a fit made once may
    # serve every iteration, which the file keys by the op's index.
    fits_reusable: bool = False
    # Data-dependent outputs (by position) the file leaves at their replayed size: every
    # reader writes through them as indices (``x[torch.where(m)] = v``), its result the
    # size of what it writes whatever their count (passes/values.py).
    unfitted: frozenset[int] = frozenset()
    # Outputs (by position) a later view reads through views only, in a layout this
    # op's kernel may give otherwise where the replay runs: the file lays them out as
    # recorded (passes/tensors.py keep_viewed_layouts).
    keep_layout: tuple[int, ...] = ()
    # A stride-dependent view in a trace that recorded no strides: the layout it reads
    # is unknown, and where this device's kernels laid it out so that it cannot view
    # it, the file views a contiguous copy (runtime ``_viewed``).
    copy_if_unviewable: bool = False
    # Index arguments computed from values that are not the original's (what a fitted
    # mask selected, integer arithmetic on filled integers), by (argument name, position
    # in its list or None): the size they index (passes/values.py). They may fall out of
    # range where the original's did not, so they are wrapped into range where read.
    in_range: dict[tuple[str, int | None], int] = field(default_factory=dict)
    # Integer divisor arguments computed from values that are not the original's (the
    # same as in_range's, passes/values.py): one may be 0 where the original's never
    # was, and an integer division by 0 raises; the file divides by 1 there.
    nonzero: tuple[str, ...] = ()
    # Value domains this op's tensor arguments inherit from a composite op it ran inside
    # and is replayed without (passes/select.py descends into such ops): {(argument,
    # list position or None): ("positive" or "range", low, high, why)}. quantile's
    # levels in [0, 1] hold for the children that turn them into indices.
    domains: dict[tuple[str, int | None], tuple[str, float, float, str]] = field(
        default_factory=dict)
    free_after: list[Binding] = field(default_factory=list)  # variables last read here
    # Variables last read here that stay alive (the original freed them later,
    # passes/frees.py) but whose autograd history goes: the replay's forward records a
    # graph its explicit backward never consumes, which would keep every saved tensor.
    drop_history_after: list[Binding] = field(default_factory=list)
    # False: the original freed an input this op read in grad mode before the next
    # backward began, so its autograd node saved none of it (activation
    # checkpointing's pack hook, save_on_cpu); the replay's node saves nothing either
    # (passes/frees.py). Its graph would keep the input to the backward (a checkpointed
    # MLP's peak was the unchecked one's).
    keeps_saved: bool = True
    # Schedule (passes/streams.py; issue 6's --compose sets ``thread``/``stream`` too):
    # ``thread`` above is the host thread that issues the op (one replay unit per thread
    # when Program.threaded); ``stream`` the recorded stream its device work ran on, None
    # for the replay's current stream. Waits name ops by ``index``.
    stream: int | None = None
    stream_waits: list[int] = field(default_factory=list)  # ops on other streams to wait for
    thread_waits: list[int] = field(default_factory=list)  # ops on other threads to wait for
    timing: OpTiming | None = None  # facts from the Kineto trace (passes/link.py)
    comm: CommInfo | None = None  # a torch.distributed call (passes/comms.py)
    # Functional collectives whose results this op is the first to read: the original
    # waited for them inside its dispatch (DTensor, AsyncCollectiveTensor), so the
    # replay waits just before it (passes/comms.py).
    waits_on: list[int] = field(default_factory=list)
    # Autograd (passes/autograd.py): the original ran this op in grad mode (its seq_id >=
    # 0; None where no seq_id was recorded); it, or an op inside it, created an autograd
    # node (passes/select.py grad_node_makers); the grad mode to replay it in (None:
    # whichever is current).
    records_grad: bool | None = None
    made_grad_node: bool | None = None
    grad_mode: bool | None = None
    # Arguments that required grad although the op recorded no node (their kernel
    # depends on it: oprules.GRAD_REVEALED_BY); passes/autograd.py makes them leaves.
    requires_grad_args: tuple[str, ...] = ()
    # What the recorded children showed about the input values that decide the
    # kernel's path (oprules.KERNEL_PATHS; passes/values.py fills the inputs so).
    kernel_path: tuple | None = None
    # The public function that dispatches exactly this overload ("torch.add"), where
    # probing proved one (passes/public_calls.py); None: call it through torch.ops.
    public_call: str | None = None
    # Arguments the public call leaves out, recorded at their schema's default: the
    # callable takes them only by keyword, or not at all (passes/public_calls.py).
    public_omits: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.signature.qualified_name


@dataclass(frozen=True)
class KernelRecord:
    """One GPU activity (kernel, memcpy, memset) an op launched, from Kineto."""

    name: str
    stream: int
    dur_us: float


@dataclass
class OpTiming:
    """Recorded durations of one replayed op, in microseconds."""

    cpu_us: float  # inclusive CPU time of the op
    cpu_self_us: float  # exclusive: minus the CPU ops it called
    gap_us: float | None = None  # host time on its thread since the previous top-level op
    gap_events: int = 0  # profiler-only scopes recorded in that gap (passes/hostgaps.py)
    gap_calls: int = 0  # Python calls the profiler's Python tracer recorded in that gap
    gap_annotations: int = 0  # of those scopes, Python record_function ones (not counted
    # in gap_events: they cost the recorders another amount each)
    kernels: tuple[KernelRecord, ...] = ()

    @property
    def gpu_us(self) -> float:
        return sum(k.dur_us for k in self.kernels)


@dataclass(frozen=True)
class StreamInfo:
    """A recorded stream: how many replayed ops run on it and how many kernels it ran."""

    stream: int
    ops: int
    kernels: int
    main: bool  # the replay's current stream (ops on it carry ``stream=None``)


@dataclass
class ProgramTiming:
    """The Kineto trace linked to the program and its end-to-end duration."""

    kineto: str  # file name
    sha256: str
    original_ms: float  # first linked op start to last op/kernel end
    linked_ops: int
    link_methods: dict[str, int] = field(default_factory=dict)  # method -> ops linked
    host_gaps: str = "linked"  # where the gaps come from (passes/hostgaps.py)
    # The gaps come from a Kineto trace recorded with the ET observer attached (one
    # profiler session, linked by id): the benchmark calibrates the observer's cost out.
    observer_in_gaps: bool = False
    # How the gaps' recorders were set, for the benchmark to calibrate under the same:
    # the profiler recorded memory events (profile_memory), and the ET observer whose
    # work is in the gaps computed each integral tensor's range (both cost host time
    # in the gaps: 14 us before each embedding_bag, measured here, for the ranges).
    memory_in_gaps: bool = False
    observer_ranges: bool = False
    # The schema that observer wrote: only an observer writing the same one (the same
    # implementation) measures the same cost at run time.
    observer_schema: str = ""
    # The profiler's other options that cost host time in the gaps (kineto
    # options: record_shapes, with_flops, with_stack, and a device's activity as
    # cuda_activity, xpu_activity), as the trace shows them:
    # measured here, record_shapes added 0.13 us to a gap, with_stack 0.2 us plus 0.2 us
    # per Python call it traced (gap_calls), which no replayed op makes.
    profiler_options: tuple[str, ...] = ()
    tail_gap_us: float | None = None  # host time after the last op, to the step's end
    # The capture host's Python speed (``_host_probe_us``, harness/runtime.py) while it
    # recorded the gaps: ``--host-gaps scaled`` scales them by its own over this.
    host_probe_us: float | None = None
    tail_gap_events: int = 0  # profiler-only scopes recorded in the tail
    tail_gap_calls: int = 0  # Python calls traced in the tail (with_stack)
    tail_gap_annotations: int = 0  # Python record_function scopes begun in the tail
    # Each recorded step's gaps in total, where the gaps are medians over several steps:
    # how far they disagree is the recording's noise, against which the benchmark
    # weighs what a same-session correction leaves to wait (``_calibrate_gaps``).
    step_gap_totals_us: tuple[float, ...] = ()
    # How many recorded steps each gap is the median over (1: one step's own gaps, such
    # as the linked step's). Fewer than three hold the recorders' cold first step,
    # which the benchmark's calibration then mirrors (harness ``_cold_steps``).
    gap_steps: int = 1
    # Whether the profiler ran before the first of those steps (a schedule's warm-up:
    # its first step is ``ProfilerStep#1`` or later), so that only the ET observer
    # started cold at it.
    profiler_warm: bool = False
    # What the replayed gaps add up to: the median step's, or the quietest's where the
    # others stalled (passes/hostgaps.py ``typical_step_total``).
    step_gap_typical_us: float | None = None
    # The eager step the capture timed with no recorder attached (its step.json), where
    # one is beside the Kineto trace. The Kineto span above is a profiled step, with the
    # ET observer attached where linked by id: 10x the eager step, measured on an
    # embedding model's training step.
    measured_step_ms: float | None = None
    # The median Kineto span of the steps profiled without the ET observer whose gaps
    # replay (a capture's profile-only steps, or the steps of a same-session profile
    # the observer was not started in; ``gap_steps`` of them): the step as it ran with
    # the profiler alone, where the recorded step's span above carries the observer.
    profiled_step_ms: float | None = None

    @property
    def step_ms(self) -> float:
        """The original step time a replay is compared with: the measured eager step
        where known, else the steps profiled without the ET observer, else the Kineto
        span of the recorded step (see :attr:`step_ms_from`)."""
        if self.measured_step_ms is not None:
            return self.measured_step_ms
        return self.profiled_step_ms if self.profiled_step_ms is not None \
            else self.original_ms

    @property
    def step_ms_from(self) -> str:
        """Where :attr:`step_ms` comes from, in words."""
        if self.measured_step_ms is not None:
            return "eager steps the capture measured, its step.json"
        if self.profiled_step_ms is not None:
            many = self.gap_steps != 1
            return (f"median Kineto span of {self.gap_steps} step{'s' if many else ''}"
                    " profiled without the ET observer")
        if self.observer_in_gaps:
            return "Kineto span of the recorded step, ET observer attached"
        return "Kineto span of the recorded step, profiled"


@dataclass
class TraceInfo:
    name: str
    sha256: str
    schema: str
    node_count: int
    # Intra-op CPU threads the capture ran with (its step.json), where known: the
    # benchmark says so where it runs with another count.
    num_threads: int | None = None
    # The observer wrote strides (passes/tensors.py keep_viewed_layouts): without them
    # every tensor is taken to be row-major.
    strides_recorded: bool = True
    # The N of the ProfilerStep#N the filters kept, if they kept one step: the ranks of
    # one job are warned where theirs differ (passes/filters.py steps_apart).
    step: int | None = None


@dataclass
class Program:
    trace: TraceInfo
    ops: list[Op] = field(default_factory=list)
    storages: list[Storage] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    primary_device: str = "cpu"  # the recorded device kind that --device replaces
    # Estimated peak memory of one iteration, inputs included, on the primary device;
    # beside an accelerator, the host's tensors' peak apart (each device's allocator
    # and free memory are its own).
    peak_bytes: int = 0
    host_peak_bytes: int = 0
    # Every fact reported about the trace: nodes not replayed, guarded ops, filters
    # applied, notes (the docstring, inspect and errors render from these).
    diagnostics: list[Diagnostic] = field(default_factory=list)
    timing: ProgramTiming | None = None  # set when a Kineto trace is linked
    streams: list[StreamInfo] = field(default_factory=list)  # recorded streams, main first
    threaded: bool = False  # replay each distinct Op.thread on its own Python thread
    threaded_by: str = "--threads"  # the flag that asked for it (the header says)
    distributed: DistInfo | None = None  # ranks and process groups (passes/ranks.py)
    # Forward-AD dual levels live during an iteration: one past the highest level an op
    # names (oprules/forward_ad.py); 0: no op needs one.
    dual_levels: int = 0

    def reported(self, level: Level) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.level is level]

    @property
    def not_replayed(self) -> list[Diagnostic]:
        return self.reported(Level.NOT_REPLAYED)

    @property
    def filters(self) -> list[str]:
        return [d.reason for d in self.reported(Level.FILTER)]

    @property
    def notes(self) -> list[str]:
        return [d.reason for d in self.reported(Level.NOTE)]

    @classmethod
    def empty(cls, name: str = "reference") -> Program:
        """A program of no ops: what the passes start from (and the backends' reference)."""
        return cls(TraceInfo(name, "0" * 64, "", 0))


def iter_tensors(value: Value) -> Iterator[TensorValue]:
    """Every TensorValue inside a value tree, in order."""
    # Passes ask this of every argument of every op, many times: a tensor or a scalar
    # gets a plain iterator, and only lists pay for a generator.
    if isinstance(value, TensorValue):
        return iter((value,))
    if isinstance(value, ListValue):
        return _list_tensors(value)
    return iter(())


def _list_tensors(value: ListValue) -> Iterator[TensorValue]:
    for item in value.items:
        yield from iter_tensors(item)


def iter_leaves(value: Value):
    """Every value inside a value tree that is not a list, in order."""
    if isinstance(value, ListValue):
        for item in value.items:
            yield from iter_leaves(item)
    else:
        yield value


__all__ = [
    "Arg",
    "Binding",
    "DerivedView",
    "DeviceValue",
    "FreshStorage",
    "StandInTensor",
    "GroupName",
    "Init",
    "InputView",
    "KernelRecord",
    "ListValue",
    "Literal",
    "Op",
    "OpOutput",
    "OpTiming",
    "PackedLinear",
    "PackedWeight",
    "Program",
    "ProgramTiming",
    "SparseLayout",
    "Storage",
    "StreamInfo",
    "TensorMeta",
    "TensorValue",
    "TorchConstant",
    "TraceInfo",
    "Value",
    "contiguous_strides",
    "iter_leaves",
    "iter_tensors",
]
