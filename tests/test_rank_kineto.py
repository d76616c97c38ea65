"""Per-rank Kineto traces (issue 13): each rank trace of a job links its own Kineto trace
(matched by the rank it records in ``distributedInfo``, else in the order given) and
its own profile-only steps, and the distributed benchmark carries every rank's timing.

Synthetic ETs and Kineto documents (tests/golden_cases.py ``two_ranks``), and one job
captured under torchrun as other tools capture it (``parallel_workload.py --profiled``: a
repeating schedule's tensorboard_trace_handler files beside each rank's ET);
tests/test_parallel.py captures and replays more real jobs.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
from pathlib import Path

import pytest

from mystique_gen.cli import main as cli_main
from mystique_gen.constants import STEP_SCOPE
from mystique_gen.driver import compile_paths, expand_inputs, kineto_paths, render
from mystique_gen.errors import OptionError
from mystique_gen.passes.filters import kineto_steps
from mystique_gen.passes.ranks import match_kineto
from mystique_gen.sources.kineto import load_kineto
from tests.conftest import ROOT
from tests.golden_cases import two_ranks
from tests.test_distributed import _torchrun


def _replay_body(text: str, rank: int) -> str:
    return text.split(f"def replay_rank{rank}(")[1].split("\ndef ")[0]


def _gaps(program) -> list[float | None]:
    return [op.timing.gap_us if op.timing is not None else None for op in program.ops]


def _strip_rank(path: Path) -> Path:
    doc = json.loads(path.read_text())
    del doc["distributedInfo"]
    path.write_text(json.dumps(doc))
    return path


def test_kineto_records_its_rank(tmp_path):
    _, kinetos = two_ranks(tmp_path)
    assert [load_kineto(k).rank for k in kinetos] == [0, 1]
    assert load_kineto(_strip_rank(kinetos[0])).rank is None


def test_each_rank_links_its_own_kineto_trace(tmp_path):
    """Given in the other order, the Kineto traces still go to their ranks (by the rank
    each records); each rank replays its own gaps and carries its own ORIGINAL."""
    ets, kinetos = two_ranks(tmp_path)
    compiled = compile_paths(ets, kineto=list(reversed(kinetos)))
    assert compiled.ranks == [0, 1]
    timings = [p.timing for p in compiled.programs]
    assert [t.kineto for t in timings if t is not None] == ["rank-0.kineto.json",
                                                              "rank-1.kineto.json"]
    assert [_gaps(p) for p in compiled.programs] == [[None, 20.0, 20.0], [None, 40.0, 40.0]]
    assert [t.original_ms for t in timings if t is not None] == [0.085, 0.125]
    assert "matched to ranks by the rank each records (distributedInfo)" in compiled.rank_source

    text = render(compiled)
    gap = r"_host_gap\(([\d.]+), before=\d+\)"
    assert re.findall(gap, _replay_body(text, 0)) == ["20.0", "20.0"]
    assert re.findall(gap, _replay_body(text, 1)) == ["40.0", "40.0"]
    for rank in (0, 1):
        facts = text.split(f"ORIGINAL_RANK{rank} = ")[1].split("}")[0]
        assert f'"kineto": "rank-{rank}.kineto.json"' in facts
        assert f"ORIGINAL_OPS_RANK{rank} = [" in text
    assert "0: (make_inputs_rank0, replay_rank0, 3, ORIGINAL_RANK0)" in text
    assert "1: (make_inputs_rank1, replay_rank1, 3, ORIGINAL_RANK1)" in text
    assert "\nORIGINAL = None\n" in text  # the job picks its rank's facts from RANKS


def test_without_recorded_ranks_the_order_given_decides(tmp_path):
    ets, kinetos = two_ranks(tmp_path)
    for k in kinetos:
        _strip_rank(k)
    compiled = compile_paths(ets, kineto=list(reversed(kinetos)))
    assert [p.timing.kineto for p in compiled.programs if p.timing is not None] == [
        "rank-1.kineto.json", "rank-0.kineto.json"]
    assert "Kineto traces matched to ranks in the order given" in compiled.rank_source


def test_a_capture_folder_stands_for_its_rank_traces_and_kineto_traces(tmp_path):
    """A capture's folder holds each rank's ``.et.json``, ``.kineto.json`` and sidecar:
    as the traces it stands for the first, as ``--kineto`` for the second."""
    ets, kinetos = two_ranks(tmp_path)
    for et in ets:
        et.rename(et.with_name(et.name.replace(".json", ".et.json")))
    (tmp_path / "rank-0.step.json").write_text("{}")
    assert [p.name for p in kineto_paths(tmp_path)] == ["rank-0.kineto.json",
                                                        "rank-1.kineto.json"]
    assert [p.name for p in expand_inputs([tmp_path])] == ["rank-0.et.json", "rank-1.et.json"]
    compiled = compile_paths([tmp_path], kineto=tmp_path)
    assert [p.timing.kineto for p in compiled.programs if p.timing is not None] == [
        "rank-0.kineto.json", "rank-1.kineto.json"]


def test_a_folder_named_by_no_convention_is_told_apart_by_what_each_file_holds(tmp_path):
    """PARAM's and HTA's recipes write ``et_rank<N>.json`` beside ``kineto_rank<N>.json``
    (or gzipped): no name says which is which, so the folder as the traces took the
    Kineto traces for ETs ("kineto_rank0.json: no 'nodes' field"), and as ``--kineto``
    took the ETs for Kineto traces (4 of them for 2 ranks). What each holds decides."""
    ets, kinetos = two_ranks(tmp_path)
    for rank, (et, kineto) in enumerate(zip(ets, kinetos, strict=True)):
        et.rename(tmp_path / f"et_rank{rank}.json")
        data = kineto.read_bytes()
        kineto.unlink()
        if rank:
            (tmp_path / f"kineto_rank{rank}.json.gz").write_bytes(gzip.compress(data))
        else:
            (tmp_path / f"kineto_rank{rank}.json").write_bytes(data)
    assert [p.name for p in expand_inputs([tmp_path])] == ["et_rank0.json", "et_rank1.json"]
    assert [p.name for p in kineto_paths(tmp_path)] == ["kineto_rank0.json",
                                                        "kineto_rank1.json.gz"]
    compiled = compile_paths([tmp_path], kineto=tmp_path)
    assert [p.timing.kineto for p in compiled.programs if p.timing is not None] == [
        "kineto_rank0.json", "kineto_rank1.json.gz"]


def test_each_rank_takes_host_gaps_from_its_own_profile_only_steps(tmp_path):
    """``<name>.profile.json`` beside a rank's Kineto trace (named by its
    ``<name>.step.json``) gives that rank's gaps, as for a single trace."""
    ets, kinetos = two_ranks(tmp_path)
    names = ["aten::mm", "c10d::allreduce_", "aten::relu"]
    events, t = [], 0.0
    for _ in range(3):
        start = t
        for name in names:
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 7,
                           "ts": t + 3.0, "dur": 2.0})
            t += 5.0  # a 3 us gap before each op
        events.append({"ph": "X", "cat": "user_annotation", "name": STEP_SCOPE, "pid": 1,
                       "tid": 7, "ts": start, "dur": t - start})
        t += 100.0
    (tmp_path / "rank-1.profile.json").write_text(json.dumps({"traceEvents": events}))
    (tmp_path / "rank-1.step.json").write_text(json.dumps({"profile": "rank-1.profile.json"}))
    compiled = compile_paths(ets, kineto=kinetos)
    rank0, rank1 = compiled.programs
    assert rank0.timing is not None and rank0.timing.host_gaps == "linked"
    assert rank1.timing is not None
    assert rank1.timing.host_gaps == "rank-1.profile.json (median of 3 profiled steps)"
    assert _gaps(rank0) == [None, 20.0, 20.0] and _gaps(rank1) == [3.0, 3.0, 3.0]
    assert (rank0.timing.observer_in_gaps, rank1.timing.observer_in_gaps) == (True, False)


