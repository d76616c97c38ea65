"""Property tests: no trace, however hostile, crashes the generator or becomes code.

* any JSON document gives either a clean MystiqueError or a file that parses and
  passes the safety check (every call goes to torch, torch.ops or the harness);
* so does a valid trace with any one field replaced by any JSON value, or with
  random text as an operator name, schema, string argument or scope;
* the emitter's literals never let trace text escape, and the layout engine agrees
  with black on random call and list trees.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import warnings
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mystique_gen.backends import exprs
from mystique_gen.backends.check import UnsafeCodeError, check_source
from mystique_gen.backends.layout import Atom, Group, Keyword, Node, lay_out
from mystique_gen.backends.render import format_with_black
from mystique_gen.backends.single import reference_facts
from mystique_gen.driver import build_program, generate_source
from mystique_gen.errors import MystiqueError
from mystique_gen.sources.et import load_trace
from tests.tracebuilder import ADD_, EMBEDDING, MM, RELU, TraceBuilder

# Kept small for `make test`; MYSTIQUE_FUZZ_EXAMPLES=2000 fuzzes deeper.
EXAMPLES = int(os.environ.get("MYSTIQUE_FUZZ_EXAMPLES", "60"))
SETTINGS = settings(deadline=None, max_examples=EXAMPLES,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

# Every character, surrogates and line separators included.
ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=40)
HOSTILE_TEXT = st.one_of(ANY_TEXT, st.sampled_from([
    '"""', "'''", "\\", "\n", "\r", "\u2028", "\x00", "\ud800", "#", "import os",
    '"); import os; os.system("x', "__import__('os')", "aten::mm\n", "a::b.c", "é",
]), st.lists(st.sampled_from(['"', "'", "\\", "\n", "(", ")", "::", ".", "os", "x"]),
             max_size=12).map("".join))

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | HOSTILE_TEXT,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["nodes", "id", "name", "ctrl_deps", "inputs",
                                       "outputs", "attrs", "values", "shapes", "types",
                                       "strides", "schema", "value", "op_schema"]) | ANY_TEXT,
                      children, max_size=5),
    max_leaves=25,
)


def base_doc() -> dict[str, Any]:
    b = TraceBuilder()
    step = b.annotation("ProfilerStep#1")
    w = b.tensor((10, 4))
    idx = b.tensor((3,), dtype="int64")
    e = b.tensor((3, 4))
    b.op(EMBEDDING, [w, idx, -1, False, False], [e], parent=step)
    m = b.tensor((4, 2))
    o = b.tensor((3, 2))
    b.op(MM, [e, m], [o], parent=step)
    r = b.tensor((3, 2))
    b.op(RELU, [o], [r], parent=step)
    b.op(ADD_, [r, o, 2.5], [r], parent=step)
    return b.doc()


BASE = base_doc()


