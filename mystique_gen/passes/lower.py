"""Lowering: decode each selected node's recorded arguments into IR values.

Arguments are decoded by the schema's argument type, not by guessing from the
recorded value: an ``int`` recorded for a ``ScalarType?`` argument becomes
``torch.float32``, a device string becomes the benchmark's device, a tensor record
becomes a :class:`TensorValue` with its full view metadata. Problems with one node
become ``not replayed`` diagnostics; malformed records raise :class:`TraceError`.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any, Protocol

import torch

from mystique_gen import oprules
from mystique_gen.errors import TraceError
from mystique_gen.ir import (
    Arg,
    DeviceValue,
    Diagnostic,
    FreshStorage,
    GroupName,
    ListValue,
    Literal,
    Op,
    PackedLinear,
    PackedWeight,
    StandInTensor,
    TensorMeta,
    TensorValue,
    TorchConstant,
    Value,
    contiguous_strides,
    iter_leaves,
    iter_tensors,
    not_replayed,
)
from mystique_gen.ir.dtypes import (
    ITEM_SIZES,
    LAYOUT_CODES,
    MEMORY_FORMAT_CODES,
    SCALAR_TYPE_CODES,
    dtype_from_type_string,
)
from mystique_gen.ir.schema import SchemaError, Signature, parse_signature
from mystique_gen.passes import kernels
from mystique_gen.passes.select import Domain, Selected, SparseTensors, recorded_domains
from mystique_gen.sources.et import RawArg, RawNode


class CommHook(Protocol):
    """Communication lowering for one trace (passes/comms.py's CommLowering)."""

    def lower(self, sel: Selected, sig: Signature, index: int) -> Op | Diagnostic:
        """One c10d op as a torch.distributed call."""

    def group_of(self, name: object) -> int:
        """The benchmark's group index of a recorded process group name."""


INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


class Unsupported(Exception):
    """This node cannot be replayed; the message is the reason."""


class StoragelessTensor(Unsupported):
    """A recorded tensor without storage: unsupported, except where stand-ins serve
    (:func:`_on_stand_ins`)."""


def lower_ops(selected: list[Selected], comm: CommHook | None = None, *,
              release: bool = False, sparse: SparseTensors | None = None,
              ) -> tuple[list[Op], list[Diagnostic]]:
    """``comm`` lowers ``c10d::`` ops (passes/comms.py); without it they are not replayed.
    ``release``: drop each node's recorded arguments once lowered, so that the trace
    shrinks while the IR grows (peak memory: about one of them, not both).
    ``sparse``: the trace's sparse COO tensors by tensor id (:func:`sparse_tensors`)."""
    sparse = sparse if sparse is not None else SparseTensors()
    ops: list[Op] = []
    skipped: list[Diagnostic] = []
    for sel in _consumed(selected, release):
        node = sel.node
        try:
            sig = parse_signature(node.op_schema)
        except SchemaError as exc:
            skipped.append(not_replayed(node.id, _short(node.name), str(exc)))
            continue
        if comm is not None and sig.namespace == "c10d":
            lowered = comm.lower(sel, sig, len(ops))
            if isinstance(lowered, Op):
                ops.append(lowered)
            else:
                skipped.append(lowered)
            continue
        functional = comm is not None and sig.namespace in oprules.FUNCTIONAL_NAMESPACES
        reason = None if functional else _not_replayed_reason(sig)
        if reason:
            skipped.append(not_replayed(node.id, sig.qualified_name, reason))
            continue
        try:
            outputs = _decode_outputs(sig, node.outputs, node.id, sparse)
            args = _decode_args(sig, node.inputs, node.id,
                                comm.group_of if functional and comm else None, outputs,
                                sparse, key=len(ops))
        except StoragelessTensor as exc:
            decoded = _on_stand_ins(sig, node, sparse, len(ops))
            if decoded is None:
                skipped.append(not_replayed(node.id, sig.qualified_name, str(exc)))
                continue
            outputs, args = decoded
        except Unsupported as exc:
            skipped.append(not_replayed(node.id, sig.qualified_name, str(exc)))
            continue
        seq_id = node.attrs.get("seq_id")
        ops.append(Op(
            index=len(ops), node_id=node.id, signature=sig, args=args, outputs=outputs,
            thread=node.tid, scope=sel.scope,
            guard=oprules.FUNCTIONAL_GUARD if functional else _guard(sig),
            records_grad=(seq_id >= 0 if isinstance(seq_id, int)
                          and not isinstance(seq_id, bool) else None),
            made_grad_node=sel.made_grad_node,
            requires_grad_args=sel.requires_grad_args,
            kernel_path=sel.kernel_path,
            domains=inherited_domains(sel.composites, args, sel.child_domains),
        ))
    return ops, skipped


def inherited_domains(composites: tuple[RawNode, ...], args: list[Arg],
                      from_children: tuple[tuple[tuple[int, int], Domain], ...] = ()
                      ) -> dict[tuple[str, int | None], Domain]:
    """The value domains (``oprules.POSITIVE_ARGS``, ``FLOAT_RANGES``) of composite ops
    replayed as their children, on the arguments of one child that read the same
    tensors (by trace and storage id), and those ``from_children`` (the op's own
    recorded children's, ``Selected.child_domains``). ``torch.quantile`` under autograd
    is replayed as its children, which check its levels and turn them into gather
    indices: without its [0, 1] rule the replay filled them at random and failed."""
    wanted = recorded_domains(composites, " (replayed as its children)")
    for key, domain in from_children:
        wanted.setdefault(key, domain)
    found: dict[tuple[str, int | None], tuple[str, float, float, str]] = {}
    for arg in args:
        items = arg.value.items if isinstance(arg.value, ListValue) else (arg.value,)
        for k, item in enumerate(items):
            if isinstance(item, TensorValue) and (item.trace_id, item.storage_id) in wanted:
                position = k if isinstance(arg.value, ListValue) else None
                found[(arg.spec.name, position)] = wanted[(item.trace_id, item.storage_id)]
    return found


def _consumed(selected: list[Selected], release: bool) -> Iterator[Selected]:
    for sel in selected:
        yield sel
        if release:  # runs after the loop body, whichever way it ended
            sel.node.inputs = sel.node.outputs = []


def _short(name: str) -> str:
    return name if len(name) <= 80 else name[:77] + "..."


def _not_replayed_reason(sig: Signature) -> str | None:
    if sig.qualified_name in oprules.NOT_REPLAYED:
        return oprules.NOT_REPLAYED[sig.qualified_name]
    if sig.namespace in oprules.COMMUNICATION_NAMESPACES:
        return "communication op: run the benchmark under torch.distributed (not yet supported)"
    for spec in sig.args:
        if spec.type == "Storage" and sig.returns[:1] == ("Tensor",):
            continue  # a new one, as large as the result needs (_fresh_storage)
        if _packs_linear(sig, spec.type):
            continue  # packed from the op's shapes (_packed_linear)
        if any(bad in spec.type for bad in oprules.UNSUPPORTED_ARG_TYPES):
            return f"argument {spec.name!r} of type {spec.type} cannot be rebuilt from a trace"
    return None


@lru_cache(maxsize=4096)
def _guard(sig: Signature) -> str | None:
    reason = kernels.guard_reason(f"{sig.namespace}::{sig.name}.{sig.overload}")
    if sig.namespace in oprules.NAMESPACE_MODULES:  # registered when its module loads
        with contextlib.suppress(ImportError):
            importlib.import_module(oprules.NAMESPACE_MODULES[sig.namespace])
    if reason:
        return reason
    if kernels.unknown_here(f"{sig.namespace}::{sig.name}.{sig.overload}"):
        return (f"not an operator of torch {torch.__version__}, which generated this "
                "file")
    return None


def _decode_args(sig: Signature, recorded: list[RawArg], node_id: int,
                 group_of: Callable[[object], int] | None = None,
                 outputs: list[Value] | None = None,
                 sparse: SparseTensors | None = None, *,
                 stand_ins: bool = False, key: int = 0) -> list[Arg]:
    """Arguments by schema type; with ``group_of``, a process group's recorded name
    becomes that group at run time (functional collectives); a ``Storage`` one, a new
    storage for the result in ``outputs`` (:func:`_fresh_storage`); a packed linear
    weight, one made for this op, ``key`` (:func:`_packed_linear`)."""
    if len(recorded) > len(sig.args):
        raise Unsupported(
            f"{len(recorded)} inputs recorded but the schema takes {len(sig.args)}")
    args = []
    packed = oprules.PACKED_ARGS.get(sig.qualified_name)  # (argument, packer, sources)
    for i, (spec, raw) in enumerate(zip(sig.args, recorded, strict=False)):
        if group_of is not None and spec.name in oprules.GROUP_NAME_ARGS:
            args.append(Arg(spec, GroupName(group_of(raw.value))))
            continue
        if spec.type == "Storage":
            args.append(Arg(spec, _fresh_storage(outputs or [], node_id, f"inputs[{i}]")))
            continue
        if _packs_linear(sig, spec.type):
            args.append(Arg(spec, _packed_linear(sig, args, outputs or [], key,
                                                 f"inputs[{i}]")))
            continue
        if packed is not None and spec.name == packed[0]:
            args.append(Arg(spec, PackedWeight(key=key, packer=packed[1],
                                               sources=packed[2])))
            continue
        value = decode_value(raw.value, spec.type, raw, node_id, f"inputs[{i}]", sparse,
                             stand_ins=stand_ins)
        args.append(Arg(spec, value))
    missing = [s.name for s in sig.args[len(recorded):] if not s.has_default]
    if missing:
        raise Unsupported(f"required arguments not recorded: {', '.join(missing)}")
    return args


def _on_stand_ins(sig: Signature, node: RawNode, sparse: SparseTensors,
                  key: int) -> tuple[list[Value], list[Arg]] | None:
    """Outputs and arguments of an op that read a tensor recorded without storage (a
    vmap wrapper), with stand-ins of their recorded shape, where those serve: the op
    writes no argument, and either returns no tensor (the autograd engine's
    ``is_same_size`` under ``torch.func``: it reads sizes, strides and dtype) or
    touches no real tensor at all (a cast of a wrapper to the dtype it had, which
    returns it: it ran on no tensor below it, so no child of it was replayed). None
    where they do not serve: an op between wrappers and real tensors
    (``_add_batch_dim``) is vmap's own machinery."""
    if any(spec.writes for spec in sig.args):
        return None
    try:
        outputs = _decode_outputs(sig, node.outputs, node.id, sparse, stand_ins=True)
        args = _decode_args(sig, node.inputs, node.id, outputs=outputs, sparse=sparse,
                            stand_ins=True, key=key)
    except Unsupported:
        return None
    real = any(True for v in [*outputs, *(a.value for a in args)] for _ in iter_tensors(v))
    returns_tensor = any(isinstance(leaf, (TensorValue, StandInTensor))
                         for v in outputs for leaf in iter_leaves(v))
    return (outputs, args) if not (real and returns_tensor) else None


def _packs_linear(sig: Signature, type_str: str) -> bool:
    return type_str == oprules.LINEAR_PACKED and sig.qualified_name in oprules.PACKED_LINEAR


def _packed_linear(sig: Signature, args: list[Arg], outputs: list[Value], key: int,
                   where: str) -> PackedLinear:
    """A quantized linear op's packed weight, which the trace writes as ``"<Object>"``:
    as many input features as its input's last dimension, as many output features as
    its result's (oprules/quantized.py)."""
    inputs = [a.value for a in args if isinstance(a.value, TensorValue)]
    result = outputs[0] if outputs else None
    if not inputs or not isinstance(result, TensorValue) or not inputs[0].meta.shape \
            or not result.meta.shape:
        raise Unsupported(f"{where}: a packed weight, and no recorded input and result "
                          "to size it")
    return PackedLinear(key=key, out_features=result.meta.shape[-1],
                        in_features=inputs[0].meta.shape[-1],
                        packing=oprules.PACKED_LINEAR[sig.qualified_name])


def _fresh_storage(outputs: list[Value], node_id: int, where: str) -> FreshStorage:
    """The storage an op (``set_``) puts its result on, which the trace does not
    record: one as large as the recorded result reaches, on its device."""
    result = outputs[0] if outputs else None
    if not isinstance(result, TensorValue):
        raise Unsupported(f"{where}: a Storage argument, and no recorded result to size it")
    meta = result.meta
    return FreshStorage(nbytes=meta.extent * ITEM_SIZES.get(meta.dtype, 4), kind=meta.device)


def _decode_outputs(sig: Signature, recorded: list[RawArg], node_id: int,
                    sparse: SparseTensors, *,
                    stand_ins: bool = False) -> list[Value]:
    outputs: list[Value] = []
    for i, type_str in enumerate(sig.returns):
        if i < len(recorded):
            raw = recorded[i]
            outputs.append(decode_value(raw.value, type_str, raw, node_id, f"outputs[{i}]",
                                        sparse, stand_ins=stand_ins))
        else:
            outputs.append(Literal(None))
    return outputs


def _is_none(value: Any) -> bool:
    return value is None or value == "<None>"


def decode_value(value: Any, type_str: str, raw: RawArg, node_id: int, where: str,
                 sparse: SparseTensors | None = None, *,
                 stand_ins: bool = False) -> Value:
    """Decode one recorded value by its schema type; ``sparse``: the trace's sparse COO
    tensors by tensor id (:func:`sparse_tensors`)."""
    optional = type_str.startswith("Optional[")
    base = type_str[len("Optional["):-1] if optional else type_str
    if _is_none(value):
        return Literal(None)
    if base == "Tensor":
        return _tensor(value, raw.shape, raw.strides, raw.type, node_id, where, sparse,
                       stand_ins=stand_ins)
    if base in ("List[Tensor]", "List[Optional[Tensor]]"):
        if not isinstance(value, list):
            raise TraceError("expected a list of tensors", node_id=node_id, field=where)
        element_types = list_element_types(raw.type, len(value))
        shapes = raw.shape if isinstance(raw.shape, list) else []
        strides = raw.strides if isinstance(raw.strides, list) else None
        items: list[Value] = []
        for j, item in enumerate(value):
            if _is_none(item):
                items.append(Literal(None))
                continue
            shape = shapes[j] if j < len(shapes) else None
            stride = strides[j] if strides is not None and j < len(strides) else None
            items.append(_tensor(item, shape, stride, element_types[j], node_id,
                                 f"{where}[{j}]", sparse, stand_ins=stand_ins))
        return ListValue(tuple(items))
    if base == "ScalarType":
        return _code(value, SCALAR_TYPE_CODES, "dtype", node_id, where)
    if base == "Layout":
        return _code(value, LAYOUT_CODES, "layout", node_id, where)
    if base == "MemoryFormat":
        return _code(value, MEMORY_FORMAT_CODES, "memory format", node_id, where)
    if base == "Device":
        if not isinstance(value, str):
            raise TraceError("expected a device string", node_id=node_id, field=where)
        return DeviceValue(_device_kind(value, node_id, where))
    if base in ("Generator",):
        return Literal(None)  # the benchmark seeds the default generator instead
    if base in ("int", "SymInt"):
        return Literal(_number(value, (int,), node_id, where))
    if base == "complex" or (base in ("Scalar", "number") and raw.type == "ComplexDouble"):
        return Literal(_complex(value, node_id, where))
    if base in ("float", "Scalar", "number"):
        return Literal(_number(value, (int, float), node_id, where))
    if base == "bool":
        if not isinstance(value, bool):
            raise TraceError("expected a boolean", node_id=node_id, field=where)
        return Literal(value)
    if base == "str":
        if not isinstance(value, str):
            raise TraceError("expected a string", node_id=node_id, field=where)
        return Literal(value)
    if base.startswith("List[") and base.endswith("]"):
        inner = base[len("List["):-1]
        if inner.removeprefix("Optional[").removesuffix("]") in (
                "int", "SymInt", "float", "bool", "Scalar", "number"):
            if not isinstance(value, list):
                raise TraceError("expected a list", node_id=node_id, field=where)
            return ListValue(tuple(
                decode_value(v, inner, raw, node_id, f"{where}[{j}]")
                for j, v in enumerate(value)
            ))
    raise Unsupported(f"argument type {type_str} is not supported")


def list_element_types(type_str: str, count: int) -> list[str]:
    """``GenericList[Tensor(float),Tensor(long int)]`` -> per-element type strings."""
    inner = type_str[type_str.find("[") + 1 : -1] if type_str.endswith("]") else ""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    if inner:
        parts.append(inner[start:])
    if not parts:
        parts = ["Tensor(float)"]
    return [parts[min(j, len(parts) - 1)] for j in range(count)]


def _code(value: Any, table: dict[int, str], what: str, node_id: int, where: str) -> Value:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"expected an integer {what} code", node_id=node_id, field=where)
    if value not in table:
        raise Unsupported(f"unknown {what} code {value}")
    return TorchConstant(table[value])