def _error(capsys, argv: list[str]) -> str:
    assert cli_main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1  # one line, no traceback
    return lines[0]


def test_mismatched_kineto_traces_are_refused_naming_the_files(tmp_path, capsys):
    ets, kinetos = two_ranks(tmp_path)
    out = ["-o", str(tmp_path / "bench.py")]
    traces = [str(p) for p in ets]
    message = _error(capsys, [*traces, "--kineto", str(kinetos[0]), *out])
    assert message == ("mystique-gen: error: 2 rank traces (rank-0.json, rank-1.json) but 1 "
                       "Kineto trace(s) (rank-0.kineto.json): --kineto takes one Kineto "
                       "trace per rank trace")
    # One per rank and cycle (a repeating schedule's folder): which cycle is the user's.
    message = _error(capsys, [*traces, "--kineto", *map(str, kinetos), *map(str, kinetos),
                              *out])
    assert message.endswith("--kineto takes one Kineto trace per rank trace (a profiler "
                            "whose schedule repeats writes one per rank and cycle: give "
                            "one cycle's)")
    # Both record rank 0: not the ranks of the traces.
    doc = json.loads(kinetos[1].read_text())
    doc["distributedInfo"]["rank"] = 0
    twin = tmp_path / "twin.kineto.json"
    twin.write_text(json.dumps(doc))
    message = _error(capsys, [*traces, "--kineto", str(kinetos[0]), str(twin), *out])
    assert "record other ranks than the rank traces' (0, 1)" in message
    assert "rank-0.kineto.json rank 0, twin.kineto.json rank 0" in message
    # One records its rank, the other does not: by order, and the recorded one disagrees.
    _strip_rank(kinetos[0])
    message = _error(capsys, [*traces, "--kineto", str(kinetos[1]), str(kinetos[0]), *out])
    assert message == ("mystique-gen: error: rank-1.kineto.json records rank 1 but goes with "
                       "rank-0.json (rank 0) by order: give the Kineto traces in the order "
                       "of the rank traces")
    # One trace, two Kineto traces.
    message = _error(capsys, [traces[0], "--kineto", str(kinetos[0]), str(kinetos[1]), *out])
    assert "2 Kineto traces (rank-0.kineto.json, rank-1.kineto.json) for one trace" in message
    assert not (tmp_path / "bench.py").exists()


