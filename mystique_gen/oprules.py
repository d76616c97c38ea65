"""Per-operator rules, all in one table-like place.

The pipeline is generic; an operator family gets a rule here only where the trace
alone cannot say how to replay it faithfully.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Operators that are never replayed, with the reason shown in the benchmark header.
NOT_REPLAYED: dict[str, str] = {
    "aten::record_stream": "binds a tensor to a CUDA stream object the trace does not record",
    "profiler::_record_function_enter": "profiler bookkeeping",
    "profiler::_record_function_enter_new": "profiler bookkeeping",
    "profiler::_record_function_exit": "profiler bookkeeping",
    "aten::_record_function_enter": "profiler bookkeeping",
    "aten::_record_function_exit": "profiler bookkeeping",
}

# Namespaces whose operators are replayed directly; any other namespace (fbgemm::,
# torchrec::, a user's custom ops) may not be loaded where the benchmark runs.
CORE_NAMESPACES = frozenset({"aten", "prims"})

# Kernels tied to one vendor's library: they exist only where that backend is built.
BACKEND_SPECIFIC = re.compile(
    r"cudnn|miopen|_cuda|cuda_|_nccl|cublas|_mps|xpu|flash_attention|efficient_attention"
)

COMMUNICATION_NAMESPACES = frozenset({"c10d", "c10d_functional", "_c10d_functional"})


# Operators that need an accelerator even when their tensors are on the host.
NEEDS_ACCELERATOR = frozenset({"pin_memory", "_pin_memory"})


def guard_reason(namespace: str, name: str) -> str | None:
    """Why an op may be unavailable on the replay machine (then it is guarded), or None."""
    if name in NEEDS_ACCELERATOR:
        return "needs an accelerator"
    if namespace not in CORE_NAMESPACES:
        return f"namespace {namespace}:: may not be loaded"
    if BACKEND_SPECIFIC.search(name):
        return "backend-specific kernel"
    return None


# Argument types that cannot be rebuilt from a trace.
UNSUPPORTED_ARG_TYPES = ("Stream", "Storage", "__torch__", "Dict", "Future", "Any", "Capsule")


# ---------------------------------------------------------------------------
# Valid input values. Index-like integer tensors that are materialised (not produced
# by a replayed op) must hold values the consuming op accepts, or the benchmark
# crashes or runs at the wrong speed. Each rule says which argument is the index and
# what bounds it, in terms of the op's other recorded arguments.
# ---------------------------------------------------------------------------


class Bound:
    """An exclusive upper bound for an index argument, computed from the op's args."""

    def upper(self, args: dict[str, object]) -> int | None:  # pragma: no cover - abstract
        raise NotImplementedError


class SizeOf(Bound):
    """Size of tensor argument ``tensor`` along a fixed dim or along the int arg ``dim``."""

    def __init__(self, tensor: str, dim: int | str):
        self.tensor, self.dim = tensor, dim

    def upper(self, args: dict[str, object]) -> int | None:
        shape = args.get(self.tensor)
        dim = args.get(self.dim) if isinstance(self.dim, str) else self.dim
        if not isinstance(shape, tuple) or not isinstance(dim, int) or not shape:
            return None
        if -len(shape) <= dim < len(shape):
            return shape[dim]
        return None


class ClassCount(Bound):
    """Number of classes of a loss input: dim 1 of (N, C, ...) or dim 0 of (C,)."""

    def __init__(self, tensor: str):
        self.tensor = tensor

    def upper(self, args: dict[str, object]) -> int | None:
        shape = args.get(self.tensor)
        if not isinstance(shape, tuple) or not shape:
            return None
        return shape[1] if len(shape) >= 2 else shape[0]


class IntArg(Bound):
    """The value of an int argument (``num_classes``, ``num_weights``)."""

    def __init__(self, name: str):
        self.name = name

    def upper(self, args: dict[str, object]) -> int | None:
        value = args.get(self.name)
        return value if isinstance(value, int) and value > 0 else None


