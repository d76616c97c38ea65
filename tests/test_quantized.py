"""Quantized inference (oprules/quantized.py): packed linear weights rebuilt from the
op's shapes, quantized tensors filled as their integer representation, quantized
embedding bags given valid indices and offsets, and quantized convolutions and packed
tables (whose packed objects hold what the trace lacks) reported, not run."""

from __future__ import annotations

import importlib.util
import warnings
from collections import Counter

import pytest
import torch

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.driver import generate
from mystique_gen.tools.capture import capture
from mystique_gen.tools.compare import op_multiset
from tests.conftest import last_json, run_benchmark

pytestmark = pytest.mark.slow

quantization = torch.ao.quantization


def _replay(step, tmp_path, name):
    """Capture `step`, generate its benchmark, replay it standalone: (header, original
    op multiset, replayed op multiset, the --json line)."""
    torch.set_num_threads(1)
    result = capture(step, tmp_path, name=name, kineto=False, timing_iters=1)
    bench = tmp_path / f"{name}_bench.py"
    text = generate(result.et_path, bench, GenerateOptions(command_line="test"))
    replay_et = tmp_path / f"{name}_replay.et.json"
    proc = run_benchmark(bench, "--device", "cpu", "--warmup", "1", "--iters", "2",
                         "--json", "--et", str(replay_et))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return (text.split('"""')[1], op_multiset(result.et_path, by_overload=True),
            op_multiset(replay_et, by_overload=True), last_json(proc.stdout))


