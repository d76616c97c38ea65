"""Kernel paths that input values decide: what the recorded children show.

Some kernels run other children depending on their inputs' values, not only their
shapes: ``embedding_renorm_`` scales only the looked-up rows whose norms exceed
``max_norm`` (one ``mul_`` each), a max-mode embedding bag's backward selects its
non-empty bags (``nonzero`` of the bag sizes), ``pack_padded_sequence`` copies one
block per run of equal batch sizes, ``tensor_split`` by a tensor splits where its
values say. Filled values took other paths (no row scaled, other bag counts, other
blocks, other splits), so the replay ran other children than the original.
The children the trace records say what the values were, or enough of them: each rule
reads them at selection (``read``) and says how to fill the op's inputs so that the
replay takes the recorded path (``facts``, passes/values.py)."""

from __future__ import annotations

from mystique_gen.harness.fills import FillKind
from mystique_gen.oprules.base import Facts, KernelPath, OpFamily, OutShapes, PathFacts, _numel
from mystique_gen.sources.et import RawNode

# embedding_bag's mode argument: 0 sum, 1 mean, 2 max.
MODE_MAX = 2


def _int_input(node: RawNode, position: int) -> int | None:
    if position >= len(node.inputs):
        return None
    value = node.inputs[position].value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_input(node: RawNode, position: int) -> float | None:
    if position >= len(node.inputs):
        return None
    value = node.inputs[position].value
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


class RenormedRows(KernelPath):
    """``embedding_renorm_(self, indices, max_norm, norm_type)``: for each distinct
    index, sorted, a ``select`` of its row and its norm, then a ``mul_`` by
    ``max_norm / (norm + 1e-7)`` where the norm exceeded max_norm. The rows the indices
    reached are the selects' (the indices are filled with them), and the rows scaled
    get back the norms their scales say (the table is filled so)."""

    def read(self, node: RawNode, below: list[RawNode]) -> tuple | None:
        rows: list[int] = []
        over: list[tuple[int, float]] = []
        for child in below:
            if child.parent != node.id:
                continue
            if child.name == "aten::select" and _int_input(child, 1) == 0:
                row = _int_input(child, 2)
                if row is None:
                    return None
                rows.append(row)
            elif child.name == "aten::mul_" and rows:
                scale = _float_input(child, 1)
                over.append((rows[-1], scale if scale is not None else 0.0))
        return (tuple(rows), tuple(over)) if rows else None

    def facts(self, args: Facts, outputs: OutShapes, recorded: tuple) -> PathFacts | None:
        rows, over = recorded
        count, max_norm = _numel(args.get("indices")), args.get("max_norm")
        norm_type = args.get("norm_type", 2.0)
        if not count or count < len(rows) or not isinstance(max_norm, (int, float)) \
                or not isinstance(norm_type, (int, float)):
            return None
        # Each recorded row once, the rest repeats: the same distinct rows (the order
        # of the original's indices is not recorded).
        values = tuple(rows[k % len(rows)] for k in range(count))
        # The norm a scale came from (the observer keeps six decimals: never at or
        # below max_norm, else the row would not be scaled).
        norms = tuple((row, max(max_norm / scale if scale > 0 else 2.0 * max_norm,
                                max_norm * 1.001)) for row, scale in over)
        return PathFacts(values=(("indices", values),),
                         row_norms=(("self", float(max_norm), float(norm_type), norms),))


