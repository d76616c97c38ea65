"""Names several stages agree on: the capture, the generated harness and compare.

A neutral module that imports only the harness (the lowest layer), so any layer may
use it without pulling in another.
"""

# The profiler scopes around work the generated harness adds, and around a portable
# equivalent of an op: defined by the harness.
from mystique_gen.harness.runtime import EQUIVALENT_SCOPE, HARNESS_SCOPE

__all__ = ["BACKWARD_SCOPE", "DEVICE_CATEGORIES", "EQUIVALENT_SCOPE", "ET_SUFFIX",
           "HARNESS_SCOPE", "KINETO_SUFFIX", "SIDECAR_SUFFIX", "STEP_SCOPE", "equivalent_of",
           "in_backward"]


def equivalent_of(scope: str) -> str | None:
    """The op (``ns::name.overload``) whose equivalent ran in ``scope``, or None."""
    head, _, tail = EQUIVALENT_SCOPE.partition("{}")
    if scope.startswith(head) and scope.endswith(tail) and len(scope) > len(head + tail):
        return scope[len(head):len(scope) - len(tail)]
    return None

# The scope the autograd engine records around each node's backward: what ran in it is
# the backward's work.
BACKWARD_SCOPE = "autograd::engine::evaluate_function"


def in_backward(scopes: tuple[str, ...]) -> bool:
    """Whether an op inside ``scopes`` (its enclosing annotations) is the autograd
    engine's work: a node's backward."""
    return any(scope.startswith(BACKWARD_SCOPE) for scope in scopes)

# The annotation capture wraps each profiled step in (no "::": compare counts "ns::name"
# events as ops).
STEP_SCOPE = "MystiqueProfiledStep"
# Files a capture writes beside each other: <name>.et.json, <name>.kineto.json and
# <name>.step.json (which names <name>.profile.json).
ET_SUFFIX = ".et.json"
KINETO_SUFFIX = ".kineto.json"
SIDECAR_SUFFIX = ".step.json"
# Kineto categories of device activity (a kernel, a copy): the Kineto loader's GPU events,
# and the nodes Chakra's trace_link adds to an execution trace (its "ET+": each a copy
# of the CPU op that launched it, with the activity's "cat", "ts" and "stream").
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset",
                               "gpu_user_annotation"})
