"""Pairs of small models that differ by one change a reviewer cares about, for the
stable-names tests (tests/test_stable_names.py) and the `diffs` bench section."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from pathlib import Path

import torch

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.driver import generate
from mystique_gen.tools.capture import capture

Step = Callable[[], None]


def mlp(widths: tuple[int, ...] = (32, 128, 10), batch: int = 16, optimizer: str = "sgd",
        extra: bool = False) -> Step:
    """An MLP trained one step; ``extra`` inserts Linear(128, 128) + GELU after the
    first hidden layer."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for k, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
        layers.append(torch.nn.Linear(a, b))
        if k < len(widths) - 2:
            layers.append(torch.nn.GELU())
            if extra and k == 0:
                layers += [torch.nn.Linear(b, b), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    opt: torch.optim.Optimizer = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                                  if optimizer == "sgd" else
                                  torch.optim.AdamW(model.parameters(), lr=1e-3))
    x, y = torch.randn(batch, widths[0]), torch.randint(0, widths[-1], (batch,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


PAIRS: dict[str, tuple[Callable[[], Step], Callable[[], Step]]] = {
    "insert one layer": (mlp, lambda: mlp(extra=True)),
    "widen one layer": (mlp, lambda: mlp((32, 256, 10))),
    "batch size": (mlp, lambda: mlp(batch=32)),
    "sgd -> adamw": (mlp, lambda: mlp(optimizer="adamw")),
    "same model twice": (mlp, mlp),
}


def benchmark_of(make: Callable[[], Step], work: Path, name: str) -> str:
    """Capture one step of ``make()``'s model (ET only) and generate its benchmark."""
    result = capture(make(), work, name=name, warmup=1, timing_iters=1, kineto=False)
    out = work / f"{name}.py"
    return generate(result.et_path, out, GenerateOptions(command_line="mystique-gen"))


def changed_lines(old: str, new: str) -> tuple[list[str], list[str]]:
    """(removed, added) lines of a unified diff."""
    diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0))
    removed = [d[1:] for d in diff if d.startswith("-") and not d.startswith("---")]
    added = [d[1:] for d in diff if d.startswith("+") and not d.startswith("+++")]
    return removed, added


IDENTITY = re.compile(r'^\s*"(name|sha256|schema|nodes)": ')  # the TRACE dict's fields


def code_changes(old: str, new: str) -> tuple[list[str], list[str]]:
    """(removed, added) lines outside the module docstring and the TRACE dict's
    identity fields: what a reviewer reads as a change to the workload's code."""
    def code(text: str) -> str:
        body = text.split('"""', 2)[2] if text.startswith('"""') else text
        return "\n".join(line for line in body.splitlines() if not IDENTITY.match(line))
    return changed_lines(code(old), code(new))


def masked(lines: list[str]) -> list[str]:
    """Lines with every number replaced: equal when only shapes and sizes changed."""
    return sorted(re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", line) for line in lines)
