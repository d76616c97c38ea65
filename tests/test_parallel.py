"""Production parallelism replays under torchrun (issue 13): functional collectives in
tensor parallel on DTensor, FSDP2 (fully_shard, AdamW foreach, fsdp:: copy-in/out ops),
coalesced c10d collectives, reduce ops and a monitored_barrier, a 1F1B pipeline's
sends and recvs, and DDP's fp16 compression hook (its decompression a Future callback
on gloo's thread), captured per rank at test time (gloo, 2 ranks), replayed from one
benchmark; per rank, the replay issues the same collectives (c10d and _c10d_functional)
in the same order with the same sizes, and the same reduce ops where the trace records
them (functional collectives name theirs; c10d ops write an opaque ReduceOp)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from mystique_gen.cli import main as cli_main
from mystique_gen.passes.comms import collective_sequence
from mystique_gen.passes.select import BACKEND_THREAD_NOTE, select_ops
from mystique_gen.sources.et import load_trace
from tests.conftest import ROOT, assert_rank_replays, last_json
from tests.test_distributed import _torchrun

pytestmark = pytest.mark.slow
WORKLOAD = ROOT / "tests" / "parallel_workload.py"
MODES = ["tp", "fsdp2", "fsdp2_dim1", "functional", "coalesced", "reductions", "pipeline", "seqpar",
         "expert", "expert_grouped", "rooted", "objects", "vocab", "sparse", "side", "hooks",
         "zero_by_hand", "hf_ep"]
# What each mode's benchmark must call or say (header notes wrap, so whitespace is
# compared loosely): functional collectives; FSDP2's own ops, with the import of the
# torch module that registers them; coalesced collectives as one call each; the c10d
# reductions that replay as SUM; sends and recvs issued async.
CALLS = {
    "tp": ["torch.ops._c10d_functional."],
    # Issued back to back, each on the last one's result, waited once at the end.
    "functional": [f"torch.ops._c10d_functional.{name}.default" for name in
                   ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")],
    "fsdp2": ['_load_namespace("torch.distributed.fsdp._fully_shard._fsdp_collectives")',
              "torch.ops.fsdp.all_gather_copy_in.", "torch.ops.fsdp.split_with_sizes_copy.",
              "torch.ops.fsdp.chunk_cat."],
    # The parameters sharded on dim 1: their copy-out ends in cat(out=) into a view of
    # the buffer each unsharded parameter lives on; the forward reads the parameter, a
    # leaf of its own (read as the no_grad view, autograd refused it).
    "fsdp2_dim1": ["torch.ops.fsdp.split_with_sizes_copy.", "aten_cat_out("],
    "coalesced": ["_all_gather_into_tensor_coalesced(", "_reduce_scatter_tensor_coalesced(",
                  "_all_reduce_coalesced(", '"min"',
                  "SUM replayed: c10d::reduce_scatter_tensor_coalesced_ x1, "
                  "c10d::allreduce_coalesced_ x1"],
    "reductions": ['"max"', '"min"', "_monitored_barrier(",
                   "SUM replayed: c10d::allreduce_ x2, c10d::reduce_ x1, "
                   "c10d::_reduce_scatter_base_ x2",
                   "c10d::monitored_barrier_ x1: monitored_barrier on gloo"],
    # 1F1B crosses sends: blocking calls in recorded order would wait on each other.
    "pipeline": ["torch.distributed.isend(", "torch.distributed.irecv(",
                 "8 sends and recvs run as isend/irecv in recorded order"],
    # Views of an AsyncCollectiveTensor wait for nothing: the trace's waits are the
    # only ones (a wait added before the view ran gloo's completion twice).
    "seqpar": ["torch.ops._c10d_functional.reduce_scatter_tensor.",
               "torch.ops._c10d_functional.all_gather_into_tensor."],
    # The token counts, then tokens out and back, forward and backward.
    "expert": ["torch.distributed.all_to_all_single("],
    # The group ends come from counts the replay's routing exchanged, the tokens from
    # the recorded splits: fitted to the rows they split (past them, the GEMM read
    # beyond its input).
    "expert_grouped": ["torch.distributed.all_to_all_single(", "_fit_values("],
    # Rank 1 gathers and scatters too, with no list (it hung rank 0 when it did not).
    "rooted": ["torch.distributed.gather(", "torch.distributed.scatter(",
               "torch.distributed.all_gather(", "torch.distributed.broadcast("],
    # The pickles' byte tensors set_ onto new storages (the trace records none); what
    # they hold was written outside recorded ops, so readers read an input.
    "objects": ["aten_set__source_Storage", "_storage("],
    # Each rank's shard offset is its first row (ids outside its rows are masked): at
    # random, the shifted ids left the shard and rank 1's embedding failed.
    "vocab": ['"span", 0, 0', '"span", 32, 32'],
    # The embedding's sparse gradient, made in the step, all-reduced as itself.
    "sparse": ["torch.distributed.all_reduce( sparse_coo_tensor_unsafe, group=_GROUPS[0]"],
    # The ranks issue calls on the side group and the default one in other orders, and
    # a background thread's call runs async in the one-thread replay: in line, or
    # waited before the other group's next call, both ranks waited on each other.
    "side": ["group=_GROUPS[0]", "group=_GROUPS[1]", "async_op=True"],
    # The half-precision all-reduce; the callback's decompression (checked below).
    "hooks": ["torch.distributed.all_reduce("],
    # Each bucket's reduce-scatter, issued in a gradient hook, runs async (checked
    # below: gloo's completion is the collective's, the wait where the bucket is read).
    "zero_by_hand": ["_reduce_scatter_single(", "_all_gather_single("],
    # transformers' expert parallel: the token counts by c10d, the tokens by functional
    # all_to_all_single through autograd (its backward sends the gradients back).
    "hf_ep": ["torch.distributed.all_to_all_single(",
              "torch.ops._c10d_functional.all_to_all_single",
              "torch.ops._c10d_functional._wrap_tensor_autograd"],
}


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parallel_capture")
    proc = _torchrun(str(WORKLOAD), str(out), *MODES, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _not_replayed(text: str) -> list[str]:
    """The header's "Ops not replayed" entries (one line each, their node ids dropped)."""
    section = text.split("Ops not replayed:\n", 1)[1].split("\n\n", 1)[0]
    entries = re.findall(r"^  - (.*(?:\n      .*)*)", section, flags=re.M)
    return [" ".join(entry.split()) for entry in entries]


