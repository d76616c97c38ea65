"""A ninth batch of steps for ``scripts/bench_features.py``: model code whose correctness
depends on the values of tensors that exist before the step (buffers, closed-over
tensors, optimizer and module state), which the trace records only as shapes, dtypes
and strides, so that the replay must fill them from rules (passes/values.py,
oprules/). Each is a small model with a forward, loss, backward and optimizer step (or
an inference step), written as users write it, with no clamps added for the replay.

Domains of math on buffers (logs of ratios, a Fisher z-transform, lgamma/digamma of
Dirichlet state, variances from running sums over an integer count, EMA bias
correction with a step counter, division by a buffer's sum); sortedness (bucketize
and searchsorted against boundary buffers, inverse-CDF sampling from a cumsum of a
probability buffer, histc, bincount with weights); probabilities from buffers
(multinomial of normalised counts, Categorical, Bernoulli, Beta, Dirichlet,
MultivariateNormal from a scale_tril or precision buffer, LowRankMultivariateNormal);
indices from buffers (``(u * n).long()``, argsort, topk, a ring-buffer pointer, a KV
cache position, repeat_interleave and unique counts, scatter_add_, a sparse adjacency
from index buffers); matrices from buffers (a Gram solve, a Kalman filter with
Cholesky, Mahalanobis with a precision buffer, ZCA whitening by eigh, matrix_exp, a
stored Cholesky factor); masks and lengths (attention masks from a lengths buffer,
pack_padded_sequence, CTC with buffer lengths, masked_select then a fixed reshape);
integer arithmetic (floor division and remainders by buffers, gcd/lcm, shifts,
``.item()``-driven control flow); quantization state (fake quantization with
scale/zero-point buffers, per-channel low-bit, QAT's fused observer, quantize with a
buffer scale). ``WORKLOADS``: name -> a builder that returns the step; ``*_min`` are
minimal repros of what a probe found.

What this batch found when it was added (46 of the first 46 steps run: 39 pass; later
additions 7 of 8 pass): domains do not pass through two-input arithmetic (log1p of a
buffer difference; ``1 - cumprod(1 - betas)`` under sqrt; Cholesky of ``H P H^T + R``);
a non-negative range on a keeps-sign result (``multinomial(c / c.sum())``) puts no sign
on its inputs; eigh's input gets no positive-definite fill (ZCA whitening, rsqrt of
eigenvalues; ``torch.logdet`` alone likewise); searchsorted's result (one past the end)
reads as an index unguarded; a float buffer scaled to an index (``(u * n).long()``)
replays negative; a SUM fill (repeat_interleave) overrides an index bound and a
divisor's nonzero rule; lengths compared with ``arange`` are filled with 0 (a fully
masked softmax row); ``narrow.Tensor``'s start has no bound; CTC targets have no class
bound (out-of-range reads, heap corruption); fake_quantize_per_channel's scale is made
a leaf that requires grad. Fixed since: eigh/eigvalsh/logdet/det take positive-definite
fills, multinomial's weights are positive (through ``c / c.sum()``), a product in
(0, 1] has its factors there and a complement's range bounds its tensor on both sides
(the DDPM schedule), CTC targets are classes of log_probs' last dim, fake quantization's
scale is positive, its zero point below quant_max and neither a parameter, a search's
result read as an index is wrapped into range, lengths compared with arange lie in
[1, n], a SUM fill's parts are at least 1 where its total allows (the divisor). The
others are ``known`` in bench_features.py (README: Known limits).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from features_steps import sgd_step
from torch import distributions as D

_sgd = functools.partial(sgd_step, lr=0.01)


class _Head(nn.Module):
    """A small linear model with room for buffers."""

    def __init__(self, d_in=8, d_out=4):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)


# -- domains of math on buffers ----------------------------------------------------


def y_log_ratio_prior():
    """Logit adjustment by the log-ratio of two positive count buffers."""
    m = _Head(8, 5)
    m.register_buffer("pos", torch.rand(5) * 10 + 1)
    m.register_buffer("neg", torch.rand(5) * 10 + 1)
    x, y = torch.randn(4, 8), torch.randint(0, 5, (4,))
    return _sgd(m, lambda: F.cross_entropy(m.lin(x) + torch.log(m.pos / m.neg), y))


def y_fisher_z_corr():
    """Fisher z-transform of a correlation formed from running covariance buffers."""
    m = _Head(8, 4)
    m.register_buffer("cov", torch.full((4,), 0.3))
    m.register_buffer("var_a", torch.ones(4))
    m.register_buffer("var_b", torch.full((4,), 2.0))
    x = torch.randn(4, 8)

    def loss():
        z = torch.atanh(m.cov / torch.sqrt(m.var_a * m.var_b))
        return (m.lin(x) * z).pow(2).mean()

    return _sgd(m, loss)


def y_acos_angle_buffers():
    """An angular margin whose angle is acos of the product of two cosine buffers."""
    m = _Head(8, 4)
    m.register_buffer("cos_a", torch.rand(4) * 0.9)
    m.register_buffer("cos_b", torch.rand(4) * 0.9)
    m.register_buffer("sin_b", torch.rand(4) * 0.5)
    x = torch.randn(4, 8)

    def loss():
        theta = torch.acos(m.cos_a * m.cos_b - m.sin_b * 0.1)
        return (m.lin(x) + theta).square().mean()

    return _sgd(m, loss)


def y_dirichlet_kl_state():
    """KL(Dir(alpha) || Dir(prior)) with lgamma/digamma; alpha = prior + counts."""
    m = _Head(8, 4)
    m.register_buffer("prior", torch.full((4,), 0.5))
    m.register_buffer("counts", torch.rand(4) * 3)
    x = torch.randn(4, 8)

    def loss():
        alpha = m.prior + m.counts
        a0 = alpha.sum()
        kl = (torch.lgamma(a0) - torch.lgamma(alpha).sum() - torch.lgamma(m.prior.sum())
              + torch.lgamma(m.prior).sum()
              + ((alpha - m.prior) * (torch.digamma(alpha) - torch.digamma(a0))).sum())
        return m.lin(x).square().mean() * kl

    return _sgd(m, loss)


def y_log1p_buffer_diff():
    """log1p of a margin between two buffers (hinge statistics kept in state)."""
    m = _Head(8, 4)
    m.register_buffer("hi", torch.full((4,), 2.0))
    m.register_buffer("lo", torch.full((4,), 0.5))
    x = torch.randn(4, 8)
    return _sgd(m, lambda: (m.lin(x) * torch.log1p(m.hi - m.lo)).pow(2).mean())


def y_running_var_count():
    """Normalisation by running sums over an integer count buffer: var = E[x^2] - E[x]^2."""
    m = _Head(8, 4)
    m.register_buffer("s", torch.zeros(8))
    m.register_buffer("sq", torch.zeros(8))
    m.register_buffer("n", torch.zeros((), dtype=torch.long))
    x = torch.randn(4, 8)

    def loss():
        with torch.no_grad():
            m.s += x.sum(0)
            m.sq += (x * x).sum(0)
            m.n += x.shape[0]
        mean = m.s / m.n
        var = m.sq / m.n - mean * mean
        return m.lin((x - mean) * torch.rsqrt(var + 1e-5)).pow(2).mean()

    return _sgd(m, loss)


def y_ema_bias_correction():
    """An EMA of features with bias correction by a step-count buffer."""
    m = _Head(8, 4)
    m.register_buffer("ema", torch.zeros(8))
    m.register_buffer("step_n", torch.zeros((), dtype=torch.long))
    beta = 0.99
    x = torch.randn(4, 8)

    def loss():
        with torch.no_grad():
            m.step_n += 1
            m.ema.mul_(beta).add_(x.mean(0), alpha=1 - beta)
        corrected = m.ema / (1 - beta ** m.step_n)
        return m.lin(x - corrected).pow(2).mean()

    return _sgd(m, loss)


def y_div_buffer_sum():
    """Class weights normalised by their sum, as a loss weight."""
    m = _Head(8, 5)
    m.register_buffer("freq", torch.rand(5) + 0.1)
    x, y = torch.randn(4, 8), torch.randint(0, 5, (4,))

    def loss():
        w = (1.0 / m.freq) / (1.0 / m.freq).sum()
        return F.cross_entropy(m.lin(x), y, weight=w)

    return _sgd(m, loss)


# -- sortedness ---------------------------------------------------------------------


def y_bucketize_embed():
    """Bucketised numeric features embedded (boundaries a sorted buffer)."""
    emb = nn.Embedding(9, 4)
    m = nn.Module()
    m.emb = emb
    m.register_buffer("bounds", torch.linspace(-2, 2, 8))
    x = torch.randn(6)
    return _sgd(m, lambda: m.emb(torch.bucketize(x, m.bounds)).pow(2).mean())


def y_icdf_sample():
    """Inverse-CDF sampling of bins from a probability buffer, gathered from a table."""
    m = _Head(8, 4)
    m.register_buffer("probs", torch.softmax(torch.randn(6), 0))
    table = nn.Parameter(torch.randn(6, 8))
    m.table = table
    u = torch.rand(5)

    def loss():
        cdf = torch.cumsum(m.probs, 0)
        idx = torch.searchsorted(cdf, u)
        return m.lin(m.table.index_select(0, idx)).pow(2).mean()

    return _sgd(m, loss)


def y_histc_buffer():
    """A histogram of a score buffer as features."""
    m = _Head(8, 4)
    m.register_buffer("scores", torch.rand(32))
    x = torch.randn(4, 8)

    def loss():
        h = torch.histc(m.scores, bins=8, min=0, max=1)
        return (m.lin(x * h / h.sum())).pow(2).mean()

    return _sgd(m, loss)


def y_bincount_weights():
    """Per-class sums of a weight via bincount of a label buffer."""
    m = _Head(8, 5)
    m.register_buffer("labels", torch.randint(0, 5, (12,)))
    m.register_buffer("num_classes", torch.tensor(5))
    w = torch.rand(12)
    x = torch.randn(4, 8)

    def loss():
        per = torch.bincount(m.labels, weights=w, minlength=int(m.num_classes.item()))
        return (m.lin(x) * per).pow(2).mean()

    return _sgd(m, loss)


# -- probabilities from buffers -------------------------------------------------------


def y_multinomial_counts():
    """Negative sampling by normalised frequency counts raised to 0.75."""
    m = nn.Module()
    m.emb = nn.Embedding(10, 4)
    m.register_buffer("counts", torch.randint(1, 50, (10,)).float())
    ids = torch.randint(0, 10, (4,))

    def loss():
        p = m.counts / m.counts.sum()
        neg = torch.multinomial(p, 6, replacement=True)
        return -F.logsigmoid(-(m.emb(ids) @ m.emb(neg).T)).mean()

    return _sgd(m, loss)


def y_categorical_prior():
    """A Categorical over a prior buffer: sample, then score by log_prob."""
    m = _Head(8, 5)
    m.register_buffer("prior", torch.softmax(torch.randn(5), 0))
    x = torch.randn(4, 8)

    def loss():
        d = D.Categorical(probs=m.prior)
        y = d.sample((4,))
        return F.cross_entropy(m.lin(x), y) - d.log_prob(y).mean()

    return _sgd(m, loss)


def y_bernoulli_keep():
    """Bernoulli feature dropout with per-feature keep probabilities in a buffer."""
    m = _Head(8, 4)
    m.register_buffer("keep", torch.rand(8) * 0.5 + 0.4)
    x = torch.randn(4, 8)

    def loss():
        mask = D.Bernoulli(probs=m.keep).sample((4,))
        return m.lin(x * mask / m.keep).pow(2).mean()

    return _sgd(m, loss)


def y_beta_mixup():
    """Mixup with Beta(a, b) parameters held as buffers."""
    m = _Head(8, 4)
    m.register_buffer("a", torch.tensor(0.4))
    m.register_buffer("b", torch.tensor(0.4))
    x, y = torch.randn(4, 8), torch.randn(4, 4)

    def loss():
        lam = D.Beta(m.a, m.b).sample()
        xm = lam * x + (1 - lam) * x.flip(0)
        return F.mse_loss(m.lin(xm), lam * y + (1 - lam) * y.flip(0))

    return _sgd(m, loss)


def y_dirichlet_logprob():
    """Dirichlet log-likelihood of the model's softmax under a concentration buffer."""
    m = _Head(8, 4)
    m.register_buffer("conc", torch.rand(4) * 2 + 0.5)
    x = torch.randn(4, 8)
    return _sgd(m, lambda: -D.Dirichlet(m.conc).log_prob(m.lin(x).softmax(-1)).mean())


