"""The incremental trace reader (load/stream.py) and the generation session (progress.py)."""

from __future__ import annotations

import gzip
import io
import json
import time
from pathlib import Path

import pytest

from mystique_gen import progress
from mystique_gen.errors import TraceError
from mystique_gen.progress import session
from mystique_gen.sources import jsonstream as stream
from mystique_gen.sources.et import EMPTY, load_trace, trace_from_document
from tests.conftest import ROOT
from tests.synthetic import write_synthetic

EXAMPLE = ROOT / "examples" / "traces" / "mlp_sgd.et.json.gz"


def _same(a, b) -> None:
    assert (a.name, a.sha256, a.schema, a.metadata) == (b.name, b.sha256, b.schema, b.metadata)
    assert a.nodes == b.nodes  # dataclass equality, field by field


def _reference(path: Path):
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    import hashlib

    return trace_from_document(doc, name=path.name, sha256=hashlib.sha256(raw).hexdigest())


@pytest.mark.parametrize("chunk", [stream.CHUNK, 4096, 7])
def test_streaming_equals_whole_document(monkeypatch, chunk):
    """Any buffer size reads the same trace, numbers and strings cut anywhere."""
    monkeypatch.setattr(stream, "CHUNK", chunk)
    _same(load_trace(EXAMPLE), _reference(EXAMPLE))


def test_streaming_synthetic_plain_json(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "CHUNK", 1000)
    path = tmp_path / "s.json"
    write_synthetic(path, 300)
    _same(load_trace(path), _reference(path))


def test_header_after_nodes_bom_and_odd_whitespace(tmp_path):
    doc = {"nodes": [{"id": 1, "name": "x", "ctrl_deps": 1}], "schema": "1.1.1", "pid": 7}
    text = json.dumps(doc, indent="\t").replace("[", "[ \r\n ", 1)
    path = tmp_path / "t.json"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    trace = load_trace(path)
    assert trace.schema == "1.1.1" and trace.metadata == {"schema": "1.1.1", "pid": 7}
    assert [n.id for n in trace.nodes] == [1]


def test_nodes_given_twice_is_refused(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"nodes": [{"id": 1, "name": "a"}], "nodes": [{"id": 2, "name": "b"}]}')
    with pytest.raises(TraceError, match="'nodes' is given twice"):
        load_trace(path)


def test_progress_reports_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "CHUNK", 512)
    path = tmp_path / "s.json"
    write_synthetic(path, 200)
    seen: list[int] = []
    load_trace(path, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == path.stat().st_size and len(seen) > 5


def test_empty_shapes_are_shared_and_read_only():
    trace = load_trace(EXAMPLE)
    empties = [a.shape for n in trace.nodes for a in n.inputs if a.shape == []]
    assert empties and all(s is EMPTY for s in empties)
    with pytest.raises(TypeError):
        EMPTY.append(1)
    import copy

    assert type(copy.deepcopy(EMPTY)) is list and copy.copy(EMPTY) == []


@pytest.mark.parametrize("compress", [False, True])
def test_sha256_is_of_the_file_bytes(tmp_path, monkeypatch, compress):
    """The recorded hash is the file's, however it was read (chunks, gzip trailer)."""
    monkeypatch.setattr(stream, "CHUNK", 100)
    text = gzip.decompress(EXAMPLE.read_bytes())
    data = gzip.compress(text, mtime=0) if compress else text
    path = tmp_path / ("t.json.gz" if compress else "t.json")
    path.write_bytes(data)
    import hashlib

    assert load_trace(path).sha256 == hashlib.sha256(data).hexdigest()


def test_value_larger_than_many_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "CHUNK", 64)
    big = "x" * 100_000
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schema": "1.1.1", "nodes": [{"id": 1, "name": big}]}))
    assert load_trace(path).nodes[0].name == big


def test_error_line_numbers_survive_refills(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "CHUNK", 16)
    lines = ['{"schema": "1.1.1", "nodes": [']
    lines += [f'{{"id": {i}, "name": "n"}},' for i in range(1, 40)]
    lines += ['{"id": 40, "name": "n"} oops', "]}"]
    path = tmp_path / "t.json"
    path.write_text("\n".join(lines))
    with pytest.raises(TraceError, match="at line 41"):
        load_trace(path)


# -- the session: progress bar only on a terminal, after a delay ---------------------------

class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_when_not_a_terminal():
    out = io.StringIO()
    with session(out):
        progress.phase("reading", 10)
    assert out.getvalue() == ""


def test_no_bar_for_short_generations():
    out = _Tty()
    with session(out):
        pass
    assert out.getvalue() == ""


def test_bar_drawn_and_cleared():
    out = _Tty()
    with session(out, bar=True, delay=0.0):
        progress.phase("reading t.json", 200)
        progress.advance(50)
        time.sleep(0.3)
        progress.advance(60)  # tqdm redraws on an update after its minimum interval
    text = out.getvalue()
    assert "mystique-gen: reading t.json" in text
    assert "25%" in text or "30%" in text
    assert "\n" not in text.rstrip("\n")  # one line, redrawn in place and cleared
