"""Input values: range inference per op family, recorded ranges and data, data-dependent
sizes, and the capture/compare tools on a replay of a captured model."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Binomial, Dirichlet, Gamma, Poisson
from torch.profiler import ExecutionTraceObserver

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.backends.render import format_with_black
from mystique_gen.cli import main as tools_main
from mystique_gen.driver import Source, build_program, generate, generate_source, run_passes
from mystique_gen.harness import runtime
from mystique_gen.ir import Init, Literal, TensorMeta
from mystique_gen.oprules import op_category
from mystique_gen.options import BuildOptions
from mystique_gen.passes.values import CapturedInputs, recorded_values, rising_run
from mystique_gen.sources.et import load_trace, trace_from_document
from mystique_gen.tools.capture import capture, capture_script
from mystique_gen.tools.compare import (
    compare_traces,
    format_comparison,
    kineto_times,
    op_multiset,
)
from tests.conftest import last_json, record_et, run_benchmark
from tests.tracebuilder import EMBEDDING, VIEW, Device, T, TraceBuilder

INDEX_SELECT = "aten::index_select(Tensor self, int dim, Tensor index) -> Tensor"
GATHER = ("aten::gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) "
          "-> Tensor")
NLL = ("aten::nll_loss(Tensor self, Tensor target, Tensor? weight=None, int reduction=1, "
       "SymInt ignore_index=-100) -> Tensor")
BAG = ("aten::embedding_bag(Tensor weight, Tensor indices, Tensor offsets, "
       "bool scale_grad_by_freq=False, int mode=0, bool sparse=False, "
       "Tensor? per_sample_weights=None, bool include_last_offset=False) "
       "-> (Tensor, Tensor, Tensor, Tensor)")
NONZERO = "aten::nonzero(Tensor self) -> Tensor"
WHERE = "aten::where(Tensor condition) -> Tensor[]"
UNIQUE = ("aten::_unique2(Tensor self, bool sorted=True, bool return_inverse=False, "
          "bool return_counts=False) -> (Tensor, Tensor, Tensor)")
REPEAT = ("aten::repeat_interleave.self_Tensor(Tensor self, Tensor repeats, int? dim=None, "
          "*, SymInt? output_size=None) -> Tensor")
BINCOUNT = "aten::bincount(Tensor self, Tensor? weights=None, int minlength=0) -> Tensor"
ONE_HOT = "aten::one_hot(Tensor self, int num_classes=-1) -> Tensor"
MASKED_SELECT = "aten::masked_select(Tensor self, Tensor mask) -> Tensor"
INDEX = "aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor"
SEGMENT = ("aten::segment_reduce(Tensor data, str reduce, *, Tensor? lengths=None, "
           "Tensor? indices=None, Tensor? offsets=None, int axis=0, bool unsafe=False, "
           "Scalar? initial=None) -> Tensor")
LOG = "aten::log(Tensor self) -> Tensor"
MM = "aten::mm(Tensor self, Tensor mat2) -> Tensor"
BERNOULLI = "aten::bernoulli(Tensor self, *, Generator? generator=None) -> Tensor"
RNN_BACKWARD = ("aten::mkldnn_rnn_layer_backward(Tensor input, Tensor weight1, Tensor weight2, "
                "Tensor weight3, Tensor weight4, Tensor hx_, Tensor cx_tmp, Tensor output, "
                "Tensor hy_, Tensor cy_, Tensor? grad_output, Tensor? grad_hy, "
                "Tensor? grad_cy, bool reverse, int mode, int hidden_size, int num_layers, "
                "bool has_biases, bool train, bool bidirectional, int[] batch_sizes, "
                "bool batch_first, Tensor workspace) -> (Tensor, Tensor, Tensor, Tensor, "
                "Tensor, Tensor, Tensor)")


def _program(b: TraceBuilder, resources=None):
    return build_program(trace_from_document(b.doc(), name="t.json", sha256="0"), resources)


def _init_of(program, dtype_first: str = "int64") -> Init:
    inits = [s.init for s in program.storages if s.materialised and s.dtype == dtype_first]
    assert len(inits) == 1, inits
    return inits[0]


# -- consumer bounds per op family ----------------------------------------------------


@pytest.mark.parametrize("schema,shape,dim,bound", [
    (INDEX_SELECT, (7, 3), 0, 7),
    (INDEX_SELECT, (7, 3), 1, 3),
    (GATHER, (5, 9), -1, 9),
    # a 0-d self indexes as one element (OpInfo's index_select/index_fill samples:
    # filled 0..8 before, IndexError at replay)
    (INDEX_SELECT, (), 0, 1),
    (INDEX_SELECT, (), -1, 1),
])
def test_index_bounded_by_indexed_dim(schema, shape, dim, bound):
    b = TraceBuilder()
    idx = b.tensor((4,) if schema == INDEX_SELECT else (5, 2), dtype="int64")
    out = b.tensor((2, 2))
    b.op(schema, [b.tensor(shape), dim, idx], [out])
    init = _init_of(_program(b))
    assert (init.kind, init.low, init.high) == ("randint", 0, bound)


LU_UNPACK = ("aten::lu_unpack(Tensor LU_data, Tensor LU_pivots, bool unpack_data=True, "
             "bool unpack_pivots=True) -> (Tensor P, Tensor L, Tensor U)")
MAX_UNPOOL2D = ("aten::max_unpool2d(Tensor self, Tensor indices, SymInt[2] output_size) "
                "-> Tensor")
MULTI_MARGIN = ("aten::multi_margin_loss(Tensor self, Tensor target, Scalar p=1, "
                "Scalar margin=1, Tensor? weight=None, int reduction=1) -> Tensor")
MULTILABEL_MARGIN = ("aten::multilabel_margin_loss(Tensor self, Tensor target, "
                     "int reduction=1) -> Tensor")


def test_pivots_of_a_wide_factorisation_name_its_rows():
    """A 3 x 5 LU's pivots are rows, [1, 3]: filled up to the column count (5),
    lu_unpack refused them ("must be between 1 and LU.size(-2) inclusive")."""
    b = TraceBuilder()
    pivots = b.tensor((3,), dtype="int32")
    b.op(LU_UNPACK, [b.tensor((3, 5)), pivots, True, True],
         [b.tensor((3, 3)), b.tensor((3, 3)), b.tensor((3, 5))])
    init = _init_of(_program(b), "int32")
    assert (init.kind, init.low, init.high) == ("randint", 1, 4)


GROUPED_MM = ("aten::_grouped_mm(Tensor self, Tensor mat2, Tensor? offs=None, "
              "Tensor? bias=None, ScalarType? out_dtype=None) -> Tensor")


@pytest.mark.parametrize("a,b,out,unit,total", [
    ((128, 32), (4, 32, 64), (128, 64), 16, 128),  # tokens x experts' weights: rows
    ((64, 128), (128, 32), (4, 64, 32), 16, 128),  # a weight's grad per expert: inner
    ((4, 48, 30), (30, 20), (48, 20), 1, 20),  # 3-D x 2-D: mat2's columns, unaligned
])
def test_grouped_matmul_offsets_end_each_group_inside_the_split_dimension(
        a, b, out, unit, total):
    """A mixture of experts' ``offs`` made outside the step (torchtitan permutes tokens
    with a Triton kernel the trace does not record) was filled with random integers
    below 8: the replay multiplied 8 of 128 tokens (0.057 ms against eager 0.153)."""
    builder = TraceBuilder()
    offs = builder.tensor((4,), dtype="int32")
    builder.op(GROUPED_MM, [builder.tensor(a, dtype="bfloat16"),
                            builder.tensor(b, dtype="bfloat16"), offs, None, None],
               [builder.tensor(out, dtype="bfloat16")])
    init = _init_of(_program(builder), "int32")
    assert (init.kind, init.low, init.high) == ("ends", unit, total)


TO_DTYPE = ("aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, "
            "bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a)")


def test_computed_group_ends_are_fitted_where_they_are_made():
    """Expert parallel's group ends are the token counts an all_to_all brought,
    cumulated and cast, while the tokens come in the recorded splits: the replay's
    routing counts other tokens, so the ends are fitted to the rows where the cumsum
    makes them (carried through the cast), once, and the counts given as an input are
    left as they come."""
    b = TraceBuilder()
    counts, ends = b.tensor((4,), dtype="int64"), b.tensor((4,), dtype="int64")
    b.op("aten::cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor",
         [counts, 0, None], [ends])
    ends32 = b.tensor((4,), dtype="int32")
    b.op(TO_DTYPE, [ends, 3, False, False, None], [ends32])
    b.op(GROUPED_MM, [b.tensor((96, 32), dtype="bfloat16"),
                      b.tensor((4, 32, 64), dtype="bfloat16"), ends32, None, None],
         [b.tensor((96, 64), dtype="bfloat16")])
    program = _program(b)
    assert program.ops[0].name == "aten::cumsum"
    assert program.ops[0].fit_values == {0: ("ends", 16, 96)}
    assert program.ops[1].fit_values == {}
    assert _init_of(program).kind != "ends"
    text = generate_source(program)
    assert "cumsum = _fit_values(cumsum, \"ends\", 16, 96" in " ".join(text.split())


FLASH_VARLEN = ("flash_attn::_flash_attn_varlen_forward(Tensor q, Tensor k, Tensor v, "
                "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, "
                "SymInt max_seqlen_k, float dropout_p, float softmax_scale, bool causal, "
                "SymInt window_size_left=-1, SymInt window_size_right=-1, "
                "float softcap=0., Tensor? alibi_slopes=None, bool return_softmax=False, "
                "Tensor? block_table=None, Tensor? leftpad_k=None, Tensor? seqused_k=None) "
                "-> (Tensor, Tensor, Tensor, Tensor)")


def _varlen_attention(b: TraceBuilder, cu_q: T, cu_k: T) -> None:
    q, k = b.tensor((60, 4, 8), dtype="bfloat16"), b.tensor((90, 4, 8), dtype="bfloat16")
    b.op(FLASH_VARLEN, [q, k, b.tensor((90, 4, 8), dtype="bfloat16"), cu_q, cu_k, 20, 40,
                        0.0, 0.35, True, -1, -1, 0.0, None, False, None, None, None],
         [b.tensor((60, 4, 8), dtype="bfloat16"), b.tensor((4, 60)), b.tensor((0,)),
          b.tensor((2,), dtype="int64")])


def test_packed_sequences_cumulative_lengths_span_the_recorded_tokens():
    """Packed (varlen) attention's cu_seqlens, made by a data collator outside the
    step: 4 sequences over the 60 query and 90 key rows, none longer than the recorded
    max_seqlen (at random, a few rows were attended to, or rows past the tokens)."""
    b = TraceBuilder()
    cu_q, cu_k = b.tensor((5,), dtype="int32"), b.tensor((5,), dtype="int32")
    _varlen_attention(b, cu_q, cu_k)
    inits = [s.init for s in _program(b).storages if s.materialised and s.dtype == "int32"]
    assert sorted((i.kind, i.low, i.high) for i in inits) == [("spans", 20, 60),
                                                             ("spans", 40, 90)]


def test_packed_sequences_lengths_computed_from_a_mask_are_fitted_where_made():
    """transformers' unpadding computes cu_seqlens in the step (a mask's row sums,
    cumulated and padded with a 0): fitted where the pad makes them."""
    b = TraceBuilder()
    sums, cu = b.tensor((4,), dtype="int32"), b.tensor((5,), dtype="int32")
    b.op("aten::constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor",
         [sums, [1, 0], 0], [cu])
    _varlen_attention(b, cu, cu)
    program = _program(b)
    assert program.ops[0].fit_values == {}  # two readers want two totals: left alone
    b = TraceBuilder()
    sums, cu_q = b.tensor((4,), dtype="int32"), b.tensor((5,), dtype="int32")
    b.op("aten::constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor",
         [sums, [1, 0], 0], [cu_q])
    _varlen_attention(b, cu_q, b.tensor((5,), dtype="int32"))
    program = _program(b)
    assert program.ops[0].fit_values == {0: ("spans", 20, 60)}
    assert '_fit_values(constant_pad_nd, "spans", 20, 60' in " ".join(
        generate_source(program).split())


REPEAT_INTERLEAVE = ("aten::repeat_interleave.self_Tensor(Tensor self, Tensor repeats, "
                     "int? dim=None, *, SymInt? output_size=None) -> Tensor")


@pytest.mark.parametrize("output_size,fitted", [(32, {0: ("sum", 32, 0)}), (None, {})])
def test_computed_repeats_are_fitted_where_made_only_where_output_size_fixes_the_total(
        output_size, fitted):
    """Repeats a replayed op computes (token counts per expert) that miss a given
    output_size raise ("allocated size does not match required size"): fitted to add
    up to it where they are made. Without output_size the op's output is fitted after
    it, and the counts are left as they come (no sync for them)."""
    b = TraceBuilder()
    x, counts = b.tensor((4,), dtype="int64"), b.tensor((4,), dtype="int64")
    b.op("aten::abs(Tensor self) -> Tensor", [x], [counts])
    b.op(REPEAT_INTERLEAVE, [b.tensor((4,), dtype="int64"), counts, None, output_size],
         [b.tensor((32,), dtype="int64")])
    program = _program(b)
    assert program.ops[0].name == "aten::abs" and program.ops[0].fit_values == fitted


@pytest.mark.parametrize("values,valid", [([5, 0, 20, 7], True), ([5, 9, 20, 7], False),
                                          ([-1, 13, 13, 7], False)])
def test_fit_values_keeps_repeats_adding_up_and_refills_others(values, valid):
    got = runtime._fit_values(torch.tensor(values), "sum", 32, 0)
    assert (got.tolist() == values) == valid
    assert sum(got.tolist()) == 32 and min(got.tolist()) >= 0


@pytest.mark.parametrize("ends,fitted", [
    ([30, 60, 80, 96], [30, 60, 80, 96]),  # the replay's own, valid: kept
    ([30, 60, 80, 101], [32, 64, 80, 96]),  # past the rows: even aligned groups
    ([30, 20, 80, 96], [32, 64, 80, 96]),  # falling
    ([10, 20, 30, 40], [32, 64, 80, 96]),  # short of the rows
])
def test_fit_values_keeps_valid_group_ends_and_evens_out_others(ends, fitted):
    got = runtime._fit_values(torch.tensor(ends, dtype=torch.int32), "ends", 16, 96)
    assert got.dtype == torch.int32 and got.tolist() == fitted


@pytest.mark.parametrize("kind,values,valid", [
    ("offsets", [0, 3, 3, 20], True), ("offsets", [0, 3, 3, 40], False),
    ("offsets", [1, 3, 5, 8], False), ("offsets", [0, 5, 3, 8], False),
    ("cuts", [0, 7, 12, 36], True), ("cuts", [0, 7, 12, 30], False),
])
def test_fit_values_keeps_valid_offsets_and_refills_others(kind, values, valid):
    """Bag offsets start at 0 and stay within the 36 indices; cuts also end there."""
    given = torch.tensor(values)
    got = runtime._fit_values(given, kind, 0, 36)
    assert (got.tolist() == values) == valid
    flat = got.tolist()
    assert flat[0] == 0 and flat == sorted(flat) and flat[-1] <= 36
    assert kind == "offsets" or flat[-1] == 36


def test_bag_offsets_computed_from_lengths_stay_within_the_indices(tmp_path):
    """A jagged feature as recommendation models feed it: lengths given, the bag
    offsets their exclusive cumsum in the step. The lengths filled at random summed
    past the recorded indices: "offsets[-1] can not be greater than input's length 36
    but got offsets[-1] of 60"."""
    torch.manual_seed(0)
    lengths = torch.randint(0, 6, (16,))
    indices = torch.randint(0, 1000, (int(lengths.sum()),))
    bag = torch.nn.EmbeddingBag(1000, 8, mode="sum")

    def step() -> torch.Tensor:
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        return bag(indices, offsets).sum()

    step()
    bench = tmp_path / "bag.py"
    generate(record_et(step, tmp_path / "bag.json"), bench, GenerateOptions(command_line="t"))
    assert '_fit_values(cat, "offsets", 0,' in bench.read_text()
    proc = run_benchmark(bench, "--warmup", "1", "--iters", "2")
    assert proc.returncode == 0, proc.stderr[-800:]


GRU_DATA = ("aten::gru.data(Tensor data, Tensor batch_sizes, Tensor hx, Tensor[] params, "
            "bool has_biases, int num_layers, float dropout, bool train, "
            "bool bidirectional) -> (Tensor, Tensor)")
PAD_PACKED = ("aten::_pad_packed_sequence(Tensor data, Tensor batch_sizes, bool batch_first, "
              "Scalar padding_value, int total_length) -> (Tensor, Tensor)")
PACK_BACKWARD = ("aten::_pack_padded_sequence_backward(Tensor grad, SymInt[] input_size, "
                 "Tensor batch_sizes, bool batch_first) -> Tensor")


