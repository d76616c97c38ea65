"""Input values: how each materialised storage is filled.

Sources, strongest first:

1. integral data the trace saved in ``<trace>_resources/nid_<node>_tid_<k>.dat``
   (``ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_DATA``), embedded when small;
   what ``mystique_gen.tools.capture`` recorded in its ``<name>.step.json``: the values
   of 0-d floating arguments (wrapped Python numbers, mostly; ``scalars``), where every
   op reading the storage recorded the same value, and of short tensors the step built
   from Python data alike in two steps (``literals``: ``torch.tensor([0.5, 2.0])``, the
   index list of ``x[:, [0, 2]]``), embedded as they were;
2. data-dependent output sizes (:data:`oprules.SHAPE_RULES`): a mask with the recorded
   number of true values, as many distinct values as ``unique`` returned, repeats that
   add up to the recorded output, jagged lengths that add up to the values;
3. the recorded ``tensor_range`` attribute (min and max of every integral input,
   ``ENABLE_PYTORCH_EXECUTION_TRACE_SAVE_INTEGRAL_TENSOR_RANGE=1``), clipped to
4. consumer bounds (:data:`oprules.INDEX_RULES`): rows of the embedding table, the
   size of the indexed dimension, the class count of a loss; bag offsets sorted from 0;
5. floating ranges: positive variances and denominators, probabilities in [0, 1].

When one storage feeds several ops the bounds are intersected, so no consumer reads an
out-of-range index.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import TypeVar

from mystique_gen import oprules
from mystique_gen.errors import TraceError
from mystique_gen.harness.fills import FillKind
from mystique_gen.ir import (
    DerivedView,
    Init,
    ListValue,
    Literal,
    Op,
    OpOutput,
    Storage,
    TensorMeta,
    TensorValue,
    contiguous_strides,
    iter_tensors,
)
from mystique_gen.ir.dtypes import (
    FLOATING,
    INTEGRAL,
    ITEM_SIZES,
    QUANTIZED,
    dtype_from_type_string,
)
from mystique_gen.passes.lower import list_element_types
from mystique_gen.passes.tensors import output_paths
from mystique_gen.sources.et import RawArg, RawTrace

# Values a fill may take per integral dtype (int64 leaves room for ``high + 1``).
_INT_LIMITS = {
    "uint8": (0, 255), "int8": (-128, 127), "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1), "int64": (-(2**62), 2**62), "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1), "uint64": (0, 2**62),
}
# Fills a computed tensor gets where it is made (Op.fit_values), not at an input: what
# a replayed op computes decides a length, an offset or a group's end the reader
# checks against the sizes the trace recorded.
FITTED_WHERE_MADE = frozenset({FillKind.DESCENDING, FillKind.ENDS, FillKind.CUTS,
                               FillKind.OFFSETS, FillKind.SUM, FillKind.SPANS})


@dataclass
class RecordedValues:
    """Facts about input values the trace recorded, keyed by (node id, tensor ordinal).

    The ordinal counts every tensor among a node's inputs, list elements included, in
    order: the key of both ``tensor_range`` and the saved ``.dat`` files.
    """

    ranges: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    data: dict[tuple[int, int], Path] = field(default_factory=dict)
    ordinals: dict[int, list[list[int | None]]] = field(default_factory=dict)
    scalars: dict[tuple[int, int], float] = field(default_factory=dict)  # 0-d values
    literals: dict[tuple[int, int], list[float | int]] = field(default_factory=dict)


# Recorded values per op overload and tensor ordinal, in call order: the capture
# sidecar's ``scalars`` (mystique_gen.tools.capture.record_scalars).
ScalarRecord = dict[str, dict[str, list[float]]]
# Each call's values (row-major), or None, in call order, of the op that makes Python
# data a tensor (``aten::lift_fresh``: oprules ``ASSIGNED_LITERALS``): the sidecar's
# ``literals``.
LiteralRecord = list[list[float | int] | None]


@dataclass
class CapturedInputs:
    """What the capture recorded of the values the ET leaves out (its sidecar)."""

    scalars: ScalarRecord = field(default_factory=dict)
    literals: LiteralRecord = field(default_factory=list)
    # The same of 0-d integral arguments (wrapped Python ints: the 2 and 1 of a
    # Normal's ``icdf``, ``erfinv(2 * p - 1)``), matched apart from the floating ones.
    integers: ScalarRecord = field(default_factory=dict)

    def sidecar_fields(self) -> dict[str, object]:
        """These, under the keys the sidecar keeps them (sources/kineto.py reads them:
        ``scalars_of``, ``literals_of``)."""
        return {"scalars": self.scalars, "literals": self.literals,
                "integer_scalars": self.integers}


def resources_dir(trace_path: str | Path) -> Path | None:
    """``x.et.json`` (or ``x.et.json.gz``) -> ``x.et_resources/`` where it exists."""
    path = Path(trace_path)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    stem = name[: name.rfind(".json")] if ".json" in name else name
    folder = path.with_name(stem + "_resources")
    return folder if folder.is_dir() else None


def _ordinals(inputs: list[RawArg]) -> list[list[int | None]]:
    """Per input: the tensor ordinal of each of its tensors (None where not a tensor)."""
    result: list[list[int | None]] = []
    k = 0
    for raw in inputs:
        if raw.type.startswith("Tensor"):
            result.append([k])
            k += 1
        elif "List[" in raw.type and isinstance(raw.value, list):
            row: list[int | None] = []
            for t in list_element_types(raw.type, len(raw.value)):
                if t.startswith("Tensor"):
                    row.append(k)
                    k += 1
                else:
                    row.append(None)
            result.append(row)
        else:
            result.append([])
    return result


def _parse_range(text: object, node_id: int) -> dict[int, tuple[int, int]]:
    if text in (None, ""):
        return {}
    try:
        doc = json.loads(text) if isinstance(text, str) else text
        return {int(k): (int(v[0]), int(v[1])) for k, v in doc.items()}
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        raise TraceError(f"malformed tensor range {str(text)[:40]!r}", node_id=node_id,
                         field="tensor_range") from None


def recorded_values(trace: RawTrace, resources: Path | None = None,
                    captured: CapturedInputs | None = None) -> RecordedValues:
    """Ranges and saved data of every node that has them, and the recorded values of
    0-d floating inputs (:func:`match_scalars`) and literals (:func:`match_literals`)."""
    found = RecordedValues()
    if captured is not None and captured.scalars:
        found.scalars = match_scalars(trace, captured.scalars)
    if captured is not None and captured.integers:
        found.scalars.update(match_scalars(trace, captured.integers, integral=True))
    if captured is not None and captured.literals:
        found.literals = match_literals(trace, captured.literals)
    with_scalars = {node_id for node_id, _ in found.scalars} | \
        {node_id for node_id, _ in found.literals}
    saved: dict[tuple[int, int], Path] = {}
    if resources is not None:
        for f in resources.glob("nid_*_tid_*.dat"):
            parts = f.stem.split("_")
            if len(parts) == 4 and parts[1].isdigit() and parts[3].isdigit():
                saved[(int(parts[1]), int(parts[3]))] = f
    for node in trace.nodes:
        ranges = _parse_range(node.attrs.get("tensor_range"), node.id)
        has_data = any(key[0] == node.id for key in saved) if saved else False
        if not ranges and not has_data and node.id not in with_scalars:
            continue
        found.ordinals[node.id] = _ordinals(node.inputs)
        for k, r in ranges.items():
            found.ranges[(node.id, k)] = r
    for key, f in saved.items():
        if key[0] in found.ordinals:
            found.data[key] = f
    return found


def integer_key(op: str, first: str | None) -> str:
    """How integral values are recorded and matched: by op overload and the dtype of
    its first tensor argument (``aten::sub.Tensor|float32``). An op's calls on other
    dtypes are often other code (Gemma 3n's ``2 * p - 1`` on a float, its mask
    arithmetic on longs), and the capture's steps may run one more of those."""
    return f"{op}|{first}"


def match_scalars(trace: RawTrace, recorded: ScalarRecord, integral: bool = False
                  ) -> dict[tuple[int, int], float]:
    """(node id, tensor ordinal) -> value: the k-th recorded value of an op overload's
    ordinal is its k-th node (in id order, the call order) whose input at that ordinal
    is a 0-d floating CPU tensor (``integral``: a 0-d integral one). Where the counts
    differ (the recorded step ran other ops), that overload and ordinal get no values:
    better a stand-in than a value from another call."""
    sites: dict[tuple[str, int], list[int]] = {}
    for node in trace.nodes:
        op = node.op_schema.split("(", 1)[0].strip()
        if integral:
            first = next((raw for raw in node.inputs if raw.type.startswith("Tensor")), None)
            op = integer_key(op, dtype_from_type_string(first.type) if first else None)
        if op not in recorded:
            continue
        for raw, row in zip(node.inputs, _ordinals(node.inputs), strict=True):
            if raw.type.startswith("Tensor") and _scalar_tensor(raw, integral):
                sites.setdefault((op, row[0]), []).append(node.id)
    found: dict[tuple[int, int], float] = {}
    for (op, k), node_ids in sites.items():
        values = recorded[op].get(str(k), [])
        if len(values) == len(node_ids):
            found.update(((nid, k), float(v)) for nid, v in zip(node_ids, values, strict=True))
    return found


def match_literals(trace: RawTrace, recorded: LiteralRecord
                   ) -> dict[tuple[int, int], list[float | int]]:
    """(node id, 0) -> values: the k-th recorded literal is the trace's k-th
    ``aten::lift_fresh`` node (in id order), where it has as many elements. Where the
    counts differ (the recorded steps built other literals, or another thread built
    some), none is matched."""
    nodes = [node for node in trace.nodes if node.name in oprules.ASSIGNED_LITERALS]
    if len(nodes) != len(recorded):
        return {}
    found: dict[tuple[int, int], list[float | int]] = {}
    for node, values in zip(nodes, recorded, strict=True):
        raw = node.inputs[0] if node.inputs else None
        if values is None or raw is None or not raw.type.startswith("Tensor") \
                or not isinstance(raw.shape, list) \
                or prod(d for d in raw.shape if isinstance(d, int)) != len(values):
            continue
        found[(node.id, 0)] = values
    return found


def _scalar_tensor(raw: RawArg, integral: bool = False) -> bool:
    """A 0-d floating (``integral``: integral) CPU tensor, as the ET records one."""
    record = raw.value
    device = record[5] if isinstance(record, list) and len(record) > 5 else None
    return raw.shape == [] and device in ("cpu", None) and \
        dtype_from_type_string(raw.type) in (INTEGRAL if integral else FLOATING)


def _arg_facts(op: Op) -> dict[str, object]:
    """Argument name -> shape (tensors, a tuple), literal value (scalars) or list of
    literal values (a list of numbers, such as a size: a list, never taken for a
    shape)."""
    facts: dict[str, object] = {}
    for arg in op.args:
        v = arg.value
        if isinstance(v, TensorValue):
            facts[arg.spec.name] = v.meta.shape
        elif isinstance(v, Literal):
            facts[arg.spec.name] = v.value
        elif isinstance(v, ListValue) and v.items \
                and all(isinstance(item, Literal) for item in v.items):
            facts[arg.spec.name] = [item.value for item in v.items]
    return facts


def _output_shapes(op: Op) -> list[object]:
    shapes: list[object] = []
    for v in op.outputs:
        if isinstance(v, TensorValue):
            shapes.append(v.meta.shape)
        elif isinstance(v, ListValue):
            shapes.append([t.meta.shape if isinstance(t, TensorValue) else None
                           for t in v.items])
        else:
            shapes.append(None)
    return shapes


def _covers(meta: TensorMeta, storage: Storage) -> bool:
    """The view is the whole storage, element for element (so counts carry over)."""
    return (meta.offset == 0 and meta.numel == storage.extent
            and meta.strides == contiguous_strides(meta.shape))


def _narrow(values: list[int]) -> tuple[int, bytes] | None:
    """Smallest little-endian signed width that holds every value."""
    lo, hi = (min(values), max(values)) if values else (0, 0)
    for size in (1, 2, 4, 8):
        bound = 2 ** (8 * size - 1)
        if -bound <= lo and hi < bound:
            return size, b"".join(v.to_bytes(size, "little", signed=True) for v in values)
    return None


def _read_data(path: Path, meta: TensorMeta) -> list[int] | None:
    size = ITEM_SIZES.get(meta.dtype, 0)
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if not size or len(raw) != meta.numel * size:
        return None
    signed = not meta.dtype.startswith("uint")
    return [int.from_bytes(raw[i:i + size], "little", signed=signed)
            for i in range(0, len(raw), size)]


