"""Forward-mode AD: the dual levels its ops name must be live when they run.

``torch.autograd.forward_ad.dual_level()`` (and ``torch.func``'s transforms) enter a
level by a call no trace records; the ops inside name it (``aten::_make_dual(primal,
tangent, level)``). Replayed with no level live, the first such op raises ("Trying to
access a forward AD level with an invalid index"). Entered, the ops on dual tensors
also compute their tangents again, as the children the trace records under them.

A dual tensor is the same view of its primal's memory, yet a tensor of its own (with
the tangent), and so is the primal an unpack returns (without it): readers of each read
that result, not the view it aliases.
"""

from __future__ import annotations

from mystique_gen.oprules.base import OpFamily

FAMILY = OpFamily(
    name="forward AD",
    distinct_aliases=frozenset({"aten::_make_dual", "aten::_unpack_dual",
                                "aten::_fw_primal"}),
    forward_ad_levels={
        "aten::_make_dual": "level",
        "aten::_make_dual_copy": "level",
        "aten::_unpack_dual": "level",
        "aten::_fw_primal": "level",
        "aten::_fw_primal_copy": "level",
    },
)
