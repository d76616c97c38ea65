"""The code generator shared by every backend: Program -> template context.

Templates only iterate and format. This module walks the program once, names every
value through one :class:`Namespace` in order of first appearance, and produces
laid-out statements using the emitter functions in :mod:`exprs`.
"""

from __future__ import annotations

import keyword
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from mystique_gen import __version__, oprules
from mystique_gen.backends import comms, exprs, schedule, valuefill
from mystique_gen.backends.harness import reserved_names
from mystique_gen.backends.layout import INDENT, Atom, Group, Node, flat, lay_out, names_statement
from mystique_gen.backends.names import Namespace, input_hint, op_hint
from mystique_gen.harness.fills import FillKind
from mystique_gen.ir import (
    Arg,
    Binding,
    DerivedView,
    DeviceValue,
    FreshStorage,
    GroupName,
    InputView,
    Level,
    ListValue,
    Literal,
    Op,
    OpOutput,
    PackedLinear,
    PackedWeight,
    Program,
    StandInTensor,
    Storage,
    TensorMeta,
    TensorValue,
    TorchConstant,
    Value,
    iter_tensors,
)
from mystique_gen.passes.tensors import binding_key, binding_root, output_paths

BODY_DEPTH = 1  # statements live inside a function body


@dataclass
class OpHandle:
    name: str  # identifier in the generated file
    target: str  # "torch.ops.aten.mm.default" or a public binding, "torch.mm"
    qualified: str  # "aten::mm.default"

    def lines(self) -> list[str]:
        resolve = [Atom(f"lambda: {self.target}"), Atom(exprs.str_literal(self.qualified))]
        return lay_out(f"{self.name} = ", exprs.call("_op", resolve), 0)


@dataclass
class BenchmarkContext:
    docstring: list[str]
    generator: str
    trace_fields: list[str]  # lines of the TRACE dict, laid out
    op_lines: list[str]  # one resolved operator handle each, laid out
    fallbacks: list[str]  # lines of the _FALLBACKS list
    inputs_only_for: list[str]  # lines of the _INPUTS_ONLY_FOR list
    input_lines: list[str]  # body of make_inputs()
    replay_lines: list[str]  # body of replay()
    op_count: int
    required_bytes: int  # the estimated peak on --device
    host_bytes: int  # and on the host, where --device is an accelerator
    primary_device: str
    op_counts: dict[str, int] = field(default_factory=dict)
    original_lines: list[str] = field(
        default_factory=lambda: [schedule.ORIGINAL_COMMENT, "ORIGINAL = None"])
    dist: comms.DistContext | None = None  # set for a distributed benchmark
    default_device: str = "None"  # literal: the benchmark's default --device, None to detect


@dataclass
class GenerateOptions:
    command_line: str = "mystique-gen"
    filters: list[str] = field(default_factory=list)
    default_device: str | None = None  # written into the file as --device's default


