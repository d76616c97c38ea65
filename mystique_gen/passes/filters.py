"""Filters on the selected top-level ops: which part of a trace a benchmark replays.

They run on the selection, before lowering and before the tensor pass, so a tensor
that a dropped op would have produced is first seen as an input of a kept op and is
materialised with its recorded shape, dtype and strides, like any other input.

Order: ``--iteration``, ``--subgraph``, ``--mode``, ``--include``, ``--exclude``,
``--max-ops``. Each filter in use adds one line to ``Program.filters`` with the
counts of top-level ops before and after (``--max-ops`` only where it cuts).

Annotations (``ProfilerStep#N``, ``## forward ##``) are nodes on one host thread.
Ops on *other* host threads (the autograd engine's) that start inside an
annotation's span -- from its node id to the largest id among its descendants, ids
being in start order -- belong to it too, so a step keeps its backward pass.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mystique_gen import oprules
from mystique_gen.errors import OptionError, TraceError
from mystique_gen.options import BuildOptions
from mystique_gen.passes.select import Selected, Selection, is_root
from mystique_gen.sources.et import RawNode, RawTrace, raw_storage_ids
from mystique_gen.sources.kineto import KinetoTrace

STEP_RE = re.compile(r"ProfilerStep#(\d+)")
OPTIMIZER_STEP_RE = re.compile(r"Optimizer\.step#(.+)\.step")


def is_communication(name: str) -> bool:
    return name.split("::", 1)[0] in oprules.COMMUNICATION_NAMESPACES


class _Tree:
    """Parent links of a trace: ancestors of a node and the id span of an annotation."""

    def __init__(self, trace: RawTrace):
        self.nodes = trace.nodes
        self.by_id = {n.id: n for n in trace.nodes}
        self._ancestors: dict[int, tuple[int, ...]] = {}
        self._span_end: dict[int, int] | None = None

    def ancestors(self, node_id: int) -> tuple[int, ...]:
        """Ids of a node's ancestors, nearest first."""
        chain: list[int] = []
        seen: set[int] = set()
        cur = self.by_id.get(node_id)
        while cur is not None and cur.id not in self._ancestors:
            if cur.id in seen:
                raise TraceError("parent links form a cycle", node_id=cur.id, field="ctrl_deps")
            seen.add(cur.id)
            chain.append(cur.id)
            cur = self.by_id.get(cur.parent) if cur.parent != cur.id else None
        tail: tuple[int, ...] = () if cur is None else (cur.id, *self._ancestors[cur.id])
        for nid in reversed(chain):
            self._ancestors[nid] = tail
            tail = (nid, *tail)
        return self._ancestors.get(node_id, ())

    def span_end(self, node_id: int) -> int:
        """The largest node id in the subtree of ``node_id``."""
        if self._span_end is None:
            ends: dict[int, int] = {}
            for n in self.nodes:
                for a in self.ancestors(n.id):
                    if ends.get(a, -1) < n.id:
                        ends[a] = n.id
            self._span_end = ends
        return self._span_end.get(node_id, node_id)

    def within(self, anchor: RawNode, node: RawNode,
               other_thread_ok: Callable[[RawNode], bool]) -> bool:
        """Whether ``node`` is under ``anchor``, or starts in its span on another thread."""
        if anchor.id in self.ancestors(node.id):
            return True
        return (node.tid != anchor.tid and anchor.id < node.id <= self.span_end(anchor.id)
                and other_thread_ok(node))


