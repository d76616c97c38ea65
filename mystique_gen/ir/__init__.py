"""The intermediate representation: typed dataclasses every later stage reads.

``program`` holds ops, values, storages and the :class:`Program`; ``schema`` operator
signatures; ``dtypes`` the trace's type encodings; ``dist`` process groups and
collectives; ``diagnostics`` why something is not replayed. This package imports
nothing of mystique_gen's but itself and the harness's fill kinds.
"""

from mystique_gen.diagnostics import (  # noqa: F401 (diagnostics are part of the IR)
    Diagnostic,
    Level,
    filter_applied,
    guarded,
    not_replayed,
    note,
)
from mystique_gen.ir.program import *  # noqa: F403 (the IR's public types, one import)
