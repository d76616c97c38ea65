"""Load a PyTorch execution trace (ET) into validated, normalised node records.

Two layouts exist in the wild and both are read here, keyed on the fields that are
present rather than on the declared version string:

* flat (schema 1.0.1): ``parent``, ``op_schema``, ``inputs``, ``input_shapes``,
  ``input_types`` and the ids as top-level keys of each node;
* nested (1.0.2 and later, "chakra"): ``ctrl_deps``, ``inputs``/``outputs`` objects with
  ``values``/``shapes``/``types``/``strides`` and an ``attrs`` list.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from sys import intern
from typing import Any

from mystique_gen import progress as _progress
from mystique_gen.constants import DEVICE_CATEGORIES
from mystique_gen.errors import TraceError
from mystique_gen.ir.dist import ProcessGroupSpec
from mystique_gen.sources.jsonstream import HashingReader, JsonStream

KNOWN_SCHEMA_PREFIXES = ("1.0.1", "1.0.2", "1.0.3", "1.0.4", "1.1.0", "1.1.1")


@dataclass(frozen=True, slots=True)  # slots: a million-node trace holds millions
class RawArg:
    """One recorded input or output: its value and the metadata recorded beside it."""

    value: Any
    shape: Any
    type: str
    strides: Any | None  # None where the trace predates strides


def _is_record(value: list) -> bool:
    """Whether a list of a recorded value is one tensor's record, not a list of them."""
    return len(value) >= 6 and isinstance(value[1], int) and isinstance(value[5], str)


def tensor_records(raw: RawArg) -> list[list]:
    """The tensor records of one recorded argument, nested lists included: each
    ``[tensor id, storage id, offset, numel, itemsize, device]``.

    A list, built without nested generators: passes ask this of every argument of
    every node several times, and most arguments are one record or none."""
    value = raw.value
    if "Tensor" not in raw.type or not isinstance(value, list):
        return []
    if _is_record(value):
        return [value]
    found: list[list] = []
    _collect_records(value, found)
    return found


def _collect_records(value: list, found: list[list]) -> None:
    """Append the records in ``value`` (a list of records or of lists), in order."""
    for item in value:
        if isinstance(item, list):
            if _is_record(item):
                found.append(item)
            else:
                _collect_records(item, found)


def tensor_records_with_ranks(raw: RawArg) -> list[tuple[list, int | None]]:
    """:func:`tensor_records`, each with its number of dimensions from the argument's
    parallel ``shape`` (None where the two do not line up)."""
    found: list[tuple[list, int | None]] = []
    if "Tensor" in raw.type:
        _collect_ranked(raw.value, raw.shape, found)
    return found


def _collect_ranked(value: object, shape: object, found: list[tuple[list, int | None]]
                    ) -> None:
    if not isinstance(value, list):
        return
    if _is_record(value):
        dims = isinstance(shape, list) and all(isinstance(d, int) for d in shape)
        found.append((value, len(shape) if dims else None))  # type: ignore[arg-type]
        return
    shapes = shape if isinstance(shape, list) and len(shape) == len(value) \
        else [None] * len(value)
    for item, item_shape in zip(value, shapes, strict=True):
        _collect_ranked(item, item_shape, found)


def raw_storage_ids(raw: RawArg) -> Iterator[int]:
    """Storage ids of the tensors in one recorded argument (nested lists included)."""
    return (record[1] for record in tensor_records(raw))


# Top-level node keys of an ET+ (Chakra trace_link): Kineto times, and for device
# activity its category, phase and stream.
LINKED_KEYS = ("cat", "ph", "ts", "inclusive_dur", "exclusive_dur", "stream")


@dataclass(slots=True)
class RawNode:
    id: int
    name: str
    parent: int
    tid: int
    rf_id: int | None
    op_schema: str
    inputs: list[RawArg]
    outputs: list[RawArg]
    attrs: dict[str, Any] = field(default_factory=dict)
    # Position in the file: torch's observer writes a node when it ends, so on one host
    # thread this is the order in which its ops ended (-1: not read from a file).
    written: int = -1