class _Facts:
    """What is known about each materialised storage, collected op by op."""

    def __init__(self) -> None:
        self.upper: dict[int, tuple[int, str]] = {}  # exclusive bound, why
        self.offsets: dict[int, tuple[int, bool, str]] = {}  # indices count, last fixed
        self.shape: dict[int, tuple[tuple[str, int, int], str]] = {}  # data-dependent fill
        self.ranges: dict[int, tuple[int, int]] = {}  # recorded [min, max], union of views
        self.data: dict[int, list[float | int]] = {}  # recorded values (ints unless literal)
        self.literals: set[int] = set()  # of those, the literals the step built (VALUES)
        self.positive: dict[int, str] = {}
        self.float_range: dict[int, tuple[float, float, str]] = {}
        # integral storages a floating function reads under those rules (log of a count)
        self.float_read: set[int] = set()
        self.below: dict[int, tuple[float, str]] = {}  # floats under a bound (COMPLEMENTS)
        self.rising: dict[int, tuple[int, str]] = {}  # rising in runs of n (DIFFERENCES)
        # floats within (-c, c): the term a positive difference subtracts (DIFFERENCES)
        self.small: dict[int, tuple[float, str]] = {}
        self.fan_in: dict[int, int] = {}  # from the storage's widest view of 2+ dims
        self.bias_fan_in: dict[int, int] = {}  # a bias: its weight's fan-in
        self.activation: set[int] = set()  # the input a weight multiplies: not a weight
        self.weights: set[int] = set()  # read as an op's ``weight`` of 2+ dims
        self.scalar: set[int] = set()  # storages viewed as 0-d tensors
        self.literal: set[int] = set()  # 0-d literals x[...] = v writes (ASSIGNED_LITERALS)
        # what such a literal was, and whether a test names it (not just its sign)
        self.literal_value: dict[int, tuple[int, str, bool]] = {}
        self.lengths: dict[int, tuple[int, str]] = {}  # compared with arange(n): (n, op)
        self.scalar_values: dict[int, list[float]] = {}  # recorded values of 0-d views
        # every element's value, as ``.item()`` reads of the input recorded them
        self.item_values: dict[int, list[float | int]] = {}
        # boolean masks that keep every element from a value that is not finite: the
        # mask value that does, and why (None where two uses want both)
        self.keep_all: dict[int, tuple[bool, str] | None] = {}
        self.workspace: dict[int, str] = {}  # raw saved state: zeros (SAVED_WORKSPACES)
        self.divisor: dict[int, str] = {}  # integral divisors: never 0 (INTEGER_DIVISORS)
        self.window_low: dict[int, tuple[int, str]] = {}  # a shard's offset (WINDOW_SHIFTS)
        # (op index, output position) -> true elements of a computed mask (None: readers
        # disagree)
        self.true_counts: dict[tuple[int, int], int | None] = {}
        # (op index, output position) -> (fill kind, a, b) of computed values fitted
        # where they are made, Op.fit_values (None: readers disagree)
        self.fit_values: dict[tuple[int, int], tuple[str, int, int] | None] = {}
        # Data-dependent fills wanted by computed storages, carried back to the inputs
        # they were copied or sorted from (_carry_shape_fills).
        self.computed_shape: dict[int, tuple[tuple[str, int, int], str]] = {}
        # Values a kernel's recorded children showed a computed storage held, carried
        # back the same way (oprules.KERNEL_PATHS).
        self.computed_data: dict[int, tuple[list[int], str]] = {}
        # Tables whose rows' norms a kernel's recorded children showed (embedding_renorm_
        # scales the rows above max_norm): (row length, max_norm, norm_type, {row: norm},
        # why); a row's first recorded norm wins (renormalised, it is under max_norm).
        self.norms: dict[int, tuple[int, float, float, dict[int, float], str]] = {}

    def view(self, tv: TensorValue) -> None:
        s = tv.storage
        if s is None or not s.materialised:
            return
        if not tv.meta.shape:
            self.scalar.add(s.index)
        # A view whose first dimension is 1 is no weight's: a weight's first dimension
        # counts its outputs, and a leading 1 is a batch of one or a vector broadcast
        # over a batch. FrozenBatchNorm2d (DETR-family backbones) reads its weight and
        # statistics as ``weight.reshape(1, -1, 1, 1)``: filled within 1/sqrt(C), every
        # layer scaled activations by ~0.03 until a batch's samples were equal, and a
        # training batch norm over them multiplied gradients to inf (D-FINE). A weight
        # with one output is an op's ``weight`` (``weight_fan_in``).
        if len(tv.meta.shape) < 2 or tv.meta.shape[0] == 1:
            return
        self.weight_fan_in(tv)

    def weight_fan_in(self, tv: TensorValue) -> int:
        """A weight's fan-in (its elements per output), kept for its storage where that
        is filled; returned either way (its bias's bound needs it)."""
        fan_in = prod(tv.meta.shape[1:])
        s = tv.storage
        if s is not None and s.materialised and fan_in > self.fan_in.get(s.index, 0):
            self.fan_in[s.index] = fan_in
        return fan_in

    @staticmethod
    def integral(tv: TensorValue) -> Storage | None:
        s = tv.storage
        if s is None or not s.materialised or s.dtype not in INTEGRAL:
            return None
        return s

    def bound(self, tv: TensorValue, high: int, why: str) -> None:
        s = tv.storage  # produced storages too: bounds flow back to their sources
        if s is None or s.dtype not in INTEGRAL:
            return
        high = max(int(high), 1)
        if s.index not in self.upper or high < self.upper[s.index][0]:
            self.upper[s.index] = (high, why)

    def shape_fill(self, tv: TensorValue, init: tuple[str, int, int] | None, why: str,
                   fit_where_made: bool = True) -> None:
        s = tv.storage
        if init is not None and init[0] == FillKind.MASK and tv.meta.dtype == "bool" \
                and isinstance(tv.binding, OpOutput) and len(tv.binding.path) == 1:
            # A mask a replayed op computed: fitted where it is made (Op.true_counts);
            # two readers that recorded different counts leave it as it comes.
            key = (tv.binding.op_index, tv.binding.path[0])
            self.true_counts[key] = init[1] if self.true_counts.get(key, init[1]) == init[1] \
                else None
            return
        if init is not None and init[0] in FITTED_WHERE_MADE and fit_where_made \
                and isinstance(tv.binding, OpOutput) and len(tv.binding.path) == 1:
            # Sequence lengths, offsets or group ends a replayed op computed: fitted
            # where they are made (Op.fit_values), as a computed mask is, unless
            # _carry_shape_fills carries the fill back to where they were copied or
            # sorted from. Two readers that want different ones leave them as they come.
            key, wanted = (tv.binding.op_index, tv.binding.path[0]), tuple(init)
            self.fit_values[key] = wanted \
                if self.fit_values.get(key, wanted) == wanted else None
        if init is None or s is None:
            return
        # (complex storages take no shape fill but SPD's: a real symmetric
        # positive-definite matrix is Hermitian positive-definite as complex, and
        # cholesky refused complex matrices filled at random)
        if (s.dtype.startswith("complex") and init[0] != FillKind.SPD) \
                or not _covers(tv.meta, s):
            return
        (self.shape if s.materialised else self.computed_shape).setdefault(s.index, (init, why))

    def domain_read(self, s: Storage, float_out: bool) -> None:
        """An integral or boolean storage a floating function reads under a domain
        rule (``float_out``: the op's result is floating) keeps that domain in integers
        (``_integral_domain``)."""
        if float_out and (s.dtype in INTEGRAL or s.dtype == "bool"):
            self.float_read.add(s.index)

    def known(self, tv: TensorValue, values: list[int], why: str) -> None:
        """Values a kernel's recorded children showed ``tv`` held (recorded data wins)."""
        s = tv.storage
        if s is None or s.dtype not in INTEGRAL or not _covers(tv.meta, s) \
                or len(values) != tv.meta.numel:
            return
        if s.materialised:
            self.data.setdefault(s.index, values)
        else:
            self.computed_data.setdefault(s.index, (values, why))

    def row_norms(self, tv: TensorValue, max_norm: float, norm_type: float,
                  rows: tuple[tuple[int, float], ...], why: str) -> None:
        s = tv.storage
        if s is None or not s.materialised or s.dtype not in FLOATING \
                or len(tv.meta.shape) != 2 or not _covers(tv.meta, s):
            return
        _, _, _, known, _ = self.norms.setdefault(
            s.index, (tv.meta.shape[1], max_norm, norm_type, {}, why))
        for row, norm in rows:
            known.setdefault(row, norm)

    def recorded(self, tv: TensorValue, span: tuple[int, int] | None,
                 data: Path | None, literal: list[float | int] | None = None) -> None:
        s = tv.storage
        if literal is not None and s is not None and s.materialised \
                and _covers(tv.meta, s) and len(literal) == tv.meta.numel:
            self.data[s.index] = literal
            self.literals.add(s.index)
        s = self.integral(tv)
        if s is None:
            return
        if span is not None:
            lo, hi = self.ranges.get(s.index, span)
            self.ranges[s.index] = (min(lo, span[0]), max(hi, span[1]))
        if (data is not None and s.index not in self.data and _covers(tv.meta, s)
                and tv.meta.numel <= oprules.MAX_EMBEDDED_ELEMENTS):
            values = _read_data(data, tv.meta)
            if values is not None:
                self.data[s.index] = values


def assign_values(ops: list[Op], storages: list[Storage],
                  recorded: RecordedValues | None = None) -> None:
    facts = _Facts()
    recorded = recorded or RecordedValues()
    for op in ops:
        _collect(op, facts, recorded)
    _item_values(ops, facts)
    _masks_keeping_all(ops, facts)
    _lengths_against_positions(ops, facts)
    _exponent_scales(ops, facts)
    _literal_markers(ops, facts)
    _literals_into_zeros(ops, facts)
    _segment_ids(ops, facts)
    _propagate_bounds(ops, facts)
    _carry_shape_fills(ops, facts)
    _propagate_domains(ops, facts)
    _shift_windows(ops, facts)
    by_index = {op.index: op for op in ops}
    for (index, position), count in _masks_to_fit(ops, facts.true_counts).items():
        by_index[index].true_counts[position] = count
    for (index, position), fit in facts.fit_values.items():
        if fit is not None:
            by_index[index].fit_values[position] = fit
            out = by_index[index].outputs[position]
            known = facts.computed_data.get(out.storage.index) \
                if isinstance(out, TensorValue) and out.storage is not None else None
            if fit[0] == FillKind.DESCENDING and known is not None \
                    and sum(known[0]) == fit[1]:
                by_index[index].recorded_lengths[position] = tuple(known[0])
    _unfitted_indices(ops)
    _reusable_fits(ops)
    _guard_computed_values(ops, facts)
    for s in storages:
        if s.materialised:
            s.init = _choose(s, facts)


def _item_values(ops: list[Op], facts: _Facts) -> None:
    """The values of inputs whose every element an ``.item()`` read recorded
    (oprules.ITEM_READS: the read's output is the value), where the reads of each
    element agree and come before any op writes the storage (a step counter read after
    its increment is not its initial value). A plain ET records no tensor's data; these
    reads are where its values show (a diffusers scheduler's timesteps, ``for t in
    timesteps``)."""
    written: set[int] = set()
    reads: dict[int, dict[int, list[float | int]]] = {}
    extents: dict[int, int] = {}
    for op in ops:
        if op.name in oprules.ITEM_READS and op.args and op.outputs:
            tv, out = op.args[0].value, op.outputs[0]
            if isinstance(tv, TensorValue) and tv.storage is not None \
                    and tv.storage.materialised and tv.meta.numel == 1 \
                    and tv.storage.index not in written and isinstance(out, Literal) \
                    and isinstance(out.value, (int, float)) \
                    and (tv.storage.dtype in FLOATING or tv.storage.dtype in INTEGRAL
                         or tv.storage.dtype == "bool"):
                reads.setdefault(tv.storage.index, {}).setdefault(
                    tv.meta.offset, []).append(out.value)
                extents[tv.storage.index] = tv.storage.extent
        for arg in op.args:
            if arg.spec.writes:
                written.update(t.storage.index for t in iter_tensors(arg.value)
                               if t.storage is not None)
    for index, by_offset in reads.items():
        if len(by_offset) != extents[index]:  # (a table's few reads: no loop over it)
            continue
        if all(_one_value([float(v) for v in by_offset.get(k, [])]) is not None
               for k in range(extents[index])):
            firsts = (by_offset[k][0] for k in range(extents[index]))
            facts.item_values[index] = [int(v) if isinstance(v, bool) else v
                                        for v in firsts]


def _masks_keeping_all(ops: list[Op], facts: _Facts) -> None:
    """Boolean mask inputs that put a value that is not finite where they say
    (:data:`oprules.EXCLUDING_MASKS`: ``scores.masked_fill(~keep, -inf)``, a boolean
    ``attn_mask``) keep every element, through views and negations
    (:data:`oprules.NEGATIONS`). The trace records no mask's values; filled half true
    at random, a row of a few keys was all masked, and its softmax NaN (eager torch's
    too), where a padding mask keeps at least one key a row. Keeping all, the kernels
    do the same work."""
    by_index = {op.index: op for op in ops}
    for op in ops:
        rule = oprules.EXCLUDING_MASKS.get(op.name)
        if rule is None:
            continue
        named = {a.spec.name: a.value for a in op.args}
        mask = named.get(rule[0])
        if not isinstance(mask, TensorValue) or mask.meta.dtype != "bool":
            continue
        keeps = [keep for value_arg, keep in rule[1]
                 if not value_arg or _not_finite(named.get(value_arg))]
        if len(keeps) != 1:
            continue
        found = _mask_source(mask, keeps[0], by_index)
        if found is None:
            continue
        i, keep = found
        why = f"a mask {op.name} keeps every element from a value that is not finite"
        previous = facts.keep_all.get(i, (keep, why))
        facts.keep_all[i] = previous if previous is not None and previous[0] == keep \
            else None


