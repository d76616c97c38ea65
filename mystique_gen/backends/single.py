"""The single-process backend: one Program, one benchmark file (benchmark.py.j2)."""

from __future__ import annotations

from functools import lru_cache

from mystique_gen.backends.base import BenchmarkContext, CodeGen, GenerateOptions
from mystique_gen.backends.check import Facts, check_source, gather
from mystique_gen.backends.render import render_text
from mystique_gen.ir import Program

TEMPLATE = "benchmark.py.j2"


def build_context(program: Program, options: GenerateOptions | None = None) -> BenchmarkContext:
    return CodeGen(program, options or GenerateOptions()).build()


def render(programs: list[Program], ranks: list[int], options: GenerateOptions,
           rank_source: str = "") -> str:
    """The benchmark file of ``programs[0]``, checked: it parses and calls only torch and
    the harness."""
    (program,) = programs
    text = render_text(build_context(program, options), TEMPLATE)
    check_source(text, reference_facts())
    return text


@lru_cache(maxsize=1)
def reference_facts() -> Facts:
    """What the harness defines, imports and calls: the template for a program of no ops."""
    facts = gather(render_text(build_context(Program.empty()), TEMPLATE, whole_harness=True))
    facts.handles.clear()
    return facts
