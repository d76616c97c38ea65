"""``mystique-gen diff A B``: what changed between two workloads, as a reviewable diff.

Each side is reduced to a list of :class:`OpRecord` (qualified overload, scope, and a
signature key built from argument shapes, dtypes and scalar values; trace node, tensor
and storage ids never enter it, so the same workload recorded twice compares equal).

* Traces go through the driver with the selection flags of ``generate``; ops keep their
  recorded annotation scope, shapes and dtypes, and the Program's peak memory estimate.
* Generated benchmarks are read with ``ast``: the operator handle table
  (``aten_mm = _op(lambda: ..., "aten::mm.default")``) names each call in ``replay()``
  (``replay_rankN()``), and the scope comments name its innermost annotation. Shapes of
  intermediate values are not written in the file, so benchmarks compare by overload
  sequence only (no "changed" ops, FLOPs or bytes).

Alignment is two-level, first over runs of ops sharing a scope, then over ops within
paired runs; at each level exact keys anchor first (difflib), and what is left pairs by a
coarse key (scope name; op name) so that "same op, other arguments" reads as changed.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher
from math import prod
from pathlib import Path
from typing import Any

from mystique_gen import oprules
from mystique_gen.driver import compile_paths
from mystique_gen.errors import MystiqueError, OptionError
from mystique_gen.ir import (
    ListValue,
    Literal,
    Op,
    TensorMeta,
    TensorValue,
    TorchConstant,
    Value,
    contiguous_strides,
    iter_tensors,
)
from mystique_gen.ir.dtypes import ITEM_SIZES
from mystique_gen.options import BuildOptions

BENCHMARK_SUFFIX = ".py"
TOP_LEVEL = "(top level)"
# Step annotations carry the step number; the same step of another run is the same scope.
_STEP_NUMBER = re.compile(r"^(ProfilerStep)#\d+$")
_REPLAY_FUNCTION = re.compile(r"^replay(_rank(\d+))?$")
_SHORT_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                 "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
                 "bool": "b8"}


# -- one side: a list of op records ---------------------------------------------------------
@dataclass(frozen=True)
class OpRecord:
    """One replayed op, as the diff sees it."""

    name: str  # qualified overload: "aten::mm.default"
    scope: tuple[str, ...]  # enclosing annotations, outermost first
    args: tuple[tuple[str, str], ...] = ()  # (argument name, rendered value); () in benchmarks
    flops: int | None = None  # estimate; None where shapes are unknown
    nbytes: int | None = None  # tensor bytes the op reads and writes; None where unknown
    time_us: float | None = None  # linked Kineto time (device time where kernels ran)
    device_time: bool = False

    @property
    def category(self) -> str:
        return oprules.op_category(self.name)

    @property
    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (self.name, self.args)

    def text(self) -> str:
        if not self.args:
            return self.name
        return f"{self.name}({', '.join(_arg_text(n, v) for n, v in self.args)})"


def _arg_text(name: str, value: str) -> str:
    return f"{name.removeprefix('kw:')}={value}" if name.startswith("kw:") else value


@dataclass
class Workload:
    """One side of the diff."""

    name: str  # file name, for the report
    kind: str  # "trace" or "benchmark"
    ops: list[OpRecord]
    peak_bytes: int | None
    timed: bool = False  # a Kineto trace was linked


def load_workload(path: str | Path, options: BuildOptions,
                  kineto: str | Path | None = None) -> Workload:
    """A trace (through the driver) or a generated benchmark (through ``ast``)."""
    path = Path(path)
    if path.name.endswith(BENCHMARK_SUFFIX):
        if kineto is not None:
            raise OptionError(f"{path.name}: --kineto-a/--kineto-b go with traces, not "
                              "generated benchmarks")
        return benchmark_workload(path)
    return trace_workload(path, options, kineto)


def trace_workload(path: Path, options: BuildOptions,
                   kineto: str | Path | None = None) -> Workload:
    # The diff writes no code: no need to probe which public function calls each op.
    compiled = compile_paths([path], replace(options, public_calls=False), kineto=kineto)
    several = len(compiled.programs) > 1
    ops: list[OpRecord] = []
    for rank, program in zip(compiled.ranks, compiled.programs, strict=True):
        prefix = (f"rank {rank}",) if several else ()
        ops += [op_record(op, prefix) for op in program.ops]
    peak = max(p.peak_bytes for p in compiled.programs)
    return Workload(path.name, "trace", ops, peak, kineto is not None)


def op_record(op: Op, prefix: tuple[str, ...] = ()) -> OpRecord:
    timing = op.timing
    device_time = timing is not None and bool(timing.kernels)
    time_us = None if timing is None else (timing.gpu_us if device_time else timing.cpu_us)
    return OpRecord(
        name=op.signature.full_name,
        scope=prefix + normalize_scope(op.scope),
        args=tuple((_arg_label(a.spec.name, a.spec.kwarg_only), render_value(a.value))
                   for a in op.args),
        flops=estimate_flops(op),
        nbytes=touched_bytes(op),
        time_us=time_us,
        device_time=device_time,
    )


def normalize_scope(scope: Sequence[str]) -> tuple[str, ...]:
    return tuple(_STEP_NUMBER.sub(r"\1#N", s) for s in scope)


def _arg_label(name: str, kwarg_only: bool) -> str:
    # Keyword-only arguments print as name=value, like the benchmark's calls.
    return f"kw:{name}" if kwarg_only else name


# -- rendering argument values: what the signature key is made of ---------------------------
def render_value(value: Value) -> str:
    """Shapes, dtypes, non-contiguous strides and scalars; never trace ids."""
    if isinstance(value, TensorValue):
        return render_tensor(value.meta)
    if isinstance(value, ListValue):
        return "[" + ", ".join(render_value(v) for v in value.items) + "]"
    if isinstance(value, Literal):
        return repr(value.value)
    if isinstance(value, TorchConstant):
        return f"torch.{value.name}"
    return getattr(value, "kind", repr(value))  # DeviceValue


def render_tensor(meta: TensorMeta) -> str:
    dims = ",".join(map(str, meta.shape))
    text = f"{_SHORT_DTYPES.get(meta.dtype, meta.dtype)}[{dims}]"
    if meta.numel > 1 and meta.strides != contiguous_strides(meta.shape):
        # A transposed operand is different work (another kernel, other memory traffic).
        text += "{" + ",".join(map(str, meta.strides)) + "}"
    if meta.device != "cpu":
        text = f"{meta.device}:{text}"
    return text


# -- estimates -----------------------------------------------------------------------------
def _tensor_args(op: Op) -> list[TensorMeta | None]:
    """The first tensor of each argument, by position (None: not a tensor)."""
    out: list[TensorMeta | None] = []
    for arg in op.args:
        first = next(iter_tensors(arg.value), None)
        out.append(first.meta if first is not None else None)
    return out


def _gemm_flops(a: TensorMeta | None, b: TensorMeta | None) -> int | None:
    """2*M*K*N per batch for a[..., M, K] @ b[..., K, N] (1-D operands as in matmul)."""
    if a is None or b is None or not a.shape or not b.shape:
        return None
    k = a.shape[-1]
    n = b.shape[-1] if len(b.shape) > 1 else 1
    rows = prod(a.shape[:-1])  # batch dims of a times M
    batch_b = prod(b.shape[:-2]) if len(b.shape) > 2 else 1
    if len(a.shape) <= 2 and batch_b > 1:  # broadcast a over b's batch
        rows *= batch_b
    return 2 * rows * k * n


# Operand positions (first, second) of the GEMM-like ops.
_GEMM_OPERANDS = {"mm": (0, 1), "bmm": (0, 1), "matmul": (0, 1), "addmm": (1, 2),
                  "baddbmm": (1, 2), "addbmm": (1, 2), "_addmm_activation": (1, 2),
                  "addmv": (1, 2), "mv": (0, 1), "dot": (0, 1)}
_CONV = re.compile(r"^(_?convolution|conv\d?d|conv_transpose\d?d|mkldnn_convolution|"
                   r"cudnn_convolution|_slow_conv2d_forward|thnn_conv2d)$")


def estimate_flops(op: Op) -> int:
    """Floating point operations, estimated from shapes: GEMMs and convolutions exactly
    (2 per multiply-add), elementwise, reduction and optimizer ops one per element, memory
    and view ops none."""
    short = op.signature.name
    tensors = _tensor_args(op)
    if short in _GEMM_OPERANDS:
        i, j = _GEMM_OPERANDS[short]
        if j < len(tensors):
            return _gemm_flops(tensors[i], tensors[j]) or 0
    if short == "linear" and len(tensors) > 1 and tensors[0] and tensors[1]:
        out_features = tensors[1].shape[0] if tensors[1].shape else 1
        return 2 * tensors[0].numel * out_features
    if _CONV.match(short) or short == "convolution_backward":
        return _conv_flops(op, tensors)
    category = oprules.op_category(op.name)
    if category in ("elementwise", "optimizer"):
        produced = sum(t.meta.numel for v in op.outputs for t in iter_tensors(v))
        return produced or _first_numel(op)
    if category == "reduction":
        return _first_numel(op)
    return 0


def _conv_flops(op: Op, tensors: list[TensorMeta | None]) -> int:
    """2 * output elements * (input channels per group * kernel size); the backward
    computes two such products (input and weight gradients)."""
    weight = tensors[1] if len(tensors) > 1 else None
    if weight is None or len(weight.shape) < 2:
        return 0
    per_output = prod(weight.shape[1:])
    if op.signature.name == "convolution_backward":
        grad_output = tensors[0]
        weight = tensors[2] if len(tensors) > 2 else None
        if grad_output is None or weight is None:
            return 0
        return 2 * 2 * grad_output.numel * prod(weight.shape[1:])
    out = next((t for v in op.outputs for t in iter_tensors(v)), None)
    return 2 * out.meta.numel * per_output if out is not None else 0


def _first_numel(op: Op) -> int:
    for arg in op.args:
        found = list(iter_tensors(arg.value))
        if found:
            return sum(t.meta.numel for t in found)
    return 0


def touched_bytes(op: Op) -> int:
    """Bytes of the tensors an op reads and writes: arguments and outputs, each distinct
    view once (an in-place op's output is its input)."""
    seen: set[tuple[Any, ...]] = set()
    total = 0
    values = [a.value for a in op.args] + list(op.outputs)
    for value in values:
        for t in iter_tensors(value):
            m = t.meta
            ident = (t.storage_id, m.offset, m.shape, m.strides, m.dtype)
            if ident in seen:
                continue
            seen.add(ident)
            total += m.numel * ITEM_SIZES.get(m.dtype, 4)
    return total


# -- generated benchmarks ---------------------------------------------------------------------
def benchmark_workload(path: Path) -> Workload:
    """The op sequence of a generated benchmark: handle table, replay calls, scope
    comments. Only names and overloads: the file does not write intermediate shapes."""
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MystiqueError(f"cannot read {path.name}: {exc.strerror or exc}") from None
    try:
        tree = ast.parse(source, path.name)
    except SyntaxError as exc:
        raise MystiqueError(f"{path.name}: not a Python file (line {exc.lineno}: "
                            f"{exc.msg})") from None
    handles = _handle_table(tree)
    replays = _replay_functions(tree)
    if not handles or not replays:
        raise MystiqueError(f"{path.name}: not a benchmark generated by mystique-gen (no "
                            "operator handles or no replay function)")
    comments = _comments(source)
    several = len(replays) > 1
    ops: list[OpRecord] = []
    for rank, fn in replays:
        prefix = (f"rank {rank}",) if several else ()
        ops += _replay_ops(fn, handles, comments, prefix)
    return Workload(path.name, "benchmark", ops, _int_constant(tree, "REQUIRED_BYTES"))


def _handle_table(tree: ast.Module) -> dict[str, str]:
    """Handle name -> qualified overload, from the module-level lines
    ``aten_mm = _op(lambda: torch.mm, "aten::mm.default")``."""
    table: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        if (isinstance(call.func, ast.Name) and call.func.id == "_op" and len(call.args) == 2
                and isinstance(call.args[1], ast.Constant)
                and isinstance(call.args[1].value, str)):
            table[node.targets[0].id] = call.args[1].value
    return table


def _replay_functions(tree: ast.Module) -> list[tuple[int, ast.FunctionDef]]:
    """(rank, function) of ``replay`` or each ``replay_rankN``; the last definition of a
    name wins, as in Python."""
    found: dict[str, tuple[int, ast.FunctionDef]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            m = _REPLAY_FUNCTION.match(node.name)
            if m:
                found[node.name] = (int(m.group(2) or 0), node)
    ranked = [v for k, v in found.items() if k != "replay"]
    # A distributed file's plain replay() dispatches to the ranks' functions.
    return sorted(ranked, key=lambda v: v[0]) if ranked else list(found.values())


def _comments(source: str) -> dict[int, str]:
    """Line -> text of every comment (ast drops them; the scope comments live there)."""
    out: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                out[tok.start[0]] = tok.string[1:].strip()
    except (tokenize.TokenError, SyntaxError):
        pass  # ast parsed the file; missing scope labels only cost readability
    return out


def _replay_ops(fn: ast.FunctionDef, handles: dict[str, str], comments: dict[int, str],
                prefix: tuple[str, ...]) -> list[OpRecord]:
    """Every operator call in ``fn`` in source order (nested thread bodies included),
    each under the last scope comment above it."""
    calls: list[tuple[int, int, str]] = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        target = node.func.id
        if target == "_guarded" and len(node.args) > 1 and isinstance(node.args[1], ast.Name):
            target = node.args[1].id  # _guarded(site, aten_xxx, *args)
        if target in handles:
            calls.append((node.lineno, node.col_offset, handles[target]))
    calls.sort()
    end = fn.end_lineno or fn.lineno
    scope_lines = sorted(line for line in comments if fn.lineno < line <= end)
    ops: list[OpRecord] = []
    k = 0
    scope: tuple[str, ...] = ()
    for line, _col, name in calls:
        while k < len(scope_lines) and scope_lines[k] < line:
            scope = (comments[scope_lines[k]],)
            k += 1
        ops.append(OpRecord(name, prefix + normalize_scope(scope)))
    return ops


def _int_constant(tree: ast.Module, name: str) -> int | None:
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int)):
            return node.value.value
    return None


