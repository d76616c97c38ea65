"""What an op family can say: the record each family module exports, and the bounds,
fills and defaults those records are written in.

A family (embedding and indexing, losses, normalisation, RNNs, optimizers, math
domains, data-dependent shapes, collectives) is one module of this package exporting
``FAMILY = OpFamily(...)``; ``oprules/__init__.py`` merges every family into the tables
the passes read, refusing an op that two families claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mystique_gen.harness.fills import FillKind
from mystique_gen.sources.et import RawNode


class Bound:
    """An exclusive upper bound for an index argument, computed from the op's args."""

    def upper(self, args: dict[str, object]) -> int | None:  # pragma: no cover - abstract
        raise NotImplementedError


class SizeOf(Bound):
    """Size of tensor argument ``tensor`` along a fixed dim or along the int arg ``dim``."""

    def __init__(self, tensor: str, dim: int | str):
        self.tensor, self.dim = tensor, dim

    def upper(self, args: dict[str, object]) -> int | None:
        shape = args.get(self.tensor)
        dim = args.get(self.dim) if isinstance(self.dim, str) else self.dim
        if not isinstance(shape, tuple) or not isinstance(dim, int):
            return None
        if not shape:
            # A 0-d tensor indexes as one element along dim 0 or -1 (torch wraps the
            # dim as for a 1-d tensor): index_select/index_fill/index_add on a scalar
            # take only index 0, and no bound let 0..8 through (IndexError).
            return 1 if dim in (0, -1) else None
        if -len(shape) <= dim < len(shape):
            return shape[dim]
        return None


class SizeListAt(Bound):
    """Element ``dim`` (an int argument) of an int-list argument that holds a shape
    (``index_select_backward``'s ``self_sizes``)."""

    def __init__(self, sizes: str, dim: str):
        self.sizes, self.dim = sizes, dim

    def upper(self, args: dict[str, object]) -> int | None:
        sizes, dim = args.get(self.sizes), args.get(self.dim)
        if not isinstance(sizes, (list, tuple)) or not isinstance(dim, int) \
                or not -len(sizes) <= dim < len(sizes):
            return None
        size = sizes[dim]
        return size if isinstance(size, int) and size > 0 else None


class SizeProduct(Bound):
    """The number of elements of a shape an int-list argument holds: ``max_unpool2d``'s
    indices are flat positions in each plane of ``output_size`` (any dims)."""

    def __init__(self, sizes: str):
        self.sizes = sizes

    def upper(self, args: dict[str, object]) -> int | None:
        sizes = args.get(self.sizes)
        if not isinstance(sizes, (list, tuple)) or not sizes \
                or not all(isinstance(n, int) and n > 0 for n in sizes):
            return None
        n = 1
        for size in sizes:
            n *= size
        return n


class ClassCount(Bound):
    """Number of classes of a loss input: dim 1 of (N, C, ...) or dim 0 of (C,)."""

    def __init__(self, tensor: str):
        self.tensor = tensor

    def upper(self, args: dict[str, object]) -> int | None:
        shape = args.get(self.tensor)
        if shape == ():  # one score, one class (multi_margin_loss of a 0-d input)
            return 1
        if not isinstance(shape, tuple):
            return None
        return shape[1] if len(shape) >= 2 else shape[0]


class IntArg(Bound):
    """The value of an int argument (``num_classes``, ``num_weights``)."""

    def __init__(self, name: str):
        self.name = name

    def upper(self, args: dict[str, object]) -> int | None:
        value = args.get(self.name)
        return value if isinstance(value, int) and value > 0 else None


class PerDim(Bound):
    """``indices[k]`` of ``aten::index`` indexes dim k of ``tensor`` (handled by position).
    ``selection``: the argument that holds the selected elements (``index_put_``'s
    ``values``); None: the op's output (``index``)."""

    def __init__(self, tensor: str, selection: str | None = None):
        self.tensor, self.selection = tensor, selection

    def upper(self, args: dict[str, object]) -> int | None:
        return None  # resolved per list element by the values pass


