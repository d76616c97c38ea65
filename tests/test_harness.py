"""The harness as a module: fill kinds, fillers, the job hooks and main, and inlining."""

from __future__ import annotations

import ast
import contextlib
import inspect
import itertools
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings
from pathlib import Path

import pytest
import torch

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.backends.harness import BEGIN, END, harness_source, shaken
from mystique_gen.driver import generate
from mystique_gen.errors import MystiqueError
from mystique_gen.harness import dist, equivalents, runtime
from mystique_gen.harness.fills import FillKind
from mystique_gen.ir import Init
from tests.conftest import last_json, run_benchmark
from tests.test_values import _varlen_attention
from tests.tracebuilder import TraceBuilder


def test_every_fill_kind_has_a_filler_and_back():
    assert {k.value for k in FillKind} - {FillKind.DATA.value, FillKind.VALUES.value,
                                         FillKind.NORMS.value} == \
        set(runtime._FILLS)


def test_an_unknown_fill_kind_is_a_generation_error():
    assert Init("span", 0, 8).kind is FillKind.SPAN
    with pytest.raises(MystiqueError, match="unknown fill kind 'positive'"):
        Init("positive")


def _fill(kind: str, numel: int, low, high) -> torch.Tensor:
    gens = {"cpu": torch.Generator().manual_seed(0)}
    return runtime._fill(numel, torch.int64, "cpu", kind, low, high, gens)


def test_fillers_give_what_their_kind_promises():
    span = _fill("span", 50, 3, 9)
    assert span.min() == 3 and span.max() == 9 and span[0] == 3 and span[-1] == 9
    offsets = _fill("offsets", 20, 0, 100)
    assert offsets[0] == 0 and torch.all(offsets[1:] >= offsets[:-1]) and offsets.max() <= 100
    cuts = _fill("cuts", 10, 0, 40)
    assert cuts[0] == 0 and cuts[-1] == 40 and torch.all(cuts[1:] >= cuts[:-1])
    assert int(_fill("mask", 30, 7, 0).sum()) == 7
    assert int(_fill("sum", 12, 50, 0).sum()) == 50
    assert len(torch.unique(_fill("distinct", 40, 6, 0))) == 6
    runs = _fill("runs", 40, 5, 0)
    assert len(torch.unique_consecutive(runs)) == 5
    randint = _fill("randint", 100, 2, 5)
    assert randint.min() >= 2 and randint.max() < 5
    gens = {"cpu": torch.Generator().manual_seed(0)}
    uniform = runtime._fill(100, torch.float32, "cpu", "uniform", -0.5, 0.5, gens)
    assert uniform.dtype == torch.float32 and uniform.abs().max() <= 0.5
    assert torch.all(_fill("ones", 4, 0, 0) == 1) and torch.all(_fill("zeros", 4, 0, 0) == 0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16,
                                   torch.float16, torch.float8_e4m3fn, torch.int32])
def test_uniform_fill_is_in_range_in_every_dtype_and_seeded(dtype):
    """Filled in place in its own dtype where it can be (no float32 temporaries for a
    large table), through float32 where it cannot (float8 has no uniform_)."""
    def fill():
        gens = {"cpu": torch.Generator().manual_seed(3)}
        return runtime._fill(4096, dtype, "cpu", "uniform", -2.0, 3.0, gens)

    first = fill()
    assert first.dtype == dtype and first.shape == (4096,)
    values = first.float()
    assert values.min() >= -2.0 and values.max() <= 3.0 and values.std() > 0.5
    assert torch.equal(first.view(torch.uint8), fill().view(torch.uint8))


def _main_replaying(monkeypatch, make_inputs, replay, ops):
    """runtime.main's module set as a generated file sets it, for one local process."""
    monkeypatch.setattr(runtime, "make_inputs", make_inputs)
    monkeypatch.setattr(runtime, "replay", replay)
    monkeypatch.setattr(runtime, "OPS", ops)
    monkeypatch.setattr(runtime, "_JOB", runtime._Local())