def _mask_source(mask: TensorValue, keep: bool, by_index: dict[int, Op]
                 ) -> tuple[int, bool] | None:
    """The input storage ``mask`` views, through negations, and the value of it that
    keeps every element; None where an op other than a negation computed it."""
    for _ in range(len(by_index) + 1):
        made = _producer(mask, by_index)
        if made is None:
            storage = mask.storage
            return (storage.index, keep) if storage is not None and storage.materialised \
                else None
        if made[0].name not in oprules.NEGATIONS:
            return None
        source = next(iter(iter_tensors(made[0].args[0].value)), None)
        if source is None:
            return None
        mask, keep = source, not keep
    return None


def _not_finite(value: object) -> bool:
    return isinstance(value, Literal) and isinstance(value.value, float) \
        and not math.isfinite(value.value)


def _collect(op: Op, facts: _Facts, recorded: RecordedValues) -> None:
    for arg in op.args:
        for tv in iter_tensors(arg.value):
            facts.view(tv)
    # A bias beside a weight of 2+ dims (linear, convolutions) is bounded by that
    # weight's fan-in, as nn.Linear and nn.Conv initialise it: a U(-1, 1) bias
    # outweighs the small products of fan-in scaled weights, fixes each feature's sign,
    # and a ReLU after it then passes or zeroes whole channels.
    # The input such a weight multiplies is an activation, not a weight: it is filled
    # like data, U(-1, 1), not within its own "fan-in" (an image of 3x16x16 got
    # +-0.036, and the bias then decided every output's sign).
    named = {a.spec.name: a.value for a in op.args}
    weight, bias = named.get("weight"), named.get("bias")
    if isinstance(weight, TensorValue) and len(weight.meta.shape) >= 2:
        fan_in = facts.weight_fan_in(weight)  # nn.Linear(n, 1)'s [1, n] too
        if weight.storage is not None:
            facts.weights.add(weight.storage.index)
        if isinstance(bias, TensorValue) and bias.storage is not None:
            facts.bias_fan_in.setdefault(bias.storage.index, fan_in)
        data = named.get("input")
        if isinstance(data, TensorValue) and data.storage is not None:
            facts.activation.add(data.storage.index)
    ordinals = recorded.ordinals.get(op.node_id)
    if ordinals is not None:
        for i, arg in enumerate(op.args):
            row = ordinals[i] if i < len(ordinals) else []
            items = arg.value.items if isinstance(arg.value, ListValue) else (arg.value,)
            for j, item in enumerate(items):
                k = row[j] if j < len(row) else None
                if isinstance(item, TensorValue) and k is not None:
                    facts.recorded(item, recorded.ranges.get((op.node_id, k)),
                                   recorded.data.get((op.node_id, k)),
                                   recorded.literals.get((op.node_id, k)))
                    value = recorded.scalars.get((op.node_id, k))
                    if value is not None and item.storage is not None \
                            and not item.meta.shape:
                        facts.scalar_values.setdefault(item.storage.index, []).append(value)

    if op.name in oprules.ASSIGNED_LITERALS:
        facts.literal.update(tv.storage.index for arg in op.args
                             for tv in iter_tensors(arg.value)
                             if tv.storage is not None and not tv.meta.shape)
    for arg in op.args:
        if arg.spec.name in oprules.INTEGER_DIVISORS.get(op.name, ()):
            for tv in iter_tensors(arg.value):
                if tv.storage is not None and tv.storage.dtype in INTEGRAL:
                    facts.divisor.setdefault(tv.storage.index, f"{op.name} {arg.spec.name}")
    _inherited_domains(op, facts)
    index_rules = oprules.INDEX_RULES.get(op.name)
    shape_rules = oprules.SHAPE_RULES.get(op.name)
    positive = oprules.POSITIVE_ARGS.get(op.name, ())
    float_ranges = oprules.FLOAT_RANGES.get(op.name)
    take = oprules.TAKE_RULES.get(op.name)
    for arg in op.args:
        if arg.spec.name in oprules.SAVED_WORKSPACES.get(op.name, ()):
            for tv in iter_tensors(arg.value):
                if tv.storage is not None:
                    facts.workspace[tv.storage.index] = f"{op.name} {arg.spec.name}"
    path = oprules.KERNEL_PATHS.get(op.name)
    if path is not None and op.kernel_path is not None:
        _kernel_path_facts(op, path, facts)
    if not (index_rules or shape_rules or positive or float_ranges or take
            or op.name in oprules.FRACTIONAL_POWERS):
        return
    args = _arg_facts(op)
    by_name = {a.spec.name: a.value for a in op.args}
    for arg_name, rule in (index_rules or {}).items():
        value = by_name.get(arg_name)
        if value is None:
            continue
        if rule == "offsets":
            indices = by_name.get("indices")
            if isinstance(indices, TensorValue) and isinstance(value, TensorValue):
                s = facts.integral(value)
                last = args.get("include_last_offset") is True
                why = f"{op.name} offsets"
                if s is not None:
                    facts.offsets[s.index] = (indices.meta.numel, last, why)
                elif value.storage is not None and value.storage.dtype in INTEGRAL:
                    kind = FillKind.CUTS if last else FillKind.OFFSETS
                    facts.shape_fill(value, (kind, 0, indices.meta.numel), why)
            continue
        if isinstance(rule, oprules.PerDim):
            _mask_rows(op, rule, value, args, facts, arg_name)
    for arg_name, k, tv, high in _index_bounds(index_rules or {}, by_name, args):
        facts.bound(tv, high, f"{op.name} {arg_name}" + ("" if k is None else f"[{k}]"))
    if take:
        index, source = by_name.get(take[0]), by_name.get(take[1])
        if isinstance(index, TensorValue) and isinstance(source, TensorValue):
            facts.bound(index, source.meta.numel, f"{op.name} {take[0]}")
    if shape_rules:
        outputs = _output_shapes(op)
        for arg_name, fill in shape_rules.items():
            value = by_name.get(arg_name)
            if isinstance(value, ListValue) and len(value.items) == 1:
                # A list of one tensor: the jagged ops' ``Tensor[] offsets`` of one
                # ragged dimension (a nested tensor's), which went unfilled: random
                # offsets cut its 107 values at 0..8 ("size of tensor a (105) must
                # match the size of tensor b (0)").
                value = value.items[0]
            if isinstance(value, TensorValue):
                facts.shape_fill(value, fill.init(args, outputs), f"{op.name} {arg_name}",
                                 fill.fitted_where_made(args))
    float_out = _floating_result(op)
    positive = (*positive, *_fractional_power_base(op, by_name))
    for arg_name in positive:
        for tv in iter_tensors(by_name.get(arg_name) or ListValue(())):
            if tv.storage is not None:
                facts.positive.setdefault(tv.storage.index, f"{op.name} {arg_name}")
                facts.domain_read(tv.storage, float_out)
    for arg_name, range_rule in (float_ranges or {}).items():
        bounds = oprules.float_range(range_rule, args)
        if bounds is None:
            continue
        for tv in iter_tensors(by_name.get(arg_name) or ListValue(())):
            if tv.storage is not None:
                facts.float_range.setdefault(tv.storage.index,
                                             (*bounds, f"{op.name} {arg_name}"))
                facts.domain_read(tv.storage, float_out)


def _fractional_power_base(op: Op, by_name: dict[str, object]) -> tuple[str, ...]:
    """The base of a power to a recorded non-integral number (``x ** 0.5``: NaN where
    x < 0), which must be positive as a square root's argument (oprules
    ``fractional_powers``); none for an integral or tensor exponent."""
    rule = oprules.FRACTIONAL_POWERS.get(op.name)
    exponent = by_name.get(rule[1]) if rule else None
    if not (isinstance(exponent, Literal) and isinstance(exponent.value, float)
            and math.isfinite(exponent.value) and not exponent.value.is_integer()):
        return ()
    return (rule[0],)


def _kernel_path_facts(op: Op, rule: oprules.KernelPath, facts: _Facts) -> None:
    """Fill the inputs whose values decided the kernel's path as its recorded children
    show them (oprules.KERNEL_PATHS): the replay then runs the children the original
    ran (embedding_renorm_'s row scalings, a bag backward's non-empty bags, a pack's
    blocks)."""
    assert op.kernel_path is not None
    found = rule.facts(_arg_facts(op), _output_shapes(op), op.kernel_path)
    if found is None:
        return
    by_name = {a.spec.name: a.value for a in op.args}
    why = f"{op.name}'s recorded children"
    for name, values in found.values:
        tv = by_name.get(name)
        if isinstance(tv, TensorValue):
            facts.known(tv, list(values), why)
    for name, init in found.fills:
        tv = by_name.get(name)
        if isinstance(tv, TensorValue):
            facts.shape_fill(tv, init, why)
    for name, max_norm, norm_type, rows in found.row_norms:
        tv = by_name.get(name)
        if isinstance(tv, TensorValue):
            facts.row_norms(tv, max_norm, norm_type, rows, why)


def _floating_result(op: Op) -> bool:
    """Whether ``op`` returns a floating or complex tensor: an integral input it reads
    under a domain rule (log of a count) needs that domain in integers too."""
    return any(tv.meta.dtype in FLOATING or tv.meta.dtype.startswith("complex")
               for _path, tv in output_paths(op.outputs))


def _inherited_domains(op: Op, facts: _Facts) -> None:
    """The domains of a composite op replayed as its children, or of an op's own
    recorded children (``Op.domains``); an integral or boolean tensor they reach
    keeps them as integers where the op's result is floating (``facts.float_read``)."""
    if not op.domains:
        return
    float_out = _floating_result(op)
    for arg in op.args:
        items = arg.value.items if isinstance(arg.value, ListValue) else (arg.value,)
        for k, item in enumerate(items):
            position = k if isinstance(arg.value, ListValue) else None
            domain = op.domains.get((arg.spec.name, position))
            if domain is None or not isinstance(item, TensorValue) or item.storage is None:
                continue
            kind, low, high, why = domain
            if kind == "positive":
                facts.positive.setdefault(item.storage.index, why)
            else:
                facts.float_range.setdefault(item.storage.index, (low, high, why))
            facts.domain_read(item.storage, float_out)


def _propagate_bounds(ops: list[Op], facts: _Facts) -> None:
    """Carry each output's bound back to the inputs its values were copied from."""
    for op in reversed(ops):
        sources = oprules.VALUE_PRESERVING.get(op.name)
        if not sources:
            continue
        bounds = [facts.upper[tv.storage.index] for value in op.outputs
                  for tv in iter_tensors(value)
                  if tv.storage is not None and tv.storage.index in facts.upper]
        if not bounds:
            continue
        high, why = min(bounds)
        for arg in op.args:
            if arg.spec.name in sources:
                for tv in iter_tensors(arg.value):
                    facts.bound(tv, high, f"{why} (via {op.name})")


def _carry_shape_fills(ops: list[Op], facts: _Facts) -> None:
    """Carry a data-dependent fill that a computed tensor needs back to the input its
    values came from, each once (:data:`oprules.SAME_VALUES`: a sort, a copy).

    ``pack_padded_sequence(x, lengths, enforce_sorted=False)`` sorts ``lengths`` and
    packs by the sorted copy, so the fill that packs the recorded rows
    (``PackedLengths``) was wanted on the sort's result, which no fill reaches: the
    lengths were filled from their recorded range, packed other rows, and the RNN
    after it failed on the shapes."""
    by_index = {op.index: op for op in ops}
    for op in reversed(ops):
        _carry_definite(op, facts, by_index)
        rule = oprules.SAME_VALUES.get(op.name)
        if rule is None or rule[1] >= len(op.outputs):
            continue
        out = op.outputs[rule[1]]
        source = next((a.value for a in op.args if a.spec.name == rule[0]), None)
        if not (isinstance(out, TensorValue) and out.storage is not None
                and isinstance(source, TensorValue) and source.meta.numel == out.meta.numel):
            continue
        wanted = facts.computed_shape.get(out.storage.index)
        known = facts.computed_data.get(out.storage.index)
        if wanted is None and known is None:
            continue
        facts.fit_values.pop((op.index, rule[1]), None)  # fitted at the source instead
        if known is not None:  # (a multiset: a sort's source holds the same values)
            facts.known(source, known[0], f"{known[1]} (via {op.name})")
        if wanted is not None:
            init, why = wanted
            facts.shape_fill(source, init, f"{why} (via {op.name})")


