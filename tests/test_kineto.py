"""Issue 4: link ET with Kineto (timing, kernels, streams), stream/thread schedule, host
gaps, original timing in the benchmark."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch.profiler import (
    ExecutionTraceObserver,
    ProfilerActivity,
    profile,
    schedule,
    tensorboard_trace_handler,
)
from torch.utils.checkpoint import checkpoint

from mystique_gen.backends.layout import names_statement
from mystique_gen.backends.render import format_with_black
from mystique_gen.backends.schedule import gap_literal, helper_call
from mystique_gen.cli import main as cli_main
from mystique_gen.driver import _unprofiled_threads, compile_trace, generate
from mystique_gen.errors import TraceError
from mystique_gen.ir import Op, OpTiming, Program
from mystique_gen.ir.schema import parse_signature
from mystique_gen.options import BuildOptions
from mystique_gen.passes.filters import kineto_steps
from mystique_gen.passes.frees import NEVER, allocations
from mystique_gen.passes.link import link_nodes
from mystique_gen.passes.streams import plan_schedule
from mystique_gen.sources.et import load_trace
from mystique_gen.sources.kineto import kineto_from_document, load_kineto
from mystique_gen.tools.capture import capture
from tests.conftest import last_json, run_benchmark
from tests.golden_cases import kineto_doc, two_stream, two_threads
from tests.models import MODELS
from tests.tracebuilder import ADD_, RELU, TraceBuilder

# -- a captured ET + Kineto pair (newer ids), and older-id variants of it ----------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("pair")
    result = capture(MODELS["mlp_sgd"](), out, name="mlp", timing_iters=1)
    return result.et_path, result.kineto_path


def _rewrite(src, dst, edit):
    doc = json.loads(src.read_text())
    for ev in doc["traceEvents"]:
        if isinstance(ev.get("args"), dict):
            edit(ev["args"])
    dst.write_text(json.dumps(doc))
    return dst


def _linked_fraction(et, kineto, **kwargs):
    program = compile_trace(et, kineto=kineto, **kwargs)
    assert program.timing is not None
    return program.timing.linked_ops / len(program.ops), program.timing.link_methods


def test_captured_pair_links_by_record_function_id(pair):
    fraction, methods = _linked_fraction(*pair)
    assert fraction >= 0.95
    assert set(methods) == {"record_function_id"}


def test_external_id_fallback(pair, tmp_path):
    et, kineto = pair
    def older_profiler(args):  # before PyTorch 2.4, External id carried the rf_id
        if "Record function id" in args:
            args["External id"] = args.pop("Record function id")

    old = _rewrite(kineto, tmp_path / "k.json", older_profiler)
    fraction, methods = _linked_fraction(et, old)
    assert fraction >= 0.95 and set(methods) == {"external_id"}


def test_constant_offset_fallback(pair, tmp_path):
    def shift(args):
        args.pop("Record function id", None)
        if "External id" in args:
            args["External id"] += 1000

    fraction, methods = _linked_fraction(pair[0], _rewrite(pair[1], tmp_path / "k.json", shift))
    assert fraction >= 0.95 and set(methods) == {"external_id_offset"}


def test_order_fallback_without_ids(pair, tmp_path):
    def strip(args):
        args.pop("Record function id", None)
        args.pop("External id", None)

    fraction, methods = _linked_fraction(pair[0], _rewrite(pair[1], tmp_path / "k.json", strip))
    assert fraction >= 0.95 and set(methods) == {"order"}


def test_a_later_cycle_links_its_own_steps_when_ids_drift(tmp_path):
    """A repeating schedule's observer writes both cycles into one ET; each cycle's
    Kineto trace holds its own steps. Before torch 2.4 (no record function id), the
    second cycle's External ids run ahead of the ET's rf_ids (here by 400): the offset
    vote paired the first cycle's nodes with the second cycle's events, and the step
    the Kineto trace holds (the default) linked none of its ops."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2))
    x = torch.randn(4, 8)
    et_path, cycles = tmp_path / "rep.et.json", []

    def export(prof: profile) -> None:
        cycles.append(tmp_path / f"c{len(cycles)}.json")
        prof.export_chrome_trace(str(cycles[-1]))

    observer = ExecutionTraceObserver().register_callback(str(et_path))
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=observer,
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                 on_trace_ready=export) as prof:
        for _ in range(9):
            model(x).sum().backward()
            prof.step()
    observer.unregister_callback()
    doc = json.loads(cycles[1].read_text())
    for ev in doc["traceEvents"]:
        args = ev.get("args")
        if isinstance(args, dict) and "Record function id" in args:
            args["External id"] = args.pop("Record function id") + 400
    second = tmp_path / "second.json"
    second.write_text(json.dumps(doc))
    program = compile_trace(et_path, kineto=second)
    assert program.timing is not None
    assert program.timing.linked_ops >= 0.95 * len(program.ops)
    assert set(program.timing.link_methods) == {"external_id_offset"}
    # A Kineto trace of another session, its steps numbered otherwise (no number in
    # common), still links by order, as before steps were compared.
    for ev in doc["traceEvents"]:
        if str(ev.get("name", "")).startswith("ProfilerStep#"):
            ev["name"] = f"ProfilerStep#{100 + int(ev['name'].split('#')[1])}"
        args = ev.get("args")
        if isinstance(args, dict):
            args.pop("External id", None)
    renumbered = tmp_path / "renumbered.json"
    renumbered.write_text(json.dumps(doc))
    program = compile_trace(et_path, kineto=renumbered)
    assert program.timing is not None
    assert program.timing.linked_ops >= 0.95 * len(program.ops)


