"""The op-family registry: every family merges into the passes' tables, none twice."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import fields

import pytest
import torch

from mystique_gen import oprules
from mystique_gen.oprules.base import OpFamily
from mystique_gen.oprules.derivatives import parse

QUALIFIED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*$")


def test_every_rule_names_an_op_without_overload():
    for family in oprules.FAMILIES:
        for f in fields(OpFamily):
            value = getattr(family, f.name)
            if isinstance(value, (dict, frozenset)):
                for op in value:
                    assert QUALIFIED.match(op), f"{family.name}.{f.name}: {op!r}"


def test_an_op_claimed_by_two_families_is_refused(monkeypatch):
    twice = OpFamily("again", positive_args={"aten::log": ("self",)})
    monkeypatch.setattr(oprules, "FAMILIES", (*oprules.FAMILIES, twice))
    with pytest.raises(ValueError, match="aten::log in positive_args of both"):
        oprules.merged("positive_args")


def test_the_tables_hold_every_family():
    for family in oprules.FAMILIES:
        for op, rule in family.index_rules.items():
            assert oprules.INDEX_RULES[op] is rule
        for op in family.data_dependent_outputs | family.uninitialised_outputs:
            assert op in oprules.DATA_DEPENDENT_OUTPUTS | oprules.UNINITIALISED_OUTPUTS
        for op, rule in family.comm_ops.items():
            assert oprules.COMM_OPS[op] is rule


def test_arguments_torchs_formula_table_leaves_out_are_not_differentiable():
    """derivatives.yaml gives soft_margin_loss no formula for its target: autograd
    refuses a target that requires grad, and the replay of OpInfo's training sample
    made it a parameter ("not differentiable with respect to argument 'target'")."""
    assert not oprules.differentiable("aten::soft_margin_loss", "target")
    assert oprules.differentiable("aten::soft_margin_loss", "self")
    assert oprules.differentiable("aten::mse_loss", "target")
    assert oprules.differentiable("aten::add", "other")
    table = parse(
        "- name: f.a(Tensor self, Tensor target, Tensor? w=None) -> Tensor\n"
        "  self: g(grad)\n"
        "  w: non_differentiable\n"
        "- name: f.b(Tensor self, Tensor target) -> Tensor\n"
        "  self, target: h(grad)\n"
        "- name: k(Tensor(a!) self, Tensor other) -> Tensor(a!)\n"
        "  dispatch:\n"
        "    Default:\n"
        "      self: grad\n")
    # an argument one overload differentiates stays differentiable
    assert table == {"aten::f": frozenset({"w"}), "aten::k": frozenset({"other"})}


_ROWS_VIEWS = [  # (op, its recorded arguments but self, the view in torch, keeps rows)
    ("aten::alias", {}, lambda t: t.view_as(t), True),
    ("aten::squeeze", {"dim": 2}, lambda t: t.squeeze(2), True),
    ("aten::squeeze", {"dim": [1, 2]}, lambda t: t.squeeze((1, 2)), True),
    ("aten::squeeze", {"dim": 0}, lambda t: t.squeeze(0), False),
    ("aten::squeeze", {}, lambda t: t.squeeze(), False),  # (3,) at a count of one
    ("aten::unsqueeze", {"dim": -1}, lambda t: t.unsqueeze(-1), True),
    ("aten::unsqueeze", {"dim": 0}, lambda t: t.unsqueeze(0), False),
    ("aten::select", {"dim": 1, "index": 0}, lambda t: t.select(1, 0), True),
    ("aten::select", {"dim": 0, "index": 0}, lambda t: t.select(0, 0), False),
    ("aten::slice", {"dim": 0, "start": 0, "end": 2**63 - 1, "step": 1},
     lambda t: t[0:], True),
    ("aten::slice", {"dim": 0, "start": 0, "end": 2, "step": 1}, lambda t: t[0:2], False),
    ("aten::slice", {"dim": 1, "start": 0, "end": 2, "step": 1}, lambda t: t[:, 0:2], True),
    ("aten::transpose", {"dim0": 1, "dim1": 2}, lambda t: t.transpose(1, 2), True),
    ("aten::transpose", {"dim0": 0, "dim1": 1}, lambda t: t.transpose(0, 1), False),
    ("aten::permute", {"dims": [0, 2, 1]}, lambda t: t.permute(0, 2, 1), True),
    ("aten::permute", {"dims": [1, 0, 2]}, lambda t: t.permute(1, 0, 2), False),
    ("aten::view", {"size": [2, 3]}, lambda t: t.view(2, 3), False),
]


def _rows_kept(view: Callable[[torch.Tensor], torch.Tensor], n: int,
               rest: tuple[int, ...]) -> bool:
    """Whether ``view`` of ``n`` rows (row i holding i) gives those rows in its dim 0,
    or their one index as a 0-d tensor."""
    rows = torch.arange(n).reshape(n, *[1] * len(rest)).expand(n, *rest).contiguous()
    try:
        out = view(rows)
    except RuntimeError:
        return False
    if out.dim() == 0:
        return n == 1 and out.item() == 0
    return out.shape[0] == n and all(bool((out[i] == i).all()) for i in range(n))


@pytest.mark.parametrize("name,args,view,keeps", _ROWS_VIEWS,
                         ids=[f"{c[0]}-{c[1]}" for c in _ROWS_VIEWS])
def test_views_keep_data_dependent_rows_for_any_count_as_torch_does(name, args, view,
                                                                    keeps):
    """``keeps_rows`` on a view of a (2, 3, 1) ``nonzero``-like result says what torch
    does at every row count: dim 0 holds the same rows at 1, 2 and 5 (the replay reads
    it at its own count), or at some count it does not (or fails)."""
    assert oprules.keeps_rows(name, {"self": (2, 3, 1), **args}) is keeps
    assert all(_rows_kept(view, n, (3, 1)) for n in (1, 2, 5)) is keeps


def test_squeezing_every_dim_of_one_keeps_rows_as_one_index_at_a_count_of_one():
    """``nonzero(mask_1d).squeeze()``: (n, 1) rows become (n,), or the one index 0-d."""
    assert oprules.keeps_rows("aten::squeeze", {"self": (4, 1)})
    assert all(_rows_kept(lambda t: t.squeeze(), n, (1,)) for n in (1, 2, 5))
    assert not oprules.keeps_rows("aten::squeeze", {"self": (1, 1)})  # 0-d recorded
