from __future__ import annotations

from mystique_gen.backends.names import RESERVED, Namespace


def test_numbered_names_follow_first_appearance_and_are_stable():
    ns = Namespace()
    assert [ns.numbered(k, "t") for k in ("a", "b", "a", "c")] == ["t0", "t1", "t0", "t2"]


def test_readable_names_are_identifiers_and_unique():
    ns = Namespace()
    a = ns.readable("k1", "aten_add__Tensor")
    b = ns.readable("k2", "aten_add__Tensor")
    c = ns.readable("k3", "3d::weird-name")
    assert a == "aten_add__Tensor" and b == "aten_add__Tensor_2"
    assert c.isidentifier()


def test_reserved_and_builtin_names_are_never_produced():
    ns = Namespace()
    for reserved in RESERVED:
        assert ns.readable(("r", reserved), reserved) != reserved
    assert ns.readable("len", "len") != "len"
    assert ns.readable("class", "class") != "class"
