"""Errors that name the trace node and field at fault."""

from __future__ import annotations

from dataclasses import dataclass


class MystiqueError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class TraceError(MystiqueError):
    """The trace is malformed. Carries the node id and field at fault where known."""

    def __init__(self, message: str, *, node_id: int | None = None, field: str | None = None):
        self.node_id = node_id
        self.field = field
        self.message = message
        where = []
        if node_id is not None:
            where.append(f"node {node_id}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = (", ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)


@dataclass(frozen=True)
class Problem:
    """An error as a value: why one node cannot be replayed. Collected, not raised."""

    node_id: int
    field: str | None
    reason: str

    def __str__(self) -> str:
        field = f" ({self.field})" if self.field else ""
        return f"node {self.node_id}{field}: {self.reason}"
