"""Render a template with a context (the backends check the text, see check.py).

Statements arrive already laid out in black's style (see :mod:`layout`), so the file
is black-stable without running black over thousands of statements; ``check_black``
runs black itself, for tests and for ``--black``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from importlib import resources

import black
import jinja2

from mystique_gen.backends.base import BenchmarkContext
from mystique_gen.backends.exprs import str_literal
from mystique_gen.backends.harness import harness_source, shaken_source

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


# Where the harness goes, while the rest of the file is rendered around it.
_RUNTIME_MARK, _DIST_MARK = "#@mystique-harness-runtime@", "#@mystique-harness-dist@"


def render_text(context: BenchmarkContext, template: str, *, whole_harness: bool = False
                ) -> str:
    """``template`` rendered with ``context``, unchecked (backends check the text): the
    harness as much of it as the file uses (backends/harness.py ``shaken``), or all of
    it with ``whole_harness`` (what the safety check allows a file to call)."""
    source = harness_source()
    if whole_harness:
        return environment().get_template(template).render(harness=source, **vars(context))
    marked = replace(source, runtime=[_RUNTIME_MARK], dist=[_DIST_MARK])
    text = environment().get_template(template).render(harness=marked, **vars(context))
    kept = shaken_source(source, text, dist=_DIST_MARK in text)
    text = text.replace(_RUNTIME_MARK, "\n".join(kept.runtime), 1)
    return text.replace(_DIST_MARK, "\n".join(kept.dist), 1)


def black_mode() -> black.Mode:
    return black.Mode(target_versions={black.TargetVersion.PY310},
                      line_length=BLACK_LINE_LENGTH)


def format_with_black(text: str) -> str:
    return black.format_str(text, mode=black_mode())