@dataclass
class RawTrace:
    name: str
    sha256: str
    schema: str
    nodes: list[RawNode]  # sorted by id
    metadata: dict[str, Any]
    # For a rank set: every rank's process groups, as one job created them (each rank's
    # trace lists only the groups it is a member of). Set by the driver; None: the
    # trace's own list (passes/ranks.py ``read_groups``).
    job_groups: list[ProcessGroupSpec] | None = None
    # passes/select.py repairs the observer's nesting in place, once.
    nesting_repaired: bool = False
    # passes/select.py, found on the first selection, before covered arguments go: ops
    # replayed as their children (their inner results are read by later ops), and the
    # host threads a communication backend ran collectives' work on.
    descended: set[int] | None = None
    backend_threads: set[int] | None = None
    # The nodes Dynamo ran compiling a frame in the step (passes/select.py
    # compile_time_nodes), found with them.
    compiling: dict[int, int | None] | None = None
    # passes/select.py, once per trace (each reads every node's arguments): the ops
    # dispatched to a tensor subclass or a vmap level, and the sparse and MKLDNN
    # tensors (a SparseTensors; typed loosely: sources import no pass).
    subclass_dispatched: set[int] | None = None
    storageless: Any = None
    # The file ended inside its node list, after this many whole nodes (None: whole).
    cut: int | None = None
    # Device activity (kernels, copies) that Chakra's trace_link linked into the trace,
    # below the ops that launched them; not ops (sources/kineto.py linked_kineto).
    device_nodes: list[RawNode] = field(default_factory=list)

    @property
    def linked_timing(self) -> bool:
        """An ET+: its ops carry the Kineto times trace_link put on them."""
        return any("ts" in n.attrs and "inclusive_dur" in n.attrs for n in self.nodes)

    @property
    def records_strides(self) -> bool:
        """Whether the observer wrote tensors' strides (torch 2.4 and later): without
        them, every tensor is taken to be row-major, which a kernel's result may not
        have been where the trace was made. A trace without tensor arguments (a
        compiled step whose kernels it does not hold) has no strides to lack."""
        tensors = False
        for arg in (arg for n in self.nodes for arg in n.inputs):
            if arg.strides is not None:
                return True
            tensors = tensors or "Tensor" in arg.type
        return not tensors

    @property
    def node_count(self) -> int:
        return len(self.nodes)


def read_json(path: Path) -> Any:
    """Parse ``.json`` or ``.json.gz``; every failure becomes one clean TraceError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read {path.name}: {exc.strerror or exc}") from None
    return parse_json_bytes(data, path.name)


def parse_json_bytes(data: bytes, name: str) -> Any:
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{name}: corrupt gzip data ({exc})") from None
    try:
        return json.loads(data)
    except UnicodeDecodeError:
        raise TraceError(f"{name}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        if exc.pos >= len(data.rstrip()) - 1:
            raise TraceError(f"{name}: truncated JSON (ends at byte {exc.pos})") from None
        raise TraceError(f"{name}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise TraceError(f"{name}: JSON nested too deeply") from None


def load_trace(path: str | Path,
               progress: Callable[[int], None] | None = None) -> RawTrace:
    """Read a trace incrementally (see :mod:`stream`): each node becomes a compact
    :class:`RawNode` as soon as it is decoded, so the whole document never exists as
    Python objects. ``progress`` is called with the bytes read so far."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"no such trace file: {path.name}")
    nodes: list[RawNode] = []
    try:
        with open(path, "rb") as f:
            reader = HashingReader(f)
            _progress.phase(f"reading {path.name[:24]}", os.fstat(f.fileno()).st_size)
            stream = JsonStream(reader, path.name, progress or _progress.advance)
            doc, streamed = stream.document(lambda obj, i: nodes.append(_node(obj, i)))
            reader.drain()
    except OSError as exc:
        raise TraceError(f"cannot read {path.name}: {exc.strerror or exc}") from None
    _progress.phase("compiling")
    sha256 = reader.sha256.hexdigest()
    if not streamed:
        return trace_from_document(doc, name=path.name, sha256=sha256)
    trace = _assemble(doc, nodes, path.name, sha256)
    if stream.cut is not None:
        trace.cut = stream.cut
        warnings.warn(unfinished_note(trace), stacklevel=2)
    return trace


def unfinished_note(trace: RawTrace) -> str:
    """What an execution trace whose file ends inside its node list holds."""
    return (f"{trace.name} ends inside its node list (the process ended before the ET "
            "observer was unregistered, which finishes the file, or the file was cut): "
            f"its {trace.cut} whole nodes are read; ops still running when it ended, "
            "and whatever the observer had not yet written, are not in it")


def trace_from_document(doc: Any, *, name: str, sha256: str) -> RawTrace:
    if not isinstance(doc, dict):
        raise TraceError(f"{name}: top level is {type(doc).__name__}, expected an object")
    if "nodes" not in doc:
        if "traceEvents" in doc:  # the profiler's own trace, given where an ET goes
            raise TraceError(
                f"{name}: a Kineto (torch.profiler) trace, not an execution trace: it "
                "times ops but records no tensor identities, so the ops' data flow "
                "cannot be rebuilt from it. Record an execution trace of the same step "
                "(ExecutionTraceObserver, or `mystique-gen capture`) and give this file "
                "beside it: --kineto (compare: --kineto-original or --kineto-replay; "
                "diff: --kineto-a or --kineto-b)")
        raise TraceError(f"{name}: no 'nodes' field; is this an execution trace?")
    nodes = doc["nodes"]
    if not isinstance(nodes, list):
        raise TraceError(f"{name}: 'nodes' is {type(nodes).__name__}, expected a list")
    return _assemble(doc, [_node(n, i) for i, n in enumerate(nodes)], name, sha256)


