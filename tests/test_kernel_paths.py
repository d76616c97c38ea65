"""The replay takes the kernels the original took, where the op's choice of kernel
depends on facts beyond shapes and dtypes: whether an operand required grad, an
index's strides, grouped key/value heads, input values its recorded children show
(oprules/kernel_paths.py)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.ao.quantization.fake_quantize import FusedMovingAvgObsFakeQuantize

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.driver import generate
from mystique_gen.harness import equivalents, runtime
from mystique_gen.oprules import KERNEL_PATHS
from mystique_gen.oprules import matmul_grad_operand as _matmul
from mystique_gen.sources.et import load_trace
from mystique_gen.tools.compare import op_multiset
from tests.conftest import record_et, run_benchmark


def _kernels(path) -> Counter[str]:
    """Every recorded matmul kernel, children of composites included."""
    return Counter(n.name for n in load_trace(path).nodes
                   if n.name in ("aten::mm", "aten::bmm"))


@pytest.mark.slow
def _replayed(original, tmp_path):
    """The ET of one iteration of the benchmark generated from ``original``."""
    bench = tmp_path / "bench.py"
    generate(original, bench, GenerateOptions(command_line="test"))
    replay = tmp_path / "replay.et.json"
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1",
                         "--et", str(replay))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return replay


def test_an_inference_step_folds_matmuls_as_the_original_did(tmp_path):
    """Under no_grad, matmul folds a non-contiguous batch into one mm only where the
    weight requires grad, as a model's parameters do; replayed with plain tensors it
    ran an expanded bmm (Mamba's projections of transposed states, twice as slow; a
    language model's head on the last position in generate())."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(16, 8)
    states = torch.randn(2, 16, 12)

    @torch.no_grad()
    def step() -> None:
        hidden = proj(states.transpose(1, 2))
        proj.weight.t().matmul(hidden[:, -1:].transpose(1, 2).squeeze(0).unsqueeze(0))

    original = record_et(step, tmp_path / "step.et.json")
    assert _kernels(original)["aten::mm"] == 2
    assert _kernels(_replayed(original, tmp_path)) == _kernels(original)


def test_a_fold_that_strides_do_not_allow_reveals_the_matrix_required_grad():
    # Mamba's x_proj of hidden_states.transpose(1, 2): folded to mm only because the
    # weight required grad (an inference step under no_grad).
    assert _matmul([2, 8, 64], [512, 1, 8], [64, 18], [1, 64]) == 1
    # A contiguous batch folds anyway: nothing revealed.
    assert _matmul([2, 8, 64], [512, 64, 1], [64, 18], [1, 64]) is None
    # A matrix times a batch folds only for grad: the matrix (first) required it.
    assert _matmul([64, 2], [2, 1], [2, 2, 8], [144, 1, 18]) == 0


def test_attention_equivalent_takes_grouped_query_attention():
    q, k = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16)
    want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, k, 0.0, True)[0]
    (got,) = equivalents._attention(q, k, k, None, 0.0, True, None)
    torch.testing.assert_close(got, want)


def test_a_wrapped_index_keeps_its_strides():
    index = torch.arange(36).view(6, 6)[:, 0]  # stride 6
    wrapped = runtime._in_range(index, 5)
    assert wrapped.stride() == index.stride()
    assert wrapped.tolist() == [i % 5 for i in index.tolist()]


def _dtyped(path, names) -> Counter[tuple[str, tuple[str, ...]]]:
    """Every recorded op of ``names``, children included, by its tensor inputs' dtypes."""
    return Counter((n.name, tuple(a.type for a in n.inputs if a.type.startswith("Tensor(")))
                   for n in load_trace(path).nodes if n.name in names)


