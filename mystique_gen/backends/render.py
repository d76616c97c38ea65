"""Render the benchmark file: context -> Jinja template -> syntax and safety checks.

Statements arrive already laid out in black's style (see :mod:`layout`), so the file
is black-stable without running black over thousands of statements; ``check_black``
runs black itself, for tests and for ``--black``.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from importlib import resources

import jinja2

from mystique_gen.backends.context import BenchmarkContext
from mystique_gen.backends.exprs import HARNESS_SCOPE, str_literal
from mystique_gen.errors import MystiqueError

TEMPLATE = "benchmark.py.j2"
DIST_TEMPLATE = "distributed.py.j2"  # extends TEMPLATE (torch.distributed replay)
BLACK_LINE_LENGTH = 88


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    def load(name: str) -> str:
        return resources.files("mystique_gen.templates").joinpath(name).read_text("utf-8")

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # the output is Python, and every value is pre-escaped by exprs
    )
    env.filters["pystr"] = str_literal
    return env


def render(context: BenchmarkContext) -> str:
    """The benchmark file, checked: it parses and calls only torch and the harness."""
    from mystique_gen import progress
    from mystique_gen.backends.check import check_source

    progress.phase("rendering")
    text = render_text(context)
    progress.phase("checking the output")
    check_source(text, dist_harness_facts() if context.dist is not None else None)
    return text


@lru_cache(maxsize=1)
def dist_harness_facts():
    """The safety check's reference for distributed files: their own template's harness."""
    from mystique_gen.backends.check import gather
    from mystique_gen.multirank import reference_context

    facts = gather(render_text(reference_context()))
    facts.handles.clear()
    return facts


def render_text(context: BenchmarkContext) -> str:
    """The template rendered, unchecked (the checker renders its reference with this)."""
    name = TEMPLATE if context.dist is None else DIST_TEMPLATE
    return environment().get_template(name).render(harness_scope=HARNESS_SCOPE,
                                                   **vars(context))


def check_syntax(text: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as exc:  # a generator bug, never the trace's fault
        raise MystiqueError(f"internal error: generated code does not parse: {exc}") from None


def black_mode():
    import black

    return black.Mode(target_versions={black.TargetVersion.PY310},
                      line_length=BLACK_LINE_LENGTH)


def format_with_black(text: str) -> str:
    import black

    return black.format_str(text, mode=black_mode())