class PerDim(Bound):
    """``indices[k]`` of ``aten::index`` indexes dim k of ``tensor`` (handled by position)."""

    def __init__(self, tensor: str):
        self.tensor = tensor

    def upper(self, args: dict[str, object]) -> int | None:
        return None  # resolved per list element by the values pass


_ROWS = SizeOf("weight", 0)
_ALONG_DIM = SizeOf("self", "dim")
_EMBEDDING_BAG = {"indices": _ROWS, "offsets": "offsets"}
_LOSS = {"target": ClassCount("self")}

# op -> {index argument name: Bound, or "offsets" for bag offsets over "indices"}
INDEX_RULES: dict[str, dict[str, Bound | str]] = {
    "aten::embedding": {"indices": _ROWS},
    "aten::embedding_bag": _EMBEDDING_BAG,
    "aten::_embedding_bag": _EMBEDDING_BAG,
    "aten::_embedding_bag_forward_only": _EMBEDDING_BAG,
    "aten::embedding_dense_backward": {"indices": IntArg("num_weights")},
    "aten::embedding_backward": {"indices": IntArg("num_weights")},
    "aten::_embedding_bag_backward": {"indices": IntArg("num_weights"), "offsets": "offsets"},
    "aten::_embedding_bag_dense_backward": {"indices": IntArg("num_weights")},
    "aten::index_select": {"index": _ALONG_DIM},
    "aten::gather": {"index": _ALONG_DIM},
    "aten::scatter": {"index": _ALONG_DIM},
    "aten::scatter_": {"index": _ALONG_DIM},
    "aten::scatter_add": {"index": _ALONG_DIM},
    "aten::scatter_add_": {"index": _ALONG_DIM},
    "aten::scatter_reduce": {"index": _ALONG_DIM},
    "aten::scatter_reduce_": {"index": _ALONG_DIM},
    "aten::index_add": {"index": _ALONG_DIM},
    "aten::index_add_": {"index": _ALONG_DIM},
    "aten::index_copy": {"index": _ALONG_DIM},
    "aten::index_copy_": {"index": _ALONG_DIM},
    "aten::index_fill": {"index": _ALONG_DIM},
    "aten::index_fill_": {"index": _ALONG_DIM},
    "aten::take_along_dim": {"indices": _ALONG_DIM},
    "aten::index": {"indices": PerDim("self")},
    "aten::index_put": {"indices": PerDim("self")},
    "aten::index_put_": {"indices": PerDim("self")},
    "aten::_index_put_impl_": {"indices": PerDim("self")},
    "aten::nll_loss": _LOSS,
    "aten::nll_loss_nd": _LOSS,
    "aten::nll_loss_forward": _LOSS,
    "aten::nll_loss2d": _LOSS,
    "aten::nll_loss2d_forward": _LOSS,
    "aten::cross_entropy_loss": _LOSS,
    "aten::nll_loss_backward": _LOSS,
    "aten::nll_loss2d_backward": _LOSS,
    "aten::one_hot": {"self": IntArg("num_classes")},
}

# Ops whose outputs hold no defined values (whatever bytes the allocator handed out).
# Where a recorded op reads such a tensor's values before any recorded op writes them,
# the original filled it outside recorded ops: ``torch.tensor([3, 1, 2])`` records only
# aten::empty, aten::to, aten::lift_fresh and aten::detach_, and C++ copies the data in
# unseen. The tensor pass then builds that storage before timing (filled like any input,
# from its consumers' rules and its recorded ranges: an aten::index reading it gets valid
# indices, not garbage) and the replayed empty call's result goes unused.
UNINITIALISED_OUTPUTS = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::empty_permuted",
})
# In-place ops (``Tensor(a!) self``) that change a tensor's metadata or autograd state,
# never its values: they neither read nor define an uninitialised tensor's values.
NO_VALUE_WRITES = frozenset({
    "aten::detach_", "aten::requires_grad_", "aten::resize_", "aten::resize_as_",
    "aten::as_strided_", "aten::squeeze_", "aten::unsqueeze_", "aten::t_",
    "aten::transpose_", "aten::swapdims_", "aten::swapaxes_", "aten::_coalesced_",
})