@pytest.mark.slow
def test_an_autocast_step_runs_its_kernels_in_the_cast_dtype(tmp_path):
    """Under torch.autocast, linear is recorded on float32 arguments; autocast casts
    them and calls linear again on bfloat16 ones. Replayed whole, without the autocast
    context, it ran a float32 GEMM, and every op after it on float32 tensors (an
    inference step: nothing made the selection descend into it)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 8), torch.nn.Softmax(-1))
    x = torch.randn(4, 16)

    @torch.no_grad()
    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x)

    original = record_et(step, tmp_path / "step.et.json")
    names = ("aten::addmm", "aten::gelu", "aten::_softmax")
    assert ("aten::addmm", ("Tensor(c10::BFloat16)",) * 3) in _dtyped(original, names)
    assert _dtyped(_replayed(original, tmp_path), names) == _dtyped(original, names)


def _names(path, names) -> Counter[str]:
    return Counter(n.name for n in load_trace(path).nodes if n.name in names)


@pytest.mark.slow
def test_a_training_steps_data_does_not_require_grad(tmp_path):
    """A batch and a float attention mask are read by ops that record autograd nodes
    (their weights require grad), but the step never updates them: they are data, and
    did not require grad. Made parameters, max_pool1d of the batch computed indices
    (max_pool1d_with_indices) and attention with the mask left the flash kernel for
    the math one."""
    torch.manual_seed(0)
    conv, proj = torch.nn.Conv1d(4, 4, 3, padding=1), torch.nn.Linear(8, 24)
    opt = torch.optim.SGD(list(conv.parameters()) + list(proj.parameters()), lr=0.1)
    x, mask = torch.randn(2, 4, 8), torch.randn(4, 4)

    def step() -> None:
        opt.zero_grad()
        pooled = torch.nn.functional.max_pool1d(x, 2)
        q, k, v = proj(conv(x)).view(2, 4, 2, 12).transpose(1, 2).chunk(3, dim=-1)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        (att.sum() + pooled.sum()).backward()
        opt.step()

    original = record_et(step, tmp_path / "step.et.json")
    names = ("aten::max_pool1d_with_indices", "aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_attention_math")
    assert _names(original, names) == Counter(
        {"aten::_scaled_dot_product_flash_attention_for_cpu": 1})
    assert _names(_replayed(original, tmp_path), names) == _names(original, names)


@pytest.mark.slow
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_sequence_lengths_computed_in_the_step_pack_as_recorded(tmp_path, enforce_sorted):
    """Lengths computed from the tokens (`(tokens != 0).sum(1)`) come from filled
    tokens in the replay: unsorted for a pack that requires them sorted, or adding up
    to other rows than the GRU's recorded weights-times-rows product (13 for 12), and
    the benchmark stopped. They are fitted where they are made, as a computed mask is:
    the pack gets lengths of the recorded total, longest and order."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4, padding_idx=0)
    rnn = torch.nn.GRU(4, 4, batch_first=True)
    tokens = torch.tensor([[1, 2, 3, 4, 5], [3, 4, 2, 0, 0], [7, 1, 0, 0, 0]])
    if not enforce_sorted:
        tokens = tokens.flip(0)

    def step() -> None:
        lengths = (tokens != 0).sum(1)
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            emb(tokens), lengths, batch_first=True, enforce_sorted=enforce_sorted)
        _, hidden = rnn(packed)
        hidden.sum().backward()

    original = record_et(step, tmp_path / "step.et.json")
    bench = tmp_path / "bench.py"
    text = generate(original, bench, GenerateOptions(command_line="test"))
    assert "_fit_lengths(" in text.split("def replay", 1)[1]
    replay = tmp_path / "replay.et.json"
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                         "--et", str(replay))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert op_multiset(replay, by_overload=True) == op_multiset(original, by_overload=True)


def _all_ops(path) -> Counter[tuple[str, tuple[str, ...]]]:
    """Every recorded op, children of composites included, by its tensor inputs' shapes;
    not what the replay's harness ran (its scope), nor undefined optional tensors (the
    original's kernels pass them, the replay passes None)."""
    nodes = load_trace(path).nodes
    parent = {n.id: n.parent for n in nodes}
    harness = {n.id for n in nodes if runtime.HARNESS_SCOPE in n.name}
    ops: Counter[tuple[str, tuple[str, ...]]] = Counter()
    for n in nodes:
        seen, at = set(), n.id
        while at not in harness and at not in seen and at in parent:
            seen.add(at)
            at = parent[at]
        if at in harness or not n.op_schema:
            continue
        ops[(n.name, tuple(str(a.shape) for a in n.inputs
                           if a.type.startswith("Tensor(") and "nullptr" not in a.type))] += 1
    return ops


