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

# Every batch-norm op, forward and backward, and the arguments that hold its weights
# and statistics; results 1 and 2 are the saved statistics (forward) or the weight's
# and bias's grads (backward), where the op has them.
_BATCH_NORMS = ("aten::batch_norm", "aten::native_batch_norm",
                "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_no_training",
                "aten::_batch_norm_impl_index", "aten::_batch_norm_with_update",
                "aten::_batch_norm_no_update", "aten::cudnn_batch_norm",
                "aten::miopen_batch_norm", "aten::native_batch_norm_backward",
                "aten::_batch_norm_impl_index_backward", "aten::batch_norm_backward",
                "aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward")
_BATCH_NORM_STATE = ("weight", "bias", "running_mean", "running_var", "save_mean",
                     "save_var", "save_invstd", "save_var_transform")

_EPS = ("eps",)

FAMILY = OpFamily(
    name="normalisation",
    # Every normalisation divides by sqrt(variance + eps): BERT's LayerNorm eps 1e-12
    # reads 0.0 in the trace, and a constant row would replay inf.
    epsilon_args={
        **{op: _EPS for op in (
            "aten::layer_norm", "aten::native_layer_norm", "aten::batch_norm",
            "aten::native_batch_norm", "aten::_native_batch_norm_legit",
            "aten::_native_batch_norm_legit_no_training", "aten::_batch_norm_impl_index",
            "aten::_batch_norm_with_update", "aten::_batch_norm_no_update",
            "aten::native_batch_norm_backward", "aten::group_norm",
            "aten::native_group_norm", "aten::instance_norm", "aten::rms_norm",
            "aten::_fused_rms_norm")},
        "aten::cudnn_batch_norm": ("epsilon",),
        "aten::cudnn_batch_norm_backward": ("epsilon",),
    },
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
    # Batch norm's weights and statistics stay float32 beside half or bfloat16
    # inputs, as mixed-precision training keeps them: cuDNN's and MIOpen's kernels take
    # nothing else (ResNet-50 recast whole to bfloat16 on an H200 skipped all 53 of its
    # recorded cudnn_batch_norm_backward ops at run time), and the native kernels take
    # such a mix where every parameter is float32 (CPU: "mixed dtype (CPU): expect
    # parameter to have scalar type of Float" where some were recast and some not).
    full_precision={op: (_BATCH_NORM_STATE, (1, 2)) for op in _BATCH_NORMS},
)