def test_main_times_the_replay_the_file_provides(monkeypatch, capsys):
    """runtime.main as a generated file runs it: its inputs, replay and job."""
    calls = []

    def make_inputs(device, host, gens):
        return {"x": torch.ones(4, device=device)}

    def replay(inputs, device, host):
        calls.append(1)
        inputs["x"].mul_(2.0)  # a training step updates its inputs in place

    _main_replaying(monkeypatch, make_inputs, replay, 1)
    assert runtime.main(["--device", "cpu", "--warmup", "1", "--iters", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # One warm-up, three timed, and one untimed step that measures peak_bytes.
    assert len(calls) == 5 and result["iters"] == 3 and result["ops"] == 1
    assert result["reset_inputs"] is True and result["device"] == "cpu"
    assert result["nonfinite_inputs"] == []
    for key in ("iter_ms_median", "iter_ms_mean", "iter_ms_min"):
        assert result[key] > 0


@pytest.mark.parametrize("flags, said", [
    (["--et", "/proc/replay.et.json"], "mystique: --et /proc/replay.et.json: "),
    (["--profile", "/proc/profiles"], "mystique: --profile /proc/profiles: "),
    (["--device", "meta"], "mystique: --device meta: "),
])
def test_outputs_and_devices_that_cannot_serve_stop_the_run_before_it_starts(
        monkeypatch, flags, said):
    """An --et the observer could not open was only logged by it, and the run ended as
    if it had written the trace; --profile's folder and --device meta raised
    tracebacks, the profile's after the whole timed run."""
    calls = []
    _main_replaying(monkeypatch, lambda device, host, gens: {},
                    lambda inputs, device, host: calls.append(1), 1)
    with pytest.raises(SystemExit) as stopped:
        runtime.main(["--warmup", "1", "--iters", "2", *flags])
    assert str(stopped.value.code).startswith(said) and calls == []


@pytest.mark.parametrize("flags, said", [
    (["--warmup", "-1"], "--warmup must be 0 or more, not -1"),
    (["--iters", "-2"], "--iters must be 0 or more, not -2"),
    (["--seed", str(2**64)], "--seed must fit in 64 bits"),
])
def test_numbers_out_of_range_are_usage_errors(monkeypatch, capsys, flags, said):
    """A seed past 64 bits raised a traceback from torch.Generator after the inputs'
    set-up; a usage error says which flag, before anything runs."""
    _main_replaying(monkeypatch, lambda device, host, gens: {}, lambda *a: None, 1)
    with pytest.raises(SystemExit) as stopped:
        runtime.main(flags)
    assert stopped.value.code == 2 and said in capsys.readouterr().err
    runtime._parse_args(["--seed", str(-(2**63))])  # the edges torch takes
    runtime._parse_args(["--seed", str(2**63 - 1)])


def test_outputs_are_written_where_their_folders_do_not_exist_yet(monkeypatch, tmp_path):
    _main_replaying(monkeypatch, lambda device, host, gens: {"x": torch.ones(2)},
                    lambda inputs, device, host: inputs["x"].mul_(2.0), 1)
    et, profiles = tmp_path / "new" / "replay.et.json", tmp_path / "profiles"
    assert runtime.main(["--warmup", "1", "--iters", "2", "--et", str(et),
                         "--profile", str(profiles)]) == 0
    assert et.is_file() and [p.name for p in profiles.iterdir()] == ["kineto_trace.json"]


def test_main_names_the_inputs_an_iteration_left_nan_or_inf(monkeypatch, capsys):
    """A replay that carries NaN into the inputs it writes (a training step on values
    outside some op's domain) says so, by name, in --json and on stderr, though the
    inputs are reset before each iteration. Inputs it only reads are not checked."""

    def make_inputs(device, host, gens):
        return {"weight": torch.ones(4), "data": torch.ones(4),
                "constant": torch.full((4,), float("inf"))}

    def replay(inputs, device, host):
        inputs["weight"].add_(inputs["data"].sub(2.0).sqrt())  # sqrt(-1): NaN

    _main_replaying(monkeypatch, make_inputs, replay, 2)
    argv = ["--device", "cpu", "--warmup", "1", "--iters", "2", "--json"]
    assert runtime.main([*argv, "--reset-inputs", "on"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["nonfinite_inputs"] == ["weight"]
    assert "1 input(s) this replay writes hold NaN or inf (weight)" in captured.err


def test_the_distributed_job_replays_its_rank_alone_without_a_launcher(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(dist, "WORLD_SIZE", 2)
    monkeypatch.setattr(dist, "RANKS", {0: (None, None, 5, None), 1: (None, None, 6, None)})
    job = dist._Ranks()

    class Args:
        backend = None

    job.start(Args(), torch.device("cpu"))
    assert (job.rank, job.comm) == (0, False)
    assert job.iteration_times([1.0, 2.0]) == [1.0, 2.0]
    facts = job.facts()
    assert facts["ops"] == 5 and facts["world_size"] == 1 and "compute only" in facts["note"]
    assert job.et_path("out/replay.json") == "out/replay.rank0.json"


def test_a_rank_that_communicated_leaves_without_interpreter_teardown(monkeypatch, capsys):
    """A profile keeps the process group's gloo threads alive past
    destroy_process_group, and one still freeing a collective's tensors during
    interpreter teardown aborts the process: a rank that communicated flushes its
    output and leaves with os._exit; one that did not returns its status."""
    left = []
    monkeypatch.setattr(dist.os, "_exit", left.append)
    job = dist._Ranks()
    job.comm = False
    assert job.leave(3) == 3 and left == []
    job.comm = True
    print("result")
    job.leave(0)
    assert left == [0] and capsys.readouterr().out == "result\n"


def test_each_rank_replays_with_its_own_original(monkeypatch):
    """The job picks its rank's Kineto facts from RANKS (its gaps' calibration reads
    them); the result reports the slowest rank's original step, as iterations are
    timed, and each rank's own under per_rank."""
    monkeypatch.delenv("RANK", raising=False)
    originals = {r: {"step_ms": 2.0 + r, "observer_in_gaps": False} for r in (0, 1)}
    monkeypatch.setattr(dist, "WORLD_SIZE", 2)
    monkeypatch.setattr(dist, "RANKS", {r: (None, None, 3, originals[r]) for r in (0, 1)})
    monkeypatch.setitem(runtime._RUNTIME, "host_gaps", True)
    monkeypatch.setitem(runtime._RUNTIME, "gap_own_us", 4.5)
    job = dist._Ranks()
    job.rank, job.comm = 1, False  # not launched: this rank alone
    assert job.original() is originals[1] and job.original_ms() == 3.0
    job.iteration_times([1.0])
    [mine] = job.facts()["per_rank"]
    assert mine["original_ms"] == 3.0 and mine["host_gaps_replayed"] is True
    assert mine["host_gap_own_us"] == 4.5
    job.comm = True  # launched: every rank of the job, without gathering here
    job.per_rank = [[1.0], [2.0]]
    # Rank 0's gaps came from a same-session pair (its observer's cost calibrated out,
    # the wait left and its doubt), rank 1's from profile-only steps (-1: none).
    job.per_rank_gaps = [[4.5, 0.0, 1.0, 0.2, 0.0, 30.0, 90.0, 1.5, 23.0],
                         [6.0, 0.0, 0.0, 0.0, 0.0, -1.0, -1.0, -1.0, -1.0]]
    assert job.original_ms() == 3.0
    per_rank = job.facts()["per_rank"]
    assert [r["original_ms"] for r in per_rank] == [2.0, 3.0]
    assert [r["host_gaps_replayed"] for r in per_rank] == [True, False]
    assert [r["host_gap_call_us"] for r in per_rank] == [0.2, 0.0]
    assert [r["host_gap_wait_us"] for r in per_rank] == [90.0, None]
    assert [r["host_gap_doubt_us"] for r in per_rank] == [23.0, None]
    assert [r["host_gap_observer_ratio"] for r in per_rank] == [1.5, None]
    # A Kineto trace that linked no op (one cycle's, another step's) gives a step of
    # 0: none known, as for one process, not the job's step at 0.0 ms.
    nothing = {r: {"step_ms": 0.0, "observer_in_gaps": False} for r in (0, 1)}
    monkeypatch.setattr(dist, "RANKS", {r: (None, None, 3, nothing[r]) for r in (0, 1)})
    assert job.original_ms() is None
    assert [r["original_ms"] for r in job.facts()["per_rank"]] == [None, None]
    monkeypatch.setattr(dist, "RANKS", {r: (None, None, 3, None) for r in (0, 1)})
    assert job.original() is None and job.original_ms() is None
    assert "original_ms" not in job.facts()["per_rank"][0]


class _FailingOp:
    def __init__(self, namespace: str):
        self.namespace = namespace

    def __call__(self, *args):
        raise RuntimeError("Detected mismatch between collectives on ranks")

    def __str__(self) -> str:
        return f"{self.namespace}.op.default"


@pytest.mark.parametrize("comm", [False, True])
def test_a_failing_collective_stands_in_only_where_no_job_runs(monkeypatch, comm):
    """Without torchrun a functional collective cannot run and stands in; under it, a
    failure means the ranks are out of step, and it must stop the job where it
    happened, not at a later collective."""
    monkeypatch.setattr(runtime, "_FALLBACKS", [[(torch.float32, [2], [1], "device")]])
    monkeypatch.setitem(runtime._RUNTIME, "comm", comm)
    monkeypatch.setitem(runtime._RUNTIME, "skipped", {})
    monkeypatch.setitem(runtime._RUNTIME, "device", torch.device("cpu"))
    collective = _FailingOp("_c10d_functional")
    if comm:
        with pytest.raises(RuntimeError, match="mismatch"):
            runtime._guarded(0, collective)
    else:
        assert runtime._guarded(0, collective).shape == (2,)
    # Ops that may be missing on this device still stand in, job or not.
    assert runtime._guarded(0, _FailingOp("fsdp")).shape == (2,)


def test_inlined_source_is_the_modules_less_what_the_file_provides():
    source = harness_source()
    runtime_text = "\n".join(source.runtime)
    for text in (runtime_text, "\n".join(source.dist)):
        assert BEGIN not in text and END not in text
        assert "import " not in "\n".join(line for line in text.splitlines()
                                          if not line.startswith((" ", "#")))
    defined = {n.name for n in ast.parse(runtime_text).body
               if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    # The generated file provides make_inputs and replay; the harness provides the rest.
    assert {"main", "_fill", "_Local", "_guarded", "_calibrate_gaps"} <= defined
    assert not {"make_inputs", "replay"} & defined
    assert "import torch" in source.imports


_HARNESS_CODE = textwrap.dedent('''
    _STATE = {"n": 0}


    def _used(x):
        return _helper(x) + _STATE["n"]


    def _helper(x):
        return x


    def _unused(x):
        return _only_for_unused(x)


    def _only_for_unused(x):
        return x


    # Some torch lacks an op: its equivalent.
    def _roi(x):
        return _helper(x)


    def _cudnn(x):
        return x


    print("registered")  # a statement for its effect binds nothing: always kept


    def _guarded(key, x):
        return PORTABLE[key](x)


    PORTABLE = {
        # torchvision's
        "torchvision::roi_align.default": _roi,
        "aten::cudnn_convolution.default": (
            _cudnn
        ),
    }
    ''').strip().splitlines()


def test_a_file_holds_the_harness_statements_it_reads_and_its_ops_equivalents():
    """An MLP's benchmark held 4,485 lines, 2,100 of them kernels it never runs: each
    file now holds what its own code reads, transitively, and the equivalents of the
    operators it calls."""
    own = '''r = _guarded("torchvision::roi_align.default", _used(1))'''
    code, _ = shaken(_HARNESS_CODE, [], own)
    text = "\n".join(code)
    assert "def _used" in text and "def _helper" in text and "_STATE = " in text
    assert "def _unused" not in text and "def _only_for_unused" not in text
    assert 'print("registered")' in text
    assert "# torchvision's" in text and '"torchvision::roi_align.default": _roi' in text
    assert "cudnn" not in text  # neither its entry nor the function only it reads
    assert "# Some torch lacks an op" in text  # a kept statement's comment stays
    namespace: dict[str, object] = {}
    exec(compile(text, "<harness>", "exec"), namespace)
    assert set(namespace["PORTABLE"]) == {"torchvision::roi_align.default"}
    # An entry whose value is wrapped in parentheses keeps its closing line.
    code, _ = shaken(_HARNESS_CODE, [], '_guarded("aten::cudnn_convolution.default", 1)')
    namespace = {}
    exec(compile("\n".join(code), "<harness>", "exec"), namespace)
    assert set(namespace["PORTABLE"]) == {"aten::cudnn_convolution.default"}
    # A file that calls no such op keeps an empty table (the harness reads it).
    code, _ = shaken(_HARNESS_CODE, [], "_guarded(op, _used(1))")
    assert "PORTABLE = {}" in code and not any("def _roi" in line for line in code)


def test_every_generated_file_defines_each_name_it_reads(tmp_path):
    """The harness kept in a file is closed under what it reads: no name of it is left
    undefined (pyflakes' F821, through ruff), in every golden file and the demo."""
    root = Path(__file__).resolve().parent.parent
    files = sorted((root / "tests" / "golden").glob("*.py")) + [root / "generated" / "mlp_sgd.py"]
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated",
                           "--select", "F821,F811", *map(str, files)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert len(files) >= 8


def test_peak_bytes_counts_the_inputs_and_what_one_step_holds_at_once(monkeypatch):
    mib = 2**20

    def replay(inputs, device, host):
        a = torch.empty(mib // 4)  # 1 MiB
        b = torch.empty(mib // 4)  # 2 MiB held at once
        del a, b
        c = torch.empty(mib // 4)  # 1 MiB again: not a new peak
        del c

    monkeypatch.setattr(runtime, "replay", replay)
    cpu = torch.device("cpu")
    x = torch.ones(1024)
    inputs = {"x": x, "x_view": x[2:], "y": torch.ones(256, dtype=torch.float64)}
    assert runtime._input_bytes(inputs, cpu) == 4096 + 2048  # each storage once
    assert runtime._peak_bytes(inputs, cpu, cpu) == 4096 + 2048 + 2 * mib
    assert runtime._peak_bytes(inputs, torch.device("meta"), cpu) is None


def test_peak_bytes_is_not_reported_for_a_replay_on_several_cpu_threads(monkeypatch):
    """The profiler sees only its own thread's allocations: a partial peak would mislead."""

    def replay(inputs, device, host):
        runtime._run_threads(0, lambda: torch.empty(1000), lambda: torch.empty(1000))

    monkeypatch.setattr(runtime, "replay", replay)
    monkeypatch.setitem(runtime._RUNTIME, "threads", None)
    cpu = torch.device("cpu")
    assert runtime._peak_bytes({}, cpu, cpu) is None


def test_main_reports_peak_bytes_and_profiles_one_step_per_iteration(
    monkeypatch, capsys, tmp_path
):
    def replay(inputs, device, host):
        inputs["x"].add_(torch.ones(1000))

    _main_replaying(monkeypatch, lambda d, h, g: {"x": torch.ones(1000)}, replay, 1)
    argv = ["--device", "cpu", "--warmup", "1", "--iters", "4", "--json",
            "--profile", str(tmp_path)]
    assert runtime.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["peak_bytes"] == 8000  # the input, and ones(1000) during the step
    assert result["profile"] == str(tmp_path / "kineto_trace.json")
    events = json.loads((tmp_path / "kineto_trace.json").read_text())["traceEvents"]
    steps = [e["name"] for e in events if e["name"].startswith("ProfilerStep#")]
    assert steps == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]


def test_collective_helpers_on_a_one_rank_group(monkeypatch):
    """The harness's coalesced collectives, monitored barrier and list waits, in a
    one-rank gloo group (what a world-size-1 benchmark runs); its gathers, scatters
    and coalesced all-reduces warn of no deprecated call."""
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available in this build")
    monkeypatch.setitem(dist._RUNTIME, "comm", True)
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(),
                                         rank=0, world_size=1)
    try:
        group = torch.distributed.group.WORLD
        inputs = [torch.arange(4.0), torch.arange(6.0)]
        outputs = [torch.empty(4), torch.empty(6)]
        work = dist._all_gather_into_tensor_coalesced(outputs, inputs, group=group,
                                                      async_op=True)
        dist._wait_work(work)
        assert all(torch.equal(o, i) for o, i in zip(outputs, inputs, strict=True))
        assert dist._reduce_scatter_tensor_coalesced(
            outputs, inputs, op=torch.distributed.ReduceOp.MAX, group=group) is None
        assert all(torch.equal(o, i) for o, i in zip(outputs, inputs, strict=True))
        dist._monitored_barrier(wait_all_ranks=True, group=group)
        with warnings.catch_warnings():  # torch 2.13's calls: none deprecated
            warnings.simplefilter("error", FutureWarning)
            whole, part = torch.empty(4), torch.empty(4)
            dist._all_gather_single(whole, inputs[0], group=group)
            dist._reduce_scatter_single(part, whole, group=group)
            assert torch.equal(part, inputs[0])
            work = dist._all_reduce_coalesced(
                inputs, op=torch.distributed.ReduceOp.MAX, group=group, async_op=True
            )
            dist._wait_work(work)
            assert dist._all_reduce_coalesced(inputs, group=group) is None
        results = torch.ops._c10d_functional.all_reduce_coalesced(
            inputs, "max", group.group_name)
        dist._wait_tensor(results)  # a coalesced collective's list: each tensor waited
        assert torch.equal(results[1], inputs[1])
    finally:
        torch.distributed.destroy_process_group()


def test_held_peak_leaves_out_frees_of_memory_allocated_before_profiling():
    """The profiler reports the free of a block allocated before it started wherever it
    learnt the block's size (in an earlier profiling session of the process): counted,
    it lowered one capture's step peak by a gradient's size and not another's."""
    events = [(0, 7, -640), (1, 1, 100), (2, 2, 50), (3, 1, -100), (4, 3, 80),
              (5, 1, 30), (6, 9, -1000)]
    # 7 and 9 were allocated before: their frees count nothing. Live: 100, 150, 50,
    # 130, 160.
    assert runtime._held_peak(events) == 160
    assert runtime._held_peak(reversed(events)) == 160  # taken in time order


def test_only_the_inputs_an_iteration_writes_are_reset():
    """Restoring every input before each iteration read an inference replay's weights
    from cold caches; only what an iteration writes (version counters) is restored."""
    cpu = torch.device("cpu")
    weight_buf, state_buf = torch.ones(16), torch.zeros(16)
    inputs = {"weight": weight_buf.as_strided([4, 4], [4, 1], 0),
              "state": state_buf.as_strided([16], [1], 0),
              "state_view": state_buf.as_strided([2, 8], [8, 1], 0)}
    snapshot = runtime._snapshot(inputs, cpu, "on")
    assert len(snapshot) == 2
    versions = runtime._versions(inputs)
    assert runtime._written_only(snapshot, inputs, versions) == []
    inputs["state_view"][1].add_(inputs["weight"].sum())  # an optimizer's update
    kept = runtime._written_only(snapshot, inputs, versions)
    assert [s.data_ptr() for s, _ in kept] == [state_buf.untyped_storage().data_ptr()]
    runtime._reset(kept)
    assert state_buf.eq(0).all()


class _Event:
    """What `_own_gaps` reads of a profiler event (torch's FunctionEvent)."""

    def __init__(self, name: str, start: float, end: float, thread: int = 1):
        self.name, self.thread = name, thread
        self.time_range = type("Range", (), {"start": start, "end": end})()
        self.device_type = torch.autograd.DeviceType.CPU


def test_own_gaps_are_measured_gap_by_gap_and_as_a_mean():
    """Two calibration iterations of a replay with ops 0..2 and a tail: the own gap
    before op 1 is 3 us, before op 2 is 9 us (a long argument list), and the tail
    2 us; op 0's gap runs from the iteration's start. Children of an op and the
    harness's own work are not ops. Marks are wall times; the profiler's zero is at
    1000 ns."""
    events, marks = [], []
    for start in (0.0, 100.0):
        events.append(_Event("mystique::calibrate", start, start + 40.0))
        ops = [(start + 1.0, start + 6.0), (start + 9.0, start + 14.0),
               (start + 23.0, start + 38.0)]
        for k, (a, b) in enumerate(ops):
            events.append(_Event(f"aten::op{k}", a, b))
            marks.append((k, int(a * 1000 - 500 + 1000)))  # 0.5 us before its op
        events.append(_Event("aten::child", start + 24.0, start + 30.0))
        events.append(_Event(runtime.HARNESS_SCOPE, start + 15.0, start + 16.0))
        events.append(_Event("aten::fill_", start + 15.2, start + 15.8))
        marks.append((3, int((start + 39.0) * 1000 + 1000)))
    mean, per_gap, busy, in_harness = runtime._own_gaps(events, marks, trace_start_ns=1000)
    assert mean == pytest.approx(6.0)  # (3 + 9) / 2 per iteration
    assert per_gap == pytest.approx({0: 1.0, 1: 3.0, 2: 9.0, 3: 2.0})
    # The harness's 1 us scope lies in the gap before op 2: (0 + 1) / 2 per iteration.
    assert in_harness[0] == pytest.approx(0.5)
    assert in_harness[1] == pytest.approx({0: 0.0, 1: 0.0, 2: 1.0, 3: 0.0})
    # Without the profiler's zero in wall time, gaps cannot be placed: the mean only.
    # The top-level ops' own time per iteration, and how many (children not counted).
    assert busy == (pytest.approx(25.0), 3)
    assert runtime._own_gaps(events, marks, trace_start_ns=None)[:2] == (mean, {})


def test_scaled_gaps_scale_the_recorded_time_and_the_calibrated_costs(monkeypatch):
    """--host-gaps scaled: a gap recorded at a probe time of 8 us, replayed where the
    probe now takes 4 us (a host, or a phase, twice as fast), waits half the recorded
    time, less its own time calibrated at 5 us scaled by 4 / 5. The wait shows as the
    carry where it is negative (nothing to wait: the excess goes to the next gap)."""
    state = {k: runtime._RUNTIME[k] for k in (
        "host_gaps", "gap_own", "gap_own_us", "gap_event_us", "probe_recorded_us",
        "probe_calibrated_us", "gap_scale", "own_scale", "gap_scales")}
    monkeypatch.setattr(runtime, "_host_probe_us", lambda runs=9: 4.0)
    try:
        runtime._RUNTIME.update(host_gaps=True, gap_own={7: 30.0}, gap_own_us=0.0,
                                gap_event_us=10.0, probe_recorded_us=8.0,
                                probe_calibrated_us=5.0, gap_scales=[])
        runtime._track_host_speed()
        assert (runtime._RUNTIME["gap_scale"], runtime._RUNTIME["own_scale"]) == (0.5, 0.8)
        carry = runtime._RUNTIME["gap_carry"]
        carry.clear()
        runtime._host_gap(40.0, 2, before=7)  # 40 * 0.5 - (30 + 2 * 10) * 0.8
        assert carry[None] == pytest.approx(-20.0)  # one replay thread: no id
        carry.clear()
        runtime._RUNTIME["probe_recorded_us"] = None  # not scaling: nothing changes
        runtime._track_host_speed()
        assert runtime._RUNTIME["gap_scales"] == [0.5]
    finally:
        runtime._RUNTIME.update(state)
        runtime._RUNTIME["gap_carry"].clear()


class _SteppingClock:
    """A stand-in for the ``time`` module whose clock moves 10 us a reading: a busy-wait
    under it takes as many readings as the time it waits, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        self.now += 1e-5
        return self.now

    def time_ns(self) -> int:
        return int(self.now * 1e9)


_GAP_STATE = ("host_gaps", "gap_own", "gap_own_us", "gap_event_us", "gap_call_us",
              "gap_annotation_us", "gap_planned", "gap_plan", "gap_scale", "own_scale",
              "gap_marks", "threads")


@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.5, 0.8)])
def test_planned_gaps_wait_what_reckoned_gaps_wait(monkeypatch, scales):
    """A replay on one host thread looks each gap's wait up from a plan worked out once
    (`_plan_gaps`), where reckoning it per gap cost tiny-op steps more host time than
    the original's Python between ops. The plan waits what the reckoning waits from an
    iteration's second run on, a gap's excess of own time taken from the next gaps
    across the iteration's end as well, at the scales --host-gaps scaled sets."""
    clock = _SteppingClock()
    monkeypatch.setattr(runtime, "time", clock)
    state = {k: runtime._RUNTIME[k] for k in _GAP_STATE}
    # (recorded us, scopes, calls, annotations) in the order an iteration reaches them:
    # the last two gaps are short of their own time, and their excess carries into the
    # next iteration's first.
    planned = {2: (1000.0, 1, 0, 0), 3: (2000.0, 0, 0, 1), 5: (100.0, 0, 0, 0),
               9: (20.0, 0, 0, 0)}
    own = {5: 300.0, 2: 100.0, 9: 500.0}  # 3: the mean

    def waits() -> list[float]:
        spun = []
        for before, (us, events, calls, notes) in planned.items():
            started = clock.now
            runtime._host_gap(us, events, before=before, calls=calls, annotations=notes)
            spun.append(round((clock.now - started) * 1e6, -1))
        return spun

    try:
        runtime._RUNTIME.update(host_gaps=True, gap_own=own, gap_own_us=200.0,
                                gap_event_us=50.0, gap_call_us=0.0, gap_annotation_us=70.0,
                                gap_planned=planned, gap_plan=None, gap_marks=None,
                                threads=None, gap_scale=1.0, own_scale=1.0)
        runtime._RUNTIME["gap_carry"].clear()
        runtime._scale_gaps(*scales)
        reckoned = [waits() for _ in range(3)]
        runtime._RUNTIME["gap_plan"] = {}
        runtime._scale_gaps(*scales)  # plans, as at the calibration's end
        assert runtime._RUNTIME["gap_plan"]
        assert [waits() for _ in range(2)] == [reckoned[1]] * 2
        assert reckoned[2] == reckoned[1] != reckoned[0]
    finally:
        runtime._RUNTIME.update(state)
        runtime._RUNTIME["gap_carry"].clear()


def test_the_calibrations_marks_are_not_the_replays_own_time(monkeypatch):
    """The calibration marks every gap (`gap_marks`), the timed replay none: what a
    mark costs comes off every gap's calibrated own time, never below zero."""
    state = {k: runtime._RUNTIME[k] for k in (*_GAP_STATE, "gap_mark_us")}
    monkeypatch.setattr(runtime, "_mark_cost_us", lambda: 0.4)
    try:
        runtime._RUNTIME.update(gap_own={1: 2.0, 2: 0.3}, gap_own_us=1.5)
        runtime._leave_out_marks()
        assert runtime._RUNTIME["gap_own"] == {1: pytest.approx(1.6), 2: 0.0}
        assert runtime._RUNTIME["gap_own_us"] == pytest.approx(1.1)
        assert runtime._RUNTIME["gap_mark_us"] == 0.4
    finally:
        runtime._RUNTIME.update(state)


def test_a_gap_that_ends_at_a_wait_for_a_peer_holds_that_wait(monkeypatch):
    """A recorded gap before a recv or a collective's wait held the original's wait for
    its peer (no op records it): the replay waits first, and the gap busy-waits only
    what is left of it; a wait longer than the gap leaves no debt for the next gaps,
    and the calibration counts no wait as the replay's own time."""
    clock = _SteppingClock()
    monkeypatch.setattr(runtime, "time", clock)
    state = {k: runtime._RUNTIME[k] for k in ("host_gaps", "gap_own", "gap_own_us",
                                               "gap_scale", "own_scale", "gap_marks")}
    try:
        runtime._RUNTIME.update(host_gaps=True, gap_own={}, gap_own_us=0.0, gap_scale=1.0,
                                own_scale=1.0, gap_marks=[])
        runtime._waited_for_peers(clock.perf_counter() - 0.004)  # 4 ms with a peer
        started = clock.now
        runtime._host_gap(5000.0, before=3)  # 5 ms recorded: 1 ms left to wait
        spun = clock.now - started
        assert spun == pytest.approx(0.001, abs=3e-5)
        runtime._waited_for_peers(clock.perf_counter() - 0.008)
        runtime._host_gap(5000.0, before=4)  # covered by the 8 ms wait
        assert runtime._RUNTIME["gap_carry"][None] == 0.0  # no debt carried on
        assert not runtime._RUNTIME["gap_waited"]
        waits = [mark[6] for mark in runtime._RUNTIME["gap_marks"]]
        assert waits[0] == pytest.approx(4000.0, rel=0.05)
        assert waits[1] == pytest.approx(8000.0, rel=0.05)
    finally:
        runtime._RUNTIME.update(state)
        runtime._RUNTIME["gap_carry"].clear()
        runtime._RUNTIME["gap_waited"].clear()


def test_own_gaps_leave_out_the_waits_for_peers():
    """The calibration's own time in a gap is the span between two top-level ops less
    what the replay waited for a peer there (its mark's last field)."""
    cpu = torch.autograd.DeviceType.CPU
    span = types.SimpleNamespace
    events = [span(name="mystique::calibrate", time_range=span(start=0.0, end=100.0),
                   thread=1, device_type=cpu)]
    events += [span(name=f"aten::op{k}", time_range=span(start=a, end=b), thread=1,
                    device_type=cpu) for k, (a, b) in enumerate([(0.0, 10.0), (50.0, 60.0)])]
    marks = [(1, 45_000, 0.0, 0, 0, 0, 30.0)]  # before op 1, 45 us in; 30 us waited
    mean, per_gap, *_ = runtime._own_gaps(events, marks, trace_start_ns=0)
    assert per_gap == {1: pytest.approx(10.0)}  # 40 us between the ops, 30 waited
    # The mean too (it was 40: a pipeline stage's swung with its peer's pace, and
    # across passes with and without the observer its JSON read -676 us a gap).
    assert mean == pytest.approx(10.0)
    assert runtime._own_gaps(events, marks, trace_start_ns=None)[0] == pytest.approx(10.0)


def test_each_ranks_messages_name_its_rank(monkeypatch, capsys):
    """torchrun interleaves the ranks' stderr: one rank's "host gaps off" (a pipeline's
    first stage, whose own time exceeded its gaps) read as the job's, while the other
    replayed its gaps. A launched job's messages name their rank; one process's do not."""
    monkeypatch.setitem(runtime._RUNTIME, "host_gaps", True)
    monkeypatch.setitem(runtime._RUNTIME, "gap_planned", {0: (5.0, 0, 0, 0)})
    monkeypatch.setitem(runtime._RUNTIME, "gap_own", {0: 8.0})
    monkeypatch.setitem(runtime._RUNTIME, "comm", True)
    monkeypatch.setitem(runtime._RUNTIME, "rank", 1)
    runtime._drop_gaps_behind_own_time()
    assert capsys.readouterr().err.startswith(
        "mystique: rank 1: this replay's own host time between ops exceeds the recorded "
        "gaps by 3 us")
    monkeypatch.setitem(runtime._RUNTIME, "comm", False)  # not launched: no rank
    runtime._say("host gaps off")
    assert capsys.readouterr().err == "mystique: host gaps off\n"
    # One write per line: print's two writes let another rank's line in between.
    writes: list[str] = []
    monkeypatch.setattr(runtime.sys, "stderr", types.SimpleNamespace(
        write=writes.append, flush=lambda: None))
    runtime._say("no host gaps recorded (use --kineto): host gaps off")
    assert writes == ["mystique: no host gaps recorded (use --kineto): host gaps off\n"]


def test_gaps_behind_the_replays_own_time_are_turned_off(capsys):
    """Where the replay's own host time exceeds the recorded gaps of an iteration in
    all (a scan of many small ops), no gap would ever wait (the carry takes each
    excess into the next gaps, across iterations), and the bookkeeping alone made the
    replay 13-20% slow: the calibration turns the gaps off and says by how much. Where
    the gaps exceed it in all, they stay on, though some gaps alone fall short."""
    keys = ("host_gaps", "gap_planned", "gap_own", "gap_own_us", "gap_event_us",
            "gap_call_us")
    state = {k: runtime._RUNTIME[k] for k in keys}
    try:
        # Gaps of 5, 30 and 4 us (2 scopes in the second, at 1 us each) against own
        # time of 8, 10 and 6 us: 39 recorded, 26 own and scopes: 13 us to wait.
        runtime._RUNTIME.update(host_gaps=True, gap_own={0: 8.0, 1: 10.0}, gap_own_us=6.0,
                                gap_event_us=1.0, gap_call_us=0.0,
                                gap_planned={0: (5.0, 0, 0, 0), 1: (30.0, 2, 0, 0),
                                             2: (4.0, 0, 0, 0)})
        assert runtime._gap_balance_us() == pytest.approx(13.0)
        runtime._drop_gaps_behind_own_time()
        assert runtime._RUNTIME["host_gaps"] is True and capsys.readouterr().err == ""
        runtime._RUNTIME["gap_planned"][1] = (12.0, 2, 0, 0)  # 21 recorded: 5 us short
        runtime._drop_gaps_behind_own_time()
        assert runtime._RUNTIME["host_gaps"] is False
        assert runtime._RUNTIME["gap_own_us"] == 6.0  # still reported as calibrated
        assert "exceeds the recorded gaps by 5 us an iteration" in capsys.readouterr().err
    finally:
        runtime._RUNTIME.update(state)


def test_a_threads_gap_lets_the_other_replay_threads_run():
    """Replayed on a host thread each (--threads, --compose parallel), one thread's gap
    must not hold the GIL: a plain spin kept it until CPython's switch interval took
    it away (5 ms; 1 s here), and the other threads' ops waited out the gap. The other
    thread runs while this one waits 200 ms."""
    keys = ("host_gaps", "gap_own", "gap_own_us", "gap_event_us", "gap_call_us",
            "gap_scale", "own_scale", "gap_marks", "threads")
    state = {k: runtime._RUNTIME[k] for k in keys}
    interval = sys.getswitchinterval()
    started, seen = threading.Event(), []
    try:
        runtime._RUNTIME.update(host_gaps=True, gap_own={}, gap_own_us=0.0,
                                gap_event_us=0.0, gap_call_us=0.0, gap_scale=1.0,
                                own_scale=1.0, gap_marks=None)
        sys.setswitchinterval(1.0)

        def waits() -> None:
            started.set()
            runtime._host_gap(200_000.0)
            seen.append(("gap over", time.perf_counter()))

        def runs() -> None:
            started.wait()
            time.sleep(0.01)  # (the gap has begun)
            seen.append(("ran", time.perf_counter()))

        begin = time.perf_counter()
        runtime._run_threads(0, waits, runs)
    finally:
        sys.setswitchinterval(interval)
        runtime._RUNTIME.update(state)
        runtime._RUNTIME["gap_carry"].clear()
    order = [what for what, _ in sorted(seen, key=lambda s: s[1])]
    assert order == ["ran", "gap over"]
    assert dict(seen)["ran"] - begin < 0.15


def test_recording_cost_pairs_each_recorded_loop_with_a_plain_one_just_before(monkeypatch):
    """This VM switches between two speeds over seconds (an empty scope: 6.3 or 10.4
    us with no recorder). Least plain loop against least recorded loop, taken seconds
    apart, read the observer's cost per scope anywhere from 1.3 to 11 us. Each recorded
    loop is now set against the plain loop just before it, and the cost is the median
    of those differences. Here the recorders cost 2 us a run, and the machine slows
    from 6 to 10 us a run after 5000 runs: unpaired, all plain loops ran fast and all
    recorded ones slow, and the cost read 12 - 6 = 6 us."""
    state = {"recorders": False, "runs": 0, "now": 0.0}

    @contextlib.contextmanager
    def recorded(original, path):
        state["recorders"] = True
        try:
            yield
        finally:
            state["recorders"] = False

    def body():
        state["runs"] += 1
        us = 10.0 if state["runs"] > 5000 else 6.0
        state["now"] += (us + (2.0 if state["recorders"] else 0.0)) * 1e-6

    monkeypatch.setattr(runtime.time, "perf_counter", lambda: state["now"])
    monkeypatch.setattr(runtime, "_recorded_as", recorded)
    assert runtime._recording_cost({}, body, 1000, rounds=5) == pytest.approx(2.0)


def test_scope_cost_times_the_autograd_engines_scopes_and_no_op(monkeypatch):
    """The scopes only the original recorded in its gaps are the autograd engine's: an
    evaluate_function and the node's own around each backward op, which the ET
    observer records with the node's inputs, at 1.5-2x an empty scope's cost. Counted
    at an empty scope, a ResNet training step's same-session gaps kept 1.1-1.3 ms of
    the observer's cost. What `_scope_cost` times must be those scopes alone, and its
    cost is per scope."""
    timed = {}

    def recording_cost(original, body, count, rounds=5):
        timed["body"] = body
        return 128.0  # us per run of `body`

    monkeypatch.setattr(runtime, "_recording_cost", recording_cost)
    per_scope = runtime._scope_cost({"observer_in_gaps": True})
    with torch.no_grad(), torch.profiler.profile() as prof:  # as a replay runs
        timed["body"]()
    names = [e.name for e in prof.events()]
    assert all(n.startswith("autograd::engine::evaluate_function") or
               n.endswith("Backward0") for n in names), names  # no op, no other scope
    assert len(names) == runtime._SCOPE_CHAIN_SCOPES > 2 * runtime._SCOPE_CHAIN
    assert per_scope == pytest.approx(128.0 / len(names))


@pytest.mark.parametrize("facts, passes", [
    # Gaps of one step of a session whose warm-up step ran the profiler: passes of one
    # iteration each, the observer started after an untimed one under the profiler.
    ({"gap_steps": 1, "profiler_warm": True}, [(1, True)] * 4),
    ({"gap_steps": 2, "profiler_warm": False}, [(2, False)] * 4),  # nothing ran before
    ({"gap_steps": 3}, [(9, False)]),  # the median over 3 steps drops the cold one
    ({}, [(9, False)]),
])
def test_calibration_mirrors_gaps_of_one_or_two_cold_steps(monkeypatch, facts, passes):
    """Recorded gaps of one or two steps hold the recorders' cold first step: an MLP's
    one-step inference pair replayed +26% against warm iterations. Such a calibration
    profiles `_COLD_PASSES` passes of as many first iterations of fresh recorders,
    with, without and with the observer as ever (here the profile-only side: one
    side)."""
    calls = []

    def profile_own(inputs, device, host, snapshot, iters, original, probes, warm=False):
        calls.append((iters, warm))
        probes.append(8.0)  # the host's Python speed, timed before each iteration
        return (5.0, {}, None, (100.0, 3), (0.0, {}))

    monkeypatch.setattr(runtime, "_profile_own", profile_own)
    monkeypatch.setattr(runtime, "replay", lambda inputs, device, host: None, raising=False)
    for name, value in (("_scope_cost", 1.0), ("_annotation_cost", 1.0),
                        ("_python_call_cost", 0.0)):
        monkeypatch.setattr(runtime, name, lambda original, value=value: value)
    monkeypatch.setitem(runtime._RUNTIME, "gap_planned", {})
    monkeypatch.setitem(runtime._RUNTIME, "gap_carry", {})
    monkeypatch.setitem(runtime._RUNTIME, "gap_waited", {})
    monkeypatch.setitem(runtime._RUNTIME, "device", "cpu")
    monkeypatch.setattr(runtime, "_JOB", runtime._Local())
    runtime._calibrate_gaps((), torch.device("cpu"), torch.device("cpu"),
                            original={"observer_in_gaps": False, **facts})
    assert calls == passes


def test_a_warm_up_runs_under_the_profiler_before_the_observer_starts(monkeypatch, tmp_path):
    """As a profiler schedule's warm-up step leaves them: the profiler has run (its
    first step's costs are behind it), the ET observer has not; its trace is written
    out when the profile ends, as the profiler's exit writes it."""
    monkeypatch.setitem(runtime._RUNTIME, "device", "cpu")
    x = torch.ones(4)
    path = tmp_path / "calibrate.et.json"
    with runtime._recorded_as({"observer_in_gaps": True}, str(path),
                              warm_up=lambda: torch.add(x, x)) as prof:
        torch.mul(x, x)
    profiled = {e.name for e in prof.events()}
    assert {"aten::add", "aten::mul"} <= profiled
    observed = {node["name"] for node in json.loads(path.read_text())["nodes"]}
    assert "aten::mul" in observed and "aten::add" not in observed


def test_calibration_passes_merge_gap_by_gap():
    """A same-session calibration profiles with, without, without and with the
    observer; each side's two passes merge into one: means of their numbers, gap by
    gap (a gap one pass did not see keeps the other's)."""
    first = (10.0, {1: 4.0, 2: 8.0}, "1.1", (100.0, 5), (1.0, {1: 0.5}))
    second = (14.0, {1: 6.0}, "1.1", (140.0, 5), (3.0, {1: 1.5, 2: 2.0}))
    mean, gaps, schema, busy, harness = runtime._merged(first, second)
    assert (mean, schema, busy) == (12.0, "1.1", (120.0, 5))
    assert gaps == {1: 5.0, 2: 8.0}
    assert harness == (2.0, {1: 1.0, 2: 2.0})


def test_the_observers_ratio_comes_from_the_ops_and_scales_its_share_of_the_gaps():
    """The observer cost the original's ops 60 us (100 recorded, 40 without it) and the
    replay's 30 (70 with it): it is taken to cost the original's gaps twice what it
    costs the replay's. Gaps own 10 us with the observer, 4 without: 4 + 2 x 6 = 16."""
    facts = {"op_cpu_us": 100.0, "linked_ops": 3}
    assert runtime._observer_ratio(facts, (70.0, 3), (40.0, 3)) == 2.0
    # Ops that do not pair up, or an observer too cheap to divide by: no ratio.
    assert runtime._observer_ratio(facts, (70.0, 4), (40.0, 4)) == 1.0
    assert runtime._observer_ratio(facts, (40.5, 3), (40.0, 3)) == 1.0
    assert runtime._observer_ratio({**facts, "op_cpu_us": 1000.0}, (70.0, 3), (40.0, 3)) == 4.0
    # Never below 1: the original's gaps hold its work on every op the replay runs. A
    # recorded op time near the replay's plain one (captured in this VM's fast phase,
    # calibrated in its slow one) read 0.5.
    assert runtime._observer_ratio({**facts, "op_cpu_us": 50.0}, (70.0, 3), (40.0, 3)) == 1.0
    state = {k: runtime._RUNTIME[k] for k in ("gap_own", "gap_own_us", "gap_planned",
                                              "gap_event_us", "gap_call_us")}
    try:
        runtime._RUNTIME.update(gap_own={1: 10.0}, gap_own_us=10.0,
                                gap_planned={1: (30.0, 0, 0, 0)}, gap_event_us=0.0,
                                gap_call_us=0.0)
        cost, wait = runtime._observer_share(4.0, {1: 4.0}, 2.0)
        assert runtime._RUNTIME["gap_own"] == {1: 16.0} and (cost, wait) == (12.0, 14.0)
        assert runtime._RUNTIME["gap_own_us"] == 16.0
        # Harness work (a fit of a token list) the observer recorded: 5 of the 10 us
        # with it against 2 without. The original never did that work, so none of
        # the observer's cost there is the original's: (10 - 5 + 2 - 4) x 2 = 6.
        runtime._RUNTIME.update(gap_own={1: 10.0}, gap_own_us=10.0)
        harness = ((5.0, {1: 5.0}), (2.0, {1: 2.0}))
        cost, wait = runtime._observer_share(4.0, {1: 4.0}, 2.0, harness)
        assert runtime._RUNTIME["gap_own"] == {1: 10.0} and (cost, wait) == (6.0, 20.0)
        assert runtime._RUNTIME["gap_own_us"] == 10.0
    finally:
        runtime._RUNTIME.update(state)


def test_calibration_records_as_the_original_recorders_did(tmp_path):
    """The recorded gaps hold the recorders' own costs: the calibration profiles under
    the same, memory events and an ET observer computing integral tensors' ranges
    (14 us before an embedding_bag here) included, as the original's facts say."""
    indices = torch.randint(0, 10, (8,))
    cases = {
        "ranges": ({"observer_in_gaps": True, "memory_in_gaps": True,
                    "observer_ranges": True}, True, True),
        "observer": ({"observer_in_gaps": True}, False, False),
        "profile-only": (None, False, None),
    }
    for name, (original, memory, ranges) in cases.items():
        et_path = tmp_path / f"{name}.json"
        with runtime._recorded_as(original, str(et_path)) as prof:
            torch.ones(4).add(indices.float().sum())
        assert ("[memory]" in {e.name for e in prof.events()}) is memory, name
        if ranges is None:  # no observer attached
            assert not et_path.exists(), name
            continue
        nodes = json.loads(et_path.read_text())["nodes"]
        found = [a["value"] for n in nodes for a in n.get("attrs", [])
                 if a["name"] == "tensor_range"]
        assert any(found) is ranges, name  # an observer without them writes ""
    assert runtime._RANGE_ENV not in os.environ


@pytest.mark.parametrize("coalesced", [True, False])
def test_sparse_inputs_have_the_recorded_structure(coalesced):
    """A sparse input is built on its filled values buffer: its shape, its nonzeros in
    rows of its dense dimensions, valid indices; distinct and sorted where coalesced."""
    gens = {"cpu": torch.Generator().manual_seed(0)}
    values = torch.arange(12 * 4, dtype=torch.float32)
    hybrid = runtime._sparse_coo(values, [10, 4], 1, coalesced, gens)
    assert hybrid.layout == torch.sparse_coo and list(hybrid.shape) == [10, 4]
    assert hybrid.sparse_dim() == 1 and hybrid.dense_dim() == 1
    assert hybrid.is_coalesced() == coalesced
    indices = hybrid._indices()
    assert int(indices.min()) >= 0 and int(indices.max()) < 10
    if coalesced:  # 12 nonzeros cannot fit 10 distinct rows: as many as there are
        assert hybrid._nnz() == 10 and bool((indices[0].diff() > 0).all())
    else:
        assert hybrid._nnz() == 12
        assert torch.equal(hybrid._values().flatten(), values)
    matrix = runtime._sparse_coo(torch.ones(30), [20, 50], 2, coalesced, gens)
    assert matrix._nnz() == 30 and matrix.sparse_dim() == 2
    assert torch.equal(matrix.to_dense().sum(), torch.tensor(30.0))
    assert [p.layout for p in runtime._dense_parts(matrix)] == [torch.strided] * 2


def test_guards_of_replay_computed_values_keep_every_valid_value():
    """`_nonzero` divides by 1 only where a computed integer divisor is 0; `_in_range`
    names the same element for every index that was valid, negative ones too."""
    divisor = torch.tensor([0, 2, -3, 0, 5])
    assert runtime._nonzero(divisor).tolist() == [1, 2, -3, 1, 5]
    assert divisor.tolist() == [0, 2, -3, 0, 5]  # a new tensor: the value is read again
    index = torch.tensor([-4, -1, 0, 3, 4, 9])
    table = torch.arange(4) * 10
    wrapped = runtime._in_range(index, 4)
    assert table[wrapped[:4]].tolist() == table[index[:4]].tolist()
    assert ((wrapped >= 0) & (wrapped < 4)).all()
    targets = torch.tensor([-100, 5, 12, -100])
    assert runtime._in_range(targets, 10, -100).tolist() == [-100, 5, 2, -100]


def test_a_fitted_mask_keeps_the_layout_the_comparison_gave_it():
    """``x > 0`` of a permuted ``x`` is laid out as x is, and ``masked_scatter`` read
    the fitted mask, made dense, in another loop (a random program with collectives,
    ``layout mismatch``)."""
    permuted = torch.randn(2, 1, 6).permute(2, 1, 0)  # strides (1, 6, 6)
    mask = permuted > 0
    fitted = runtime._fit_mask(mask, 5)
    assert fitted.stride() == mask.stride() and int(fitted.sum()) == 5


def test_an_index_wrapped_into_range_keeps_its_layout_expanded_ones_too():
    """A layout is a kernel: ``gather`` reads an index expanded along the beams (stride
    0) in another loop than a dense one, and the wrap had made it dense (the features
    section's beam search, ``layout mismatch``)."""
    beams = torch.tensor([[5], [-1], [2]]).expand(3, 8)
    wrapped = runtime._in_range(beams, 4)
    assert wrapped.shape == (3, 8) and wrapped.stride() == beams.stride() == (1, 0)
    assert wrapped[:, 0].tolist() == [1, 3, 2]
    transposed = torch.tensor([[7, 1], [2, 9]]).t()
    assert runtime._in_range(transposed, 4).stride() == transposed.stride()


def test_a_fit_cuts_or_pads_sizes_past_the_rows_and_keeps_the_cells_both_have():
    """``one_hot(x)`` counts its classes from x's values, and ``unique(dim=1)`` its
    columns: a replay's result may be wider or narrower than recorded. Its cells are
    cut, or padded with zeros, so the classes both have keep their ones (before, the
    whole result was replaced by zeros); rows are fitted as before."""
    wide = torch.nn.functional.one_hot(torch.tensor([0, 5, 2]))  # 6 classes
    cut = runtime._fit(wide, [3, 4], [4, 1])
    assert cut.tolist() == [[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0]]
    narrow = torch.nn.functional.one_hot(torch.tensor([1, 0]))  # 2 classes, 2 rows
    padded = runtime._fit(narrow, [3, 4], [4, 1])
    assert padded.shape == (3, 4) and padded.stride() == (4, 1)
    assert padded[:2].tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]
    grads = torch.ones(2, 3, requires_grad=True)
    fitted = runtime._fit(grads, [2, 2], [2, 1])
    fitted.sum().backward()
    assert grads.grad.tolist() == [[1, 1, 0], [1, 1, 0]]


def test_a_fit_at_a_site_is_made_once_and_reused(monkeypatch):
    """A mixture of experts fits every expert's token list, every iteration: at a site
    the first fit is kept, and a later value that misses the recorded size again gets
    it without a second fit (a value of the recorded size is still the replay's own)."""
    monkeypatch.setitem(runtime._RUNTIME, "fits", {})
    rows = torch.where(torch.tensor([[1, 0], [0, 1], [1, 1]]) == 1)  # 4 rows
    first = runtime._fit(rows, [[6], [6]], [[1], [1]], site=(3, 0))
    assert [t.shape[0] for t in first] == [6, 6] and first[0].max() < 3

    def no_second_fit(*args):
        raise AssertionError("fitted again")

    monkeypatch.setattr(runtime, "_fit_one", no_second_fit)
    again = runtime._fit(torch.where(torch.eye(3) == 1), [[6], [6]], [[1], [1]],
                         site=(3, 0))
    assert again is first
    own = torch.where(torch.ones(3, 2) == 1)
    assert runtime._fit(own, [[6], [6]], [[1], [1]], site=(3, 0)) is own
    with pytest.raises(AssertionError, match="fitted again"):  # another site
        runtime._fit(rows, [[6], [6]], [[1], [1]], site=(4, 0))
    with pytest.raises(AssertionError, match="fitted again"):  # no site: fitted each time
        runtime._fit(rows, [[6], [6]], [[1], [1]])


def test_only_small_indices_and_masks_are_kept(monkeypatch):
    """Floating values stay this iteration's (later ops compute on them), and a large
    kept value would hold memory past the step the original freed."""
    monkeypatch.setitem(runtime._RUNTIME, "fits", {})
    activations = torch.randn(5, 4)
    fitted = runtime._fit(activations, [3, 4], [4, 1], site=(1, 0))
    assert runtime._fit(activations, [3, 4], [4, 1], site=(1, 0)) is not fitted
    big = torch.zeros(runtime.KEPT_FIT_BYTES // 8 + 1, dtype=torch.int64)
    fitted = runtime._fit(big, [4], [1], site=(2, 0))
    assert runtime._fit(big, [4], [1], site=(2, 0)) is not fitted
    assert runtime._RUNTIME["fits"] == {}


def test_a_mask_at_a_site_is_counted_once(monkeypatch):
    """`_fit_mask` counts the trues (a device sync) on the first iteration only."""
    monkeypatch.setitem(runtime._RUNTIME, "fits", {})
    mask = torch.tensor([True, False, False, True])
    first = runtime._fit_mask(mask, 3, site=(5, 0))
    assert int(first.sum()) == 3 and mask.tolist() == [True, False, False, True]
    assert runtime._fit_mask(torch.zeros(4, dtype=torch.bool), 3, site=(5, 0)) is first
    exact = torch.tensor([True, True, False, False])
    assert runtime._fit_mask(exact, 2, site=(6, 0)) is exact
    assert runtime._fit_mask(torch.ones(4, dtype=torch.bool), 2, site=(6, 0)) is exact


def test_a_skipped_ops_stand_in_is_never_uninitialised(monkeypatch):
    """Freed memory the allocator hands back can hold NaN; a stand-in read by later ops
    carried it into a training replay's weights. Floating stand-ins are ones (a safe
    divisor), others zeros (a valid index)."""
    monkeypatch.setitem(runtime._RUNTIME, "device", torch.device("cpu"))
    for _ in range(3):
        dirty = torch.full((64, 64), float("nan"))
        del dirty
        ones = runtime._stand_in([torch.float32, [64, 64], [64, 1], "device"])
        assert torch.equal(ones, torch.ones(64, 64))
    index = runtime._stand_in([torch.int64, [4], [1], "device"])
    assert index.tolist() == [0, 0, 0, 0]
    quantized = runtime._stand_in([torch.quint8, [3], [1], "device"])
    assert quantized.dequantize().tolist() == [0.0, 0.0, 0.0]


def test_the_memory_check_leaves_out_inputs_it_will_not_make(monkeypatch):
    """An input only missing ops read is not made (`_fill`'s only_for), so the check
    before the inputs are made does not ask for its memory either."""
    monkeypatch.setattr(runtime, "REQUIRED_BYTES", 1000)
    missing = runtime._Unavailable("mylib::lookup.default", "not loaded")
    monkeypatch.setattr(runtime, "_INPUTS_ONLY_FOR", [
        [600, [missing]], [300, [missing, torch.ops.aten.add.Tensor]]])
    assert runtime._required_bytes("cpu") == 400


def test_the_memory_check_counts_the_hosts_tensors_only_on_the_host(monkeypatch):
    """A CUDA trace's host tensors (PARAM's 40 MB cache flush, CPU-side buffers) take
    none of the GPU's memory: its check and `estimated_peak_bytes` leave them out, as
    the CUDA allocator's peak does (on an H200, a trace read 0.75 MiB measured against
    80.5 MiB estimated). Replayed on the host, everything is there."""
    monkeypatch.setattr(runtime, "REQUIRED_BYTES", 1000)
    monkeypatch.setattr(runtime, "HOST_BYTES", 5000)
    assert runtime._estimated_bytes("cuda:0") == runtime._required_bytes("cuda") == 1000
    assert runtime._estimated_bytes("cpu") == runtime._required_bytes("cpu") == 6000


def test_a_sparse_input_not_made_is_a_meta_sparse_tensor(monkeypatch):
    """A sparse input only a missing op reads: its values buffer is a meta tensor
    (`_fill` only_for), and its structure is drawn on meta, without a generator."""
    missing = runtime._Unavailable("mylib::lookup.default", "not loaded")
    monkeypatch.setitem(runtime._RUNTIME, "unmade_bytes", 0)
    gens = {"cpu": torch.Generator().manual_seed(0)}
    values = runtime._fill(12, torch.float32, "cpu", "uniform", -1.0, 1.0, gens,
                           only_for=[missing])
    assert values.is_meta and runtime._RUNTIME["unmade_bytes"] == 48
    for coalesced in (True, False):
        sparse = runtime._sparse_coo(values, [4, 5], 1, coalesced, gens)
        assert sparse.is_meta and sparse.layout == torch.sparse_coo


@pytest.mark.parametrize("sizes,dense", [((50,), (8,)), ((6, 7), ()), ((6, 7), (3,))])
@pytest.mark.parametrize("more", [-3, 0, 5])
def test_a_coalesced_sparse_result_is_fitted_to_its_recorded_entries(sizes, dense, more):
    """coalesce keeps as many entries as the indices hold distinct positions, which
    the replay's values decide: the fit cuts entries or adds some at positions the
    tensor lacks, so the result stays coalesced and its values' gradient flows."""
    torch.manual_seed(0)
    indices = torch.stack([torch.randint(0, n, (20,)) for n in sizes])
    values = torch.randn(20, *dense, requires_grad=True)
    made = torch.sparse_coo_tensor(indices, values, (*sizes, *dense)).coalesce()
    want = made._nnz() + more
    fitted = runtime._fit_nnz(made, want)
    assert fitted._nnz() == want and fitted.is_coalesced()
    assert torch.equal(fitted.coalesce()._indices(), fitted._indices())  # distinct, sorted
    kept = min(want, made._nnz())
    assert set(map(tuple, made._indices()[:, :kept].T.tolist())) <= \
        set(map(tuple, fitted._indices().T.tolist()))
    fitted.values().sum().backward()
    assert values.grad is not None and values.grad.abs().sum() > 0
    dense_value = values.detach()
    assert runtime._fit_nnz(dense_value, 3) is dense_value  # not sparse: as it is


# Schemas of the library ops with equivalents (torchvision's), which torch alone lacks.
LIBRARY_SCHEMAS = {
    "torchvision::deform_conv2d.default": (
        "torchvision::deform_conv2d(Tensor input, Tensor weight, Tensor offset, "
        "Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, "
        "SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
        "SymInt offset_groups, bool use_mask) -> Tensor"),
    "torchvision::_deform_conv2d_backward.default": (
        "torchvision::_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, "
        "Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, "
        "SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
        "SymInt groups, SymInt offset_groups, bool use_mask) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)"),
    # flash_attn 2.6-2.8 (torch.library.custom_op's schemas of its Python signatures)
    "flash_attn::_flash_attn_forward.default": (
        "flash_attn::_flash_attn_forward(Tensor q, Tensor k, Tensor v, float dropout_p, "
        "float softmax_scale, bool causal, SymInt window_size_left, "
        "SymInt window_size_right, float softcap, Tensor? alibi_slopes, "
        "bool return_softmax) -> (Tensor, Tensor, Tensor, Tensor)"),
    "flash_attn::_flash_attn_varlen_forward.default": (
        "flash_attn::_flash_attn_varlen_forward(Tensor q, Tensor k, Tensor v, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, "
        "SymInt max_seqlen_k, float dropout_p, float softmax_scale, bool causal, "
        "SymInt window_size_left=-1, SymInt window_size_right=-1, float softcap=0., "
        "Tensor? alibi_slopes=None, bool return_softmax=False, "
        "Tensor? block_table=None, Tensor? leftpad_k=None, Tensor? seqused_k=None) "
        "-> (Tensor, Tensor, Tensor, Tensor)"),
    "flash_attn::_flash_attn_backward.default": (
        "flash_attn::_flash_attn_backward(Tensor dout, Tensor q, Tensor k, Tensor v, "
        "Tensor out, Tensor softmax_lse, Tensor(a6!)? dq, Tensor(a7!)? dk, "
        "Tensor(a8!)? dv, float dropout_p, float softmax_scale, bool causal, "
        "SymInt window_size_left, SymInt window_size_right, float softcap, "
        "Tensor? alibi_slopes, bool deterministic, Tensor? rng_state=None) -> Tensor"),
    "flash_attn::_flash_attn_varlen_backward.default": (
        "flash_attn::_flash_attn_varlen_backward(Tensor dout, Tensor q, Tensor k, "
        "Tensor v, Tensor out, Tensor softmax_lse, Tensor(a6!)? dq, Tensor(a7!)? dk, "
        "Tensor(a8!)? dv, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "SymInt max_seqlen_q, SymInt max_seqlen_k, float dropout_p, "
        "float softmax_scale, bool causal, SymInt window_size_left, "
        "SymInt window_size_right, float softcap, Tensor? alibi_slopes, "
        "bool deterministic, Tensor? rng_state=None) -> Tensor"),
    "torchvision::nms.default": (
        "torchvision::nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"),
    "torchvision::roi_align.default": (
        "torchvision::roi_align(Tensor input, Tensor rois, float spatial_scale, "
        "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, bool aligned) "
        "-> Tensor"),
    "torchvision::_roi_align_backward.default": (
        "torchvision::_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, "
        "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
        "SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor"),
    # torchaudio's (2.9): the kernel, and the autograd Function's call of it, which
    # torchaudio registers with unnamed arguments
    "torchaudio::rnnt_loss.default": (
        "torchaudio::rnnt_loss(Tensor logits, Tensor targets, Tensor logit_lengths, "
        "Tensor target_lengths, int blank, float clamp, bool fused_log_softmax) "
        "-> (Tensor, Tensor?)"),
    "torchaudio::rnnt_loss_forward.default": (
        "torchaudio::rnnt_loss_forward(Tensor _0, Tensor _1, Tensor _2, Tensor _3, int _4, "
        "float _5, bool _6) -> (Tensor _0, Tensor? _1)"),
    "torchaudio::_lfilter_core_loop.default": (
        "torchaudio::_lfilter_core_loop(Tensor input_signal_windows, "
        "Tensor a_coeff_flipped, Tensor(a!) padded_output_waveform) -> ()"),
    "torchaudio::_overdrive_core_loop.default": (
        "torchaudio::_overdrive_core_loop(Tensor _0, Tensor _1, Tensor _2, Tensor _3, "
        "Tensor _4) -> ()"),
    # fbgemm_gpu's (1.9, CPU build), as TorchRec's steps record them
    "fbgemm::asynchronous_complete_cumsum.default": (
        "fbgemm::asynchronous_complete_cumsum(Tensor t_in) -> Tensor"),
    "fbgemm::asynchronous_exclusive_cumsum.default": (
        "fbgemm::asynchronous_exclusive_cumsum(Tensor t_in) -> Tensor"),
    "fbgemm::asynchronous_inclusive_cumsum.default": (
        "fbgemm::asynchronous_inclusive_cumsum(Tensor t_in) -> Tensor"),
    **{f"fbgemm::permute_{kind}sparse_data.default": (
        f"fbgemm::permute_{kind}sparse_data(Tensor permute, Tensor lengths, Tensor values, "
        "Tensor? weights=None, SymInt? permuted_lengths_sum=None) -> (Tensor, Tensor, Tensor?)")
       for kind in ("2D_", "1D_", "")},
    "fbgemm::split_embedding_codegen_forward_cpu.default": (
        "fbgemm::split_embedding_codegen_forward_cpu(Tensor weights, Tensor weights_offsets, "
        "Tensor D_offsets, SymInt total_D, Tensor hash_size_cumsum, Tensor indices, "
        "Tensor offsets, int pooling_mode, Tensor indice_weights, int output_dtype) -> Tensor"),
    "fbgemm::split_embedding_backward_codegen_sgd_cpu.default": (
        "fbgemm::split_embedding_backward_codegen_sgd_cpu(Tensor grad_output, "
        "Tensor(a!) host_weights, Tensor weights_placements, Tensor weights_offsets, "
        "Tensor D_offsets, int max_D, Tensor hash_size_cumsum, int total_hash_size_bits, "
        "Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, "
        "bool stochastic_rounding, Tensor learning_rate_tensor, int output_dtype=0) -> ()"),
    "fbgemm::split_embedding_backward_codegen_adagrad_cpu.default": (
        "fbgemm::split_embedding_backward_codegen_adagrad_cpu(Tensor grad_output, "
        "Tensor(a!) host_weights, Tensor weights_placements, Tensor weights_offsets, "
        "Tensor D_offsets, int max_D, Tensor hash_size_cumsum, int total_hash_size_bits, "
        "Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, "
        "bool stochastic_rounding, Tensor(g!) momentum1_host, Tensor momentum1_placements, "
        "Tensor momentum1_offsets, Tensor learning_rate_tensor, float eps=0., "
        "int output_dtype=0) -> ()"),
    "fbgemm::split_embedding_backward_codegen_rowwise_adagrad_cpu.default": (
        "fbgemm::split_embedding_backward_codegen_rowwise_adagrad_cpu(Tensor grad_output, "
        "Tensor(a!) host_weights, Tensor weights_placements, Tensor weights_offsets, "
        "Tensor D_offsets, int max_D, Tensor hash_size_cumsum, int total_hash_size_bits, "
        "Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, "
        "bool stochastic_rounding, Tensor(g!) momentum1_host, Tensor momentum1_placements, "
        "Tensor momentum1_offsets, Tensor learning_rate_tensor, float eps=0., "
        "float weight_decay=0., int weight_decay_mode=0, float max_norm=0., "
        "int output_dtype=0) -> ()"),
    "fbgemm::dense_embedding_codegen_lookup_function.default": (
        "fbgemm::dense_embedding_codegen_lookup_function(Tensor dev_weights, "
        "Tensor weights_offsets, Tensor D_offsets, SymInt total_D, SymInt max_D, "
        "Tensor hash_size_cumsum, int total_hash_size_bits, Tensor indices, Tensor offsets, "
        "int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, "
        "int output_dtype=0, Tensor? B_offsets=None, "
        "Tensor? vbe_output_offsets_feature_rank=None, "
        "Tensor? vbe_B_offsets_rank_per_feature=None, SymInt max_B=-1, "
        "SymInt max_B_feature_rank=-1, SymInt vbe_output_size=-1, bool mixed_D=True) "
        "-> Tensor"),
    # fbgemm_gpu before its pt2 wrappers, as the shared CUDA DLRM traces record it
    "fbgemm::split_embedding_codegen_lookup_adagrad_function.default": (
        "fbgemm::split_embedding_codegen_lookup_adagrad_function("
        "Tensor placeholder_autograd_tensor, Tensor dev_weights, Tensor uvm_weights, "
        "Tensor lxu_cache_weights, Tensor weights_placements, Tensor weights_offsets, "
        "Tensor D_offsets, int total_D, int max_D, Tensor hash_size_cumsum, "
        "int total_hash_size_bits, Tensor indices, Tensor offsets, int pooling_mode, "
        "Tensor? indice_weights, Tensor? feature_requires_grad, Tensor lxu_cache_locations, "
        "bool gradient_clipping, float max_gradient, bool stochastic_rounding, "
        "Tensor momentum1_dev, Tensor momentum1_uvm, Tensor momentum1_placements, "
        "Tensor momentum1_offsets, float eps=0., float learning_rate=0., "
        "int output_dtype=0) -> Tensor"),
    # torch.nn.attention.varlen's ops (registered where that module is imported)
    "torch_attn::_varlen_attn.default": (
        "torch_attn::_varlen_attn(Tensor query, Tensor key, Tensor value, Tensor cu_seq_q, "
        "Tensor? cu_seq_k, SymInt max_q, SymInt max_k, bool is_causal=False, "
        "float? scale=None, SymInt[]? window_size=None, bool enable_gqa=False, "
        "Tensor? seqused_k=None, Tensor? block_table=None, SymInt? num_splits=None) "
        "-> (Tensor, Tensor, Tensor)"),
    "torch_attn::_varlen_attn_out.default": (
        "torch_attn::_varlen_attn_out(Tensor(a0!) out, Tensor query, Tensor key, "
        "Tensor value, Tensor cu_seq_q, Tensor? cu_seq_k, SymInt max_q, SymInt max_k, "
        "bool is_causal=False, float? scale=None, SymInt[]? window_size=None, "
        "bool enable_gqa=False, Tensor? seqused_k=None, Tensor? block_table=None, "
        "SymInt? num_splits=None) -> Tensor"),
    "torch_attn::_varlen_attn_backward.default": (
        "torch_attn::_varlen_attn_backward(Tensor grad_out, Tensor query, Tensor key, "
        "Tensor value, Tensor out, Tensor lse, Tensor cu_seq_q, Tensor cu_seq_k, "
        "SymInt max_q, SymInt max_k, bool is_causal, Tensor rng_state, float? scale=None, "
        "SymInt[]? window_size=None) -> (Tensor, Tensor, Tensor)"),
    # MSLK (formerly fbgemm_gpu's gen-ai kernels, namespace fbgemm), torchao's float8
    "mslk::f8f8bf16_rowwise.default": (
        "mslk::f8f8bf16_rowwise(Tensor XQ, Tensor WQ, Tensor x_scale, Tensor w_scale, "
        "Tensor? bias=None, bool use_fast_accum=True, Tensor(a!)? output=None) -> Tensor"),
    "fbgemm::f8f8bf16_rowwise.default": (
        "fbgemm::f8f8bf16_rowwise(Tensor XQ, Tensor WQ, Tensor x_scale, Tensor w_scale, "
        "Tensor? bias=None, bool use_fast_accum=True, Tensor(a!)? output=None) -> Tensor"),
}
# The same op as an older fbgemm_gpu defined it (the shared DLRM trace's): fewer
# trailing arguments, which the equivalent defaults.
OLDER_LIBRARY_SCHEMAS = {
    "fbgemm::dense_embedding_codegen_lookup_function.default": (
        "fbgemm::dense_embedding_codegen_lookup_function(Tensor dev_weights, "
        "Tensor weights_offsets, Tensor D_offsets, int total_D, int max_D, "
        "Tensor hash_size_cumsum, int total_hash_size_bits, Tensor indices, Tensor offsets, "
        "int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, "
        "int output_dtype=0) -> Tensor"),
}


def _schema_call(key: str, values: dict[str, object],
                 schemas: dict[str, str] = LIBRARY_SCHEMAS) -> tuple[list, dict]:
    """Positional and keyword arguments of the op `key` (namespace::name.overload), each
    argument's value from `values` by name (None where it has none)."""
    if key in schemas:
        schema = torch._C.parse_schema(schemas[key])
    else:
        name, overload = key.split("::")[1].split(".")
        schema = getattr(getattr(torch.ops.aten, name), overload)._schema
    args = [values.get(a.name) for a in schema.arguments if not a.kwarg_only]
    kwargs = {a.name: values.get(a.name) for a in schema.arguments if a.kwarg_only}
    return args, kwargs


@pytest.mark.parametrize("key", sorted(equivalents.PORTABLE))
def test_every_portable_equivalent_takes_its_kernels_arguments(key):
    """The benchmark calls an equivalent exactly as it calls the kernel: with the
    schema's positional arguments and its keyword-only ones by name."""
    args, kwargs = _schema_call(key, {})
    inspect.signature(equivalents.PORTABLE[key]).bind(*args, **kwargs)
    if key in OLDER_LIBRARY_SCHEMAS:
        args, kwargs = _schema_call(key, {}, OLDER_LIBRARY_SCHEMAS)
        inspect.signature(equivalents.PORTABLE[key]).bind(*args, **kwargs)


def _batch_norm_case(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, 5, generator=gen).to(dtype)
    weight, bias = torch.rand(3, generator=gen) + 0.5, torch.randn(3, generator=gen)
    return x, weight, bias, torch.zeros(3), torch.ones(3)


def test_cudnn_batch_norm_runs_as_native_batch_norm_with_the_same_gradients():
    x, weight, bias, mean, var = _batch_norm_case()
    values = {"input": x, "weight": weight, "bias": bias, "running_mean": mean,
              "running_var": var, "training": True, "exponential_average_factor": 0.1,
              "epsilon": 1e-5}
    args, kwargs = _schema_call("aten::cudnn_batch_norm.default", values)
    out, save_mean, save_invstd = equivalents.PORTABLE["aten::cudnn_batch_norm.default"](
        *args, **kwargs)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    expected = torch.nn.functional.batch_norm(
        leaves[0], torch.zeros(3), torch.ones(3), leaves[1], leaves[2], training=True)
    torch.testing.assert_close(out, expected.detach())
    grad = torch.randn_like(x)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    values.update(grad_output=grad, save_mean=save_mean, save_var=save_invstd,
                  reserveSpace=torch.empty(0, dtype=torch.uint8))
    for key in ("aten::cudnn_batch_norm_backward.default",
                "aten::miopen_batch_norm_backward.default"):
        args, kwargs = _schema_call(key, values)
        grads = equivalents.PORTABLE[key](*args, **kwargs)
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("transposed", [False, True])
def test_backend_convolutions_run_as_aten_convolution(transposed):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 9, 9, generator=gen)
    weight = torch.randn(4, 2, 3, 3, generator=gen)
    values = {"self": x, "weight": weight, "padding": [1, 1], "output_padding": [1, 1],
              "stride": [2, 2], "dilation": [1, 1], "groups": 2}
    if transposed:
        expected = torch.nn.functional.conv_transpose2d(
            x, weight, stride=2, padding=1, output_padding=1, groups=2)
        keys = ["aten::cudnn_convolution_transpose.default",
                "aten::miopen_convolution_transpose.default"]
    else:
        expected = torch.nn.functional.conv2d(x, weight, stride=2, padding=1, groups=2)
        keys = ["aten::cudnn_convolution.default", "aten::miopen_convolution.default",
                "aten::mkldnn_convolution.default"]
        nnpack = equivalents.PORTABLE["aten::_nnpack_spatial_convolution.default"]
        torch.testing.assert_close(nnpack(x, weight[:, :1].repeat(1, 4, 1, 1), None,
                                          [1, 1], [2, 2]),
                                   torch.nn.functional.conv2d(
                                       x, weight[:, :1].repeat(1, 4, 1, 1), None, 2, 1))
    for key in keys:
        args, kwargs = _schema_call(key, values)
        torch.testing.assert_close(equivalents.PORTABLE[key](*args, **kwargs), expected)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_backward_matches_the_kernel_that_runs_here(causal):
    """The CPU flash kernel runs here, so its equivalent (and every other fused
    kernel's, fed the same tensors) must give its gradients."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 16, generator=gen) for _ in range(3))
    out, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        q, k, v, 0.0, causal)
    grad = torch.randn_like(out)
    want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        grad, q, k, v, out, logsumexp, 0.0, causal)
    values = {"grad_out": grad, "grad_out_": grad, "query": q, "key": k, "value": v,
              "out": out, "logsumexp": logsumexp, "dropout_p": 0.0, "is_causal": causal,
              "grad_input_mask": [True, True, True, False], "max_q": 8, "max_k": 8}
    # SDPA's fused kernels, heads before the sequence (aten::_flash_attention_* put
    # the sequence first: tested apart)
    fused = [key for key in equivalents.PORTABLE if "scaled_dot_product" in key]
    backward = [key for key in fused if "backward" in key]
    assert len(backward) == 5
    for key in backward:
        args, kwargs = _schema_call(key, values)
        got = equivalents.PORTABLE[key](*args, **kwargs)
        for g, w in zip(got, want, strict=False):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    forward = [key for key in fused if "backward" not in key]
    for key in forward:
        args, kwargs = _schema_call(key, {**values, "dropout_p": 0.0})
        torch.testing.assert_close(equivalents.PORTABLE[key](*args, **kwargs)[0], out)


def _bilinear(image: torch.Tensor, y: float, x: float) -> torch.Tensor:
    """torchvision's bilinear_interpolate (roi_align_kernel.cpp), one point, every channel."""
    height, width = image.shape[1:]
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return torch.zeros(image.shape[0], dtype=image.dtype)
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_low = y_high = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_low = x_high = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    return ((1 - ly) * (1 - lx) * image[:, y_low, x_low] + (1 - ly) * lx * image[:, y_low, x_high]
            + ly * (1 - lx) * image[:, y_high, x_low] + ly * lx * image[:, y_high, x_high])


def _reference_roi_align(input: torch.Tensor, rois: torch.Tensor, scale: float, pooled: int,
                         sampling_ratio: int, aligned: bool) -> torch.Tensor:
    """torchvision's CPU roi_align, written out point by point."""
    out = torch.zeros(len(rois), input.shape[1], pooled, pooled + 1, dtype=input.dtype)
    offset = 0.5 if aligned else 0.0
    for k, (index, x1, y1, x2, y2) in enumerate(rois.tolist()):
        x1, y1, x2, y2 = (v * scale - offset for v in (x1, y1, x2, y2))
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / pooled, roi_w / (pooled + 1)
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(bin_h)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(bin_w)
        for i in range(pooled):
            for j in range(pooled + 1):
                total = sum(
                    (_bilinear(input[int(index)], y1 + i * bin_h + (iy + 0.5) * bin_h / grid_h,
                               x1 + j * bin_w + (ix + 0.5) * bin_w / grid_w)
                     for iy in range(grid_h) for ix in range(grid_w)),
                    torch.zeros(input.shape[1], dtype=input.dtype))
                out[k, :, i, j] = total / max(grid_h * grid_w, 1)
    return out


@pytest.mark.parametrize(("sampling_ratio", "aligned"),
                         [(2, True), (1, False), (0, True), (-1, False)])
def test_roi_align_runs_as_torchvisions_kernel_computes_it(sampling_ratio, aligned):
    """Mask R-CNN's roi_align (torchvision's C++ kernel, which the benchmark cannot
    load) runs as torch ops with torchvision's result: regions crossing the feature
    map's border, on either image, with fixed and adaptive sample counts; its backward
    is the forward's adjoint (roi_align is linear in its input)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 7, generator=gen, dtype=torch.float64)
    corners = torch.rand(12, 4, generator=gen, dtype=torch.float64) * 40 - 6
    boxes = torch.cat([corners[:, :2].minimum(corners[:, 2:]),
                       corners[:, :2].maximum(corners[:, 2:])], 1)
    rois = torch.cat([torch.randint(0, 2, (12, 1), generator=gen).double(), boxes], 1)
    values = {"input": x, "rois": rois, "spatial_scale": 0.25, "pooled_height": 3,
              "pooled_width": 4, "sampling_ratio": sampling_ratio, "aligned": aligned}
    args, _ = _schema_call("torchvision::roi_align.default", values)
    out = equivalents.PORTABLE["torchvision::roi_align.default"](*args)
    torch.testing.assert_close(
        out, _reference_roi_align(x, rois, 0.25, 3, sampling_ratio, aligned))
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    values.update(grad=grad, batch_size=2, channels=3, height=9, width=7)
    args, _ = _schema_call("torchvision::_roi_align_backward.default", values)
    grad_input = equivalents.PORTABLE["torchvision::_roi_align_backward.default"](*args)
    assert grad_input.shape == x.shape
    torch.testing.assert_close((grad_input * x).sum(), (grad * out).sum())
    empty = equivalents.PORTABLE["torchvision::_roi_align_backward.default"](
        grad[:0], rois[:0], *args[2:])
    assert empty.shape == x.shape and not empty.any()  # no regions: no gradient


def _reference_deform_conv2d(x, weight, offset, mask, bias, stride, pad, dilation,  # noqa: ANN001, ANN202
                              groups, offset_groups, use_mask):
    """torchvision's deformable convolution, point by point: each tap reads the input
    bilinearly at its place plus its offset, corners outside the map reading zero."""
    batch, channels, height, width = x.shape
    _, _, kernel_h, kernel_w = weight.shape
    out_h, out_w = offset.shape[-2:]
    columns = torch.zeros(batch, channels, kernel_h, kernel_w, out_h, out_w, dtype=x.dtype)
    for b, c, ki, kj, i, j in itertools.product(range(batch), range(channels), range(kernel_h),
                                              range(kernel_w), range(out_h), range(out_w)):
        group, tap = c // (channels // offset_groups), ki * kernel_w + kj
        taps = kernel_h * kernel_w
        y = i * stride - pad + ki * dilation + float(offset[b, group * 2 * taps + 2 * tap, i, j])
        x_at = j * stride - pad + kj * dilation + float(offset[b, group * 2 * taps + 2 * tap + 1,
                                                               i, j])
        value = 0.0
        y0, x0 = math.floor(y), math.floor(x_at)
        for yy, xx in ((y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)):
            if 0 <= yy < height and 0 <= xx < width:
                value += (1 - abs(y - yy)) * (1 - abs(x_at - xx)) * float(x[b, c, yy, xx])
        if use_mask:
            value *= float(mask[b, group * taps + tap, i, j])
        columns[b, c, ki, kj, i, j] = value
    per_group = columns.reshape(batch, groups, -1, out_h * out_w)
    kernel = weight.reshape(groups, weight.shape[0] // groups, -1)
    out = torch.einsum("gok,bgkl->bgol", kernel, per_group).reshape(batch, -1, out_h, out_w)
    return out + bias.reshape(1, -1, 1, 1)


@pytest.mark.parametrize(("stride", "pad", "dilation", "groups", "offset_groups", "use_mask"),
                         [(1, 1, 1, 1, 1, True), (2, 0, 1, 2, 2, False), (1, 2, 2, 2, 1, True)])
def test_deform_conv2d_runs_as_torchvisions_kernel_computes_it(stride, pad, dilation, groups,
                                                               offset_groups, use_mask):
    """A deformable convolution (torchvision's C++ kernel) runs as torch ops with its
    result, taps falling off the map included; its backward gives the input's,
    weight's, mask's and bias's grads (linear in each) and the offsets' (against
    finite differences)."""
    gen = torch.Generator().manual_seed(stride + pad + groups)
    x = torch.randn(2, 4, 6, 5, generator=gen, dtype=torch.float64)
    weight = torch.randn(4, 4 // groups, 3, 3, generator=gen, dtype=torch.float64)
    bias = torch.randn(4, generator=gen, dtype=torch.float64)
    out_h = (6 + 2 * pad - dilation * 2 - 1) // stride + 1
    out_w = (5 + 2 * pad - dilation * 2 - 1) // stride + 1
    offset = torch.randn(2, offset_groups * 18, out_h, out_w, generator=gen,
                         dtype=torch.float64) * 2
    mask = torch.rand(2, offset_groups * 9, out_h, out_w, generator=gen, dtype=torch.float64)
    values = {"input": x, "weight": weight, "offset": offset, "mask": mask, "bias": bias,
              "stride_h": stride, "stride_w": stride, "pad_h": pad, "pad_w": pad,
              "dilation_h": dilation, "dilation_w": dilation, "groups": groups,
              "offset_groups": offset_groups, "use_mask": use_mask}
    args, _ = _schema_call("torchvision::deform_conv2d.default", values)
    deform = equivalents.PORTABLE["torchvision::deform_conv2d.default"]
    out = deform(*args)
    torch.testing.assert_close(out, _reference_deform_conv2d(
        x, weight, offset, mask, bias, stride, pad, dilation, groups, offset_groups,
        use_mask))
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    args, _ = _schema_call("torchvision::_deform_conv2d_backward.default", {**values,
                                                                            "grad": grad})
    grad_x, grad_weight, grad_offset, grad_mask, grad_bias = equivalents.PORTABLE[
        "torchvision::_deform_conv2d_backward.default"](*args)
    without_bias = (grad * (out - bias.reshape(1, -1, 1, 1))).sum()
    for tensor, found in ((x, grad_x), (weight, grad_weight)):
        torch.testing.assert_close((found * tensor).sum(), without_bias)
    torch.testing.assert_close(grad_bias, grad.sum((0, 2, 3)))
    if use_mask:
        torch.testing.assert_close((grad_mask * mask).sum(), without_bias)
    else:
        assert not grad_mask.any()
    direction = torch.randn(offset.shape, generator=gen, dtype=torch.float64)
    step = 1e-6
    moved = [deform(*[offset + sign * step * direction if a is offset else a
                      for a in _schema_call("torchvision::deform_conv2d.default",
                                            values)[0]]) for sign in (1, -1)]
    torch.testing.assert_close((grad * (moved[0] - moved[1])).sum() / (2 * step),
                               (grad_offset * direction).sum(), rtol=1e-4, atol=1e-6)


def _reference_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> list[int]:
    """Greedy non-maximum suppression, box by box, as torchvision's CPU kernel runs it."""
    kept: list[int] = []
    for i in scores.argsort(descending=True, stable=True).tolist():
        x1, y1, x2, y2 = boxes[i].tolist()
        for j in kept:
            u1, v1, u2, v2 = boxes[j].tolist()
            inter = max(min(x2, u2) - max(x1, u1), 0) * max(min(y2, v2) - max(y1, v1), 0)
            if inter / ((x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - inter) > threshold:
                break
        else:
            kept.append(i)
    return kept


@pytest.mark.parametrize("count", [0, 1, 7, 300, 700])
def test_nms_runs_as_torchvisions_greedy_suppression(count):
    """torchvision's nms in torch ops keeps the boxes the greedy kernel keeps, in its
    order, across blocks (NMS_BLOCK) and at every threshold: crowded boxes make long
    chains of suppressions."""
    gen = torch.Generator().manual_seed(count)
    corners = torch.rand(count, 4, generator=gen, dtype=torch.float64) * 100
    boxes = torch.cat([corners[:, :2].minimum(corners[:, 2:]),
                       corners[:, :2].maximum(corners[:, 2:]) + 1], 1)
    scores = torch.rand(count, generator=gen, dtype=torch.float64)
    nms = equivalents.PORTABLE["torchvision::nms.default"]
    for threshold in (0.1, 0.5, 0.9):
        args, _ = _schema_call("torchvision::nms.default", {
            "dets": boxes, "scores": scores, "iou_threshold": threshold})
        kept = nms(*args)
        assert kept.dtype == torch.long
        assert kept.tolist() == _reference_nms(boxes, scores, threshold)


def _attention_by_hand(q, k, v, allowed, scale, softcap=0.0, bias=None):  # noqa: ANN001, ANN202
    """Attention over (batch, seq, heads, dim) tensors where `allowed[i, j]`, written out."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def _flash_call(key: str, **values: object) -> object:
    args, _ = _schema_call(key, {"dropout_p": 0.0, "softmax_scale": 0.25, "causal": False,
                                 "window_size_left": -1, "window_size_right": -1,
                                 "softcap": 0.0, **values})
    return equivalents.PORTABLE[key](*args)


def test_flash_attn_runs_as_flash_attention_computes_it():
    """transformers' flash_attention_2 (the flash_attn package's CUDA ops) runs as
    torch ops: a causal mask and windows aligned to the bottom right (a decoding step's
    one query sees every key), grouped key/value heads, Gemma 2's soft cap, ALiBi's
    biases, and sequences packed one after another (varlen)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 5, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    wide_k, wide_v = (t.repeat_interleave(2, dim=2) for t in (k, v))  # GQA: 2 per head
    forward = "flash_attn::_flash_attn_forward.default"
    i, j = torch.arange(3)[:, None] + 2, torch.arange(5)[None]  # bottom right: 5 - 3
    cases = [
        ({}, torch.ones(3, 5, dtype=torch.bool), {}),
        ({"causal": True}, j <= i, {}),
        ({"window_size_left": 1, "window_size_right": 0}, (j <= i) & (j >= i - 1), {}),
        ({"softcap": 2.0}, torch.ones(3, 5, dtype=torch.bool), {"softcap": 2.0}),
        ({"alibi_slopes": torch.tensor([0.5, 0.25, 0.125, 1.0], dtype=torch.float64)},
         torch.ones(3, 5, dtype=torch.bool),
         {"bias": -torch.tensor([0.5, 0.25, 0.125, 1.0], dtype=torch.float64)[:, None, None]
          * (j - i).abs()}),
    ]
    for flags, allowed, extra in cases:
        (out,) = _flash_call(forward, q=q, k=k, v=v, **flags)
        torch.testing.assert_close(out, _attention_by_hand(q, wide_k, wide_v, allowed, 0.25,
                                                           **extra))
    (one,) = _flash_call(forward, q=q[:, -1:], k=k, v=v, causal=True)  # decoding
    torch.testing.assert_close(one, _attention_by_hand(q[:, -1:], wide_k, wide_v,
                                                       torch.ones(1, 5, dtype=torch.bool), 0.25))
    # Packed: the two sequences of 3 queries and 5 keys, one after the other.
    cu_q, cu_k = torch.tensor([0, 3, 6], dtype=torch.int32), torch.tensor([0, 5, 10],
                                                                            dtype=torch.int32)
    (packed,) = _flash_call("flash_attn::_flash_attn_varlen_forward.default",
                            q=q.flatten(0, 1), k=k.flatten(0, 1), v=v.flatten(0, 1),
                            cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=3,
                            max_seqlen_k=5, causal=True)
    torch.testing.assert_close(packed, _attention_by_hand(q, wide_k, wide_v, j <= i, 0.25)
                               .flatten(0, 1))


@pytest.mark.parametrize("packed", [False, True])
def test_flash_attn_backward_writes_the_grads_where_the_kernel_does(packed):
    """flash_attn's backward writes dq, dk and dv in place (its schema's `(a!)`) and
    returns softmax_d, rowsum(dout * out) padded as the kernel lays it out."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 6, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    allowed = torch.arange(6)[None] <= torch.arange(6)[:, None]
    out = _attention_by_hand(*leaves, allowed, 0.5)
    dout = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad(out, leaves, dout)
    grads = [torch.zeros_like(t) for t in (q, k, v)]
    values = {"dout": dout, "q": q, "k": k, "v": v, "out": out.detach(), "softmax_lse": None,
              "dq": grads[0], "dk": grads[1], "dv": grads[2], "causal": True,
              "softmax_scale": 0.5, "deterministic": False}
    if packed:
        flat = {name: values[name].flatten(0, 1)
                for name in ("dout", "q", "k", "v", "out", "dq", "dk", "dv")}
        cu = torch.tensor([0, 6, 12], dtype=torch.int32)
        softmax_d = _flash_call("flash_attn::_flash_attn_varlen_backward.default",
                                **{**values, **flat, "cu_seqlens_q": cu, "cu_seqlens_k": cu,
                                   "max_seqlen_q": 6, "max_seqlen_k": 6})
        assert softmax_d.shape == (2, 12 + 128 * 2)
        torch.testing.assert_close(softmax_d[:, :12],
                                   (dout * out).sum(-1).flatten(0, 1).T.float())
        for got, grad in zip(grads, want, strict=True):
            torch.testing.assert_close(got, grad)
        return
    softmax_d = _flash_call("flash_attn::_flash_attn_backward.default", **values)
    assert softmax_d.shape == (2, 2, 128) and softmax_d.dtype == torch.float32
    torch.testing.assert_close(softmax_d[..., :6], (dout * out).sum(-1).transpose(1, 2).float())
    for got, grad in zip(grads, want, strict=True):
        torch.testing.assert_close(got, grad)


def _fbgemm():
    """torch.ops.fbgemm where fbgemm_gpu is installed (its kernels to check the
    equivalents against), else None: the references below need no fbgemm."""
    try:
        import fbgemm_gpu  # noqa: F401
    except ImportError:
        return None
    return torch.ops.fbgemm


@pytest.mark.parametrize("shape", [(0,), (7,), (3, 4)])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_fbgemm_cumsums_run_as_torch_cumsum(shape, dtype):
    """TorchRec's jagged offsets (fbgemm::asynchronous_complete_cumsum, a 0 then the
    running sum, per row of a 2-D input) and the exclusive and inclusive sums (in memory
    order), in the input's dtype."""
    lengths = torch.randint(0, 5, shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    rows = lengths.reshape(math.prod(shape[:-1]), shape[-1]).tolist()
    flat = lengths.flatten().tolist()
    running = [sum(flat[:i + 1]) for i in range(len(flat))]
    expected = {
        "complete": torch.tensor([[0] + [sum(r[:i + 1]) for i in range(len(r))] for r in rows],
                                 dtype=dtype).view(*shape[:-1], shape[-1] + 1),
        "exclusive": torch.tensor([0] + running[:-1], dtype=dtype)[:len(flat)].view(shape),
        "inclusive": torch.tensor(running, dtype=dtype).view(shape)}
    fbgemm = _fbgemm()
    for kind, want in expected.items():
        key = f"fbgemm::asynchronous_{kind}_cumsum.default"
        args, _ = _schema_call(key, {"t_in": lengths})
        got = equivalents.PORTABLE[key](*args)
        assert got.dtype == dtype and torch.equal(got, want), (kind, got, want)
        if fbgemm is not None and (kind == "complete" or len(shape) == 1):
            assert torch.equal(got, getattr(fbgemm, f"asynchronous_{kind}_cumsum")(lengths))


def _reference_permute(permute: list[int], lengths: torch.Tensor, values: torch.Tensor,
                       weights: torch.Tensor | None) -> tuple:
    """fbgemm's permute_{1D,2D}_sparse_data, row by row: each named row's lengths and
    the values (and weights) they count."""
    rows = lengths.reshape(lengths.shape[0], -1).sum(1).tolist()
    starts = [sum(rows[:i]) for i in range(len(rows))]
    picks = [i for row in permute for i in range(starts[row], starts[row] + rows[row])]
    picks_t = torch.tensor(picks, dtype=torch.long)
    return (lengths[permute], values[picks_t],
            None if weights is None else weights[picks_t])


@pytest.mark.parametrize("kind", ["2D_", "1D_", ""])
@pytest.mark.parametrize("permute", [[4, 2, 0, 1, 3], [1, 1, 3], [], [0, 4, 4, 4, 2, 1]])
def test_fbgemm_permute_sparse_data_gathers_the_rows_it_names(kind, permute):
    """KeyedJaggedTensor.permute (fbgemm::permute_2D_sparse_data; the 1-D form permutes
    single segments): the rows of lengths in the order named, repeated or left out, and
    the values and weights they count, gathered in torch ops."""
    gen = torch.Generator().manual_seed(len(permute))
    lengths = torch.randint(0, 4, (5, 3), generator=gen, dtype=torch.int32)
    if kind == "1D_":
        lengths = lengths[:, 0].contiguous()
    values = torch.randint(0, 100, (int(lengths.sum()),), generator=gen)
    weights = torch.rand(values.shape, generator=gen)
    order = torch.tensor(permute, dtype=torch.int32)
    key = f"fbgemm::permute_{kind}sparse_data.default"
    fbgemm = _fbgemm()
    for w in (None, weights):
        args, _ = _schema_call(key, {"permute": order, "lengths": lengths, "values": values,
                                     "weights": w})
        got = equivalents.PORTABLE[key](*args)
        for a, b in zip(got, _reference_permute(permute, lengths, values, w), strict=True):
            assert (a is None and b is None) or torch.equal(a, b)
        if fbgemm is not None:
            real = getattr(fbgemm, f"permute_{kind}sparse_data")(*args)
            for a, b in zip(got, real, strict=True):
                assert (a is None and b is None) or torch.equal(a, b)


# Three tables of a TBE (rows, columns), laid out in one flat buffer as fbgemm lays them.
TBE_TABLES = [(50, 8), (200, 16), (30, 4)]


def _tbe_case(bags: int = 6, seed: int = 0) -> dict[str, object]:
    """A TBE's arguments: its flat weights, layout and a batch of bags (some empty,
    some reading a row twice)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (len(TBE_TABLES) * bags,), generator=gen)
    indices = torch.cat([
        torch.randint(0, rows, (int(lengths[t * bags:(t + 1) * bags].sum()),), generator=gen)
        for t, (rows, _) in enumerate(TBE_TABLES)])
    sizes = [rows * cols for rows, cols in TBE_TABLES]
    return {
        "weights": torch.rand(sum(sizes), generator=gen) * 2 - 1,
        "weights_offsets": torch.tensor([sum(sizes[:t]) for t in range(len(sizes))]),
        "D_offsets": torch.tensor([0, 8, 24, 28], dtype=torch.int32),
        "total_D": 28, "max_D": 16,
        "hash_size_cumsum": torch.tensor([0, 50, 250, 280]),
        "total_hash_size_bits": 9,
        "weights_placements": torch.zeros(3, dtype=torch.int32),
        "indices": indices,
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        "indice_weights": torch.empty(0), "output_dtype": 0, "stochastic_rounding": False,
    }


def _reference_tbe_bags(case: dict[str, object], pooling: int):
    """Each (table, bag): its rows of the flat weights (a view) and the rows it reads."""
    bags = (len(case["offsets"]) - 1) // len(TBE_TABLES)
    offsets, indices = case["offsets"].tolist(), case["indices"].tolist()
    for t, (rows, cols) in enumerate(TBE_TABLES):
        start = int(case["weights_offsets"][t])
        table = case["weights"][start:start + rows * cols].view(rows, cols)
        for b in range(bags):
            yield t, b, table, indices[offsets[t * bags + b]:offsets[t * bags + b + 1]]


def _reference_tbe_forward(case: dict[str, object], pooling: int) -> torch.Tensor:
    """fbgemm's TBE forward, bag by bag: the sum (pooling 0) or mean (1) of its rows."""
    bags = (len(case["offsets"]) - 1) // len(TBE_TABLES)
    out = torch.zeros(bags, case["total_D"])
    columns = case["D_offsets"].tolist()
    for t, b, table, rows in _reference_tbe_bags(case, pooling):
        pooled = sum((table[r] for r in rows), torch.zeros(table.shape[1]))
        out[b, columns[t]:columns[t + 1]] = pooled / max(len(rows), 1) if pooling else pooled
    return out


@pytest.mark.parametrize("pooling", [0, 1])
def test_fbgemm_tbe_lookup_runs_as_embedding_bags(pooling):
    """TorchRec's sharded tables on the host (fbgemm::split_embedding_codegen_forward_cpu)
    and the CUDA traces' lookups (the old fused Adagrad lookup function, the dense TBE's):
    each table's bags pooled from its rows of the flat weights, side by side."""
    case = {**_tbe_case(), "pooling_mode": pooling}
    want = _reference_tbe_forward(case, pooling)
    cuda = {**case, "dev_weights": case["weights"], "uvm_weights": torch.empty(0),
            "momentum1_dev": torch.zeros_like(case["weights"])}
    for key, values in (("fbgemm::split_embedding_codegen_forward_cpu.default", case),
                        ("fbgemm::split_embedding_codegen_lookup_adagrad_function.default",
                         cuda),
                        ("fbgemm::dense_embedding_codegen_lookup_function.default", cuda)):
        args, kwargs = _schema_call(key, values)
        torch.testing.assert_close(equivalents.PORTABLE[key](*args, **kwargs), want)
    fbgemm = _fbgemm()
    if fbgemm is not None:
        args, _ = _schema_call("fbgemm::split_embedding_codegen_forward_cpu.default", case)
        torch.testing.assert_close(fbgemm.split_embedding_codegen_forward_cpu(*args), want)


def test_fbgemm_tbe_lookup_of_filled_inputs_splits_the_columns_evenly():
    """A benchmark fills a TBE's layout buffers (the trace records no values): where they
    do not lay tables out in the weights, the lookup takes total_D split evenly over
    the tables, rows as many as the weights hold, and indices and offsets within them."""
    case = _tbe_case()
    case.update(weights_offsets=torch.tensor([7, 3, 5]),
                D_offsets=torch.tensor([2, 7, 1, 0], dtype=torch.int32),
                hash_size_cumsum=torch.tensor([5, 0, 4, 6]), pooling_mode=0)
    case["offsets"] = case["offsets"] * 3  # past the indices' end, as filled ones may be
    args, _ = _schema_call("fbgemm::split_embedding_codegen_forward_cpu.default", case)
    out = equivalents.PORTABLE["fbgemm::split_embedding_codegen_forward_cpu.default"](*args)
    assert out.shape == (6, 28) and out.isfinite().all()
    assert equivalents._tbe_tables(case["weights"], case["weights_offsets"], case["D_offsets"],
                               28, case["hash_size_cumsum"]) == [
        (0, 132, 10, 0), (1320, 132, 9, 10), (2508, 132, 9, 19)]


def _reference_tbe_update(case: dict[str, object], grad: torch.Tensor, optimizer: str,
                          lr: float, eps: float) -> None:
    """fbgemm's fused backward on the host: each row's gradient summed over the bags
    that read it, then one step of the optimizer per row, in place."""
    columns = case["D_offsets"].tolist()
    rows_grad: dict[tuple[int, int], torch.Tensor] = {}
    tables = {}
    for t, b, table, rows in _reference_tbe_bags(case, case["pooling_mode"]):
        tables[t] = table
        g = grad[b, columns[t]:columns[t + 1]]
        if case["pooling_mode"] == 1:
            g = g / max(len(rows), 1)
        for r in rows:
            rows_grad[t, r] = rows_grad.get((t, r), 0) + g
    state = case.get("momentum1_host")
    state_at = case["momentum1_offsets"].tolist() if state is not None else []
    for (t, r), g in sorted(rows_grad.items()):
        if optimizer == "sgd":
            tables[t][r] -= lr * g
        elif optimizer == "adagrad":
            cols = tables[t].shape[1]
            s = state[state_at[t] + r * cols:state_at[t] + (r + 1) * cols]
            s += g * g
            tables[t][r] -= lr * g / (s.sqrt() + eps)
        else:  # row-wise: one state value a row, the gradient's mean square
            state[state_at[t] + r] += (g * g).mean()
            tables[t][r] -= lr * g / (state[state_at[t] + r].sqrt() + eps)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("pooling", [0, 1])
def test_fbgemm_fused_backward_updates_the_rows_the_bags_read(optimizer, pooling):
    """TorchRec's fused optimizers (fbgemm::split_embedding_backward_codegen_*_cpu): no
    gradient is made; each row the bags read takes its summed gradient's step of SGD,
    Adagrad (state per weight) or row-wise Adagrad (state per row), in place."""
    case = {**_tbe_case(seed=1), "pooling_mode": pooling}
    grad = torch.randn(6, 28, generator=torch.Generator().manual_seed(2))
    sizes = [rows * cols for rows, cols in TBE_TABLES]
    if optimizer == "adagrad":
        state, at = torch.rand(sum(sizes)), [sum(sizes[:t]) for t in range(3)]
    elif optimizer == "rowwise_adagrad":
        state, at = torch.rand(280), [0, 50, 250]
    if optimizer != "sgd":
        case.update(momentum1_host=state, momentum1_offsets=torch.tensor(at),
                    momentum1_placements=torch.zeros(3, dtype=torch.int32))
    key = f"fbgemm::split_embedding_backward_codegen_{optimizer}_cpu.default"
    values = {**case, "grad_output": grad, "learning_rate_tensor": torch.tensor([0.1]),
              "eps": 1e-3}
    expected = {k: v.clone() for k, v in case.items() if isinstance(v, torch.Tensor)}
    _reference_tbe_update({**case, **expected}, grad, optimizer, 0.1, 1e-3)
    for run in ("equivalent", "fbgemm"):
        fbgemm = _fbgemm()
        if run == "fbgemm" and fbgemm is None:
            continue
        copies = {k: v.clone() for k, v in case.items() if isinstance(v, torch.Tensor)}
        args, kwargs = _schema_call(key, {**values, **copies, "host_weights": copies["weights"]})
        if run == "equivalent":
            assert equivalents.PORTABLE[key](*args, **kwargs) is None
        else:
            getattr(fbgemm, f"split_embedding_backward_codegen_{optimizer}_cpu")(*args, **kwargs)
        torch.testing.assert_close(copies["weights"], expected["weights"])
        if optimizer != "sgd":
            torch.testing.assert_close(copies["momentum1_host"], expected["momentum1_host"])
        assert not torch.equal(copies["weights"], case["weights"])  # it moved


def test_an_op_of_a_newer_torch_resolves_to_its_equivalent(monkeypatch, capsys):
    """A trace of torch 2.13 replayed on 2.9: functional collectives' eager wrapper
    (``_c10d_functional::_wrap_tensor_autograd``, which 2.9 lacks) hands its tensor
    back, said on stderr, where a stand-in would refuse to skip a collective's op
    under torchrun (the whole tensor-parallel replay stopped at it)."""
    monkeypatch.setitem(runtime._RUNTIME, "equivalents", [])
    name = "_c10d_functional::_wrap_tensor_autograd.default"

    def missing():
        raise AttributeError("'_OpNamespace' '_c10d_functional' object has no attribute")

    wrap = runtime._op(missing, name)
    t = torch.randn(3)
    assert wrap(t) is t
    assert runtime._RUNTIME["equivalents"] == [name]
    assert "running its equivalent in torch ops" in capsys.readouterr().err


def test_a_portable_backward_keeps_what_it_saves_where_the_replay_keeps_nothing():
    """Where the original freed what its forward saved (activation checkpointing), the
    replay's nodes keep nothing (`_saved_tensors(False)`); an equivalent's backward,
    recomputed under autograd meanwhile, still reads what its own graph saved."""
    x, grad = torch.randn(3, 4), torch.randn(3, 4)
    leaf = x.clone().requires_grad_()
    (leaf.tanh() * leaf).backward(grad)
    runtime._saved_tensors(False)
    try:
        a = torch.randn(3, requires_grad=True)
        with pytest.raises(RuntimeError, match="saved tensor was read back"):
            (a * a).sum().backward()
        (got,) = equivalents._grads_by_autograd(lambda t: (t.tanh() * t,), [x], [grad])
        with pytest.raises(RuntimeError, match="saved tensor was read back"):
            (a * a).sum().backward()  # (still keeping nothing after it)
    finally:
        runtime._saved_tensors(True)
    torch.testing.assert_close(got, leaf.grad)


def test_a_backend_kernel_that_cannot_run_runs_its_equivalent(monkeypatch, capsys):
    """cuDNN's batch-norm backward cannot run on the host: the replay runs its portable
    equivalent (said once on stderr, listed in --json), not stand-in ones."""
    x, weight, bias, mean, var = _batch_norm_case()
    out, save_mean, save_invstd = torch.ops.aten.native_batch_norm.default(
        x, weight, bias, mean, var, True, 0.1, 1e-5)
    grad = torch.randn_like(x)
    rows = [(torch.float32, list(t.shape), list(t.stride()), "device")
            for t in (x, weight, bias)]
    monkeypatch.setattr(runtime, "_FALLBACKS", [rows])
    monkeypatch.setitem(runtime._RUNTIME, "skipped", {})
    monkeypatch.setitem(runtime._RUNTIME, "ported", {})
    monkeypatch.setitem(runtime._RUNTIME, "device", torch.device("cpu"))
    kernel = torch.ops.aten.cudnn_batch_norm_backward.default
    call = (x, grad, weight, mean, var, save_mean, save_invstd, 1e-5,
            torch.empty(0, dtype=torch.uint8))
    want = torch.ops.aten.native_batch_norm_backward.default(
        grad, x, weight, mean, var, save_mean, save_invstd, True, 1e-5, [True] * 3)
    for _ in range(2):
        got = runtime._guarded(0, kernel, *call)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
    assert list(runtime._RUNTIME["ported"]) == ["aten::cudnn_batch_norm_backward.default"]
    assert runtime._RUNTIME["skipped"] == {}
    assert capsys.readouterr().err.count("running its portable equivalent") == 1
    # A fused attention's equivalent returns its output; the kernel's other outputs
    # (log-sum-exp, seeds) stand in, in the kernel's form.
    q = torch.randn(1, 2, 4, 8)
    monkeypatch.setattr(runtime, "_FALLBACKS", [[
        (torch.float32, [1, 2, 4, 8], [64, 32, 8, 1], "device"),
        (torch.float32, [1, 2, 4], [8, 4, 1], "device"), None, None]])
    if hasattr(torch.ops.aten, "_scaled_dot_product_efficient_attention"):
        got = runtime._guarded(0, _FailingAttention(), q, q, q, None, True)
        assert [None if t is None else tuple(t.shape) for t in got] == [
            (1, 2, 4, 8), (1, 2, 4), None, None]
        torch.testing.assert_close(
            got[0], torch.nn.functional.scaled_dot_product_attention(q, q, q))


class _FailingAttention:
    def __call__(self, *args, **kwargs):
        raise NotImplementedError("no kernel for this backend")

    def __str__(self) -> str:
        return "aten._scaled_dot_product_efficient_attention.default"


def test_sync_batch_norms_kernels_run_as_native_batch_norm_does():
    """SyncBatchNorm's CUDA kernels, as their equivalents on one rank and two: the
    statistics, their reduction over ranks, the normalisation and its backward agree
    with native batch norm's over the whole batch."""
    x, weight, bias, mean, var = _batch_norm_case()
    out, save_mean, save_invstd = torch.ops.aten.native_batch_norm.default(
        x, weight, bias, None, None, True, 0.1, 1e-5)
    port = equivalents.PORTABLE
    halves = [port["aten::batch_norm_stats.default"](h, 1e-5) for h in x.chunk(2)]
    running_mean, running_var = mean.clone(), var.clone()
    got_mean, got_invstd = port["aten::batch_norm_gather_stats_with_counts.default"](
        x, torch.stack([m for m, _ in halves]), torch.stack([s for _, s in halves]),
        running_mean, running_var, 0.1, 1e-5, torch.tensor([50.0, 50.0]))
    torch.testing.assert_close(got_mean, save_mean)
    torch.testing.assert_close(got_invstd, save_invstd)
    torch.testing.assert_close(running_mean, 0.1 * save_mean)
    torch.testing.assert_close(running_var, 0.9 + 0.1 * x.var(dim=(0, 2, 3)))
    torch.testing.assert_close(port["aten::batch_norm_gather_stats.default"](
        x, got_mean[None], got_invstd[None], None, None, 0.1, 1e-5, 100)[1], save_invstd)
    torch.testing.assert_close(port["aten::batch_norm_elemt.default"](
        x, weight, bias, got_mean, got_invstd, 1e-5), out)
    grad = torch.randn_like(x)
    want = torch.ops.aten.native_batch_norm_backward.default(
        grad, x, weight, None, None, save_mean, save_invstd, True, 1e-5, [True] * 3)
    sum_dy, sum_dy_xmu, grad_weight, grad_bias = port[
        "aten::batch_norm_backward_reduce.default"](
        grad, x, got_mean, got_invstd, weight, True, True, True)
    grad_input = port["aten::batch_norm_backward_elemt.default"](
        grad, x, got_mean, got_invstd, weight, sum_dy, sum_dy_xmu,
        torch.tensor([50, 50], dtype=torch.int32))
    for got, expected in zip((grad_input, grad_weight, grad_bias), want, strict=True):
        torch.testing.assert_close(got, expected)


def test_cuda_only_pooling_convolution_and_norm_kernels_have_their_gradients():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 9, 9, generator=gen, requires_grad=True)
    pooled = torch.nn.functional.max_pool2d(x, 3, 2, 1)
    grad = torch.randn(pooled.shape, generator=gen)
    (want,) = torch.autograd.grad(pooled, x, grad)
    got = equivalents.PORTABLE["aten::max_pool2d_backward.default"](
        grad, x.detach(), [3, 3], [2, 2], [1, 1], [1, 1], False)
    torch.testing.assert_close(got, want)
    weight, bias = torch.randn(4, 1, 3, 3, generator=gen), torch.randn(4, generator=gen)
    torch.testing.assert_close(
        equivalents.PORTABLE["aten::_conv_depthwise2d.default"](
            x.detach(), weight, [3, 3], bias, [1, 1], [1, 1], [1, 1]),
        torch.nn.functional.conv2d(x.detach(), weight, bias, 1, 1, 1, groups=4))
    h = torch.randn(3, 5, 8, generator=gen, requires_grad=True)
    w = torch.rand(8, generator=gen, requires_grad=True)
    normed = torch.rms_norm(h, [8], w, 1e-6)
    grad = torch.randn(normed.shape, generator=gen)
    want = torch.autograd.grad(normed, (h, w), grad)
    rstd = torch.rsqrt(h.detach().pow(2).mean(-1, keepdim=True) + 1e-6)
    got = equivalents.PORTABLE["aten::_fused_rms_norm_backward.default"](
        grad, h.detach(), [8], rstd, w.detach(), [True, True])
    for g, expected in zip(got, want, strict=True):
        torch.testing.assert_close(g, expected)
    a, b = torch.randn(4, 6, generator=gen), torch.randn(6, 5, generator=gen)
    torch.testing.assert_close(
        equivalents.PORTABLE["aten::mm.dtype"](a, b, torch.float64), (a @ b).double())
    torch.testing.assert_close(
        equivalents.PORTABLE["aten::addmm.dtype"](a[:, :5], a, b, torch.float64, beta=0.5),
        torch.addmm(a[:, :5], a, b, beta=0.5).double())
    # Pinning needs an accelerator: without one, the copy it makes, in pageable memory.
    pinned = equivalents.PORTABLE["aten::pin_memory.default"](a)
    assert torch.equal(pinned, a) and pinned.data_ptr() != a.data_ptr()


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_fused_rnn_cells_match_the_cells_and_their_autograd(cell):
    """nn.LSTMCell and nn.GRUCell on CUDA run fused kernels (and autograd their fused
    backward by name); the equivalents compute the cells and the same gradients."""
    gen = torch.Generator().manual_seed(0)
    gates = 4 if cell == "lstm" else 3
    x, h = torch.randn(5, 7, generator=gen), torch.randn(5, 6, generator=gen)
    w_ih = torch.randn(gates * 6, 7, generator=gen)
    w_hh = torch.randn(gates * 6, 6, generator=gen)
    b_ih, b_hh = torch.randn(gates * 6, generator=gen), torch.randn(gates * 6, generator=gen)
    input_gates = (x @ w_ih.T).requires_grad_()
    hidden_gates = (h @ w_hh.T).requires_grad_()
    if cell == "lstm":
        c = torch.randn(5, 6, generator=gen, requires_grad=True)
        hy, cy, workspace = equivalents.PORTABLE["aten::_thnn_fused_lstm_cell.default"](
            input_gates, hidden_gates, c, b_ih, b_hh)
        want_h, want_c = torch.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)
        torch.testing.assert_close((hy, cy), (want_h, want_c))
        grad_h, grad_c = torch.randn_like(hy), torch.randn_like(cy)
        want = torch.autograd.grad((hy, cy), (input_gates, c), (grad_h, grad_c))
        got = equivalents.PORTABLE["aten::_thnn_fused_lstm_cell_backward_impl.default"](
            grad_h, grad_c, c.detach(), cy.detach(), workspace.detach(), True)
        torch.testing.assert_close(got[:2], want)
        torch.testing.assert_close(got[2], want[0].sum(0))
    else:
        h.requires_grad_()
        hy, workspace = equivalents.PORTABLE["aten::_thnn_fused_gru_cell.default"](
            input_gates, hidden_gates, h, b_ih, b_hh)
        torch.testing.assert_close(hy, torch.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh))
        grad_h = torch.randn_like(hy)
        want = torch.autograd.grad(hy, (input_gates, hidden_gates, h), grad_h)
        got = equivalents.PORTABLE["aten::_thnn_fused_gru_cell_backward.default"](
            grad_h, workspace.detach(), True)
        torch.testing.assert_close(got[:3], want)
        torch.testing.assert_close(got[3:], (want[0].sum(0), want[1].sum(0)))


def test_an_op_this_pytorch_lacks_is_skipped_where_guarded_and_named_where_not(
        monkeypatch, capsys):
    """A file generated with a newer PyTorch, run with an older one: an op the older
    one lacks stands in where the file guards it (its reason the lookup's), and where
    the file calls it unguarded the error says which op, which PyTorch, and what to do
    (a bare NotImplementedError named only the attribute lookup)."""
    missing = runtime._op(lambda: torch.ops.aten.no_such_op_here.default,
                          "aten::no_such_op_here.default")
    assert isinstance(missing, runtime._Unavailable)
    monkeypatch.setattr(runtime, "_FALLBACKS", [[(torch.float32, [2], [1], "device")]])
    monkeypatch.setitem(runtime._RUNTIME, "skipped", {})
    monkeypatch.setitem(runtime._RUNTIME, "device", torch.device("cpu"))
    assert runtime._guarded(0, missing).shape == (2,)
    (reason,) = runtime._RUNTIME["skipped"].values()
    assert "no_such_op_here" in reason and "mystique:" not in reason
    with pytest.raises(NotImplementedError) as raised:
        missing(torch.ones(2))
    text = str(raised.value)
    assert "aten::no_such_op_here.default is not an operator of this PyTorch" in text
    assert torch.__version__ in text and "--exclude" in text


@pytest.mark.parametrize("mode,packed", [(2, False), (2, True), (3, False), (1, True)])
def test_cudnn_rnns_run_as_torchs_portable_rnns_with_their_gradients(mode, packed):
    """An LSTM, GRU or RNN trained on CUDA calls cuDNN's network and, in autograd, its
    backward by name: the equivalents run the network through torch's portable
    kernels, and the backward gives the gradients autograd gives the module."""
    torch.manual_seed(0)
    cls = {1: torch.nn.RNN, 2: torch.nn.LSTM, 3: torch.nn.GRU}[mode]
    net = cls(4, 5, num_layers=2, bidirectional=True)
    length, batch = 6, 3
    x = torch.randn(length, batch, 4, requires_grad=True)
    h0 = torch.randn(4, batch, 5, requires_grad=True)
    c0 = torch.randn(4, batch, 5, requires_grad=True) if mode == 2 else None
    lengths = [6, 4, 2]
    data = (torch.nn.utils.rnn.pack_padded_sequence(x, lengths) if packed else x)
    out, hidden = net(data, (h0, c0) if mode == 2 else h0)
    out = out.data if packed else out
    hy, cy = hidden if mode == 2 else (hidden, None)
    grads = [torch.randn_like(t) for t in (out, hy)]
    leaves = [x, h0] + ([c0] if c0 is not None else []) + list(net._flat_weights)
    want = torch.autograd.grad([out, hy], leaves, grads)
    sizes = data.batch_sizes.tolist() if packed else []
    inp = data.data.detach() if packed else x.detach()
    args = dict(input=inp, weight=[w.detach() for w in net._flat_weights],
                weight_stride0=4, weight_buf=torch.empty(0), hx=h0.detach(),
                cx=None if c0 is None else c0.detach(), mode=mode, hidden_size=5,
                proj_size=0, num_layers=2, batch_first=False, dropout=0.0, train=True,
                bidirectional=True, batch_sizes=sizes, dropout_state=None)
    for key in ("aten::_cudnn_rnn.default", "aten::miopen_rnn.default"):
        forward = equivalents.PORTABLE[key](*_schema_call(key, args)[0])
        torch.testing.assert_close(forward[0], out.detach())
    args.update(output=out.detach(), grad_output=grads[0], grad_hy=grads[1],
                grad_cy=None, reserve=torch.empty(0), output_mask=[True] * 4)
    for key in ("aten::_cudnn_rnn_backward.default", "aten::miopen_rnn_backward.default"):
        grad_x, grad_h, grad_c, grad_w = equivalents.PORTABLE[key](*_schema_call(key, args)[0])
        got = [grad_x, grad_h] + ([grad_c] if c0 is not None else []) + grad_w
        if packed:  # the packed input's grad, padded back like the module's
            got[0] = torch.nn.utils.rnn.pad_packed_sequence(
                torch.nn.utils.rnn.PackedSequence(grad_x, data.batch_sizes))[0]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_the_hosts_lstm_layer_runs_as_torchs_portable_lstm(reverse, batch_first):
    """A host trace's LSTM runs oneDNN's layer and, in autograd, its backward by name
    (neither runs on a GPU): the equivalents match both, here where they run. The
    layer's input is time-major even for a batch_first LSTM (aten::mkldnn_rnn
    transposes it first, and passes the flag on): the equivalent read it as
    batch-major there, and raised or crashed in torch._VF.lstm."""
    torch.manual_seed(0)
    x, h, c = torch.randn(6, 3, 4), torch.randn(3, 5), torch.randn(3, 5)
    weights = [torch.randn(20, 4), torch.randn(20, 5), torch.randn(20), torch.randn(20)]
    flags = (reverse, [], 2, 5, 1, True, False, batch_first, True)
    want = torch.ops.aten.mkldnn_rnn_layer.default(x, *weights, h, c, *flags)
    got = equivalents.PORTABLE["aten::mkldnn_rnn_layer.default"](x, *weights, h, c, *flags)
    torch.testing.assert_close(got, want[:3])
    grads = [torch.randn_like(t) for t in want[:3]]
    back = (reverse, 2, 5, 1, True, True, False, [], batch_first, want[3])
    expected = torch.ops.aten.mkldnn_rnn_layer_backward.default(
        x, *weights, h, c, *want[:3], *grads, *back)
    got = equivalents.PORTABLE["aten::mkldnn_rnn_layer_backward.default"](
        x, *weights, h, c, *want[:3], *grads, *back)
    for g, w in zip(got, expected, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_a_fused_attentions_backward_with_a_float_mask_keeps_its_kernels_outputs():
    """The host flash kernel's backward returns three grads, a float mask or not, and
    the efficient kernel's the mask's grad only where its grad_input_mask asks; the
    mask shapes the attention either way."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=gen) for _ in range(3))
    mask = torch.randn(1, 2, 6, 6, generator=gen)
    out, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        q, k, v, 0.0, False, attn_mask=mask)
    grad = torch.randn_like(out)
    want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        grad, q, k, v, out, logsumexp, 0.0, False, attn_mask=mask)
    got = equivalents.PORTABLE[
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default"](
        grad, q, k, v, out, logsumexp, 0.0, False, attn_mask=mask)
    assert len(got) == 3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, mask)]
    expected = torch.autograd.grad(
        torch.nn.functional.scaled_dot_product_attention(
            *leaves[:3], attn_mask=leaves[3]), leaves, grad)
    efficient = equivalents.PORTABLE[
        "aten::_scaled_dot_product_efficient_attention_backward.default"]
    for asked in (True, False):
        got = efficient(grad, q, k, v, mask, out, logsumexp, None, None, 0.0,
                        [True, True, True, asked])
        torch.testing.assert_close(got[:3], expected[:3], atol=1e-4, rtol=1e-4)
        if asked:
            torch.testing.assert_close(got[3], expected[3], atol=1e-4, rtol=1e-4)
        else:
            assert len(got) == 3


def _int4_rows(values: torch.Tensor) -> torch.Tensor:
    """4-bit values (n x k, 0..15) packed two a byte in row-major order, the order the
    equivalents read a packed weight in."""
    flat = values.to(torch.uint8).reshape(-1, 2)
    return (flat[:, 0] << 4 | flat[:, 1]).reshape(values.shape[0], -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_weight_only_matmuls_run_as_the_kernel_dequantizes(dtype):
    """torchao's int4 weight-only linear: tinygemm (``_weight_int4pack_mm``, CUDA)
    and the CPU kernel (``_for_cpu``) were skipped where they cannot run, a quantized
    model's every linear gone from the replay. The equivalent dequantizes as the
    kernel does ((q - 8) * scale + zero per group) and multiplies: against the CPU
    kernel, given the same values in the kernel's packing and in row-major order."""
    gen = torch.Generator().manual_seed(0)
    n, k, group = 48, 128, 32
    values = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
    scale_zero = torch.randn(k // group, n, 2, generator=gen).to(dtype)
    x = torch.randn(5, k, generator=gen).to(dtype)
    expected = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x, torch.ops.aten._convert_weight_to_int4pack_for_cpu(values, 2), group,
        scale_zero)
    for key in ("aten::_weight_int4pack_mm.default",
                "aten::_weight_int4pack_mm_for_cpu.default"):
        got = equivalents.PORTABLE[key](x, _int4_rows(values), group, scale_zero)
        assert got.dtype == dtype and got.shape == (5, n)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), expected.float(), rtol=tol,
                                   atol=tol * float(expected.abs().max()))
    # tinygemm's int32 tiles hold the same bytes: n*k/8 int32, read as bytes
    tiles = _int4_rows(values).view(torch.int32).reshape(n // 8, k // 32, 32, 1)
    got = equivalents.PORTABLE["aten::_weight_int4pack_mm.default"](x, tiles, group, scale_zero)
    assert got.shape == (5, n)


def test_int8_weight_only_matmul_and_float8_rowwise_gemm_run_as_their_kernels():
    """``_weight_int8pack_mm`` (CPU and MPS kernels only) and MSLK's rowwise float8
    GEMM (torchao's float8 dynamic quantization on CUDA, a library the benchmark does
    not load) as torch ops, against the CPU kernel and ``torch._scaled_mm``."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=gen)
    weight = torch.randint(-128, 128, (32, 64), generator=gen, dtype=torch.int8)
    scales = torch.rand(32, generator=gen)
    torch.testing.assert_close(
        equivalents.PORTABLE["aten::_weight_int8pack_mm.default"](x, weight, scales),
        torch.ops.aten._weight_int8pack_mm(x, weight, scales), rtol=1e-4, atol=1e-3)
    xq = torch.randn(5, 64, generator=gen).to(torch.float8_e4m3fn)
    wq = torch.randn(32, 64, generator=gen).to(torch.float8_e4m3fn)
    x_scale, w_scale = torch.rand(5, 1, generator=gen), torch.rand(1, 32, generator=gen)
    bias = torch.randn(32, generator=gen)
    expected = torch._scaled_mm(xq, wq.t(), scale_a=x_scale, scale_b=w_scale,
                                out_dtype=torch.bfloat16)
    for key in ("mslk::f8f8bf16_rowwise.default", "fbgemm::f8f8bf16_rowwise.default"):
        got = equivalents.PORTABLE[key](xq, wq, x_scale, w_scale)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
        with_bias = equivalents.PORTABLE[key](xq, wq, x_scale, w_scale, bias)
        torch.testing.assert_close(with_bias.float(), expected.float() + bias,
                                   rtol=2e-2, atol=5e-2)
        output = torch.empty(5, 32, dtype=torch.bfloat16)
        written = equivalents.PORTABLE[key](xq, wq, x_scale, w_scale, None, True, output)
        assert written is output
        torch.testing.assert_close(output, expected, rtol=2e-2, atol=2e-2)


def _rnnt_reference(logits, targets, frames, labels, blank, fused):
    """One sequence's RNN-T loss by the lattice's definition, node by node (Graves
    2012): -log of the sum over alignments, each a path of blanks (t + 1) and labels
    (u + 1) ending with a blank after the last frame and label."""
    lp = logits.log_softmax(-1) if fused else logits
    alpha = {(0, 0): lp.new_zeros(())}
    for t in range(frames):
        for u in range(labels + 1):
            if (t, u) == (0, 0):
                continue
            terms = []
            if t:
                terms.append(alpha[t - 1, u] + lp[t - 1, u, blank])
            if u:
                terms.append(alpha[t, u - 1] + lp[t, u - 1, targets[u - 1]])
            alpha[t, u] = torch.logsumexp(torch.stack(terms), 0)
    return -(alpha[frames - 1, labels] + lp[frames - 1, labels, blank])


@pytest.mark.parametrize("fused", [True, False])
def test_rnnt_loss_equivalent_gives_the_lattices_loss_and_gradients(fused):
    """torchaudio's RNN-T loss is a C++ kernel that computes each sequence's loss and
    its gradient in one call (rnnt_loss_forward; the backward only scales them): an
    Emformer RNN-T's training step skipped it where torchaudio is absent (a vendor's
    machine), the loss's whole lattice missing from the benchmark. Its equivalent
    gives the loss and gradients by definition, padded lengths and the clamp included."""
    gen = torch.Generator().manual_seed(0)
    batch, frames, labels, classes = 3, 6, 4, 5
    logits = torch.randn(batch, frames, labels + 1, classes, generator=gen)
    if not fused:
        logits = logits.log_softmax(-1)
    targets = torch.randint(1, classes, (batch, labels), generator=gen, dtype=torch.int32)
    t_len = torch.tensor([6, 4, 1], dtype=torch.int32)
    u_len = torch.tensor([4, 2, 0], dtype=torch.int32)
    costs, grads = equivalents.PORTABLE["torchaudio::rnnt_loss_forward.default"](
        logits, targets, t_len, u_len, 0, -1.0, fused)
    leaf = logits.clone().requires_grad_()
    for b in range(batch):
        want = _rnnt_reference(leaf[b], targets[b], int(t_len[b]), int(u_len[b]), 0, fused)
        (want_grad,) = torch.autograd.grad(want, leaf)
        torch.testing.assert_close(costs[b], want.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grads[b], want_grad[b], atol=1e-5, rtol=1e-5)
    _, clamped = equivalents.PORTABLE["torchaudio::rnnt_loss.default"](
        logits, targets, t_len, u_len, 0, 0.01, fused)
    torch.testing.assert_close(clamped, grads.clamp(-0.01, 0.01))


@pytest.mark.parametrize(("order", "samples"), [(3, 300), (2, 7), (5, 130), (1, 10)])
def test_lfilter_loop_equivalent_gives_the_sample_loops_output(order, samples):
    """torchaudio's lfilter (and every biquad: highpass, lowpass, equalizer...) runs its
    IIR part in a C++ loop over samples, _lfilter_core_loop, writing into a padded
    buffer: without torchaudio the benchmark skipped it, the filtering missing. The
    equivalent solves the same recurrence a chunk at a time, to the loop's output
    (torchaudio's own generic loop, here), past outputs in the buffer included."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, samples, generator=gen)
    a_flipped = torch.randn(3, order, generator=gen) * 0.4
    a_flipped[:, -1] = 1.0
    buffer = torch.zeros(2, 3, samples + order - 1)
    buffer[..., : order - 1] = torch.randn(2, 3, order - 1, generator=gen)
    want = buffer.clone()
    for i in range(samples):  # torchaudio's _lfilter_core_generic_loop
        want[:, :, i + order - 1] = x[:, :, i] - (want[:, :, i: i + order] * a_flipped).sum(-1)
    got = buffer.clone()
    equivalents.PORTABLE["torchaudio::_lfilter_core_loop.default"](x, a_flipped, got)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_overdrive_loop_equivalent_gives_the_sample_loops_output():
    """overdrive's C++ loop (a first-order high-pass of the clipped signal, mixed with
    the input) as torchaudio's generic loop computes it, and its state left as the
    loop leaves it."""
    gen = torch.Generator().manual_seed(0)
    waveform = torch.randn(3, 200, generator=gen)
    temp = torch.randn(3, 200, generator=gen).clamp(-1, 1)
    last_in, last_out = torch.randn(3, generator=gen), torch.randn(3, generator=gen)
    want = torch.empty(3, 200)
    prev_in, prev_out = last_in.clone(), last_out.clone()
    for i in range(200):
        prev_out = temp[:, i] - prev_in + 0.995 * prev_out
        prev_in = temp[:, i]
        want[:, i] = waveform[:, i] * 0.5 + prev_out * 0.75
    got = torch.empty(3, 200)
    equivalents.PORTABLE["torchaudio::_overdrive_core_loop.default"](
        waveform, temp, last_in, last_out, got)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last_in, prev_in)
    torch.testing.assert_close(last_out, prev_out, atol=1e-5, rtol=1e-5)


GROUPED_LAYOUTS = [((128, 32), (4, 32, 24)),  # tokens x experts' weights
                   ((20, 128), (128, 24)),  # a weight's grad per expert
                   ((4, 20, 32), (32, 128)),  # groups of columns
                   ((4, 20, 32), (4, 32, 24))]  # a batch, no offs


@pytest.mark.parametrize("a,b", GROUPED_LAYOUTS)
def test_grouped_matmul_equivalent_matches_the_kernel(a, b):
    """The equivalent of ``_grouped_mm`` (which CUDA before sm80 and an older torch's
    CPU build lack), an empty group among them, against torch's own kernel."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(a, generator=gen), torch.randn(b, generator=gen)
    offs = None if len(a) == 3 and len(b) == 3 else torch.tensor([16, 48, 48, 128],
                                                                 dtype=torch.int32)
    want = torch._grouped_mm(x.bfloat16(), w.bfloat16(), offs=offs)
    got = equivalents.PORTABLE["aten::_grouped_mm.default"](x.bfloat16(), w.bfloat16(), offs)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)


def test_scaled_grouped_matmul_equivalent_scales_rows_and_each_groups_columns():
    """float8 experts (CUDA sm90+ only) as a bfloat16 grouped GEMM: self's rowwise
    scale per token, mat2's per expert and column, as a loop over experts computes it."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(4, 16, 32, generator=gen).to(torch.float8_e4m3fn).transpose(-2, -1)
    scale_a, scale_b = torch.rand(64, generator=gen), torch.rand(4, 16, generator=gen)
    ends = [16, 32, 32, 64]
    got = equivalents.PORTABLE["aten::_scaled_grouped_mm.default"](
        x, w, scale_a, scale_b, torch.tensor(ends, dtype=torch.int32),
        out_dtype=torch.bfloat16)
    want = torch.cat([(x[s:e].float() @ w[g].float()) * scale_a[s:e, None] * scale_b[g]
                      for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends, strict=True))])
    assert got.dtype == torch.bfloat16 and got.shape == (64, 16)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)