def _renormed_rows():
    """Six of ten looked-up rows above max_norm: embedding_renorm_ scales each (a mul_)."""
    emb = torch.nn.Embedding(20, 4, max_norm=1.0)
    with torch.no_grad():
        emb.weight.mul_(0.4)
        emb.weight[:6].mul_(5.0)
    ids = torch.tensor([[0, 1, 2, 7, 8], [3, 4, 5, 9, 3]])
    return lambda: emb(ids).sum().backward()


def _packed_lengths():
    """Lengths [7, 5, 2], not the longest first and the rest even ([7, 4, 3])."""
    rnn = torch.nn.GRU(4, 4, batch_first=True)
    x, lengths = torch.randn(3, 7, 4), torch.tensor([7, 5, 2])

    def step() -> None:
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
        out, _ = rnn(packed)
        torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0].sum().backward()
    return step


def _computed_lengths():
    """Lengths the step computes, [6, 5, 1], unsorted: fitted to the recorded total and
    longest alone they were [6, 3, 3], packed in other blocks."""
    emb, rnn = torch.nn.Embedding(10, 4, padding_idx=0), torch.nn.GRU(4, 4)
    tokens = torch.tensor([[3, 4, 2, 1, 1, 0], [1, 2, 3, 4, 5, 6], [7, 0, 0, 0, 0, 0]])

    def step() -> None:
        lengths = (tokens != 0).sum(1)
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            emb(tokens).transpose(0, 1), lengths, enforce_sorted=False)
        rnn(packed)[1].sum().backward()
    return step


def _packed_outside():
    """A PackedSequence made before the step (a collate function): batch sizes [3, 3,
    2, 2, 2, 1, 1]; filled as the longest step the batch and the rest even ([3, 2, 2,
    2, 2, 2, 1]), every step's cell ran at other sizes."""
    rnn = torch.nn.LSTM(4, 4, num_layers=2, bidirectional=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(7, 3, 4),
                                                     torch.tensor([7, 5, 2]))

    def step() -> None:
        out, _ = rnn(packed)
        torch.nn.utils.rnn.pad_packed_sequence(out)[0].sum().backward()
    return step


def _qat_flags():
    """Fused observers and fake quantizations, one with its observer off and one with
    its fake quantization off (QAT's later epochs): the flags filled 0..8 turned others
    off or these on (an aminmax and a quantization more or less)."""
    fqs = [FusedMovingAvgObsFakeQuantize() for _ in range(3)]
    fqs[0].disable_observer()
    fqs[1].disable_fake_quant()
    x = torch.randn(8, 16, requires_grad=True)

    def step() -> None:
        y = x
        for fq in fqs:
            y = fq(y)
        y.sum().backward()
    return step


def _empty_bags():
    """Three of six max-mode bags empty: the backward's nonzero(bag_size) keeps three."""
    bag = torch.nn.EmbeddingBag(20, 4, mode="max")
    ids, offsets = torch.arange(1, 9), torch.tensor([0, 2, 2, 5, 5, 5])
    return lambda: bag(ids, offsets).sum().backward()


def _split_points():
    """tensor_split by a tensor of points ([2, 7] of 10 rows) and by a 0-d count of
    sections: filled at random, they split at other points (every output, and what
    reads it, at other sizes)."""
    x = torch.randn(10, 4, requires_grad=True)
    points, sections = torch.tensor([2, 7]), torch.tensor(3)

    def step() -> None:
        parts = [*torch.tensor_split(x, points), *torch.tensor_split(x, sections, 1)]
        sum(p.sum() * k for k, p in enumerate(parts)).backward()
    return step


@pytest.mark.slow
@pytest.mark.parametrize("make_step", [_renormed_rows, _packed_lengths, _computed_lengths,
                                       _packed_outside, _empty_bags, _split_points])
def test_kernel_paths_that_values_decide_run_as_recorded(tmp_path, make_step):
    """Filled values took other paths through these kernels: no row above max_norm (16
    mul_ in a model's step, none replayed), lengths packed in other blocks (a
    contiguous less), other bags empty (the backward's nonzero, index_select and
    index_add_ at other sizes). Filled as the recorded children show, every op,
    children included, runs at the recorded sizes."""
    torch.manual_seed(0)
    original = record_et(make_step(), tmp_path / "step.et.json")
    assert _all_ops(_replayed(original, tmp_path)) == _all_ops(original)