def filter_selection(trace: RawTrace, selection: Selection, options: BuildOptions,
                     profiled_steps: frozenset[int] = frozenset(), *,
                     one_step: bool = False) -> tuple[Selection, list[str]]:
    """The selection ``options`` keep, and one line per filter applied (counts of
    top-level ops before and after). ``profiled_steps``: the ``ProfilerStep#N`` numbers
    the Kineto trace linked to this one holds, which the default step comes from.
    ``one_step``: the trace was recorded as one step (``mystique-gen capture``'s, a
    call of the step function, whatever optimizer steps it takes), not cut into
    iterations by its optimizer steps."""
    tree = _Tree(trace)
    ops = list(selection.ops)
    skipped = list(selection.not_replayed)
    lines: list[str] = []

    def apply(label: str, keep: Callable[[RawNode], bool]) -> None:
        nonlocal ops, skipped
        before = len(ops)
        ops = [s for s in ops if keep(s.node)]
        skipped = [s for s in skipped if s.node_id not in tree.by_id
                   or keep(tree.by_id[s.node_id])]
        lines.append(f"{label}: {before} -> {len(ops)} ops")

    step = _step(trace, tree, ops, options.iteration, profiled_steps)
    kept_number = None
    if step is not None:
        anchor, kept_number, label = step

        def no_step_around(node: RawNode) -> bool:
            return not any(STEP_RE.fullmatch(tree.by_id[a].name)
                           for a in tree.ancestors(node.id))

        apply(label, lambda n: tree.within(anchor, n, no_step_around))
    elif not steps(trace):
        between = _optimizer_step(tree, ops, options.iteration, one_step=one_step)
        if between is not None:
            (after, last), label = between
            apply(label, lambda n: after < n.id <= last)
    if options.subgraph is not None:
        around = _annotation(tree, ops, options.subgraph)
        apply(f"subgraph {options.subgraph!r}: {around.name!r} (node {around.id})",
              lambda n: tree.within(around, n, lambda _n: True))
    if options.mode == "compute":
        apply("mode compute (communication ops dropped)", lambda n: not is_communication(n.name))
    elif options.mode == "comm":
        apply("mode comm (only communication ops)", lambda n: is_communication(n.name))
    if options.include:
        includes = [re.compile(p) for p in options.include]
        apply(f"include {_patterns(options.include)}",
              lambda n: any(p.search(n.name) for p in includes))
    if options.exclude:
        excludes = [re.compile(p) for p in options.exclude]
        apply(f"exclude {_patterns(options.exclude)}",
              lambda n: not any(p.search(n.name) for p in excludes))
    if options.max_ops is not None and len(ops) > options.max_ops:
        # Nodes after the first dropped op are dropped too, not-replayed ones included.
        limit = ops[options.max_ops].node.id
        apply(f"max-ops {options.max_ops}", lambda n: n.id < limit)
    if selection.ops and not ops:  # a benchmark that times nothing helps no one
        raise OptionError(f"the filters leave no op of {trace.name} to replay: "
                          + "; ".join(lines))
    threads = sorted({s.node.tid for s in ops})
    return Selection(ops, skipped, threads, step=kept_number), lines


def _patterns(patterns: tuple[str, ...]) -> str:
    return ", ".join(repr(p) for p in patterns)


def kineto_steps(kineto: KinetoTrace | None) -> frozenset[int]:
    """The ``N`` of every ``ProfilerStep#N`` a Kineto trace holds (none without one)."""
    if kineto is None:
        return frozenset()
    return frozenset(int(m.group(1)) for e in kineto.cpu_ops
                     if (m := STEP_RE.fullmatch(e.name)))


def step_listing(numbers: Iterable[int]) -> str:
    """``#2, #3, ...``: the first eight step numbers, in the order given."""
    shown = list(numbers)
    return ", ".join(f"#{n}" for n in shown[:8]) + (", ..." if len(shown) > 8 else "")


def steps(trace: RawTrace) -> list[tuple[int, RawNode]]:
    """(N, node) of every ``ProfilerStep#N`` annotation, in start order.

    Every one recorded is complete: the observer writes a node when it ends, so a step
    cut off by the start or the end of recording has no annotation at all.
    """
    found = []
    for n in trace.nodes:
        m = STEP_RE.fullmatch(n.name)
        if m and not n.op_schema:
            found.append((int(m.group(1)), n))
    return found


