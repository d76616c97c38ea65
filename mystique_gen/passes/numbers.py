"""Numbers the trace records imperfectly: wrapped Python numbers replay as Python
numbers where the recorded dtypes show it, and an eps written as 0.0 replays positive
(:func:`restore_epsilons`).

``x * 0.5`` or ``mask / 2.0`` reach the dispatcher as a ``Tensor`` argument: Python's
argument parser wraps the number in a 0-d CPU tensor (float64, int64, bool or
complex128) flagged as a *wrapped number*. The execution trace records it as any
other 0-d tensor, but type promotion treats the two apart: a wrapped float times an
int64 tensor is float32 (the default dtype), a 0-d float64 *tensor* times it is
float64. Replayed as a tensor, such an argument promotes the result, and every op
downstream then runs in another dtype (a mixture-of-experts router's jitter on an int
mask made the next matmul fail on float64 against float32).

So an input is replayed as a number where all of these hold: it is a 0-d CPU float64
tensor, no recorded op made or wrote its storage before, every dimensioned tensor
argument is boolean or integral, and the op returned a floating tensor of another
dtype, which a 0-d float64 tensor argument could not have produced; or, where every
tensor argument is 0-d, the op returned the floating dtype (not float64) of another
0-d tensor it read (a VAE's KL term times -0.5: replayed as a tensor, the loss became
float64 and the backward refused it), or a floating dtype (not float64) beside only
integral or boolean 0-d tensors (a box count times 0.5). (Wrapped integers
and booleans promote as 0-d tensors of their dtype would: nothing to tell apart.
Complex numbers are left as they are.) The number is the value the capture recorded
(``mystique_gen.tools.capture``), else 1.0, which neither zeroes nor overflows what it
scales or divides: the trace itself records no float values.
"""

from __future__ import annotations

from mystique_gen import oprules
from mystique_gen.ir import Literal, Op, TensorValue, iter_tensors
from mystique_gen.ir.dtypes import FLOATING, INTEGRAL
from mystique_gen.passes.values import RecordedValues, never_negative_reads

_BOOL_OR_INTEGRAL = INTEGRAL | {"bool"}


def replay_wrapped_numbers(ops: list[Op], recorded: RecordedValues | None = None) -> int:
    """Turn the wrapped-number inputs of ``ops`` (one trace, in order) into Python
    numbers, each its ``recorded`` value where the capture recorded one
    (passes/values.py), else 1.0; returns how many."""
    made: set[int] = set()  # storage ids a recorded op returned or wrote
    changed = 0
    for op in ops:
        outputs = [tv for value in op.outputs for tv in iter_tensors(value)]
        rows = recorded.ordinals.get(op.node_id, []) if recorded else []
        for i, arg in enumerate(op.args):
            tv = arg.value
            if isinstance(tv, TensorValue) and _wrapped(tv, op, outputs, made):
                k = rows[i][0] if i < len(rows) and rows[i] else None
                value = recorded.scalars.get((op.node_id, k)) if recorded else None
                arg.value = Literal(1.0 if value is None else value)
                changed += 1
        made.update(tv.storage_id for tv in outputs)
        made.update(tv.storage_id for arg in op.args if arg.spec.writes
                    for tv in iter_tensors(arg.value))
    return changed


def _wrapped(tv: TensorValue, op: Op, outputs: list[TensorValue], made: set[int]) -> bool:
    meta = tv.meta
    if meta.dtype != "float64" or meta.shape != () or meta.device != "cpu" \
            or tv.storage_id in made:
        return False
    others = [t.meta.dtype for arg in op.args for t in iter_tensors(arg.value)
              if t is not tv and t.meta.shape != ()]
    results = {t.meta.dtype for t in outputs} & FLOATING - {"float64"}
    if not others:
        # Every other tensor is 0-d too, and 0-d tensors promote among themselves: a
        # 0-d float64 tensor beside a 0-d float32 one it reads makes float64, a wrapped
        # float does not (a loss term times -0.5). Written tensors say nothing (an
        # in-place op keeps its dtype).
        # So does one beside integral or boolean 0-d tensors alone (D-FINE's box count
        # times 0.5): a float64 tensor would make float64, a wrapped float the default.
        read = {t.meta.dtype for arg in op.args if not arg.spec.writes
                for t in iter_tensors(arg.value) if t is not tv}
        return bool(results & read) or bool(results and read and read <= _BOOL_OR_INTEGRAL)
    if any(d not in _BOOL_OR_INTEGRAL for d in others):
        return False
    return bool(results)


def scalar_beside(tv: TensorValue, op: Op) -> bool:
    """``tv`` looks like a wrapped Python float next to tensors of another dtype or
    device: a 0-d CPU float64 tensor where the op's other floating tensors are not
    float64 CPU tensors (``0.5 * x`` on a float32 or CUDA ``x``). Whether the number was
    wrapped or a 0-d tensor its dtype cannot tell (both promote alike), but a model's
    parameters share their module's dtype and device, so it is a constant of the step,
    never a parameter (passes/autograd.py)."""
    meta = tv.meta
    if meta.dtype != "float64" or meta.shape != () or meta.device != "cpu":
        return False
    others = [t.meta for arg in op.args for t in iter_tensors(arg.value)
              if t is not tv and t.meta.dtype in FLOATING]
    return bool(others) and all(m.dtype != "float64" or m.device != "cpu" for m in others)


# What an eps the trace wrote as 0.0 replays as: the observer writes doubles with six
# decimals (Adam's lr / bias correction 0.005263, its eps 1e-8 as 0.0), so the
# recorded value only says it was below 5e-7; 1e-8 is Adam's default.
EPSILON_STAND_IN = 1e-8


def restore_epsilons(ops: list[Op]) -> int:
    """Give each eps argument the trace recorded as 0.0 (oprules ``epsilon_args``) a
    small positive value, EPSILON_STAND_IN; returns how many. A normalisation's or an
    optimizer's eps is positive by design, and at 0 a zero variance or a zero gradient
    divides by zero (the PARAM GPT-2 trace's first Adam step replayed NaN into 43
    weights: every entry whose gradient was 0). So is a floor of 0.0 under a value
    that is never negative (oprules ``epsilon_floors``: ``F.normalize``'s
    ``clamp_min(norm, 1e-12)``, through views of the norm): a random program's replay
    divided an all-zero row by it, 0 / 0."""
    changed = 0
    never_negative = never_negative_reads(ops)
    for op in ops:
        names = list(oprules.EPSILON_ARGS.get(op.name, ()))
        floor = oprules.EPSILON_FLOORS.get(op.name)
        if floor is not None:
            floored = next((a.value for a in op.args if a.spec.name == floor[0]), None)
            if isinstance(floored, TensorValue) and (floored.trace_id, floored.storage_id) \
                    in never_negative.get(op.index, ()):
                names.append(floor[1])
        for arg in op.args:
            value = arg.value
            if (arg.spec.name in names and isinstance(value, Literal)
                    and type(value.value) is float and value.value == 0.0):
                arg.value = Literal(EPSILON_STAND_IN)
                changed += 1
    return changed
