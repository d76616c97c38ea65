"""The intermediate representation: what the benchmark replays, as typed dataclasses.

Lowering turns selected trace nodes into :class:`Op` records whose arguments are
:data:`Value` trees. The tensor pass then gives every tensor a :class:`Storage`
(one buffer per recorded storage lifetime) and a binding that says where its value
comes from at run time. Templates read only this module's types, through the
emitter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Union

from mystique_gen.schema import ArgSpec, Signature


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: str  # torch attribute name: "float32"
    device: str  # device kind as recorded: "cpu", "cuda", ...

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def extent(self) -> int:
        """Elements of storage this view needs: offset + largest index + 1."""
        if self.numel == 0:
            return self.offset
        return self.offset + sum((n - 1) * abs(s) for n, s in zip(self.shape, self.strides)) + 1


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Init:
    """How a materialised storage is filled. ``kind`` is one of the emitter's fill kinds."""

    kind: str  # "uniform", "randint", "offsets", "bool", "zeros", "ones", "positive"
    low: float | int = 0
    high: float | int = 1
    why: str = ""  # provenance, e.g. "aten::embedding_bag indices < 1000 rows"


@dataclass(eq=False)
class Storage:
    """One recorded storage over one lifetime (storage ids are reused after frees)."""

    index: int  # order of first appearance
    dtype: str
    device: str
    extent: int  # elements
    materialised: bool  # True: built before timing; False: produced by a replayed op
    init: Init | None = None

    @property
    def nbytes(self) -> int:
        from mystique_gen.dtypes import ITEM_SIZES

        return self.extent * ITEM_SIZES.get(self.dtype, 4)


# Where a tensor's value comes from at run time.
@dataclass(frozen=True, eq=False)
class InputView:
    """A view of a materialised storage, built once before timing."""

    storage: Storage
    meta: TensorMeta


@dataclass(frozen=True)
class OpOutput:
    """Returned by a replayed op: ``path`` indexes into the op's result."""

    op_index: int
    path: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class DerivedView:
    """A view of a produced storage that no replayed op returned: ``as_strided`` of ``base``."""

    base: Binding
    meta: TensorMeta


Binding = Union[InputView, OpOutput, DerivedView]


@dataclass(eq=False)
class TensorValue:
    trace_id: int
    storage_id: int
    meta: TensorMeta
    binding: Binding | None = None  # set by the tensor pass
    storage: Storage | None = None


@dataclass(frozen=True)
class Literal:
    value: int | float | bool | str | None


@dataclass(frozen=True)
class TorchConstant:
    """``torch.<name>``: a dtype, layout or memory format."""

    name: str


@dataclass(frozen=True)
class DeviceValue:
    """A device argument, by kind ("cpu", "cuda"); the trace's main kind becomes the
    benchmark's ``--device`` and "cpu" stays on the host."""

    kind: str


@dataclass(frozen=True)
class ListValue:
    items: tuple[Value, ...]


Value = Union[Literal, TorchConstant, DeviceValue, ListValue, TensorValue]


@dataclass(eq=False)
class Arg:
    spec: ArgSpec
    value: Value


@dataclass(eq=False)
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
    free_after: list[Binding] = field(default_factory=list)  # variables last read here

    @property
    def name(self) -> str:
        return self.signature.qualified_name


@dataclass(frozen=True)
class NotReplayed:
    node_id: int
    name: str
    reason: str


@dataclass
class TraceInfo:
    name: str
    sha256: str
    schema: str
    node_count: int


@dataclass
class Program:
    trace: TraceInfo
    ops: list[Op]
    storages: list[Storage]
    not_replayed: list[NotReplayed]
    threads: list[int]
    devices: list[str]
    primary_device: str = "cpu"  # the recorded device kind that --device replaces
    peak_bytes: int = 0  # estimated peak memory of one iteration, inputs included
    filters: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def iter_tensors(value: Value):
    """Every TensorValue inside a value tree, in order."""
    if isinstance(value, TensorValue):
        yield value
    elif isinstance(value, ListValue):
        for item in value.items:
            yield from iter_tensors(item)