def test_compose_still_refuses_kineto(tmp_path, capsys):
    ets, kinetos = two_ranks(tmp_path)
    message = _error(capsys, [*(str(p) for p in ets), "--compose", "sequence", "--kineto",
                              *(str(k) for k in kinetos), "-o", str(tmp_path / "b.py")])
    assert message == "mystique-gen: error: --kineto links one trace; it cannot go with --compose"


def test_match_kineto_pairs():
    names, knames = ["a", "b", "c"], ["x", "y", "z"]
    assert match_kineto([0, 1, 2], [2, 0, 1], names, knames)[0] == [1, 2, 0]
    assert match_kineto([2, 0, 1], [None, None, None], names, knames)[0] == [0, 1, 2]
    assert match_kineto([0, 1, 2], [0, None, 2], names, knames)[0] == [0, 1, 2]
    with pytest.raises(OptionError, match="z records rank 1 but goes with c"):
        match_kineto([0, 1, 2], [0, None, 1], names, knames)
    with pytest.raises(OptionError, match="x rank 0, y rank 1, z rank 3"):
        match_kineto([0, 1, 2], [0, 1, 3], names, knames)


@pytest.fixture(scope="module")
def profiled_tp(tmp_path_factory) -> dict[int, list[Path]]:
    """A tensor-parallel job captured as PARAM's and HTA's recipes do, two cycles of a
    repeating schedule: per rank, its ET and its Kineto traces in cycle order."""
    out = tmp_path_factory.mktemp("profiled")
    proc = _torchrun(str(ROOT / "tests" / "parallel_workload.py"), str(out), "--profiled",
                     "tp", cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files: dict[int, list[Path]] = {0: [], 1: []}
    for path in sorted((out / "tp").glob("*.pt.trace.json")):
        kineto = load_kineto(path)
        files[kineto.rank].append((min(kineto_steps(kineto)), path))
    return {r: [out / "tp" / f"et_rank{r}.json"] + [p for _, p in sorted(files[r])]
            for r in (0, 1)}


@pytest.mark.slow
def test_kineto_traces_of_different_cycles_are_said_to_replay_different_steps(profiled_tp):
    """Each rank keeps the first step its own Kineto trace holds: given rank 0's first
    cycle and rank 1's second, rank 0 replayed ProfilerStep#2 and rank 1 #5, silently
    (the header named rank 0's step only). Said now; one cycle's files say nothing."""
    ets = [profiled_tp[r][0] for r in (0, 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one cycle's: no warning
        same = compile_paths(ets, kineto=[profiled_tp[0][2], profiled_tp[1][2]])
    assert not any("different steps" in n for p in same.programs for n in p.notes)
    with pytest.warns(UserWarning, match=r"the ranks replay different steps \(rank 0 "
                      r"ProfilerStep#2, rank 1 ProfilerStep#5\)"):
        mixed = compile_paths(ets, kineto=[profiled_tp[0][1], profiled_tp[1][2]])
    for program in mixed.programs:
        assert any("different steps" in n for n in program.notes)


def test_a_wait_for_a_peer_is_not_replayed_as_host_time(tmp_path):
    """Rank 1 posts a recv and waits LATE_SEND_S for rank 0, which sleeps before it
    sends: captured the PARAM/HTA way, the wait sat in rank 1's gap before the matmul
    reading the received tensor (50.9 ms of a 51 ms gap), and --host-gaps recorded
    busy-waited it as host time, replaying the original's peer pace. The backend's
    scope (``gloo:recv``) ends when the data came: only what follows is host time.
    Rank 0's sleep is its own host time and stays."""
    from tests.parallel_workload import LATE_SEND_S

    proc = _torchrun(str(ROOT / "tests" / "parallel_workload.py"), str(tmp_path),
                     "--profiled", "late_send", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "late_send"
    first: dict[int, Path] = {}
    for path in sorted(out.glob("*.pt.trace.json")):
        kineto = load_kineto(path)
        if kineto.rank not in first or min(kineto_steps(kineto)) < min(
                kineto_steps(load_kineto(first[kineto.rank]))):
            first[kineto.rank] = path
    sleep_us = LATE_SEND_S * 1e6
    with pytest.warns(UserWarning, match=r"us of rank 1's recorded gaps \(1 gaps\) were "
                      "waits for its peers"):
        compiled = compile_paths([out / "et_rank0.json", out / "et_rank1.json"],
                                 kineto=[first[0], first[1]])
    reader = {r: next(op for op in p.ops if op.name == "aten::matmul")
              for r, p in zip(compiled.ranks, compiled.programs, strict=True)}
    assert reader[1].timing is not None and reader[1].timing.gap_us is not None
    assert reader[1].timing.gap_us < sleep_us / 10
    assert reader[0].timing is not None and reader[0].timing.gap_us is not None
    assert reader[0].timing.gap_us > sleep_us * 0.9  # its own sleep: host time
    assert not any("waits for its peers" in n for n in compiled.programs[0].notes)