def test_kineto_dir_of_a_repeating_schedule_takes_the_cycle_of_the_step(tmp_path, capsys):
    """HTA's and PARAM's recipe: one profiler with a repeating schedule, its ET observer
    and tensorboard_trace_handler(DIR). The ET holds every cycle's steps, DIR one
    Kineto trace per cycle; --kineto DIR was refused ("2 Kineto traces ... for one
    trace"). It now takes the cycle holding the step to replay: the first step by
    default, --iteration N's otherwise, for inspect as for generation; a step no cycle
    holds (or --iteration all) is still refused."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2))
    x = torch.randn(4, 8)
    et_path, logs = tmp_path / "et.json", tmp_path / "logs"
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=observer,
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                 on_trace_ready=tensorboard_trace_handler(str(logs))) as prof:
        for _ in range(9):
            model(x).sum().backward()
            prof.step()
    observer.unregister_callback()
    cycles = sorted(logs.glob("*.pt.trace.json"), key=lambda f: f.stat().st_mtime)
    assert len(cycles) == 2
    held = [sorted(kineto_steps(load_kineto(c))) for c in cycles]
    assert len(held[0]) == 2 and len(held[1]) == 2 and held[0][-1] < held[1][0]
    for iteration, cycle in (("auto", 0), (str(held[1][1]), 1)):
        out = tmp_path / f"bench_{iteration}.py"
        rc = cli_main([str(et_path), "--kineto", str(logs), "--iteration", iteration,
                       "-o", str(out)])
        assert rc == 0, capsys.readouterr().err
        text = out.read_text()
        assert f'"kineto": "{cycles[cycle].name}"' in text
        header = " ".join(text.split('"""')[1].split())
        assert "(one per cycle of a repeating schedule), the one holding step #" in header
        rc = cli_main(["inspect", str(et_path), "--kineto", str(logs), "--iteration",
                       iteration, "--json"])
        summary = json.loads(capsys.readouterr().out)
        assert rc == 0 and summary["kineto"] == cycles[cycle].name
        assert summary["linked_ops"] == summary["selected_ops"]
    for iteration in ("all", "99"):
        rc = cli_main([str(et_path), "--kineto", str(logs), "--iteration", iteration,
                       "-o", str(tmp_path / "refused.py")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "2 Kineto traces" in err[0], err
    # One folder for the ET and its cycles, given as both: the ET is its one trace
    # (the Kineto traces were taken for ETs too: "no 'nodes' field").
    (logs / "et.json").write_bytes(et_path.read_bytes())
    rc = cli_main([str(logs), "--kineto", str(logs), "-o", str(tmp_path / "folder.py")])
    assert rc == 0, capsys.readouterr().err
    assert f'"kineto": "{cycles[0].name}"' in (tmp_path / "folder.py").read_text()


def test_a_kineto_trace_of_other_ops_links_nothing_by_order(pair, tmp_path):
    """Links by name and order pair any two traces that share op names: an MLP's ET
    with a transformer's or a CNN's Kineto trace linked 35-62 of their ops by order,
    above the half that warns, and replayed gaps between unrelated ops (5x the step).
    The same events in another order (time reversed, nesting kept) link none."""
    et, kineto = pair
    doc = json.loads(kineto.read_text())
    end = max(ev["ts"] + ev.get("dur", 0) for ev in doc["traceEvents"] if "ts" in ev)
    for ev in doc["traceEvents"]:
        if "ts" in ev:
            ev["ts"] = end - ev["ts"] - ev.get("dur", 0)
        args = ev.get("args")
        if isinstance(args, dict):
            args.pop("Record function id", None)
            args.pop("External id", None)
    other = tmp_path / "reversed.json"
    other.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match="it recorded other ops, not this trace's"):
        program = compile_trace(et, kineto=other)
    assert program.timing is not None and program.timing.linked_ops == 0


@pytest.mark.parametrize("profiler", ["before 2.4", "2.4 and later"])
def test_a_kineto_trace_of_another_process_links_by_order(pair, tmp_path, profiler):
    """Ids count from the same start in every process. A torch 2.1 ET with a Kineto
    trace of another run (its External ids carry the record function ids) linked the
    same step's ops by id by chance, and was taken for a pair recorded together: its
    gaps were corrected for an observer. Across processes nothing links by id, the
    header says why, and the observer is in the gaps only where the Kineto trace's
    own record function ids show one (2.4 and later)."""
    et, kineto = pair
    doc = json.loads(kineto.read_text())
    pids = {ev["pid"] for ev in doc["traceEvents"] if ev.get("ph") == "X"
            and isinstance(ev.get("pid"), int)}
    for ev in doc["traceEvents"]:
        if ev.get("pid") in pids:
            ev["pid"] += 1
        args = ev.get("args")
        if profiler == "before 2.4" and isinstance(args, dict) and \
                "Record function id" in args:
            args["External id"] = args.pop("Record function id")
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    # Another run's times are not the ET's: said on stderr, not in the header alone.
    with pytest.warns(UserWarning, match="other.json was recorded by another process"):
        program = compile_trace(et, kineto=other)
    assert program.timing is not None
    assert set(program.timing.link_methods) == {"order"}
    assert program.timing.linked_ops >= 0.95 * len(program.ops)
    assert program.timing.observer_in_gaps == (profiler == "2.4 and later")
    notes = " ".join(" ".join(d.reason.split()) for d in program.diagnostics)
    assert "other.json was recorded by another process" in notes
    assert ("its record function ids show one" in notes) == (profiler == "2.4 and later")


def test_links_point_at_equally_named_events(pair):
    et, kineto = pair
    trace, k = load_trace(et), load_kineto(kineto)
    links = link_nodes(trace, k)
    by_id = {n.id: n for n in trace.nodes}
    assert links.events
    assert all(by_id[nid].name == ev.name for nid, ev in links.events.items())


def test_op_timing_is_consistent(pair):
    program = compile_trace(pair[0], kineto=pair[1])
    timed = [op for op in program.ops if op.timing is not None]
    assert all(0 <= op.timing.cpu_self_us <= op.timing.cpu_us for op in timed)
    assert all(op.timing.gap_us is None or op.timing.gap_us >= 0 for op in timed)
    # Gaps come from the capture's profile-only steps, where the first op's gap is the
    # step's own host time before it (passes/hostgaps.py).
    assert program.timing is not None and program.timing.host_gaps.startswith("mlp.profile")
    assert all(op.timing.gap_us is not None for op in timed)
    total_cpu = sum(op.timing.cpu_us for op in timed) / 1000
    assert program.timing is not None and total_cpu <= program.timing.original_ms
    assert program.streams == []  # a CPU run launches no kernels


def test_linked_cpu_replay_runs_and_reports_original(pair, tmp_path):
    bench = tmp_path / "bench.py"
    text = generate(pair[0], bench, kineto=pair[1])
    assert format_with_black(text) == text
    assert "_host_gap(" in text and "ORIGINAL_OPS = [" in text
    for mode in ("off", "recorded"):
        proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                             "--json", "--host-gaps", mode)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = last_json(proc.stdout)
        assert out["host_gaps"] == mode
        # The clock: the eager step the capture timed, not the span of the step it
        # recorded under the profiler and the ET observer (several times longer).
        sidecar = json.loads(pair[1].with_name("mlp.step.json").read_text())
        assert out["original_ms"] == pytest.approx(sidecar["step_ms_median"], abs=1e-4)
        assert "step.json" in out["original_ms_from"]
        assert out["original_ratio"] == pytest.approx(out["iter_ms_median"] / out["original_ms"])


