"""The training step the feature batches (``scripts/features_*.py``) build their
workloads' steps with. ``bench_features.py`` puts this folder on ``sys.path`` where it
loads a batch."""

from __future__ import annotations

from collections.abc import Callable

import torch


def sgd_step(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor],
             opt: torch.optim.Optimizer | None = None, lr: float = 0.001
             ) -> Callable[[], None]:
    """A training step of ``model``: zero the grads, ``loss_fn()``, its backward, and a
    step of ``opt`` (else plain SGD at ``lr`` over the parameters that take grads)."""
    opt = opt or torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)

    def step() -> None:
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()

    return step
