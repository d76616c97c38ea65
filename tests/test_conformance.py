"""Every real trace in ../shared/traces generates, and its benchmark runs one CPU iteration."""

from __future__ import annotations

import ast

import pytest

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.driver import generate
from tests.conftest import last_json, run_benchmark

pytestmark = pytest.mark.conformance

ALL = [
    "param/linear_et.json.gz",
    "param/resnet50_1gpu_et.json.gz",
    "param/hf_gpt2_et.json.gz",
    "param/pt2_et.json",
    "chakra/allgather_2rank_1.0.2.json.gz",
    "hta/simple_add_et.json.gz",
    *[f"param/dlrm_8rank/dlrm_eg_{r}.json.gz" for r in range(8)],
]
# Every trace runs one CPU iteration (issue 2's bar). GPT-2 is the heaviest: about
# 1.5 minutes and 14 GB on a 2-core, 24 GB machine.
RUNNABLE = ALL


@pytest.mark.parametrize("name", ALL)
def test_generates(name, shared_traces, tmp_path):
    out = tmp_path / "bench.py"
    text = generate(shared_traces / name, out, GenerateOptions(command_line="test"))
    ast.parse(text)
    assert out.read_text() == text


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNABLE)
def test_runs_one_cpu_iteration(name, shared_traces, tmp_path):
    out = tmp_path / "bench.py"
    generate(shared_traces / name, out, GenerateOptions(command_line="test"))
    proc = run_benchmark(out, "--device", "cpu", "--warmup", "0", "--iters", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["iters"] == 1
    assert result["device"] == "cpu"