def _run_on_cpu(b: TraceBuilder, tmp_path: Path) -> tuple[str, subprocess.CompletedProcess]:
    """A built trace (recorded on cuda:0) generated and run on the CPU: the file's text,
    its whitespace folded, and the run, which skipped nothing and left no input NaN or
    inf (asserted)."""
    bench = tmp_path / "bench.py"
    generate(b.write(tmp_path / "t.json"), bench, GenerateOptions(command_line="t"))
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-1500:]
    result = last_json(proc.stdout)
    assert result["skipped_at_runtime"] == [] and result["nonfinite_inputs"] == []
    return " ".join(bench.read_text().split()), proc


def test_a_float8_grouped_matmul_of_a_cuda_trace_replays_on_cpu(tmp_path):
    """A CUDA trace's ``_scaled_grouped_mm`` (float8 MoE training) has no CPU kernel:
    the replay runs its equivalent, skips nothing, and says so."""

    b = TraceBuilder()
    schema = str(torch.ops.aten._scaled_grouped_mm.default._schema)
    x = b.tensor((64, 32), dtype="float8_e4m3fn", device="cuda:0")
    w = b.tensor((4, 32, 16), dtype="float8_e4m3fn", device="cuda:0", strides=(512, 1, 32))
    offs = b.tensor((4,), dtype="int32", device="cuda:0")
    b.op(schema, [x, w, b.tensor((64,), device="cuda:0"), b.tensor((4, 16), device="cuda:0"),
                  offs, None, None, 15, False],
         [b.tensor((64, 16), dtype="bfloat16", device="cuda:0")])
    text, proc = _run_on_cpu(b, tmp_path)
    assert "aten::_scaled_grouped_mm" in proc.stderr and "portable equivalent" in proc.stderr


