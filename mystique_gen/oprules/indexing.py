"""Embedding, gather/scatter and indexing: index arguments stay in range."""

from __future__ import annotations

from mystique_gen.oprules.base import (
    Bound,
    IntArg,
    OpFamily,
    PerDim,
    SizeListAt,
    SizeOf,
    SizeProduct,
)


class NarrowStart(Bound):
    """``narrow(self, dim, start, length)`` with ``start`` a 0-d tensor (an offset a
    model keeps as a tensor: a cache position): the window stays inside ``self``,
    ``start + length <= size``. Filled 1 to 8 as any wrapped int, a window of 3 over 5
    started at 6 ("start (6) + length (3) exceeds dimension size (5)")."""

    def upper(self, args: dict[str, object]) -> int | None:
        size, length = SizeOf("self", "dim").upper(args), args.get("length")
        if size is None or not isinstance(length, int) or not 0 <= length <= size:
            return None
        return size - length + 1

_ROWS = SizeOf("weight", 0)
_ALONG_DIM = SizeOf("self", "dim")
# An embedding bag's indices: rows of its table; its offsets: where each bag starts.
EMBEDDING_BAG_RULES = {"indices": _ROWS, "offsets": "offsets"}

FAMILY = OpFamily(
    name="embedding and indexing",
    # Inverse-CDF sampling reads searchsorted(cdf, u) as an index: with a cdf and u
    # filled at random, u above the cdf's end gave len(cdf) (IndexError).
    searches=frozenset({"aten::searchsorted", "aten::bucketize"}),
    # A weight that requires grad takes embedding_bag off its forward-only kernel even
    # under no_grad (an inference step of a model's own parameters: 24 us a call
    # against 9 us here); the recorded child tells which one ran.
    grad_revealed_by={"aten::embedding_bag": ("aten::_embedding_bag", ("weight",))},
    index_rules={
        "aten::embedding": {"indices": _ROWS},
        "aten::embedding_bag": EMBEDDING_BAG_RULES,
        "aten::_embedding_bag": EMBEDDING_BAG_RULES,
        "aten::_embedding_bag_forward_only": EMBEDDING_BAG_RULES,
        "aten::embedding_dense_backward": {"indices": IntArg("num_weights")},
        "aten::embedding_backward": {"indices": IntArg("num_weights")},
        "aten::_embedding_bag_backward": {"indices": IntArg("num_weights"), "offsets": "offsets"},
        "aten::_embedding_bag_dense_backward": {"indices": IntArg("num_weights")},
        "aten::index_select": {"index": _ALONG_DIM},
        "aten::index_select_backward": {"index": SizeListAt("self_sizes", "dim")},
        "aten::gather": {"index": _ALONG_DIM},
        "aten::gather_backward": {"index": _ALONG_DIM},
        "aten::scatter": {"index": _ALONG_DIM},
        "aten::scatter_": {"index": _ALONG_DIM},
        "aten::scatter_add": {"index": _ALONG_DIM},
        "aten::scatter_add_": {"index": _ALONG_DIM},
        "aten::scatter_reduce": {"index": _ALONG_DIM},
        "aten::scatter_reduce_": {"index": _ALONG_DIM},
        "aten::index_add": {"index": _ALONG_DIM},
        "aten::index_add_": {"index": _ALONG_DIM},
        "aten::index_copy": {"index": _ALONG_DIM},
        "aten::index_copy_": {"index": _ALONG_DIM},
        "aten::index_fill": {"index": _ALONG_DIM},
        "aten::index_fill_": {"index": _ALONG_DIM},
        "aten::index_reduce": {"index": _ALONG_DIM},
        "aten::index_reduce_": {"index": _ALONG_DIM},
        "aten::take_along_dim": {"indices": _ALONG_DIM},
        # Flat positions in each output plane (max_unpool1d runs as max_unpool2d).
        "aten::max_unpool2d": {"indices": SizeProduct("output_size")},
        "aten::max_unpool3d": {"indices": SizeProduct("output_size")},
        "aten::index": {"indices": PerDim("self")},
        # index and index_put without bounds checks in compiled code, index's kernel
        # in eager (aot_eager's and decompositions' upsampling, gathers): IndexError
        # at random indices ("index 7 is out of bounds for dimension 1 with size 6").
        "aten::_unsafe_index": {"indices": PerDim("self")},
        "aten::_unsafe_index_put": {"indices": PerDim("self", "values")},
        "aten::narrow": {"start": NarrowStart()},
        # positions in each row of the sequence (its argsort): a sequence shorter than
        # 8 refused sorter filled 0..8 ("sorter index out of range")
        "aten::searchsorted": {"sorter": SizeOf("sorted_sequence", -1)},
        "aten::index_put": {"indices": PerDim("self", "values")},
        "aten::index_put_": {"indices": PerDim("self", "values")},
        "aten::_index_put_impl_": {"indices": PerDim("self", "values")},
    },
    take_rules={
        "aten::take": ("index", "self"),
        "aten::put": ("index", "self"),
        "aten::put_": ("index", "self"),
    },
    # Ops that copy values from these inputs to their outputs unchanged (a selection, a
    # reshape, a concatenation). A bound a consumer puts on the output also holds for
    # the input, so an index tensor read through `y[mask]` stays in range, and a
    # schedule read through `alphas[t]` and raised to 0.5 stays positive.
    value_preserving={
        "aten::index": ("self",),
        "aten::index_select": ("self",),
        "aten::gather": ("self",),
        "aten::masked_select": ("self",),
        "aten::take_along_dim": ("self",),
        "aten::clone": ("self",),
        "aten::contiguous": ("self",),
        "aten::to": ("self",),
        "aten::_to_copy": ("self",),
        "aten::copy_": ("src",),
        "aten::repeat": ("self",),
        "aten::repeat_interleave": ("self",),
        "aten::flip": ("self",),
        "aten::roll": ("self",),
        "aten::reshape": ("self",),
        "aten::flatten": ("self",),
        "aten::cat": ("tensors",),
        "aten::concat": ("tensors",),
        "aten::stack": ("tensors",),
        "aten::tile": ("self",),
        # (the padding itself is a constant: a loss's ignore index, mostly)
        "aten::constant_pad_nd": ("self",),
        "aten::pad": ("self",),
        # Writes: the values put into an index tensor become its values.
        "aten::fill_": ("value",),
        "aten::index_put_": ("values",),
        "aten::index_put": ("self", "values"),
        "aten::masked_fill_": ("value",),
        "aten::masked_fill": ("self", "value"),
        "aten::where": ("self", "other"),
    },
    stacks=frozenset({"aten::stack"}),
    moves_rows={
        "aten::index": ("self", "indices"),
        "aten::index_select": ("self", "dim"),
        "aten::cat": ("tensors", "dim"),
        "aten::concat": ("tensors", "dim"),
        "aten::stack": ("tensors", "dim"),
        "aten::clone": ("self", ""),
        "aten::contiguous": ("self", ""),
        "aten::to": ("self", ""),
        "aten::_to_copy": ("self", ""),
        "aten::copy_": ("src", ""),
        "aten::reshape": ("self", ""),
        "aten::flatten": ("self", ""),
    },
    # A dimension sharded over ranks (a vocabulary-parallel embedding, loss parallel,
    # DTensor's _MaskPartial): each rank masks the indices outside its window,
    # ``mask = (t < low) | (t >= high)``, shifts the rest to its own rows,
    # ``t.clone() - low``, and puts 0 where masked. ``low`` is a Python int there,
    # recorded as a 0-d tensor without its value: filled at random, the shifted
    # indices leave the window and the embedding or gather after it fails.
    # PyG's to_dense_batch and to_dense_adj: ``num_nodes = scatter_add(ones, batch)``,
    # ``ptr = cumsum(num_nodes)``, ``arange(N) - ptr[batch]``: a node's place in its
    # graph, which holds only for a sorted batch vector. Filled at random, the places
    # fell outside the graphs and whole graphs' masks were empty.
    bin_counts={op: ("self", "index") for op in (
        "aten::scatter_add", "aten::scatter_add_", "aten::index_add", "aten::index_add_")},
    cumulative_sums=frozenset({"aten::cumsum", "aten::cumsum_"}),
    window_bounds={"aten::lt": "low", "aten::ge": "high"},
    window_shifts={"aten::sub": ("self", "other")},
    excluding_masks={
        "aten::masked_fill": ("mask", (("value", False),)),
        "aten::masked_fill_": ("mask", (("value", False),)),
        # where(keep, scores, -inf) takes other where keep is False, self where True
        "aten::where": ("condition", (("other", True), ("self", False))),
    },
    negations=frozenset({"aten::bitwise_not", "aten::logical_not"}),
)