# Default fills by element kind: (kind, low, high).
DEFAULT_INTEGRAL = (FillKind.RANDINT, 0, 8)
DEFAULT_FLOATING = (FillKind.UNIFORM, -1.0, 1.0)
POSITIVE_FLOATING = (FillKind.UNIFORM, 0.5, 1.5)
# 0-d floating tensors are mostly Python scalars wrapped by the argument parser
# (optimizer betas, learning rates, bias corrections): their values are not recorded,
# and one storage id often serves several of them in turn. Near 1, any of those roles
# keeps optimizer state finite and positive where it must be.
SCALAR_FLOATING = (FillKind.UNIFORM, 0.95, 1.0)
# 0-d integral tensors nothing else bounds are mostly Python ints wrapped the same way
# (``h / (2 * var)``, ``(1 / n) * k``): a model never wrote a 0 there that it divides
# by, and filled at random a 0 made inf or NaN (a Normal's log-density, class weights).
SCALAR_INTEGRAL = (FillKind.RANDINT, 1, 8)


Facts = dict[str, object]  # argument name -> shape (tensors), value (scalars), list (numbers)
OutShapes = list[object]  # recorded output shapes; a list output: a list of shapes


def _numel(shape: object) -> int | None:
    if not isinstance(shape, tuple):
        return None
    n = 1
    for d in shape:
        n *= d
    return n


def _out(outputs: OutShapes, index: int = 0, element: int | None = None) -> tuple | None:
    if index >= len(outputs):
        return None
    shape = outputs[index]
    if element is not None:
        shape = shape[element] if isinstance(shape, list) and element < len(shape) else None
    return shape if isinstance(shape, tuple) else None


@dataclass(frozen=True)
class PathFacts:
    """What an op's recorded children show about the values its arguments held, where
    the kernel's path (which children it ran, at which sizes) depends on them.
    ``values``: (argument, the integers it held; a multiset where the order is not
    recorded). ``fills``: (argument, a data-dependent fill as ``Fill.init`` gives).
    ``row_norms``: (table argument, max_norm, norm_type, ((row, its norm), ...)): the
    rows whose norms exceeded max_norm."""

    values: tuple[tuple[str, tuple[int, ...]], ...] = ()
    fills: tuple[tuple[str, tuple[str, int, int]], ...] = ()
    row_norms: tuple[tuple[str, float, float, tuple[tuple[int, float], ...]], ...] = ()


class KernelPath:
    """Reads an op's recorded children (``read``, at selection: the raw nodes) into
    plain facts kept on the op, and turns them into fills of its arguments (``facts``,
    at the values pass, with the op's argument facts and output shapes)."""

    def read(self, node: RawNode, below: list[RawNode]) -> tuple | None:
        raise NotImplementedError  # pragma: no cover - abstract

    def facts(self, args: Facts, outputs: OutShapes, recorded: tuple) -> PathFacts | None:
        raise NotImplementedError  # pragma: no cover - abstract


@dataclass(frozen=True)
class ShiftedRange:
    """A floating argument's range that moves with an int argument ``arg``:
    ``(low, high) + step * (arg - 1)``. ``mvlgamma(x, p)`` sums ``lgamma(x - j / 2)``
    for j < p, so it needs ``x > (p - 1) / 2``: (0.5, 2.0) shifted by 0.5 a term."""

    low: float
    high: float
    arg: str
    step: float

    def bounds(self, args: Facts) -> tuple[float, float] | None:
        value = args.get(self.arg)
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        shift = self.step * (value - 1)
        return (self.low + shift, self.high + shift)


# A floating argument's range: fixed, or moving with an int argument.
FloatRange = tuple[float, float] | ShiftedRange


def float_range(rule: FloatRange, args: Facts) -> tuple[float, float] | None:
    """The (low, high) of ``rule`` for an op called with ``args``."""
    return rule.bounds(args) if isinstance(rule, ShiftedRange) else rule


class Fill:
    """How one input must be filled for a data-dependent output to keep its size."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[str, int, int] | None:
        raise NotImplementedError  # pragma: no cover - abstract

    def fitted_where_made(self, args: Facts) -> bool:
        """Whether such an input, where a replayed op computes it, is fitted to this
        fill where it is made (the op refuses or misreads values that miss it). Not
        where the file fits the op's output after it instead."""
        return True


