"""Public calls: call each op the way a model does, where that is provably the same op.

A call through ``torch.ops.aten.add.Tensor`` boxes its arguments against the schema and
costs about twice the host time of ``torch.add``, whose generated C++ binding calls the
operator unboxed. A benchmark that replays thousands of small ops through ``torch.ops``
would spend more host time per op than the model it came from. So where a public
callable (``torch.add``, ``torch.Tensor.add_``, ``torch.nn.functional.gelu``,
``torch.linalg.vector_norm``) exists, this pass *probes* it: it calls the candidate once
with arguments of the same Python types the generated file passes but nothing to
compute (empty tensors, zero numbers), under the profiler, and keeps it only if the
call dispatched exactly the recorded overload and nothing else at the top level.
(Python's argument parser picks the overload from the argument types, and some
overloads are never bound: ``torch.add(x, 2)`` dispatches ``aten::add.Tensor``, not
``aten::add.Scalar``.) Everything else keeps its ``torch.ops`` call. Probes are
deduplicated by (operator, argument kinds), so a trace costs one probe per distinct
call form, each on empty tensors (see :func:`probe_value`), all in a forked child
process where the platform allows (see :func:`_run_probes`).

Only callables that are C++ bindings of operators are candidates (never a Python
function of the same name), checked by identity against torch's binding modules; the
safety check of generated files uses the same test (:func:`public_chain_ok`).
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import select
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import lru_cache
from typing import Any

import torch
from torch._C._profiler import _ExperimentalConfig, _RecordFunctionFast
from torch.autograd.profiler import profile

from mystique_gen import oprules
from mystique_gen.ir import (
    Arg,
    DeviceValue,
    FreshStorage,
    Literal,
    Op,
    StandInTensor,
    TensorValue,
    TorchConstant,
    Value,
    iter_leaves,
)

# A probe: a public callable's dotted path, the op it may call, the arguments left out.
Probe = tuple[str, Op, tuple[str, ...]]

_PROBE_MARK = "mystique_probe_"
PROBE_TIMEOUT_S = 60.0  # a probe child silent this long is stopped (its probe keeps torch.ops)
MAX_PROBE_CHILDREN = 16  # children started for one trace, each after one crashing probe


def choose_public_calls(ops: list[Op]) -> None:
    """Set ``op.public_call`` to a public callable's dotted path where probing proves it
    dispatches exactly the op's recorded overload, and ``op.public_omits`` to the
    arguments it leaves out, recorded at their schema's default (`omittable`).

    Left out where the probe saw the binding dispatch the schema's default for each
    (the profiler's argument values): every argument Python's parser reads costs host
    time, ``torch.add(x, y, alpha=1)`` 1.5 us against 1.2 us without ``alpha``. And
    where the binding takes them only so: ``Tensor.to`` takes ``memory_format`` only by
    keyword, which ``aten::to.dtype``'s schema places fourth, and through ``torch.ops``
    every tensor cast cost 1.2 us more host time."""
    forms: dict[tuple[object, ...], list[Op]] = {}
    for op in ops:
        if _probe_worthy(op):
            forms.setdefault(call_form(op), []).append(op)
    if not forms:
        return
    probes = [(key, chain, omits, group[0]) for key, group in forms.items()
              for omits in dict.fromkeys(((), omittable(group[0])))
              for chain in candidates(group[0].signature.name)]
    dispatched = _run_probes([(chain, op, omits) for _key, chain, omits, op in probes])
    # Per form, the best call: without its defaults where the probe saw the binding
    # pass the schema's (0), else with every argument (1), else without its defaults
    # unseen (2: this torch's profiler shows no argument values); the earlier
    # candidate among equals.
    chosen: dict[tuple[object, ...], tuple[int, str, tuple[str, ...]]] = {}
    for (key, chain, omits, op), names in zip(probes, dispatched, strict=True):
        full = op.signature.full_name
        rank = 0 if omits and names == [full] else 1 if names == [full] else \
            2 if omits and names == [full, _UNSEEN_DEFAULTS] else None
        if rank is not None and (key not in chosen or rank < chosen[key][0]):
            chosen[key] = rank, chain, omits
    for key, group in forms.items():
        _rank, chain, omits = chosen.get(key, (None, None, ()))
        for op in group:
            op.public_call, op.public_omits = chain, omits


def candidates(name: str) -> list[str]:
    """Public callables that may bind aten operator ``name``, in order of preference."""
    found = []
    for public, _binding, prefix in oprules.PUBLIC_MODULES:
        if name.startswith(prefix):
            chain = f"{public}.{name[len(prefix):]}"
            if public_chain_ok(chain):
                found.append(chain)
    if public_chain_ok(f"torch.Tensor.{name}"):
        found.append(f"torch.Tensor.{name}")
    return found


@lru_cache(maxsize=8192)
def public_chain_ok(chain: str) -> bool:
    """Whether ``chain`` (``torch.add``, ``torch.Tensor.add_``) is a public name of a C++
    operator binding of the installed torch: identical to the attribute of the same
    name in the binding module, so never a Python function (``torch.norm``) nor
    anything that is not an operator (``torch.load``)."""
    module_path, _, attr = chain.rpartition(".")
    if not attr.isidentifier() or attr.startswith("__"):
        return False
    if module_path == "torch.Tensor":
        bound = getattr(torch._C.TensorBase, attr, None)
        return bound is not None and type(bound).__name__ == "method_descriptor" and (
            getattr(torch.Tensor, attr, None) is bound)
    for public, binding, prefix in oprules.PUBLIC_MODULES:
        if module_path == public:
            bound = getattr(getattr(torch._C, binding), prefix + attr, None)
            return (bound is not None and type(bound).__name__ == "builtin_function_or_method"
                    and getattr(_module(public), attr, None) is bound)
    return False


def _module(path: str) -> Any:
    return importlib.import_module(path)


def _probe_worthy(op: Op) -> bool:
    """aten ops the harness calls directly that take or make a tensor: ops without
    either (``aten::_print``) may act on the process rather than on tensors, and are
    never called at generation time."""
    if op.guard or op.comm is not None or op.signature.namespace != "aten":
        return False
    if any("Tensor" in r for r in op.signature.returns):
        return True
    return any(isinstance(v, (TensorValue, DeviceValue)) for arg in op.args
               for v in iter_leaves(arg.value))


def call_form(op: Op) -> tuple[object, ...]:
    """What Python's argument parser sees of a call: the operator and each argument's
    Python type (tensors by whether they are 0-d, which a Scalar parameter accepts),
    and last the arguments a call may leave out (`omittable`)."""
    return (op.signature.full_name, *(_kind(arg.value) for arg in op.args), omittable(op))


def omittable(op: Op) -> tuple[str, ...]:
    """The op's arguments a call may leave out, their recorded value being the
    schema's default (a plain Python value of the same type): keyword-only ones
    wherever they are, positional ones from the end back to the first that is not."""
    def at_default(arg: Arg) -> bool:
        return arg.spec.has_scalar_default and isinstance(arg.value, Literal) \
            and _is_default(arg.value.value, arg)

    positional = [arg for arg in op.args if not arg.spec.kwarg_only]
    trailing: list[str] = []
    for arg in reversed(positional):
        if not at_default(arg):
            break
        trailing.append(arg.spec.name)
    keywords = [arg.spec.name for arg in op.args if arg.spec.kwarg_only and at_default(arg)]
    return tuple(sorted({*trailing, *keywords}))


def _is_default(value: object, arg: Arg) -> bool:
    """Whether a Python value is ``arg``'s schema default, of the same type too (``1``
    is not ``1.0``, nor ``True``)."""
    default = arg.spec.scalar_default
    return type(value) is type(default) and value == default


def _kind(value: Value) -> object:
    if isinstance(value, (TensorValue, StandInTensor)):
        return "tensor0" if not value.meta.shape else "tensor"
    if isinstance(value, Literal):
        return type(value.value).__name__
    if isinstance(value, TorchConstant):
        return ("constant", value.name)
    if isinstance(value, DeviceValue):
        return "device"
    if isinstance(value, FreshStorage):
        return "storage"
    return ("list", tuple(sorted({repr(_kind(v)) for v in value.items})))


def probe_value(value: Value) -> Any:
    """The argument with the same Python type as in the generated call but nothing to
    compute: tensors empty (their rank and dtype kept), numbers zero, devices the CPU.
    The parser chooses an overload from types alone, and a probe then allocates
    nothing whatever sizes the trace declares."""
    if isinstance(value, (TensorValue, StandInTensor)):
        shape = (0,) * len(value.meta.shape)  # a 0-d tensor keeps its one element
        return torch.empty(shape, dtype=getattr(torch, value.meta.dtype))
    if isinstance(value, Literal):
        v = value.value
        return type(v)(0) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
    if isinstance(value, TorchConstant):
        return getattr(torch, value.name)
    if isinstance(value, DeviceValue):
        return torch.device("cpu")
    if isinstance(value, FreshStorage):
        return torch.UntypedStorage(0)
    items = value.items
    if any(isinstance(v, TensorValue) for v in items):
        items = items[:2]  # the parser reads the items' types; an optimizer's 150 are slow
    return [probe_value(v) for v in items]


def _call(chain: str, op: Op, omits: tuple[str, ...] = ()) -> Callable[[], object]:
    module_path, _, attr = chain.rpartition(".")
    target = getattr(torch.Tensor if module_path == "torch.Tensor" else _module(module_path),
                     attr)
    args, kwargs = [], {}
    for arg in op.args:
        if arg.spec.name in omits:
            continue
        value = probe_value(arg.value)
        if arg.spec.kwarg_only:
            kwargs[arg.spec.name] = value
        else:
            args.append(value)
    return lambda: target(*args, **kwargs)


# Runs probes in this process: (the probes, called with each probe's index as it starts
# and with their count after the last) -> per probe, names or None.
ProbeRunner = Callable[[list[Any], Callable[[int], object] | None], list[list[str] | None]]


def _run_probes(probes: list[Probe]) -> list[list[str] | None]:
    """For each (callable, op, arguments left out), the overloads the call dispatched at
    the top level (``aten::add.Tensor``; ``.default`` spelled out), or None where it
    could not be made (`run_probes`)."""
    return run_probes(probes, _probe_here)


def run_probes(probes: list[Any], here: ProbeRunner) -> list[list[str] | None]:
    """``here(probes)``'s names per probe, None for a probe that could not be made.

    Where the platform forks, the probes run in a child process: a kernel that crashes
    on the empty arguments (``_weight_norm_interface`` divides by a zero size and
    raises SIGFPE) takes only the child down, and the torch code the kernels page in
    (about 20 MiB for GPT-2's ops) stays out of the generator's memory. The child says
    which probe it starts, so a crash or a hang costs that probe alone: the others run
    again in a new child."""
    if sys.platform != "linux" or not hasattr(os, "fork"):
        with _quiet_stderr():
            return here(probes, None)
    results: list[list[str] | None] = [None] * len(probes)
    pending = list(range(len(probes)))
    for _attempt in range(MAX_PROBE_CHILDREN):
        report, started = _probe_in_child([probes[i] for i in pending], here)
        if report is not None:
            for index, dispatched in zip(pending, report, strict=True):
                results[index] = dispatched
            break
        if started is None:  # it died outside any probe: nothing to leave out
            break
        del pending[started]  # that probe keeps its torch.ops call
        if not pending:
            break
    return results


def _probe_in_child(probes: list[Any], here: ProbeRunner
                    ) -> tuple[list[list[str] | None] | None, int | None]:
    """Run ``probes`` in a forked child: (its report, None), or (None, the index of the
    probe it was in when it crashed or hung, if it was in one)."""
    sys.stdout.flush()
    sys.stderr.flush()  # the child must not flush (or lock) the parent's buffers
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: probe, report, leave without the parent's exit handlers
        status = 1
        try:
            os.close(read_fd)
            faulthandler.disable()  # a crash dump would go to the parent's stderr
            quiet = os.open(os.devnull, os.O_WRONLY)  # its logs, or a crash dump, are noise
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            report = here(probes, lambda i: _send(write_fd, b"S%d\n" % i))
            _send(write_fd, b"R" + json.dumps(report).encode() + b"\n")
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    lines, finished = _read_child(read_fd, pid)
    started = None  # the probe the child last started; len(probes) once past them all
    for line in lines:
        if line[:1] == b"S" and line[1:].isdigit():
            started = int(line[1:])
    if started is not None and started >= len(probes):
        started = None
    report = lines[-1][1:] if finished and lines and lines[-1][:1] == b"R" else None
    try:
        result = json.loads(report) if report is not None else None
    except ValueError:
        result = None
    if not (isinstance(result, list) and len(result) == len(probes) and all(
            r is None or (isinstance(r, list) and all(isinstance(x, str) for x in r))
            for r in result)):
        return None, started
    return result, None


def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_child(fd: int, pid: int) -> tuple[list[bytes], bool]:
    """The child's lines, and whether it exited cleanly, never silent for longer than
    PROBE_TIMEOUT_S (it writes a line as each probe starts)."""
    chunks = []
    timed_out = False
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], PROBE_TIMEOUT_S)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                timed_out = True
                break
            chunk = pipe.read(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    clean = not timed_out and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    return b"".join(chunks).splitlines(), clean


def _probe_here(probes: list[Probe],
                on_start: Callable[[int], object] | None = None) -> list[list[str] | None]:
    """The probes, in this process; ``on_start(i)`` before probe ``i`` runs, and
    ``on_start(len(probes))`` after the last.

    The profiler records an op when it is entered, so a kernel that then refuses the
    empty arguments (a view to a size they do not have) still shows which overload the
    parser chose. A profiler already running (generation inside a profiled program)
    leaves every op on torch.ops.
    """
    calls: list[Callable[[], object] | None] = []
    for chain, op, omits in probes:
        try:
            calls.append(_call(chain, op, omits))
        except Exception:  # noqa: BLE001 - a dtype this build cannot hold: no probe
            calls.append(None)
    config = _ExperimentalConfig(capture_overload_names=True)
    # (record_shapes: the values of the arguments each op was given)
    profiler = profile(use_cpu=True, record_shapes=True, experimental_config=config)
    try:
        profiler.__enter__()
    except RuntimeError:
        return [None] * len(calls)
    try:
        with torch.no_grad():
            for i, call in enumerate(calls):
                if call is None:
                    continue
                if on_start is not None:
                    on_start(i)
                # A kernel refusing the empty arguments is expected: see above.
                with _RecordFunctionFast(f"{_PROBE_MARK}{i}"), suppress(Exception):
                    call()
            if on_start is not None:
                on_start(len(calls))  # past every probe
    finally:
        profiler.__exit__(None, None, None)
    result: list[list[str] | None] = [None if c is None else [] for c in calls]
    for event in profiler.function_events:
        parent = event.cpu_parent
        if parent is None or not parent.name.startswith(_PROBE_MARK):
            continue
        index = int(parent.name[len(_PROBE_MARK):])
        entries = result[index]
        if entries is not None:
            overload = event.overload_name or "default"
            entries.append(f"{event.name}.{overload}")
            _, op, omits = probes[index]
            if omits and len(entries) == 1:
                entries.extend(_defaults_seen(op, omits, event))
    return result


# A probe's mark where the profiler showed no argument values to check the defaults by.
_UNSEEN_DEFAULTS = "?defaults"


def _defaults_seen(op: Op, omits: tuple[str, ...], event: Any) -> list[str]:
    """Nothing where the op dispatched with the schema's default in the place of every
    argument the call left out; a mark that says it did not (which fails the probe),
    or that the profiler does not say (`_UNSEEN_DEFAULTS`)."""
    values = getattr(event, "concrete_inputs", None)
    if not values or len(values) != len(op.args):
        return [_UNSEEN_DEFAULTS]
    for arg, value in zip(op.args, values, strict=True):
        if arg.spec.name in omits and not _is_default(value, arg):
            return [f"!{arg.spec.name}={value!r}"]
    return []


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """The profiler logs its start and stop on the process's stderr; a generator's
    stderr is for its own messages (a forked child has its stderr on /dev/null)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