# In-place ops that refuse a view ("Can't detach views in-place"). An input the replay
# builds is an ``as_strided`` view of its buffer; where such an op reads it, the input
# is detached from its buffer's view chain (same storage, so aliasing is unchanged).
REFUSES_VIEWS = frozenset({"aten::detach_"})

# Floating arguments that must be positive for the op to stay finite.
POSITIVE_ARGS: dict[str, tuple[str, ...]] = {
    "aten::batch_norm": ("running_var",),
    "aten::native_batch_norm": ("running_var",),
    "aten::_native_batch_norm_legit": ("running_var",),
    "aten::_batch_norm_impl_index": ("running_var",),
    "aten::cudnn_batch_norm": ("running_var",),
    "aten::native_batch_norm_backward": ("running_var", "save_invstd"),
    "aten::cudnn_batch_norm_backward": ("running_var", "save_var"),
    "aten::log": ("self",),
    "aten::log2": ("self",),
    "aten::log10": ("self",),
    "aten::log_": ("self",),
    "aten::sqrt": ("self",),
    "aten::sqrt_": ("self",),
    "aten::rsqrt": ("self",),
    "aten::_foreach_sqrt": ("self",),
    "aten::_foreach_sqrt_": ("self",),
    "aten::addcdiv": ("tensor2",),
    "aten::addcdiv_": ("tensor2",),
    "aten::_foreach_addcdiv_": ("tensor2",),
    "aten::_fused_adam_": ("exp_avg_sqs",),
    "aten::_fused_adamw_": ("exp_avg_sqs",),
}

# Integral divisors: integer division by zero raises (ZeroDivisionError), so a divisor
# the replay fills (a wrapped Python int such as top_k, or a tensor built from a list)
# never holds 0; floating divisors are in FLOAT_RANGES.
INTEGER_DIVISORS: dict[str, tuple[str, ...]] = {
    name: ("other",) for name in (
        "aten::div", "aten::div_", "aten::floor_divide", "aten::floor_divide_",
        "aten::remainder", "aten::remainder_", "aten::fmod", "aten::fmod_")
}

# Saved state a backward op reads back from its forward as raw bytes (an RNN's gates in a
# workspace): random bytes reinterpreted as floats hold NaN and inf, which poison every
# gradient and slow every kernel after them. Filled with zeros, which read as 0.0 in any
# dtype.
SAVED_WORKSPACES: dict[str, tuple[str, ...]] = {
    "aten::mkldnn_rnn_layer_backward": ("workspace",),
    "aten::_cudnn_rnn_backward": ("reserve",),
    "aten::miopen_rnn_backward": ("reserve",),
}

# Default fills by element kind: (kind, low, high).
DEFAULT_INTEGRAL = ("randint", 0, 8)
DEFAULT_FLOATING = ("uniform", -1.0, 1.0)
POSITIVE_FLOATING = ("uniform", 0.5, 1.5)
# 0-d floating tensors are mostly Python scalars wrapped by the argument parser
# (optimizer betas, learning rates, bias corrections): their values are not recorded,
# and one storage id often serves several of them in turn. Near 1, any of those roles
# keeps optimizer state finite and positive where it must be.
SCALAR_FLOATING = ("uniform", 0.95, 1.0)


# ---------------------------------------------------------------------------
# Data-dependent output sizes. Where a materialised input decides how large an op's
# output is (nonzero of a mask, unique, repeat_interleave, bincount, jagged lengths),
# the input is filled so the output comes out at its recorded size. Each rule reads
# the target from the op's recorded arguments and outputs and names a fill kind of the
# benchmark's ``_fill``: "mask" (exactly ``low`` nonzero elements), "distinct"
# (``low`` distinct values), "runs" (``low`` runs of equal values), "sum" (non-negative
# parts adding up to ``low``), "cuts" (sorted, first 0, last ``high``), "span" (values
# in [low, high] with both ends present).
# ---------------------------------------------------------------------------

