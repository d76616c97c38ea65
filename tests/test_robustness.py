"""Hostile and broken traces: a one-line error naming the node and field, exit 2, no
traceback (unless --debug), no output file; or a safe file where the input is usable."""

from __future__ import annotations

import copy
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mystique_gen import driver
from mystique_gen.backends.check import check_source
from mystique_gen.backends.single import reference_facts
from mystique_gen.cli import main as cli_main
from tests.conftest import ROOT, last_json, run_benchmark
from tests.tracebuilder import MM, RELU, TraceBuilder


def base_doc() -> dict[str, Any]:
    b = TraceBuilder()
    x, w = b.tensor((4, 8)), b.tensor((8, 2))
    y = b.tensor((4, 2))
    b.op(MM, [x, w], [y])
    z = b.tensor((4, 2))
    b.op(RELU, [y], [z])
    return b.doc()


def op_nodes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes with an op schema, in id order."""
    nodes = [n for n in doc["nodes"] if any(
        a["name"] == "op_schema" and a["value"] for a in n["attrs"])]
    return sorted(nodes, key=lambda n: n["id"])


def write(tmp_path: Path, data: bytes | dict[str, Any], name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def generate(tmp_path: Path, trace: Path, capsys, *extra: str) -> tuple[int, list[str], Path]:
    out = tmp_path / "out" / "bench.py"
    rc = cli_main([str(trace), "-o", str(out), *extra])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return rc, err, out


def assert_refused(tmp_path: Path, trace: Path, capsys, *needles: str) -> str:
    rc, err, out = generate(tmp_path, trace, capsys)
    assert rc == 2, err
    assert len(err) == 1, err
    assert err[0].startswith("mystique-gen: error: "), err
    assert "Traceback" not in err[0]
    for needle in needles:
        assert needle in err[0], err[0]
    assert not out.exists()
    leftovers = list(out.parent.iterdir()) if out.parent.exists() else []
    assert leftovers == [], leftovers  # no temporary file either
    return err[0]


def mutated(mutate) -> dict[str, Any]:
    doc = copy.deepcopy(base_doc())
    mutate(doc)
    return doc


# -- the bytes are not a trace ----------------------------------------------------------

def test_not_json(tmp_path, capsys):
    assert_refused(tmp_path, write(tmp_path, b"hello, world"), capsys, "not valid JSON")


def test_empty_file(tmp_path, capsys):
    assert_refused(tmp_path, write(tmp_path, b""), capsys, "truncated JSON")


def _nodes_last(doc: dict[str, Any]) -> str:
    """The document as the observer writes it: its header fields, then the node list."""
    return json.dumps({k: v for k, v in doc.items() if k != "nodes"} | {"nodes": doc["nodes"]},
                      indent=1)


def test_truncated_json(tmp_path, capsys):
    """Cut before the first whole node (in the header, or inside the first node)."""
    text = _nodes_last(base_doc())
    first = text.index('"nodes"')
    for cut in (first // 2, first + 20):
        assert_refused(tmp_path, write(tmp_path, text[:cut].encode()), capsys,
                       "truncated JSON")


def test_truncated_gzip(tmp_path, capsys):
    data = gzip.compress(_nodes_last(base_doc()).encode())
    trace = write(tmp_path, data[:30], "t.json.gz")
    assert_refused(tmp_path, trace, capsys, "truncated gzip data")


@pytest.mark.parametrize("compressed", [False, True])
def test_a_trace_cut_inside_its_node_list_is_read_as_far_as_it_goes(tmp_path, capsys,
                                                                    compressed):
    """The observer finishes its file when it is unregistered: a process that ends
    first (killed after the step, ``os._exit``) leaves a node list without its end, and
    the trace was refused ("truncated JSON"). Its whole nodes are read, and stderr and
    the header say what is missing; the same where gzip data ends early."""
    text = _nodes_last(base_doc())
    whole = text.rindex("}", 0, text.rindex("]")) + 1  # after the last node's end
    for cut in (len(text) - 1, whole):  # the document's end, the node list's end
        data = text[:cut].encode()
        data = gzip.compress(data)[:-8] if compressed else data  # (no gzip trailer)
        trace = write(tmp_path, data, "t.json.gz" if compressed else "t.json")
        rc, err, out = generate(tmp_path, trace, capsys)
        assert rc == 0, err
        said = [line for line in err if "ends inside its node list" in line]
        assert len(said) == 1, err
        assert re.search(r"its (\d+) whole nodes are read", said[0])
        assert "ends inside its node list" in " ".join(out.read_text().split())


def test_corrupt_gzip(tmp_path, capsys):
    data = bytearray(gzip.compress(json.dumps(base_doc()).encode()))
    for i in range(40, len(data) - 8, 7):
        data[i] ^= 0x5A
    assert_refused(tmp_path, write(tmp_path, bytes(data), "t.json.gz"), capsys, "gzip")


def test_not_utf8(tmp_path, capsys):
    assert_refused(tmp_path, write(tmp_path, b'{"nodes": ["\xff\xfe"]}'), capsys, "UTF-8")


def test_missing_file(tmp_path, capsys):
    assert_refused(tmp_path, tmp_path / "nope.json", capsys, "no such trace file")


def test_top_level_not_an_object(tmp_path, capsys):
    assert_refused(tmp_path, write(tmp_path, b"[1, 2]"), capsys, "expected an object")


def test_extra_data_after_document(tmp_path, capsys):
    data = json.dumps(base_doc()).encode() + b" {}"
    assert_refused(tmp_path, write(tmp_path, data), capsys, "not valid JSON")


@pytest.mark.parametrize("where", ["/proc/bench.py", "folder", "a file's folder"])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys,
                                                                     where, monkeypatch):
    """-o on /proc, on a folder, or below a file: a traceback after the whole trace was
    compiled (minutes for a large one)."""
    blocker = write(tmp_path, b"", "blocker")
    out = {"/proc/bench.py": Path("/proc/bench.py"), "folder": tmp_path,
           "a file's folder": blocker / "bench.py"}[where]
    monkeypatch.setattr(driver, "compile_paths", lambda *a, **k: pytest.fail("compiled"))
    rc = cli_main([str(write(tmp_path, base_doc())), "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"mystique-gen: error: -o {out}: ")


def test_capture_into_a_folder_that_cannot_be_written_stops_before_the_script(tmp_path,
                                                                              capsys):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('ran')\n")
    for out in (Path("/proc/traces"), script):
        rc = cli_main(["capture", "-o", str(out), "--", sys.executable, str(script)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err[-1].startswith(f"mystique-gen: error: -o {out}: "), err


def test_empty_object(tmp_path, capsys):
    assert_refused(tmp_path, write(tmp_path, {}), capsys, "no 'nodes' field")


def test_a_kineto_trace_given_as_the_trace_says_what_it_is_and_what_to_do(tmp_path, capsys):
    """A user's first try is often the profiler trace they already have: "no 'nodes'
    field; is this an execution trace?" left them guessing."""
    kineto = {"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 2.0}]}
    assert_refused(tmp_path, write(tmp_path, kineto), capsys, "a Kineto (torch.profiler) "
                   "trace, not an execution trace", "ExecutionTraceObserver", "--kineto")


@pytest.mark.parametrize("nodes", [{}, "nodes", 3, None])
def test_nodes_not_a_list(tmp_path, capsys, nodes):
    assert_refused(tmp_path, write(tmp_path, {"schema": "1.1.1", "nodes": nodes}), capsys,
                   "'nodes' is", "expected a list")


def test_integer_too_long_to_read(tmp_path, capsys):
    data = b'{"nodes": [{"id": ' + b"9" * 5000 + b"}]}"
    assert_refused(tmp_path, write(tmp_path, data), capsys, "nodes[0]")


# -- nodes with missing or mistyped fields -------------------------------------------------

def _drop(key: str):
    def mutate(doc):
        del op_nodes(doc)[0][key]
    return mutate


def _set(key: str, value: Any, which: int = 0):
    def mutate(doc):
        node = op_nodes(doc)[which]
        target = node
        *path, last = key.split(".")
        for part in path:
            target = target[part]
        target[last] = value
    return mutate


def _first_op_id() -> int:
    return op_nodes(base_doc())[0]["id"]


def test_missing_id(tmp_path, capsys):
    assert_refused(tmp_path, write(tmp_path, mutated(_drop("id"))), capsys, "has no 'id'")


@pytest.mark.parametrize("mutate,field", [
    (_drop("name"), "name"),
    (_set("name", 7), "name"),
    (_set("ctrl_deps", "3"), "ctrl_deps"),
    (_set("inputs", [1, 2]), "inputs"),
    (_set("inputs.values", 3), "inputs.values"),
    (_set("inputs.types", "Tensor(float)"), "inputs.types"),
    (_set("inputs.types", [1, 2]), "inputs.types[0]"),
    (_set("inputs.types", ["Tensor(float)"]), "inputs.types"),
    (_set("attrs", {"op_schema": MM}), "attrs"),
    (_set("attrs", [{"value": 1}]), "attrs"),
    (_set("inputs.values", [["a", 2, 0, 32, 4, "cpu"], [1, 2, 0, 16, 4, "cpu"]]), "inputs[0]"),
    (_set("inputs.values", [[1, 2, 0, 32, 4, 7], [3, 4, 0, 16, 4, "cpu"]]), "inputs[0]"),
    (_set("inputs.values", [[1, 2, -5, 32, 4, "cpu"], [3, 4, 0, 16, 4, "cpu"]]), "inputs[0]"),
    (_set("inputs.values", [[1, 2], [3, 4, 0, 16, 4, "cpu"]]), "inputs[0]"),
    (_set("inputs.shapes", [["4", 8], [8, 2]]), "inputs[0].shape"),
    (_set("inputs.shapes", [[-4, 8], [8, 2]]), "inputs[0].shape"),
    (_set("inputs.strides", [[8], [2, 1]]), "inputs[0].strides"),
    (_set("inputs.values", [[1, 2, 0, 32, 4, "cu da:0"], [3, 4, 0, 16, 4, "cpu"]]),
     "inputs[0]"),
])
def test_bad_field_names_node_and_field(tmp_path, capsys, mutate, field):
    line = assert_refused(tmp_path, write(tmp_path, mutated(mutate)), capsys)
    assert f"node {_first_op_id()}" in line, line
    assert f"field '{field}'" in line, line


def test_mistyped_id_names_the_index(tmp_path, capsys):
    doc = mutated(_set("id", "7"))
    index = next(i for i, n in enumerate(doc["nodes"]) if n["id"] == "7")
    assert_refused(tmp_path, write(tmp_path, doc), capsys, f"nodes[{index}].id",
                   "expected an integer")


def test_duplicate_ids(tmp_path, capsys):
    doc = base_doc()
    first, second = op_nodes(doc)
    second["id"] = first["id"]
    assert_refused(tmp_path, write(tmp_path, doc), capsys, f"node {first['id']}", "duplicate")


def test_ctrl_deps_cycle(tmp_path, capsys):
    doc = base_doc()
    thread = next(n for n in doc["nodes"] if n["name"].endswith("|thread]"))
    process = next(n for n in doc["nodes"] if n["name"].endswith("|process]"))
    process["ctrl_deps"] = thread["id"]  # thread -> process -> thread
    assert_refused(tmp_path, write(tmp_path, doc), capsys, "cycle", "field 'ctrl_deps'")


@pytest.mark.parametrize("depth", [5000, 100_000])
def test_lists_nested_thousands_deep(tmp_path, capsys, depth):
    data = json.dumps(base_doc()).encode()
    deep = b"[" * depth + b"1" + b"]" * depth
    data = data.replace(b'"values": [', b'"values": [' + deep + b", ", 1)
    assert_refused(tmp_path, write(tmp_path, data), capsys, "nested too deeply", "nodes[")


def test_lists_nested_hundreds_deep_are_data(tmp_path, capsys):
    """Deep but decodable nesting in an argument: refused by type, never by a crash."""
    deep: Any = 1
    for _ in range(400):
        deep = [deep]
    doc = mutated(_set("inputs.values", [deep, [3, 4, 0, 16, 4, "cpu"]]))
    line = assert_refused(tmp_path, write(tmp_path, doc), capsys, "field 'inputs[0]'")
    assert f"node {_first_op_id()}" in line


def test_debug_shows_the_traceback(tmp_path, capsys):
    trace = write(tmp_path, b"not json")
    rc = cli_main([str(trace), "-o", str(tmp_path / "b.py"), "--debug"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("mystique-gen: error:")


def test_cli_process_exit_status_and_one_line(tmp_path):
    """Through the real entry point: exit status 2, one stderr line, no file."""
    trace = write(tmp_path, json.dumps(base_doc()).encode()[:200])
    out = tmp_path / "b.py"
    proc = subprocess.run([sys.executable, "-m", "mystique_gen", str(trace), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "truncated JSON" in proc.stderr
    assert not out.exists()


# -- usable input with surprises: warn or skip, and the file stays safe --------------------

def test_unknown_schema_version_warns_and_continues(tmp_path, capsys):
    doc = base_doc()
    doc["schema"] = "9.9.9-future"
    rc, err, out = generate(tmp_path, write(tmp_path, doc), capsys)
    assert rc == 0, err
    assert any(line.startswith("mystique-gen: warning:")
               and "unknown schema version '9.9.9-future'" in line for line in err), err
    check_source(out.read_text(), reference_facts())


HOSTILE = [
    'aten::mm"); import os; os.system("echo pwned',
    "aten::mm\nimport os",
    "aten::mm.default\n",
    "__builtins__::eval.default",
    "aten::mm.__class__",
    "aten::__class__.default",
    "aten::__dict__",
    "aten::m\u00e9",
    "aten::mm.default\"\"\"",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_operator_names_are_not_replayed(tmp_path, capsys, name):
    doc = base_doc()
    node = op_nodes(doc)[0]
    node["name"] = name
    for attr in node["attrs"]:
        if attr["name"] == "op_schema":
            attr["value"] = name + "(Tensor self, Tensor mat2) -> Tensor"
    rc, err, out = generate(tmp_path, write(tmp_path, doc), capsys)
    assert rc == 0, err
    text = out.read_text()
    check_source(text, reference_facts())
    body = text.split('"""', 2)[2]  # trace text may only appear in the docstring
    assert "pwned" not in body
    assert body.count("import os") == 1  # the harness's own import
    assert "aten_mm(" not in body.split("def replay", 1)[1]


def test_hostile_strings_become_literals(tmp_path, capsys):
    """Quotes, newlines, backslashes and unicode in string arguments, scopes and names
    stay data: the file parses, and the values round-trip through its literals."""
    evil = "a\"b'c\\nd\n\"\"\"e\u2028\ud800"
    b = TraceBuilder()
    scope = b.annotation("## " + evil + " ##")
    x = b.tensor((3,))
    y = b.tensor((3,))
    b.op("aten::div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor",
         [x, x, evil], [y], parent=scope)
    rc, err, out = generate(tmp_path, write(tmp_path, b.doc()), capsys)
    assert rc == 0, err
    text = out.read_text()
    check_source(text, reference_facts())
    import ast

    strings = {n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant)}
    assert evil in strings


@pytest.mark.parametrize("value,literal", [
    (float("nan"), 'float("nan")'),
    (float("inf"), 'float("inf")'),
    (float("-inf"), '-float("inf")'),
    (2**70, None),
])
def test_non_finite_and_huge_numbers(tmp_path, capsys, value, literal):
    b = TraceBuilder()
    x = b.tensor((3,))
    y = b.tensor((3,))
    b.op("aten::add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
         [x, value], [y])
    rc, err, out = generate(tmp_path, write(tmp_path, b.doc()), capsys)
    assert rc == 0, err
    text = out.read_text()
    check_source(text, reference_facts())
    if literal is None:  # beyond 64 bits: not replayed, with the reason
        assert "outside 64 bits" in text and "aten_add_Scalar(" not in text
    else:
        assert literal in text


MASKED_FILL = ("aten::masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor")
CLAMP = ("aten::clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor")


@pytest.mark.parametrize("text,literal", [
    ("-inf", '-float("inf")'), ("inf", 'float("inf")'), ("nan", 'float("nan")'),
])
def test_non_finite_floats_recorded_as_strings(tmp_path, capsys, text, literal):
    """JSON has no infinity: the ET observer writes a non-finite Double as "-inf", "inf"
    or "nan" (masked_fill(mask, -inf) in attention masks and MoE routers). Wherever a
    float is expected that is the number, and the benchmark runs with it."""
    b = TraceBuilder()
    x, mask = b.tensor((3, 4)), b.tensor((3, 4), dtype="bool")
    y, z = b.tensor((3, 4)), b.tensor((3, 4))
    b.op(MASKED_FILL, [x, mask, text], [y])
    b.op(CLAMP, [y, text, None], [z])
    rc, err, out = generate(tmp_path, write(tmp_path, b.doc()), capsys)
    assert rc == 0, err
    source = out.read_text()
    check_source(source, reference_facts())
    calls = [line for line in source.splitlines()
             if "aten_masked_fill_Scalar(" in line or "aten_clamp(" in line]
    assert len(calls) == 2 and all(f", {literal}" in c for c in calls), calls
    proc = run_benchmark(out, "--device", "cpu", "--warmup", "0", "--iters", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("schema,value", [
    (CLAMP, "-infinite"),  # not a number, though it starts like one
    ("aten::select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)", "inf"),
])
def test_strings_where_no_float_fits_are_refused(tmp_path, capsys, schema, value):
    b = TraceBuilder()
    x, y = b.tensor((3, 4)), b.tensor((4,))
    b.op(schema, [x, 0, value] if "select" in schema else [x, value, None], [y])
    assert_refused(tmp_path, write(tmp_path, b.doc()), capsys, "expected a number, got str")


def test_tensors_without_storage_replay_on_stand_ins_only_where_no_real_tensor_meets_them(
        tmp_path, capsys):
    """Ops run under vmap (transformers' mask functions) record their batched tensors as
    [id, 0, 0, 0, 0, ""]: no storage or device. Calling the op with None in their place
    crashed the benchmark. An op among such wrappers alone replays on stand-ins of
    their recorded shape; one that mixes them with real tensors is not replayed, with
    the reason (its values are unknown)."""
    b = TraceBuilder()
    x, y = b.tensor((3,), dtype="int64"), b.tensor((3,), dtype="bool")
    b.op("aten::new_ones(Tensor self, SymInt[] size, *, ScalarType? dtype=None, "
         "Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
         [x, [], 11, None, None, False], [y])
    real, wrapped = b.tensor((3,)), b.tensor((3,))
    b.op("aten::mul.Tensor(Tensor self, Tensor other) -> Tensor", [real, wrapped],
         [b.tensor((3,))])
    b.op(RELU, [b.tensor((2,))], [b.tensor((2,))])
    doc = b.doc()
    node = next(n for n in doc["nodes"] if n["name"] == "aten::new_ones")
    node["inputs"]["values"][0] = [x.tensor_id, 0, 0, 0, 0, ""]
    node["outputs"]["values"][0] = [y.tensor_id, 0, 0, 0, 0, ""]
    node = next(n for n in doc["nodes"] if n["name"] == "aten::mul")
    node["inputs"]["values"][1] = [wrapped.tensor_id, 0, 0, 0, 0, ""]
    node["outputs"]["values"][0][1:] = [0, 0, 0, 0, ""]
    rc, err, out = generate(tmp_path, write(tmp_path, doc), capsys)
    assert rc == 0, err
    source = out.read_text()
    assert "aten_new_ones(\n        _metadata_stand_in(" in source
    assert "aten::mul x1: outputs[0]: a tensor without storage" in source
    assert "aten_mul(" not in source
    proc = run_benchmark(out, "--device", "cpu", "--warmup", "0", "--iters", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_huge_tensor_generates_and_refuses_to_run(tmp_path, capsys):
    """A 10**13-element tensor: the file is written; the benchmark says what it needs
    and what is free before allocating anything, and exits."""
    b = TraceBuilder()
    x = b.tensor((10**13,))
    y = b.tensor((10**13,))
    b.op(RELU, [x], [y])
    rc, err, out = generate(tmp_path, write(tmp_path, b.doc()), capsys)
    assert rc == 0, err
    text = out.read_text()
    assert f"REQUIRED_BYTES = {2 * 4 * 10**13}" in text
    proc = run_benchmark(out, "--device", "cpu", "--iters", "1", "--warmup", "0", timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "needs 74505.81 GiB on cpu but" in proc.stderr and "GiB are free" in proc.stderr


def test_a_gpu_traces_host_tensors_are_estimated_apart(tmp_path, capsys):
    """PARAM's benchmarks flush the cache with a 40 MB tensor on the host between
    timed GPU ops: the file's estimate for --device (REQUIRED_BYTES, what its memory
    check asks of the GPU) leaves it out and states it apart (HOST_BYTES, the header);
    replayed on the host, the benchmark counts both (`estimated_peak_bytes`)."""
    b = TraceBuilder()
    x, y = b.tensor((256, 256), device="cuda"), b.tensor((256, 256), device="cuda")
    flush, flushed = b.tensor((10_485_760,)), b.tensor((10_485_760,))
    b.op(RELU, [x], [y])
    b.op(RELU, [flush], [flushed])
    rc, err, out = generate(tmp_path, write(tmp_path, b.doc()), capsys)
    assert rc == 0, err
    text = out.read_text()
    device, host = 2 * 4 * 256 * 256, 2 * 4 * 10_485_760
    assert f"REQUIRED_BYTES = {device}\nHOST_BYTES = {host}\n" in text
    assert "Estimated peak memory: 512.0 KiB on cuda, 80.0 MiB on the host" in text
    proc = run_benchmark(out, "--device", "cpu", "--iters", "1", "--warmup", "0",
                         "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert last_json(proc.stdout)["estimated_peak_bytes"] == device + host


def test_a_gpu_traces_backend_kernels_run_as_portable_equivalents(tmp_path, capsys):
    """Autograd calls cuDNN's batch-norm backward directly, so a CUDA trace replays it
    as recorded; where it cannot run (the host, another vendor's GPU, a dtype cuDNN
    refuses), the benchmark runs native batch norm's backward in its place, says so
    in its header, on stderr and in --json, and skips nothing."""
    b = TraceBuilder()
    x, grad = b.tensor((8, 4, 6, 6), device="cuda"), b.tensor((8, 4, 6, 6), device="cuda")
    weight, bias = b.tensor((4,), device="cuda"), b.tensor((4,), device="cuda")
    mean, var = b.tensor((4,), device="cuda"), b.tensor((4,), device="cuda")
    out = b.tensor((8, 4, 6, 6), device="cuda")
    save_mean, save_var = b.tensor((4,), device="cuda"), b.tensor((4,), device="cuda")
    reserve = b.tensor((0,), dtype="uint8", device="cuda")
    grads = [b.tensor((8, 4, 6, 6), device="cuda"), b.tensor((4,), device="cuda"),
             b.tensor((4,), device="cuda")]
    b.op("aten::cudnn_batch_norm(Tensor input, Tensor weight, Tensor? bias, Tensor? "
         "running_mean, Tensor? running_var, bool training, float "
         "exponential_average_factor, float epsilon) -> (Tensor, Tensor, Tensor, Tensor)",
         [x, weight, bias, mean, var, True, 0.1, 1e-5], [out, save_mean, save_var, reserve])
    b.op("aten::cudnn_batch_norm_backward(Tensor input, Tensor grad_output, Tensor weight, "
         "Tensor? running_mean, Tensor? running_var, Tensor? save_mean, Tensor? save_var, "
         "float epsilon, Tensor reserveSpace) -> (Tensor, Tensor, Tensor)",
         [x, grad, weight, mean, var, save_mean, save_var, 1e-5, reserve], grads)
    rc, err, out_path = generate(tmp_path, write(tmp_path, b.doc()), capsys)
    assert rc == 0, err
    header = " ".join(out_path.read_text().split('"""')[1].split())
    assert ("- aten::cudnn_batch_norm_backward x1: backend-specific kernel, with a "
            "portable equivalent") in header
    proc = run_benchmark(out_path, "--device", "cpu", "--iters", "2", "--warmup", "1",
                         "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    facts = last_json(proc.stdout)
    assert facts["skipped_at_runtime"] == [] and facts["ops"] == 2
    assert facts["equivalents_at_runtime"] == ["aten::cudnn_batch_norm.default",
                                               "aten::cudnn_batch_norm_backward.default"]
    assert proc.stderr.count("running its portable equivalent") == 2



def test_a_gpu_traces_quantized_matmuls_run_as_portable_equivalents(tmp_path, capsys):
    """torchao's int4 weight-only linear on CUDA records tinygemm's
    ``_weight_int4pack_mm`` (no host kernel) and its float8 dynamic quantization
    MSLK's ``f8f8bf16_rowwise`` (a library the benchmark does not load): on the host
    both were skipped, every quantized linear gone from the replay. They run as
    torch ops (dequantize, multiply), named in the header, on stderr and in --json."""
    b = TraceBuilder()
    x = b.tensor((4, 64), dtype="bfloat16", device="cuda")
    tiles = b.tensor((4, 2, 32, 1), dtype="int32", device="cuda")  # n=32, k=64, 2 tiles
    scale_zero = b.tensor((2, 32, 2), dtype="bfloat16", device="cuda")
    out = b.tensor((4, 32), dtype="bfloat16", device="cuda")
    b.op("aten::_weight_int4pack_mm(Tensor self, Tensor mat2, int qGroupSize, "
         "Tensor qScaleAndZeros) -> Tensor", [x, tiles, 32, scale_zero], [out])
    xq = b.tensor((4, 64), dtype="float8_e4m3fn", device="cuda")
    wq = b.tensor((32, 64), dtype="float8_e4m3fn", device="cuda")
    x_scale = b.tensor((4, 1), device="cuda")
    w_scale = b.tensor((1, 32), device="cuda", strides=(1, 1))
    result = b.tensor((4, 32), dtype="bfloat16", device="cuda")
    b.op("mslk::f8f8bf16_rowwise(Tensor XQ, Tensor WQ, Tensor x_scale, Tensor w_scale, "
         "Tensor? bias=None, bool use_fast_accum=True, Tensor(a!)? output=None) -> Tensor",
         [xq, wq, x_scale, w_scale, None, True, None], [result])
    rc, err, out_path = generate(tmp_path, write(tmp_path, b.doc()), capsys)
    assert rc == 0, err
    header = " ".join(out_path.read_text().split('"""')[1].split())
    assert "mslk::f8f8bf16_rowwise x1: namespace mslk:: may not be loaded, with a " \
        "portable equivalent" in header
    assert "aten::_weight_int4pack_mm x1: kernels for some devices only, with a " \
        "portable equivalent" in header
    proc = run_benchmark(out_path, "--device", "cpu", "--iters", "2", "--warmup", "1",
                         "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    facts = last_json(proc.stdout)
    assert facts["skipped_at_runtime"] == [] and facts["ops"] == 2
    assert facts["equivalents_at_runtime"] == ["aten::_weight_int4pack_mm.default",
                                               "mslk::f8f8bf16_rowwise.default"]


SDPA = ("aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, "
        "Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, "
        "float? scale=None, bool enable_gqa=False) -> Tensor")
PERMUTE = "aten::permute(Tensor(a) self, int[] dims) -> Tensor(a)"
VIEW = "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)"


@pytest.mark.parametrize("laid_out_as", ["other backend", "contiguous"])
def test_a_view_of_a_kernel_output_laid_out_elsewhere_still_views(tmp_path, capsys,
                                                                  laid_out_as):
    """Multi-head attention permutes attention's output and views it, which works only
    in the layout attention gave it where the trace was made (on the host, its query's;
    on a GPU, another): replayed where the kernel lays it out otherwise, the view failed
    ("view size is not compatible with input tensor's size and stride") and stopped
    the benchmark. The file gives that output its recorded layout, copying only where
    the kernel's differs; a kernel output it need not touch stays as it is."""
    b = TraceBuilder()
    batch, heads, length, dim = 2, 4, 8, 16
    q = b.tensor((batch, heads, length, dim))
    # Recorded as a (length, batch, heads, dim) buffer: the host kernel here gives a
    # contiguous query's output its own contiguous layout instead.
    strides = (heads * dim, dim, batch * heads * dim, 1)
    out = b.tensor((batch, heads, length, dim), strides=strides)
    permuted = b.view(out, (length, batch, heads, dim))
    viewed = b.view(out, (length * batch, heads * dim))
    b.op(SDPA, [q, q, q, None, 0.0, False, None, False], [out])
    b.op(PERMUTE, [out, [2, 0, 1, 3]], [permuted])
    b.op(VIEW, [permuted, [length * batch, heads * dim]], [viewed])
    if laid_out_as == "contiguous":  # a relu's output, contiguous, viewed: untouched
        r = b.tensor((length, batch * heads * dim))
        b.op(RELU, [viewed], [r])
        b.op(VIEW, [r, [length * batch, heads * dim]], [b.view(r, (length * batch,
                                                                   heads * dim))])
    rc, err, path = generate(tmp_path, write(tmp_path, b.doc()), capsys)
    assert rc == 0, err
    text = re.sub(r"\s+", "", path.read_text())
    assert text.count("=_laid_out(scaled_dot_product_attention,(64,16,128,1))") == 1
    assert text.count("=_laid_out(") == 1
    proc = run_benchmark(path, "--device", "cpu", "--iters", "2", "--warmup", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert last_json(proc.stdout)["skipped_at_runtime"] == []


def test_a_trace_without_strides_views_a_copy_where_its_layout_refuses(tmp_path, capsys):
    """Observers before torch 2.4 wrote no strides, and torch 2.1's attention laid its
    output out by sequence, which the model's permute-and-view relied on. Replayed with
    that layout guessed row-major, a torch 2.1 Llama stopped at the view ("view size is
    not compatible with input tensor's size and stride"). Without strides no layout is
    imposed; a view its input refuses views a contiguous copy, says so once, and the
    header says why."""
    b = TraceBuilder(schema="1.0.1")
    batch, heads, length, dim = 2, 4, 8, 16
    q = b.tensor((batch, heads, length, dim))
    out = b.tensor((batch, heads, length, dim))
    permuted = b.view(out, (length, batch, heads, dim))
    viewed = b.view(out, (length * batch, heads * dim))
    b.op(SDPA, [q, q, q, None, 0.0, False, None, False], [out])
    b.op(PERMUTE, [out, [2, 0, 1, 3]], [permuted])
    b.op(VIEW, [permuted, [length * batch, heads * dim]], [viewed])
    b.op(RELU, [viewed], [b.tensor((length * batch, heads * dim))])
    doc = b.doc()
    for node in doc["nodes"]:
        for field in ("inputs", "outputs"):
            if isinstance(node.get(field), dict):
                node[field].pop("strides", None)
    rc, err, path = generate(tmp_path, write(tmp_path, doc), capsys)
    assert rc == 0, err
    source = path.read_text()
    header = " ".join(source.split('"""')[1].split())
    assert "the trace records no strides (torch 2.3 or older)" in header
    text = re.sub(r"\s+", "", source)
    assert "=_laid_out(" not in text and text.count("=_viewed(") == 1
    proc = run_benchmark(path, "--device", "cpu", "--iters", "2", "--warmup", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("views a contiguous copy") == 1
    assert last_json(proc.stdout)["skipped_at_runtime"] == []


def test_sync_batch_norm_from_a_gpu_trace_runs_on_the_host(tmp_path, capsys):
    """SyncBatchNorm calls CUDA-only kernels by name (no name says so: the generating
    PyTorch's dispatcher does); the benchmark stopped at the first one on the host. It
    now guards them and runs their portable equivalents."""
    b = TraceBuilder()
    x = b.tensor((8, 4, 6, 6), device="cuda")
    weight, bias = b.tensor((4,), device="cuda"), b.tensor((4,), device="cuda")
    mean, invstd = b.tensor((4,), device="cuda"), b.tensor((4,), device="cuda")
    means, invstds = b.tensor((2, 4), device="cuda"), b.tensor((2, 4), device="cuda")
    counts = b.tensor((2,), device="cuda")
    gmean, ginvstd = b.tensor((4,), device="cuda"), b.tensor((4,), device="cuda")
    out = b.tensor((8, 4, 6, 6), device="cuda")
    b.op("aten::batch_norm_stats(Tensor input, float eps) -> (Tensor, Tensor)",
         [x, 1e-5], [mean, invstd])
    b.op("aten::batch_norm_gather_stats_with_counts(Tensor input, Tensor mean, Tensor "
         "invstd, Tensor? running_mean, Tensor? running_var, float momentum, float eps, "
         "Tensor counts) -> (Tensor, Tensor)",
         [x, means, invstds, None, None, 0.1, 1e-5, counts], [gmean, ginvstd])
    b.op("aten::batch_norm_elemt(Tensor input, Tensor? weight, Tensor? bias, Tensor mean, "
         "Tensor invstd, float eps) -> Tensor", [x, weight, bias, gmean, ginvstd, 1e-5], [out])
    rc, err, path = generate(tmp_path, write(tmp_path, b.doc()), capsys)
    assert rc == 0, err
    header = " ".join(path.read_text().split('"""')[1].split())
    assert ("- aten::batch_norm_stats x1: kernels for some devices only, with a portable "
            "equivalent") in header
    proc = run_benchmark(path, "--device", "cpu", "--iters", "2", "--warmup", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    facts = last_json(proc.stdout)
    assert facts["skipped_at_runtime"] == [] and facts["ops"] == 3
    assert facts["equivalents_at_runtime"] == [
        "aten::batch_norm_elemt.default", "aten::batch_norm_gather_stats_with_counts.default",
        "aten::batch_norm_stats.default"]