# JSON has no literal for non-finite numbers, so the ET observer writes a Double that is
# infinite or NaN as a string (masked_fill(mask, -inf) in attention masks and MoE
# routers). Read back only where a float is expected; any other string stays an error.
NON_FINITE = {"inf": math.inf, "+inf": math.inf, "infinity": math.inf, "-inf": -math.inf,
              "-infinity": -math.inf, "nan": math.nan, "+nan": math.nan, "-nan": math.nan}


def _number(value: Any, kinds: tuple[type, ...], node_id: int, where: str) -> int | float:
    if float in kinds and isinstance(value, str) and value.strip().lower() in NON_FINITE:
        return NON_FINITE[value.strip().lower()]
    # bool is an int subclass; a recorded bool in a Scalar slot is a valid value.
    if not isinstance(value, kinds):
        raise TraceError(f"expected a number, got {type(value).__name__}", node_id=node_id,
                         field=where)
    if type(value) is int and not INT64_MIN <= value <= UINT64_MAX:
        raise Unsupported(f"{where}: integer {str(value)[:24]} is outside 64 bits")
    return value  # NaN and infinities are emitted as float("nan") etc.


# The ET observer writes a complex Scalar's type (ComplexDouble) but not its value:
# "<ComplexDouble>" (complex autograd's conj-multiplies, x * 1j). A complex stand-in of
# magnitude one keeps the result's dtype (a real tensor times it is complex) and scale.
COMPLEX_STAND_IN = complex(1.0, 0.0)


