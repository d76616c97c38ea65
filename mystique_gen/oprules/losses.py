"""Losses: class-index targets below the class count; class weights not differentiable."""

from __future__ import annotations

from mystique_gen.oprules.base import ClassCount, IntArg, OpFamily

_LOSS = {"target": ClassCount("self")}
_CLASS_WEIGHTS = ("weight",)

FAMILY = OpFamily(
    name="losses",
    index_rules={
        "aten::nll_loss": _LOSS,
        "aten::nll_loss_nd": _LOSS,
        "aten::nll_loss_forward": _LOSS,
        "aten::nll_loss2d": _LOSS,
        "aten::nll_loss2d_forward": _LOSS,
        "aten::cross_entropy_loss": _LOSS,
        "aten::nll_loss_backward": _LOSS,
        "aten::nll_loss2d_backward": _LOSS,
        "aten::one_hot": {"self": IntArg("num_classes")},
    },
    float_ranges={
        "aten::binary_cross_entropy": {"self": (0.05, 0.95), "target": (0.0, 1.0)},
        "aten::binary_cross_entropy_backward": {"self": (0.05, 0.95), "target": (0.0, 1.0)},
    },
    not_differentiable={
        "aten::nll_loss": _CLASS_WEIGHTS,
        "aten::nll_loss_nd": _CLASS_WEIGHTS,
        "aten::nll_loss2d": _CLASS_WEIGHTS,
        "aten::cross_entropy_loss": _CLASS_WEIGHTS,
        "aten::binary_cross_entropy": _CLASS_WEIGHTS,
        "aten::binary_cross_entropy_with_logits": ("weight", "pos_weight"),
        "aten::multi_margin_loss": _CLASS_WEIGHTS,
        "aten::multilabel_margin_loss": _CLASS_WEIGHTS,
    },
)
