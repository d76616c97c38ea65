"""Data-dependent output sizes: inputs filled so that outputs keep their recorded size.

Where a materialised input decides how large an op's output is (nonzero of a mask,
unique, repeat_interleave, bincount, one_hot's classes, jagged lengths), the input is
filled so the output comes out at its recorded size. Where that input is produced by a
replayed op (router logits -> top-k -> where -> index_add in a mixture of experts), the
values differ from the original's, so the benchmark fits each such output to its
recorded size (rows cut or repeated, so indices stay valid; other sizes cut or padded
with zeros) before anything reads it."""

from __future__ import annotations

from mystique_gen.harness.fills import FillKind
from mystique_gen.oprules.base import Facts, Fill, OpFamily, OutShapes, _numel, _out


class TrueCount(Fill):
    """Nonzero elements = the recorded rows of output ``index`` (``element`` of a list)."""

    def __init__(self, index: int = 0, element: int | None = None):
        self.index, self.element = index, element

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        shape = _out(outputs, self.index, self.element)
        return (FillKind.MASK, shape[0], 0) if shape else None


class MaskedCount(Fill):
    """``masked_select``: the output has (true elements of the broadcast mask) values."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        out, mask, other = _numel(_out(outputs)), _numel(args.get("mask")), \
            _numel(args.get("self"))
        if out is None or not mask or not other:
            return None
        factor = max(other // mask, 1)  # mask broadcast over a larger self
        return (FillKind.MASK, out // factor, 0) if out % factor == 0 else None


class ScatteredCount(Fill):
    """``masked_scatter``: the (broadcast) mask selects as many elements as the source
    holds (it may hold more: then as many as it holds, the most that is valid)."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        source, mask, self_ = _numel(args.get("source")), _numel(args.get("mask")), \
            _numel(args.get("self"))
        if source is None or not mask or not self_:
            return None
        factor = max(self_ // mask, 1)  # mask broadcast over a larger self
        return (FillKind.MASK, min(source // factor, mask), 0)


class DistinctCount(Fill):
    """``unique`` over all elements: as many distinct values as the recorded output."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        if args.get("dim") is not None:
            return None
        return (FillKind.DISTINCT, _numel(_out(outputs)) or 0, 0) if _out(outputs) else None


class RunCount(Fill):
    """``unique_consecutive``: as many runs as the recorded output has values."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        if args.get("dim") is not None:
            return None
        return (FillKind.RUNS, _numel(_out(outputs)) or 0, 0) if _out(outputs) else None


class RepeatsSum(Fill):
    """``repeat_interleave`` repeats add up to the output's size along ``dim``."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        out, repeats = _out(outputs), args.get("repeats")
        dim = args.get("dim")
        if out is None or not out or not isinstance(repeats, tuple):
            return None
        total = out[dim] if isinstance(dim, int) and -len(out) <= dim < len(out) else out[0]
        parts = _numel(repeats) or 0
        if parts == 1:  # one repeat count for every element
            inner = args.get("self")
            size = (inner[dim] if isinstance(dim, int) and isinstance(inner, tuple) and inner
                    else _numel(inner) if isinstance(inner, tuple) else 1) or 1
            return (FillKind.SUM, total // size, 0) if total % size == 0 else None
        return (FillKind.SUM, total, 0)

    def fitted_where_made(self, args: Facts) -> bool:
        # Given output_size, repeats that miss it raise ("allocated size does not match
        # required size"); without, the output is fitted to its recorded size after.
        return args.get("output_size") is not None


class MaxIsLast(Fill):
    """The largest value is one less than the recorded output's size along ``axis``:
    ``bincount``'s length, ``one_hot``'s classes (``num_classes=-1`` counts them from
    the values; given, the same span holds every class index)."""

    def __init__(self, axis: int = 0):
        self.axis = axis

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        out = _out(outputs)
        size = out[self.axis] if out else 0
        return (FillKind.SPAN, 0, size - 1) if size > 0 else None


class LengthsOf(Fill):
    """Jagged lengths: non-negative parts adding up to ``tensor``'s size along ``axis``."""

    def __init__(self, tensor: str, axis: str | int, cuts: bool = False):
        self.tensor, self.axis, self.cuts = tensor, axis, cuts

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        shape = args.get(self.tensor)
        axis = args.get(self.axis, 0) if isinstance(self.axis, str) else self.axis
        if not isinstance(shape, tuple) or not isinstance(axis, int) or not shape:
            return None
        total = shape[axis] if -len(shape) <= axis < len(shape) else None
        if total is None:
            return None
        return (FillKind.CUTS, 0, total) if self.cuts else (FillKind.SUM, total, 0)


class PackedLengths(Fill):
    """``_pack_padded_sequence``: lengths that pack as many rows as the recorded data
    (output 0) over as many steps as the recorded batch sizes (output 1): the longest
    sequence as long as those steps, the others as even as they can be, sorted
    longest first (``enforce_sorted``). The same shapes, whatever the original's
    lengths were."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        data, steps, lengths = _out(outputs, 0), _out(outputs, 1), args.get("lengths")
        count = _numel(lengths) if isinstance(lengths, tuple) else None
        if not data or not steps or not count:
            return None
        rows, longest = data[0], steps[0]
        if not (longest + count - 1 <= rows <= longest * count):
            return None  # no lengths in [1, longest] add up to it
        return (FillKind.DESCENDING, rows, longest)


class PackedBatchSizes(Fill):
    """A packed sequence's ``batch_sizes`` (sequences still running at each step),
    made outside the step (a collate function packs the batch): non-increasing, the
    first the batch (``rows`` of output ``index``'s dim ``axis``), adding up to the
    packed ``data``'s rows. Filled at random below 8, the replay's ``lstm`` failed
    against its recorded hidden state ("size of tensor a (32) must match the size of
    tensor b (4)"). The longest steps as the batch, the rest as even as they can be;
    the recorded children, where they show each step (``PackedSteps``), win."""

    def __init__(self, data: str, index: int, axis: int):
        self.data, self.index, self.axis = data, index, axis

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        data, steps = args.get(self.data), _numel(args.get("batch_sizes"))
        batch = _out(outputs, self.index)
        if not isinstance(data, tuple) or not data or not steps or not batch \
                or not -len(batch) <= self.axis < len(batch):
            return None
        rows, width = data[0], batch[self.axis]
        if not (width + steps - 1 <= rows <= width * steps):
            return None  # no sizes in [1, batch] add up to it
        return (FillKind.DESCENDING, rows, width)


class PackedGradBatchSizes(Fill):
    """``_pack_padded_sequence_backward``'s ``batch_sizes``: as ``PackedBatchSizes``,
    the batch read from ``input_size`` (time-major, or batch-first)."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        grad, size, steps = args.get("grad"), args.get("input_size"), \
            _numel(args.get("batch_sizes"))
        if not isinstance(grad, tuple) or not grad or not isinstance(size, list) \
                or len(size) < 2 or not steps:
            return None
        width = size[0] if args.get("batch_first") is True else size[1]
        if not isinstance(width, int) or not (width + steps - 1 <= grad[0] <= width * steps):
            return None
        return (FillKind.DESCENDING, grad[0], width)


# Beyond any size a view could name: an ``end`` at or above it slices to the end.
_TO_THE_END = 2**62


def _dim(value: object, rank: int) -> int | None:
    """``value`` as a dim of a tensor of ``rank`` dims, or None."""
    return value % rank if type(value) is int and rank and -rank <= value < rank else None


def keeps_rows(op_name: str, args: Facts) -> bool:
    """Whether view ``op_name`` of a tensor whose dim 0 counts data-dependent rows (a
    ``nonzero``'s) keeps those rows in its own dim 0 for any count, naming no count
    (``nonzero().squeeze(1)``, ``nonzero()[:, 0]``): the replay may read it at the
    replayed count. A view that names sizes, cuts rows or moves dim 0 does not."""
    shape = args.get("self")
    if not isinstance(shape, tuple) or not shape:
        return False
    rank, dim = len(shape), args.get("dim")
    if op_name in ("aten::alias", "aten::detach"):
        return True
    if op_name == "aten::squeeze":
        if dim is None:  # every dim of one: rows alone are left (0-d at a count of one)
            return shape[0] != 1 and all(d == 1 for d in shape[1:])
        dims = dim if isinstance(dim, list) else [dim]
        return all(_dim(d, rank) not in (None, 0) for d in dims)
    if op_name == "aten::unsqueeze":
        return _dim(dim, rank + 1) not in (None, 0)
    if op_name == "aten::select":
        return _dim(dim, rank) not in (None, 0)
    if op_name == "aten::slice":
        if _dim(dim, rank) != 0:
            return _dim(dim, rank) is not None
        end = args.get("end")
        return args.get("start") in (None, 0) and args.get("step") in (None, 1) \
            and (end is None or (type(end) is int and end >= _TO_THE_END))
    if op_name == "aten::transpose":
        return 0 not in (_dim(args.get("dim0"), rank), _dim(args.get("dim1"), rank))
    if op_name == "aten::permute":
        dims = args.get("dims")
        return isinstance(dims, list) and bool(dims) and _dim(dims[0], rank) == 0
    return False


_UNIQUE = {"self": DistinctCount()}
# A packed recurrent network: its final hidden state (output 1: layers x batch x
# hidden) holds the batch.
_PACKED_RNN = {"batch_sizes": PackedBatchSizes("data", 1, 1)}
_SEGMENTS = {"lengths": LengthsOf("data", "axis"), "offsets": LengthsOf("data", "axis", True)}

FAMILY = OpFamily(
    name="data-dependent shapes",
    shape_rules={
        "aten::nonzero": {"self": TrueCount()},
        "aten::argwhere": {"self": TrueCount()},
        "aten::nonzero_numpy": {"self": TrueCount(0, 0)},
        "aten::where": {"condition": TrueCount(0, 0)},
        "aten::masked_select": {"mask": MaskedCount()},
        "aten::masked_scatter": {"mask": ScatteredCount()},
        "aten::masked_scatter_": {"mask": ScatteredCount()},
        "aten::_unique": _UNIQUE,
        "aten::_unique2": _UNIQUE,
        "aten::unique_consecutive": {"self": RunCount()},
        "aten::repeat_interleave": {"repeats": RepeatsSum()},
        "aten::bincount": {"self": MaxIsLast()},
        "aten::one_hot": {"self": MaxIsLast(-1)},
        "aten::segment_reduce": _SEGMENTS,
        "aten::_segment_reduce_backward": _SEGMENTS,
        "aten::_jagged_to_padded_dense_forward": {"offsets": LengthsOf("values", 0, True)},
        "aten::_padded_dense_to_jagged_forward": {"offsets": LengthsOf("dense", 0, True)},
        "aten::_pack_padded_sequence": {"lengths": PackedLengths()},
        "aten::lstm": _PACKED_RNN,
        "aten::gru": _PACKED_RNN,
        "aten::rnn_tanh": _PACKED_RNN,
        "aten::rnn_relu": _PACKED_RNN,
        "aten::quantized_lstm": _PACKED_RNN,
        "aten::quantized_gru": _PACKED_RNN,
        # its output 1: each sequence's length, one per batch entry
        "aten::_pad_packed_sequence": {"batch_sizes": PackedBatchSizes("data", 1, 0)},
        "aten::_pack_padded_sequence_backward": {"batch_sizes": PackedGradBatchSizes()},
    },
    # A data-dependent op often reads a copy or a sort of the tensor it was given:
    # pack_padded_sequence(enforce_sorted=False) sorts its lengths first. A fill for
    # what it reads is carried back to that tensor through these (passes/values.py).
    same_values={
        "aten::sort": ("self", 0),
        "aten::msort": ("self", 0),
        "aten::to": ("self", 0),
        "aten::_to_copy": ("self", 0),
        "aten::clone": ("self", 0),
        "aten::contiguous": ("self", 0),
        "aten::reshape": ("self", 0),
        "aten::flatten": ("self", 0),
        "aten::flip": ("self", 0),
        "aten::roll": ("self", 0),
    },
    data_dependent_outputs=frozenset({
        "aten::nonzero", "aten::argwhere", "aten::nonzero_numpy", "aten::where",
        "aten::masked_select", "aten::_unique", "aten::_unique2", "aten::unique_dim",
        "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::repeat_interleave",
        "aten::bincount", "aten::index", "aten::_ragged_idx",
        "aten::one_hot",  # its classes, where num_classes=-1 counts them from the values
        "torchvision::nms",  # the boxes kept, by the boxes' values
    }),
)
