"""Random draws whose parameters are tensors: rates, counts, concentrations and scales
non-negative, probabilities in [0, 1]. torch checks most of them and raises ("invalid
Poisson rate, expected rate to be non-negative", "normal expects all elements of std
>= 0.0"), so a parameter the replay fills (a distribution's buffer or parameter, read
as it is) must be drawn inside its domain."""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily

_PROBABILITY = (0.0, 1.0)

FAMILY = OpFamily(
    name="random sampling",
    positive_args={
        "aten::poisson": ("self",),
        "aten::binomial": ("count",),
        "aten::normal": ("std",),
        "aten::_standard_gamma": ("self",),
        "aten::_standard_gamma_grad": ("self", "output"),
        "aten::_sample_dirichlet": ("self",),
        "aten::_dirichlet_grad": ("alpha", "total"),
        # Weights, not only a range: computed as c / c.sum() from a counts buffer, the
        # counts must be positive too ("probability entry < 0").
        "aten::multinomial": ("self",),
    },
    float_ranges={
        "aten::bernoulli": {"self": _PROBABILITY, "p": _PROBABILITY},
        "aten::bernoulli_": {"p": _PROBABILITY},
        "aten::binomial": {"prob": _PROBABILITY},
        "aten::multinomial": {"self": (0.1, 1.0)},
        "aten::_dirichlet_grad": {"x": (0.05, 0.95)},
    },
)