def _carry_definite(op: Op, facts: _Facts, by_index: dict[int, Op]) -> None:
    """Carry a positive-definite fill wanted on ``op``'s computed result back to the
    inputs it is computed from (:data:`oprules.POSITIVE_DEFINITE`): each square term of
    a sum, the matrix a positive number scales (the number positive), the middle factor
    of a congruence ``(A @ P) @ A.T``. A Gaussian process's ``cholesky(K * s + n * I)``
    of a Gram buffer, and a Kalman filter's ``cholesky(H @ (P + Q) @ H.T + R)``, failed
    with their buffers filled at random: the fill reached only a matrix the
    factorisation reads itself."""
    how = oprules.POSITIVE_DEFINITE.get(op.name)
    out = op.outputs[0] if how is not None and op.outputs else None
    if not isinstance(out, TensorValue) or out.storage is None:
        return
    wanted = facts.computed_shape.get(out.storage.index)
    if wanted is None or wanted[0][0] != FillKind.SPD:
        return
    init, why = wanted[0], f"{wanted[1]} (via {op.name})"
    named = {a.spec.name: a.value for a in op.args}
    tensors = [tv for a in op.args for tv in iter_tensors(a.value)
               if tv.storage is not None and tv.storage is not out.storage]
    if how == "sum":
        alpha = named.get("alpha", Literal(1))
        if not (isinstance(alpha, Literal) and isinstance(alpha.value, (int, float))
                and alpha.value >= 0):
            return
        for tv in tensors:  # (a broadcast term, a 0-d or a vector, is no matrix)
            if tv.meta.shape == out.meta.shape:
                facts.shape_fill(tv, init, why)
    elif how == "scale":
        squares = [tv for tv in tensors if tv.meta.shape == out.meta.shape]
        numbers = [tv for tv in tensors if not tv.meta.shape]
        if len(squares) != 1 or len(numbers) != len(tensors) - 1 \
                or (op.name.startswith("aten::div") and named.get("self") is not squares[0]):
            return
        facts.shape_fill(squares[0], init, why)
        for tv in numbers:
            facts.positive.setdefault(tv.storage.index, why)
    elif how == "congruence":
        first, second = named.get("self"), named.get("other", named.get("mat2"))
        made = _producer(first, by_index) if isinstance(first, TensorValue) else None
        inner = made[0] if made is not None else None
        if inner is None or oprules.POSITIVE_DEFINITE.get(inner.name) != "congruence" \
                or not isinstance(second, TensorValue):
            return
        inner_named = {a.spec.name: a.value for a in inner.args}
        a, p = inner_named.get("self"), inner_named.get("other", inner_named.get("mat2"))
        if isinstance(a, TensorValue) and isinstance(p, TensorValue) \
                and second.storage is a.storage and _transposed(second.meta, a.meta) \
                and len(p.meta.shape) >= 2 and p.meta.shape[-1] == p.meta.shape[-2]:
            facts.shape_fill(p, (FillKind.SPD, p.meta.shape[-1], 0),
                             f"{why}: {a.meta.shape} congruence")


def _transposed(t: TensorMeta, a: TensorMeta) -> bool:
    """``t`` views the same elements as ``a``'s matrix transpose (``A.T``, ``A.mT``)."""
    return len(t.shape) == len(a.shape) >= 2 and t.offset == a.offset \
        and t.shape[:-2] == a.shape[:-2] and t.shape[-2:] == a.shape[-2:][::-1] \
        and t.strides[:-2] == a.strides[:-2] and t.strides[-2:] == a.strides[-2:][::-1]


def _propagate_domains(ops: list[Op], facts: _Facts) -> None:
    """Carry a view's positive or ranged floats back to the tensor it views: Adam's
    state of a complex parameter is a complex tensor the step reads through
    ``view_as_real``, and its square root needs the complex storage filled
    non-negative (a view of another dtype is another storage here). A positive result
    of an op that keeps signs (:data:`oprules.KEEPS_SIGN`: sums, products, matmuls)
    carries back to its arguments the same way: ``log(mel @ power + eps)`` with a
    filter bank filled with both signs took logs of negative numbers. Both carry back
    through the sources of an op that copies values unchanged as well
    (:data:`oprules.VALUE_PRESERVING`: index, gather, cat, where). A positive result
    of an op that is positive only for some arguments (:data:`oprules.POSITIVE_IF`)
    puts that condition on them."""
    by_index = {op.index: op for op in ops}
    signed = never_negative_reads(ops)
    for op in reversed(ops):
        _positive_if(op, facts)
        _complement_bound(op, facts)
        _product_bound(op, facts)
        _difference_bound(op, facts)
        _contracted(op, facts)
        _carry_rising(op, facts, by_index)
        keeps_sign = oprules.KEEPS_SIGN.get(op.name, ())
        if keeps_sign and not _non_negative_alpha(op):
            keeps_sign = ()
        # Arguments whose values the result holds unchanged: a view's base, and the
        # sources of a selection or copy (``alphas_cumprod[t] ** 0.5`` reads a buffer
        # through `index`: pow's range is the buffer's).
        same = oprules.VALUE_PRESERVING.get(op.name, ())
        if not op.signature.is_view and not keeps_sign and not same:
            continue
        outputs, positive = _positive_result(op, facts)
        ranged, below = _first_of(facts.float_range, outputs), _first_of(facts.below, outputs)
        small = _first_of(facts.small, outputs)
        if positive is None and ranged is None and below is None and small is None:
            continue
        for arg in op.args:
            holds_values = op.signature.is_view or arg.spec.name in same
            if not holds_values and arg.spec.name not in keeps_sign:
                continue
            for tv in iter_tensors(arg.value):
                if tv.storage is None or tv.storage.index in outputs:
                    continue
                if positive is not None and (tv.trace_id, tv.storage_id) not in \
                        signed.get(op.index, ()):
                    facts.positive.setdefault(tv.storage.index, f"{positive} (via {op.name})")
                if not holds_values:  # a sum's range is not its terms'
                    continue
                if ranged is not None:
                    facts.float_range.setdefault(tv.storage.index, ranged)
                if below is not None:
                    facts.below.setdefault(tv.storage.index, below)
                if small is not None:
                    facts.small.setdefault(tv.storage.index, small)


def never_negative_reads(ops: list[Op]) -> dict[int, set[tuple[int, int]]]:
    """For each op, the (tensor id, storage id) of the tensors it reads that the step
    made never negative, whatever their inputs hold: a positive result asks nothing
    more of those, and a floor of 0.0 under one was an eps (passes/numbers.py).
    ``rsqrt(h * h + 1)`` of a linear layer's ``h`` carried positivity back through the
    square, into every weight of three layers before it: filled all positive, the
    activations grew by the fan-in at each layer and a data-parallel replay's second
    step was inf.

    Made never negative: an op of ``oprules.NON_NEGATIVE_RESULTS``, one of
    ``oprules.NON_NEGATIVE_IF`` whose arguments meet its rule (a product of a tensor
    with itself, an even power, a clamp at a floor of at least 0), a view of a tensor
    never negative, and an op that keeps signs (``oprules.KEEPS_SIGN``) of such tensors
    and numbers of at least 0 alone (``h * h + 1``, ``sum(h * h)``)."""
    never_negative: set[tuple[int, int]] = set()
    found: dict[int, set[tuple[int, int]]] = {}
    for op in ops:
        keys = {(tv.trace_id, tv.storage_id) for arg in op.args
                for tv in iter_tensors(arg.value)}
        held = keys & never_negative
        if held:
            found[op.index] = held
        makes = _makes_non_negative(op, never_negative)
        for _path, tv in output_paths(op.outputs):
            key = (tv.trace_id, tv.storage_id)
            if makes:
                never_negative.add(key)
            else:
                never_negative.discard(key)
    return found


def _literal_number(value: object) -> int | float | None:
    """The number a Literal holds (a bool is none), else None."""
    if isinstance(value, Literal) and isinstance(value.value, (int, float)) \
            and not isinstance(value.value, bool):
        return value.value
    return None


def _at_least_zero(value: object) -> bool:
    number = _literal_number(value)
    return number is not None and number >= 0


def _meets(rule: tuple[str, str, str], args: dict[str, object]) -> bool:
    """Whether ``args`` meet an ``oprules.NON_NEGATIVE_IF`` rule."""
    kind, name, other_name = rule
    value = args.get(name)
    if kind == "square":
        other = args.get(other_name)
        return isinstance(value, TensorValue) and isinstance(other, TensorValue) \
            and (value.trace_id, value.storage_id) == (other.trace_id, other.storage_id)
    if kind == "even_power":
        number = _literal_number(value)
        return number is not None and number != 0 and number == int(number) \
            and int(number) % 2 == 0
    return kind == "floor_at_least_zero" and _at_least_zero(value)


def _makes_non_negative(op: Op, never_negative: set[tuple[int, int]]) -> bool:
    """Whether ``op``'s result is never negative (see never_negative_reads)."""
    if op.name in oprules.NON_NEGATIVE_RESULTS:
        return True
    args = {a.spec.name: a.value for a in op.args}
    self_value = args.get("self")

    def held(value: object) -> bool:
        return isinstance(value, TensorValue) \
            and (value.trace_id, value.storage_id) in never_negative

    if op.signature.is_view:
        return held(self_value)
    rule = oprules.NON_NEGATIVE_IF.get(op.name)
    if rule is not None and _meets(rule, args):
        return True
    keeps_sign = oprules.KEEPS_SIGN.get(op.name, ())
    if not keeps_sign or not _non_negative_alpha(op):
        return False
    terms = [(name, args[name]) for name in keeps_sign if name in args]
    if not any(isinstance(v, (TensorValue, ListValue)) for _, v in terms):
        return False
    for _name, value in terms:
        tensors = list(iter_tensors(value))
        if tensors:
            if not all(held(tv) for tv in tensors):
                return False
        elif value is not None and not _at_least_zero(value):
            return False
    return True


def _literal_markers(ops: list[Op], facts: _Facts) -> None:
    """The value of an integral literal that ``x[...] = v`` writes, where later code
    tells it (:data:`oprules.MARKER_TESTS`, :data:`oprules.IGNORED_TARGETS`): ``x ==
    -2`` tests for -2, ``x >= 0`` for a marker below 0 (-1), a loss's ignore index for
    itself. torchvision's matchers mark unmatched anchors ``matched[...] = -1``;
    filled 0, every anchor matched a box."""
    if not facts.literal:
        return
    written: dict[int, list[int]] = {}  # storage written into -> literals written
    for op in ops:
        writes = oprules.LITERAL_WRITES.get(op.name)
        test, ignored = oprules.MARKER_TESTS.get(op.name), oprules.IGNORED_TARGETS.get(op.name)
        if writes is None and test is None and ignored is None:
            continue
        named = {a.spec.name: a.value for a in op.args}
        if writes is not None:
            target, value = named.get(writes[0]), named.get(writes[1])
            if isinstance(target, TensorValue) and isinstance(value, TensorValue) \
                    and target.storage is not None and value.storage is not None \
                    and value.storage.index in facts.literal \
                    and target.storage.dtype in INTEGRAL:
                written.setdefault(target.storage.index, []).append(value.storage.index)
            continue
        marker: int | None = None
        tested, other = named.get("self"), named.get("other")
        if test is not None and isinstance(other, Literal) and type(other.value) is int:
            if test == "equal" and other.value < 0:
                marker = other.value
            elif test == "sign" and other.value == 0:
                marker = -1
        elif ignored is not None:
            tested, index = named.get(ignored[0]), named.get(ignored[1])
            if isinstance(index, Literal) and type(index.value) is int and index.value < 0:
                marker = index.value
        if marker is None or not isinstance(tested, TensorValue) or tested.storage is None:
            continue
        named_value = test == "equal" or ignored is not None  # more than a sign
        for literal in written.get(tested.storage.index, ()):
            if literal not in facts.literal_value or named_value:
                facts.literal_value[literal] = (marker, f"a literal {op.name} tests",
                                                named_value)


def _segment_ids(ops: list[Op], facts: _Facts) -> None:
    """An integral input counted into K bins (:data:`oprules.BIN_COUNTS`) that then
    indexes a running sum (:data:`oprules.CUMULATIVE_SUMS`), ``cumsum(counts)[batch]``,
    is a segment id in CSR order: filled sorted, K runs (fill kind ``runs``). PyG's
    ``to_dense_batch`` places node i at ``i - ptr[batch[i]]`` in its graph; with a
    batch vector filled at random the places fell outside the graphs, and MinCut
    pooling's loss divided 0 by 0 on a graph left empty."""
    counted: dict[int, int] = {}  # storage of an index -> bins it was counted into
    cumulative: set[int] = set()  # storages a running sum wrote
    for op in ops:
        named = {a.spec.name: a.value for a in op.args}
        if op.name in oprules.CUMULATIVE_SUMS:
            cumulative.update(_output_storages(op))
            continue
        rule = oprules.BIN_COUNTS.get(op.name)
        if rule is not None:
            bins, index, dim = named.get(rule[0]), named.get(rule[1]), named.get("dim")
            s = facts.integral(index) if isinstance(index, TensorValue) else None
            if s is not None and isinstance(bins, TensorValue) and isinstance(dim, Literal) \
                    and type(dim.value) is int and -len(bins.meta.shape) <= dim.value \
                    < len(bins.meta.shape):
                counted.setdefault(s.index, bins.meta.shape[dim.value])
            continue
        if op.name != "aten::index" or not isinstance(named.get("self"), TensorValue):
            continue
        table = named["self"]
        if table.storage is None or table.storage.index not in cumulative:
            continue
        for tv in iter_tensors(named.get("indices") or ListValue(())):
            s = facts.integral(tv)
            if s is not None and s.index in counted and len(tv.meta.shape) == 1:
                facts.shape_fill(tv, (FillKind.RUNS, counted[s.index], 0),
                                 f"a segment id: {op.name} of a running sum of its counts")


