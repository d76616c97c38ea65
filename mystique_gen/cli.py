"""Command line: ``mystique-gen TRACE -o OUT.py`` and ``mystique-gen inspect TRACE``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import traceback
import warnings
from collections.abc import Callable

from mystique_gen import __version__
from mystique_gen.errors import MystiqueError
from mystique_gen.options import add_build_arguments

SUBCOMMANDS = ("generate", "inspect", "capture", "compare")


def _generate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mystique-gen",
        description="Compile a PyTorch execution trace into a standalone benchmark script. "
        f"Other commands: {', '.join(SUBCOMMANDS[1:])} (see 'mystique-gen COMMAND --help').",
        epilog="example: mystique-gen trace.json.gz -o bench.py && python bench.py --json",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="execution trace (.json or .json.gz), or a directory of per-rank "
                   "traces; several: the ranks of one job (one benchmark for all ranks, "
                   "run it under torchrun), otherwise they need --compose")
    p.add_argument("-o", "--output", required=True, help="benchmark file to write")
    add_build_arguments(p)
    _add_kineto_arguments(p, threads=True)
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    p.add_argument("--version", action="version", version=f"mystique-gen {__version__}")
    return p


def _inspect_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mystique-gen inspect",
        description="Summarise a trace and what a benchmark of it would replay.",
        epilog="example: mystique-gen inspect trace.json.gz --json",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="execution trace (.json or .json.gz); several need --compose")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_build_arguments(p)
    _add_kineto_arguments(p, threads=False)
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def _add_kineto_arguments(p: argparse.ArgumentParser, *, threads: bool) -> None:
    g = p.add_argument_group("timing, streams and threads")
    g.add_argument("--kineto", metavar="KINETO",
                   help="Kineto (profiler) trace of the same run: per-op timing, streams, "
                        "host gaps and the original step time (passes/link.py)")
    if threads:
        g.add_argument("--threads", action="store_true",
                       help="replay each recorded host thread on its own Python thread, "
                            "waiting for the recorded cross-thread dependencies")


def command_line(argv: list[str]) -> str:
    """The command as recorded in a generated file: no absolute paths, no user names."""
    shown = [os.path.basename(a) if os.path.isabs(a) else a for a in argv]
    return shlex.join(["mystique-gen", *shown])


def run_generate(args: argparse.Namespace, argv: list[str]) -> int:
    from mystique_gen.backends.context import GenerateOptions
    from mystique_gen.generate import generate
    from mystique_gen.options import build_options, default_device, device_lines

    device = default_device(args)
    options = GenerateOptions(command_line=command_line(argv), default_device=device,
                              filters=device_lines(device))
    generate(args.traces, args.output, options, build=build_options(args),
             kineto=args.kineto, threads=args.threads)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    from mystique_gen.options import build_options, default_device
    from mystique_gen.pipeline import inspect_traces
    from mystique_gen.tools.inspect import format_summary, summarize

    default_device(args)  # validated as generate would
    trace, program = inspect_traces(args.traces, build_options(args))
    summary = summarize(trace, program)
    if args.kineto:
        from mystique_gen.passes.link import timing_summary
        from mystique_gen.passes.streams import schedule_program

        if len(args.traces) != 1:
            raise MystiqueError("--kineto links one trace; it cannot go with --compose")
        summary.update(timing_summary(schedule_program(program, trace, args.kineto)))
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"mystique-gen: warning: {message}", file=sys.stderr)


Runner = Callable[[argparse.Namespace], int]


def _command(name: str, rest: list[str]) -> tuple[argparse.ArgumentParser, Runner]:
    """(parser, runner) of a subcommand; capture and compare live in tools_cli.py."""
    if name in ("capture", "compare"):
        from mystique_gen import tools_cli

        if name == "capture":
            return tools_cli.capture_parser(), tools_cli.run_capture
        return tools_cli.compare_parser(), tools_cli.run_compare
    if name == "inspect":
        return _inspect_parser(), run_inspect
    return _generate_parser(), lambda args: run_generate(args, rest)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "generate"
    rest = argv[1:] if argv and argv[0] in SUBCOMMANDS else argv
    parser, runner = _command(command, rest)
    args = parser.parse_args(rest)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        # catch_warnings restores showwarning afterwards (not formatwarning).
        warnings.showwarning = _show_warning
        try:
            from mystique_gen.progress import session

            with session():  # collector relaxed; a progress bar when stderr is a tty
                return runner(args)
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