class EmptyBags(KernelPath):
    """A max-mode bag's backward selects its non-empty bags, ``nonzero(bag_size)``:
    the rows of that result are the bags that were not empty. Offsets are filled with
    that many bags empty (random offsets left other bags empty, and the backward's
    ``nonzero``, ``index_select`` and ``index_add_`` ran at other sizes)."""

    def read(self, node: RawNode, below: list[RawNode]) -> tuple | None:
        for child in below:
            if child.name == "aten::nonzero" and child.outputs and child.inputs:
                shape, read = child.outputs[0].shape, child.inputs[0].shape
                if isinstance(shape, list) and shape and isinstance(shape[0], int) \
                        and isinstance(read, list) and len(read) == 1:
                    return (shape[0], read[0])
        return None

    def facts(self, args: Facts, outputs: OutShapes, recorded: tuple) -> PathFacts | None:
        non_empty, read = recorded
        bags, offsets, total = _numel(args.get("bag_size")), _numel(args.get("offsets")), \
            _numel(args.get("indices"))
        if args.get("mode") != MODE_MAX or bags is None or offsets is None or total is None \
                or read != bags or offsets not in (bags, bags + 1) or non_empty > bags \
                or non_empty > total or (non_empty == 0) != (total == 0):
            return None
        # include_last_offset: one offset more than bags, the last at the end.
        kind = FillKind.BAG_CUTS if offsets == bags + 1 else FillKind.BAGS
        return PathFacts(fills=(("offsets", (kind, bags - non_empty, total)),))


class PackedRuns(KernelPath):
    """``_pack_padded_sequence`` copies one block per run of steps with the same batch
    size: ``slice(0, start, end)`` of the time-major input, then ``slice(1, 0, b)``.
    Those give every step's batch size, and so every sequence's length (the number of
    steps whose batch holds it), which the lengths are filled with; filled longest
    first and the rest even, they packed the recorded rows in other blocks."""

    def read(self, node: RawNode, below: list[RawNode]) -> tuple | None:
        sizes: list[int] = []
        run: tuple[int, int] | None = None
        for child in below:
            if child.parent != node.id or child.name != "aten::slice":
                continue
            dim, start, end = (_int_input(child, k) for k in (1, 2, 3))
            if dim == 0 and start is not None and end is not None and end > start:
                run = (start, end)
            elif dim == 1 and run is not None and start == 0 and end is not None \
                    and run[0] == len(sizes):
                sizes.extend([end] * (run[1] - run[0]))
                run = None
        return tuple(sizes) if sizes else None

    def facts(self, args: Facts, outputs: OutShapes, recorded: tuple) -> PathFacts | None:
        sizes = list(recorded)
        count = _numel(args.get("lengths"))
        data, steps = outputs[0] if outputs else None, outputs[1] if len(outputs) > 1 else None
        if not count or not isinstance(data, tuple) or not isinstance(steps, tuple) \
                or not data or not steps or steps[0] != len(sizes) or data[0] != sum(sizes) \
                or max(sizes) != count or sizes != sorted(sizes, reverse=True):
            return None
        lengths = tuple(sum(1 for size in sizes if size > i) for i in range(count))
        return PathFacts(values=(("lengths", lengths),))


class PackedSteps(KernelPath):
    """A packed recurrent network (``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu`` over
    ``data`` and ``batch_sizes``) projects the packed rows at once, then takes each
    step's rows, ``narrow(0, start, batch)`` of that projection (the first layer's
    forward direction, from row 0 on; the hidden state is narrowed too, where the
    batch shrinks): those batches are the batch sizes, which are filled with them
    (``PackedBatchSizes`` alone makes the longest steps the batch and the rest even,
    the same rows in other steps)."""

    def read(self, node: RawNode, below: list[RawNode]) -> tuple | None:
        sizes: list[int] = []
        projected = None  # the first narrow's tensor (id, storage): not the hidden state's
        for child in below:
            if child.parent != node.id or child.name != "aten::narrow" \
                    or _int_input(child, 1) != 0 or not child.inputs \
                    or not isinstance(child.inputs[0].value, list):
                continue
            tensor = tuple(child.inputs[0].value[:2])
            projected = projected or tensor
            if tensor != projected:
                continue
            start, length = _int_input(child, 2), _int_input(child, 3)
            if start is None or length is None or length <= 0:
                return None
            if start != sum(sizes):  # another layer or the reverse direction
                break
            sizes.append(length)
        return tuple(sizes) if sizes else None

    def facts(self, args: Facts, outputs: OutShapes, recorded: tuple) -> PathFacts | None:
        sizes, data = list(recorded), args.get("data")
        if not isinstance(data, tuple) or not data or sum(sizes) != data[0] \
                or _numel(args.get("batch_sizes")) != len(sizes) \
                or sizes != sorted(sizes, reverse=True):
            return None
        return PathFacts(values=(("batch_sizes", tuple(sizes)),))


