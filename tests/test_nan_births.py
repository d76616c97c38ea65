"""The NaN-birth check of `make bench`'s features section (scripts/nan_births.py): an
inference step's NaN activations reach no input the replay writes, so only this check
sees them (diffusers' DDIM step)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from nan_births import NanBirths  # noqa: E402


def test_an_op_that_computes_nan_from_finite_tensors_is_a_birth():
    a = torch.tensor([0.9, 0.5])
    with NanBirths() as mode:
        ratio = 1 - a[0] / a[1]  # a falling schedule read the wrong way round
        ratio ** 0.5
        ratio ** 0.5
    assert mode.births == ["aten.pow.Tensor_Scalar"]


def test_nan_carried_written_or_uninitialised_is_no_birth():
    with NanBirths() as mode:
        carried = torch.tensor([float("nan"), 1.0]).exp()  # its input held NaN
        written = torch.full((2,), float("nan"))  # a constant the program wrote
        torch.empty(4).fill_(float("nan"))  # filled uninitialised memory
        torch.where(torch.isnan(carried), torch.zeros(2), carried).sqrt()
    assert mode.births == [] and written.isnan().all()