def test_packed_attention_of_a_cuda_trace_replays_over_its_filled_spans(tmp_path):
    """flash_attn's varlen forward with its cu_seqlens given: filled as even spans
    over the recorded tokens, it runs as its equivalent on the CPU, nothing skipped."""
    b = TraceBuilder()
    _varlen_attention(b, b.tensor((5,), dtype="int32"), b.tensor((5,), dtype="int32"))
    text, proc = _run_on_cpu(b, tmp_path)
    assert '"spans", 20, 60,' in text and '"spans", 40, 90,' in text


def _packed(gen: torch.Generator, lengths: list[int]) -> tuple[torch.Tensor, ...]:
    q, k, v = (torch.randn(sum(lengths), 4, 8, generator=gen) for _ in range(3))
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    return q, k, v, cu


def _per_sequence(q, k, v, cu, causal=True):
    """Attention over each packed sequence on its own, heads first for SDPA."""
    bounds = cu.tolist()
    outs = [torch.nn.functional.scaled_dot_product_attention(
        *(t[s:e].transpose(0, 1) for t in (q, k, v)), is_causal=causal).transpose(0, 1)
        for s, e in itertools.pairwise(bounds)]
    return torch.cat(outs)


def test_aten_and_torch_varlen_flash_attention_equivalents_match_attention():
    """aten::_flash_attention_forward (CUDA) over a batch and over packed sequences,
    and torch.nn.attention.varlen's op, against SDPA per sequence, with the grads of
    their backwards."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, cu = _packed(gen, [5, 9, 2])
    want = _per_sequence(q, k, v, cu)
    values = {"query": q, "key": k, "value": v, "cum_seq_q": cu, "cum_seq_k": cu,
              "max_q": 9, "max_k": 9, "dropout_p": 0.0, "is_causal": True,
              "return_debug_mask": False}
    args, kwargs = _schema_call("aten::_flash_attention_forward.default", values)
    (got,) = equivalents.PORTABLE["aten::_flash_attention_forward.default"](*args, **kwargs)
    torch.testing.assert_close(got, want)
    values.update(cu_seq_q=cu, cu_seq_k=cu)
    args, kwargs = _schema_call("torch_attn::_varlen_attn.default", values)
    (got,) = equivalents.PORTABLE["torch_attn::_varlen_attn.default"](*args, **kwargs)
    torch.testing.assert_close(got, want)
    batched = {**values, "query": q[:8].reshape(2, 4, 4, 8), "key": k[:8].reshape(2, 4, 4, 8),
               "value": v[:8].reshape(2, 4, 4, 8), "cum_seq_q": None, "cum_seq_k": None}
    args, kwargs = _schema_call("aten::_flash_attention_forward.default", batched)
    (got,) = equivalents.PORTABLE["aten::_flash_attention_forward.default"](*args, **kwargs)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (batched["query"], batched["key"], batched["value"])),
        is_causal=True).transpose(1, 2)
    torch.testing.assert_close(got, expected)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grad = torch.randn_like(q)
    expected_grads = torch.autograd.grad(_per_sequence(*leaves, cu), leaves, grad)
    values.update(grad_out=grad, out=want, logsumexp=None, lse=None, rng_state=None,
                  unused=None)
    for key in ("aten::_flash_attention_backward.default",
                "torch_attn::_varlen_attn_backward.default"):
        args, kwargs = _schema_call(key, values)
        for got, want_grad in zip(equivalents.PORTABLE[key](*args, **kwargs), expected_grads,
                                  strict=True):
            torch.testing.assert_close(got, want_grad)


def test_torch_varlen_attention_of_a_cuda_trace_replays_on_cpu(tmp_path):
    """torch.nn.attention.varlen's op (its kernel CUDA only) in a CUDA trace: the
    benchmark loads its namespace, fills the cumulative lengths as spans of the tokens,
    and runs its equivalent on the CPU, nothing skipped."""

    b = TraceBuilder()
    q, k, v = (b.tensor((48, 4, 8), dtype="bfloat16", device="cuda:0") for _ in range(3))
    cu = b.tensor((4,), dtype="int32", device="cuda:0")
    b.op(LIBRARY_SCHEMAS["torch_attn::_varlen_attn.default"],
         [q, k, v, cu, cu, 20, 20, True, None, None, False, None, None, None],
         [b.tensor((48, 4, 8), dtype="bfloat16", device="cuda:0"),
          b.tensor((4, 48), device="cuda:0"), b.tensor((2,), dtype="int64", device="cuda:0")])
    text, proc = _run_on_cpu(b, tmp_path)
    assert '_load_namespace("torch.nn.attention.varlen")' in text
    assert '"spans", 20, 48,' in text
    assert "torch_attn._varlen_attn.default cannot run here" in proc.stderr
    assert "running its portable equivalent" in proc.stderr


def test_no_harness_name_is_defined_twice():
    """runtime.py and dist.py are inlined into one namespace: a second definition of a
    name replaces the first everywhere (an equivalent of aten::_flash_attention_backward
    named like SDPA's flash backward's took its place, and SDPA's backward replayed
    other gradients), and pyflakes misses it where the first is read in between."""
    inlined = harness_source()
    tree = ast.parse("\n".join([*inlined.runtime, "", *inlined.dist]))
    names = [node.name for node in tree.body
             if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)]
    assert sorted({n for n in names if names.count(n) > 1}) == []


@pytest.mark.parametrize("backend", ["cudnn", "miopen"])
def test_fused_convolution_relu_equivalents_match_convolution_then_relu(backend):
    """cuDNN's and MIOpen's fused convolution + (skip connection) + ReLU (GPU conv
    fusion: torch.jit.freeze, torch.fx) against conv2d and relu on the CPU."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 4, 9, 9, generator=gen), torch.randn(6, 2, 3, 3, generator=gen)
    bias, z = torch.randn(6, generator=gen), torch.randn(2, 6, 5, 5, generator=gen)
    values = {"self": x, "weight": w, "bias": bias, "stride": [2, 2], "padding": [1, 1],
              "dilation": [1, 1], "groups": 2, "z": z, "alpha": 0.5}
    conv = torch.nn.functional.conv2d(x, w, bias, 2, 1, 1, 2)
    args, kwargs = _schema_call(f"aten::{backend}_convolution_relu.default", values)
    got = equivalents.PORTABLE[f"aten::{backend}_convolution_relu.default"](*args, **kwargs)
    torch.testing.assert_close(got, conv.relu())
    args, kwargs = _schema_call(f"aten::{backend}_convolution_add_relu.default", values)
    got = equivalents.PORTABLE[f"aten::{backend}_convolution_add_relu.default"](*args, **kwargs)
    torch.testing.assert_close(got, (conv + 0.5 * z).relu())