# -- alignment ----------------------------------------------------------------------------
Opcode = tuple[str, int, int, int, int]  # ("equal"|"pair"|"delete"|"insert", i1, i2, j1, j2)


def align(exact_a: Sequence[Hashable], exact_b: Sequence[Hashable],
          coarse_a: Sequence[Hashable], coarse_b: Sequence[Hashable]) -> list[Opcode]:
    """Exact keys anchor first ("equal"); within each gap between anchors, equal coarse
    keys "pair" one for one and the rest is "delete" (only in a) or "insert" (only in b).
    Anchoring on exact keys first keeps an inserted op from shifting its neighbours'
    pairing (a name-only match would pair the new Linear with the old one after it)."""
    out: list[Opcode] = []
    ea, eb = _ids(exact_a, exact_b)
    top = SequenceMatcher(None, ea, eb, autojunk=False)
    ca, cb = _ids(coarse_a, coarse_b)
    for tag, i1, i2, j1, j2 in top.get_opcodes():
        if tag == "equal":
            out.append(("equal", i1, i2, j1, j2))
            continue
        inner = SequenceMatcher(None, ca[i1:i2], cb[j1:j2], autojunk=False)
        for t, a1, a2, b1, b2 in inner.get_opcodes():
            if t == "equal":
                out.append(("pair", i1 + a1, i1 + a2, j1 + b1, j1 + b2))
                continue
            if a2 > a1:
                out.append(("delete", i1 + a1, i1 + a2, j1 + b1, j1 + b1))
            if b2 > b1:
                out.append(("insert", i1 + a2, i1 + a2, j1 + b1, j1 + b2))
    return out