class CodeGen:
    """Program -> BenchmarkContext: every statement the templates print, named through
    one namespace. A backend (backends/single.py, backends/distributed.py) runs one per
    file and picks the template."""

    def __init__(self, program: Program, options: GenerateOptions):
        self.program = program
        self.options = options
        self.ns = Namespace(reserved_names())
        self.handles: dict[str, OpHandle] = {}
        self.input_lines: list[str] = []
        self.input_names: list[str] = []
        self.replay_lines: list[str] = []
        self.fallback_rows: list[Node] = []
        # [bytes, [ops]] of the inputs only guarded ops read, for the memory check (a
        # file of several ranks keeps rank 0's, whose estimate REQUIRED_BYTES is).
        self.inputs_only_for: list[Node] = []
        self.grad_state: bool | None = None  # autograd mode at this point of the unit
        self.saves_state = True  # whether ops' autograd nodes keep what they save
        self._read_program()

    def start_program(self, program: Program) -> None:
        """Build another program (a rank) into the same file: operator handles,
        fallbacks and names stay shared, the function bodies start afresh."""
        self.program = program
        self.ns = self.ns.fork(lambda key: isinstance(key, tuple) and key[0] == "op")
        self.input_lines, self.input_names, self.replay_lines = [], [], []
        self.inputs_only_for = []
        self._read_program()

    def _read_program(self) -> None:
        """What the statements read of the program being built: the roots its ops
        read, its inputs' names, the inputs that refuse views, its storageless results."""
        self.read_roots = self._read_roots()
        self.tags: dict[object, str] = {}  # variable key -> the shape its value descends from
        self._name_inputs()
        self.unviewed = self._inputs_refusing_views()
        self._storageless_results = self._results_without_storage()

    def _results_without_storage(self) -> frozenset[object]:
        """Binding keys of the op results whose layout has no storage (sparse COO,
        MKLDNN): dropping their history records ops (``exprs.without_history``)."""
        return frozenset(binding_key(OpOutput(op.index, path)) for op in self.program.ops
                         for path, tv in output_paths(op.outputs) if tv.meta.storageless)

    # -- naming -------------------------------------------------------------------
    def _name_inputs(self) -> None:
        """Claim every input's name before any statement is written, so no temporary
        takes it: its role for its first consumer (backends/names.py). The first input
        of a role keeps the bare name; later ones add their shape (a 0-d tensor, a
        wrapped Python scalar, the shape of the tensor it goes with), and their order
        among inputs of that role and shape. Inserting a layer renames no other input."""
        wanted: dict[int, tuple[str, str]] = {}  # id(view) -> (hint, shape tag)
        storages: dict[int, int] = {}  # id(view) -> id(its storage)
        for op in self.program.ops:
            tensors = [(arg.spec.name, tv) for arg in op.args for tv in iter_tensors(arg.value)]
            partner = next((_shape_tag(tv.meta.shape) for _, tv in tensors if tv.meta.shape),
                           "scalar")
            for arg_name, tv in tensors:
                if isinstance(tv.binding, InputView) and id(tv.binding) not in wanted:
                    tag = _shape_tag(tv.meta.shape) if tv.meta.shape else partner
                    wanted[id(tv.binding)] = (input_hint(op.name, arg_name), tag)
                    storages[id(tv.binding)] = id(tv.binding.storage)
        # State (parameters, optimizer buffers) is what some op updates in place; its
        # shape names the values derived from it. Activations and data are not state.
        written = {id(tv.storage) for op in self.program.ops for arg in op.args
                   if arg.spec.writes for tv in iter_tensors(arg.value) if tv.storage}
        parameters = {view for view, storage in storages.items() if storage in written}
        seen: Counter[tuple[str, str]] = Counter()
        bare: set[str] = set()
        for view, (hint, tag) in wanted.items():
            if view in parameters:  # a batch-sized shape would rename on a batch change
                self.tags[("input", view)] = tag
            if hint not in bare:
                bare.add(hint)
                name = hint
            else:
                k = seen[(hint, tag)]
                seen[(hint, tag)] += 1
                name = f"{hint}_{tag}" + (f"_{k}" if k else "")
            self.ns.claim(("input", view), name)

    def _read_roots(self) -> set[object]:
        """Keys of op results that some later statement reads (others are not named)."""
        roots: set[object] = set()
        for op in self.program.ops:
            roots.update(binding_key(OpOutput(p, (0,))) for p in op.waits_on)
            if _functional_collective(op):  # waited for at the end if nothing reads it
                roots.add(binding_key(OpOutput(op.index, (0,))))
            for view in op.derive_before:
                roots.add(binding_key(binding_root(view.base)))
            # Held until a later op, as the original held it (passes/frees.py).
            roots.update(binding_key(root) for root in op.free_after
                         if isinstance(root, OpOutput) and root.op_index != op.index)
            for arg in op.args:
                for tv in iter_tensors(arg.value):
                    if tv.binding is not None:
                        roots.add(binding_key(binding_root(tv.binding)))
        return roots

    def _inputs_refusing_views(self) -> set[int]:
        """id() of the input views that an op refusing views (oprules.REFUSES_VIEWS)
        may receive: read directly, or through the ops that made its argument (``to``
        of the same dtype and device returns its input itself). The original's tensor
        was no view, but ``as_strided`` makes one, so such inputs are detached."""
        ops = self.program.ops
        found: set[int] = set()
        pending = [(tv.binding, 0) for op in ops if op.name in oprules.REFUSES_VIEWS
                   for arg in op.args for tv in iter_tensors(arg.value)]
        while pending:
            binding, depth = pending.pop()
            if isinstance(binding, InputView):
                found.add(id(binding))
            elif isinstance(binding, OpOutput) and depth < 3:
                pending += [(tv.binding, depth + 1) for arg in ops[binding.op_index].args
                            for tv in iter_tensors(arg.value)]
        return found

    def handle(self, op: Op) -> str:
        """The module-level name bound to the op's callable: its public binding where
        one was proven (passes/bindings.py; guarded ops keep torch.ops, whose name the
        skip notice prints), else its torch.ops overload."""
        sig = op.signature
        public = op.public_call if not op.guard else None
        return self.overload_handle(sig.namespace, sig.name, sig.overload, public)

    def overload_handle(self, namespace: str, name: str, overload: str = "default",
                        public: str | None = None) -> str:
        """The module-level name bound to one operator overload (``public``: its
        proven public binding, else its torch.ops overload)."""
        full_name = f"{namespace}::{name}.{overload}"
        target = public or f"torch.ops.{namespace}.{name}.{overload}"
        key = f"{full_name} {target}"
        if key not in self.handles:
            hint = f"{namespace}_{name}" + (f"_{overload}" if overload != "default" else "")
            handle = self.ns.readable(("op", key), hint)
            self.handles[key] = OpHandle(handle, target, full_name)
        return self.handles[key].name

    def storage_name(self, storage: Storage, view: str) -> str:
        """The flat buffer behind input views, named after the first (``view``)."""
        key = ("storage", storage.index)
        if key not in self.ns:
            name = self.ns.claim(key, f"{view}_buf")
            self.input_lines.extend(lay_out(f"{name} = ", self._fill(storage), BODY_DEPTH))
        return self.ns.get(key)

    def binding_expr(self, binding: Binding) -> str:
        if isinstance(binding, InputView):
            key = ("input", id(binding))
            if key not in self.ns:  # an input no op argument names (a derived view's base)
                self.ns.claim(key, "input")
            name = self.ns.get(key)
            if name not in self.input_names:
                base = self.storage_name(binding.storage, name)
                self.input_lines.extend(
                    lay_out(f"{name} = ", _input_view(base, binding.meta), BODY_DEPTH))
                # A parameter (passes/autograd.py) is a leaf of its own, not a view of
                # its buffer: under no_grad a view of a view-leaf does not require grad
                # (``w.t()`` in ``linear``), and matmul then took an expanded bmm where
                # the original, whose parameters are real leaves, folded to mm.
                if id(binding) in self.unviewed or binding.storage.requires_grad:
                    self.input_lines.append(f"{INDENT * BODY_DEPTH}{name} = {name}.detach()")
                if binding.storage.requires_grad:
                    self.input_lines.append(f"{INDENT * BODY_DEPTH}{name}.requires_grad_()")
                self.input_names.append(name)
            return name
        if isinstance(binding, OpOutput):
            root = self.ns.get(binding_key(binding_root(binding)))
            return root if len(binding.path) == 1 else f"{root}[{binding.path[1]}]"
        return self.ns.get(binding_key(binding))

    # -- values -------------------------------------------------------------------
    def device_expr(self, kind: str) -> str:
        if kind == "cpu" and self.program.primary_device != "cpu":
            return "host"
        return "device"

    def value(self, value: Value) -> Node:
        if isinstance(value, Literal):
            return Atom(exprs.scalar_literal(value.value))
        if isinstance(value, TorchConstant):
            return Atom(exprs.torch_attr(value.name))
        if isinstance(value, DeviceValue):
            return Atom(self.device_expr(value.kind))
        if isinstance(value, GroupName):
            return Atom(f"_group_name({int(value.index)})")
        if isinstance(value, FreshStorage):
            return exprs.call("_storage", [Atom(str(int(value.nbytes))),
                                           Atom(self.device_expr(value.kind))])
        if isinstance(value, StandInTensor):  # on the benchmark's device
            return exprs.call("_metadata_stand_in", [_meta_row(value.meta, "device")])
        if isinstance(value, PackedLinear):
            return exprs.call("_packed_linear", [
                Atom(str(int(value.key))), Atom(str(int(value.out_features))),
                Atom(str(int(value.in_features))), Atom(exprs.str_literal(value.packing)),
            ])
        if isinstance(value, ListValue):
            return exprs.list_display([self.value(v) for v in value.items])
        if isinstance(value, TensorValue):
            assert value.binding is not None
            return Atom(self.binding_expr(value.binding))
        raise TypeError(type(value).__name__)

    def _fill(self, storage: Storage) -> Node:
        init = storage.init
        if init is not None and init.kind is FillKind.DATA:
            return valuefill.data_call(init, storage.dtype, self.device_expr(storage.device))
        if init is not None and init.kind is FillKind.VALUES:
            return valuefill.values_call(init, storage.dtype, self.device_expr(storage.device))
        if init is not None and init.kind is FillKind.NORMS:
            return valuefill.norms_call(init, storage.extent, storage.dtype,
                                        self.device_expr(storage.device))
        kind, low, high = (init.kind, init.low, init.high) if init else (FillKind.ZEROS, 0, 0)
        args: list[Node] = [
            Atom(str(storage.extent)),
            Atom(exprs.torch_attr(storage.dtype)),
            Atom(self.device_expr(storage.device)),
            Atom(exprs.str_literal(kind.value)),
            Atom(exprs.scalar_literal(low)),
            Atom(exprs.scalar_literal(high)),
            Atom("gens"),
        ]
        if storage.only_guarded_readers:  # made only where one of its readers exists
            handles = sorted({self.handle(self.program.ops[i])
                              for i in storage.only_guarded_readers})
            ops = exprs.list_display([Atom(h) for h in handles])
            args.append(exprs.keyword("only_for", ops))
            self.inputs_only_for.append(
                exprs.list_display([Atom(str(storage.nbytes)), ops]))
        return exprs.call("_fill", args)

    # -- statements -----------------------------------------------------------------
    def grad_mode_lines(self, mode: bool | None, depth: int) -> list[str]:
        """Switch autograd on or off where the next op needs the other mode; the state is
        tracked per replay unit (reset with ``grad_state = None``)."""
        if mode is None or mode == self.grad_state:
            return []
        self.grad_state = mode
        return [f"{INDENT * depth}torch.set_grad_enabled({mode})"]

    def saves_lines(self, op: Op, depth: int) -> list[str]:
        """Switch whether autograd nodes keep their saved tensors where the next op that
        records one needs the other (``Op.keeps_saved``, passes/frees.py)."""
        if not op.records_grad or op.keeps_saved == self.saves_state:
            return []
        self.saves_state = op.keeps_saved
        return [f"{INDENT * depth}_saved_tensors({op.keeps_saved})"]

    def end_grad_mode(self, depth: int) -> list[str]:
        """Leave a replay unit with autograd on and saving, as the harness expects."""
        lines = self.grad_mode_lines(True, depth) if self.grad_state is False else []
        self.grad_state = None
        if not self.saves_state:
            lines.append(f"{INDENT * depth}_saved_tensors(True)")
            self.saves_state = True
        return lines

    def wait_lines(self, op: Op, depth: int = BODY_DEPTH) -> list[str]:
        """The waits for collectives due before ``op``: async ones' works and
        functional ones' results (passes/comms.py)."""
        lines = comms.waits_before(self, op, depth)
        for producer in op.waits_on:
            key = binding_key(OpOutput(producer, (0,)))
            if key in self.ns:
                lines.append(f"{INDENT * depth}_wait_tensor({self.ns.get(key)})")
        return lines

    def op_statement(self, op: Op, depth: int = BODY_DEPTH, *, waits: bool = True
                     ) -> list[str]:
        """The op's statements at indentation ``depth`` (deeper inside a stream block
        or a host-thread function, see emit/schedule.py), after its waits unless the
        caller placed them (before the op's host gap, which holds them)."""
        lines = self.wait_lines(op, depth) if waits else []
        lines += self.grad_mode_lines(op.grad_mode, depth)
        lines += self.saves_lines(op, depth)
        if op.derive_before:
            lines.append(INDENT * depth + "with _harness():")
        for view in op.derive_before:
            name = self.ns.claim(binding_key(view), "view")
            base = self.binding_expr(view.base)
            lines.extend(lay_out(f"{name} = ", _as_strided(base, view.meta), depth + 1))
        if op.comm is not None:  # a torch.distributed call (emit/comms.py)
            lines.extend(comms.call_lines(self, op, depth))
            lines.extend(self._frees(op, depth))
            return lines + comms.waits_at_end(self, op, depth)
        args: list[Node] = []
        omitted = op.public_omits if op.public_call and not op.guard else ()
        for arg in op.args:
            if arg.spec.name in omitted:
                continue  # at its default, which the public call takes (`handle`)
            if isinstance(arg.value, PackedWeight):
                node = self._packed_weight(op, arg.value)
            else:
                node = self._in_range(op, arg) if op.in_range else self.value(arg.value)
            if arg.spec.name in op.nonzero:
                node = valuefill.nonzero(node)
            if not arg.spec.kwarg_only:
                args.append(node)
            elif arg.spec.name.isidentifier() and not keyword.iskeyword(arg.spec.name):
                args.append(exprs.keyword(arg.spec.name, node))
            else:
                args.append(Atom(f"**{{{exprs.str_literal(arg.spec.name)}: {flat(node)}}}"))
        handle: Node = Atom(self.handle(op))
        wire = _functional_collective(op) and comms.wire_form(
            op, oprules.functional_reduces(op.signature.name))
        if wire:  # gloo cannot send this dtype: its bytes, or for a reduction wider
            handle = exprs.call("_on_wire", [handle, Atom(exprs.str_literal(wire))])
        if op.guard:
            site = len(self.fallback_rows)
            self.fallback_rows.append(self._fallback_row(op))
            call = exprs.call("_guarded", [Atom(str(site)), handle, *args])
        elif op.copy_if_unviewable:
            call = exprs.call("_viewed", [Atom(str(op.index)), handle, *args])
        else:
            call = exprs.call(flat(handle), args)
        targets = self._targets(op)
        prefix = f"{', '.join(targets)} = " if any(t != "_" for t in targets) else ""
        lines.extend(lay_out(prefix, call, depth))
        lines.extend(valuefill.fit_lines(op, targets, depth))
        lines.extend(valuefill.layout_lines(op, targets, depth))
        lines.extend(self._frees(op, depth))
        return lines + comms.waits_at_end(self, op, depth)

    def _packed_weight(self, op: Op, packed: PackedWeight) -> Node:
        """``_packed_weight(key, packer, source, ...)``: packed from the op's own
        arguments at its first call by the packing op's handle (runtime
        ``_packed_weight``)."""
        values = {a.spec.name: a.value for a in op.args}
        namespace, name = packed.packer.split("::")
        return exprs.call("_packed_weight", [
            Atom(str(int(packed.key))), Atom(self.overload_handle(namespace, name)),
            *(self.value(values[source]) for source in packed.sources),
        ])

    def _in_range(self, op: Op, arg: Arg) -> Node:
        """An argument with its computed indices wrapped into range (``Op.in_range``):
        ``_in_range(index, size)``, or each such tensor of an index list; a loss's
        ``ignore_index`` is kept (``_in_range(target, classes, ignore)``)."""
        name = arg.spec.name
        ignore = next((a.value.value for a in op.args if a.spec.name == "ignore_index"
                       and isinstance(a.value, Literal) and type(a.value.value) is int), None)
        if (name, None) in op.in_range:
            return valuefill.in_range(self.value(arg.value), op.in_range[(name, None)],
                                      ignore)
        if isinstance(arg.value, ListValue) and any(key[0] == name for key in op.in_range):
            items = [self.value(item) for item in arg.value.items]
            return exprs.list_display([
                valuefill.in_range(node, op.in_range[(name, k)], ignore)
                if (name, k) in op.in_range else node for k, node in enumerate(items)])
        return self.value(arg.value)

    def _targets(self, op: Op) -> list[str]:
        """Names of the op's results: the op's name while it is free; else the op's name
        and the shape of the input its value descends from (linear_10x128), so that an
        op inserted elsewhere does not renumber this one; else a counter."""
        tag = self._tag_of(op)
        targets = []
        for i in range(len(op.signature.returns)):
            key = binding_key(OpOutput(op.index, (i,)))
            if key not in self.read_roots:
                targets.append("_")
                continue
            hint = op_hint(op.name)
            if tag is not None and self.ns.taken(hint):
                hint = f"{hint}_{tag}"
            targets.append(self.ns.claim(key, hint))
            if tag is not None:
                self.tags[key] = tag
        return targets

    def _tag_of(self, op: Op) -> str | None:
        """The shape an op's results descend from: its first input's where that is state
        (never the batch's activations), else the first tagged value's."""
        found: str | None = None
        for arg in op.args:
            for tv in iter_tensors(arg.value):
                if isinstance(tv.binding, InputView):
                    return self.tags.get(("input", id(tv.binding)))
                if tv.binding is not None and found is None:
                    found = self.tags.get(binding_key(binding_root(tv.binding)))
        return found

    def _frees(self, op: Op, depth: int = BODY_DEPTH) -> list[str]:
        """``del`` of the values freed here; their names are free again after. Values
        last read here but held on (passes/frees.py) first drop their history."""
        lines = []
        for root in op.drop_history_after:
            key = binding_key(root)
            if key in self.ns:
                name = self.ns.get(key)
                storageless = key in self._storageless_results
                lines.append(f"{INDENT * depth}{name} = "
                             f"{exprs.without_history(name, storageless)}")
        names = []
        for root in op.free_after:
            key = binding_key(root)
            if key in self.ns and (key in self.read_roots or isinstance(root, DerivedView)):
                names.append(self.ns.get(key))
                self.ns.release(key)
        return lines + names_statement("del", names, depth)

    def _fallback_row(self, op: Op) -> Node:
        """Recorded outputs of a guarded op, to stand in for them if it cannot run."""
        items: list[Node] = []
        for value in op.outputs:
            if isinstance(value, TensorValue):
                items.append(_meta_row(value.meta, self.device_expr(value.meta.device)))
            elif isinstance(value, ListValue):
                items.append(exprs.list_display([
                    _meta_row(t.meta, self.device_expr(t.meta.device))
                    for t in iter_tensors(value)
                ]))
            else:
                items.append(Atom("None"))
        return exprs.list_display(items)

    def build(self) -> BenchmarkContext:
        previous_scope: tuple[str, ...] | None = None
        if schedule.uses_schedule(self.program):  # streams, host threads or host gaps
            self.replay_lines.extend(schedule.replay_lines(self))
        else:
            for op in self.program.ops:
                if op.scope != previous_scope and op.scope:
                    self.replay_lines.append("    " + exprs.comment(op.scope[-1]))
                previous_scope = op.scope
                self.replay_lines.extend(self.op_statement(op))
            self.replay_lines.extend(self.end_grad_mode(BODY_DEPTH))
            # A functional collective's result nothing read (or not yet waited for):
            # wait before the iteration ends, as the original's did by its exit.
            for op in self.program.ops:
                key = binding_key(OpOutput(op.index, (0,)))
                if _functional_collective(op) and key in self.ns:
                    self.replay_lines.append(f"{INDENT}_wait_tensor({self.ns.get(key)})")
        if self.program.dual_levels:  # forward-AD levels, live for the iteration only
            self.replay_lines[:0] = schedule.helper_call(
                "_dual_levels", [str(int(self.program.dual_levels))], BODY_DEPTH)
            self.replay_lines.extend(schedule.helper_call("_dual_levels", ["0"], BODY_DEPTH))
        returned = [Atom(f"{exprs.str_literal(n)}: {n}") for n in self.input_names]
        self.input_lines.extend(
            lay_out("return ", Group("{", tuple(returned), "}", literal=True), BODY_DEPTH))
        unpack = [f"    {n} = inputs[{exprs.str_literal(n)}]" for n in self.input_names]
        program = self.program
        required = program.peak_bytes
        return BenchmarkContext(
            docstring=self._docstring(),
            generator=f"mystique-gen {__version__}",
            trace_fields=self._trace_fields(),
            # By name, not first use: a new op adds its own line and moves no other.
            op_lines=self._namespace_lines() + [
                line for h in sorted(self.handles.values(), key=lambda h: h.name)
                for line in h.lines()],
            fallbacks=lay_out("_FALLBACKS = ", exprs.list_display(self.fallback_rows), 0),
            inputs_only_for=lay_out("_INPUTS_ONLY_FOR = ",
                                    exprs.list_display(self.inputs_only_for), 0),
            input_lines=self.input_lines,
            replay_lines=unpack + self.replay_lines,
            op_count=len(program.ops),
            required_bytes=required,
            host_bytes=program.host_peak_bytes,
            primary_device=program.primary_device,
            op_counts=dict(Counter(op.name for op in program.ops)),
            original_lines=schedule.original_lines(program),
            default_device=exprs.scalar_literal(self.options.default_device),
        )

    def _namespace_lines(self) -> list[str]:
        """Imports of the torch modules that register the namespaces ops use (fsdp::)."""
        spaces = sorted({h.qualified.split("::", 1)[0] for h in self.handles.values()})
        return [f"_load_namespace({exprs.str_literal(oprules.NAMESPACE_MODULES[s])})"
                for s in spaces if s in oprules.NAMESPACE_MODULES]

    def _trace_fields(self) -> list[str]:
        t = self.program.trace
        items = [
            Atom(f"{exprs.str_literal(k)}: {v}")
            for k, v in (
                ("name", exprs.str_literal(exprs.docstring_line(t.name, 200))),
                ("sha256", exprs.str_literal(t.sha256)),
                ("schema", exprs.str_literal(exprs.docstring_line(t.schema, 60))),
                ("nodes", str(t.node_count)),
                ("num_threads", "None" if t.num_threads is None else str(int(t.num_threads))),
            )
        ]
        return lay_out("TRACE = ", Group("{", tuple(items), "}", literal=True), 0)

    def _docstring(self) -> list[str]:
        return wrap(self._source_lines(self.program)
                    + report_lines([(None, self.program)], self.options.filters))

    def docstring_of_ranks(self, programs: list[Program], ranks: list[int]) -> list[str]:
        """The header of a file that replays several ranks: the first rank's source
        lines, and every rank's filters, ops not replayed and notes (a line that holds
        on some ranks only names them)."""
        return wrap(self._source_lines(programs[0])
                    + report_lines(list(zip(ranks, programs, strict=True)),
                                   self.options.filters))

    def _source_lines(self, p: Program) -> list[str]:
        """The header's lines on the trace, the command line and the replay's size."""
        t = p.trace
        d = exprs.docstring_line
        lines = [
            f"Benchmark generated by mystique-gen {__version__} from an execution trace.",
            "",
            f"Source trace: {d(t.name)}",
            f"  sha256: {t.sha256}",
            f"  schema: {d(t.schema)}",
            f"  nodes: {t.node_count}",
            f"Command: {d(self.options.command_line, 200)}",
            f"Replayed ops: {len(p.ops)} on {len(p.threads)} host thread(s) "
            + (f"each on its own thread ({p.threaded_by})" if p.threaded else "in node order"),
            f"Recorded devices: {', '.join(p.devices) or 'none'} "
            f"(--device replaces {p.primary_device})",
            f"Estimated peak memory: {_human_bytes(p.peak_bytes)}"
            + (f" on {p.primary_device}, {_human_bytes(p.host_peak_bytes)} on the host"
               if p.host_peak_bytes else ""),
        ]
        if t.num_threads is not None:  # the capture's step.json: the ET does not say
            lines.append(f"Captured with {t.num_threads} intra-op CPU thread"
                         f"{'s' if t.num_threads != 1 else ''} (a CPU run: --num-threads "
                         f"{t.num_threads} to match; default: torch's)")
        return lines


