"""Errors that name the trace node and field at fault."""

from __future__ import annotations

from mystique_gen.diagnostics import Diagnostic, Level


class MystiqueError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class OptionError(MystiqueError):
    """A build option that cannot be honoured (bad regex, unknown step, ...)."""


class TraceError(MystiqueError):
    """The trace is malformed. Carries the node id and field at fault where known."""

    def __init__(self, message: str, *, node_id: int | None = None, field: str | None = None):
        self.diagnostic = Diagnostic(Level.ERROR, message, node_id, field)
        self.node_id = node_id
        self.field = field
        self.message = message
        super().__init__(str(self.diagnostic))