def y_mvn_scale_tril():
    """A Gaussian likelihood with a stored lower-triangular scale buffer."""
    m = _Head(8, 4)
    m.register_buffer("L", torch.eye(4) + torch.tril(torch.rand(4, 4) * 0.2, -1))
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    return _sgd(m, lambda: -D.MultivariateNormal(m.lin(x), scale_tril=m.L).log_prob(y).mean())


def y_mvn_precision():
    """A Gaussian likelihood parameterised by a precision-matrix buffer."""
    m = _Head(8, 4)
    a = torch.randn(4, 4)
    m.register_buffer("P", a @ a.T + torch.eye(4))
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    return _sgd(m, lambda: -D.MultivariateNormal(m.lin(x), precision_matrix=m.P).log_prob(y).mean())


def y_lowrank_mvn():
    """LowRankMultivariateNormal with cov_factor and cov_diag buffers (a fitted prior)."""
    m = _Head(8, 6)
    m.register_buffer("W", torch.randn(6, 2) * 0.3)
    m.register_buffer("dg", torch.rand(6) + 0.5)
    x, y = torch.randn(4, 8), torch.randn(4, 6)

    def loss():
        d = D.LowRankMultivariateNormal(m.lin(x), cov_factor=m.W, cov_diag=m.dg)
        return -d.log_prob(y).mean()

    return _sgd(m, loss)


