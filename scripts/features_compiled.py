"""`make bench` features: compiled and exported programs (optimizer steps, graph breaks,
regional compile, backends, AOTInductor, export with dynamic shapes, unflatten,
compiled flex attention, compiled selective AC, compiled autocast inference)."""

from __future__ import annotations

import functools
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))


def _trained(run, params, batches, optimizer=torch.optim.AdamW, lr=1e-3):
    """A training step of ``run`` (a module, compiled or not) over the batch
    ``batches()`` gives for each call, its parameters ``params`` updated by
    ``optimizer``."""
    opt = optimizer(params, lr=lr)

    def step():
        opt.zero_grad()
        run(batches()).pow(2).mean().backward()
        opt.step()

    return step


def _compiled_sgd(model, batches):
    """A training step of ``torch.compile(model)`` with SGD, on the batch ``batches()``
    gives for each call (its size is what the steps below vary)."""
    return _trained(torch.compile(model), model.parameters(), batches,
                    torch.optim.SGD, lr=1e-2)


def c_opt_adamw():
    m = _mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(8, 16)

    @torch.compile
    def ostep():
        opt.step()

    def step():
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        ostep()

    return step


def c_opt_sgd_mom():
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(8, 16)
    ostep = torch.compile(opt.step)

    def step():
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        ostep()

    return step


def c_whole_train_step():
    m = _mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(8, 16)
    y = torch.randint(0, 4, (8,))

    @torch.compile
    def step():
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()

    return step


class _Breaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 4)

    def forward(self, x):
        h = F.relu(self.a(x))
        s = h.mean().item()
        h = h * 2 if s > 0.1 else h - 1  # data-dependent branch: a graph break
        print("", end="")  # print: a graph break
        return self.b(h)


def c_graph_breaks():
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    return _compiled_sgd(_Breaky(), lambda: x)


class _Scalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)

    def forward(self, x):
        h = self.a(x)
        n = (h > 0).sum().item()  # captured as a SymInt with capture_scalar_outputs
        return h * (n / h.numel()) + torch.zeros(n).sum()


def c_capture_scalar():
    torch._dynamo.config.capture_scalar_outputs = True
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    return _compiled_sgd(_Scalar(), lambda: x)


def c_mark_dynamic_varying():
    m = _mlp()
    cm = torch.compile(m)
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    xs = [torch.randn(n, 16) for n in (8, 12, 5, 17)]
    for x in xs:
        torch._dynamo.mark_dynamic(x, 0)
    it = [0]

    def step():
        # two batches of different sizes per step: dynamic shapes, one graph
        for x in (xs[it[0] % 4], xs[(it[0] + 1) % 4]):
            opt.zero_grad()
            cm(x).pow(2).mean().backward()
            opt.step()
        it[0] += 1

    return step


def c_recompile_in_window():
    # shapes vary between steps and the recorded step compiles a new shape
    torch._dynamo.config.automatic_dynamic_shapes = False
    sizes = iter(range(4, 1000))
    return _compiled_sgd(_mlp(), lambda: torch.randn(next(sizes), 16))


class _Block(nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.h = h

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.ln2(x))


def c_regional():
    torch.manual_seed(0)
    blocks = nn.Sequential(*[_Block() for _ in range(3)])
    for blk in blocks:
        blk.compile()
    x = torch.randn(2, 16, 32)
    return _trained(blocks, blocks.parameters(), lambda: x)


def _train_backend(**kw):
    torch.manual_seed(0)
    m = nn.Sequential(_Block(), _Block())
    x = torch.randn(2, 16, 32)
    return _trained(torch.compile(m, **kw), m.parameters(), lambda: x)


def c_aot_eager():
    return _train_backend(backend="aot_eager")


def c_backend_eager():
    return _train_backend(backend="eager")


def c_reduce_overhead():
    return _train_backend(mode="reduce-overhead")


def c_cpp_wrapper():
    torch._inductor.config.cpp_wrapper = True
    return _train_backend()


