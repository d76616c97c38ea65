"""Command line: ``mystique-gen TRACE -o OUT.py`` and ``mystique-gen inspect TRACE``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import traceback
import warnings
from pathlib import Path

from mystique_gen import __version__
from mystique_gen.errors import MystiqueError

SUBCOMMANDS = ("generate", "inspect")


def _generate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mystique-gen",
        description="Compile a PyTorch execution trace into a standalone benchmark script. "
        f"Other commands: {', '.join(SUBCOMMANDS[1:])} (see 'mystique-gen COMMAND --help').",
        epilog="example: mystique-gen trace.json.gz -o bench.py && python bench.py --json",
    )
    p.add_argument("trace", help="execution trace (.json or .json.gz)")
    p.add_argument("-o", "--output", required=True, help="benchmark file to write")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    p.add_argument("--version", action="version", version=f"mystique-gen {__version__}")
    return p


def _inspect_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mystique-gen inspect",
        description="Summarise a trace and what a benchmark of it would replay.",
        epilog="example: mystique-gen inspect trace.json.gz --json",
    )
    p.add_argument("trace", help="execution trace (.json or .json.gz)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def command_line(argv: list[str]) -> str:
    """The command as recorded in a generated file: no absolute paths, no user names."""
    shown = [os.path.basename(a) if os.path.isabs(a) else a for a in argv]
    return shlex.join(["mystique-gen", *shown])


def run_generate(args: argparse.Namespace, argv: list[str]) -> int:
    from mystique_gen.emit.context import GenerateOptions
    from mystique_gen.generate import generate

    options = GenerateOptions(command_line=command_line(argv))
    generate(args.trace, args.output, options)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    from mystique_gen.load.et import load_trace
    from mystique_gen.pipeline import build_program
    from mystique_gen.report import format_summary, summarize

    trace = load_trace(args.trace)
    summary = summarize(trace, build_program(trace))
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "generate"
    rest = argv[1:] if argv and argv[0] in SUBCOMMANDS else argv
    if command == "inspect":
        args = _inspect_parser().parse_args(rest)
    else:
        args = _generate_parser().parse_args(rest)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.formatwarning = lambda msg, *a, **k: f"mystique-gen: warning: {msg}\n"
        try:
            if command == "inspect":
                return run_inspect(args)
            return run_generate(args, rest)
        except MystiqueError as exc:
            if args.debug:
                traceback.print_exc()
            print(f"mystique-gen: error: {exc}", file=sys.stderr)
            return 2
        except (RecursionError, MemoryError) as exc:
            if args.debug:
                traceback.print_exc()
            print(f"mystique-gen: error: trace too large or too deeply nested "
                  f"({type(exc).__name__})", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    raise SystemExit(main())
