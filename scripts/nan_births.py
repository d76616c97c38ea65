"""Where a step first computes NaN: a dispatch mode that notes each op whose result
holds NaN while none of the tensors it read does (a NaN's "birth").

`bench_features.py` runs the eager step and the replay's first iteration under it, and
fails a replay with births the eager step does not have. An inference step's NaN
activations reach no input the replay writes, so checking those alone (the
benchmark's `nonfinite_inputs`) missed them: diffusers' DDIM step replayed NaN, found
only by a probe. Ops that read no tensor (a NaN constant the program wrote) and ops
whose result is uninitialised memory are not births, nor ops given NaN as a number
(`fill_`, `masked_fill` with NaN). Imports torch only: the replay's
runner runs it where mystique_gen cannot be imported.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Results that hold whatever memory held: NaN bit patterns there are no birth.
UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "empty_strided",
                           "new_empty_strided", "set_", "resize_", "resize_as_"})


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def holds_nan(tensors: list[torch.Tensor]) -> bool:
    return any((t.is_floating_point() or t.is_complex()) and t.numel() > 0
               and bool(torch.isnan(t.detach()).any()) for t in tensors)


class NanBirths(TorchDispatchMode):
    """Collects in ``births`` each op (its overload's name, once, in order) that
    computed NaN from tensors without any."""

    def __init__(self) -> None:
        super().__init__()
        self.births: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        flat = tree_flatten((args, kwargs))[0]
        read = [a for a in flat if isinstance(a, torch.Tensor)]
        given = any(isinstance(a, (float, complex)) and a != a for a in flat)
        clean = bool(read) and not given and not holds_nan(read)
        out = func(*args, **kwargs)
        name = str(func)
        if (clean and func.overloadpacket.__name__ not in UNINITIALISED
                and name not in self.births and holds_nan(_tensors(out))):
            self.births.append(name)
        return out
