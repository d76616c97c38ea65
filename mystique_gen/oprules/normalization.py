"""Normalisation: parameters and running statistics as the modules initialise them
(running variances positive); running statistics never require grad."""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily

# Running statistics are buffers, never parameters: whatever op reads them, they must
# not require grad (PyTorch refuses: "not differentiable with respect to argument").
NOT_DIFFERENTIABLE_ARGS = frozenset({"running_mean", "running_var", "num_batches_tracked"})

# Filled with the values the modules start from (weight 1, bias 0, mean 0, variance 1),
# not U(-1, 1): a random mean or bias shifts a whole channel to one sign, after which
# a ReLU zeroes it or passes it whole, and the kernels downstream branch on those
# values. A max_pool2d after BatchNorm -> ReLU ran in 250 us on such channels against
# 500 us on the original's (half zeros, unpredictable): a ResNet step replayed 8%
# fast. Even U(-0.1, 0.1) shifts outweigh the small activations of fan-in scaled
# weights (14% zeros). Trained models move from these values, but their outputs
# stay of both signs.
_AS_INITIALISED = {"weight": (1.0, 1.0), "bias": (0.0, 0.0), "running_mean": (0.0, 0.0),
                   "running_var": (1.0, 1.0)}
_NORMALISED = ("aten::batch_norm", "aten::native_batch_norm", "aten::_native_batch_norm_legit",
               "aten::_native_batch_norm_legit_no_training", "aten::_batch_norm_impl_index",
               "aten::cudnn_batch_norm", "aten::miopen_batch_norm",
               "aten::_batch_norm_with_update", "aten::_batch_norm_no_update",
               "aten::layer_norm", "aten::native_layer_norm", "aten::group_norm",
               "aten::native_group_norm", "aten::instance_norm", "aten::rms_norm",
               "aten::_fused_rms_norm")

_STATISTICS = ("weight", "bias", "running_mean", "running_var")
_SAVED = ("weight", "running_mean", "running_var", "save_mean", "save_var")

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
    float_ranges={op: dict(_AS_INITIALISED) for op in _NORMALISED},
    # With half or bfloat16 inputs, cuDNN's and MIOpen's kernels take float32 weights
    # and statistics (and return them so: save_mean, save_var; grad_weight,
    # grad_bias). With those recast too, ResNet-50 in bfloat16 on an H200 skipped all
    # 53 of its recorded cudnn_batch_norm_backward ops at run time.
    full_precision={
        "aten::cudnn_batch_norm": (_STATISTICS, (1, 2)),
        "aten::miopen_batch_norm": (_STATISTICS, (1, 2)),
        "aten::cudnn_batch_norm_backward": (_SAVED, (1, 2)),
        "aten::miopen_batch_norm_backward": (_SAVED, (1, 2)),
    },
)
