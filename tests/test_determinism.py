"""Deterministic output: the same bytes for the same input and flags, in any process;
the same body when every id in the trace is shifted; black-clean; nothing of the
machine or the moment (absolute paths, timestamps) in the file."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mystique_gen.backends.render import format_with_black
from mystique_gen.cli import main as cli_main
from tests.conftest import ROOT
from tests.tracebuilder import ADD_, EMBEDDING, MM, RELU, VIEW, TraceBuilder

EXAMPLE = ROOT / "examples" / "traces" / "mlp_sgd.et.json.gz"
SHIFT = 1_000_003
_SHA = re.compile(r"\b[0-9a-f]{64}\b")


def synthetic_doc() -> dict[str, Any]:
    """Reuse of storage ids, views, an index input, two scopes: the naming paths."""
    b = TraceBuilder()
    step = b.annotation("ProfilerStep#3")
    w = b.tensor((16, 8))
    idx = b.tensor((5,), dtype="int64")
    e = b.tensor((5, 8))
    b.op(EMBEDDING, [w, idx, -1, False, False], [e], parent=step)
    m = b.tensor((8, 4))
    o = b.tensor((5, 4))
    b.op(MM, [e, m], [o], parent=step)
    v = b.view(o, (20,))
    b.op(VIEW, [o, [20]], [v], parent=step)
    r = b.tensor((5, 4), storage=e.storage_id)  # storage id reused after a free
    b.op(RELU, [o], [r], parent=b.annotation("## backward ##", step))
    b.op(ADD_, [r, o, 1], [r], parent=step)
    return b.doc()


def _is_tensor_record(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 6 and isinstance(value[5], str)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value[:5]))


def _shift_values(value: Any) -> Any:
    if _is_tensor_record(value):
        return [value[0] + SHIFT, value[1] + SHIFT, *value[2:]]
    if isinstance(value, list):
        return [_shift_values(v) for v in value]
    return value


def shift_ids(doc: dict[str, Any]) -> dict[str, Any]:
    """Every node, tensor and storage id (and reference to one) plus SHIFT."""
    out = dict(doc)
    nodes = []
    for node in doc["nodes"]:
        node = dict(node)
        for key in ("id", "ctrl_deps", "parent", "fw_parent"):
            if isinstance(node.get(key), int) and (key != "fw_parent" or node[key]):
                node[key] += SHIFT
        for key in ("inputs", "outputs"):
            if isinstance(node.get(key), dict):
                node[key] = {**node[key], "values": _shift_values(node[key]["values"])}
            elif isinstance(node.get(key), list):
                node[key] = _shift_values(node[key])
        if "attrs" in node:
            node["attrs"] = [
                {**a, "value": a["value"] + SHIFT}
                if a["name"] == "fw_parent" and a["value"] else a
                for a in node["attrs"]
            ]
        nodes.append(node)
    out["nodes"] = nodes
    return out


def body(text: str) -> str:
    """Everything after the module docstring, with the trace's sha256 masked (the
    shifted file's bytes, hence its hash, differ by construction)."""
    assert text.startswith('"""')
    return _SHA.sub("<sha256>", text[text.index('"""', 3) + 3:])


def write_doc(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path


def generate(trace: Path, out: Path, *extra: str) -> str:
    assert cli_main([str(trace), "-o", str(out), *extra]) == 0
    return out.read_text()


def read_doc(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def test_same_input_same_bytes_in_fresh_processes(tmp_path):
    """Hash randomisation differs per process: set or dict order must never leak."""
    texts = []
    for seed in ("1", "2"):
        out = tmp_path / f"bench_{seed}" / "bench.py"
        env = {**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-m", "mystique_gen", str(EXAMPLE), "-o", str(out)],
                       check=True, cwd=ROOT, env=env, capture_output=True, timeout=300)
        texts.append(out.read_bytes())
    assert texts[0] == texts[1]


def test_same_input_same_bytes_in_process(tmp_path):
    trace = write_doc(tmp_path / "s.json", synthetic_doc())
    first = generate(trace, tmp_path / "a" / "b.py")
    second = generate(trace, tmp_path / "a" / "b.py")
    assert first == second


def _shift_case(tmp_path: Path, doc: dict[str, Any], name: str) -> tuple[str, str]:
    """(file of ``doc``, file of ``doc`` with shifted ids), same trace name and flags."""
    original = generate(write_doc(tmp_path / "o" / name, doc), tmp_path / "o" / "b.py")
    shifted = generate(write_doc(tmp_path / "s" / name, shift_ids(doc)), tmp_path / "s" / "b.py")
    return original, shifted


def test_shifted_ids_same_body_synthetic(tmp_path):
    original, shifted = _shift_case(tmp_path, synthetic_doc(), "t.json")
    assert original != shifted  # the docstring lists node ids and the hash
    assert body(original) == body(shifted)


def test_shifted_ids_same_body_captured_example(tmp_path):
    original, shifted = _shift_case(tmp_path, read_doc(EXAMPLE), "t.json.gz")
    assert body(original) == body(shifted)


@pytest.mark.conformance
def test_shifted_ids_same_body_flat_layout(tmp_path, shared_traces):
    doc = read_doc(shared_traces / "param" / "linear_et.json.gz")
    original, shifted = _shift_case(tmp_path, doc, "linear.json")
    assert body(original) == body(shifted)


def test_black_clean(tmp_path):
    text = generate(write_doc(tmp_path / "s.json", synthetic_doc()), tmp_path / "b.py")
    assert format_with_black(text) == text


def test_no_absolute_paths_or_timestamps(tmp_path):
    """The trace's own "time" field and the absolute paths given on the command line
    stay out of the file; only base names are recorded."""
    doc = synthetic_doc()
    doc["time"] = "2031-05-06 07:08:09"
    trace = write_doc(tmp_path / "deep" / "dir" / "s.json", doc)
    out = (tmp_path / "elsewhere" / "bench.py").resolve()
    text = generate(trace.resolve(), out)
    assert str(tmp_path) not in text
    assert "/deep/" not in text and "/elsewhere/" not in text
    assert os.path.expanduser("~") not in text
    assert "2031" not in text
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)
    assert not re.search(r"\b\d\d:\d\d:\d\d\b", text)
    assert "Command: mystique-gen s.json -o bench.py" in text