def _ids(a: Sequence[Hashable], b: Sequence[Hashable]) -> tuple[list[int], list[int]]:
    """Keys as small ints: SequenceMatcher hashes them many times."""
    table: dict[Hashable, int] = {}
    return ([table.setdefault(k, len(table)) for k in a],
            [table.setdefault(k, len(table)) for k in b])


@dataclass(frozen=True)
class Run:
    """Consecutive ops under one scope."""

    scope: tuple[str, ...]
    start: int
    stop: int


def scope_runs(ops: Sequence[OpRecord]) -> list[Run]:
    runs: list[Run] = []
    for i, op in enumerate(ops):
        if runs and runs[-1].scope == op.scope:
            runs[-1] = Run(op.scope, runs[-1].start, i + 1)
        else:
            runs.append(Run(op.scope, i, i + 1))
    return runs


@dataclass(frozen=True)
class Change:
    kind: str  # "added", "removed" or "changed"
    scope: tuple[str, ...]
    old: OpRecord | None
    new: OpRecord | None
    index_old: int | None
    index_new: int | None

    def changed_args(self) -> list[tuple[str, str, str]]:
        """(argument, old, new) of the arguments that differ."""
        assert self.old is not None and self.new is not None
        old, new = dict(self.old.args), dict(self.new.args)
        names = list(old) + [n for n in new if n not in old]
        return [(n, old.get(n, "-"), new.get(n, "-")) for n in names
                if old.get(n) != new.get(n)]


