"""Which tensor arguments autograd differentiates, from torch's own ``derivatives.yaml``.

A replay marks the floating inputs a grad-recording op reads as parameters (they
require grad). Autograd refuses one that its formula table gives no gradient for
("The function 'soft_margin_loss' is not differentiable with respect to argument
'target'"), so such an argument is never a parameter. The table ships inside torch's
wheel (``torchgen/packaged/autograd/derivatives.yaml``); where it is missing, nothing
is known and the hand-written ``not_differentiable`` rules alone apply.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

_ENTRY = re.compile(r"^- name:\s*(\S+?)\((.*)\)\s*->")
_KEY = re.compile(r"^\s+([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*:\s*(.*)$")
_TENSOR_ARG = re.compile(r"Tensor(?:\([^)]*\))?\??\s+(\w+)")


def _table() -> Path | None:
    spec = importlib.util.find_spec("torchgen")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / "packaged" / "autograd" / "derivatives.yaml"
        if path.is_file():
            return path
    return None


def parse(text: str) -> dict[str, frozenset[str]]:
    """``aten::<op>`` -> the tensor arguments an overload of it leaves without a formula
    (or marks ``non_differentiable``) and none differentiates."""
    missing: dict[str, set[str]] = {}
    anywhere: dict[str, set[str]] = {}  # differentiated by some overload
    entry: tuple[str, set[str]] | None = None
    graded: set[str] = set()

    def close() -> None:
        if entry is None:
            return
        name, tensors = entry
        base = "aten::" + name.split(".", 1)[0]
        missing.setdefault(base, set()).update(tensors - graded)
        anywhere.setdefault(base, set()).update(graded)

    for line in text.splitlines():
        m = _ENTRY.match(line)
        if m:
            close()
            entry, graded = (m.group(1), set(_TENSOR_ARG.findall(m.group(2)))), set()
            continue
        k = _KEY.match(line)
        if entry is not None and k and not k.group(2).startswith("non_differentiable"):
            graded.update(n.strip() for n in k.group(1).split(","))
    close()
    # An argument one overload differentiates stays differentiable (names are matched
    # without overloads).
    found = {name: frozenset(args - anywhere[name]) for name, args in missing.items()}
    return {name: args for name, args in found.items() if args}


@functools.cache
def not_differentiable() -> dict[str, frozenset[str]]:
    path = _table()
    return parse(path.read_text()) if path is not None else {}