# -- indices from buffers ----------------------------------------------------------------


def y_gather_scaled_positions():
    """Fixed random sampling positions in [0, 1) stored as a buffer, scaled to indices."""
    m = _Head(8, 4)
    m.register_buffer("u", torch.rand(4, 3))
    x = torch.randn(4, 10, 8)

    def loss():
        idx = (m.u * x.shape[1]).long()
        g = torch.gather(x, 1, idx[..., None].expand(-1, -1, 8))
        return m.lin(g).pow(2).mean()

    return _sgd(m, loss)


def y_argsort_topk_prune():
    """Channel pruning: keep the top-k channels by an importance buffer, in sorted order."""
    m = _Head(6, 4)
    m.register_buffer("importance", torch.rand(8))
    x = torch.randn(4, 8)

    def loss():
        keep = m.importance.topk(6).indices
        order = m.importance.argsort(descending=True)
        return m.lin(x.index_select(1, keep)).pow(2).mean() + x[:, order].mean() * 0

    return _sgd(m, loss)


def y_ring_queue():
    """A feature queue with a pointer buffer: write at (ptr + arange(b)) % size."""
    m = _Head(8, 4)
    m.register_buffer("queue", torch.randn(16, 4))
    m.register_buffer("ptr", torch.zeros(1, dtype=torch.long))
    x = torch.randn(4, 8)

    def loss():
        q = m.lin(x)
        out = (q @ m.queue.clone().T).logsumexp(-1).mean()
        with torch.no_grad():
            idx = (m.ptr + torch.arange(4)) % m.queue.shape[0]
            m.queue.index_copy_(0, idx, q.detach())
            m.ptr.copy_((m.ptr + 4) % m.queue.shape[0])
        return out

    return _sgd(m, loss)