@pytest.mark.parametrize("mode", MODES)
def test_replays_the_same_collectives_on_every_rank(captured, mode, tmp_path):
    ranks = [captured / f"{mode}-rank-{r}.json" for r in (0, 1)]
    bench = tmp_path / "bench.py"
    assert cli_main([str(p) for p in ranks] + ["-o", str(bench)]) == 0
    text = bench.read_text()
    flat = " ".join(text.split())
    assert all(" ".join(call.split()) in flat for call in CALLS[mode]), CALLS[mode]
    if mode == "rooted":  # on every rank, root or not
        for r in (0, 1):
            body = text.split(f"def replay_rank{r}(")[1].split("\ndef ")[0]
            assert all(call in body for call in CALLS[mode]), r
    if mode == "hooks":  # the callback on gloo's thread is the program's: replayed
        assert _not_replayed(text) == ["none"], _not_replayed(text)
    if mode == "zero_by_hand":
        body = text.split("def replay_rank0(")[1].split("\ndef ")[0]
        # gloo chunks its clone and copies into the output where the step waited,
        # after backward, outside the hook that issued it: the collective's own work.
        assert "aten_chunk(" not in body
        # The first bucket's reduce-scatter is in flight while backward writes the
        # next bucket of the same flat buffer: waited before the next collective only.
        first_wait = body.index("_wait_work(")
        assert "aten_" not in body[first_wait:body.index("_reduce_scatter_single(",
                                                         first_wait)]
    if mode == "seqpar":  # every wait is one the trace recorded
        body = text.split("def replay_rank0(")[1].split("\ndef ")[0]
        assert "_wait_tensor(" not in body
    # Every op with a schema replays; what is left are record_function labels that
    # look like op names and ran nothing (FSDP::root_pre_forward), and what gloo's
    # worker threads ran for a collective (FSDP2's all-gather copies).
    assert all(entry == "none" or entry.endswith(": no operator schema recorded")
               or entry.endswith(BACKEND_THREAD_NOTE) for entry in _not_replayed(text)), \
        _not_replayed(text)
    proc = _torchrun(str(bench), "--device", "cpu", "--warmup", "1", "--iters", "2",
                     "--json", "--et", str(tmp_path / "replay.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # No call torch deprecates (FSDP2's gathers and scatters on gloo warned on each rank).
    assert "FutureWarning" not in proc.stderr, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["distributed"] and result["world_size"] == 2
    assert result["skipped_at_runtime"] == []
    for r, original in enumerate(ranks):
        assert_rank_replays(original, tmp_path / f"replay.rank{r}.json")
        replay, recorded = load_trace(tmp_path / f"replay.rank{r}.json"), load_trace(original)
        if mode == "reductions":  # the functional ones name theirs: compared above
            assert {"max", "min"} <= {s for *_, strings in collective_sequence(recorded)
                                      for s in strings}
        # fsdp:: ops ran as themselves, not as stand-ins (skipped_at_runtime is empty).
        fsdp = [Counter(s.node.name for s in select_ops(trace).ops
                        if s.node.name.startswith("fsdp::")) for trace in (recorded, replay)]
        assert fsdp[0] == fsdp[1] and bool(fsdp[0]) == mode.startswith("fsdp2")


def test_per_rank_kineto_timing_replays_every_ranks_host_gaps(tmp_path):
    """Each rank captured with its own Kineto trace and profile-only steps (as
    tools/capture.py captures one process); one benchmark with every rank's timing,
    the Kineto traces given in the other order (matched by the rank each records);
    under torchrun, --host-gaps recorded calibrates and replays gaps on every rank."""
    proc = _torchrun(str(WORKLOAD), str(tmp_path), "--kineto", "tp", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ets = [tmp_path / f"tp-rank-{r}.et.json" for r in (0, 1)]
    kinetos = [tmp_path / f"tp-rank-{r}.kineto.json" for r in (1, 0)]
    bench = tmp_path / "bench.py"
    assert cli_main([*map(str, ets), "--kineto", *map(str, kinetos), "-o", str(bench)]) == 0
    text = bench.read_text()
    assert "matched to ranks by the rank each records" in " ".join(text.split())
    for r in (0, 1):
        assert f'"kineto": "tp-rank-{r}.kineto.json"' in text.split(f"ORIGINAL_RANK{r} = ")[1]
        assert f'"host_gaps": "tp-rank-{r}.profile.json (median of' in text
        assert "_host_gap(" in text.split(f"def replay_rank{r}(")[1].split("\ndef ")[0]
    proc = _torchrun(str(bench), "--device", "cpu", "--warmup", "1", "--iters", "2", "--json",
                     "--host-gaps", "recorded", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["distributed"] and result["world_size"] == 2
    assert result["host_gaps"] == "recorded" and result["skipped_at_runtime"] == []
    per_rank = result["per_rank"]
    assert all(r["host_gap_own_us"] > 0 for r in per_rank)  # calibrated on every rank
    # Replayed on each rank, unless its own host time exceeds its recorded gaps in all
    # (a loaded machine's calibration, beside another test), which turns them off and
    # says so: no gap would wait, and their bookkeeping would cost time.
    if not all(r["host_gaps_replayed"] for r in per_rank):
        assert "exceeds the recorded gaps by" in proc.stderr, proc.stderr[-3000:]
    originals = [r["original_ms"] for r in per_rank]
    assert all(ms > 0 for ms in originals) and result["original_ms"] == max(originals)
    assert result["original_ratio"] == pytest.approx(result["iter_ms_median"] / max(originals))

    # Rank 1 without its profile-only steps: its gaps are its ET's own session's, whose
    # observer the calibration measures in more passes; every rank replays them, or
    # the ranks' collectives never meet (the job hung). Its one linked step is its
    # recorders' first, so every rank's passes are as many fresh first iterations.
    (tmp_path / "tp-rank-1.profile.json").unlink()
    assert cli_main([*map(str, ets), "--kineto", *map(str, kinetos), "-o", str(bench)]) == 0
    rank1 = bench.read_text().split("ORIGINAL_RANK1 = ")[1]
    assert '"observer_in_gaps": True' in rank1 and '"gap_steps": 1,' in rank1
    proc = _torchrun(str(bench), "--device", "cpu", "--warmup", "1", "--iters", "2", "--json",
                     "--host-gaps", "recorded", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_fsdp2_replays_without_the_module_that_registers_its_ops(captured, tmp_path):
    """On a torch without FSDP2's module the fsdp:: ops do not resolve: the benchmark
    runs the harness's equivalents in torch ops (the same copies into the same
    buffers), says so on stderr and in --json, and every rank still replays its
    recorded collectives and ops."""
    ranks = [captured / f"fsdp2-rank-{r}.json" for r in (0, 1)]
    bench = tmp_path / "bench.py"
    assert cli_main([str(p) for p in ranks] + ["-o", str(bench)]) == 0
    runner = tmp_path / "without_fsdp.py"
    runner.write_text(
        "import runpy, sys\n"
        "sys.modules['torch.distributed.fsdp._fully_shard._fsdp_collectives'] = None\n"
        "sys.modules['mystique_gen'] = None\n"
        "path = sys.argv[1]\nsys.argv = sys.argv[1:]\n"
        "runpy.run_path(path, run_name='__main__')\n")
    proc = _torchrun(str(runner), str(bench), "--device", "cpu", "--warmup", "1", "--iters",
                     "2", "--json", "--et", str(tmp_path / "replay.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["skipped_at_runtime"] == []
    assert result["equivalents_at_runtime"] == [
        "fsdp::all_gather_copy_in.default", "fsdp::chunk_cat.default",
        "fsdp::split_with_sizes_copy.default"]
    assert "running its equivalent in torch ops" in proc.stderr
    for r, original in enumerate(ranks):
        replay = tmp_path / f"replay.rank{r}.json"
        recorded = collective_sequence(load_trace(original))
        assert recorded and collective_sequence(load_trace(replay)) == recorded