@pytest.mark.parametrize("dtype", [torch.qint8, torch.float16])
def test_dynamically_quantized_linears_replay_with_packed_weights(dtype, tmp_path):
    """``quantize_dynamic`` packs each Linear's weight into a TorchScript object, which
    the trace writes as "<Object>": the ops were dropped as not rebuildable. The
    replay packs a weight of the op's shape (int8, or fp16 for an fp16 model)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 16)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=dtype)
    x = torch.randn(8, 32)

    def step():
        with torch.no_grad():
            return quantized(x)

    header, original, replayed, out = _replay(step, tmp_path, "dynamic")
    linears = {k: n for k, n in original.items() if k.startswith("quantized::linear")}
    assert sum(linears.values()) == 2, original
    assert "cannot be rebuilt" not in header and "Ops not replayed:\n  - none" in header
    assert replayed == original, (original - replayed, replayed - original)
    assert out["skipped_at_runtime"] == [] and out["nonfinite_inputs"] == []


def test_a_statically_quantized_network_runs_and_names_what_it_cannot_rebuild(tmp_path):
    """Eager static quantization: quantized tensors between ops (the benchmark made
    them with ``torch.zeros``, which quantized dtypes refuse, and crashed), a quantized
    linear (replayed), and quantized convolutions, whose packed weights hold a kernel
    size, stride and padding the trace does not record: not replayed, with that reason,
    rather than replayed as the allocations recorded below them."""
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = quantization.QuantStub(), quantization.DeQuantStub()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.relu = torch.nn.ReLU()
            self.fc = torch.nn.Linear(8 * 6 * 6, 10)

        def forward(self, x):
            x = self.relu(self.conv(self.quant(x)))
            return self.dequant(self.fc(torch.flatten(x, 1)))

    net = Net().eval()
    net.qconfig = quantization.get_default_qconfig("x86")
    image = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = quantization.prepare(net)
        prepared(image)
        converted = quantization.convert(prepared)

    def step():
        with torch.no_grad():
            return converted(image)

    header, original, replayed, out = _replay(step, tmp_path, "static")
    assert original["quantized::conv2d.new"] == 1
    assert "quantized::conv2d x1: its packed weight holds the convolution's kernel size" \
        in " ".join(header.split())
    # every other op as recorded: quantize, the linear, dequantize, the quantized relu
    assert original - replayed == Counter({"quantized::conv2d.new": 1}), original
    assert replayed - original == Counter()
    assert replayed["quantized::linear.default"] == 1
    assert out["skipped_at_runtime"] == []


def test_rowwise_quantized_embedding_bags_read_valid_rows_and_bags(tmp_path):
    """A recommender's inference over FBGEMM's rowwise-quantized tables: the byte
    kernel checks its offsets, and random ones made it fail at run time (skipped, with
    a stand-in result). Indices and offsets follow aten::embedding_bag's rules. The
    module form passes its table packed, whose row count the trace does not hold: not
    replayed, with that reason."""
    torch.manual_seed(0)
    table = torch.randn(1000, 16)
    byte = torch.ops.quantized.embedding_bag_byte_prepack(table)
    nibble = torch.ops.quantized.embedding_bag_4bit_prepack(table)
    indices, offsets = torch.randint(0, 1000, (64,)), torch.arange(0, 64, 4)
    bag = torch.ao.nn.quantized.EmbeddingBag(1000, 16, mode="sum", dtype=torch.quint8)

    def step():
        a = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
            byte, indices, offsets, False, 0, False, None, None, False)
        b = torch.ops.quantized.embedding_bag_4bit_rowwise_offsets(
            nibble, indices, offsets, False, 0, False, None, None, False)
        return a.sum() + b.sum() + bag(indices, offsets).sum()

    header, original, replayed, out = _replay(step, tmp_path, "bags")
    assert out["skipped_at_runtime"] == []
    # Every draw is valid, not only this seed's: offsets of bags (first 0, never
    # decreasing, within the indices) and indices of the table's rows.
    spec = importlib.util.spec_from_file_location("bags_bench", tmp_path / "bags_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cpu = torch.device("cpu")
    bench._RUNTIME.update(device=cpu, host=cpu)
    for seed in range(5):
        made = bench.make_inputs(cpu, cpu, {"cpu": torch.Generator().manual_seed(seed)})
        drawn_offsets, drawn_indices = made["offsets"], made["indices"]
        assert drawn_offsets[0] == 0 and bool((drawn_offsets.diff() >= 0).all())
        assert int(drawn_offsets[-1]) <= drawn_indices.numel()
        assert int(drawn_indices.min()) >= 0 and int(drawn_indices.max()) < 1000
    assert original - replayed == Counter({"quantized::embedding_bag_byte.default": 1})
    assert replayed["quantized::embedding_bag_byte_rowwise_offsets.default"] == 1
    assert replayed["quantized::embedding_bag_4bit_rowwise_offsets.default"] == 1
    assert "embedding_bag_byte x1: its packed table's row count is not in the trace" \
        in " ".join(header.split())


def test_onednn_quantized_ops_replay_on_weights_prepacked_as_mkldnn_tensors(tmp_path):
    """PT2E's x86 quantizer under ``torch.compile`` with freezing runs oneDNN's
    quantized convolution and linear (``onednn::qconv_pointwise``,
    ``onednn::qlinear_pointwise``) on weights prepacked as MKLDNN tensors, which the
    trace records without storage, as it records a vmap wrapper: taken for one, each
    op was replayed as its output's allocation alone, and the header named neither.
    The replay makes them as MKLDNN tensors (``to_mkldnn``), which the kernels take."""
    torch.manual_seed(0)
    onednn = torch.ops.onednn
    qx = torch.randint(0, 255, (2, 3, 8, 8), dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last)
    conv_w = onednn.qconv_prepack(torch.randint(-127, 127, (16, 3, 3, 3), dtype=torch.int8),
                                  torch.rand(16) / 100, 0.02, 0, [1, 1], [1, 1], [1, 1], 1,
                                  [2, 3, 8, 8])
    qh = torch.randint(0, 255, (2, 64), dtype=torch.uint8)
    linear_w = onednn.qlinear_prepack(torch.randint(-127, 127, (10, 64), dtype=torch.int8),
                                      [2, 64])
    scale, zero = torch.tensor(0.02), torch.tensor(0, dtype=torch.int32)

    def step():
        with torch.no_grad():
            y = onednn.qconv_pointwise.tensor(
                qx, scale, zero, conv_w, torch.rand(16) / 100,
                torch.zeros(16, dtype=torch.int64), torch.zeros(16), [1, 1], [1, 1],
                [1, 1], 1, 1.0, 0, torch.float32, "relu", [None], "")
            z = onednn.qlinear_pointwise.tensor(
                qh, scale, zero, linear_w, torch.rand(10) / 100,
                torch.zeros(10, dtype=torch.int32), torch.zeros(10), 1.0, 0,
                torch.float32, "none", [None], "")
            return y.sum() + z.sum()

    header, original, replayed, out = _replay(step, tmp_path, "onednn")
    assert original["onednn::qconv_pointwise.tensor"] == 1, original
    assert original["onednn::qlinear_pointwise.tensor"] == 1, original
    assert replayed == original, (original - replayed, replayed - original)
    assert "Ops not replayed:\n  - none" in header
    assert out["skipped_at_runtime"] == [] and out["nonfinite_inputs"] == []
