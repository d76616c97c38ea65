"""Which of its arguments an op's autograd node saves, asked of the installed torch.

The frees pass replays an op in grad mode saving nothing (``Op.keeps_saved``) where the
original freed an input it read before the next backward: the original's node cannot
have saved that input, or the free would have waited for the node (passes/frees.py).
That holds only for an input the node would save at all: ``add`` saves none, ``cat``
none, ``tanh`` its result, ``mul`` both operands. Switching saving off and on around
every op that merely reads a value freed soon after costs the replay host time the
original never spent (a push and a pop of the saved-tensor hooks, and a Python pack
hook per tensor the nodes save meanwhile): a random inference step of 43 ops in grad
mode toggled 22 times and replayed 5 % slower for it.

So each distinct call form is *probed*, as public calls are (passes/public_calls.py,
in a forked child): the overload runs once on zeros of the recorded shapes (empty
tensors where the op is large), every floating one requiring grad (the most a node
could save), and the nodes it made (its own, or those of the ops a composite such as
``matmul`` decomposes into) show what they saved (``_saved_<name>`` on each node): an
argument is saved where a saved tensor uses its storage (itself, a view of it). An op
that cannot be probed, a collective or an op outside aten saves anything as far as the
pass knows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mystique_gen.ir import (
    ListValue,
    Literal,
    Op,
    StandInTensor,
    TensorValue,
    Value,
    iter_tensors,
)
from mystique_gen.passes.public_calls import call_form, probe_value, run_probes


def saved_arguments(ops: list[Op]) -> dict[int, frozenset[str] | None]:
    """Per op (by ``op.index``): the names of the arguments its autograd node saves,
    None where that is not known (any may be)."""
    forms: dict[tuple[object, ...], list[Op]] = {}
    out: dict[int, frozenset[str] | None] = {}
    for op in ops:
        if op.signature.namespace != "aten" or op.comm is not None or op.guard:
            out[op.index] = None  # (a collective, a custom op: never run here)
        else:
            forms.setdefault(call_form(op), []).append(op)
    keys = list(forms)
    found = run_probes([forms[key][0] for key in keys], _saved_here) if keys else []
    for key, names in zip(keys, found, strict=True):
        for op in forms[key]:
            out[op.index] = None if names is None else frozenset(names)
    return out


def _saved_here(ops: list[Op], on_start: Callable[[int], object] | None
                ) -> list[list[str] | None]:
    results: list[list[str] | None] = []
    with torch.enable_grad():
        for i, op in enumerate(ops):
            if on_start is not None:
                on_start(i)
            results.append(_saved_by(op))
    if on_start is not None:
        on_start(len(ops))
    return results


def _saved_by(op: Op) -> list[str] | None:
    """The arguments whose storage a node the op made holds for its backward."""
    sig = op.signature
    try:
        overload = getattr(getattr(getattr(torch.ops, sig.namespace), sig.name), sig.overload)
        made = _as_recorded if _small(op) else probe_value
        values = {arg.spec.name: _requiring_grad(made(arg.value)) for arg in op.args}
        args = [values[a.spec.name] for a in op.args if not a.spec.kwarg_only]
        kwargs = {a.spec.name: values[a.spec.name] for a in op.args if a.spec.kwarg_only}
        result = overload(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a kernel refusing empty arguments: not known
        return None
    owners = {
        storage: name
        for name, value in values.items()
        for storage in _storages(value)
    }
    stops = {t.grad_fn for value in values.values() for t in _tensors(value)}
    held = set()
    for node in _nodes_made(result, stops):
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                saved = getattr(node, attr)
            except Exception:  # noqa: BLE001 - a value it cannot show: not known
                return None
            held.update(owners[s] for s in _storages(saved) if s in owners)
    return sorted(held)


# An op whose tensors (arguments and results) have at most this many elements each is
# probed as recorded: tensors of zeros at their shapes, numbers as they were, where
# kernels check sizes (``unfold`` past a dimension's end raises on an empty tensor).
# Others are probed as public calls are: empty tensors, numbers zero.
SIZED_PROBE_ELEMENTS = 1 << 16


def _small(op: Op) -> bool:
    values = [arg.value for arg in op.args] + list(op.outputs)
    return all(tv.meta.numel <= SIZED_PROBE_ELEMENTS and not tv.meta.storageless
               for value in values for tv in iter_tensors(value))


def _as_recorded(value: Value) -> Any:
    """The argument at its recorded shape (zeros) and value, for a small op."""
    if isinstance(value, (TensorValue, StandInTensor)):
        return torch.zeros(value.meta.shape, dtype=getattr(torch, value.meta.dtype))
    if isinstance(value, Literal):
        return value.value
    if isinstance(value, ListValue):
        return [_as_recorded(item) for item in value.items]
    return probe_value(value)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return [value] if isinstance(value, torch.Tensor) else []


def _storages(value: Any) -> set[int]:
    """The storages ``value``'s tensors use, by identity (an empty tensor has a storage
    of its own, with no memory)."""
    return {t.untyped_storage()._cdata for t in _tensors(value)}


def _requiring_grad(value: Any) -> Any:
    """A floating tensor as a non-leaf that requires grad (an in-place op may write it),
    so that a node saves whatever it could; lists item by item; anything else as is."""
    if isinstance(value, list):
        return [_requiring_grad(v) for v in value]
    if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
        return value.requires_grad_().clone()
    return value


def _nodes_made(result: Any, stops: set[Any]) -> list[Any]:
    """The autograd nodes between the op's results and its arguments' nodes (`stops`):
    its own, or those of the ops a composite decomposes into."""
    pending = [t.grad_fn for t in _tensors(result) if t.grad_fn is not None]
    seen: set[int] = set()
    nodes = []
    while pending:
        node = pending.pop()
        if node is None or node in stops or id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        pending.extend(next_node for next_node, _ in node.next_functions)
    return nodes