def y_kv_cache_position():
    """Decoding with a KV cache whose position is a counter buffer (index_copy_, narrow)."""
    d, t_max = 8, 12
    m = nn.Module()
    m.qkv = nn.Linear(d, 3 * d)
    m.register_buffer("kc", torch.zeros(2, t_max, d))
    m.register_buffer("vc", torch.zeros(2, t_max, d))
    m.register_buffer("pos", torch.zeros((), dtype=torch.long))
    x0 = torch.randn(2, 1, d)

    def step():
        with torch.no_grad():
            m.kc.zero_()
            m.vc.zero_()
            m.pos.zero_()
            x = x0
            for _ in range(3):
                q, k, v = m.qkv(x).chunk(3, -1)
                at = m.pos + torch.arange(1)
                m.kc.index_copy_(1, at, k)
                m.vc.index_copy_(1, at, v)
                m.pos += 1
                n = int(m.pos)
                kk, vv = m.kc.narrow(1, 0, n), m.vc.narrow(1, 0, n)
                x = F.scaled_dot_product_attention(q, kk, vv)
            return x

    return step


def y_repeat_interleave_pad():
    """Ragged rows expanded by a counts buffer, then written into a padded batch by mask."""
    m = _Head(8, 4)
    m.register_buffer("counts", torch.tensor([3, 1, 2, 2]))
    x = torch.randn(4, 8)

    def loss():
        rows = torch.repeat_interleave(m.lin(x), m.counts, dim=0)
        mask = torch.arange(3)[None, :] < m.counts[:, None]
        pad = rows.new_zeros(4, 3, 4)
        pad[mask] = rows
        return pad.pow(2).sum(1).div(m.counts[:, None]).mean()

    return _sgd(m, loss)


def y_unique_counts_emb():
    """Unique ids of a buffer with counts: embed each id once, weight by 1 / count."""
    m = nn.Module()
    m.emb = nn.Embedding(10, 4)
    m.register_buffer("ids", torch.tensor([1, 3, 3, 7, 1, 1, 9, 4]))

    def loss():
        vals, counts = torch.unique(m.ids, return_counts=True)
        return (m.emb(vals).pow(2).sum(-1) / counts.float()).mean()

    return _sgd(m, loss)


def y_scatter_add_segments():
    """Segment sums by a segment-id buffer with scatter_add_."""
    m = _Head(8, 4)
    m.register_buffer("seg", torch.tensor([0, 0, 1, 2, 2, 2]))
    x = torch.randn(6, 8)

    def loss():
        h = m.lin(x)
        out = h.new_zeros(3, 4).scatter_add_(0, m.seg[:, None].expand(-1, 4), h)
        return out.pow(2).mean()

    return _sgd(m, loss)


def y_sparse_adjacency():
    """A GCN layer over a sparse adjacency built from edge-index and weight buffers."""
    n = 6
    m = _Head(8, 4)
    m.register_buffer("edges", torch.tensor([[0, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 3]]))
    m.register_buffer("ew", torch.rand(7))
    x = torch.randn(n, 8)

    def loss():
        a = torch.sparse_coo_tensor(m.edges, m.ew, (n, n))
        return torch.sparse.mm(a, m.lin(x)).pow(2).mean()

    return _sgd(m, loss)


# -- matrices from buffers -------------------------------------------------------------


def y_gram_solve():
    """A kernel ridge readout: solve (B B^T + eps I) w = y with a basis buffer B."""
    m = _Head(8, 4)
    m.register_buffer("B", torch.randn(4, 6))
    x = torch.randn(4, 8)

    def loss():
        a = m.B @ m.B.T + 1e-3 * torch.eye(4)
        return torch.linalg.solve(a, m.lin(x).T).pow(2).mean()

    return _sgd(m, loss)


def y_kalman_cholesky():
    """A Kalman filter update: P, Q, R buffers; S = H P H^T + R factorised by Cholesky."""
    m = nn.Module()
    m.H = nn.Linear(4, 3, bias=False)
    m.register_buffer("P", torch.eye(4))
    m.register_buffer("Q", torch.eye(4) * 0.01)
    m.register_buffer("R", torch.eye(3) * 0.1)
    m.register_buffer("mu", torch.zeros(4))
    z = torch.randn(3)

    def loss():
        H, mu0 = m.H.weight, m.mu.clone()
        P = m.P + m.Q
        S = H @ P @ H.T + m.R
        L = torch.linalg.cholesky(S)
        K = torch.cholesky_solve(H @ P, L).T
        mu = mu0 + K @ (z - H @ mu0)
        r = z - H @ mu
        out = r @ torch.cholesky_solve(r[:, None], L).squeeze(1) + 2 * L.diagonal().log().sum()
        with torch.no_grad():
            m.P.copy_((torch.eye(4) - K @ H) @ P)
            m.mu.copy_(mu)
        return out

    return _sgd(m, loss)