def test_cudnn_spatial_transformer_equivalents_match_grid_sample_and_affine_grid():
    """cuDNN's grid sampler and affine grid generator (F.grid_sample and F.affine_grid
    with align_corners=True on CUDA) and their backwards, against the functional ops
    and autograd on the CPU."""
    gen = torch.Generator().manual_seed(0)
    theta = (torch.eye(2, 3) + 0.1 * torch.randn(2, 2, 3, generator=gen)).requires_grad_()
    x = torch.randn(2, 3, 6, 7, generator=gen, requires_grad=True)
    grid = torch.nn.functional.affine_grid(theta, [2, 3, 4, 5], align_corners=True)
    out = torch.nn.functional.grid_sample(x, grid, align_corners=True)
    grad = torch.randn_like(out)
    want = torch.autograd.grad(out, (x, grid, theta), grad, retain_graph=True)
    portable = equivalents.PORTABLE
    got_grid = portable["aten::cudnn_affine_grid_generator.default"](theta, 2, 3, 4, 5)
    torch.testing.assert_close(got_grid, grid)
    got = portable["aten::cudnn_grid_sampler.default"](x, grid)
    torch.testing.assert_close(got, out)
    grad_x, grad_grid = portable["aten::cudnn_grid_sampler_backward.default"](
        x, grid, grad)
    torch.testing.assert_close(grad_x, want[0])
    torch.testing.assert_close(grad_grid, want[1])
    grad_theta = portable["aten::cudnn_affine_grid_generator_backward.default"](
        grad_grid, 2, 3, 4, 5)
    torch.testing.assert_close(grad_theta, want[2])