def diff_ops(a: Sequence[OpRecord], b: Sequence[OpRecord]) -> list[Change]:
    """Scopes first, then ops within paired scopes (module docstring)."""
    runs_a, runs_b = scope_runs(a), scope_runs(b)
    exact_a = [(r.scope, tuple(op.key for op in a[r.start:r.stop])) for r in runs_a]
    exact_b = [(r.scope, tuple(op.key for op in b[r.start:r.stop])) for r in runs_b]
    changes: list[Change] = []
    for tag, i1, i2, j1, j2 in align(exact_a, exact_b, [r.scope for r in runs_a],
                                     [r.scope for r in runs_b]):
        if tag == "equal":
            continue
        if tag == "delete":
            changes += _removed(a, runs_a[i1:i2])
        elif tag == "insert":
            changes += _added(b, runs_b[j1:j2])
        else:
            for ra, rb in zip(runs_a[i1:i2], runs_b[j1:j2], strict=True):
                changes += _diff_run(a, b, ra, rb)
    return changes


def _removed(a: Sequence[OpRecord], runs: Sequence[Run]) -> list[Change]:
    return [Change("removed", a[i].scope, a[i], None, i, None)
            for r in runs for i in range(r.start, r.stop)]


def _added(b: Sequence[OpRecord], runs: Sequence[Run]) -> list[Change]:
    return [Change("added", b[j].scope, None, b[j], None, j)
            for r in runs for j in range(r.start, r.stop)]


