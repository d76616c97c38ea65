"""Diagnostics are one type: errors, skipped nodes, guards, filters and notes."""

from __future__ import annotations

from mystique_gen.diagnostics import Diagnostic, Level
from mystique_gen.driver import build_program
from mystique_gen.errors import TraceError
from mystique_gen.options import BuildOptions
from mystique_gen.sources.et import trace_from_document
from tests.tracebuilder import TraceBuilder


def test_an_error_is_a_diagnostic_naming_node_and_field():
    err = TraceError("expected a list of integers", node_id=42, field="inputs[0].shape")
    assert err.diagnostic == Diagnostic(Level.ERROR, "expected a list of integers", 42,
                                        "inputs[0].shape")
    assert str(err) == "node 42, field 'inputs[0].shape': expected a list of integers"


def test_the_program_gathers_every_kind_the_header_renders():
    b = TraceBuilder()
    x, y = b.tensor((4, 4)), b.tensor((4, 4))
    b.op("aten::relu(Tensor self) -> Tensor", [x], [y])
    b.op("aten::record_stream(Tensor(a!) self, Stream s) -> ()", [y], [])
    b.op("fbgemm::jagged_thing(Tensor x) -> Tensor", [x], [b.tensor((4, 4))])
    program = build_program(trace_from_document(b.doc(), name="t.json", sha256="0"),
                            options=BuildOptions(exclude=("nothing_matches",)))
    levels = {d.level for d in program.diagnostics}
    assert {Level.NOT_REPLAYED, Level.GUARDED, Level.FILTER} <= levels
    skipped = program.not_replayed[0]
    assert skipped.name == "aten::record_stream" and skipped.node_id is not None
    (guard,) = program.reported(Level.GUARDED)
    assert guard.name == "fbgemm::jagged_thing" and "fbgemm" in guard.reason
    assert program.filters and all(isinstance(f, str) for f in program.filters)