Facts = dict[str, object]  # argument name -> shape (tensors) or value (scalars)
OutShapes = list[object]  # recorded output shapes; a list output: a list of shapes


def _numel(shape: object) -> int | None:
    if not isinstance(shape, tuple):
        return None
    n = 1
    for d in shape:
        n *= d
    return n


def _out(outputs: OutShapes, index: int = 0, element: int | None = None) -> tuple | None:
    if index >= len(outputs):
        return None
    shape = outputs[index]
    if element is not None:
        shape = shape[element] if isinstance(shape, list) and element < len(shape) else None
    return shape if isinstance(shape, tuple) else None


class Fill:
    """How one input must be filled for a data-dependent output to keep its size."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[str, int, int] | None:
        raise NotImplementedError  # pragma: no cover - abstract


class TrueCount(Fill):
    """Nonzero elements = the recorded rows of output ``index`` (``element`` of a list)."""

    def __init__(self, index: int = 0, element: int | None = None):
        self.index, self.element = index, element

    def init(self, args: Facts, outputs: OutShapes) -> tuple[str, int, int] | None:
        shape = _out(outputs, self.index, self.element)
        return ("mask", shape[0], 0) if shape else None


class MaskedCount(Fill):
    """``masked_select``: the output has (true elements of the broadcast mask) values."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[str, int, int] | None:
        out, mask, other = _numel(_out(outputs)), _numel(args.get("mask")), \
            _numel(args.get("self"))
        if out is None or not mask or not other:
            return None
        factor = max(other // mask, 1)  # mask broadcast over a larger self
        return ("mask", out // factor, 0) if out % factor == 0 else None


class DistinctCount(Fill):
    """``unique`` over all elements: as many distinct values as the recorded output."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[str, int, int] | None:
        if args.get("dim") is not None:
            return None
        return ("distinct", _numel(_out(outputs)) or 0, 0) if _out(outputs) else None


class RunCount(Fill):
    """``unique_consecutive``: as many runs as the recorded output has values."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[str, int, int] | None:
        if args.get("dim") is not None:
            return None
        return ("runs", _numel(_out(outputs)) or 0, 0) if _out(outputs) else None


class RepeatsSum(Fill):
    """``repeat_interleave`` repeats add up to the output's size along ``dim``."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[str, int, int] | None:
        out, repeats = _out(outputs), args.get("repeats")
        dim = args.get("dim")
        if out is None or not out or not isinstance(repeats, tuple):
            return None
        total = out[dim] if isinstance(dim, int) and -len(out) <= dim < len(out) else out[0]
        parts = _numel(repeats) or 0
        if parts == 1:  # one repeat count for every element
            inner = args.get("self")
            size = (inner[dim] if isinstance(dim, int) and isinstance(inner, tuple) and inner
                    else _numel(inner) if isinstance(inner, tuple) else 1) or 1
            return ("sum", total // size, 0) if total % size == 0 else None
        return ("sum", total, 0)


class MaxIsLast(Fill):
    """``bincount``: the largest value is one less than the recorded output length."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[str, int, int] | None:
        out = _out(outputs)
        return ("span", 0, out[0] - 1) if out and out[0] > 0 else None


class LengthsOf(Fill):
    """Jagged lengths: non-negative parts adding up to ``tensor``'s size along ``axis``."""

    def __init__(self, tensor: str, axis: str | int, cuts: bool = False):
        self.tensor, self.axis, self.cuts = tensor, axis, cuts

    def init(self, args: Facts, outputs: OutShapes) -> tuple[str, int, int] | None:
        shape = args.get(self.tensor)
        axis = args.get(self.axis, 0) if isinstance(self.axis, str) else self.axis
        if not isinstance(shape, tuple) or not isinstance(axis, int) or not shape:
            return None
        total = shape[axis] if -len(shape) <= axis < len(shape) else None
        if total is None:
            return None
        return ("cuts", 0, total) if self.cuts else ("sum", total, 0)


_UNIQUE = {"self": DistinctCount()}
_SEGMENTS = {"lengths": LengthsOf("data", "axis"), "offsets": LengthsOf("data", "axis", True)}

# op -> {input argument: Fill}
SHAPE_RULES: dict[str, dict[str, Fill]] = {
    "aten::nonzero": {"self": TrueCount()},
    "aten::argwhere": {"self": TrueCount()},
    "aten::nonzero_numpy": {"self": TrueCount(0, 0)},
    "aten::where": {"condition": TrueCount(0, 0)},
    "aten::masked_select": {"mask": MaskedCount()},
    "aten::_unique": _UNIQUE,
    "aten::_unique2": _UNIQUE,
    "aten::unique_consecutive": {"self": RunCount()},
    "aten::repeat_interleave": {"repeats": RepeatsSum()},
    "aten::bincount": {"self": MaxIsLast()},
    "aten::segment_reduce": _SEGMENTS,
    "aten::_segment_reduce_backward": _SEGMENTS,
    "aten::_jagged_to_padded_dense_forward": {"offsets": LengthsOf("values", 0, True)},
    "aten::_padded_dense_to_jagged_forward": {"offsets": LengthsOf("dense", 0, True)},
}

# Ops whose output sizes depend on input values. Where their input is produced by a
# replayed op (router logits -> top-k -> where -> index_add in a mixture of experts),
# the values differ from the original's, so the benchmark fits each such output to its
# recorded size (rows cut or repeated, so indices stay valid) before anything reads it.
DATA_DEPENDENT_OUTPUTS = frozenset({
    "aten::nonzero", "aten::argwhere", "aten::nonzero_numpy", "aten::where",
    "aten::masked_select", "aten::_unique", "aten::_unique2", "aten::unique_dim",
    "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::repeat_interleave",
    "aten::bincount", "aten::index", "aten::_ragged_idx",
})

# Floating arguments that must lie in a range for the op to run or stay finite:
# probabilities, unit-interval inputs, positive bases of fractional powers.
FLOAT_RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "aten::bernoulli": {"self": (0.0, 1.0), "p": (0.0, 1.0)},
    "aten::bernoulli_": {"p": (0.0, 1.0)},
    "aten::binary_cross_entropy": {"self": (0.05, 0.95), "target": (0.0, 1.0)},
    "aten::binary_cross_entropy_backward": {"self": (0.05, 0.95), "target": (0.0, 1.0)},
    "aten::multinomial": {"self": (0.1, 1.0)},
    "aten::pow": {"self": (0.5, 1.5)},
    "aten::pow_": {"self": (0.5, 1.5)},
    "aten::log1p": {"self": (0.0, 1.0)},
    "aten::lgamma": {"self": (0.5, 2.0)},
    "aten::digamma": {"self": (0.5, 2.0)},
    "aten::acos": {"self": (-0.9, 0.9)},
    "aten::asin": {"self": (-0.9, 0.9)},
    "aten::atanh": {"self": (-0.9, 0.9)},
    "aten::acosh": {"self": (1.1, 2.0)},
    "aten::reciprocal": {"self": (0.5, 1.5)},
    "aten::div": {"other": (0.5, 1.5)},
    "aten::div_": {"other": (0.5, 1.5)},
    "aten::_foreach_div_": {"other": (0.5, 1.5)},
}

# Index arguments whose exclusive bound is the number of elements of a tensor.
TAKE_RULES: dict[str, tuple[str, str]] = {
    "aten::take": ("index", "self"),
    "aten::put": ("index", "self"),
    "aten::put_": ("index", "self"),
}

# Saved integral data is embedded in the benchmark up to this many elements per
# storage; larger tensors are filled from their recorded range instead.
MAX_EMBEDDED_ELEMENTS = 8192


# ---------------------------------------------------------------------------
# Op categories for `mystique-gen compare`: the first pattern that matches an op or
# kernel name (lower case, namespace dropped) decides its category.
# ---------------------------------------------------------------------------
OP_CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(
        r"c10d|nccl|gloo|all_?reduce|all_?gather|reduce_scatter|all_to_all|alltoall|"
        r"broadcast|send|recv|barrier")),
    ("optimizer", re.compile(r"^_foreach_|_fused_(adam|sgd|adagrad)|adam|sgd|adagrad|"
                             r"optimizer|lamb|rmsprop")),
    ("conv", re.compile(r"conv|cudnn_convolution|mkldnn_convolution|im2col|col2im")),
    ("matmul", re.compile(r"^(mm|addmm|bmm|baddbmm|matmul|linear|addmv|mv|dot|einsum|"
                          r"_addmm_activation|_scaled_mm|addbmm)|gemm|cublas|"
                          r"attention|_flash|_efficient|linear_backward|mm_backward")),
    ("reduction", re.compile(
        r"^(sum|mean|max|min|amax|amin|argmax|argmin|norm|linalg_vector_norm|var|std|"
        r"var_mean|std_mean|prod|cumsum|cumprod|logsumexp|_?softmax|_?log_softmax|"
        r"softmax_backward|_softmax_backward_data|_log_softmax_backward_data|"
        r"nll_loss|cross_entropy|native_layer_norm|layer_norm|native_batch_norm|"
        r"batch_norm|_batch_norm|group_norm|native_group_norm|topk|sort|"
        r"embedding_bag|_embedding_bag|all|any|count_nonzero|mse_loss|"
        r"binary_cross_entropy|smooth_l1|l1_loss|nll_loss_forward|nll_loss_backward|"
        r"native_layer_norm_backward|native_batch_norm_backward|mse_loss_backward|"
        r"binary_cross_entropy_with_logits)$|reduce|_backward_data$")),
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