def y_mahalanobis_sqrt():
    """Mahalanobis distance to a class mean under a precision buffer, as a loss."""
    m = _Head(8, 4)
    a = torch.randn(4, 4)
    m.register_buffer("prec", a @ a.T / 4 + torch.eye(4))
    m.register_buffer("mu", torch.zeros(4))
    x = torch.randn(4, 8)

    def loss():
        d = m.lin(x) - m.mu
        return torch.sqrt(((d @ m.prec) * d).sum(-1) + 1e-6).mean()

    return _sgd(m, loss)


def y_zca_eigh():
    """ZCA whitening with a running covariance buffer: V diag(1/sqrt(e)) V^T."""
    m = _Head(4, 4)
    a = torch.randn(4, 4)
    m.register_buffer("cov", a @ a.T / 4 + 0.1 * torch.eye(4))
    x = torch.randn(6, 4)

    def loss():
        e, v = torch.linalg.eigh(m.cov)
        w = v @ torch.diag(e.rsqrt()) @ v.T
        return m.lin(x @ w).pow(2).mean()

    return _sgd(m, loss)


def y_slogdet_buffer():
    """A Gaussian log-density term with slogdet and inverse of a covariance buffer."""
    m = _Head(8, 4)
    a = torch.randn(4, 4)
    m.register_buffer("cov", a @ a.T + torch.eye(4))
    x = torch.randn(4, 8)

    def loss():
        sign, logdet = torch.linalg.slogdet(m.cov)
        r = m.lin(x)
        return (r @ torch.linalg.inv(m.cov) * r).sum(-1).mean() + logdet

    return _sgd(m, loss)


def y_matrix_exp_rotation():
    """A learned rotation exp(S - S^T) composed with a fixed generator buffer."""
    m = _Head(4, 4)
    m.S = nn.Parameter(torch.randn(4, 4) * 0.1)
    m.register_buffer("G", torch.randn(4, 4) * 0.1)
    x = torch.randn(6, 4)
    skew = lambda: m.S - m.S.T + m.G - m.G.T  # noqa: E731
    return _sgd(m, lambda: m.lin(x @ torch.linalg.matrix_exp(skew())).pow(2).mean())


def y_stored_cholesky_factor():
    """A GP posterior mean with a stored Cholesky factor of the training kernel."""
    m = _Head(8, 5)
    k = torch.randn(5, 5)
    m.register_buffer("Lk", torch.linalg.cholesky(k @ k.T + torch.eye(5)))
    m.register_buffer("yt", torch.randn(5, 1))
    x = torch.randn(4, 8)

    def loss():
        alpha = torch.cholesky_solve(m.yt, m.Lk)
        return (m.lin(x) @ alpha).pow(2).mean()

    return _sgd(m, loss)


# -- masks and lengths -------------------------------------------------------------------


def y_lengths_attention_mask():
    """Self-attention over padded sequences, key mask from a lengths buffer."""
    d = 8
    m = nn.Module()
    m.qkv = nn.Linear(d, 3 * d)
    m.register_buffer("lengths", torch.tensor([5, 3, 4, 2]))
    x = torch.randn(4, 5, d)

    def loss():
        q, k, v = m.qkv(x).chunk(3, -1)
        s = q @ k.transpose(1, 2) / math.sqrt(d)
        keep = torch.arange(5)[None, :] < m.lengths[:, None]
        s = s.masked_fill(~keep[:, None, :], float("-inf"))
        return (s.softmax(-1) @ v).pow(2).mean()

    return _sgd(m, loss)


def y_pack_padded_buffer():
    """A GRU over padded sequences packed by a lengths buffer; mean-pooled by length."""
    m = nn.Module()
    m.rnn = nn.GRU(4, 6, batch_first=True)
    m.register_buffer("lengths", torch.tensor([5, 4, 2]))
    x = torch.randn(3, 5, 4)

    def loss():
        packed = nn.utils.rnn.pack_padded_sequence(x, m.lengths, batch_first=True)
        out, _ = m.rnn(packed)
        pad, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return (pad.sum(1) / m.lengths[:, None]).pow(2).mean()

    return _sgd(m, loss)


def y_ctc_buffer_lengths():
    """CTC with padded targets and input/target lengths as buffers."""
    m = nn.Module()
    m.proj = nn.Linear(6, 5)
    m.register_buffer("targets", torch.tensor([[1, 2, 3], [2, 4, 0]]))
    m.register_buffer("in_len", torch.tensor([8, 6]))
    m.register_buffer("tgt_len", torch.tensor([3, 2]))
    x = torch.randn(8, 2, 6)

    def loss():
        logp = m.proj(x).log_softmax(-1)
        return F.ctc_loss(logp, m.targets, m.in_len, m.tgt_len)

    return _sgd(m, loss)


