"""Allocation and metadata ops: what holds no values yet, and what writes none."""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily

FAMILY = OpFamily(
    name="allocation and metadata",
    # Where a recorded op reads such a tensor's values before any recorded op writes
    # them, the original filled it outside recorded ops: ``torch.tensor([3, 1, 2])``
    # records only aten::empty, aten::to, aten::lift_fresh and aten::detach_, and C++
    # copies the data in unseen. The tensor pass then builds that storage before timing
    # (filled like any input, from its consumers' rules and its recorded ranges: an
    # aten::index reading it gets valid indices, not garbage) and the replayed empty
    # call's result goes unused.
    uninitialised_outputs=frozenset({
        "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
        "aten::new_empty_strided", "aten::empty_permuted",
        "aten::_empty_affine_quantized", "aten::_empty_per_channel_affine_quantized",
    }),
    # In-place ops (``Tensor(a!) self``) that change a tensor's metadata or autograd
    # state, never its values: they neither read nor define an uninitialised tensor,
    # and their arguments may overlap in any way (``set_`` points ``self`` at another
    # view of the same storage), which proves nothing about memory (passes/tensors.py).
    no_value_writes=frozenset({
        "aten::detach_", "aten::requires_grad_", "aten::resize_", "aten::resize_as_",
        "aten::as_strided_", "aten::squeeze_", "aten::unsqueeze_", "aten::t_",
        "aten::transpose_", "aten::swapdims_", "aten::swapaxes_", "aten::_coalesced_",
        "aten::set_",
    }),
    # Below another op, a fill prepares that op's result and its kernel computes the
    # rest (passes/select.py): the op is no composite of its children.
    fills=frozenset({"aten::fill_", "aten::zero_", "aten::index_fill_",
                     "aten::masked_fill_"}),
    overwrites=frozenset({"aten::copy_", "aten::fill_", "aten::zero_"}),
    # ``mask[..., :1] = False``, ``x[x < 0] = 0``: the indexing code lifts the literal to
    # a 0-d tensor. Filled at random, transformers' "keep at least one token" literal
    # removed every token of a row, and multinomial refused the NaN probabilities.
    assigned_literals=frozenset({"aten::lift_fresh"}),
    # ``t.item()``, ``int(t)``, ``for t in timesteps``: the value each read recorded is
    # the input's (passes/values.py), where no op wrote it before (a diffusers
    # scheduler's timesteps, from numpy, were filled 0..7 for their 75 to 0).
    item_reads=frozenset({"aten::item", "aten::_local_scalar_dense"}),
    # Which value such a literal was: ``matched[iou < t] = -1`` then ``matched >= 0``,
    # ``labels[pad] = -100`` then a loss that ignores -100 (filled 0, every anchor
    # matched a box, and FCOS's centerness took square roots outside them).
    # ``mask = zeros(n, dtype=bool); mask[idx] = 1`` (PyG's to_dense_batch): the
    # literal written into zeros is not 0.
    zero_creations=frozenset({"aten::zeros", "aten::new_zeros", "aten::zeros_like"}),
    literal_writes={name: ("self", "values") for name in (
        "aten::index_put_", "aten::index_put", "aten::_index_put_impl_")},
    marker_tests={"aten::eq": "equal", "aten::ne": "equal", "aten::ge": "sign",
                  "aten::lt": "sign"},
    # (values computed from such a result do not derive from its argument's:
    # passes/values.py follows values the replay computes from filled ones)
    metadata_only=frozenset({
        "aten::empty_like", "aten::zeros_like", "aten::ones_like", "aten::full_like",
        "aten::rand_like", "aten::randn_like", "aten::randint_like", "aten::new_empty",
        "aten::new_empty_strided", "aten::new_zeros", "aten::new_ones", "aten::new_full",
        "aten::size", "aten::sym_size", "aten::numel", "aten::sym_numel", "aten::stride",
        "aten::_has_compatible_shallow_copy_type",  # ``tensor.data = other`` asks it
    }),
    # An input the replay builds is an ``as_strided`` view of its buffer; where such an
    # op reads it, the input is detached from its buffer's view chain (same storage, so
    # aliasing is unchanged).
    refuses_views=frozenset({"aten::detach_"}),
    # A model views a kernel's output only where the layout it got allows it (its
    # ``.contiguous()`` of an already contiguous tensor records nothing): the replay
    # keeps that layout where a kernel elsewhere lays it out otherwise (a CPU trace's
    # attention output, permuted and viewed, failed to view on CUDA).
    stride_dependent_views=frozenset({"aten::view", "aten::_unsafe_view",
                                      "aten::view_as", "aten::unflatten"}),
    layout_by_backend=frozenset({
        "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_fused_attention_overrideable",
    }),
    # The fused attention kernels' logsumexp is float32 whatever the inputs' type, and
    # their backwards take it only so: a recast to half or bfloat16 keeps it
    # (``expected scalar type Float but found Half`` in the CPU flash backward).
    full_precision={
        **{op: ((), (1,)) for op in (
            "aten::_scaled_dot_product_flash_attention",
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_efficient_attention",
            "aten::_scaled_dot_product_cudnn_attention",
            "aten::_flash_attention_forward", "aten::_efficient_attention_forward",
            "aten::_cudnn_attention_forward")},
        # the in-place flash forward writes the output and returns the logsumexp
        "aten::_flash_attention_forward_no_dropout_inplace": ((), (0,)),
        **{op: (("logsumexp",), ()) for op in (
            "aten::_scaled_dot_product_flash_attention_backward",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
            "aten::_scaled_dot_product_efficient_attention_backward",
            "aten::_scaled_dot_product_cudnn_attention_backward",
            "aten::_flash_attention_backward", "aten::_efficient_attention_backward",
            "aten::_cudnn_attention_backward")},
    },
    # A quantization observer reads ``x.detach()``: bound to ``x`` itself, its min and
    # max recorded autograd nodes in the replay, and the scale they made required grad.
    distinct_aliases=frozenset({"aten::detach"}),
)
