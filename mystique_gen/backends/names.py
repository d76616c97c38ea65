"""One namespace for every identifier in a generated file.

Names say what a value is, never where it first appears: an input is named by its
role for its first consumer (``linear_w``, ``embedding_w``, ``exp_avgs``), a temporary
by the op that made it (``mm``, ``relu_1``), and a temporary's name is free again after
its last use (as torch.fx reuses names), so a change in one place of a model renames
only nearby lines. Names never derive from trace ids or dict order: the same trace
gives the same file, and a trace whose ids are all shifted gives the same body.
"""

from __future__ import annotations

import builtins
import keyword
import re
from collections.abc import Callable, Hashable
from functools import lru_cache

# Names the harness template defines or uses; generated names must not shadow them.
RESERVED = frozenset(
    {"torch", "argparse", "json", "os", "statistics", "sys", "time", "inputs", "device",
     "host", "gens", "main", "replay", "make_inputs", "_"}
)


# Argument names that say little on their own: the input is named op_arg (mm_x).
GENERIC_ARGS = frozenset({"self", "input", "other", "x", "tensor", "tensor1", "tensor2",
                          "mat1", "mat2", "src", "vec", "vec1", "vec2", "batch1", "batch2",
                          "tensors", "a", "b", "end", "value", "values", "out", "result"})
SHORT_ARGS = {"weight": "w", "bias": "b", "self": "x", "input": "x"}


@lru_cache(maxsize=4096)  # asked for every op and input: few distinct hints
def identifier(hint: str) -> str:
    """``hint`` as an identifier that shadows no keyword or builtin."""
    base = re.sub(r"\W", "_", hint, flags=re.ASCII).strip("_") or "v"
    if base[0].isdigit():
        base = "v" + base
    if keyword.iskeyword(base) or hasattr(builtins, base):
        base += "_"
    return base


def op_hint(op_name: str) -> str:
    """A temporary's name from the op that made it: ``aten::_foreach_add_`` -> foreach_add."""
    return identifier(op_name.split("::", 1)[-1].split(".", 1)[0])


def input_hint(op_name: str, arg: str) -> str:
    """An input's name from its first consumer and the argument it fills: linear_w,
    embedding_w, mm_x; a descriptive argument name stands alone (exp_avgs, indices)."""
    if arg in SHORT_ARGS or arg in GENERIC_ARGS:
        return identifier(f"{op_hint(op_name)}_{SHORT_ARGS.get(arg, arg)}")
    return identifier(arg)


class Namespace:
    def __init__(self, reserved: frozenset[str] = frozenset()) -> None:
        self._by_key: dict[Hashable, str] = {}
        self._used: set[str] = set(RESERVED) | set(reserved)
        self._reserved = frozenset(reserved)
        self._counters: dict[str, int] = {}

    def numbered(self, key: Hashable, prefix: str) -> str:
        """``prefix`` + the next number for that prefix: t0, t1, x0, ..."""
        if key in self._by_key:
            return self._by_key[key]
        while True:
            n = self._counters.get(prefix, 0)
            self._counters[prefix] = n + 1
            name = f"{prefix}{n}"
            if name not in self._used:
                break
        return self._claim(key, name)

    def readable(self, key: Hashable, hint: str) -> str:
        """A readable identifier from ``hint`` (sanitised), made unique with a suffix."""
        if key in self._by_key:
            return self._by_key[key]
        base = re.sub(r"\W", "_", hint, flags=re.ASCII) or "v"
        if base[0].isdigit():
            base = "_" + base
        if keyword.iskeyword(base) or hasattr(builtins, base):
            base += "_"
        name, n = base, 1
        while name in self._used:
            n += 1
            name = f"{base}_{n}"
        return self._claim(key, name)

    def claim(self, key: Hashable, hint: str) -> str:
        """Exactly ``hint`` (as an identifier) where it is free, else hint_1, hint_2, ...:
        the lowest free one, so released names are taken again."""
        if key in self._by_key:
            return self._by_key[key]
        base = identifier(hint)
        name, n = base, 0
        while name in self._used:
            n += 1
            name = f"{base}_{n}"
        return self._claim(key, name)

    def release(self, key: Hashable) -> None:
        """The value of ``key`` is dead: its name may be claimed again."""
        name = self._by_key.pop(key)
        self._used.discard(name)

    def fork(self, keep: Callable[[Hashable], bool]) -> Namespace:
        """A namespace for another function body of the same file: the names of the
        keys ``keep`` accepts (module-level ones) stay taken, local ones start afresh."""
        ns = Namespace(self._reserved)
        for key, name in self._by_key.items():
            if keep(key):
                ns._claim(key, name)
        return ns

    def taken(self, name: str) -> bool:
        return name in self._used

    def get(self, key: Hashable) -> str:
        return self._by_key[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._by_key

    def _claim(self, key: Hashable, name: str) -> str:
        self._by_key[key] = name
        self._used.add(name)
        return name
