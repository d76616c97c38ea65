"""One namespace for every identifier in a generated file.

Names derive from stable keys in order of first appearance (never from trace ids or
dict order), so the same trace always gives the same names and a trace whose ids
are all shifted gives the same file body.
"""

from __future__ import annotations

import builtins
import keyword
import re
from collections.abc import Callable, Hashable

# Names the harness template defines or uses; generated names must not shadow them.
RESERVED = frozenset(
    {"torch", "argparse", "json", "os", "statistics", "sys", "time", "inputs", "device",
     "host", "gens", "main", "replay", "make_inputs", "_"}
)


class Namespace:
    def __init__(self) -> None:
        self._by_key: dict[Hashable, str] = {}
        self._used: set[str] = set(RESERVED)
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

    def fork(self, keep: Callable[[Hashable], bool]) -> Namespace:
        """A namespace for another function body of the same file: the names of the
        keys ``keep`` accepts (module-level ones) stay taken, local ones start afresh."""
        ns = Namespace()
        for key, name in self._by_key.items():
            if keep(key):
                ns._claim(key, name)
        return ns

    def get(self, key: Hashable) -> str:
        return self._by_key[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._by_key

    def _claim(self, key: Hashable, name: str) -> str:
        self._by_key[key] = name
        self._used.add(name)
        return name
