"""Which recorded ops may be unavailable where the benchmark runs: guarded ops.

The names that oprules.availability knows (a vendor's kernels, namespaces that may not
be loaded), and any aten op that the PyTorch generating the file gives no kernel for
every device: neither a composite nor one on the host (and on a CUDA build, one on
the GPU too). SyncBatchNorm's ``batch_norm_stats`` has a CUDA kernel only: a CUDA
trace's benchmark, run on the host, stopped there rather than running the rest.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from mystique_gen import oprules

# Dispatch keys whose kernel serves every device, and those of the host and the GPU.
_COMPOSITE_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd",
                   "CompositeExplicitAutogradNonFunctional")
_HOST_KEYS = ("CPU", "SparseCPU", "SparseCsrCPU", "QuantizedCPU", "MkldnnCPU",
              "NestedTensorCPU")
_CUDA_KEYS = ("CUDA", "SparseCUDA", "SparseCsrCUDA", "QuantizedCUDA", "NestedTensorCUDA")


@lru_cache(maxsize=4096)
def guard_reason(qualified: str) -> str | None:
    """Why the op ``namespace::name[.overload]`` (as its schema names it) may be
    unavailable where the benchmark runs, or None where it runs everywhere."""
    namespace, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    overload = overload or "default"
    reason = oprules.guard_reason(namespace, name, overload)
    if reason is not None or namespace != "aten" or _on_every_device(qualified):
        return reason
    return oprules.device_specific_reason(namespace, name, overload)


@lru_cache(maxsize=4096)
def unknown_here(qualified: str) -> bool:
    """Whether this PyTorch has no operator ``namespace::name[.overload]``: a trace of a
    newer PyTorch (``aten::linalg_polar``, new in 2.14, on 2.13)."""
    namespace, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    try:
        getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except (AttributeError, RuntimeError):
        return True
    return False


def _on_every_device(qualified: str) -> bool:
    """Whether this PyTorch has a kernel of the op for every device it was built for;
    True for an op it does not know (lowering says what is wrong with that)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    dispatch_name = qualified.removesuffix(".default")
    try:
        if any(has(dispatch_name, key) for key in _COMPOSITE_KEYS):
            return True
        on_host = any(has(dispatch_name, key) for key in _HOST_KEYS)
        on_cuda = not torch.backends.cuda.is_built() or any(
            has(dispatch_name, key) for key in _CUDA_KEYS)
    except RuntimeError:
        return True
    return on_host and on_cuda
