"""Quantized operators: the packed weights they take, which a trace cannot hold.

``quantized::linear`` and its dynamic forms take a ``LinearPackedParamsBase``, a
TorchScript object the ET writes as ``"<Object>"``. Its weight's shape is the op's
(input features, output features), so the replay packs a weight of that shape once
(``_packed_linear``); its values do not set the kernel's speed. A convolution's packed
weight also holds its kernel size, stride, padding and groups, which the trace does not
say: those ops are not replayed, with that reason. Quantized tensors themselves are
filled as their integer representation (``ir.dtypes.QUANTIZED``).
"""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily

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

FAMILY = OpFamily(
    name="quantized",
    packed_linear=_LINEAR,
    not_replayed={f"quantized::{name}": _CONV_WHY for name in _CONVS},
)
