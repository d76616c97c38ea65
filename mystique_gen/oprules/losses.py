"""Losses: class-index targets below the class count, probability and count targets in
their domains, class weights not differentiable.

A target outside its loss's domain (a probability below 0, a negative count) makes the
loss unbounded below or NaN: a training replay then drives its weights to inf and NaN,
within one step (KL divergence's log of a negative target) or over a hundred (an
EmbeddingBag recommender's BCE-with-logits on U(-1, 1) targets, without --reset-inputs).
NaN and inf change what value-dependent kernels do, so the replay times another step."""

from __future__ import annotations

from mystique_gen.harness.fills import FillKind
from mystique_gen.oprules.base import ClassCount, Facts, Fill, IntArg, OpFamily, OutShapes, SizeOf


class CtcInputLengths(Fill):
    """CTC's input lengths as tensors: every sequence as long as log_probs' time
    dimension (cuDNN's kernel takes only that; at random the CPU kernel refuses a
    length above it)."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        probs = args.get("log_probs")
        if not isinstance(probs, tuple) or not probs or probs[0] <= 0:
            return None
        return (FillKind.SPAN, probs[0], probs[0])


class CtcTargetLengths(Fill):
    """CTC's target lengths as tensors: parts adding up to the concatenated targets
    (1-d), or in [1, the padded length] (2-d), none above the input length."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        probs, targets = args.get("log_probs"), args.get("targets")
        if not isinstance(probs, tuple) or not probs or not isinstance(targets, tuple):
            return None
        if len(targets) == 1:
            return (FillKind.SUM, targets[0], 0)
        if len(targets) == 2 and targets[1] > 0:
            return (FillKind.SPAN, 1, max(1, min(targets[1], probs[0])))
        return None


_CTC_LENGTHS = {"input_lengths": CtcInputLengths(), "target_lengths": CtcTargetLengths()}

_LOSS = {"target": ClassCount("self")}
_CTC = {"targets": SizeOf("log_probs", -1)}
# torchaudio's RNN-T loss: targets are classes of the logits' last dim (the autograd
# Function's rnnt_loss_forward is registered with unnamed arguments, _0 the logits).
_RNNT = {"targets": SizeOf("logits", -1)}
_RNNT_FORWARD = {"_1": SizeOf("_0", -1)}
_CLASS_WEIGHTS = ("weight",)

FAMILY = OpFamily(
    name="losses",
    index_rules={
        "aten::nll_loss": _LOSS,
        "aten::nll_loss_nd": _LOSS,
        "aten::nll_loss_forward": _LOSS,
        "aten::nll_loss2d": _LOSS,
        "aten::nll_loss2d_forward": _LOSS,
        "aten::cross_entropy_loss": _LOSS,
        "aten::nll_loss_backward": _LOSS,
        "aten::nll_loss2d_backward": _LOSS,
        # Class indices too (multilabel's -1 ends a row's list; [0, C) is valid).
        "aten::multi_margin_loss": _LOSS,
        "aten::multi_margin_loss_backward": _LOSS,
        "aten::multilabel_margin_loss": _LOSS,
        "aten::multilabel_margin_loss_forward": _LOSS,
        "aten::multilabel_margin_loss_backward": _LOSS,
        "aten::one_hot": {"self": IntArg("num_classes")},
        # CTC's targets are classes of log_probs' last dim: out of range, the CPU
        # kernel reads past its buffers (a double free, as eager torch does).
        "aten::ctc_loss": _CTC,
        "aten::_ctc_loss": _CTC,
        "aten::_ctc_loss_backward": _CTC,
        "aten::_cudnn_ctc_loss": _CTC,
        "aten::_use_cudnn_ctc_loss": _CTC,
        "torchaudio::rnnt_loss": _RNNT,
        "torchaudio::rnnt_loss_forward": _RNNT_FORWARD,
    },
    # The tensor overloads' lengths (the list overloads record them as numbers).
    shape_rules={name: _CTC_LENGTHS for name in (
        "aten::ctc_loss", "aten::_ctc_loss", "aten::_ctc_loss_backward",
        "aten::_cudnn_ctc_loss", "aten::_use_cudnn_ctc_loss")},
    float_ranges={
        "aten::binary_cross_entropy": {"self": (0.05, 0.95), "target": (0.0, 1.0)},
        "aten::binary_cross_entropy_backward": {"self": (0.05, 0.95), "target": (0.0, 1.0)},
        "aten::binary_cross_entropy_with_logits": {"target": (0.0, 1.0),
                                                   "pos_weight": (0.5, 1.5)},
        # Probabilities, or with log_target log-probabilities: (0, 1) is finite for both.
        "aten::kl_div": {"target": (0.0, 1.0)},
        # Counts; the input is a rate where log_input is off (positive either way).
        "aten::poisson_nll_loss": {"input": (0.05, 1.5), "target": (0.0, 2.0)},
    },
    ignored_targets={name: ("target", "ignore_index") for name in (
        "aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss2d",
        "aten::nll_loss_forward", "aten::nll_loss2d_forward", "aten::nll_loss_backward",
        "aten::nll_loss2d_backward", "aten::cross_entropy_loss")},
    not_differentiable={
        "aten::nll_loss": _CLASS_WEIGHTS,
        "aten::nll_loss_nd": _CLASS_WEIGHTS,
        "aten::nll_loss2d": _CLASS_WEIGHTS,
        "aten::cross_entropy_loss": _CLASS_WEIGHTS,
        "aten::binary_cross_entropy": _CLASS_WEIGHTS,
        "aten::binary_cross_entropy_with_logits": ("weight", "pos_weight"),
        "aten::multi_margin_loss": _CLASS_WEIGHTS,
        "aten::multilabel_margin_loss": _CLASS_WEIGHTS,
    },
)
