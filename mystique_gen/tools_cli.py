"""``mystique-gen capture`` and ``mystique-gen compare``: the commands around a benchmark.

* ``capture -o DIR [options] -- python train.py ARGS``: run a training script, skip
  ``--warmup`` optimizer steps, time ``--timing-iters`` more, record the next one
  (ET + Kineto, integral ranges on) and write the eager step time beside it;
* ``compare ORIGINAL_ET REPLAY_ET [--kineto-original K1 --kineto-replay K2] [--json]
  [--plot OUT.png]``: op-multiset match, per-op count differences and, with Kineto
  traces, time per op category and the end-to-end error.
"""

from __future__ import annotations

import argparse
import json
import sys

from mystique_gen.errors import MystiqueError


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
    p.add_argument("--name", default="trace", help="file stem (default: trace)")
    p.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first")
    p.add_argument("--timing-iters", type=int, default=5,
                   help="timed steps for the eager step time")
    p.add_argument("--no-kineto", action="store_true", help="record the ET only")
    p.add_argument("--no-ranges", action="store_true",
                   help="do not record integral tensor ranges")
    p.add_argument("--save-indices", action="store_true",
                   help="also save the values of index tensors (<name>.et_resources/)")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- python SCRIPT [ARGS] (or python -m MODULE [ARGS])")
    return p


def compare_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mystique-gen compare",
        description="Compare an original execution trace with the trace of its replay "
        "(a benchmark run with --et, and --profile for Kineto).",
        epilog="example: mystique-gen compare trace.et.json replay.et.json "
        "--kineto-original trace.kineto.json --kineto-replay prof/kineto_trace.json",
    )
    p.add_argument("original", help="execution trace of the original")
    p.add_argument("replay", help="execution trace of the replay")
    p.add_argument("--kineto-original", metavar="K1", help="Kineto trace of the original")
    p.add_argument("--kineto-replay", metavar="K2", help="Kineto trace of the replay")
    p.add_argument("--replay-iters", type=int, default=None,
                   help="iterations in K2 (default: inferred from op counts)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="OUT.png", help="bar chart by category (matplotlib)")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def run_capture(args: argparse.Namespace) -> int:
    from mystique_gen.tools.capture import ScriptError, capture_script, result_dict

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.warmup < 1 or args.timing_iters < 1:
        raise MystiqueError("--warmup and --timing-iters must be at least 1")
    try:
        result = capture_script(
            command, args.out, name=args.name, warmup=args.warmup,
            timing_iters=args.timing_iters, kineto=not args.no_kineto,
            integral_ranges=not args.no_ranges, integral_data=args.save_indices)
    except ScriptError as exc:
        raise MystiqueError(str(exc)) from None
    print(json.dumps(result_dict(result)))
    print(f"captured one optimizer step: eager {result.step_ms_median:.3f} ms "
          f"(median); wrote {result.et_path}", file=sys.stderr)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from mystique_gen.tools.compare import compare_traces, format_comparison, plot_comparison

    if args.plot and not (args.kineto_original and args.kineto_replay):
        raise MystiqueError("--plot needs --kineto-original and --kineto-replay")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise MystiqueError(
                "--plot needs matplotlib: pip install 'mystique-gen[plot]'") from None
    result = compare_traces(args.original, args.replay,
                            kineto_original=args.kineto_original,
                            kineto_replay=args.kineto_replay,
                            replay_iterations=args.replay_iters)
    if args.plot:
        plot_comparison(result, args.plot)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_comparison(result))
    return 0
