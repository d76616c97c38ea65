"""Real models built from torch's own modules, for capturing traces at test time."""

from __future__ import annotations

from collections.abc import Callable

import torch


def mlp_sgd() -> Callable[[], None]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def cnn_batchnorm() -> Callable[[], None]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(16, 5),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 5, (4,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def transformer_adamw() -> Callable[[], None]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                             dropout=0.0, batch_first=True)
    head = torch.nn.Linear(32, 32)
    params = list(layer.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    x = torch.randn(2, 8, 32)

    def step() -> None:
        opt.zero_grad()
        head(layer(x)).pow(2).mean().backward()
        opt.step()

    return step


def embedding_bag() -> Callable[[], None]:
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(1000, 16, mode="sum")
    emb = torch.nn.Embedding(500, 16)
    top = torch.nn.Linear(32, 1)
    opt = torch.optim.Adagrad(list(bag.parameters()) + list(emb.parameters())
                              + list(top.parameters()), lr=0.1)
    indices = torch.randint(0, 1000, (40,))
    offsets = torch.tensor([0, 7, 15, 22, 30, 35, 38, 39])
    ids = torch.randint(0, 500, (8,))
    y = torch.rand(8, 1)

    def step() -> None:
        opt.zero_grad()
        z = torch.cat([bag(indices, offsets), emb(ids)], dim=1)
        torch.nn.functional.binary_cross_entropy_with_logits(top(z), y).backward()
        opt.step()

    return step


MODELS: dict[str, Callable[[], Callable[[], None]]] = {
    "mlp_sgd": mlp_sgd,
    "cnn_batchnorm": cnn_batchnorm,
    "transformer_adamw": transformer_adamw,
    "embedding_bag": embedding_bag,
}