def _sdpa_bshd(q, k, v, mask=None):
    """SDPA on (batch, sequence, heads, dim) tensors."""
    return torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask).transpose(1, 2)


def test_memory_efficient_attention_equivalents_match_attention():
    """aten::_efficient_attention_forward and _backward (CUDA; nested-tensor SDPA
    calls them directly): no mask, causal from the top left and from the bottom right,
    a learned bias with its grad, and packed sequences, against SDPA."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 4, 8, generator=gen)
    k, v = torch.randn(2, 7, 4, 8, generator=gen), torch.randn(2, 7, 4, 8, generator=gen)
    bias = torch.randn(2, 4, 5, 7, generator=gen)
    forward = equivalents.PORTABLE["aten::_efficient_attention_forward.default"]
    backward = equivalents.PORTABLE["aten::_efficient_attention_backward.default"]
    top_left = torch.ones(5, 7, dtype=torch.bool).tril()
    bottom_right = torch.ones(5, 7, dtype=torch.bool).tril(2)
    for mask_type, mask in ((0, None), (1, top_left), (2, bottom_right)):
        values = {"query": q, "key": k, "value": v, "dropout_p": 0.0,
                  "custom_mask_type": mask_type}
        args, kwargs = _schema_call("aten::_efficient_attention_forward.default", values)
        (got,) = forward(*args, **kwargs)
        torch.testing.assert_close(got, _sdpa_bshd(q, k, v, mask))
    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    want = _sdpa_bshd(*leaves)
    grad = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, leaves, grad)
    values = {"grad_out_": grad, "query": q, "key": k, "value": v, "bias": bias,
              "out": want.detach(), "dropout_p": 0.0, "custom_mask_type": 0,
              "bias_requires_grad": True}
    args, kwargs = _schema_call("aten::_efficient_attention_backward.default", values)
    for got, want_grad in zip(backward(*args, **kwargs), want_grads, strict=True):
        torch.testing.assert_close(got, want_grad)
    values["bias_requires_grad"] = False
    args, kwargs = _schema_call("aten::_efficient_attention_backward.default", values)
    assert backward(*args, **kwargs)[3] is None
    pq, pk, pv, cu = _packed(gen, [5, 9, 2])
    values = {"query": pq[None], "key": pk[None], "value": pv[None], "cu_seqlens_q": cu,
              "cu_seqlens_k": cu, "max_seqlen_q": 9, "max_seqlen_k": 9, "dropout_p": 0.0,
              "custom_mask_type": 1}
    args, kwargs = _schema_call("aten::_efficient_attention_forward.default", values)
    (got,) = forward(*args, **kwargs)
    torch.testing.assert_close(got[0], _per_sequence(pq, pk, pv, cu))


def test_cudnn_attention_equivalents_match_attention():
    """aten::_cudnn_attention_forward and _backward (CUDA) over a batch (heads
    first, as SDPA) and over packed sequences (nested-tensor SDPA), against SDPA."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=gen) for _ in range(3))
    forward = equivalents.PORTABLE["aten::_cudnn_attention_forward.default"]
    backward = equivalents.PORTABLE["aten::_cudnn_attention_backward.default"]
    values = {"query": q, "key": k, "value": v, "max_q": 6, "max_k": 6,
              "compute_log_sumexp": True, "dropout_p": 0.0, "is_causal": True,
              "return_debug_mask": False}
    args, kwargs = _schema_call("aten::_cudnn_attention_forward.default", values)
    (got,) = forward(*args, **kwargs)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
    torch.testing.assert_close(got, want.detach())
    grad = torch.randn_like(want)
    values.update(grad_out=grad, out=got)
    args, kwargs = _schema_call("aten::_cudnn_attention_backward.default", values)
    for got_grad, want_grad in zip(backward(*args, **kwargs),
                                   torch.autograd.grad(want, leaves, grad), strict=True):
        torch.testing.assert_close(got_grad, want_grad)
    pq, pk, pv, cu = _packed(gen, [5, 9, 2])
    values.update(query=pq, key=pk, value=pv, cum_seq_q=cu, cum_seq_k=cu, max_q=9,
                  max_k=9)
    args, kwargs = _schema_call("aten::_cudnn_attention_forward.default", values)
    (got,) = forward(*args, **kwargs)
    torch.testing.assert_close(got, _per_sequence(pq, pk, pv, cu))


