"""Capture the demo trace: a small MLP classifier trained with SGD (torch.nn only).

    python examples/mlp_sgd.py OUT_DIR

writes OUT_DIR/mlp_sgd.et.json, the trace shipped as examples/traces/mlp_sgd.et.json.gz.
"""

from __future__ import annotations

import sys

import torch

from mystique_gen.tools.capture import capture


def make_step(batch: int = 64, width: int = 256, classes: int = 10):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, classes),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, width)
    y = torch.randint(0, classes, (batch,))

    def step() -> None:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    return step


if __name__ == "__main__":
    torch.set_num_threads(1)
    capture(make_step(), sys.argv[1], name="mlp_sgd", kineto=False)