@pytest.mark.parametrize("reader", ["gru", "pad", "pack_backward"])
def test_packed_batch_sizes_made_outside_the_step_add_up_to_the_packed_rows(reader):
    """A PackedSequence a collate function made: its ``batch_sizes`` were filled with
    random integers below 8, and the replay's ``lstm`` over 957 packed rows failed
    against its recorded hidden state of 32 ("size of tensor a (32) must match the
    size of tensor b (4)"). Non-increasing, the first the batch, adding up to the rows
    (50 steps, 957 rows, a batch of 32)."""
    builder = TraceBuilder()
    sizes = builder.tensor((50,), dtype="int64")
    data = builder.tensor((957, 16))
    if reader == "gru":
        params = [builder.tensor((48, 16)), builder.tensor((48, 16))]
        builder.op(GRU_DATA, [data, sizes, builder.tensor((1, 32, 16)), params, False, 1,
                              0.0, False, False],
                   [builder.tensor((957, 16)), builder.tensor((1, 32, 16))])
    elif reader == "pad":
        builder.op(PAD_PACKED, [data, sizes, True, 0.0, 50],
                   [builder.tensor((32, 50, 16)), builder.tensor((32,), dtype="int64")])
    else:
        builder.op(PACK_BACKWARD, [data, [50, 32, 16], sizes, False],
                   [builder.tensor((50, 32, 16))])
    init = _init_of(_program(builder))
    assert (init.kind, init.low, init.high) == ("descending", 957, 32)
    filled = runtime._fill_descending(50, 957, 32, None, "cpu", {}, torch.int64)
    assert filled[0] == 32 and filled.sum() == 957 and bool((filled.diff() <= 0).all())


SCALED_GROUPED_MM_V2 = (
    "aten::_scaled_grouped_mm_v2(Tensor self, Tensor mat2, Tensor[] scale_a, int[] recipe_a, "
    "int[] swizzle_a, Tensor[] scale_b, int[] recipe_b, int[] swizzle_b, Tensor? offs=None, "
    "Tensor? bias=None, ScalarType? out_dtype=None, int[] contraction_dim=[], "
    "bool use_fast_accum=False) -> Tensor")


def test_scaled_grouped_matmul_v2_offsets_are_group_ends_too():
    """The float8 grouped GEMM's second form (scales as lists) takes the same offs."""
    builder = TraceBuilder()
    offs = builder.tensor((4,), dtype="int32")
    builder.op(SCALED_GROUPED_MM_V2, [
        builder.tensor((128, 32), dtype="float8_e4m3fn"),
        builder.tensor((4, 32, 64), dtype="float8_e4m3fn"), [builder.tensor((128,))], [0],
        [0], [builder.tensor((4, 64))], [0], [0], offs, None, None, [], False],
        [builder.tensor((128, 64), dtype="bfloat16")])
    init = _init_of(_program(builder), "int32")
    assert (init.kind, init.low, init.high) == ("ends", 16, 128)


@pytest.mark.parametrize("groups,unit,total", [(4, 16, 128), (3, 16, 32), (5, 1, 7),
                                               (4, 1, 2), (1, 16, 64)])
def test_group_ends_rise_to_the_total_in_aligned_groups(groups, unit, total):
    ends = runtime._fill_ends(groups, unit, total, None, "cpu", {}, torch.int32)
    sizes = torch.diff(ends, prepend=torch.zeros(1, dtype=ends.dtype))
    assert ends.tolist()[-1] == total and bool((sizes >= 0).all())
    assert sizes.max() - sizes.min() <= (unit if total % unit == 0 else 1)
    assert all(size % unit == 0 for size in sizes.tolist()) or total % unit


def test_grouped_matmul_over_filled_ends_multiplies_every_row():
    """The filled ends, given to torch's own ``_grouped_mm``: every token meets its
    expert's weights, as a per-group loop computes it."""
    x, w = torch.randn(128, 32), torch.randn(4, 32, 16)
    ends = runtime._fill_ends(4, 16, 128, None, "cpu", {}, torch.int32).to(torch.int32)
    got = torch._grouped_mm(x.bfloat16(), w.bfloat16(), offs=ends).float()
    bounds = [0, *ends.tolist()]
    want = torch.cat([x[bounds[g]:bounds[g + 1]] @ w[g] for g in range(4)])
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=0.5, rtol=0.05)


@pytest.mark.parametrize("schema,args,target,bound", [
    # indices are flat positions in each output plane: below 3 * 4
    (MAX_UNPOOL2D, lambda b, t: [b.tensor((2, 3, 2, 2)), t, [3, 4]], (2, 3, 2, 2), 12),
    # class indices below the class count, as nll_loss's
    (MULTI_MARGIN, lambda b, t: [b.tensor((4, 6)), t, 1, 1, None, 1], (4,), 6),
    (MULTILABEL_MARGIN, lambda b, t: [b.tensor((4, 6)), t, 1], (4, 6), 6),
    # a 0-d input is one class: target 0
    (MULTI_MARGIN, lambda b, t: [b.tensor(()), t, 1, 1, None, 1], (), 1),
    # index_reduce had no rule at all
    ("aten::index_reduce(Tensor self, int dim, Tensor index, Tensor source, str reduce, "
     "*, bool include_self=True) -> Tensor",
     lambda b, t: [b.tensor((7, 3)), 0, t, b.tensor((4, 3)), "prod", True], (4,), 7),
])
def test_unpool_indices_and_margin_targets_stay_in_range(schema, args, target, bound):
    """OpInfo's max_unpool1d, multi(label)_margin_loss and index_reduce samples: their
    index tensors were filled 0..8 ("Found an invalid max index", "target out of
    range", "index out of range in self")."""
    b = TraceBuilder()
    t = b.tensor(target, dtype="int64")
    b.op(schema, args(b, t), [b.tensor(())])
    init = _init_of(_program(b))
    assert (init.kind, init.low, init.high) == ("randint", 0, bound)


UNSAFE_INDEX = "aten::_unsafe_index.Tensor(Tensor self, Tensor?[] indices) -> Tensor"
UNSAFE_INDEX_PUT = ("aten::_unsafe_index_put(Tensor self, Tensor?[] indices, Tensor values, "
                    "bool accumulate=False) -> Tensor")
SEARCHSORTED_SORTER = ("aten::searchsorted.Tensor(Tensor sorted_sequence, Tensor self, *, "
                       "bool out_int32=False, bool right=False, str? side=None, "
                       "Tensor? sorter=None) -> Tensor")
NARROW_TENSOR = ("aten::narrow.Tensor(Tensor(a) self, int dim, Tensor start, SymInt length) "
                 "-> Tensor(a)")


@pytest.mark.parametrize("schema,args,target,out,bound", [
    # a nearest 2x upsampling's row and column indices, as aot_eager replays it: the
    # columns (dim 3, size 6) were filled 0..8 ("index 7 is out of bounds for
    # dimension 1 with size 6")
    (UNSAFE_INDEX, lambda b, t: [b.tensor((4, 3, 5, 6)), [None, None, None, t]], (12,),
     (4, 3, 5, 12), 6),
    (UNSAFE_INDEX_PUT, lambda b, t: [b.tensor((5, 6)), [t], b.tensor((3, 6)), False], (3,),
     (5, 6), 5),
    # a window of 3 over 5 starts at 0, 1 or 2 (a 0-d start filled 1..8 as a wrapped
    # int: "start (6) + length (3) exceeds dimension size (5)")
    (NARROW_TENSOR, lambda b, t: [b.tensor((4, 3, 5, 6)), 2, t, 3], (), (4, 3, 3, 6), 3),
    (NARROW_TENSOR, lambda b, t: [b.tensor((4, 3, 5, 6)), -1, t, 6], (), (4, 3, 5, 6), 1),
    # a sorter holds positions in each row of a 5-long sequence
    (SEARCHSORTED_SORTER, lambda b, t: [b.tensor((4, 5)), b.tensor((4, 3)), False, False,
                                        None, t], (4, 5), (4, 3), 5),
])
def test_unchecked_indices_and_tensor_narrow_starts_stay_in_range(schema, args, target,
                                                                   out, bound):
    b = TraceBuilder()
    t = b.tensor(target, dtype="int64")
    b.op(schema, args(b, t), [b.tensor(out)])
    init = _init_of(_program(b))
    assert (init.kind, init.low, init.high) == ("randint", 0, bound)


FUSED_OBS_FQ = ("aten::fused_moving_avg_obs_fake_quant(Tensor self, Tensor observer_on, "
                "Tensor fake_quant_on, Tensor(a!) running_min, Tensor(b!) running_max, "
                "Tensor(c!) scale, Tensor(d!) zero_point, float averaging_const, "
                "int quant_min, int quant_max, int ch_axis, bool per_row_fake_quant=False, "
                "bool symmetric_quant=False) -> Tensor")


def test_qat_flags_without_recorded_reads_are_on():
    """QAT's observer and fake-quantization flags (one-element int64 buffers) were
    filled 0..8: where fake_quant_on drew 0 the op skipped its quantization (0.8 ms
    against 12.4 for 1M elements). Without children that show them, both are 1."""
    b = TraceBuilder()
    observer_on, fake_quant_on = b.tensor((1,), dtype="int64"), b.tensor((1,), dtype="int64")
    b.op(FUSED_OBS_FQ, [b.tensor((8, 16)), observer_on, fake_quant_on, b.tensor((1,)),
                        b.tensor((1,)), b.tensor((1,)), b.tensor((1,), dtype="int32"),
                        0.01, 0, 255, -1, False, False], [b.tensor((8, 16))])
    inits = [s.init for s in _program(b).storages if s.materialised and s.dtype == "int64"]
    assert [i.kind for i in inits] == ["ones"] * 2


@pytest.mark.parametrize("dtype", ["bool", "int64"])
def test_an_asserted_flag_made_outside_the_step_holds(dtype):
    """``torch._assert_async(ok, "bad input")`` of a flag the data pipeline computed:
    filled True or False at random, the replay raised "bad input" at seeds 1 and 2."""
    b = TraceBuilder()
    flag = b.tensor((), dtype=dtype)
    b.op("aten::_assert_async.msg(Tensor self, str assert_msg) -> ()", [flag, "bad input"],
         [])
    init = _init_of(_program(b), dtype)
    assert init.kind == "ones"


def test_float_powers_base_is_positive_as_pows():
    """float_power (pow in double) of a U(-1, 1) base to a 0-d exponent filled near 1
    was NaN (OpInfo's float_power sample; the original's exponent was integral)."""
    b = TraceBuilder()
    base, exponent = b.tensor((5,), dtype="float64"), b.tensor(())
    b.op("aten::float_power.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor",
         [base, exponent], [b.tensor((5,), dtype="float64")])
    init = _init_of(_program(b), "float64")
    assert (init.kind, init.low, init.high) == ("uniform", 0.5, 1.5)


RSUB = "aten::rsub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor"
DIV = "aten::div.Tensor(Tensor self, Tensor other) -> Tensor"
POW_SCALAR = "aten::pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor"


@pytest.mark.parametrize("exponent, positive", [(0.5, True), (1.5, True), (2.0, False)])
def test_a_fractional_powers_base_is_positive_through_a_ratio(exponent, positive):
    """``((1 - a) / a) ** 0.5``, diffusers' DPM-Solver and Euler sigmas from a schedule
    buffer: a power's preferred range did not carry into the ratio, the buffer was
    filled (0.5, 1.5), 1 - a went negative and every sigma was NaN. A non-integral
    exponent is a square root's domain; a square stays a preferred range (positivity
    carried back from ``h ** 2`` made whole networks positive)."""
    b = TraceBuilder()
    a, complement, ratio = b.tensor((100,)), b.tensor((100,)), b.tensor((100,))
    b.op(RSUB, [a, 1, 1], [complement])
    b.op(DIV, [complement, a], [ratio])
    b.op(POW_SCALAR, [ratio, exponent], [b.tensor((100,))])
    init = _init_of(_program(b), "float32")
    assert (init.low > 0 and init.high < 1) is positive, init


ARANGE = ("aten::arange.start(Scalar start, Scalar end, *, ScalarType? dtype=None, "
          "Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor")
MUL = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
EXP = "aten::exp(Tensor self) -> Tensor"


@pytest.mark.parametrize("half, divisor", [(128, "int64"), (1000, "float64"), (4, "int64")])
def test_wrapped_numbers_scaling_positions_keep_an_exponent_finite(half, divisor):
    """``exp(-log(10000) * arange(half) / half)``, the sinusoidal timestep embedding of
    diffusers' DiT, SD3 and Flux: from a plain trace the two numbers were filled near
    1, the exponent reached half, and from 89 up float32's exp was inf (a DiT training
    replay ended with every weight NaN). The multiplier keeps the exponent in [-10, 0]
    with the divisor at its least fill."""
    b = TraceBuilder()
    positions, scaled, ratio = b.tensor((half,)), b.tensor((half,)), b.tensor((half,))
    multiplier, count = b.tensor((), dtype="float64"), b.tensor((), dtype=divisor)
    b.op(ARANGE, [0, half, 6, None, Device("cpu"), False], [positions])
    b.op(MUL, [positions, multiplier], [scaled])
    b.op(DIV, [scaled, count], [ratio])
    b.op(EXP, [ratio], [b.tensor((half,))])
    inits = [s.init for s in _program(b).storages if s.materialised]
    scaled_by = [init for init in inits if "positions" in init.why]
    assert len(scaled_by) == 1, inits
    least = 1.0 if divisor == "int64" else 0.5
    init = scaled_by[0]
    assert init.high <= 0 and init.low * half / least >= -10.0 - 1e-9, init


@pytest.mark.parametrize("alias,dtype,expect", [
    # torch.true_divide of booleans: x / False = inf (OpInfo's bool true_divide sample)
    ("aten::true_divide.Tensor(Tensor self, Tensor other) -> Tensor", "bool",
     ("ones", 0, 0)),
    # torch.special.logit: log(x / (1 - x)) outside (0, 1) is NaN
    ("aten::special_logit(Tensor self, float? eps=None) -> Tensor", "float32",
     ("uniform", 0.05, 0.95)),
])
def test_an_alias_keeps_the_domain_of_the_op_it_calls(alias, dtype, expect):
    """The rules name canonical ops (div, logit); an alias or wrapper records its own
    name above the op it calls with the same tensors, and is replayed whole: the
    rule of its recorded child holds for the tensors both read."""
    b = TraceBuilder()
    x, other, out = b.tensor((6,), dtype=dtype), b.tensor((6,), dtype=dtype), b.tensor((6,))
    two = alias.startswith("aten::true_divide")
    parent = b.op(alias, [x, other] if two else [x, None], [out])
    child = ("aten::div.Tensor(Tensor self, Tensor other) -> Tensor" if two else
             "aten::logit(Tensor self, float? eps=None) -> Tensor")
    b.op(child, [x, other] if two else [x, None], [out], parent=parent)
    program = _program(b)
    inits = [s.init for s in program.storages if s.materialised and s.dtype == dtype]
    got = inits[-1] if two else inits[0]  # the divisor; logit's only input
    assert (got.kind, got.low, got.high) == expect


@pytest.mark.parametrize("p,low", [(1, 0.5), (3, 1.5), (5, 2.5)])
def test_a_multivariate_log_gammas_input_lies_above_its_pole(p, low):
    """mvlgamma(x, p) sums lgamma(x - j / 2) for j < p: NaN-free only where
    x > (p - 1) / 2 (OpInfo's mvlgamma samples, p = 3 and 5, replayed NaN from
    lgamma's own range)."""
    b = TraceBuilder()
    b.op("aten::mvlgamma(Tensor self, int p) -> Tensor", [b.tensor((5,)), p],
         [b.tensor((5,))])
    init = _init_of(_program(b), "float32")
    assert (init.kind, init.low, init.high) == ("uniform", low, low + 1.5)


@pytest.mark.parametrize("schema,expect", [
    (LOG, ("randint", 1, 8)),  # log(0) = -inf
    ("aten::acos(Tensor self) -> Tensor", ("randint", 0, 1)),  # acos(2) = NaN
    ("aten::lgamma(Tensor self) -> Tensor", ("randint", 1, 3)),  # lgamma(0) = inf
])
def test_integral_inputs_of_floating_functions_stay_in_their_domains(schema, expect):
    """OpInfo's int64 samples: a floating function of an integral tensor (filled 0..8)
    returned inf or NaN where the original's values were in its domain."""
    b = TraceBuilder()
    b.op(schema, [b.tensor((6,), dtype="int64")], [b.tensor((6,))])
    init = _init_of(_program(b))
    assert (init.kind, init.low, init.high) == expect


@pytest.mark.parametrize("schema,expect", [
    ("aten::atanh(Tensor self) -> Tensor", "zeros"),  # atanh(True) = inf
    ("aten::div.Tensor(Tensor self, Tensor other) -> Tensor", "ones"),  # x / False
    ("aten::log1p(Tensor self) -> Tensor", "bool"),  # either is in its domain
])
def test_boolean_inputs_of_floating_functions_stay_in_their_domains(schema, expect):
    b = TraceBuilder()
    x = b.tensor((6,), dtype="bool")
    args = [b.tensor((6,)), x] if "div" in schema else [x]
    b.op(schema, args, [b.tensor((6,))])
    assert _init_of(_program(b), "bool").kind == expect