def _literals_into_zeros(ops: list[Op], facts: _Facts) -> None:
    """The first integral or boolean literal that ``x[...] = v`` writes into a tensor
    made of zeros (:data:`oprules.ZERO_CREATIONS`, through views) is not 0: writing 0
    there changes nothing. PyG's ``to_dense_batch`` builds its node mask as
    ``mask = zeros(n, dtype=bool); mask[idx] = 1``; filled False (the likeliest
    literal elsewhere), every mask was empty and a MinCut pooling loss divided 0 by 0.
    A literal later code tests for keeps that value (:func:`_literal_markers`)."""
    if not facts.literal:
        return
    by_index = {op.index: op for op in ops}
    written: set[int] = set()
    for op in ops:
        writes = oprules.LITERAL_WRITES.get(op.name)
        if writes is None:
            continue
        named = {a.spec.name: a.value for a in op.args}
        target, value = named.get(writes[0]), named.get(writes[1])
        if not (isinstance(target, TensorValue) and isinstance(value, TensorValue)
                and target.storage is not None and value.storage is not None):
            continue
        first = target.storage.index not in written
        written.add(target.storage.index)
        made = _producer(target, by_index)
        if (first and value.storage.index in facts.literal
                and (value.storage.dtype in INTEGRAL or value.storage.dtype == "bool")
                and made is not None and made[0].name in oprules.ZERO_CREATIONS):
            facts.literal_value.setdefault(
                value.storage.index, (1, f"a literal {op.name} writes into {made[0].name}",
                                      False))


def _producer(tv: TensorValue, by_index: dict[int, Op],
              through: frozenset[str] = frozenset()) -> tuple[Op, TensorValue] | None:
    """The op that computed ``tv``'s values, through views and the ops named in
    ``through`` (copies and casts of one tensor), with the tensor it made; None for an
    input."""
    for _ in range(len(by_index) + 1):
        binding = tv.binding
        while isinstance(binding, DerivedView):
            binding = binding.base
        if not isinstance(binding, OpOutput) or binding.op_index not in by_index:
            return None
        op = by_index[binding.op_index]
        if not op.signature.is_view and op.name not in through:
            return op, tv
        base = next((t for a in op.args for t in iter_tensors(a.value)), None)
        if base is None:
            return None
        tv = base
    return None


def _exponent_scales(ops: list[Op], facts: _Facts) -> None:
    """An exponent (:data:`oprules.EXPONENTS`) computed as positions (``arange``) times
    wrapped Python numbers, divided by others: ``exp(-log(10000) * arange(half) /
    half)``, the sinusoidal timestep and position embeddings. A plain trace holds no
    value of the numbers, and near 1 they made exponents up to half: from 128 up the
    float32 exp overflowed, inf times 0 was NaN, and every weight of a DiT's training
    replay NaN. The multipliers are filled so that the exponent lies in [-bound, 0],
    as a decaying frequency's does, counting every divisor at its least fill."""
    by_index = {op.index: op for op in ops}
    for op in ops:
        rule = oprules.EXPONENTS.get(op.name)
        named = {a.spec.name: a.value for a in op.args}
        exponent = named.get(rule[0]) if rule else None
        if not isinstance(exponent, TensorValue) or exponent.meta.dtype not in FLOATING:
            continue
        bound = oprules.EXPONENT_BOUND
        if rule[1] is not None:  # a number's power: bound / log(base)
            base = named.get(rule[1])
            if not (isinstance(base, Literal) and isinstance(base.value, (int, float))
                    and not isinstance(base.value, bool) and base.value > 1):
                continue
            bound /= math.log(base.value)
        found = _scaled_positions(exponent, by_index)
        if found is None:
            continue
        magnitude, multipliers, least_divisor = found
        if not multipliers or magnitude <= 0:
            continue
        high = (bound * least_divisor / magnitude) ** (1 / len(multipliers))
        why = f"{op.name} {rule[0]}: positions up to {magnitude:g} times it within {bound:g}"
        for k, s in enumerate(multipliers):
            span = (-high, -high / 2) if k == 0 else (high / 2, high)
            facts.float_range.setdefault(s.index, (*span, why))


def _scaled_positions(tv: TensorValue, by_index: dict[int, Op]
                      ) -> tuple[float, list[Storage], float] | None:
    """Where ``tv`` is ``arange(...)`` multiplied and divided by 0-d inputs (through
    views, copies and casts): the positions' largest magnitude, the floating 0-d
    inputs it is multiplied by, and the product of the least values its 0-d divisors
    are filled with (floating: 0.5, integral: 1); None for anything else."""
    multipliers: list[Storage] = []
    least_divisor = 1.0
    for _ in range(len(by_index) + 1):
        found = _producer(tv, by_index, oprules.SAME_VALUE_CASTS)
        if found is None:
            return None
        op, _made = found
        named = {a.spec.name: a.value for a in op.args}
        if op.name in oprules.POSITIONS:
            ends = [v.value for k in ("start", "end") if isinstance(v := named.get(k), Literal)
                    and isinstance(v.value, (int, float)) and not isinstance(v.value, bool)]
            return (max(abs(e) for e in ends), multipliers, least_divisor) if ends else None
        if op.name not in ("aten::mul", "aten::div"):
            return None
        this, other = named.get("self"), named.get("other")
        if not isinstance(this, TensorValue) or not isinstance(other, TensorValue):
            return None
        if _number_input(this) and op.name == "aten::mul":
            this, other = other, this
        if not _number_input(other) or other.storage is None:
            return None
        if op.name == "aten::div":
            least_divisor *= 0.5 if other.meta.dtype in FLOATING else 1.0
        elif other.meta.dtype in FLOATING:
            multipliers.append(other.storage)
        else:
            return None
        tv = this
    return None


def _number_input(tv: TensorValue) -> bool:
    """A 0-d input: mostly a Python number the argument parser wrapped."""
    return not tv.meta.shape and tv.storage is not None and tv.storage.materialised \
        and tv.storage.extent == 1


def _lengths_against_positions(ops: list[Op], facts: _Facts) -> None:
    """An integral input compared (:data:`oprules.LENGTH_COMPARISONS`) with positions,
    the result of ``arange(n)`` (:data:`oprules.POSITIONS`) through views, is a length:
    filled in [1, n] where nothing recorded says otherwise. ``arange(T) <
    lengths[:, None]`` builds a padding mask; filled from 0, a length of 0 masked a
    whole row, and its softmax was NaN."""
    by_index = {op.index: op for op in ops}
    for op in ops:
        if op.name not in oprules.LENGTH_COMPARISONS:
            continue
        tensors = [tv for arg in op.args for tv in iter_tensors(arg.value)]
        if len(tensors) != 2:
            continue
        for length, other in (tensors, tensors[::-1]):
            s = length.storage
            found = _producer(other, by_index)
            made = found[0] if found is not None else None
            if (s is None or not s.materialised or s.dtype not in INTEGRAL or made is None
                    or made.name not in oprules.POSITIONS or not other.meta.shape):
                continue
            positions = next((t for t in made.outputs if isinstance(t, TensorValue)), None)
            if positions is not None and positions.meta.numel >= 1:
                facts.lengths.setdefault(s.index, (positions.meta.numel, op.name))


_T = TypeVar("_T")


def _output_storages(op: Op) -> list[int]:
    """The indices of ``op``'s output storages, in order."""
    return [tv.storage.index for value in op.outputs for tv in iter_tensors(value)
            if tv.storage is not None]


def _first_of(found: dict[int, _T], storages: list[int]) -> _T | None:
    """What ``found`` holds for the first of ``storages`` it holds anything for."""
    return next((found[i] for i in storages if i in found), None)


def _positive_result(op: Op, facts: _Facts) -> tuple[list[int], str | None]:
    """``op``'s output storages in order, and why the first that must be positive
    must (None: none must)."""
    outputs = _output_storages(op)
    return outputs, _first_of(facts.positive, outputs)


def _complement_bound(op: Op, facts: _Facts) -> None:
    """Where ``op``'s result, ``number - alpha * tensor`` (:data:`oprules.COMPLEMENTS`),
    must be positive, its tensor lies below number / alpha."""
    rule = oprules.COMPLEMENTS.get(op.name)
    if rule is None:
        return
    outputs, why = _positive_result(op, facts)
    if why is None:  # a range above 0 (a power's base) needs it positive too
        why = next((r[2] for i in outputs if (r := facts.float_range.get(i)) and r[0] >= 0),
                   None)
    named = {a.spec.name: a.value for a in op.args}
    number, alpha = named.get(rule[1]), named.get("alpha", Literal(1))
    if why is None or not all(isinstance(v, Literal) and isinstance(v.value, (int, float))
                              and not isinstance(v.value, bool) for v in (number, alpha)):
        return
    if alpha.value <= 0:
        return
    # A result in a range (lo, hi) within [0, number] puts the tensor in (number - hi,
    # number - lo) / alpha: ``cumprod(1 - beta)`` in (0, 1) keeps each beta in (0, 1).
    # (A power's preferred range, (0.5, 1.5), is no such domain: ``(1 - a) ** 0.5``
    # only bounds a above.)
    ranged = _first_of(facts.float_range, outputs)
    for tv in iter_tensors(named.get(rule[0]) or ListValue(())):
        if tv.storage is None or tv.storage.index in outputs:
            continue
        if ranged is not None and ranged[0] >= 0 and ranged[1] <= number.value:
            low, high = ((number.value - ranged[1]) / alpha.value,
                         (number.value - ranged[0]) / alpha.value)
            facts.float_range.setdefault(tv.storage.index,
                                         (low, high, f"{ranged[2]} (via {op.name})"))
        facts.below.setdefault(tv.storage.index,
                               (number.value / alpha.value, f"{why} (via {op.name})"))


def _product_bound(op: Op, facts: _Facts) -> None:
    """Where a product's result (:data:`oprules.PRODUCTS`) must lie under b <= 1, and
    above 0, or in a range within [0, 1], every factor lies in (0, b]: a noise
    schedule's ``1 - cumprod(1 - beta)`` under a square root needs each ``1 - beta``
    there."""
    factors = oprules.PRODUCTS.get(op.name)
    if factors is None:
        return
    outputs = _output_storages(op)
    ranged, below = _first_of(facts.float_range, outputs), _first_of(facts.below, outputs)
    if ranged is not None and ranged[0] >= 0 and ranged[1] <= 1:
        high, why = ranged[1], ranged[2]
    elif below is not None and 0 < below[0] <= 1:
        high, why = below
    else:
        return
    named = {a.spec.name: a.value for a in op.args}
    for tv in iter_tensors(named.get(factors) or ListValue(())):
        if tv.storage is not None and tv.storage.index not in outputs:
            facts.float_range.setdefault(tv.storage.index,
                                         (0.0, high, f"{why} (via {op.name})"))


def rising_run(greater: TensorMeta, lesser: TensorMeta, extent: int) -> int | None:
    """The run of storage elements that, each filled rising, puts every element of
    ``greater`` above the element of ``lesser`` at the same index: both views of one
    storage of ``extent`` elements, of one shape and strides, ``greater`` further into
    it (a box's ``x2`` and ``x1``, two elements apart in rows of 4). None where no run
    holds every pair."""
    if greater.shape != lesser.shape or greater.strides != lesser.strides \
            or greater.storageless or lesser.numel == 0:
        return None
    delta = greater.offset - lesser.offset
    if delta <= 0:
        return None
    dims = [(stride, n) for stride, n in zip(lesser.strides, lesser.shape, strict=True)
            if n > 1]
    outer = [stride for stride, _ in dims if stride > delta]
    run = min(outer) if outer else extent
    if run <= 0 or any(stride % run for stride in outer):
        return None
    spread = sum((n - 1) * stride for stride, n in dims if stride < run)
    return run if lesser.offset % run + spread + delta < run else None


def _difference_bound(op: Op, facts: _Facts) -> None:
    """Where ``op``'s result, ``greater - lesser`` (:data:`oprules.DIFFERENCES`), must be
    positive and both are views of one tensor at two offsets, that tensor rises within
    runs holding every pair: a detector's box targets ``log((x2 - x1) / w)``, with
    boxes filled at random, took logs of negative widths and trained NaN."""
    rule = oprules.DIFFERENCES.get(op.name)
    if rule is None:
        return
    # (a domain only: a preferred range, a power's base, would reorder a weight read as
    # ``(w[1:] - w[:-1]) ** 2``)
    outputs, why = _positive_result(op, facts)
    if why is None:  # a domain's range above 0 (log1p's), not the near-1 preference
        why = next((r[2] for i in outputs if (r := facts.float_range.get(i))
                    and r[0] >= 0 and (r[0], r[1]) != oprules.POSITIVE_FLOATING[1:]), None)
    named = {a.spec.name: a.value for a in op.args}
    greater, lesser = named.get(rule[0]), named.get(rule[1])
    alpha = named.get("alpha", Literal(1))
    if why is None or not isinstance(greater, TensorValue) \
            or not isinstance(lesser, TensorValue) \
            or not (isinstance(alpha, Literal) and alpha.value == 1):
        return
    s = greater.storage
    if s is not None and lesser.storage is not None and lesser.storage is not s:
        _separate_difference(op, greater, lesser, outputs, why, facts)
        return
    if s is None or lesser.storage is not s or s.index in outputs or s.dtype not in FLOATING:
        return
    run = rising_run(greater.meta, lesser.meta, s.extent)
    if run is not None:
        facts.rising.setdefault(s.index, (run, f"{why} (via {op.name}: {rule[0]} > {rule[1]})"))


