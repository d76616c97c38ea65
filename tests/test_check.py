"""The safety check of generated files (mystique_gen/backends/check.py)."""

from __future__ import annotations

import pytest

from mystique_gen.backends import check
from mystique_gen.backends.check import UnsafeCodeError, check_source
from mystique_gen.backends.single import reference_facts
from tests.conftest import ROOT

GOLDEN = (ROOT / "generated" / "mlp_sgd.py").read_text()


def inject(statement: str, where: str = "def replay(inputs, device, host):") -> str:
    """The golden file with one statement added as the first line of a function body."""
    head, rest = GOLDEN.split(where, 1)
    doc_end = rest.index('"""', rest.index('"""') + 3) + 3
    return head + where + rest[:doc_end] + f"\n    {statement}" + rest[doc_end:]


def test_golden_file_passes():
    check_source(GOLDEN, reference_facts())


def test_harness_names_come_from_the_template():
    facts = reference_facts()
    assert {"replay", "make_inputs", "main", "_op", "_fill", "_guarded"} <= facts.defs
    assert "torch" in facts.imports and not facts.handles


@pytest.mark.parametrize("statement", [
    'os.system("echo pwned")',
    '__import__("os").system("x")',
    'eval("1")',
    'exec("x = 1")',
    'getattr(torch, "load")("x")',
    "(lambda: 1)()",
    "torch.__class__.__init__()",
    "torch.ops.__dict__.clear()",
    "torch.ops.aten.__class__.mro()",
    "torch.ops.aten.__dict__.clear()",
    "torch.ops.aten.__and__.Tensor.__call__()",
    'torch.load("weights.pt")',
    'torch.hub.load("repo", "model")',
    'torch.ops.load_library("evil.so")',
    'torch.utils.cpp_extension.load_inline("x", "")',
    "torch._C._set_grad_enabled(True)",
    'torch.jit.load("m.pt")',
    'float("1e309")',
    "sys.modules.clear()",
    "inputs.__class__()",
    "inputs.__reduce__()",
])
def test_calls_outside_torch_and_the_harness_are_refused(statement):
    with pytest.raises(UnsafeCodeError, match="neither torch nor the harness"):
        check_source(inject(statement), reference_facts())


@pytest.mark.parametrize("statement", ["import subprocess", "from os import system",
                                       "import torch.distributed as os"])
def test_imports_the_template_does_not_make_are_refused(statement):
    with pytest.raises(UnsafeCodeError, match="imports"):
        check_source(inject(statement), reference_facts())


@pytest.mark.parametrize("statement", [
    "torch.ops.aten.__and__.Tensor(x0, x0)",  # a real dunder-named operator
    "x0.as_strided([2], [1], 0)",
    'float("-inf")',
    "torch.randn(3)",
    "_fill(3, torch.float32, device, 'uniform', 0, 1, None)",
])
def test_torch_tensor_methods_and_harness_calls_pass(statement):
    check_source(inject(statement), reference_facts())


def test_operator_handles_must_resolve_to_torch_ops():
    ok = GOLDEN.replace("\n\n# Operators,", '\nh = _op(lambda: torch.ops.aten.mm.default, "x")\n'
                        "\n# Operators,", 1)
    check_source(ok, reference_facts())
    bad = GOLDEN.replace("\n\n# Operators,", '\nh = _op(lambda: os.system, "x")\n'
                         "\n# Operators,", 1)
    check_source(bad, reference_facts())  # binding it is harmless; calling it is not
    with pytest.raises(UnsafeCodeError, match="'h'"):
        check_source(inject_call(bad, "h('echo pwned')"), reference_facts())
    check_source(inject_call(ok, "h(1, 2)"), reference_facts())


def inject_call(text: str, statement: str) -> str:
    """``statement`` added as the last statement of replay()."""
    head, tail = text.split("def replay(", 1)
    return head + "def replay(" + tail.replace(
        "\n    return None\n", f"\n    {statement}\n    return None\n", 1)


def test_syntax_errors_anywhere_are_reported(monkeypatch):
    for piece_bytes in (check.PIECE_BYTES, 300):  # whole functions, and body pieces
        monkeypatch.setattr(check, "PIECE_BYTES", piece_bytes)
        check_source(GOLDEN, reference_facts())
        with pytest.raises(UnsafeCodeError, match="does not parse"):
            check_source(inject("t0 = aten_mm(x0,"), reference_facts())
        with pytest.raises(UnsafeCodeError, match="does not parse"):
            check_source(inject_call(GOLDEN, "x = (\n  )\n  )"), reference_facts())
        with pytest.raises(UnsafeCodeError, match="does not parse"):
            check_source(GOLDEN + '\nx = """unterminated\n', reference_facts())


def test_small_pieces_see_every_call(monkeypatch):
    """Pieces cut inside a big body still find an unsafe call at its end."""
    monkeypatch.setattr(check, "PIECE_BYTES", 200)
    with pytest.raises(UnsafeCodeError, match="line"):
        check_source(inject_call(GOLDEN, 'os.system("x")'), reference_facts())
    text = inject_call(GOLDEN, "with _harness():\n        v0 = x0.as_strided([1], [1], 0)")
    check_source(text, reference_facts())
