"""A second batch of steps for ``scripts/bench_features.py``, each one feature the
first batch (features_train.py, features_infer.py) left out: custom autograd Functions
with mark_dirty, LBFGS's closure, seven more optimizers (RMSprop centred, Adafactor,
...), CTC and a dozen other losses, distributions, torch.func transforms, grid
sampling and folds, the scatter family, quantiles and order statistics, weight tying,
SDPA's variants, a selective scan, double backward, writes through views, control
flow on ``.item()``, complex parameters, zero-size and strided inputs, small integer
and float8 dtypes, int8 matmul, channels_last_3d, and transformers' generate()
(greedy, sampled, beam search, static cache). ``WORKLOADS``: name -> a builder that
returns the step.

What this batch found when it was added: RMSprop(centered=True) replayed NaN (its
square root of square_avg - grad_avg**2 on state filled at random); torch.quantile's
levels were filled outside [0, 1]; a complex Python scalar stopped generation.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from features_steps import sgd_step

_sgd = functools.partial(sgd_step, lr=0.01)


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class _Relu6Inplace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        x.clamp_(0, 6)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * ((y > 0) & (y < 6)).to(g.dtype)


def y_custom_function():
    m = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    return _sgd(m, lambda: _Relu6Inplace.apply(_Square.apply(m(x)) * 1.0).sum())


def y_lbfgs():
    m = nn.Linear(6, 1)
    x, y = torch.randn(16, 6), torch.randn(16, 1)
    opt = torch.optim.LBFGS(m.parameters(), lr=0.5, max_iter=4)

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(m(x), y)
        loss.backward()
        return loss

    return lambda: opt.step(closure)


def y_optimizers():
    ms = [nn.Linear(8, 8) for _ in range(7)]
    opts = [
        torch.optim.Adagrad(ms[0].parameters()),
        torch.optim.RMSprop(ms[1].parameters(), momentum=0.9, centered=True),
        torch.optim.NAdam(ms[2].parameters()),
        torch.optim.RAdam(ms[3].parameters()),
        torch.optim.Adamax(ms[4].parameters()),
        torch.optim.Rprop(ms[5].parameters()),
        torch.optim.Adafactor(ms[6].parameters()),
    ]
    x = torch.randn(4, 8)

    def step():
        for o in opts:
            o.zero_grad()
        sum(m(x).pow(2).mean() for m in ms).backward()
        for o in opts:
            o.step()

    return step


def y_fused_adamw():
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters(), fused=True, weight_decay=0.1)
    x = torch.randn(4, 8)
    return _sgd(m, lambda: m(x).square().mean(), opt)


def y_ctc_loss():
    m = nn.Linear(8, 6)
    x = torch.randn(12, 2, 8)
    tg = torch.randint(1, 6, (2, 4))

    def loss():
        lp = m(x).log_softmax(-1)
        return F.ctc_loss(lp, tg, torch.tensor([12, 10]), torch.tensor([4, 3]))

    return _sgd(m, loss)


def y_losses():
    m = nn.Linear(8, 5)
    x = torch.randn(6, 8)
    y = torch.randint(0, 5, (6,))
    yb = torch.rand(6, 5)

    def loss():
        o = m(x)
        return (
            F.cross_entropy(o, y, label_smoothing=0.1, ignore_index=2)
            + F.binary_cross_entropy_with_logits(o, yb, pos_weight=torch.ones(5) * 2)
            + F.kl_div(o.log_softmax(-1), yb.softmax(-1), reduction="batchmean")
            + F.huber_loss(o, yb)
            + F.smooth_l1_loss(o, yb, beta=0.5)
            + F.multilabel_soft_margin_loss(o, (yb > 0.5).float())
            + F.poisson_nll_loss(o, yb)
            + F.gaussian_nll_loss(o, yb, torch.ones(6, 5))
            + F.margin_ranking_loss(o[:, 0], o[:, 1], torch.sign(yb[:, 0] - 0.5))
            + F.multi_margin_loss(o, y)
            + F.cosine_embedding_loss(o, yb, torch.ones(6))
        )

    return _sgd(m, loss)


def y_cells_loop():
    lstm, gru = nn.LSTMCell(8, 16), nn.GRUCell(16, 8)
    m = nn.ModuleList([lstm, gru])
    xs = torch.randn(5, 3, 8)

    def loss():
        h = c = torch.zeros(3, 16)
        g = torch.zeros(3, 8)
        for t in range(xs.shape[0]):
            h, c = lstm(xs[t], (h, c))
            g = gru(h, g)
        return g.sum()

    return _sgd(m, loss)


def y_distributions():
    from torch.distributions import Categorical, Normal, kl_divergence

    mu = nn.Linear(4, 3)
    x = torch.randn(5, 4)

    def loss():
        o = mu(x)
        p = Normal(o, F.softplus(o) + 0.1)
        q = Normal(torch.zeros(3), torch.ones(3))
        c = Categorical(logits=o)
        a = c.sample()
        return (
            p.rsample().sum()
            + kl_divergence(p, q).sum()
            + c.log_prob(a).sum()
            + c.entropy().sum()
            + F.gumbel_softmax(o, tau=0.5, hard=True).sum()
        )

    return _sgd(mu, loss)


def y_func_transforms():
    from torch.func import functional_call, hessian, jacrev, vmap

    m = nn.Linear(3, 2)
    params = dict(m.named_parameters())
    x = torch.randn(4, 3)

    def f(p, xi):
        return functional_call(m, p, (xi,)).tanh().sum()

    def step():
        with torch.no_grad():
            j = vmap(jacrev(f, argnums=1), in_dims=(None, 0))(params, x)
            h = hessian(lambda xi: xi.sin().pow(2).sum())(x[0])
        return j, h

    return step


def y_vision_ops():
    conv = nn.Conv2d(3, 12, 3, padding=1)
    theta = nn.Parameter(torch.eye(2, 3).unsqueeze(0).repeat(2, 1, 1))
    m = nn.ModuleList([conv])
    x = torch.randn(2, 3, 8, 8)

    def loss():
        y = F.pixel_shuffle(conv(x), 2)  # 2,3,16,16
        g = F.affine_grid(theta, (2, 3, 8, 8), align_corners=False)
        z = F.grid_sample(y, g, mode="bilinear", padding_mode="reflection", align_corners=False)
        u = F.unfold(z, 3, padding=1)
        f = F.fold(u, (8, 8), 3, padding=1)
        return F.pixel_unshuffle(f, 2).pow(2).mean() + F.adaptive_max_pool2d(f, 3).sum()

    return _sgd(m, loss, torch.optim.SGD(list(m.parameters()) + [theta], lr=0.01))


def y_scatter_family():
    w = nn.Parameter(torch.randn(10, 4))
    idx = torch.randint(0, 5, (10,))
    mask = torch.rand(5, 4) > 0.5

    def loss():
        out = torch.zeros(5, 4).scatter_reduce(
            0, idx[:, None].expand(10, 4), w, "amax", include_self=False
        )
        acc = torch.zeros(5, 4).index_add(0, idx, w * 2)
        put = torch.zeros(5, 4).index_put((idx,), w, accumulate=True)
        ms = torch.zeros(5, 4).masked_scatter(mask, w)
        tk = torch.take_along_dim(w, idx[:, None].expand(10, 4) % 4, dim=1)
        return out.sum() + acc.sum() + put.pow(2).sum() + ms.sum() + tk.sum()

    opt = torch.optim.SGD([w], lr=0.01)

    def step():
        opt.zero_grad()
        loss().backward()
        opt.step()

    return step


def y_stats():
    x = torch.randn(7, 9)

    def step():
        return (
            torch.quantile(x, torch.tensor([0.1, 0.5, 0.9]), dim=1),
            x.median(dim=0),
            x.round().mode(dim=1),
            x.kthvalue(3, dim=1),
            torch.var_mean(x, dim=0, correction=0),
            x.nanmean(),
            torch.cummax(x, 1),
            torch.logcumsumexp(x, 0),
            torch.aminmax(x),
            torch.histc(x, bins=5),
            torch.bucketize(x, torch.linspace(-2, 2, 5)),
            torch.bincount(torch.randint(0, 6, (20,)), weights=torch.rand(20)),
        )

    return step


def y_weight_tying():
    emb = nn.Embedding(30, 8)
    head = nn.Linear(8, 30, bias=False)
    head.weight = emb.weight
    m = nn.ModuleList([emb, head, nn.LayerNorm(8)])
    t = torch.randint(0, 30, (4, 6))
    return _sgd(m, lambda: F.cross_entropy(head(m[2](emb(t))).flatten(0, 1), t.flatten()))


def y_norms():
    m = nn.Sequential(
        nn.Conv2d(4, 8, 3),
        nn.GroupNorm(2, 8),
        nn.InstanceNorm2d(8, affine=True),
        nn.LocalResponseNorm(3),
        nn.BatchNorm2d(8),
        nn.Flatten(2),
        nn.RMSNorm(36),
        nn.LayerNorm(36, elementwise_affine=False),
    )
    x = torch.randn(2, 4, 8, 8)
    return _sgd(m, lambda: m(x).pow(2).mean())


def y_sdpa_variants():
    q = nn.Linear(16, 16)
    x = torch.randn(2, 6, 16)
    mask = torch.rand(6, 6) > 0.3
    mask.fill_diagonal_(True)

    def loss():
        h = q(x).view(2, 6, 4, 4).transpose(1, 2)
        kv = h[:, :2]
        a = F.scaled_dot_product_attention(h, h, h, is_causal=True)
        b = F.scaled_dot_product_attention(h, h, h, attn_mask=mask, dropout_p=0.1)
        c = F.scaled_dot_product_attention(h, kv, kv, enable_gqa=True, scale=0.3)
        return (a + b + c).square().mean()

    return _sgd(q, loss)


def y_half_cpu():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).half()
    x = torch.randn(4, 8, dtype=torch.half)
    return lambda: m(x).float().softmax(-1)


def y_selective_scan():
    d, n = 8, 4
    proj = nn.Linear(d, 2 * n + 1)
    A = nn.Parameter(-torch.rand(d, n))
    m = nn.ModuleList([proj])
    x = torch.randn(2, 6, d)

    def loss():
        bcd = proj(x)
        B, C, dt = bcd[..., :n], bcd[..., n : 2 * n], F.softplus(bcd[..., -1:])
        h = torch.zeros(2, d, n)
        ys = []
        for t in range(x.shape[1]):
            dA = torch.exp(dt[:, t, :, None] * A)
            h = dA * h + dt[:, t, :, None] * B[:, t, None, :] * x[:, t, :, None]
            ys.append((h * C[:, t, None, :]).sum(-1))
        return torch.stack(ys, 1).pow(2).mean()

    return _sgd(m, loss, torch.optim.Adam(list(m.parameters()) + [A]))


def y_param_groups_clip_value():
    m = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(
        [
            {"params": m[0].parameters(), "lr": 1e-3},
            {"params": m[2].parameters(), "lr": 1e-2, "weight_decay": 0},
        ],
        foreach=False,
    )
    x = torch.randn(4, 8)

    def step():
        opt.zero_grad()
        m(x).sum().backward()
        nn.utils.clip_grad_value_(m.parameters(), 0.1)
        opt.step()

    return step


def y_double_backward_conv():
    conv = nn.Conv2d(2, 3, 3)
    x = torch.randn(1, 2, 6, 6, requires_grad=True)

    def loss():
        out = conv(x).tanh().sum()
        (g,) = torch.autograd.grad(out, x, create_graph=True)
        v = torch.ones_like(g)
        (hv,) = torch.autograd.grad((g * v).sum(), x, create_graph=True)
        return hv.pow(2).sum() + out

    return _sgd(conv, loss)


def y_view_writes():
    w = nn.Parameter(torch.randn(6, 6))

    def loss():
        y = w * 1.0
        y[:, :3].mul_(2)
        y.diagonal().add_(1)
        y.narrow(0, 1, 2).copy_(torch.ones(2, 6))
        z = torch.as_strided(y, (3, 3), (7, 1))
        u = y.unfold(1, 3, 2)
        return z.sum() + u.pow(2).sum() + y.t().contiguous().view(-1)[::5].sum()

    opt = torch.optim.SGD([w], lr=0.01)

    def step():
        opt.zero_grad()
        loss().backward()
        opt.step()

    return step


def y_item_control():
    m = nn.Linear(4, 4)
    x = torch.randn(3, 4)

    def loss():
        h = m(x)
        n = int((h > 0).sum().item()) % 3 + 1
        for _ in range(n):
            h = m(h).relu()
        return h.sum() if h.mean().item() > -1 else h.mean()

    return _sgd(m, loss)


def y_complex_params():
    w = nn.Parameter(torch.randn(4, 4, dtype=torch.cfloat))
    x = torch.randn(3, 4, dtype=torch.cfloat)
    opt = torch.optim.Adam([w])

    def step():
        opt.zero_grad()
        y = x @ w
        (y.abs().pow(2).sum() + torch.view_as_real(y).sum() + y.angle().sum()).backward()
        opt.step()

    return step


def y_spectral_norm():
    m = nn.utils.spectral_norm(nn.Linear(8, 8))
    x = torch.randn(4, 8)
    return _sgd(m, lambda: m(x).sum())


def y_split_stack():
    m = nn.Linear(8, 12)
    x = torch.randn(5, 8)

    def loss():
        h = m(x)
        a, b, c = h.split([3, 4, 5], dim=1)
        parts = list(h.chunk(4, 0)) + list(h.unbind(1))
        return (
            torch.cat([a, c, b], 1).sum()
            + sum(p.sum() for p in parts)
            + torch.stack(h.unbind(0)).pow(2).sum()
        )

    return _sgd(m, loss)


def y_embedding_options():
    e1 = nn.Embedding(20, 4, padding_idx=0, scale_grad_by_freq=True)
    e2 = nn.EmbeddingBag(20, 4, mode="max")
    m = nn.ModuleList([e1, e2])
    t = torch.randint(0, 20, (3, 5))
    return _sgd(m, lambda: e1(t).sum() + e2(t).pow(2).sum())


def y_gru_bidir():
    m = nn.GRU(6, 8, num_layers=2, bidirectional=True, dropout=0.2, batch_first=True)
    x = torch.randn(2, 5, 6)
    return _sgd(m, lambda: m(x)[0].pow(2).mean())


def y_foreach():
    ps = [torch.randn(5) for _ in range(4)]
    gs = [torch.randn(5) for _ in range(4)]

    def step():
        torch._foreach_mul_(ps, 0.9)
        torch._foreach_lerp_(ps, gs, 0.1)
        torch._foreach_addcdiv_(ps, gs, [g.abs() + 1 for g in gs], value=0.01)
        return torch._foreach_norm(ps)

    return step


def y_zero_size():
    m = nn.Linear(4, 4)
    x = torch.randn(0, 4)
    y = torch.randn(3, 4)

    def loss():
        a = m(x)
        b = torch.cat([a, m(y)], 0)
        return b.sum() + a.sum() + torch.empty(0).sum()

    return _sgd(m, loss)


def y_strided_inputs():
    m = nn.Linear(4, 6)
    base = torch.randn(8, 4)
    x = base.t().contiguous().t()[::2]
    e = torch.randn(1, 4).expand(5, 4)
    return _sgd(m, lambda: m(x).sum() + m(e).sum() + m(base[:, None, :].expand(8, 3, 4)).mean())


def y_small_dtypes():
    a = torch.randint(0, 200, (6, 6), dtype=torch.uint8)
    b = torch.randint(-100, 100, (6, 6), dtype=torch.int16)
    f = torch.randn(6, 6)

    def step():
        c = (a.to(torch.int16) + b) >> 1
        d = f.to(torch.float8_e4m3fn).to(torch.float32)
        e = f.to(torch.bfloat16).to(torch.float16)
        return c.sum(), d.sum(), e.float().sum(), (a > 100).logical_xor(b < 0).sum()

    return step


def y_int_mm():
    a = torch.randint(-8, 8, (32, 64), dtype=torch.int8)
    b = torch.randint(-8, 8, (64, 32), dtype=torch.int8)
    return lambda: torch._int_mm(a, b)


def y_channels_last_3d():
    m = nn.Sequential(nn.Conv3d(2, 4, 3), nn.BatchNorm3d(4), nn.ReLU()).to(
        memory_format=torch.channels_last_3d
    )
    x = torch.randn(1, 2, 6, 6, 6).to(memory_format=torch.channels_last_3d)
    return _sgd(m, lambda: m(x).mean())


# transformers' generate(): a decoding loop as LLM serving runs it (KV cache, logits
# processors, sampling, beams, a static cache), from a tiny Llama config.


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128,
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
    return LlamaForCausalLM(cfg).eval()


def y_generate_greedy():
    m = _llama()
    ids = torch.randint(3, 128, (2, 6))
    return lambda: m.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)


def y_generate_sample():
    m = _llama()
    ids = torch.randint(3, 128, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    return lambda: m.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=6,
        do_sample=True,
        top_k=20,
        top_p=0.9,
        temperature=0.7,
        repetition_penalty=1.2,
        min_new_tokens=6,
    )


def y_generate_beam():
    m = _llama()
    ids = torch.randint(3, 128, (1, 5))
    return lambda: m.generate(ids, max_new_tokens=5, num_beams=3, do_sample=False, min_new_tokens=5)


def y_generate_static_cache():
    m = _llama()
    ids = torch.randint(3, 128, (2, 6))
    return lambda: m.generate(
        ids, max_new_tokens=5, do_sample=False, cache_implementation="static", min_new_tokens=5
    )


WORKLOADS = {k[2:]: v for k, v in globals().items() if k.startswith("y_")}