class SetFlag(Fill):
    """A flag the op reads that the original step had set: an asserted condition
    (``torch._assert_async(flag)``, an exported program's runtime check), which raises
    where it is 0 or False; a QAT module's on/off buffer (``observer_enabled``,
    ``fake_quant_enabled``), where 0 skips the op's work. Filled at random, the replay
    stopped at one seed in two ("RuntimeError: bad input"), and one fake quantization
    in eight did none of its work (0.8 ms against 12.4). Filled 1."""

    def init(self, args: Facts, outputs: OutShapes) -> tuple[str, int, int] | None:
        return (FillKind.ONES, 0, 0)


@dataclass(frozen=True)
class CommRule:
    """How one c10d operator replays as a torch.distributed call. ``tensors`` lists
    (schema argument, form) in the order of the call's positional arguments; forms:
    "tensor" (a Tensor), "one" (the only tensor of a Tensor[]), "list" (a Tensor[]),
    "inner" (the only list of a Tensor[][]), "inner_or_none" (that list, or None where
    it is empty: gather/scatter on a non-root rank). ``root``: the schema argument
    holding a group-local rank, passed as ``root_keyword``. ``reduce_op``: the schema
    argument holding the reduce op, passed as ``op=`` where the trace records it.
    ``harness``: ``call`` is a function of the generated file's harness
    (harness/dist.py), not of torch.distributed. ``scalars``: recorded bools and ints
    passed on, as (schema argument, keyword). ``note``: why the replay differs from the
    recorded call, for the file's header. ``point_to_point``: "send" or "recv", issued
    async so that ranks pair them up in recorded order without deadlock.
    ``group_size``: (larger, smaller) schema arguments whose element counts' ratio is
    the size of the group the op ran on (all-gather: output over input), for traces
    that do not record the group (gloo: no record_param_comms). ``group_members``: for
    those traces, the schema argument whose innermost list holds one tensor per member
    of the group (a list all-gather's outputs, an all-to-all's lists, a root's gather
    or scatter list; empty on a non-root rank): its length is the group's size. A
    reducing rule's first tensor argument is what it writes (the reduced result).
    ``same_sizes``: every
    member of the group passes tensors of the same sizes (not all-to-all, gather,
    scatter or point-to-point), so members that differ would fail."""

    call: str
    tensors: tuple[tuple[str, str], ...]
    root: str | None = None
    root_keyword: str | None = None
    splits: bool = False  # all_to_all_single: pass the recorded split sizes
    tag: bool = False  # send/recv: pass the recorded tag
    async_call: str | None = None  # the call to use when the trace waits on it later
    has_async_arg: bool = True  # the call takes async_op=
    reduce_op: str | None = None
    harness: bool = False
    scalars: tuple[tuple[str, str], ...] = ()
    note: str | None = None
    point_to_point: str | None = None
    group_size: tuple[str, str] | None = None
    group_members: str | None = None
    same_sizes: bool = True

    @property
    def implies_group(self) -> bool:
        """Whether the op's tensors say the size of the group it ran on."""
        return self.group_size is not None or self.group_members is not None