def _on_ranks(held: list[int | None], every: int) -> str:
    """The prefix naming the ranks a header line holds on: none where it holds on all."""
    if len(held) == every:
        return ""
    return ("rank " if len(held) == 1 else "ranks ") + ", ".join(map(str, held)) + ": "


def report_lines(programs: list[tuple[int | None, Program]], filters: list[str]
                 ) -> list[str]:
    """The header's facts of one program or of several ranks' (``programs``: rank, or
    None for a single program, and its program): filters applied, ops not replayed
    with their reasons and node ids, guarded ops and notes. A line that holds on every
    rank is written once; others name the ranks they hold on."""
    d = exprs.docstring_line
    every = len(programs)

    def merged(items: list[tuple[int | None, str]]) -> list[tuple[str, str]]:
        held: dict[str, list[int | None]] = {}
        for rank, text in items:
            ranks = held.setdefault(text, [])
            if rank not in ranks:
                ranks.append(rank)
        return [(_on_ranks(ranks, every), text) for text, ranks in held.items()]

    lines = ["", "Filters applied:"]
    applied = [f"  - {d(f, 300)}" for f in filters]  # the command line's: every rank's
    applied += [f"  - {who}{d(f, 300)}" for who, f in merged(
        [(r, f) for r, p in programs for f in p.filters])]
    lines += applied or ["  - none"]
    lines += ["", "Ops not replayed:"]
    grouped: dict[tuple[str, str], dict[int | None, list[int]]] = defaultdict(dict)
    for rank, p in programs:
        for s in p.not_replayed:
            grouped[(s.name, s.reason)].setdefault(rank, []).append(s.node_id)
    if not grouped:
        lines.append("  - none")
    for (name, reason), by_rank in grouped.items():
        # One line where every rank skipped the same nodes, else one per rank.
        same = len(by_rank) == every and len({tuple(i) for i in by_rank.values()}) == 1
        for rank, ids in ([(None, next(iter(by_rank.values())))] if same
                          else by_rank.items()):
            who = "" if rank is None else f"rank {rank}: "
            shown = ", ".join(str(i) for i in ids[:6]) + (", ..." if len(ids) > 6 else "")
            lines.append(f"  - {who}{d(name, 60)} x{len(ids)}: {d(reason, 200)}")
            lines.append(f"    nodes {shown}")
    guarded = [(r, g) for r, p in programs for g in p.reported(Level.GUARDED)]
    if guarded:
        lines += ["", "Ops guarded at run time (where one cannot run, its portable"
                  " equivalent runs where it has one, else its outputs stand in):"]
        counts = Counter((r, g.name) for r, g in guarded)
        reasons = {g.name: g.reason for _, g in guarded}
        lines += [f"  - {who}{text}" for who, text in merged(
            [(r, f"{n} x{c}: {d(reasons[n], 120)}") for (r, n), c in counts.items()])]
    notes = [(r, n) for r, p in programs for n in p.notes]
    if notes:
        lines += ["", "Notes:"] + [f"  - {who}{d(n, 400)}" for who, n in merged(notes)]
    return lines


