"""Which ops a benchmark can call where it runs, and which it never replays."""

from __future__ import annotations

import re

from mystique_gen.harness.equivalents import PORTABLE
from mystique_gen.oprules.base import OpFamily

# Operators that are never replayed, with the reason shown in the benchmark header.
_PROFILER: dict[str, str] = {
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

# Kernels tied to one vendor's library or one device: they run only where that backend
# is built (where one cannot, the benchmark runs its portable equivalent if the harness
# has one, equivalents.PORTABLE, else its outputs stand in).
BACKEND_SPECIFIC = re.compile(
    r"cudnn|miopen|mkldnn|_cuda|cuda_|_nccl|cublas|_mps|xpu|_for_cpu|fbgemm_|nnpack|"
    r"flash_attention|efficient_attention|fused_attention_overrideable"
)

# Namespaces that libtorch itself registers where it is built with their backend (MKL,
# oneDNN, fbgemm/qnnpack quantized kernels): never a model's own ops, so never replayed
# as the ops they call inside (an MKL linear records only its output's allocation);
# guarded like any op outside aten, for a torch built without them.
TORCH_NATIVE_NAMESPACES = frozenset({
    "mkl", "mkldnn", "mkldnn_prepacked", "onednn", "quantized", "_quantized", "sparse",
})

# Operators that need an accelerator even when their tensors are on the host.
NEEDS_ACCELERATOR = frozenset({"pin_memory", "_pin_memory"})


def guard_reason(namespace: str, name: str, overload: str = "default") -> str | None:
    """Why an op may be unavailable on the replay machine (then it is guarded), or None."""
    if name in NEEDS_ACCELERATOR:
        return _ported("needs an accelerator", namespace, name, overload)
    if namespace not in CORE_NAMESPACES:
        return _ported(f"namespace {namespace}:: may not be loaded", namespace, name, overload)
    if BACKEND_SPECIFIC.search(name):
        return _ported("backend-specific kernel", namespace, name, overload)
    return None


def device_specific_reason(namespace: str, name: str, overload: str = "default") -> str:
    """The guard of an op whose kernels serve some devices only (passes/kernels.py)."""
    return _ported("kernels for some devices only", namespace, name, overload)


def has_portable_equivalent(qualified: str) -> bool:
    """Whether the harness runs a portable equivalent of ``namespace::name[.overload]``
    (as its schema names it) where the op itself cannot run (equivalents.PORTABLE)."""
    namespace, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    return f"{namespace}::{name}.{overload or 'default'}" in PORTABLE


def _ported(reason: str, namespace: str, name: str, overload: str) -> str:
    """A guard's reason, saying so where the harness has a portable equivalent."""
    if f"{namespace}::{name}.{overload}" in PORTABLE:
        return f"{reason}, with a portable equivalent"
    return reason


# Operator namespaces that a torch module registers when imported (torch.library): the
# generator imports it to resolve the ops, and the benchmark does too before it
# resolves them (still torch: the file stays self-contained). FSDP2's copy-in/out ops.
# _c10d_functional is native, but some of its ops (_wrap_tensor_autograd) are defined by
# the Python module of functional collectives. torch_attn: varlen attention
# (torch.nn.attention.varlen, its custom ops over packed sequences).
NAMESPACE_MODULES = {
    "fsdp": "torch.distributed.fsdp._fully_shard._fsdp_collectives",
    "torch_attn": "torch.nn.attention.varlen",
    "_c10d_functional": "torch.distributed._functional_collectives",
    "_c10d_functional_autograd": "torch.distributed._functional_collectives",
}

# Argument types that cannot be rebuilt from a trace.
UNSUPPORTED_ARG_TYPES = ("Stream", "Storage", "__torch__", "Dict", "Future", "Any", "Capsule")

# Public modules whose attributes may be operator bindings: (public path, binding
# module's path under torch._C, prefix of the aten name); passes/public_calls.py.
# ``torch.Tensor`` methods are handled apart (their binding module is TensorBase).
PUBLIC_MODULES = (
    ("torch", "_VariableFunctions", ""),
    ("torch.nn.functional", "_nn", ""),
    ("torch.linalg", "_linalg", "linalg_"),
    ("torch.special", "_special", "special_"),
    ("torch.fft", "_fft", "fft_"),
)

FAMILY = OpFamily(name="profiler and streams", not_replayed=_PROFILER)
