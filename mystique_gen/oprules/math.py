"""Elementwise math: arguments inside each function's domain (random draws:
``sampling.py``)."""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily, SetFlag, ShiftedRange

# An asserted condition holds: the original step passed it.
_HOLDS = {"self": SetFlag()}

# Integer division by zero raises (ZeroDivisionError), so a divisor the replay fills (a
# wrapped Python int such as top_k, or a tensor built from a list) never holds 0;
# floating divisors are in float_ranges.
_DIVISIONS = ("aten::div", "aten::div_", "aten::floor_divide", "aten::floor_divide_",
              "aten::remainder", "aten::remainder_", "aten::fmod", "aten::fmod_")

# Non-negative arguments make these non-negative (add's alpha is 1 as the trace records
# it almost always; a negative one is checked where the rule is applied).
_BINARY = ("self", "other")
_MULTIGAMMA = ShiftedRange(0.5, 2.0, "p", 0.5)
_KEEPS_SIGN = {
    **{op: _BINARY for op in ("aten::add", "aten::add_", "aten::mul", "aten::mul_",
                              "aten::div", "aten::div_", "aten::maximum", "aten::minimum")},
    **{op: ("self",) for op in ("aten::sum", "aten::mean", "aten::cumsum", "aten::prod",
                                "aten::cumprod",
                                "aten::amax", "aten::amin", "aten::clone",
                                "aten::contiguous", "aten::to", "aten::_to_copy",
                                "aten::avg_pool1d", "aten::avg_pool2d",
                                "aten::adaptive_avg_pool1d", "aten::adaptive_avg_pool2d",
                                "aten::index_select", "aten::gather", "aten::repeat")},
    # A clamp keeps what is already in range; a lerp with a weight in [0, 1] (running
    # statistics: Adafactor's row and column variances) stays between its ends.
    **{op: ("self",) for op in ("aten::clamp", "aten::clamp_", "aten::clamp_min",
                                "aten::clamp_min_")},
    **{op: ("self", "end") for op in ("aten::lerp", "aten::lerp_")},
    "aten::cat": ("tensors",),
    "aten::stack": ("tensors",),
}

