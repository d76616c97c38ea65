"""The op-family registry: every family merges into the passes' tables, none twice."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from mystique_gen import oprules
from mystique_gen.oprules.base import OpFamily

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
