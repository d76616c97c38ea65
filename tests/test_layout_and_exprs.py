"""Emitter functions and the black-stable layout engine."""

from __future__ import annotations

import ast

import pytest

from mystique_gen.backends import exprs
from mystique_gen.backends.comms import group_row
from mystique_gen.backends.layout import Atom, Group, flat, lay_out
from mystique_gen.backends.render import format_with_black
from mystique_gen.ir.dist import ProcessGroupSpec


def _black_stable(lines: list[str]) -> None:
    text = "def f():\n" + "\n".join(lines) + "\n"
    assert format_with_black(text) == text


@pytest.mark.parametrize("n_args", [1, 3, 12, 40])
@pytest.mark.parametrize("prefix", ["", "t1 = ", "t1, _, t3 = "])
def test_call_layouts_match_black(n_args, prefix):
    args = [Atom(f"x{i}") for i in range(n_args)]
    _black_stable(lay_out(prefix, exprs.call("aten_some_long_operator_name", args), 1))


def test_list_argument_is_exploded_like_black():
    tensors = exprs.list_display([Atom(f"t{i}") for i in range(30)])
    alpha = exprs.keyword("alpha", Atom("0.5"))
    call = exprs.call("aten__foreach_add__List", [tensors, tensors, alpha])
    lines = lay_out("", call, 1)
    assert len(lines) > 30
    _black_stable(lines)


def test_single_long_argument_splits_recursively():
    values = [Atom(f"value_{i}") for i in range(12)]
    inner = exprs.call("torch.ops.aten.some_operator.default", values)
    _black_stable(lay_out("result = ", exprs.call("_guarded", [inner]), 1))


_NO_ARGUMENTS = exprs.call("torch.ops.some_namespace." + "an_operator_" * 6 + "x", [])
_EMPTY_LIST = Group("[", (), "]", literal=True)


@pytest.mark.parametrize(("prefix", "value"), [
    ("scaled_dot_product_flash_attention_for_cpu_backward_32_1 = ", _NO_ARGUMENTS),
    ("t" * 90 + " = ", _NO_ARGUMENTS),  # too long for `t = (` too: wrapped all the same
    ("t" * 90 + " = ", _EMPTY_LIST),
    ("native_layer_norm, native_layer_norm_32, native_layer_norm_32_1 = ", _NO_ARGUMENTS),
    ("native_layer_norm, native_layer_norm_32, native_layer_norm_32_1_of_a_layer_12345 = ",
     _EMPTY_LIST),
    ("_, mkldnn_rnn_layer_backward, mkldnn_rnn_layer_backward_1, "  # the targets one
     "mkldnn_rnn_layer_backward_2, _, _ = ", _NO_ARGUMENTS),  # per line instead
    ("return ", _NO_ARGUMENTS),
    ("", _NO_ARGUMENTS),  # an expression statement: black adds no parentheses
])
def test_a_too_long_value_in_empty_brackets_is_laid_out_as_black_lays_it(prefix, value):
    """Black cannot split inside `f()` or `[]`, so it wraps an assignment's or a
    return's value in parentheses instead, even where a line then stays too long (the
    fuzz test found `lay_out` leaving such a line whole, a file black would change)."""
    assert len("    " + prefix + flat(value)) > 88  # what the case is about
    _black_stable(lay_out(prefix, value, 1))


def test_short_statement_stays_on_one_line():
    assert lay_out("t0 = ", exprs.call("aten_mm", [Atom("x0"), Atom("x1")]), 1) == [
        "    t0 = aten_mm(x0, x1)"
    ]


@pytest.mark.parametrize("text", ["plain", "it's", 'say "hi"', "both ' and \"", "tab\tnew\nline",
                                  "unicode é ✓", "back\\slash", 'a\\"b', "x'y'\""])
def test_str_literal_round_trips_and_is_black_normalised(text):
    literal = exprs.str_literal(text)
    assert ast.literal_eval(literal) == text
    stmt = f"x = {literal}\n"
    assert format_with_black(stmt) == stmt


@pytest.mark.parametrize("value,expected", [
    (1e-05, "1e-05"), (1e20, "1e20"), (0.1, "0.1"), (float("inf"), 'float("inf")'),
    (float("-inf"), '-float("inf")'), (float("nan"), 'float("nan")'), (-2.5, "-2.5"),
])
def test_float_literal(value, expected):
    assert exprs.float_literal(value) == expected


@pytest.mark.parametrize("value", [1 + 0j, 0.5 - 2j, -1.5 + 0.25j, complex(0.0, -0.0),
                                   complex(float("inf"), 1.0)])
def test_complex_literal_evaluates_to_its_value_and_is_black_stable(value):
    literal = exprs.scalar_literal(value)
    stmt = f"y = torch.mul(x, {literal})\n"  # an argument, as the file passes it
    assert format_with_black(stmt) == stmt
    got = eval(literal, {"float": float})  # noqa: S307 - our own literal
    assert isinstance(got, complex) and got == value


def test_scalar_literal_rejects_non_scalars():
    with pytest.raises(TypeError):
        exprs.scalar_literal([1])


@pytest.mark.parametrize("text", ["ok\nimport os", "a\r\nb", 'x"""y', "x\\"])
def test_comment_and_docstring_text_cannot_escape(text):
    comment = exprs.comment(text)
    assert "\n" not in comment and "\r" not in comment and comment.startswith("# ")
    doc = exprs.docstring_line(text)
    assert '"""' not in doc and "\n" not in doc and "\\" not in doc


def test_torch_attr_rejects_non_identifiers():
    assert exprs.torch_attr("float32") == "torch.float32"
    with pytest.raises(ValueError):
        exprs.torch_attr("float32; import os")


@pytest.mark.parametrize("values", [(3, 0), (7,), ()])
def test_int_tuple_is_the_tuple_it_reads_as(values):
    text = exprs.int_tuple(values).text
    assert ast.literal_eval(text) == tuple(values)
    assert format_with_black(f"x = {text}\n") == f"x = {text}\n"


@pytest.mark.parametrize("count", [2, 9, 40])
def test_dict_entries_holding_lists_split_as_black_splits_them(count):
    """The ORIGINAL dict's step gaps and a process group's ranks are lists whose
    length the trace decides: nine gaps of a noisy capture ran past 88 columns on one
    line, which black then split (the file was not black-stable)."""
    gaps = exprs.list_display([Atom(f"{1000.0 + 7919.3 * k:.1f}") for k in range(count)])
    entries = (exprs.dict_entry("kineto", Atom('"step.kineto.json"')),
               exprs.dict_entry("step_gaps_us", gaps))
    text = "\n".join(lay_out("ORIGINAL = ", Group("{", entries, "}", literal=True), 0)) + "\n"
    assert format_with_black(text) == text
    group = ProcessGroupSpec(index=1, name="1", desc="dp", ranks=tuple(range(0, 2 * count, 2)),
                             size=count)
    text = "\n".join(lay_out("PROCESS_GROUPS = ", exprs.list_display([group_row(group, 64)]),
                             0)) + "\n"
    assert format_with_black(text) == text


def test_a_tensor_without_history_is_its_data_or_the_harness_shallow_copy():
    """``.data`` records no op for a strided tensor; a sparse one's shallow copy does,
    so it is the harness's (``_without_history``)."""
    assert exprs.without_history("x") == "x.data"
    assert exprs.without_history("coalesce", storageless=True) == "_without_history(coalesce)"
