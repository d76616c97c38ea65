"""Recurrent layers: saved workspaces a backward reads back as raw bytes."""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily

FAMILY = OpFamily(
    name="recurrent layers",
    # Random bytes reinterpreted as floats hold NaN and inf, which poison every gradient
    # and slow every kernel after them; zeros read as 0.0 in any dtype.
    saved_workspaces={
        "aten::mkldnn_rnn_layer_backward": ("workspace",),
        "aten::_cudnn_rnn_backward": ("reserve",),
        "aten::miopen_rnn_backward": ("reserve",),
    },
)