def test_a_complex_matrix_cholesky_factors_is_filled_positive_definite():
    """OpInfo's complex64 cholesky sample: SPD fills skipped complex storages, and
    linalg.cholesky refused the matrix filled at random."""
    b = TraceBuilder()
    b.op("aten::linalg_cholesky(Tensor self, *, bool upper=False) -> Tensor",
         [b.tensor((5, 5), dtype="complex64"), False], [b.tensor((5, 5), dtype="complex64")])
    init = _init_of(_program(b), "complex64")
    assert (init.kind, init.low) == ("spd", 5)


def test_sparse_indices_stay_inside_the_sparse_dims():
    """A COO tensor's indices (sparse_dim x nnz) index its size's first dims: every
    value stays below the smallest (without this, 0..8 over a 4-row tensor)."""
    schema = ("aten::sparse_coo_tensor.indices_size(Tensor indices, Tensor values, "
              "int[] size, *, ScalarType? dtype=None, Layout? layout=None, "
              "Device? device=None, bool? pin_memory=None, bool? is_coalesced=None) -> Tensor")
    b = TraceBuilder()
    indices = b.tensor((2, 6), dtype="int64")
    b.op(schema, [indices, b.tensor((6, 3)), [5, 9, 3], None, None, None, None, None],
         [b.tensor((5, 9, 3))])
    init = _init_of(_program(b))
    assert (init.kind, init.low, init.high) == ("randint", 0, 5)


def test_embedding_indices_and_loss_targets_intersect_when_shared():
    b = TraceBuilder()
    ids = b.tensor((6,), dtype="int64")
    b.op(EMBEDDING, [b.tensor((50, 4)), ids], [b.tensor((6, 4))])
    b.op(NLL, [b.tensor((6, 10)), ids], [b.tensor(())])
    init = _init_of(_program(b))
    assert (init.kind, init.high) == ("randint", 10)


def test_bag_offsets_sorted_and_last_offset_fixed_when_included():
    for include_last, kind in ((False, "offsets"), (True, "cuts")):
        b = TraceBuilder()
        indices, offsets = b.tensor((40,), dtype="int64"), b.tensor((9,), dtype="int32")
        b.op(BAG, [b.tensor((100, 8)), indices, offsets, False, 0, False, None, include_last],
             [b.tensor((8, 8)), b.tensor((0,), dtype="int64"), b.tensor((8,), dtype="int64"),
              b.tensor((8,), dtype="int64")])
        program = _program(b)
        inits = {s.dtype: s.init for s in program.storages if s.materialised}
        assert (inits["int64"].kind, inits["int64"].high) == ("randint", 100)
        assert (inits["int32"].kind, inits["int32"].high) == (kind, 40)


def test_bound_flows_back_through_a_selection():
    """y[mask] feeds a loss: y itself must hold valid class indices."""
    b = TraceBuilder()
    y, mask = b.tensor((12,), dtype="int64"), b.tensor((12,), dtype="bool")
    picked = b.tensor((5,), dtype="int64")
    b.op(INDEX, [y, [mask]], [picked])
    b.op(NLL, [b.tensor((5, 7)), picked], [b.tensor(())])
    program = _program(b)
    inits = {s.dtype: s.init for s in program.storages if s.materialised}
    assert (inits["int64"].kind, inits["int64"].high) == ("randint", 7)
    assert (inits["bool"].kind, inits["bool"].low) == ("mask", 5)


# -- data-dependent output sizes -------------------------------------------------------


@pytest.mark.parametrize("schema,in_dtype,outputs,expect", [
    (NONZERO, "bool", [((9, 2), "int64")], ("mask", 9)),
    (UNIQUE, "int64", [((4,), "int64"), ((0,), "int64"), ((0,), "int64")], ("distinct", 4)),
    (BINCOUNT, "int64", [((13,), "int64")], ("span", 0)),
    # one_hot(x) counts its classes from the values: the largest is the last class
    (ONE_HOT, "int64", [((30, 13), "int64")], ("span", 0)),
])
def test_input_filled_for_recorded_output_size(schema, in_dtype, outputs, expect):
    b = TraceBuilder()
    x = b.tensor((5, 6) if schema == NONZERO else (30,), dtype=in_dtype)
    extra = {BINCOUNT: [None, 0], UNIQUE: [True, False, False], ONE_HOT: [-1]}
    b.op(schema, [x, *extra.get(schema, [])], [b.tensor(s, dtype=d) for s, d in outputs])
    init = _init_of(_program(b), in_dtype)
    assert (init.kind, init.low) == expect
    if schema in (BINCOUNT, ONE_HOT):
        assert init.high == 12


def test_where_mask_masked_select_and_repeats():
    b = TraceBuilder()
    cond, mask, reps = (b.tensor((4, 5), dtype="bool"), b.tensor((4, 5), dtype="uint8"),
                        b.tensor((6,), dtype="int32"))
    b.op(WHERE, [cond], [[b.tensor((7,), dtype="int64"), b.tensor((7,), dtype="int64")]])
    b.op(MASKED_SELECT, [b.tensor((3, 4, 5)), mask], [b.tensor((24,))])
    b.op(REPEAT, [b.tensor((6, 2)), reps, 0], [b.tensor((17, 2))])
    inits = {s.dtype: s.init for s in _program(b).storages if s.materialised}
    assert (inits["bool"].kind, inits["bool"].low) == ("mask", 7)
    assert (inits["uint8"].kind, inits["uint8"].low) == ("mask", 8)  # 24 over 3 broadcasts
    assert (inits["int32"].kind, inits["int32"].low) == ("sum", 17)


MASKED_FILL = "aten::masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor"
BITWISE_NOT = "aten::bitwise_not(Tensor self) -> Tensor"
WHERE_SCALAR_OTHER = ("aten::where.ScalarOther(Tensor condition, Tensor self, Scalar other) "
                      "-> Tensor")
SDPA = ("aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, "
        "Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, "
        "float? scale=None, bool enable_gqa=False) -> Tensor")
SOFTMAX = "aten::softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor"


def _masked_scores(mask_op: str, value: float) -> str:
    """The fill of a boolean mask input that masks attention scores before a softmax:
    ``masked_fill(mask, value)``, ``masked_fill(~mask, value)`` (through a view),
    ``where(mask, scores, value)``, or a boolean ``attn_mask`` of attention."""
    b = TraceBuilder()
    mask, scores = b.tensor((2, 4), dtype="bool"), b.tensor((2, 4))
    out = b.tensor((2, 4))
    if mask_op == "masked_fill":
        b.op(MASKED_FILL, [scores, mask, value], [out])
    elif mask_op == "negated":
        negated = b.tensor((2, 4), dtype="bool")
        b.op(BITWISE_NOT, [b.view(mask, (2, 4))], [negated])
        b.op(MASKED_FILL, [scores, negated, value], [out])
    elif mask_op == "where":
        b.op(WHERE_SCALAR_OTHER, [mask, scores, value], [out])
    else:
        q = b.tensor((1, 2, 4))
        b.op(SDPA, [q, q, q, b.view(mask, (1, 2, 4)), 0.0, False, None, False],
             [b.tensor((1, 2, 4))])
        return _init_of(_program(b), "bool").kind
    b.op(SOFTMAX, [out, -1, None], [b.tensor((2, 4))])
    return _init_of(_program(b), "bool").kind


@pytest.mark.parametrize("mask_op,value,kind", [
    ("masked_fill", float("-inf"), "zeros"),  # True masks: none does
    ("negated", float("-inf"), "ones"),  # ~keep masks: keep all
    ("where", float("-inf"), "ones"),  # where(keep, scores, -inf)
    ("sdpa", 0.0, "ones"),  # a boolean attn_mask: True attends
    ("masked_fill", 0.0, "bool"),  # a finite value: any mask is fine
])
def test_a_mask_that_puts_inf_in_scores_keeps_every_element(mask_op, value, kind):
    """A padding mask's values are not in a plain ET. Filled half true, a row of a few
    keys was all masked, and the softmax over it NaN (a random program's replay):
    a mask that puts a value that is not finite keeps every element instead."""
    assert _masked_scores(mask_op, value) == kind


GT = "aten::gt.Scalar(Tensor self, Scalar other) -> Tensor"
INDEX_PUT_IMPL = ("aten::_index_put_impl_(Tensor(a!) self, Tensor?[] indices, Tensor values, "
              "bool accumulate=False, bool unsafe=False) -> Tensor(a!)")


def test_a_boolean_index_gets_the_recorded_count_given_or_computed():
    """x[mask] keeps its recorded rows: a given mask is filled with that many trues; a
    computed one (``ids > 10``, from replayed ids) is fitted where it is made, so the
    backward's index_put_ with the same mask takes as many values as the forward made."""
    b = TraceBuilder()
    given = b.tensor((6,), dtype="bool")
    b.op(INDEX, [b.tensor((6, 4)), [given]], [b.tensor((4, 4))])
    ids = b.tensor((3, 5), dtype="int64")
    mask = b.tensor((3, 5), dtype="bool")
    b.op(GT, [ids, 10], [mask])
    h = b.tensor((3, 5, 8))
    b.op(INDEX, [h, [mask]], [b.tensor((9, 8))])
    b.op(INDEX_PUT_IMPL, [b.tensor((3, 5, 8)), [mask], b.tensor((9, 8)), True, True],
         [b.tensor((3, 5, 8))])
    # A mask only where reads, as a mixture of experts routes: its result is fitted, and
    # fitting the mask as well would cost a sync per expert every iteration.
    routed = b.tensor((3, 5), dtype="bool")
    b.op(GT, [ids, 20], [routed])
    b.op(WHERE, [routed], [[b.tensor((4,), dtype="int64"), b.tensor((4,), dtype="int64")]])
    program = _program(b)
    assert (_init_of(program, "bool").kind, _init_of(program, "bool").low) == ("mask", 4)
    assert program.ops[1].true_counts == {0: 9}
    assert program.ops[4].name == "aten::gt" and program.ops[4].true_counts == {}
    text = generate_source(program)
    assert "gt = _fit_mask(gt, 9, site=(1, 0))" in text and text.count("_fit_mask(gt") == 1


def test_a_fit_is_kept_for_reuse_only_where_no_later_op_writes_the_value():
    """Routing indices the step only reads are fitted once and the fit reused (a mixture
    of experts fits every expert's token list, every iteration); indices a later op
    writes in place are fitted anew each iteration, since a kept fit would carry the
    write into the next one."""
    b = TraceBuilder()
    chosen = b.tensor((8, 2), dtype="bool")
    read_only = [b.tensor((5,), dtype="int64"), b.tensor((5,), dtype="int64")]
    b.op(WHERE, [chosen], [read_only])
    b.op(INDEX, [b.tensor((8, 4)), [read_only[0]]], [b.tensor((5, 4))])
    written = [b.tensor((3,), dtype="int64"), b.tensor((3,), dtype="int64")]
    b.op(WHERE, [b.tensor((8, 2), dtype="bool")], [written])
    b.op(ADD_, [written[0], b.tensor((3,), dtype="int64"), 1], [written[0]])
    program = _program(b)
    assert [op.fits_reusable for op in program.ops if op.name == "aten::where"] == [True,
                                                                                     False]
    text = generate_source(program)
    assert "where = _fit(where, [[5], [5]], [[1], [1]], site=(0, 0))" in text
    assert "where = _fit(where, [[3], [3]], [[1], [1]])\n" in text


def test_jagged_lengths_add_up_to_the_values():
    b = TraceBuilder()
    lengths = b.tensor((4,), dtype="int64")
    b.op(SEGMENT, [b.tensor((10, 3)), "sum", lengths, None, None, 0], [b.tensor((4, 3))])
    init = _init_of(_program(b))
    assert (init.kind, init.low) == ("sum", 10)


JAGGED_TO_PADDED = ("aten::_jagged_to_padded_dense_forward(Tensor values, Tensor[] offsets, "
                    "SymInt[] max_lengths, float padding_value=0.0) -> Tensor")


def test_a_nested_tensors_offsets_given_as_a_list_cut_all_its_values():
    """A nested tensor built in the step from values and offsets made outside it
    (``nested_tensor_from_jagged``), padded: the rule for ``offsets`` was never applied
    to a ``Tensor[]`` of one, the offsets were filled 0..8, and the replay raised "The
    size of tensor a (105) must match the size of tensor b (0)"."""
    b = TraceBuilder()
    offsets = b.tensor((5,), dtype="int64")
    b.op(JAGGED_TO_PADDED, [b.tensor((107, 64)), [offsets], [107], 0.0],
         [b.tensor((4, 107, 64))])
    init = _init_of(_program(b))
    assert (init.kind, init.low, init.high) == ("cuts", 0, 107)


ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
SUB = "aten::sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"


@pytest.mark.parametrize("combine, alpha, positive", [(ADD, 1, True), (ADD, -1, False),
                                                      (SUB, 1, False)])
def test_a_log_of_a_product_needs_non_negative_factors(combine, alpha, positive):
    """``log(mel @ power + eps)``: the filter bank, filled with both signs, took logs of
    negative numbers and a training replay went NaN. Sums, products and matmuls keep
    signs, so the log's domain carries back to their inputs; a difference does not."""
    b = TraceBuilder()
    bank, power, floor = b.tensor((8, 6)), b.tensor((6, 5)), b.tensor((8, 5))
    product, total = b.tensor((8, 5)), b.tensor((8, 5))
    b.op(MM, [bank, power], [product])
    b.op(combine, [product, floor, alpha], [total])
    b.op(LOG, [total], [b.tensor((8, 5))])
    inits = {s.extent: s.init for s in _program(b).storages if s.materialised}
    assert (inits[48].low >= 0) is positive, inits[48]  # the bank
    assert (inits[30].low >= 0) is positive, inits[30]  # the power


def test_float_rules_keep_values_finite():
    b = TraceBuilder()
    p, x = b.tensor((8,)), b.tensor((8,), dtype="float64")
    b.op(BERNOULLI, [p, None], [b.tensor((8,))])
    b.op(LOG, [x], [b.tensor((8,), dtype="float64")])
    inits = {s.dtype: s.init for s in _program(b).storages if s.materialised}
    assert (inits["float32"].low, inits["float32"].high) == (0.0, 1.0)
    assert inits["float64"].low > 0


LINEAR = "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor"


def test_loss_targets_in_their_domains_keep_a_training_replay_finite(tmp_path):
    """Probability targets (BCE with logits, KL divergence) in [0, 1] and counts
    (Poisson NLL) non-negative: filled U(-1, 1), KL's log of a negative target made
    every weight NaN in one step, and an EmbeddingBag recommender's BCE drove its
    weights to NaN within a hundred iterations without --reset-inputs."""
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 4)
    x, labels = torch.randn(16, 8), torch.rand(16, 4)
    probs, counts = torch.softmax(torch.randn(16, 4), -1), torch.poisson(torch.ones(16, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def step() -> None:
        opt.zero_grad()
        out = net(x)
        loss = (F.binary_cross_entropy_with_logits(out, labels)
                + F.kl_div(out.log_softmax(-1), probs, reduction="batchmean")
                + F.poisson_nll_loss(out, counts))
        loss.backward()
        opt.step()

    result = capture(step, tmp_path, name="losses", kineto=False, timing_iters=1)
    program = build_program(load_trace(result.et_path))
    ranges = [(s.init.low, s.init.high) for s in program.storages if s.materialised]
    assert ranges.count((0.0, 1.0)) >= 2 and (0.0, 2.0) in ranges, ranges
    bench = tmp_path / "losses_bench.py"
    generate(result.et_path, bench, GenerateOptions(command_line="test"))
    _assert_replays_finite(bench, 20)


def test_centred_moments_and_quantile_levels_stay_in_their_domains(tmp_path):
    """RMSprop(centered=True) takes the square root of square_avg - grad_avg**2, which
    its EMAs keep non-negative and state filled at random did not (NaN in one step,
    looped and foreach alike); torch.quantile refuses levels outside [0, 1] (the
    replay failed on its first call)."""
    torch.manual_seed(0)
    nets = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)]
    opts = [torch.optim.RMSprop(nets[0].parameters(), centered=True, foreach=False),
            torch.optim.RMSprop(nets[1].parameters(), centered=True, momentum=0.9,
                                foreach=True)]
    x, levels = torch.randn(4, 8), torch.tensor([0.1, 0.5, 0.9])

    def step() -> None:
        for opt in opts:
            opt.zero_grad()
        sum(torch.quantile(net(x), levels, dim=1).sum() for net in nets).backward()
        for opt in opts:
            opt.step()

    result = capture(step, tmp_path, name="rmsprop", kineto=False, timing_iters=1)
    bench = tmp_path / "rmsprop_bench.py"
    generate(result.et_path, bench, GenerateOptions(command_line="test"))
    _assert_replays_finite(bench, 10)


