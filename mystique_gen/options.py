"""Build options: which ops a benchmark keeps, how traces combine, what is rewritten.

One small frozen object carries every choice from the command line (or a library
caller) through the pipeline; :func:`add_build_arguments` gives ``mystique-gen`` and
``mystique-gen inspect`` the same flags.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

import torch

from mystique_gen.errors import OptionError

MODES = ("full", "compute", "comm")
COMPOSE_MODES = ("sequence", "parallel")
DTYPES = ("float32", "float16", "bfloat16")
# A device the benchmark may default to: "cpu", "cuda", "cuda:1", "xpu:0", ...
DEVICE_RE = re.compile(r"^[a-z][a-z0-9_]{0,15}(:[0-9]{1,3})?$")


@dataclass(frozen=True)
class BuildOptions:
    mode: str = "full"  # "full", "compute" (no communication) or "comm" (only communication)
    include: tuple[str, ...] = ()  # regexes on qualified op names; an op must match one
    exclude: tuple[str, ...] = ()  # regexes on qualified op names; a match drops the op
    iteration: str = "auto"  # "auto" (first complete step of several), "all" or a step number
    subgraph: str | None = None  # keep the ops under the first annotation containing this
    max_ops: int | None = None  # keep the first N ops left by the other filters
    compose: str | None = None  # how several traces combine: "sequence" or "parallel"
    repeat: int = 1  # the op list this many times per iteration
    dtype: str | None = None  # recast floating tensors and dtype arguments to this
    public_calls: bool = True  # call ops as torch.add(...) where proven the same overload
    threads: bool = False  # replay each recorded host thread on its own Python thread

    @property
    def threaded(self) -> bool:
        """Whether the benchmark runs a host thread per recorded thread (or composed
        trace); otherwise it replays every thread's ops in order on one."""
        return self.threads or self.compose == "parallel"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise OptionError(f"--mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        for flag, patterns in (("--include", self.include), ("--exclude", self.exclude)):
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise OptionError(f"{flag} {pattern!r} is not a regular expression: "
                                      f"{exc}") from None
        if self.iteration not in ("auto", "all") and not self.iteration.isdigit():
            raise OptionError(f"--iteration takes a step number or 'all', not "
                              f"{self.iteration!r}")
        if self.max_ops is not None and self.max_ops < 1:
            raise OptionError("--max-ops must be at least 1")
        if self.repeat < 1:
            raise OptionError("--repeat must be at least 1")
        if self.compose is not None and self.compose not in COMPOSE_MODES:
            raise OptionError(f"--compose must be one of {', '.join(COMPOSE_MODES)}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise OptionError(f"--dtype must be one of {', '.join(DTYPES)}")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_build_arguments(parser: argparse.ArgumentParser, *, compose: bool = True) -> None:
    """The selection, composition and retargeting flags shared by generate and inspect
    (and diff, whose sides are one workload each: without ``--compose``)."""
    g = parser.add_argument_group("select, combine and retarget")
    g.add_argument("--mode", choices=MODES, default="full",
                   help="full: every op; compute: no communication ops; comm: only them")
    g.add_argument("--include", action="append", default=[], metavar="REGEX",
                   help="keep only ops whose qualified name (aten::mm) matches; repeatable")
    g.add_argument("--exclude", action="append", default=[], metavar="REGEX",
                   help="drop ops whose qualified name matches (after --include); repeatable")
    g.add_argument("--iteration", default="auto", metavar="N|all",
                   help="keep the ops of ProfilerStep#N (default: the first complete step "
                        "when the trace has several; 'all' keeps every step); in a trace "
                        "with no step marks, the N-th iteration its optimizer steps make "
                        "(default: the second)")
    g.add_argument("--subgraph", metavar="NAME",
                   help="keep the ops under the first annotation whose name contains NAME")
    g.add_argument("--max-ops", type=_positive, metavar="N",
                   help="keep the first N ops left by the other filters")
    if compose:
        g.add_argument("--compose", choices=COMPOSE_MODES,
                       help="combine several traces, each with its own tensors: sequence "
                            "runs them one after another in each iteration, parallel at "
                            "once, each on its own host thread (and its own stream on GPU)")
    g.add_argument("--repeat", type=_positive, default=1, metavar="K",
                   help="replay the op list K times per iteration")
    g.add_argument("--dtype", choices=DTYPES,
                   help="recast floating tensors and dtype arguments")
    g.add_argument("--dispatcher-calls", action="store_true",
                   help="call every op through torch.ops.<ns>.<op>.<overload>, not the "
                        "public function (torch.add) that dispatches the same overload")
    g.add_argument("--device", metavar="DEVICE",
                   help="the benchmark's default --device (default: cuda if available, "
                        "else cpu, decided where it runs)")


def build_options(args: argparse.Namespace) -> BuildOptions:
    return BuildOptions(
        mode=args.mode,
        include=tuple(args.include),
        exclude=tuple(args.exclude),
        iteration=str(args.iteration),
        subgraph=args.subgraph,
        max_ops=args.max_ops,
        compose=getattr(args, "compose", None),
        repeat=args.repeat,
        dtype=args.dtype,
        public_calls=not args.dispatcher_calls,
        threads=getattr(args, "threads", False),
    )


def default_device(args: argparse.Namespace) -> str | None:
    """The validated ``--device`` to write into the benchmark, or None to decide at run time."""
    device = args.device
    if device is None:
        return None
    if not DEVICE_RE.match(device):
        raise OptionError(f"--device {device[:40]!r} is not a device such as cpu, cuda or "
                          "cuda:1")
    try:  # a device type PyTorch knows (this one need not have it)
        torch.device(device)
    except RuntimeError:
        raise OptionError(f"--device {device[:40]!r} is not a device type PyTorch knows "
                          "(cpu, cuda, xpu, mps, ...)") from None
    return device


def device_lines(device: str | None) -> list[str]:
    """The docstring line that records a default ``--device`` written into the file."""
    return [f"device: the benchmark's --device defaults to {device}"] if device else []