def _diff_run(a: Sequence[OpRecord], b: Sequence[OpRecord], ra: Run, rb: Run) -> list[Change]:
    ops_a, ops_b = a[ra.start:ra.stop], b[rb.start:rb.stop]
    out: list[Change] = []
    for tag, i1, i2, j1, j2 in align([o.key for o in ops_a], [o.key for o in ops_b],
                                     [o.name for o in ops_a], [o.name for o in ops_b]):
        if tag == "delete":
            out += [Change("removed", ra.scope, ops_a[i], None, ra.start + i, None)
                    for i in range(i1, i2)]
        elif tag == "insert":
            out += [Change("added", rb.scope, None, ops_b[j], None, rb.start + j)
                    for j in range(j1, j2)]
        elif tag == "pair":
            out += [Change("changed", rb.scope, ops_a[i], ops_b[j], ra.start + i, rb.start + j)
                    for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
    return out


# -- the report ---------------------------------------------------------------------------
@dataclass
class Totals:
    ops: int
    by_category: dict[str, int]
    flops: int | None
    nbytes: int | None
    peak_bytes: int | None
    time_ms: dict[str, float] | None = None  # by category, with a Kineto trace
    device_time: bool = False


def totals(w: Workload) -> Totals:
    cats = Counter(op.category for op in w.ops)
    shaped = w.kind == "trace"
    time_ms = None
    device_time = any(op.device_time for op in w.ops)
    if w.timed:
        time_ms = dict.fromkeys(oprules.CATEGORY_ORDER, 0.0)
        for op in w.ops:
            # Device time where any op launched kernels, host time of top-level ops otherwise.
            us = op.time_us if (op.device_time or not device_time) else 0.0
            time_ms[op.category] = time_ms.get(op.category, 0.0) + (us or 0.0) / 1000.0
    return Totals(
        ops=len(w.ops),
        by_category={k: cats.get(k, 0) for k in _categories(cats)},
        flops=sum(op.flops or 0 for op in w.ops) if shaped else None,
        nbytes=sum(op.nbytes or 0 for op in w.ops) if shaped else None,
        peak_bytes=w.peak_bytes,
        time_ms=time_ms,
        device_time=device_time,
    )


def _categories(counts: Counter[str] | dict[str, Any]) -> list[str]:
    return list(oprules.CATEGORY_ORDER) + sorted(set(counts) - set(oprules.CATEGORY_ORDER))


@dataclass
class DiffReport:
    a: Workload
    b: Workload
    changes: list[Change]
    totals_a: Totals
    totals_b: Totals
    notes: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.changes

    @property
    def by_signature(self) -> bool:
        return self.a.kind == "trace"

    def count(self, kind: str) -> int:
        return sum(c.kind == kind for c in self.changes)

    def grouped(self) -> dict[str, list[Change]]:
        """Changes by scope, scopes in order of their first change."""
        out: dict[str, list[Change]] = {}
        for c in self.changes:
            out.setdefault(scope_text(c.scope), []).append(c)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": _side(self.a),
            "b": _side(self.b),
            "same": self.same,
            "compared_by": "signature" if self.by_signature else "overload",
            "added": self.count("added"),
            "removed": self.count("removed"),
            "changed": self.count("changed"),
            "scopes": [{"scope": s, "changes": [_change_dict(c) for c in cs]}
                       for s, cs in self.grouped().items()],
            "totals": _totals_dict(self.totals_a, self.totals_b),
            "notes": self.notes,
        }