def test_a_loss_target_autograd_does_not_differentiate_replays_without_grad(tmp_path):
    """soft_margin_loss's float target is read in grad mode but has no gradient formula:
    made a parameter, the replay's first call raised."""
    torch.manual_seed(0)
    x, target = torch.randn(5, requires_grad=True), torch.randn(5).sign()
    et = record_et(lambda: (0 + F.soft_margin_loss(x, target).sum()).backward(),
                   tmp_path / "sm.json")
    bench = tmp_path / "sm_bench.py"
    generate(et, bench, GenerateOptions(command_line="test"))
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-800:]


def test_draws_special_functions_and_cached_pivots_read_inputs_in_their_domains(tmp_path):
    """Parameters a step reads as they are, filled by the replay: a Poisson rate, a
    binomial's probabilities, a normal's std (torch raises on each out of its domain:
    "invalid Poisson rate"), gamma and Dirichlet concentrations, erfinv/logit/xlogy/
    igamma arguments (NaN outside theirs, which the gradient put into the weights) and
    an LU factorisation computed once and solved against in each step ("Pivots given
    to lu_solve must all be greater or equal to 1")."""
    torch.manual_seed(0)
    conc = torch.nn.Parameter(torch.rand(3, 4) + 0.5)
    w = torch.nn.Parameter(torch.randn(6))
    rate, prob, std = torch.rand(6) * 3, torch.rand(6), torch.rand(6) + 0.1
    u, p, q = torch.rand(6) * 1.8 - 0.9, torch.rand(6) * 0.9 + 0.05, torch.rand(6) + 0.1
    lu, pivots = torch.linalg.lu_factor(torch.randn(6, 6) + 6 * torch.eye(6))
    opt = torch.optim.SGD([conc, w], lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        draws = (Poisson(rate).sample().sum() + Binomial(10, probs=prob).sample().sum()
                 + torch.normal(torch.zeros(6), std).sum())
        special = torch.erfinv(u) + torch.logit(p) + torch.xlogy(w, q) + torch.igamma(q, p)
        solved = torch.linalg.lu_solve(lu, pivots, w[:, None])
        loss = (Gamma(conc, conc).rsample().sum() + Dirichlet(conc).rsample().sum()
                + (special * w).sum() + solved.sum() + draws * 0)
        loss.backward()
        opt.step()

    result = capture(step, tmp_path, name="domains", kineto=False, timing_iters=1)
    bench = tmp_path / "domains_bench.py"
    generate(result.et_path, bench, GenerateOptions(command_line="test"))
    _assert_replays_finite(bench, 5)


@pytest.mark.parametrize("foreach", [True, False])
def test_adams_first_step_keeps_rows_no_token_used_finite(foreach, tmp_path):
    """A trace of Adam's first step makes its state in the step (zeros), and an
    embedding row no token used has a zero gradient there: its update is 0 / (0 + eps).
    The observer writes eps = 1e-8 as 0.0 (six decimals), and replayed as 0 the
    foreach update was 0 / 0, NaN in the weight (the PARAM GPT-2 trace: 43 weights)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 4))
    opt = torch.optim.Adam(model.parameters(), foreach=foreach)
    ids = torch.tensor([[1, 2, 3], [2, 5, 7]])
    et_path = tmp_path / "adam.et.json"
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    observer.start()
    opt.zero_grad()
    model(ids).pow(2).mean().backward()
    opt.step()
    observer.stop()
    observer.unregister_callback()
    bench = tmp_path / "adam_bench.py"
    text = generate(et_path, bench, GenerateOptions(command_line="test"))
    _assert_replays_finite(bench, 2)
    # foreach adds eps as a Scalar (recorded 0.0); the loop adds it to a tensor as a
    # wrapped number, whose value the trace does not record (numbers.py: 1.0).
    assert ("eps arguments recorded as 0.0" in " ".join(text.split())) == foreach


def test_values_read_through_a_selection_and_wrapped_ints_keep_their_domains(tmp_path):
    """Traced with a plain observer (no values, no ranges): a schedule buffer read
    through ``index`` and ``gather`` and raised to 0.5 beside its complement
    (diffusers' ``add_noise``: ``alphas_cumprod[t] ** 0.5``, ``(1 - alphas_cumprod[t])
    ** 0.5``): both powers' domains are the buffer's, (0, 1); and Python ints in
    arithmetic (``h / (k * var)``), which the argument parser wraps as 0-d int64
    tensors: filled with 0, the division made inf and the weights NaN."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    schedule, var = torch.rand(100), torch.rand(4) + 0.5
    opt = torch.optim.SGD(lin.parameters(), lr=1e-3)

    def step() -> None:
        t = torch.randint(0, 100, (4,))
        opt.zero_grad()
        a = schedule[t]
        snr = a / (1 - a)
        h = lin(torch.randn(4, 8)) * (a ** 0.5 + (1 - a) ** 0.5 + snr.clamp(max=5) / snr)
        h = h * schedule.gather(0, t) ** 1.5
        for k in range(2, 14):
            h = h / (k * var)
        (h.sum() + lin(torch.randn(4, 8)).square().mean()).backward()
        opt.step()

    et_path = record_et(step, tmp_path / "domains.et.json")
    bench = tmp_path / "domains_bench.py"
    text = generate(et_path, bench, GenerateOptions(command_line="test"))
    _assert_replays_finite(bench, 3)
    # A power's range stays on what it reads and copies: carried back through sums and
    # products (`h.square()`), it filled the weights positive and a network overflowed.
    assert not re.search(r'linear_w\w* = _fill\([^)]*"uniform", 0\.5, 1\.5', text), text


def test_a_diffusion_steps_embedding_and_sigmas_from_a_plain_trace_replay_finite(tmp_path):
    """A DiT-like training step traced with a plain observer: the sinusoidal timestep
    embedding ``exp(-log(10000) * arange(128) / 128)`` (numbers filled near 1: exp of
    up to 127, inf, and NaN in every weight after the backward) and DPM-Solver's
    ``((1 - a) / a) ** 0.5`` of a schedule buffer (filled (0.5, 1.5): NaN sigmas)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 8)
    alphas_cumprod = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 100), 0)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        t = torch.randint(0, 100, (4,))
        sigmas = ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5
        half = 128
        exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32)
        freqs = torch.exp(exponent / half)
        args = t[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], -1)
        (lin(emb) * sigmas[t, None]).square().mean().backward()
        opt.step()

    et_path = record_et(step, tmp_path / "dit.et.json")
    bench = tmp_path / "dit_bench.py"
    generate(et_path, bench, GenerateOptions(command_line="test"))
    _assert_replays_finite(bench, 3)


def test_literals_written_by_setitem_replay_as_zero_unless_they_divide(tmp_path):
    """``x[...] = literal`` lifts the literal to a 0-d tensor (``aten::lift_fresh``)
    whose value the trace does not hold. transformers' samplers keep a row's best token
    with ``remove[..., :1] = False`` (or ``= 0``); filled at random, every token of a
    row was removed, and multinomial refused the NaN probabilities. A literal that ends
    up dividing (``counts[counts == 0] = 1``) must still never be 0."""
    torch.manual_seed(0)
    logits = torch.randn(6, 16)
    counts = torch.randint(0, 3, (6,))

    def step() -> None:
        for flags in ((logits > -1e9), (logits > -1e9).long()):
            remove = flags.clone()
            remove[:, :1] = False if flags.dtype == torch.bool else 0
            probs = logits.masked_fill(remove.bool(), float("-inf")).softmax(-1)
            torch.multinomial(probs, 2)
        safe = counts.clone()
        safe[safe == 0] = 1
        torch.div(torch.arange(6), safe, rounding_mode="floor")

    et_path = record_et(step, tmp_path / "literals.et.json")
    program = build_program(load_trace(et_path))
    literals = [op.args[0].value.storage for op in program.ops if op.name == "aten::lift_fresh"]
    assert len(literals) == 3 and all(s is not None and s.init is not None for s in literals)
    assert [(s.init.kind, s.init.low) for s in literals[:2]] == [("zeros", 0), ("randint", 0)]
    assert literals[2].init.low >= 1  # divides
    bench = tmp_path / "literals_bench.py"
    generate(et_path, bench, GenerateOptions(command_line="test"))
    _assert_replays_finite(bench, 3)


def test_literals_that_later_code_tests_for_replay_as_those_values(tmp_path):
    """The trace holds no value for a literal ``x[...] = v`` writes; where later code
    tells it, it replays as that value: a matcher's ``matched[iou < t] = -1`` tested
    with ``matched >= 0`` (-1: filled 0, every anchor matched a box), labels set to
    -100 where a loss ignores -100, and -2 where ``x == -2`` tests for it."""
    torch.manual_seed(0)
    x, boxes_iou = torch.randn(8, 4), torch.rand(8, 5)
    targets = torch.randint(0, 3, (8,))
    head = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)

    def step() -> None:
        opt.zero_grad()
        best, matched = boxes_iou.max(1)
        matched[best < 0.5] = -1
        kind = targets.clone()
        kind[best > 0.9] = -2
        labels = targets.clone()
        labels[labels == 0] = -100
        logits = head(x)
        foreground = (matched >= 0) | (kind == -2)
        (F.cross_entropy(logits, labels) + logits[foreground].sum()).backward()
        opt.step()

    et_path = record_et(step, tmp_path / "markers.et.json")
    bench = tmp_path / "markers_bench.py"
    generate(et_path, bench, GenerateOptions(command_line="test"))
    text = bench.read_text()
    for value in (-1, -2, -100):
        assert f'"span", {value}, {value}, gens)' in text, value
    _assert_replays_finite(bench, 3)


def test_buffers_read_through_spectra_ratios_products_and_quantizers_keep_their_domains(
        tmp_path):
    """Module state whose values the trace does not hold, each read the way real code
    reads it, each replayed NaN, out of range or refused before its rule: whitening by
    ``eigh``'s eigenvalues and a Gaussian's ``logdet`` of a covariance buffer
    (positive-definite), multinomial over ``c / c.sum()`` of a counts buffer (a range
    above 0 asks for positive counts), a DDPM schedule ``1 - cumprod(1 - betas)``
    under a square root (a product in (0, 1) has its factors there, and a complement's
    range bounds its tensor on both sides), CTC targets (classes of log_probs' last
    dim: out of range, the kernel reads past its buffers), and per-channel fake
    quantization with an observer's scale and zero point (positive, in range, and no
    parameters: the kernel refuses ones that require grad), and inverse-CDF sampling
    (``searchsorted`` of a filled cdf gives one past the end: wrapped where forward and
    backward read it as an index), and a padding mask from a lengths buffer (lengths
    compared with ``arange(n)`` lie in [1, n]: a 0 masked a whole softmax row)."""
    torch.manual_seed(0)
    lin, proj = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)
    cov, counts = torch.eye(4) * 2, torch.rand(16) + 0.1
    betas, targets = torch.full((8,), 0.01), torch.ones(2, 5, dtype=torch.long)
    scale, zero_point = torch.full((4,), 0.1), torch.zeros(4, dtype=torch.int32)
    x, frames = torch.randn(8, 4), torch.randn(12, 2, 4)
    table, probs, u = torch.nn.Parameter(torch.randn(16, 4)), torch.full((16,), 1 / 16), \
        torch.rand(16)
    lengths = torch.full((8,), 3)
    opt = torch.optim.SGD([*lin.parameters(), *proj.parameters(), table], lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        eigenvalues, vectors = torch.linalg.eigh(cov)
        h = lin(x) @ vectors * eigenvalues.rsqrt() + torch.logdet(cov)
        h = h * (1 - torch.cumprod(1 - betas, 0)).sqrt()[:, None]
        q = torch.fake_quantize_per_channel_affine(lin.weight, scale, zero_point, 0, 0, 15)
        ctc = F.ctc_loss(proj(frames).log_softmax(-1), targets, [12, 12], [5, 5])
        drawn = table.index_select(0, torch.searchsorted(probs.cumsum(0), u))
        keep = torch.arange(4)[None, :] < lengths[:, None]
        h = h.masked_fill(~keep, float("-inf")).softmax(-1)
        (h.sum() + (x @ q).sum() + ctc + drawn.sum()).backward()
        opt.step()
        torch.multinomial(counts / counts.sum(), 4, replacement=True)

    et_path = record_et(step, tmp_path / "state.et.json")
    bench = tmp_path / "state_bench.py"
    generate(et_path, bench, GenerateOptions(command_line="test"))
    _assert_replays_finite(bench, 3)


@pytest.mark.parametrize("greater, lesser, extent, run", [
    # x2 - x1 of boxes [5, 4] by select (and unsqueeze): pairs 2 apart in rows of 4
    (((5,), (4,), 2), ((5,), (4,), 0), 20, 4),
    (((5, 1), (4, 1), 3), ((5, 1), (4, 1), 1), 20, 4),
    # boxes[:, 2:] - boxes[:, :2], and boxes[4:] - boxes[:4] of a 1-D tensor of 8
    (((5, 2), (4, 1), 2), ((5, 2), (4, 1), 0), 20, 4),
    (((4,), (1,), 4), ((4,), (1,), 0), 8, 8),
    # t[1:] - t[:-1]: the whole storage rises; one row of boxes likewise
    (((7,), (1,), 1), ((7,), (1,), 0), 8, 8),
    (((2,), (1,), 2), ((2,), (1,), 0), 4, 4),
    # no run holds every pair: the first further in, rows that straddle runs, shapes
    # that differ, strides not multiples of the run
    (((5,), (4,), 0), ((5,), (4,), 2), 20, None),
    (((5, 3), (4, 1), 2), ((5, 3), (4, 1), 0), 20, None),
    (((5,), (4,), 2), ((4,), (4,), 0), 20, None),
    (((3, 2), (6, 4), 2), ((3, 2), (6, 4), 0), 18, None),
])
def test_a_positive_difference_of_two_views_rises_within_runs_holding_both(
        greater, lesser, extent, run):
    def meta(shape, strides, offset):
        return TensorMeta(tuple(shape), tuple(strides), offset, "float32", "cpu")

    assert rising_run(meta(*greater), meta(*lesser), extent) == run


def test_box_targets_log_positive_widths_of_boxes_gathered_and_joined(tmp_path):
    """A detector's box regression targets as torchvision computes them: each image's
    ground truth boxes resized column by column (``stack([x1 * r, ...], 1)``), matched
    to anchors by index and joined (``cat``); anchors made from a grid's shifts plus
    each cell's boxes (module state); ``log(gt_w / anchor_w)`` with widths ``x2 - x1``
    by select, by slice and by unbind. Filled at random, the boxes and cells gave
    negative widths, and the training replay went NaN. They rise within each box."""
    torch.manual_seed(0)
    images = [torch.cat([xy := torch.rand(n, 2) * 50, xy + torch.rand(n, 2) * 20 + 1], 1)
              for n in (3, 5)]
    cells = torch.tensor([[-8.0, -8.0, 8.0, 8.0], [-16.0, -8.0, 16.0, 8.0]])
    head = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)

    def step() -> None:
        opt.zero_grad()
        ratio = torch.tensor(64.0) / torch.tensor(50.0)
        resized = [torch.stack([c * ratio for c in gt.unbind(1)], 1) for gt in images]
        shifts = torch.arange(0, 32, 8.0)
        sy, sx = torch.meshgrid(shifts, shifts, indexing="ij")
        grid = torch.stack([sx.reshape(-1), sy.reshape(-1)] * 2, 1)
        anchors = (grid.view(-1, 1, 4) + cells.view(1, -1, 4)).reshape(-1, 4)
        boxes = torch.cat([gt[torch.randint(0, len(gt), (16,))] for gt in resized], 0)
        dw = torch.log((boxes[:, 2] - boxes[:, 0]) / (anchors[:, 2] - anchors[:, 0]))
        wh = (boxes[:, 2:] - boxes[:, :2]).log()
        x1, y1, x2, y2 = boxes.unbind(-1)
        dh = torch.log(y2.unsqueeze(1) - y1.unsqueeze(1))
        loss = (head(anchors) - torch.stack([dw, dw, *wh.unbind(1)], 1)).pow(2).mean()
        (loss + dh.mean() + torch.sqrt(x2 - x1).mean()).backward()
        opt.step()

    et_path = record_et(step, tmp_path / "boxes.et.json")
    bench = tmp_path / "boxes_bench.py"
    generate(et_path, bench, GenerateOptions(command_line="test"))
    assert bench.read_text().count('"rising", 4, 0') == 3  # two images' boxes, cells
    _assert_replays_finite(bench, 3)


def test_an_index_after_a_mask_is_bounded_by_the_dimension_it_indexes(tmp_path):
    """FCOS's ``targets[mask, labels[mask]] = 1.0``: a 2-D mask indexes dimensions 0
    and 1, so the labels index dimension 2. Bounded by dimension 1's size (the list
    position), the replay's labels ran past dimension 2 and index_put_ raised."""
    torch.manual_seed(0)
    x, labels = torch.randn(2, 50, 8), torch.randint(0, 4, (2, 50))
    head = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)

    def step() -> None:
        opt.zero_grad()
        logits = head(x)
        mask = labels >= 1
        target = torch.zeros_like(logits)
        target[mask, labels[mask]] = 1.0
        F.binary_cross_entropy_with_logits(logits, target).backward()
        opt.step()

    et_path = record_et(step, tmp_path / "masked.et.json")
    bench = tmp_path / "masked_bench.py"
    generate(et_path, bench, GenerateOptions(command_line="test"))
    assert re.search(r"aten_index_put_\(\w+, \[\w+, _in_range\(\w+, 4\)\]", bench.read_text())
    _assert_replays_finite(bench, 3)