def test_packed_memory_efficient_attention_of_a_cuda_trace_replays_on_cpu(tmp_path):
    """aten::_efficient_attention_forward and _backward called directly over packed
    sequences in a CUDA trace (no CPU kernel): the cumulative lengths are filled as
    spans of the tokens, both run as their equivalents, nothing skipped."""

    b = TraceBuilder()
    forward = str(torch.ops.aten._efficient_attention_forward.default._schema)
    backward = str(torch.ops.aten._efficient_attention_backward.default._schema)
    q, k, v = (b.tensor((1, 48, 4, 8), dtype="bfloat16", device="cuda:0")
               for _ in range(3))
    cu = b.tensor((4,), dtype="int32", device="cuda:0")
    out = b.tensor((1, 48, 4, 8), dtype="bfloat16", device="cuda:0")
    lse = b.tensor((3, 4, 32), device="cuda:0")
    seed, offset = (b.tensor((), dtype="int64", device="cuda:0") for _ in range(2))
    b.op(forward, [q, k, v, None, cu, cu, 20, 20, 0.0, 1, True, None, None, None],
         [out, lse, seed, offset, 20, 20])
    grads = [b.tensor((1, 48, 4, 8), dtype="bfloat16", device="cuda:0") for _ in range(3)]
    grad_out = b.tensor((1, 48, 4, 8), dtype="bfloat16", device="cuda:0")
    b.op(backward, [grad_out, q, k, v, None, out, cu, cu, 20, 20, lse, 0.0, seed, offset,
                    1, False, None, None, None, False],
         [*grads, b.tensor((0,), dtype="bfloat16", device="cuda:0")])
    text, proc = _run_on_cpu(b, tmp_path)
    assert '"spans", 20, 48,' in text
    for op in ("_efficient_attention_forward", "_efficient_attention_backward"):
        assert f"aten::{op}" in proc.stderr or f"aten.{op}" in proc.stderr
    assert "running its portable equivalent" in proc.stderr


