"""The op-family registry: every family merges into the passes' tables, none twice."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

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