def node_steps(trace: RawTrace) -> dict[int, int]:
    """Node id -> the N of the ``ProfilerStep#N`` annotation it is or lies under, where
    one is."""
    marked = {node.id: number for number, node in steps(trace)}
    if not marked:
        return {}
    tree = _Tree(trace)
    found: dict[int, int] = {}
    for n in trace.nodes:
        number = next((marked[a] for a in (n.id, *tree.ancestors(n.id)) if a in marked),
                      None)
        if number is not None:
            found[n.id] = number
    return found


@dataclass(frozen=True)
class OptimizerIterations:
    """Iterations of a trace that marks no ``ProfilerStep#N``, cut where optimizer
    steps end: each ends with the ``per_iteration``-th of the outermost optimizer
    steps since the previous one (a GAN's discriminator and generator: 2)."""

    ends: list[int]  # the largest node id of each iteration, in order
    per_iteration: int
    last_name: str  # the optimizer whose step ends the first iteration

    def describe(self, k: int) -> str:
        each = (f"optimizer {self.last_name}'s step" if self.per_iteration == 1 else
                f"every {self.per_iteration} optimizer steps ({self.last_name}'s last)")
        return f"iteration {k} of {len(self.ends)}, up to the end of {each} {k}"


def optimizer_iterations(tree: _Tree, ops: list[Selected]) -> OptimizerIterations | None:
    """Where the kept ops lie under several optimizer steps (``Optimizer.step#...``
    annotations, the outermost: a wrapper's step holds its inner optimizer's), the
    iterations they make: an iteration ends with an optimizer step, as
    ``mystique-gen capture`` cuts a step, and holds the fewest steps after which the
    iterations repeat, the same ops in each (the first aside, which may hold the
    optimizer's lazy initialisation, compared only where there are two), all the
    steps in whole iterations: one step of one optimizer, a GAN's discriminator's and
    generator's, or a critic's several and its generator's (one WGAN iteration of
    four critic steps is not two iterations of two). None where no such repetition
    shows (one GAN iteration, steps whose ops differ, routing that changes the ops
    every step)."""
    ordered = _outer_optimizer_steps(tree, ops)
    if len(ordered) < 2:
        return None
    by_id = sorted((sel.node.id, sel.node.name) for sel in ops)
    ids = [nid for nid, _ in by_id]
    for per in range(1, len(ordered) // 2 + 1):
        if len(ordered) % per:  # whole iterations, or a critic's steps would be one
            continue
        ends = [tree.span_end(a) for a, _ in ordered[per - 1::per]]
        bounds = [bisect_right(ids, end) for end in ends]
        held = [Counter(name for _, name in by_id[lo:hi])
                for lo, hi in zip([0, *bounds], bounds, strict=False)]
        compared = held[1:] if len(held) > 2 else held
        if all(c == compared[0] for c in compared):
            return OptimizerIterations(ends, per, ordered[per - 1][1])
    return None


def _outer_optimizer_steps(tree: _Tree, ops: list[Selected]) -> list[tuple[int, str]]:
    """The outermost ``Optimizer.step#NAME.step`` annotations above the ops: (id,
    NAME), in order."""
    found: dict[int, str] = {}
    for sel in ops:
        for a in tree.ancestors(sel.node.id):
            node = tree.by_id[a]
            m = OPTIMIZER_STEP_RE.fullmatch(node.name)
            if m and not node.op_schema and not any(
                    OPTIMIZER_STEP_RE.fullmatch(tree.by_id[b].name)
                    for b in tree.ancestors(a)):
                found[a] = m.group(1)
    return sorted(found.items())


def _optimizer_step(tree: _Tree, ops: list[Selected], iteration: str, *,
                    one_step: bool = False) -> tuple[tuple[int, int], str] | None:
    """Where a trace marks no ``ProfilerStep#N`` but its ops make iterations by their
    optimizer steps (an observer started and stopped by hand around a loop,
    :func:`optimizer_iterations`): the node ids of the iteration to keep,
    ``(after, last]``, and its description; None to keep every op. By default the
    second: the first may have begun before the observer did, or run the optimizer's
    lazy initialisation of its state; the second is whole and warm. ``one_step``: the
    trace is one step (``mystique-gen capture``'s), not cut."""
    if iteration == "all":
        return None
    found = None if one_step else optimizer_iterations(tree, ops)
    if found is None:
        if iteration == "auto":
            return None
        why = ("it was captured as one step" if one_step else
               "and no optimizer steps that repeat")
        raise OptionError(f"--iteration {iteration}: the trace has no ProfilerStep#N "
                          f"annotations ({why}; use --subgraph for other annotations)")
    wanted = 2 if iteration == "auto" else int(iteration)
    if not 1 <= wanted <= len(found.ends):
        raise OptionError(f"--iteration {wanted}: the trace marks no ProfilerStep#N, and "
                          f"its optimizer steps make {len(found.ends)} iterations: 1 to "
                          f"{len(found.ends)}")
    after = found.ends[wanted - 2] if wanted >= 2 else -1
    why = ("default: the first after a whole one; --iteration all keeps them all"
           if iteration == "auto" else "--iteration")
    return (after, found.ends[wanted - 1]), (
        f"{found.describe(wanted)} (the trace marks no ProfilerStep#N; {why})")


def unmarked_steps(trace: RawTrace, selection: Selection) -> str | None:
    """A note where the kept ops hold several steps of every optimizer and the trace
    marks no ``ProfilerStep#N`` (an observer started and stopped by hand around a
    loop, kept whole with --iteration all, or whose steps do not repeat): they all
    replay in one iteration, which is then that many steps long.

    Optimizers are told apart by the tensors their steps update in place (their
    parameters and state), not by class alone: one iteration of a GAN steps its
    discriminator's Adam and its generator's once each (a WGAN's critic several
    times), and is one step."""
    if steps(trace):
        return None
    tree = _Tree(trace)
    outer = _outer_optimizer_steps(tree, selection.ops)
    # Each optimizer steps at least once an iteration (a critic several times).
    iterations = min(_steps_per_optimizer(tree, selection.ops, outer), default=0)
    if iterations < 2:
        return None
    found = optimizer_iterations(tree, selection.ops)
    cut = (f"--iteration K keeps the K-th of the {len(found.ends)} iterations they make"
           if found is not None else
           "their ops differ from step to step, so no iteration is cut from them")
    return (f"the trace holds {iterations} steps of each optimizer and marks no "
            f"ProfilerStep#N: they replay as one iteration ({cut})")


def _steps_per_optimizer(tree: _Tree, ops: list[Selected],
                         outer: list[tuple[int, str]]) -> list[int]:
    """How many of the optimizer steps ``outer`` each optimizer took, the steps of one
    optimizer being those of one class that update mostly the same storages."""
    updated: dict[int, set[int]] = {a: set() for a, _ in outer}
    for sel in ops:
        step = next((a for a in tree.ancestors(sel.node.id) if a in updated), None)
        op = sel.node.name.rsplit("::", 1)[-1].split(".", 1)[0]
        if step is not None and sel.node.inputs and op.endswith("_") \
                and not op.endswith("__"):  # in place: its first argument's storages
            updated[step].update(raw_storage_ids(sel.node.inputs[0]))
    optimizers: list[tuple[str, set[int], list[int]]] = []
    for a, name in outer:
        same = next((o for o in optimizers
                     if o[0] == name and _mostly_shared(o[1], updated[a])), None)
        if same is None:
            optimizers.append((name, set(updated[a]), [a]))
        else:
            same[1].update(updated[a])
            same[2].append(a)
    return [len(steps) for _, _, steps in optimizers]


def _mostly_shared(a: set[int], b: set[int]) -> bool:
    """Whether two optimizer steps update mostly the same storages: those of one
    optimizer do, two optimizers' share at most a few temporaries whose freed storage
    ids the recorder handed out again; steps whose updates were not recorded are taken
    for one optimizer's."""
    if not a or not b:
        return True
    return 2 * len(a & b) > min(len(a), len(b))


def _step(trace: RawTrace, tree: _Tree, ops: list[Selected], iteration: str,
          profiled_steps: frozenset[int] = frozenset()) -> tuple[RawNode, int, str] | None:
    """The step annotation to keep, its ``N`` and its description, or None to keep
    every step.

    By default, the first step that the linked Kineto trace holds as well: an observer
    handed to a profiler with a repeating schedule records every active step of every
    cycle into one ET, while each cycle's Kineto trace holds that cycle's steps only."""
    if iteration == "all":
        return None
    found = steps(trace)
    listing = step_listing(number for number, _ in found)
    if iteration == "auto":
        # Steps around some op (an empty last step, as the profiler's stop leaves, is
        # not one); the default applies when there are several.
        around = {a for s in ops for a in tree.ancestors(s.node.id)}
        busy = [(number, node) for number, node in found if node.id in around]
        if len(busy) < 2:
            return None
        profiled = [(number, node) for number, node in busy if number in profiled_steps]
        number, node = (profiled or busy)[0]
        held = f" that the Kineto trace holds too ({step_listing(n for n, _ in profiled)})" \
            if profiled and len(profiled) < len(busy) else ""
        return node, number, (f"iteration ProfilerStep#{number} (default: the first complete of "
                      f"{len(busy)} steps {listing}{held}; --iteration all keeps every step)")
    wanted = int(iteration)
    for number, node in found:
        if number == wanted:
            return node, number, \
                f"iteration ProfilerStep#{number} (of {len(found)} steps {listing})"
    if not found:
        return None  # iterations by optimizer steps, if any (_optimizer_step)
    raise OptionError(f"--iteration {wanted}: {trace.name} has no ProfilerStep#{wanted}; "
                      f"it has {listing}")


def steps_apart(kept: dict[int, int | None]) -> str | None:
    """Where the ranks of one job keep different steps (rank -> the ``N`` of the
    ``ProfilerStep#N`` each keeps, None where it keeps no one step): why that
    misleads, else None. Each rank's default is the first step its own Kineto trace
    holds, so a repeating schedule's files of two cycles (rank 0's first, rank 1's
    second) had each rank replay another iteration, and the header named rank 0's."""
    numbers = {n for n in kept.values() if n is not None}
    if len(numbers) < 2:
        return None
    listing = ", ".join(f"rank {r} ProfilerStep#{n}" for r, n in sorted(kept.items())
                        if n is not None)
    return (f"the ranks replay different steps ({listing}): their ops, collectives and "
            "timing come from different iterations (each rank keeps the first step its "
            "own Kineto trace holds: give every rank its Kineto trace of the same cycle "
            "of a repeating schedule, or --iteration N)")


def _annotation(tree: _Tree, ops: list[Selected], text: str) -> RawNode:
    """The first annotation (by start) around a kept op whose name contains ``text``."""
    around: set[int] = set()
    for s in ops:
        around.update(tree.ancestors(s.node.id))
    candidates = sorted(
        (tree.by_id[a] for a in around),
        key=lambda n: n.id,
    )
    names: list[str] = []
    for node in candidates:
        if node.op_schema or is_root(node):
            continue
        if text in node.name:
            return node
        if node.name not in names:
            names.append(node.name)
    shown = ", ".join(repr(n[:40]) for n in names[:8]) + (", ..." if len(names) > 8 else "")
    raise OptionError(f"--subgraph {text!r}: no annotation around the kept ops contains it; "
                      f"annotations: {shown or 'none'}")