def scope_text(scope: tuple[str, ...]) -> str:
    """Annotations outermost first; an inner name its parent already ends with is left
    out ("autograd::engine::evaluate_function: MmBackward0" holds "MmBackward0")."""
    shown = [s for k, s in enumerate(scope) if k == 0 or not scope[k - 1].endswith(s)]
    return " / ".join(shown) if shown else TOP_LEVEL


def _side(w: Workload) -> dict[str, Any]:
    return {"name": w.name, "kind": w.kind, "ops": len(w.ops)}


def _op_dict(op: OpRecord) -> dict[str, Any]:
    return {"op": op.name, "args": {n.removeprefix("kw:"): v for n, v in op.args},
            "category": op.category}


def _change_dict(c: Change) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": c.kind, "index_a": c.index_old, "index_b": c.index_new}
    if c.old is not None:
        out["old"] = _op_dict(c.old)
    if c.new is not None:
        out["new"] = _op_dict(c.new)
    if c.kind == "changed":
        out["changed_args"] = [{"arg": n.removeprefix("kw:"), "old": o, "new": v}
                               for n, o, v in c.changed_args()]
    return out


def _delta(a: float | None, b: float | None) -> dict[str, Any]:
    return {"a": a, "b": b, "delta": None if a is None or b is None else b - a}


def _totals_dict(a: Totals, b: Totals) -> dict[str, Any]:
    cats = [k for k in _categories({**a.by_category, **b.by_category})]
    out: dict[str, Any] = {
        "ops": _delta(a.ops, b.ops),
        "ops_by_category": {k: _delta(a.by_category.get(k, 0), b.by_category.get(k, 0))
                            for k in cats},
        "flops": _delta(a.flops, b.flops),
        "bytes": _delta(a.nbytes, b.nbytes),
        "peak_bytes": _delta(a.peak_bytes, b.peak_bytes),
    }
    if a.time_ms is not None and b.time_ms is not None:
        out["time_ms_by_category"] = {
            k: _delta(a.time_ms.get(k, 0.0), b.time_ms.get(k, 0.0))
            for k in _categories({**a.time_ms, **b.time_ms})}
        out["time_ms"] = _delta(sum(a.time_ms.values()), sum(b.time_ms.values()))
        out["device_time"] = a.device_time or b.device_time
    return out


def diff_paths(a: str | Path, b: str | Path, options: BuildOptions | None = None, *,
               kineto_a: str | Path | None = None,
               kineto_b: str | Path | None = None) -> DiffReport:
    """Compare two workloads: traces (selected with ``options``) or generated benchmarks."""
    options = options or BuildOptions()
    if (kineto_a is None) != (kineto_b is None):
        raise OptionError("give both --kineto-a and --kineto-b, or neither")
    wa = load_workload(a, options, kineto_a)
    wb = load_workload(b, options, kineto_b)
    if wa.kind != wb.kind:
        raise OptionError(f"{wa.name} is a {wa.kind} and {wb.name} a {wb.kind}: diff two "
                          "traces or two generated benchmarks")
    if wa.kind == "benchmark" and replace(options, public_calls=True) != BuildOptions():
        raise OptionError(f"{wa.name} and {wb.name} are generated benchmarks: selection "
                          "flags (--mode, --include, --iteration, ...) select from traces; "
                          "generate the benchmarks with them instead")
    notes = []
    if wa.kind == "benchmark":
        notes.append("generated benchmarks compare by op overload sequence only (their "
                     "intermediate shapes are not written in the file): no changed ops, "
                     "FLOPs or bytes")
    return DiffReport(wa, wb, diff_ops(wa.ops, wb.ops), totals(wa), totals(wb), notes)


