"""Per-operator rules, one module per op family, merged into the tables the passes read.

The pipeline is generic; an operator family gets a rule only where the trace alone
cannot say how to replay it faithfully. To add a family: write a module here that
exports ``FAMILY = OpFamily(...)`` (oprules/base.py says what a family can state), add
it to ``FAMILIES`` below, and add a test. An op claimed twice for the same table is an
error at import.
"""

from __future__ import annotations

from typing import Any

from mystique_gen.oprules import (
    attention,
    availability,
    collectives,
    datadep,
    fbgemm,
    forward_ad,
    indexing,
    kernel_paths,
    linalg,
    losses,
    math,
    memory,
    mkldnn,
    normalization,
    optimizer,
    quantized,
    rnn,
    sampling,
    sparse,
)
from mystique_gen.oprules.availability import (
    BACKEND_SPECIFIC,
    CORE_NAMESPACES,
    NAMESPACE_MODULES,
    NEEDS_ACCELERATOR,
    PUBLIC_MODULES,
    TORCH_NATIVE_NAMESPACES,
    UNSUPPORTED_ARG_TYPES,
    device_specific_reason,
    guard_reason,
    has_portable_equivalent,
)
from mystique_gen.oprules.base import (
    DEFAULT_FLOATING,
    DEFAULT_INTEGRAL,
    POSITIVE_FLOATING,
    SCALAR_FLOATING,
    SCALAR_INTEGRAL,
    Bound,
    ClassCount,
    CommRule,
    Fill,
    FloatRange,
    IntArg,
    KernelPath,
    OpFamily,
    PathFacts,
    PerDim,
    ShiftedRange,
    SizeOf,
    float_range,
)
from mystique_gen.oprules.categories import CATEGORY_ORDER, DEFAULT_CATEGORY, op_category
from mystique_gen.oprules.collectives import (
    ASYNC_ARGS,
    ASYNC_SCOPE,
    COLLECTIVE_HELPERS,
    COMMUNICATION_NAMESPACES,
    FUNCTIONAL_GUARD,
    FUNCTIONAL_NAMESPACES,
    GROUP_NAME_ARGS,
    REDUCE_OP_NAMES,
    REFUSED_ARGS,
    WIRE_DTYPES,
    functional_reduces,
    reduce_op_name,
    scope_runs_op,
    wire_form,
)
from mystique_gen.oprules.datadep import keeps_rows
from mystique_gen.oprules.derivatives import not_differentiable
from mystique_gen.oprules.linalg import matmul_grad_operand
from mystique_gen.oprules.normalization import NOT_DIFFERENTIABLE_ARGS
from mystique_gen.oprules.quantized import LINEAR_PACKED

FAMILIES: tuple[OpFamily, ...] = (
    availability.FAMILY,
    indexing.FAMILY,
    fbgemm.FAMILY,
    losses.FAMILY,
    normalization.FAMILY,
    rnn.FAMILY,
    optimizer.FAMILY,
    math.FAMILY,
    sampling.FAMILY,
    mkldnn.FAMILY,
    linalg.FAMILY,
    attention.FAMILY,
    datadep.FAMILY,
    collectives.FAMILY,
    memory.FAMILY,
    sparse.FAMILY,
    forward_ad.FAMILY,
    quantized.FAMILY,
    kernel_paths.FAMILY,
)

# Saved integral data is embedded in the benchmark up to this many elements per
# storage; larger tensors are filled from their recorded range instead.
MAX_EMBEDDED_ELEMENTS = 8192


def merged(table: str) -> dict[str, Any]:
    """One table (an OpFamily field) of every family; an op in two families is an error."""
    out: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for family in FAMILIES:
        for op, rule in getattr(family, table).items():
            if op in out:
                raise ValueError(f"oprules: {op} in {table} of both {owner[op]!r} and "
                                 f"{family.name!r}")
            out[op], owner[op] = rule, family.name
    return out


INDEX_RULES: dict[str, dict[str, Bound | str]] = merged("index_rules")
TAKE_RULES: dict[str, tuple[str, str]] = merged("take_rules")
POSITIVE_ARGS: dict[str, tuple[str, ...]] = merged("positive_args")
KEEPS_SIGN: dict[str, tuple[str, ...]] = merged("keeps_sign")
FRACTIONAL_POWERS: dict[str, tuple[str, str]] = merged("fractional_powers")
EXPONENTS: dict[str, tuple[str, str | None]] = merged("exponents")
POSITIVE_IF: dict[str, tuple[tuple[str, ...], dict[str, tuple[float, float]]]] = merged(
    "positive_if")
