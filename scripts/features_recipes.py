"""A fifth batch of steps for ``scripts/bench_features.py``: training recipes and
numerics real users run, each a small forward, loss, backward and optimizer step (or
a decoding loop). Mixed precision with fp16 autocast on CPU and ``GradScaler("cpu")``
skipping a step on a non-finite norm, ``get_total_norm``/``clip_grads_with_norm_`` and
foreach clipping, pruning masks as forward pre-hooks, the noisy regularisers (rrelu,
alpha and feature-alpha dropout, dropout1d/2d/3d), EmbeddingBag with offsets,
``padding_idx`` and ``include_last_offset``, the backward of linear algebra (eigh,
svd, lstsq, cholesky_solve, slogdet, cdist without the mm path), FlexAttention with
a document mask, a score_mod reading a bias table and its LSE (inference: no CPU
backward here), Llama's complex RoPE with ellipsis einsums, MultiheadAttention
training with padding and per-head weights, compiled autograd and max-autotune; and
recipes: CLIP with a clamped logit scale, a GAN with two optimizers, knowledge distillation
(``kl_div(log_target=True)``), PPO, DDPM training on noise-schedule buffers gathered
at random timesteps, MAE masking over ``Tensor.unfold`` patches, a U-Net with
antialiased resizing and PixelShuffle, an audio front-end (stft, mel filterbank,
istft), beam search over ``nn.Transformer``, speculative decoding, regression on
NaN-marked targets, Mixup/CutMix, SAM's two passes, a tensor learning rate under
SequentialLR, a DINO teacher with a centre buffer, chunked cross-entropy under
checkpointing; then recipes whose inputs carry domains the replay must fill inside
(a noise schedule indexed and raised to 0.5, PPO's running observation statistics, a
MoCo queue and its pointer, a k-NN label bank, a MAML inner loop, Poincare embeddings,
class-balanced sampling with logit adjustment, segmentation with ignore label 255 and
Dice, a SparseDispatcher MoE, DPO's label masking, a mixture density network, a
Shampoo preconditioner by eigh, word2vec's negative sampling on sparse embeddings
under Adagrad, an AdaHessian-style Hutchinson estimate). ``WORKLOADS``: name -> a
builder that returns the step.

What this batch found when it was added (37 of 41 passed; all four fixed since): a
wrapped Python int (``2 * var`` in ``Normal.log_prob``, ``1 / x``, ``w * 4``) replayed
as a 0-d int64 tensor filled randint(0, 8), so a denominator made from it was 0 one
time in eight (ppo_obs_norm, class_balanced; now 1..7, SCALAR_INTEGRAL); a buffer read
through ``aten::index`` (``alphas_cumprod[t] ** 0.5`` beside ``(1 - ...) ** 0.5``) got
no domain from the powers after it and replayed NaN (ddpm_index_pow; domains now carry
back through value-preserving ops, and ``rsub``'s positive result bounds its tensor
above: COMPLEMENTS); a sparse embedding read twice sums its two gradients with
``add``, whose entry count depends on the indices (sgns_sparse_adagrad; now fitted
like coalesce's). FlexAttention has no CPU backward here, so it is probed for
inference only.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from features_steps import sgd_step


def _mlp(i, h, o):
    return nn.Sequential(nn.Linear(i, h), nn.GELU(), nn.Linear(h, o))


# -- numerics and training utilities ---------------------------------------------------


def y_amp_fp16_scaler():
    m = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    x = torch.randn(8, 16)
    y = torch.randint(0, 4, (8,))

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(m(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True)
        if torch.isfinite(norm):
            scaler.step(opt)
        scaler.update()

    return step


def y_grad_norm_utils():
    m = _mlp(16, 32, 4)
    opt = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9)
    x = torch.randn(8, 16)

    def step():
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        grads = [p.grad for p in m.parameters()]
        total = nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
        nn.utils.clip_grads_with_norm_(m.parameters(), 0.5, total, foreach=True)
        nn.utils.clip_grad_value_(m.parameters(), 0.05, foreach=True)
        inf_norm = nn.utils.clip_grad_norm_(m.parameters(), 1.0, norm_type="inf")
        opt.step()
        vec = nn.utils.parameters_to_vector(m.parameters())
        nn.utils.vector_to_parameters(vec * (1 - 1e-4 * inf_norm.clamp(max=1)), m.parameters())

    return step


def y_prune_masks():
    import torch.nn.utils.prune as prune

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    prune.l1_unstructured(m[0], "weight", amount=0.3)
    prune.random_structured(m[3], "weight", amount=0.25, dim=0)
    prune.global_unstructured(
        [(m[0], "bias"), (m[3], "bias")], pruning_method=prune.L1Unstructured, amount=2
    )
    x = torch.randn(2, 3, 8, 8)
    y = torch.tensor([1, 3])
    return sgd_step(m, lambda: F.cross_entropy(m(x), y))


def y_noisy_regularisers():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv1d(4, 8, 3, padding=1)
            self.c2 = nn.Conv2d(4, 8, 3, padding=1)
            self.c3 = nn.Conv3d(2, 4, 3, padding=1)
            self.lin = nn.Linear(8, 8)
            self.selu = nn.Sequential(nn.Linear(8, 8), nn.SELU(), nn.AlphaDropout(0.1))

        def forward(self, a, b, c, d):
            h1 = F.dropout1d(F.rrelu(self.c1(a), training=True), 0.2, training=True)
            h2 = F.dropout2d(self.c2(b), 0.2, training=True)
            h3 = F.dropout3d(self.c3(c), 0.2, training=True)
            h4 = F.feature_alpha_dropout(F.selu(self.lin(d)), 0.1, training=True)
            h5 = F.alpha_dropout(self.selu(d), 0.1, training=True)
            return h1.pow(2).mean() + h2.pow(2).mean() + h3.pow(2).mean() + (h4 + h5).pow(2).mean()

    m = M().train()
    a, b = torch.randn(2, 4, 10), torch.randn(2, 4, 6, 6)
    c, d = torch.randn(1, 2, 4, 4, 4), torch.randn(2, 3, 8)
    return sgd_step(m, lambda: m(a, b, c, d))


def y_embbag_offsets():
    e_sum = nn.EmbeddingBag(40, 8, mode="sum", padding_idx=0)
    e_mean = nn.EmbeddingBag(40, 8, mode="mean", padding_idx=0, include_last_offset=True)
    e_max = nn.EmbeddingBag(40, 8, mode="max")
    head = nn.Linear(24, 2)
    m = nn.ModuleList([e_sum, e_mean, e_max, head])
    inp = torch.tensor([0, 5, 7, 0, 3, 12, 9, 0, 33, 1, 2, 0])
    offsets = torch.tensor([0, 2, 5, 9])
    last = torch.tensor([0, 2, 5, 9, 12])
    w = torch.rand(12)
    y = torch.tensor([0, 1, 1, 0])

    def loss():
        a = e_sum(inp, offsets, per_sample_weights=w)
        b = e_mean(inp, last)
        c = e_max(inp, offsets)
        return F.cross_entropy(head(torch.cat([a, b, c], 1)), y)

    return sgd_step(m, loss, torch.optim.Adagrad(m.parameters(), lr=1e-2))


def y_linalg_backward():
    torch.manual_seed(0)
    m = nn.Linear(6, 6)
    x = torch.randn(10, 6)
    b = torch.randn(10, 2)
    protos = nn.Parameter(torch.randn(3, 6))
    ps = [*m.parameters(), protos]

    def loss():
        h = m(x)
        cov = h.T @ h / 10 + torch.eye(6)
        evals, evecs = torch.linalg.eigh(cov)
        u, s, vh = torch.linalg.svd(h, full_matrices=False)
        sol = torch.linalg.lstsq(h, b).solution
        chol = torch.linalg.cholesky(cov)
        cs = torch.cholesky_solve(h[:2].T, chol)
        sign, logdet = torch.linalg.slogdet(cov)
        d = torch.cdist(h, protos, compute_mode="donot_use_mm_for_euclid_dist")
        d1 = torch.cdist(h, protos, p=1.0)
        return (
            evals.log().sum()
            + evecs[:, -1].abs().sum()
            + s[:3].sum()
            + sol.pow(2).mean()
            + cs.mean()
            + sign * logdet
            + F.cross_entropy(-d, torch.arange(10) % 3)
            + d1.mean() * 0.1
        )

    return sgd_step(m, loss, torch.optim.SGD(ps, lr=1e-3))


# -- attention --------------------------------------------------------------------------


def y_flex_score_mod():
    # FlexAttention has no CPU backward (eager or compiled) in this torch: inference,
    # with a document mask and a score_mod that reads a bias table, returning the LSE
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    qkv = nn.Linear(32, 96).eval()
    rel = torch.randn(2, 33) * 0.1
    doc = torch.arange(128) // 48  # three packed documents

    def doc_causal(b, h, qi, ki):
        return (qi >= ki) & (doc[qi] == doc[ki])

    def score_mod(score, bi, hi, qi, ki):
        return score + rel[hi, (qi - ki).clamp(-16, 16) + 16]

    mask = create_block_mask(doc_causal, 1, 1, 128, 128, device="cpu")
    x = torch.randn(1, 128, 32)

    @torch.no_grad()
    def step():
        q, k, v = qkv(x).view(1, 128, 3, 2, 16).permute(2, 0, 3, 1, 4)
        out, lse = flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, return_lse=True)
        return out.sum() + lse.sum()

    return step


def y_rope_einsum_ellipsis():
    class Attn(nn.Module):
        def __init__(self, d=32, h=4, T=8):
            super().__init__()
            self.wq, self.wk, self.wv = (nn.Linear(d, d, bias=False) for _ in range(3))
            self.wo = nn.Linear(d, d, bias=False)
            hd = d // h
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
            ang = torch.outer(torch.arange(T).float(), inv)
            self.register_buffer("freqs_cis", torch.polar(torch.ones_like(ang), ang))
            self.h = h

        def rope(self, t):
            tc = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
            return (
                torch.view_as_real(tc * self.freqs_cis[: t.shape[1], None]).flatten(-2).type_as(t)
            )

        def forward(self, x):
            b, T, d = x.shape
            q = self.rope(self.wq(x).view(b, T, self.h, -1))
            k = self.rope(self.wk(x).view(b, T, self.h, -1))
            v = self.wv(x).view(b, T, self.h, -1)
            s = torch.einsum("...qhd,...khd->...hqk", q, k) / math.sqrt(q.shape[-1])
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            o = torch.einsum("...hqk,...khd->...qhd", s.softmax(-1), v)
            return self.wo(o.reshape(b, T, d))

    m = Attn()
    x = torch.randn(2, 8, 32)
    return sgd_step(m, lambda: m(x).pow(2).mean(), torch.optim.AdamW(m.parameters(), lr=1e-3))


def y_mha_padding_train():
    mha = nn.MultiheadAttention(16, 4, dropout=0.1, kdim=12, vdim=10, batch_first=True)
    head = nn.Linear(16, 3)
    m = nn.ModuleList([mha, head]).train()
    q = torch.randn(2, 5, 16)
    k, v = torch.randn(2, 7, 12), torch.randn(2, 7, 10)
    kpm = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
    bias = torch.triu(torch.full((5, 7), -1.0), 3)
    y = torch.tensor([0, 2])

    def loss():
        out, w = mha(q, k, v, key_padding_mask=kpm, attn_mask=bias, average_attn_weights=False)
        ent = -(w * (w + 1e-9).log()).sum(-1).mean()
        return F.cross_entropy(head(out.mean(1)), y) + 0.01 * ent

    return sgd_step(m, loss)


# -- compilation ------------------------------------------------------------------------


def y_compiled_autograd():
    m = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 4))
    cm = torch.compile(m)
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    x = torch.randn(8, 16)
    from torch._dynamo import compiled_autograd

    def step():
        opt.zero_grad()
        loss = cm(x).pow(2).mean()
        with compiled_autograd._enable(torch.compile(backend="inductor")):
            loss.backward()
        opt.step()

    step()
    return step


def y_compile_max_autotune():
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    cm = torch.compile(m, mode="max-autotune-no-cudagraphs")
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    x = torch.randn(8, 16)
    y = torch.randint(0, 4, (8,))

    def step():
        opt.zero_grad()
        F.cross_entropy(cm(x), y).backward()
        opt.step()

    step()
    return step


# -- recipes ----------------------------------------------------------------------------


def y_clip_logit_scale():
    class Clip(nn.Module):
        def __init__(self):
            super().__init__()
            self.img = nn.Sequential(
                nn.Conv2d(3, 8, 3, 2), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 7 * 7, 16)
            )
            self.tok = nn.Embedding(50, 16)
            self.txt = nn.Linear(16, 16)
            self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

        def forward(self, im, ids):
            zi = F.normalize(self.img(im), dim=-1)
            eos = ids.argmax(-1)
            zt = F.normalize(self.txt(self.tok(ids)[torch.arange(ids.shape[0]), eos]), dim=-1)
            scale = self.logit_scale.exp().clamp(max=100)
            logits = scale * zi @ zt.t()
            lab = torch.arange(im.shape[0])
            return (F.cross_entropy(logits, lab) + F.cross_entropy(logits.t(), lab)) / 2

    m = Clip()
    im = torch.randn(4, 3, 16, 16)
    ids = torch.randint(0, 49, (4, 6))
    ids[:, -1] = 49
    return sgd_step(m, lambda: m(im, ids), torch.optim.AdamW(m.parameters(), lr=1e-3))


def y_gan_two_opt():
    G = nn.Sequential(nn.Linear(8, 32), nn.LeakyReLU(0.2), nn.Linear(32, 16), nn.Tanh())
    D = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    og = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    od = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real = torch.rand(8, 16) * 2 - 1

    def step():
        z = torch.randn(8, 8)
        fake = G(z)
        od.zero_grad()
        ld = F.binary_cross_entropy_with_logits(
            D(real), torch.full((8, 1), 0.9)
        ) + F.binary_cross_entropy_with_logits(D(fake.detach()), torch.zeros(8, 1))
        ld.backward()
        od.step()
        og.zero_grad()
        lg = F.binary_cross_entropy_with_logits(D(fake), torch.ones(8, 1))
        lg.backward()
        og.step()

    return step


def y_distill_kl():
    teacher = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
    student = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 10))
    x = torch.randn(8, 16)
    y = torch.randint(0, 10, (8,))
    T = 4.0

    def loss():
        with torch.no_grad():
            t = teacher(x)
        s = student(x)
        kd = F.kl_div(
            F.log_softmax(s / T, -1),
            F.log_softmax(t / T, -1),
            reduction="batchmean",
            log_target=True,
        )
        return 0.7 * kd * T * T + 0.3 * F.cross_entropy(s, y)

    return sgd_step(student, loss, torch.optim.SGD(student.parameters(), lr=1e-2, momentum=0.9))


def y_ppo_step():
    from torch.distributions import Categorical

    pi = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    vf = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    m = nn.ModuleList([pi, vf])
    opt = torch.optim.Adam(m.parameters(), lr=3e-4, eps=1e-5)
    obs = torch.randn(16, 8)
    rewards = torch.randn(16)

    def step():
        with torch.no_grad():
            dist = Categorical(logits=pi(obs))
            act = dist.sample()
            old_lp = dist.log_prob(act)
            values = vf(obs).squeeze(-1)
            # GAE over a single 16-step rollout
            adv = torch.zeros(16)
            last = torch.zeros(())
            for t in reversed(range(16)):
                nxt = values[t + 1] if t + 1 < 16 else torch.zeros(())
                delta = rewards[t] + 0.99 * nxt - values[t]
                last = delta + 0.99 * 0.95 * last
                adv[t] = last
            ret = adv + values
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        for _ in range(2):
            d = Categorical(logits=pi(obs))
            ratio = (d.log_prob(act) - old_lp).exp()
            pg = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
            v = vf(obs).squeeze(-1)
            vloss = 0.5 * (v - ret).pow(2).mean()
            loss = pg + 0.5 * vloss - 0.01 * d.entropy().mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            opt.step()

    return step


def y_ddpm_schedule():
    class Eps(nn.Module):
        def __init__(self, T=1000):
            super().__init__()
            betas = torch.linspace(1e-4, 0.02, T)
            ac = torch.cumprod(1 - betas, 0)
            self.register_buffer("sqrt_ac", ac.sqrt())
            self.register_buffer("sqrt_1mac", (1 - ac).sqrt())
            self.register_buffer("snr", ac / (1 - ac))
            self.net = nn.Sequential(
                nn.Conv2d(3 + 1, 16, 3, padding=1), nn.SiLU(), nn.Conv2d(16, 3, 3, padding=1)
            )
            self.T = T

        def forward(self, x0):
            b = x0.shape[0]
            t = torch.randint(0, self.T, (b,))
            noise = torch.randn_like(x0)
            a = self.sqrt_ac.gather(0, t)[:, None, None, None]
            s = self.sqrt_1mac[t].view(b, 1, 1, 1)
            xt = a * x0 + s * noise
            tmap = (t.float() / self.T)[:, None, None, None].expand(b, 1, *x0.shape[2:])
            v_pred = self.net(torch.cat([xt, tmap], 1))
            v = a * noise - s * x0
            w = torch.clamp(self.snr[t], max=5.0) / (self.snr[t] + 1)  # min-SNR, v-pred
            return (w * (v_pred - v).pow(2).mean((1, 2, 3))).mean()

    m = Eps()
    x0 = torch.randn(4, 3, 8, 8)
    return sgd_step(m, lambda: m(x0), torch.optim.AdamW(m.parameters(), lr=1e-4))


def y_mae_masking():
    class MAE(nn.Module):
        def __init__(self, p=4, d=32):
            super().__init__()
            self.p = p
            self.embed = nn.Linear(3 * p * p, d)
            self.pos = nn.Parameter(torch.randn(1, 16, d) * 0.02)
            self.enc = nn.TransformerEncoderLayer(d, 2, 64, dropout=0.0, batch_first=True)
            self.mask_tok = nn.Parameter(torch.zeros(1, 1, d))
            self.dec = nn.Linear(d, 3 * p * p)

        def forward(self, img):
            b, c, H, W = img.shape
            p = self.p
            patches = img.unfold(2, p, p).unfold(3, p, p)  # b c h w p p
            patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * p * p)
            n = patches.shape[1]
            keep = n // 4
            noise = torch.rand(b, n)
            ids_shuffle = noise.argsort(1)
            ids_restore = ids_shuffle.argsort(1)
            ids_keep = ids_shuffle[:, :keep]
            tok = self.embed(patches) + self.pos
            vis = torch.gather(tok, 1, ids_keep[..., None].expand(-1, -1, tok.shape[-1]))
            enc = self.enc(vis)
            full = torch.cat([enc, self.mask_tok.expand(b, n - keep, -1)], 1)
            full = torch.gather(full, 1, ids_restore[..., None].expand(-1, -1, full.shape[-1]))
            rec = self.dec(full + self.pos)
            mask = torch.ones(b, n)
            mask[:, :keep] = 0
            mask = torch.gather(mask, 1, ids_restore)
            target = patches
            mu, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
            target = (target - mu) / (var + 1e-6).sqrt()
            loss = ((rec - target) ** 2).mean(-1)
            img_rec = F.fold(rec.transpose(1, 2), (H, W), p, stride=p)
            return (loss * mask).sum() / mask.sum() + 0 * img_rec.mean()

    m = MAE()
    img = torch.randn(2, 3, 16, 16)
    return sgd_step(m, lambda: m(img), torch.optim.AdamW(m.parameters(), lr=1.5e-4))


def y_unet_antialias():
    class Block(nn.Module):
        def __init__(self, i, o):
            super().__init__()
            self.c = nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(2, o), nn.SiLU())

        def forward(self, x):
            return self.c(x)

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.e1, self.e2 = Block(3, 8), Block(8, 16)
            self.mid = Block(16, 16)
            self.up = nn.Sequential(nn.Conv2d(16, 8 * 4, 1), nn.PixelShuffle(2))
            self.d1 = Block(16, 8)
            self.out = nn.Conv2d(8, 3, 1)

        def forward(self, x):
            s1 = self.e1(x)
            h = F.interpolate(
                s1, scale_factor=0.5, mode="bilinear", antialias=True, align_corners=False
            )
            h = self.mid(self.e2(h))
            h = self.up(h)
            h = self.d1(torch.cat([h, s1], 1))
            y = self.out(h)
            big = F.interpolate(
                y, size=(24, 24), mode="bicubic", antialias=True, align_corners=False
            )
            return y, big

    m = UNet()
    x = torch.randn(2, 3, 16, 16)
    hr = torch.randn(2, 3, 24, 24)

    def loss():
        y, big = m(x)
        return F.l1_loss(y, x) + F.mse_loss(big, hr)

    return sgd_step(m, loss, torch.optim.Adam(m.parameters(), lr=1e-3))


def y_audio_frontend():
    def mel_fb(n_freqs, n_mels, sr=8000):
        def hz2mel(f):
            return 2595 * math.log10(1 + f / 700)

        mels = torch.linspace(hz2mel(0), hz2mel(sr / 2), n_mels + 2)
        hz = 700 * (10 ** (mels / 2595) - 1)
        freqs = torch.linspace(0, sr / 2, n_freqs)
        lo, ce, hi = hz[:-2, None], hz[1:-1, None], hz[2:, None]
        return torch.clamp(
            torch.minimum((freqs - lo) / (ce - lo), (hi - freqs) / (hi - ce)), min=0
        ).T

    class Front(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("window", torch.hann_window(128))
            self.register_buffer("fb", mel_fb(65, 16))
            self.enhance = nn.Conv1d(1, 1, 9, padding=4)
            self.cls = nn.Sequential(
                nn.Conv1d(16, 16, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool1d(1),
                nn.Flatten(),
                nn.Linear(16, 5),
            )

        def forward(self, wav):
            w = self.enhance(wav[:, None]).squeeze(1)
            spec = torch.stft(w, 128, hop_length=32, window=self.window, return_complex=True)
            power = spec.abs().pow(2)
            mel = torch.matmul(power.transpose(1, 2), self.fb).transpose(1, 2)
            logmel = torch.log(mel.clamp(min=1e-10))
            logmel = (logmel - logmel.mean(-1, keepdim=True)) / (
                logmel.std(-1, keepdim=True) + 1e-5
            )
            rec = torch.istft(spec, 128, hop_length=32, window=self.window, length=wav.shape[-1])
            return self.cls(logmel), rec

    m = Front()
    wav = torch.randn(2, 1024)
    y = torch.tensor([1, 4])

    def loss():
        logits, rec = m(wav)
        return F.cross_entropy(logits, y) + F.l1_loss(rec, wav)

    return sgd_step(m, loss, torch.optim.Adam(m.parameters(), lr=1e-3))


# -- decoding ---------------------------------------------------------------------------


def y_seq2seq_beam():
    torch.manual_seed(0)
    V, d, B = 24, 16, 3
    emb = nn.Embedding(V, d)
    tr = nn.Transformer(d, 2, 1, 1, 32, dropout=0.0, batch_first=True)
    head = nn.Linear(d, V)
    nn.ModuleList([emb, tr, head]).eval()
    src = torch.randint(3, V, (1, 7))

    @torch.no_grad()
    def step():
        memory = tr.encoder(emb(src))
        memory = memory.index_select(0, torch.zeros(B, dtype=torch.long))
        seqs = torch.ones(B, 1, dtype=torch.long)
        scores = torch.tensor([0.0] + [-1e9] * (B - 1))
        finished = torch.zeros(B, dtype=torch.bool)
        for _ in range(5):
            L = seqs.shape[1]
            mask = nn.Transformer.generate_square_subsequent_mask(L)
            h = tr.decoder(emb(seqs), memory, tgt_mask=mask, tgt_is_causal=True)
            lp = head(h[:, -1]).log_softmax(-1)
            lp = torch.where(
                finished[:, None],
                torch.full_like(lp, -1e9).index_fill(1, torch.tensor([2]), 0.0),
                lp,
            )
            cand = (scores[:, None] + lp).flatten()
            top, idx = cand.topk(B)
            beam = torch.div(idx, V, rounding_mode="floor")
            tok = idx % V
            seqs = torch.cat([seqs.index_select(0, beam), tok[:, None]], 1)
            finished = finished.gather(0, beam) | (tok == 2)
            scores = top
            if bool(finished.all()):
                break
        lengths = (seqs != 2).sum(1).float()
        best = (scores / lengths.pow(0.6)).argmax()
        return seqs[best]

    return step


def y_speculative_decode():
    class LM(nn.Module):
        def __init__(self, d, layers):
            super().__init__()
            self.emb = nn.Embedding(32, d)
            self.blocks = nn.ModuleList(
                [
                    nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.0, batch_first=True)
                    for _ in range(layers)
                ]
            )
            self.head = nn.Linear(d, 32)

        def forward(self, ids):
            h = self.emb(ids)
            mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
            for b in self.blocks:
                h = b(h, src_mask=mask, is_causal=True)
            return self.head(h)

    torch.manual_seed(0)
    target, draft = LM(32, 2).eval(), LM(16, 1).eval()
    prompt = torch.randint(0, 32, (1, 4))

    @torch.no_grad()
    def step():
        ids = prompt
        k = 3
        while ids.shape[1] < 12:
            prop = ids
            for _ in range(k):
                nxt = draft(prop)[:, -1].argmax(-1, keepdim=True)
                prop = torch.cat([prop, nxt], 1)
            logits = target(prop)[:, ids.shape[1] - 1 :]
            tgt = logits.argmax(-1)  # k + 1 target tokens
            drafted = prop[:, ids.shape[1] :]
            agree = (tgt[:, :k] == drafted).int().cumprod(1)
            n = int(agree.sum())
            ids = torch.cat([ids, drafted[:, :n], tgt[:, n : n + 1]], 1)
        return ids

    return step


# -- more numerics ----------------------------------------------------------------------


def y_nan_masked_regression():
    m = _mlp(8, 16, 3)
    x = torch.randn(12, 8)
    y = torch.randn(12, 3)
    y[torch.rand(12, 3) < 0.3] = float("nan")  # missing labels
    y[0, 0] = float("nan")

    def loss():
        p = m(x)
        miss = torch.isnan(y)
        err = torch.where(miss, torch.full_like(p, float("nan")), p - y).pow(2)
        per_task = err.nanmean(0)
        total = torch.nansum(err) / (~miss).sum()
        clean = torch.nan_to_num(y, nan=0.0)
        l1 = ((p - clean).abs() * (~miss)).sum() / (~miss).sum()
        return per_task.sum() + total + l1

    return sgd_step(m, loss)


def y_mixup_cutmix():
    from torch.distributions import Beta

    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )
    x = torch.randn(6, 3, 16, 16)
    y = torch.randint(0, 5, (6,))
    beta = Beta(torch.tensor(0.4), torch.tensor(0.4))

    def loss():
        lam = beta.sample()
        perm = torch.randperm(6)
        onehot = F.one_hot(y, 5).float()
        if lam > 0.5:  # mixup
            xm = x.lerp(x[perm], 1 - lam)
            t = onehot.lerp(onehot[perm], 1 - lam)
        else:  # cutmix
            cut = int(16 * math.sqrt(1 - lam.item()))
            cx, cy = torch.randint(0, 16 - cut + 1, (2,)).tolist()
            xm = x.clone()
            xm[:, :, cy : cy + cut, cx : cx + cut] = x[perm, :, cy : cy + cut, cx : cx + cut]
            a = 1 - cut * cut / 256
            t = onehot * a + onehot[perm] * (1 - a)
        return F.cross_entropy(m(xm), t, label_smoothing=0.1)

    return sgd_step(m, loss, torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9))


def y_sam_two_pass():
    m = _mlp(16, 32, 4)
    base = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9)
    x = torch.randn(8, 16)
    y = torch.randint(0, 4, (8,))
    rho = 0.05

    def step():
        base.zero_grad()
        F.cross_entropy(m(x), y).backward()
        params = [p for p in m.parameters() if p.grad is not None]
        gnorm = torch.norm(torch.stack([p.grad.norm(2) for p in params]), 2)
        eps = []
        with torch.no_grad():
            for p in params:
                e = p.grad * (rho / (gnorm + 1e-12))
                p.add_(e)
                eps.append(e)
        base.zero_grad()
        F.cross_entropy(m(x), y).backward()
        with torch.no_grad():
            torch._foreach_sub_(params, eps)
        base.step()

    return step


def y_tensor_lr_sched():
    m = _mlp(16, 32, 4)
    opt = torch.optim.AdamW(m.parameters(), lr=torch.tensor(1e-3), weight_decay=0.05)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=10)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[10])
    x = torch.randn(8, 16)

    def step():
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()
        sched.step()

    return step


def y_dino_center():
    def net():
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, 2),
            nn.GELU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 16),
        )

    student, teacher = net(), net()
    teacher.load_state_dict(student.state_dict())
    teacher.requires_grad_(False)
    center = torch.zeros(1, 16)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    img = torch.randn(4, 3, 24, 24)

    def step():
        g = [img, img.flip(-1)]
        local = [F.interpolate(img[..., :16, :16], size=12, mode="bilinear", align_corners=False)]
        with torch.no_grad():
            t_out = [teacher(v) for v in g]
            t_prob = [F.softmax((t - center) / 0.04, -1) for t in t_out]
        s_out = [student(v) for v in g + local]
        loss, n = 0.0, 0
        for i, tp in enumerate(t_prob):
            for j, so in enumerate(s_out):
                if i == j:
                    continue
                loss = loss + torch.sum(-tp * F.log_softmax(so / 0.1, -1), -1).mean()
                n += 1
        opt.zero_grad()
        (loss / n).backward()
        opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(teacher.parameters()), list(student.parameters()), 0.004)
            center.mul_(0.9).add_(torch.cat(t_out).mean(0, keepdim=True), alpha=0.1)

    return step


def y_chunked_ce_ckpt():
    from torch.utils.checkpoint import checkpoint

    d, V = 32, 200
    body = nn.Sequential(nn.Embedding(V, d), nn.Linear(d, d), nn.GELU())
    head = nn.Linear(d, V, bias=False)
    m = nn.ModuleList([body, head])
    ids = torch.randint(0, V, (2, 24))
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = -100

    def chunk_loss(h, lab):
        logits = head(h).float()
        z = torch.logsumexp(logits, -1)
        ce = F.cross_entropy(logits, lab, ignore_index=-100, reduction="sum")
        return ce + 1e-4 * (z.pow(2) * (lab != -100)).sum()

    def loss():
        h = body(ids).flatten(0, 1)
        lab = labels.flatten()
        total = 0.0
        for hc, lc in zip(h.split(16), lab.split(16), strict=True):
            total = total + checkpoint(chunk_loss, hc, lc, use_reentrant=False)
        return total / (lab != -100).sum()

    return sgd_step(m, loss, torch.optim.AdamW(m.parameters(), lr=1e-3))


# -- recipes whose inputs carry domains: buffers and state read as they are ------------


def y_ddpm_index_pow():
    # diffusers' add_noise: alphas_cumprod[timesteps] ** 0.5 and (1 - ...) ** 0.5
    class Sched(nn.Module):
        def __init__(self, T=1000):
            super().__init__()
            betas = torch.linspace(1e-4, 0.02, T)
            self.register_buffer("alphas_cumprod", torch.cumprod(1 - betas, 0))
            self.net = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1), nn.SiLU(), nn.Conv2d(16, 3, 3, padding=1)
            )
            self.T = T

        def forward(self, x0):
            t = torch.randint(0, self.T, (x0.shape[0],))
            noise = torch.randn_like(x0)
            sqrt_a = (self.alphas_cumprod[t] ** 0.5).flatten()[:, None, None, None]
            sqrt_1ma = ((1 - self.alphas_cumprod[t]) ** 0.5).flatten()[:, None, None, None]
            xt = sqrt_a * x0 + sqrt_1ma * noise
            snr = self.alphas_cumprod[t] / (1 - self.alphas_cumprod[t])
            w = torch.stack([snr, 5 * torch.ones_like(snr)], 1).min(1).values / snr
            return (w * F.mse_loss(self.net(xt), noise, reduction="none").mean((1, 2, 3))).mean()

    m = Sched()
    x0 = torch.randn(4, 3, 8, 8)
    return sgd_step(m, lambda: m(x0), torch.optim.AdamW(m.parameters(), lr=1e-4))


def y_ppo_obs_norm():
    class RunningMeanStd(nn.Module):
        def __init__(self, shape):
            super().__init__()
            self.register_buffer("mean", torch.zeros(shape))
            self.register_buffer("var", torch.ones(shape))
            self.register_buffer("count", torch.tensor(1e-4))

        @torch.no_grad()
        def update(self, x):
            bm, bv, bc = x.mean(0), x.var(0, unbiased=False), x.shape[0]
            delta = bm - self.mean
            tot = self.count + bc
            new_mean = self.mean + delta * bc / tot
            m2 = self.var * self.count + bv * bc + delta.pow(2) * self.count * bc / tot
            self.mean.copy_(new_mean)
            self.var.copy_(m2 / tot)
            self.count.copy_(tot)

        def forward(self, x):
            return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-10, 10)

    from torch.distributions import Normal

    rms = RunningMeanStd(6)
    pi = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 2))
    log_std = nn.Parameter(torch.zeros(2))
    vf = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.Adam([*pi.parameters(), log_std, *vf.parameters()], lr=3e-4)
    obs = torch.randn(16, 6) * 3 + 1
    ret = torch.randn(16)

    def step():
        rms.update(obs)
        o = rms(obs)
        with torch.no_grad():
            d0 = Normal(pi(o), log_std.exp())
            act = d0.sample()
            old_lp = d0.log_prob(act).sum(-1)
            old_v = vf(o).squeeze(-1)
            adv = ret - old_v
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        d = Normal(pi(o), log_std.exp())
        ratio = (d.log_prob(act).sum(-1) - old_lp).exp()
        pg = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        v = vf(o).squeeze(-1)
        v_clip = old_v + (v - old_v).clamp(-0.2, 0.2)
        vloss = torch.max((v - ret).pow(2), (v_clip - ret).pow(2)).mean()
        loss = pg + 0.5 * vloss - 0.001 * d.entropy().sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def y_moco_queue():
    def enc():
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, 2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 16),
        )

    class MoCo(nn.Module):
        def __init__(self, K=32):
            super().__init__()
            self.q, self.k = enc(), enc()
            self.k.load_state_dict(self.q.state_dict())
            self.k.requires_grad_(False)
            self.register_buffer("queue", F.normalize(torch.randn(16, K), dim=0))
            self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))
            self.K = K

        def forward(self, im_q, im_k):
            q = F.normalize(self.q(im_q), dim=1)
            with torch.no_grad():
                for pq, pk in zip(self.q.parameters(), self.k.parameters(), strict=True):
                    pk.data.mul_(0.999).add_(pq.data, alpha=0.001)
                k = F.normalize(self.k(im_k), dim=1)
            l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
            l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
            logits = torch.cat([l_pos, l_neg], 1) / 0.2
            labels = torch.zeros(logits.shape[0], dtype=torch.long)
            ptr = int(self.queue_ptr)
            self.queue[:, ptr : ptr + k.shape[0]] = k.T
            self.queue_ptr[0] = (ptr + k.shape[0]) % self.K
            return F.cross_entropy(logits, labels)

    m = MoCo()
    x = torch.randn(8, 3, 12, 12)
    return sgd_step(m, lambda: m(x, x.flip(-1)), torch.optim.SGD(m.q.parameters(), lr=0.03))


def y_knn_label_bank():
    class KNN(nn.Module):
        def __init__(self, n=64, d=16, c=5):
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, d))
            self.register_buffer("bank", F.normalize(torch.randn(n, d), dim=1))
            self.register_buffer("labels", torch.randint(0, c, (n,)))
            self.c = c

    torch.manual_seed(0)
    m = KNN().eval()
    x = torch.randn(6, 12)

    @torch.no_grad()
    def step():
        f = F.normalize(m.backbone(x), dim=1)
        sim = f @ m.bank.T
        w, idx = sim.topk(10, dim=1)
        nb = m.labels[idx]  # 6 x 10
        votes = F.one_hot(nb, m.c).float() * (w / 0.07).exp()[..., None]
        pred = votes.sum(1).argmax(1)
        hist = torch.zeros(6, m.c).scatter_add_(1, nb, torch.ones_like(w))
        return pred, hist

    return step


def y_maml_inner_loop():
    from torch.func import functional_call

    net = nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, 1))
    meta = torch.optim.Adam(net.parameters(), lr=1e-3)
    xs, ys = torch.rand(3, 10, 1) * 10 - 5, torch.randn(3, 10, 1)
    xq, yq = torch.rand(3, 10, 1) * 10 - 5, torch.randn(3, 10, 1)

    def step():
        meta.zero_grad()
        outer = 0.0
        for task in range(3):
            params = dict(net.named_parameters())
            for _ in range(2):
                inner = F.mse_loss(functional_call(net, params, (xs[task],)), ys[task])
                grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
                params = {k: p - 0.01 * g for (k, p), g in zip(params.items(), grads, strict=True)}
            outer = outer + F.mse_loss(functional_call(net, params, (xq[task],)), yq[task])
        (outer / 3).backward()
        meta.step()

    return step


def y_poincare_embed():
    emb = nn.Embedding(30, 2)
    nn.init.uniform_(emb.weight, -1e-3, 1e-3)
    u = torch.randint(0, 30, (16,))
    v = torch.randint(0, 30, (16, 5))  # one positive, four negatives

    def dist(a, b):
        sq = (a - b).pow(2).sum(-1)
        na = (1 - a.pow(2).sum(-1)).clamp(min=1e-5)
        nb = (1 - b.pow(2).sum(-1)).clamp(min=1e-5)
        return torch.acosh(1 + 2 * sq / (na * nb))

    opt = torch.optim.SGD(emb.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        d = dist(emb(u)[:, None], emb(v))
        F.cross_entropy(-d, torch.zeros(16, dtype=torch.long)).backward()
        with torch.no_grad():  # Riemannian SGD: rescale, step, project into the ball
            w = emb.weight
            w.grad.mul_(((1 - w.pow(2).sum(-1, keepdim=True)) ** 2) / 4)
            opt.step()
            norm = w.norm(dim=-1, keepdim=True)
            w.copy_(torch.where(norm >= 1, w / norm * (1 - 1e-5), w))

    return step


def y_class_balanced():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            self.register_buffer("class_counts", torch.tensor([500.0, 100.0, 20.0, 5.0]))

    m = M()
    pool_x = torch.randn(40, 8)
    pool_y = torch.randint(0, 4, (40,))

    def loss():
        prior = m.class_counts / m.class_counts.sum()
        w = (1.0 / m.class_counts)[pool_y]
        pick = torch.multinomial(w / w.sum(), 12, replacement=True)
        x, y = pool_x[pick], pool_y[pick]
        logits = m.net(x) + torch.log(prior)  # logit adjustment
        eff = (1 - 0.999**m.class_counts) / (1 - 0.999)
        return F.cross_entropy(logits, y, weight=(1 / eff) / (1 / eff).sum() * 4)

    return sgd_step(m, loss)


def y_seg_dice_ignore():
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))
    x = torch.randn(2, 3, 12, 12)
    target = torch.randint(0, 4, (2, 12, 12))
    target[:, :2] = 255
    cw = torch.tensor([0.5, 1.0, 2.0, 2.0])

    def loss():
        logits = m(x)
        ce = F.cross_entropy(logits, target, weight=cw, ignore_index=255)
        valid = target != 255
        t = target.clone()
        t[~valid] = 0
        oh = F.one_hot(t, 4).permute(0, 3, 1, 2).float() * valid[:, None]
        p = logits.softmax(1) * valid[:, None]
        inter = (p * oh).sum((0, 2, 3))
        dice = 1 - (2 * inter + 1) / (p.sum((0, 2, 3)) + oh.sum((0, 2, 3)) + 1)
        return ce + dice.mean()

    return sgd_step(m, loss, torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9))


def y_sparse_dispatcher_moe():
    # the SparseDispatcher of Shazeer et al.'s noisy top-k MoE, as its popular port has it
    class MoE(nn.Module):
        def __init__(self, d=8, e=4, k=2):
            super().__init__()
            self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(e)])
            self.w_gate = nn.Parameter(torch.randn(d, e) * 0.1)
            self.w_noise = nn.Parameter(torch.zeros(d, e))
            self.e, self.k = e, k

        def forward(self, x):
            clean = x @ self.w_gate
            std = F.softplus(x @ self.w_noise) + 1e-2
            logits = clean + torch.randn_like(clean) * std
            top, idx = logits.topk(self.k + 1, 1)
            gates_k = top[:, : self.k].softmax(1)
            gates = torch.zeros_like(logits).scatter(1, idx[:, : self.k], gates_k)
            normal = torch.distributions.Normal(torch.tensor([0.0]), torch.tensor([1.0]))
            thr = top[:, self.k : self.k + 1]
            load = normal.cdf((clean - thr) / std).sum(0)
            importance = gates.sum(0)

            def cv2(v):
                return v.float().var() / (v.float().mean() ** 2 + 1e-10)

            aux = cv2(importance) + cv2(load)
            sorted_e, index_sorted = torch.nonzero(gates).sort(0)
            _, expert_index = sorted_e.split(1, dim=1)
            batch_index = torch.nonzero(gates)[index_sorted[:, 1], 0]
            part_sizes = (gates > 0).sum(0).tolist()
            gates_exp = gates[batch_index.flatten()]
            nz_gates = torch.gather(gates_exp, 1, expert_index)
            inp = x[batch_index].squeeze(1).split(part_sizes, 0)
            outs = [self.experts[i](inp[i]) for i in range(self.e)]
            stitched = torch.cat(outs, 0) * nz_gates
            out = torch.zeros(x.shape[0], x.shape[1]).index_add(0, batch_index, stitched)
            return out, aux

    torch.manual_seed(0)
    m = MoE()
    x = torch.randn(16, 8)

    def loss():
        y, aux = m(x)
        return y.pow(2).mean() + 0.01 * aux

    return sgd_step(m, loss)


def y_dpo_pairs():
    class LM(nn.Module):
        def __init__(self, V=40, d=16):
            super().__init__()
            self.emb = nn.Embedding(V, d)
            self.mix = nn.Linear(d, d)
            self.head = nn.Linear(d, V)

        def forward(self, ids):
            h = (
                torch.tanh(self.mix(self.emb(ids))).cumsum(1)
                / torch.arange(1, ids.shape[1] + 1)[:, None]
            )
            return self.head(h)

    torch.manual_seed(0)
    policy, ref = LM(), LM()
    ref.load_state_dict(policy.state_dict())
    ref.eval().requires_grad_(False)
    chosen = torch.randint(0, 40, (4, 10))
    rejected = torch.randint(0, 40, (4, 10))
    prompt_len = torch.tensor([3, 4, 2, 5, 3, 4, 2, 5])
    pad_from = torch.tensor([10, 8, 9, 7, 9, 10, 8, 8])

    def labels_for(ids):
        pos = torch.arange(ids.shape[1])[None]
        lab = ids.clone()
        lab[(pos < prompt_len[:, None]) | (pos >= pad_from[:, None])] = -100
        return lab[:, 1:]

    def logps(model, ids):
        logits = model(ids)[:, :-1]
        lab = labels_for(ids)
        mask = lab != -100
        lab = lab.clone()
        lab[lab == -100] = 0
        lp = torch.gather(logits.log_softmax(-1), 2, lab.unsqueeze(2)).squeeze(2)
        return (lp * mask).sum(-1)

    ids = torch.cat([chosen, rejected])

    def loss():
        pl = logps(policy, ids)
        with torch.no_grad():
            rl = logps(ref, ids)
        pc, pr = pl.chunk(2)
        rc, rr = rl.chunk(2)
        return -F.logsigmoid(0.1 * ((pc - rc) - (pr - rr))).mean()

    return sgd_step(policy, loss, torch.optim.AdamW(policy.parameters(), lr=1e-4))


def y_mdn_mixture():
    from torch.distributions import Categorical, Independent, MixtureSameFamily, Normal

    class MDN(nn.Module):
        def __init__(self, k=5, d=2):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 32), nn.Tanh())
            self.pi = nn.Linear(32, k)
            self.mu = nn.Linear(32, k * d)
            self.log_sigma = nn.Linear(32, k * d)
            self.k, self.d = k, d

        def forward(self, x):
            h = self.body(x)
            b = x.shape[0]
            comp = Independent(
                Normal(
                    self.mu(h).view(b, self.k, self.d),
                    self.log_sigma(h).clamp(-5, 3).exp().view(b, self.k, self.d),
                ),
                1,
            )
            return MixtureSameFamily(Categorical(logits=self.pi(h)), comp)

    m = MDN()
    x, y = torch.randn(16, 4), torch.randn(16, 2)

    def loss():
        dist = m(x)
        return -dist.log_prob(y).mean() + 0 * dist.sample().sum()

    return sgd_step(m, loss, torch.optim.Adam(m.parameters(), lr=1e-3))


def y_shampoo_eigh():
    lin = nn.Linear(8, 6, bias=False)
    L = torch.eye(6) * 1e-4
    R = torch.eye(8) * 1e-4
    x = torch.randn(16, 8)

    def inv_root(mat):
        evals, evecs = torch.linalg.eigh(mat)
        return evecs @ torch.diag(evals.clamp(min=1e-6).pow(-0.25)) @ evecs.T

    def step():
        lin.zero_grad()
        lin(x).pow(2).mean().backward()
        with torch.no_grad():
            g = lin.weight.grad
            L.mul_(0.95).add_(g @ g.T, alpha=0.05)
            R.mul_(0.95).add_(g.T @ g, alpha=0.05)
            pre = inv_root(L + 1e-6 * torch.eye(6)) @ g @ inv_root(R + 1e-6 * torch.eye(8))
            pre *= g.norm() / (pre.norm() + 1e-12)  # grafting onto SGD's step size
            lin.weight.sub_(0.01 * pre)

    return step


def y_sgns_sparse_adagrad():
    # word2vec's skip-gram with negative sampling: sparse embeddings under Adagrad,
    # negatives drawn from the unigram distribution ** 0.75
    class SGNS(nn.Module):
        def __init__(self, V=60, d=8):
            super().__init__()
            self.inp = nn.Embedding(V, d, sparse=True)
            self.out = nn.Embedding(V, d, sparse=True)
            self.register_buffer("counts", torch.randint(1, 100, (V,)).float())

    torch.manual_seed(0)
    m = SGNS()
    opt = torch.optim.Adagrad(m.parameters(), lr=0.05)
    center = torch.randint(0, 60, (16,))
    ctx = torch.randint(0, 60, (16,))

    def step():
        noise = m.counts**0.75
        neg = torch.multinomial(noise / noise.sum(), 16 * 4, replacement=True).view(16, 4)
        c = m.inp(center)
        pos = F.logsigmoid((c * m.out(ctx)).sum(-1))
        negs = F.logsigmoid(-torch.bmm(m.out(neg), c[:, :, None]).squeeze(-1)).sum(-1)
        opt.zero_grad()
        (-(pos + negs).mean()).backward()
        opt.step()

    return step


def y_hutchinson_hessian():
    # AdaHessian-style: the Hessian diagonal by Hutchinson's estimator (Rademacher
    # probes, a Hessian-vector product by double backward) scales the step
    m = _mlp(8, 16, 2)
    x, y = torch.randn(12, 8), torch.randint(0, 2, (12,))
    params = list(m.parameters())
    state = [torch.zeros_like(p) for p in params]

    def step():
        loss = F.cross_entropy(m(x), y)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        vs = [torch.randint_like(p, 0, 2) * 2 - 1 for p in params]
        hvs = torch.autograd.grad(grads, params, grad_outputs=vs)
        with torch.no_grad():
            for p, g, v, hv, s in zip(params, grads, vs, hvs, state, strict=True):
                s.mul_(0.95).add_((hv * v).abs(), alpha=0.05)
                p.sub_(0.01 * g / (s.sqrt() + 1e-4))

    return step


WORKLOADS = {k[2:]: v for k, v in globals().items() if k.startswith("y_")}
