"""Portable equivalents of operators a device or a PyTorch may lack.

Each entry of ``PORTABLE`` computes, with torch ops that run anywhere, what a device
kernel computes (cuDNN's and FlashAttention's attention and RNNs, fbgemm's table-batched
embeddings, torchvision's and torchaudio's kernels, CUDA-only quantised and sparse
matmuls): a replay calls it where the kernel cannot run, on the same buffers. Entries
of ``_EQUIVALENTS`` stand in for operators this PyTorch does not register (FSDP2's
``fsdp::``, ops of a newer torch). Both tables are keyed by operator name,
``ns::name.overload``.

Like ``runtime.py``, this module is real Python, imported and tested, and inlined into
generated files (before runtime.py's code, ``backends/harness.py``), which keep only the
entries of the operators they call. It imports only torch and reads nothing of the
runtime, so an operator family's equivalent is added here, with its test in
``tests/test_harness.py``.
"""

import torch


# Operators some torch lacks (FSDP2's fsdp::, registered by the torch module that
# defines them; ops of a newer torch), written with torch ops: the same work, on the
# same buffers.
def _fsdp_all_gather_copy_in(
    all_gather_inputs, all_gather_output, inp_split_sizes, all_gather_input_numel, rank
):
    """This rank's shards, copied into its part of the all-gather buffer."""
    all_gather_input = all_gather_output.narrow(
        0, all_gather_input_numel * rank, all_gather_input_numel
    )
    destinations = list(torch.split(all_gather_input, list(inp_split_sizes)))
    with torch.no_grad():
        if hasattr(torch, "_foreach_copy_"):
            torch._foreach_copy_(destinations, list(all_gather_inputs))
        else:
            for destination, source in zip(
                destinations, all_gather_inputs, strict=True
            ):
                destination.copy_(source)
    return all_gather_input, all_gather_output


def _fsdp_split_with_sizes_copy(
    all_gather_output, all_gather_input_split_sizes, dim=0, *, out
):
    """The all-gathered buffer, split along `dim` and copied into `out`."""
    parts = torch.split(all_gather_output, list(all_gather_input_split_sizes), dim=dim)
    for destination, part in zip(out, parts, strict=True):
        destination.copy_(part)


def _fsdp_chunk_cat(tensors, dim, num_chunks, *, out):
    """Each tensor cut in `num_chunks` chunks along `dim`, chunk k of all of them
    concatenated as row k of `out` (torch._chunk_cat, which pads uneven chunks)."""
    torch._chunk_cat(tensors, dim, num_chunks, out=out)


def _wrap_tensor_autograd(tensor):
    """Functional collectives' eager wrapper of a result (a Python op that torch 2.13
    defines and 2.9 does not): it hands the tensor back; no data moves."""
    return tensor


_EQUIVALENTS = {
    "_c10d_functional::_wrap_tensor_autograd.default": _wrap_tensor_autograd,
    "fsdp::all_gather_copy_in.default": _fsdp_all_gather_copy_in,
    "fsdp::split_with_sizes_copy.default": _fsdp_split_with_sizes_copy,
    "fsdp::chunk_cat.default": _fsdp_chunk_cat,
}


# Backend kernels (cuDNN's, MIOpen's, oneDNN's, the fused attentions) written with the
# portable ops they implement, for where the kernel cannot run: another vendor's GPU, the
# host, a dtype the kernel refuses (cuDNN's batch-norm backward takes no bfloat16). The
# same work in another kernel, not stand-in outputs: a CUDA ResNet-50 recast to bfloat16
# otherwise skipped its 53 batch-norm backward passes. An equivalent returns the first
# of the kernel's outputs, the ones the model reads (see _ported); the rest stand in.
def _batch_norm(
    input,
    weight,
    bias,
    running_mean,
    running_var,
    training,
    exponential_average_factor,
    epsilon,
):
    """cudnn_batch_norm and miopen_batch_norm: out, saved mean and inverse std."""
    return torch.ops.aten.native_batch_norm.default(
        input,
        weight,
        bias,
        running_mean,
        running_var,
        training,
        exponential_average_factor,
        epsilon,
    )


def _batch_norm_backward(
    input,
    grad_output,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_var,
    epsilon,
    reserveSpace=None,
):
    """cudnn_ and miopen_batch_norm_backward: their forward ran in training (in eval,
    autograd calls native_batch_norm_backward), and save_var is the inverse std."""
    return torch.ops.aten.native_batch_norm_backward.default(
        grad_output,
        input,
        weight,
        running_mean,
        running_var,
        save_mean,
        save_var,
        True,
        epsilon,
        [True, True, True],
    )


def _convolution_as(transposed, with_bias):
    """cuDNN's, MIOpen's and oneDNN's convolutions as aten::convolution: their
    arguments are (self, weight, [bias,] padding, [output_padding,] stride, dilation,
    groups, [their own flags])."""

    def run(self, weight, *args):
        bias, args = (args[0], args[1:]) if with_bias else (None, args)
        if transposed:
            padding, output_padding, stride, dilation, groups = args[:5]
        else:
            padding, stride, dilation, groups = args[:4]
            output_padding = [0] * len(stride)
        return torch.ops.aten.convolution.default(
            self,
            weight,
            bias,
            stride,
            padding,
            dilation,
            transposed,
            output_padding,
            groups,
        )

    return run


def _nnpack_convolution(input, weight, bias, padding, stride=1):
    """NNPACK's convolution (the host's, 2-d)."""
    return torch.nn.functional.conv2d(input, weight, bias, stride, padding)


def _grouped_heads(query, key, value):
    """Key and value with each head repeated for its group of query heads (grouped
    query attention: fewer key/value heads than query heads, heads third from last)."""
    heads = query.size(-3) if query.dim() >= 3 and key.dim() >= 3 else 0
    kv_heads = key.size(-3) if heads else 0
    if kv_heads and kv_heads != heads and heads % kv_heads == 0:
        key = key.repeat_interleave(heads // kv_heads, dim=-3)
        value = value.repeat_interleave(heads // kv_heads, dim=-3)
    return key, value


def _attention(query, key, value, attn_mask, dropout_p, is_causal, scale):
    """The fused attention kernels' forward: the best kernel this device has. Grouped
    query attention (fewer key/value heads than query heads, which the fused kernels
    take as they are) repeats each key/value head for its group of query heads, as
    `enable_gqa=True` does; its backward sums their grads back."""
    key, value = _grouped_heads(query, key, value)
    return (
        torch.nn.functional.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
        ),
    )


def _as_saved(tensor):
    return tensor


def _grads_by_autograd(forward, inputs, grads):
    """The grads of `inputs` from running `forward(*inputs)` again under autograd,
    given its outputs' grads (None where an output has none): a kernel's backward
    where the kernel cannot run, computed by this device's portable kernels. Its own
    graph keeps what it saves: hooks that keep each saved tensor as it is are pushed
    over any that keep none (the runtime's `_saved_tensors(False)`)."""
    hooks = torch.autograd.graph.saved_tensors_hooks(_as_saved, _as_saved)
    with hooks, torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in inputs]
        pairs = [
            (output, grad)
            for output, grad in zip(forward(*leaves), grads, strict=False)
            if grad is not None
        ]
        return torch.autograd.grad(
            [o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True
        )


def _attention_grads(attend, grad_out, query, key, value, bias=None, bias_grad=False):
    """An attention kernel's backward where the kernel cannot run: its forward,
    `attend(q, k, v, bias)`, again under autograd, then autograd's backward (a fused
    backward recomputes the attention matrix as well, without writing the output).
    The grads of query, key and value; with `bias_grad`, the bias's too (None where it
    is not floating)."""
    learned = bias_grad and bias is not None and bias.is_floating_point()

    def forward(q, k, v, *learned_bias):
        return (attend(q, k, v, learned_bias[0] if learned_bias else bias),)

    inputs = [query, key, value] + ([bias] if learned else [])
    grads = tuple(_grads_by_autograd(forward, inputs, (grad_out.to(query.dtype),)))
    return grads + (None,) if bias_grad and not learned else grads


def _attention_backward(
    grad_out,
    query,
    key,
    value,
    attn_mask,
    dropout_p,
    is_causal,
    scale,
    bias_grad=False,
):
    """The fused attention kernels' backward, as autograd runs it through this device's
    best kernel (`_attention_grads`)."""

    def attend(q, k, v, mask):
        return _attention(q, k, v, mask, dropout_p, is_causal, scale)[0]

    return _attention_grads(attend, grad_out, query, key, value, attn_mask, bias_grad)


def _flash_attention(
    query, key, value, dropout_p=0.0, is_causal=False, *rest, attn_mask=None, scale=None
):
    """_scaled_dot_product_flash_attention (the CUDA one and the CPU one)."""
    return _attention(query, key, value, attn_mask, dropout_p, is_causal, scale)


def _mask_attention(
    query,
    key,
    value,
    attn_bias=None,
    compute_log_sumexp=True,
    dropout_p=0.0,
    is_causal=False,
    *rest,
    scale=None,
):
    """_scaled_dot_product_efficient_attention and _scaled_dot_product_cudnn_attention."""
    return _attention(query, key, value, attn_bias, dropout_p, is_causal, scale)


def _fused_attention(
    query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, *rest, scale=None
):
    """_scaled_dot_product_fused_attention_overrideable."""
    return _attention(query, key, value, attn_bias, dropout_p, is_causal, scale)


def _flash_attention_backward(
    grad_out, query, key, value, out, logsumexp, *rest, scale=None
):
    """_scaled_dot_product_flash_attention_backward: (..., dropout_p, is_causal, ...)
    after cum_seq_q, cum_seq_k, max_q and max_k."""
    return _attention_backward(
        grad_out, query, key, value, None, rest[4], rest[5], scale
    )


def _flash_attention_for_cpu_backward(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    dropout_p,
    is_causal,
    *,
    attn_mask=None,
    scale=None,
):
    """_scaled_dot_product_flash_attention_for_cpu_backward."""
    return _attention_backward(
        grad_out, query, key, value, attn_mask, dropout_p, is_causal, scale
    )


def _efficient_attention_backward(
    grad_out_,
    query,
    key,
    value,
    attn_bias,
    out,
    logsumexp,
    philox_seed,
    philox_offset,
    dropout_p,
    grad_input_mask,
    is_causal=False,
    *,
    scale=None,
):
    """_scaled_dot_product_efficient_attention_backward: the bias's grad where asked."""
    return _attention_backward(
        grad_out_,
        query,
        key,
        value,
        attn_bias,
        dropout_p,
        is_causal,
        scale,
        bias_grad=grad_input_mask[3],
    )


def _cudnn_attention_backward(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    philox_seed,
    philox_offset,
    attn_bias,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    *,
    scale=None,
):
    """_scaled_dot_product_cudnn_attention_backward."""
    return _attention_backward(
        grad_out, query, key, value, attn_bias, dropout_p, is_causal, scale
    )


def _fused_attention_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
):
    """_scaled_dot_product_fused_attention_overrideable_backward."""
    return _attention_backward(
        grad_out,
        query,
        key,
        value,
        attn_bias,
        dropout_p,
        is_causal,
        scale,
        bias_grad=grad_input_mask[3],
    )


def _key_distance(rows, cols, offset, device):
    """(rows, cols): each key's column less its query's row plus `offset`: 0 on the
    diagonal a causal mask keeps, aligned to the top left (`offset` 0) or to the
    bottom right (`cols - rows`, as FlashAttention aligns it)."""
    position = torch.arange(rows, device=device)[:, None] + offset
    return torch.arange(cols, device=device)[None, :] - position


def _band(distance, right, left):
    """Where a query may attend a key: its `distance` at most `right` and at least
    `-left`, each bound where it is 0 or more."""
    allowed = torch.ones_like(distance, dtype=torch.bool)
    if right >= 0:
        allowed &= distance <= right
    if left >= 0:
        allowed &= distance >= -left
    return allowed


# The memory-efficient (xformers-derived) and cuDNN attention kernels that SDPA's
# backends call, which nested-tensor SDPA and xformers-style code also call directly:
# queries (batch, sequence, heads, dim) for the memory-efficient one, (batch, heads,
# sequence, dim) for cuDNN's; both over packed sequences (cumulative lengths) too.
def _efficient_attn(q, k, v, bias, dropout_p, mask_type, scale, seqlen_k, window):
    """One batch of memory-efficient attention, (batch, sequence, heads, dim): its
    mask type 0 none, 1 causal from the top left, 2 from the bottom right; `window`
    keys before each query's diagonal at most; keys past `seqlen_k[b]` masked."""
    query, key, value = (t.transpose(1, 2) for t in (q, k, v))
    rows, cols = query.size(2), key.size(2)
    allowed = None
    if mask_type or window:
        offset = cols - rows if mask_type == 2 else 0
        distance = _key_distance(rows, cols, offset, q.device)
        allowed = _band(distance, 0, window - 1 if window else -1)
    if seqlen_k is not None:
        present = torch.arange(cols, device=q.device) < seqlen_k.reshape(-1, 1)
        present = present[:, None, None, :]
        allowed = present if allowed is None else allowed & present
    mask = bias
    if allowed is not None:
        mask = allowed if bias is None else bias.masked_fill(~allowed, float("-inf"))
    (out,) = _attention(query, key, value, mask, dropout_p, False, scale)
    return out.transpose(1, 2)


