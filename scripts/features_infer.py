"""Inference steps (and a few training steps) that each exercise one torch feature:
the MultiheadAttention and nested-tensor fast paths, inference mode, torch.compile,
TorchScript, dynamic quantization, greedy and beam decoding, NMS in torch,
data-dependent shapes, linear algebra, sorting, sampling, complex and sparse
tensors, integer ops and in-place buffers (``scripts/bench_features.py`` runs them).
``WORKLOADS``: name -> a builder that returns the step.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def mha_fast():
    m = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)

    def step():
        with torch.no_grad():
            return m(x, x, x, need_weights=False)[0]

    return step


def encoder_nested():
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    m = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x = torch.randn(3, 6, 16)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[0, 4:] = True
    mask[1, 2:] = True

    def step():
        with torch.no_grad():
            return m(x, src_key_padding_mask=mask)

    return step


def inference_mode_mlp():
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    x = torch.randn(8, 16)

    def step():
        with torch.inference_mode():
            return m(x).softmax(-1)

    return step


def compile_infer():
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    cm = torch.compile(m)
    x = torch.randn(8, 16)
    with torch.no_grad():
        cm(x)

    def step():
        with torch.no_grad():
            return cm(x)

    return step


def compile_train():
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    cm = torch.compile(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    cm(x).sum().backward()

    def step():
        opt.zero_grad()
        cm(x).sum().backward()
        opt.step()

    return step


class _Scripted(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.l2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.l1(x))
        if h.sum() > 0:
            h = h * 2
        return self.l2(h)


def jit_script():
    m = torch.jit.script(_Scripted().eval())
    x = torch.randn(8, 16)

    def step():
        with torch.no_grad():
            return m(x)

    return step


class _QM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y[:, -1])


def quant_dynamic():
    m = torch.ao.quantization.quantize_dynamic(
        _QM().eval(), {nn.Linear, nn.LSTM}, dtype=torch.qint8
    )
    x = torch.randn(2, 5, 8)

    def step():
        with torch.no_grad():
            return m(x)

    return step


class _TinyGPT(nn.Module):
    def __init__(self, V=32, D=16, L=2):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.qkv = nn.ModuleList([nn.Linear(D, 3 * D) for _ in range(L)])
        self.o = nn.ModuleList([nn.Linear(D, D) for _ in range(L)])
        self.head = nn.Linear(D, V)
        self.D = D

    def forward(self, tok, cache):
        h = self.emb(tok)  # (1, 1, D)
        new = []
        for i, (qkv, o) in enumerate(zip(self.qkv, self.o, strict=True)):
            q, k, v = qkv(h).chunk(3, -1)
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], 1)
                v = torch.cat([cache[i][1], v], 1)
            new.append((k, v))
            a = torch.softmax(q @ k.transpose(1, 2) / self.D**0.5, -1) @ v
            h = h + o(a)
        return self.head(h[:, -1]), new


def greedy_decode():
    m = _TinyGPT().eval()

    def step():
        with torch.no_grad():
            tok = torch.tensor([[1]])
            cache = [None, None]
            out = []
            for _ in range(8):
                logits, cache = m(tok, cache)
                nxt = logits.argmax(-1, keepdim=True)
                if nxt.item() == 31:
                    break
                out.append(nxt)
                tok = nxt
            return torch.cat(out, 1)

    return step


def beam_search():
    V, B = 20, 3
    W = torch.randn(8, V)
    emb = torch.randn(V, 8)

    def step():
        scores = torch.zeros(B)
        seqs = torch.zeros(B, 0, dtype=torch.long)
        h = torch.randn(B, 8)
        for _ in range(4):
            lp = torch.log_softmax(h @ W, -1) + scores[:, None]
            top, idx = lp.flatten().topk(B)
            beam = torch.div(idx, V, rounding_mode="floor")
            tok = idx % V
            seqs = torch.cat([seqs.index_select(0, beam), tok[:, None]], 1)
            h = torch.gather(h, 0, beam[:, None].expand(-1, 8)) + emb[tok]
            scores = top
        return seqs

    return step


def _box_iou(a, b):
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (area_a[:, None] + area_b[None] - inter)


def nms_post():
    g = torch.Generator().manual_seed(1)
    xy = torch.rand(30, 2, generator=g) * 50
    boxes = torch.cat([xy, xy + 5 + torch.rand(30, 2, generator=g) * 20], 1)
    scores = torch.rand(30, generator=g)

    def step():
        keep_mask = scores > 0.2
        b = boxes[keep_mask]
        s = scores.masked_select(keep_mask)
        order = s.argsort(descending=True)
        b = b[order]
        iou = _box_iou(b, b)
        alive = torch.ones(b.shape[0], dtype=torch.bool)
        keep = []
        while alive.any():
            i = alive.nonzero()[0, 0]
            keep.append(i)
            alive = alive & (iou[i] <= 0.5)
            alive[i] = False
        return b[torch.stack(keep)]

    return step


def unique_hist():
    x = torch.randint(0, 10, (50,))
    f = torch.randn(50)
    bounds = torch.linspace(-2, 2, 9)

    def step():
        u, inv, cnt = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
        bc = torch.bincount(x, minlength=12)
        h = torch.histc(f, bins=10, min=-3, max=3)
        bk = torch.bucketize(f, bounds)
        ss = torch.searchsorted(bounds, f.sort().values)
        return u, inv, cnt, bc, h, bk, ss

    return step


def linalg():
    g = torch.Generator().manual_seed(2)
    A = torch.randn(5, 5, generator=g)
    S = A @ A.T + 5 * torch.eye(5)
    b = torch.randn(5, 2, generator=g)
    R = torch.randn(8, 5, generator=g)

    def step():
        q, r = torch.linalg.qr(A)
        u, s, vh = torch.linalg.svd(A)
        w, v = torch.linalg.eigh(S)
        x = torch.linalg.solve(S, b)
        L = torch.linalg.cholesky(S)
        ls = torch.linalg.lstsq(R, torch.randn(8, 2)).solution
        inv = torch.linalg.inv(S)
        d = torch.linalg.det(S)
        return q, s, w, x, L, ls, inv, d

    return step


def sorting():
    x = torch.randn(6, 10)
    xi = torch.randint(0, 4, (6, 10))

    def step():
        a = torch.sort(x, dim=1, descending=True)
        b = torch.argsort(xi, dim=1, stable=True)
        c = torch.topk(x, 3, dim=1)
        d = torch.kthvalue(x, 4, dim=1)
        e = torch.median(x, dim=1)
        f = torch.mode(xi, dim=1)
        return a, b, c, d, e, f

    return step


def random_ops():
    m = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.Linear(16, 4)).train()
    p = torch.softmax(torch.randn(4, 10), -1)
    x = torch.randn(4, 8)

    def step():
        s = torch.multinomial(p, 3, replacement=False)
        perm = torch.randperm(10)
        mask = torch.empty(4, 8).bernoulli_(0.5)
        y = m(x * mask)
        return s, perm, y

    return step


def scans_einsum():
    a = torch.randn(4, 6)
    b = torch.randn(6, 5)
    c = torch.randn(5, 3)
    bb = torch.randn(2, 4, 6)
    bc = torch.randn(2, 6, 5)
    base = torch.randn(2, 4, 5)

    def step():
        r1 = a.cumsum(1) + a.cumprod(1) + torch.logcumsumexp(a, 1)
        r2 = torch.einsum("ij,jk,kl->il", a, b, c)
        r3 = torch.baddbmm(base, bb, bc, beta=0.5, alpha=2.0)
        r4 = torch.addmm(torch.randn(4, 5), a, b)
        r5 = torch.tensordot(bb, bc, dims=([0, 2], [0, 1]))
        return r1, r2, r3, r4, r5

    return step


def complex_stft():
    audio = torch.randn(1, 800)
    win = torch.hann_window(64)
    M = torch.randn(4, 4, dtype=torch.cfloat)

    def step():
        S = torch.stft(audio, 64, hop_length=16, window=win, return_complex=True)
        S2 = S * torch.exp(1j * torch.angle(S))
        y = torch.istft(S2, 64, hop_length=16, window=win, length=800)
        r = torch.view_as_real(S2)
        c = torch.view_as_complex(r.contiguous())
        mm = M @ M.conj().T
        return y, c.abs().sum(), mm.real

    return step


def sparse_mm():
    i = torch.tensor([[0, 1, 2, 3, 4], [1, 0, 3, 2, 4]])
    v = torch.randn(5)
    coo = torch.sparse_coo_tensor(i, v, (5, 5)).coalesce()
    d = torch.randn(5, 3)

    def step():
        r1 = torch.sparse.mm(coo, d)
        csr = coo.to_dense().to_sparse_csr()
        r2 = csr @ d
        return r1 + r2

    return step


def nested_jagged():
    lin = nn.Linear(8, 4)

    def step():
        nt = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)], layout=torch.jagged)
        with torch.no_grad():
            y = F.relu(lin(nt))
        return y

    return step


def nonfinite():
    x = torch.randn(6, 6)
    x[0, 0] = float("inf")
    x[1, 1] = float("-inf")
    x[2, 2] = float("nan")

    def step():
        fin = torch.isfinite(x)
        y = torch.where(fin, x, torch.zeros_like(x))
        z = torch.nan_to_num(x, nan=0.0, posinf=1e4, neginf=-1e4).clamp(-5, 5)
        return y.sum() + z.sum() + torch.isnan(x).sum() + torch.isinf(x).sum()

    return step


def int_bits():
    a = torch.randint(0, 1000, (16, 16), dtype=torch.int32)
    b = torch.randint(1, 50, (16, 16), dtype=torch.int32)
    u = torch.randint(0, 255, (16,), dtype=torch.uint8)
    i8a = torch.randint(-128, 127, (32, 32), dtype=torch.int8)
    i8b = torch.randint(-128, 127, (32, 32), dtype=torch.int8)

    def step():
        r = (a & 0xFF) | (b << 2)
        r = r ^ (a >> 3)
        r = torch.remainder(r, b) + torch.floor_divide(a, b)
        uu = (u & 0x0F) << 1
        mm = torch._int_mm(i8a, i8b) if hasattr(torch, "_int_mm") else i8a.int() @ i8b.int()
        return r, uu, mm

    return step


def inplace_buf():
    x = torch.randn(4, 3)
    idx = torch.tensor([0, 2, 2, 1])
    vals = torch.randn(4)

    def step():
        buf = torch.zeros(4, 10)
        for i in range(3):
            buf[:, i] = x[:, i] * 2
        acc = torch.zeros(3)
        acc.index_put_((idx.clamp(max=2),), vals, accumulate=True)
        buf.masked_fill_(buf < 0, -1.0)
        return buf, acc

    return step


def interp_pad():
    img = torch.randn(1, 4, 8, 8)

    def step():
        a = F.interpolate(
            img, scale_factor=0.5, mode="bicubic", antialias=True, align_corners=False
        )
        b = F.pad(img, (1, 1, 2, 2), mode="reflect")
        c = F.pad(img, (1, 1, 1, 1), mode="replicate")
        d = F.pad(img, (2, 2, 2, 2), mode="circular")
        u = F.unfold(img, 3, padding=1)
        f = F.fold(u, (8, 8), 3, padding=1)
        p = F.pixel_shuffle(img, 2)
        return a, b, c, d, f, p

    return step


def mixed_dtype():
    a = torch.randn(8, 8, dtype=torch.float64)
    b = torch.randn(8, 8).half()
    c = torch.randn(8, 8)

    def step():
        x = a.to(torch.float32) @ c
        y = b.float() + x
        z = c.type_as(a) * a
        w = (b * b.to(torch.float16)).to(torch.float64) + z
        return x, y, z, w.sum().item()

    return step


WORKLOADS = {
    "mha_fast": mha_fast,
    "encoder_nested": encoder_nested,
    "inference_mode_mlp": inference_mode_mlp,
    "compile_infer": compile_infer,
    "compile_train": compile_train,
    "jit_script": jit_script,
    "quant_dynamic": quant_dynamic,
    "greedy_decode": greedy_decode,
    "beam_search": beam_search,
    "nms_post": nms_post,
    "unique_hist": unique_hist,
    "linalg": linalg,
    "sorting": sorting,
    "random_ops": random_ops,
    "scans_einsum": scans_einsum,
    "complex_stft": complex_stft,
    "sparse_mm": sparse_mm,
    "nested_jagged": nested_jagged,
    "nonfinite": nonfinite,
    "int_bits": int_bits,
    "inplace_buf": inplace_buf,
    "interp_pad": interp_pad,
    "mixed_dtype": mixed_dtype,
}


# ---- minimal repros ----
def spurious_grad_min():
    a = torch.randn(4, 4)  # nothing requires grad; grad mode on

    def step():
        return torch.sin(a)

    return step


def encoder_nested_min():
    nt = torch.nested.nested_tensor(
        [torch.randn(2, 4), torch.randn(3, 4)]
    )  # strided NestedTensorImpl

    def step():
        return torch.nested.to_padded_tensor(nt, 0.0)

    return step


def quant_dynamic_min():
    m = torch.ao.quantization.quantize_dynamic(
        nn.ModuleList([nn.LSTM(4, 8)]), {nn.LSTM}, dtype=torch.qint8
    )[0]
    x = torch.randn(3, 1, 4)

    def step():
        with torch.no_grad():
            return m(x)[0]

    return step


def sparse_mm_min():
    csr = torch.randn(5, 5).relu().to_sparse_csr()
    d = torch.randn(5, 3)

    def step():
        return csr @ d

    return step


def sparse_coo_min():
    coo = torch.randn(5, 5).relu().to_sparse()
    d = torch.randn(5, 3)

    def step():
        return torch.sparse.mm(coo, d)

    return step


WORKLOADS.update({k: v for k, v in globals().items() if k.endswith("_min") and callable(v)})


def csr_build_min():
    d = torch.randn(5, 5).relu()

    x = torch.randn(5, 3)

    def step():
        return d.to_sparse_csr() @ x

    return step


WORKLOADS["csr_build_min"] = csr_build_min