class ItemReads(KernelPath):
    """Flags an op reads on the host, ``.item()`` of a one-element tensor argument: the
    recorded ``aten::item`` below it, of that tensor (its id and storage), holds the
    value, which the argument is filled with. ``args``: (argument, its position).
    QAT's fused observer and fake quantization skips its quantization where
    ``fake_quant_on`` is 0 (0.8 ms against 12.4 for 1M elements); filled 0..8, one
    fake quantization in eight did no work."""

    def __init__(self, *args: tuple[str, int]):
        self.args = args

    def read(self, node: RawNode, below: list[RawNode]) -> tuple | None:
        found: list[tuple[str, int]] = []
        for name, position in self.args:
            if position >= len(node.inputs) or not isinstance(node.inputs[position].value, list):
                continue
            tensor = node.inputs[position].value[:2]
            for child in below:
                if child.name in ("aten::item", "aten::_local_scalar_dense") and child.inputs \
                        and child.outputs and isinstance(child.inputs[0].value, list) \
                        and child.inputs[0].value[:2] == tensor:
                    value = child.outputs[0].value
                    if isinstance(value, bool) or not isinstance(value, int):
                        break
                    found.append((name, value))
                    break
        return tuple(found) if found else None

    def facts(self, args: Facts, outputs: OutShapes, recorded: tuple) -> PathFacts | None:
        values = tuple((name, (value,)) for name, value in recorded
                       if _numel(args.get(name)) == 1)
        return PathFacts(values=values) if values else None


class SplitPoints(KernelPath):
    """``tensor_split`` at points (or a count of sections) given as a tensor reads it
    on the host and calls its ``int[]`` overload, which the trace records with the
    values: the tensor is filled with them (filled at random, the replay split at other
    points, and every output had another shape)."""

    def read(self, node: RawNode, below: list[RawNode]) -> tuple | None:
        for child in below:
            if child.parent != node.id or child.name != node.name or len(child.inputs) < 2:
                continue
            value = child.inputs[1].value
            if isinstance(value, int) and not isinstance(value, bool):
                return (value,)
            if isinstance(value, list) and all(
                    isinstance(v, int) and not isinstance(v, bool) for v in value):
                return tuple(value)
        return None

    def facts(self, args: Facts, outputs: OutShapes, recorded: tuple) -> PathFacts | None:
        if _numel(args.get("tensor_indices_or_sections")) != len(recorded):
            return None
        return PathFacts(values=(("tensor_indices_or_sections", recorded),))


FAMILY = OpFamily(
    name="kernel paths",
    kernel_paths={
        "aten::embedding_renorm_": RenormedRows(),
        "aten::_embedding_bag_backward": EmptyBags(),
        "aten::_pack_padded_sequence": PackedRuns(),
        "aten::tensor_split": SplitPoints(),
        **{f"aten::{name}": PackedSteps() for name in ("lstm", "gru", "rnn_tanh", "rnn_relu")},
        **{f"aten::{name}": ItemReads(("observer_on", 1), ("fake_quant_on", 2))
           for name in ("fused_moving_avg_obs_fake_quant", "_fused_moving_avg_obs_fq_helper",
                        "_fused_moving_avg_obs_fq_helper_functional")},
        "aten::_fake_quantize_per_tensor_affine_cachemask_tensor_qparams": ItemReads(
            ("fake_quant_enabled", 3)),
    },
)