COMPLEMENTS: dict[str, tuple[str, str]] = merged("complements")
PRODUCTS: dict[str, str] = merged("products")
DIFFERENCES: dict[str, tuple[str, str]] = merged("differences")
CONTRACTING: dict[str, tuple[str, ...]] = merged("contracting")
POSITIVE_DEFINITE: dict[str, str] = merged("positive_definite")
INCREASING: dict[str, tuple[str, ...]] = merged("increasing")
FLOAT_RANGES: dict[str, dict[str, FloatRange]] = merged("float_ranges")
SHAPE_RULES: dict[str, dict[str, Fill]] = merged("shape_rules")
VALUE_PRESERVING: dict[str, tuple[str, ...]] = merged("value_preserving")
MOVES_ROWS: dict[str, tuple[str, str]] = merged("moves_rows")
LITERAL_WRITES: dict[str, tuple[str, str]] = merged("literal_writes")
BIN_COUNTS: dict[str, tuple[str, str]] = merged("bin_counts")
MARKER_TESTS: dict[str, str] = merged("marker_tests")
IGNORED_TARGETS: dict[str, tuple[str, str]] = merged("ignored_targets")
SAME_VALUES: dict[str, tuple[str, int]] = merged("same_values")
SAVED_WORKSPACES: dict[str, tuple[str, ...]] = merged("saved_workspaces")
NOT_DIFFERENTIABLE_BY_OP: dict[str, tuple[str, ...]] = merged("not_differentiable")
EPSILON_ARGS: dict[str, tuple[str, ...]] = merged("epsilon_args")
EPSILON_FLOORS: dict[str, tuple[str, str]] = merged("epsilon_floors")
GRAD_REVEALED_BY: dict[str, tuple[str, tuple[str, ...]]] = merged("grad_revealed_by")
COMM_OPS: dict[str, CommRule] = merged("comm_ops")
COMM_NOT_REPLAYED: dict[str, str] = merged("comm_not_replayed")
NOT_REPLAYED: dict[str, str] = merged("not_replayed")
INTEGER_DIVISORS: dict[str, tuple[str, ...]] = merged("integer_divisors")
WINDOW_BOUNDS: dict[str, str] = merged("window_bounds")
WINDOW_SHIFTS: dict[str, tuple[str, str]] = merged("window_shifts")
GROUP_RANK_ARGS: dict[str, str] = merged("group_rank_args")
SPARSE_FACTS: dict[str, str] = merged("sparse_facts")
FORWARD_AD_LEVELS: dict[str, str] = merged("forward_ad_levels")
PACKED_LINEAR: dict[str, str] = merged("packed_linear")
PACKED_ARGS: dict[str, tuple[str, str, tuple[str, ...]]] = merged("packed_args")
FULL_PRECISION: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = merged("full_precision")
KERNEL_PATHS: dict[str, KernelPath] = merged("kernel_paths")
EXCLUDING_MASKS: dict[str, tuple[str, tuple[tuple[str, bool], ...]]] = merged(
    "excluding_masks")


def _union(field_name: str) -> frozenset[str]:
    return frozenset(op for family in FAMILIES for op in getattr(family, field_name))


DATA_DEPENDENT_OUTPUTS = _union("data_dependent_outputs")
SPARSE_DATA_DEPENDENT_OUTPUTS = _union("sparse_data_dependent_outputs")
UNINITIALISED_OUTPUTS = _union("uninitialised_outputs")
NO_VALUE_WRITES = _union("no_value_writes")
REFUSES_VIEWS = _union("refuses_views")
DISTINCT_ALIASES = _union("distinct_aliases")
STRIDE_DEPENDENT_VIEWS = _union("stride_dependent_views")
LAYOUT_BY_BACKEND = _union("layout_by_backend")
FILLS = _union("fills")
OVERWRITES = _union("overwrites")
ASSIGNED_LITERALS = _union("assigned_literals")
ITEM_READS = _union("item_reads")
NEGATIONS = _union("negations")
NON_NEGATIVE_RESULTS = _union("non_negative_results")
NON_NEGATIVE_IF: dict[str, tuple[str, str, str]] = merged("non_negative_if")
ZERO_CREATIONS = _union("zero_creations")
CUMULATIVE_SUMS = _union("cumulative_sums")
SEARCHES = _union("searches")
STACKS = _union("stacks")
SUMS = _union("sums")
LENGTH_COMPARISONS = _union("length_comparisons")
POSITIONS = _union("positions")
SAME_VALUE_CASTS = _union("same_value_casts")
# An exponent's magnitude where the replay picks it (EXPONENTS): e**10 is 22026, finite
# in float16 as in float32.
EXPONENT_BOUND = 10.0
METADATA_ONLY = _union("metadata_only")
MKLDNN_OPS = _union("mkldnn_ops")


MKLDNN_LAYOUT = mkldnn.MKLDNN_LAYOUT


