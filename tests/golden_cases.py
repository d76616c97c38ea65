"""Golden cases, one per backend and schedule: small deterministic traces (built here)
and the benchmark each must compile to, byte for byte, in tests/golden/<case>.py.

``make regen`` rewrites the files (scripts/regen.py); tests/test_golden.py compares.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.cli import _generate_parser, command_line
from mystique_gen.driver import compile_paths, render
from mystique_gen.options import BuildOptions, build_options
from mystique_gen.passes.ranks import INIT_NODE
from tests.tracebuilder import ADD_, ALLREDUCE_, MM, RELU, Object, TraceBuilder

GOLDEN = Path(__file__).resolve().parent / "golden"
SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"


def kineto_doc(tb: TraceBuilder, spans: dict[int, tuple[float, float, list[int]]]) -> dict:
    """A Kineto document for ``tb``: node id -> (ts, dur, streams of its kernels)."""
    events: list[dict] = []
    corr = 500
    for node in tb.nodes:
        if node["id"] not in spans:
            continue
        attrs = {a["name"]: a["value"] for a in node["attrs"]}
        ts, dur, streams = spans[node["id"]]
        tid = 100 + attrs["tid"]
        events.append({"ph": "X", "cat": "cpu_op", "name": node["name"], "pid": 1, "tid": tid,
                       "ts": ts, "dur": dur, "args": {"Record function id": attrs["rf_id"],
                                                      "External id": attrs["rf_id"]}})
        for i, stream in enumerate(streams):
            corr += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "pid": 1, "tid": tid, "ts": ts + 1 + i, "dur": 1,
                           "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": f"k{corr}", "pid": 0,
                           "tid": stream, "ts": ts + 10, "dur": 4.0,
                           "args": {"stream": stream, "correlation": corr}})
    return {"traceEvents": events}


def two_stream(tmp_path):
    tb = TraceBuilder()
    x, w = tb.tensor((4, 4)), tb.tensor((4, 4))
    a, b, c = tb.tensor((4, 4)), tb.tensor((4, 4)), tb.tensor((4, 4))
    e = tb.tensor((4, 4))
    n1 = tb.op(MM, [x, w], [a])
    n2 = tb.op(RELU, [a], [b])
    n3 = tb.op(MM, [b, w], [c])
    n4 = tb.op(ADD_, [a, c, 1], [a])
    n5 = tb.op(RELU, [a], [e])
    spans = {n1: (0, 10, [7]), n2: (20, 10, [20]), n3: (40, 10, [20]), n4: (60, 10, [7]),
             n5: (80, 10, [7, 7])}
    et = tb.write(tmp_path / "two_stream.et.json")
    kineto = tmp_path / "two_stream.kineto.json"
    kineto.write_text(json.dumps(kineto_doc(tb, spans)))
    return et, kineto


def two_threads(tmp_path):
    tb = TraceBuilder()
    x, w = tb.tensor((4, 4)), tb.tensor((4, 4))
    a, b, c, d = (tb.tensor((4, 4)) for _ in range(4))
    tb.op(MM, [x, w], [a], tid=1)
    tb.op(RELU, [a], [b], tid=2)  # reads thread 1's value
    tb.op(MM, [x, x], [c], tid=1)
    tb.op(MM, [b, c], [d], tid=1)  # reads thread 2's value
    tb.op(RELU, [b], [tb.tensor((4, 4))], tid=2)
    return tb.write(tmp_path / "threads.et.json")


def one_stream_with_gaps(tmp_path: Path) -> tuple[Path, Path]:
    """Three ops on one stream with host time between them (Kineto host gaps)."""
    tb = TraceBuilder()
    x, w = tb.tensor((8, 8)), tb.tensor((8, 8))
    a, b, c = tb.tensor((8, 8)), tb.tensor((8, 8)), tb.tensor((8, 8))
    n1 = tb.op(MM, [x, w], [a])
    n2 = tb.op(RELU, [a], [b])
    n3 = tb.op(MM, [b, w], [c])
    spans = {n1: (0, 10, [7]), n2: (35, 5, [7]), n3: (52.5, 10, [7])}
    et = tb.write(tmp_path / "gaps.et.json")
    kineto = tmp_path / "gaps.kineto.json"
    kineto.write_text(json.dumps(kineto_doc(tb, spans)))
    return et, kineto


def two_ranks(tmp_path: Path) -> tuple[list[Path], list[Path]]:
    """One step of a two-rank job (mm, a synchronous all_reduce, relu on each rank) and
    each rank's Kineto trace, recording its rank in ``distributedInfo``: each rank has
    its own timing, rank 1 twice rank 0's host gaps."""
    groups = json.dumps([{"pg_name": "0", "pg_desc": "default_pg", "backend_config":
                          "cpu:gloo", "ranks": [], "group_size": 2, "group_count": 1}])
    ets, kinetos = [], []
    for rank in (0, 1):
        tb = TraceBuilder()
        tb.op("", [groups], [], name=INIT_NODE)
        x, w = tb.tensor((4, 4)), tb.tensor((4, 4))
        a, b = tb.tensor((4, 4)), tb.tensor((4, 4))
        n1 = tb.op(MM, [x, w], [a])
        n2 = tb.op(ALLREDUCE_, [[a], Object(), Object(), None, False, -1], [[a], Object()])
        tb.op("", [[a], 1, ["0", "default_pg"], rank, "allreduce", [], [], 2], [[a]],
              parent=n2, name="record_param_comms")
        n3 = tb.op(RELU, [a], [b])
        gap = 20.0 * (rank + 1)
        spans = {n1: (0, 10, []), n2: (10 + gap, 30, []), n3: (40 + 2 * gap, 5, [])}
        ets.append(tb.write(tmp_path / f"rank-{rank}.json"))
        doc = kineto_doc(tb, spans)
        doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": 2}
        kinetos.append(tmp_path / f"rank-{rank}.kineto.json")
        kinetos[-1].write_text(json.dumps(doc))
    return ets, kinetos