def test_complex_scalars_the_trace_holds_no_value_of_replay_complex(tmp_path):
    """The observer writes a complex Scalar as "<ComplexDouble>" (complex autograd's
    conj-multiplies, ``x * 1j``): generation stopped at it. It replays as a complex
    number of magnitude one, which keeps the result complex, and the header says so."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.cfloat))
    x = torch.randn(3, 4)
    opt = torch.optim.SGD([w], lr=0.01)

    def step() -> None:
        opt.zero_grad()
        y = (x * 1j) @ w
        (y.abs().pow(2).sum() + y.angle().sum()).backward()
        opt.step()

    result = capture(step, tmp_path, name="complex", kineto=False, timing_iters=1)
    bench = tmp_path / "complex_bench.py"
    generate(result.et_path, bench, GenerateOptions(command_line="test"))
    text = bench.read_text()
    assert "complex scalar arguments replay as (1+0j)" in " ".join(text.split())
    assert "(1.0 + 0.0j)" in text
    replay = tmp_path / "replay.json"
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "2",
                         "--json", "--et", str(replay))
    assert proc.returncode == 0, proc.stderr[-3000:]
    muls = [node for node in load_trace(replay).nodes if node.name == "aten::mul"
            and any(arg.type == "ComplexDouble" for arg in node.inputs)]
    assert muls and all("complex" in node.outputs[0].type for node in muls)


def test_recorded_constants_keep_a_gated_recurrence_finite(tmp_path):
    """RecurrentGemma's gate, exp(-8.0 * sigmoid(x) * softplus(a)): the ET records the
    wrapped -8.0 as a 0-d tensor without its value, and a stand-in near 1 made
    sqrt(1 - gate^2) NaN in the first iteration. The capture records such values
    (step.json's scalars) and the replay fills them; where the recorded calls do not
    pair up with the trace's one for one, it keeps the stand-in."""
    torch.manual_seed(0)
    lin, gate = torch.nn.Linear(8, 8), torch.nn.Parameter(torch.randn(8))
    x = torch.randn(4, 8)
    opt = torch.optim.SGD([*lin.parameters(), gate], lr=0.01)

    def step() -> None:
        opt.zero_grad()
        log_gate = -8.0 * torch.sigmoid(lin(x)) * F.softplus(gate)
        (torch.sqrt(1 - torch.exp(2 * log_gate)) * x).sum().backward()
        opt.step()

    result = capture(step, tmp_path, name="gate", kineto=False, timing_iters=1)
    sidecar = json.loads(result.sidecar_path.read_text())
    assert -8.0 in sidecar["scalars"]["aten::mul.Tensor"]["1"]
    bench = tmp_path / "gate_bench.py"
    text = generate(result.et_path, bench, GenerateOptions(command_line="test"))
    assert '"uniform", -8.0, -8.0' in text
    _assert_replays_finite(bench, 3)
    # One value more than the trace has calls: none is trusted.
    sidecar["scalars"]["aten::mul.Tensor"]["1"].append(-8.0)
    result.sidecar_path.write_text(json.dumps(sidecar))
    assert '"uniform", -8.0, -8.0' not in generate(result.et_path, bench,
                                                   GenerateOptions(command_line="test"))


def test_literals_the_step_builds_replay_as_it_built_them(tmp_path):
    """A step's own constants, built from Python data (``torch.tensor([...])``, the
    index list of ``x[:, [0, 2, 5]]``): the ET records their shapes, not their values,
    and the square root of a difference of two, filled at random, replayed NaN. The
    capture records short literals that two steps build alike, and the replay builds
    them so; a literal of data, another every step, is not recorded."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 6)
    x = torch.randn(4, 6)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    batch = iter(range(10_000))

    def step() -> None:
        opt.zero_grad()
        picked = lin(x)[:, [0, 2, 5]]
        scale = torch.sqrt(torch.tensor([1.0, 4.0, 9.0]) - torch.tensor([0.5, 0.5, 0.5]))
        seen = torch.tensor([next(batch), 7])  # data: another value every step
        ((picked * scale).sum() + seen.sum() * 0.0).backward()
        opt.step()

    result = capture(step, tmp_path, name="lit", kineto=False, timing_iters=1)
    literals = json.loads(result.sidecar_path.read_text())["literals"]
    assert literals == [[0, 2, 5], [1.0, 4.0, 9.0], [0.5, 0.5, 0.5], None]
    bench = tmp_path / "lit_bench.py"
    text = generate(result.et_path, bench, GenerateOptions(command_line="test"))
    assert "_values([0, 2, 5], torch.int64, device)" in text
    assert "_values([1.0, 4.0, 9.0], torch.float32, device)" in text
    assert text.count("_values([") == 3
    _assert_replays_finite(bench, 3)


def test_literals_pair_with_the_traces_calls_one_for_one():
    """The k-th recorded literal is the trace's k-th ``aten::lift_fresh``, where it has
    as many elements; one literal more or fewer than the trace's calls: none is used."""
    b = TraceBuilder()
    first, second = b.tensor((3,), dtype="int64"), b.tensor((2,))
    b.op(LIFT_FRESH, [first], [first])
    b.op(LIFT_FRESH, [second], [second])
    b.op(MUL, [b.tensor((2,)), second], [b.tensor((2,))])
    trace = trace_from_document(b.doc(), name="t.json", sha256="0")
    captured = CapturedInputs(literals=[[0, 2, 5], [0.25, 4.0]])
    inits = {s.dtype: s.init for s in run_passes(
        [Source(trace, captured=captured)], BuildOptions()).storages
        if s.materialised and s.extent in (2, 3) and s.dtype in ("int64", "float32")
        and s.init is not None and s.init.kind == "values"}
    assert inits["int64"].values == (0, 2, 5) and inits["float32"].values == (0.25, 4.0)
    for literals in ([[0, 2, 5]], [[0, 2, 5], [0.25, 4.0], [1.0]]):
        program = run_passes([Source(trace, captured=CapturedInputs(literals=literals))],
                             BuildOptions())
        assert not any(s.init is not None and s.init.kind == "values"
                       for s in program.storages)


MUL = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
LIFT_FRESH = "aten::lift_fresh(Tensor(a) self) -> Tensor(a)"
FILL_ = "aten::fill_.Tensor(Tensor(a!) self, Tensor value) -> Tensor(a!)"


def test_two_literals_at_one_freed_address_are_two_values():
    """``mask[:, n:] = 1`` and later ``attn[...] = -inf`` (D-FINE's denoising queries):
    each literal is a 0-d tensor the allocator may put where the freed one was, under
    the same tensor and storage ids. Each lift is a literal of its own, filled with its
    own recorded value (read as one, both were -inf, and the mask's 1 - mask
    multiplied NaN into the boxes)."""
    b = TraceBuilder()
    mask, attn = b.tensor((2, 6)), b.tensor((4, 4))
    literal = b.tensor(())
    again = T(literal.tensor_id, literal.storage_id, (), ())
    b.op(LIFT_FRESH, [literal], [literal])
    b.op(FILL_, [mask, literal], [mask])
    b.op(LIFT_FRESH, [again], [again])
    b.op(FILL_, [attn, again], [attn])
    trace = trace_from_document(b.doc(), name="t.json", sha256="0")
    captured = CapturedInputs(literals=[[1.0], [float("-inf")]])
    program = run_passes([Source(trace, captured=captured)], BuildOptions())
    fills = [op.args[1].value.storage for op in program.ops if op.name == "aten::fill_"]
    assert fills[0] is not fills[1]
    assert [s.init.values for s in fills] == [(1.0,), (float("-inf"),)]


SUM = "aten::sum(Tensor self, *, ScalarType? dtype=None) -> Tensor"


@pytest.mark.parametrize("same_tensor", [False, True])
def test_a_literal_where_a_freed_result_was_is_the_literal(same_tensor):
    """A loss's 0-d ``sum`` is freed and ``torch.tensor(0.5)`` lands on its storage id:
    the lifted literal is another tensor object than the result (a tensor id of its
    own), so it is filled with its recorded value, not read as the sum. Where the
    lifted tensor is the result itself (``torch.tensor`` recorded its own ``empty``
    and ``to``), it stays the op's result."""
    b = TraceBuilder()
    x, mask = b.tensor((4,)), b.tensor((4,))
    total = b.tensor(())
    b.op(SUM, [x, None], [total])
    literal = total if same_tensor else T(b.new_id(), total.storage_id, (), ())
    b.op(LIFT_FRESH, [literal], [literal])
    b.op(FILL_, [mask, literal], [mask])
    trace = trace_from_document(b.doc(), name="t.json", sha256="0")
    program = run_passes([Source(trace, captured=CapturedInputs(literals=[[0.5]]))],
                         BuildOptions())
    read = next(op for op in program.ops if op.name == "aten::fill_").args[1].value
    if same_tensor:
        assert not read.storage.materialised
    else:
        assert read.storage.materialised and read.storage.init.values == (0.5,)




@pytest.mark.parametrize("values", [[-8.0, -8.0], [-8.0, 2.0]])
def test_each_reader_of_a_recorded_scalar_replays_its_own_value(values):
    """Two ops read one 0-d storage of the trace (a storage that served two wrapped
    numbers in turn): each replays the value the capture recorded for it. Python wraps
    a float as a double."""
    b = TraceBuilder()
    x, scale = b.tensor((4,)), b.tensor((), dtype="float64")
    b.op(MUL, [x, scale], [b.tensor((4,))])
    b.op(MUL, [x, scale], [b.tensor((4,))])
    trace = trace_from_document(b.doc(), name="t.json", sha256="0")
    source = Source(trace, captured=CapturedInputs({"aten::mul.Tensor": {"1": values}}))
    program = run_passes([source], BuildOptions())
    read = [op.args[1].value.storage.init for op in program.ops]
    assert [(init.low, init.high, init.why) for init in read] == \
        [(v, v, "recorded value") for v in values]


XLOGY = "aten::xlogy.Tensor(Tensor self, Tensor other) -> Tensor"


@pytest.mark.parametrize("recorded", [None, 3])
def test_a_recorded_integer_wins_over_its_readers_domain(recorded):
    """``xlogy(x, 3)`` wraps the 3 as a 0-d long that a floating op reads inside its
    domain (> 0): the value the capture recorded replays as it was; without one, a
    value inside the domain."""
    b = TraceBuilder()
    x, base = b.tensor((4,)), b.tensor((), dtype="int64")
    b.op(XLOGY, [x, base], [b.tensor((4,))])
    trace = trace_from_document(b.doc(), name="t.json", sha256="0")
    integers = {} if recorded is None else {"aten::xlogy.Tensor|float32": {"1": [recorded]}}
    program = run_passes([Source(trace, captured=CapturedInputs(integers=integers))],
                         BuildOptions())
    init = program.ops[0].args[1].value.storage.init
    if recorded is None:
        assert init.kind == "randint" and init.low >= 1
    else:
        assert (init.kind, init.low, init.high, init.why) == \
            ("span", recorded, recorded, "recorded value")


def test_a_float32_scalar_read_by_two_ops_is_one_tensor():
    """A float32 0-d tensor is no wrapped Python number (those are doubles, int64s or
    bools): two ops reading it (a learnable temperature, a median a backward reads
    back) read one tensor, not one buffer each."""
    b = TraceBuilder()
    x, temperature = b.tensor((4,)), b.tensor(())
    b.op(MUL, [x, temperature], [b.tensor((4,))])
    b.op(MUL, [x, temperature], [b.tensor((4,))])
    trace = trace_from_document(b.doc(), name="t.json", sha256="0")
    program = run_passes([Source(trace)], BuildOptions())
    first, second = (op.args[1].value.storage for op in program.ops)
    assert first is second


def test_a_layer_is_filled_as_its_module_initialises_it():
    """nn.Linear's weight and bias within 1/sqrt(fan-in); the input it multiplies is an
    activation, filled like data (U(-1, 1)), not within a fan-in of its own."""
    b = TraceBuilder()
    x, w, bias = b.tensor((4, 64)), b.tensor((16, 64)), b.tensor((16,))
    b.op(LINEAR, [x, w, bias], [b.tensor((4, 16))])
    inits = {s.index: s.init for s in _program(b).storages if s.materialised}
    bounds = sorted((init.low, init.high) for init in inits.values())
    assert bounds == [(-1.0, 1.0), (-0.125, 0.125), (-0.125, 0.125)]


def test_a_vector_viewed_for_broadcast_is_no_weight_of_its_own_fan_in(tmp_path):
    """FrozenBatchNorm2d (DETR-family backbones) reads its weight, bias and statistics
    as ``t.reshape(1, -1, 1, 1)``: the [1, C, 1, 1] view gave each a "fan-in" of C, and
    filled within 1/sqrt(C) every such layer scaled activations by ~0.03, until a
    batch's samples were equal and a training batch norm over them sent D-FINE's
    gradients to inf. A leading 1 is a batch of one or a broadcast, not a weight's
    outputs; nn.Linear(n, 1)'s [1, n] weight keeps its fan-in (an op names it)."""
    torch.manual_seed(0)
    channels = 48
    conv = torch.nn.Conv2d(3, channels, 3, bias=False)
    head = torch.nn.Linear(channels, 1)
    stats = [torch.ones(channels), torch.zeros(channels), torch.zeros(channels),
             torch.ones(channels)]

    def step() -> None:
        weight, bias, mean, var = (t.reshape(1, -1, 1, 1) for t in stats)
        scale = weight * (var + 1e-5).rsqrt()
        h = conv(torch.randn(2, 3, 8, 8)) * scale + (bias - mean * scale)
        head(h.mean((2, 3))).sum()

    program = build_program(load_trace(record_et(step, tmp_path / "frozen.et.json")))
    # the four statistics and the head's [1, C] weight
    inits = [s.init for s in program.storages
             if s.materialised and s.dtype == "float32" and s.extent == channels]
    assert len(inits) == 5, inits
    weights = [init for init in inits if "fan-in" in init.why]
    assert [init.high for init in weights] == [pytest.approx(1 / math.sqrt(channels))]
    assert all(init.high >= 1.0 for init in inits if init not in weights), inits


def test_saved_workspaces_are_zeros_not_random_bytes():
    """An RNN backward reads its forward's gates from a byte workspace: random bytes read
    as floats hold NaN and inf, which made every gradient NaN (and the LSTM training
    replay 15% slow); zeros read as 0.0, even where the trace recorded a byte range."""
    b = TraceBuilder()
    f = [b.tensor((4, 8)) for _ in range(10)]
    workspace = b.tensor((1024,), dtype="uint8")
    outs = [b.tensor((4, 8)) for _ in range(7)]
    b.op(RNN_BACKWARD, [*f, None, None, None, False, 2, 8, 1, True, True, False, [], True,
                        workspace], outs,
         attrs={"tensor_range": json.dumps({"22": [0, 255]})})
    init = _init_of(_program(b), "uint8")
    assert init.kind == "zeros" and "workspace" in init.why


# -- recorded ranges and data ----------------------------------------------------------


def test_recorded_range_is_used_and_clipped_to_bounds():
    b = TraceBuilder()
    ids = b.tensor((6,), dtype="int64")
    b.op(EMBEDDING, [b.tensor((50, 4)), ids], [b.tensor((6, 4))],
         attrs={"tensor_range": '{"1":[3,90]}'})
    init = _init_of(_program(b))
    assert (init.kind, init.low, init.high) == ("span", 3, 49)


def test_recorded_range_keys_count_tensors_in_lists():
    b = TraceBuilder()
    rows = b.tensor((3,), dtype="int64")
    b.op(INDEX, [b.tensor((10, 4)), [rows]], [b.tensor((3, 4))],
         attrs={"tensor_range": '{"1":[2,5]}'})
    trace = trace_from_document(b.doc(), name="t.json", sha256="0")
    assert recorded_values(trace).ordinals  # the node with a range was indexed
    init = _init_of(build_program(trace))
    assert (init.kind, init.low, init.high) == ("span", 2, 5)


ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
ADD_ = "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)"


def _assert_replays_finite(bench, iters: int) -> None:
    """The benchmark runs ``iters`` iterations without resetting its inputs, and none
    it writes ends NaN or inf."""
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", str(iters),
                         "--reset-inputs", "off", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["nonfinite_inputs"] == []


def _wrapped_scalars(b: TraceBuilder, values: list[int], same_tensor: bool = False,
                     written: bool = False, in_place: bool = False) -> None:
    """Python ints wrapped as 0-d int64 tensors at one address, one after the other
    (T5's relative position buckets: 0 and 8), each added to a position tensor
    (``in_place``: the first in place to another tensor, as AdamW adds a step count)."""
    first = b.tensor((), dtype="int64")
    for k, v in enumerate(values):
        scalar = first if same_tensor or k == 0 else b.view(first, ())
        pos = b.tensor((4,), dtype="int64")
        if in_place and k == 0:
            b.op(ADD_, [pos, scalar], [pos],
                 attrs={"tensor_range": json.dumps({"0": [0, 3], "1": [v, v]})})
        else:
            b.op(ADD, [pos, scalar], [b.tensor((4,), dtype="int64")],
                 attrs={"tensor_range": json.dumps({"0": [0, 3], "1": [v, v]})})
        if written:
            b.op(ADD_, [scalar, pos], [scalar],
                 attrs={"tensor_range": json.dumps({"0": [v, v], "1": [0, 3]})})


def _scalar_inits(program) -> list[tuple[str, int, int]]:
    return [(s.init.kind, s.init.low, s.init.high) for s in program.storages
            if s.materialised and s.dtype == "int64" and s.extent == 1]


@pytest.mark.parametrize("same_tensor,in_place", [(False, False), (True, False),
                                                   (False, True)])
def test_tensors_that_reused_a_storage_id_get_a_fill_each(same_tensor, in_place):
    """Two reads of the same view of one storage id whose recorded values differ, with
    no write between them, cannot be the same bytes: the first tensor was freed and its
    address reused (the tensor id too: the observer keys it by TensorImpl address).
    Each is its own lifetime, with its own recorded range (one fill over 0..8
    overflowed a relative-position embedding)."""
    b = TraceBuilder()
    _wrapped_scalars(b, [1, 8], same_tensor=same_tensor, in_place=in_place)
    assert sorted(_scalar_inits(_program(b))) == [("span", 1, 1), ("span", 8, 8)]


def test_one_lifetime_where_a_recorded_op_writes_between_the_reads():
    b = TraceBuilder()
    _wrapped_scalars(b, [0, 8], written=True)
    assert len(_scalar_inits(_program(b))) == 1


def test_each_op_reads_a_wrapped_scalar_of_its_own():
    """Equal values at one address: whether the allocator reused it varies from one
    capture of a model to the next, so the replay never depends on it (stable diffs)."""
    b = TraceBuilder()
    _wrapped_scalars(b, [5, 5])
    assert _scalar_inits(_program(b)) == [("span", 5, 5), ("span", 5, 5)]


FLOOR_DIVIDE = "aten::floor_divide(Tensor self, Tensor other) -> Tensor"


@pytest.mark.parametrize("ranges,expected", [
    (None, ("randint", 1, 8)),  # the default fill, without 0
    ('{"1":[0,3]}', ("span", 1, 3)),
    ('{"1":[2,2]}', ("span", 2, 2)),  # a recorded positive value is kept
])
def test_integer_divisors_are_never_zero(ranges, expected):
    """floor_divide(sorted_ids, top_k) with top_k a wrapped Python int: a fill of 0
    raised ZeroDivisionError in the replay of a MoE router."""
    b = TraceBuilder()
    k = b.tensor((), dtype="int64")
    b.op(FLOOR_DIVIDE, [b.tensor((8,)), k], [b.tensor((8,))],
         attrs={"tensor_range": ranges} if ranges else None)
    init = _init_of(_program(b))
    assert (init.kind, init.low, init.high) == expected


@pytest.mark.parametrize("ranges", [None, '{"1":[8192,8192]}'])
def test_a_scalar_at_a_returned_tensors_addresses_is_a_new_tensor(ranges):
    """Llama 4's chunked mask: ``floor_divide(positions, 8192)`` read a wrapped Python
    int whose TensorImpl and data both reused the addresses of a freed (2,1,1,1) view,
    so it carried that view's tensor and storage ids. Read as a view of the live
    buffer, its zeros raised ZeroDivisionError. A tensor id returned on other metadata
    is another tensor: the divisor gets a fill of its own."""
    from dataclasses import replace

    b = TraceBuilder()
    base = b.tensor((2,), dtype="int64")
    b.op(ADD, [b.tensor((2,), dtype="int64"), b.tensor((2,), dtype="int64")], [base])
    viewed = b.view(base, (2, 1, 1, 1))
    b.op(VIEW, [base, [2, 1, 1, 1]], [viewed])
    positions = b.tensor((2, 1, 1, 1), dtype="int64")
    b.op(ADD, [viewed, b.tensor((), dtype="int64")], [positions])
    scalar = replace(viewed, shape=(), strides=())  # both addresses reused
    b.op(FLOOR_DIVIDE, [positions, scalar], [b.tensor((2, 1, 1, 1), dtype="int64")],
         attrs={"tensor_range": ranges} if ranges else None)
    program = _program(b)
    divisor = next(op for op in program.ops if op.name.startswith("aten::floor_divide"))
    tv = divisor.args[1].value
    assert tv.storage.materialised, "the divisor must not read the view's live buffer"
    expected = ("span", 8192, 8192) if ranges else ("randint", 1, 8)
    assert (tv.storage.init.kind, tv.storage.init.low, tv.storage.init.high) == expected


DIV = "aten::div.Tensor(Tensor self, Tensor other) -> Tensor"


def test_a_scalar_at_an_inputs_address_read_as_another_dtype_is_a_new_number():
    """2-D parallel training's gradient clipping divided a 0-d float32 norm by a wrapped
    Python float whose storage id was a freed FSDP2 all-gather buffer's, an input the
    step only viewed: read as that buffer, it stayed a float64 tensor on one rank, its
    stacked norms became float64, and the ranks' all_reduce dtypes disagreed."""
    from dataclasses import replace

    b = TraceBuilder()
    buffer = b.tensor((32,))  # an input: no recorded op allocates it
    b.op(VIEW, [buffer, [4, 8]], [b.view(buffer, (4, 8))])
    norm = b.tensor(())
    b.op(ADD, [b.tensor(()), b.tensor(())], [norm])
    scalar = replace(b.tensor((), dtype="float64"), storage_id=buffer.storage_id)
    b.op(DIV, [norm, scalar], [b.tensor(())])
    program = _program(b)
    divide = next(op for op in program.ops if op.name.startswith("aten::div"))
    assert divide.args[1].value == Literal(1.0)


def test_malformed_range_names_node_and_field():
    from mystique_gen.errors import TraceError

    b = TraceBuilder()
    node = b.op(EMBEDDING, [b.tensor((50, 4)), b.tensor((6,), dtype="int64")],
                [b.tensor((6, 4))], attrs={"tensor_range": "{oops"})
    with pytest.raises(TraceError) as err:
        _program(b)
    assert err.value.node_id == node and err.value.field == "tensor_range"


def test_saved_data_is_embedded_and_black_stable(tmp_path):
    b = TraceBuilder()
    ids = b.tensor((5,), dtype="int64")
    node = b.op(EMBEDDING, [b.tensor((100, 4)), ids], [b.tensor((5, 4))])
    resources = tmp_path / "t.et_resources"
    resources.mkdir()
    values = [25, 37, 78, 68, 55]
    (resources / f"nid_{node}_tid_1.dat").write_bytes(
        b"".join(v.to_bytes(8, "little", signed=True) for v in values))
    program = _program(b, resources)
    init = _init_of(program)
    assert (init.kind, init.low) == ("data", 1)
    text = generate_source(program)
    assert format_with_black(text) == text
    namespace: dict = {}
    exec(compile(text, "bench", "exec"), namespace)  # noqa: S102 - our own output
    got = namespace["_data"](init.data.hex(), 1, torch.int64, "cpu")
    assert got.tolist() == values


# -- fill kinds at run time -----------------------------------------------------------


def test_fill_kinds_produce_the_sizes_they_promise():
    b = TraceBuilder()
    b.op(NONZERO, [b.tensor((4,), dtype="bool")], [b.tensor((2, 1), dtype="int64")])
    namespace: dict = {}
    exec(compile(generate_source(build_program(  # noqa: S102 - our own output
        trace_from_document(b.doc(), name="t", sha256="0"))), "bench", "exec"), namespace)
    fill = namespace["_fill"]
    gens = {"cpu": torch.Generator().manual_seed(0)}
    assert int(fill(50, torch.bool, "cpu", "mask", 13, 0, gens).sum()) == 13
    assert len(fill(50, torch.int64, "cpu", "distinct", 9, 0, gens).unique()) == 9
    assert len(fill(50, torch.int64, "cpu", "runs", 6, 0, gens).unique_consecutive()) == 6
    parts = fill(7, torch.int64, "cpu", "sum", 40, 0, gens)
    assert int(parts.sum()) == 40 and int(parts.min()) >= 1  # none empty where 40 allows
    for _ in range(20):  # (an empty segment's mean is NaN: segment_lengths)
        assert int(fill(4, torch.int64, "cpu", "sum", 4, 0, gens).min()) == 1
    parts = fill(7, torch.int64, "cpu", "sum", 3, 0, gens)
    assert int(parts.sum()) == 3 and int(parts.min()) == 0
    cuts = fill(6, torch.int64, "cpu", "cuts", 0, 30, gens)
    assert cuts[0] == 0 and cuts[-1] == 30 and bool((cuts.diff() >= 0).all())
    rising = fill(10, torch.float32, "cpu", "rising", 4, 0, gens)
    assert rising.shape == (10,) and bool((rising > 0).all())
    assert bool((rising[:8].view(2, 4).diff(dim=1) > 0).all()) and rising[9] > rising[8]
    span = fill(20, torch.int64, "cpu", "span", 3, 11, gens)
    assert int(span.min()) == 3 and int(span.max()) == 11
    fit = runtime._fit  # (a file holds it where its replay fits a result)
    rows = torch.tensor([[0, 1], [2, 0], [1, 1]])
    fitted = fit(rows, [5, 2], [1, 5])
    assert list(fitted.shape) == [5, 2] and fitted.stride() == (1, 5)
    assert set(map(tuple, fitted.tolist())) <= set(map(tuple, rows.tolist()))
    assert fit(rows, [3, 2], [2, 1]) is rows
    # Cut: the replay's rows in their storage where the layout agrees (no kernel in
    # the step), as a tensor of its own: the op's result was not a view, and a view
    # refuses `detach_` (which `torch.tensor(...)` calls on its result).
    cut = fit(rows, [2, 2], [2, 1])
    assert cut.tolist() == rows[:2].tolist() and cut.data_ptr() == rows.data_ptr()
    assert not cut._is_view()
    cut.detach_()
    grad_rows = torch.randn(3, 2, requires_grad=True)  # a gradient flows through a cut
    fit(grad_rows, [2, 2], [2, 1]).sum().backward()
    assert grad_rows.grad.tolist() == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    assert fit(rows, [2, 2], [1, 2]).stride() == (1, 2)  # laid out as recorded
    again = fit(rows[:1], [3, 2], [2, 1])
    assert again.tolist() == [[0, 1]] * 3
    # torch.where's index tensors stay rows of one buffer, paired, whether cut or
    # repeated: a view the file derives from the second (offset 0 of its storage, as
    # the original laid it out) reads the first (switch_transformers' routing).
    mask = torch.tensor([[True, False], [True, True], [False, True]])
    for n in (2, 5):
        first, second = fit(torch.where(mask), [[n], [n]], [[1], [1]], True)
        assert second.as_strided([n], [1], 0).tolist() == first.tolist()
        pairs = set(zip(*torch.where(mask), strict=True))
        assert set(zip(first.tolist(), second.tolist(), strict=True)) <= \
            {(int(a), int(b)) for a, b in pairs}
    assert [list(t.shape) for t in fit([rows[:, 0]], [[1]], [[1]])] == [[1]]
    fit_mask = runtime._fit_mask
    bools = torch.tensor([[True, False, True], [False, True, False]])
    assert fit_mask(bools, 3) is bools
    for count in (0, 1, 5, 6):
        fitted = fit_mask(bools, count)
        assert fitted.shape == bools.shape and int(fitted.sum()) == count
        assert int(bools.sum()) == 3  # the replay's own mask is left as it was
        assert not fitted._is_view()
        fitted.detach_()


# -- functional: captured models replay at the recorded shapes without ranges ----------


class _MoE(torch.nn.Module):
    """Top-k routing, then per-expert where + index + index_add_ (data-dependent rows)."""

    def __init__(self, d: int = 16, experts: int = 4, k: int = 2):
        super().__init__()
        self.router = torch.nn.Linear(d, experts)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(experts))
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = torch.topk(torch.softmax(self.router(x), -1), self.k, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            out.index_add_(0, rows, expert(x[rows]) * weights[rows, slot, None])
        return out


def _embedding_moe_step():
    torch.manual_seed(0)
    emb, moe, head = torch.nn.Embedding(50, 16), _MoE(), torch.nn.Linear(16, 7)
    params = [*emb.parameters(), *moe.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    ids, y = torch.randint(0, 50, (12,)), torch.randint(0, 7, (12,))
    keep = torch.rand(12) > 0.3

    def step() -> None:
        opt.zero_grad()
        h = moe(emb(ids))[keep]
        used = emb.weight.index_select(0, torch.unique(ids)).sum()
        (torch.nn.functional.cross_entropy(head(h), y[keep]) + used * 0).backward()
        opt.step()

    return step


@pytest.mark.slow
def test_embedding_and_moe_replay_at_recorded_shapes_without_ranges(tmp_path):
    torch.set_num_threads(1)
    result = capture(_embedding_moe_step(), tmp_path, name="moe", kineto=False,
                     timing_iters=1, integral_ranges=False)
    assert "tensor_range" not in result.et_path.read_text().replace('"tensor_range", "type":'
                                                                    ' "string", "value": ""', "")
    bench = tmp_path / "moe_bench.py"
    text = generate(result.et_path, bench, GenerateOptions(command_line="test"))
    assert "_fit(" in text and '"mask"' in text and '"distinct"' in text
    replay_et = tmp_path / "replay.et.json"
    for seed in ("0", "1", "2"):  # other routings: rows are fitted, nothing crashes
        proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                             "--json", "--seed", seed, "--et", str(replay_et))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert last_json(proc.stdout)["skipped_at_runtime"] == []
    recorded = _op_shapes(result.et_path)
    replayed = _op_shapes(replay_et)
    # where's own result follows the replayed routing; _fit brings it to the recorded
    # rows before anything reads it, so every consumer runs at the recorded shapes.
    for name in ("aten::index", "aten::linear", "aten::index_add_", "aten::_unique2",
                 "aten::log_softmax", "aten::nll_loss_forward"):
        assert recorded.get(name) and recorded.get(name) == replayed.get(name), name
    assert op_multiset(result.et_path, by_overload=True) == op_multiset(replay_et, by_overload=True)


@pytest.mark.slow
def test_a_computed_mask_indexes_forward_and_backward_at_its_recorded_count(tmp_path):
    """``h[ids > 10]`` with replayed ids: fitting only the forward's rows left the
    backward's index_put_ with the same mask one value short, and the replay crashed."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 5)
    opt = torch.optim.Adam([*emb.parameters(), *head.parameters()], lr=1e-3)
    ids, labels = torch.randint(0, 50, (4, 10)), torch.randint(0, 5, (4, 10))

    def step() -> None:
        opt.zero_grad()
        keep = ids > 10
        F.cross_entropy(head(emb(ids)[keep]), labels[keep]).backward()
        opt.step()

    result = capture(step, tmp_path, name="mask", kineto=False, timing_iters=1)
    bench = tmp_path / "mask_bench.py"
    text = generate(result.et_path, bench, GenerateOptions(command_line="test"))
    assert "gt = _fit_mask(gt, " in text
    replay_et = tmp_path / "replay.et.json"
    for seed in ("0", "1"):
        proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                             "--seed", seed, "--et", str(replay_et))
        assert proc.returncode == 0, proc.stderr[-3000:]
    recorded, replayed = _op_shapes(result.et_path), _op_shapes(replay_et)
    for name in ("aten::index", "aten::_index_put_impl_", "aten::linear"):
        assert recorded.get(name) and recorded.get(name) == replayed.get(name), name


def test_a_computed_mask_scatters_as_many_values_as_its_source_holds(tmp_path):
    """``x.masked_scatter(x > 0, src)`` with ``src`` sized by the mask's recorded count
    (``int(mask.sum())``): the replayed mask, computed from other values, selected more
    elements than ``src`` held and the replay crashed. The mask is fitted to the count
    the source implies."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 8)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    ids = torch.randint(0, 50, (20,))

    def step() -> None:
        opt.zero_grad()
        h = emb(ids)
        mask = h > 0
        h.masked_scatter(mask, torch.randn(int(mask.sum()))).sum().backward()
        opt.step()

    result = capture(step, tmp_path, name="scatter", kineto=False, timing_iters=1)
    bench = tmp_path / "scatter_bench.py"
    text = generate(result.et_path, bench, GenerateOptions(command_line="test"))
    assert "gt = _fit_mask(gt, " in text
    for seed in ("0", "1"):
        proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                             "--seed", seed)
        assert proc.returncode == 0, proc.stderr[-3000:]