def _assemble(doc: dict[str, Any], parsed: list[RawNode], name: str, sha256: str) -> RawTrace:
    """Check the document's header fields and order the nodes by id."""
    schema = doc.get("schema", "")
    if not isinstance(schema, str):
        raise TraceError(f"{name}: 'schema' is not a string")
    if not schema.startswith(KNOWN_SCHEMA_PREFIXES):
        warnings.warn(
            f"{name}: unknown schema version {schema!r}; reading the fields that are present",
            stacklevel=2,
        )
    parsed.sort(key=lambda n: n.id)
    repeated = [a for a, b in zip(parsed, parsed[1:], strict=False) if a.id == b.id]
    if repeated:
        raise _duplicate_ids(parsed, repeated)
    metadata = {k: v for k, v in doc.items() if k != "nodes" and isinstance(v, (str, int, float))}
    # Device activity an ET+ added: each node repeats the schema and arguments of the
    # op that launched it, so as a node it would replay that op again.
    device = [n for n in parsed if n.attrs.get("cat") in DEVICE_CATEGORIES]
    if device:
        parsed = [n for n in parsed if n.attrs.get("cat") not in DEVICE_CATEGORIES]
    return RawTrace(name=name, sha256=sha256, schema=schema, nodes=parsed, metadata=metadata,
                    device_nodes=device)


def _duplicate_ids(parsed: list[RawNode], repeated: list[RawNode]) -> TraceError:
    """Ids that repeat. Many of them, on other ops, are the mark of several processes'
    ops in one file: a process forked while the observer recorded (a DataLoader
    worker started inside the recorded span: ``for batch in loader`` inside
    ``profile(execution_trace_observer=...)``) inherits the observer and the open file
    and writes its own ops there, numbered from the same ids as the parent's. Neither
    the ids nor any field tell the processes apart, so the trace cannot be read; the
    error says how to record one that can be (it said only "duplicate node id")."""
    ids = {n.id for n in repeated}
    names: dict[int, set[str]] = {}
    for n in parsed:
        if n.id in ids:
            names.setdefault(n.id, set()).add(n.name)
    differ = [i for i in sorted(ids) if len(names[i]) > 1]
    if len(differ) < 2:
        return TraceError("duplicate node id", node_id=repeated[0].id, field="id")
    return TraceError(
        f"duplicate node id ({' and '.join(sorted(names[differ[0]])[:3])}; "
        f"{len(differ)} ids repeat on other ops): the "
        "trace holds several processes' ops, as when a process forks while the ET "
        "observer records (a DataLoader with num_workers > 0 iterated inside the "
        "recorded span: each worker writes its own ops into the same file); create "
        "the loader's iterator before the observer starts (it = iter(loader)) or "
        "record with num_workers=0", node_id=differ[0], field="id")


def _int(value: Any, node_id: int | None, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"expected an integer, got {_describe(value)}", node_id=node_id,
                         field=field_name)
    return value