def _efficient_attn_call(q, k, v, bias, cu_q, cu_k, dropout_p, mask_type, *rest):
    """Memory-efficient attention over a batch, or over the packed sequences of a
    batch of one, (1, tokens, heads, dim), one sequence at a time (without a bias)."""
    if cu_q is None:
        return _efficient_attn(q, k, v, bias, dropout_p, mask_type, *rest)
    scale, _, window = rest
    out = torch.zeros((*q.shape[:-1], v.size(-1)), dtype=q.dtype, device=q.device)
    args = (None, dropout_p, mask_type, scale, None, window)
    for _, q0, q1, k0, k1 in _packed_pairs(cu_q, cu_k, q.size(1), k.size(1)):
        out[:, q0:q1] = _efficient_attn(q[:, q0:q1], k[:, k0:k1], v[:, k0:k1], *args)
    return out


def _aten_efficient_forward(
    query,
    key,
    value,
    bias,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p,
    custom_mask_type,
    compute_log_sumexp=False,
    *,
    scale=None,
    seqlen_k=None,
    window_size=None,
):
    """aten::_efficient_attention_forward (CUDA): the output; the log-sum-exp, seeds
    and sizes stand in."""
    spans = (cu_seqlens_q, cu_seqlens_k, dropout_p, custom_mask_type)
    rest = (scale, seqlen_k, window_size)
    return (_efficient_attn_call(query, key, value, bias, *spans, *rest),)


def _aten_efficient_backward(
    grad_out_,
    query,
    key,
    value,
    bias,
    out,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    logsumexp,
    dropout_p,
    philox_seed,
    philox_offset,
    custom_mask_type,
    bias_requires_grad,
    *,
    scale=None,
    num_splits_key=None,
    window_size=None,
    shared_storage_dqdkdv=False,
):
    """aten::_efficient_attention_backward: its forward again under autograd; the
    grads of query, key, value and the bias (None unless asked and floating)."""
    spans = (cu_seqlens_q, cu_seqlens_k, dropout_p, custom_mask_type)

    def attend(q, k, v, b):
        return _efficient_attn_call(q, k, v, b, *spans, scale, None, window_size)

    asked = bool(bias_requires_grad)
    grads = _attention_grads(attend, grad_out_, query, key, value, bias, asked)
    return grads if asked else grads + (None,)


def _cudnn_attn_call(q, k, v, bias, cum_seq_q, cum_seq_k, dropout_p, causal, scale):
    """cuDNN attention over a batch (batch, heads, sequence, dim), or over packed
    sequences (tokens, heads, dim) cut by cumulative lengths."""
    if cum_seq_q is None:
        return _attention(q, k, v, bias, dropout_p, causal, scale)[0]
    spans = (cum_seq_q, cum_seq_k, dropout_p, causal, scale, (None, None), None)
    return _packed_flash_call(q, k, v, *spans)


def _aten_cudnn_forward(
    query,
    key,
    value,
    attn_bias,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    compute_log_sumexp,
    dropout_p=0.0,
    is_causal=False,
    return_debug_mask=False,
    *,
    scale=None,
):
    """aten::_cudnn_attention_forward (CUDA): the output; the rest stands in."""
    spans = (cum_seq_q, cum_seq_k, dropout_p, is_causal, scale)
    return (_cudnn_attn_call(query, key, value, attn_bias, *spans),)


def _aten_cudnn_backward(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    philox_seed,
    philox_offset,
    attn_bias,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    *,
    scale=None,
):
    """aten::_cudnn_attention_backward: its forward again under autograd."""
    spans = (cum_seq_q, cum_seq_k, dropout_p, is_causal, scale)

    def attend(q, k, v, bias):
        return _cudnn_attn_call(q, k, v, bias, *spans)

    return _attention_grads(attend, grad_out, query, key, value, attn_bias)


# FlashAttention 2's ops (the flash_attn package's torch.library ops, CUDA only, which
# transformers' attn_implementation="flash_attention_2" calls): tensors laid out
# (batch, sequence, heads, head dim), or sequences packed one after another (varlen,
# cu_seqlens). Its causal mask and windows align to the bottom right: query i of sq
# sees key j of sk where i + sk - sq - left <= j <= i + sk - sq + right.
def _flash_attn(
    q, k, v, dropout_p, softmax_scale, causal, window_left, window_right, softcap, alibi
):
    """One batch of FlashAttention: the best kernel this device has where the scores
    are plain (sdpa with the mask), else the scores written out (a soft cap
    `softcap * tanh(s / softcap)`, ALiBi's `-slope * |i + sk - sq - j|`)."""
    query, key, value = (t.transpose(1, 2) for t in (q, k, v))
    rows, cols = query.size(2), key.size(2)
    right = 0 if causal else window_right
    masked = right >= 0 or window_left >= 0
    mask = distance = None
    if masked or alibi is not None:
        distance = _key_distance(rows, cols, cols - rows, q.device)
    if masked:
        mask = _band(distance, right, window_left)
    if not softcap and alibi is None:
        (out,) = _attention(query, key, value, mask, dropout_p, False, softmax_scale)
        return out.transpose(1, 2)
    heads = query.size(1)
    key, value = _grouped_heads(query, key, value)
    scores = (query @ key.transpose(-1, -2)).float() * softmax_scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi is not None:
        slopes = alibi.float().reshape(-1 if alibi.dim() == 1 else alibi.size(0), heads)
        scores = scores - slopes[..., None, None] * distance.abs()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(query.dtype)
    probs = torch.nn.functional.dropout(probs, dropout_p) if dropout_p else probs
    return (probs @ value).transpose(1, 2)


def _flash_attn_forward(
    q,
    k,
    v,
    dropout_p,
    softmax_scale,
    causal,
    window_size_left=-1,
    window_size_right=-1,
    softcap=0.0,
    alibi_slopes=None,
    *rest,
):
    """flash_attn::_flash_attn_forward: out (its log-sum-exp, softmax and RNG state
    stand in: only its own backward reads them)."""
    args = (dropout_p, softmax_scale, causal, window_size_left, window_size_right)
    return (_flash_attn(q, k, v, *args, softcap, alibi_slopes),)


def _packed_spans(cu_seqlens, total):
    """The (start, stop) rows of each packed sequence, from cumulative lengths (kept in
    [0, total] and rising, whatever the replay's values)."""
    bounds = cu_seqlens.clamp(0, total).cummax(0).values.tolist()
    return list(zip(bounds[:-1], bounds[1:], strict=False))


def _packed_pairs(cu_seqlens_q, cu_seqlens_k, rows_q, rows_k):
    """(index, q0, q1, k0, k1): each packed sequence that has queries and keys, its
    rows among the `rows_q` queries and `rows_k` keys. Keys without cumulative lengths
    of their own (None: self-attention) are cut as the queries are."""
    cu_seqlens_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
    spans_q = _packed_spans(cu_seqlens_q, rows_q)
    spans_k = _packed_spans(cu_seqlens_k, rows_k)
    return [
        (index, q0, q1, k0, k1)
        for index, ((q0, q1), (k0, k1)) in enumerate(
            zip(spans_q, spans_k, strict=False)
        )
        if q1 > q0 and k1 > k0
    ]


def _flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi, *args):
    """FlashAttention over packed sequences, one sequence at a time."""
    out = torch.zeros_like(q)
    rows = (q.size(0), k.size(0))
    for index, q0, q1, k0, k1 in _packed_pairs(cu_seqlens_q, cu_seqlens_k, *rows):
        slopes = alibi[index] if alibi is not None and alibi.dim() == 2 else alibi
        one = [t[None] for t in (q[q0:q1], k[k0:k1], v[k0:k1])]
        out[q0:q1] = _flash_attn(*one, *args, slopes)[0]
    return out