def compile_or_refuse(path: Path) -> str | None:
    """The generated text, or None for a clean refusal. Anything else fails the test:
    a traceback, or the safety check catching unsafe output (a generator bug)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown schema versions: warned, not refused
        try:
            text = generate_source(build_program(load_trace(path)))
        except UnsafeCodeError:
            raise
        except MystiqueError as exc:
            assert not str(exc).startswith("internal error"), exc
            assert "\n" not in str(exc)  # one line on the terminal
            return None
    ast.parse(text)
    # render checked it already; checked again as the property
    check_source(text, reference_facts())
    return text


@SETTINGS
@given(doc=JSON)
def test_any_json_document_is_refused_cleanly_or_safe(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("fuzz") / "t.json"
    path.write_text(json.dumps(doc))
    compile_or_refuse(path)


@SETTINGS
@given(data=st.data())
def test_any_field_replaced_is_refused_cleanly_or_safe(tmp_path_factory, data):
    """Walk into the valid base trace along a random path; replace what is there."""
    doc = copy.deepcopy(BASE)
    target: Any = doc
    while True:
        keys = list(target) if isinstance(target, dict) else list(range(len(target)))
        assume(keys)
        key = data.draw(st.sampled_from(keys))
        child = target[key]
        if not isinstance(child, (dict, list)) or not child or data.draw(st.booleans()):
            target[key] = data.draw(JSON)
            break
        target = child
    path = tmp_path_factory.mktemp("fuzz") / "t.json"
    path.write_text(json.dumps(doc))
    compile_or_refuse(path)


@SETTINGS
@given(name=HOSTILE_TEXT, schema_tail=st.sampled_from(
    ["(Tensor self, Tensor mat2) -> Tensor", "", "(", "(Tensor self) -> Tensor"]),
    arg=HOSTILE_TEXT, scope=HOSTILE_TEXT, device=HOSTILE_TEXT)
def test_hostile_text_in_every_text_field(tmp_path_factory, name, schema_tail, arg, scope,
                                          device):
    b = TraceBuilder()
    parent = b.annotation(scope)
    x = b.tensor((3,), device="cpu")
    y = b.tensor((3,))
    b.op(name + schema_tail, [x, x], [y], parent=parent, name=name)
    z = b.tensor((3,))
    b.op("aten::div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor",
         [x, x, arg], [z], parent=parent)
    doc = b.doc()
    doc["nodes"][0]["inputs"]["values"][0][5] = device  # the last op's first tensor
    path = tmp_path_factory.mktemp("fuzz") / "t.json"
    path.write_text(json.dumps(doc))
    compile_or_refuse(path)


# -- emitter literals ---------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(ANY_TEXT)
def test_str_literal_is_one_safe_literal(text):
    literal = exprs.str_literal(text)
    assert "\n" not in literal and "\r" not in literal
    tree = ast.parse(f"x = {literal}\n")
    (stmt,) = tree.body
    assert isinstance(stmt.value, ast.Constant) and stmt.value.value == text


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT, st.integers(min_value=8, max_value=120))
def test_comment_stays_a_comment(text, limit):
    line = exprs.comment(text, limit)
    assert line.startswith("# ") and line.isascii() and len(line.splitlines()) == 1
    assert len(line) <= limit + 2
    tree = ast.parse(f"def f():\n    {line}\n    return 1\n")
    assert len(tree.body[0].body) == 1


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT, st.integers(min_value=8, max_value=200))
def test_docstring_line_stays_in_the_docstring(text, limit):
    line = exprs.docstring_line(text, limit)
    assert line.isascii() and "\n" not in line and len(line) <= limit
    source = f'"""Title\n{line}\n"""\n'
    (stmt,) = ast.parse(source).body
    assert stmt.value.value == f"Title\n{line}\n"  # nothing escaped or interpreted


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), ANY_TEXT))
def test_scalar_literal_round_trips(value):
    literal = exprs.scalar_literal(value)
    names: dict[str, Any] = {}
    exec(compile(f"x = {literal}\n", "<literal>", "exec"), {"__builtins__": {"float": float}},
         names)  # only float() is reachable: the literal can call nothing else
    evaluated = names["x"]
    if isinstance(value, float) and value != value:
        assert evaluated != evaluated
    else:
        assert evaluated == value and type(evaluated) is type(value)


# -- layout agrees with black -----------------------------------------------------------------

IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,14}", fullmatch=True).filter(
    lambda s: s not in {"if", "in", "is", "or", "as", "and", "not", "for", "def", "del", "try",
                        "else", "elif", "from", "with", "pass", "None", "True", "False",
                        "while", "class", "break", "raise", "async", "await", "yield",
                        "lambda", "global", "return", "import", "assert", "except",
                        "finally", "continue", "nonlocal"})
ATOM = st.one_of(
    IDENT.map(Atom),
    st.integers(min_value=-(10**12), max_value=10**12).map(lambda i: Atom(repr(i))),
    st.text(alphabet="abc xyz_'\"", max_size=20).map(lambda s: Atom(exprs.str_literal(s))),
    st.floats(allow_nan=False).map(lambda f: Atom(exprs.float_literal(f))),
)


def _tree(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    calls = st.builds(
        lambda head, args, kwargs: Group(head + "(", tuple(args) + tuple(
            Keyword(k, v) for k, v in kwargs), ")"),
        st.one_of(IDENT, st.builds(lambda a, b: f"{a}.{b}", IDENT, IDENT)),
        st.lists(children, max_size=6),
        st.lists(st.tuples(IDENT, children), max_size=2, unique_by=lambda kv: kv[0]),
    )
    lists = st.lists(children, max_size=8).map(lambda items: Group("[", tuple(items), "]",
                                                                   literal=True))
    return calls | lists


STATEMENT_CALL = _tree(st.recursive(ATOM, _tree, max_leaves=30))  # a call or a list


LONG_TARGETS = [  # a multi-output op's results (a fused kernel's backward, batch norm's)
    "scaled_dot_product_flash_attention_for_cpu_backward_32_1 = ",
    "native_layer_norm, native_layer_norm_32, native_layer_norm_32_1 = ",
    "_, mkldnn_rnn_layer_backward, mkldnn_rnn_layer_backward_1, "
    "mkldnn_rnn_layer_backward_2, mkldnn_rnn_layer_backward_3, _, _ = ",
]


@settings(max_examples=2 * EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node=STATEMENT_CALL,
       prefix=st.sampled_from(["", "t0 = ", "t0, _, t12 = ", "return ", *LONG_TARGETS]),
       depth=st.integers(min_value=0, max_value=2))
def test_lay_out_equals_black(node, prefix, depth):
    lines = lay_out(prefix, node, depth)
    header = ["def f():", "    with g():"][:depth]
    text = "\n".join(header + lines) + "\n"
    if prefix == "return " and depth == 0:
        text = "\n".join(lay_out(prefix, node, 1)).join(["def f():\n", "\n"])
    assert format_with_black(text) == text
