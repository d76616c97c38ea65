"""Render a template with a context (the backends check the text, see check.py).

Statements arrive already laid out in black's style (see :mod:`layout`), so the file
is black-stable without running black over thousands of statements; ``check_black``
runs black itself, for tests and for ``--black``.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import black
import jinja2

from mystique_gen.backends.base import BenchmarkContext
from mystique_gen.backends.exprs import str_literal
from mystique_gen.backends.harness import harness_source

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


def render_text(context: BenchmarkContext, template: str) -> str:
    """``template`` rendered with ``context``, unchecked (backends check the text)."""
    return environment().get_template(template).render(harness=harness_source(),
                                                       **vars(context))


def black_mode() -> black.Mode:
    return black.Mode(target_versions={black.TargetVersion.PY310},
                      line_length=BLACK_LINE_LENGTH)


def format_with_black(text: str) -> str:
    return black.format_str(text, mode=black_mode())