def _complex(value: Any, node_id: int, where: str) -> complex:
    if isinstance(value, str) and value.startswith("<"):
        return COMPLEX_STAND_IN
    if isinstance(value, list) and len(value) == 2:  # [real, imag], should a torch write it
        value = complex(*(_number(v, (int, float), node_id, where) for v in value))
    if isinstance(value, (int, float, complex)) and not isinstance(value, bool):
        return complex(value)
    raise TraceError(f"expected a complex number, got {type(value).__name__}",
                     node_id=node_id, field=where)


def _device_kind(text: str, node_id: int, where: str) -> str:
    kind = text.split(":", 1)[0]
    if not (kind.isascii() and kind.isidentifier()) or len(kind) > 16:
        raise TraceError(f"not a device: {text[:30]!r}", node_id=node_id, field=where)
    return kind


_INTS = frozenset({int})


def _int_list(value: Any, node_id: int, where: str, *, signed: bool) -> tuple[int, ...]:
    # type() is int: a bool is not a size; this runs for every recorded tensor, so the
    # checks run in C (map, min, max) rather than in a generator.
    if not isinstance(value, list) or not _INTS.issuperset(map(type, value)):
        raise TraceError("expected a list of integers", node_id=node_id, field=where)
    if value:
        low = min(value)
        if not signed and low < 0:
            raise TraceError("negative size", node_id=node_id, field=where)
        if low < INT64_MIN or max(value) > INT64_MAX:
            raise Unsupported(f"{where}: a size or stride is outside 64 bits")
    return tuple(value)


