"""Normalisation: running variances positive; running statistics never require grad."""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily

# Running statistics are buffers, never parameters: whatever op reads them, they must
# not require grad (PyTorch refuses: "not differentiable with respect to argument").
NOT_DIFFERENTIABLE_ARGS = frozenset({"running_mean", "running_var", "num_batches_tracked"})

FAMILY = OpFamily(
    name="normalisation",
    positive_args={
        "aten::batch_norm": ("running_var",),
        "aten::native_batch_norm": ("running_var",),
        "aten::_native_batch_norm_legit": ("running_var",),
        "aten::_batch_norm_impl_index": ("running_var",),
        "aten::cudnn_batch_norm": ("running_var",),
        "aten::native_batch_norm_backward": ("running_var", "save_invstd"),
        "aten::cudnn_batch_norm_backward": ("running_var", "save_var"),
    },
)
