"""A 2 x 2 device mesh (dp x tp, 4 ranks, gloo): collectives on mesh subgroups replay
on the recorded subgroups, on one node and across two torchrun launchers (issue 13).

Each rank's trace lists only the groups it is a member of; the compiler merges them
into the job's groups (passes/ranks.py ``job_groups``), which every rank creates in
the recorded order, so a functional collective's group name in the replay is the
recorded one, and the check compares it with the shapes, rank by rank.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch

from mystique_gen.cli import main as cli_main
from mystique_gen.driver import compile_paths
from mystique_gen.passes.ranks import is_multi_rank_set, recorded_groups
from mystique_gen.sources.et import load_trace
from tests.conftest import ROOT, assert_rank_replays, last_json
from tests.launch import launch_env, torchrun_command

pytestmark = pytest.mark.slow
WORKLOAD = ROOT / "tests" / "parallel_workload.py"
RANKS = 4


def _launch(*args: str, nproc: int, cwd: Path, extra: tuple[str, ...] = ("--standalone",)
            ) -> subprocess.Popen[str]:
    return subprocess.Popen(torchrun_command(nproc, *args, rendezvous=extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env=launch_env())


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def mesh(tmp_path_factory) -> tuple[list[Path], Path]:
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available in this build")
    out = tmp_path_factory.mktemp("mesh")
    code, _out, err = _finish(_launch(str(WORKLOAD), str(out), "mesh2d", "fsdp2_tp",
                                      "pipeline_mesh", "hsdp", "stage_dp", nproc=RANKS,
                                      cwd=out))
    assert code == 0, err[-3000:]
    traces = [out / f"mesh2d-rank-{r}.json" for r in range(RANKS)]
    bench = out / "bench.py"
    assert cli_main([str(p) for p in traces] + ["-o", str(bench)]) == 0
    return traces, bench


def test_fsdp2_with_tensor_parallel_on_a_mesh(mesh, tmp_path):
    """FSDP2 on dp and tensor parallel on tp: gloo records no group for FSDP2's c10d
    all-gathers and reduce-scatters, so each runs on the group its sizes imply (here
    of size 2, the dp group: the first of that size each rank is in), where running
    them on the world made the replay fail ("invalid tensor size")."""
    out = mesh[1].parent
    traces = [out / f"fsdp2_tp-rank-{r}.json" for r in range(RANKS)]
    text, result = _generate_and_run(traces, tmp_path)
    assert "run on the group their sizes imply" in text
    assert result["skipped_at_runtime"] == []


def test_pipeline_stages_over_a_mesh_send_to_their_pp_peers(mesh, tmp_path):
    """A send names its peer within the pp group, and gloo records no group: on the
    default group rank 0 sent to rank 1 instead of 2, and rank 1 to itself ("Pair is
    not connected"). Each send and recv runs on the group where both ends name each
    other. FSDP2's gathers, whose group only their sizes imply, ran on the first mesh
    dimension's groups (pp), where the two stages' sizes differ and gloo failed; they
    run on the dimension whose ranks issue them alike (dp)."""
    out = mesh[1].parent
    traces = [out / f"pipeline_mesh-rank-{r}.json" for r in range(RANKS)]
    text, result = _generate_and_run(traces, tmp_path)
    assert "sends and recvs of this job run on the process group whose members" in text
    assert "run on the mesh dimension whose ranks issue them with the same sizes" in text
    assert result["skipped_at_runtime"] == []


def test_hsdp_gathers_on_the_shard_groups(mesh, tmp_path):
    """HSDP's gathers fit both mesh dimensions alike (every rank gathers the same
    sizes), so the first, the replicas', was kept; FSDP2's copy-in records the rank
    within the gather's group, which only the shard groups put each rank at."""
    out = mesh[1].parent
    traces = [out / f"hsdp-rank-{r}.json" for r in range(RANKS)]
    compiled = compile_paths(traces)
    for program, rank in zip(compiled.programs, compiled.ranks, strict=True):
        assert program.distributed is not None
        groups = {op.comm.group for op in program.ops
                  if op.comm is not None and op.comm.sized}
        assert [program.distributed.groups[g].ranks for g in groups] == \
            [(0, 1) if rank < 2 else (2, 3)]
        # Its all-reduce of each reduce-scattered shard runs over the replicas, not
        # over every rank (which would sum the shard groups' results again).
        reduced = [program.distributed.groups[op.comm.group].ranks for op in program.ops
                   if op.comm is not None and op.comm.call == "all_reduce"]
        assert reduced and set(reduced) == {(0, 2) if rank % 2 == 0 else (1, 3)}
    _generate_and_run(traces, tmp_path)


