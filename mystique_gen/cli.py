"""Command line: ``mystique-gen TRACE -o OUT.py`` and the ``inspect``, ``capture``,
``compare`` and ``diff`` commands (their work lives in driver.py and tools/)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

from mystique_gen import __version__
from mystique_gen.backends.base import GenerateOptions
from mystique_gen.driver import generate, one_kineto, writable
from mystique_gen.errors import MystiqueError
from mystique_gen.options import add_build_arguments, build_options, default_device, device_lines
from mystique_gen.progress import session
from mystique_gen.tools.capture import ScriptError, capture_script, result_dict
from mystique_gen.tools.compare import (
    compare_traces,
    format_comparison,
    plot_comparison,
    read_clock,
    read_number,
    step_json_beside,
)
from mystique_gen.tools.diff import diff_paths, format_diff
from mystique_gen.tools.inspect import format_summary, inspect_paths

SUBCOMMANDS = ("generate", "inspect", "capture", "compare", "diff")


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
    _add_kineto_arguments(p, generate=True)
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
    _add_kineto_arguments(p, generate=False)
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def _add_kineto_arguments(p: argparse.ArgumentParser, *, generate: bool) -> None:
    """--kineto (generation: one per rank trace too) and, for generation, --threads."""
    g = p.add_argument_group("timing, streams and threads")
    what = ("Kineto (profiler) trace of the same run: per-op timing, streams, host gaps "
            "and the original step time (passes/link.py); a Chakra trace_link ET+ is "
            "its own Kineto trace (pass the same file)")
    if not generate:
        g.add_argument("--kineto", metavar="KINETO", help=what)
        return
    g.add_argument("--kineto", metavar="KINETO", nargs="+", action="extend",
                   help=f"{what}; with rank traces, one per rank (or a directory of them), "
                        "matched by the rank each records, else in the order given")
    g.add_argument("--threads", action="store_true",
                   help="replay each recorded host thread on its own Python thread, "
                        "waiting for the recorded cross-thread dependencies")


def command_line(argv: list[str]) -> str:
    """The command as recorded in a generated file: no absolute paths, no user names."""
    shown = [os.path.basename(a) if os.path.isabs(a) else a for a in argv]
    return shlex.join(["mystique-gen", *shown])


def run_generate(args: argparse.Namespace, argv: list[str]) -> int:
    device = default_device(args)
    options = GenerateOptions(command_line=command_line(argv), default_device=device,
                              filters=device_lines(device))
    generate(args.traces, args.output, options, build=build_options(args),
             kineto=args.kineto)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    default_device(args)  # validated as generate would
    options = build_options(args)
    trace = args.traces[0] if len(args.traces) == 1 else None
    summary = inspect_paths(args.traces, options,
                            kineto=one_kineto(args.kineto, trace, options.iteration))
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"mystique-gen: warning: {message}", file=sys.stderr)


Runner = Callable[[argparse.Namespace], int]


def _command(name: str, rest: list[str]) -> tuple[argparse.ArgumentParser, Runner]:
    """(parser, runner) of a subcommand."""
    if name == "capture":
        return capture_parser(), run_capture
    if name == "compare":
        return compare_parser(), run_compare
    if name == "inspect":
        return _inspect_parser(), run_inspect
    if name == "diff":
        return diff_parser(), run_diff
    return _generate_parser(), lambda args: run_generate(args, rest)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "generate"
    rest = argv[1:] if argv and argv[0] in SUBCOMMANDS else argv
    parser, runner = _command(command, rest)
    args = parser.parse_args(rest)
    with warnings.catch_warnings():
        # A captured script's warnings are its own: it runs in this process, and under
        # these settings torch's and transformers' warnings printed as ours
        # ("mystique-gen: warning: `torch.jit.script_method` is deprecated"), with
        # library DeprecationWarnings shown that python hides from the script alone.
        # (catch_warnings still undoes the script's -W filters afterwards.)
        if command != "capture":
            warnings.simplefilter("default")
            # catch_warnings restores showwarning afterwards (not formatwarning).
            warnings.showwarning = _show_warning
        try:
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


def capture_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mystique-gen capture",
        description="Record an execution trace and a Kineto trace of one optimizer step "
        "of a training script, after warm-up steps, with the eager step time in "
        "<name>.step.json. The step boundary is torch.optim's global step hook: a step "
        "is everything between the end of one optimizer.step() and the end of the next.",
        epilog="example: mystique-gen capture -o traces -- python train.py --epochs 1",
    )
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--name", default="trace", help="file stem (default: trace; under "
                   "torchrun each rank adds -rank-<RANK>)")
    p.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first")
    p.add_argument("--timing-iters", type=int, default=5,
                   help="timed steps for the eager step time")
    p.add_argument("--profile-steps", type=int, default=9,
                   help="warm steps profiled after the recorded one and the one that "
                   "records 0-d argument values, each annotated, into "
                   "<name>.profile.json (host gaps, compare); fewer if the script "
                   "ends first (default: 9)")
    p.add_argument("--step-at", metavar="[MODULE:]NAME",
                   help="each return from this function ends a step, instead of an "
                   "optimizer step: an inference script's (serve_batch), a method "
                   "(Engine.step), or a function of a module the script imports "
                   "(transformers.generation.utils:GenerationMixin.generate); default "
                   "module: the script's own")
    p.add_argument("--no-kineto", action="store_true", help="record the ET only")
    p.add_argument("--no-ranges", action="store_true",
                   help="do not record integral tensor ranges")
    p.add_argument("--save-indices", action="store_true",
                   help="also save the values of index tensors (<name>.et_resources/)")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- python SCRIPT [ARGS] (or python -m MODULE [ARGS], or a "
                   "launcher's command: torchrun ..., accelerate launch ...)")
    return p


def compare_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mystique-gen compare",
        description="Compare an original execution trace with the trace of its replay "
        "(a benchmark run with --et, and --profile for Kineto).",
        epilog="example: mystique-gen compare trace.et.json replay.et.json "
        "--kineto-original trace.profile.json --kineto-replay prof/kineto_trace.json "
        "--bench-json result.json",
    )
    p.add_argument("original", help="execution trace of the original")
    p.add_argument("replay", help="execution trace of the replay")
    p.add_argument("--kineto-original", metavar="K1", help="Kineto trace of the original")
    p.add_argument("--kineto-replay", metavar="K2", help="Kineto trace of the replay")
    p.add_argument("--replay-iters", type=int, default=None,
                   help="iterations in K2 (default: its ProfilerStep annotations, else "
                   "inferred from op counts)")
    p.add_argument("--step-json", metavar="FILE",
                   help="the capture's <name>.step.json: measured eager step time "
                   "(default: the one beside K1, if any)")
    p.add_argument("--bench-json", metavar="FILE",
                   help="the benchmark's --json output: measured iteration time")
    p.add_argument("--iteration", metavar="N|all", default="auto",
                   help="of an original ET that recorded several ProfilerStep#N, the "
                   "step the benchmark replays, as given to the generator (default: "
                   "its default, the first complete step the Kineto trace K1 holds)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="OUT.png", help="bar chart by category (matplotlib)")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def run_capture(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.warmup < 1 or args.timing_iters < 1 or args.profile_steps < 1:
        raise MystiqueError("--warmup, --timing-iters and --profile-steps must be at least 1")
    writable(Path(args.out), folder=True)  # before the script runs, not after
    before = set(threading.enumerate())
    try:
        result = capture_script(
            command, args.out, name=args.name, warmup=args.warmup,
            timing_iters=args.timing_iters, kineto=not args.no_kineto,
            integral_ranges=not args.no_ranges, integral_data=args.save_indices,
            profile_steps=args.profile_steps, step_at=args.step_at)
    except ScriptError as exc:
        raise MystiqueError(str(exc)) from None
    print(json.dumps(result_dict(result)))
    step = "optimizer step" if args.step_at is None else f"step (to a return from {args.step_at})"
    print(f"captured one {step}: eager {result.step_ms_median:.3f} ms "
          f"(median); wrote {result.et_path}", file=sys.stderr)
    _leave_script_threads(before)
    return 0


def _leave_script_threads(before: set[threading.Thread], grace_s: float = 1.0) -> None:
    """Exit now where the stopped script left threads of its own running that are not
    daemons (a prefetching thread that its loop's end would have stopped): the
    interpreter waited for them at exit, and the capture, its files written, never
    ended."""
    deadline = time.monotonic() + grace_s
    left = []
    for thread in threading.enumerate():
        if thread in before or thread.daemon or not thread.is_alive():
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            left.append(thread.name)
    if not left:
        return
    print(f"mystique-gen: note: the stopped script's threads {', '.join(left)} still run; "
          "exiting without waiting for them", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_compare(args: argparse.Namespace) -> int:
    args.kineto_original = one_kineto(args.kineto_original)
    args.kineto_replay = one_kineto(args.kineto_replay)
    if args.plot and not (args.kineto_original and args.kineto_replay):
        raise MystiqueError("--plot needs --kineto-original and --kineto-replay")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise MystiqueError(
                "--plot needs matplotlib: pip install 'mystique-gen[plot]'") from None
        writable(Path(args.plot), "--plot")
    step_json = args.step_json or (
        step_json_beside(args.kineto_original) if args.kineto_original else None)
    result = compare_traces(
        args.original, args.replay,
        kineto_original=args.kineto_original, kineto_replay=args.kineto_replay,
        replay_iterations=args.replay_iters,
        original_step_ms=read_clock(step_json, "step_ms_median") if step_json else None,
        replay_iter_ms=(read_clock(args.bench_json, "iter_ms_median")
                        if args.bench_json else None),
        original_peak_bytes=read_number(step_json, "step_peak_bytes") if step_json else None,
        replay_peak_bytes=(read_number(args.bench_json, "peak_step_bytes")
                           if args.bench_json else None),
        iteration=args.iteration)
    if args.plot:
        plot_comparison(result, args.plot)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_comparison(result))
    return 0


def diff_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mystique-gen diff",
        description="What changed between two workloads: ops added, removed and changed "
        "(same op at the same place, other shapes, dtypes or scalar arguments), grouped "
        "by recorded scope, then op counts by category, estimated FLOPs, bytes touched "
        "and peak memory, old and new. Inputs are two execution traces (compared by "
        "op signature) or two generated benchmarks (compared by op overload sequence "
        "only: a benchmark file does not write the shapes of intermediate values). "
        "Exit status 0: same workload, 1: different, 2: error.",
        epilog="example: mystique-gen diff old.et.json new.et.json "
        "--kineto-a old.kineto.json --kineto-b new.kineto.json",
    )
    p.add_argument("a", metavar="A", help="old workload: execution trace (.json, .json.gz) "
                   "or generated benchmark (.py)")
    p.add_argument("b", metavar="B", help="new workload, of the same kind as A")
    p.add_argument("--kineto-a", metavar="K1",
                   help="Kineto trace of A's run: also compare time per op category")
    p.add_argument("--kineto-b", metavar="K2", help="Kineto trace of B's run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_build_arguments(p, compose=False)  # each side is one workload
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def run_diff(args: argparse.Namespace) -> int:
    default_device(args)  # validated as generate would
    report = diff_paths(args.a, args.b, build_options(args),
                        kineto_a=one_kineto(args.kineto_a), kineto_b=one_kineto(args.kineto_b))
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_diff(report))
    return 0 if report.same else 1


if __name__ == "__main__":
    raise SystemExit(main())
