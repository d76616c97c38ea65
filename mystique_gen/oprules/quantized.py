"""Quantized operators: the packed weights they take, which a trace cannot hold.

``quantized::linear`` and its dynamic forms take a ``LinearPackedParamsBase``, a
TorchScript object the ET writes as ``"<Object>"``. Its weight's shape is the op's
(input features, output features), so the replay packs a weight of that shape once
(``_packed_linear``); its values do not set the kernel's speed. A convolution's packed
weight also holds its kernel size, stride, padding and groups, which the trace does not
say, and a packed embedding table its row count: those ops are not replayed, with that
reason. Quantized tensors themselves are filled as their integer representation
(``ir.dtypes.QUANTIZED``). Quantized embedding bags read indices and offsets as
``aten::embedding_bag`` does.
"""

from __future__ import annotations

from mystique_gen.oprules.base import IntArg, OpFamily, SetFlag
from mystique_gen.oprules.indexing import EMBEDDING_BAG_RULES

# The packed weight class the ops below take, as their schema names it.
LINEAR_PACKED = "__torch__.torch.classes.quantized.LinearPackedParamsBase"

# {op: how its weight was packed}: "int8" (``quantized::linear_prepack``) or "fp16"
# (``quantized::linear_prepack_fp16``).
_LINEAR = {
    "quantized::linear": "int8",
    "quantized::linear_relu": "int8",
    "quantized::linear_leaky_relu": "int8",
    "quantized::linear_tanh": "int8",
    "quantized::linear_dynamic": "int8",
    "quantized::linear_relu_dynamic": "int8",
    "quantized::linear_dynamic_fp16": "fp16",
    "quantized::linear_relu_dynamic_fp16": "fp16",
}

_CONV_WHY = ("its packed weight holds the convolution's kernel size, stride, padding and "
             "groups, which the trace does not record")
_CONVS = ("conv1d", "conv2d", "conv3d", "conv1d_relu", "conv2d_relu", "conv3d_relu",
          "conv2d_add", "conv2d_add_relu", "conv_transpose1d", "conv_transpose2d",
          "conv_transpose3d")

# Quantized embedding bags over rowwise-quantized tables (a recommender's inference,
# FBGEMM's layout: each row's bytes, then its scale and bias): the same indices and
# bag offsets as aten::embedding_bag's, rows counted along the table's first dimension.
_BAGS = ("embedding_bag_byte_rowwise_offsets", "embedding_bag_4bit_rowwise_offsets",
         "embedding_bag_2bit_rowwise_offsets")

# The module form (torch.ao.nn.quantized.EmbeddingBag) passes its table packed.
_TABLE_WHY = ("its packed table's row count is not in the trace (its indices say only "
              "which rows were read), and the rows a step touches set its speed")
_PACKED_TABLES = ("embedding_bag_byte", "embedding_bag_4bit", "embedding_byte",
                  "embedding_4bit")

# Fake quantization (QAT): x / scale rounded, so a scale must be positive; a fixed
# (observer-computed) scale and zero point are no parameters, and the per-channel
# kernels refuse ones that require grad ("not differentiable with respect to argument
# 'scale'"). The learnable forms train theirs.
_FAKE_QUANT = ("fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine",
               "fake_quantize_per_tensor_affine_cachemask",
               "fake_quantize_per_channel_affine_cachemask",
               "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams")
_LEARNABLE_FAKE_QUANT = ("_fake_quantize_learnable_per_tensor_affine",
                         "_fake_quantize_learnable_per_channel_affine")

# A QAT module's on/off flags are on (1 by default), save where the op's recorded
# children show their value (kernel_paths.ItemReads), which wins.
_FLAGS = {"observer_on": SetFlag(), "fake_quant_on": SetFlag()}
_FUSED_OBSERVERS = ("fused_moving_avg_obs_fake_quant", "_fused_moving_avg_obs_fq_helper",
                    "_fused_moving_avg_obs_fq_helper_functional")

FAMILY = OpFamily(
    name="quantized",
    shape_rules={
        **{f"aten::{name}": _FLAGS for name in _FUSED_OBSERVERS},
        "aten::_fake_quantize_per_tensor_affine_cachemask_tensor_qparams": {
            "fake_quant_enabled": SetFlag()},
    },
    packed_linear=_LINEAR,
    index_rules={
        **{f"quantized::{name}": EMBEDDING_BAG_RULES for name in _BAGS},
        # A zero point lies in [quant_min, quant_max] (the kernels check): below
        # quant_max, from 0, holds for the signed and unsigned ranges alike.
        **{f"aten::{name}": {"zero_point": IntArg("quant_max")}
           for name in _FAKE_QUANT + _LEARNABLE_FAKE_QUANT},
    },
    positive_args={f"aten::{name}": ("scale",) for name in _FAKE_QUANT + _LEARNABLE_FAKE_QUANT},
    not_differentiable={f"aten::{name}": ("scale", "zero_point") for name in _FAKE_QUANT},
    not_replayed={
        **{f"quantized::{name}": _CONV_WHY for name in _CONVS},
        **{f"quantized::{name}": _TABLE_WHY for name in _PACKED_TABLES},
    },
)
