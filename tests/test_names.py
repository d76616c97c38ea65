from __future__ import annotations

from mystique_gen.backends.names import RESERVED, Namespace, input_hint, op_hint


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


def test_claimed_names_are_free_again_after_release():
    ns = Namespace()
    assert ns.claim("a", "relu") == "relu"
    assert ns.claim("b", "relu") == "relu_1"
    ns.release("a")
    assert ns.claim("c", "relu") == "relu"  # the lowest free one
    assert ns.claim("d", "sum") == "sum_"  # never a builtin


def test_harness_names_are_reserved():
    ns = Namespace(frozenset({"_fill", "profile"}))
    assert ns.claim("k", "profile") == "profile_1"


def test_names_say_what_a_value_is():
    assert input_hint("aten::linear", "weight") == "linear_w"
    assert input_hint("aten::embedding", "weight") == "embedding_w"
    assert input_hint("aten::mm", "self") == "mm_x"
    assert input_hint("aten::_fused_adam_", "exp_avgs") == "exp_avgs"
    assert op_hint("aten::_foreach_add_") == "foreach_add"
    assert op_hint("aten::max.dim") == "max_"
