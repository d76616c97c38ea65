"""Autograd: replay each op in the grad mode, and with the inputs, the original had.

In a training step the forward ops record an autograd graph (the trace marks them
with a ``seq_id``), while backward and optimizer ops run without. Recording costs
host time per op and changes some kernels (``max_pool2d`` also computes indices,
``embedding_bag`` leaves its forward-only path), so a replay that ran everything
without autograd would be faster than the original. This pass:

* marks as parameters the materialised floating storages that ops which created an
  autograd node read, and that no op in grad mode writes (their views become leaves
  that require grad), but not Python numbers the op wrapped (``0.5 * x``): marked,
  each made autograd save the tensor it scaled, a GPT-2 training step held 13 % more
  memory at its peak. An op in grad mode that made no node read no tensor requiring
  grad: a fake-quantize observer's buffers, marked, made the replay's scale require
  grad, which its kernel refuses;
* follows, statically, which values require grad (parameters, and the floating results
  of ops recorded with grad that read such values);
* gives each op a grad mode: on where the original recorded a node; off where it did
  not but reads a value that requires grad (backward, optimizer); otherwise
  unconstrained. A trace whose seq_ids show no autograd ran without it (inference
  under ``no_grad``): every op replays with grad off. Without seq_ids nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable

from mystique_gen import oprules
from mystique_gen.ir import (
    Binding,
    DerivedView,
    InputView,
    Literal,
    Op,
    OpOutput,
    iter_tensors,
)
from mystique_gen.ir.dtypes import FLOATING
from mystique_gen.passes.numbers import scalar_beside
from mystique_gen.passes.tensors import output_paths


def dual_levels(ops: list[Op]) -> int:
    """How many forward-AD levels an iteration keeps live: one past the highest level
    an op names (oprules.FORWARD_AD_LEVELS; the trace records no level's entry)."""
    levels = [-1]
    for op in ops:
        arg_name = oprules.FORWARD_AD_LEVELS.get(op.name)
        for arg in op.args if arg_name else ():
            value = arg.value
            if (arg.spec.name == arg_name and isinstance(value, Literal)
                    and type(value.value) is int and value.value >= 0):
                levels.append(value.value)
    return max(levels) + 1


def plan_autograd(ops: list[Op]) -> None:
    _mark_revealed(ops)
    if all(op.records_grad is None for op in ops):
        return  # the trace recorded no seq_ids: nothing is known about autograd
    if not any(op.records_grad for op in ops):
        for op in ops:
            op.grad_mode = False
        return
    _mark_parameters(ops)
    requiring: set[int] = set()  # id() of bindings whose value requires grad

    def requires(binding: Binding | None) -> bool:
        if isinstance(binding, InputView):
            return binding.storage.requires_grad
        return binding is not None and id(binding) in requiring

    for op in ops:
        for view in op.derive_before:
            if requires(view.base):
                requiring.add(id(view))
        reads = any(requires(tv.binding) for arg in op.args for tv in iter_tensors(arg.value))
        if op.records_grad:
            op.grad_mode = True
        elif reads:
            op.grad_mode = False
        # A view of a tensor that requires grad requires grad in any grad mode (DTensor's
        # from_local views its input under no_grad): taken as not, the backward ops that
        # read it replayed in grad mode, built a graph, and the gradient they accumulated
        # into required grad, which gloo's reduce-scatter then refused to write.
        if not (op.grad_mode and reads
                or op.signature.is_view and _aliased_requires(op, requires)):
            continue
        for _path, tv in output_paths(op.outputs):
            if tv.meta.dtype in FLOATING and isinstance(tv.binding, (OpOutput, DerivedView)):
                requiring.add(id(tv.binding))


def _aliased_requires(op: Op, requires: Callable[[Binding | None], bool]) -> bool:
    """Whether the tensor a view op aliases (its first argument) requires grad; a
    ``detach`` (oprules.DISTINCT_ALIASES) aliases it without its autograd history."""
    return (op.name not in oprules.DISTINCT_ALIASES and bool(op.args)
            and any(requires(tv.binding) for tv in iter_tensors(op.args[0].value)))


def _mark_revealed(ops: list[Op]) -> None:
    """Arguments a recorded child shows required grad (an inference step of a model's
    own parameters, under no_grad) become leaves that require grad, so the op takes
    the kernel it took (``embedding_bag``: ``_embedding_bag``, not the forward-only
    one); in grad mode off they record nothing."""
    for op in ops:
        for arg in op.args:
            if arg.spec.name not in op.requires_grad_args:
                continue
            for tv in iter_tensors(arg.value):
                s = tv.storage
                if s is not None and s.materialised and s.dtype in FLOATING:
                    s.requires_grad = True


def _mark_parameters(ops: list[Op]) -> None:
    read, written = set(), set()
    for op in ops:
        if op.name in oprules.UNINITIALISED_OUTPUTS:
            # A tensor built from Python data (passes/tensors.py undefined_reads) is
            # materialised, but a constant of the step, never a parameter.
            written.update(tv.storage.index for _p, tv in output_paths(op.outputs)
                           if tv.storage is not None)
        if not op.records_grad:
            continue
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                s = tv.storage
                if s is None or not s.materialised or s.dtype not in FLOATING:
                    continue
                if arg.spec.writes or not oprules.differentiable(op.name, arg.spec.name) \
                        or scalar_beside(tv, op):
                    written.add(s.index)  # never a parameter
                elif op.made_grad_node is not False:
                    read.add(s.index)
    parameters = read - written
    updated = _updated_after_forward(ops)
    if parameters & updated:
        # The step updates its parameters (an optimizer): what it reads in grad mode and
        # never updates is data (a batch, a float attention mask), which did not
        # require grad. Marked, it changes kernels: max_pool1d computes indices, and
        # attention with a mask that requires grad leaves the flash kernel for math.
        parameters &= updated
    for op in ops:
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                s = tv.storage
                if s is not None and s.index in parameters:
                    s.requires_grad = True


def _updated_after_forward(ops: list[Op]) -> set[int]:
    """Storages written in place, without grad, after the last op in grad mode (an
    optimizer's update of the parameters)."""
    last = max((k for k, op in enumerate(ops) if op.records_grad), default=len(ops))
    updated: set[int] = set()
    for op in ops[last + 1:]:
        if op.records_grad:
            continue
        for arg in op.args:
            if not arg.spec.writes:
                continue
            for tv in iter_tensors(arg.value):
                if tv.storage is not None and tv.storage.materialised:
                    updated.add(tv.storage.index)
    return updated