# The bound on the term a positive difference subtracts, against the greater term's
# positive fill (0.5, 1.5): ``sq - mean ** 2`` then lies in (0.25, 1.75).
_SMALL_TERM = 0.25


def _separate_difference(op: Op, greater: TensorValue, lesser: TensorValue,
                         outputs: list[int], why: str, facts: _Facts) -> None:
    """``greater - lesser`` of two tensors (not views of one) that must be positive, or
    lie in a range above 0, the greater an input (a buffer, state): it is filled
    positive (within the middle half of the range) and lesser within (-w, w) for a
    quarter w of it (0.25 for a positive result), carried back through the ops it is
    computed by (:data:`oprules.CONTRACTING`): a running variance ``(sq - mean **
    2).sqrt()`` of two moment buffers, filled apart, was NaN, and ``log1p(hi - lo)``
    likewise; a wrapped Python int it subtracts (``n - 1``) puts it above that int's
    fill."""
    if greater.storage.index in outputs or lesser.storage.index in outputs \
            or greater.meta.dtype not in FLOATING or not greater.storage.materialised:
        # (a computed greater term is left alone: positivity carried back through what
        # computes it, ``log(mel @ power - floor)``, would fill a network's weights
        # positive, and its activations grow)
        return
    if lesser.meta.dtype in INTEGRAL and not lesser.meta.shape:
        # A wrapped Python int (``n - 1``), its value not in the trace: the greater lies
        # above the most it is filled with (Welford's ``sqrt(m2 / (n - 1))`` of a count
        # buffer filled near 1 took the square root of a negative number).
        top = facts.ranges.get(lesser.storage.index, (0, oprules.SCALAR_INTEGRAL[2] - 1))[1]
        _domain_range(facts, greater.storage.index,
                      (top + 0.5, top + 1.5, f"{why} (via {op.name}: above a number up "
                                             f"to {top})"))
        return
    if lesser.meta.dtype not in FLOATING:
        return
    ranged = _first_of(facts.float_range, outputs)
    why = f"{why} (via {op.name}: {greater.meta.shape} > {lesser.meta.shape})"
    if ranged is not None and ranged[0] >= 0 and math.isfinite(ranged[1]) \
            and (ranged[0], ranged[1]) != oprules.POSITIVE_FLOATING[1:]:
        low, high, _ = ranged
        width = (high - low) / 4
        _domain_range(facts, greater.storage.index, (low + width, high - width, why))
    else:
        width = _SMALL_TERM
    facts.positive.setdefault(greater.storage.index, why)
    facts.small.setdefault(lesser.storage.index, (width, why))


def _domain_range(facts: _Facts, i: int, ranged: tuple[float, float, str]) -> None:
    """A domain's range for storage ``i``, over a preferred one near 1 (a divisor's or a
    power's (0.5, 1.5)); a domain found first stays."""
    held = facts.float_range.get(i)
    if held is None or (held[0], held[1]) == oprules.POSITIVE_FLOATING[1:]:
        facts.float_range[i] = ranged


def _contracted(op: Op, facts: _Facts) -> None:
    """A result within (-c, c) of an op that keeps that bound (:data:`oprules.CONTRACTING`)
    puts it on its arguments (a power only where its exponent is a number >= 1). A 0-d
    factor is left alone: mostly a wrapped Python number (an EMA's decay, 0.99), filled
    near 1 or as recorded, it does not grow the product."""
    names = oprules.CONTRACTING.get(op.name)
    if names is None:
        return
    outputs = _output_storages(op)
    small = _first_of(facts.small, outputs)
    if small is None or small[0] > 1:
        return
    named = {a.spec.name: a.value for a in op.args}
    divisor = named.get("other") if op.name.startswith("aten::div") else None
    if divisor is not None and not (
            isinstance(divisor, TensorValue) and not divisor.meta.shape
            or isinstance(divisor, Literal) and isinstance(divisor.value, (int, float))
            and abs(divisor.value) >= 1):
        return
    exponent = named.get("exponent")
    if exponent is not None and not (isinstance(exponent, Literal)
                                     and isinstance(exponent.value, (int, float))
                                     and exponent.value >= 1):
        return
    for name in names:
        for tv in iter_tensors(named.get(name) or ListValue(())):
            if tv.storage is not None and tv.storage.index not in outputs \
                    and tv.meta.dtype in FLOATING and tv.meta.shape:
                facts.small.setdefault(tv.storage.index, (small[0], f"{small[1]} (via {op.name})"))


def _aligned(meta: TensorMeta, run: int) -> bool:
    """Whether ``meta`` is contiguous and made of whole runs of ``run`` elements,
    aligned in its storage."""
    return not meta.storageless and run > 0 and meta.offset % run == 0 \
        and meta.numel % run == 0 and all(
            stride == want for stride, want, n in
            zip(meta.strides, contiguous_strides(meta.shape), meta.shape, strict=True)
            if n > 1)


def _rows_of(meta: TensorMeta, run: int) -> int | None:
    """Where ``meta`` is aligned runs of ``run`` elements that its last dimensions hold,
    from the returned one on: that dimension (the first of the largest such tail)."""
    if not _aligned(meta, run):
        return None
    return next((k for k in range(len(meta.shape), -1, -1) if prod(meta.shape[k:]) == run),
                None)


def _moved_dims(value: object, rank: int) -> list[int] | None:
    """The dimensions an op selects or joins along: its ``dim`` (a Literal), or those
    its ``indices`` list indexes (a boolean mask indexes as many as it has)."""
    if isinstance(value, Literal) and isinstance(value.value, int) and rank:
        return [value.value % rank]
    if isinstance(value, ListValue):
        return [d for item, dim, width in _indexed_dims(value)
                if isinstance(item, TensorValue) for d in range(dim, dim + width)]
    return None


def _carry_rising(op: Op, facts: _Facts, by_index: dict[int, Op]) -> None:
    """Carry a rising order within runs back through an op that copies whole rows
    (:data:`oprules.MOVES_ROWS`): ``cat([gt_boxes[matched] ...])`` keeps each box's
    four values together and in order. Through a stack along the runs
    (:data:`oprules.STACKS`), it orders the stacked tensors, element by element, and
    where they rise with one tensor's columns (:data:`oprules.INCREASING`: a resize's
    ``stack([x1 * w, y1 * h, x2 * w, y2 * h], 1)``), that tensor rises along them."""
    rule = oprules.MOVES_ROWS.get(op.name)
    if rule is None and op.name not in oprules.SUMS:
        return
    out = next((tv for value in op.outputs[:1] for tv in iter_tensors(value)), None)
    if out is None or out.storage is None or out.storage.index not in facts.rising:
        return
    run, why = facts.rising[out.storage.index]
    if op.name in oprules.SUMS:
        _terms_rising(op, out, run, f"{why} (via {op.name})", facts)
    if rule is None:
        return
    source, along = rule
    named = {a.spec.name: a.value for a in op.args}
    sources = list(iter_tensors(named.get(source) or ListValue(())))
    if along:  # rows move as wholes where the op moves only dimensions before them
        rows = _rows_of(out.meta, run)
        moved = _moved_dims(named.get(along), len(out.meta.shape))
        if rows is None or moved is None:
            return
        if op.name in oprules.STACKS and moved == [rows] \
                and out.meta.shape[rows:] == (len(sources),):
            _columns_rising(sources, by_index, f"{why} (via {op.name})", facts)
            return
        if any(d >= rows for d in moved):
            return
    elif not _aligned(out.meta, run):  # every element keeps its place in memory order
        return
    for tv in sources:
        s = tv.storage
        if s is None or s is out.storage or s.dtype not in FLOATING \
                or (_rows_of(tv.meta, run) is None if along else not _aligned(tv.meta, run)):
            continue
        facts.rising.setdefault(s.index, (run, f"{why} (via {op.name})"))


def _terms_rising(op: Op, out: TensorValue, run: int, why: str, facts: _Facts) -> None:
    """A sum rises within runs where each of its terms does along the same last
    dimensions (a 0-d term shifts every element alike)."""
    rows = _rows_of(out.meta, run)
    if rows is None or not _non_negative_alpha(op):
        return
    tail = out.meta.shape[rows:]
    for arg in op.args:
        for tv in iter_tensors(arg.value):
            s = tv.storage
            if s is None or s is out.storage or s.dtype not in FLOATING \
                    or not tv.meta.shape:
                continue
            if tail and tuple(tv.meta.shape[-len(tail):]) == tail \
                    and _rows_of(tv.meta, run) is not None:
                facts.rising.setdefault(s.index, (run, why))


def _columns_rising(tensors: list[TensorValue], by_index: dict[int, Op], why: str,
                    facts: _Facts) -> None:
    """Where each of ``tensors`` rises with a view of one storage (through
    :data:`oprules.INCREASING` ops), the views in order, each further into it: that
    storage rises within runs holding them all."""
    views = [_rises_with(tv, by_index) for tv in tensors]
    if len(views) < 2 or any(v is None or v.storage is not views[0].storage for v in views):
        return
    s = views[0].storage
    offsets = [v.meta.offset for v in views]
    if s is None or s.dtype not in FLOATING or offsets != sorted(set(offsets)):
        return
    run = rising_run(views[-1].meta, views[0].meta, s.extent)
    if run is not None:
        facts.rising.setdefault(s.index, (run, why))


def _rises_with(tv: TensorValue, by_index: dict[int, Op]) -> TensorValue | None:
    """The view ``tv`` rises with through ops that scale, shift or copy it (a few)."""
    for _ in range(4):
        binding = tv.binding
        op = by_index.get(binding.op_index) if isinstance(binding, OpOutput) else None
        if op is None or op.signature.is_view or op.name not in oprules.INCREASING:
            return tv
        tensors = [(a.spec.name, t) for a in op.args for t in iter_tensors(a.value)]
        grows = [t for name, t in tensors if name in oprules.INCREASING[op.name]
                 and t.meta.shape]
        if len(grows) != 1 or any(t.meta.shape for _, t in tensors if t is not grows[0]):
            return None
        tv = grows[0]
    return None


def _positive_if(op: Op, facts: _Facts) -> None:
    """Where ``op``'s result must be positive, its :data:`oprules.POSITIVE_IF` condition
    on its inputs: some positive, some in a range."""
    rule = oprules.POSITIVE_IF.get(op.name)
    if rule is None:
        return
    outputs, why = _positive_result(op, facts)
    if why is None:
        return
    positive, ranges = rule
    why = f"{why} (via {op.name})"
    for arg in op.args:
        for tv in iter_tensors(arg.value):
            if tv.storage is None or tv.storage.index in outputs:
                continue
            if arg.spec.name in positive:
                facts.positive.setdefault(tv.storage.index, why)
            elif arg.spec.name in ranges:
                low, high = ranges[arg.spec.name]
                facts.float_range.setdefault(tv.storage.index, (low, high, why))


def _masks_to_fit(ops: list[Op], counts: dict[tuple[int, int], int | None]
                  ) -> dict[tuple[int, int], int]:
    """The computed masks worth fitting where they are made: read by an op whose result
    cannot be fitted after it (``index_put_`` takes as many values as the mask has
    trues) or by two ops (``x[mask]`` and ``labels[mask]`` pick matching rows). A mask
    only one data-dependent op reads (a mixture of experts' ``where(chosen == e)``) is
    left alone: that op's result is fitted, and fitting the mask too would cost a sync
    and a kernel per expert every iteration (its inference step replayed 13 % slow)."""
    readers: dict[tuple[int, int], set[int]] = {}
    unfitted: set[tuple[int, int]] = set()
    for op in ops:
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                b = tv.binding
                if not isinstance(b, OpOutput) or len(b.path) != 1:
                    continue
                key = (b.op_index, b.path[0])
                if counts.get(key) is None:
                    continue
                readers.setdefault(key, set()).add(op.index)
                if op.name not in oprules.DATA_DEPENDENT_OUTPUTS:
                    unfitted.add(key)
    return {key: count for key, count in counts.items()
            if count is not None and (key in unfitted or len(readers.get(key, ())) > 1)}


# Ops that write through indices, their result `self` whatever the indices' count: the
# argument of the indices, and that of the value written at each.
_INDEX_WRITERS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("aten::index_put_", "aten::index_put", "aten::_index_put_impl_"),
                    ("indices", "values")),
    **dict.fromkeys(("aten::index_fill_", "aten::index_fill"), ("index", "value")),
}