def test_bag_offsets_leave_the_recorded_bags_empty():
    gens = {"cpu": torch.Generator().manual_seed(0)}
    for numel, empty, total in ((6, 3, 8), (5, 0, 5), (4, 4, 0), (7, 6, 1)):
        offsets = runtime._fill_bags(numel, empty, total, gens["cpu"], "cpu", gens, None)
        ends = torch.cat([offsets[1:], torch.tensor([total])])
        assert offsets[0] == 0 and bool((ends >= offsets).all())
        assert int((ends == offsets).sum()) == empty
    cuts = runtime._fill_bag_cuts(7, 2, 9, gens["cpu"], "cpu", gens, None)
    assert cuts[-1] == 9 and int((cuts[1:] == cuts[:-1]).sum()) == 2


def test_a_renormed_table_has_the_recorded_rows_above_max_norm():
    gens = {"cpu": torch.Generator().manual_seed(0)}
    table = runtime._norms(40, 4, 0.5, 1.0, [1, 2.5, 7, 0.75], torch.float32, "cpu",
                           gens).view(10, 4)
    norms = torch.linalg.vector_norm(table, ord=1.0, dim=1)
    assert (norms > 0.5).nonzero().flatten().tolist() == [1, 7]
    torch.testing.assert_close(norms[[1, 7]], torch.tensor([2.5, 0.75]))


def test_split_points_are_the_int_overloads_recorded_values():
    rule = KERNEL_PATHS["aten::tensor_split"]
    facts = rule.facts({"tensor_indices_or_sections": (2,)}, [[(2, 4), (5, 4), (3, 4)]],
                       (2, 7))
    assert facts is not None and facts.values == (("tensor_indices_or_sections", (2, 7)),)
    assert rule.facts({"tensor_indices_or_sections": ()}, [], (3,)) is not None
    assert rule.facts({"tensor_indices_or_sections": (3,)}, [], (2, 7)) is None


def test_packed_runs_give_the_recorded_lengths():
    rule = KERNEL_PATHS["aten::_pack_padded_sequence"]
    # batch sizes [3, 3, 2, 2, 2, 1, 1]: 14 rows over 7 steps
    facts = rule.facts({"lengths": (3,)}, [(14, 4), (7,)], (3, 3, 2, 2, 2, 1, 1))
    assert facts is not None and facts.values == (("lengths", (7, 5, 2)),)
    assert rule.facts({"lengths": (3,)}, [(15, 4), (7,)], (3, 3, 2, 2, 2, 1, 1)) is None


def test_packed_steps_give_the_recorded_batch_sizes():
    rule = KERNEL_PATHS["aten::lstm"]
    facts = rule.facts({"data": (14, 4), "batch_sizes": (7,)}, [], (3, 3, 2, 2, 2, 1, 1))
    assert facts is not None and facts.values == (("batch_sizes", (3, 3, 2, 2, 2, 1, 1)),)
    # not every row, not one size a step, or rising: left to the shape rule
    assert rule.facts({"data": (15, 4), "batch_sizes": (7,)}, [], (3, 3, 2, 2, 2, 1, 1)) \
        is None
    assert rule.facts({"data": (14, 4), "batch_sizes": (6,)}, [], (3, 3, 2, 2, 2, 1, 1)) \
        is None
    assert rule.facts({"data": (14, 4), "batch_sizes": (7,)}, [], (1, 3, 2, 2, 2, 3, 1)) \
        is None


@pytest.mark.slow
def test_qat_flags_run_the_recorded_observers_and_quantizations(tmp_path):
    """The replay runs the fused op's helper, which the wrapper called (the wrapper
    itself is not replayed): below it, the same aminmax and quantization kernels."""
    torch.manual_seed(0)
    original = record_et(_qat_flags(), tmp_path / "step.et.json")
    wrapper = "aten::fused_moving_avg_obs_fake_quant"

    def ops(path):
        return Counter({k: n for k, n in _all_ops(path).items() if k[0] != wrapper})
    want = ops(original)
    assert want[("aten::aminmax", ("[8, 16]",))] == 2
    assert ops(_replayed(original, tmp_path)) == want
