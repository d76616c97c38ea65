"""Training steps that each exercise one torch feature users reach for: activation
checkpointing, autocast, channels_last, FFTs, RNNs, distributions, diffusion UNets,
grid sampling, graph message passing, fused optimizers, EMA with foreach ops,
parametrizations, GQA attention, sparse gradients, vmap, QAT and more
(``scripts/bench_features.py`` runs them). ``WORKLOADS``: name -> a builder that
returns the step; the ``*_min`` ones are minimal repros of what a probe found, kept
beside the workload they came from.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from features_steps import sgd_step
from torch.utils.checkpoint import checkpoint

_sgd_step = functools.partial(sgd_step, lr=0.01)


# 1 / 2 activation checkpointing
def _ckpt(reentrant):
    def b():
        l1, l2, l3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)
        m = nn.ModuleList([l1, l2, l3])
        x = torch.randn(8, 16, requires_grad=reentrant)

        def blk(h):
            return F.gelu(l2(F.relu(l1(h))))

        def loss():
            h = checkpoint(blk, x, use_reentrant=reentrant)
            return l3(h).pow(2).mean()

        return _sgd_step(m, loss)

    return b


# 3 autocast bf16 transformer-ish block
def autocast_block():
    d = 32
    m = nn.ModuleDict(
        dict(
            ln=nn.LayerNorm(d),
            qkv=nn.Linear(d, 3 * d),
            o=nn.Linear(d, d),
            ff1=nn.Linear(d, 64),
            ff2=nn.Linear(64, d),
        )
    )
    x = torch.randn(2, 8, d)
    y = torch.randn(2, 8, d)

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = m["ln"](x)
            q, k, v = m["qkv"](h).chunk(3, -1)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ v
            h = x + m["o"](a)
            h = h + m["ff2"](F.gelu(m["ff1"](h)))
            return F.mse_loss(h.float(), y)

    return _sgd_step(m, loss)


# 4 channels_last CNN
def channels_last_cnn():
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )
    m = m.to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 16, 16).to(memory_format=torch.channels_last)
    t = torch.randint(0, 5, (4,))
    return _sgd_step(m, lambda: F.cross_entropy(m(x), t))


# 5 FNet
def fnet():
    d = 16
    m = nn.ModuleDict(
        dict(ln1=nn.LayerNorm(d), ln2=nn.LayerNorm(d), ff=nn.Linear(d, d), head=nn.Linear(d, 3))
    )
    x = torch.randn(4, 8, d)
    t = torch.randint(0, 3, (4,))

    def loss():
        h = m["ln1"](x + torch.fft.fft2(x).real)
        h = m["ln2"](h + m["ff"](h))
        return F.cross_entropy(m["head"](h.mean(1)), t)

    return _sgd_step(m, loss)


# 6 GRU + LSTM
def gru_lstm():
    m = nn.ModuleDict(
        dict(
            gru=nn.GRU(8, 12, num_layers=2, bidirectional=True, dropout=0.1, batch_first=True),
            lstm=nn.LSTM(24, 6, num_layers=2, bidirectional=True, dropout=0.1, batch_first=True),
        )
    )
    x = torch.randn(3, 5, 8)

    def loss():
        h, _ = m["gru"](x)
        h, (hn, cn) = m["lstm"](h)
        return h.pow(2).mean() + hn.sum() * 0.01

    return _sgd_step(m, loss)


# 7 VAE
def vae():
    from torch.distributions import Normal, kl_divergence

    enc, mu_l, lv_l, dec = nn.Linear(16, 32), nn.Linear(32, 4), nn.Linear(32, 4), nn.Linear(4, 16)
    m = nn.ModuleList([enc, mu_l, lv_l, dec])
    x = torch.rand(8, 16)

    def loss():
        h = F.relu(enc(x))
        mu, lv = mu_l(h), lv_l(h)
        q = Normal(mu, torch.exp(0.5 * lv))
        z = q.rsample()
        rec = F.binary_cross_entropy_with_logits(dec(z), x, reduction="sum")
        kl = kl_divergence(q, Normal(torch.zeros_like(mu), torch.ones_like(mu))).sum()
        return (rec + kl) / x.shape[0]

    return _sgd_step(m, loss, torch.optim.Adam(m.parameters(), lr=1e-3))


# 8 small diffusion UNet
class _UNet(nn.Module):
    def __init__(self):
        super().__init__()
        c = 8
        self.inc = nn.Conv2d(3, c, 3, padding=1)
        self.t = nn.Linear(16, c)
        self.d1 = nn.Sequential(
            nn.GroupNorm(4, c), nn.SiLU(), nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
        )
        self.mid = nn.Sequential(
            nn.GroupNorm(4, 2 * c), nn.SiLU(), nn.Conv2d(2 * c, 2 * c, 3, padding=1)
        )
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.out = nn.Conv2d(3 * c, 3, 3, padding=1)

    def forward(self, x, t):
        half = 8
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        a = t[:, None].float() * freqs[None]
        emb = torch.cat([a.sin(), a.cos()], -1)
        h = self.inc(x) + self.t(emb)[:, :, None, None]
        d = self.d1(h)
        d = self.mid(d)
        u1 = self.up(d)
        u2 = F.interpolate(d, scale_factor=2, mode="nearest")
        u3 = F.interpolate(d[:, :8], size=h.shape[-2:], mode="bilinear", align_corners=False)
        return self.out(torch.cat([h + u3, u1, u2[:, :8]], 1))


def diffusion_unet():
    m = _UNet()
    x = torch.randn(2, 3, 16, 16)
    t = torch.tensor([3, 500])
    noise = torch.randn_like(x)
    return _sgd_step(m, lambda: F.mse_loss(m(x + noise, t), noise))


# 9 spatial transformer
def spatial_transformer():
    loc = nn.Sequential(nn.Flatten(), nn.Linear(16 * 16, 6))
    nn.init.zeros_(loc[1].weight)
    with torch.no_grad():
        loc[1].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1, 0]))
    cls = nn.Linear(16 * 16, 3)
    m = nn.ModuleList([loc, cls])
    x = torch.randn(4, 1, 16, 16)
    y = torch.randint(0, 3, (4,))

    def loss():
        theta = loc(x).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        xs = F.grid_sample(x, grid, align_corners=False)
        return F.cross_entropy(cls(xs.flatten(1)), y)

    return _sgd_step(m, loss)


# 10 GNN message passing
def gnn():
    n, d = 10, 8
    lin, lin2 = nn.Linear(d, d), nn.Linear(d, 2)
    m = nn.ModuleList([lin, lin2])
    x = torch.randn(n, d)
    src = torch.randint(0, n, (30,))
    dst = torch.randint(0, n, (30,))
    y = torch.randint(0, 2, (n,))

    def loss():
        msg = lin(x).index_select(0, src)
        agg = torch.zeros(n, d).index_add_(0, dst, msg)
        mean = torch.zeros(n, d).scatter_reduce(
            0, dst[:, None].expand(-1, d), msg, reduce="mean", include_self=False
        )
        h = F.relu(agg + mean + x)
        return F.cross_entropy(lin2(h), y)

    return _sgd_step(m, loss)


# 11 clip_grad_norm_ + OneCycleLR + fused Adam
def clip_onecycle_fused():
    m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, fused=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=1000)
    x, y = torch.randn(8, 16), torch.randn(8, 1)

    def step():
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        sched.step()

    return step


# 12 EMA via foreach
def ema_foreach():
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    ema = [p.detach().clone() for p in m.parameters()]
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 16)

    def step():
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()
        with torch.no_grad():
            ps = [p.detach() for p in m.parameters()]
            torch._foreach_mul_(ema, 0.999)
            torch._foreach_lerp_(ema, ps, 0.001)

    return step


# 13 parametrizations
def parametrizations():
    P = nn.utils.parametrizations
    a = P.weight_norm(nn.Linear(8, 16))
    b = P.spectral_norm(nn.Linear(16, 16))
    c = P.orthogonal(nn.Linear(16, 16))
    d = nn.Linear(16, 2)
    m = nn.Sequential(a, nn.ReLU(), b, nn.ReLU(), c, d)
    x = torch.randn(4, 8)
    return _sgd_step(m, lambda: m(x).pow(2).mean())


# 14 RMSNorm + SwiGLU + GQA SDPA causal
def rms_swiglu_gqa():
    d, hq, hkv, hd = 32, 4, 2, 8
    m = nn.ModuleDict(
        dict(
            n1=nn.RMSNorm(d),
            n2=nn.RMSNorm(d),
            q=nn.Linear(d, hq * hd, bias=False),
            kv=nn.Linear(d, 2 * hkv * hd, bias=False),
            o=nn.Linear(hq * hd, d, bias=False),
            w1=nn.Linear(d, 48, bias=False),
            w3=nn.Linear(d, 48, bias=False),
            w2=nn.Linear(48, d, bias=False),
        )
    )
    B, T = 2, 6
    x = torch.randn(B, T, d)

    def loss():
        h = m["n1"](x)
        q = m["q"](h).view(B, T, hq, hd).transpose(1, 2)
        k, v = m["kv"](h).view(B, T, 2, hkv, hd).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = x + m["o"](a.transpose(1, 2).reshape(B, T, -1))
        g = m["n2"](h)
        h = h + m["w2"](F.silu(m["w1"](g)) * m["w3"](g))
        return h.pow(2).mean()

    return _sgd_step(m, loss)


# 15 embedding padding_idx + max_norm
def embedding_maxnorm():
    emb = nn.Embedding(20, 8, padding_idx=0, max_norm=1.0)
    head = nn.Linear(8, 3)
    m = nn.ModuleList([emb, head])
    idx = torch.tensor([[0, 3, 5, 7], [2, 0, 0, 19]])
    y = torch.randint(0, 3, (2,))
    return _sgd_step(m, lambda: F.cross_entropy(head(emb(idx).mean(1)), y))


# 16 triplet w/ cdist hard-negative mining
def triplet_cdist():
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    x = torch.randn(12, 16)
    lab = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])

    def loss():
        e = m(x)
        dmat = torch.cdist(e, e)
        same = lab[:, None] == lab[None]
        pos_idx = (dmat * same).argmax(1)
        neg_idx = (dmat + same * 1e4).topk(1, dim=1, largest=False).indices[:, 0]
        return F.triplet_margin_loss(e, e[pos_idx], e[neg_idx], margin=0.5)

    return _sgd_step(m, loss)


# 17 InfoNCE
def infonce():
    f = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    g = nn.Linear(16, 16)
    m = nn.ModuleList([f, g])
    a, b = torch.randn(8, 16), torch.randn(8, 16)

    def loss():
        za, zb = F.normalize(f(a), dim=-1), F.normalize(g(b), dim=-1)
        logits = za @ zb.t() / 0.07
        lab = torch.arange(8)
        return F.cross_entropy(logits, lab, label_smoothing=0.1)

    return _sgd_step(m, loss)


# 18 maxpool indices + unpool AE
def maxunpool_ae():
    c1, c2 = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 1, 3, padding=1)
    pool, unpool = nn.MaxPool2d(2, return_indices=True), nn.MaxUnpool2d(2)
    m = nn.ModuleList([c1, c2])
    x = torch.randn(2, 1, 8, 8)

    def loss():
        h, idx = pool(F.relu(c1(x)))
        return F.mse_loss(c2(unpool(h, idx)), x)

    return _sgd_step(m, loss)


# 19 grad accumulation + GradScaler('cpu')
def grad_accum_scaler():
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    xs = [torch.randn(4, 16) for _ in range(2)]
    ys = [torch.randn(4, 1) for _ in range(2)]

    def step():
        opt.zero_grad()
        for x, y in zip(xs, ys, strict=True):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(m(x).float(), y) / 2
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()

    return step


# 20 LoRA
class _LoRA(nn.Module):
    def __init__(self, i, o, r=2):
        super().__init__()
        self.base = nn.Linear(i, o)
        self.base.requires_grad_(False)
        self.A = nn.Parameter(torch.randn(r, i) * 0.01)
        self.B = nn.Parameter(torch.zeros(o, r))

    def forward(self, x):
        return self.base(x) + (x @ self.A.t() @ self.B.t()) * 2.0


def lora():
    m = nn.Sequential(_LoRA(16, 32), nn.GELU(), _LoRA(32, 4))
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3, foreach=True)
    x = torch.randn(8, 16)
    return _sgd_step(m, lambda: m(x).pow(2).mean(), opt)


# 21 TransformerDecoder
def transformer_decoder():
    layer = nn.TransformerDecoderLayer(16, 2, dim_feedforward=32, dropout=0.1, batch_first=True)
    m = nn.TransformerDecoder(layer, 2)
    tgt = torch.randn(2, 5, 16)
    mem = torch.randn(2, 7, 16)
    mask = nn.Transformer.generate_square_subsequent_mask(5)
    kpm = torch.tensor([[False] * 7, [False] * 5 + [True] * 2])
    m.train()
    return _sgd_step(
        m,
        lambda: m(tgt, mem, tgt_mask=mask, tgt_is_causal=True, memory_key_padding_mask=kpm)
        .pow(2)
        .mean(),
    )


# 22 Conv3d video
def conv3d_video():
    m = nn.Sequential(
        nn.Conv3d(3, 4, (3, 3, 3), padding=1),
        nn.BatchNorm3d(4),
        nn.ReLU(),
        nn.Conv3d(4, 4, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
        nn.AdaptiveAvgPool3d((1, 2, 2)),
        nn.Flatten(),
        nn.Linear(16, 3),
    )
    x = torch.randn(2, 3, 4, 8, 8)
    y = torch.tensor([0, 2])
    return _sgd_step(m, lambda: F.cross_entropy(m(x), y))


# 23 packed LSTM
def packed_lstm():
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    emb, lstm, head = nn.Embedding(10, 8), nn.LSTM(8, 12, batch_first=True), nn.Linear(12, 3)
    m = nn.ModuleList([emb, lstm, head])
    idx = torch.randint(1, 10, (3, 6))
    lens = torch.tensor([4, 6, 2])
    y = torch.randint(0, 3, (3,))

    def loss():
        p = pack_padded_sequence(emb(idx), lens, batch_first=True, enforce_sorted=False)
        out, (hn, cn) = lstm(p)
        o, _ = pad_packed_sequence(out, batch_first=True)
        return F.cross_entropy(head(hn[-1]), y) + o.pow(2).mean()

    return _sgd_step(m, loss)


WORKLOADS = {
    "ckpt_nonreentrant": _ckpt(False),
    "ckpt_reentrant": _ckpt(True),
    "autocast_block": autocast_block,
    "channels_last_cnn": channels_last_cnn,
    "fnet": fnet,
    "gru_lstm": gru_lstm,
    "vae": vae,
    "diffusion_unet": diffusion_unet,
    "spatial_transformer": spatial_transformer,
    "gnn": gnn,
    "clip_onecycle_fused": clip_onecycle_fused,
    "ema_foreach": ema_foreach,
    "parametrizations": parametrizations,
    "rms_swiglu_gqa": rms_swiglu_gqa,
    "embedding_maxnorm": embedding_maxnorm,
    "triplet_cdist": triplet_cdist,
    "infonce": infonce,
    "maxunpool_ae": maxunpool_ae,
    "grad_accum_scaler": grad_accum_scaler,
    "lora": lora,
    "transformer_decoder": transformer_decoder,
    "conv3d_video": conv3d_video,
    "packed_lstm": packed_lstm,
}


# ---------------- extra, harder variants ----------------
def x_sparse_embedding():
    emb = nn.Embedding(50, 8, sparse=True)
    head = nn.Linear(8, 2)
    o1 = torch.optim.SparseAdam(list(emb.parameters()), lr=1e-2)
    o2 = torch.optim.SGD(head.parameters(), lr=1e-2)
    idx = torch.randint(0, 50, (4, 6))
    y = torch.randint(0, 2, (4,))

    def step():
        o1.zero_grad()
        o2.zero_grad()
        F.cross_entropy(head(emb(idx).mean(1)), y).backward()
        o1.step()
        o2.step()

    return step


def x_rope_complex():
    d, T = 16, 6
    q, k = nn.Linear(d, d), nn.Linear(d, d)
    m = nn.ModuleList([q, k])
    freqs = torch.polar(
        torch.ones(T, d // 2), torch.outer(torch.arange(T).float(), torch.rand(d // 2))
    )
    x = torch.randn(2, T, d)

    def rope(t):
        tc = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
        return torch.view_as_real(tc * freqs).flatten(-2)

    def loss():
        a = rope(q(x)) @ rope(k(x)).transpose(-1, -2)
        return a.softmax(-1).pow(2).mean()

    return _sgd_step(m, loss)


def x_bool_mask_loss():
    m = nn.Linear(8, 1)
    x = torch.randn(16, 8)
    y = torch.randn(16)

    def loss():
        p = m(x).squeeze(-1)
        mask = y > 0
        return F.mse_loss(p[mask], y[mask]) + p.masked_select(~mask).abs().mean()

    return _sgd_step(m, loss)


def x_nonzero_unique():
    m = nn.Linear(8, 4)
    x = torch.randn(16, 8)
    lab = torch.randint(0, 4, (16,))

    def loss():
        out = m(x)
        cls = torch.unique(lab)
        sel = torch.nonzero(lab == cls[0]).squeeze(1)
        return out[sel].sum() + out.gather(1, lab[:, None]).mean()

    return _sgd_step(m, loss)


def x_grad_penalty():
    D = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    real, fake = torch.randn(4, 8), torch.randn(4, 8)

    def loss():
        eps = torch.rand(4, 1)
        xi = (eps * real + (1 - eps) * fake).requires_grad_(True)
        (g,) = torch.autograd.grad(D(xi).sum(), xi, create_graph=True)
        gp = ((g.norm(2, dim=1) - 1) ** 2).mean()
        return D(fake).mean() - D(real).mean() + 10 * gp

    return _sgd_step(D, loss)


def x_embedding_bag():
    eb = nn.EmbeddingBag(30, 8, mode="sum")
    head = nn.Linear(8, 2)
    m = nn.ModuleList([eb, head])
    inp = torch.randint(0, 30, (10,))
    offsets = torch.tensor([0, 3, 7])
    w = torch.rand(10)
    y = torch.randint(0, 2, (3,))
    return _sgd_step(m, lambda: F.cross_entropy(head(eb(inp, offsets, per_sample_weights=w)), y))


def x_vmap_per_sample_grad():
    from torch.func import functional_call, grad, vmap

    m = nn.Linear(8, 2)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def lossf(p, xb, yb):
        return F.cross_entropy(functional_call(m, p, (xb[None],)), yb[None])

    def step():
        p = {k: v.detach() for k, v in m.named_parameters()}
        g = vmap(grad(lossf), in_dims=(None, 0, 0))(p, x, y)
        for k, v in m.named_parameters():
            v.grad = g[k].clamp(-1, 1).mean(0)
        opt.step()

    return step


def x_bf16_weights():
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).to(
        torch.bfloat16
    )
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    return _sgd_step(
        m, lambda: m(x).float().pow(2).mean(), torch.optim.AdamW(m.parameters(), lr=1e-3)
    )


def x_unfold_im2col():
    w = nn.Linear(9, 4)
    x = torch.randn(2, 1, 6, 6)

    def loss():
        cols = F.unfold(x, 3, padding=1).transpose(1, 2)
        out = w(cols).transpose(1, 2)
        return F.fold(out[:, :1], (6, 6), 1).pow(2).mean()

    return _sgd_step(w, loss)


def x_sort_cumsum_topk():
    m = nn.Linear(8, 10)
    x = torch.randn(4, 8)

    def loss():
        lo = m(x)
        s, i = lo.sort(-1, descending=True)
        p = s.softmax(-1).cumsum(-1)
        keep = p < 0.9
        return (s * keep).sum() + torch.multinomial(lo.softmax(-1).detach(), 2).float().sum() * 0

    return _sgd_step(m, loss)


def x_hooks_inplace():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 1))
    m[0].weight.register_hook(lambda g: g * 0.5)
    m[2].register_full_backward_hook(lambda mod, gi, go: None)
    x = torch.randn(4, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, nesterov=True)

    def step():
        opt.zero_grad(set_to_none=False)
        m(x).sum().backward()
        opt.step()

    return step


def x_fake_quant_qat():
    import torch.ao.quantization as tq

    m = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    m.train()
    m.qconfig = tq.get_default_qat_qconfig("fbgemm")
    m = tq.prepare_qat(m)
    x = torch.randn(2, 1, 8, 8)
    y = torch.tensor([0, 1])
    return _sgd_step(m, lambda: F.cross_entropy(m(x), y))


WORKLOADS.update({k: v for k, v in globals().items() if k.startswith("x_")})


def x_sparse_embedding_min():
    emb = nn.Embedding(50, 8, sparse=True)
    opt = torch.optim.SparseAdam(list(emb.parameters()), lr=1e-2)
    idx = torch.randint(0, 50, (24,))

    def step():
        opt.zero_grad()
        emb(idx).sum().backward()
        opt.step()

    return step


def x_coalesce_min():
    w = nn.Linear(8, 8)
    idx = torch.randint(0, 50, (1, 24))

    def loss():
        v = w(torch.ones(24, 8))
        s = torch.sparse_coo_tensor(idx, v, (50, 8)).coalesce()
        return s.values().pow(2).sum()

    return _sgd_step(w, loss)


WORKLOADS["x_sparse_embedding_min"] = x_sparse_embedding_min
WORKLOADS["x_coalesce_min"] = x_coalesce_min


def x_sparse_bound_min():
    w = nn.Linear(8, 8)
    idx = torch.tensor([[0, 1, 2, 3]])  # all distinct, rows < 4

    def loss():
        s = torch.sparse_coo_tensor(idx, w(torch.ones(4, 8)), (4, 8))
        return torch.sparse.sum(s)

    return _sgd_step(w, loss)


WORKLOADS["x_sparse_bound_min"] = x_sparse_bound_min
