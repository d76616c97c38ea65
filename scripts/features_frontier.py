"""A seventh batch of steps for ``scripts/bench_features.py``: serving patterns,
architectures and training tricks the earlier batches left out, each written from
scratch in plain torch (transformers' models from tiny configs, never weights).
Serving: GPT-2's generate() sampling with top-k/top-p, a repetition penalty and
no-repeat n-grams, a hand decoding loop over an explicit DynamicCache, generate()
over a user-built StaticCache, a paged KV cache (block pool, block table,
index_copy_/index_put_, gather by table), continuous batching over ragged lengths,
ALiBi, a sliding-window mask, RoPE with NTK and YaRN scaling. Architectures: Mamba-1's
selective scan in parallel form (cumsum of log decays, exp), Hyena's implicit filter,
Performer and elu+1 linear attention, an mLSTM cell, Swin's shifted windows, ConvNeXt,
MobileNetV3, EfficientNet's MBConv, a small 3D U-Net, PointNet++ (farthest point
sampling, ball query, grouped max), NeRF volume rendering with importance sampling,
GAT's scatter softmax, GraphSAGE neighbour sampling, DCN-v2 with DIN, a two-tower
retrieval model with hashed ids, segment_reduce over offsets, a TCN, Informer's
ProbSparse attention, a Conformer block, a Stable-Diffusion cross-attention block.
Training tricks: SWA with SWALR and update_bn, LoRA merged and unmerged, stochastic
depth, class-weighted label smoothing, hand-written LARS/LAMB, Lion and schedule-free
SGD, bf16 autocast, float64, gradient accumulation into kept gradients,
clip_grad_value_ under deterministic algorithms, a tied LM head. ``WORKLOADS``: name ->
a builder that returns the step; ``*_min`` are minimal repros of what a probe found.

Then harder variants (generate()'s min_p/typical_p/epsilon processors, prompt lookup,
Mistral's sliding window, dynamic RoPE, Gemma 2's soft-capping, bf16 stochastic
rounding through int32 bit views, overlapping as_strided windows, CausalBias with GQA,
index_reduce, a 4-D paged pool, order statistics, functional_call soups, inferred
one_hot, unique(dim=1), a GP's cholesky on a buffer, running-moment normalisation,
``.data`` swaps, int4 unpacking, concrete dropout, ``labels[labels == pad] = -100``).

What this batch found when it was added (55 of its 58 workloads passed, all 39 of the first
group among them): a Python literal stored by ``__setitem__`` (``mask[..., :k] = False``) is an
``aten::lift_fresh`` tensor with no value in the trace, filled at random (bool) or 1..7
(integers, never 0), so generate()'s processors removed every token and multinomial
raised; cholesky of a matrix computed from a buffer (``K * s + noise * I``) got no
positive-definite fill; ``(sq - mean ** 2).sqrt()`` over two buffers got no domain and
replayed NaN into the weights. The literal is fixed (it replays 0, or False, unless it
divides); the other two are in README's Known limits.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from features_steps import sgd_step


def _attn(q, k, v, bias=None):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    return s.softmax(-1) @ v


# -- serving -----------------------------------------------------------------------


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=96,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return GPT2LMHeadModel(cfg).eval()


def _tiny_lm(family: str, **overrides):
    """A tiny decoder-only LM of a transformers family (``"Llama"``, ``"Mistral"``,
    ``"Gemma2"``) from a config, no weights; ``overrides`` change its config."""
    import transformers

    config = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    cfg = getattr(transformers, f"{family}Config")(**{**config, **overrides})
    return getattr(transformers, f"{family}ForCausalLM")(cfg).eval()


def _llama():
    return _tiny_lm("Llama")


def y_gpt2_generate_sample():
    m = _gpt2()
    ids = torch.randint(3, 96, (2, 5))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0

    def step():
        torch.manual_seed(1)
        return m.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            top_k=10,
            top_p=0.8,
            temperature=0.9,
            repetition_penalty=1.3,
            no_repeat_ngram_size=2,
            max_new_tokens=5,
            min_new_tokens=5,
        )

    return step


def y_llama_dynamic_cache_loop():
    from transformers import DynamicCache

    m = _llama()
    ids = torch.randint(3, 96, (2, 5))

    def step():
        with torch.no_grad():
            cache = DynamicCache(config=m.config)
            out = m(input_ids=ids, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            pos = ids.shape[1]
            for _ in range(4):
                out = m(
                    input_ids=tok,
                    past_key_values=out.past_key_values,
                    use_cache=True,
                    cache_position=torch.tensor([pos]),
                )
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                pos += 1
            return tok

    return step


def y_llama_static_cache_sample():
    from transformers import StaticCache

    m = _llama()
    ids = torch.randint(3, 96, (2, 5))

    def step():
        torch.manual_seed(2)
        cache = StaticCache(config=m.config, max_cache_len=16)
        return m.generate(
            ids,
            past_key_values=cache,
            do_sample=True,
            top_k=8,
            max_new_tokens=4,
            min_new_tokens=4,
        )

    return step


def y_paged_kv_cache():
    """Decode steps against a paged KV cache: a block pool, a block table per sequence,
    new keys written by index_copy_ / index_put_, keys gathered through the table."""
    h, d, bs, nblk = 2, 8, 4, 12
    qkv = nn.Linear(h * d, 3 * h * d)
    out = nn.Linear(h * d, h * d)
    kpool = torch.zeros(nblk * bs, h, d)
    vpool = torch.zeros(nblk * bs, h, d)
    table = torch.tensor([[3, 7, 1], [0, 5, 9]])
    lens0 = [5, 2]
    x0 = torch.randn(2, 3, h * d)

    def step():
        with torch.no_grad():
            kpool.zero_()
            vpool.zero_()
            lens = list(lens0)
            for b, n in enumerate(lens):  # prefill
                slots = table[b, torch.arange(n) // bs] * bs + torch.arange(n) % bs
                kv = torch.randn(n, 2, h, d)
                kpool.index_copy_(0, slots, kv[:, 0])
                vpool.index_put_((slots,), kv[:, 1])
            outs = []
            for t in range(3):
                q, k, v = qkv(x0[:, t]).view(2, 3, h, d).unbind(1)
                pos = torch.tensor(lens)
                slot = table.gather(1, (pos // bs)[:, None]).squeeze(1) * bs + pos % bs
                kpool.index_copy_(0, slot, k)
                vpool.index_put_((slot,), v)
                lens = [n + 1 for n in lens]
                res = []
                for b, n in enumerate(lens):
                    idx = (
                        table[b].repeat_interleave(bs) * bs + torch.arange(bs).repeat(3)
                    )[:n]
                    kk, vv = kpool[idx], vpool.index_select(0, idx)
                    res.append(
                        _attn(q[b][:, None], kk.transpose(0, 1), vv.transpose(0, 1))
                    )
                outs.append(out(torch.stack([r.flatten() for r in res])))
            return torch.stack(outs, 1)

    return step


def y_continuous_batching():
    """Ragged requests packed into one padded batch with per-request positions and a
    key padding mask combined with causal masking; finished rows dropped between steps.
    """
    vocab, d = 64, 16
    emb, pos_emb = nn.Embedding(vocab, d), nn.Embedding(32, d)
    layer = nn.ModuleDict(
        dict(qkv=nn.Linear(d, 3 * d), o=nn.Linear(d, d), head=nn.Linear(d, vocab))
    )
    seqs0 = [torch.randint(1, vocab, (n,)) for n in (3, 6, 4, 2)]

    def forward(seqs):
        L = max(len(s) for s in seqs)
        ids = torch.stack([F.pad(s, (L - len(s), 0)) for s in seqs])
        valid = torch.stack([torch.arange(L) >= L - len(s) for s in seqs])
        pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
        x = emb(ids) + pos_emb(pos)
        q, k, v = (
            layer["qkv"](x).view(len(seqs), L, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        )
        mask = torch.ones(L, L, dtype=torch.bool).tril()[None] & valid[:, None, :]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        h = layer["o"](a.transpose(1, 2).reshape(len(seqs), L, d))
        return layer["head"](h[:, -1])

    def step():
        with torch.no_grad():
            seqs = [s.clone() for s in seqs0]
            budget = [2, 4, 3, 1]
            while seqs:
                nxt = forward(seqs).argmax(-1)
                seqs = [torch.cat([s, nxt[i : i + 1]]) for i, s in enumerate(seqs)]
                budget = [b - 1 for b in budget]
                seqs = [s for s, b in zip(seqs, budget, strict=True) if b > 0]
                budget = [b for b in budget if b > 0]

    return step


def y_alibi_attention():
    n_head, d, L = 4, 16, 7
    slopes = torch.tensor([2 ** (-8 * (i + 1) / n_head) for i in range(n_head)])
    qkv, o = nn.Linear(d, 3 * d), nn.Linear(d, d)
    m = nn.ModuleList([qkv, o])
    x = torch.randn(2, L, d)

    def loss():
        q, k, v = qkv(x).view(2, L, 3, n_head, d // n_head).permute(2, 0, 3, 1, 4)
        rel = torch.arange(L)[None, :] - torch.arange(L)[:, None]
        bias = slopes[:, None, None] * rel[None].float()
        bias = bias.masked_fill(rel[None] > 0, float("-inf"))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])
        return o(a.transpose(1, 2).reshape(2, L, d)).pow(2).mean()

    return sgd_step(m, loss)


def y_sliding_window_mask():
    n_head, d, L, w = 2, 16, 10, 3
    qkv, o = nn.Linear(d, 3 * d), nn.Linear(d, d)
    m = nn.ModuleList([qkv, o])
    x = torch.randn(2, L, d)

    def loss():
        q, k, v = qkv(x).view(2, L, 3, n_head, d // n_head).permute(2, 0, 3, 1, 4)
        i = torch.arange(L)
        diff = i[:, None] - i[None, :]
        allowed = (diff >= 0) & (diff < w)
        s = (q @ k.transpose(-1, -2)) * (d // n_head) ** -0.5
        s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
        a = s.softmax(-1) @ v
        return o(a.transpose(1, 2).reshape(2, L, d)).pow(2).mean()

    return sgd_step(m, loss)


def _rope_freqs(dim, base, L, kind):
    inv = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
    if kind == "ntk":
        alpha = 4.0
        base2 = base * alpha ** (dim / (dim - 2))
        inv = 1.0 / (base2 ** (torch.arange(0, dim, 2).float() / dim))
    elif kind == "yarn":
        scale, orig = 4.0, 16
        low, high = 1.0, 32.0
        wavelen = 2 * math.pi / inv
        ramp = ((orig / wavelen) - low) / (high - low)
        ramp = ramp.clamp(0, 1)
        inv = inv / scale * (1 - ramp) + inv * ramp
    t = torch.arange(L).float()
    f = torch.outer(t, inv)
    mscale = 0.1 * math.log(4.0) + 1.0 if kind == "yarn" else 1.0
    return f.cos() * mscale, f.sin() * mscale


def _rotate(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)


def y_rope_scaled():
    d, h, L = 16, 2, 12
    qkv, o = nn.Linear(d, 3 * d), nn.Linear(d, d)
    m = nn.ModuleList([qkv, o])
    x = torch.randn(2, L, d)

    def loss():
        total = 0
        for kind in ("ntk", "yarn"):
            cos, sin = _rope_freqs(d // h, 10000.0, L, kind)
            q, k, v = qkv(x).view(2, L, 3, h, d // h).permute(2, 0, 3, 1, 4)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            total = total + o(a.transpose(1, 2).reshape(2, L, d)).pow(2).mean()
        return total

    return sgd_step(m, loss)


# -- architectures -----------------------------------------------------------------


def y_mamba1_parallel_scan():
    """Mamba-1's selective scan as a parallel scan: log decays summed by cumsum, the
    recurrence as exp of differences of prefix sums (segment sums), a causal mask."""

    class Mamba(nn.Module):
        def __init__(self, d=8, n=4, e=2):
            super().__init__()
            di = d * e
            self.inp = nn.Linear(d, 2 * di)
            self.conv = nn.Conv1d(di, di, 4, groups=di, padding=3)
            self.xproj = nn.Linear(di, 2 * n + 1)
            self.dtproj = nn.Linear(1, di)
            self.A_log = nn.Parameter(
                torch.log(torch.arange(1, n + 1).float()).repeat(di, 1)
            )
            self.D = nn.Parameter(torch.ones(di))
            self.out = nn.Linear(di, d)
            self.n = n

        def forward(self, u):
            b, L, _ = u.shape
            x, z = self.inp(u).chunk(2, -1)
            x = F.silu(self.conv(x.transpose(1, 2))[..., :L].transpose(1, 2))
            B, C, dt = self.xproj(x).split([self.n, self.n, 1], -1)
            dt = F.softplus(self.dtproj(dt))  # b L di
            A = -torch.exp(self.A_log)  # di n
            logdA = dt[..., None] * A  # b L di n
            cs = torch.cumsum(logdA, 1)
            seg = cs[:, :, None] - cs[:, None, :]  # b Lt Ls di n
            causal = torch.ones(L, L, dtype=torch.bool).tril()
            w = torch.exp(
                seg.masked_fill(~causal[None, :, :, None, None], float("-inf"))
            )
            bx = dt[..., None] * B[:, :, None, :] * x[..., None]  # b L di n
            h = torch.einsum("btsdn,bsdn->btdn", w, bx)
            y = (h * C[:, :, None, :]).sum(-1) + self.D * x
            return self.out(y * F.silu(z))

    m = Mamba()
    x = torch.randn(2, 6, 8)
    return sgd_step(
        m, lambda: m(x).pow(2).mean(), torch.optim.AdamW(m.parameters(), lr=1e-3)
    )


def y_hyena_implicit_filter():
    class Hyena(nn.Module):
        def __init__(self, d=8, L=16, order=2, emb=5):
            super().__init__()
            self.proj = nn.Linear(d, (order + 1) * d)
            self.short = nn.Conv1d(
                (order + 1) * d, (order + 1) * d, 3, padding=2, groups=(order + 1) * d
            )
            self.filt = nn.Sequential(
                nn.Linear(emb, 16), nn.SiLU(), nn.Linear(16, order * d)
            )
            self.bias = nn.Parameter(torch.randn(order, d))
            self.out = nn.Linear(d, d)
            t = torch.linspace(0, 1, L)[:, None]
            bands = torch.linspace(1e-4, 1, (emb - 1) // 2)
            z = torch.exp(-1j * 2 * math.pi * bands * t)
            self.register_buffer("z", torch.cat([t, z.real, z.imag], -1))
            self.register_buffer(
                "decay", torch.exp(-torch.linspace(0, 1, L)[:, None] * 3)
            )
            self.order, self.d = order, d

        def forward(self, x):
            L = x.shape[1]
            u = self.proj(x).transpose(1, 2)
            u = self.short(u)[..., :L]
            *xs, v = u.split(self.d, 1)
            k = (
                (self.filt(self.z) * self.decay)
                .transpose(0, 1)
                .view(self.order, self.d, L)
            )
            for i, xi in enumerate(xs):
                kf = torch.fft.rfft(k[i], n=2 * L)
                vf = torch.fft.rfft(v, n=2 * L)
                y = torch.fft.irfft(vf * kf, n=2 * L, norm="forward")[..., :L] / (2 * L)
                v = xi * (y + v * self.bias[i][:, None])
            return self.out(v.transpose(1, 2))

    m = Hyena()
    x = torch.randn(2, 16, 8)
    return sgd_step(m, lambda: m(x).pow(2).mean())


def y_linear_attention():
    """Performer's FAVOR+ positive random features (bidirectional) and the elu+1
    kernel in causal form (prefix sums of k v^T)."""
    d, h, L, r = 16, 2, 8, 12
    qkv, o = nn.Linear(d, 3 * d), nn.Linear(d, d)
    m = nn.ModuleList([qkv, o])
    omega = torch.randn(r, d // h)
    x = torch.randn(2, L, d)

    def favor(t):
        t = t * (d // h) ** -0.25
        proj = t @ omega.t()
        return torch.exp(
            proj
            - t.pow(2).sum(-1, keepdim=True) / 2
            - proj.amax(-1, keepdim=True).detach()
        ) / math.sqrt(r)

    def loss():
        q, k, v = qkv(x).view(2, L, 3, h, d // h).permute(2, 0, 3, 1, 4)
        qf, kf = favor(q), favor(k)
        kv = torch.einsum("bhlr,bhld->bhrd", kf, v)
        z = 1 / (torch.einsum("bhlr,bhr->bhl", qf, kf.sum(2)) + 1e-6)
        a1 = torch.einsum("bhlr,bhrd,bhl->bhld", qf, kv, z)
        qe, ke = F.elu(q) + 1, F.elu(k) + 1
        s = torch.cumsum(ke[..., :, None] * v[..., None, :], 2)  # b h l dk dv
        zc = torch.cumsum(ke, 2)
        a2 = (qe[..., None] * s).sum(-2) / ((qe * zc).sum(-1, keepdim=True) + 1e-6)
        a = (a1 + a2).transpose(1, 2).reshape(2, L, d)
        return o(a).pow(2).mean()

    return sgd_step(m, loss)


def y_mlstm_cell():
    """xLSTM's mLSTM in its parallel (stabilised) form: log-sigmoid forget gates summed,
    exponential input gates, a max stabiliser, normaliser clamped below by exp(-m)."""

    class MLSTM(nn.Module):
        def __init__(self, d=16, h=2):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.gates = nn.Linear(d, 2 * h)
            self.og = nn.Linear(d, d)
            self.norm = nn.GroupNorm(h, d)
            self.out = nn.Linear(d, d)
            self.h = h

        def forward(self, x):
            b, L, d = x.shape
            h, dh = self.h, d // self.h
            q, k, v = self.qkv(x).view(b, L, 3, h, dh).permute(2, 0, 3, 1, 4)
            ig, fg = self.gates(x).view(b, L, 2, h).permute(2, 0, 3, 1)  # b h L
            logf = F.logsigmoid(fg)
            cf = torch.cumsum(logf, -1)
            dmat = cf[..., :, None] - cf[..., None, :] + ig[..., None, :]
            causal = torch.ones(L, L, dtype=torch.bool).tril()
            dmat = dmat.masked_fill(~causal, float("-inf"))
            mx = dmat.amax(-1, keepdim=True)
            dexp = torch.exp(dmat - mx)
            c = (q @ k.transpose(-1, -2)) / math.sqrt(dh) * dexp
            n = torch.maximum(c.sum(-1, keepdim=True).abs(), torch.exp(-mx))
            hs = (c / (n + 1e-6)) @ v
            hs = hs.transpose(1, 2).reshape(b, L, d)
            hs = self.norm(hs.transpose(1, 2)).transpose(1, 2)
            return self.out(hs * torch.sigmoid(self.og(x)))

    m = MLSTM()
    x = torch.randn(2, 7, 16)
    return sgd_step(m, lambda: m(x).pow(2).mean())


def y_swin_window_attn():
    class SwinBlock(nn.Module):
        def __init__(self, d=16, h=2, ws=4, shift=2, H=8, W=8):
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(
                nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)
            )
            self.table = nn.Parameter(torch.randn((2 * ws - 1) ** 2, h) * 0.02)
            coords = torch.stack(
                torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")
            )
            cf = coords.flatten(1)
            rel = (cf[:, :, None] - cf[:, None, :]).permute(1, 2, 0) + (ws - 1)
            self.register_buffer("rel_index", rel[..., 0] * (2 * ws - 1) + rel[..., 1])
            img = torch.zeros(1, H, W, 1)
            cnt = 0
            for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                    img[:, hs, wsl, :] = cnt
                    cnt += 1
            mw = self._part(img, ws).squeeze(-1)
            am = mw[:, None, :] - mw[:, :, None]
            self.register_buffer(
                "mask", am.masked_fill(am != 0, -100.0).masked_fill(am == 0, 0.0)
            )
            self.h, self.ws, self.shift = h, ws, shift

        @staticmethod
        def _part(x, ws):
            B, H, W, C = x.shape
            x = x.view(B, H // ws, ws, W // ws, ws, C).permute(0, 1, 3, 2, 4, 5)
            return x.reshape(-1, ws * ws, C)

        @staticmethod
        def _merge(w, ws, B, H, W):
            x = w.view(B, H // ws, W // ws, ws, ws, -1).permute(0, 1, 3, 2, 4, 5)
            return x.reshape(B, H, W, -1)

        def forward(self, x):
            B, H, W, C = x.shape
            s = torch.roll(self.n1(x), (-self.shift, -self.shift), (1, 2))
            w = self._part(s, self.ws)
            nw, N = w.shape[0], w.shape[1]
            q, k, v = (
                self.qkv(w).view(nw, N, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
            )
            bias = self.table[self.rel_index.view(-1)].view(N, N, -1).permute(2, 0, 1)
            att = q @ k.transpose(-1, -2) * (C // self.h) ** -0.5 + bias
            nwin = self.mask.shape[0]
            att = att.view(-1, nwin, self.h, N, N) + self.mask[None, :, None]
            a = att.view(-1, self.h, N, N).softmax(-1) @ v
            a = self.proj(a.transpose(1, 2).reshape(nw, N, C))
            s = torch.roll(
                self._merge(a, self.ws, B, H, W), (self.shift, self.shift), (1, 2)
            )
            x = x + s
            return x + self.mlp(self.n2(x))

    m = SwinBlock()
    x = torch.randn(2, 8, 8, 16)
    return sgd_step(
        m, lambda: m(x).pow(2).mean(), torch.optim.AdamW(m.parameters(), lr=1e-3)
    )


def _drop_path(x, p, training=True):
    if p == 0.0 or not training:
        return x
    keep = 1 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask.div_(keep)


def y_convnext_block():
    class Block(nn.Module):
        def __init__(self, d=16, dp=0.2):
            super().__init__()
            self.dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
            self.norm = nn.LayerNorm(d, eps=1e-6)
            self.pw1, self.pw2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.gamma = nn.Parameter(1e-6 * torch.ones(d))
            self.dp = dp

        def forward(self, x):
            y = self.dw(x).permute(0, 2, 3, 1)
            y = self.pw2(F.gelu(self.pw1(self.norm(y)))) * self.gamma
            return x + _drop_path(y.permute(0, 3, 1, 2), self.dp, self.training)

    m = nn.Sequential(
        nn.Conv2d(3, 16, 2, 2),
        Block(),
        Block(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 5),
    )
    x = torch.randn(3, 3, 16, 16)
    y = torch.randint(0, 5, (3,))
    return sgd_step(
        m, lambda: F.cross_entropy(m(x), y), torch.optim.AdamW(m.parameters(), 1e-3)
    )


class _SE(nn.Module):
    def __init__(self, c, r, act, gate):
        super().__init__()
        self.f1, self.f2 = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)
        self.act, self.gate = act, gate

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.f2(self.act(self.f1(s))))


def y_mobilenetv3():
    def ir(cin, cexp, cout, k, s, se):
        layers = [
            nn.Conv2d(cin, cexp, 1, bias=False),
            nn.BatchNorm2d(cexp),
            nn.Hardswish(),
            nn.Conv2d(cexp, cexp, k, s, k // 2, groups=cexp, bias=False),
            nn.BatchNorm2d(cexp),
            nn.Hardswish(),
        ]
        if se:
            layers.append(_SE(cexp, 8, nn.ReLU(), nn.Hardsigmoid()))
        layers += [nn.Conv2d(cexp, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers)

    class Res(nn.Module):
        def __init__(self, b):
            super().__init__()
            self.b = b

        def forward(self, x):
            return x + self.b(x)

    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, 2, 1, bias=False),
        nn.BatchNorm2d(8),
        nn.Hardswish(),
        ir(8, 16, 12, 3, 2, False),
        Res(ir(12, 24, 12, 5, 1, True)),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(12, 16),
        nn.Hardswish(),
        nn.Dropout(0.2),
        nn.Linear(16, 4),
    )
    x = torch.randn(2, 3, 16, 16)
    y = torch.tensor([1, 3])
    opt = torch.optim.RMSprop(
        m.parameters(), lr=1e-3, alpha=0.9, momentum=0.9, eps=1e-3
    )
    return sgd_step(m, lambda: F.cross_entropy(m(x), y), opt)


def y_efficientnet_mbconv():
    class MB(nn.Module):
        def __init__(self, c, e=4, k=3, dc=0.2):
            super().__init__()
            ce = c * e
            self.exp = nn.Sequential(
                nn.Conv2d(c, ce, 1, bias=False), nn.BatchNorm2d(ce), nn.SiLU()
            )
            self.dw = nn.Sequential(
                nn.Conv2d(ce, ce, k, 1, k // 2, groups=ce, bias=False),
                nn.BatchNorm2d(ce, momentum=0.01, eps=1e-3),
                nn.SiLU(),
            )
            self.se = _SE(ce, max(1, c // 4), nn.SiLU(), nn.Sigmoid())
            self.proj = nn.Sequential(
                nn.Conv2d(ce, c, 1, bias=False), nn.BatchNorm2d(c)
            )
            self.dc = dc

        def forward(self, x):
            y = self.proj(self.se(self.dw(self.exp(x))))
            if self.training:
                keep = torch.rand(x.shape[0], 1, 1, 1) >= self.dc
                y = y / (1 - self.dc) * keep
            return x + y

    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, 2, 1),
        nn.SiLU(),
        MB(8),
        MB(8, k=5),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    )
    x = torch.randn(2, 3, 16, 16)
    y = torch.tensor([0, 2])
    return sgd_step(m, lambda: F.cross_entropy(m(x), y, label_smoothing=0.1))


def y_unet3d_small():
    def cb(i, o):
        return nn.Sequential(
            nn.Conv3d(i, o, 3, padding=1),
            nn.GroupNorm(2, o),
            nn.ReLU(),
            nn.Conv3d(o, o, 3, padding=1),
            nn.ReLU(),
        )

    class U(nn.Module):
        def __init__(self):
            super().__init__()
            self.e1, self.e2 = cb(1, 4), cb(4, 8)
            self.d1 = cb(12, 4)
            self.head = nn.Conv3d(4, 2, 1)

        def forward(self, x):
            a = self.e1(x)
            b = self.e2(F.max_pool3d(a, 2))
            u = F.interpolate(b, scale_factor=2, mode="trilinear", align_corners=False)
            return self.head(self.d1(torch.cat([a, u], 1)))

    m = U()
    x = torch.randn(1, 1, 8, 8, 8)
    y = torch.randint(0, 2, (1, 8, 8, 8))
    return sgd_step(m, lambda: F.cross_entropy(m(x), y))


def y_pointnet2():
    def fps(xyz, n):
        B, N, _ = xyz.shape
        idx = torch.zeros(B, n, dtype=torch.long)
        dist = torch.full((B, N), 1e10)
        far = torch.zeros(B, dtype=torch.long)
        ar = torch.arange(B)
        for i in range(n):
            idx[:, i] = far
            c = xyz[ar, far][:, None]
            dist = torch.minimum(dist, ((xyz - c) ** 2).sum(-1))
            far = dist.argmax(-1)
        return idx

    def ball_query(xyz, centers, r, k):
        d = torch.cdist(centers, xyz)
        dd, gi = d.sort(-1)
        gi = gi[..., :k]
        first = gi[..., :1].expand_as(gi)
        return torch.where(dd[..., :k] > r, first, gi)

    class SA(nn.Module):
        def __init__(self, cin, cout, n, r, k):
            super().__init__()
            self.mlp = nn.Sequential(
                nn.Conv2d(cin + 3, cout, 1), nn.BatchNorm2d(cout), nn.ReLU()
            )
            self.n, self.r, self.k = n, r, k

        def forward(self, xyz, feat):
            B = xyz.shape[0]
            ci = fps(xyz, self.n)
            centers = xyz.gather(1, ci[..., None].expand(-1, -1, 3))
            gi = ball_query(xyz, centers, self.r, self.k)
            ar = torch.arange(B)[:, None, None]
            gx = xyz[ar, gi] - centers[:, :, None]
            gf = torch.cat([gx, feat[ar, gi]], -1)  # B n k C
            h = self.mlp(gf.permute(0, 3, 1, 2))
            return centers, h.max(-1)[0].transpose(1, 2)

    sa1, sa2 = SA(3, 16, 16, 0.4, 8), SA(16, 32, 4, 0.8, 4)
    head = nn.Linear(32, 5)
    m = nn.ModuleList([sa1, sa2, head])
    xyz = torch.rand(2, 64, 3)
    y = torch.tensor([1, 4])

    def loss():
        c, f = sa1(xyz, xyz)
        c, f = sa2(c, f)
        return F.cross_entropy(head(f.max(1)[0]), y)

    return sgd_step(m, loss)


def y_nerf_render():
    def posenc(x, L):
        f = 2.0 ** torch.arange(L) * math.pi
        xf = x[..., None] * f
        return torch.cat([x, xf.sin().flatten(-2), xf.cos().flatten(-2)], -1)

    mlp = nn.Sequential(
        nn.Linear(3 + 3 * 2 * 4, 32),
        nn.ReLU(),
        nn.Linear(32, 32),
        nn.ReLU(),
        nn.Linear(32, 4),
    )
    o = torch.randn(16, 3) * 0.1
    dirs = F.normalize(torch.randn(16, 3), dim=-1)
    target = torch.rand(16, 3)

    def render(t):
        pts = o[:, None] + dirs[:, None] * t[..., None]
        raw = mlp(posenc(pts, 4))
        sigma, rgb = F.relu(raw[..., 0]), torch.sigmoid(raw[..., 1:])
        delta = torch.cat([t[:, 1:] - t[:, :-1], torch.full_like(t[:, :1], 1e10)], -1)
        alpha = 1 - torch.exp(-sigma * delta)
        trans = torch.cumprod(
            torch.cat([torch.ones_like(alpha[:, :1]), 1 - alpha + 1e-10], -1), -1
        )
        w = alpha * trans[:, :-1]
        return (w[..., None] * rgb).sum(1), w

    def loss():
        t = torch.linspace(2.0, 6.0, 8).expand(16, 8)
        t = t + (torch.rand(16, 8) - 0.5) * (4.0 / 8)
        c0, w = render(t)
        w = w.detach()[:, 1:-1] + 1e-5
        pdf = w / w.sum(-1, keepdim=True)
        cdf = torch.cat([torch.zeros_like(pdf[:, :1]), torch.cumsum(pdf, -1)], -1)
        mids = 0.5 * (t[:, 1:] + t[:, :-1])
        u = torch.rand(16, 8).contiguous()
        inds = torch.searchsorted(cdf, u, right=True)
        below = (inds - 1).clamp(min=0)
        above = inds.clamp(max=cdf.shape[-1] - 1)
        cb, ca = cdf.gather(1, below), cdf.gather(1, above)
        bb, ba = mids.gather(1, below), mids.gather(1, above)
        denom = torch.where(ca - cb < 1e-5, torch.ones_like(ca), ca - cb)
        ts = bb + (u - cb) / denom * (ba - bb)
        tf, _ = torch.sort(torch.cat([t, ts.detach()], -1), -1)
        c1, _ = render(tf)
        return F.mse_loss(c0, target) + F.mse_loss(c1, target)

    return sgd_step(mlp, loss, torch.optim.Adam(mlp.parameters(), lr=5e-4))


def y_gat_scatter_softmax():
    N, E, d, h = 10, 30, 8, 2
    src = torch.randint(0, N, (E,))
    dst = torch.randint(0, N, (E,))
    x = torch.randn(N, d)
    lin = nn.Linear(d, h * d, bias=False)
    a_src, a_dst = nn.Parameter(torch.randn(h, d)), nn.Parameter(torch.randn(h, d))
    m = nn.ModuleList([lin])

    def loss():
        z = lin(x).view(N, h, d)
        e = F.leaky_relu(
            (z * a_src).sum(-1)[src] + (z * a_dst).sum(-1)[dst], 0.2
        )  # E h
        mx = torch.full((N, h), float("-inf")).scatter_reduce(
            0, dst[:, None].expand(-1, h), e, "amax", include_self=True
        )
        ex = torch.exp(e - mx[dst])
        den = torch.zeros(N, h).index_add_(0, dst, ex)
        alpha = ex / (den[dst] + 1e-16)
        out = torch.zeros(N, h, d).index_add_(0, dst, alpha[..., None] * z[src])
        return F.elu(out).pow(2).mean()

    return sgd_step(m, loss, torch.optim.Adam([*m.parameters(), a_src, a_dst], lr=1e-3))


def y_graphsage_sampling():
    N, d = 40, 8
    adj = torch.rand(N, N) < 0.15
    adj = adj | adj.t()
    feats = torch.randn(N, d)
    labels = torch.randint(0, 3, (N,))
    l1, l2 = nn.Linear(2 * d, 16), nn.Linear(32, 3)
    m = nn.ModuleList([l1, l2])

    def sample(nodes, k):
        rows, cols = [], []
        for i, n in enumerate(nodes.tolist()):
            nb = adj[n].nonzero().flatten()
            if nb.numel() == 0:
                nb = torch.tensor([n])
            pick = nb[torch.randperm(nb.numel())[:k]]
            rows.append(torch.full((pick.numel(),), i))
            cols.append(pick)
        return torch.cat(rows), torch.cat(cols)

    def agg(h_self, h_all, rows, cols, lin):
        s = torch.zeros(h_self.shape[0], h_all.shape[1]).index_add_(
            0, rows, h_all[cols]
        )
        cnt = torch.bincount(rows, minlength=h_self.shape[0]).clamp(min=1)
        return F.normalize(
            F.relu(lin(torch.cat([h_self, s / cnt[:, None]], -1))), dim=-1
        )

    def loss():
        batch = torch.randperm(N)[:6]
        r1, c1 = sample(batch, 3)
        hop1, inv = torch.unique(torch.cat([batch, c1]), return_inverse=True)
        r2, c2 = sample(hop1, 3)
        h1 = agg(feats[hop1], feats, r2, c2, l1)  # hop1 nodes
        hb = h1[inv[: batch.numel()]]
        hn = h1[inv[batch.numel() :]]
        s = torch.zeros(batch.numel(), 16).index_add_(0, r1, hn)
        cnt = torch.bincount(r1, minlength=batch.numel()).clamp(min=1)
        out = l2(torch.cat([hb, s / cnt[:, None]], -1))
        return F.cross_entropy(out, labels[batch])

    return sgd_step(m, loss)


def y_dcnv2_din():
    class Rec(nn.Module):
        def __init__(self, n_items=50, d=8, L=2):
            super().__init__()
            self.item = nn.Embedding(n_items, d, padding_idx=0)
            self.dense = nn.Linear(4, d)
            D = 3 * d
            self.cross_w = nn.ModuleList([nn.Linear(D, D) for _ in range(L)])
            self.att = nn.Sequential(nn.Linear(4 * d, 16), nn.PReLU(), nn.Linear(16, 1))
            self.deep = nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, 1))

        def forward(self, hist, target, dense):
            eh, et = self.item(hist), self.item(target)  # B T d, B d
            q = et[:, None].expand_as(eh)
            w = self.att(torch.cat([q, eh, q - eh, q * eh], -1)).squeeze(-1)
            w = w.masked_fill(hist == 0, 0.0)  # DIN: no softmax
            user = (w[..., None] * eh).sum(1)
            x0 = torch.cat([user, et, self.dense(dense)], -1)
            x = x0
            for lin in self.cross_w:
                x = x0 * lin(x) + x
            return self.deep(x).squeeze(-1)

    m = Rec()
    hist = torch.randint(1, 50, (4, 6))
    hist[0, 4:] = 0
    hist[2, 2:] = 0
    target = torch.randint(1, 50, (4,))
    dense = torch.randn(4, 4)
    y = torch.tensor([1.0, 0.0, 1.0, 0.0])
    return sgd_step(
        m,
        lambda: F.binary_cross_entropy_with_logits(m(hist, target, dense), y),
        torch.optim.Adagrad(m.parameters(), lr=1e-2),
    )


def y_two_tower_hash():
    buckets = 97
    uemb, iemb = nn.EmbeddingBag(buckets, 16, mode="sum"), nn.Embedding(buckets, 16)
    ut, it = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 8)), nn.Linear(
        16, 8
    )
    m = nn.ModuleList([uemb, iemb, ut, it])
    raw_user = torch.randint(0, 10**9, (6, 3))
    raw_item = torch.randint(0, 10**9, (6,))
    logq = torch.log(torch.rand(6) * 0.5 + 0.1)
    temp = 0.05

    def loss():
        uh = torch.remainder(raw_user * 31 + 7, buckets)
        ih = (raw_item * 17 + 3) % buckets
        u = F.normalize(ut(uemb(uh)), dim=-1)
        i = F.normalize(it(iemb(ih)), dim=-1)
        logits = u @ i.t() / temp - logq[None]
        return F.cross_entropy(logits, torch.arange(6))

    return sgd_step(m, loss, torch.optim.Adam(m.parameters(), lr=1e-3))


def y_segment_reduce_offsets():
    lin = nn.Linear(6, 6)
    x = torch.randn(11, 6)
    offsets = torch.tensor([0, 3, 3, 7, 11])

    def loss():
        h = lin(x)
        mx = torch.segment_reduce(h, "max", offsets=offsets, unsafe=True, initial=0.0)
        sm = torch.segment_reduce(h, "sum", offsets=offsets, axis=0)
        return mx.pow(2).mean() + sm.pow(2).mean()

    return sgd_step(lin, loss)


def y_tcn_dilated():
    class Block(nn.Module):
        def __init__(self, cin, cout, dil, k=3):
            super().__init__()
            self.c1 = nn.utils.parametrizations.weight_norm(
                nn.Conv1d(cin, cout, k, dilation=dil)
            )
            self.c2 = nn.utils.parametrizations.weight_norm(
                nn.Conv1d(cout, cout, k, dilation=dil)
            )
            self.down = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()
            self.pad = (k - 1) * dil

        def forward(self, x):
            y = F.dropout(F.relu(self.c1(F.pad(x, (self.pad, 0)))), 0.1, self.training)
            y = F.dropout(F.relu(self.c2(F.pad(y, (self.pad, 0)))), 0.1, self.training)
            return F.relu(y + self.down(x))

    m = nn.Sequential(
        Block(3, 8, 1), Block(8, 8, 2), Block(8, 8, 4), nn.Conv1d(8, 1, 1)
    )
    x = torch.randn(2, 3, 20)
    y = torch.randn(2, 1, 20)
    return sgd_step(m, lambda: F.mse_loss(m(x), y))


def y_informer_probsparse():
    d, h, L = 16, 2, 12
    qkv, o = nn.Linear(d, 3 * d), nn.Linear(d, d)
    m = nn.ModuleList([qkv, o])
    x = torch.randn(2, L, d)
    factor = 2

    def loss():
        B = x.shape[0]
        q, k, v = qkv(x).view(B, L, 3, h, d // h).permute(2, 0, 3, 1, 4)
        u = min(factor * math.ceil(math.log(L)), L)
        idx = torch.randint(L, (L, u))
        ks = k[:, :, idx]  # B h L u dh
        qk = (q[..., None, :] * ks).sum(-1)
        M = qk.max(-1)[0] - qk.sum(-1) / L
        top = M.topk(u, sorted=False)[1]  # B h u
        qr = q.gather(2, top[..., None].expand(-1, -1, -1, d // h))
        sc = qr @ k.transpose(-1, -2) / math.sqrt(d // h)
        ctx = v.mean(2, keepdim=True).expand(-1, -1, L, -1).clone()
        upd = sc.softmax(-1) @ v
        ctx = ctx.scatter(2, top[..., None].expand(-1, -1, -1, d // h), upd)
        return o(ctx.transpose(1, 2).reshape(B, L, d)).pow(2).mean()

    return sgd_step(m, loss)


def y_conformer_block():
    class Conformer(nn.Module):
        def __init__(self, d=16, h=2, k=7, maxrel=8):
            super().__init__()
            self.ff1 = nn.Sequential(
                nn.LayerNorm(d),
                nn.Linear(d, 4 * d),
                nn.SiLU(),
                nn.Dropout(0.1),
                nn.Linear(4 * d, d),
            )
            self.ff2 = nn.Sequential(
                nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d)
            )
            self.ln_att = nn.LayerNorm(d)
            self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.rel = nn.Embedding(2 * maxrel + 1, h)
            self.ln_conv = nn.LayerNorm(d)
            self.pw1 = nn.Conv1d(d, 2 * d, 1)
            self.dw = nn.Conv1d(d, d, k, padding=k // 2, groups=d)
            self.bn = nn.BatchNorm1d(d)
            self.pw2 = nn.Conv1d(d, d, 1)
            self.ln_out = nn.LayerNorm(d)
            self.h, self.maxrel = h, maxrel

        def forward(self, x, pad):
            B, L, d = x.shape
            x = x + 0.5 * self.ff1(x)
            q, k, v = (
                self.qkv(self.ln_att(x))
                .view(B, L, 3, self.h, d // self.h)
                .permute(2, 0, 3, 1, 4)
            )
            pos = torch.arange(L)
            rel = (pos[None] - pos[:, None]).clamp(
                -self.maxrel, self.maxrel
            ) + self.maxrel
            bias = self.rel(rel).permute(2, 0, 1)[None]
            s = q @ k.transpose(-1, -2) / math.sqrt(d // self.h) + bias
            s = s.masked_fill(pad[:, None, None, :], float("-inf"))
            x = x + self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, d))
            c = self.ln_conv(x).masked_fill(pad[..., None], 0.0).transpose(1, 2)
            c = F.glu(self.pw1(c), dim=1)
            c = self.pw2(F.silu(self.bn(self.dw(c))))
            x = x + c.transpose(1, 2)
            x = x + 0.5 * self.ff2(x)
            return self.ln_out(x)

    m = Conformer()
    x = torch.randn(2, 10, 16)
    pad = torch.zeros(2, 10, dtype=torch.bool)
    pad[1, 7:] = True
    return sgd_step(m, lambda: m(x, pad).masked_fill(pad[..., None], 0).pow(2).mean())


def y_sd_crossattn_block():
    class Block(nn.Module):
        def __init__(self, c=16, ctx=12, h=2, tdim=16):
            super().__init__()
            self.n1, self.n2 = nn.GroupNorm(4, c), nn.GroupNorm(4, c)
            self.c1, self.c2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(
                c, c, 3, padding=1
            )
            self.temb = nn.Linear(tdim, c)
            self.norm_t = nn.GroupNorm(4, c, eps=1e-6)
            self.proj_in, self.proj_out = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 1)
            self.ln1, self.ln2, self.ln3 = (
                nn.LayerNorm(c),
                nn.LayerNorm(c),
                nn.LayerNorm(c),
            )
            self.q1, self.kv1, self.o1 = (
                nn.Linear(c, c, bias=False),
                nn.Linear(c, 2 * c, bias=False),
                nn.Linear(c, c),
            )
            self.q2, self.kv2, self.o2 = (
                nn.Linear(c, c, bias=False),
                nn.Linear(ctx, 2 * c, bias=False),
                nn.Linear(c, c),
            )
            self.geglu, self.ff = nn.Linear(c, 8 * c), nn.Linear(4 * c, c)
            self.h, self.tdim = h, tdim

        def mha(self, q, kv, o):
            B, N, c = q.shape
            k, v = kv.chunk(2, -1)

            def sp(t):
                return t.view(B, -1, self.h, c // self.h).transpose(1, 2)

            a = F.scaled_dot_product_attention(sp(q), sp(k), sp(v))
            return o(a.transpose(1, 2).reshape(B, N, c))

        def forward(self, x, t, ctx):
            half = self.tdim // 2
            f = torch.exp(-math.log(10000) * torch.arange(half) / half)
            te = torch.cat([torch.cos(t[:, None] * f), torch.sin(t[:, None] * f)], -1)
            hdn = self.c1(F.silu(self.n1(x))) + self.temb(F.silu(te))[..., None, None]
            hdn = self.c2(F.dropout(F.silu(self.n2(hdn)), 0.0))
            x = x + hdn
            B, c, H, W = x.shape
            y = self.proj_in(self.norm_t(x)).flatten(2).transpose(1, 2)
            z = self.ln1(y)
            y = y + self.mha(self.q1(z), self.kv1(z), self.o1)
            z = self.ln2(y)
            y = y + self.mha(self.q2(z), self.kv2(ctx), self.o2)
            a, g = self.geglu(self.ln3(y)).chunk(2, -1)
            y = y + self.ff(a * F.gelu(g))
            return x + self.proj_out(y.transpose(1, 2).reshape(B, c, H, W))

    m = Block()
    x = torch.randn(2, 16, 6, 6)
    t = torch.tensor([10.0, 500.0])
    ctx = torch.randn(2, 5, 12)
    return sgd_step(m, lambda: F.mse_loss(m(x, t, ctx), torch.zeros(2, 16, 6, 6)))


# -- training tricks -----------------------------------------------------------------


def y_swa_update_bn():
    from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

    m = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    swa = AveragedModel(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    sched = SWALR(opt, swa_lr=0.01, anneal_epochs=2, anneal_strategy="cos")
    loader = [torch.randn(4, 8) for _ in range(2)]
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))

    def step():
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
        swa.update_parameters(m)
        sched.step()
        update_bn(loader, swa)

    return step


def y_lora_merge():
    class LoRA(nn.Module):
        def __init__(self, i, o, r=4, alpha=8):
            super().__init__()
            self.base = nn.Linear(i, o)
            self.base.requires_grad_(False)
            self.A = nn.Parameter(torch.randn(r, i) * 0.01)
            self.B = nn.Parameter(torch.zeros(o, r))
            self.scale = alpha / r
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            return self.base(x) + (self.drop(x) @ self.A.t() @ self.B.t()) * self.scale

        @torch.no_grad()
        def merged(self):
            return self.base.weight + (self.B @ self.A) * self.scale

    m = nn.Sequential(LoRA(16, 16), nn.GELU(), LoRA(16, 4))
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)
    x = torch.randn(4, 16)

    def step():
        m.train()
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()
        with torch.no_grad():  # merged eval path beside the unmerged one
            h = F.linear(x, m[0].merged(), m[0].base.bias)
            h = F.linear(F.gelu(h), m[2].merged(), m[2].base.bias)
            m.eval()
            return (h - m(x)).abs().max()

    return step


def y_stochastic_depth():
    class Res(nn.Module):
        def __init__(self, d, p):
            super().__init__()
            self.f = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU())
            self.p = p

        def forward(self, x):
            keep = (torch.rand(x.shape[0], 1) > self.p).to(x.dtype)
            return x + self.f(x) * keep / (1 - self.p)

    m = nn.Sequential(*[Res(16, 0.1 * (i + 1)) for i in range(4)], nn.Linear(16, 3))
    x, y = torch.randn(6, 16), torch.randint(0, 3, (6,))
    return sgd_step(m, lambda: F.cross_entropy(m(x), y))


def y_label_smooth_weighted():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))
    w = torch.tensor([0.5, 1.0, 2.0, 1.5, 0.2])
    x = torch.randn(2, 8, 3)
    y = torch.randint(0, 5, (2, 3))
    y[0, 1] = -100

    def loss():
        logits = m(x.transpose(1, 2)).transpose(1, 2)  # B C T
        return F.cross_entropy(logits, y, weight=w, label_smoothing=0.15)

    return sgd_step(m, loss)


def y_lars_lamb():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ps = list(m.parameters())
    mom = [torch.zeros_like(p) for p in ps]
    ema1 = [torch.zeros_like(p) for p in ps]
    ema2 = [torch.zeros_like(p) for p in ps]
    state = {"t": 0}
    x, y = torch.randn(6, 8), torch.randn(6, 4)

    def step():
        for p in ps:
            p.grad = None
        F.mse_loss(m(x), y).backward()
        state["t"] += 1
        t = state["t"]
        with torch.no_grad():
            for i, p in enumerate(ps):
                g = p.grad
                if i < 2:  # LARS on the first layer
                    wn, gn = p.norm(), g.norm()
                    trust = torch.where(
                        (wn > 0) & (gn > 0), 0.001 * wn / (gn + 1e-4 * wn), 1.0
                    )
                    mom[i].mul_(0.9).add_(g + 1e-4 * p, alpha=float(1)).mul_(trust)
                    p.sub_(mom[i], alpha=0.1)
                else:  # LAMB on the rest
                    ema1[i].mul_(0.9).add_(g, alpha=0.1)
                    ema2[i].mul_(0.999).addcmul_(g, g, value=0.001)
                    mh = ema1[i] / (1 - 0.9**t)
                    vh = ema2[i] / (1 - 0.999**t)
                    r = mh / (vh.sqrt() + 1e-6) + 0.01 * p
                    ratio = torch.where(
                        p.norm() > 0, p.norm() / r.norm().clamp(min=1e-12), 1.0
                    )
                    p.sub_(0.01 * ratio * r)

    return step


def y_lion_schedule_free():
    """Lion (sign of an interpolated momentum, lerp_) on one model; schedule-free SGD
    (gradient at y = lerp(z, x), z stepped, x averaged) on another."""
    m1 = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    m2 = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    p1, p2 = list(m1.parameters()), list(m2.parameters())
    exp_avg = [torch.zeros_like(p) for p in p1]
    z = [p.detach().clone() for p in p2]
    xs = [p.detach().clone() for p in p2]
    st = {"k": 0}
    x, y = torch.randn(6, 8), torch.randn(6, 1)

    def step():
        for p in p1 + p2:
            p.grad = None
        F.mse_loss(m1(x), y).backward()
        with torch.no_grad():
            for p, ea in zip(p1, exp_avg, strict=True):
                p.mul_(1 - 1e-4 * 0.01)
                upd = ea.lerp(p.grad, 1 - 0.9).sign_()
                p.add_(upd, alpha=-1e-4)
                ea.lerp_(p.grad, 1 - 0.99)
        st["k"] += 1
        c = 1.0 / (st["k"] + 1)
        with torch.no_grad():
            for p, zi, xi in zip(p2, z, xs, strict=True):
                p.copy_(torch.lerp(zi, xi, 0.9))  # y
        F.mse_loss(m2(x), y).backward()
        with torch.no_grad():
            for p, zi, xi in zip(p2, z, xs, strict=True):
                zi.sub_(p.grad, alpha=0.05)
                xi.lerp_(zi, c)
                p.copy_(xi)

    return step


def y_bf16_autocast_cnn():
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.GroupNorm(2, 8),
        nn.SiLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(32, 4),
    )
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 3])

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
            loss = F.cross_entropy(out, y) + out.float().softmax(-1).pow(2).mean()
        loss.backward()
        opt.step()

    return step


def y_float64_train():
    m = nn.Sequential(
        nn.Linear(6, 16), nn.Softplus(), nn.LayerNorm(16), nn.Linear(16, 1)
    ).double()
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.randn(8, 1, dtype=torch.float64)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, amsgrad=True)
    return sgd_step(
        m,
        lambda: F.smooth_l1_loss(m(x), y)
        + 1e-3
        * torch.logdet(
            m[0].weight.t() @ m[0].weight + torch.eye(6, dtype=torch.float64)
        ),
        opt,
    )


def y_grad_accum_keep():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9, weight_decay=1e-4)
    xs = torch.randn(3, 4, 8)
    ys = torch.randint(0, 2, (3, 4))

    def step():
        opt.zero_grad(set_to_none=False)
        for i in range(3):
            (F.cross_entropy(m(xs[i]), ys[i]) / 3).backward()
        opt.step()

    return step


def y_clip_value_deterministic():
    emb = nn.Embedding(20, 8)
    lin = nn.Linear(8, 3)
    m = nn.ModuleList([emb, lin])
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    idx = torch.randint(0, 20, (10,))
    seg = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 3, 3])

    def step():
        prev = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            opt.zero_grad()
            h = emb(idx)
            pooled = torch.zeros(4, 8).index_add(0, seg, h)
            pooled = pooled.scatter_add(0, seg[:4, None].expand(-1, 8), h[:4])
            loss = lin(pooled).logsumexp(-1).mean()
            loss.backward()
            nn.utils.clip_grad_value_(m.parameters(), 0.01, foreach=False)
            opt.step()
        finally:
            torch.use_deterministic_algorithms(prev)

    return step


def y_tied_lm_head():
    class TinyLM(nn.Module):
        def __init__(self, V=50, d=16, L=8):
            super().__init__()
            self.tok, self.pos = nn.Embedding(V, d), nn.Parameter(torch.zeros(L, d))
            self.layer = nn.TransformerEncoderLayer(
                d, 2, 32, dropout=0.0, batch_first=True, norm_first=True
            )
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, V, bias=False)
            self.head.weight = self.tok.weight
            self.register_buffer(
                "mask", nn.Transformer.generate_square_subsequent_mask(L)
            )

        def forward(self, t):
            h = self.tok(t) * math.sqrt(self.tok.embedding_dim) + self.pos[: t.shape[1]]
            h = self.layer(h, src_mask=self.mask, is_causal=True)
            return self.head(self.ln(h))

    m = TinyLM()
    t = torch.randint(0, 50, (2, 8))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)
    return sgd_step(
        m, lambda: F.cross_entropy(m(t)[:, :-1].flatten(0, 1), t[:, 1:].flatten()), opt
    )


# -- harder variants (added after the 39 above all passed) ----------------------------


def y_hf_generate_processors():
    m = _llama()
    ids = torch.randint(3, 96, (2, 5))

    def step():
        torch.manual_seed(3)
        return m.generate(
            ids,
            do_sample=True,
            min_p=0.05,
            typical_p=0.9,
            epsilon_cutoff=1e-4,
            bad_words_ids=[[5], [7, 8]],
            sequence_bias={(9,): -2.0},
            num_return_sequences=2,
            output_scores=True,
            return_dict_in_generate=True,
            max_new_tokens=4,
            min_new_tokens=4,
        )

    return step


def y_hf_prompt_lookup():
    m = _llama()
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 9, 5, 6]])
    return lambda: m.generate(
        ids,
        prompt_lookup_num_tokens=3,
        max_new_tokens=5,
        min_new_tokens=5,
        do_sample=False,
    )


def y_hf_mistral_sliding():
    m = _tiny_lm("Mistral", sliding_window=4)
    ids = torch.randint(3, 96, (2, 6))
    return lambda: m.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False)


def y_hf_llama_dynamic_rope():
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    m = _tiny_lm("Llama", max_position_embeddings=8, rope_parameters=rope)
    ids = torch.randint(3, 96, (1, 6))
    return lambda: m.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)


def y_hf_gemma2_softcap():
    m = _tiny_lm("Gemma2", head_dim=8, sliding_window=4, final_logit_softcapping=30.0,
                 attn_logit_softcapping=50.0)
    ids = torch.randint(3, 96, (2, 6))
    return lambda: m.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)


def y_bf16_stochastic_round():
    """bf16 weights updated with stochastic rounding: the fp32 update's bits viewed as
    int32, random low bits added, the low half masked off, viewed back and cast."""
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(torch.bfloat16)
    x, y = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(
        4, 2, dtype=torch.bfloat16
    )

    def step():
        for p in m.parameters():
            p.grad = None
        F.mse_loss(m(x).float(), y.float()).backward()
        with torch.no_grad():
            for p in m.parameters():
                upd = p.float() - 1e-2 * p.grad.float()
                bits = upd.view(torch.int32)
                noise = torch.randint_like(bits, 0, 1 << 16)
                rounded = ((bits + noise) & -65536).view(torch.float32)
                p.copy_(rounded.to(torch.bfloat16))

    return step


def y_as_strided_windows():
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 10, 4)

    def loss():
        h = lin(x).contiguous()
        B, L, D = h.shape
        w = h.as_strided((B, L - 2, 3, D), (L * D, D, D, 1))  # overlapping windows
        return w.amax(2).pow(2).mean() + w.mean()

    return sgd_step(lin, loss)


def y_sdpa_causal_bias():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    qp, kvp = nn.Linear(16, 16), nn.Linear(16, 16)
    m = nn.ModuleList([qp, kvp])
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 7, 16)

    def loss():
        q = qp(x).view(2, 3, 4, 4).transpose(1, 2)
        k, v = kvp(mem).view(2, 7, 2, 8).transpose(1, 2).chunk(2, -1)
        bias = causal_lower_right(3, 7)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
        with sdpa_kernel(SDPBackend.MATH):
            b = F.scaled_dot_product_attention(
                q, k, v, is_causal=False, enable_gqa=True, scale=0.3
            )
        return (a + b).pow(2).mean()

    return sgd_step(m, loss)


def y_index_reduce_family():
    lin = nn.Linear(4, 4)
    x = torch.randn(9, 4)
    idx = torch.tensor([0, 2, 2, 1, 0, 3, 3, 3, 1])

    def loss():
        h = lin(x)
        a = torch.zeros(4, 4).index_reduce_(0, idx, h, "amax", include_self=False)
        b = torch.ones(4, 4).index_reduce(0, idx, h, "mean", include_self=True)
        c = torch.zeros(4, 4).scatter_reduce(
            0, idx[:, None].expand(-1, 4), h, "mean", include_self=False
        )
        d = torch.ones(4, 4).scatter_reduce(
            0, idx[:, None].expand(-1, 4), h.sigmoid(), "prod"
        )
        return a.sum() + b.pow(2).sum() + c.pow(2).sum() + d.sum()

    return sgd_step(lin, loss)


def y_paged_pool_views():
    """A paged cache as (blocks, block_size, heads, dim): 2-D block-table indexing,
    index_put_ with accumulate, masked_scatter_, all under deterministic algorithms."""
    nblk, bs, h, d = 8, 4, 2, 4
    pool = torch.zeros(nblk, bs, h, d)
    table = torch.tensor([[2, 5], [7, 0]])
    q = nn.Linear(h * d, h * d)
    x = torch.randn(2, h * d)

    def step():
        prev = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            with torch.no_grad():
                pool.zero_()
                blk = torch.tensor([2, 7, 2])
                off = torch.tensor([1, 3, 1])
                pool.index_put_((blk, off), torch.randn(3, h, d), accumulate=True)
                sel = torch.zeros(nblk, bs, h, d, dtype=torch.bool)
                sel[5, :2] = True
                pool.masked_scatter_(sel, torch.randn(2 * h * d))
                kv = pool[table].flatten(1, 2)  # B, 2*bs, h, d
                qq = q(x).view(2, h, 1, d)
                return (qq @ kv.permute(0, 2, 3, 1)).softmax(-1) @ kv.transpose(1, 2)
        finally:
            torch.use_deterministic_algorithms(prev)

    return step


def y_order_stats_misc():
    lin = nn.Linear(6, 6)
    x = torch.randn(5, 6)
    x[1, 2] = float("nan")
    cls = torch.tensor([0, 1, 1, 2, 2, 2, 0, 1])

    def loss():
        h = lin(torch.nan_to_num(x))
        kv = h.kthvalue(2, dim=1).values
        mo = h.round().mode(1).values
        nm = torch.where(torch.isnan(x), x, h).nanmedian(1).values
        ta = torch.take_along_dim(h, h.argsort(1)[:, :2], 1)
        pu = h.clone().put_(
            torch.tensor([0, 7, 29]), torch.ones(3) * h.mean(), accumulate=True
        )
        fi = h.index_fill(1, torch.tensor([0, 5]), 0.0)
        uc, cnt = torch.unique_consecutive(cls, return_counts=True)
        bc = torch.bincount(cls, weights=torch.linspace(0, 1, 8))
        return (
            kv.sum()
            + mo.sum()
            + nm.sum()
            + ta.sum()
            + pu.sum()
            + fi.sum()
            + (uc.float() * cnt).sum() * bc.sum()
        )

    return sgd_step(lin, loss)


def y_functional_soup():
    from torch.func import functional_call, stack_module_state

    models = [
        nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)) for _ in range(3)
    ]
    base = models[0]
    params, bufs = stack_module_state(models)
    x = torch.randn(4, 6)
    head = nn.Linear(8, 2)

    def loss():
        soup = {k: v.mean(0) for k, v in params.items()}
        out = functional_call(base, soup, (x,))
        tied = functional_call(
            base,
            {**soup, "2.weight": head.weight},
            (x,),
            tie_weights=True,
            strict=False,
        )
        return out.pow(2).mean() + tied.pow(2).mean()

    return sgd_step(head, loss)


def y_one_hot_inferred():
    lin = nn.Linear(5, 5)
    x = torch.randn(6, 5)
    y = torch.tensor([0, 4, 2, 1, 4, 3])

    def loss():
        t = F.one_hot(y).float()  # num_classes from the labels' max
        w = torch.bincount(y).float()
        return (F.log_softmax(lin(x), -1) * t).sum(-1).mean().neg() + w.max() * 0

    return sgd_step(lin, loss)


def y_unique_dim_edges():
    emb = nn.Embedding(10, 4)
    edges = torch.tensor([[0, 1, 1, 2, 0, 3, 1], [1, 2, 2, 3, 1, 0, 2]])

    def loss():
        e, cnt = torch.unique(edges, dim=1, return_counts=True)
        msg = emb(e[0]) * cnt[:, None].float()
        out = torch.zeros(10, 4).index_add(0, e[1], msg)
        return out.pow(2).mean()

    return sgd_step(emb, loss)


def y_gp_cholesky_buffer():
    """An exact GP's marginal likelihood on fixed training inputs: the RBF Gram matrix
    kept as a buffer, scaled by a learned output scale plus learned noise, factorised
    by cholesky, solved against, its log-determinant from the diagonal."""

    class GP(nn.Module):
        def __init__(self, n=8):
            super().__init__()
            xs = torch.linspace(0, 1, n)[:, None]
            self.register_buffer("gram", torch.exp(-torch.cdist(xs, xs) ** 2 / 0.1))
            self.register_buffer("y", torch.sin(6 * xs).squeeze(-1))
            self.log_scale = nn.Parameter(torch.zeros(()))
            self.log_noise = nn.Parameter(torch.tensor(-2.0))

        def forward(self):
            n = self.gram.shape[0]
            K = self.gram * self.log_scale.exp() + self.log_noise.exp() * torch.eye(n)
            L = torch.linalg.cholesky(K)
            alpha = torch.cholesky_solve(self.y[:, None], L)
            return 0.5 * (self.y[:, None] * alpha).sum() + L.diagonal().log().sum()

    m = GP()
    return sgd_step(m, m, torch.optim.Adam(m.parameters(), lr=1e-2))


def y_welford_norm_sqrt():
    class RunningNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.register_buffer("mean", torch.zeros(d))
            self.register_buffer("sq", torch.ones(d))

        def forward(self, x):
            if self.training:
                with torch.no_grad():
                    self.mean.mul_(0.99).add_(x.mean(0), alpha=0.01)
                    self.sq.mul_(0.99).add_(x.pow(2).mean(0), alpha=0.01)
            std = (self.sq - self.mean.pow(2)).sqrt() + 1e-5
            return (x - self.mean) / std

    m = nn.Sequential(RunningNorm(6), nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    x, y = torch.randn(8, 6) * 3 + 1, torch.randn(8, 1)
    return sgd_step(m, lambda: F.mse_loss(m(x), y))


def y_param_data_swap():
    base = nn.Linear(8, 8)
    A, B = nn.Parameter(torch.randn(2, 8) * 0.1), nn.Parameter(torch.zeros(8, 2))
    head = nn.Linear(8, 2)
    x = torch.randn(4, 8)
    opt = torch.optim.SGD([A, B, *head.parameters()], lr=1e-2)
    w0 = base.weight.detach().clone()

    def step():
        opt.zero_grad()
        base.weight.data = w0.clone()  # unmerge
        out = head(base(x) + x @ A.t() @ B.t())
        out.pow(2).mean().backward()
        opt.step()
        base.weight.data = (
            base.weight.data + B.detach() @ A.detach()
        )  # merge for serving
        return head(base(x))

    return step


def y_int4_unpack_dequant():
    """Weight-only int4: two nibbles per uint8 unpacked with shifts and masks, grouped
    scales and zero points, dequantised and multiplied; a LoRA on top trains."""
    out_f, in_f, g = 8, 16, 8
    packed = torch.randint(0, 256, (out_f, in_f // 2), dtype=torch.uint8)
    scales = torch.rand(out_f, in_f // g) * 0.02 + 0.01
    zeros = torch.full((out_f, in_f // g), 8.0)
    lora_a = nn.Parameter(torch.randn(2, in_f) * 0.1)
    lora_b = nn.Parameter(torch.zeros(out_f, 2))
    m = nn.ParameterList([lora_a, lora_b])
    x = torch.randn(3, in_f)

    def loss():
        lo, hi = packed & 0x0F, (packed >> 4) & 0x0F
        q = torch.stack([lo, hi], -1).view(out_f, in_f).to(torch.float32)
        w = ((q.view(out_f, -1, g) - zeros[..., None]) * scales[..., None]).view(
            out_f, in_f
        )
        return (x @ w.t() + x @ lora_a.t() @ lora_b.t()).pow(2).mean()

    return sgd_step(m, loss)


def y_concrete_dropout():
    class CD(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.lin = nn.Linear(d, d)
            self.p_logit = nn.Parameter(torch.tensor(-2.0))
            self.register_buffer("keep", torch.full((d,), 0.9))

        def forward(self, x):
            p = torch.sigmoid(self.p_logit)
            u = torch.rand_like(x)
            drop = torch.sigmoid(
                (torch.log(p) - torch.log1p(-p) + torch.log(u) - torch.log1p(-u)) / 0.1
            )
            hard = torch.bernoulli(self.keep.expand_as(x))
            return self.lin(x * (1 - drop) / (1 - p) * hard)

    m = nn.Sequential(CD(8), nn.ReLU(), nn.Linear(8, 1))
    x, y = torch.randn(6, 8), torch.randn(6, 1)
    return sgd_step(m, lambda: F.mse_loss(m(x), y))


def y_labels_pad_to_ignore():
    """HF's collator idiom: ``labels[labels == pad_id] = -100`` before the LM loss."""
    emb, head = nn.Embedding(12, 8), nn.Linear(8, 12)
    m = nn.ModuleList([emb, head])
    ids = torch.randint(1, 12, (2, 6))
    ids[1, 4:] = 0

    def loss():
        labels = ids.clone()
        labels[labels == 0] = -100
        logits = head(emb(ids))
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())

    return sgd_step(m, loss)