def y_masked_select_reshape():
    """Select the kept positions by a per-row mask buffer (same count in every row)."""
    m = _Head(8, 4)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:, [0, 2, 5]] = True
    m.register_buffer("keep", mask)
    x = torch.randn(4, 6, 8)

    def loss():
        sel = x.masked_select(m.keep[..., None]).view(4, 3, 8)
        return m.lin(sel).pow(2).mean()

    return _sgd(m, loss)


# -- integer arithmetic -------------------------------------------------------------------


def y_floor_div_mod_grid():
    """2-D positions from flat index and width buffers: row = i // w, col = i % w."""
    m = nn.Module()
    m.row = nn.Embedding(4, 8)
    m.col = nn.Embedding(5, 8)
    m.register_buffer("flat", torch.tensor([0, 3, 7, 12, 19, 6]))
    m.register_buffer("width", torch.tensor(5))

    def loss():
        r = torch.div(m.flat, m.width, rounding_mode="floor")
        c = m.flat % m.width
        return (m.row(r) + m.col(c)).pow(2).mean()

    return _sgd(m, loss)


def y_gcd_lcm_shift():
    """Periodic phases from gcd/lcm of two period buffers; bit masks by shift amounts."""
    m = nn.Module()
    m.emb = nn.Embedding(16, 4)
    m.register_buffer("pa", torch.tensor([2, 3, 4]))
    m.register_buffer("pb", torch.tensor([3, 4, 6]))
    m.register_buffer("bits", torch.tensor([1, 2, 3]))
    t = torch.tensor([5, 11, 17])

    def loss():
        period = torch.lcm(m.pa, m.pb)
        g = torch.gcd(m.pa, m.pb)
        phase = (t % period) // g
        masked = phase & ((1 << m.bits) - 1)
        return m.emb(masked).pow(2).mean()

    return _sgd(m, loss)


def y_item_warmup():
    """A step counter buffer decides linear warm-up through .item()."""
    m = _Head(8, 4)
    m.register_buffer("step_n", torch.zeros((), dtype=torch.long))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step():
        opt.zero_grad()
        m.lin(x).pow(2).mean().backward()
        s = int(m.step_n.item())
        scale = min(1.0, (s + 1) / 100)
        for g in opt.param_groups:
            g["lr"] = 0.1 * scale
        opt.step()
        m.step_n += 1
        n = torch.arange(0, int(m.step_n.item()))
        return n.sum()

    return step


# -- quantization state ------------------------------------------------------------------


def y_fake_quant_buffers():
    """Per-tensor fake quantisation of activations with scale/zero-point buffers."""
    m = _Head(8, 4)
    m.register_buffer("scale", torch.tensor([0.05]))
    m.register_buffer("zp", torch.tensor([128], dtype=torch.int32))
    x = torch.randn(4, 8)

    def loss():
        xq = torch.fake_quantize_per_tensor_affine(x, m.scale, m.zp, 0, 255)
        return m.lin(xq).pow(2).mean()

    return _sgd(m, loss)


def y_fake_quant_per_channel_low_bit():
    """2-bit per-channel weight fake quantisation (quant range [-2, 1])."""
    m = _Head(8, 4)
    m.register_buffer("scale", torch.full((4,), 0.2))
    m.register_buffer("zp", torch.zeros(4, dtype=torch.int32))
    x = torch.randn(4, 8)

    def loss():
        wq = torch.fake_quantize_per_channel_affine(m.lin.weight, m.scale, m.zp, 0, -2, 1)
        return F.linear(x, wq, m.lin.bias).pow(2).mean()

    return _sgd(m, loss)


def y_qat_fused_observer():
    """QAT: torch.ao's FusedMovingAvgObsFakeQuantize with its observer state buffers."""
    from torch.ao.quantization import FusedMovingAvgObsFakeQuantize

    m = _Head(8, 4)
    m.fq = FusedMovingAvgObsFakeQuantize()
    x = torch.randn(4, 8)
    return _sgd(m, lambda: m.lin(m.fq(x)).pow(2).mean())


def y_minmax_observer_quantize():
    """A min/max observer's buffers give a scale and zero point; quantize, dequantize."""
    m = _Head(8, 4)
    m.register_buffer("min_val", torch.tensor(-1.0))
    m.register_buffer("max_val", torch.tensor(1.0))
    x = torch.randn(4, 8)

    def loss():
        with torch.no_grad():
            m.min_val.copy_(torch.minimum(m.min_val, x.min()))
            m.max_val.copy_(torch.maximum(m.max_val, x.max()))
        scale = (m.max_val - m.min_val) / 255
        zp = (-torch.round(m.min_val / scale)).to(torch.int64).clamp(0, 255)
        xq = torch.quantize_per_tensor(x, scale, zp, torch.quint8).dequantize()
        return m.lin(xq).pow(2).mean()

    return _sgd(m, loss)


