"""Per-operator rules, all in one table-like place.

The pipeline is generic; an operator family gets a rule here only where the trace
alone cannot say how to replay it faithfully.
"""

from __future__ import annotations

import re

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
BACKEND_SPECIFIC = re.compile(r"cudnn|miopen|_cuda|cuda_|_nccl|cublas|_mps|xpu")

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

# Default fills by element kind: (kind, low, high).
DEFAULT_INTEGRAL = ("randint", 0, 8)
DEFAULT_FLOATING = ("uniform", -1.0, 1.0)
POSITIVE_FLOATING = ("uniform", 0.5, 1.5)