# ---------------------------------------------------------------------------
# Communication: how each c10d operator is replayed with torch.distributed.
# ``tensors`` lists (schema argument, form) in the order of the call's positional
# arguments; forms: "tensor" (a Tensor), "one" (the only tensor of a Tensor[]),
# "list" (a Tensor[]), "inner" (the only list of a Tensor[][]), "inner_or_none"
# (that list, or None where it is empty: gather/scatter on a non-root rank).
# ``root``: schema argument holding a group-local rank, passed as ``root_keyword``.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CommRule:
    call: str
    tensors: tuple[tuple[str, str], ...]
    root: str | None = None
    root_keyword: str | None = None
    splits: bool = False  # all_to_all_single: pass the recorded split sizes
    tag: bool = False  # send/recv: pass the recorded tag
    async_call: str | None = None  # the call to use when the trace waits on it later
    has_async_arg: bool = True  # the call takes async_op=


COMM_OPS: dict[str, CommRule] = {
    "c10d::allreduce_": CommRule("all_reduce", (("tensors", "one"),)),
    "c10d::allreduce_coalesced_": CommRule("all_reduce_coalesced", (("tensors", "list"),)),
    "c10d::broadcast_": CommRule("broadcast", (("tensors", "one"),), "root_rank", "group_src"),
    "c10d::reduce_": CommRule("reduce", (("tensors", "one"),), "root_rank", "group_dst"),
    "c10d::allgather_": CommRule(
        "all_gather", (("output_tensors", "inner"), ("input_tensors", "one"))),
    "c10d::_allgather_base_": CommRule(
        "all_gather_into_tensor", (("output_tensor", "tensor"), ("input_tensor", "tensor"))),
    "c10d::allgather_coalesced_": CommRule(
        "all_gather_coalesced", (("output_lists", "list"), ("input_list", "list"))),
    "c10d::reduce_scatter_": CommRule(
        "reduce_scatter", (("output_tensors", "one"), ("input_tensors", "inner"))),
    "c10d::_reduce_scatter_base_": CommRule(
        "reduce_scatter_tensor", (("output_tensor", "tensor"), ("input_tensor", "tensor"))),
    "c10d::alltoall_": CommRule(
        "all_to_all", (("output_tensors", "list"), ("input_tensors", "list"))),
    "c10d::alltoall_base_": CommRule(
        "all_to_all_single", (("output", "tensor"), ("input", "tensor")), splits=True),
    "c10d::gather_": CommRule(
        "gather", (("input_tensors", "one"), ("output_tensors", "inner_or_none")),
        "root_rank", "group_dst"),
    "c10d::scatter_": CommRule(
        "scatter", (("output_tensors", "one"), ("input_tensors", "inner_or_none")),
        "root_rank", "group_src"),
    "c10d::send": CommRule("send", (("tensors", "one"),), "dst", "group_dst", tag=True,
                           async_call="isend", has_async_arg=False),
    "c10d::recv_": CommRule("recv", (("tensors", "one"),), "src", "group_src", tag=True,
                            async_call="irecv", has_async_arg=False),
    "c10d::barrier": CommRule("barrier", ()),
}