def _flash_attn_varlen_forward(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p,
    softmax_scale,
    causal,
    window_size_left=-1,
    window_size_right=-1,
    softcap=0.0,
    alibi_slopes=None,
    *rest,
):
    """flash_attn::_flash_attn_varlen_forward: out, as the batched one."""
    args = (dropout_p, softmax_scale, causal, window_size_left, window_size_right)
    spans = (cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    return (_flash_attn_varlen(q, k, v, *spans, *args, softcap),)


def _flash_attn_grads(forward, dout, q, k, v, out, dq, dk, dv, rows):
    """FlashAttention's backward: the grads of q, k and v written into dq, dk and dv
    (where given), and softmax_d (rowsum(dout * out), float32, heads first, each row
    of sequences padded to `rows` as the kernel lays it out)."""
    grads = _grads_by_autograd(forward, (q, k, v), (dout.to(q.dtype),))
    for target, grad in zip((dq, dk, dv), grads, strict=True):
        if target is not None and grad is not None:
            target.copy_(grad)
    rowsum = (dout.float() * out.float()).sum(-1)  # (batch, seq, heads), (rows, heads)
    softmax_d = rowsum.movedim(-1, 0 if rowsum.dim() == 2 else 1)
    return torch.nn.functional.pad(softmax_d, (0, max(rows - softmax_d.size(-1), 0)))


def _flash_attn_backward(
    dout,
    q,
    k,
    v,
    out,
    softmax_lse,
    dq,
    dk,
    dv,
    dropout_p,
    softmax_scale,
    causal,
    window_size_left=-1,
    window_size_right=-1,
    softcap=0.0,
    alibi_slopes=None,
    *rest,
):
    """flash_attn::_flash_attn_backward: its forward again under autograd."""
    args = (dropout_p, softmax_scale, causal, window_size_left, window_size_right)

    def forward(q, k, v):
        return (_flash_attn(q, k, v, *args, softcap, alibi_slopes),)

    rows = -(-q.size(1) // 128) * 128
    return _flash_attn_grads(forward, dout, q, k, v, out, dq, dk, dv, rows)


def _flash_attn_varlen_backward(
    dout,
    q,
    k,
    v,
    out,
    softmax_lse,
    dq,
    dk,
    dv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p,
    softmax_scale,
    causal,
    window_size_left=-1,
    window_size_right=-1,
    softcap=0.0,
    alibi_slopes=None,
    *rest,
):
    """flash_attn::_flash_attn_varlen_backward: its forward again under autograd."""
    args = (dropout_p, softmax_scale, causal, window_size_left, window_size_right)
    spans = (cu_seqlens_q, cu_seqlens_k, alibi_slopes)

    def forward(q, k, v):
        return (_flash_attn_varlen(q, k, v, *spans, *args, softcap),)

    rows = q.size(0) + 128 * (cu_seqlens_q.numel() - 1)
    return _flash_attn_grads(forward, dout, q, k, v, out, dq, dk, dv, rows)


def _packed_flash_call(
    query, key, value, cum_seq_q, cum_seq_k, dropout_p, causal, scale, window, alibi
):
    """aten's FlashAttention (CUDA): over a batch, (batch, seq, heads, dim), or over
    packed sequences, (tokens, heads, dim) cut by cumulative lengths. `window`: (left,
    right), either None for none, or None (torch's varlen_attn given no window)."""
    scale = query.size(-1) ** -0.5 if scale is None else scale
    left, right = (-1 if w is None else w for w in (window or (None, None)))
    args = (dropout_p, scale, causal, left, right, 0.0)
    if cum_seq_q is None:
        return _flash_attn(query, key, value, *args, alibi)
    return _flash_attn_varlen(query, key, value, cum_seq_q, cum_seq_k, alibi, *args)


def _aten_flash_forward(
    query,
    key,
    value,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    return_debug_mask,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    seqused_k=None,
    alibi_slopes=None,
    **rest,
):
    """aten::_flash_attention_forward (CUDA; SDPA's flash kernel and varlen attention
    call it): the output; the log-sum-exp and seeds stand in."""
    window = (window_size_left, window_size_right)
    spans = (cum_seq_q, cum_seq_k, dropout_p, is_causal, scale, window, alibi_slopes)
    return (_packed_flash_call(query, key, value, *spans),)


def _aten_flash_backward(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    rng_state,
    unused,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    **rest,
):
    """aten::_flash_attention_backward: its forward again under autograd."""
    window = (window_size_left, window_size_right)
    spans = (cum_seq_q, cum_seq_k, dropout_p, is_causal, scale, window, None)

    def attend(q, k, v, bias):
        return _packed_flash_call(q, k, v, *spans)

    return _attention_grads(attend, grad_out, query, key, value)


def _descaled(t, descale, heads_dim):
    """A float8 operand of FlashAttention 3's quantized path in bfloat16 (another
    dtype kept), times its descale: one number, or (batch, kv heads) broadcast over
    heads at `heads_dim` (repeated over each group of query heads); another shape
    (packed sequences') is left unscaled, the same attention."""
    out = t.to(torch.bfloat16) if t.element_size() == 1 else t
    if descale is None:
        return out
    descale = descale.to(torch.float32)
    if descale.numel() == 1:
        return out * descale.reshape(()).to(out.dtype)
    heads = t.size(heads_dim)
    if t.dim() == 4 and descale.dim() == 2 and descale.size(0) == t.size(0):
        if descale.size(1) != heads and heads % descale.size(1) == 0:
            descale = descale.repeat_interleave(heads // descale.size(1), dim=1)
        if descale.size(1) == heads:
            shape = [t.size(0), 1, 1, 1]
            shape[heads_dim] = heads
            return out * descale.reshape(shape).to(out.dtype)
    return out


def _aten_flash_forward_quantized(
    query,
    key,
    value,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    return_debug_mask,
    q_descale,
    k_descale,
    v_descale,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    seqused_k=None,
    alibi_slopes=None,
):
    """aten::_flash_attention_forward.quantized (FlashAttention 3's float8 path,
    CUDA): the operands descaled to bfloat16, then as the unquantized one."""
    q, k, v = (
        _descaled(t, d, 2)
        for t, d in ((query, q_descale), (key, k_descale), (value, v_descale))
    )
    window = (window_size_left, window_size_right)
    spans = (cum_seq_q, cum_seq_k, dropout_p, is_causal, scale, window, alibi_slopes)
    return (_packed_flash_call(q, k, v, *spans),)


def _flash_attention_quantized(
    query,
    key,
    value,
    q_descale,
    k_descale,
    v_descale,
    dropout_p=0.0,
    is_causal=False,
    return_debug_mask=False,
    *,
    scale=None,
):
    """_scaled_dot_product_flash_attention.quantized (float8 SDPA, CUDA), heads
    first: the operands descaled to bfloat16, then attention."""
    q, k, v = (
        _descaled(t, d, 1)
        for t, d in ((query, q_descale), (key, k_descale), (value, v_descale))
    )
    return _attention(q, k, v, None, dropout_p, is_causal, scale)


def _flash_with_lse(q, k, v, causal, scale, left, right):
    """FlashAttention over a batch (batch, sequence, heads, dim), written out to keep
    the log-sum-exp its in-place kernel returns: (the output, (batch, heads, rows) in
    float32). Causal masks and windows align to the bottom right, as flash's do."""
    query, key, value = (t.transpose(1, 2) for t in (q, k, v))
    key, value = _grouped_heads(query, key, value)
    scale = query.size(-1) ** -0.5 if scale is None else scale
    scores = (query @ key.transpose(-1, -2)).float() * scale
    rows, cols = query.size(2), key.size(2)
    right = 0 if causal else (-1 if right is None else right)
    left = -1 if left is None else left
    if right >= 0 or left >= 0:
        distance = _key_distance(rows, cols, cols - rows, q.device)
        scores = scores.masked_fill(~_band(distance, right, left), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num_(0.0)
    return (probs.to(value.dtype) @ value).transpose(1, 2), lse


def _aten_flash_forward_into(
    out,
    query,
    key,
    value,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    return_debug_mask,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    seqused_k=None,
    alibi_slopes=None,
    block_table=None,
    num_splits=None,
):
    """aten::_flash_attention_forward_no_dropout_inplace (CUDA; varlen attention's
    out= variant, for inference): the output written into `out`, and the log-sum-exp,
    (batch, heads, rows), or (heads, tokens) over packed sequences."""
    window = (is_causal, scale, window_size_left, window_size_right)
    if cum_seq_q is None:
        result, lse = _flash_with_lse(query, key, value, *window)
        out.copy_(result)
        return lse
    lse = torch.full(
        (query.size(1), query.size(0)),
        float("-inf"),
        dtype=torch.float32,
        device=query.device,
    )
    rows = (query.size(0), key.size(0))
    for _, q0, q1, k0, k1 in _packed_pairs(cum_seq_q, cum_seq_k, *rows):
        one = [t[None] for t in (query[q0:q1], key[k0:k1], value[k0:k1])]
        result, part = _flash_with_lse(*one, *window)
        out[q0:q1] = result[0]
        lse[:, q0:q1] = part[0]
    return lse


def _varlen_attn_out(
    out,
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    is_causal=False,
    scale=None,
    window_size=None,
    *rest,
):
    """torch_attn::_varlen_attn_out (torch.nn.attention.varlen's out= op, CUDA only):
    the output into `out`; the log-sum-exp returned."""
    left, right = tuple(window_size) if window_size is not None else (None, None)
    return _aten_flash_forward_into(
        out,
        query,
        key,
        value,
        cu_seq_q,
        cu_seq_k,
        max_q,
        max_k,
        0.0,
        is_causal,
        False,
        scale=scale,
        window_size_left=left,
        window_size_right=right,
    )


def _varlen_attn(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    is_causal=False,
    scale=None,
    window_size=None,
    *rest,
):
    """torch_attn::_varlen_attn (torch.nn.attention.varlen, CUDA only): the output
    over packed sequences; the log-sum-exp and seeds stand in."""
    spans = (cu_seq_q, cu_seq_k, 0.0, is_causal, scale, window_size, None)
    return (_packed_flash_call(query, key, value, *spans),)


def _varlen_attn_backward(
    grad_out,
    query,
    key,
    value,
    out,
    lse,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    is_causal,
    rng_state,
    scale=None,
    window_size=None,
    *rest,
):
    """torch_attn::_varlen_attn_backward: its forward again under autograd."""
    spans = (cu_seq_q, cu_seq_k, 0.0, is_causal, scale, window_size, None)

    def attend(q, k, v, bias):
        return _packed_flash_call(q, k, v, *spans)

    return _attention_grads(attend, grad_out, query, key, value)


# SyncBatchNorm's kernels (CUDA only): statistics, their reduction over ranks, the
# normalisation, and its backward, written with reductions and elementwise ops.
def _channels(input):
    """The dimensions a batch norm reduces (all but the channels), and the shape that
    broadcasts a per-channel vector over its input."""
    dims = [d for d in range(input.dim()) if d != 1]
    return dims, [1, -1] + [1] * (input.dim() - 2)


def _batch_norm_stats(input, eps):
    dims, _ = _channels(input)
    var, mean = torch.var_mean(
        input.to(torch.promote_types(input.dtype, torch.float32)),
        dim=dims,
        correction=0,
    )
    return mean, torch.rsqrt(var + eps)


def _batch_norm_gather_stats_with_counts(
    input, mean, invstd, running_mean, running_var, momentum, eps, counts
):
    """Every rank's mean and inverse std (rows), weighted by its element count."""
    counts = counts.to(mean.dtype).reshape(-1, 1)
    total = counts.sum()
    global_mean = (mean * counts).sum(0) / total
    var = (invstd.pow(-2) - eps + (mean - global_mean).pow(2)) * counts
    global_var = var.sum(0) / total
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(global_mean, alpha=momentum)
        if running_var is not None:
            unbiased = global_var * total / (total - 1).clamp(min=1)
            running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
    return global_mean, torch.rsqrt(global_var + eps)


def _batch_norm_gather_stats(
    input, mean, invstd, running_mean, running_var, momentum, eps, count
):
    counts = torch.full((mean.shape[0],), count, dtype=mean.dtype, device=mean.device)
    return _batch_norm_gather_stats_with_counts(
        input, mean, invstd, running_mean, running_var, momentum, eps, counts
    )


def _batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    _, shape = _channels(input)
    out = (input - mean.view(shape)) * invstd.view(shape)
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    return out.to(input.dtype)


def _batch_norm_backward_reduce(
    grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g
):
    """(sum of grad_out, sum of grad_out * (input - mean), the weight's and the
    bias's grads) per channel."""
    dims, shape = _channels(input)
    sum_dy = grad_out.sum(dims)
    sum_dy_xmu = (grad_out * (input - mean.view(shape))).sum(dims)
    return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd, sum_dy


def _batch_norm_backward_elemt(
    grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count
):
    _, shape = _channels(input)
    total = count.sum()
    scale = invstd if weight is None else invstd * weight
    projection = (input - mean.view(shape)) * (invstd.pow(2) * sum_dy_xmu / total).view(
        shape
    )
    grad = (grad_out - (sum_dy / total).view(shape) - projection) * scale.view(shape)
    return grad.to(input.dtype)


def _max_pool2d_backward(
    grad_output, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False
):
    """cuDNN's max-pool backward: the native one, from the indices of the maxima."""
    args = (kernel_size, stride, padding, dilation, ceil_mode)
    _, indices = torch.ops.aten.max_pool2d_with_indices.default(self, *args)
    return torch.ops.aten.max_pool2d_with_indices_backward.default(
        grad_output, self, *args, indices
    )


def _depthwise_convolution(self, weight, kernel_size, bias, stride, padding, dilation):
    """_conv_depthwise2d and conv_depthwise3d: a convolution of one group per channel."""
    return torch.ops.aten.convolution.default(
        self,
        weight,
        bias,
        stride,
        padding,
        dilation,
        False,
        [0] * len(stride),
        self.shape[1],
    )


def _convolution_in_order(self, weight, bias, stride, padding, dilation, groups):
    """aten::convolution of the fused convolutions' arguments (stride before padding,
    unlike cuDNN's plain one: `_convolution_as`)."""
    return torch.ops.aten.convolution.default(
        self, weight, bias, stride, padding, dilation, False, [0] * len(stride), groups
    )


def _convolution_relu(self, weight, bias, stride, padding, dilation, groups):
    """cudnn_convolution_relu and miopen_convolution_relu (a CUDA graph's
    convolution fused with its ReLU: torch.jit.freeze's and torch.fx's conv fusion
    on a GPU): relu(convolution)."""
    out = _convolution_in_order(self, weight, bias, stride, padding, dilation, groups)
    return torch.relu_(out)


def _convolution_add_relu(
    self, weight, z, alpha, bias, stride, padding, dilation, groups
):
    """cudnn_convolution_add_relu and miopen_convolution_add_relu (a residual block's
    convolution, its skip connection and ReLU in one call): relu(conv + alpha * z)."""
    out = _convolution_in_order(self, weight, bias, stride, padding, dilation, groups)
    out = out.add_(z, alpha=1 if alpha is None else alpha)
    return torch.relu_(out)


# cuDNN's spatial transformer kernels (F.grid_sample and F.affine_grid pick them on
# CUDA for a 4-d bilinear, zero-padded sampling with align_corners=True; autograd's
# backward then calls cuDNN's backward): the native kernels with those settings.
def _cudnn_grid_sampler(self, grid):
    """cudnn_grid_sampler: bilinear (0), zeros padding (0), corners aligned."""
    return torch.ops.aten.grid_sampler_2d.default(self, grid, 0, 0, True)


def _cudnn_grid_sampler_backward(self, grid, grad_output):
    """cudnn_grid_sampler_backward: (the input's grad, the grid's)."""
    return torch.ops.aten.grid_sampler_2d_backward.default(
        grad_output, self, grid, 0, 0, True, [True, True]
    )


def _cudnn_affine_grid(theta, N, C, H, W):
    """cudnn_affine_grid_generator: the (N, H, W, 2) sampling grid of theta."""
    return torch.ops.aten.affine_grid_generator.default(theta, [N, C, H, W], True)


def _cudnn_affine_grid_backward(grad, N, C, H, W):
    """cudnn_affine_grid_generator_backward: theta's grad."""
    return torch.ops.aten.affine_grid_generator_backward.default(
        grad, [N, C, H, W], True
    )


# cuDNN's CTC loss (F.ctc_loss picks it on CUDA for float32 log-probabilities, blank
# 0, int32 targets on the host and every input as long as the batch): it returns each
# sequence's loss and, computed in the same pass, their sum's grad, which autograd's
# backward only scales. Inside ctc_loss, which replays as these children so that the
# backward reads that grad (and the replay does the grad's work).
def _use_cudnn_ctc_loss(log_probs, targets, input_lengths, target_lengths, blank):
    """_use_cudnn_ctc_loss: the trace ran cuDNN's loss (its equivalent's here)."""
    return True


def _cudnn_ctc_loss(
    log_probs,
    targets,
    input_lengths,
    target_lengths,
    blank,
    deterministic,
    zero_infinity,
):
    """_cudnn_ctc_loss: (each sequence's loss, the grad of their sum), by the native
    CTC loss and its backward."""
    lengths = (input_lengths, target_lengths)
    if torch.is_tensor(input_lengths):
        forward = torch.ops.aten._ctc_loss.Tensor
        backward = torch.ops.aten._ctc_loss_backward.Tensor
    else:
        forward = torch.ops.aten._ctc_loss.default
        backward = torch.ops.aten._ctc_loss_backward.default
    nll, alpha = forward(log_probs, targets, *lengths, blank, zero_infinity)
    grad = backward(
        torch.ones_like(nll),
        log_probs,
        targets,
        *lengths,
        nll,
        alpha,
        blank,
        zero_infinity,
    )
    return nll, grad


def _fused_rms_norm_backward(
    grad_out, input, normalized_shape, rstd, weight, output_mask
):
    """RMS norm's backward from its saved inverse root mean square."""
    inner = tuple(range(input.dim() - len(normalized_shape), input.dim()))
    normalised = input * rstd
    scaled = grad_out if weight is None else grad_out * weight
    mean = (scaled * normalised).mean(inner, keepdim=True)
    grad_input = (rstd * (scaled - normalised * mean)).to(input.dtype)
    if weight is None:
        return grad_input, None
    outer = tuple(range(input.dim() - len(normalized_shape)))
    return grad_input, (grad_out * normalised).sum(outer).to(weight.dtype)


def _with_out_dtype(op):
    """mm, bmm, addmm and baddbmm with an out_dtype (CUDA only): in the inputs' dtype,
    then cast."""

    def run(*args, **kwargs):
        *rest, out_dtype = args
        return op(*rest, **kwargs).to(out_dtype)

    return run


def _int4_values(packed, rows, cols):
    """The rows x cols 4-bit values (0..15) of a packed int4 weight, two a byte, read
    in row-major order. The kernels tile them otherwise (tinygemm's int32
    [n/8, k/(16*tiles), 32, tiles/2], the CPU kernel's blocks of columns, whose width
    is the capturing CPU's vector width), so this is another int4 weight of the same
    shape: the same dequantization and product, not the kernel's values."""
    data = packed.contiguous().view(torch.uint8).reshape(-1)[: rows * cols // 2]
    return torch.stack((data >> 4, data & 15), -1).reshape(rows, cols)


def _weight_int4pack_mm(self, mat2, qGroupSize, qScaleAndZeros):
    """_weight_int4pack_mm (tinygemm, CUDA: torchao's int4 weight-only linear) and
    its CPU kernel (_for_cpu): self @ w.T, w = (q - 8) * scale + zero per group of
    qGroupSize along k, qScaleAndZeros [k/group, n, 2]."""
    k, n = self.shape[-1], qScaleAndZeros.shape[1]
    q = _int4_values(mat2, n, k).to(self.dtype).sub_(8)
    scale_zero = qScaleAndZeros.to(self.dtype).transpose(0, 1).unsqueeze(2)
    q = q.view(n, k // qGroupSize, qGroupSize)
    w = (q * scale_zero[..., 0] + scale_zero[..., 1]).view(n, k)
    return self @ w.t()


def _weight_int8pack_mm(self, mat2, scales):
    """_weight_int8pack_mm (CPU and MPS: int8 weight-only linear): self @ mat2.T
    scaled per output channel."""
    return (self @ mat2.to(self.dtype).t()) * scales.to(self.dtype)


# 2:4 (semi-structured) sparse GEMMs, CUDA only: CUTLASS's take the kept values
# (rows, cols / 2) and a separate metadata tensor, cuSPARSELt's one buffer holding both
# (torchao's and torch.sparse's 2:4 sparse linear layers, inference and training). The
# metadata's layout is the kernel's own, so the values are placed as the first two of
# each group of four: another 2:4 matrix of the same shape, the same dense product.
def _two_four(values, cols):
    """A (rows, cols) matrix whose every group of four columns holds two of `values`
    (rows, cols / 2), in a dtype the host multiplies (8-bit types as float32)."""
    dtype = values.dtype
    if dtype.itemsize == 1 or not (dtype.is_floating_point or dtype.is_complex):
        dtype = torch.float32
    values = values.reshape(values.shape[0], cols // 4, 2).to(dtype)
    return torch.nn.functional.pad(values, (0, 2)).reshape(values.shape[0], cols)


def _sparse_result(out, dtype, activation=None):
    """A sparse GEMM's result in `dtype`, after its fused activation."""
    if activation == "relu":
        out = torch.relu(out)
    elif activation == "silu":
        out = torch.nn.functional.silu(out)
    if not dtype.is_floating_point and out.is_floating_point():
        info = torch.iinfo(dtype)
        out = out.round().clamp(info.min, info.max)
    return out.to(dtype)


def _sparse_out_dtype(operand, out_dtype):
    """int8 x int8 accumulates to int32 where no out_dtype is given."""
    if out_dtype is not None:
        return out_dtype
    return torch.int32 if operand.dtype == torch.int8 else operand.dtype


def _sparse_semi_structured_linear(
    input, weight, meta, *, bias=None, activation=None, out_dtype=None
):
    """_sparse_semi_structured_linear: activation(input @ W.T + bias), W 2:4 sparse
    (out, in) from its kept values (out, in / 2)."""
    w = _two_four(weight, weight.shape[1] * 2)
    out = input.to(w.dtype) @ w.t()
    if bias is not None:
        out = out + bias.to(out.dtype)
    return _sparse_result(out, _sparse_out_dtype(input, out_dtype), activation)


def _sparse_semi_structured_mm(mat1, mat1_meta, mat2, *, out_dtype=None):
    """_sparse_semi_structured_mm: mat1 (2:4 sparse, its kept values) @ mat2."""
    a = _two_four(mat1, mat2.shape[0])
    return _sparse_result(a @ mat2.to(a.dtype), _sparse_out_dtype(mat2, out_dtype))


def _sparse_semi_structured_addmm(
    input, mat1, mat1_meta, mat2, *, alpha=1, beta=1, out_dtype=None
):
    """_sparse_semi_structured_addmm: beta * input + alpha * mat1 @ mat2."""
    a = _two_four(mat1, mat2.shape[0])
    out = torch.addmm(input.to(a.dtype), a, mat2.to(a.dtype), beta=beta, alpha=alpha)
    return _sparse_result(out, _sparse_out_dtype(mat2, out_dtype))


def _cslt_rows(compressed_A, k):
    """The rows of cuSPARSELt's compressed matrix: a 2-d buffer's rows (torch.sparse's
    view of it), else from its size: per row, k / 2 values and 2 bits of metadata per
    value kept."""
    if compressed_A.dim() == 2:
        return compressed_A.shape[0]
    size = compressed_A.element_size()
    return round(compressed_A.numel() * size * 8 / (k * (4 * size + 1)))


def _cslt_sparse_mm(
    compressed_A,
    dense_B,
    bias=None,
    alpha=None,
    out_dtype=None,
    transpose_result=False,
    alg_id=0,
    split_k=1,
    split_k_mode=-1,
):
    """_cslt_sparse_mm (cuSPARSELt): alpha * A @ B + bias (bias per row of A), A 2:4
    sparse (m, k); transposed where asked."""
    k = dense_B.shape[0]
    m = _cslt_rows(compressed_A, k)
    values = compressed_A.reshape(-1)[: m * k // 2]
    a = _two_four(values.reshape(m, k // 2), k)
    out = a @ dense_B.to(a.dtype)
    if alpha is not None:
        alpha = alpha.to(out.dtype)
        out = out * (alpha.reshape(-1, 1) if alpha.numel() == m else alpha)
    if bias is not None:
        out = out + bias.to(out.dtype).reshape(-1, 1)
    out = _sparse_result(out, out_dtype or dense_B.dtype)
    return out.t().contiguous() if transpose_result else out


def _mixed_dtypes_linear(input, weight, scale, *, bias=None, activation=None):
    """_mixed_dtypes_linear (CUTLASS, CUDA): input (half or bfloat16) @ W * scale per
    output column, W (k, n) int8, or int4 two a byte (uint8 (k, n / 2)), in the
    kernel's reordered layout, read here in row-major order (another weight of the same
    shape, the same dequantization and product)."""
    k, n = input.shape[-1], scale.numel()
    if weight.dtype == torch.uint8 and weight.numel() * 2 == k * n:
        w = _int4_values(weight, k, n).to(input.dtype).sub_(8)
    else:
        w = weight.reshape(k, n).to(input.dtype)
    out = input @ (w * scale.to(input.dtype))
    if bias is not None:
        out = out + bias.to(out.dtype)
    return _sparse_result(out, input.dtype, activation)


def _f8f8bf16_rowwise(
    XQ, WQ, x_scale, w_scale, bias=None, use_fast_accum=True, output=None
):
    """MSLK's (formerly fbgemm_gpu's) rowwise-scaled float8 GEMM, which torchao's
    float8 dynamic quantization calls on CUDA: XQ @ WQ.T in float32, scaled per row of
    each, plus bias, in bfloat16; written into ``output`` where one is given."""
    result = XQ.to(torch.float32) @ WQ.to(torch.float32).t()
    result = result * x_scale.to(torch.float32).reshape(-1, 1)
    result = result * w_scale.to(torch.float32).reshape(1, -1)
    if bias is not None:
        result = result + bias.to(torch.float32)
    if output is not None:
        return output.copy_(result)
    return result.to(torch.bfloat16)


def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    """_grouped_mm (a mixture of experts' experts in one GEMM; CUDA before sm80 and
    CPU before torch 2.9 lack it) as one matmul per group, the groups ending at
    `offs` along the dimension they split: 2-D x 3-D the rows of self, 2-D x 2-D the
    inner dimension (a weight's grad per group), 3-D x 2-D the columns of mat2."""
    dtype = out_dtype or self.dtype
    if self.dim() == 3 and mat2.dim() == 3:
        out = torch.bmm(self, mat2)
    else:
        ends = [int(e) for e in offs.tolist()]
        starts = [0, *ends[:-1]]
        if self.dim() == 2 and mat2.dim() == 3:
            out = self.new_zeros(self.shape[0], mat2.shape[-1])
            for g, (start, end) in enumerate(zip(starts, ends, strict=True)):
                out[start:end] = self[start:end] @ mat2[g]
        elif self.dim() == 2:
            out = torch.stack(
                [self[:, s:e] @ mat2[s:e] for s, e in zip(starts, ends, strict=True)]
            )
        else:
            out = mat2.new_zeros(self.shape[1], mat2.shape[-1])
            for g, (start, end) in enumerate(zip(starts, ends, strict=True)):
                out[:, start:end] = self[g] @ mat2[:, start:end]
    if bias is not None:
        out = out + bias
    return out.to(dtype)


def _scaled_grouped_mm(
    self,
    mat2,
    scale_a,
    scale_b,
    offs=None,
    bias=None,
    scale_result=None,
    out_dtype=None,
    use_fast_accum=False,
):
    """_scaled_grouped_mm (float8 experts, CUDA sm90+ only: torchao's float8 MoE
    training) as `_grouped_mm` on the operands in bfloat16, scaled per row of self
    and per column of mat2 where the scales are rowwise, as the kernel scales them."""
    a, b = self.to(torch.bfloat16), mat2.to(torch.bfloat16)
    out = _grouped_mm(a, b, offs, None, torch.float32)
    rows, columns = out.shape[-2], out.shape[-1]
    if scale_a.numel() == out.shape[:-1].numel():
        out = out * scale_a.to(torch.float32).reshape(*out.shape[:-1], 1)
    if scale_b.numel() == columns * (b.shape[0] if b.dim() == 3 else 1):
        per_group = scale_b.to(torch.float32).reshape(-1, columns)
        if per_group.shape[0] == 1:
            out = out * per_group[0]
        elif a.dim() == 2 and offs is not None:  # each row scaled by its group's
            positions = torch.arange(rows, device=out.device)
            group = torch.searchsorted(offs.to(torch.int64), positions, right=True)
            out = out * per_group[group.clamp(max=per_group.shape[0] - 1)]
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(out_dtype or torch.bfloat16)


def _scaled_grouped_mm_v2(
    self,
    mat2,
    scale_a,
    recipe_a,
    swizzle_a,
    scale_b,
    recipe_b,
    swizzle_b,
    offs=None,
    bias=None,
    out_dtype=None,
    contraction_dim=(),
    use_fast_accum=False,
):
    """_scaled_grouped_mm_v2 (F.scaled_grouped_mm, CUDA only: scales as lists with
    their recipes) as `_scaled_grouped_mm` on the first scale of each: rowwise scales
    apply as the kernel applies them; block scales (MX, swizzled) leave the product
    unscaled, the same grouped GEMM."""
    first_a = scale_a[0] if scale_a else self.new_ones(())
    first_b = scale_b[0] if scale_b else mat2.new_ones(())
    return _scaled_grouped_mm(
        self, mat2, first_a, first_b, offs, bias, None, out_dtype, use_fast_accum
    )


def _lstm_gates(input_gates, hidden_gates, input_bias, hidden_bias):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    return i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()


def _fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """_thnn_fused_lstm_cell: (hy, cy, the activated gates as its workspace)."""
    i, f, g, o = _lstm_gates(input_gates, hidden_gates, input_bias, hidden_bias)
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def _fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """_thnn_fused_lstm_cell_backward_impl: (the gates' grad, cx's, the bias's)."""
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_hy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        grad_c = grad_c + grad_cy
    grad_gates = torch.cat(
        [
            grad_c * g * i * (1 - i),
            grad_c * cx * f * (1 - f),
            grad_c * i * (1 - g * g),
            grad_hy * tanh_cy * o * (1 - o),
        ],
        1,
    )
    return grad_gates, grad_c * f, grad_gates.sum(0) if has_bias else None


def _fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """_thnn_fused_gru_cell: (hy, its workspace r, z, n, hx and the hidden n gate)."""
    if input_bias is not None:
        input_gates = input_gates + input_bias
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def _fused_gru_cell_backward(grad_hy, workspace, has_bias):
    """_thnn_fused_gru_cell_backward: the input and hidden gates' grads, hx's, and
    the two biases'."""
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * r * (1 - r)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_input = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden = torch.cat([grad_r, grad_z, grad_n * r], 1)
    if not has_bias:
        return grad_input, grad_hidden, grad_hy * z, None, None
    return grad_input, grad_hidden, grad_hy * z, grad_input.sum(0), grad_hidden.sum(0)


def _fused_dropout(self, p, generator=None):
    """_fused_dropout: p is the probability to keep; its mask is bytes."""
    out, mask = torch.ops.aten.native_dropout.default(self, 1 - p, True)
    return out, mask.to(torch.uint8)


def _masked_scale(self, mask, scale):
    return self * mask * scale


# cuDNN's and MIOpen's recurrent networks: their weights are the module's flat list (a
# layer's w_ih, w_hh, then b_ih, b_hh and w_hr where it has them); `mode` is 0 for a
# ReLU RNN, 1 for tanh, 2 for an LSTM, 3 for a GRU.
def _rnn(
    input,
    weight,
    weight_stride0,
    hx,
    cx,
    mode,
    num_layers,
    batch_first,
    dropout,
    train,
    bidirectional,
    batch_sizes,
):
    """The network through torch's portable kernels: (output, hy[, cy])."""
    run = (torch._VF.rnn_relu, torch._VF.rnn_tanh, torch._VF.lstm, torch._VF.gru)[mode]
    hidden = (hx, cx) if mode == 2 else hx
    has_biases = weight_stride0 >= 4
    if batch_sizes:  # a packed sequence
        sizes = torch.tensor(list(batch_sizes), dtype=torch.int64)
        return run(
            input,
            sizes,
            hidden,
            weight,
            has_biases,
            num_layers,
            dropout,
            train,
            bidirectional,
        )
    return run(
        input,
        hidden,
        weight,
        has_biases,
        num_layers,
        dropout,
        train,
        bidirectional,
        batch_first,
    )


def _cudnn_rnn(
    input,
    weight,
    weight_stride0,
    weight_buf,
    hx,
    cx,
    mode,
    hidden_size,
    proj_size,
    num_layers,
    batch_first,
    dropout,
    train,
    bidirectional,
    batch_sizes,
    dropout_state,
):
    """_cudnn_rnn: output, hy and cy; its reserve and weight buffer stand in."""
    return tuple(
        _rnn(
            input,
            weight,
            weight_stride0,
            hx,
            cx,
            mode,
            num_layers,
            batch_first,
            dropout,
            train,
            bidirectional,
            batch_sizes,
        )
    )


def _miopen_rnn(input, weight, weight_stride0, hx, cx, mode, hidden_size, *rest):
    """miopen_rnn: _cudnn_rnn's arguments less its weight buffer and projection."""
    return _cudnn_rnn(
        input, weight, weight_stride0, None, hx, cx, mode, hidden_size, 0, *rest
    )


def _cudnn_rnn_backward(
    input,
    weight,
    weight_stride0,
    weight_buf,
    hx,
    cx,
    output,
    grad_output,
    grad_hy,
    grad_cy,
    mode,
    hidden_size,
    proj_size,
    num_layers,
    batch_first,
    dropout,
    train,
    bidirectional,
    batch_sizes,
    dropout_state,
    reserve,
    output_mask,
):
    """The network's forward again, then autograd's backward: (the input's grad,
    hx's, cx's, the weights')."""
    hidden = [hx] if cx is None else [hx, cx]

    def forward(x, *rest):
        states, weights = rest[: len(hidden)], list(rest[len(hidden) :])
        c = states[1] if cx is not None else None
        return _rnn(
            x,
            weights,
            weight_stride0,
            states[0],
            c,
            mode,
            num_layers,
            batch_first,
            dropout,
            train,
            bidirectional,
            batch_sizes,
        )

    grads = _grads_by_autograd(
        forward, [input, *hidden, *weight], (grad_output, grad_hy, grad_cy)
    )
    grad_cx = grads[2] if cx is not None else None
    return grads[0], grads[1], grad_cx, list(grads[1 + len(hidden) :])


def _miopen_rnn_backward(*args):
    """miopen_rnn_backward: _cudnn_rnn_backward's arguments less its projection."""
    return _cudnn_rnn_backward(*args[:12], 0, *args[12:])


def _mkldnn_rnn_layer(
    input,
    weight0,
    weight1,
    weight2,
    weight3,
    hx_,
    cx_,
    reverse,
    batch_sizes,
    mode,
    hidden_size,
    num_layers,
    has_biases,
    bidirectional,
    batch_first,
    train,
):
    """oneDNN's LSTM layer on the host (one layer, one direction; hx_ and cx_ are
    batch x hidden): output, hy and cy; its workspace stands in. The layer's input
    is time-major whatever ``batch_first`` says: ``aten::mkldnn_rnn`` transposes a
    batch-first input before it calls the layer, which ignores the flag."""
    weights = [weight0, weight1] + ([weight2, weight3] if has_biases else [])
    out, hy, cy = torch._VF.lstm(
        input.flip(0) if reverse else input,
        (hx_.unsqueeze(0), cx_.unsqueeze(0)),
        weights,
        has_biases,
        1,
        0.0,
        train,
        False,
        False,
    )
    return (out.flip(0) if reverse else out), hy[0], cy[0]


def _mkldnn_rnn_layer_backward(
    input,
    weight1,
    weight2,
    weight3,
    weight4,
    hx_,
    cx_tmp,
    output,
    hy_,
    cy_,
    grad_output,
    grad_hy,
    grad_cy,
    reverse,
    mode,
    hidden_size,
    num_layers,
    has_biases,
    train,
    bidirectional,
    batch_sizes,
    batch_first,
    workspace,
):
    """The layer again, then autograd's backward: the grads of input, the four
    weights, hx_ and cx_tmp."""

    def forward(*tensors):
        flags = (reverse, batch_sizes, mode, hidden_size, 1, has_biases, False)
        return _mkldnn_rnn_layer(*tensors, *flags, batch_first, train)

    return _grads_by_autograd(
        forward,
        (input, weight1, weight2, weight3, weight4, hx_, cx_tmp),
        (grad_output, grad_hy, grad_cy),
    )


def _pinned(self, device=None):
    """pin_memory without an accelerator: the copy, into pageable memory."""
    return self.clone()


# Kernels of libraries outside torch (torchvision's C++ ops, registered when the model
# imported the library; the benchmark does not), written with torch ops where the
# result's shape does not depend on values. Replayed as their recorded children, such
# ops cost almost nothing: those are only the kernel's allocations (Mask R-CNN's
# roi_align forward and backward were a fifth of its training step, missing).
def _roi_align_axis(start, length, bins, size, sampling_ratio):
    """Along one axis of each region: the sample points' lower and upper pixel, their
    bilinear weights, which samples count, and each region's samples per bin, as
    torchvision's kernel places them (points outside [-1, size] count as zero)."""
    step = length / bins
    if sampling_ratio > 0:
        grid = torch.full_like(step, sampling_ratio)
        most = sampling_ratio
    else:  # adaptive: ceil(bin size) samples, so regions differ; the rest weigh 0
        grid = torch.ceil(step)
        most = max(int(grid.max()), 1) if grid.numel() else 1
    bins_at = torch.arange(bins, device=step.device, dtype=step.dtype)[:, None]
    samples = torch.arange(most, device=step.device, dtype=step.dtype)[None, :]
    at = start[:, None, None] + step[:, None, None] * (
        bins_at + (samples + 0.5) / grid.clamp(min=1)[:, None, None]
    )
    used = (samples < grid[:, None, None]) & (at >= -1.0) & (at <= size)
    at = at.clamp(min=0)
    low = at.floor().clamp(max=size - 1)
    edge = low >= size - 1
    high = torch.where(edge, low, low + 1)
    frac = torch.where(edge, torch.zeros_like(at), at - low)
    return low.long(), high.long(), 1 - frac, frac, used, grid


def _roi_align(
    input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
):
    """torchvision::roi_align: each output bin is a weighted sum of the feature map's
    pixels around its sample points, so one embedding_bag (a bag per bin, four
    corners per sample, bilinear weights over the sample count) computes torchvision's
    result, without a temporary per sample and channel."""
    num_images, channels, height, width = input.shape
    count = rois.shape[0]
    if count == 0 or input.numel() == 0:
        return input.new_zeros(count, channels, pooled_height, pooled_width)
    boxes = rois[:, 1:5].to(input.dtype) * spatial_scale - (0.5 if aligned else 0.0)
    x1, y1, x2, y2 = boxes.unbind(1)
    roi_w, roi_h = x2 - x1, y2 - y1
    if not aligned:
        roi_w, roi_h = roi_w.clamp(min=1.0), roi_h.clamp(min=1.0)
    y_low, y_high, y_w0, y_w1, y_used, y_grid = _roi_align_axis(
        y1, roi_h, pooled_height, height, sampling_ratio
    )
    x_low, x_high, x_w0, x_w1, x_used, x_grid = _roi_align_axis(
        x1, roi_w, pooled_width, width, sampling_ratio
    )
    first = rois[:, 0].to(torch.long).clamp(0, num_images - 1) * (height * width)
    # (region, bin row, sample row) and (region, bin col, sample col), broadcast to
    # (region, bin row, sample row, bin col, sample col)
    rows, cols = (..., None, None), (slice(None), None, None, ...)
    share = (y_used[rows] & x_used[cols]).to(input.dtype)
    share = share / (y_grid * x_grid).clamp(min=1)[:, None, None, None, None]
    places, weights = [], []
    for row, row_weight in ((y_low, y_w0), (y_high, y_w1)):
        for col, col_weight in ((x_low, x_w0), (x_high, x_w1)):
            pixel = row[rows] * width + col[cols]
            places.append(first[:, None, None, None, None] + pixel)
            weights.append(row_weight[rows] * col_weight[cols] * share)
    # (region, bin row, sample row, bin col, sample col, corner) -> a bag per bin
    order = (0, 1, 3, 2, 4, 5)
    bags = count * pooled_height * pooled_width
    pooled = torch.nn.functional.embedding_bag(
        torch.stack(places, -1).permute(order).reshape(bags, -1),
        input.permute(0, 2, 3, 1).reshape(-1, channels),
        mode="sum",
        per_sample_weights=torch.stack(weights, -1).permute(order).reshape(bags, -1),
    )
    pooled = pooled.view(count, pooled_height, pooled_width, channels)
    return pooled.permute(0, 3, 1, 2).contiguous()


def _box_overlaps(boxes, others, iou_threshold):
    """Whether each of `boxes` overlaps each of `others` by more than the threshold
    (intersection over union, as torchvision's nms measures it)."""
    x1, y1, x2, y2 = boxes[:, None].unbind(-1)
    u1, v1, u2, v2 = others.unbind(-1)
    inter = (torch.minimum(x2, u2) - torch.maximum(x1, u1)).clamp(min=0) * (
        torch.minimum(y2, v2) - torch.maximum(y1, v1)
    ).clamp(min=0)
    union = (x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - inter
    return inter / union > iou_threshold


NMS_BLOCK = 256  # boxes settled at once: overlaps computed for kept boxes only, mostly


def _nms(dets, scores, iou_threshold):
    """torchvision::nms: the boxes greedy non-maximum suppression keeps, best score
    first, settled a block of boxes at a time. In a block, a box is kept where it
    survived the earlier blocks and no kept box of the block with a higher score
    overlaps it: that holds for the greedy result and no other set, so applying it to
    the block until nothing changes reaches it (in as many passes as its longest chain
    of suppressions). The block's kept boxes then suppress the later ones."""
    order = scores.argsort(descending=True, stable=True)
    boxes = dets[order]
    keep = torch.ones(len(order), dtype=torch.bool, device=dets.device)
    for start in range(0, len(order), NMS_BLOCK):
        block = boxes[start : start + NMS_BLOCK]
        alive = keep[start : start + NMS_BLOCK]
        overlaps = _box_overlaps(block, block, iou_threshold).triu_(1)
        kept = alive
        while True:
            settled = alive & ~(overlaps & kept[:, None]).any(0)
            if torch.equal(settled, kept):
                break
            kept = settled
        keep[start : start + NMS_BLOCK] = kept
        later = boxes[start + NMS_BLOCK :]
        if len(later):
            keep[start + NMS_BLOCK :] &= ~_box_overlaps(
                block[kept], later, iou_threshold
            ).any(0)
    return order[keep]


def _rnnt_loss(
    logits, targets, logit_lengths, target_lengths, blank, clamp, fused_log_softmax
):
    """torchaudio::rnnt_loss (and rnnt_loss_forward, the autograd Function's call): the
    RNN-T loss of each sequence and its gradient with respect to the logits, as
    torchaudio's CPU kernel computes them (cpu_kernels.h). The forward variables alpha
    and the backward ones beta run over the (time, label) lattice one time step at a
    time; within a step, the label recursion ``a[u] = logaddexp(x[u], a[u - 1] +
    emit[u - 1])`` is a cumulative log-sum-exp after the emissions' running sum is
    taken off, so a step is a few whole-row ops. Lengths outside the lattice are
    clamped into it (a filled length the kernel would refuse), targets wrapped into the
    classes. The gradients are computed whether or not the logits require them (the
    kernel skips them where they do not, as in no training step)."""
    batch, frames, labels, classes = logits.shape
    work = logits.float()
    lp = work.log_softmax(-1) if fused_log_softmax else work
    blank = blank % classes
    targets = targets.long().remainder(classes)[:, : labels - 1]
    t_len = logit_lengths.long().clamp(1, frames)
    u_len = target_lengths.long().clamp(0, labels - 1)
    blank_lp = lp[..., blank]  # (B, T, U + 1)
    emit = torch.zeros_like(blank_lp)
    if labels > 1:
        index = targets[:, None, :, None].expand(batch, frames, labels - 1, 1)
        emit[..., :-1] = lp[..., :-1, :].gather(-1, index).squeeze(-1)
    # emissions' running sums before each label: S[u] = emit[0] + ... + emit[u - 1]
    before = torch.cat(
        [emit.new_zeros(batch, frames, 1), emit[..., :-1].cumsum(-1)], -1
    )
    ninf = float("-inf")
    positions = torch.arange(labels, device=logits.device)
    steps = torch.arange(frames, device=logits.device)
    alpha = torch.empty_like(blank_lp)
    start = torch.full((batch, labels), ninf, device=logits.device)
    start[:, 0] = 0.0
    x = start
    for t in range(frames):
        if t:
            x = alpha[:, t - 1] + blank_lp[:, t - 1]
        alpha[:, t] = before[:, t] + (x - before[:, t]).logcumsumexp(-1)
    # beta, from each sequence's end: one blank after its last frame and label
    end = torch.where(positions[None] == u_len[:, None], 0.0, ninf)
    beta = torch.empty_like(blank_lp)
    after = torch.full((batch, labels), ninf, device=logits.device)
    for t in reversed(range(frames)):
        following = torch.where((t + 1 == t_len)[:, None], end, after)
        x = torch.where((t < t_len)[:, None], following + blank_lp[:, t], ninf)
        x = x.masked_fill(positions[None] > u_len[:, None], ninf)
        row = (x + before[:, t]).flip(-1).logcumsumexp(-1).flip(-1) - before[:, t]
        beta[:, t] = row
        after = row
    log_z = beta[:, 0, 0]
    costs = -log_z
    # gradients: each node's occupancy times the softmax, less the flow of the blank
    # and label transitions out of it (w.r.t. log-probabilities: those flows only)
    valid = (steps[None, :, None] < t_len[:, None, None]) & (
        positions[None, None] <= u_len[:, None, None]
    )
    occupancy = (alpha - log_z[:, None, None]).masked_fill(~valid, ninf)
    next_beta = torch.cat([beta[:, 1:], beta.new_full((batch, 1, labels), ninf)], 1)
    final = (steps[None, :, None] + 1 == t_len[:, None, None]) & (
        positions[None, None] == u_len[:, None, None]
    )
    next_beta = torch.where(final, 0.0, next_beta)
    blank_flow = (occupancy + blank_lp + next_beta).exp()
    skip_beta = torch.cat([beta[..., 1:], beta.new_full((batch, frames, 1), ninf)], -1)
    skip_beta = skip_beta.masked_fill(
        positions[None, None] >= u_len[:, None, None], ninf
    )
    label_flow = (occupancy + emit + skip_beta).exp()
    if fused_log_softmax:
        grads = (lp + (occupancy + beta)[..., None]).exp()
    else:
        grads = torch.zeros_like(lp)
    grads[..., blank] -= blank_flow
    if labels > 1:
        grads[..., :-1, :].scatter_add_(-1, index, -label_flow[..., :-1, None])
    if clamp > 0:
        grads = grads.clamp(-clamp, clamp)
    return costs.to(logits.dtype), grads.to(logits.dtype)


IIR_CHUNK = 64  # samples a recurrence settles at once: a matmul, then one state step


def _recurrence(x, lags, history):
    """y[i] = x[i] - sum_j lags[..., j - 1] * y[i - j] (j = 1..p) along the last dim of x
    (batch, channels, n), lags (channels, p), history (batch, channels, p) the outputs
    before the first, oldest first. Exactly, in O(log n) steps where the C++ loop takes
    n: the responses over a chunk to a unit input (the impulse response h) and to each
    unit past output (F) by doubling; each chunk's response to its own input a Toeplitz
    matmul of h, all chunks at once; the state (its last p outputs) carried from chunk
    to chunk by a doubling scan of s' = M s + q."""
    batch, channels, n = x.shape
    p = lags.shape[-1]
    dtype, device = x.dtype, x.device
    coeffs = lags.to(dtype)

    def state(seq):  # the last p values of (..., m) sequences, lag 1 first
        return seq[..., seq.shape[-1] - p :].flip(-1)

    # over m samples: h (channels, m), F (channels, m, p), from a single sample
    h = torch.ones(channels, 1, dtype=dtype, device=device)
    f = -coeffs[:, None, :]
    # past outputs, oldest first
    units = torch.eye(p, dtype=dtype, device=device).flip(-1)
    size = 1
    while size < max(IIR_CHUNK, p):
        # the sequences with the past outputs before them: zeros for h, units for F
        past_h = torch.cat([h.new_zeros(channels, p), h], -1)
        past_f = torch.cat([units.T.expand(channels, p, p), f.transpose(1, 2)], -1)
        s_h = state(past_h)  # (channels, p)
        s_f = state(past_f)  # (channels, p: column j, p: lag)
        h = torch.cat([h, torch.einsum("cmj,cj->cm", f, s_h)], -1)
        f = torch.cat([f, torch.einsum("cmi,cji->cmj", f, s_f)], 1)
        size *= 2
    chunks = -(-n // size)
    x = torch.nn.functional.pad(x, (0, chunks * size - n)).view(
        batch, channels, chunks, size
    )
    lag = torch.arange(size, device=device)
    steps = lag[:, None] - lag[None]
    toeplitz = h[:, steps.clamp(min=0)] * (steps >= 0)  # (channels, size, size)
    own = torch.einsum("bckq,cmq->bckm", x, toeplitz)
    if p:
        # M[c, i, j]: lag i + 1 after a chunk, from lag j + 1
        move = f[:, size - p :].flip(1)
        carried = state(own)  # (batch, channels, chunks, p)
        start = history.to(dtype).flip(-1)
        carried[:, :, 0] += torch.einsum("cij,bcj->bci", move, start)
        span = 1
        while span < chunks:
            carried = torch.cat(
                [
                    carried[:, :, :span],
                    carried[:, :, span:]
                    + torch.einsum("cij,bckj->bcki", move, carried[:, :, :-span]),
                ],
                2,
            )
            move = move @ move
            span *= 2
        states = torch.cat([start[:, :, None], carried[:, :, :-1]], 2)
        own = own + torch.einsum("cmj,bckj->bckm", f, states)
    return own.reshape(batch, channels, chunks * size)[..., :n]


def _lfilter_core_loop(input_signal_windows, a_coeff_flipped, padded_output_waveform):
    """torchaudio::_lfilter_core_loop: lfilter's IIR part, sample by sample in C++
    (out[i + n - 1] = x[i] - out[i : i + n] . a_flipped, reading the slot it writes as
    it was), as one linear recurrence solved a chunk at a time (_recurrence)."""
    n = a_coeff_flipped.shape[-1]
    out = padded_output_waveform
    x = input_signal_windows - out[..., n - 1 :] * a_coeff_flipped[:, -1:].to(out.dtype)
    lags = a_coeff_flipped[:, :-1].flip(-1)  # lag 1 first
    out[..., n - 1 :] = _recurrence(x.to(out.dtype), lags, out[..., : n - 1])


def _overdrive_core_loop(waveform, temp, last_in, last_out, output_waveform):
    """torchaudio::_overdrive_core_loop: a first-order high-pass of the clipped signal
    (out[i] = temp[i] - temp[i - 1] + 0.995 out[i - 1]) mixed with the input, written
    where the C++ loop writes it, last_in and last_out left at the last sample's."""
    before = torch.cat([last_in[:, None], temp[:, :-1]], 1)
    lags = torch.full((1, 1), -0.995, dtype=temp.dtype, device=temp.device)
    high = _recurrence((temp - before)[:, None], lags, last_out[:, None, None])[:, 0]
    output_waveform.copy_(waveform * 0.5 + high * 0.75)
    last_in.copy_(temp[:, -1])
    last_out.copy_(high[:, -1])


def _deform_conv2d(
    input,
    weight,
    offset,
    mask,
    bias,
    stride_h,
    stride_w,
    pad_h,
    pad_w,
    dilation_h,
    dilation_w,
    groups,
    offset_groups,
    use_mask,
):
    """torchvision::deform_conv2d: each kernel tap samples the input bilinearly at its
    place plus a learned offset (zero outside the map, as torchvision's kernel reads
    it: grid_sample), weighted by the mask, and the taps' columns meet the weight in
    one grouped matmul."""
    batch, channels, height, width = input.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    taps = kernel_h * kernel_w
    out_h, out_w = offset.shape[-2:]
    offset_groups = max(offset_groups, 1)
    # Each offset group's taps: (dy, dx) pairs, tap-major, then the output position.
    moved = offset.reshape(batch * offset_groups, taps, 2, out_h, out_w)
    tap_y = torch.arange(kernel_h, device=input.device).repeat_interleave(kernel_w)
    tap_x = torch.arange(kernel_w, device=input.device).repeat(kernel_h)
    rows = torch.arange(out_h, device=input.device) * stride_h - pad_h
    cols = torch.arange(out_w, device=input.device) * stride_w - pad_w
    at_y = (rows[None, :, None] + (tap_y * dilation_h)[:, None, None]).to(offset.dtype)
    at_x = (cols[None, None, :] + (tap_x * dilation_w)[:, None, None]).to(offset.dtype)
    y = at_y + moved[:, :, 0]  # (batch * offset groups, taps, out_h, out_w)
    x = at_x + moved[:, :, 1]
    grid = torch.stack(((2 * x + 1) / width - 1, (2 * y + 1) / height - 1), dim=-1)
    sampled = torch.nn.functional.grid_sample(
        input.reshape(batch * offset_groups, channels // offset_groups, height, width),
        grid.reshape(batch * offset_groups, taps * out_h, out_w, 2).to(input.dtype),
        mode="bilinear",
        padding_mode="zeros",
        align_corners=False,
    ).reshape(batch, offset_groups, channels // offset_groups, taps, out_h, out_w)
    if use_mask:
        weights = mask.reshape(batch, offset_groups, 1, taps, out_h, out_w)
        sampled = sampled * weights.to(sampled.dtype)
    columns = sampled.reshape(batch, groups, channels // groups * taps, out_h * out_w)
    kernel = weight.reshape(groups, out_channels // groups, -1)
    out = torch.einsum("gok,bgkl->bgol", kernel, columns)
    out = out.reshape(batch, out_channels, out_h, out_w)
    return out + bias.reshape(1, -1, 1, 1) if bias is not None else out


def _deform_conv2d_backward(grad, input, weight, offset, mask, bias, *args):
    """torchvision::_deform_conv2d_backward: the grads of input, weight, offset, mask
    and bias, the forward again under autograd (zeros where one has none)."""
    inputs = (input, weight, offset, mask, bias)
    grads = _grads_by_autograd(
        lambda *tensors: (_deform_conv2d(*tensors, *args),), inputs, (grad,)
    )
    return tuple(
        torch.zeros_like(tensor) if found is None else found
        for tensor, found in zip(inputs, grads, strict=True)
    )


def _roi_align_backward(
    grad,
    rois,
    spatial_scale,
    pooled_height,
    pooled_width,
    batch_size,
    channels,
    height,
    width,
    sampling_ratio,
    aligned,
):
    """torchvision::_roi_align_backward: the forward's weighted sums scattered back
    (embedding_bag's backward), the forward again under autograd."""
    shape = (rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    zeros = grad.new_zeros(batch_size, channels, height, width)
    if grad.numel() == 0 or zeros.numel() == 0:  # no regions: nothing to scatter
        return zeros
    (grad_input,) = _grads_by_autograd(
        lambda input: (_roi_align(input, *shape),), (zeros,), (grad,)
    )
    return grad_input


# fbgemm_gpu's jagged-tensor and table-batched embedding (TBE) kernels: TorchRec's
# KeyedJaggedTensor and sharded EmbeddingBagCollection, and DLRM's embedding work. Where
# fbgemm_gpu is not loaded (a torch-only benchmark, always), these do the same work with
# torch ops. A TBE holds every table in one flat buffer: table t's rows start at element
# weights_offsets[t], hold D_offsets[t + 1] - D_offsets[t] columns, and number
# hash_size_cumsum[t + 1] - hash_size_cumsum[t]; indices are rows within each table, and
# offsets (T * B + 1, table-major) cut them into one bag per table and sample.
TBE_POOLING = {0: "sum", 1: "mean", 2: None}  # fbgemm's PoolingMode (2: no pooling)
TBE_OUTPUT_DTYPES = {
    0: torch.float32,
    1: torch.float16,
    5: torch.bfloat16,
}  # SparseType


def _complete_cumsum(t_in):
    """fbgemm::asynchronous_complete_cumsum: the running sum along the last dim with a 0
    before it (jagged lengths' offsets), one longer than its input."""
    out = t_in.new_zeros(*t_in.shape[:-1], t_in.shape[-1] + 1)
    torch.cumsum(t_in, -1, dtype=t_in.dtype, out=out.narrow(-1, 1, t_in.shape[-1]))
    return out


def _exclusive_cumsum(t_in):
    """fbgemm::asynchronous_exclusive_cumsum: the running sum before each element (in
    memory order, whatever the input's dims)."""
    flat = t_in.reshape(-1)
    return _complete_cumsum(flat).narrow(0, 0, flat.numel()).view(t_in.shape)


def _inclusive_cumsum(t_in):
    """fbgemm::asynchronous_inclusive_cumsum: the running sum up to each element (in
    memory order, whatever the input's dims)."""
    return torch.cumsum(t_in.reshape(-1), 0, dtype=t_in.dtype).view(t_in.shape)


def _permute_sparse_data(
    permute, lengths, values, weights=None, permuted_lengths_sum=None
):
    """fbgemm::permute_2D_sparse_data (and _1D_): the rows of `lengths` (a table's
    lengths per sample, or one segment's length) in the order `permute` names, and the
    segments of `values` (and `weights`) they count, gathered in that order (a row may
    be named twice or not at all). How many values it keeps is the permuted lengths'
    sum, as the kernel's (`permuted_lengths_sum` only saves the kernel computing it):
    the generator fits the result to the recorded size where the replay's differ."""
    rows = lengths.shape[0]
    per_row = lengths.reshape(rows, -1).sum(1, dtype=torch.long)
    starts = per_row.cumsum(0) - per_row
    permute = permute.long()
    if rows and permute.numel() and int(permute.max()) >= rows:
        permute = permute.remainder(rows)  # filled inputs: keep every row in range
    counts = per_row[permute]
    total = int(counts.sum())
    # each kept value: its segment's start in `values` plus its place in the segment
    shift = starts[permute] - (counts.cumsum(0) - counts)
    positions = torch.repeat_interleave(shift, counts, output_size=total)
    positions += torch.arange(total, device=positions.device)
    if total and rows and int(per_row.sum()) > values.shape[0]:
        positions = positions.remainder(max(values.shape[0], 1))
    permuted = values.index_select(0, positions)
    weighted = None if weights is None else weights.index_select(0, positions)
    return lengths.index_select(0, permute), permuted, weighted


def _tbe_tables(weights, weights_offsets, D_offsets, total_D, hash_size_cumsum):
    """Each table's (first element in the flat `weights`, rows, columns, first output
    column): as the arguments say where they lay the tables out in `weights`; else (a
    benchmark fills its inputs, and the trace records no values) `total_D` split evenly
    over the tables, each with as many rows as the buffer holds."""
    tables = max(D_offsets.numel() - 1, 0)
    starts, dims = weights_offsets.tolist(), D_offsets.tolist()
    hashes = hash_size_cumsum.tolist()
    layout = []
    if (
        len(starts) >= tables
        and len(hashes) > tables
        and dims[:1] == [0]
        and dims[-1:] == [total_D]
    ):
        for t in range(tables):
            columns, rows = dims[t + 1] - dims[t], hashes[t + 1] - hashes[t]
            if (
                columns < 0
                or rows <= 0
                or starts[t] < 0
                or (starts[t] + rows * columns > weights.numel())
            ):
                break
            layout.append((starts[t], rows, columns, dims[t]))
    if len(layout) == tables:
        return layout
    base, extra = divmod(total_D, max(tables, 1))
    rows = max(weights.numel() // max(total_D, 1), 1)
    layout, column = [], 0
    for t in range(tables):
        columns = base + (t < extra)
        layout.append((rows * column, rows, columns, column))
        column += columns
    return layout


def _tbe_bags(layout, indices, offsets):
    """Per table: its indices and its bags' offsets from 0 (each index kept within the
    table's rows, as filled inputs need not be), its bag count, and where its indices
    start and end in `indices`."""
    tables = len(layout)
    bags = (offsets.numel() - 1) // max(tables, 1)
    # offsets within the indices and never falling, as the kernel assumes (a
    # benchmark's filled inputs need not be)
    offsets = offsets.clamp(0, indices.numel()).cummax(0).values
    ends = offsets[:: max(bags, 1)].tolist() if bags else [0] * (tables + 1)
    for t, (_, rows, _, _) in enumerate(layout):
        first, last = ends[t], ends[t + 1] if t + 1 < len(ends) else indices.numel()
        picked = indices[first:last].long()
        if picked.numel() and (int(picked.max()) >= rows or int(picked.min()) < 0):
            picked = picked.remainder(rows)
        bag_offsets = offsets[t * bags : (t + 1) * bags + 1].long() - first
        yield picked, bag_offsets, bags, first, last


def _tbe_forward(
    weights,
    weights_offsets,
    D_offsets,
    total_D,
    hash_size_cumsum,
    indices,
    offsets,
    pooling_mode,
    indice_weights,
    output_dtype,
):
    """A table-batched embedding lookup: each table's bags pooled (fbgemm's
    PoolingMode: sum, mean, or none: each index's row) from its rows of the flat
    weights, one embedding_bag a table, side by side in a (B, total_D) output."""
    layout = _tbe_tables(weights, weights_offsets, D_offsets, total_D, hash_size_cumsum)
    mode = TBE_POOLING.get(int(pooling_mode), "sum")
    dtype = TBE_OUTPUT_DTYPES.get(int(output_dtype), weights.dtype)
    if indice_weights is not None and indice_weights.numel() == 0:
        indice_weights = None
    pooled = []
    with torch.no_grad():
        for (start, rows, columns, _), (picked, bag_offsets, _, first, last) in zip(
            layout, _tbe_bags(layout, indices, offsets), strict=True
        ):
            table = weights[start : start + rows * columns].view(rows, columns)
            if mode is None:
                pooled.append(torch.nn.functional.embedding(picked, table))
                continue
            sample_weights = None
            if indice_weights is not None:
                sample_weights = indice_weights[first:last].to(table.dtype)
            pooled.append(
                torch.nn.functional.embedding_bag(
                    picked,
                    table,
                    bag_offsets,
                    mode="sum" if sample_weights is not None else mode,
                    per_sample_weights=sample_weights,
                    include_last_offset=True,
                )
            )
    if mode is None:
        return torch.cat(pooled).to(dtype)
    bags = (offsets.numel() - 1) // max(len(layout), 1)
    if not pooled:
        return weights.new_zeros(bags, total_D, dtype=dtype)
    return torch.cat(pooled, 1).to(dtype)


def _tbe_forward_cpu(
    weights,
    weights_offsets,
    D_offsets,
    total_D,
    hash_size_cumsum,
    indices,
    offsets,
    pooling_mode,
    indice_weights,
    output_dtype,
):
    """fbgemm::split_embedding_codegen_forward_cpu: TorchRec's sharded tables' lookup on
    the host (the kernel under each fused optimizer's lookup function)."""
    return _tbe_forward(
        weights,
        weights_offsets,
        D_offsets,
        total_D,
        hash_size_cumsum,
        indices,
        offsets,
        pooling_mode,
        indice_weights,
        output_dtype,
    )


def _tbe_lookup_adagrad(
    placeholder_autograd_tensor,
    dev_weights,
    uvm_weights,
    lxu_cache_weights,
    weights_placements,
    weights_offsets,
    D_offsets,
    total_D,
    max_D,
    hash_size_cumsum,
    total_hash_size_bits,
    indices,
    offsets,
    pooling_mode,
    indice_weights,
    feature_requires_grad,
    lxu_cache_locations,
    gradient_clipping,
    max_gradient,
    stochastic_rounding,
    momentum1_dev,
    momentum1_uvm,
    momentum1_placements,
    momentum1_offsets,
    eps=0.0,
    learning_rate=0.0,
    output_dtype=0,
):
    """fbgemm::split_embedding_codegen_lookup_adagrad_function (fbgemm_gpu before its
    pt2 wrappers, as the shared CUDA DLRM trace records it): the tables' forward
    lookup. Its fused Adagrad step runs in its autograd node's backward, which the
    trace records as no op (only that node's allocations)."""
    weights = dev_weights if dev_weights.numel() else uvm_weights
    return _tbe_forward(
        weights,
        weights_offsets,
        D_offsets,
        total_D,
        hash_size_cumsum,
        indices,
        offsets,
        pooling_mode,
        indice_weights,
        output_dtype,
    )


def _dense_tbe_lookup(
    dev_weights,
    weights_offsets,
    D_offsets,
    total_D,
    max_D,
    hash_size_cumsum,
    total_hash_size_bits,
    indices,
    offsets,
    pooling_mode,
    indice_weights,
    feature_requires_grad,
    output_dtype=0,
    B_offsets=None,
    vbe_output_offsets_feature_rank=None,
    vbe_B_offsets_rank_per_feature=None,
    max_B=-1,
    max_B_feature_rank=-1,
    vbe_output_size=-1,
    mixed_D=True,
):
    """fbgemm::dense_embedding_codegen_lookup_function: a dense TBE's lookup (its
    weights a parameter that a separate optimizer updates)."""
    return _tbe_forward(
        dev_weights,
        weights_offsets,
        D_offsets,
        total_D,
        hash_size_cumsum,
        indices,
        offsets,
        pooling_mode,
        indice_weights,
        output_dtype,
    )


def _tbe_row_grads(
    grad_output,
    host_weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    indices,
    offsets,
    pooling_mode,
    indice_weights,
):
    """Per table: (its rows as a view of the flat weights, the rows its bags read,
    unique and sorted, and each one's gradient summed over the bags that read it), as
    the fused backward kernels compute them before their optimizer's update."""
    total_D = grad_output.shape[1] if grad_output.dim() == 2 else 0
    layout = _tbe_tables(
        host_weights, weights_offsets, D_offsets, total_D, hash_size_cumsum
    )
    mode = TBE_POOLING.get(int(pooling_mode), "sum")
    if indice_weights is not None and indice_weights.numel() == 0:
        indice_weights = None
    for t, ((start, rows, columns, column), bagged) in enumerate(
        zip(layout, _tbe_bags(layout, indices, offsets), strict=True)
    ):
        picked, bag_offsets, bags, first, last = bagged
        table = host_weights[start : start + rows * columns].view(rows, columns)
        if not picked.numel():
            continue
        if mode is None:  # each index's own row of the output
            grads = grad_output[first:last, :columns]
        else:
            lengths = bag_offsets.diff()
            bag_of = torch.repeat_interleave(
                torch.arange(bags, device=picked.device),
                lengths,
                output_size=picked.numel(),
            )
            grads = grad_output[:, column : column + columns].index_select(0, bag_of)
            if mode == "mean":
                grads = grads / lengths.clamp(min=1).index_select(0, bag_of)[:, None]
            if indice_weights is not None:
                grads = grads * indice_weights[first:last, None].to(grads.dtype)
        touched, place = torch.unique(picked, return_inverse=True)
        summed = grads.new_zeros(touched.numel(), columns).index_add_(0, place, grads)
        yield t, table, start, touched, summed.to(table.dtype)


def _tbe_state(momentum, offsets, t, fallback, size):
    """Table t's optimizer state, `size` elements of the flat `momentum` from
    `offsets[t]` where that lies inside it, else from `fallback` (filled inputs);
    None where neither fits."""
    first = offsets[t] if t < len(offsets) else fallback
    if not 0 <= first <= momentum.numel() - size:
        first = fallback
    if not 0 <= first <= momentum.numel() - size:
        return None
    return momentum[first : first + size]


def _tbe_backward_sgd_cpu(
    grad_output,
    host_weights,
    weights_placements,
    weights_offsets,
    D_offsets,
    max_D,
    hash_size_cumsum,
    total_hash_size_bits,
    indices,
    offsets,
    pooling_mode,
    indice_weights,
    stochastic_rounding,
    learning_rate_tensor,
    output_dtype=0,
):
    """fbgemm::split_embedding_backward_codegen_sgd_cpu: the lookup's backward with its
    fused SGD step (TorchRec's fused optimizer): each row the bags read moves against
    its summed gradient, in place; no gradient is made."""
    rate = learning_rate_tensor.item()
    for _, table, _, touched, grads in _tbe_row_grads(
        grad_output,
        host_weights,
        weights_offsets,
        D_offsets,
        hash_size_cumsum,
        indices,
        offsets,
        pooling_mode,
        indice_weights,
    ):
        table.index_add_(0, touched, grads, alpha=-rate)


def _tbe_backward_adagrad_cpu(
    grad_output,
    host_weights,
    weights_placements,
    weights_offsets,
    D_offsets,
    max_D,
    hash_size_cumsum,
    total_hash_size_bits,
    indices,
    offsets,
    pooling_mode,
    indice_weights,
    stochastic_rounding,
    momentum1_host,
    momentum1_placements,
    momentum1_offsets,
    learning_rate_tensor,
    eps=0.0,
    output_dtype=0,
):
    """fbgemm::split_embedding_backward_codegen_adagrad_cpu: the lookup's backward with
    its fused Adagrad step: each row the bags read adds its summed gradient's square to
    its state (one per weight, laid out as the weights), and moves by lr * g /
    (sqrt(state) + eps), in place."""
    rate = learning_rate_tensor.item()
    states = momentum1_offsets.tolist()
    for t, table, start, touched, grads in _tbe_row_grads(
        grad_output,
        host_weights,
        weights_offsets,
        D_offsets,
        hash_size_cumsum,
        indices,
        offsets,
        pooling_mode,
        indice_weights,
    ):
        rows, columns = table.shape
        state = _tbe_state(momentum1_host, states, t, start, rows * columns)
        if state is None:
            continue
        state = state.view(rows, columns)
        squares = state.index_select(0, touched).addcmul_(grads, grads)
        state.index_copy_(0, touched, squares)
        table.index_add_(0, touched, grads / (squares.sqrt_() + eps), alpha=-rate)


def _tbe_backward_rowwise_adagrad_cpu(
    grad_output,
    host_weights,
    weights_placements,
    weights_offsets,
    D_offsets,
    max_D,
    hash_size_cumsum,
    total_hash_size_bits,
    indices,
    offsets,
    pooling_mode,
    indice_weights,
    stochastic_rounding,
    momentum1_host,
    momentum1_placements,
    momentum1_offsets,
    learning_rate_tensor,
    eps=0.0,
    weight_decay=0.0,
    weight_decay_mode=0,
    max_norm=0.0,
    output_dtype=0,
):
    """fbgemm::split_embedding_backward_codegen_rowwise_adagrad_cpu: the lookup's
    backward with its fused row-wise Adagrad step (TorchRec's default): each row the
    bags read adds its summed gradient's mean square to its one state value, and moves
    by lr * g / (sqrt(state) + eps), in place (weight decay: L2, mode 1, adds
    weight_decay * w to the gradient; decoupled, mode 2, shrinks the row)."""
    rate = learning_rate_tensor.item()
    states = momentum1_offsets.tolist()
    for t, table, start, touched, grads in _tbe_row_grads(
        grad_output,
        host_weights,
        weights_offsets,
        D_offsets,
        hash_size_cumsum,
        indices,
        offsets,
        pooling_mode,
        indice_weights,
    ):
        rows = table.shape[0]
        # one value a row; filled inputs: the tables' rows one after another
        state = _tbe_state(momentum1_host, states, t, start // table.shape[1], rows)
        if state is None:
            continue
        if weight_decay and int(weight_decay_mode) == 1:
            grads = grads + weight_decay * table.index_select(0, touched)
        squares = state.index_select(0, touched) + grads.square().mean(1)
        state.index_copy_(0, touched, squares)
        step = grads / (squares.sqrt() + eps)[:, None]
        if weight_decay and int(weight_decay_mode) == 2:
            step = step + weight_decay * table.index_select(0, touched)
        table.index_add_(0, touched, step, alpha=-rate)


PORTABLE = {
    "aten::cudnn_batch_norm.default": _batch_norm,
    "aten::miopen_batch_norm.default": _batch_norm,
    "aten::cudnn_batch_norm_backward.default": _batch_norm_backward,
    "aten::miopen_batch_norm_backward.default": _batch_norm_backward,
    "aten::cudnn_convolution.default": _convolution_as(False, False),
    "aten::cudnn_convolution_transpose.default": _convolution_as(True, False),
    "aten::miopen_convolution.default": _convolution_as(False, True),
    "aten::miopen_depthwise_convolution.default": _convolution_as(False, True),
    "aten::mkldnn_convolution.default": _convolution_as(False, True),
    "aten::_nnpack_spatial_convolution.default": _nnpack_convolution,
    "aten::miopen_convolution_transpose.default": _convolution_as(True, True),
    "aten::_scaled_dot_product_flash_attention.default": _flash_attention,
    "aten::_scaled_dot_product_flash_attention_for_cpu.default": _flash_attention,
    "aten::_scaled_dot_product_efficient_attention.default": _mask_attention,
    "aten::_scaled_dot_product_cudnn_attention.default": _mask_attention,
    "aten::_scaled_dot_product_fused_attention_overrideable.default": _fused_attention,
    "aten::_scaled_dot_product_flash_attention_backward.default": (
        _flash_attention_backward
    ),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default": (
        _flash_attention_for_cpu_backward
    ),
    "aten::_scaled_dot_product_efficient_attention_backward.default": (
        _efficient_attention_backward
    ),
    "aten::_scaled_dot_product_cudnn_attention_backward.default": (
        _cudnn_attention_backward
    ),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward.default": (
        _fused_attention_backward
    ),
    "aten::batch_norm_stats.default": _batch_norm_stats,
    "aten::batch_norm_gather_stats.default": _batch_norm_gather_stats,
    "aten::batch_norm_gather_stats_with_counts.default": (
        _batch_norm_gather_stats_with_counts
    ),
    "aten::batch_norm_elemt.default": _batch_norm_elemt,
    "aten::batch_norm_backward_reduce.default": _batch_norm_backward_reduce,
    "aten::batch_norm_backward_elemt.default": _batch_norm_backward_elemt,
    "aten::max_pool2d_backward.default": _max_pool2d_backward,
    "aten::_conv_depthwise2d.default": _depthwise_convolution,
    "aten::conv_depthwise3d.default": _depthwise_convolution,
    "aten::cudnn_convolution_relu.default": _convolution_relu,
    "aten::miopen_convolution_relu.default": _convolution_relu,
    "aten::cudnn_convolution_add_relu.default": _convolution_add_relu,
    "aten::miopen_convolution_add_relu.default": _convolution_add_relu,
    "aten::cudnn_grid_sampler.default": _cudnn_grid_sampler,
    "aten::cudnn_grid_sampler_backward.default": _cudnn_grid_sampler_backward,
    "aten::cudnn_affine_grid_generator.default": _cudnn_affine_grid,
    "aten::cudnn_affine_grid_generator_backward.default": _cudnn_affine_grid_backward,
    "aten::_use_cudnn_ctc_loss.default": _use_cudnn_ctc_loss,
    "aten::_use_cudnn_ctc_loss.Tensor": _use_cudnn_ctc_loss,
    "aten::_cudnn_ctc_loss.default": _cudnn_ctc_loss,
    "aten::_cudnn_ctc_loss.Tensor": _cudnn_ctc_loss,
    "aten::_fused_rms_norm_backward.default": _fused_rms_norm_backward,
    "aten::mm.dtype": _with_out_dtype(torch.mm),
    "aten::bmm.dtype": _with_out_dtype(torch.bmm),
    "aten::addmm.dtype": _with_out_dtype(torch.addmm),
    "aten::baddbmm.dtype": _with_out_dtype(torch.baddbmm),
    "aten::_weight_int4pack_mm.default": _weight_int4pack_mm,
    "aten::_weight_int4pack_mm_for_cpu.default": _weight_int4pack_mm,
    "aten::_weight_int8pack_mm.default": _weight_int8pack_mm,
    "aten::_sparse_semi_structured_linear.default": _sparse_semi_structured_linear,
    "aten::_sparse_semi_structured_mm.default": _sparse_semi_structured_mm,
    "aten::_sparse_semi_structured_addmm.default": _sparse_semi_structured_addmm,
    "aten::_cslt_sparse_mm.default": _cslt_sparse_mm,
    "aten::_mixed_dtypes_linear.default": _mixed_dtypes_linear,
    "aten::_grouped_mm.default": _grouped_mm,
    "aten::_scaled_grouped_mm.default": _scaled_grouped_mm,
    "aten::_scaled_grouped_mm_v2.default": _scaled_grouped_mm_v2,
    "mslk::f8f8bf16_rowwise.default": _f8f8bf16_rowwise,
    "fbgemm::f8f8bf16_rowwise.default": _f8f8bf16_rowwise,
    "aten::_thnn_fused_lstm_cell.default": _fused_lstm_cell,
    "aten::_thnn_fused_lstm_cell_backward_impl.default": _fused_lstm_cell_backward,
    "aten::_thnn_fused_gru_cell.default": _fused_gru_cell,
    "aten::_thnn_fused_gru_cell_backward.default": _fused_gru_cell_backward,
    "aten::_fused_dropout.default": _fused_dropout,
    "aten::_masked_scale.default": _masked_scale,
    "aten::_cudnn_rnn.default": _cudnn_rnn,
    "aten::miopen_rnn.default": _miopen_rnn,
    "aten::_cudnn_rnn_backward.default": _cudnn_rnn_backward,
    "aten::miopen_rnn_backward.default": _miopen_rnn_backward,
    "aten::mkldnn_rnn_layer.default": _mkldnn_rnn_layer,
    "aten::mkldnn_rnn_layer_backward.default": _mkldnn_rnn_layer_backward,
    "aten::pin_memory.default": _pinned,
    "aten::_pin_memory.default": _pinned,
    "aten::_flash_attention_forward.default": _aten_flash_forward,
    "aten::_flash_attention_backward.default": _aten_flash_backward,
    "aten::_flash_attention_forward_no_dropout_inplace.default": (
        _aten_flash_forward_into
    ),
    "aten::_flash_attention_forward.quantized": _aten_flash_forward_quantized,
    "aten::_scaled_dot_product_flash_attention.quantized": _flash_attention_quantized,
    "aten::_efficient_attention_forward.default": _aten_efficient_forward,
    "aten::_efficient_attention_backward.default": _aten_efficient_backward,
    "aten::_cudnn_attention_forward.default": _aten_cudnn_forward,
    "aten::_cudnn_attention_backward.default": _aten_cudnn_backward,
    "torch_attn::_varlen_attn.default": _varlen_attn,
    "torch_attn::_varlen_attn_backward.default": _varlen_attn_backward,
    "torch_attn::_varlen_attn_out.default": _varlen_attn_out,
    "flash_attn::_flash_attn_forward.default": _flash_attn_forward,
    "flash_attn::_flash_attn_varlen_forward.default": _flash_attn_varlen_forward,
    "flash_attn::_flash_attn_backward.default": _flash_attn_backward,
    "flash_attn::_flash_attn_varlen_backward.default": _flash_attn_varlen_backward,
    "torchvision::deform_conv2d.default": _deform_conv2d,
    "torchvision::_deform_conv2d_backward.default": _deform_conv2d_backward,
    "torchvision::nms.default": _nms,
    "torchvision::roi_align.default": _roi_align,
    "torchvision::_roi_align_backward.default": _roi_align_backward,
    "torchaudio::rnnt_loss.default": _rnnt_loss,
    "torchaudio::rnnt_loss_forward.default": _rnnt_loss,
    "torchaudio::_lfilter_core_loop.default": _lfilter_core_loop,
    "torchaudio::_overdrive_core_loop.default": _overdrive_core_loop,
    "fbgemm::asynchronous_complete_cumsum.default": _complete_cumsum,
    "fbgemm::asynchronous_exclusive_cumsum.default": _exclusive_cumsum,
    "fbgemm::asynchronous_inclusive_cumsum.default": _inclusive_cumsum,
    "fbgemm::permute_2D_sparse_data.default": _permute_sparse_data,
    "fbgemm::permute_1D_sparse_data.default": _permute_sparse_data,
    "fbgemm::permute_sparse_data.default": _permute_sparse_data,
    "fbgemm::split_embedding_codegen_forward_cpu.default": _tbe_forward_cpu,
    "fbgemm::split_embedding_backward_codegen_sgd_cpu.default": _tbe_backward_sgd_cpu,
    "fbgemm::split_embedding_backward_codegen_adagrad_cpu.default": (
        _tbe_backward_adagrad_cpu
    ),
    "fbgemm::split_embedding_backward_codegen_rowwise_adagrad_cpu.default": (
        _tbe_backward_rowwise_adagrad_cpu
    ),
    "fbgemm::split_embedding_codegen_lookup_adagrad_function.default": (
        _tbe_lookup_adagrad
    ),
    "fbgemm::dense_embedding_codegen_lookup_function.default": _dense_tbe_lookup,
}