FAMILY = OpFamily(
    name="math domains",
    shape_rules={
        "aten::_assert_async": _HOLDS,
        "aten::_functional_assert_async": _HOLDS,
    },
    epsilon_args={"aten::cosine_similarity": ("eps",)},
    epsilon_floors={op: ("self", "min") for op in (
        "aten::clamp_min", "aten::clamp_min_", "aten::clamp", "aten::clamp_")},
    non_negative_results=frozenset({
        "aten::linalg_vector_norm", "aten::norm", "aten::frobenius_norm",
        "aten::linalg_norm", "aten::linalg_matrix_norm", "aten::nuclear_norm",
        "aten::sqrt", "aten::abs", "aten::std", "aten::var", "aten::exp"}),
    # ``h * h + 1`` under an rsqrt asks nothing of h (its square is never negative)
    non_negative_if={
        **{op: ("square", "self", "other") for op in ("aten::mul", "aten::mul_")},
        **{op: ("even_power", "exponent", "") for op in ("aten::pow", "aten::pow_")},
        **{op: ("floor_at_least_zero", "min", "") for op in (
            "aten::clamp", "aten::clamp_", "aten::clamp_min", "aten::clamp_min_")},
    },
    integer_divisors={name: ("other",) for name in _DIVISIONS},
    keeps_sign=_KEEPS_SIGN,
    # ``((1 - alphas_cumprod) / alphas_cumprod) ** 0.5`` (diffusers' DPM-Solver and
    # Euler sigmas): a square root written as a power, its base a ratio whose range a
    # preferred range does not carry into; filled (0.5, 1.5) the cumulative alphas made
    # 1 - a negative and every sigma NaN.
    exponents={
        **{op: ("self", None) for op in ("aten::exp", "aten::exp_", "aten::expm1",
                                         "aten::expm1_", "aten::sinh", "aten::cosh")},
        # ``theta ** (arange(0, d, 2) / d)``: rotary embeddings' inverse frequencies
        "aten::pow": ("exponent", "self"),
    },
    same_value_casts=frozenset({"aten::to", "aten::_to_copy", "aten::clone",
                                "aten::contiguous"}),
    fractional_powers={op: ("self", "exponent") for op in (
        "aten::pow", "aten::pow_", "aten::float_power", "aten::float_power_")},
    positive_args={
        "aten::log": ("self",),
        "aten::log2": ("self",),
        "aten::log10": ("self",),
        "aten::log_": ("self",),
        "aten::sqrt": ("self",),
        "aten::sqrt_": ("self",),
        "aten::rsqrt": ("self",),
        "aten::rsqrt_": ("self",),
        "aten::log2_": ("self",),
        "aten::log10_": ("self",),
        # x log y and the entropy -x log x: NaN (or -inf) where y, x < 0.
        "aten::xlogy": ("other",),
        "aten::xlogy_": ("other",),
        "aten::special_entr": ("self",),
        # The regularised incomplete gamma functions: a > 0, x >= 0.
        "aten::igamma": ("self", "other"),
        "aten::igamma_": ("self", "other"),
        "aten::igammac": ("self", "other"),
        "aten::igammac_": ("self", "other"),
    },
    complements={"aten::rsub": ("self", "other")},
    differences={"aten::sub": ("self", "other"), "aten::sub_": ("self", "other"),
                 "aten::rsub": ("other", "self")},
    # (a 0-d scale is taken as positive: an image's resize ratio, a temperature)
    increasing={"aten::mul": _BINARY, "aten::add": _BINARY, "aten::div": ("self",),
                "aten::sub": ("self",), "aten::clone": ("self",),
                "aten::contiguous": ("self",), "aten::to": ("self",),
                "aten::_to_copy": ("self",)},
    sums=frozenset({"aten::add"}),
    # |a * b|, |x ** e| (e >= 1, checked where the rule is applied), a mean, |tanh x|
    # and the like are below c <= 1 where their arguments are: ``sq - mean * mean`` and
    # ``sq - mean ** 2`` keep mean within the bound the difference puts on its square.
    contracting={
        **{op: _BINARY for op in ("aten::mul", "aten::mul_")},
        # (a division only by a number or a 0-d tensor: ``s1 * s1 / n``)
        **{op: ("self",) for op in ("aten::div", "aten::div_")},
        **{op: ("self",) for op in (
            "aten::pow", "aten::pow_", "aten::square", "aten::abs", "aten::neg",
            "aten::mean", "aten::tanh", "aten::sin", "aten::amax", "aten::amin",
            "aten::clone", "aten::contiguous", "aten::to", "aten::_to_copy")},
    },
    products={"aten::prod": "self", "aten::cumprod": "self", "aten::cumprod_": "self"},
    length_comparisons=frozenset({"aten::lt", "aten::le", "aten::gt", "aten::ge"}),
    positions=frozenset({"aten::arange"}),
    float_ranges={
        "aten::quantile": {"q": (0.0, 1.0)},
        "aten::nanquantile": {"q": (0.0, 1.0)},
        # Ranges, not positive_args: a range stays on the tensor read (and what it is a
        # view or copy of), where positivity would carry back through sums and products
        # to the weights (``h.square()`` made a whole network positive, then inf).
        "aten::pow": {"self": (0.5, 1.5)},
        "aten::pow_": {"self": (0.5, 1.5)},
        # pow in double: a negative base to a filled exponent (0-d: near 1, not 1) is NaN
        "aten::float_power": {"self": (0.5, 1.5)},
        "aten::float_power_": {"self": (0.5, 1.5)},
        "aten::reciprocal": {"self": (0.5, 1.5)},
        "aten::div": {"other": (0.5, 1.5)},
        "aten::div_": {"other": (0.5, 1.5)},
        "aten::log1p": {"self": (0.0, 1.0)},
        "aten::lgamma": {"self": (0.5, 2.0)},
        "aten::digamma": {"self": (0.5, 2.0)},
        # digamma's derivatives: the same poles at 0 and the negative integers
        "aten::polygamma": {"self": (0.5, 2.0)},
        "aten::special_polygamma": {"self": (0.5, 2.0)},
        # lgamma(x - j / 2) for j < p: x above (p - 1) / 2
        "aten::mvlgamma": {"self": _MULTIGAMMA},
        "aten::mvlgamma_": {"self": _MULTIGAMMA},
        "aten::special_multigammaln": {"self": _MULTIGAMMA},
        "aten::acos": {"self": (-0.9, 0.9)},
        "aten::asin": {"self": (-0.9, 0.9)},
        "aten::atanh": {"self": (-0.9, 0.9)},
        "aten::acosh": {"self": (1.1, 2.0)},
        # Inverse CDFs and log-odds: NaN outside (-1, 1) and (0, 1).
        "aten::erfinv": {"self": (-0.9, 0.9)},
        "aten::erfinv_": {"self": (-0.9, 0.9)},
        "aten::logit": {"self": (0.05, 0.95)},
        "aten::logit_": {"self": (0.05, 0.95)},
        "aten::special_ndtri": {"self": (0.05, 0.95)},
        "aten::special_xlog1py": {"other": (0.0, 1.0)},
        "aten::special_zeta": {"self": (1.1, 2.0), "other": (0.5, 1.5)},
    },
)