# Communication ops that have no faithful torch.distributed call, with the reason.
COMM_NOT_REPLAYED: dict[str, str] = {
    "c10d::allgather_into_tensor_coalesced_": "coalesced tensor collective (FSDP): "
    "not replayed yet",
    "c10d::reduce_scatter_tensor_coalesced_": "coalesced tensor collective (FSDP): "
    "not replayed yet",
    "c10d::recv_any_source_": "the sender is chosen at run time; not reproducible",
    "c10d::monitored_barrier_": "debugging barrier (gloo only), not part of the workload",
}

# Ops that copy integral values from these inputs to their outputs unchanged (a
# selection, a reshape, a concatenation). A bound a consumer puts on the output also
# holds for the input, so an index tensor read through `y[mask]` stays in range.
VALUE_PRESERVING: dict[str, tuple[str, ...]] = {
    "aten::index": ("self",),
    "aten::index_select": ("self",),
    "aten::gather": ("self",),
    "aten::masked_select": ("self",),
    "aten::take_along_dim": ("self",),
    "aten::clone": ("self",),
    "aten::contiguous": ("self",),
    "aten::to": ("self",),
    "aten::_to_copy": ("self",),
    "aten::copy_": ("src",),
    "aten::repeat": ("self",),
    "aten::repeat_interleave": ("self",),
    "aten::flip": ("self",),
    "aten::roll": ("self",),
    "aten::reshape": ("self",),
    "aten::flatten": ("self",),
    "aten::cat": ("tensors",),
    "aten::concat": ("tensors",),
    "aten::stack": ("tensors",),
    "aten::tile": ("self",),
}


