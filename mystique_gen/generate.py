"""Generate a benchmark file from a trace: the library entry point."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mystique_gen.emit.context import GenerateOptions, build_context
from mystique_gen.emit.render import render
from mystique_gen.ir import Program
from mystique_gen.pipeline import compile_trace


def generate_source(program: Program, options: GenerateOptions | None = None) -> str:
    return render(build_context(program, options))


def generate(trace: str | Path, out: str | Path, options: GenerateOptions | None = None) -> str:
    program = compile_trace(trace)
    text = generate_source(program, options)
    write_atomic(Path(out), text)
    return text


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder, so no partial file is ever left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