def wrap(lines: list[str], width: int = 84) -> list[str]:
    out = []
    for line in lines:
        while len(line) > width:
            cut = line.rfind(" ", 0, width)
            cut = cut if cut > 8 else width
            out.append(line[:cut].rstrip())
            line = "      " + line[cut:].lstrip()
        out.append(line.rstrip())
    return out


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"


def _functional_collective(op: Op) -> bool:
    return (op.signature.namespace in oprules.FUNCTIONAL_NAMESPACES
            and op.signature.name not in oprules.COLLECTIVE_HELPERS)


def _shape_tag(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _input_view(base: str, meta: TensorMeta) -> Node:
    """An input tensor on its flat buffer: a view, a sparse tensor on its values, or
    an MKLDNN tensor of its values."""
    if meta.mkldnn:
        return exprs.call("_to_mkldnn", [_as_strided(base, meta)])
    if meta.sparse is None:
        return _as_strided(base, meta)
    return exprs.call("_sparse_coo", [
        Atom(base), exprs.int_list(meta.shape), Atom(str(meta.sparse.sparse_dim)),
        Atom(str(meta.sparse.coalesced)), Atom("gens"),
    ])


def _as_strided(base: str, meta: TensorMeta) -> Node:
    return exprs.call(f"{base}.as_strided", [
        exprs.int_list(meta.shape), exprs.int_list(meta.strides), Atom(str(meta.offset))
    ])


def _meta_row(meta: TensorMeta, device: str) -> Node:
    return exprs.list_display([
        Atom(exprs.torch_attr(meta.dtype)),
        exprs.int_list(meta.shape),
        exprs.int_list(meta.strides),
        Atom(exprs.str_literal(device)),
    ])

