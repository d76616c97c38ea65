"""A third batch of steps for ``scripts/bench_features.py``: features of recent torch
releases and parameters a step reads as they are. Random draws whose parameters are
module state (Poisson, binomial, gamma, Dirichlet, normal with a tensor std), special
functions (erfinv, logit, xlogy, igamma, ndtri) on buffers, a cached LU factorisation
solved against, grouped GEMMs (``torch._grouped_mm``) in a mixture of experts with an
empty expert, transformers' experts implementations (batched_mm, eager), ``torch.cond``,
an exported program's module, activations offloaded by ``save_on_cpu``, selective
activation checkpointing, float8 ``_scaled_mm``, ``F.rms_norm``, an adaptive softmax,
module hooks that rewrite inputs, outputs and gradients, lazy modules, einsum chains,
chunked vmap, an autograd Function's generated vmap rule, cumulative ops' backward,
``torch.polar`` and index tensors kept as buffers; and architectures outside the zoos:
a KAN, mixture-of-depths routing, a Switch MoE with capacity and token dropping,
RWKV's WKV recurrence, capsule routing, an adaptive-step neural ODE, Transformer-XL
memory, Perceiver latents. ``WORKLOADS``: name -> a builder that returns the step.

What this batch found when it was added: a Poisson rate filled negative (the replay
raised), erfinv/logit/xlogy arguments outside their domains (NaN in the weights), and
a cached factorisation's pivots filled with zeros (lu_solve raised); and that
``torch.autograd.grad(..., is_grads_batched=True)`` replays without vmap's own
``_add_batch_dim``/``_remove_batch_dim`` (Known limits).
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from features_steps import sgd_step
from torch.distributions import Beta, Binomial, Dirichlet, Gamma, LogNormal, Normal, Poisson
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)


def y_dist_params():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.alpha = nn.Parameter(torch.rand(6) + 0.5)
            self.beta = nn.Parameter(torch.rand(6) + 0.5)
            self.conc = nn.Parameter(torch.rand(3, 4) + 0.5)
            self.scale = nn.Parameter(torch.rand(6) + 0.5)
            self.register_buffer("rate", torch.rand(6) * 3)
            self.register_buffer("prob", torch.rand(6))
            self.register_buffer("std", torch.rand(6) + 0.1)
            self.lin = nn.Linear(6, 6)

    m = M()
    x = torch.randn(4, 6)

    def loss():
        g = Gamma(m.alpha, m.beta).rsample((4,))
        d = Dirichlet(m.conc).rsample()
        b = Beta(m.alpha, m.beta).rsample()
        n = Normal(m.lin(x), m.scale).rsample()
        ln = LogNormal(torch.zeros(6), m.scale).log_prob(g + 0.1)
        p = Poisson(m.rate).sample((2,))
        bi = Binomial(10, probs=m.prob).sample()
        z = torch.normal(torch.zeros(6), m.std)
        return g.sum() + d.sum() + b.sum() + n.sum() + ln.sum() + (p.sum() + bi.sum() + z.sum()) * 0

    return sgd_step(m, loss)


def y_special_domains():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("u", torch.rand(8) * 1.8 - 0.9)
            self.register_buffer("p", torch.rand(8) * 0.9 + 0.05)
            self.register_buffer("a", torch.rand(8) + 2.0)
            self.register_buffer("q", torch.rand(8) + 0.1)
            self.w = nn.Parameter(torch.randn(8))

    m = M()

    def loss():
        t = (
            torch.erfinv(m.u)
            + torch.logit(m.p)
            + torch.xlogy(m.w, m.q)
            + torch.special.entr(m.p)
            + torch.mvlgamma(m.a, 3)
            + torch.igamma(m.a, m.q)
            + torch.special.ndtri(m.p)
            + torch.special.log_ndtr(m.u)
        )
        return (t * m.w).sum()

    return sgd_step(m, loss)


def y_grouped_mm_moe():
    E, D, H = 4, 16, 32
    router = nn.Linear(D, E)
    w1 = nn.Parameter(torch.randn(E, D, H) * 0.1)
    w2 = nn.Parameter(torch.randn(E, H, D) * 0.1)
    m = nn.ModuleDict({"r": router})
    m.register_parameter("w1", w1)
    m.register_parameter("w2", w2)
    x = torch.randn(12, D)

    def loss():
        logits = router(x)
        logits[:, 3] = -1e9  # expert 3 never chosen: an empty group
        wts, idx = torch.topk(logits.softmax(-1), 2, dim=-1)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xs = x[order // 2]
        h = F.silu(torch._grouped_mm(xs, w1, offs=offs))
        y = torch._grouped_mm(h, w2, offs=offs)
        out = torch.zeros_like(x).index_add_(0, order // 2, y * wts.reshape(-1)[order, None])
        return out.pow(2).mean()

    return sgd_step(m, loss)


def _qwen_moe(impl):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    c = Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        head_dim=8,
    )
    return Qwen3MoeForCausalLM._from_config(c, experts_implementation=impl)


def y_hf_moe_batched():
    m = _qwen_moe("batched_mm")
    x = torch.randint(0, 128, (2, 8))
    return sgd_step(m, lambda: m(x, labels=x).loss)


def y_hf_moe_eager_infer():
    m = _qwen_moe("eager").eval()
    x = torch.randint(0, 128, (2, 8))

    def step():
        with torch.no_grad():
            m(x)

    return step


def y_torch_cond():
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def loss():
        h = lin(x)
        y = torch.cond(h.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (h,))
        return y.sum()

    return sgd_step(lin, loss)


def y_export_module():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

        def forward(self, x):
            return self.b(F.gelu(self.a(x))).softmax(-1)

    x = torch.randn(4, 8)
    gm = torch.export.export(Net().eval(), (x,)).module()

    def step():
        with torch.no_grad():
            gm(x)

    return step


def y_save_on_cpu():
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)

    def loss():
        with torch.autograd.graph.save_on_cpu(pin_memory=False):
            return m(x).pow(2).mean()

    return sgd_step(m, loss)


def y_selective_ac():
    def policy(ctx, op, *args, **kwargs):
        return (
            CheckpointPolicy.MUST_SAVE
            if op == torch.ops.aten.mm.default
            else CheckpointPolicy.PREFER_RECOMPUTE
        )

    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))
    x = torch.randn(8, 16)
    ctx = functools.partial(create_selective_checkpoint_contexts, policy)

    def loss():
        return checkpoint(m, x, use_reentrant=False, context_fn=ctx).pow(2).mean()

    return sgd_step(m, loss)


def y_scaled_mm_fp8():
    a = torch.randn(16, 32).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32).to(torch.float8_e4m3fn).t()
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)

    def step():
        torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)

    return step


def y_rms_norm():
    m = nn.Sequential(nn.Linear(16, 16), nn.RMSNorm(16), nn.Linear(16, 4))
    x = torch.randn(8, 16)
    return sgd_step(m, lambda: F.rms_norm(m(x), (4,)).pow(2).mean())


def y_adaptive_logsoftmax():
    m = nn.AdaptiveLogSoftmaxWithLoss(16, 50, cutoffs=[10, 30], div_value=2.0)
    x = torch.randn(32, 16)
    t = torch.randint(0, 50, (32,))
    return sgd_step(m, lambda: m(x, t).loss)


def y_module_hooks():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    m[0].register_forward_pre_hook(lambda mod, inp: (inp[0] * 2,))
    m[2].register_full_backward_hook(lambda mod, gi, go: (gi[0] * 0.5,))
    m[1].register_forward_hook(lambda mod, i, o: o + 1)
    x = torch.randn(4, 8)
    return sgd_step(m, lambda: m(x).pow(2).mean())


def y_grads_batched():
    lin = nn.Linear(6, 3)
    x = torch.randn(5, 6, requires_grad=True)

    def step():
        y = lin(x)
        eye = torch.eye(3).unsqueeze(1).expand(3, 5, 3)
        (jac,) = torch.autograd.grad(y, x, eye, is_grads_batched=True)
        jac.sum()

    return step


def y_lazy_modules():
    m = nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(5))
    x = torch.randn(2, 3, 8, 8)
    m(x)
    return sgd_step(m, lambda: m(x).pow(2).mean())


def y_einsum_multi():
    a = nn.Parameter(torch.randn(4, 5))
    b = torch.randn(5, 6)
    c = torch.randn(6, 7)
    d = torch.randn(7, 3)
    mm = nn.ParameterList([a])
    return sgd_step(
        mm,
        lambda: torch.einsum("ij,jk,kl,lm->im", a, b, c, d).pow(2).sum()
        + torch.einsum("bij,bjk->bik", a.expand(2, 4, 5), b.expand(2, 5, 6)).sum(),
    )


def y_vmap_chunked():
    w = torch.randn(8, 8)
    x = torch.randn(10, 8)

    def step():
        torch.vmap(lambda r: torch.tanh(w @ r).sum(), chunk_size=3)(x)

    return step


class _Cube(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x**3

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


def y_function_vmap():
    lin = nn.Linear(4, 4)
    x = torch.randn(6, 4)
    return sgd_step(lin, lambda: torch.vmap(_Cube.apply)(lin(x)).sum())


def y_cumulative():
    p = nn.Parameter(torch.randn(4, 6))
    mm = nn.ParameterList([p])

    def loss():
        z = p.clone()
        z[:, 2] = 0
        return (
            torch.cumprod(z, 1).sum()
            + torch.logcumsumexp(p, 1).sum()
            + torch.cummin(p, 1).values.sum()
            + torch.cummax(p, 0).values.sum()
        )

    return sgd_step(mm, loss)


def y_lu_cached_solve():
    a = torch.randn(6, 6) + 6 * torch.eye(6)
    lu, piv = torch.linalg.lu_factor(a)
    chol = torch.linalg.cholesky(a @ a.T)
    b = torch.randn(6, 3)

    def step():
        torch.linalg.lu_solve(lu, piv, b)
        torch.cholesky_solve(b, chol)
        torch.linalg.solve_triangular(chol, b, upper=False)
        torch.lu_unpack(lu, piv)

    return step


def y_polar_complex():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mag", torch.rand(8) + 0.1)
            self.ang = nn.Parameter(torch.randn(8))

    m = M()

    def loss():
        z = torch.polar(m.mag, m.ang)
        return torch.view_as_real(z * z.conj()).sum() + z.abs().sum()

    return sgd_step(m, loss)


def y_index_leaf():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Parameter(torch.randn(20, 4))
            self.register_buffer("ids", torch.randint(0, 20, (6,)))
            self.register_buffer("rows", torch.tensor([0, 3, 5]))

    m = M()

    def loss():
        t = torch.zeros(8, 4)
        t = t.index_copy(0, m.rows, m.emb[m.ids[:3]])
        u = torch.take(m.emb, m.ids)
        w = torch.zeros(20, 4).index_put((m.ids,), m.emb[m.ids], accumulate=True)
        return t.sum() + u.sum() + w.pow(2).sum()

    return sgd_step(m, loss)


# Architectures outside the zoos, as training steps (AdamW).


def _adamw(m, loss_fn):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()

    return step


class KANLayer(nn.Module):
    def __init__(self, i, o, grid=5, k=3):
        super().__init__()
        h = 2.0 / grid
        g = torch.arange(-k, grid + k + 1) * h - 1.0
        self.register_buffer("grid", g.expand(i, -1).contiguous())
        self.coef = nn.Parameter(torch.randn(o, i, grid + k) * 0.1)
        self.base = nn.Linear(i, o)
        self.k = k

    def bsplines(self, x):
        g = self.grid
        x = x.unsqueeze(-1)
        b = ((x >= g[:, :-1]) & (x < g[:, 1:])).to(x.dtype)
        for p in range(1, self.k + 1):
            b = (x - g[:, : -(p + 1)]) / (g[:, p:-1] - g[:, : -(p + 1)]) * b[..., :-1] + (
                g[:, p + 1 :] - x
            ) / (g[:, p + 1 :] - g[:, 1:(-p)]) * b[..., 1:]
        return b

    def forward(self, x):
        return self.base(F.silu(x)) + torch.einsum("bij,oij->bo", self.bsplines(x), self.coef)


def y_kan():
    m = nn.Sequential(KANLayer(4, 8), KANLayer(8, 2))
    x = torch.rand(16, 4) * 1.8 - 0.9
    return _adamw(m, lambda: m(x).pow(2).mean())


def y_mixture_of_depths():
    blk = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
    router = nn.Linear(16, 1)
    m = nn.ModuleList([blk, router])
    x = torch.randn(2, 10, 16)

    def loss():
        w = router(x).squeeze(-1)
        k = 4
        top = torch.topk(w, k, dim=1).indices.sort(dim=1).values
        idx = top.unsqueeze(-1).expand(-1, -1, 16)
        sel = torch.gather(x, 1, idx)
        out = blk(sel) * torch.gather(w, 1, top).sigmoid().unsqueeze(-1)
        y = x.scatter_add(1, idx, out)
        return y.pow(2).mean()

    return _adamw(m, loss)


def y_switch_capacity():
    E, D, cap = 4, 8, 3
    gate = nn.Linear(D, E)
    experts = nn.ModuleList([nn.Linear(D, D) for _ in range(E)])
    m = nn.ModuleList([gate, experts])
    x = torch.randn(10, D)

    def loss():
        probs = gate(x).softmax(-1)
        e = probs.argmax(-1)
        mask = F.one_hot(e, E)
        pos = (torch.cumsum(mask, 0) - 1) * mask
        keep = (pos < cap) & mask.bool()
        disp = F.one_hot(pos.clamp(max=cap - 1), cap) * keep.unsqueeze(-1)
        xin = torch.einsum("tec,td->ecd", disp.float(), x)
        yout = torch.stack([experts[i](xin[i]) for i in range(E)])
        comb = disp.float() * (probs * keep).unsqueeze(-1)
        y = torch.einsum("tec,ecd->td", comb, yout)
        aux = (mask.float().mean(0) * probs.mean(0)).sum() * E
        return y.pow(2).mean() + 0.01 * aux

    return _adamw(m, loss)


def y_rwkv_wkv():
    T, C = 8, 16
    k_l, v_l, r_l = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
    decay = nn.Parameter(torch.randn(C) * 0.1)
    first = nn.Parameter(torch.randn(C) * 0.1)
    m = nn.ModuleList([k_l, v_l, r_l])
    m.register_parameter("decay", decay)
    m.register_parameter("first", first)
    x = torch.randn(T, C)

    def loss():
        k, v, r = k_l(x), v_l(x), r_l(x).sigmoid()
        w = -torch.exp(decay)
        aa = torch.zeros(C)
        bb = torch.zeros(C)
        pp = torch.full((C,), -1e38)
        outs = []
        for t in range(T):
            ww = first + k[t]
            q = torch.maximum(pp, ww)
            e1, e2 = torch.exp(pp - q), torch.exp(ww - q)
            outs.append((e1 * aa + e2 * v[t]) / (e1 * bb + e2))
            ww = pp + w
            q = torch.maximum(ww, k[t])
            e1, e2 = torch.exp(ww - q), torch.exp(k[t] - q)
            aa, bb, pp = e1 * aa + e2 * v[t], e1 * bb + e2, q
        return (r * torch.stack(outs)).pow(2).mean()

    return _adamw(m, loss)


def y_capsule_routing():
    W = nn.Parameter(torch.randn(1, 6, 3, 8, 4) * 0.1)
    m = nn.ParameterList([W])
    u = torch.randn(5, 6, 1, 4, 1)

    def squash(s, dim=-1):
        n2 = (s**2).sum(dim, keepdim=True)
        return n2 / (1 + n2) * s / torch.sqrt(n2 + 1e-8)

    def loss():
        uhat = (W @ u).squeeze(-1)  # b, in, out, d
        b = torch.zeros(5, 6, 3)
        for _ in range(3):
            c = b.softmax(-1)
            v = squash((c.unsqueeze(-1) * uhat).sum(1))
            b = b + (uhat * v.unsqueeze(1)).sum(-1)
        return v.norm(dim=-1).sum()

    return _adamw(m, loss)


def y_neural_ode_adaptive():
    f = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 4))
    y0 = torch.randn(8, 4)

    def loss():
        y, t, h = y0, 0.0, 0.3
        steps = 0
        while t < 1.0 and steps < 12:
            k1 = f(y)
            k2 = f(y + h * k1)
            y2 = y + h * 0.5 * (k1 + k2)
            err = (h * 0.5 * (k2 - k1)).abs().max().item()
            if err < 1e-2 or h < 0.05:
                y, t = y2, t + h
            h = min(0.3, max(0.05, h * 0.9 * (1e-2 / max(err, 1e-9)) ** 0.5))
            steps += 1
        return y.pow(2).mean()

    return _adamw(f, loss)


def y_transformer_xl_mems():
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
    x = torch.randn(2, 6, 16)
    state = {"mem": torch.zeros(2, 4, 16)}

    def loss():
        h = torch.cat([state["mem"], x], 1)
        out = layer(h)[:, -6:]
        state["mem"] = out[:, -4:].detach()
        return out.pow(2).mean()

    return _adamw(layer, loss)


def y_perceiver_latents():
    lat = nn.Parameter(torch.randn(4, 16))
    ca = nn.MultiheadAttention(16, 2, batch_first=True)
    sa = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
    m = nn.ModuleList([ca, sa])
    m.register_parameter("lat", lat)
    x = torch.randn(3, 20, 16)
    pad = torch.zeros(3, 20, dtype=torch.bool)
    pad[0, 15:] = True

    def loss():
        q = lat.expand(3, -1, -1)
        z, _ = ca(q, x, x, key_padding_mask=pad)
        return sa(z).pow(2).mean()

    return _adamw(m, loss)


WORKLOADS = {k[2:]: v for k, v in globals().items() if k.startswith("y_")}