def y_split_pad_sequence():
    """Ragged rows split by a lengths buffer (tolist), padded, masked mean by lengths."""
    m = _Head(8, 4)
    m.register_buffer("lengths", torch.tensor([3, 1, 2]))
    x = torch.randn(6, 8)

    def loss():
        parts = torch.split(m.lin(x), m.lengths.tolist())
        pad = nn.utils.rnn.pad_sequence(parts, batch_first=True)
        keep = torch.arange(pad.shape[1])[None, :] < m.lengths[:, None]
        return ((pad * keep[..., None]).sum(1) / m.lengths[:, None]).pow(2).mean()

    return _sgd(m, loss)


def y_logdet_cov():
    """A Gaussian log-likelihood with torch.logdet of a stored covariance buffer."""
    m = _Head(8, 4)
    a = torch.randn(4, 4)
    m.register_buffer("cov", a @ a.T + torch.eye(4))
    x = torch.randn(4, 8)

    def loss():
        r = m.lin(x)
        return (r @ torch.cholesky_inverse(torch.linalg.cholesky(m.cov)) * r).sum(-1).mean() \
            + torch.logdet(m.cov) * m.lin.bias.sum()

    return _sgd(m, loss)


def y_ctc_targets_min():
    m = nn.Module()
    m.proj = nn.Linear(4, 2)
    m.register_buffer("targets", torch.ones(4, 12, dtype=torch.long))
    x = torch.randn(32, 4, 4)
    return _sgd(m, lambda: F.ctc_loss(m.proj(x).log_softmax(-1), m.targets, [32] * 4, [12] * 4))


def y_logdet_min():
    m = _Head(4, 1)
    m.register_buffer("cov", torch.eye(4) * 2)
    return _sgd(m, lambda: torch.logdet(m.cov) * m.lin.bias.sum())


def y_length_regulator():
    """FastSpeech's length regulator: phonemes repeated by a durations buffer, and each
    duration embedded (a table of 10 rows: durations never reach 10)."""
    m = _Head(8, 8)
    m.dur_emb = nn.Embedding(10, 8)
    m.register_buffer("dur", torch.tensor([3, 2, 4, 3, 1, 5]))
    x = torch.randn(6, 8)

    def loss():
        h = m.lin(x) + m.dur_emb(m.dur)
        frames = torch.repeat_interleave(h, m.dur, dim=0)
        return frames.pow(2).mean()

    return _sgd(m, loss)


def y_vq_ema_codebook():
    """VQ-VAE codebook updated by EMA with Laplace-smoothed cluster sizes."""
    k, d, decay, eps = 8, 4, 0.99, 1e-5
    m = _Head(8, d)
    m.register_buffer("embed", torch.randn(k, d))
    m.register_buffer("cluster_size", torch.ones(k))
    m.register_buffer("embed_avg", m.embed.clone())
    x = torch.randn(6, 8)

    def loss():
        z = m.lin(x)
        idx = torch.cdist(z, m.embed).argmin(-1)
        q = m.embed.index_select(0, idx)
        with torch.no_grad():
            onehot = F.one_hot(idx, k).float()
            m.cluster_size.mul_(decay).add_(onehot.sum(0), alpha=1 - decay)
            m.embed_avg.mul_(decay).add_(onehot.T @ z.detach(), alpha=1 - decay)
            n = m.cluster_size.sum()
            size = (m.cluster_size + eps) / (n + k * eps) * n
            m.embed.copy_(m.embed_avg / size.unsqueeze(1))
        return F.mse_loss(z, q) + (z + (q - z).detach()).pow(2).mean()

    return _sgd(m, loss)


def y_binomial_logprob():
    """A Binomial likelihood of observed counts with total-count and probability buffers."""
    m = _Head(8, 4)
    m.register_buffer("total", torch.tensor([10.0, 8.0, 12.0, 6.0]))
    m.register_buffer("k", torch.tensor([3.0, 5.0, 2.0, 6.0]))
    x = torch.randn(2, 8)
    return _sgd(m, lambda: -D.Binomial(m.total, logits=m.lin(x)).log_prob(m.k).mean())


def y_narrow_tensor_start():
    """A rolling KV window read with narrow at a 0-d position tensor (compile-friendly)."""
    m = _Head(8, 8)
    m.register_buffer("kc", torch.randn(16, 8))
    m.register_buffer("pos", torch.tensor(4))
    x = torch.randn(2, 8)

    def loss():
        win = m.kc.narrow(0, m.pos, 8)
        return (m.lin(x) @ win.T).softmax(-1).pow(2).mean()

    return _sgd(m, loss)


def y_ddpm_betas_cumprod():
    """DDPM noising with alphas_cumprod computed in the step from a betas buffer."""
    m = _Head(8, 8)
    m.register_buffer("betas", torch.linspace(1e-4, 0.02, 50))
    x0, noise = torch.randn(4, 8), torch.randn(4, 8)
    t = torch.tensor([3, 10, 25, 49])

    def loss():
        acp = torch.cumprod(1 - m.betas, 0)[t][:, None]
        xt = acp.sqrt() * x0 + (1 - acp).sqrt() * noise
        return F.mse_loss(m.lin(xt), noise)

    return _sgd(m, loss)


# -- minimal repros -------------------------------------------------------------------


