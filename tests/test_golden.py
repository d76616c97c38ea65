"""generated/ holds the benchmarks of examples/traces/, byte for byte (run `make regen`)."""

from __future__ import annotations

import sys

import pytest

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.backends.render import format_with_black
from mystique_gen.cli import command_line
from mystique_gen.driver import compile_trace, generate_source
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from regen import golden_pairs  # noqa: E402

PAIRS = golden_pairs()


def test_examples_exist():
    assert PAIRS, "examples/traces/ holds no example trace"


@pytest.mark.parametrize("trace,out", PAIRS)
def test_generated_is_up_to_date(trace, out):
    options = GenerateOptions(command_line=command_line([trace, "-o", out]))
    fresh = generate_source(compile_trace(ROOT / trace), options)
    assert fresh == (ROOT / out).read_text(), "generated/ is stale: run `make regen`"


@pytest.mark.parametrize("trace,out", PAIRS)
def test_generated_is_black_clean(trace, out):
    text = (ROOT / out).read_text()
    assert format_with_black(text) == text