def _op_shapes(path) -> dict[str, list]:
    """Output shapes of every top-level op, by name, in order."""
    from mystique_gen.constants import HARNESS_SCOPE
    from mystique_gen.passes.select import select_ops
    from mystique_gen.sources.et import load_trace

    shapes: dict[str, list] = {}
    for sel in select_ops(load_trace(path)).ops:
        if HARNESS_SCOPE not in sel.scope:
            shapes.setdefault(sel.node.name, []).append([o.shape for o in sel.node.outputs])
    return shapes


# -- capture and compare ---------------------------------------------------------------


@pytest.mark.slow
def test_capture_script_then_compare_replay(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Flatten(),\n"
        "                            torch.nn.Linear(32, 5))\n"
        "opt = torch.optim.Adam(model.parameters())\n"
        "for _ in range(50):\n"
        "    x, y = torch.randint(0, 100, (8, 4)), torch.randint(0, 5, (8,))\n"
        "    opt.zero_grad()\n"
        "    torch.nn.functional.cross_entropy(model(x), y).backward()\n"
        "    opt.step()\n"
        "raise SystemExit('the capture should have ended the script before this')\n")
    out = tmp_path / "cap"
    assert tools_main(["capture", "-o", str(out), "--name", "tr", "--warmup", "2",
                       "--timing-iters", "2", "--", "python", str(script)]) == 0
    sidecar = json.loads((out / "tr.step.json").read_text())
    assert sidecar["boundary"] == "optimizer step" and len(sidecar["step_ms"]) == 2
    # As many warm, annotated steps profiled as the Python API profiles.
    assert sidecar["profile_steps"] == 9
    profiled = kineto_times(out / "tr.profile.json", None)
    assert (profiled.iterations, profiled.cold_steps_dropped) == (8, 1)
    assert sidecar["step_ms_median"] > 0
    assert "tensor_range" in (out / "tr.et.json").read_text()
    # The step after the recorded one records 0-d values (Adam's, as wrapped numbers).
    assert sidecar["scalars"] and all(sidecar["scalars"].values())
    bench = out / "bench.py"
    generate(out / "tr.et.json", bench, GenerateOptions(command_line="test"))
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "3",
                         "--et", str(out / "replay.et.json"), "--profile", str(out / "prof"),
                         "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out / "result.json").write_text(proc.stdout)
    capsys.readouterr()
    assert tools_main(["compare", str(out / "tr.et.json"), str(out / "replay.et.json"),
                       "--kineto-original", str(out / "tr.profile.json"),
                       "--kineto-replay", str(out / "prof" / "kineto_trace.json"),
                       "--bench-json", str(out / "result.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # The clock: the step time beside the capture, the benchmark's own median.
    assert report["original_step_ms"] == sidecar["step_ms_median"]
    assert report["replay_iter_ms"] == last_json(proc.stdout)["iter_ms_median"]
    # One step's memory above its inputs, measured on both sides.
    assert sidecar["step_peak_bytes"] > 0
    memory = report["peak_step_bytes"]
    assert memory["original"] == sidecar["step_peak_bytes"]
    assert memory["replay"] == last_json(proc.stdout)["peak_step_bytes"] > 0
    assert report["op_multiset_match"] == 1.0 and report["differences"] == []
    assert report["replay_iterations"] == 3
    assert report["category_ms"]["matmul"]["original"] > 0
    assert report["category_ms"]["matmul"]["replay"] > 0
    assert report["e2e_error"] is not None

    c = compare_traces(out / "tr.et.json", out / "replay.et.json")
    assert "100.00%" in format_comparison(c)


def test_capture_script_too_short_is_a_clean_error(tmp_path, capsys):
    script = tmp_path / "short.py"
    script.write_text("import torch\nm = torch.nn.Linear(2, 2)\n"
                      "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for _ in range(2):\n    m(torch.ones(1, 2)).sum().backward()\n"
                      "    o.step()\n")
    from mystique_gen.tools.capture import ScriptError

    with pytest.raises(ScriptError, match="made 2 optimizer steps"):
        capture_script(["python", str(script)], tmp_path / "o", warmup=1, timing_iters=1)
    assert tools_main(["capture", "-o", str(tmp_path / "o"), "--", "python",
                       str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _two_traces(tmp_path):
    a, b = TraceBuilder(), TraceBuilder()
    for builder, n in ((a, 3), (b, 2)):
        for _ in range(n):
            builder.op(LOG, [builder.tensor((4,))], [builder.tensor((4,))])
    return a.write(tmp_path / "a.json"), b.write(tmp_path / "b.json")


def test_compare_counts_differences(tmp_path):
    pa, pb = _two_traces(tmp_path)
    c = compare_traces(pa, pb)
    assert c.differences == [("aten::log.default", 3, 2)] and abs(c.match - 2 / 3) < 1e-9


@pytest.mark.skipif(_has_matplotlib(), reason="matplotlib installed: no error to give")
def test_plot_without_matplotlib_is_a_clean_error(tmp_path, capsys):
    pa, pb = _two_traces(tmp_path)
    assert tools_main(["compare", str(pa), str(pb), "--kineto-original", str(pa),
                       "--kineto-replay", str(pb), "--plot", str(tmp_path / "x.png")]) == 2
    assert "matplotlib" in capsys.readouterr().err


@pytest.mark.skipif(not _has_matplotlib(), reason="matplotlib (the plot extra) not installed")
def test_plot_draws_categories(tmp_path):
    from mystique_gen.tools.compare import Comparison, KinetoTimes, plot_comparison

    times = KinetoTimes({"matmul": 2.0, "memory": 0.5}, 3.0, 10, 1, False)
    c = Comparison(1.0, 10, 10, [], times, KinetoTimes({"matmul": 1.8}, 2.7, 10, 5, False))
    assert plot_comparison(c, tmp_path / "x.png") == ["op-multiset match 100.0%"]
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"
    c.original_peak_bytes, c.replay_peak_bytes = 2.0 * 2**20, 2.1 * 2**20
    titles = plot_comparison(c, tmp_path / "y.png")
    assert titles[1] == "peak memory of one step"
    assert (tmp_path / "y.png").read_bytes()[:4] == b"\x89PNG"


def test_op_categories():
    assert [op_category(n) for n in ("aten::addmm", "aten::convolution_backward",
                                     "aten::add_", "aten::sum", "aten::cat",
                                     "c10d::allreduce_", "aten::_foreach_mul_",
                                     "aten::t", "aten::tanh", "aten::mvlgamma",
                                     "aten::_efficientzerotensor")] == [
        "matmul", "conv", "elementwise", "reduction", "memory", "communication",
        "optimizer", "memory", "elementwise", "elementwise", "elementwise"]


@pytest.mark.parametrize("name", [
    "aten::_grouped_mm", "aten::_scaled_grouped_mm", "aten::_int_mm",
    "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm_for_cpu", "aten::_sparse_mm",
    "aten::_sparse_semi_structured_linear", "aten::_mixed_dtypes_linear",
])
def test_grouped_quantized_and_sparse_products_are_matmul_time(name):
    """A mixture of experts' grouped GEMMs (most of its step) counted as elementwise
    time in compare's category shares."""
    assert op_category(name) == "matmul"


def test_data_fill_needs_a_width():
    from mystique_gen.backends.valuefill import data_call

    with pytest.raises(ValueError):
        data_call(Init("data", 3, 1, "", b"\x00"), "int64", "device")


def test_guard_emitters():
    """The index wrap and the divisor guard, as the file spells them."""
    from mystique_gen.backends.layout import Atom, flat
    from mystique_gen.backends.valuefill import in_range, nonzero

    assert flat(in_range(Atom("index"), 128)) == "_in_range(index, 128)"
    assert flat(in_range(Atom("target"), 2000, -100)) == "_in_range(target, 2000, -100)"
    assert flat(nonzero(Atom("width"))) == "_nonzero(width)"


def test_normalised_activations_keep_both_signs(tmp_path):
    """BatchNorm's parameters and running statistics are filled as the module starts
    them (weight 1, bias 0, mean 0, variance 1), so that what a ReLU after it passes
    is half of every channel, as in the original, not whole channels shifted to one
    sign by a random mean or bias: kernels downstream (a max_pool2d: 500 against
    250 us) branch on those values."""
    import runpy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16),
                                torch.nn.ReLU(), torch.nn.MaxPool2d(2)).eval()
    x = torch.randn(2, 3, 16, 16)

    def step() -> None:
        with torch.no_grad():
            model(x)

    result = capture(step, tmp_path, name="cnn", kineto=False, timing_iters=1)
    bench = tmp_path / "cnn_bench.py"
    generate(result.et_path, bench, GenerateOptions(command_line="test"))
    g = runpy.run_path(str(bench), run_name="cnn_bench")
    cpu = torch.device("cpu")
    g["_RUNTIME"]["device"] = g["_RUNTIME"]["host"] = cpu
    inputs = g["make_inputs"](cpu, cpu, {"cpu": torch.Generator().manual_seed(0)})
    scope = g["replay"].__globals__
    relu, seen = scope["aten_relu"], []

    def spy(*args):
        out = relu(*args)
        seen.append(out)
        return out

    scope["aten_relu"] = spy
    g["replay"](inputs, cpu, cpu)
    (out,) = seen
    zeros = (out == 0).float().mean(dim=(0, 2, 3))  # per channel
    assert float(zeros.min()) > 0.2 and float(zeros.max()) < 0.8


class _VocabShard(torch.nn.Module):
    """One rank's shard of a vocabulary-parallel embedding, as Megatron and DTensor's
    _MaskPartial write it: the ids outside rows [start, end) are masked, the rest
    shifted by ``start`` (a Python int) to the shard's own rows."""

    def __init__(self, start: int, end: int):
        super().__init__()
        self.start, self.end = start, end
        self.weight = torch.nn.Parameter(torch.randn(end - start, 8))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = (ids < self.start) | (ids >= self.end)
        local = ids.clone() - self.start
        local[mask] = 0
        out = F.embedding(local, self.weight)
        out[mask] = 0.0
        return out


@pytest.mark.parametrize("start", [0, 24])
def test_a_shard_offset_the_trace_holds_no_value_of_is_its_windows_low_bound(
        tmp_path, start):
    """The offset reaches the trace as a 0-d int64 tensor without a value; filled at
    random, the shifted ids left the shard's rows and the embedding raised "index out
    of range" (rank 1 of tensor parallel with a vocabulary-parallel embedding)."""
    torch.manual_seed(0)
    shard = _VocabShard(start, start + 24)
    ids = torch.randint(0, 48, (4, 6))
    opt = torch.optim.SGD(shard.parameters(), lr=0.1)

    def step() -> None:
        opt.zero_grad()
        shard(ids).sum().backward()
        opt.step()

    result = capture(step, tmp_path, name="vocab", kineto=False, timing_iters=1,
                     integral_ranges=False)
    bench = tmp_path / "vocab_bench.py"
    text = generate(result.et_path, bench, GenerateOptions(command_line="test"))
    assert f'"span", {start}, {start}' in text
    replay_et = tmp_path / "replay.et.json"
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                         "--json", "--et", str(replay_et))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert op_multiset(result.et_path, by_overload=True) == op_multiset(replay_et, by_overload=True)


LT = "aten::lt.Scalar(Tensor self, Scalar other) -> Tensor"
GE = "aten::ge.Scalar(Tensor self, Scalar other) -> Tensor"
SUB = "aten::sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"


@pytest.mark.parametrize("lows,high,expected", [
    ([4], 8, ("span", 4, 4)),
    # Neither fixes it: a 0-d int's default (a wrapped Python int, never 0).
    ([4, 0], 8, ("randint", 1, 8)),  # two windows over the same values: none is known
    ([4], None, ("randint", 1, 8)),  # no high bound: a compare, not a window
])
def test_only_one_agreed_window_fixes_an_offset(lows, high, expected):
    b = TraceBuilder()
    ids = b.tensor((6,), dtype="int64")
    offset = b.tensor((), dtype="int64")
    for low in lows:
        b.op(LT, [ids, low], [b.tensor((6,), dtype="bool")])
    if high is not None:
        b.op(GE, [ids, high], [b.tensor((6,), dtype="bool")])
    b.op(SUB, [ids, offset, 1], [b.tensor((6,), dtype="int64")])
    assert (_scalar_inits(_program(b))) == [expected]


LIFT_FRESH = "aten::lift_fresh(Tensor(a) self) -> Tensor(a)"
INDEX_PUT_ = ("aten::index_put_(Tensor(a!) self, Tensor?[] indices, Tensor values, "
              "bool accumulate=False) -> Tensor(a!)")


def test_a_scalar_an_op_returns_as_it_is_is_still_a_new_number():
    """``t.clone() - 32`` read a wrapped 32, and the ``torch.tensor(0)`` put at the
    masked ids later came at its freed address; lift_fresh returns its input, and
    counted as having made it, so the two shared one fill: 32, out of the shard's 32
    rows (a flaky rank-1 failure of vocabulary-parallel replays)."""
    b = TraceBuilder()
    ids = b.tensor((6,), dtype="int64")
    mask = b.tensor((6,), dtype="bool")
    b.op(LT, [ids, 32], [mask])
    b.op(GE, [ids, 64], [b.tensor((6,), dtype="bool")])
    offset = b.tensor((), dtype="int64")
    local = b.tensor((6,), dtype="int64")
    b.op(SUB, [ids, offset, 1], [local])
    zero = T(b.new_id(), offset.storage_id, (), (), dtype="int64")  # the freed address
    b.op(LIFT_FRESH, [zero], [zero])
    b.op(INDEX_PUT_, [local, [mask], zero, False], [local])
    b.op(EMBEDDING, [b.tensor((32, 4)), local], [b.tensor((6, 4))])
    assert sorted(_scalar_inits(_program(b))) == [("randint", 0, 32), ("span", 32, 32)]


def test_a_number_at_the_address_an_earlier_shard_put_is_a_new_number():
    """The other order, from a CI run: the first shard's ``torch.tensor(0)``
    (lift_fresh returns it, which defines nothing new) was freed, and the next shard's
    wrapped offset 32 came at its address, as another tensor. One fill served both,
    32: the first shard's masked ids read row 32 of 32."""
    b = TraceBuilder()
    zero = b.tensor((), dtype="int64")
    for table in range(2):
        ids = b.tensor((6,), dtype="int64")
        mask = b.tensor((6,), dtype="bool")
        b.op(LT, [ids, 32], [mask])
        b.op(GE, [ids, 64], [b.tensor((6,), dtype="bool")])
        offset = T(b.new_id(), zero.storage_id, (), (), dtype="int64") if table else \
            b.tensor((), dtype="int64")
        local = b.tensor((6,), dtype="int64")
        b.op(SUB, [ids, offset, 1], [local])
        if not table:
            b.op(LIFT_FRESH, [zero], [zero])
            b.op(INDEX_PUT_, [local, [mask], zero, False], [local])
        b.op(EMBEDDING, [b.tensor((32, 4)), local], [b.tensor((6, 4))])
    assert sorted(_scalar_inits(_program(b))) == [
        ("randint", 0, 32), ("span", 32, 32), ("span", 32, 32)]


ZEROS = ("aten::zeros(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, "
         "Device? device=None, bool? pin_memory=None) -> Tensor")
ONES = ("aten::ones(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, "
        "Device? device=None, bool? pin_memory=None) -> Tensor")


@pytest.mark.parametrize("made_by, dtype, expect", [
    (ZEROS, "bool", "ones"), (ZEROS, "int64", ("span", 1, 1)),
    (ONES, "bool", "zeros"), (ONES, "int64", ("randint", 0, 1))])
def test_a_literal_written_into_zeros_is_not_zero(made_by, dtype, expect):
    """PyG's ``to_dense_batch``: ``mask = zeros(n, dtype=bool); mask[idx] = 1``. The
    literal was filled False, the likeliest elsewhere (``keep[..., :1] = False``), so
    every node mask was empty and MinCut pooling's loss divided 0 by 0; writing 0 into
    zeros changes nothing, so the first literal written there is 1."""
    b = TraceBuilder()
    mask, idx, literal = b.tensor((29,), dtype=dtype), b.tensor((22,), dtype="int64"), \
        b.tensor((), dtype=dtype)
    b.op(made_by, [[29], 11 if dtype == "bool" else 4, None, Device("cpu"), False], [mask])
    b.op(LIFT_FRESH, [literal], [literal])
    b.op(INDEX_PUT_, [mask, [idx], literal, False], [mask])
    init = next(s.init for s in _program(b).storages
                if s.materialised and s.extent == 1 and s.dtype == dtype)
    assert (init.kind if isinstance(expect, str) else (init.kind, init.low, init.high)) \
        == expect, init


SCATTER_ADD_ = ("aten::scatter_add_(Tensor(a!) self, int dim, Tensor index, Tensor src) "
                "-> Tensor(a!)")
CUMSUM = "aten::cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor"


@pytest.mark.parametrize("running_sum, expect", [(True, ("runs", 4)), (False, ("randint", 0))])
def test_an_index_counted_into_bins_and_reading_their_running_sum_is_sorted(running_sum,
                                                                            expect):
    """PyG's batch vector in ``to_dense_batch``/``to_dense_adj``: ``num_nodes =
    zeros(B).scatter_add_(0, batch, ones)``, ``ptr = cumsum(num_nodes)``, and a node's
    place in its graph ``i - ptr[batch[i]]``, which holds only where batch is sorted.
    Filled at random the places left the graphs (and their masks empty); counted
    alone (global pooling) it stays a bounded random index."""
    b = TraceBuilder()
    batch, counts = b.tensor((22,), dtype="int64"), b.tensor((4,))
    b.op(SCATTER_ADD_, [counts, 0, batch, b.tensor((22,))], [counts])
    ptr = b.tensor((4,))
    b.op(CUMSUM, [counts, 0, None], [ptr])
    if running_sum:
        b.op(INDEX, [ptr, [batch]], [b.tensor((22,))])
    init = _init_of(_program(b), "int64")
    assert (init.kind, init.low) == expect, init


def test_inputs_only_a_missing_op_reads_are_not_made(tmp_path):
    """A DLRM rank's fbgemm:: lookup reads 5.1 GB of embedding weights and optimizer
    state nothing else reads: where fbgemm is not loaded it is skipped, and its inputs
    were still filled (8 s of the run). They are made only where the op exists; its
    stand-in output is finite, so the ops after it train on finite values."""
    b = TraceBuilder()
    table, ids = b.tensor((1000, 64)), b.tensor((8,), dtype="int64")
    rows = b.tensor((8, 64))
    b.op("mylib::lookup(Tensor table, Tensor ids) -> Tensor", [table, ids], [rows])
    b.op(ADD_, [b.tensor((8, 64)), rows, 1], [b.tensor((8, 64))])
    b.op(ADD, [ids, ids, 1], [b.tensor((8,), dtype="int64")])
    program = _program(b)
    assert [(s.extent, s.only_guarded_readers) for s in program.storages
            if s.only_guarded_readers] == [(1000 * 64, (0,))]  # not ids: an add reads it
    text = generate_source(program)
    assert text.count("only_for=[mylib_lookup]") == 1
    assert "_INPUTS_ONLY_FOR = [[256000, [mylib_lookup]]]" in text  # the memory check's
    bench = tmp_path / "bench.py"
    bench.write_text(text)
    proc = run_benchmark(bench, "--warmup", "1", "--iters", "2", "--reset-inputs", "off",
                         "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = last_json(proc.stdout)
    assert out["skipped_at_runtime"] == ["mylib::lookup.default"]
    assert out["inputs_not_made_bytes"] == 1000 * 64 * 4
    assert "0.00 GiB of inputs not made" in proc.stderr and "NaN" not in proc.stderr


def test_an_attention_backward_reads_the_logsumexp_its_forward_computed(tmp_path):
    """The fused attention's backward takes the forward's logsumexp and computes
    exp(scores - logsumexp): with the composite replayed whole, it read one filled
    near 0 instead, and large scores (here a large ``scale``; timm's VOLO by its
    activations) turned the gradients and the weights inf. The forward replays as its
    kernel, whose logsumexp the backward reads, and nothing fills one."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 32, requires_grad=True) for _ in range(3))
    opt = torch.optim.SGD([q, k, v], lr=0.01)

    def step() -> None:
        opt.zero_grad()
        F.scaled_dot_product_attention(q, k, v, scale=1e4).square().sum().backward()
        opt.step()

    step()
    et = record_et(step, tmp_path / "sdpa.json")
    bench = tmp_path / "sdpa_bench.py"
    text = generate(et, bench, GenerateOptions(command_line="test"))
    assert "logsumexp_buf" not in text
    _assert_replays_finite(bench, 3)


def test_a_positive_difference_of_two_buffers_keeps_the_subtracted_term_small(tmp_path):
    """Running moments read as a variance, ``(sq - mean ** 2).sqrt()`` and ``sq - mean *
    mean``, and a margin ``log1p(hi - lo)`` of two buffers: the result's domain passes
    through the difference of two tensors (oprules ``differences``, ``contracting``):
    the greater filled positive, the subtracted term within 0.25 through the product or
    power that makes it. Filled apart, each square root and log1p was NaN, and the
    weights the step trains with them followed."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 6)
    mean, sq = torch.zeros(6), torch.ones(6)
    mean2, sq2 = torch.zeros(6), torch.ones(6)
    hi, lo = torch.full((6,), 2.0), torch.full((6,), 0.5)
    x = torch.randn(8, 6) * 3 + 1
    opt = torch.optim.SGD(lin.parameters(), lr=1e-2)

    def step() -> None:
        opt.zero_grad()
        with torch.no_grad():
            mean.mul_(0.99).add_(x.mean(0), alpha=0.01)
            sq.mul_(0.99).add_(x.pow(2).mean(0), alpha=0.01)
        h = (x - mean) / ((sq - mean.pow(2)).sqrt() + 1e-5)
        h = h / (sq2 - mean2 * mean2).sqrt() * torch.log1p(hi - lo)
        lin(h).square().mean().backward()
        opt.step()

    et_path = record_et(step, tmp_path / "moments.et.json")
    bench = tmp_path / "moments_bench.py"
    text = generate(et_path, bench, GenerateOptions(command_line="test"))
    assert text.count('"uniform", -0.25, 0.25') >= 3, text  # mean, mean2, lo
    _assert_replays_finite(bench, 3)


def test_a_positive_definite_matrix_the_step_computes_has_its_terms_filled_so(tmp_path):
    """Cholesky of a matrix computed from buffers: a Gaussian process's ``K * s + n *
    I`` of a Gram buffer, and a Kalman filter's ``H @ (P + Q) @ H.T + R`` (oprules
    ``positive_definite``: each term of a sum, the matrix a positive number scales, the
    middle of a congruence). Filled at random, the factorisation raised "not
    positive-definite"."""
    torch.manual_seed(0)
    xs = torch.linspace(0, 1, 6)[:, None]
    gram, y = torch.exp(-torch.cdist(xs, xs) ** 2 / 0.1), torch.sin(6 * xs)
    log_scale, log_noise = torch.nn.Parameter(torch.zeros(())), \
        torch.nn.Parameter(torch.tensor(-2.0))
    h = torch.nn.Linear(4, 3, bias=False)
    p, q, r, z = torch.eye(4), torch.eye(4) * 0.01, torch.eye(3) * 0.1, torch.randn(3, 1)
    opt = torch.optim.Adam([log_scale, log_noise, *h.parameters()], lr=1e-2)

    def step() -> None:
        opt.zero_grad()
        k = gram * log_scale.exp() + log_noise.exp() * torch.eye(6)
        low = torch.linalg.cholesky(k)
        gp = (y * torch.cholesky_solve(y, low)).sum() + low.diagonal().log().sum()
        s = h.weight @ (p + q) @ h.weight.T + r
        kalman = (z * torch.cholesky_solve(z, torch.linalg.cholesky(s))).sum()
        (gp + kalman).backward()
        opt.step()

    et_path = record_et(step, tmp_path / "definite.et.json")
    bench = tmp_path / "definite_bench.py"
    text = generate(et_path, bench, GenerateOptions(command_line="test"))
    assert text.count('"spd", 6, 0') == 1 and text.count('"spd", 4, 0') == 2 \
        and text.count('"spd", 3, 0') == 1, text
    _assert_replays_finite(bench, 3)


def test_a_count_minus_one_and_a_square_over_a_number_keep_a_variance_positive(tmp_path):
    """Welford's ``sqrt(m2 / (n - 1))`` with a count buffer ``n`` (``n - 1`` subtracts a
    wrapped Python int the trace holds no value of, filled 1..7: the count lies above
    it) and a variance from sums, ``(s2 - s1 * s1 / 8) / 7`` (a division by a number
    keeps the subtracted term small, oprules ``contracting``). Filled near 1 and apart,
    both square roots were NaN."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 1)
    n, mean, m2 = torch.tensor(10.0), torch.zeros(6), torch.ones(6) * 9
    s1, s2 = torch.full((6,), 2.0), torch.full((6,), 10.0)
    x = torch.randn(6)
    opt = torch.optim.SGD(lin.parameters(), lr=1e-2)

    def step() -> None:
        opt.zero_grad()
        with torch.no_grad():
            n.add_(1)
            delta = x - mean
            mean.add_(delta / n)
            m2.add_(delta * (x - mean))
        std = (m2 / (n - 1)).sqrt() * ((s2 - s1 * s1 / 8) / 7).sqrt()
        lin((x - mean) / std).square().sum().backward()
        opt.step()

    et_path = record_et(step, tmp_path / "welford.et.json")
    bench = tmp_path / "welford_bench.py"
    text = generate(et_path, bench, GenerateOptions(command_line="test"))
    assert '"uniform", 7.5, 8.5' in text, text  # the count, above n - 1's 1..7
    _assert_replays_finite(bench, 3)


def _masked_attention_step(unmask_full_rows: Callable[[torch.Tensor], None]
                           ) -> Callable[[], None]:
    """A training step of masked attention, one key per query, whose mask covers every
    key of all queries but one: ``unmask_full_rows(mask)`` unmasks such queries (as
    Mask2Former guards its softmax) before masked logits meet a softmax."""
    torch.manual_seed(0)
    scorer, values = torch.nn.Linear(4, 1), torch.nn.Linear(4, 4)
    with torch.no_grad():  # positive logits for every query but one
        scorer.weight.fill_(0.1)
        scorer.bias.zero_()
    x = torch.rand(2, 16, 4) + 0.1
    x[0, 0] = -1.0
    opt = torch.optim.SGD([*scorer.parameters(), *values.parameters()], lr=1e-2)

    def step() -> None:
        opt.zero_grad()
        logits = scorer(x)  # one key per query
        mask = (logits.sigmoid() < 0.5).detach()
        unmask_full_rows(mask)
        scores = torch.zeros_like(logits).masked_fill(mask, float("-inf")) + logits
        (scores.softmax(-1) * values(x)).sum().backward()
        opt.step()

    return step


def _unmask_by_where(mask: torch.Tensor) -> None:
    mask[torch.where(mask.sum(-1) == mask.shape[-1])] = False


def _unmask_by_squeezed_rows(mask: torch.Tensor) -> None:
    full = (mask.sum(-1) == mask.shape[-1]).flatten()
    mask.view(-1, 1).index_fill_(0, full.nonzero().squeeze(1), False)


def _unmask_by_selected_rows(mask: torch.Tensor) -> None:
    full = (mask.sum(-1) == mask.shape[-1]).flatten()
    mask.view(-1, 1)[full.nonzero()[:, 0]] = False


@pytest.mark.parametrize("unmask,made_by", [(_unmask_by_where, "where"),
                                            (_unmask_by_squeezed_rows, "nonzero"),
                                            (_unmask_by_selected_rows, "nonzero")],
                         ids=["where", "nonzero-squeeze", "nonzero-select"])
def test_indices_only_written_through_keep_every_row_the_replay_selects(
        tmp_path, unmask, made_by):
    """Mask2Former's masked attention unmasks every query whose mask covers all keys
    (``mask[torch.where(mask.sum(-1) == keys)] = False``) before a softmax. The
    original selected one such row; replayed weights select about half of them, and
    the ``where`` fitted to its recorded count kept one: the others stayed all -inf,
    their softmax NaN, and the weights NaN after a step (OneFormer's training step).
    Indices only an index write reads, with one value for any count, keep their
    replayed size: the write's result has its recorded size anyway. So do rows taken
    through a view that keeps them at any count (``nonzero().squeeze(1)`` into
    ``index_fill_``, ``nonzero()[:, 0]`` into an index assignment)."""
    et_path = record_et(_masked_attention_step(unmask), tmp_path / "masked.et.json")
    bench = tmp_path / "masked_attention_bench.py"
    text = generate(et_path, bench, GenerateOptions(command_line="test"))
    assert f"{made_by} = _fit(" not in text, text
    _assert_replays_finite(bench, 3)


ITEM = "aten::item(Tensor self) -> Scalar"
SELECT = "aten::select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)"


def _read_by_items(values, *, write_first: bool = False, skip: int | None = None,
                   dtype: str = "int64"):
    """A 4-element input (a diffusers scheduler's timesteps, from numpy) whose elements
    ``for t in timesteps`` reads with ``.item()``; a float reads it too. Optionally an
    in-place add before the reads, or one element left unread."""
    b = TraceBuilder()
    steps, x = b.tensor((4,), dtype=dtype), b.tensor((4,))
    b.op(MUL, [x, steps], [b.tensor((4,))])
    if write_first:
        b.op(ADD_, [steps, x, 1], [steps])
    for k, value in enumerate(values):
        if k == skip:
            continue
        element = b.view(steps, (), offset=k)
        b.op(SELECT, [steps, 0, k], [element])
        b.op(ITEM, [element], [value])
    program = run_passes([Source(trace_from_document(b.doc(), name="t.json", sha256="0"))],
                         BuildOptions())
    return program.ops[0].args[1].value.storage.init


@pytest.mark.parametrize(("values", "dtype"), [((75, 50, 25, 0), "int64"),
                                               ((0.5, -1.25, 3.0, 1e-3), "float32")])
def test_values_items_read_are_the_inputs(values, dtype):
    """Each element's ``.item()`` recorded its value, a plain ET's only record of a
    tensor's data: the input is filled with them."""
    init = _read_by_items(values, dtype=dtype)
    assert (init.kind, init.values) == ("values", values)


@pytest.mark.parametrize("case", ["written first", "an element unread"])
def test_items_read_after_a_write_or_of_some_elements_are_no_fill(case):
    """A read after an op wrote the storage is not its initial value; a read of some
    elements says nothing of the others: then the usual rules fill it."""
    init = _read_by_items((75, 50, 25, 0), write_first=case == "written first",
                          skip=2 if case == "an element unread" else None)
    assert init.kind != "values"


def _deep_step(head: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
    """A training step of three linear layers whose output meets ``rsqrt(head(h))``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 6),
                                torch.nn.Linear(6, 6))
    x = torch.randn(4, 6)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def step() -> None:
        opt.zero_grad()
        torch.rsqrt(head(model(x))).mean().backward()
        opt.step()

    return step


def _weight_inits(et_path) -> list[Init]:
    program = build_program(load_trace(et_path))
    return [s.init for s in program.storages
            if s.materialised and s.dtype == "float32" and s.extent == 36]


@pytest.mark.parametrize("head", [
    lambda h: h * h + 1, lambda h: torch.relu(h) + 1e-3, lambda h: h.clamp_min(0) + 1e-3,
    lambda h: (h * h).sum(-1, keepdim=True) + 1,
], ids=["square", "relu", "clamp_min", "sum_of_squares"])
def test_a_positive_result_asks_nothing_of_a_term_the_step_made_never_negative(
        tmp_path, head):
    """``rsqrt(h * h + 1)`` of a linear layer's ``h`` carried positivity back through
    the square into every weight of three layers: filled all positive, activations grew
    by the fan-in at each layer, and a data-parallel replay of a random program (seed
    31 of scripts/random_strategies.py) went inf in its second step. A term the step
    makes never negative (a square, relu, a clamp at 0, a sum of those) needs nothing
    of what it is computed from: the weights keep their fan-in fill, with both signs."""
    et_path = record_et(_deep_step(head), tmp_path / "never_negative.et.json")
    inits = _weight_inits(et_path)
    assert len(inits) == 3, inits
    assert all(init.low < 0 < init.high for init in inits), inits
    bench = tmp_path / "never_negative_bench.py"
    generate(et_path, bench, GenerateOptions(command_line="test"))
    _assert_replays_finite(bench, 5)


@pytest.mark.parametrize("head", [lambda h: h + 3, lambda h: h * 2 + 1],
                         ids=["shifted", "scaled"])
def test_a_weight_a_positive_result_needs_positive_is_scaled_by_its_fan_in(tmp_path, head):
    """Where positivity does need the weights (``rsqrt(h + 3)``, ``rsqrt(2 * h + 1)``),
    they are filled positive over their fan-in: filled in [0.5, 1.5) as other inputs
    are, each layer multiplied its input's size by the fan-in, 6 ** 3 here."""
    et_path = record_et(_deep_step(head), tmp_path / "positive.et.json")
    inits = _weight_inits(et_path)
    assert len(inits) == 3, inits
    assert all(init.low > 0 and init.high <= 1.5 / 6 for init in inits), inits
    bench = tmp_path / "positive_bench.py"
    generate(et_path, bench, GenerateOptions(command_line="test"))
    _assert_replays_finite(bench, 5)