def _unfitted_indices(ops: list[Op]) -> None:
    """Set ``Op.unfitted``: the data-dependent outputs that only index writes read, as
    their indices, with one value for any count (``mask[torch.where(full_rows)] =
    False``, Mask2Former's guard against a query that masks every key), maybe through
    views that keep their rows for any count (``nonzero().squeeze(1)``). Fitted to the
    recorded count, a cut would drop rows the replayed values select and leave them
    unwritten (there: rows all -inf, a softmax of NaN, NaN weights after a step); the
    write's result has its recorded size either way, so nothing later needs the fit."""
    by_index = {op.index: op for op in ops}
    made: dict[int, tuple[int, int]] = {}  # storage -> its data-dependent maker
    for op in ops:
        if op.name in oprules.DATA_DEPENDENT_OUTPUTS:
            for position, value in enumerate(op.outputs):
                for tv in iter_tensors(value):
                    if tv.storage is not None:
                        made[id(tv.storage)] = (op.index, position)
    read: set[tuple[int, int]] = set()
    needed: set[tuple[int, int]] = set()
    for op in ops:
        index, written = _INDEX_WRITERS.get(op.name, ("", ""))
        value = next((a.value for a in op.args if a.spec.name == written), None)
        # one value for any count: a scalar, or a tensor of one element
        broadcast = bool(index) and (not isinstance(value, TensorValue)
                                     or value.meta.numel <= 1)
        passes_rows = op.signature.is_view and oprules.keeps_rows(op.name, _arg_facts(op))
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                maker = _rows_maker(tv, by_index)
                traced = maker is not None  # else read otherwise (a view by offset)
                if not traced and tv.storage is not None:
                    maker = made.get(id(tv.storage))
                if maker is None or maker[0] == op.index:
                    continue
                read.add(maker)
                if traced and passes_rows and arg.spec.name == "self":
                    continue  # its readers read the rows
                if not (traced and broadcast and arg.spec.name == index):
                    needed.add(maker)
    for index, position in read - needed:
        by_index[index].unfitted = by_index[index].unfitted | {position}


def _rows_maker(tv: TensorValue, by_index: dict[int, Op]) -> tuple[int, int] | None:
    """The data-dependent op and output position whose rows ``tv`` holds, directly or
    through views that keep rows (:func:`oprules.keeps_rows`), or None."""
    for _ in range(8):
        b = tv.binding
        op = by_index.get(b.op_index) if isinstance(b, OpOutput) and b.path else None
        if op is None:
            return None
        if op.name in oprules.DATA_DEPENDENT_OUTPUTS:
            return op.index, b.path[0]
        source = next((a.value for a in op.args if a.spec.name == "self"), None)
        if not (op.signature.is_view and isinstance(source, TensorValue)
                and oprules.keeps_rows(op.name, _arg_facts(op))):
            return None
        tv = source
    return None


def fits_output(op: Op, value: object) -> bool:
    """Whether the file fits this output of ``op`` to its recorded size after the op
    (backends/valuefill.py): an op whose output sizes depend on values
    (``oprules.DATA_DEPENDENT_OUTPUTS``), or a sparse result whose entry count does
    (``SPARSE_DATA_DEPENDENT_OUTPUTS``). Under a guard too: a stand-in has the recorded
    size already, but a portable equivalent (torchvision's nms) keeps what its
    values decide. Not one left at its replayed size (``Op.unfitted``)."""
    if any(value is op.outputs[p] for p in op.unfitted if p < len(op.outputs)):
        return False
    if op.name in oprules.DATA_DEPENDENT_OUTPUTS:
        return True
    return (op.name in oprules.SPARSE_DATA_DEPENDENT_OUTPUTS
            and isinstance(value, TensorValue) and value.meta.sparse is not None)


def _reusable_fits(ops: list[Op]) -> None:
    """Set ``Op.fits_reusable`` where the values the file fits after an op (its
    data-dependent outputs, its masks in ``true_counts``) are made by it and written by
    no later op: the step makes them anew each iteration and only reads them, so a fit
    made once serves every later iteration whose value misses the recorded size again
    (``_fit``'s ``site``). A fit costs a harness call, and a cut or repeat, in the
    timed step: a mixture of experts fits every expert's token list, and its inference
    step replayed 6 % slower than with fits reused (measured side by side)."""
    last_write: dict[int, int] = {}
    for op in ops:
        for arg in op.args:
            if arg.spec.writes:
                for tv in iter_tensors(arg.value):
                    if tv.storage is not None:
                        last_write[id(tv.storage)] = op.index
    for op in ops:
        fits = any(fits_output(op, value) for value in op.outputs)
        if not (fits or op.true_counts or op.fit_values):
            continue
        made = [tv.storage for value in op.outputs for tv in iter_tensors(value)]
        op.fits_reusable = bool(made) and all(
            s is not None and not s.materialised and last_write.get(id(s), -1) <= op.index
            for s in made)


def mark_only_guarded_readers(ops: list[Op], storages: list[Storage]) -> None:
    """Set ``Storage.only_guarded_readers`` for inputs every op reading is guarded: the
    file need not make (and fill) them where none of those ops exists. Over the whole
    program (every composed or repeated block), since blocks may share an input."""
    readers: dict[int, set[int]] = {}
    unguarded: set[int] = set()
    for op in ops:
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                if tv.storage is None or not tv.storage.materialised:
                    continue
                readers.setdefault(id(tv.storage), set()).add(op.index)
                if not op.guard:
                    unguarded.add(id(tv.storage))
    for s in storages:
        if s.materialised and id(s) in readers and id(s) not in unguarded:
            s.only_guarded_readers = tuple(sorted(readers[id(s)]))


def _non_negative_alpha(op: Op) -> bool:
    alpha = next((a.value for a in op.args if a.spec.name == "alpha"), None)
    return not (isinstance(alpha, Literal) and isinstance(alpha.value, (int, float))
                and alpha.value < 0)


def _shift_windows(ops: list[Op], facts: _Facts) -> None:
    """An unrecorded offset that shifts windowed indices is the window's low bound.

    A sharded dimension's indices are masked outside ``[low, high)`` by compares with
    recorded Scalars (:data:`oprules.WINDOW_BOUNDS`) and shifted by ``low``
    (:data:`oprules.WINDOW_SHIFTS`), a Python int the trace records as a 0-d tensor
    with no value. The compares may read the tensor before it is copied (``clone``,
    ``where``): storages whose values one copies from another count as one. Applied
    only where every compare of those values agrees on one low bound and a high bound
    exists, and no recorded value or range fills the offset."""
    parent: dict[int, int] = {}

    def root(i: int) -> int:
        while parent.get(i, i) != i:
            i = parent[i]
        return i

    for op in ops:  # values copied from one storage to another: one class
        sources = oprules.VALUE_PRESERVING.get(op.name, ())
        outs = [tv.storage.index for value in op.outputs for tv in iter_tensors(value)
                if tv.storage is not None]
        for arg in op.args:
            if arg.spec.name in sources:
                for tv in iter_tensors(arg.value):
                    for out in outs if tv.storage is not None else ():
                        parent[root(out)] = root(tv.storage.index)
    lows: dict[int, set[int]] = {}
    highs: set[int] = set()
    for op in ops:
        side = oprules.WINDOW_BOUNDS.get(op.name)
        if side is None:
            continue
        named = {a.spec.name: a.value for a in op.args}
        tensor, bound = named.get("self"), named.get("other")
        if not isinstance(tensor, TensorValue) or tensor.storage is None \
                or tensor.meta.dtype not in INTEGRAL or not isinstance(bound, Literal) \
                or type(bound.value) is not int:
            continue
        if side == "low":
            lows.setdefault(root(tensor.storage.index), set()).add(bound.value)
        else:
            highs.add(root(tensor.storage.index))
    for op in ops:
        shift = oprules.WINDOW_SHIFTS.get(op.name)
        if shift is None:
            continue
        named = {a.spec.name: a.value for a in op.args}
        tensor, offset = named.get(shift[0]), named.get(shift[1])
        if not (isinstance(tensor, TensorValue) and isinstance(offset, TensorValue)):
            continue
        s, cls = offset.storage, root(tensor.storage.index) if tensor.storage else None
        if s is None or not s.materialised or s.dtype not in INTEGRAL or s.extent != 1 \
                or s.index in facts.data or s.index in facts.ranges:
            continue
        window = lows.get(cls, set()) if cls is not None else set()
        if len(window) == 1 and cls in highs:
            low = next(iter(window))
            facts.window_low.setdefault(s.index, (low, f"{op.name} {shift[1]}: the low "
                                                       f"bound {low} of its index window"))


def _guard_computed_values(ops: list[Op], facts: _Facts) -> None:
    """Set ``Op.in_range`` and ``Op.nonzero`` for index and integer divisor arguments
    the replay computes from values that are not the original's.

    Two kinds of such values:

    - what a fitted mask selected: ``_fit_mask`` reaches the recorded count by turning
      elements true that fail the condition the mask tested (D-FINE's loss selects the
      bins ``0 <= i < reg_max`` of its targets and reads ``values[i + 1]``; the replay
      read past the end). Everything derived from it is followed.
    - integer arithmetic on filled integers: an input filled within its bounds or its
      recorded range, but not with its recorded data, and every integral or boolean
      value computed from it (GLM-4V finds each position's image by comparing
      positions with the cumulative sum of its filled patch grid and counting, and
      the count reached past the last image: IndexError; Cosmos-3 divides each
      image's patch width by the merge size and takes remainders by that, and a filled
      width of 1 made the divisor 0: ZeroDivisionError on CPU), and a search's result
      over filled values (:data:`oprules.SEARCHES`). Floating values end the chain
      otherwise: an index a model derives from them (``argmax``, ``topk``) is in range
      by construction, and wrapping it would add an op to every routed step.

    Where such a value is read as an index with a known bound
    (:data:`oprules.INDEX_RULES`), the file wraps it into range (``_in_range``), which
    leaves every index that was valid on the element it names; where it is an integer
    divisor (:data:`oprules.INTEGER_DIVISORS`), the file divides by 1 where it is 0
    (``_nonzero``). An index or divisor that is itself an input is filled within its
    bound or nonzero, and is left as it is."""
    from_masks: set[OpOutput] = set()
    from_fills: set[OpOutput] = set()

    def origin(binding: object) -> object:
        while isinstance(binding, DerivedView):
            binding = binding.base
        return binding

    def filled(tv: TensorValue) -> bool:
        s = tv.storage
        return (s is not None and s.materialised and s.dtype in INTEGRAL
                and s.index not in facts.data)

    def computed(tv: TensorValue) -> bool:
        return origin(tv.binding) in from_masks or origin(tv.binding) in from_fills

    for op in ops:
        reads = [tv for arg in op.args for tv in iter_tensors(arg.value)]
        masked = bool(op.true_counts) or any(origin(tv.binding) in from_masks for tv in reads)
        # An op that keeps its input's values (a view, a copy, a selection) keeps a
        # filled input within the bound its readers put on it (`_propagate_bounds`):
        # only what is computed from one is followed.
        keeps = op.signature.is_view or op.name in oprules.VALUE_PRESERVING
        arithmetic = op.name not in oprules.METADATA_ONLY and any(
            tv.meta.dtype in INTEGRAL | {"bool"}
            and (origin(tv.binding) in from_fills or filled(tv) and not keeps)
            for tv in reads)
        # A search's result is one past the end where a filled value exceeds every
        # boundary, whichever dtype the values are.
        arithmetic = arithmetic or op.name in oprules.SEARCHES and any(
            tv.storage is not None and tv.storage.materialised for tv in reads)
        for _path, tv in output_paths(op.outputs):
            if isinstance(tv.binding, OpOutput):
                if masked:
                    from_masks.add(tv.binding)
                if arithmetic and tv.meta.dtype in INTEGRAL | {"bool"}:
                    from_fills.add(tv.binding)
        if op.guard:
            continue
        divisors = oprules.INTEGER_DIVISORS.get(op.name, ())
        op.nonzero = tuple(a.spec.name for a in op.args if a.spec.name in divisors
                           and isinstance(a.value, TensorValue)
                           and a.value.meta.dtype in INTEGRAL and computed(a.value))
        rules = oprules.INDEX_RULES.get(op.name)
        if not rules:
            continue
        by_name = {a.spec.name: a.value for a in op.args}
        for arg_name, k, tv, high in _index_bounds(rules, by_name, _arg_facts(op)):
            # (a bound list of tensors, each its own argument, is not wrapped)
            whole = k is not None or isinstance(by_name[arg_name], TensorValue)
            if whole and high > 0 and tv.meta.dtype in INTEGRAL and computed(tv):
                op.in_range[(arg_name, k)] = high


def _index_bounds(rules: dict[str, object], by_name: dict[str, object],
                  args: dict[str, object]
                  ) -> Iterator[tuple[str, int | None, TensorValue, int]]:
    """The index tensors an op's index rules bound, as (argument, position in its list
    or None, tensor, exclusive bound): a :class:`oprules.Bound`'s every tensor, and
    ``aten::index``'s ``indices[k]`` (not a mask) by dim k of the tensor it indexes."""
    for arg_name, rule in rules.items():
        value = by_name.get(arg_name)
        if value is None:
            continue
        if isinstance(rule, oprules.PerDim):
            shape = args.get(rule.tensor)
            if not isinstance(value, ListValue) or not isinstance(shape, tuple):
                continue
            for k, (item, dim, _) in enumerate(_indexed_dims(value)):
                if isinstance(item, TensorValue) and dim < len(shape) \
                        and item.meta.dtype not in _MASK_DTYPES:
                    yield arg_name, k, item, shape[dim]
        elif isinstance(rule, oprules.Bound):
            high = rule.upper(args)
            for tv in iter_tensors(value) if high is not None else ():
                yield arg_name, None, tv, high


