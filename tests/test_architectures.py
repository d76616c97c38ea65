"""Architectures nobody here wrote replay: tiny HuggingFace models captured at test time.

Each exercises a mechanism the issue-12 sweep (scripts/bench_sweep.py) found fragile:
relative position buckets from wrapped Python scalars (T5: storage ids reused by
scalars of other values), mixture-of-experts routing (top-k, data-dependent expert
batches; Llama 4's router starts from full_like(logits, -inf), recorded as "-inf"),
rotary embeddings and cache positions (Llama: arange plus a wrapped offset), a
state-space layer (Mamba), routing read through torch.where's index tensors (Switch
Transformers), and speech (wav2vec 2.0: a time mask drawn in numpy each step, made a
tensor that torch detaches in place). One training step (loss, backward, AdamW) is
captured, compiled, replayed standalone, and must replay the same multiset of
top-level op overloads. transformers is in the ``test`` extra; where it is missing
these tests are skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mystique_gen.backends.base import GenerateOptions
from mystique_gen.driver import generate
from mystique_gen.tools.capture import capture
from mystique_gen.tools.compare import op_multiset
from tests.conftest import run_benchmark

pytestmark = pytest.mark.slow
transformers = pytest.importorskip(
    "transformers", reason="transformers is in the test extra: pip install -e '.[test]'")

VOCAB = 128
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
         "max_position_embeddings": 64}


def t5() -> tuple[torch.nn.Module, dict[str, Any]]:
    # Relative position buckets: 0-d int64 scalars (0, num_buckets) wrapped one after
    # another at one address; one fill over both overflowed the bucket embedding.
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                num_decoder_layers=1, num_heads=2,
                                relative_attention_num_buckets=8,
                                relative_attention_max_distance=16, decoder_start_token_id=0)
    ids = torch.randint(1, VOCAB, (2, 12))
    return transformers.T5ForConditionalGeneration(cfg), {"input_ids": ids, "labels": ids}


def mixtral() -> tuple[torch.nn.Module, dict[str, Any]]:
    cfg = transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(cfg), _lm_inputs()


def qwen2_moe() -> tuple[torch.nn.Module, dict[str, Any]]:
    cfg = transformers.Qwen2MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=16,
                                      shared_expert_intermediate_size=32)
    return transformers.Qwen2MoeForCausalLM(cfg), _lm_inputs()


def llama4_text() -> tuple[torch.nn.Module, dict[str, Any]]:
    # The router starts from full_like(logits, -inf): the ET writes "-inf" as a string.
    cfg = transformers.Llama4TextConfig(**SMALL, head_dim=16, intermediate_size_mlp=64,
                                        num_local_experts=4, num_experts_per_tok=1)
    return transformers.Llama4ForCausalLM(cfg), _lm_inputs()


def llama() -> tuple[torch.nn.Module, dict[str, Any]]:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)), _lm_inputs()


def mamba() -> tuple[torch.nn.Module, dict[str, Any]]:
    cfg = transformers.MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=4,
                                   num_hidden_layers=1, expand=2, conv_kernel=4)
    return transformers.MambaForCausalLM(cfg), _lm_inputs()


def switch_transformers() -> tuple[torch.nn.Module, dict[str, Any]]:
    # Top-1 routing read through torch.where's two index tensors, rows of one buffer:
    # the reader of the first was given a view derived by offset from the second,
    # which read token indices as top-k slots once fitted (IndexError).
    cfg = transformers.SwitchTransformersConfig(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=2, num_experts=4, expert_capacity=8, num_sparse_encoder_layers=1,
        num_sparse_decoder_layers=1, relative_attention_num_buckets=8,
        decoder_start_token_id=0)
    ids = torch.randint(1, VOCAB, (2, 12))
    return transformers.SwitchTransformersForConditionalGeneration(cfg), \
        {"input_ids": ids, "labels": ids}


def wav2vec2() -> tuple[torch.nn.Module, dict[str, Any]]:
    # SpecAugment: training masks time steps drawn in numpy each step and made a tensor
    # by torch.tensor(...), which detaches its result in place. The replay fitted that
    # mask to its recorded count as a view, and detach_ refused it (RuntimeError).
    # Beside it: a convolutional feature extractor and a weight-normed positional
    # convolution, under a CTC loss.
    cfg = transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, conv_dim=(16,) * 7, num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, mask_time_prob=0.3, mask_time_length=2)
    audio = torch.randn(2, 8000)  # 24 frames: a random mask of the recorded count is unlikely
    return transformers.Wav2Vec2ForCTC(cfg), \
        {"input_values": audio, "labels": torch.randint(1, 32, (2, 4))}


def _lm_inputs() -> dict[str, Any]:
    ids = torch.randint(1, VOCAB, (2, 12))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, dict[str, Any]]]] = {
    "t5": t5, "mixtral": mixtral, "qwen2_moe": qwen2_moe, "llama4_text": llama4_text,
    "llama": llama, "mamba": mamba, "switch_transformers": switch_transformers,
    "wav2vec2": wav2vec2,
}


def _train_step(name: str) -> Callable[[], None]:
    torch.manual_seed(0)
    try:
        model, inputs = MODELS[name]()
    except (AttributeError, ImportError, TypeError, ValueError) as exc:
        pytest.skip(f"{name} cannot be built with transformers "
                    f"{transformers.__version__}: {exc}")
    model.config._attn_implementation = "eager"
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(**inputs).loss.backward()
        opt.step()

    return step


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_step_replays_the_same_ops(name: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    result = capture(_train_step(name), tmp_path, name=name, warmup=1, timing_iters=1,
                     kineto=False)
    bench = tmp_path / f"{name}_bench.py"
    generate(result.et_path, bench, GenerateOptions(command_line="test"))
    replay_et = tmp_path / "replay.et.json"
    # Two seeds: fills must be valid by construction, not by a lucky draw.
    for seed in ("0", "1"):
        proc = run_benchmark(bench, "--device", "cpu", "--warmup", "0", "--iters", "1",
                             "--seed", seed, "--et", str(replay_et))
        assert proc.returncode == 0, proc.stderr[-3000:]
    original = op_multiset(result.et_path, by_overload=True)
    replayed = op_multiset(replay_et, by_overload=True)
    assert original == replayed, (original - replayed, replayed - original)