def y_log1p_of_difference_min():
    m = _Head(4, 1)
    m.register_buffer("hi", torch.full((64,), 2.0))
    m.register_buffer("lo", torch.full((64,), 0.5))
    x = torch.randn(64, 4)
    return _sgd(m, lambda: (m.lin(x).squeeze(1) * torch.log1p(m.hi - m.lo)).sum())


def y_searchsorted_index_min():
    m = nn.Module()
    m.table = nn.Parameter(torch.randn(16, 4))
    m.register_buffer("probs", torch.full((16,), 1 / 16))
    u = torch.rand(16)
    return _sgd(m, lambda: m.table.index_select(0, torch.searchsorted(m.probs.cumsum(0), u)).sum())


def y_multinomial_of_ratio_min():
    m = nn.Module()
    m.register_buffer("c", torch.rand(16) + 0.1)
    return lambda: torch.multinomial(m.c / m.c.sum(), 4, replacement=True)


def y_repeats_as_divisor_min():
    m = _Head(4, 4)
    m.register_buffer("counts", torch.tensor([1, 2, 1, 1, 2, 1, 1, 1]))
    x = torch.randn(8, 4)

    def loss():
        h = m.lin(x)
        return torch.repeat_interleave(h, m.counts, dim=0).sum() + (h.sum(1) / m.counts).sum()

    return _sgd(m, loss)


def y_cholesky_of_congruence_min():
    m = nn.Module()
    m.H = nn.Linear(4, 3, bias=False)
    m.register_buffer("P", torch.eye(4))
    m.register_buffer("R", torch.eye(3))
    return _sgd(m, lambda: torch.linalg.cholesky(m.H.weight @ m.P @ m.H.weight.T + m.R).sum())


def y_eigh_rsqrt_min():
    m = _Head(4, 4)
    m.register_buffer("C", torch.eye(4) * 2)
    x = torch.randn(6, 4)

    def loss():
        e, v = torch.linalg.eigh(m.C)
        return (m.lin(x) @ v * e.rsqrt()).sum()

    return _sgd(m, loss)


def y_fake_quant_channel_scale_min():
    m = _Head(8, 4)
    m.register_buffer("scale", torch.full((4,), 0.1))
    m.register_buffer("zp", torch.zeros(4, dtype=torch.int32))
    x = torch.randn(2, 8)
    return _sgd(m, lambda: F.linear(x, torch.fake_quantize_per_channel_affine(
        m.lin.weight, m.scale, m.zp, 0, -128, 127)).sum())


def y_index_from_float_buffer_min():
    m = nn.Module()
    m.table = nn.Parameter(torch.randn(10, 4))
    m.register_buffer("u", torch.rand(16))
    return _sgd(m, lambda: m.table.index_select(0, (m.u * 10).long()).sum())


def y_repeats_bounded_index_min():
    m = nn.Module()
    m.emb = nn.Embedding(8, 4)
    m.register_buffer("dur", torch.full((6,), 5))
    return _sgd(m, lambda: torch.repeat_interleave(m.emb(m.dur), m.dur, dim=0).sum())


def y_narrow_start_min():
    m = _Head(4, 4)
    m.register_buffer("kc", torch.randn(10, 4))
    m.register_buffer("pos", torch.tensor(2))
    return _sgd(m, lambda: m.lin(m.kc.narrow(0, m.pos, 8)).sum())


def y_cumprod_complement_min():
    m = _Head(4, 1)
    m.register_buffer("betas", torch.full((32,), 0.01))
    x = torch.randn(32, 4)
    return _sgd(m, lambda: (m.lin(x).squeeze(1) * (1 - torch.cumprod(1 - m.betas, 0)).sqrt()).sum())


def y_zero_length_mask_min():
    m = _Head(4, 4)
    m.register_buffer("lengths", torch.full((16,), 3))
    x = torch.randn(16, 4, 4)

    def loss():
        keep = torch.arange(4)[None, :] < m.lengths[:, None]
        h = m.lin(x)
        return (h[..., 0].masked_fill(~keep, float("-inf")).softmax(-1) * h[..., 1]).sum()

    return _sgd(m, loss)



def y_ddim_falling_schedule_min():
    """A DDIM sampling step (inference): ``(1 - a[t] / a[prev]) ** 0.5`` of a falling
    ``alphas_cumprod`` buffer, read at two recorded timesteps. Its NaN reaches no input
    the replay writes; only the NaN-birth check sees it."""
    unet = nn.Conv2d(3, 3, 3, padding=1)
    alphas = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 50), 0)
    t, prev = torch.tensor(40), torch.tensor(20)
    x = torch.randn(1, 3, 8, 8)

    @torch.no_grad()
    def step():
        eps = unet(x)
        a_t, a_prev = alphas[t], alphas[prev]
        sigma = 0.5 * ((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)) ** 0.5
        x0 = (x - (1 - a_t) ** 0.5 * eps) / a_t ** 0.5
        return a_prev ** 0.5 * x0 + (1 - a_prev - sigma ** 2) ** 0.5 * eps

    return step

WORKLOADS = {k[2:]: v for k, v in globals().items() if k.startswith("y_")}
