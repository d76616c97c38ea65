"""Random models under random parallel strategies, for ``bench_random_parallel.py``.

``features_random`` draws programs nobody wrote; the collective programs there talk
over the default group by hand. Production traces come from programs wrapped by a
parallel strategy instead, whose collectives, hooks and copies run between, inside
and after the model's own ops. Here a seed draws both:

* a model: 1 to 4 layers, each ``Linear(d, h)``, a random program on its activation
  (``RandomBlock``: ``features_random``'s palette, parameters and data inputs of its
  own, maybe with collectives), ``Linear(h, d)``;
* a strategy over it, with its options: DDP (bucket size, gradients as bucket
  views, a static graph, unused parameters found), FSDP2 (which layers are sharded,
  resharding after forward, bf16 parameters with fp32 reductions), tensor parallel on
  DTensor (each layer's Linears column- then row-parallel, the program on each rank's
  shard), or a pipeline of stages (GPipe, 1F1B, and with two stages per rank
  Interleaved1F1B, LoopedBFS, ZBVZeroBubble, DualPipeV); on 4 ranks or more also
  FSDP2 over a mesh's first dimension with tensor parallel over its second, and
  HSDP;
* a step: training (SGD with momentum, Adam, AdamW; foreach, fused or per tensor;
  gradients maybe clipped; one or two microbatches accumulated where the strategy
  can; each layer maybe under activation checkpointing) or, for the data-parallel
  strategies, inference under ``no_grad``.

Every rank draws the same model from the seed. Data-parallel ranks then see their own
data (inputs shifted by rank / 4, as ``features_random.program`` shifts them), tensor
and pipeline ranks the same batch.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from features_random import _Program, shift_data_inputs
from torch import nn
from torch.distributed import pipelining as pp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.utils.checkpoint import checkpoint

STRATEGIES = ("ddp", "fsdp2", "tp", "pipeline")
# on an even world of 4 ranks or more: FSDP2 over a 2 x world/2 mesh's first
# dimension with tensor parallel over its second, and HSDP (replicated x sharded)
TWO_D_STRATEGIES = ("fsdp2_tp", "hsdp")
_FSDP = ("fsdp2", "fsdp2_tp", "hsdp")
_DATA_PARALLEL = ("ddp", *_FSDP)
_PIPELINES = ("gpipe", "1f1b", "interleaved", "looped_bfs", "zbv", "dualpipev")
_TWO_STAGES_PER_RANK = {"interleaved": "loop", "looped_bfs": "loop", "zbv": "v",
                        "dualpipev": "v"}


class RandomBlock(nn.Module):
    """A random program as a module's forward: its first result is the module's
    input, its parameters are the module's own (FSDP2 swaps them for unsharded ones
    before each forward), and it returns the input plus a number taken from its last
    results, so that gradients reach what those results read."""

    def __init__(self, seed: int, shape: tuple[int, ...], train: bool,
                 collectives: bool, leave_out: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.program = _Program(seed, collectives, train=train,
                                activation=torch.randn(shape, requires_grad=train),
                                leave_out=leave_out)
        self.weights = nn.ParameterList(nn.Parameter(t.detach())
                                        for t in self.program.params)
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        program = self.program
        program.activation, program.table = x, list(self.weights)
        env: list[torch.Tensor] = []
        for instr in program.code:
            env.append(instr(env))
        program.activation = None
        ends = [t for t in env[-6:] if t.is_floating_point() and t.numel()]
        bump = sum(t.float().tanh().mean() for t in ends)
        return x + bump if isinstance(bump, torch.Tensor) else x


class _Draw:
    """What one seed draws, in the order it draws it (every rank alike)."""

    def __init__(self, seed: int, world: int) -> None:
        rng = random.Random(seed)
        self.rng = rng
        two_d = TWO_D_STRATEGIES if world >= 4 and world % 2 == 0 else ()
        self.strategy = rng.choice(STRATEGIES + two_d)
        self.tp = {"tp": world, "fsdp2_tp": world // 2}.get(self.strategy, 1)
        self.schedule = rng.choice(_PIPELINES) if self.strategy == "pipeline" else ""
        self.stages = world * (2 if self.schedule in _TWO_STAGES_PER_RANK else 1)
        self.train = self.strategy in ("tp", "pipeline") or rng.random() < 0.75
        self.d = rng.choice((4, 6, 8))
        self.h = world * rng.choice((2, 3, 4))
        self.layers = (self.stages if self.strategy == "pipeline"
                       else rng.randint(1, 3))
        self.micro = rng.choice((2, 4)) if self.strategy == "pipeline" else 1
        if self.schedule == "dualpipev":  # (it needs a microbatch per stage)
            self.micro = max(self.micro, self.stages)
        self.batch = self.micro * rng.choice((1, 2, 3))
        self.collectives = self.strategy != "pipeline" and rng.random() < 0.4
        self.optimizer = rng.choice(("sgd", "adam", "adamw"))
        self.foreach = rng.choice((None, True, False, "fused"))
        self.clip = self.train and rng.random() < 0.3
        self.accumulate = (self.strategy in _DATA_PARALLEL and self.train
                           and rng.random() < 0.3)
        self.loss = rng.choice(("mse", "cross_entropy"))
        # each layer under non-reentrant activation checkpointing, as torchtitan and
        # FSDP recipes wrap their blocks (the backward runs its forward again)
        self.checkpoint = (self.train and self.strategy != "pipeline"
                           and rng.random() < 0.3)

    def describe(self) -> str:
        parts = [self.strategy, self.schedule, "train" if self.train else "infer",
                 f"{self.layers} layers", self.optimizer if self.train else "",
                 "clip" if self.clip else "", "accumulate" if self.accumulate else "",
                 "checkpointed" if self.checkpoint else "",
                 "collectives" if self.collectives else ""]
        return " ".join(p for p in parts if p)


def _block(seed: int, shape: tuple[int, ...], draw: _Draw) -> RandomBlock:
    """The first block drawn from ``seed`` (then ``seed`` + 1000, ...) whose step runs
    three times on an activation of ``shape`` with its inputs finite (a drawn op may
    run forward and have no backward). Every rank draws the same."""
    # (a zero-bubble schedule computes weight gradients after the next microbatch's
    # forward, from the graph its input gradients were taken through: a parameter
    # written in a forward, or a checkpoint's recomputed graph, is one it refuses)
    zero_bubble = draw.schedule in ("zbv", "dualpipev")
    leave_out = ("_autograd", "_storage", "_region") if zero_bubble else ()
    # (a pipeline runs a microbatch's forward before the last one's backward: a write
    # into state both read, a data input's, is one the backward refuses)
    in_flight = 2 if draw.strategy == "pipeline" else 1
    for attempt in range(20):
        block = RandomBlock(seed + 1000 * attempt, shape, draw.train, draw.collectives,
                            leave_out)
        x = torch.randn(shape, requires_grad=draw.train)
        try:
            for _ in range(3):
                ys = [block(x) for _ in range(in_flight)]
                if draw.train:
                    for y in ys:
                        y.sum().backward()
        except Exception:  # (alike on every rank: their inputs are alike until here)
            continue
        block.zero_grad(set_to_none=True)
        if block.program.inputs_finite():
            return block
    raise RuntimeError(f"no block of seed {seed} ran")


class Layer(nn.Sequential):
    """``Linear(d, h)``, a random block, ``Linear(h, d)``; ``checkpointed``: run under
    non-reentrant activation checkpointing (inside the hooks a strategy puts on the
    layer, as ``checkpoint_wrapper`` before ``fully_shard`` does)."""

    checkpointed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed:
            return checkpoint(super().forward, x, use_reentrant=False)
        return super().forward(x)


def _layer(seed: int, d: int, h: int, width: int, batch: int, draw: _Draw) -> Layer:
    return Layer(nn.Linear(d, h), _block(seed, (batch, width), draw), nn.Linear(h, d))


def _optimizer(draw: _Draw, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    options: dict[str, object] = {"lr": 1e-3}
    if draw.foreach == "fused" and draw.optimizer != "sgd":
        options["fused"] = True
    elif draw.foreach in (True, False):
        options["foreach"] = draw.foreach
    if draw.optimizer == "sgd":
        return torch.optim.SGD(_param_groups(params), momentum=0.9, **options)
    kind = torch.optim.Adam if draw.optimizer == "adam" else torch.optim.AdamW
    return kind(_param_groups(params), **options)


def _loss(draw: _Draw, y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if draw.loss == "mse":
        return ((y.float() - target) ** 2).mean()
    return nn.functional.cross_entropy(y.float(), target.argmax(-1))


def _unused(model: nn.Module, x: torch.Tensor, target: torch.Tensor,
            draw: _Draw) -> bool:
    """Whether a training step leaves a parameter without a gradient (DDP must be
    told to look for those)."""
    _loss(draw, model(x), target).backward()
    unused = any(p.grad is None for p in model.parameters())
    model.zero_grad(set_to_none=True)
    return unused


def _runs_in(dtype: torch.dtype, layers: list[Layer], draw: _Draw) -> bool:
    """Whether every layer's random block runs (and, training, runs backward) with its
    parameters and activation in ``dtype`` and its data inputs as they are, as under
    FSDP2's mixed precision: a program may mix them in an op that refuses two dtypes.
    The parameters keep their values (rounded to ``dtype`` and back)."""
    for layer in layers:
        block = layer[1]
        block.to(dtype)
        try:
            x = torch.randn(block.shape, dtype=dtype, requires_grad=draw.train)
            y = block(x)
            if draw.train:
                y.float().sum().backward()
        except RuntimeError:
            return False
        finally:
            block.zero_grad(set_to_none=True)
            block.to(torch.float32)
    return True


def _param_groups(params: list[nn.Parameter]) -> list[dict[str, object]]:
    """DTensor parameters (by mesh) and plain ones in groups of their own: a foreach
    or fused step refuses them mixed (FSDP2 leaves its ignored parameters plain, tensor
    parallel the ones no plan names)."""
    groups: dict[object, list[nn.Parameter]] = {}
    for p in params:  # (by mesh: a 2-D step's DTensors may live on two)
        groups.setdefault(p.device_mesh if isinstance(p, DTensor) else None, []).append(p)
    return [{"params": group} for group in groups.values()]


def _clip(params: list[nn.Parameter]) -> None:
    """Gradients clipped by their total norm, each group of ``_param_groups`` apart
    (the norm of DTensors and plain tensors together is refused)."""
    for group in _param_groups(params):
        nn.utils.clip_grad_norm_(group["params"], 1.0)


def _tensor_parallel(model: nn.Module, mesh: DeviceMesh, draw: _Draw) -> None:
    """Each layer's first Linear column-parallel, its last row-parallel: the random
    program between them runs on each rank's shard of the activation."""
    plan: dict[str, object] = {}
    for k in range(draw.layers):
        plan[f"{k}.0"], plan[f"{k}.2"] = ColwiseParallel(), RowwiseParallel()
    parallelize_module(model, mesh, plan)