@dataclass(frozen=True)
class OpFamily:
    """Everything one family of operators needs beyond what the trace says. Keys are
    qualified op names without overload (``aten::embedding``)."""

    name: str
    # Index arguments and what bounds them: {op: {argument: Bound, or "offsets"}}.
    index_rules: dict[str, dict[str, Bound | str]] = field(default_factory=dict)
    # Index arguments bounded by another tensor's element count: {op: (index, tensor)}.
    take_rules: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Floating arguments that must be positive for the op to stay finite.
    positive_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Powers NaN for a negative base where the exponent is not an integer: {op: (base,
    # exponent)}. A recorded non-integral number exponent (``x ** 0.5``) makes the base
    # positive as ``positive_args`` do, carried back through ops that keep signs; an
    # integral one (``h ** 2``) or a tensor exponent leaves ``float_ranges``' preferred
    # range alone (positivity carried from a square made a whole network positive).
    fractional_powers: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Ops that raise e (or a number: its argument, else None) to a tensor argument:
    # {op: (exponent, base)}. An exponent computed as positions times wrapped numbers
    # (``exp(-log(10000) * arange(n) / n)``) has those numbers filled so that it stays
    # within EXPONENT_BOUND (natural units).
    exponents: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    # Ops that copy one tensor's values, maybe in another dtype: exponents are followed
    # through them to the positions they scale.
    same_value_casts: frozenset[str] = frozenset()
    # Ops whose result is non-negative where these floating arguments are: a result that
    # must be positive (``positive_args`` of its reader) needs them non-negative too.
    keeps_sign: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Ops whose result is positive where these arguments are positive and these others
    # lie in a small range: {op: (positive arguments, {argument: (low, high)})}. A
    # result that must be positive puts both on its inputs (a centred second moment,
    # ``square_avg - grad_avg * grad_avg``, whose square root RMSprop takes).
    positive_if: dict[str, tuple[tuple[str, ...], dict[str, tuple[float, float]]]] = field(
        default_factory=dict)
    # Ops whose result is ``number - alpha * tensor``: {op: (tensor, number)}. A result
    # that must be positive (or in a positive range) bounds the tensor above by number /
    # alpha (``(1 - a) ** 0.5`` beside ``a ** 0.5``: a diffusion schedule's cumulative
    # alphas lie in (0, 1)).
    complements: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Ops whose result is ``greater - alpha * lesser``: {op: (greater, lesser)}. A result
    # that must be positive, where both are views of one tensor at two offsets (a box's
    # ``x2 - x1``), has that tensor filled rising along the dimension between them.
    differences: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Ops whose result lies within (-c, c), for c <= 1, where these arguments do (a
    # product, a power of at least 1, a mean): {op: (argument, ...)}. The small term of
    # a positive difference of two tensors (``sq - mean ** 2``, running moments) carries
    # its bound back through them to the tensors it is computed from.
    contracting: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Ops whose result is positive-definite where their arguments are: {op: how}, how
    # one of "sum" (``self + alpha * other``, alpha >= 0: every square term
    # positive-definite), "scale" (a square matrix times a 0-d positive number) or
    # "congruence" (``(A @ P) @ A.T``: P positive-definite). A matrix a factorisation
    # reads that the step computes (a Gaussian process's ``K * s + n * I``, a Kalman
    # filter's ``H P H^T + R``) has its inputs filled so.
    positive_definite: dict[str, str] = field(default_factory=dict)
    # Ops whose result rises with these arguments where every other tensor argument is
    # 0-d (a scale, a shift, a copy): {op: (argument, ...)}. A stack of such results of
    # one tensor's columns keeps their order (a resize of boxes, column by column).
    increasing: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Of those, sums: they rise with all their arguments at once (anchors, a grid's
    # shifts plus each cell's boxes, rise within each box where the boxes do).
    sums: frozenset[str] = frozenset()
    # Products of their argument's elements (``prod``, ``cumprod``): a result that must
    # lie in (0, b] with b <= 1 has every factor in (0, b] (a noise schedule's
    # cumulative product of 1 - beta).
    products: dict[str, str] = field(default_factory=dict)
    # Floating arguments that must lie in a range: {op: {argument: (low, high)}}.
    float_ranges: dict[str, dict[str, FloatRange]] = field(default_factory=dict)
    # Inputs filled so that a data-dependent output keeps its recorded size.
    shape_rules: dict[str, dict[str, Fill]] = field(default_factory=dict)
    # Ops whose output sizes depend on their input values (fitted at run time).
    data_dependent_outputs: frozenset[str] = frozenset()
    # Ops whose sparse results' entry counts depend on their indices (fitted at run
    # time where a result is sparse; a dense result's size does not).
    sparse_data_dependent_outputs: frozenset[str] = frozenset()
    # Ops whose output (at this position) holds each value of this input once, in some
    # order: a fill that fixes the output's count or sum holds for the input.
    same_values: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Ops that copy values from these inputs to their outputs unchanged: a bound or
    # domain a reader puts on the output holds for the inputs too.
    value_preserving: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Ops that copy whole rows (the trailing dimensions after those they select or join
    # along) of this input unchanged: {op: (input, the argument naming those
    # dimensions: "dim", or "indices" for the dimensions indexed; "" where the op keeps
    # every element in memory order)}. A rising order within rows carries back through
    # them (``cat([gt[idx] for ...])`` of boxes).
    moves_rows: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Ops that put their tensors side by side along a new dimension (``stack``): a
    # rising order along it is one between the tensors, element by element.
    stacks: frozenset[str] = frozenset()
    # Saved state a backward reads back as raw bytes: zero-filled (never NaN).
    saved_workspaces: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Floating inputs that must not require grad although an autograd op reads them.
    not_differentiable: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Float arguments that are a small positive offset by design (an eps): the trace
    # writes doubles with six decimals, so one below 5e-7 reads 0.0 and replays as
    # EPSILON_STAND_IN (passes/numbers.py).
    epsilon_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Ops that floor a tensor at a number: {op: (tensor, floor)}. Where the tensor is a
    # result that is never negative (``non_negative_results``) and the floor reads 0.0,
    # it was an eps below what the trace's six decimals show (``F.normalize``'s
    # ``clamp_min(norm, 1e-12)``): flooring such a value at 0 is a no-op nobody writes.
    epsilon_floors: dict[str, tuple[str, str]] = field(default_factory=dict)
    non_negative_results: frozenset[str] = frozenset()
    # Ops whose result is never negative for some arguments: {op: (kind, argument,
    # other)}: "square" (the argument and ``other`` are one tensor: ``h * h``),
    # "even_power" (the argument, an exponent, is an even integer), "floor_at_least_zero"
    # (the argument, a floor, is a number of at least 0). passes/values.py
    # ``never_negative_reads``.
    non_negative_if: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    # Ops that take another kernel where these inputs require grad, grad mode on or off,
    # and the child op that shows they did: {op: (child op, (argument, ...))}.
    grad_revealed_by: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # Communication: how each c10d op replays, and those that do not, with the reason.
    comm_ops: dict[str, CommRule] = field(default_factory=dict)
    comm_not_replayed: dict[str, str] = field(default_factory=dict)
    # Ops that record, for the collective that reads their results, the rank within its
    # group: {op: argument} (FSDP2's copy-in before its all-gather). Where the trace
    # records no group, it tells mesh dimensions of one size apart.
    group_rank_args: dict[str, str] = field(default_factory=dict)
    # Ops never replayed, with the reason shown in the benchmark header.
    not_replayed: dict[str, str] = field(default_factory=dict)
    # Ops whose outputs hold no defined values until something writes them.
    uninitialised_outputs: frozenset[str] = frozenset()
    # In-place ops that change only metadata or autograd state, never values.
    no_value_writes: frozenset[str] = frozenset()
    # In-place ops that write one value given as a Scalar over (part of) a tensor.
    fills: frozenset[str] = frozenset()
    # Comparisons of an integral input with positions (the result of a ``positions``
    # op, ``arange(n)``, through views): the input is a length, filled in [1, n]
    # (``arange(T) < lengths[:, None]``: a length of 0 masked a whole softmax row).
    length_comparisons: frozenset[str] = frozenset()
    positions: frozenset[str] = frozenset()
    # Ops whose integral result is one past the end where a value exceeds every boundary
    # (``searchsorted``, ``bucketize``): computed from filled values, it is wrapped into
    # range where an op reads it as an index (passes/values.py).
    searches: frozenset[str] = frozenset()
    # Ops whose recorded children show values their inputs held where the kernel's
    # path depends on them (rows renormalised, empty bags, packed lengths):
    # {op: KernelPath} (oprules/kernel_paths.py).
    kernel_paths: dict[str, KernelPath] = field(default_factory=dict)
    # Ops whose 0-d argument is a Python literal that ``x[...] = literal`` writes into a
    # tensor; the trace records no value for it.
    assigned_literals: frozenset[str] = frozenset()
    # Ops that hand a one-element tensor's value to Python (``.item()``): the trace
    # records that value as their output, a plain ET's one record of a tensor's data.
    item_reads: frozenset[str] = frozenset()
    # Ops that put a value where a boolean mask says: {op: (mask, ((value argument or
    # "" for -inf always, the mask's value that keeps every element from it), ...))}.
    # Where that value is not finite (``scores.masked_fill(~keep, -inf)`` before a
    # softmax, a boolean ``attn_mask``: True attends), a mask input is filled to keep
    # every element: filled at random, a row of keys all masked is NaN.
    excluding_masks: dict[str, tuple[str, tuple[tuple[str, bool], ...]]] = field(
        default_factory=dict)
    # Ops whose boolean result is its argument's negation (``~mask``).
    negations: frozenset[str] = frozenset()
    # Ops that count an index into bins: {op: (bins tensor, index)} (``zeros(K)
    # .scatter_add_(0, batch, ones)``). An index counted so whose counts' running sum
    # (``cumulative_sums``) it then indexes (``cumsum(counts)[batch]``) is a segment
    # id, sorted as CSR order needs (PyG's batch vector).
    bin_counts: dict[str, tuple[str, str]] = field(default_factory=dict)
    cumulative_sums: frozenset[str] = frozenset()
    # Ops that make a tensor of zeros: a literal first written into one is not 0.
    zero_creations: frozenset[str] = frozenset()
    # Ops that write a value into a tensor: {op: (tensor, value)} (``x[mask] = v``).
    literal_writes: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Tests of an integral tensor that tell which literal marks some of its entries:
    # {op: "equal"} (``x == c`` or ``!=`` with a Scalar c < 0: the marker is c) or
    # {op: "sign"} (``x >= 0``, ``x < 0``: a marker below 0, -1).
    marker_tests: dict[str, str] = field(default_factory=dict)
    # Losses that skip the targets equal to an argument: {op: (target, ignore index)}.
    ignored_targets: dict[str, tuple[str, str]] = field(default_factory=dict)
    # In-place ops that replace their written argument whole and read none of its values
    # (as an ``out=`` argument is replaced).
    overwrites: frozenset[str] = frozenset()
    # Ops whose results take only their tensor arguments' metadata (shape, dtype,
    # device), never their values: ``new_zeros``, ``full_like``.
    metadata_only: frozenset[str] = frozenset()
    # In-place ops that refuse a view argument ("Can't detach views in-place").
    refuses_views: frozenset[str] = frozenset()
    # Views that refuse an input whose strides they cannot view ("view size is not
    # compatible with input tensor's size and stride"): the layout of the kernel
    # output they view, through other views, matters (passes/tensors.py).
    stride_dependent_views: frozenset[str] = frozenset()
    # Ops whose kernels lay their output out by device and backend (a fused attention
    # follows its query's layout on the host, not on a GPU).
    layout_by_backend: frozenset[str] = frozenset()
    # Ops whose result is the same view of their input's memory, yet a tensor of its
    # own: ``detach`` (without autograd history), ``_make_dual`` (with a tangent). A
    # reader of that tensor reads the result, not the view it aliases.
    distinct_aliases: frozenset[str] = frozenset()
    # Ops that tell a sparse COO tensor's structure, which the trace records with no
    # tensor of that layout: {op: what the op says}: "nnz", "sparse_dim", "coalesced",
    # "indices" or "values" of its first argument (its result), or "made" (it returns
    # a new sparse tensor; its ``indices`` argument, if any, gives the structure).
    sparse_facts: dict[str, str] = field(default_factory=dict)
    # Ops whose tensors recorded without storage are MKLDNN (oneDNN) tensors, the
    # other layout the trace records with no storage (oprules/mkldnn.py).
    mkldnn_ops: frozenset[str] = frozenset()
    # Weights an op takes packed in an opaque format that random values cannot stand
    # for: {op: (argument, packing op, (arguments of the op it is packed from, ...))}.
    packed_args: dict[str, tuple[str, str, tuple[str, ...]]] = field(default_factory=dict)
    # Integral divisors, never filled with 0: {op: (argument, ...)}.
    integer_divisors: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Compares of an integral tensor with a recorded Scalar that bound a shard's index
    # window: {op: "low" or "high"} (t < low | t >= high masks other shards' rows).
    window_bounds: dict[str, str] = field(default_factory=dict)
    # Ops that shift a windowed tensor to shard-local indices: {op: (tensor, offset)};
    # an offset the trace holds no value of is the window's low bound.
    window_shifts: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Forward-mode AD ops that name a dual level: {op: argument}. A replay iteration
    # keeps one level more than the highest named live (oprules/forward_ad.py).
    forward_ad_levels: dict[str, str] = field(default_factory=dict)
    # Ops that take a packed linear weight (a TorchScript object the trace cannot hold),
    # rebuilt from their input and result shapes: {op: "int8" or "fp16"}, how it was
    # packed (oprules/quantized.py).
    packed_linear: dict[str, str] = field(default_factory=dict)
    # Floating tensors a recast to half or bfloat16 (``--dtype``) leaves as recorded,
    # with every tensor of their storages: {op: (arguments, output positions)}: batch
    # norm's weights and statistics, which cuDNN's kernels take only in float32.
    full_precision: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = field(
        default_factory=dict)