def test_original_step_without_a_capture_sidecar_is_the_profiled_span(pair, tmp_path):
    """A Kineto trace from another tool has no measured step beside it: the benchmark
    reports the recorded step's span and says that it was profiled."""
    kineto = tmp_path / "other.kineto.json"
    kineto.write_bytes(pair[1].read_bytes())  # no other.step.json beside it
    program = compile_trace(pair[0], kineto=kineto)
    timing = program.timing
    assert timing is not None and timing.measured_step_ms is None
    assert timing.step_ms == timing.original_ms and "ET observer" in timing.step_ms_from
    # With the capture's sidecar, the measured eager step (which timing alone cannot
    # tell apart from the span on a loaded machine: 3.9 ms against a 2.9 ms span once).
    with_sidecar = compile_trace(pair[0], kineto=pair[1]).timing
    assert with_sidecar is not None and with_sidecar.measured_step_ms is not None
    assert with_sidecar.step_ms == with_sidecar.measured_step_ms
    assert "step.json" in with_sidecar.step_ms_from


def _link_like_chakra(et_path, kineto_path, out, kernels: bool = True):
    """An ET+ as Chakra's trace_link writes one: node ids renumbered from 1 in id order,
    each op carrying its Kineto event's ts, inclusive_dur and exclusive_dur, and (on a
    GPU trace) a node per kernel below the op that launched it: a copy of that op,
    schema and arguments included, with the kernel's name, cat, ts and stream."""
    doc = json.loads(et_path.read_text())
    events = {ev["args"]["Record function id"]: ev
              for ev in json.loads(kineto_path.read_text())["traceEvents"]
              if ev.get("ph") == "X" and "Record function id" in ev.get("args", {})}
    nodes = sorted(doc["nodes"], key=lambda n: n["id"])
    parents = {n["ctrl_deps"] for n in nodes}
    renumber = {n["id"]: k for k, n in enumerate(nodes, start=1)}
    device = []
    for node in nodes:
        attrs = {a["name"]: a["value"] for a in node["attrs"]}
        ev = events.get(attrs.get("rf_id"))
        if ev is not None:
            node.update(ts=ev["ts"], inclusive_dur=ev["dur"], exclusive_dur=ev["dur"],
                        inter_thread_dep=None)
        if kernels and ev is not None and attrs.get("op_schema") and node["id"] not in parents:
            kernel = copy.deepcopy(node)
            kernel.update(id=len(nodes) + len(device) + 1, ctrl_deps=renumber[node["id"]],
                          name="void at::native::vectorized_elementwise_kernel<4>(int)",
                          cat="kernel", ph="X", ts=ev["ts"] + ev["dur"], inclusive_dur=2,
                          exclusive_dur=2, stream=7)
            device.append(kernel)
    for node in nodes:
        node["id"], node["ctrl_deps"] = renumber[node["id"]], renumber.get(node["ctrl_deps"], 0)
    doc["nodes"] = nodes + device
    out.write_text(json.dumps(doc))
    return out