def _tensor(value: Any, shape: Any, strides: Any, type_str: str, node_id: int,
            where: str, sparse: SparseTensors | None = None, *,
            stand_ins: bool = False) -> Value:
    """A recorded tensor: ``[tensor_id, storage_id, offset, numel, itemsize, device]``."""
    if not (isinstance(value, list) and len(value) >= 6):
        raise TraceError("expected a tensor record [id, storage, offset, numel, itemsize, "
                         "device]", node_id=node_id, field=where)
    tid, sid, offset, _numel, _itemsize, device = value[:6]
    for v, name in ((tid, "id"), (sid, "storage"), (offset, "offset")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise TraceError(f"tensor {name} is not a non-negative integer", node_id=node_id,
                             field=where)
    if offset > INT64_MAX:
        raise Unsupported(f"{where}: storage offset is outside 64 bits")
    if not isinstance(device, str):
        raise TraceError("tensor device is not a string", node_id=node_id, field=where)
    if type_str.startswith("Tensor(nullptr"):
        return Literal(None)  # an undefined tensor
    known_sparse = sparse.at(tid, node_id) if device == "" and sparse else None
    mkldnn = device == "" and sparse is not None and tid in sparse.mkldnn
    if device == "" and known_sparse is None and not mkldnn:
        # A defined tensor with no storage: a functorch/vmap wrapper (transformers
        # builds attention masks under vmap) or a tensor subclass. The record holds no
        # device or values to rebuild it from, and None in its place crashes the op;
        # ``stand_ins``: a stand-in of the recorded shape (see _on_stand_ins).
        found = _stand_in(shape, strides, type_str, node_id, where) if stand_ins else None
        if found is None:
            raise StoragelessTensor(
                f"{where}: a tensor without storage (vmap or a tensor subclass)")
        return found
    dtype = dtype_from_type_string(type_str)
    if dtype is None:
        raise Unsupported(f"tensor element type {type_str[:40]!r} is not supported")
    dims = _int_list(shape if shape is not None else [], node_id, f"{where}.shape", signed=False)
    if known_sparse is not None:
        return TensorValue(trace_id=tid, storage_id=sid, meta=known_sparse.meta(dims, dtype))
    if mkldnn:  # opaque, on the host: its recorded strides mean nothing (oprules/mkldnn.py)
        meta = TensorMeta(shape=dims, strides=contiguous_strides(dims), offset=0, dtype=dtype,
                          device="cpu", mkldnn=True)
        return TensorValue(trace_id=tid, storage_id=sid, meta=meta)
    if strides is None or strides == [] and dims:
        stride_t = contiguous_strides(dims)
    else:
        stride_t = _int_list(strides, node_id, f"{where}.strides", signed=True)
        if len(stride_t) != len(dims):
            raise TraceError(f"{len(dims)} sizes but {len(stride_t)} strides",
                             node_id=node_id, field=f"{where}.strides")
    meta = _shared_meta(dims, stride_t, offset, dtype, _device_kind(device, node_id, where))
    return TensorValue(trace_id=tid, storage_id=sid, meta=meta)


def _stand_in(shape: Any, strides: Any, type_str: str, node_id: int, where: str
              ) -> StandInTensor | None:
    """A stand-in for a tensor recorded without storage, from its recorded shape,
    strides and dtype (its device is the benchmark's); None where they do not make
    one."""
    dtype = dtype_from_type_string(type_str)
    if dtype is None or not isinstance(shape, list):
        return None
    try:
        dims = _int_list(shape, node_id, f"{where}.shape", signed=False)
        stride_t = _int_list(strides, node_id, f"{where}.strides", signed=True) \
            if isinstance(strides, list) and len(strides) == len(dims) \
            else contiguous_strides(dims)
    except (TraceError, Unsupported):
        return None
    if any(stride < 0 for stride in stride_t):
        stride_t = contiguous_strides(dims)
    return StandInTensor(_shared_meta(dims, stride_t, 0, dtype, ""))


@lru_cache(maxsize=1 << 16)
def _shared_meta(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, dtype: str,
                 device: str) -> TensorMeta:
    """One frozen TensorMeta per distinct view: traces repeat the same few shapes."""
    return TensorMeta(shape=shape, strides=strides, offset=offset, dtype=dtype, device=device)
