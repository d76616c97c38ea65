"""Sparse COO tensors: how a trace tells them apart from tensors without storage.

The observer records a sparse tensor as ``[id, 0, 0, 0, 0, ""]``: no storage, no
device, like a functorch wrapper. Every sparse kernel reads the tensor's parts through
these ops (an ``add_`` of a sparse gradient into a dense weight records ``_nnz``,
``sparse_dim``, ``_values`` and ``_indices`` below it), and every sparse tensor is
made by one of the constructors, so a tensor id that they read or return is a sparse
tensor, with the structure their results state (passes/select.py ``sparse_tensors``).
"""

from __future__ import annotations

from mystique_gen.oprules.base import Bound, OpFamily


class SparseExtent(Bound):
    """A COO tensor's ``indices`` (sparse_dim x nnz): row k indexes dim k of ``size``,
    so every value stays below the smallest of the sparse dims' sizes."""

    def upper(self, args: dict[str, object]) -> int | None:
        size, indices = args.get("size"), args.get("indices")
        if not isinstance(size, list) or not isinstance(indices, tuple) \
                or len(indices) != 2 or not 0 < indices[0] <= len(size):
            return None
        sizes = size[:indices[0]]
        return min(sizes) if all(isinstance(n, int) and n > 0 for n in sizes) else None


_INDICES = {"indices": SparseExtent()}

FAMILY = OpFamily(
    name="sparse",
    sparse_facts={
        "aten::_nnz": "nnz",
        "aten::sparse_dim": "sparse_dim",
        "aten::is_coalesced": "coalesced",
        "aten::_indices": "indices",
        "aten::indices": "indices",
        "aten::_values": "values",
        "aten::values": "values",
        "aten::_sparse_coo_tensor_with_dims_and_tensors": "made",
        "aten::_sparse_coo_tensor_with_dims": "made",
        "aten::_sparse_coo_tensor_unsafe": "made",
        "aten::sparse_coo_tensor": "made",
        "aten::to_sparse": "made",
        "aten::_to_sparse": "made",
        "aten::coalesce": "made",
        "aten::_coalesce": "made",
        "aten::sparse_mask": "made",
    },
    # How many entries these make depends on values (distinct indices, nonzeros): the
    # file fits each result to its recorded count (backends/valuefill.py _fit_nnz).
    data_dependent_outputs=frozenset({
        "aten::coalesce", "aten::_coalesce", "aten::to_sparse", "aten::_to_sparse",
    }),
    # Sparse + sparse merges the entries of equal indices where the two lists meet
    # (AccumulateGrad's sum of two uncoalesced embedding gradients: 79 of 80 entries
    # in the original, 80 at the replay's indices).
    sparse_data_dependent_outputs=frozenset({"aten::add", "aten::sub", "aten::mul"}),
    index_rules={
        "aten::sparse_coo_tensor": _INDICES,
        "aten::_sparse_coo_tensor_unsafe": _INDICES,
        "aten::_sparse_coo_tensor_with_dims_and_tensors": _INDICES,
    },
    # A sparse tensor's values are those it was made from or masked out of: SparseAdam's
    # square root reads its exp_avg_sq through sparse_mask and _values.
    keeps_sign={
        "aten::sparse_mask": ("self",),
        "aten::_values": ("self",),
        "aten::values": ("self",),
        "aten::coalesce": ("self",),
        "aten::sparse_coo_tensor": ("values",),
        "aten::_sparse_coo_tensor_unsafe": ("values",),
    },
)