@dataclass
class Case:
    """Inputs of one golden benchmark: trace files (and Kineto) made in a folder."""

    make: Callable[[Path], tuple[list[Path], Path | list[Path] | None]]  # traces, Kineto
    flags: tuple[str, ...] = ()  # the command-line flags that give ``options``
    needs_shared: bool = False

    @property
    def options(self) -> BuildOptions:
        return build_options(_generate_parser().parse_args(["t", "-o", "o", *self.flags]))


def render_case(name: str, work: Path) -> str:
    """The benchmark of case ``name``, its inputs made in ``work``, as make regen writes it."""
    case = CASES[name]
    paths, kineto = case.make(work)
    argv = [*(p.name for p in paths), *case.flags]
    kinetos = [kineto] if isinstance(kineto, Path) else kineto or []
    if kinetos:
        argv += ["--kineto", *(k.name for k in kinetos)]
    options = GenerateOptions(command_line=command_line([*argv, "-o", f"{name}.py"]))
    return render(compile_paths(paths, case.options, kineto=kinetos), options)


def _first(make: Callable[[Path], tuple[Path, Path]]) -> Callable[[Path], tuple[list[Path], None]]:
    return lambda d: ([make(d)[0]], None)


def _both(make: Callable[[Path], tuple[Path, Path]]) -> Callable[[Path], tuple[list[Path], Path]]:
    def made(d: Path) -> tuple[list[Path], Path]:
        et, kineto = make(d)
        return [et], kineto
    return made


CASES: dict[str, Case] = {
    "single": Case(_first(two_stream)),
    "threaded": Case(lambda d: ([two_threads(d)], None), ("--threads",)),
    "streams": Case(_both(two_stream)),
    "kineto_host_gaps": Case(_both(one_stream_with_gaps)),
    "composed": Case(lambda d: ([two_threads(d), two_stream(d)[0]], None),
                     ("--compose", "parallel")),
    "distributed_kineto": Case(two_ranks),
    "distributed": Case(lambda d: ([SHARED / "chakra" / "allgather_2rank_1.0.2.json.gz"], None),
                        needs_shared=True),
}