def _two_four_dense(values: torch.Tensor) -> torch.Tensor:
    """The 2:4 matrix whose groups of four columns start with two of `values`."""
    rows, half = values.shape
    dense = torch.zeros(rows, half // 2, 4, dtype=values.dtype)
    dense[..., :2] = values.reshape(rows, half // 2, 2)
    return dense.reshape(rows, half * 2)


def test_semi_structured_sparse_gemm_equivalents_multiply_a_two_four_matrix():
    """CUTLASS's 2:4 sparse linear, mm and addmm, and cuSPARSELt's mm (its values
    and metadata in one buffer, 1-d as _cslt_compress makes it or 2-d as torch.sparse
    views it; int8 to int32, alpha per row, a transposed result): the product of a 2:4
    matrix of the kept values, as dense matmuls compute it."""
    gen = torch.Generator().manual_seed(0)
    portable = equivalents.PORTABLE
    x, values = torch.randn(3, 5, 16, generator=gen), torch.randn(8, 8, generator=gen)
    w, bias = _two_four_dense(values), torch.randn(8, generator=gen)
    got = portable["aten::_sparse_semi_structured_linear.default"](
        x, values, torch.zeros(8, 1, dtype=torch.int16), bias=bias, activation="relu")
    torch.testing.assert_close(got, (x @ w.t() + bias).relu())
    assert (w.reshape(8, 4, 4) != 0).sum(-1).max() <= 2
    b, c = torch.randn(16, 6, generator=gen), torch.randn(8, 6, generator=gen)
    got = portable["aten::_sparse_semi_structured_mm.default"](values, None, b)
    torch.testing.assert_close(got, w @ b)
    got = portable["aten::_sparse_semi_structured_addmm.default"](
        c, values, None, b, alpha=2, beta=0.5)
    torch.testing.assert_close(got, 0.5 * c + 2 * w @ b)
    half = values.half()
    buffer = torch.cat([half.reshape(-1), torch.zeros(8 * 16 // 16, dtype=torch.half)])
    for compressed in (buffer, buffer.reshape(8, -1)):
        got = portable["aten::_cslt_sparse_mm.default"](
            compressed, b.half(), bias.half(), transpose_result=True)
        assert got.shape == (6, 8) and got.dtype == torch.half
        torch.testing.assert_close(got.float(), (w @ b + bias[:, None]).t(),
                                   rtol=1e-2, atol=1e-2)
    q = torch.randint(-8, 8, (8, 8), generator=gen, dtype=torch.int8)
    buffer = torch.cat([q.reshape(-1), torch.zeros(8 * 16 // 8, dtype=torch.int8)])
    qb = torch.randint(-8, 8, (16, 6), generator=gen, dtype=torch.int8)
    alpha = torch.rand(8, generator=gen)
    got = portable["aten::_cslt_sparse_mm.default"](
        buffer, qb, alpha=alpha, out_dtype=torch.bfloat16)
    want = (_two_four_dense(q).float() @ qb.float()) * alpha[:, None]
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-1)


def test_mixed_dtypes_linear_equivalent_dequantizes_per_column():
    """CUTLASS's half x int8 (and int4, two a byte) linear: input @ (W * scale)."""
    gen = torch.Generator().manual_seed(0)
    x, scale = torch.randn(4, 16, generator=gen), torch.rand(8, generator=gen)
    w = torch.randint(-8, 8, (16, 8), generator=gen, dtype=torch.int8)
    got = equivalents.PORTABLE["aten::_mixed_dtypes_linear.default"](x, w, scale)
    torch.testing.assert_close(got, x @ (w.float() * scale))
    packed = torch.randint(0, 256, (16, 4), generator=gen, dtype=torch.uint8)
    got = equivalents.PORTABLE["aten::_mixed_dtypes_linear.default"](
        x, packed, scale, bias=scale, activation="relu")
    nibbles = torch.stack((packed >> 4, packed & 15), -1).reshape(16, 8).float() - 8
    torch.testing.assert_close(got, (x @ (nibbles * scale) + scale).relu())


def test_scaled_grouped_matmul_v2_equivalent_reads_its_scale_lists():
    """F.scaled_grouped_mm's _scaled_grouped_mm_v2 (CUDA only) takes its scales as
    lists with their recipes: rowwise ones scale as _scaled_grouped_mm's do."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(4, 16, 32, generator=gen).to(torch.float8_e4m3fn).transpose(-2, -1)
    scale_a, scale_b = torch.rand(64, generator=gen), torch.rand(4, 16, generator=gen)
    offs = torch.tensor([16, 32, 32, 64], dtype=torch.int32)
    want = equivalents.PORTABLE["aten::_scaled_grouped_mm.default"](
        x, w, scale_a, scale_b, offs, out_dtype=torch.bfloat16)
    values = {"self": x, "mat2": w, "scale_a": [scale_a], "recipe_a": [1],
              "swizzle_a": [], "scale_b": [scale_b], "recipe_b": [1], "swizzle_b": [],
              "offs": offs, "out_dtype": torch.bfloat16, "contraction_dim": [],
              "use_fast_accum": False}
    args, kwargs = _schema_call("aten::_scaled_grouped_mm_v2.default", values)
    got = equivalents.PORTABLE["aten::_scaled_grouped_mm_v2.default"](*args, **kwargs)
    torch.testing.assert_close(got, want)


def test_float8_flash_attention_equivalents_descale_their_operands():
    """FlashAttention 3's float8 path (aten::_flash_attention_forward.quantized and
    SDPA's flash .quantized overload, CUDA only): SDPA on the operands in bfloat16
    times their descales per batch and key/value head (grouped query heads)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 4, 8, generator=gen).to(torch.float8_e4m3fn)
    k, v = (torch.randn(2, 6, 2, 8, generator=gen).to(torch.float8_e4m3fn)
            for _ in range(2))
    dq, dk, dv = (torch.rand(2, 2, generator=gen) + 0.5 for _ in range(3))

    def scaled(t, d):
        heads = t.size(2)
        d = d.repeat_interleave(heads // 2, 1).to(torch.bfloat16)
        return t.to(torch.bfloat16) * d[:, None, :, None]

    expected = torch.nn.functional.scaled_dot_product_attention(
        *(scaled(t, d).transpose(1, 2) for t, d in ((q, dq), (k, dk), (v, dv))),
        is_causal=True, enable_gqa=True)
    values = {"query": q, "key": k, "value": v, "max_q": 6, "max_k": 6, "dropout_p": 0.0,
              "is_causal": True, "return_debug_mask": False, "q_descale": dq,
              "k_descale": dk, "v_descale": dv}
    key = "aten::_flash_attention_forward.quantized"
    args, kwargs = _schema_call(key, values)
    (got,) = equivalents.PORTABLE[key](*args, **kwargs)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected.transpose(1, 2))
    values.update(query=q.transpose(1, 2), key=k.transpose(1, 2), value=v.transpose(1, 2))
    key = "aten::_scaled_dot_product_flash_attention.quantized"
    args, kwargs = _schema_call(key, values)
    (got,) = equivalents.PORTABLE[key](*args, **kwargs)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("overload", ["default", "Tensor"])
def test_cudnn_ctc_loss_equivalent_returns_each_loss_and_their_sums_grad(overload):
    """cuDNN's CTC loss (both overloads) against the native loss per sequence and
    autograd's grad of their sum."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 3, 6, generator=gen)
    targets = torch.randint(1, 6, (9,), generator=gen, dtype=torch.int32)
    lengths = ([12, 12, 12], [2, 4, 3])
    if overload == "Tensor":
        lengths = tuple(torch.tensor(x, dtype=torch.int32) for x in lengths)
    log_probs = logits.log_softmax(-1).requires_grad_()
    want = torch.nn.functional.ctc_loss(log_probs, targets, *lengths, reduction="none")
    (want_grad,) = torch.autograd.grad(want.sum(), log_probs)
    loss, grad = equivalents.PORTABLE[f"aten::_cudnn_ctc_loss.{overload}"](
        log_probs.detach(), targets, *lengths, 0, True, False)
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(grad, want_grad)
    assert equivalents.PORTABLE[f"aten::_use_cudnn_ctc_loss.{overload}"](
        log_probs, targets, *lengths, 0) is True


def test_a_cudnn_ctc_loss_of_a_cuda_trace_replays_on_cpu(tmp_path):
    """F.ctc_loss with tensor lengths on CUDA ran cuDNN's loss inside ctc_loss: the
    replay runs its children (the loss and its grad, which the backward reads) as
    their equivalents, its lengths filled as the kernel takes them, nothing skipped."""

    b = TraceBuilder()
    ctc = str(torch.ops.aten.ctc_loss.Tensor._schema)
    use = str(torch.ops.aten._use_cudnn_ctc_loss.Tensor._schema)
    cudnn = str(torch.ops.aten._cudnn_ctc_loss.Tensor._schema)
    mul = str(torch.ops.aten.mul.Tensor._schema)
    probs = b.tensor((20, 3, 6), device="cuda:0")
    targets = b.tensor((12,), dtype="int32")
    input_lengths, target_lengths = (b.tensor((3,), dtype="int32") for _ in range(2))
    args = [probs, targets, input_lengths, target_lengths]
    loss, grad = b.tensor((3,), device="cuda:0"), b.tensor((20, 3, 6), device="cuda:0")
    whole = b.op(ctc, [*args, 0, 0, False], [loss])
    b.op(use, [*args, 0], [True], parent=whole)
    b.op(cudnn, [*args, 0, True, False], [loss, grad], parent=whole)
    b.op(mul, [grad, b.tensor((1, 3, 1), device="cuda:0")],
         [b.tensor((20, 3, 6), device="cuda:0")])
    text, proc = _run_on_cpu(b, tmp_path)
    assert '"span", 20, 20,' in text and '"sum", 12, 0,' in text
    assert "_cudnn_ctc_loss.Tensor cannot run here" in proc.stderr


def test_in_place_flash_attention_equivalents_write_out_and_return_the_lse():
    """aten::_flash_attention_forward_no_dropout_inplace and varlen attention's out=
    op (torch_attn::_varlen_attn_out), CUDA only: the output written into `out`
    (as SDPA per packed sequence computes it) and the log-sum-exp of the scaled
    scores, (heads, tokens) over packed sequences, (batch, heads, rows) over a batch."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, cu = _packed(gen, [5, 9, 2])
    want = _per_sequence(q, k, v, cu)
    bounds = cu.tolist()
    want_lse = torch.cat([
        ((q[s:e].transpose(0, 1) @ k[s:e].permute(1, 2, 0)) * 8 ** -0.5
         + torch.ones(e - s, e - s).tril().log()).logsumexp(-1)
        for s, e in itertools.pairwise(bounds)], dim=1)
    values = {"query": q, "key": k, "value": v, "cum_seq_q": cu, "cum_seq_k": cu,
              "cu_seq_q": cu, "cu_seq_k": cu, "max_q": 9, "max_k": 9, "dropout_p": 0.0,
              "is_causal": True, "return_debug_mask": False}
    for key in ("aten::_flash_attention_forward_no_dropout_inplace.default",
                "torch_attn::_varlen_attn_out.default"):
        out = torch.zeros_like(q)
        args, kwargs = _schema_call(key, {**values, "out": out})
        lse = equivalents.PORTABLE[key](*args, **kwargs)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(lse, want_lse)
    batched = [t[:8].reshape(2, 4, 4, 8) for t in (q, k, v)]
    out = torch.zeros_like(batched[0])
    values.update(query=batched[0], key=batched[1], value=batched[2], cum_seq_q=None,
                  cum_seq_k=None, out=out)
    args, kwargs = _schema_call(
        "aten::_flash_attention_forward_no_dropout_inplace.default", values)
    lse = equivalents.PORTABLE["aten::_flash_attention_forward_no_dropout_inplace.default"](
        *args, **kwargs)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in batched), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, expected)
    assert lse.shape == (2, 4, 4) and lse.dtype == torch.float32


def test_torch_varlen_attention_out_of_a_cuda_trace_replays_on_cpu(tmp_path):
    """varlen attention's out= op (its kernel CUDA only, for inference) in a CUDA
    trace: its equivalent writes the output and returns the log-sum-exp on the CPU,
    its spans filled, nothing skipped."""

    b = TraceBuilder()
    q, k, v, out = (b.tensor((48, 4, 8), dtype="bfloat16", device="cuda:0")
                    for _ in range(4))
    cu = b.tensor((4,), dtype="int32", device="cuda:0")
    b.op(LIBRARY_SCHEMAS["torch_attn::_varlen_attn_out.default"],
         [out, q, k, v, cu, cu, 20, 20, True, None, None, False, None, None, None],
         [b.tensor((4, 48), device="cuda:0")])
    text, proc = _run_on_cpu(b, tmp_path)
    assert '"spans", 20, 48,' in text
    assert "torch_attn._varlen_attn_out.default cannot run here" in proc.stderr
