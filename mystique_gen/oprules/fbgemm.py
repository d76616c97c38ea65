"""fbgemm_gpu's jagged-tensor and table-batched embedding (TBE) ops (TorchRec, DLRM):
the inputs the harness's equivalents read (equivalents.PORTABLE) filled as the kernels
expect them, where the benchmark runs the equivalents (fbgemm_gpu not loaded).

A trace records no values of a TBE's layout (``weights_offsets``, ``D_offsets``,
``hash_size_cumsum``: module buffers); the equivalents use them where they describe a
layout of the flat weights (captured with ``--save-indices``), else split the columns
evenly over the tables (equivalents._tbe_tables)."""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily, SizeOf
from mystique_gen.oprules.datadep import LengthsOf

# A TBE's offsets cut its indices into one bag per table and sample.
_BAGS = {"offsets": "offsets"}
# Permuted jagged data: the permutation names rows of the lengths, and the lengths add
# up to the values they cut (then a permutation keeps them all, the recorded count).
_PERMUTE = {"permute": SizeOf("lengths", 0)}

# Adagrad's state (sums of squared gradients) is never negative: the update divides by
# its square root.
_STATE = ("momentum1_host",)

FAMILY = OpFamily(
    name="fbgemm",
    positive_args={
        "fbgemm::split_embedding_backward_codegen_adagrad_cpu": _STATE,
        "fbgemm::split_embedding_backward_codegen_rowwise_adagrad_cpu": _STATE,
        "fbgemm::split_embedding_codegen_lookup_adagrad_function": (
            "momentum1_dev", "momentum1_uvm"),
    },
    index_rules={
        "fbgemm::permute_2D_sparse_data": _PERMUTE,
        "fbgemm::permute_1D_sparse_data": _PERMUTE,
        "fbgemm::permute_sparse_data": _PERMUTE,
        "fbgemm::split_embedding_codegen_forward_cpu": _BAGS,
        "fbgemm::split_embedding_backward_codegen_sgd_cpu": _BAGS,
        "fbgemm::split_embedding_backward_codegen_adagrad_cpu": _BAGS,
        "fbgemm::split_embedding_backward_codegen_rowwise_adagrad_cpu": _BAGS,
        "fbgemm::split_embedding_codegen_lookup_adagrad_function": _BAGS,
        "fbgemm::dense_embedding_codegen_lookup_function": _BAGS,
    },
    shape_rules={
        "fbgemm::permute_2D_sparse_data": {"lengths": LengthsOf("values", 0)},
        "fbgemm::permute_1D_sparse_data": {"lengths": LengthsOf("values", 0)},
        "fbgemm::permute_sparse_data": {"lengths": LengthsOf("values", 0)},
    },
    # How many values a permutation keeps is its permuted lengths' sum.
    data_dependent_outputs=frozenset({
        "fbgemm::permute_2D_sparse_data", "fbgemm::permute_1D_sparse_data",
        "fbgemm::permute_sparse_data",
    }),
)