def c_cpp_wrapper_infer():
    torch._inductor.config.cpp_wrapper = True
    torch.manual_seed(0)
    m = nn.Sequential(_Block(), _Block()).eval()
    cm = torch.compile(m)
    x = torch.randn(2, 16, 32)

    @torch.no_grad()
    def step():
        return cm(x)

    return step


def c_aoti():
    torch.manual_seed(0)
    m = nn.Sequential(_Block(), nn.Linear(32, 4)).eval()
    x = torch.randn(2, 16, 32)
    ep = torch.export.export(m, (x,))
    path = os.path.join(tempfile.mkdtemp(), "m.pt2")
    torch._inductor.aoti_compile_and_package(ep, package_path=path)
    runner = torch._inductor.aoti_load_package(path)

    @torch.no_grad()
    def step():
        return runner(x)

    return step


def c_export_dim():
    torch.manual_seed(0)
    m = nn.Sequential(_Block(), nn.Linear(32, 4))
    xs = [torch.randn(2, t, 32) for t in (16, 24)]
    batch = torch.export.Dim("t", min=2, max=64)
    gm = torch.export.export(m, (xs[0],), dynamic_shapes=({1: batch},)).module()
    opt = torch.optim.SGD(gm.parameters(), lr=1e-3)

    def step():
        for x in xs:
            opt.zero_grad()
            gm(x).pow(2).mean().backward()
            opt.step()

    return step


class _Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.blk = _Block()
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.enc(x)
        return self.head(self.blk(h))


def c_export_unflatten():
    torch.manual_seed(0)
    m = _Nested()
    x = torch.randn(2, 8, 16)
    ep = torch.export.export(m, (x,))
    um = torch.export.unflatten(ep)

    @torch.no_grad()
    def step():
        return um(x)

    return step


def c_flex_compiled_infer():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    qkv = nn.Linear(32, 96).eval()
    rel = torch.randn(2, 33) * 0.1

    def causal(b, h, qi, ki):
        return qi >= ki

    def score_mod(score, bi, hi, qi, ki):
        return score + rel[hi, (qi - ki).clamp(-16, 16) + 16]

    mask = create_block_mask(causal, 1, 1, 128, 128, device="cpu")
    flex = torch.compile(flex_attention)
    x = torch.randn(1, 128, 32)

    @torch.no_grad()
    def step():
        q, k, v = qkv(x).view(1, 128, 3, 2, 16).permute(2, 0, 3, 1, 4)
        return flex(q, k, v, score_mod=score_mod, block_mask=mask).sum()

    return step


def c_compiled_sac():
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    def policy(ctx, op, *args, **kwargs):
        if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    torch.manual_seed(0)
    blocks = nn.ModuleList([_Block() for _ in range(2)])

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = blocks

        def forward(self, x):
            for b in self.blocks:
                contexts = functools.partial(create_selective_checkpoint_contexts, policy)
                x = checkpoint(b, x, use_reentrant=False, context_fn=contexts)
            return x

    m = M()
    x = torch.randn(2, 16, 32)
    return _trained(torch.compile(m), m.parameters(), lambda: x)


def c_autocast_nograd():
    torch.manual_seed(0)
    m = nn.Sequential(_Block(), _Block(), nn.Linear(32, 4)).eval()
    cm = torch.compile(m)
    x = torch.randn(2, 16, 32)

    def step():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return cm(x).float().sum()

    return step


def c_recompile_at_record():
    # the recorded (third) call sees a new batch size: Dynamo recompiles inside the
    # observer's window (automatic dynamic shapes: a dynamic graph)
    calls = iter(range(1000))  # bench_features: 2 warm calls, then the recorded one
    return _compiled_sgd(_mlp(), lambda: torch.randn(8 if next(calls) < 2 else 13, 16))


WORKLOADS = {k[2:]: v for k, v in globals().items() if k.startswith("c_")}