def test_unrecorded_all_reduces_the_ranks_issue_unalike_run_on_the_dimension_that_fits(
        mesh, tmp_path):
    """Two stages of different sizes all-reduce their gradients over the dp groups;
    gloo records no group, and on the default group the stages' sizes met (gloo
    aborted). The dp groups' members issue them alike; the pp groups' do not. The first
    and last ranks' tied weight is all-reduced on a group of those two only, which no
    mesh dimension holds: on the default group they waited for the others forever."""
    out = mesh[1].parent
    traces = [out / f"stage_dp-rank-{r}.json" for r in range(RANKS)]
    compiled = compile_paths(traces)
    for program, rank in zip(compiled.programs, compiled.ranks, strict=True):
        assert program.distributed is not None
        reduced = {program.distributed.groups[op.comm.group].ranks for op in program.ops
                   if op.comm is not None and op.comm.call == "all_reduce"}
        dp = (0, 1) if rank < 2 else (2, 3)
        assert reduced == ({dp, (0, RANKS - 1)} if rank in (0, RANKS - 1) else {dp})
    text, _result = _generate_and_run(traces, tmp_path)
    assert "issue them with the same sizes" in text


def _generate_and_run(traces: list[Path], tmp_path: Path) -> tuple[str, dict]:
    """Generate a benchmark from the rank traces, run it on every rank under torchrun,
    and check each rank's replay against its trace: (the file's text with its lines
    joined, rank 0's --json result)."""
    bench = tmp_path / "bench.py"
    assert cli_main([str(p) for p in traces] + ["-o", str(bench)]) == 0
    code, out_text, err = _finish(_launch(str(bench), "--device", "cpu", "--warmup", "1",
                                          "--iters", "2", "--json", "--et",
                                          str(tmp_path / "replay.json"), nproc=RANKS,
                                          cwd=tmp_path))
    assert code == 0, err[-3000:]
    _check_replay(traces, tmp_path)
    return " ".join(bench.read_text().split()), last_json(out_text)


def _check_replay(traces: list[Path], replay_dir: Path) -> None:
    for r, original in enumerate(traces):
        assert_rank_replays(original, replay_dir / f"replay.rank{r}.json")


def test_each_rank_lists_its_own_groups_and_they_merge(mesh):
    traces, bench = mesh
    loaded = [load_trace(p) for p in traces]
    own = [{g.name for g in recorded_groups(t) or []} for t in loaded]
    assert len({frozenset(s) for s in own}) > 1  # what made the rank set unrecognised
    assert is_multi_rank_set(loaded)
    text = bench.read_text()
    for ranks in ("[0, 2]", "[1, 3]", "[0, 1]", "[2, 3]"):
        assert f'"ranks": {ranks}' in text


def test_subgroup_collectives_replay_on_their_groups(mesh, tmp_path):
    traces, bench = mesh
    code, out, err = _finish(_launch(str(bench), "--device", "cpu", "--warmup", "1",
                                     "--iters", "2", "--json", "--et",
                                     str(tmp_path / "replay.json"), nproc=RANKS,
                                     cwd=tmp_path))
    assert code == 0, err[-3000:]
    assert last_json(out)["world_size"] == RANKS
    _check_replay(traces, tmp_path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_launchers_as_two_nodes(mesh, tmp_path):
    """torchrun --nnodes 2 on this machine: two launchers of 2 processes each, one
    c10d rendezvous, as a 2-node cluster runs the file (README: Multi-node)."""
    traces, bench = mesh
    endpoint = f"127.0.0.1:{free_port()}"

    def launch(node: int) -> subprocess.Popen[str]:
        return _launch(str(bench), "--device", "cpu", "--warmup", "1", "--iters", "2",
                       "--json", "--et", str(tmp_path / "replay.json"), nproc=2, cwd=tmp_path,
                       extra=("--nnodes", "2", "--node-rank", str(node), "--rdzv-backend",
                              "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
                              "mystique-test"))

    # Node 1's launcher joins first, as it may on a cluster: it then holds ranks 0, 1.
    second = launch(1)
    time.sleep(2)
    launchers = [launch(0), second]
    results = [_finish(p) for p in launchers]
    for code, _out, err in results:
        assert code == 0, err[-3000:]
    # A c10d rendezvous ignores --node-rank: the launcher that joins first holds ranks
    # 0 and 1, so global rank 0, which prints the job's JSON, is on either launcher
    # (node 0's stdout had none in 4 runs of 8 here).
    printed = [out for _code, out, _err in results if out.strip()]
    assert len(printed) == 1, [out[-300:] for _code, out, _err in results]
    assert last_json(printed[0])["world_size"] == RANKS
    _check_replay(traces, tmp_path)