# -- minimal repros --------------------------------------------------------------------


def y_setitem_literal_bool_min():
    """hf_generate_processors: ``mask[..., :1] = False`` lifts the literal to a 0-d
    tensor (aten::lift_fresh, no value in the trace); the replay fills it at random."""
    logits = torch.randn(4, 8)

    def step():
        with torch.no_grad():
            remove = logits > -1e9  # every token removed ...
            remove[:, :1] = False  # ... but the first kept
            p = logits.masked_fill(remove, float("-inf")).softmax(-1)
            return torch.multinomial(p, 1)

    return step


def y_setitem_literal_long_min():
    """The same with an integer tensor: the literal 0 is filled 1..7 (never 0)."""
    logits = torch.randn(4, 8)

    def step():
        with torch.no_grad():
            remove = (logits > -1e9).long()
            remove[:, :1] = 0
            p = logits.masked_fill(remove.bool(), float("-inf")).softmax(-1)
            return torch.multinomial(p, 1)

    return step


def y_cholesky_computed_min():
    """gp_cholesky_buffer: cholesky of a matrix computed from a buffer (``K * s``): the
    positive-definite fill reaches only a cholesky argument that is itself an input."""
    K = torch.eye(4) + 0.5
    s = nn.Parameter(torch.ones(()))

    def step():
        s.grad = None
        torch.linalg.cholesky(K * s).diagonal().log().sum().backward()
        with torch.no_grad():
            s.sub_(1e-3 * s.grad)

    return step


def y_sqrt_of_difference_min():
    """welford_norm_sqrt: ``(sq - mean ** 2).sqrt()`` over two buffers; nothing keeps
    ``sq`` above ``mean ** 2``, the square root is NaN and the weights follow."""
    mean, sq = torch.zeros(4), torch.ones(4)
    lin = nn.Linear(4, 1)
    x = torch.randn(3, 4)
    return sgd_step(lin, lambda: lin(x / (sq - mean.pow(2)).sqrt()).pow(2).mean())


WORKLOADS = {k[2:]: v for k, v in globals().items() if k.startswith("y_")}
