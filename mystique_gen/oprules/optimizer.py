"""Optimizers: second moments and denominators positive, so updates stay finite."""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily

FAMILY = OpFamily(
    name="optimizers",
    positive_args={
        "aten::_foreach_sqrt": ("self",),
        "aten::_foreach_sqrt_": ("self",),
        "aten::addcdiv": ("tensor2",),
        "aten::addcdiv_": ("tensor2",),
        "aten::_foreach_addcdiv_": ("tensor2",),
        "aten::_fused_adam_": ("exp_avg_sqs",),
        "aten::_fused_adamw_": ("exp_avg_sqs",),
    },
    float_ranges={"aten::_foreach_div_": {"other": (0.5, 1.5)}},
)
