"""Optimizers: second moments and denominators positive, so updates stay finite."""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily

FAMILY = OpFamily(
    name="optimizers",
    # Adam's, Adagrad's and RMSprop's denominators add eps (1e-8 by default) to a square
    # root: the trace writes it as 0.0, and a zero gradient's entry (an embedding row no
    # token used, in a step that made the state) replayed 0 / 0 = NaN into its weight.
    # Adding a recorded 0.0 is otherwise a no-op nobody writes.
    epsilon_args={
        "aten::add": ("other",),
        "aten::add_": ("other",),
        "aten::_foreach_add": ("scalar",),
        "aten::_foreach_add_": ("scalar",),
    },
    positive_args={
        "aten::_foreach_sqrt": ("self",),
        "aten::_foreach_sqrt_": ("self",),
        "aten::addcdiv": ("tensor2",),
        "aten::addcdiv_": ("tensor2",),
        "aten::_foreach_addcdiv_": ("tensor2",),
        "aten::_fused_adam_": ("exp_avg_sqs",),
        "aten::_fused_adamw_": ("exp_avg_sqs",),
    },
    # RMSprop(centered=True) takes the square root of square_avg - grad_avg**2 (an
    # addcmul with value -1), which their EMAs keep non-negative; state filled at
    # random does not: square_avg in [0.5, 1.5] and grad_avg in [-0.5, 0.5] does.
    positive_if={op: (("self",), {"tensor1": (-0.5, 0.5), "tensor2": (-0.5, 0.5)})
                 for op in ("aten::addcmul", "aten::addcmul_", "aten::_foreach_addcmul",
                            "aten::_foreach_addcmul_")},
    float_ranges={"aten::_foreach_div_": {"other": (0.5, 1.5)}},
)
