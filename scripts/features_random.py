"""Random programs for ``scripts/bench_features.py``: steps nobody wrote.

The other batches hold steps someone thought of; the traces users bring hold code
nobody here has seen. Each workload here is a program drawn from a seed: 16 to 40
ops over a palette of what user code does between modules (elementwise maths with
broadcasting, matmuls and convolutions on parameters, norms, reductions, every kind of
view, in-place writes through views into their bases, copies and layouts, indexing by
computed and by input indices, boolean masks with data-dependent sizes, random draws,
dtype round trips, ``out=`` calls, checkpointed, autocast and inference-mode regions,
swapped and resized memory), on inputs that are contiguous, transposed, sliced,
expanded or channels-last. Half the programs train: their parameters take gradients
through everything above, maybe clipped, and a step of SGD with momentum, Adam or
AdamW.

A program is built by running it: each drawn op runs on the tensors the program has
made so far, and one that raises (a shape that does not fit, a write into an expanded
view) is dropped, so the palette needs no shape rules of its own. Tensors whose size
came from data (a mask's selection, ``nonzero``) feed only ops that take any size. A
program whose later runs raise or turn an input NaN is drawn again. The same seed gives
the same program in every process (``WARM_STEP`` builds it once per process).

``FEATURES_RANDOM=N`` sets how many programs the batch lists (default 40), and
``FEATURES_RANDOM_FROM=K`` the first seed (default 0), so a sweep can go on where the
last stopped.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

Env = list[torch.Tensor]
Instr = Callable[[Env], torch.Tensor]

_MAX_NUMEL = 4096  # tensors larger than this feed only reductions (keeps steps short)


class _Program:
    """A program drawn from ``seed``: its instructions, each ``env -> tensor`` (the
    k-th reads results 0..k-1), and whether it ends in a training step."""

    def __init__(self, seed: int, collectives: bool = False, train: bool | None = None,
                 activation: torch.Tensor | None = None,
                 leave_out: tuple[str, ...] = ()) -> None:
        self.rng = random.Random(seed)
        torch.manual_seed(seed)
        drawn = self.rng.random() < 0.5  # (drawn either way: the later draws stay)
        self.train = drawn if train is None else train
        self.optimizer = self.rng.choice(("sgd", "sgd", "adam", "adamw"))
        self.clip = self.rng.random() < 0.3
        self.code: list[Instr] = []
        self.env: Env = []
        self.dynamic: set[int] = set()  # results whose size came from data
        self.params: list[torch.Tensor] = []
        # what parameter instructions read: ``params`` here, a module's own
        # (maybe unsharded) parameters where one runs the program as its forward
        self.table: list[torch.Tensor] = self.params
        self.inputs: list[torch.Tensor] = []
        # a program on an activation (scripts/random_strategies.py): its first
        # result is the tensor ``activation`` holds when it runs
        self.activation = activation
        palette = [(w, f) for w, f in _PALETTE if f.__name__ not in leave_out]
        palette += [(12.0, _collective)] if collectives else []
        self.weights = [w for w, _ in palette]
        self.makers = [f for _, f in palette]
        if activation is not None:
            self.emit(lambda env: self.activation)
        for _ in range(self.rng.randint(2, 3) - (activation is not None)):
            self.emit(self.input_instr(self.random_shape()))
        target = self.rng.randint(16, 40)
        tries = 0
        while len(self.code) < target and tries < 400:
            tries += 1
            maker = self.rng.choices(self.makers, self.weights)[0]
            try:
                made = maker(self)
            except (RuntimeError, ValueError, IndexError):  # (nothing it can apply to)
                continue
            if made is None:
                continue
            instr, dynamic = made if isinstance(made, tuple) else (made, False)
            self.emit(instr, dynamic)

    # -- building ------------------------------------------------------------------

    def emit(self, instr: Instr, dynamic: bool = False) -> bool:
        """Run ``instr`` on what the program has made; keep it where it ran."""
        try:
            value = instr(self.env)
        except Exception:
            return False
        if not isinstance(value, torch.Tensor):
            return False
        self.code.append(instr)
        if dynamic:
            self.dynamic.add(len(self.env))
        self.env.append(value)
        return True

    def random_shape(self) -> tuple[int, ...]:
        rank = self.rng.choice((1, 2, 2, 3, 3, 4))
        return tuple(self.rng.randint(1, 6) for _ in range(rank))

    def input_instr(self, shape: tuple[int, ...], param: bool | None = None,
                    dtype: torch.dtype = torch.float32, high: int = 5) -> Instr:
        """A new input of ``shape``: a parameter (training programs, most often), or
        data (integers in [0, ``high``)); laid out as it comes or transposed, sliced,
        expanded or channels-last."""
        param = self.train and self.rng.random() < 0.6 if param is None else param
        layout = self.rng.choice(("plain", "plain", "plain", "t", "slice", "expand", "cl"))
        if dtype.is_floating_point:
            base = torch.randn(shape, dtype=dtype)
        elif dtype == torch.bool:
            base = torch.rand(shape) < 0.5
        else:
            base = torch.randint(0, high, shape, dtype=dtype)
        if layout == "t" and len(shape) >= 2:
            base = base.transpose(-1, -2).contiguous().transpose(-1, -2)
        elif layout == "slice" and shape:
            base = torch.cat([base, base], dim=-1)[..., ::2]
        elif layout == "expand" and len(shape) >= 2 and shape[0] > 1 and not param:
            base = base[:1].expand(shape)
        elif layout == "cl" and len(shape) == 4:
            base = base.contiguous(memory_format=torch.channels_last)
        if param and dtype.is_floating_point:
            base = base.detach().requires_grad_()
            self.params.append(base)
        self.inputs.append(base)
        if base.requires_grad:
            k = len(self.params) - 1
            return lambda env: self.table[k]

        def instr(env: Env, t: torch.Tensor = base) -> torch.Tensor:
            return t

        return instr

    def pick(self, floating: bool = True, sized: bool = False,
             shape_free: bool = True) -> int | None:
        """The index of a result to use, recent ones more often; ``floating``: float
        dtypes only; ``sized``: not larger than ``_MAX_NUMEL``; ``shape_free``: may
        be one whose size came from data."""
        found = [i for i, t in enumerate(self.env)
                 if (t.is_floating_point() or not floating)
                 and (not sized or t.numel() <= _MAX_NUMEL)
                 and (shape_free or i not in self.dynamic)]
        if not found:
            return None
        weights = [1.0 + 3.0 * (i + 1) / len(self.env) for i in found]
        return self.rng.choices(found, weights)[0]

    def partner(self, i: int) -> int | None:
        """A second operand for result ``i``: one of a shape that broadcasts with it,
        else a new input of a shape that does (its own, or a trailing part of it)."""
        shape = tuple(self.env[i].shape)
        fits = [j for j, t in enumerate(self.env)
                if j != i and t.is_floating_point() and j not in self.dynamic
                and _broadcasts(tuple(t.shape), shape)]
        if fits and self.rng.random() < 0.6:
            return self.rng.choice(fits)
        cut = self.rng.randint(0, len(shape))
        part = tuple(1 if self.rng.random() < 0.2 else n for n in shape[cut:])
        if not self.emit(self.input_instr(part)):
            return None
        return len(self.env) - 1

    def dim(self, i: int) -> int | None:
        rank = self.env[i].dim()
        return self.rng.randrange(-rank, rank) if rank else None

    def writable(self, i: int) -> bool:
        """Whether an in-place write into result ``i`` is one autograd allows (its
        leaves' views are not; the rest is left to running it)."""
        t = self.env[i]
        return not t.requires_grad or (not t.is_leaf and t._base is None
                                       and self.rng.random() < 0.5)

    # -- running -------------------------------------------------------------------

    def step(self) -> Callable[[], object]:
        opt: torch.optim.Optimizer | None = None
        if self.train and self.params:
            kind = self.optimizer
            opt = (torch.optim.SGD(self.params, lr=1e-3, momentum=0.9) if kind == "sgd"
                   else torch.optim.Adam(self.params, lr=1e-3) if kind == "adam"
                   else torch.optim.AdamW(self.params, lr=1e-3, foreach=False))
        code, params, clip = self.code, self.params, self.clip

        def run() -> object:
            if opt is not None:
                opt.zero_grad()
            env: Env = []
            for instr in code:
                env.append(instr(env))
            if opt is None:
                return env[-1]
            ends = [t for t in env[-6:] if t.requires_grad and t.is_floating_point()]
            ends = ends or [t for t in env if t.requires_grad and t.is_floating_point()]
            loss = sum(t.float().tanh().mean() for t in ends)
            if not isinstance(loss, torch.Tensor):
                return None
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            return loss

        return run

    def inputs_finite(self) -> bool:
        with torch.no_grad():
            return all(bool(torch.isfinite(t).all()) for t in self.inputs
                       if t.is_floating_point())


def _broadcasts(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    if len(small) > len(big):
        return False
    return all(a in (1, b) for a, b in zip(reversed(small), reversed(big), strict=False))


# -- the palette: each maker returns an instruction (or with ``True``: its result's
# size comes from data), or None where it finds nothing to apply to ------------------

_UNARY: list[Callable[[torch.Tensor], torch.Tensor]] = [
    torch.relu, torch.tanh, torch.sigmoid, F.gelu, F.silu, torch.neg, torch.abs,
    torch.sin, torch.cos, torch.erf, F.softplus, F.leaky_relu, F.elu, F.mish,
    torch.square, torch.sign, torch.floor, torch.round, torch.frac,
    lambda x: torch.exp(x.clamp(-4, 4)),
    lambda x: torch.log1p(x.abs()),
    lambda x: torch.rsqrt(x * x + 1),
    lambda x: torch.sqrt(x.abs() + 1e-3),
    lambda x: torch.reciprocal(x.abs() + 1),
    lambda x: x.clamp(-1.5, 1.5),
    lambda x: x * 0.5,
    lambda x: 1.0 - x,
    lambda x: x / 3,
    lambda x: x ** 3,
    lambda x: F.hardtanh(x),
    lambda x: torch.nan_to_num(x),
]

_BINARY: list[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = [
    torch.add, torch.sub, torch.mul, torch.maximum, torch.minimum, torch.atan2,
    lambda a, b: a / (b.abs() + 1),
    lambda a, b: torch.where(a > b, a, b),
    lambda a, b: torch.lerp(a, b, 0.3),
    lambda a, b: torch.addcmul(a, a, b, value=0.5),
    lambda a, b: torch.add(a, b, alpha=2),
    lambda a, b: a.masked_fill(b > 0.5, 0.0),
    lambda a, b: (a - b) ** 2,
]


def _unary(p: _Program) -> Instr | tuple[Instr, bool] | None:
    i = p.pick()
    if i is None:
        return None
    fn = p.rng.choice(_UNARY)
    return (lambda env: fn(env[i])), i in p.dynamic


def _binary(p: _Program) -> Instr | None:
    i = p.pick(shape_free=False)
    if i is None:
        return None
    j = p.partner(i)
    if j is None:
        return None
    fn = p.rng.choice(_BINARY)
    a, b = (i, j) if p.rng.random() < 0.7 else (j, i)
    return lambda env: fn(env[a], env[b])


def _matmul(p: _Program) -> Instr | None:
    i = p.pick(sized=True, shape_free=False)
    if i is None or p.env[i].dim() == 0:
        return None
    x = p.env[i]
    k, n = x.shape[-1], p.rng.randint(1, 8)
    kind = p.rng.choice(("mm", "linear", "einsum", "bmm", "addmm", "vec"))
    if not p.emit(p.input_instr((k, n) if kind != "linear" else (n, k))):
        return None
    w = len(p.env) - 1
    if kind == "linear":
        bias = p.rng.random() < 0.5
        if bias and not p.emit(p.input_instr((n,))):
            return None
        b = len(p.env) - 1
        return lambda env: F.linear(env[i], env[w], env[b] if bias else None)
    if kind == "einsum":
        return lambda env: torch.einsum("...k,kn->...n", env[i], env[w])
    if kind == "bmm" and x.dim() == 3:
        return lambda env: torch.bmm(env[i], env[w].expand(env[i].shape[0], -1, -1))
    if kind == "addmm" and x.dim() == 2:
        return lambda env: torch.addmm(env[w][0], env[i], env[w], beta=0.5)
    if kind == "vec":
        return lambda env: torch.matmul(env[i], env[w][:, 0])
    return lambda env: env[i] @ env[w]


def _conv_pool(p: _Program) -> Instr | None:
    i = p.pick(sized=True, shape_free=False)
    if i is None or p.env[i].dim() not in (3, 4):
        return None
    x = p.env[i]
    c = x.shape[1]
    kind = p.rng.choice(("conv", "conv", "maxpool", "avgpool", "adaptive", "interp"))
    two_d = x.dim() == 4
    if kind == "conv":
        out, ks = p.rng.randint(1, 6), p.rng.choice((1, 2, 3))
        groups = c if p.rng.random() < 0.2 and out % c == 0 else 1
        shape = (out, c // groups, ks, ks) if two_d else (out, c // groups, ks)
        if not p.emit(p.input_instr(shape)):
            return None
        w = len(p.env) - 1
        pad, stride = p.rng.randint(0, 1), p.rng.choice((1, 1, 2))
        conv = F.conv2d if two_d else F.conv1d
        return lambda env: conv(env[i], env[w], None, stride, pad, 1, groups)
    if kind == "maxpool":
        pool = F.max_pool2d if two_d else F.max_pool1d
        return lambda env: pool(env[i], 2, ceil_mode=True)
    if kind == "avgpool":
        pool = F.avg_pool2d if two_d else F.avg_pool1d
        return lambda env: pool(env[i], 1 + (env[i].shape[-1] > 1), ceil_mode=True)
    if kind == "adaptive":
        pool = F.adaptive_avg_pool2d if two_d else F.adaptive_avg_pool1d
        return lambda env: pool(env[i], 2)
    mode = p.rng.choice(("nearest", "bilinear" if two_d else "linear"))
    return lambda env: F.interpolate(env[i], scale_factor=2, mode=mode)


def _norm(p: _Program) -> Instr | None:
    i = p.pick(sized=True, shape_free=False)
    if i is None or p.env[i].dim() == 0:
        return None
    x = p.env[i]
    kind = p.rng.choice(("layer", "softmax", "logsoftmax", "batch", "group", "normalize"))
    if kind == "layer":
        if not p.emit(p.input_instr((x.shape[-1],))):
            return None
        w = len(p.env) - 1
        return lambda env: F.layer_norm(env[i], env[i].shape[-1:], env[w])
    if kind in ("softmax", "logsoftmax"):
        d = p.dim(i)
        fn = F.softmax if kind == "softmax" else F.log_softmax
        return lambda env: fn(env[i], dim=d)
    if kind == "batch" and x.dim() >= 2:
        c = x.shape[1]
        mean, var = torch.zeros(c), torch.ones(c)
        return lambda env: F.batch_norm(env[i], mean, var, training=True, momentum=0.1)
    if kind == "group" and x.dim() >= 2:
        return lambda env: F.group_norm(env[i], 1)
    return lambda env: F.normalize(env[i], dim=-1)


def _reduce(p: _Program) -> Instr | None:
    i = p.pick()
    if i is None:
        return None
    x = p.env[i]
    if i in p.dynamic or x.dim() == 0 or p.rng.random() < 0.2:
        fn = p.rng.choice((torch.sum, torch.mean, torch.amax, torch.norm, torch.logsumexp))
        if fn is torch.logsumexp:
            return lambda env: torch.logsumexp(env[i].flatten(), 0)
        return lambda env: fn(env[i])
    d, keep = p.dim(i), p.rng.random() < 0.4
    kind = p.rng.choice(("sum", "mean", "amax", "max", "std", "norm", "lse", "cumsum",
                         "cumprod", "prod"))
    if kind == "max":
        return lambda env: env[i].max(dim=d, keepdim=keep).values
    if kind == "std":
        return lambda env: env[i].std(dim=d, keepdim=keep, correction=0)
    if kind == "norm":
        return lambda env: torch.linalg.vector_norm(env[i], dim=d, keepdim=keep)
    if kind == "lse":
        return lambda env: torch.logsumexp(env[i], dim=d, keepdim=keep)
    if kind == "cumsum":
        return lambda env: torch.cumsum(env[i], dim=d)
    if kind == "cumprod":
        return lambda env: torch.cumprod(env[i].tanh(), dim=d)
    if kind == "prod":
        return lambda env: env[i].tanh().prod(dim=d, keepdim=keep)
    fn = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}[kind]
    return lambda env: fn(env[i], dim=d, keepdim=keep)


def _view(p: _Program) -> Instr | None:
    i = p.pick(floating=False, shape_free=False)
    if i is None:
        return None
    x = p.env[i]
    rank = x.dim()
    kinds = ["flatten", "unsqueeze", "reshape"]
    if rank >= 2:
        kinds += ["transpose", "permute", "mT", "diagonal", "movedim"]
    if rank >= 1:
        kinds += ["select", "narrow", "step", "split", "unbind", "unfold", "as_strided",
                  "flip_view", "expand"]
    kind = p.rng.choice(kinds)
    if kind == "flatten":
        return lambda env: env[i].flatten()
    if kind == "unsqueeze":
        d = p.rng.randint(0, rank)
        return lambda env: env[i].unsqueeze(d)
    if kind == "reshape":
        n = x.numel()
        factors = [f for f in range(1, n + 1) if n % f == 0]
        f = p.rng.choice(factors)
        shape = (f, -1) if p.rng.random() < 0.5 else (-1, f)
        method = p.rng.choice(("view", "reshape"))
        return lambda env: getattr(env[i], method)(*shape)
    if kind in ("transpose", "movedim"):
        a, b = p.rng.sample(range(rank), 2)
        if kind == "movedim":
            return lambda env: env[i].movedim(a, b)
        return lambda env: env[i].transpose(a, b)
    if kind == "permute":
        order = list(range(rank))
        p.rng.shuffle(order)
        return lambda env: env[i].permute(*order)
    if kind == "mT":
        return lambda env: env[i].mT
    if kind == "diagonal":
        off = p.rng.randint(-1, 1)
        return lambda env: env[i].diagonal(off, -2, -1)
    d = p.rng.randrange(rank)
    n = x.shape[d]
    if n == 0:
        return None
    if kind == "select":
        k = p.rng.randrange(n)
        return lambda env: env[i].select(d, k)
    if kind == "narrow":
        start = p.rng.randrange(n)
        length = p.rng.randint(1, n - start)
        return lambda env: env[i].narrow(d, start, length)
    if kind == "step":
        s = p.rng.randint(2, 3)
        index = (slice(None),) * d + (slice(p.rng.randrange(n), None, s),)
        return lambda env: env[i][index]
    if kind == "split":
        size, k = p.rng.randint(1, n), p.rng.randrange(2)
        return lambda env: env[i].split(size, d)[min(k, math.ceil(n / size) - 1)]
    if kind == "unbind":
        k = p.rng.randrange(n)
        return lambda env: env[i].unbind(d)[k]
    if kind == "unfold":
        size, step = p.rng.randint(1, n), p.rng.randint(1, 2)
        return lambda env: env[i].unfold(d, size, step)
    if kind == "as_strided":
        t = x.contiguous() if not x.is_contiguous() else x
        count = t.numel()
        if count < 2:
            return None
        rows = p.rng.randint(1, max(1, count // 2))
        off = t.storage_offset()
        size, stride = (rows, 2), (max(1, (count - 2) // max(1, rows)), 1)
        return lambda env: env[i].contiguous().as_strided(size, stride, off)
    if kind == "flip_view":
        return lambda env: env[i].flip(d)
    ones = [k for k in range(rank) if x.shape[k] == 1]
    if not ones:
        return lambda env: env[i].unsqueeze(0).expand(2, *env[i].shape)
    shape = [p.rng.randint(2, 4) if k in ones else -1 for k in range(rank)]
    return lambda env: env[i].expand(*shape)


def _copy(p: _Program) -> Instr | None:
    i = p.pick(floating=False, shape_free=False)
    if i is None:
        return None
    x = p.env[i]
    kind = p.rng.choice(("contiguous", "clone", "cl", "dtype", "cat", "stack", "repeat",
                         "roll", "tril", "pad", "like", "arange", "out"))
    if kind == "contiguous":
        return lambda env: env[i].contiguous()
    if kind == "clone":
        return lambda env: env[i].clone()
    if kind == "cl" and x.dim() == 4:
        return lambda env: env[i].contiguous(memory_format=torch.channels_last)
    if kind == "dtype" and x.is_floating_point():
        there = p.rng.choice((torch.float64, torch.bfloat16, torch.float16))
        return lambda env: env[i].to(there).mul(2).to(torch.float32)
    if kind in ("cat", "stack") and x.dim():
        j = p.partner(i) if kind == "cat" else i
        if j is None:
            return None
        d = p.dim(i)
        if kind == "stack":
            return lambda env: torch.stack([env[i], env[i] * 2], d)
        return lambda env: torch.cat([env[i], env[j].expand_as(env[i])], d)
    if kind == "repeat" and x.dim():
        reps = [p.rng.randint(1, 2) for _ in range(x.dim())]
        return lambda env: env[i].repeat(*reps)
    if kind == "roll" and x.dim():
        shift, d = p.rng.randint(-2, 2), p.dim(i)
        return lambda env: torch.roll(env[i], shift, d)
    if kind == "tril" and x.dim() >= 2:
        return lambda env: torch.tril(env[i], p.rng.randint(-1, 1))
    if kind == "pad" and x.dim() >= 1 and x.is_floating_point():
        mode = p.rng.choice(("constant", "replicate")) if x.dim() >= 2 else "constant"
        return lambda env: F.pad(env[i], (1, 2), mode=mode)
    if kind == "like":
        fn = p.rng.choice((torch.zeros_like, torch.ones_like, torch.empty_like))
        return lambda env: fn(env[i]).fill_(0.25) if fn is torch.empty_like else fn(env[i])
    if kind == "arange" and x.dim():
        return lambda env: torch.arange(env[i].shape[-1], dtype=torch.float32) + env[i]
    if kind == "out" and x.is_floating_point():
        return lambda env: torch.mul(env[i], 2, out=torch.empty(0))
    return None


def _inplace(p: _Program) -> Instr | None:
    i = p.pick(shape_free=False)
    if i is None or not p.writable(i):
        return None
    kind = p.rng.choice(("add_", "mul_", "clamp_", "zero_", "copy_", "masked_fill_",
                         "relu_", "index_add_", "scatter_", "index_fill_", "sigmoid_",
                         "setitem"))
    if kind in ("add_", "copy_"):
        j = p.partner(i)
        if j is None or j == i:
            return None
        if kind == "copy_":
            return lambda env: env[i].copy_(env[j].detach().tanh())
        return lambda env: env[i].add_(env[j], alpha=0.1)
    if kind == "mul_":
        return lambda env: env[i].mul_(0.5)
    if kind == "clamp_":
        return lambda env: env[i].clamp_(-1, 1)
    if kind == "zero_":
        return lambda env: env[i].zero_()
    if kind == "masked_fill_":
        return lambda env: env[i].masked_fill_(env[i] > 0.5, 0.5)
    if kind == "relu_":
        return lambda env: env[i].relu_()
    if kind == "sigmoid_":
        return lambda env: env[i].sigmoid_()
    x = p.env[i]
    if x.dim() == 0:
        return None
    d = p.dim(i)
    n = x.shape[d]
    if n == 0:
        return None
    if kind == "setitem":
        k = p.rng.randrange(n)
        index = (slice(None),) * (d % x.dim()) + (k,)

        def setitem(env: Env) -> torch.Tensor:
            env[i][index] = 0.5
            return env[i]

        return setitem
    count = p.rng.randint(1, n)
    if not p.emit(p.input_instr((count,), param=False, dtype=torch.int64, high=n)):
        return None
    idx = len(p.env) - 1
    if kind == "index_fill_":
        return lambda env: env[i].index_fill_(d, env[idx], -0.5)
    if kind == "index_add_":
        return lambda env: env[i].index_add_(
            d, env[idx],
            env[i].narrow(d, 0, 1).expand_as(env[i].narrow(d, 0, count)).tanh(), alpha=0.1)
    return lambda env: env[i].scatter_(
        d, torch.zeros_like(env[i], dtype=torch.long).narrow(d, 0, 1), 0.25)


def _index(p: _Program) -> Instr | tuple[Instr, bool] | None:
    i = p.pick(shape_free=False)
    if i is None or p.env[i].dim() == 0:
        return None
    x = p.env[i]
    d = p.dim(i)
    n = x.shape[d]
    kind = p.rng.choice(("argsort_gather", "sort", "topk", "index_select", "input_index",
                         "mask", "nonzero", "embedding", "argmax", "where1", "unique"))
    if kind == "argsort_gather":
        return lambda env: torch.gather(env[i], d, torch.argsort(env[i], dim=d))
    if kind == "sort":
        return lambda env: torch.sort(env[i], dim=d, descending=True).values
    if kind == "topk" and n:
        k = p.rng.randint(1, n)
        return lambda env: torch.topk(env[i], k, dim=d).values
    if kind == "argmax":
        # (+ 0.5: a position is 0 in one run and not in another, and a norm's or a
        # product's backward divides by an exact 0 only where the replay's is 0)
        return lambda env: env[i].argmax(dim=d).float() + 0.5
    if kind == "index_select":
        k = p.rng.randint(1, max(1, n))
        return lambda env: env[i].index_select(d, torch.argsort(env[i].sum(
            [a for a in range(env[i].dim()) if a != d % env[i].dim()]))[:k])
    if kind in ("input_index", "embedding") and n:
        count = p.rng.randint(1, 6)
        if not p.emit(p.input_instr((count,), param=False, dtype=torch.int64, high=n)):
            return None
        idx = len(p.env) - 1
        if kind == "embedding":
            width = p.rng.randint(1, 6)
            if not p.emit(p.input_instr((n, width))):
                return None
            w = len(p.env) - 1
            return lambda env: F.embedding(env[idx], env[w])
        return lambda env: env[i].index_select(d, env[idx])
    if kind == "mask":
        return (lambda env: env[i][env[i] > 0]), True
    if kind == "nonzero":
        return (lambda env: torch.nonzero(env[i] > 0).float()), True
    if kind == "where1":
        return (lambda env: torch.where(env[i] > 0)[0].float()), True
    if kind == "unique":
        return (lambda env: torch.unique(env[i].round()).float()), True
    return None


def _random(p: _Program) -> Instr | None:
    i = p.pick(shape_free=False)
    if i is None:
        return None
    kind = p.rng.choice(("dropout", "rand_like", "bernoulli", "randn_add"))
    if kind == "dropout":
        return lambda env: F.dropout(env[i], 0.3, training=True)
    if kind == "rand_like":
        return lambda env: torch.rand_like(env[i]) * env[i]
    if kind == "bernoulli":
        return lambda env: torch.bernoulli(torch.sigmoid(env[i].detach())) * env[i]
    return lambda env: env[i] + 0.1 * torch.randn(env[i].shape)


def _detach(p: _Program) -> Instr | None:
    i = p.pick(shape_free=False)
    if i is None:
        return None
    kind = p.rng.choice(("detach", "no_grad"))
    if kind == "detach":
        return lambda env: env[i].detach() * 2

    def no_grad(env: Env) -> torch.Tensor:
        with torch.no_grad():
            return env[i] * env[i]

    return no_grad


def _data_shape(p: _Program) -> tuple[Instr, bool] | None:
    """A size the program reads from data: ``.item()``, ``.tolist()``, and ops whose
    result's size is a value (``repeat_interleave``, ``one_hot``, ``bincount``)."""
    i = p.pick(shape_free=False)
    if i is None or p.env[i].dim() == 0:
        return None
    kind = p.rng.choice(("item", "tolist", "repeat_interleave", "one_hot", "bincount"))
    if kind == "item":
        def item(env: Env) -> torch.Tensor:
            n = int(env[i].gt(0).sum().item())
            return torch.linspace(0, 1, n) * env[i].mean()

        return item, True
    if kind == "tolist":
        def tolist(env: Env) -> torch.Tensor:
            row = env[i].flatten()[:4]
            counts = (row.detach().abs() * 2).long().clamp(max=3)
            parts = torch.ones(int(counts.sum())).split(counts.tolist())
            return torch.stack([part.sum() for part in parts]) * row

        return tolist, False
    if kind == "repeat_interleave":
        def repeat(env: Env) -> torch.Tensor:
            row = env[i].flatten()[:6]
            return row.repeat_interleave((row.detach() > 0).long() + 1)

        return repeat, True
    if kind == "one_hot":
        return (lambda env: F.one_hot(env[i].flatten().argsort()[:3]).float()), True
    return (lambda env: torch.bincount(env[i].flatten().argsort()).float()), True


def _loss(p: _Program) -> Instr | None:
    i = p.pick(sized=True, shape_free=False)
    if i is None or p.env[i].dim() != 2:
        return None
    rows, classes = p.env[i].shape
    kind = p.rng.choice(("cross_entropy", "nll", "mse", "bce", "smooth_l1", "kl"))
    if kind in ("cross_entropy", "nll"):
        if not p.emit(p.input_instr((rows,), param=False, dtype=torch.int64, high=classes)):
            return None
        y = len(p.env) - 1
        ignore = -100 if p.rng.random() < 0.5 else 0
        smooth = 0.1 if kind == "cross_entropy" and p.rng.random() < 0.5 else 0.0
        if kind == "nll":
            return lambda env: F.nll_loss(F.log_softmax(env[i], -1), env[y],
                                          ignore_index=ignore)
        return lambda env: F.cross_entropy(env[i], env[y], ignore_index=ignore,
                                           label_smoothing=smooth)
    j = p.partner(i)
    if j is None:
        return None
    if kind == "bce":
        return lambda env: F.binary_cross_entropy_with_logits(
            env[i], torch.sigmoid(env[j].detach()).expand_as(env[i]))
    if kind == "kl":
        return lambda env: F.kl_div(F.log_softmax(env[i], -1), F.softmax(env[j], -1)
                                    .expand_as(env[i]), reduction="batchmean")
    fn = F.mse_loss if kind == "mse" else F.smooth_l1_loss
    return lambda env: fn(env[i], env[j].expand_as(env[i]))


def _attention(p: _Program) -> Instr | None:
    i = p.pick(sized=True, shape_free=False)
    if i is None or p.env[i].dim() not in (3, 4):
        return None
    causal = p.rng.random() < 0.5
    masked = not causal and p.rng.random() < 0.5
    scale = p.rng.choice((None, 0.5))

    def attend(env: Env) -> torch.Tensor:
        q = env[i]
        k, v = q.flip(-2), torch.tanh(q)
        mask = (q[..., :1] > 0) | (q[..., :1] < 0).mT if masked else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              scale=scale)

    return attend


def _int_math(p: _Program) -> Instr | None:
    i = p.pick(shape_free=False)
    if i is None or p.env[i].dim() == 0:
        return None
    d = p.dim(i)
    kind = p.rng.choice(("arith", "bits", "gather_max", "searchsorted", "bool"))
    if kind == "arith":
        return lambda env: ((env[i].argmax(d) * 3 + 1) // 2 % 5).to(torch.float32) + 0.5
    if kind == "bits":
        return lambda env: ((env[i] * 8).to(torch.int32) & 6 | 1).bitwise_left_shift(1).float()
    if kind == "gather_max":
        def gather_max(env: Env) -> torch.Tensor:
            values, where = env[i].max(d, keepdim=True)
            return torch.gather(env[i], d, where) + values
        return gather_max
    if kind == "searchsorted":
        return lambda env: torch.searchsorted(
            torch.linspace(-2, 2, 7), env[i].detach().contiguous()).float() * env[i]
    return lambda env: ((env[i] > 0) & (env[i] < 1)).float() * env[i]


def _scatter(p: _Program) -> Instr | None:
    i = p.pick(shape_free=False)
    if i is None or p.env[i].dim() == 0:
        return None
    x = p.env[i]
    n = x.shape[0]
    if n == 0:
        return None
    kind = p.rng.choice(("scatter_reduce", "index_put_acc", "masked_scatter", "put"))
    if kind in ("scatter_reduce", "index_put_acc"):
        if not p.emit(p.input_instr(tuple(x.shape), param=False, dtype=torch.int64,
                                    high=n)):
            return None
        idx = len(p.env) - 1
        if kind == "scatter_reduce":
            how = p.rng.choice(("sum", "amax", "mean", "prod"))
            return lambda env: torch.zeros_like(env[i]).scatter_reduce(
                0, env[idx], env[i], how, include_self=False)
        return lambda env: torch.zeros_like(env[i]).index_put_(
            (env[idx].flatten()[:n],), env[i][:1].expand(min(n, env[idx].numel()),
                                                          *env[i].shape[1:]),
            accumulate=True)
    if kind == "masked_scatter":
        return lambda env: env[i].masked_scatter(env[i] > 0, env[i].tanh())
    return lambda env: env[i].flatten().put(torch.tensor([0, n - 1]),
                                            torch.tensor([0.5, -0.5]))


def _masked_softmax(p: _Program) -> Instr | None:
    """Attention scores masked by an input mask, as padding masks are: a row the mask
    empties is NaN in eager torch too, so the input keeps one key per row."""
    i = p.pick(sized=True, shape_free=False)
    if i is None or p.env[i].dim() < 1:
        return None
    shape = tuple(p.env[i].shape)
    if not p.emit(p.input_instr(shape, param=False, dtype=torch.bool)):
        return None
    m = len(p.env) - 1
    p.env[m][..., 0] = True  # (the input is the tensor the instruction returns)
    return lambda env: env[i].masked_fill(~env[m], float("-inf")).softmax(-1)


def _autograd(p: _Program) -> Instr | None:
    """Autograd inside the step: a gradient taken with ``create_graph`` (a penalty), a
    hook that rewrites a gradient, ``.data`` written under ``no_grad`` (an EMA)."""
    if not p.train:
        return None
    i = p.pick(shape_free=False)
    if i is None or not p.env[i].requires_grad:
        return None
    kind = p.rng.choice(("grad", "hook", "data_ema"))
    if kind == "grad":
        def penalty(env: Env) -> torch.Tensor:
            (g,) = torch.autograd.grad(env[i].tanh().sum(), env[i], create_graph=True)
            return env[i] + g.pow(2).mean()

        return penalty
    if kind == "hook":
        def hooked(env: Env) -> torch.Tensor:
            out = env[i] * 1.5
            out.register_hook(lambda g: g.clamp(-1, 1))
            return out

        return hooked
    if not p.params:
        return None
    k = p.rng.randrange(len(p.params))

    def ema(env: Env) -> torch.Tensor:
        with torch.no_grad():
            param = p.table[k]
            param.data.mul_(0.99).add_(param.data.tanh(), alpha=0.01)
        return env[i] * 1

    return ema


def _multi_view(p: _Program) -> Instr | None:
    """Views that share one base, used together: ``chunk``'s parts in one op, a
    dtype view of the bits, ``tensor_split`` at points given as a tensor, a complex
    view and an FFT."""
    i = p.pick(shape_free=False)
    if i is None or p.env[i].dim() == 0 or not p.env[i].numel():
        return None
    kind = p.rng.choice(("chunks", "bits", "tensor_split", "complex", "fft"))
    if kind == "chunks":
        def chunks(env: Env) -> torch.Tensor:
            a, b = env[i].chunk(2, -1) if env[i].shape[-1] > 1 else (env[i], env[i])
            return a * torch.sigmoid(b[..., : a.shape[-1]])

        return chunks
    if kind == "bits":
        return lambda env: (env[i].detach().contiguous().view(torch.int32) & -65536) \
            .view(torch.float32) * env[i]
    if kind == "tensor_split":
        n = p.env[i].shape[0]
        points = sorted(p.rng.sample(range(n + 1), min(2, n + 1)))

        def split(env: Env) -> torch.Tensor:
            parts = torch.tensor_split(env[i], torch.tensor(points))
            return torch.cat([part.sum(0, keepdim=True) for part in parts])

        return split
    if kind == "complex":
        def rotate(env: Env) -> torch.Tensor:
            x = env[i]
            if x.shape[-1] % 2:
                x = F.pad(x, (0, 1))
            z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
            return torch.view_as_real(z * torch.polar(torch.ones(()), torch.tensor(0.5)))

        return rotate
    return lambda env: torch.fft.irfft(torch.fft.rfft(env[i], dim=-1), n=env[i].shape[-1])


def _sampled(p: _Program) -> Instr | None:
    """Indices the step draws or reads from inputs: ``multinomial``, an embedding bag
    over offsets, ``grid_sample`` at input coordinates."""
    i = p.pick(sized=True, shape_free=False)
    if i is None or p.env[i].dim() == 0 or not p.env[i].numel():
        return None
    n = p.env[i].shape[-1]
    kind = p.rng.choice(("multinomial", "bag", "grid"))
    if kind == "multinomial":
        k = p.rng.randint(1, n)

        def drawn(env: Env) -> torch.Tensor:
            rows = env[i].flatten(0, -2) if env[i].dim() > 1 else env[i].unsqueeze(0)
            return rows.gather(-1, torch.multinomial(rows.detach().softmax(-1), k))

        return drawn
    if kind == "bag":
        count = p.rng.randint(2, 8)
        bags = p.rng.randint(1, min(3, count))
        if not p.emit(p.input_instr((count,), param=False, dtype=torch.int64, high=n)):
            return None
        idx = len(p.env) - 1
        offsets = torch.tensor(sorted([0] + p.rng.sample(range(1, count), bags - 1)))
        if not p.emit(p.input_instr((n, 3))):
            return None
        w = len(p.env) - 1
        mode = p.rng.choice(("sum", "mean", "max"))
        return lambda env: F.embedding_bag(env[idx], env[w], offsets, mode=mode)
    if p.env[i].dim() != 4:
        return None
    rows, h, w_ = p.env[i].shape[0], p.rng.randint(1, 4), p.rng.randint(1, 4)
    if not p.emit(p.input_instr((rows, h, w_, 2), param=False)):
        return None
    g = len(p.env) - 1
    return lambda env: F.grid_sample(env[i], env[g].tanh(), align_corners=False)


def _region(p: _Program) -> Instr | None:
    """Ops inside a region that changes how they run: activation checkpointing (the
    backward runs the forward again), autocast to bfloat16, ``inference_mode``."""
    i = p.pick(sized=True, shape_free=False)
    if i is None or p.env[i].dim() == 0:
        return None
    kind = p.rng.choice(("checkpoint", "autocast", "inference"))
    if not p.emit(p.input_instr((p.env[i].shape[-1], p.rng.randint(1, 6)))):
        return None
    w = len(p.env) - 1

    def body(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.gelu(x @ weight).tanh()

    if kind == "checkpoint":
        if not p.train:
            return None
        return lambda env: checkpoint(body, env[i], env[w], use_reentrant=False)
    if kind == "autocast":
        def autocast(env: Env) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return body(env[i], env[w]).float()

        return autocast

    def inference(env: Env) -> torch.Tensor:
        with torch.inference_mode():
            made = body(env[i], env[w])
        return made.clone() * env[i].sum()

    return inference


def _storage(p: _Program) -> Instr | None:
    """Memory the step swaps or resizes: ``.data`` swapped for another tensor's, a
    buffer ``resize_``d and written, ``as_strided`` over a flat buffer."""
    i = p.pick(shape_free=False)
    if i is None or p.env[i].requires_grad or not p.env[i].numel():
        return None
    kind = p.rng.choice(("resize", "as_strided", "set_data"))
    n = p.env[i].numel()
    if kind == "resize":
        def resized(env: Env) -> torch.Tensor:
            out = torch.empty(0)
            out.resize_(n).copy_(env[i].flatten())
            return out.view(env[i].shape) * 2

        return resized
    if kind == "as_strided":
        def windows(env: Env) -> torch.Tensor:
            flat = env[i].flatten().contiguous()
            size = max(1, n // 2)
            return flat.as_strided((n - size + 1, size), (1, 1)).sum(-1)

        return windows

    def swapped(env: Env) -> torch.Tensor:
        holder = torch.zeros_like(env[i])
        holder.data = env[i].data.tanh()
        return holder + env[i]

    return swapped


def _collective(p: _Program) -> Instr | tuple[Instr, bool] | None:
    """A collective over the default group, as parallel code issues them: all-reduce
    (sum, max, asynchronous and waited later, functional), all-gather, reduce-scatter,
    broadcast, all-to-all at counts exchanged and read back with ``.tolist()``, and a
    ring of sends and receives. What it returns multiplies the local value, so a
    training program's gradients still reach its parameters."""
    i = p.pick(sized=True, shape_free=False)
    if i is None or not p.env[i].numel():
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    kind = p.rng.choice(("all_reduce", "max", "async", "functional", "all_gather",
                         "reduce_scatter", "broadcast", "all_to_all", "ring"))

    def local(env: Env) -> torch.Tensor:
        return env[i].detach().clone()

    if kind in ("all_reduce", "max"):
        how = dist.ReduceOp.SUM if kind == "all_reduce" else dist.ReduceOp.MAX

        def all_reduce(env: Env) -> torch.Tensor:
            t = local(env)
            dist.all_reduce(t, op=how)
            return t * env[i]

        return all_reduce
    if kind == "async":
        def waited(env: Env) -> torch.Tensor:
            t = local(env)
            work = dist.all_reduce(t, async_op=True)
            between = env[i].tanh()
            work.wait()
            return t + between

        return waited
    if kind == "functional":
        return lambda env: funcol.all_reduce(local(env), "sum", dist.group.WORLD) * env[i]
    if kind == "all_gather":
        def all_gather(env: Env) -> torch.Tensor:
            t = local(env).flatten()
            out = torch.empty(world * t.numel())
            dist.all_gather_into_tensor(out, t)
            return out.view(world, -1).sum(0).view_as(env[i]) * env[i]

        return all_gather
    if kind == "reduce_scatter":
        def reduce_scatter(env: Env) -> torch.Tensor:
            t = local(env).flatten()
            out = torch.empty_like(t)
            dist.reduce_scatter_tensor(out, t.repeat(world))
            return out.view_as(env[i]) + env[i]

        return reduce_scatter
    if kind == "broadcast":
        def broadcast(env: Env) -> torch.Tensor:
            t = local(env)
            dist.broadcast(t, src=world - 1)
            return t - env[i]

        return broadcast
    if kind == "ring":
        def ring(env: Env) -> torch.Tensor:
            t = local(env).contiguous()
            got = torch.empty_like(t)
            ops = [dist.P2POp(dist.isend, t, (rank + 1) % world),
                   dist.P2POp(dist.irecv, got, (rank - 1) % world)]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
            return got * env[i]

        return ring
    if p.env[i].numel() < world:
        return None

    def all_to_all(env: Env) -> torch.Tensor:
        row = env[i].detach().flatten()
        counts = (row[:world].abs() * 2).long().clamp(max=2)
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts)
        sent, received = counts.tolist(), got.tolist()
        out = torch.empty(sum(received))
        dist.all_to_all_single(out, torch.ones(sum(sent)) * row.mean(), received, sent)
        return out

    return all_to_all, True


_PALETTE: list[tuple[float, Callable[[_Program], object]]] = [
    (5, _unary), (5, _binary), (3, _matmul), (1.5, _conv_pool), (2, _norm),
    (3, _reduce), (5, _view), (2.5, _copy), (3, _inplace), (2.5, _index),
    (1, _random), (0.5, _detach), (2, _data_shape), (1, _loss), (1, _attention),
    (1.5, _int_math), (1.5, _scatter), (1, _masked_softmax), (1, _autograd),
    (1.5, _multi_view), (1, _sampled), (1, _region), (1, _storage),
]


def program(seed: int, collectives: bool = False, rank: int = 0,
            train: bool | None = None) -> Callable[[], object]:
    """The step of the first program drawn from ``seed`` (then ``seed`` + 1000, ...)
    that runs three times with its inputs finite; ``collectives``: with collectives
    over the default process group, which every rank draws alike (the same seed, the
    same inputs), its data inputs then shifted by ``rank`` / 4, so that each rank's
    data differ as data-parallel ranks' batches do (an all-to-all's counts, a mask's
    selection). ``train``: a training step or not, whatever the seed draws."""
    for attempt in range(20):
        built = _Program(seed + 1000 * attempt, collectives, train=train)
        run = built.step()
        try:
            for _ in range(3):
                run()
        except Exception:  # (alike on every rank: their inputs are alike until here)
            continue
        if built.inputs_finite():
            shift_data_inputs(built, rank)
            return run
    raise RuntimeError(f"no program of seed {seed} ran")


def shift_data_inputs(built: _Program, rank: int) -> None:
    """Shift ``built``'s float data inputs by ``rank`` / 4, so that each rank's data
    differ as data-parallel ranks' batches do (an expanded one is left: a write
    into it is refused)."""
    with torch.no_grad():
        for t in built.inputs:
            expanded = any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride(),
                                                              strict=True))
            if t.is_floating_point() and not t.requires_grad and not expanded:
                t.add_(rank / 4)


_FIRST = int(os.environ.get("FEATURES_RANDOM_FROM", "0"))
_COUNT = int(os.environ.get("FEATURES_RANDOM", "40"))
WORKLOADS = {f"rand_{seed}": (lambda seed=seed: program(seed))
             for seed in range(_FIRST, _FIRST + _COUNT)}
