"""Generate a benchmark file from a trace: the library entry point."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mystique_gen.backends.context import GenerateOptions, build_context
from mystique_gen.backends.render import render
from mystique_gen.ir import Program
from mystique_gen.multirank import expand_inputs, generate_ranks, load_rank_set
from mystique_gen.options import BuildOptions, OptionError
from mystique_gen.pipeline import compile_trace, compile_traces


def generate_source(program: Program, options: GenerateOptions | None = None) -> str:
    return render(build_context(program, options))


def generate(trace: str | Path | list[str | Path], out: str | Path,
             options: GenerateOptions | None = None, *, kineto: str | Path | None = None,
             threads: bool = False, build: BuildOptions | None = None) -> str:
    """``trace``: one path, or several with ``build.compose``; ``build``: filters and
    rewrites (None: the whole trace as recorded)."""
    paths: list[str | Path] = list(expand_inputs(trace if isinstance(trace, list) else [trace]))
    rank_set = load_rank_set(paths, build)  # the ranks of one job (multirank.py)
    if rank_set is not None:
        if kineto is not None:
            raise OptionError("--kineto links one trace; it cannot go with per-rank traces")
        return generate_ranks(rank_set, paths, out, options, build, threads)
    if len(paths) == 1:
        program = compile_trace(paths[0], kineto=kineto, threads=threads, options=build)
    else:
        if kineto is not None:
            raise OptionError("--kineto links one trace; it cannot go with --compose")
        program = compile_traces(paths, build or BuildOptions(), threads=threads)
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
        umask = os.umask(0)  # mkstemp makes the file 0600; give it the usual mode
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
