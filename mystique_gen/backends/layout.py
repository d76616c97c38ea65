"""Black-stable layout of generated statements, without running black on them.

Running black over a file of thousands of statements takes tens of seconds, so the
emitter builds each statement as a small tree (:class:`Atom`, :class:`Group`) and lays
it out the way black's stable style does for this narrow grammar of calls, lists
and keyword arguments:

* a statement that fits in 88 columns stays on one line;
* otherwise the last bracket pair is split: the contents go on their own, indented
  line if they fit there, else one item per line with a trailing comma;
* the contents of a list literal with several items are always exploded one per
  line once split (black's rule for brackets of an ``atom``);
* a single item that still does not fit is split the same way, recursively.

Tests check the result with ``black --check`` on every generated file.
"""

from __future__ import annotations

from dataclasses import dataclass

LINE_LENGTH = 88
INDENT = "    "


@dataclass(frozen=True)
class Atom:
    text: str


@dataclass(frozen=True)
class Group:
    """``head`` + ``(`` or ``[`` + items + closer. ``literal``: a list display, not a call."""

    head: str  # e.g. "aten_mm(" or "["
    items: tuple[Node, ...]
    closer: str  # ")" or "]"
    literal: bool = False


@dataclass(frozen=True)
class Keyword:
    """``name=value`` (a keyword argument), or ``name: value`` with ``separator=": "``
    (a dict display's entry, ``name`` the key's literal)."""

    name: str
    value: Node
    separator: str = "="


Node = Atom | Group | Keyword


def flat(node: Node) -> str:
    if isinstance(node, Atom):
        return node.text
    if isinstance(node, Keyword):
        return f"{node.name}{node.separator}{flat(node.value)}"
    return node.head + ", ".join(flat(i) for i in node.items) + node.closer


def _split_keyword(node: Node) -> tuple[str, Node]:
    if isinstance(node, Keyword):
        return node.name + node.separator, node.value
    return "", node


def lay_out(prefix: str, node: Node, depth: int, suffix: str = "") -> list[str]:
    """Lines for ``prefix + node + suffix`` at indentation ``depth``.

    An assignment whose first line, split at its call, is still too long is laid
    out as black lays it out: the right-hand side wrapped in parentheses where every
    line then fits (black's "second opinion" with optional parentheses; a value in
    empty brackets, which cannot split, is wrapped, and so is a return's), else, for
    several targets, the targets one per line in parentheses, then ``) = `` and the
    right-hand side laid out as any other (``(\n    a,\n    b,\n) = call(...)``)."""
    lines = _lay_out(prefix, node, depth, suffix)
    indent = INDENT * depth
    if (not suffix and (prefix.endswith(" = ") or prefix == "return ")
            and ("," not in prefix or len(indent + prefix + "(") <= LINE_LENGTH)):
        lines = _wrapped_if_unsplittable(lines, prefix, node, depth)
    targets = prefix[: -len(" = ")] if prefix.endswith(" = ") else ""
    if (not targets or suffix or len(lines[0]) <= LINE_LENGTH
            or not all(t.strip().isidentifier() for t in targets.split(","))):
        return lines
    names = [t.strip() for t in targets.split(",")]
    inner = INDENT * (depth + 1)
    exploded = [indent + "(", *(inner + name + "," for name in names),
                *_wrapped_if_unsplittable(_lay_out(") = ", node, depth), ") = ", node,
                                          depth)]
    if len(lines) == 1 or not isinstance(node, Group) \
            or lines[0] != indent + prefix + node.head:  # the right-hand side stays whole
        return exploded if len(names) > 1 else lines
    wrapped = [indent + prefix + "(", *_lay_out("", node, depth + 1), indent + ")"]
    if all(len(line) <= LINE_LENGTH for line in wrapped):
        return wrapped
    return exploded if len(names) > 1 else lines


def _wrapped_if_unsplittable(lines: list[str], prefix: str, node: Node,
                             depth: int) -> list[str]:
    """An assignment's or a return's value in empty brackets (`f()`, `[]`), too long
    on its line, wrapped in parentheses: black cannot split inside them, so it wraps
    the value, even where a line then stays too long (several targets too long for
    `a, b = (` go one per line first: `lay_out`)."""
    if len(lines) == 1 and len(lines[0]) > LINE_LENGTH and isinstance(node, Group) \
            and not node.items:
        indent = INDENT * depth
        return [indent + prefix + "(", INDENT * (depth + 1) + flat(node), indent + ")"]
    return lines


def _lay_out(prefix: str, node: Node, depth: int, suffix: str = "") -> list[str]:
    indent = INDENT * depth
    line = indent + prefix + flat(node) + suffix
    if len(line) <= LINE_LENGTH or not isinstance(node, Group) or not node.items:
        return [line]
    inner = INDENT * (depth + 1)
    opener = indent + prefix + node.head
    closer = indent + node.closer + suffix
    body = ", ".join(flat(i) for i in node.items)
    explode = node.literal and len(node.items) > 1
    if not explode and len(inner + body) <= LINE_LENGTH:
        return [opener, inner + body, closer]
    if len(node.items) == 1:
        item_prefix, item = _split_keyword(node.items[0])
        return [opener, *_lay_out(item_prefix, item, depth + 1), closer]
    lines = [opener]
    for item in node.items:
        item_prefix, value = _split_keyword(item)
        lines.extend(_lay_out(item_prefix, value, depth + 1, ","))
    lines.append(closer)
    return lines


def names_statement(keyword: str, names: list[str], depth: int) -> list[str]:
    """``del a, b`` / ``nonlocal a, b`` statements, as many as needed so that each fits
    the line length (black would wrap a long one in parentheses instead)."""
    indent = INDENT * depth
    lines: list[str] = []
    chunk: list[str] = []
    for name in names:
        if chunk and len(f"{indent}{keyword} {', '.join([*chunk, name])}") > LINE_LENGTH:
            lines.append(f"{indent}{keyword} {', '.join(chunk)}")
            chunk = []
        chunk.append(name)
    if chunk:
        lines.append(f"{indent}{keyword} {', '.join(chunk)}")
    return lines

