"""Emitters for input values and data-dependent outputs.

``_data(...)`` embeds integral values the trace saved, ``_values([...], ...)`` the
elements of a literal the step built (as the capture recorded them); ``t = _fit(t,
shape, strides)``
follows an op whose output size depends on input values (nonzero, unique, masked
selection, routing in a mixture of experts), so later statements see the recorded
size whatever the replayed values are; ``t = _fit_nnz(t, nnz)`` does the same for a
sparse result's number of entries (coalesce); ``t = _laid_out(t, strides)`` gives a
kernel's result the layout the trace recorded where a later view needs it.
"""

from __future__ import annotations

from mystique_gen.backends import exprs
from mystique_gen.backends.layout import Atom, Node, lay_out
from mystique_gen.harness.fills import FillKind
from mystique_gen.ir import Init, ListValue, Op, TensorValue
from mystique_gen.passes.values import fits_output


def data_call(init: Init, dtype: str, device: str) -> Node:
    """``_data("<hex>", width, torch.<dtype>, device)`` for a kind "data" fill."""
    if init.kind != "data" or init.low not in (1, 2, 4, 8):
        raise ValueError(f"not a data fill: {init.kind} of width {init.low}")
    return exprs.call("_data", [
        Atom(exprs.str_literal(init.data.hex())),
        Atom(str(int(init.low))),
        Atom(exprs.torch_attr(dtype)),
        Atom(device),
    ])


def values_call(init: Init, dtype: str, device: str) -> Node:
    """``_values([v, ...], torch.<dtype>, device)`` for a kind "values" fill."""
    if init.kind != "values":
        raise ValueError(f"not a values fill: {init.kind}")
    return exprs.call("_values", [
        exprs.list_display([Atom(exprs.scalar_literal(v)) for v in init.values]),
        Atom(exprs.torch_attr(dtype)),
        Atom(device),
    ])


def norms_call(init: Init, numel: int, dtype: str, device: str) -> Node:
    """``_norms(numel, row, max_norm, norm_type, [row, norm, ...], torch.<dtype>,
    device, gens)`` for a kind "norms" fill (``init.values``: the norm type, then each
    row above max_norm and its norm)."""
    if init.kind != "norms" or not init.values:
        raise ValueError(f"not a norms fill: {init.kind}")
    return exprs.call("_norms", [
        Atom(str(int(numel))),
        Atom(str(int(init.low))),
        Atom(exprs.scalar_literal(float(init.high))),
        Atom(exprs.scalar_literal(float(init.values[0]))),
        exprs.list_display([Atom(exprs.scalar_literal(v)) for v in init.values[1:]]),
        Atom(exprs.torch_attr(dtype)),
        Atom(device),
        Atom("gens"),
    ])


def _shape_rows(value: object) -> tuple[Node, Node] | None:
    if isinstance(value, TensorValue):
        return exprs.int_list(value.meta.shape), exprs.int_list(value.meta.strides)
    if isinstance(value, ListValue) and all(isinstance(v, TensorValue) for v in value.items):
        items = [v for v in value.items if isinstance(v, TensorValue)]
        return (exprs.list_display([exprs.int_list(v.meta.shape) for v in items]),
                exprs.list_display([exprs.int_list(v.meta.strides) for v in items]))
    return None


def fit_lines(op: Op, targets: list[str], depth: int) -> list[str]:
    """``t = _fit(t, shape, strides)`` for each named output of a data-dependent op;
    then ``m = _fit_mask(m, count)`` for each boolean result a data-dependent op reads
    as its mask, ``n = _fit_lengths(n, rows, longest)`` for each computed result it
    reads as sequence lengths (``recorded=[...]``: the lengths its recorded children
    showed, ``Op.recorded_lengths``), and ``o = _fit_values(o, kind, low, high)`` for
    each it reads as repeats, bag offsets, jagged cuts, packed sequences' spans or a
    grouped matmul's group ends. Where the op's fits are reusable
    (``Op.fits_reusable``) each call names its site, ``site=(op index, output
    position)``, under which the file keeps it."""
    lines: list[str] = []

    def site(position: int) -> list[Node]:
        if not op.fits_reusable:
            return []
        return [exprs.keyword("site", exprs.int_tuple((op.index, position)))]

    for position, (target, value) in enumerate(zip(targets, op.outputs, strict=False)):
        if target == "_" or not fits_output(op, value):
            continue
        if isinstance(value, TensorValue) and value.meta.sparse is not None:
            if value.meta.sparse.nnz is not None:
                call = exprs.call("_fit_nnz", [Atom(target), Atom(str(value.meta.sparse.nnz))])
                lines.extend(lay_out(f"{target} = ", call, depth))
            continue
        rows = _shape_rows(value)
        if rows is None:
            continue
        joined = [Atom("True")] if op.outputs_viewed_by_offset and \
            isinstance(value, ListValue) else []
        call = exprs.call("_fit", [Atom(target), *rows, *joined, *site(position)])
        lines.extend(lay_out(f"{target} = ", call, depth))
    for position, count in sorted(op.true_counts.items()):
        if position < len(targets) and targets[position] != "_":
            call = exprs.call("_fit_mask", [Atom(targets[position]), Atom(str(count)),
                                            *site(position)])
            lines.extend(lay_out(f"{targets[position]} = ", call, depth))
    for position, (kind, a, b) in sorted(op.fit_values.items()):
        if position >= len(targets) or targets[position] == "_":
            continue
        if kind == FillKind.DESCENDING:
            recorded = op.recorded_lengths.get(position)
            exact = [] if recorded is None else [exprs.keyword("recorded", exprs.int_list(
                recorded))]
            call = exprs.call("_fit_lengths", [Atom(targets[position]), Atom(str(a)),
                                               Atom(str(b)), *site(position), *exact])
        else:
            name = exprs.str_literal(FillKind(kind).value)
            call = exprs.call("_fit_values", [Atom(targets[position]), Atom(name),
                                              Atom(str(a)), Atom(str(b)), *site(position)])
        lines.extend(lay_out(f"{targets[position]} = ", call, depth))
    return lines


def layout_lines(op: Op, targets: list[str], depth: int) -> list[str]:
    """``t = _laid_out(t, strides)`` for each output a later view needs in its recorded
    layout (``Op.keep_layout``)."""
    lines: list[str] = []
    for position in op.keep_layout:
        value = op.outputs[position] if position < len(op.outputs) else None
        if position < len(targets) and targets[position] != "_" and \
                isinstance(value, TensorValue):
            call = exprs.call("_laid_out", [Atom(targets[position]),
                                            exprs.int_tuple(value.meta.strides)])
            lines.extend(lay_out(f"{targets[position]} = ", call, depth))
    return lines


def nonzero(divisor: Node) -> Node:
    """``_nonzero(divisor)``: an integer divisor computed from values that are not the
    original's, with 1 for 0 (``Op.nonzero``)."""
    return exprs.call("_nonzero", [divisor])


def in_range(index: Node, size: int, keep: int | None = None) -> Node:
    """``_in_range(index, size)``: an index computed from values that are not the
    original's, wrapped into range where an op reads it (``Op.in_range``);
    ``_in_range(index, size, keep)`` leaves the op's ignore index as it is."""
    args = [index, Atom(str(int(size)))] + ([] if keep is None else [Atom(str(int(keep)))])
    return exprs.call("_in_range", args)
