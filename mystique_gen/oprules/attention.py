"""Packed (variable-length) attention: the cumulative sequence lengths that cut a
batch of packed sequences into spans.

``cu_seqlens`` (``cum_seq_q``, ``cu_seq_q``) is made outside the step by a data
collator that packs sequences, or in it from an attention mask (transformers'
unpadding). Filled at random, the spans covered a few rows of the recorded tokens, or
ran past them (a CUDA kernel then reads out of bounds); computed from replayed values,
they need not add up to the recorded tokens either. They are filled, or fitted where
a replayed op computes them, as even spans over the recorded rows, none longer than
the recorded longest sequence (``max_seqlen``), which sizes the kernel's grid."""

from __future__ import annotations

from mystique_gen.harness.fills import FillKind
from mystique_gen.oprules.base import Facts, Fill, OpFamily, OutShapes


class PackedSpans(Fill):
    """``cu``: the cumulative lengths of the sequences packed into the rows of
    ``rows`` ((tokens, heads, dim), or (1, tokens, heads, dim) for memory-efficient
    attention's batch of one), the first 0 and the last the row count, each span at
    most ``longest`` (an int argument) rows."""

    def __init__(self, cu: str, rows: str, longest: str):
        self.cu, self.rows, self.longest = cu, rows, longest

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        cu, rows, longest = args.get(self.cu), args.get(self.rows), args.get(self.longest)
        if not isinstance(cu, tuple) or len(cu) != 1 or cu[0] < 2 \
                or not isinstance(rows, tuple):
            return None
        if len(rows) == 3:
            total = rows[0]
        elif len(rows) == 4 and rows[0] == 1:
            total = rows[1]
        else:
            return None
        sequences = cu[0] - 1
        if not isinstance(longest, int) or longest <= 0:
            longest = total
        if longest * sequences < total:
            return None  # no spans that short cover the rows
        return (FillKind.SPANS, longest, total)


def _spans(cu_q: str, cu_k: str, q: str, k: str, max_q: str, max_k: str
           ) -> dict[str, Fill]:
    return {cu_q: PackedSpans(cu_q, q, max_q), cu_k: PackedSpans(cu_k, k, max_k)}


_ATEN = _spans("cum_seq_q", "cum_seq_k", "query", "key", "max_q", "max_k")
_EFFICIENT = _spans("cu_seqlens_q", "cu_seqlens_k", "query", "key", "max_seqlen_q",
                    "max_seqlen_k")
_VARLEN = _spans("cu_seq_q", "cu_seq_k", "query", "key", "max_q", "max_k")
_FLASH_ATTN = _spans("cu_seqlens_q", "cu_seqlens_k", "q", "k", "max_seqlen_q",
                     "max_seqlen_k")

# A boolean attention mask: True attends. Not finite where False (-inf before the
# softmax), so a row of keys all False is NaN.
_ATTENDS = ("attn_mask", (("", True),))

FAMILY = OpFamily(
    name="packed attention",
    excluding_masks={
        "aten::scaled_dot_product_attention": _ATTENDS,
        "aten::_scaled_dot_product_flash_attention_for_cpu": _ATTENDS,
    },
    shape_rules={
        "aten::_flash_attention_forward": _ATEN,
        "aten::_flash_attention_backward": _ATEN,
        "aten::_flash_attention_forward_no_dropout_inplace": _ATEN,
        "aten::_cudnn_attention_forward": _ATEN,
        "aten::_cudnn_attention_backward": _ATEN,
        "aten::_efficient_attention_forward": _EFFICIENT,
        "aten::_efficient_attention_backward": _EFFICIENT,
        "torch_attn::_varlen_attn": _VARLEN,
        "torch_attn::_varlen_attn_out": _VARLEN,
        "torch_attn::_varlen_attn_backward": _VARLEN,
        "flash_attn::_flash_attn_varlen_forward": _FLASH_ATTN,
        "flash_attn::_flash_attn_varlen_backward": _FLASH_ATTN,
    },
)
