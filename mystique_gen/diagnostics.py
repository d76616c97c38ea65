"""Diagnostics as values: every fact the compiler reports about a trace, one type.

A node that is not replayed, an op guarded at run time, a filter applied, a note for
the reader and the error that stops a build are all a :class:`Diagnostic` naming the
node and field at fault where there is one. Passes gather them on the Program; the
benchmark's docstring, ``mystique-gen inspect`` and the CLI's error line render them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Level(str, Enum):
    ERROR = "error"  # the build stops (raised inside a TraceError)
    NOT_REPLAYED = "not replayed"  # a node left out of the benchmark, and why
    GUARDED = "guarded"  # replayed; where unavailable at run time, ported or skipped
    FILTER = "filter"  # a selection, composition or rewrite that was asked for
    NOTE = "note"  # a fact a reader of the benchmark should know


@dataclass(frozen=True)
class Diagnostic:
    level: Level
    reason: str
    node_id: int | None = None
    field: str | None = None  # the record field at fault: "inputs[0].shape"
    name: str | None = None  # the op or node it is about: "aten::mm"

    def __str__(self) -> str:
        where = []
        if self.node_id is not None:
            where.append(f"node {self.node_id}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        return (", ".join(where) + ": " if where else "") + self.reason

    def to_dict(self) -> dict[str, object]:
        return {"level": self.level.value, "node": self.node_id, "field": self.field,
                "name": self.name, "reason": self.reason}


def not_replayed(node_id: int, name: str, reason: str) -> Diagnostic:
    return Diagnostic(Level.NOT_REPLAYED, reason, node_id, name=name)


def guarded(node_id: int, name: str, reason: str) -> Diagnostic:
    return Diagnostic(Level.GUARDED, reason, node_id, name=name)


def filter_applied(text: str) -> Diagnostic:
    return Diagnostic(Level.FILTER, text)


def note(text: str) -> Diagnostic:
    return Diagnostic(Level.NOTE, text)
