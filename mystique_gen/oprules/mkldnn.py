"""MKLDNN (oneDNN) tensors: the other layout the observer records without storage.

``tensor.to_mkldnn()``, ``torch.utils.mkldnn`` modules and a frozen TorchScript model
(``optimize_for_inference``) hold activations and weights in oneDNN's opaque layout.
The observer writes such a tensor as it writes a vmap wrapper or a sparse tensor,
``[id, 0, 0, 0, 0, ""]``, with its shape and dtype. What tells it apart is the ops
around it: these read or return that layout only, an ``empty`` given
``layout=torch._mkldnn`` makes one, and an op that reads one (a ``relu_``, an ``add``)
works on that layout throughout (passes/select.py ``mkldnn_tensors``). The replay
makes them as dense tensors converted with ``to_mkldnn`` (host only).
"""

from __future__ import annotations

from mystique_gen.ir.dtypes import LAYOUT_CODES
from mystique_gen.oprules.base import OpFamily

# c10::Layout::Mkldnn, as the observer records a ``layout`` argument.
MKLDNN_LAYOUT = next(code for code, name in LAYOUT_CODES.items() if name == "_mkldnn")

FAMILY = OpFamily(
    name="mkldnn",
    mkldnn_ops=frozenset({
        "aten::to_mkldnn", "aten::to_mkldnn_backward", "aten::to_dense", "aten::_to_dense",
        "aten::_mkldnn_reshape", "aten::_mkldnn_transpose", "aten::_mkldnn_transpose_",
        "aten::mkldnn_adaptive_avg_pool2d", "aten::mkldnn_adaptive_avg_pool2d_backward",
        "aten::mkldnn_convolution", "aten::mkldnn_linear", "aten::mkldnn_linear_backward",
        "aten::mkldnn_linear_backward_input", "aten::mkldnn_linear_backward_weights",
        "aten::mkldnn_max_pool2d", "aten::mkldnn_max_pool2d_backward",
        "aten::mkldnn_max_pool3d", "aten::mkldnn_max_pool3d_backward",
        "aten::mkldnn_reorder_conv2d_weight", "aten::mkldnn_reorder_conv3d_weight",
        "mkldnn::_convolution_pointwise", "mkldnn::_convolution_pointwise_",
        "mkldnn::_convolution_transpose_pointwise", "mkldnn::_linear_pointwise",
        "mkldnn::_reorder_convolution_weight", "mkldnn::_reorder_linear_weight",
        "mkldnn::_reorder_convolution_transpose_weight",
        "mkldnn_prepacked::conv2d_run",
        # MKL's packed linear weight (Inductor's CPU freezing) is an MKLDNN tensor too.
        "mkl::_mkl_linear", "mkl::_mkl_reorder_linear_weight",
        # oneDNN's quantized convolutions and linears (PT2E's X86InductorQuantizer
        # under torch.compile with freezing) read their weights prepacked as MKLDNN
        # tensors; taken for vmap wrappers, the ops were replayed as their output's
        # allocation alone, and no header said so.
        "onednn::qconv_prepack", "onednn::qconv_pointwise", "onednn::qconv1d_pointwise",
        "onednn::qconv2d_pointwise", "onednn::qconv3d_pointwise",
        "onednn::qlinear_prepack", "onednn::qlinear_pointwise",
        "onednn::linear_prepack_fp16", "onednn::linear_dynamic_fp16",
        "onednn::linear_relu_dynamic_fp16",
    }),
    # MKL's packed GEMM weight begins with a header its kernel trusts (random values
    # crash it): packed again from the original weight the op also takes.
    packed_args={
        "mkl::_mkl_linear": ("MKL_W", "mkl::_mkl_reorder_linear_weight",
                             ("ORI_W", "batch_size")),
    },
)
