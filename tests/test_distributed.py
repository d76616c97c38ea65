"""Distributed replay: capture a 2-rank gloo job under torchrun, generate one benchmark
from both rank traces, replay it under torchrun, compare collectives rank by rank.

torchrun start-up is slow, so the whole module shares one capture run and one replay
run (session fixtures); the other tests read their results or run plain processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mystique_gen.backends.render import format_with_black
from mystique_gen.cli import main as cli_main
from mystique_gen.driver import expand_inputs
from mystique_gen.passes.comms import collective_sequence
from mystique_gen.passes.ranks import is_multi_rank_set, read_groups, read_param_comms
from mystique_gen.sources.et import load_trace
from tests.conftest import ROOT, last_json, run_benchmark
from tests.launch import launch_env, torchrun

pytestmark = pytest.mark.slow
WORKLOAD = ROOT / "tests" / "dist_workload.py"
COLLECTIVES = ["c10d::allreduce_", "c10d::allreduce_", "c10d::broadcast_", "c10d::allgather_",
               "c10d::_reduce_scatter_base_", "c10d::alltoall_base_", "c10d::allreduce_",
               "c10d::barrier"]


def _torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available in this build")
    return torchrun(2, *args, cwd=cwd, timeout=300)


@pytest.fixture(scope="session")
def rank_traces(tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("dist_capture")
    proc = _torchrun(str(WORKLOAD), str(out), cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [out / "rank-0.json", out / "rank-1.json"]


@pytest.fixture(scope="session")
def replayed(rank_traces, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("dist_replay")
    bench = out / "bench.py"
    assert cli_main([str(p) for p in rank_traces] + ["-o", str(bench)]) == 0
    proc = _torchrun(str(bench), "--device", "cpu", "--backend", "gloo", "--warmup", "1",
                     "--iters", "3", "--json", "--et", str(out / "replay.json"),
                     "--profile", str(out / "prof"), cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"bench": bench, "result": last_json(proc.stdout), "dir": out}


def test_each_rank_replays_its_collectives_in_order_with_sizes(rank_traces, replayed):
    for rank, original in enumerate(rank_traces):
        want = collective_sequence(load_trace(original))
        assert [name for name, *_ in want] == COLLECTIVES
        got = collective_sequence(load_trace(replayed["dir"] / f"replay.rank{rank}.json"))
        assert got == want, (rank, want, got)


def test_json_reports_every_rank_and_the_slowest(replayed):
    result = replayed["result"]
    assert result["distributed"] is True and result["backend"] == "gloo"
    assert result["world_size"] == 2 and result["rank"] == 0 and result["iters"] == 3
    per_rank = result["per_rank"]
    assert len(per_rank) == 2
    # An iteration lasts as long as its slowest rank: the max of the ranks, per iteration.
    assert result["iter_ms_max"] == pytest.approx(max(r["iter_ms_max"] for r in per_rank))
    assert result["iter_ms_min"] >= max(r["iter_ms_min"] for r in per_rank) - 1e-9
    assert result["et_per_rank"] == [str(replayed["dir"] / f"replay.rank{r}.json")
                                     for r in range(2)]


def test_each_rank_profiles_its_steps_with_torchs_distributed_info(replayed):
    result, prof = replayed["result"], replayed["dir"] / "prof"
    paths = [prof / f"kineto_trace.rank{r}.json" for r in range(2)]
    assert result["profile_per_rank"] == [str(p) for p in paths]
    assert sorted(prof.iterdir()) == paths  # one folder, a file per rank (as HTA reads)
    for rank, path in enumerate(paths):
        doc = json.loads(path.read_text())
        # Written by torch itself: the process group is up before the profiler starts.
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "gloo")
        steps = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"
                 and e["name"].startswith("ProfilerStep#")]
        assert steps == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    assert all(r["peak_bytes"] > 0 for r in result["per_rank"])
    assert result["peak_bytes"] == max(r["peak_bytes"] for r in result["per_rank"])

    analysis = pytest.importorskip(
        "hta.trace_analysis",
        reason="HolisticTraceAnalysis is not installed (pip install 'mystique-gen[hta]')")
    hta = analysis.TraceAnalysis(trace_dir=str(prof), include_last_profiler_step=True)
    assert sorted(hta.t.traces) == [0, 1]
    for rank in (0, 1):
        assert sorted(int(i) for i in hta.t.get_trace(rank)["iteration"].unique()) == [1, 2, 3]


def test_one_file_holds_both_ranks_and_the_groups(replayed):
    text = replayed["bench"].read_text()
    assert format_with_black(text) == text
    assert "def replay_rank0(" in text and "def replay_rank1(" in text
    assert text.count("torch.distributed.all_to_all_single(") == 2
    assert '"desc": "default_pg"' in text and "PROCESS_GROUPS = [" in text
    # The recorded async all_reduce stays async, with its wait before the barrier.
    body = text.split("def replay_rank0(")[1].split("def make_inputs_rank1(")[0]
    assert body.index("async_op=True") < body.rfind("_wait_work(") < body.index(
        "torch.distributed.barrier(")
    assert "_reduce_scatter_single(" in body


def test_without_a_launcher_rank_zero_compute_runs_alone(replayed):
    proc = run_benchmark(replayed["bench"], "--device", "cpu", "--warmup", "0", "--iters",
                         "1", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "replaying rank 0's compute only" in proc.stderr
    out = last_json(proc.stdout)
    assert out["distributed"] is False and out["recorded_world_size"] == 2
    assert out["ops"] > 0 and "note" in out


def test_rank_set_detection(rank_traces):
    pair = [load_trace(p) for p in rank_traces]
    assert is_multi_rank_set(pair)
    assert not is_multi_rank_set(pair[:1])
    assert not is_multi_rank_set([pair[0], pair[0], pair[1]])  # 3 traces, 2-rank groups
    groups = read_groups(pair[0])
    assert groups is not None and [g.desc for g in groups][0] == "default_pg"
    assert len(groups) == 2  # the default group and the new_group subgroup


def test_world_size_one_runs_standalone_in_a_one_rank_group(tmp_path):
    proc = subprocess.run([sys.executable, str(WORKLOAD), str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=launch_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    bench = tmp_path / "bench.py"
    assert cli_main([str(tmp_path / "rank-0.json"), "-o", str(bench)]) == 0
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2", "--json",
                         "--et", str(tmp_path / "replay.json"), env=launch_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc.stdout)
    assert out["distributed"] is True and out["world_size"] == 1
    assert collective_sequence(load_trace(tmp_path / "replay.rank0.json")) == \
        collective_sequence(load_trace(tmp_path / "rank-0.json"))


@pytest.mark.conformance
def test_chakra_all_gather_generates(shared_traces, tmp_path):
    bench = tmp_path / "ag.py"
    assert cli_main([str(shared_traces / "chakra" / "allgather_2rank_1.0.2.json.gz"),
                     "-o", str(bench)]) == 0
    text = bench.read_text()
    assert format_with_black(text) == text
    replay = text.split("def replay_rank0(")[1].split("\nRANKS = ")[0]
    assert replay.count("torch.distributed.all_gather(") == 10
    assert replay.count("_wait_work(work") == 10  # every wait the trace recorded
    assert "WORLD_SIZE = 2" in text


@pytest.mark.conformance
def test_record_param_comms_layouts(shared_traces):
    chakra = load_trace(shared_traces / "chakra" / "allgather_2rank_1.0.2.json.gz")
    resnet = load_trace(shared_traces / "param" / "resnet50_1gpu_et.json.gz")
    dlrm = load_trace(shared_traces / "param" / "dlrm_8rank" / "dlrm_eg_3.json.gz")
    facts = {t.name: [f for n in t.nodes if n.name == "record_param_comms"
                      if (f := read_param_comms(n)) is not None] for t in (chakra, resnet, dlrm)}
    ag = [f for f in facts[chakra.name] if f.collective == "all_gather"][0]
    assert (ag.seq, ag.group, ag.rank, ag.world_size) == (12, 82149104, 0, 2)
    bc = [f for f in facts[resnet.name] if f.collective == "broadcast"][0]
    assert (bc.seq, bc.group, bc.world_size) == (47, "0", 1)
    a2a = [f for f in facts[dlrm.name] if f.collective == "all_to_allv"][0]
    assert a2a.rank == 3 and a2a.in_splits == (768,) * 8
    assert any(f.collective == "wait" and f.seq == 147 for f in facts[dlrm.name])


@pytest.mark.conformance
def test_legacy_dlrm_ranks_generate_from_a_directory(shared_traces, tmp_path):
    folder = shared_traces / "param" / "dlrm_8rank"
    paths = expand_inputs([folder])
    assert [p.name for p in paths] == [f"dlrm_eg_{r}.json.gz" for r in range(8)]
    bench = tmp_path / "dlrm.py"
    assert cli_main([str(folder), "-o", str(bench)]) == 0
    text = bench.read_text()
    assert "WORLD_SIZE = 8" in text
    assert all(f"def replay_rank{r}(" in text for r in range(8))
    assert "no process_group:init node" in text  # the header says what was dropped
    assert "ranks as recorded by record_param_comms" in text
    assert "torch.distributed.all_to_all_single(" in text
    # (Rank 0's compute runs alone in test_conformance; a multi-rank file without a
    # launcher in test_without_a_launcher_rank_zero_compute_runs_alone.)
    compile(text, str(bench), "exec")