_MASK_DTYPES = ("bool", "uint8")


def _indexed_dims(indices: ListValue) -> Iterator[tuple[object, int, int]]:
    """Each item of an ``indices`` list with the first dimension it indexes and how
    many: a mask indexes as many as it has (``t[mask, labels[mask]] = 1`` with a 2-D
    mask: the labels index dimension 2, not 1)."""
    dim = 0
    for item in indices.items:
        masks = isinstance(item, TensorValue) and item.meta.dtype in _MASK_DTYPES
        width = max(len(item.meta.shape), 1) if masks else 1
        yield item, dim, width
        dim += width


def _mask_rows(op: Op, rule: oprules.PerDim, value: object, args: dict[str, object],
               facts: _Facts, arg_name: str) -> None:
    """``aten::index``'s boolean masks (its integer indices: `_index_bounds`): a mask
    selects the recorded rows. The selection is the output of ``index`` and the
    ``values`` of ``index_put_`` (:attr:`PerDim.selection`); values that broadcast into
    it do not give its rows."""
    shape = args.get(rule.tensor)
    if not isinstance(value, ListValue) or not isinstance(shape, tuple):
        return
    selected = args.get(rule.selection) if rule.selection else \
        (_output_shapes(op)[0] if op.outputs else None)
    for item, dim, _ in _indexed_dims(value):
        if not isinstance(item, TensorValue) or dim >= len(shape) or item.meta.dtype != "bool":
            continue
        # x[mask]: the masked dims collapse into one of (true count) rows at `dim`.
        collapsed = len(shape) - len(item.meta.shape) + 1
        if isinstance(selected, tuple) and len(selected) == collapsed and dim < collapsed:
            facts.shape_fill(item, (FillKind.MASK, selected[dim], 0),
                             f"{op.name} {arg_name}[{dim}]")


def _one_value(values: list[float]) -> float | None:
    """The value every op recorded for one storage, if they agree (one 0-d storage may
    serve several wrapped numbers in turn: then none of them is its value)."""
    if not values or not all(math.isfinite(v) for v in values):
        return None
    low, high = min(values), max(values)
    return values[0] if high - low <= 1e-12 * max(1.0, abs(high)) else None


def _choose(s: Storage, facts: _Facts) -> Init:
    init = _choose_any(s, facts)
    if s.index in facts.divisor and init.kind in ("span", "randint") and init.low <= 0:
        # An integer divisor: the original never divided by 0 (it raises), so neither
        # may the replay. Positive values: [1, high] ("span") or [1, high) ("randint").
        low, high = 1, max(init.high, 1 if init.kind == "span" else 2)
        return Init(init.kind, low, high, f"{init.why}; {facts.divisor[s.index]} != 0".lstrip("; "))
    return init


def _below(bound: tuple[float, str], positive: str | None) -> Init:
    """Floats under ``bound``, and positive too where ``positive`` says why: the middle
    half of (0, bound), else as far under the bound as positive fills lie above 0."""
    high, why = bound
    if positive is not None and high > 0:
        return Init(FillKind.UNIFORM, high / 4, high * 3 / 4, f"{positive}; {why} < {high:g}")
    if positive is not None:  # (no positive value is under it: positive wins)
        kind, low, top = oprules.POSITIVE_FLOATING
        return Init(kind, low, top, positive)
    _, low, top = oprules.POSITIVE_FLOATING
    return Init(FillKind.UNIFORM, high - top, high - low, f"{why} < {high:g}")


def _small(bound: tuple[float, str], ranged: tuple[float, float, str] | None,
           positive: str | None) -> Init:
    """Floats within (-c, c), the term a positive difference subtracts, and within a
    domain's range where the two meet (a preferred range, a power's (0.5, 1.5), that
    does not meet it gives way); above 0 where they must be positive too."""
    c, why = bound
    low, high = -c, c
    if positive is not None:
        low, why = c / 4, f"{positive}; {why}"
    if ranged is not None and max(low, ranged[0]) < min(high, ranged[1]):
        low, high = max(low, ranged[0]), min(high, ranged[1])
    return Init(FillKind.UNIFORM, low, high, f"{why}: within {c:g}")


def _integral_domain(facts: _Facts, i: int) -> Init | None:
    """The integers inside a floating function's domain, for an integral input it reads
    (OpInfo's int64 samples: 0..8 took log(0), rsqrt(0) and acos(2), inf and NaN); None
    where the domain holds no integer (then the default fill)."""
    if i in facts.float_range:
        low, high, why = facts.float_range[i]
        first, last = math.ceil(low), math.floor(high)
        return Init(FillKind.RANDINT, first, last + 1, why) if first <= last else None
    if i in facts.positive:
        _, _, high = oprules.DEFAULT_INTEGRAL
        return Init(FillKind.RANDINT, 1, high, facts.positive[i])
    return None


def _choose_any(s: Storage, facts: _Facts) -> Init:
    i = s.index
    if i in facts.workspace:
        return Init(FillKind.ZEROS, 0, 0, facts.workspace[i])
    if i in facts.literals:  # a constant of the step's code: as the original built it
        return Init(FillKind.VALUES, 0, len(facts.data[i]), "recorded literal",
                    values=tuple(facts.data[i]))
    if i in facts.data:
        values = [int(v) for v in facts.data[i]]
        high = facts.upper.get(i, (None, ""))[0]
        packed = _narrow(values)
        if packed and (high is None or all(0 <= v < high for v in values)):
            return Init(FillKind.DATA, packed[0], len(values), "recorded data", packed[1])
    if i in facts.item_values:
        values = facts.item_values[i]
        high = facts.upper.get(i, (None, ""))[0] if s.dtype in INTEGRAL else None
        if high is None or all(0 <= v < high for v in values):
            return Init(FillKind.VALUES, 0, len(values), "the values .item() read",
                        values=tuple(values))
    if i in facts.window_low:
        low, why = facts.window_low[i]
        return Init(FillKind.SPAN, low, low, why)
    if i in facts.shape:
        (kind, low, high), why = facts.shape[i]
        return Init(kind, low, high, why)
    if i in facts.offsets:
        total, last, why = facts.offsets[i]
        return Init(FillKind.CUTS, 0, total, why) if last else Init(FillKind.OFFSETS, 0, total, why)
    if i in facts.ranges and s.dtype in INTEGRAL:
        lo, hi = facts.ranges[i]
        limit_lo, limit_hi = _INT_LIMITS.get(s.dtype, (-(2**62), 2**62))
        why = "recorded range"
        if i in facts.upper:  # never outside what every consumer accepts
            high, why = facts.upper[i]
            limit_lo, limit_hi = 0, high - 1
        lo, hi = max(lo, limit_lo), min(hi, limit_hi)
        if lo <= hi:
            return Init(FillKind.SPAN, lo, hi, why)
    if i in facts.lengths and s.dtype in INTEGRAL:
        n, op_name = facts.lengths[i]
        high = min(n, facts.upper[i][0] - 1) if i in facts.upper else n
        if high >= 1:
            return Init(FillKind.SPAN, 1, high, f"a length: {op_name} against arange({n})")
    if i in facts.literal_value and s.dtype in INTEGRAL:
        # (a test that names the value wins over a reader's bound: a loss's ignore
        # index lies outside its classes; a sign alone does not)
        value, why, named_value = facts.literal_value[i]
        if named_value or i not in facts.upper:
            return Init(FillKind.SPAN, value, value, f"{why}: {value}")
    if i in facts.literal_value and s.dtype == "bool":
        value, why, _ = facts.literal_value[i]
        return Init(FillKind.ONES if value else FillKind.ZEROS, 0, 0, f"{why}: {bool(value)}")
    kept = facts.keep_all.get(i)
    if kept is not None and s.dtype == "bool":
        return Init(FillKind.ONES if kept[0] else FillKind.ZEROS, 0, 0, kept[1])
    if i in facts.upper:
        high, why = facts.upper[i]
        return Init(FillKind.RANDINT, 0, high, why + f" < {high}")
    if s.extent == 1 and i in facts.literal and (s.dtype == "bool" or s.dtype in INTEGRAL) \
            and i not in facts.positive and i not in facts.float_range:
        # ``keep[..., :1] = False``, ``x[x < 0] = 0``: the likeliest literal (a divisor
        # still gets 1: _choose).
        why = "a literal x[...] = v writes: 0, the likeliest"
        if s.dtype == "bool":
            return Init(FillKind.ZEROS, 0, 0, why)
        return Init(FillKind.RANDINT, 0, 1, why)
    if s.dtype == "bool":
        domain = _integral_domain(facts, i) if i in facts.float_read else None
        if domain is not None and domain.low >= 1:  # atanh(True), x / False: inf
            return Init(FillKind.ONES, 0, 0, domain.why)
        if domain is not None and domain.high <= 1:
            return Init(FillKind.ZEROS, 0, 0, domain.why)
        return Init(FillKind.BOOL, 0, 1)
    if s.dtype in QUANTIZED:  # its integer representation, over all of its range
        _, low, high = QUANTIZED[s.dtype]
        return Init(FillKind.RANDINT, low, high, "quantized: any integer representation")
    if s.dtype in INTEGRAL:
        # (a value the capture recorded was the original's, inside every reader's
        # domain: it wins over a domain inferred from the readers, as for floats)
        value = _one_value(facts.scalar_values.get(i, []))
        if value is not None and s.extent == 1 and value == int(value):
            return Init(FillKind.SPAN, int(value), int(value), "recorded value")
        domain = _integral_domain(facts, i) if i in facts.float_read else None
        if domain is not None:
            return domain
        if s.extent == 1 and i in facts.scalar:
            kind, low, high = oprules.SCALAR_INTEGRAL
            return Init(kind, low, high, "0-d tensor (a wrapped Python integer): never 0")
        kind, low, high = oprules.DEFAULT_INTEGRAL
        return Init(kind, low, high)
    if s.dtype in FLOATING or s.dtype.startswith("complex"):
        if i in facts.norms:
            row, max_norm, norm_type, over, why = facts.norms[i]
            flat = tuple(v for pair in sorted(over.items()) for v in pair)
            return Init(FillKind.NORMS, row, max_norm, f"{why}: {len(over)} rows above "
                        f"max_norm {max_norm:g}", values=(norm_type, *flat))
        value = _one_value(facts.scalar_values.get(i, []))
        if value is not None and s.extent == 1 and not s.dtype.startswith("complex"):
            return Init(FillKind.UNIFORM, value, value, "recorded value")
        if i in facts.rising:
            run, why = facts.rising[i]
            return Init(FillKind.RISING, run, 0, why)
        if i in facts.small:
            return _small(facts.small[i], facts.float_range.get(i), facts.positive.get(i))
        if i in facts.float_range:
            low, high, why = facts.float_range[i]
            if i in facts.below and high > facts.below[i][0]:  # narrowed under the bound
                return _below(facts.below[i], why if low >= 0 else facts.positive.get(i))
            return Init(FillKind.UNIFORM, low, high, why)
        if i in facts.below:
            return _below(facts.below[i], facts.positive.get(i))
        if i in facts.positive:
            kind, low, high = oprules.POSITIVE_FLOATING
            if i in facts.weights and i in facts.fan_in and i not in facts.activation:
                # A weight filled positive: scaled by its fan-in, a product with it
                # keeps its input's size (filled as it comes, each layer multiplied
                # activations by the fan-in, and a deep step overflowed). Only an op's
                # ``weight``: other state of 2+ dims (RMSprop's square_avg, under a
                # square root of a difference) keeps its own fill.
                n = facts.fan_in[i]
                return Init(kind, low / n, high / n, f"{facts.positive[i]}; over fan-in {n}")
            return Init(kind, low, high, facts.positive[i])
        if s.extent == 1 and i in facts.scalar:
            kind, low, high = oprules.SCALAR_FLOATING
            return Init(kind, low, high, "0-d tensor (a wrapped Python scalar)")
        if i in facts.fan_in and i not in facts.activation:
            # Like nn.Linear / nn.Conv's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
            # so that activations and gradients stay finite over many training
            # iterations (with U(-1, 1) weights they overflow to inf/NaN within a few).
            bound = 1.0 / math.sqrt(facts.fan_in[i])
            return Init(FillKind.UNIFORM, -bound, bound, f"fan-in {facts.fan_in[i]}")
        if i in facts.bias_fan_in:
            bound = 1.0 / math.sqrt(facts.bias_fan_in[i])
            return Init(FillKind.UNIFORM, -bound, bound,
                        f"bias, fan-in {facts.bias_fan_in[i]}")
        kind, low, high = oprules.DEFAULT_FLOATING
        return Init(kind, low, high)
    return Init(FillKind.ZEROS)