def test_a_chakra_et_plus_replays_its_ops_and_links_its_own_times(pair, tmp_path):
    """Chakra's trace_link merges an ET and its Kineto trace into one file. Its kernel
    nodes copy the launching op's schema and arguments: kept as nodes, they are not
    ops to replay. Its times link as a Kineto trace would (``--kineto`` on the file)."""
    et_plus = _link_like_chakra(*pair, tmp_path / "mlp_plus.json")
    trace = load_trace(et_plus)
    assert trace.device_nodes and trace.linked_timing
    assert not any(n.attrs.get("cat") == "kernel" for n in trace.nodes)
    plain, linked = compile_trace(pair[0]), compile_trace(et_plus)
    assert [op.name for op in linked.ops] == [op.name for op in plain.ops]
    timed = compile_trace(et_plus, kineto=et_plus)
    assert timed.timing is not None and timed.timing.linked_ops >= 0.95 * len(timed.ops)
    # The kernels' stream, from the device nodes below the ops that launched them.
    assert [s for s in timed.streams] and all(op.timing is not None for op in timed.ops
                                              if op.stream is not None)
    bench = tmp_path / "bench.py"
    generate(et_plus, bench, kineto=et_plus)
    # Its times reach the benchmark (the file named as its own --kineto had been
    # dropped, as an ET in a --kineto folder is).
    assert f'"kineto": "{et_plus.name}"' in bench.read_text()
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["ops"] == len(plain.ops)