def strategy_program(seed: int, rank: int, world: int) -> tuple[str, Callable[[], object]]:
    """The model, strategy and step drawn from ``seed`` on this rank: a description
    and the step."""
    draw = _Draw(seed, world)
    rng = draw.rng
    width = draw.h // draw.tp
    torch.manual_seed(seed)
    layers = [_layer(seed * 16 + k, draw.d, draw.h, width, draw.batch // draw.micro, draw)
              for k in range(draw.layers)]
    x = torch.randn(draw.batch * (1 + draw.accumulate), draw.d)
    target = torch.randn(x.shape)
    if draw.strategy in _DATA_PARALLEL:  # (a mesh's ranks are laid out dp-major)
        with torch.no_grad():
            x.add_(rank // draw.tp / 4)
        for layer in layers:
            shift_data_inputs(layer[1].program, rank // draw.tp)
    if draw.strategy == "pipeline":
        return draw.describe(), _pipeline(draw, layers, rank, world, x, target)
    for layer in layers:
        layer.checkpointed = draw.checkpoint
    model = nn.Sequential(*layers)
    if draw.strategy == "ddp":
        unused = draw.train and _unused(model, x[:draw.batch], target[:draw.batch], draw)
        model = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=rng.choice((None, 0.0001, 0.002)),
            gradient_as_bucket_view=rng.random() < 0.5,
            find_unused_parameters=unused,
            static_graph=not unused and rng.random() < 0.3)
    elif draw.strategy == "tp":
        _tensor_parallel(model, init_device_mesh("cpu", (world,)), draw)
    else:
        bf16 = rng.random() < 0.3 and _runs_in(torch.bfloat16, layers, draw)
        mesh = None
        if draw.strategy == "hsdp":
            mesh = init_device_mesh("cpu", (2, world // 2),
                                    mesh_dim_names=("replicate", "shard"))
        elif draw.strategy == "fsdp2_tp":
            both = init_device_mesh("cpu", (world // draw.tp, draw.tp),
                                    mesh_dim_names=("dp", "tp"))
            _tensor_parallel(model, both["tp"], draw)
            mesh = both["dp"]

        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                       reduce_dtype=torch.float32)
                  if bf16 else MixedPrecisionPolicy())
        # (FSDP2 shards no 0-d or non-contiguous parameter: those stay local, as
        # users leave them out)
        ignored = {p for p in model.parameters() if not p.dim() or not p.is_contiguous()}
        for layer in layers:
            if rng.random() < 0.7:
                fully_shard(layer, mesh=mesh, reshard_after_forward=rng.random() < 0.6,
                            mp_policy=policy, ignored_params=ignored)
        fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=ignored)
    if not draw.train:
        def infer() -> torch.Tensor:
            with torch.no_grad():
                return model(x[:draw.batch])

        return draw.describe(), infer
    params = list(model.parameters())
    opt = _optimizer(draw, params)
    chunks = x.chunk(1 + draw.accumulate), target.chunk(1 + draw.accumulate)

    def train() -> torch.Tensor:
        opt.zero_grad()
        for k, (part, aim) in enumerate(zip(*chunks, strict=True)):
            last = k == len(chunks[0]) - 1
            if draw.strategy in _FSDP:
                model.set_requires_gradient_sync(last)  # type: ignore[operator]
            if draw.strategy == "ddp" and not last:
                with model.no_sync():  # type: ignore[operator]
                    loss = _loss(draw, model(part), aim)
                    loss.backward()
            else:
                loss = _loss(draw, model(part), aim)
                loss.backward()
        if draw.clip:
            _clip(params)
        opt.step()
        return loss.detach()

    return draw.describe(), train


def _pipeline(draw: _Draw, layers: list[Layer], rank: int, world: int,
              x: torch.Tensor, target: torch.Tensor) -> Callable[[], object]:
    """A pipeline of one layer per stage: this rank's stages (one, or two laid out in
    a loop or a V), the drawn schedule over ``draw.micro`` microbatches, its own
    optimizer."""
    layout = _TWO_STAGES_PER_RANK.get(draw.schedule)
    mine = ([rank] if layout is None else [rank, rank + world] if layout == "loop"
            else [rank, 2 * world - 1 - rank])
    device = torch.device("cpu")
    # (shapes given: a stage infers them by running its layer on meta tensors, which
    # a program's data-dependent sizes, ``.tolist()``, refuse)
    shape = torch.empty(draw.batch // draw.micro, draw.d)
    stages = [pp.PipelineStage(layers[i], i, draw.stages, device, input_args=shape,
                               output_args=shape, input_grads=shape, output_grads=shape)
              for i in mine]
    schedule_class = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B,
                      "interleaved": pp.ScheduleInterleaved1F1B,
                      "looped_bfs": pp.ScheduleLoopedBFS,
                      "zbv": pp.ScheduleZBVZeroBubble,
                      "dualpipev": pp.ScheduleDualPipeV}[draw.schedule]

    def loss_fn(y: torch.Tensor, aim: torch.Tensor) -> torch.Tensor:
        return _loss(draw, y, aim)

    schedule = schedule_class(stages if layout else stages[0], n_microbatches=draw.micro,
                              loss_fn=loss_fn)
    params = [p for i in mine for p in layers[i].parameters()]
    opt = _optimizer(draw, params)
    first, last = 0 in mine, draw.stages - 1 in mine

    def train() -> None:
        opt.zero_grad()
        kwargs: dict[str, object] = {"target": target, "losses": []} if last else {}
        if first:
            schedule.step(x, **kwargs)
        else:
            schedule.step(**kwargs)
        if draw.clip:
            _clip(params)
        opt.step()

    return train

