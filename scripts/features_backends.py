"""A fourth batch of steps for ``scripts/bench_features.py``: the CPU backends' own
layouts and ops, and architectures outside the zoos. A user's ``torch.library``
custom op with autograd, PT2E's ``quantized_decomposed`` ops, a frozen TorchScript
model (``optimize_for_inference``), ``torch.utils.mkldnn`` modules and MKLDNN
tensors, Inductor's CPU freezing (oneDNN convolutions, MKL's packed linear), explicit
``torch.Generator`` draws, ``torch.jit.fork``, two Python threads, optimizer steps in
post-accumulate-grad hooks, FlexAttention inference, two backward passes over one
graph, a Hyena FFT convolution, label smoothing with ignored labels, a vmapped model
ensemble, bucketize/histc/searchsorted; and a DiT sampling loop with guidance, a
VQ-VAE, Mamba-2's SSD, RetNet retention, a MultivariateNormal on a buffer's
scale_tril, segment_reduce and repeat_interleave on buffers, megablocks-style expert
dispatch, Adafactor and Muon, an EMA AveragedModel, straight-through Gumbel-softmax.
``WORKLOADS``: name -> a builder that returns the step.

What this batch found when it was added: MKLDNN tensors (recorded without storage)
not replayed, a ``Scalar?[]`` argument unsupported, and MKL's packed linear replayed
as its one child (an ``empty``), or whole with a random packed weight that crashes
MKL (oprules/mkldnn.py). A frozen TorchScript model's fused oneDNN convolutions are
not recorded by the observer at all (Known limits).
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F
from features_steps import sgd_step


# a user-defined custom op (torch.library) with a Python CPU kernel and autograd
@torch.library.custom_op("probe4::scaled_gelu", mutates_args=())
def scaled_gelu(x: torch.Tensor, scale: float) -> torch.Tensor:
    return F.gelu(x) * scale


@scaled_gelu.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _sg_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    with torch.enable_grad():
        xx = x.detach().requires_grad_()
        y = F.gelu(xx) * ctx.scale
        (g,) = torch.autograd.grad(y, xx, grad)
    return g, None


def _sg_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


scaled_gelu.register_autograd(_sg_backward, setup_context=_sg_setup)


def y_custom_op():
    m = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))
    x = torch.randn(8, 16)

    def loss():
        return m[1](scaled_gelu(m[0](x), 1.5)).pow(2).mean()

    return sgd_step(m, loss)


def y_custom_op_infer():
    m = nn.Linear(16, 32).eval()
    x = torch.randn(8, 16)

    @torch.no_grad()
    def step():
        return scaled_gelu(m(x), 0.5).sum()

    return step


def y_quant_decomposed():
    import torch.ao.quantization.fx._decomposed  # noqa: F401  registers quantized_decomposed

    w = torch.randn(32, 16)
    x = torch.randn(8, 16)
    qd = torch.ops.quantized_decomposed

    @torch.no_grad()
    def step():
        xs, xz = 0.05, 3
        xq = qd.quantize_per_tensor(x, xs, xz, -128, 127, torch.int8)
        xd = qd.dequantize_per_tensor(xq, xs, xz, -128, 127, torch.int8)
        scales = w.abs().amax(1) / 127
        zps = torch.zeros(32, dtype=torch.int64)
        wq = qd.quantize_per_channel(w, scales, zps, 0, -127, 127, torch.int8)
        wd = qd.dequantize_per_channel(wq, scales, zps, 0, -127, 127, torch.int8)
        return F.linear(xd, wd).sum()

    return step


def y_mkldnn_frozen():
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    ).eval()
    x = torch.randn(2, 3, 16, 16)
    frozen = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.script(m)))

    @torch.no_grad()
    def step():
        return frozen(x).sum()

    return step


def y_to_mkldnn():
    import torch.utils.mkldnn as mkldnn_utils

    m = mkldnn_utils.to_mkldnn(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).eval())
    x = torch.randn(2, 3, 16, 16)

    @torch.no_grad()
    def step():
        return m(x.to_mkldnn()).to_dense().sum()

    return step


def y_explicit_generator():
    m = nn.Linear(16, 4)
    x = torch.randn(32, 16)
    g = torch.Generator().manual_seed(1)

    def loss():
        idx = torch.randperm(32, generator=g)[:16]
        noise = torch.randn(16, 16, generator=g) * 0.1
        keep = torch.rand(16, 16, generator=g) > 0.1
        xb = (x[idx] + noise) * keep
        pick = torch.multinomial(torch.ones(16), 8, generator=g)
        t = torch.empty(8, 4).uniform_(-1, 1, generator=g)
        return (m(xb)[pick] - t).pow(2).mean()

    return sgd_step(m, loss)


class _Forked(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        fa = torch.jit.fork(self.a, x)
        fb = torch.jit.fork(self.b, x)
        return torch.jit.wait(fa) + torch.jit.wait(fb)


def y_jit_fork():
    m = torch.jit.script(_Forked().eval())
    x = torch.randn(64, 16)

    @torch.no_grad()
    def step():
        return m(x).sum()

    return step


def y_opt_in_backward():
    m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    opts = {p: torch.optim.Adam([p], lr=1e-3) for p in m.parameters()}

    def hook(p):
        opts[p].step()
        opts[p].zero_grad()

    for p in m.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def step():
        m(x).pow(2).mean().backward()

    return step


def y_flex_infer():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q = torch.randn(1, 2, 128, 16)
    k = torch.randn(1, 2, 128, 16)
    v = torch.randn(1, 2, 128, 16)

    def causal(b, h, qi, ki):
        return qi >= ki

    mask = create_block_mask(causal, 1, 1, 128, 128, device="cpu")

    @torch.no_grad()
    def step():
        return flex_attention(q, k, v, block_mask=mask).sum()

    return step


def y_python_threads():
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    xs = [torch.randn(16, 32) for _ in range(2)]

    @torch.no_grad()
    def step():
        out = [None, None]

        def work(i):
            out[i] = m(xs[i]).sum()

        ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out[0] + out[1]

    return step


def y_two_backwards():
    m = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
    head_a, head_b = nn.Linear(16, 2), nn.Linear(16, 3)
    x = torch.randn(8, 16)
    params = [*m.parameters(), *head_a.parameters(), *head_b.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)

    def step():
        opt.zero_grad()
        h = m(x)
        a, b = head_a(h), head_b(h)
        torch.autograd.backward(
            [a, b], [torch.ones_like(a), torch.full_like(b, 0.5)], retain_graph=True
        )
        a.sum().backward()
        opt.step()

    return step


def y_hyena_fftconv():
    class Hy(nn.Module):
        def __init__(self, d=8, n=64):
            super().__init__()
            self.proj = nn.Linear(d, 3 * d)
            self.filt = nn.Parameter(torch.randn(d, n) * 0.02)
            self.out = nn.Linear(d, d)

        def forward(self, x):
            n = x.shape[1]
            q, k, v = self.proj(x).chunk(3, -1)
            u = (k * v).transpose(1, 2)
            fu = torch.fft.rfft(u, n=2 * n)
            fk = torch.fft.rfft(self.filt, n=2 * n)
            y = torch.fft.irfft(fu * fk, n=2 * n)[..., :n].transpose(1, 2)
            return self.out(q * y)

    m = Hy()
    x = torch.randn(2, 64, 8)
    return sgd_step(m, lambda: m(x).pow(2).mean())


def y_label_smooth_ignore():
    emb = nn.Embedding(50, 16)
    head = nn.Linear(16, 50)
    ids = torch.randint(0, 50, (4, 12))
    labels = ids.clone()
    labels[:, :3] = -100
    ps = [*emb.parameters(), *head.parameters()]

    def loss():
        logits = head(emb(ids))
        return F.cross_entropy(
            logits.view(-1, 50), labels.view(-1), ignore_index=-100, label_smoothing=0.1
        )

    return sgd_step(emb, loss, torch.optim.AdamW(ps, lr=1e-3))


def y_ensemble_vmap():
    from torch.func import functional_call, stack_module_state, vmap

    models = [nn.Linear(8, 4) for _ in range(3)]
    params, buffers = stack_module_state(models)
    base = nn.Linear(8, 4).to("meta")
    x = torch.randn(5, 8)

    def f(p, b):
        return functional_call(base, (p, b), (x,))

    @torch.no_grad()
    def step():
        return vmap(f)(params, buffers).sum()

    return step


def y_bucketize_hist():
    m = nn.Linear(8, 1)
    x = torch.randn(64, 8)
    edges = torch.linspace(-2, 2, 9)

    def loss():
        y = m(x).squeeze(1)
        bins = torch.bucketize(y.detach(), edges)
        counts = torch.bincount(bins, minlength=10).float()
        w = 1.0 / (counts[bins] + 1)
        h = torch.histc(y.detach(), bins=8, min=-2, max=2)
        s = torch.searchsorted(edges, y.detach().contiguous())
        return (w * y.pow(2)).mean() + h.sum() * 0 + s.float().sum() * 0

    return sgd_step(m, loss)


def y_inductor_freezing():
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3),
        nn.Flatten(),
        nn.Linear(8 * 14 * 14, 4),
    ).eval()
    x = torch.randn(2, 3, 16, 16)
    cm = torch.compile(m)

    @torch.no_grad()
    def step():
        with torch._inductor.config.patch(freezing=True):
            return cm(x).sum()

    return step


def y_mkldnn_linear():
    import torch.utils.mkldnn as mkldnn_utils

    m = mkldnn_utils.to_mkldnn(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval())
    x = torch.randn(4, 16)

    @torch.no_grad()
    def step():
        h = m(x.to_mkldnn())
        return (h + h).to_dense().sum()

    return step


def y_dit_sampling():
    class DiTBlock(nn.Module):
        def __init__(self, d=32, h=4):
            super().__init__()
            self.norm1 = nn.LayerNorm(d, elementwise_affine=False)
            self.norm2 = nn.LayerNorm(d, elementwise_affine=False)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.mlp = nn.Sequential(
                nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)
            )
            self.ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
            self.h = h

        def forward(self, x, c):
            s1, b1, g1, s2, b2, g2 = self.ada(c).unsqueeze(1).chunk(6, -1)
            h = self.norm1(x) * (1 + s1) + b1
            q, k, v = self.qkv(h).unflatten(-1, (3, self.h, -1)).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
            x = x + g1 * self.proj(a)
            return x + g2 * self.mlp(self.norm2(x) * (1 + s2) + b2)

    class DiT(nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.patch = nn.Conv2d(4, d, 2, 2)
            self.pos = nn.Parameter(torch.randn(1, 16, d) * 0.02)
            self.t_mlp = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
            self.y_emb = nn.Embedding(11, d)
            self.blocks = nn.ModuleList([DiTBlock(d) for _ in range(2)])
            self.out = nn.Linear(d, 4 * 4 * 2)
            self.d = d

        def forward(self, x, t, y):
            half = self.d // 2
            freqs = torch.exp(-math.log(10000) * torch.arange(half) / half)
            args = t[:, None].float() * freqs[None]
            temb = self.t_mlp(torch.cat([args.cos(), args.sin()], -1))
            c = temb + self.y_emb(y)
            h = self.patch(x).flatten(2).transpose(1, 2) + self.pos
            for b in self.blocks:
                h = b(h, c)
            o = self.out(h).view(x.shape[0], 4, 4, 2, 2, 8).permute(0, 5, 1, 3, 2, 4)
            return o.reshape(x.shape[0], 8, 8, 8)[:, :4]

    m = DiT().eval()
    y = torch.tensor([3, 10])  # 10: the null class for guidance

    @torch.no_grad()
    def step():
        x = torch.randn(1, 4, 8, 8)
        for i in range(3):
            t = torch.full((2,), 999 - i * 333)
            eps = m(torch.cat([x, x]), t, y)
            cond, unc = eps.chunk(2)
            x = x - 0.1 * (unc + 4.0 * (cond - unc))
        return x.sum()

    return step


def y_vqvae():
    class VQ(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Conv2d(3, 16, 4, 2, 1)
            self.codebook = nn.Embedding(64, 16)
            self.dec = nn.ConvTranspose2d(16, 3, 4, 2, 1)

        def forward(self, x):
            z = self.enc(x).permute(0, 2, 3, 1)
            flat = z.reshape(-1, 16)
            d = torch.cdist(flat, self.codebook.weight)
            idx = d.argmin(1)
            q = self.codebook(idx).view_as(z)
            commit = F.mse_loss(z, q.detach()) + F.mse_loss(q, z.detach())
            q = z + (q - z).detach()
            return self.dec(q.permute(0, 3, 1, 2)), commit

    m = VQ()
    x = torch.randn(2, 3, 16, 16)

    def loss():
        r, c = m(x)
        return F.mse_loss(r, x) + 0.25 * c

    return sgd_step(m, loss, torch.optim.Adam(m.parameters(), lr=1e-3))


def y_mamba2_ssd():
    def segsum(x):
        t = x.size(-1)
        x = x[..., None].expand(*x.shape, t)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool), -1)
        x = x.masked_fill(~mask, 0)
        s = torch.cumsum(x, -2)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool), 0)
        return s.masked_fill(~mask, -torch.inf)

    class SSD(nn.Module):
        def __init__(self, d=16, n=8, h=2):
            super().__init__()
            self.inp = nn.Linear(d, 2 * d + 2 * n + h)
            self.A_log = nn.Parameter(torch.log(torch.rand(h) * 4 + 1))
            self.out = nn.Linear(d, d)
            self.d, self.n, self.h = d, n, h

        def forward(self, u):
            b, L, _ = u.shape
            z, x, B, C, dt = self.inp(u).split([self.d, self.d, self.n, self.n, self.h], -1)
            dt = F.softplus(dt)
            A = -torch.exp(self.A_log)
            x = x.view(b, L, self.h, -1)
            Adt = (A * dt).transpose(1, 2)  # b h L
            Lm = torch.exp(segsum(Adt))
            y = torch.einsum("bln,bsn,bhls,bshp->blhp", C, B, Lm, x * dt[..., None])
            return self.out(y.reshape(b, L, -1) * F.silu(z))

    m = SSD()
    u = torch.randn(2, 12, 16)
    return sgd_step(m, lambda: m(u).pow(2).mean())


def y_retnet_decay():
    class Retention(nn.Module):
        def __init__(self, d=16, h=2):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.g = nn.Linear(d, d)
            self.o = nn.Linear(d, d)
            self.register_buffer("gammas", 1 - 2.0 ** (-5 - torch.arange(h).float()))
            self.h = h

        def forward(self, x):
            b, L, d = x.shape
            q, k, v = self.qkv(x).view(b, L, 3, self.h, -1).permute(2, 0, 3, 1, 4)
            n = torch.arange(L)
            diff = (n[:, None] - n[None]).float()
            decay = torch.where(diff >= 0, self.gammas[:, None, None] ** diff, torch.zeros(()))
            r = (q @ k.transpose(-1, -2)) * decay
            y = (r @ v).transpose(1, 2).reshape(b, L, d)
            y = F.group_norm(y.transpose(1, 2), self.h).transpose(1, 2)
            return self.o(F.silu(self.g(x)) * y)

    m = Retention()
    x = torch.randn(2, 10, 16)
    return sgd_step(m, lambda: m(x).pow(2).mean())


def y_mvn_scale_tril():
    from torch.distributions import MultivariateNormal

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.mu = nn.Linear(8, 4)
            self.register_buffer(
                "tril", torch.eye(4) * 0.5 + torch.tril(torch.rand(4, 4), -1) * 0.1
            )

    m = M()
    x = torch.randn(6, 8)
    target = torch.randn(6, 4)

    def loss():
        d = MultivariateNormal(m.mu(x), scale_tril=m.tril)
        return -d.log_prob(target).mean()

    return sgd_step(m, loss)


def y_segment_lengths():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.register_buffer("lengths", torch.tensor([3, 1, 4, 2]))
            self.register_buffer("repeats", torch.tensor([2, 1, 3, 1]))

    m = M()
    x = torch.randn(10, 8)
    y = torch.randn(4, 8)

    def loss():
        h = m.lin(x)
        s = torch.segment_reduce(h, "mean", lengths=m.lengths)
        r = torch.repeat_interleave(y, m.repeats, dim=0, output_size=7)
        return s.pow(2).mean() + r.sum() * 0 + (s.sum() * r.mean())

    return sgd_step(m, loss)


def y_megablocks_dispatch():
    class MoE(nn.Module):
        def __init__(self, d=16, e=4, k=2):
            super().__init__()
            self.router = nn.Linear(d, e, bias=False)
            self.w1 = nn.Parameter(torch.randn(e, d, 32) * 0.05)
            self.w2 = nn.Parameter(torch.randn(e, 32, d) * 0.05)
            self.e, self.k = e, k

        def forward(self, x):
            probs = self.router(x).softmax(-1)
            w, idx = probs.topk(self.k, -1)
            flat = idx.flatten()
            order = torch.argsort(flat, stable=True)
            counts = torch.bincount(flat, minlength=self.e)
            token = order // self.k
            xs = x[token]
            out = torch.zeros_like(x)
            start = 0
            for e, c in enumerate(counts.tolist()):
                if c == 0:
                    continue
                sl = slice(start, start + c)
                h = F.gelu(xs[sl] @ self.w1[e]) @ self.w2[e]
                out.index_add_(0, token[sl], h * w.flatten()[order[sl], None])
                start += c
            return out

    m = MoE()
    x = torch.randn(24, 16)
    return sgd_step(m, lambda: m(x).pow(2).mean())


def y_adafactor_muon():
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opts = []
    if hasattr(torch.optim, "Adafactor"):
        opts.append(torch.optim.Adafactor([m[0].weight, m[0].bias], lr=1e-2))
    else:
        opts.append(torch.optim.Adam([m[0].weight, m[0].bias], lr=1e-3))
    if hasattr(torch.optim, "Muon"):
        opts.append(torch.optim.Muon([m[2].weight], lr=1e-2))
        rest = [m[2].bias]
    else:
        rest = [m[2].weight, m[2].bias]
    opts.append(torch.optim.AdamW(rest, lr=1e-3))
    x = torch.randn(8, 16)

    def step():
        for o in opts:
            o.zero_grad()
        m(x).pow(2).mean().backward()
        for o in opts:
            o.step()

    return step


def y_swa_ema():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    m = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    ema = AveragedModel(m, multi_avg_fn=get_ema_multi_avg_fn(0.99))
    opt = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9, nesterov=True)
    x = torch.randn(8, 16)

    def step():
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()
        ema.update_parameters(m)

    return step


def y_gumbel_straight_through():
    m = nn.Linear(16, 10)
    emb = nn.Embedding(10, 8)
    x = torch.randn(6, 16)
    ps = [*m.parameters(), *emb.parameters()]

    def loss():
        onehot = F.gumbel_softmax(m(x), tau=0.5, hard=True)
        return (onehot @ emb.weight).pow(2).mean()

    return sgd_step(m, loss, torch.optim.SGD(ps, lr=1e-2))


WORKLOADS = {k[2:]: v for k, v in globals().items() if k.startswith("y_")}
