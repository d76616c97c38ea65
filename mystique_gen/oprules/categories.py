"""Op categories for compare and diff: time and op-mix breakdowns by kind of work."""

from __future__ import annotations

import re

# ---------------------------------------------------------------------------
OP_CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(
        r"c10d|nccl|gloo|all_?reduce|all_?gather|reduce_scatter|all_to_all|alltoall|"
        r"broadcast|send|recv|barrier")),
    ("optimizer", re.compile(r"^_foreach_|_fused_(adam|sgd|adagrad)|adam|sgd|adagrad|"
                             r"optimizer|lamb|rmsprop")),
    ("conv", re.compile(r"conv|cudnn_convolution|mkldnn_convolution|im2col|col2im")),
    ("matmul", re.compile(r"^(mm|addmm|bmm|baddbmm|matmul|linear|addmv|mv|dot|einsum|"
                          r"_addmm_activation|_scaled_mm|addbmm|mkldnn_linear)(_|$)|"
                          r"gemm|cublas|attention|_flash|_efficient_attention|"
                          r"linear_backward|mm_backward|"
                          # grouped (mixture-of-experts), integer, weight-only
                          # quantized and sparse products
                          r"grouped_mm|_int_mm|pack_mm|sparse_mm|sparse_addmm|"
                          r"semi_structured_(linear|mm|addmm)|_mixed_dtypes_linear")),
    ("reduction", re.compile(
        r"^(sum|mean|max|min|amax|amin|argmax|argmin|norm|linalg_vector_norm|var|std|"
        r"var_mean|std_mean|prod|cumsum|cumprod|logsumexp|_?softmax|_?log_softmax|"
        r"softmax_backward|_softmax_backward_data|_log_softmax_backward_data|"
        r"nll_loss|cross_entropy|native_layer_norm|layer_norm|native_batch_norm|"
        r"batch_norm|_batch_norm|group_norm|native_group_norm|topk|sort|"
        r"embedding_bag|_embedding_bag|all|any|count_nonzero|mse_loss|"
        r"binary_cross_entropy|smooth_l1|l1_loss|nll_loss_forward|nll_loss_backward|"
        r"native_layer_norm_backward|native_batch_norm_backward|mse_loss_backward|"
        r"binary_cross_entropy_with_logits|roi_align|_roi_align_backward)$|reduce|"
        r"_backward_data$")),
    ("memory", re.compile(
        r"^(copy_|clone|contiguous|to|_to_copy|cat|stack|empty|empty_like|empty_strided|"
        r"zeros|zeros_like|ones|ones_like|full|full_like|fill_|zero_|new_|index|"
        r"index_select|index_add|index_copy|index_put|_index_put_impl_|gather|scatter|"
        r"embedding|embedding_dense_backward|view|_unsafe_view|reshape|transpose|t|"
        r"permute|expand|slice|select|split|chunk|unbind|narrow|pad|constant_pad_nd|"
        r"as_strided|squeeze|unsqueeze|flatten|unflatten|detach|alias|masked_select|"
        r"nonzero|where|repeat|repeat_interleave|roll|flip|_reshape_alias|lift_fresh|"
        r"set_|resize_|slice_backward|select_backward|index_select_backward|"
        r"embedding_backward|embedding_dense_backward|_embedding_bag_backward|"
        r"_embedding_bag_dense_backward|gather_backward|scatter_add|scatter_add_|"
        r"index_add_|index_put_|index_fill_|masked_fill|masked_fill_|_unsafe_index)$|"
        r"memcpy|memset")),
)
DEFAULT_CATEGORY = "elementwise"
CATEGORY_ORDER = ("matmul", "conv", "elementwise", "reduction", "memory", "communication",
                  "optimizer")


def op_category(name: str) -> str:
    """Category of an op (``aten::mm``) or a kernel name, for time breakdowns."""
    short = name.split("::", 1)[-1].split(".", 1)[0].lower()
    for category, pattern in OP_CATEGORIES:
        if pattern.search(short):
            return category
    return DEFAULT_CATEGORY