def _describe(value: Any) -> str:
    text = json.dumps(value)[:40] if _jsonable(value) else type(value).__name__
    return f"{type(value).__name__} {text}"


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _node(obj: Any, index: int) -> RawNode:
    if not isinstance(obj, dict):
        raise TraceError(f"nodes[{index}] is {type(obj).__name__}, expected an object")
    if "id" not in obj:
        raise TraceError(f"nodes[{index}] has no 'id'")
    node_id = _int(obj["id"], None, f"nodes[{index}].id")
    name = obj.get("name")
    if not isinstance(name, str):
        raise TraceError("missing or non-string name", node_id=node_id, field="name")
    name = intern(name)

    attrs: dict[str, Any] = {}
    if "attrs" in obj:
        if not isinstance(obj["attrs"], list):
            raise TraceError("expected a list", node_id=node_id, field="attrs")
        for attr in obj["attrs"]:
            if not isinstance(attr, dict) or not isinstance(attr.get("name"), str):
                raise TraceError("attribute without a name", node_id=node_id, field="attrs")
            value = attr.get("value")
            # Interned: every node repeats the same names and many of the same strings.
            attrs[intern(attr["name"])] = intern(value) if type(value) is str else value
    # Flat layout: the same facts are top-level keys.
    for key in ("rf_id", "tid", "fw_tid", "fw_parent", "seq_id", "scope", "op_schema",
                "kernel_backend", "kernel_file", "tensor_range"):
        if key in obj and key not in attrs:
            attrs[key] = obj[key]
    # Chakra's trace_link (an "ET+") adds each op's Kineto times, and device activity
    # nodes with their category and stream, as top-level keys.
    for key in LINKED_KEYS:
        if key in obj and key not in attrs:
            attrs[key] = obj[key]

    if "ctrl_deps" in obj:
        parent = _int(obj["ctrl_deps"], node_id, "ctrl_deps")
    elif "parent" in obj:
        parent = _int(obj["parent"], node_id, "parent")
    else:
        parent = 0

    if isinstance(obj.get("inputs"), dict) or isinstance(obj.get("outputs"), dict):
        inputs = _nested_args(obj.get("inputs", {}), node_id, "inputs")
        outputs = _nested_args(obj.get("outputs", {}), node_id, "outputs")
    else:
        inputs = _flat_args(obj, node_id, "input")
        outputs = _flat_args(obj, node_id, "output")

    op_schema = attrs.get("op_schema", "")
    if op_schema is None:
        op_schema = ""
    if not isinstance(op_schema, str):
        raise TraceError("expected a string", node_id=node_id, field="op_schema")
    tid = attrs.get("tid", 0)
    tid = _int(tid, node_id, "tid") if tid is not None else 0
    rf_id = attrs.get("rf_id")
    rf_id = _int(rf_id, node_id, "rf_id") if rf_id is not None else None
    return RawNode(id=node_id, name=name, parent=parent, tid=tid, rf_id=rf_id,
                   op_schema=op_schema, inputs=inputs, outputs=outputs, attrs=attrs,
                   written=index)


def _nested_args(obj: Any, node_id: int, field_name: str) -> list[RawArg]:
    if not isinstance(obj, dict):
        raise TraceError("expected an object", node_id=node_id, field=field_name)
    values = obj.get("values", [])
    shapes = obj.get("shapes", [])
    types = obj.get("types", [])
    strides = obj.get("strides")
    return _zip_args(values, shapes, types, strides, node_id, field_name)


def _flat_args(obj: dict[str, Any], node_id: int, prefix: str) -> list[RawArg]:
    values = obj.get(f"{prefix}s", [])
    shapes = obj.get(f"{prefix}_shapes", [])
    types = obj.get(f"{prefix}_types", [])
    strides = obj.get(f"{prefix}_strides")
    return _zip_args(values, shapes, types, strides, node_id, f"{prefix}s")


def _zip_args(values: Any, shapes: Any, types: Any, strides: Any, node_id: int,
              field_name: str) -> list[RawArg]:
    for part, what in ((values, "values"), (shapes, "shapes"), (types, "types")):
        if not isinstance(part, list):
            raise TraceError("expected a list", node_id=node_id, field=f"{field_name}.{what}")
    if strides is not None and not isinstance(strides, list):
        raise TraceError("expected a list", node_id=node_id, field=f"{field_name}.strides")
    if len(types) != len(values):
        raise TraceError(f"{len(values)} values but {len(types)} types", node_id=node_id,
                         field=f"{field_name}.types")
    # Every argument of every node passes here: lengths are taken once and RawArg is
    # built positionally (a frozen dataclass's keywords cost a third more).
    args = []
    n_shapes = len(shapes)
    n_strides = len(strides) if strides is not None else 0
    for i, (value, type_str) in enumerate(zip(values, types, strict=True)):
        if not isinstance(type_str, str):
            raise TraceError("type is not a string", node_id=node_id,
                             field=f"{field_name}.types[{i}]")
        shape = _shared(shapes[i]) if i < n_shapes else EMPTY
        stride = _shared(strides[i]) if i < n_strides else None
        if type(value) is list and len(value) == 6 and type(value[5]) is str:
            value[5] = intern(value[5])  # a tensor record's device: "cuda:0"
        args.append(RawArg(value, shape, intern(type_str), stride))
    return args


class SharedList(list):
    """An immutable list, shared by every record that holds an equal one.

    Most recorded shapes and strides are ``[]`` (scalars) or ``[[], []]`` (int lists):
    one object for each instead of one per argument saves a fifth of a loaded trace.
    Copies are plain lists."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a shared trace record is read-only; copy it to change it")

    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(item, memo) for item in self]

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


EMPTY = SharedList()
_EMPTY_ROWS: dict[int, SharedList] = {}


def _shared(value: Any) -> Any:
    """``[]`` and ``[[], ..., []]`` as shared read-only lists; anything else as is."""
    if type(value) is not list:
        return value
    if not value:
        return EMPTY
    if type(value[0]) is list and not any(value) and all(type(v) is list for v in value):
        rows = _EMPTY_ROWS.get(len(value))
        if rows is None:
            rows = _EMPTY_ROWS[len(value)] = SharedList([EMPTY] * len(value))
        return rows
    return value