def test_an_execution_trace_without_times_is_no_kineto_trace(pair, tmp_path, capsys):
    with pytest.raises(TraceError, match="without linked Kineto times"):
        load_kineto(pair[0])
    # Named as its own --kineto, it is refused so, not generated without timing.
    out = tmp_path / "bench.py"
    assert cli_main([str(pair[0]), "--kineto", str(pair[0]), "-o", str(out)]) == 2
    assert "without linked Kineto times" in capsys.readouterr().err and not out.exists()


def test_hta_pair_links(shared_traces):
    et = shared_traces / "hta" / "simple_add_et.json.gz"
    kineto = shared_traces / "hta" / "simple_add_kineto.json.gz"
    program = compile_trace(et, kineto=kineto)
    assert program.timing is not None
    assert program.timing.linked_ops / len(program.ops) >= 0.95
    assert program.timing.link_methods == {"external_id": len(program.ops)}
    kernels = [k for op in program.ops if op.timing for k in op.timing.kernels]
    assert kernels and {k.stream for k in kernels} == {7}
    assert [(s.stream, s.main) for s in program.streams] == [(7, True)]
    assert all(op.stream is None for op in program.ops)


def test_inspect_kineto_json(shared_traces, capsys):
    rc = cli_main(["inspect", str(shared_traces / "hta" / "simple_add_et.json.gz"),
                   "--kineto", str(shared_traces / "hta" / "simple_add_kineto.json.gz"),
                   "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["linked_ops"] == out["selected_ops"] == 10
    assert out["streams"] == [{"stream": 7, "ops": 4, "kernels": 4, "main": True}]
    # No capture sidecar beside HTA's pair: the step is the recorded span, so named.
    assert out["step_ms"] == out["original_ms"] and "Kineto span" in out["step_ms_from"]


def test_inspect_takes_a_directory_of_one_kineto_trace(shared_traces, tmp_path, capsys):
    """As generation does (a tensorboard_trace_handler directory): --kineto DIR holding
    one Kineto trace is that trace; one with several is refused, naming them."""
    logs = tmp_path / "logs"
    logs.mkdir()
    kineto = (shared_traces / "hta" / "simple_add_kineto.json.gz").read_bytes()
    (logs / "worker0.1.pt.trace.json.gz").write_bytes(kineto)
    et = str(shared_traces / "hta" / "simple_add_et.json.gz")
    assert cli_main(["inspect", et, "--kineto", str(logs), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["linked_ops"] == 10
    (logs / "worker0.2.pt.trace.json.gz").write_bytes(kineto)
    assert cli_main(["inspect", et, "--kineto", str(logs)]) == 2
    assert "2 Kineto traces in this directory" in capsys.readouterr().err


def test_a_kineto_directory_beside_its_et_takes_the_tensorboard_file(shared_traces, tmp_path,
                                                                  capsys):
    """HTA's and PARAM's recipes write the ET and tensorboard_trace_handler's file into
    one folder, often with notes of their own: --kineto DIR is the *.pt.trace.json.gz
    there, not the ET or another JSON file (before: "3 Kineto traces (et.json, ...)",
    refused)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker0.1.pt.trace.json.gz").write_bytes(
        (shared_traces / "hta" / "simple_add_kineto.json.gz").read_bytes())
    (logs / "et.json.gz").write_bytes(
        (shared_traces / "hta" / "simple_add_et.json.gz").read_bytes())
    (logs / "notes.json").write_text("{}")
    et = str(logs / "et.json.gz")
    assert cli_main(["inspect", et, "--kineto", str(logs), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["linked_ops"] == 10
    assert cli_main([et, "--kineto", str(logs), "-o", str(tmp_path / "bench.py")]) == 0
    assert "linked" in (tmp_path / "bench.py").read_text()


def test_kineto_loader_errors_are_clean():
    with pytest.raises(TraceError, match="traceEvents"):
        kineto_from_document({"nodes": []}, name="et.json")
    with pytest.raises(TraceError, match=r"traceEvents\[0\].*'ts'"):
        kineto_from_document({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": "x"}]},
                             name="k.json")


def _profile_a_loader(tmp_path, *, iterator_first: bool):
    """A training loop over a DataLoader with a forked worker, recorded as HTA's and
    PARAM's recipes record one: ``profile(execution_trace_observer=...)`` around it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=1,
                                         multiprocessing_context="fork")
    tmp_path.mkdir()
    et_path, kineto = tmp_path / "et.json", tmp_path / "kineto.json"
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    batches = iter(loader) if iterator_first else None
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=observer) as prof:
        for i, (x, y) in enumerate(batches if iterator_first else loader):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if i == 1:
                break
    prof.export_chrome_trace(str(kineto))
    del batches
    return et_path, kineto


def test_an_et_with_forked_dataloader_workers_is_refused_with_its_cause(tmp_path, capsys):
    """A DataLoader worker forked inside the recorded span inherits the observer and
    its open file and writes its own ops into the parent's ET, numbered from the same
    ids: the refusal said only "duplicate node id"; it names the cause and the way to
    record the loop, and that way records an ET that replays."""
    et, kineto = _profile_a_loader(tmp_path / "inside", iterator_first=False)
    rc = cli_main([str(et), "--kineto", str(kineto), "-o", str(tmp_path / "bench.py")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1, err
    assert "duplicate node id" in err[0] and "several processes" in err[0], err[0]
    assert "DataLoader" in err[0] and "iter(loader)" in err[0], err[0]
    et, kineto = _profile_a_loader(tmp_path / "first", iterator_first=True)
    program = compile_trace(et, kineto=kineto)
    assert program.timing is not None and program.timing.linked_ops == len(program.ops)


# -- synthetic traces: a two-stream schedule, two host threads ---------------------------


TWO_STREAM_REPLAY = """\
    st0 = _stream(0)
    mm = aten_mm(mm_x, mm_mat2)
    ev0 = _record()
    with _on(st0):
        _host_gap(10.0, before=1)
        _wait(ev0)
        relu = aten_relu(mm)
        _host_gap(10.0, before=2)
        mm_1 = aten_mm(relu, mm_mat2)
        del relu
        ev1 = _record()
    _host_gap(10.0, before=3)
    _wait(ev1)
    aten_add__Tensor(mm, mm_1)
    del mm_1
    _host_gap(10.0, before=4)
    aten_relu(mm)
    del mm
    _join(st0)
"""


def test_two_stream_trace_emits_streams_and_events(tmp_path):
    et, kineto = two_stream(tmp_path)
    program = compile_trace(et, kineto=kineto)
    assert [(s.stream, s.ops, s.kernels, s.main) for s in program.streams] == [
        (7, 3, 4, True), (20, 2, 2, False)]
    assert [op.stream for op in program.ops] == [None, 20, 20, None, None]
    assert [op.stream_waits for op in program.ops] == [[], [0], [], [2], []]
    bench = tmp_path / "bench.py"
    text = generate(et, bench, kineto=kineto)
    assert format_with_black(text) == text
    assert TWO_STREAM_REPLAY in text
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc.stdout)
    assert out["original_ms"] == pytest.approx(0.094)
    assert "Kineto span" in out["original_ms_from"]


def test_stream_waits_follow_in_place_writes(tmp_path):
    """A side-stream op that reads a weight the main stream updated in place waits."""
    tb = TraceBuilder()
    w, g, a = tb.tensor((4, 4)), tb.tensor((4, 4)), tb.tensor((4, 4))
    n1 = tb.op(ADD_, [w, g, 1], [w])  # main: w += g
    n2 = tb.op(RELU, [w], [a])  # side: reads w
    et = tb.write(tmp_path / "t.et.json")
    kineto = tmp_path / "t.kineto.json"
    kineto.write_text(json.dumps(kineto_doc(tb, {n1: (0, 5, [7, 7]), n2: (10, 5, [9])})))
    program = compile_trace(et, kineto=kineto)
    assert [op.stream for op in program.ops] == [None, 9]
    assert program.ops[1].stream_waits == [0]


def test_threads_default_is_one_replay_thread(tmp_path):
    text = generate(two_threads(tmp_path), tmp_path / "b.py")
    assert "def thread_" not in text and "_run_threads(" not in text.split("def replay")[1]


def test_threads_replay_each_host_thread(tmp_path):
    et = two_threads(tmp_path)
    program = compile_trace(et, options=BuildOptions(threads=True))
    assert program.threaded
    assert [op.thread_waits for op in program.ops] == [[], [0], [], [1], []]
    bench = tmp_path / "bench.py"
    text = generate(et, bench, threads=True)
    assert format_with_black(text) == text
    body = text.split("def replay")[1]
    assert "    def thread_0():\n        nonlocal t0\n" in body
    assert "    def thread_1():\n        nonlocal t1\n        _await(0)\n" in body
    assert "_signal(1)" in body and "_await(1)" in body
    assert "    _run_threads(2, thread_0, thread_1)\n" in body
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "3", "--json",
                         timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["iters"] == 3


def test_schedule_is_general_over_assigned_streams(tmp_path):
    """Another pass (``--compose``) may set Op.stream/Op.thread itself and plan waits."""
    et = two_threads(tmp_path)
    program = compile_trace(et)
    for op in program.ops:
        op.stream = None if op.thread == 1 else 5
    plan_schedule(program)
    assert [s.stream for s in program.streams] == [5]
    assert [op.stream_waits for op in program.ops] == [[], [0], [], [1], []]


# -- emitter functions ------------------------------------------------------------------


def test_helper_call():
    assert helper_call("_wait", ["ev0"], 1) == ["    _wait(ev0)"]
    assert helper_call("_record", [], 2, "ev3") == ["        ev3 = _record()"]
    long = [f"thread_{i}" for i in range(12)]
    lines = helper_call("_run_threads", ["12", *long], 1)
    assert all(len(line) <= 88 for line in lines) and lines[0] == "    _run_threads("


def test_names_statement_splits_at_line_length():
    names = [f"t{i}" for i in range(40)]
    lines = names_statement("nonlocal", names, 2)
    assert all(len(line) <= 88 and line.startswith("        nonlocal ") for line in lines)
    assert [n for line in lines for n in line.split(" ", 9)[-1].split(", ")] == names
    assert names_statement("nonlocal", [], 2) == []


def test_gap_literal():
    assert gap_literal(None) is None
    assert gap_literal(0.04) is None
    assert gap_literal(12.345) == "12.3"
    assert gap_literal(3.0) == "3.0"


def test_generation_is_deterministic(tmp_path):
    et, kineto = two_stream(tmp_path)
    first = generate(et, tmp_path / "a.py", kineto=kineto)
    second = generate(copy.copy(et), tmp_path / "b.py", kineto=kineto)
    assert first == second


# -- frees as recorded (passes/frees.py) ---------------------------------------------
def _memory(ts: float, addr: int, nbytes: int) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
            "ts": ts, "args": {"Addr": addr, "Bytes": nbytes, "Device Type": 0,
                               "Device Id": -1, "Total Allocated": 0}}


def _held_locals(tmp_path, memory: list[dict]):
    """``a = relu(x)``, ``d = relu(a)`` (never read), ``b = relu(a)``, ``c = relu(b)``,
    each made in its op's span; ops begin at 0, 20, 40 and 60."""
    tb = TraceBuilder()
    x, a, d, b, c = (tb.tensor((4, 4)) for _ in range(5))
    nodes = [tb.op(RELU, [x], [a]), tb.op(RELU, [a], [d]), tb.op(RELU, [a], [b]),
             tb.op(RELU, [b], [c])]
    et = tb.write(tmp_path / "held.et.json")
    doc = kineto_doc(tb, {n: (20.0 * k, 10.0, []) for k, n in enumerate(nodes)})
    tid = doc["traceEvents"][0]["tid"]
    doc["traceEvents"] += [{**m, "tid": tid} for m in memory]
    kineto = tmp_path / "held.kineto.json"
    kineto.write_text(json.dumps(doc))
    return et, kineto


def test_memory_events_are_read_and_paired_by_address(tmp_path):
    _, kineto = _held_locals(tmp_path, [_memory(5, 1, 64), _memory(25, 2, 64),
                                        _memory(30, 1, -64), _memory(45, 1, 64)])
    trace = load_kineto(kineto)
    assert [(m.ts, m.addr, m.nbytes) for m in trace.memory] == [
        (5, 1, 64), (25, 2, 64), (30, 1, -64), (45, 1, 64)]
    # Address 1 is freed and taken again: two allocations, the second never freed.
    assert [(a.ts, a.freed) for a in allocations(trace.memory)] == [
        (5, 30), (25, NEVER), (45, NEVER)]


def test_values_are_held_until_the_op_after_which_the_original_freed_them(tmp_path):
    """``a`` is last read by the third op, but the original freed it after the fourth
    began (a local variable); ``d`` nobody reads, and the original kept it to the end.
    The replay frees both after the fourth op, and names ``d`` instead of dropping it."""
    et, kineto = _held_locals(tmp_path, [
        _memory(5, 1, 64), _memory(25, 2, 64), _memory(45, 3, 64), _memory(65, 4, 64),
        _memory(70, 3, -64),  # b: at its last read
        _memory(75, 1, -64)])  # a: after the fourth op began; d, c: never
    program = compile_trace(et, kineto=kineto)
    freed = {op.index: [root.op_index for root in op.free_after] for op in program.ops}
    assert freed == {0: [], 1: [], 2: [], 3: [2, 3, 1, 0]}, freed
    assert any("frees as recorded: 2 values" in d.reason for d in program.diagnostics)
    text = generate(et, tmp_path / "held_bench.py", kineto=kineto)
    assert "relu_1 = aten_relu(relu)" in text  # d is held, so named
    # Without memory events, every value is freed at its last read.
    plain = compile_trace(et, kineto=_held_locals(tmp_path, [])[1])
    assert {op.index: [r.op_index for r in op.free_after] for op in plain.ops} == {
        0: [], 1: [1], 2: [0], 3: [2, 3]}


def test_ops_of_threads_the_profiler_never_saw_are_named_as_such():
    """A thread started before the profiler is recorded by the ET observer but not by
    Kineto (without profile_all_threads): its ops are unlinked because of the thread,
    not because the Kineto trace holds other steps, and the warning says so."""
    relu = parse_signature("aten::relu(Tensor self) -> Tensor")

    def op(index: int, thread: int, linked: bool) -> Op:
        return Op(index=index, node_id=10 + index, signature=relu, args=[], outputs=[],
                  thread=thread, scope=(), timing=OpTiming(1.0, 1.0) if linked else None)

    program = Program.empty()
    program.ops = [op(0, 1, True), op(1, 2, False), op(2, 1, False), op(3, 2, False)]
    assert _unprofiled_threads(program) == 2  # thread 2's; thread 1's miss is a step's
    program.ops = [op(0, 1, False), op(1, 2, False)]
    assert _unprofiled_threads(program) == 0  # nothing linked: another run


def test_original_ratio_across_thread_counts_is_named(pair, tmp_path):
    """The capture ran with 1 intra-op thread (its step.json): the header names the
    count, the result reports it beside the run's, and a --num-threads other than it
    says on stderr that original_ratio compares two counts, not the replay with its
    original (a 2-thread capture replayed with --num-threads 1 read 0.03 silently)."""
    bench = tmp_path / "bench.py"
    text = generate(pair[0], bench, kineto=pair[1])
    assert "Captured with 1 intra-op CPU thread (" in text
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1",
                         "--json", "--num-threads", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc.stdout)
    assert out["num_threads"] == 2 and out["captured_num_threads"] == 1
    assert "original_ratio" in out
    assert "original_ratio compares this run's 2 intra-op CPU threads with the " \
        "capture's 1" in proc.stderr
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1",
                         "--json", "--num-threads", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["captured_num_threads"] == 1
    assert "intra-op" not in proc.stderr


def test_activations_checkpointing_freed_are_not_held_by_the_replays_graph(tmp_path):
    """Non-reentrant activation checkpointing saves nothing of a block's inner
    activations (its pack hook), and the original freed each in the forward; the
    replay's forward ops, in grad mode, saved them in a graph its explicit backward
    never runs, and held them to the backward: a checkpointed MLP's peak replayed as
    the unchecked one's (+95 %; a transformers Trainer's with gradient_checkpointing
    +131 %). Ops that read such a value last now save nothing."""
    torch.manual_seed(0)
    layers = [(torch.nn.Linear(32, 512), torch.nn.Linear(512, 32)) for _ in range(3)]
    opt = torch.optim.SGD([p for pair in layers for m in pair for p in m.parameters()],
                          lr=0.01)

    def block(x: torch.Tensor, up: torch.nn.Linear, down: torch.nn.Linear) -> torch.Tensor:
        # Locals outlive their last read (freed at the return, as a decoder layer's
        # residual is): still freed in the forward, before any backward.
        h = up(x)
        a = torch.nn.functional.gelu(h)
        return down(a)

    def step() -> None:
        x = torch.randn(512, 32)
        for up, down in layers:
            x = x + checkpoint(block, x, up, down, use_reentrant=False)
        x.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    result = capture(step, tmp_path, name="ckpt", warmup=1, timing_iters=1,
                     profile_steps=1)
    bench = tmp_path / "bench.py"
    text = generate(result.et_path, bench, kineto=result.kineto_path)
    assert "_saved_tensors(False)" in text
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1",
                         "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    replayed = last_json(proc.stdout)["peak_step_bytes"]
    original = json.loads(Path(result.sidecar_path).read_text())["step_peak_bytes"]
    assert abs(replayed - original) < 0.15 * original, (replayed, original)
