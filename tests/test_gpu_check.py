"""scripts/gpu_check.py is first run on a borrowed GPU with minutes to spare: its dry run
(every step that can run on CPU) runs here on every test run, so it cannot rot."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while built
    spec.loader.exec_module(module)
    return module


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    return env


def test_table_lines_up_and_keeps_every_field():
    gc = _module()
    rows = [gc.Row("streams", gc.OK, "1.0 ms", "fine"), gc.Row("fidelity", gc.SKIP)]
    lines = gc.format_table(rows).splitlines()
    assert lines[0].split() == ["check", "status", "numbers", "detail"]
    assert lines[2].startswith("streams   OK      1.0 ms   fine")
    assert lines[3].split() == ["fidelity", "SKIP"]


def test_without_cuda_and_without_dry_run_it_exits_3(tmp_path):
    gc = _module()
    cuda, _ = gc._cuda()
    if cuda:
        pytest.skip("CUDA is available here: the check would run")
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 3
    assert "CUDA is not available" in proc.stderr and "--dry-run" in proc.stderr


@pytest.mark.slow
def test_dry_run_prints_every_row_and_none_fails(tmp_path):
    out = tmp_path / "rows.json"
    # The dry run's own budget (300 s) is sized for an idle machine; on a loaded one its
    # last rows would be SKIPped for time, so the test gives it room.
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", str(tmp_path / "work"),
                           "--json", str(out), "--budget-s", "900"], capture_output=True,
                          text=True, timeout=1000, cwd=ROOT, env=_env())
    gc = _module()
    table = proc.stdout
    assert proc.returncode == 0, table + proc.stderr[-3000:]
    assert table.strip().splitlines()[-1] == "gpu_check: OK"
    printed = {line.split()[0]: line.split()[1] for line in table.splitlines()
               if line.split() and line.split()[0] in gc.ROWS}
    assert list(printed) == list(gc.ROWS)
    assert set(printed.values()) <= {gc.OK, gc.SKIP}
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert list(rows) == list(gc.ROWS)
    if (ROOT.parent / "shared" / "traces").is_dir():
        # What runs on CPU must have run, not been skipped for a missing input.
        for name in ("dtype-bf16", "fidelity"):
            assert rows[name]["status"] == gc.OK, rows[name]
        # The costly traces are opt-in on CPU, and say so (conformance replays them).
        assert "--big" in rows["trace:linear"]["detail"], rows["trace:linear"]
        for name in ("trace:simple_add", "nccl-1rank"):
            assert rows[name]["numbers"], rows[name]
    # CUDA-only parts say why they were skipped, and ran their CPU half where they have one.
    assert "needs CUDA" in rows["cuda-graph"]["detail"]
    assert rows["memory-check"]["status"] == gc.SKIP
    assert "mystique: needs" in rows["memory-check"]["detail"]
    assert "ran on cpu" in rows["device-map"]["detail"]
    assert "stream counts need CUDA" in rows["streams"]["detail"]
