"""Golden benchmarks, byte for byte (run `make regen` after an intended change):
generated/ from examples/traces/, and tests/golden/ with one case per backend and
schedule (single-process, distributed, threaded, streams, Kineto host gaps, composed)."""

from __future__ import annotations

import sys

import pytest

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.backends.render import format_with_black
from mystique_gen.cli import command_line
from mystique_gen.driver import compile_trace, generate_source
from tests.conftest import ROOT, run_benchmark
from tests.golden_cases import CASES, GOLDEN, SHARED, render_case

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


def _case(name: str) -> None:
    if CASES[name].needs_shared and not SHARED.is_dir():
        pytest.skip(f"shared traces not found at {SHARED}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_case_is_up_to_date_and_black_clean(name, tmp_path):
    _case(name)
    fresh = render_case(name, tmp_path)
    golden = GOLDEN / f"{name}.py"
    assert golden.is_file(), f"{golden.name} is missing: run `make regen`"
    assert fresh == golden.read_text(), f"tests/golden/{name}.py is stale: run `make regen`"
    assert format_with_black(fresh) == fresh


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_case_runs_standalone(name):
    _case(name)
    proc = run_benchmark(GOLDEN / f"{name}.py", "--device", "cpu", "--warmup", "0",
                         "--iters", "1", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