def differentiable(op_name: str, arg_name: str) -> bool:
    """Whether autograd may differentiate `op_name` with respect to `arg_name` (a
    tensor it reads there may require grad). A kernel named ``X_forward`` (torch's
    ``nll_loss2d_forward`` below ``nll_loss2d``) takes X's arguments and X's rules: the
    replay calls it itself where a composite's saved results are read later."""
    composite = op_name.removesuffix("_forward")
    return (arg_name not in NOT_DIFFERENTIABLE_ARGS
            and arg_name not in NOT_DIFFERENTIABLE_BY_OP.get(op_name, ())
            and arg_name not in NOT_DIFFERENTIABLE_BY_OP.get(composite, ())
            # torch's formula table: an argument it gives no gradient for (a loss's
            # target without one) refuses requires_grad at the call
            and arg_name not in not_differentiable().get(op_name, ()))


__all__ = [
    "ASYNC_SCOPE",
    "INTEGER_DIVISORS", "NO_VALUE_WRITES", "REFUSES_VIEWS", "UNINITIALISED_OUTPUTS",
    "STRIDE_DEPENDENT_VIEWS", "LAYOUT_BY_BACKEND",
    "ASYNC_ARGS", "BACKEND_SPECIFIC", "Bound", "CATEGORY_ORDER", "COLLECTIVE_HELPERS",
    "ASSIGNED_LITERALS", "ITEM_READS", "EXCLUDING_MASKS", "NEGATIONS",
    "EPSILON_FLOORS", "NON_NEGATIVE_IF", "NON_NEGATIVE_RESULTS", "PRODUCTS", "SEARCHES",
    "LENGTH_COMPARISONS", "POSITIONS",
    "EXPONENTS", "EXPONENT_BOUND", "SAME_VALUE_CASTS", "ZERO_CREATIONS",
    "BIN_COUNTS", "CUMULATIVE_SUMS",
    "DISTINCT_ALIASES", "FILLS", "OVERWRITES",
    "METADATA_ONLY",
    "MKLDNN_LAYOUT", "MKLDNN_OPS",
    "GRAD_REVEALED_BY", "GROUP_RANK_ARGS", "matmul_grad_operand", "keeps_rows",
    "KERNEL_PATHS", "KernelPath", "PathFacts",
    "COMMUNICATION_NAMESPACES", "COMM_NOT_REPLAYED", "COMM_OPS", "CORE_NAMESPACES",
    "ClassCount", "CommRule", "DATA_DEPENDENT_OUTPUTS", "DEFAULT_CATEGORY",
    "DEFAULT_FLOATING", "DEFAULT_INTEGRAL", "FAMILIES", "FLOAT_RANGES", "FloatRange",
    "ShiftedRange", "float_range",
    "FORWARD_AD_LEVELS", "FULL_PRECISION", "FUNCTIONAL_GUARD",
    "FUNCTIONAL_NAMESPACES", "Fill", "GROUP_NAME_ARGS", "INDEX_RULES", "IntArg",
    "COMPLEMENTS", "CONTRACTING", "DIFFERENCES", "FRACTIONAL_POWERS", "INCREASING",
    "KEEPS_SIGN", "LINEAR_PACKED",
    "MOVES_ROWS", "STACKS", "SUMS", "LITERAL_WRITES", "MARKER_TESTS",
    "IGNORED_TARGETS",
    "PACKED_ARGS", "PACKED_LINEAR",
    "MAX_EMBEDDED_ELEMENTS", "NAMESPACE_MODULES", "NEEDS_ACCELERATOR",
    "NOT_DIFFERENTIABLE_ARGS", "NOT_DIFFERENTIABLE_BY_OP", "NOT_REPLAYED", "OpFamily",
    "POSITIVE_ARGS", "POSITIVE_DEFINITE", "POSITIVE_FLOATING", "PUBLIC_MODULES", "PerDim",
    "REDUCE_OP_NAMES",
    "REFUSED_ARGS", "SAME_VALUES", "SAVED_WORKSPACES", "SCALAR_FLOATING", "SCALAR_INTEGRAL",
    "SHAPE_RULES", "SPARSE_DATA_DEPENDENT_OUTPUTS", "SPARSE_FACTS", "SizeOf",
    "TAKE_RULES", "TORCH_NATIVE_NAMESPACES", "UNSUPPORTED_ARG_TYPES", "VALUE_PRESERVING",
    "WINDOW_BOUNDS",
    "WINDOW_SHIFTS", "WIRE_DTYPES", "differentiable", "functional_reduces",
    "device_specific_reason", "guard_reason", "has_portable_equivalent", "merged",
    "op_category", "reduce_op_name", "scope_runs_op",
    "wire_form",
]
