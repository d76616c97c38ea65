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

from mystique_gen.emit.context import BenchmarkContext
from mystique_gen.emit.exprs import HARNESS_SCOPE, str_literal
from mystique_gen.errors import MystiqueError

TEMPLATE = "benchmark.py.j2"
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
    text = environment().get_template(TEMPLATE).render(harness_scope=HARNESS_SCOPE,
                                                       **vars(context))
    check_syntax(text)
    return text


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