# ---------------------------------------------------------------------------
# Autograd (passes/autograd.py): floating inputs that must not require grad even though
# an op recorded with autograd reads them (PyTorch refuses them: "not differentiable
# with respect to argument ...").
# ---------------------------------------------------------------------------

NOT_DIFFERENTIABLE_ARGS = frozenset({"running_mean", "running_var", "num_batches_tracked"})
_CLASS_WEIGHTS = ("weight",)
NOT_DIFFERENTIABLE_BY_OP: dict[str, tuple[str, ...]] = {
    "aten::nll_loss": _CLASS_WEIGHTS,
    "aten::nll_loss_nd": _CLASS_WEIGHTS,
    "aten::nll_loss2d": _CLASS_WEIGHTS,
    "aten::cross_entropy_loss": _CLASS_WEIGHTS,
    "aten::binary_cross_entropy": _CLASS_WEIGHTS,
    "aten::binary_cross_entropy_with_logits": ("weight", "pos_weight"),
    "aten::multi_margin_loss": _CLASS_WEIGHTS,
    "aten::multilabel_margin_loss": _CLASS_WEIGHTS,
}


def differentiable(op_name: str, arg_name: str) -> bool:
    return (arg_name not in NOT_DIFFERENTIABLE_ARGS
            and arg_name not in NOT_DIFFERENTIABLE_BY_OP.get(op_name, ()))