# -- text ---------------------------------------------------------------------------------
def format_diff(r: DiffReport, limit: int = 200) -> str:
    lines = [f"--- {r.a.name} ({len(r.a.ops)} ops)", f"+++ {r.b.name} ({len(r.b.ops)} ops)"]
    shown = 0
    for scope, changes in r.grouped().items():
        if shown >= limit:
            break
        lines.append(f"@@ {scope}")
        for c in changes[:max(limit - shown, 0)]:
            lines.append(_change_line(c))
        shown += len(changes)
    if shown > limit:
        lines.append(f"... {len(r.changes) - limit} more changes (--json lists all)")
    lines.append(f"{r.count('added')} added, {r.count('removed')} removed, "
                 f"{r.count('changed')} changed" if r.changes else "no differences")
    lines += [""] + _totals_lines(r.totals_a, r.totals_b)
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def _change_line(c: Change) -> str:
    if c.kind == "added":
        assert c.new is not None
        return f"+ {_clip(c.new.text())}"
    if c.kind == "removed":
        assert c.old is not None
        return f"- {_clip(c.old.text())}"
    assert c.new is not None
    parts = [f"{n.removeprefix('kw:')}: {_clip(o, 60)} -> {_clip(v, 60)}"
             for n, o, v in c.changed_args()]
    return f"~ {c.new.name}  " + "; ".join(parts)


def _clip(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _totals_lines(a: Totals, b: Totals) -> list[str]:
    rows = [("ops", str(a.ops), str(b.ops), _signed(b.ops - a.ops))]
    for k in _categories({**a.by_category, **b.by_category}):
        x, y = a.by_category.get(k, 0), b.by_category.get(k, 0)
        if x or y:
            rows.append((f"  {k}", str(x), str(y), _signed(y - x)))
    rows.append(_si_row("FLOPs (est.)", a.flops, b.flops, ""))
    rows.append(_si_row("bytes touched (est.)", a.nbytes, b.nbytes, "B"))
    rows.append(_si_row("peak memory (est.)", a.peak_bytes, b.peak_bytes, "B"))
    if a.time_ms is not None and b.time_ms is not None:
        what = "device" if (a.device_time or b.device_time) else "host, top-level ops"
        rows.append(_row(f"time ms ({what})", sum(a.time_ms.values()),
                         sum(b.time_ms.values()), 1.0))
        for k in _categories({**a.time_ms, **b.time_ms}):
            x, y = a.time_ms.get(k, 0.0), b.time_ms.get(k, 0.0)
            if x or y:
                rows.append(_row(f"  {k}", x, y, 1.0))
    width = max(len(row[0]) for row in rows)
    out = [f"{'totals':<{width}}  {'old':>10}  {'new':>10}  delta"]
    out += [f"{n:<{width}}  {x:>10}  {y:>10}  {d}" for n, x, y, d in rows]
    return out


def _row(name: str, a: float | None, b: float | None, unit: float) -> tuple[str, str, str, str]:
    if a is None or b is None:
        return (name, "n/a", "n/a", "n/a")
    return (name, f"{a / unit:.3f}", f"{b / unit:.3f}", f"{(b - a) / unit:+.3f}")


def _si_row(name: str, a: int | None, b: int | None,
            unit: str) -> tuple[str, str, str, str]:
    if a is None or b is None:
        return (name, "n/a", "n/a", "n/a")
    change = f" ({(b - a) / a * 100:+.1f}%)" if a and b != a else ""
    return (name, _si(a, unit), _si(b, unit), ("+" if b > a else "") + _si(b - a, unit) + change)


def _si(x: float, unit: str) -> str:
    """1234567 -> "1.23 M" (decimal prefixes: estimates need no more digits)."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.2f} {prefix}{unit}"
    return f"{x:g} {unit}".rstrip()


def _signed(n: int) -> str:
    return f"{n:+d}" if n else "0"
