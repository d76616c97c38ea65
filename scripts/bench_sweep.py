"""`make bench` section: does every architecture replay?

A vendor gets whatever trace a customer captured, so the benchmark must replay models
nobody here tried. This section builds every architecture the installed
``transformers`` registers for causal LM, masked LM, seq2seq LM, image classification,
audio classification, CTC and speech-to-text, semantic segmentation, video
classification, object detection, depth estimation, contrastive image-text
(CLIP-like), universal (panoptic) segmentation, keypoint detection and time-series
classification models, from its default config shrunk generically (no weights are
downloaded; where the model does not build or run eagerly from that, with fewer
attributes shrunk; inputs are made from what the forward's signature, docstring and the
config ask for, and the few models whose processor lays inputs out its own way have
their own builders in three small tables, ``_OWN_INPUTS``, ``_PROCESSED_IMAGES`` and
``_STEP_CODES``), captures one training step (loss, backward, AdamW; where the model
computes no loss from the labels given, the mean of its outputs) and one inference
step each, generates a benchmark with the CLI, replays it standalone
(``--warmup 0 --iters 3 --reset-inputs off --json --et replay.json``, with
``mystique_gen`` unimportable), compares the top-level op multisets by overload, and
checks that no input the replay writes ends NaN or inf (``nonfinite_inputs``).

Outcomes: ``skip`` (the model cannot be built or run eagerly from a tiny config: not
our failure), ``gen error``, ``run error``, ``op mismatch``, ``nonfinite``, ``pass``. Each failure
prints the first line of its error.

Environment: SWEEP_ONLY=substr,... (architecture names containing any; =name: that name
only), SWEEP_KINDS=
causal,masked,seq2seq,image,audio,ctc,speech,segmentation,video,detection,depth,
contrastive,panoptic,keypoints,series (default: all), SWEEP_LIMIT=N (first N per
kind), SWEEP_SAMPLE=K/N (the architectures whose place in the sorted list is K modulo
N: a sweep in N parts, each a spread of every kind and family), SWEEP_JOBS=N (models
at once; default 1),
SWEEP_STEPS=train,infer (the default) or any of train,infer,decode: ``decode`` (opt-in:
about twice an inference step's time) captures greedy generation of 4 tokens with the KV
cache on (``model.generate(**inputs, max_new_tokens=4, do_sample=False, use_cache=True)``
under ``torch.no_grad``, from the inference step's inputs less any decoder ids, with a
pad id in the vocabulary), the cache turned back on in every config of the tree and the
cache itself built by the model's own ``generate`` (dynamic, sliding-window, hybrid or
recurrent states); a skip where the kind is not a generating one (causal, seq2seq,
vlm, speechlm, speech) or the model cannot generate. SWEEP_TIMEOUT=seconds per model
(default 900). Traces go to a temporary directory (SWEEP_KEEP=DIR keeps them in
DIR/ARCH). Each model runs in a process of its own, so a crash or a hang costs one row.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ("causal", "masked", "seq2seq", "image", "audio", "ctc", "speech", "segmentation",
         "video", "detection", "depth", "contrastive", "panoptic", "keypoints", "series", "vlm",
         "speechlm")
# Kinds whose main input is an image (a clip of frames for video).
_PIXEL_KINDS = ("image", "segmentation", "video", "detection", "depth", "contrastive",
                "panoptic", "keypoints")
# Kinds that classify (their heads shrunk to _LABELS classes).
_LABELLED = ("image", "audio", "segmentation", "video", "detection", "panoptic", "series")
_LABELS = 4
OUTCOMES = ("skip", "capture error", "gen error", "run error", "op mismatch", "nonfinite",
            "pass")
# Timed iterations of each replay, without --reset-inputs: a training replay that
# carries NaN or inf into its weights (a value outside some op's domain) shows it in
# --json's nonfinite_inputs (the outcome ``nonfinite``).
REPLAY_ITERS = 3
BATCH, SEQ, IMAGE = 2, 16, 32
SAMPLES, FRAMES = 4000, 64  # an audio model's raw samples, or its feature frames
VOCAB = 256

# Generic shrinking: config attribute -> small value. Only attributes the config has
# are set; names differ between model families, so each family's spelling is listed.
_WIDTH = 64
_SMALL: dict[str, int] = {
    **dict.fromkeys(_WIDTHS := ("hidden_size", "d_model", "n_embd", "n_embed", "dim",
                                "embed_dim", "word_embed_proj_dim", "model_dim", "hidden_dim",
                                "hidden_size_global", "d_latents"), _WIDTH),
    **dict.fromkeys(_DEPTHS := ("num_hidden_layers", "n_layer", "n_layers", "num_layers",
                                "encoder_layers", "decoder_layers", "num_decoder_layers",
                                "num_encoder_layers", "num_self_attends_per_block"), 2),
    # Layers that reuse an earlier layer's keys and values (Gemma 3n): with two layers,
    # one of each attention type, none is left to reuse.
    "num_kv_shared_layers": 0,
    **dict.fromkeys(_HEADS := ("num_attention_heads", "n_head", "n_heads", "num_heads"), 4),
    **dict.fromkeys(("encoder_attention_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(_KV_HEADS := ("num_key_value_heads", "n_kv_heads", "num_kv_heads",
                                  "multi_query_group_num"), 2),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim",
                     "d_ff", "n_inner", "ffn_hidden_size", "mlp_dim", "inner_hidden_size"),
                    128),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size",
                     "expert_intermediate_size", "moe_ffn_hidden_size", "expert_ffn_hidden_size",
                     "moe_shared_expert_intermediate_size", "shared_experts_intermediate_size"),
                    32),
    **dict.fromkeys(_EXPERTS := ("num_experts", "num_local_experts", "n_routed_experts",
                                 "moe_num_experts", "num_routed_experts"), 4),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"), 1),
    **dict.fromkeys(_TOP_K := ("num_experts_per_tok", "num_experts_per_token", "moe_topk",
                               "top_k", "num_selected_experts", "moe_k", "top_k_experts"), 2),
    # Group-limited routing (DeepSeek): 4 experts in 2 groups of 2, the best group.
    **dict.fromkeys(("n_group", "num_expert_group"), 2),
    **dict.fromkeys(("topk_group",), 1),
    **dict.fromkeys(_HEAD_SIZES := ("head_dim", "attention_head_size", "d_kv", "kv_channels"),
                    16),
    **dict.fromkeys(("vocab_size", "n_vocab"), VOCAB),
    # Multi-head latent attention and partial rotary embeddings: parts of a head.
    **dict.fromkeys(_HEAD_PARTS := ("qk_rope_head_dim", "qk_nope_head_dim", "rotary_dim",
                                    "rope_dim"), 8),
    **dict.fromkeys(_LATENTS := ("v_head_dim", "kv_lora_rank", "q_lora_rank"), 16),
    # A speech encoder's positions: Whisper's input is twice as many feature frames.
    "max_source_positions": FRAMES // 2,
    # A detector's object queries: RT-DETR picks its top ones among the encoder's tokens.
    "num_queries": 16,
}
# A vocoder's or audio tokenizer's channels (HiFi-GAN's and BigVGAN's first upsampling
# width, halved at each of its upsamplings; an acoustic tokenizer's first filters,
# doubled at each of its downsamplings): shrunk to these, with the widths.
_CHANNELS: dict[str, int] = {"upsample_initial_channel": 2 * _WIDTH, "decoder_dim": 2 * _WIDTH,
                              "num_filters": 8}
_SMALL.update(_CHANNELS)
# Sizes a model names its own way (an adapter's input and output widths, a
# projection's): an attribute so named whose value is one of the config tree's widths
# (its own, its parent's, a sibling's) is shrunk with them, to _WIDTH.
_WIDTH_LIKE = ("_dim", "_size", "_channels", "hidden_size")
_NOT_WIDTH = ("vocab", "position", "window", "length", "image", "chunk", "sampl", "rate",
              "hop", "codebook", "patch", "feature", "bins")
# Channel lists of a speech model's convolutional feature extractor (wav2vec 2.0's
# seven 512-wide convolutions), each shrunk to _WIDTH.
_CHANNEL_LISTS = ("conv_dim",)
_IMAGE_SIZES = ("image_size", "img_size")  # shrunk to IMAGE
# Blocks per stage of a vision backbone, each shrunk to 1.
_STAGE_DEPTHS = ("depths", "num_layers_per_stage", "num_block_repeats")
# Where a model does not build or run from the shrunk config, build() retries with
# fewer attributes shrunk, rung by rung: (attributes left at their defaults, whether to
# fill sizes the default config leaves unset). Head sizes first (a model may derive them
# its own way), then widths and the image size too (Swin V2's embed_dim must stay a
# multiple of its stages' head counts; Swin's windows must fit its last stage's grid,
# MobileViTV2 downsamples 32 times), then filling unset sizes (Hunyuan's head_dim,
# Nemotron's key/value heads), last leaving depths, then widths as they were.
_LADDER: tuple[tuple[frozenset[str], bool], ...] = (
    (frozenset(), False),
    (frozenset(_HEAD_SIZES + _HEAD_PARTS + _LATENTS), False),
    (frozenset(_HEAD_SIZES + _HEAD_PARTS + _LATENTS + _WIDTHS + _IMAGE_SIZES + tuple(_CHANNELS)),
     False),
    (frozenset(), True),
    # Depths as they were: a dense-prediction head or a detector reads the backbone's
    # layers or stages by index (BEiT's out_indices, DPT's neck, RT-DETR's strides).
    (frozenset(_DEPTHS + _STAGE_DEPTHS), False),
    # ... and widths too: its neck's sizes follow the backbone's (Depth Anything).
    (frozenset(_DEPTHS + _STAGE_DEPTHS + _HEAD_SIZES + _HEAD_PARTS + _LATENTS + _WIDTHS
               + _IMAGE_SIZES + tuple(_CHANNELS)), False),
)
# Per-layer lists (layer_types, mlp_only_layers, ...) are cut to the new layer count.
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                  "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id")


# Widths of a backbone's stages (Florence-2's DaViT: 128 to 1024; Muse's audio tower):
# where a model is too big with them, divided by a power of two (see _slimmer).
_STAGE_WIDTHS = ("embed_dim", "hidden_sizes", "embed_dims")
_STAGE_HEADS = ("num_heads", "num_groups", "num_attention_heads")


def _slimmer(raw: dict[str, Any], widths: Any) -> list[int] | None:
    """Stage widths divided by the largest power of two that leaves the first at least
    16 and each a multiple of its stage's head and group counts; None where none does."""
    if not isinstance(widths, (list, tuple)) or len(widths) < 2 \
            or not all(_is_int(w) and w > 0 for w in widths):
        return None
    counts = [v for k in _STAGE_HEADS if isinstance(v := raw.get(k), (list, tuple))
              and len(v) == len(widths) and all(_is_int(c) and c > 0 for c in v)]
    factor = 1
    while widths[0] // (factor * 2) >= 16 and all(
            w % (factor * 2) == 0 and all((w // (factor * 2)) % c[i] == 0 for c in counts)
            for i, w in enumerate(widths)):
        factor *= 2
    return [w // factor for w in widths] if factor > 1 else None


def _names(cls: type, name: str) -> set[str]:
    """The names a config attribute answers to: its own and its attribute_map aliases
    (GPT-2's n_embd is hidden_size, ConvNeXt's num_stages is num_hidden_layers)."""
    return {name, *(alias for alias, target in getattr(cls, "attribute_map", {}).items()
                    if target == name)}


def _small_for(cls: type, name: str) -> int | None:
    small = next((_SMALL[n] for n in sorted(_names(cls, name)) if n in _SMALL), None)
    if small is None and (name.endswith(("vocab_size", "_vocab")) or name.startswith("vocab_size")):
        # every family names its other vocabularies its own way: LUKE's entities,
        # Gemma's per-layer inputs, BLT's byte-group hashes, FSMT's source and target
        small = VOCAB
    return small


def _smaller(cls: type, name: str, value: object, keep: frozenset[str]) -> int | None:
    """The shrunk value of a config attribute, or None where it stays as it is."""
    small = _small_for(cls, name)
    if small is None or not _is_int(value) or value <= small or _names(cls, name) & keep:
        return None
    return small


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _given(cfg: Any) -> dict[str, Any]:
    """What a sub-config was presumably built with: the fields that differ from their
    class defaults. Fields that default to None are left out: __post_init__ derives
    those (head_dim, layer_types), and they must follow the shrunk values."""
    given: dict[str, Any] = {}
    for field in dataclasses.fields(type(cfg)) if dataclasses.is_dataclass(cfg) else ():
        default = field.default
        if default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        value = vars(cfg).get(field.name, default)
        if default not in (None, dataclasses.MISSING) and value != default \
                and not hasattr(value, "to_dict") and not field.name.startswith("_"):
            given[field.name] = value
    # Attributes the parent gave that are no fields of the class (kwargs it keeps as
    # they are: CHMv2's backbone returns its class tokens): those a default lacks.
    with contextlib.suppress(Exception):
        default = vars(type(cfg)())
        given.update({k: v for k, v in vars(cfg).items() if k not in default
                      and not k.startswith("_") and not hasattr(v, "to_dict")})
    # A backbone's stages read out (properties over private fields): DPT's neck reads
    # four of its backbone's layers.
    indices = getattr(cfg, "out_indices", None)
    if isinstance(indices, (list, tuple)):
        given["out_indices"] = list(indices)
    return given


def _tree_widths(cfg: Any, depth: int = 0) -> set[int]:
    """The widths (hidden sizes, model dims) a config and its sub-configs default to."""
    cls = type(cfg)
    found = {v for k, v in vars(cfg).items() if _is_int(v) and v > 2 * _WIDTH
             and _names(cls, k) & set(_WIDTHS)}
    for value in vars(cfg).values():
        if hasattr(value, "to_dict") and depth < 3:
            found |= _tree_widths(value, depth + 1)
    return found


def _shrunk(cfg: Any, keep: frozenset[str] = frozenset(), fill: bool = False,
            depth: int = 0, widths: frozenset[int] | None = None, slim: bool = False) -> Any:
    """A shrunk copy of a config: widths, depths, heads, experts, vocabulary, per-layer
    lists; sub-configs (text_config, encoder, ...) likewise. Attributes named in keep
    stay as they are; with fill, sizes left unset (None) get their small value.

    The copy is built through the config's constructor with the shrunk values as
    arguments, so that what the config derives from them in __post_init__ (a latent
    attention's head_dim from its rope part, Swin's hidden_size from embed_dim and the
    stage count, default layer_types) follows, instead of staying derived from the
    defaults. A top-level config must be a default one (built without arguments); a
    sub-config keeps what its parent built it with (an encoder-decoder's decoder has
    cross-attention, an audio model's text_config its own sizes) as arguments too."""
    cls = type(cfg)
    raw = {k: v for k, v in vars(cfg).items() if not k.startswith("_")}
    new: dict[str, Any] = {}
    if widths is None:
        widths = frozenset(_tree_widths(cfg))
    stages = raw.get("depths")  # blocks per stage of a vision backbone (a tuple or a list)
    layer_key = next((k for k, v in raw.items() if _is_int(v)
                      and _names(cls, k) & set(_LAYER_COUNT_KEYS)), None)
    for key, value in raw.items():
        if key == layer_key and isinstance(stages, (list, tuple)) and value == len(stages):
            continue  # a count of stages, each with its own width: depths shrinks them
        if (small := _smaller(cls, key, value, keep)) is not None:
            new[key] = small
        elif _is_int(value) and value in widths and not set(_WIDTHS) & keep \
                and (key.endswith(_WIDTH_LIKE) and not any(w in key for w in _NOT_WIDTH)
                     # a group count that is a width: a depthwise convolution (Mimi's
                     # upsample_groups)
                     or key.endswith("_groups")) \
                and _small_for(cls, key) is None:
            new[key] = _WIDTH  # (Dots3's adapters: vision width in, text width out)
    heads = [k for k in raw if _names(cls, k) & set(_HEADS)]
    kv_heads = [k for k in raw if _names(cls, k) & set(_KV_HEADS)]
    if heads and kv_heads and heads[0] in new and kv_heads[0] in new \
            and raw[heads[0]] == raw[kv_heads[0]]:
        # No grouped queries: latent attention (DeepSeek's MLA) expands keys to every
        # head and some configs reject fewer key/value heads; keep them equal.
        new[kv_heads[0]] = new[heads[0]]
    sizes = [k for k in raw if _names(cls, k) & set(_HEAD_SIZES)]
    parts = [k for k in raw if _names(cls, k) & set(_HEAD_PARTS)]
    for size, part in [(a, b) for a in sizes for b in parts if a in new and b in new]:
        if raw[size] == raw[part]:
            # A head_dim that is the rotary part's size (LongCat computes its rotary
            # embedding for head_dim and applies it to the qk_rope_head_dim part).
            new[size] = new[part]
    width = next((k for k in raw if _names(cls, k) & {"hidden_size"}), None)
    expand = raw.get("expand")
    if heads and sizes and width and _is_int(expand) and heads[0] in new \
            and all(_is_int(raw[k]) for k in (heads[0], sizes[0], width)) \
            and raw[heads[0]] * raw[sizes[0]] == expand * raw[width]:
        # A state-space model (Mamba-2) splits its inner width, expand x hidden_size,
        # into heads: the head count follows the shrunk widths, as in the default.
        inner = expand * new.get(width, raw[width])
        if inner % new.get(sizes[0], raw[sizes[0]]) == 0:
            new[heads[0]] = inner // new.get(sizes[0], raw[sizes[0]])
    experts = any(_is_int(v) and v > 0 and _names(cls, k) & set(_EXPERTS) for k, v in raw.items())
    for key in [k for k, v in raw.items() if v is None and _names(cls, k) & set(_TOP_K)]:
        if experts:  # DeepSeek-V2 leaves top-k unset by default: its router cannot run
            new[key] = _SMALL[_TOP_K[0]]
    for key in [k for k, v in raw.items() if v is None and fill and _small_for(cls, k)]:
        # unset key/value heads mean as many as heads (no grouped queries)
        new[key] = new.get(heads[0], raw[heads[0]]) if key in kv_heads and heads \
            else _small_for(cls, key)
    for key in _TOKEN_ID_KEYS:
        # (with fill, unset ones too: ESM's embeddings need a padding id)
        if _is_int(raw.get(key)) and raw[key] >= VOCAB or fill and key in raw and raw[key] is None:
            new[key] = VOCAB - 1 - _TOKEN_ID_KEYS.index(key)
    padding = [k for k, v in raw.items() if k.endswith("pad_token_id") and k not in _TOKEN_ID_KEYS
               and _is_int(v) and v >= VOCAB]
    for number, key in enumerate(padding):
        # Another padding id (Kyutai's audio_pad_token_id: the row after its text and
        # codebook vocabularies) is an embedding's padding_idx: inside the shrunk table.
        new[key] = VOCAB - 1 - len(_TOKEN_ID_KEYS) - number
    for key, value in raw.items():
        if _names(cls, key) & {"max_position_embeddings"} and _is_int(value) and value > 512:
            new[key] = 512
    old_layers = raw.get(layer_key) if layer_key else None
    new_layers = new.get(layer_key, old_layers) if layer_key else None
    indices = getattr(cfg, "out_indices", None)
    if isinstance(indices, (list, tuple)) and old_layers and new_layers \
            and new_layers < old_layers and layer_key not in keep and indices \
            and all(_is_int(v) and 0 < v <= old_layers for v in indices) \
            and max(indices) > new_layers:
        # A backbone read out at k of its layers (CHMv2's DINOv3 at four, for a neck of
        # four levels): k layers, each read out, where fewer would leave levels unread.
        count = max(new_layers, len(indices))
        new[layer_key] = count
        new["out_indices"] = [max(1, v * count // old_layers) for v in indices]
        new_layers = count
    per_layer = [k for k, v in raw.items() if isinstance(v, (list, tuple)) and old_layers
                 and new_layers and len(v) == old_layers != new_layers]
    # Heterogeneous configs keep per-layer overrides (a head_dim of every sixth layer)
    # apart from the global values: they are one more per-layer column.
    spec = vars(cfg).get("_heterogeneity_spec")
    overrides = getattr(spec, "per_layer_overrides", None) or {}
    if old_layers and new_layers and new_layers != old_layers and (per_layer or overrides):
        # Keep layers of every kind a hybrid model has (attention and linear/SSM
        # layers): the first layer with each value of each per-layer list in turn (so
        # that variations of a later list do not crowd out a full-attention layer),
        # then the first layers; in order.
        # The attention kinds first (`layer_types`): Kimi Linear's `mlp_layer_types`
        # comes first in its config, and its dense and sparse layers would otherwise fill
        # both places with linear attention (no attention layer: generate cannot size
        # its mask).
        columns = [[repr(v) for v in raw[k]]
                   for k in sorted(per_layer, key=lambda k: k != "layer_types")]
        columns.append([repr(sorted(overrides.get(i, {}).items())) for i in range(old_layers)])
        chosen: set[int] = set()
        for column in columns:
            seen = {column[i] for i in chosen}
            for i, value in enumerate(column):
                if len(chosen) < new_layers and value not in seen:
                    chosen.add(i)
                    seen.add(value)
        for i in range(old_layers):
            if len(chosen) < new_layers:
                chosen.add(i)
        kept = sorted(chosen)
        for k in per_layer:
            new[k] = [raw[k][i] for i in kept]
        if overrides:
            new["per_layer_config"] = {
                j: {a: v if (small := _smaller(cls, a, v, keep)) is None else small
                    for a, v in overrides[i].items()}
                for j, i in enumerate(kept) if i in overrides}
    for key, value in raw.items():
        if key.endswith(("_indexes", "_indices")) and key != "out_indices" and old_layers \
                and new_layers and new_layers < old_layers and isinstance(value, (list, tuple)) \
                and value and all(_is_int(v) and 0 <= v < old_layers for v in value):
            # Layers named by index (SAM's global-attention layers): the same places in
            # the fewer layers.
            new[key] = type(value)(v * new_layers // old_layers for v in value)
    for key, value in raw.items():
        if key in per_layer:
            continue
        if isinstance(value, (list, tuple)) and key in _STAGE_DEPTHS and key not in keep:
            new[key] = [min(v, 1) if _is_int(v) else v for v in value]
        elif slim and key in _STAGE_WIDTHS and key not in keep and _slimmer(raw, value):
            new[key] = _slimmer(raw, value)
        elif slim and key.endswith("out_hidden_size") and _is_int(value) and any(
                value == w * k for w in widths for k in (2, 4, 8, 16)):
            # an encoder's output after merging k patches (Muse's vision: 4 x 1536)
            new[key] = _WIDTH * next(k for w in widths for k in (2, 4, 8, 16)
                                     if value == w * k)
        elif isinstance(value, (list, tuple)) and key in _CHANNEL_LISTS:
            new[key] = type(value)(min(v, _WIDTH) if _is_int(v) else v for v in value)
        elif key == "max_length" and _is_int(value) and _is_int(raw.get("num_mel_bins")):
            new[key] = FRAMES  # a spectrogram model's frames (the Audio Spectrogram Transformer)
        elif key == "depth_coefficient" and isinstance(value, float) and value > 1:
            new[key] = 1.0  # EfficientNet's compound scaling multiplies the stage depths
        elif type(value).__name__ == "TimmBackboneConfig" and depth < 3:
            # (DETR's default backbone needs timm: transformers' own ResNet instead)
            import transformers

            indices = list(getattr(value, "out_indices", None) or [4])
            new[key] = _shrunk(transformers.ResNetConfig(out_indices=indices), keep, fill,
                               depth + 1, widths, slim)
        elif hasattr(value, "to_dict") and depth < 3 and key != "quantization_config":
            new[key] = _shrunk(value, keep, fill, depth + 1, widths, slim)
    if raw.get("use_timm_backbone") is True:
        new["use_timm_backbone"] = False  # DETR's own (transformers') ResNet: no timm
    if "use_cache" in raw:
        new["use_cache"] = False  # a step of training or scoring, not generation
    for key in [k for k in _IMAGE_SIZES if k not in keep]:
        if _is_int(raw.get(key)):
            new[key] = IMAGE
        elif isinstance(raw.get(key), (list, tuple)) and len(raw[key]) == 2:
            new[key] = type(raw[key])((IMAGE, IMAGE))  # Hiera's and PVTv2's (height, width)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    args = {k: v for k, v in new.items() if k in fields or k in ("per_layer_config", "out_indices")}
    if depth:
        args = {**_given(cfg), **args}
    try:
        out = cls(**args, attn_implementation="eager")
    except Exception:  # noqa: BLE001 - a config that cannot be rebuilt is set in place
        out, fields = copy.deepcopy(cfg), set()
    for key, value in new.items():
        if key in fields or key in ("per_layer_config", "out_indices"):
            continue
        now = vars(out).get(key)
        if fields and (now != raw.get(key) or _is_int(now) and _is_int(value) and now <= value):
            continue  # derived from the shrunk arguments (Swin's hidden_size): it follows them
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            setattr(out, key, value)
    for key in ("attn_implementation", "_attn_implementation"):
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            setattr(out, key, "eager")
    return out


def _mapping(kind: str) -> dict[str, str]:
    from transformers.models.auto import modeling_auto as m

    return {
        "causal": m.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "masked": m.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "seq2seq": m.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "image": m.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
        "audio": m.MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES,
        "ctc": m.MODEL_FOR_CTC_MAPPING_NAMES,
        "speech": m.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES,
        "segmentation": m.MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES,
        "video": m.MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES,
        "detection": m.MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES,
        "depth": m.MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES,
        "contrastive": m.MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES,
        "panoptic": m.MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES,
        "keypoints": m.MODEL_FOR_KEYPOINT_DETECTION_MAPPING_NAMES,
        "series": m.MODEL_FOR_TIME_SERIES_CLASSIFICATION_MAPPING_NAMES,
        "vlm": m.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        # speech LLMs: the multimodal LMs that are not image-text-to-text ones
        "speechlm": {a: c for a, c in m.MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES.items()
                     if a not in m.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES},
    }[kind]


class Skip(Exception):
    """Not our failure: the architecture cannot be built or run from a tiny config."""


def build(kind: str, arch: str) -> tuple[Any, Callable[[], Any], Callable[[], Any]]:
    """The model and two forward functions: one returning a loss, one for inference.

    The config is shrunk as far as the model still builds and runs a step eagerly: where
    it does not, each rung of _LADDER leaves more of it as it was. The skip reason is
    the failure of the first rung, the most shrunk."""
    class_name = _mapping(kind)[arch]
    if isinstance(class_name, (tuple, list)):
        class_name = class_name[0]
    failure = ""
    for keep, fill in _LADDER:
        with _memory_cap():
            built = _build_rung(kind, arch, class_name, keep, fill)
        if isinstance(built, str):
            failure = failure or built
            continue
        return built
    raise Skip(failure)


@contextlib.contextmanager
def _memory_cap() -> Iterator[None]:
    """Address space capped at two thirds of the machine's memory while a rung builds
    and probes its model: a config that leaves some size unshrunk (cohere_compass's
    probe took all 24 GB here, and the kernel killed the process: a crash row) then
    fails with MemoryError, a skip."""
    import resource

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ValueError, OSError, AttributeError):
        yield
        return
    cap = total * 2 // 3
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# A config attribute a model reads and its config class lacks (DBRX's attention config
# has no rope_theta, Qwen3-Omni's talker no shared expert size): one more try per rung
# with it filled (`_fill_missing`), at most this many.
_MISSING = re.compile(r"'(\w+Config)' object has no attribute '(\w+)'")
# ... or an attribute it has and leaves unset, which the model's code requires (Step
# 3.7 builds a sliding-window mask whether or not a layer slides): filled in every
# config of the tree that leaves it unset (an empty class name).
_UNSET = re.compile(r"Could not find a `(\w+)` argument in the config")
# Values of such attributes no other config of the tree has (a window of half the text).
_UNSET_VALUES: dict[str, int] = {"sliding_window": SEQ // 2}
_FILLS = 4


def _build_rung(kind: str, arch: str, class_name: str, keep: frozenset[str], fill: bool
                ) -> tuple[Any, Callable[[], Any], Callable[[], Any]] | str:
    """One rung of :func:`build`: the model and its forwards, or why it failed. Where
    the model reads an attribute its config lacks, the rung is tried again with it
    filled."""
    missing: list[tuple[str, str]] = []
    while True:
        built = _build_once(kind, arch, class_name, keep, fill, missing)
        found = _MISSING.search(built) if isinstance(built, str) else None
        unset = _UNSET.search(built) if isinstance(built, str) else None
        wanted = found.groups() if found else ("", unset.group(1)) if unset else None
        if wanted is None or wanted in missing or len(missing) >= _FILLS:
            return built
        missing.append(wanted)  # type: ignore[arg-type]


def _configs(cfg: Any, depth: int = 0) -> Iterator[Any]:
    """A config and its sub-configs, parents first."""
    yield cfg
    for value in list(vars(cfg).values()):
        if hasattr(value, "to_dict") and depth < 3:
            yield from _configs(value, depth + 1)


def _fill_missing(cfg: Any, missing: list[tuple[str, str]]) -> None:
    """Set each (config class, attribute) a model read and its config lacked: as another
    config of the tree has it (a sibling's, the parent's), or as a key of one of their
    dicts (DBRX's rope_theta in rope_parameters), else its small size, else a token id
    of its own (a placeholder id the model looks for, unused by the text)."""
    configs = list(_configs(cfg))
    for number, (class_name, attr) in enumerate(missing):
        value = next((v for c in configs if (v := vars(c).get(attr)) is not None), None)
        if value is None:
            value = next((d[attr] for c in configs for d in vars(c).values()
                          if isinstance(d, dict) and d.get(attr) is not None), None)
        if value is None:
            value = _small_for(type(cfg), attr) or _UNSET_VALUES.get(attr)
        if value is None and attr.endswith(("token_id", "token_index")):
            value = VOCAB - 1 - len(_TOKEN_ID_KEYS) - number
        for target in (c for c in configs if type(c).__name__ == class_name
                       or not class_name and attr in vars(c) and vars(c)[attr] is None):
            with contextlib.suppress(AttributeError, TypeError, ValueError):
                setattr(target, attr, value)


def _build_once(kind: str, arch: str, class_name: str, keep: frozenset[str], fill: bool,
                missing: list[tuple[str, str]]
                ) -> tuple[Any, Callable[[], Any], Callable[[], Any]] | str:
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        cls = getattr(transformers, class_name)
        for slim in (False, True):
            # (slimmer only where the model is too big: its stages' widths too)
            default = _default_config(CONFIG_MAPPING[arch])
            cfg = _configured(kind, cls, default, keep, fill, slim, missing)
            params = _parameters(cls, cfg)
            if params <= _MAX_PARAMETERS:
                break
        if params > _MAX_PARAMETERS:
            return f"{params / 1e6:.0f}M parameters after shrinking"
        torch.manual_seed(0)
        model = cls(cfg)
        if type(model).forward is torch.nn.Module.forward:
            # A generation-only composite (Qwen2.5-Omni: thinker, talker, vocoder) has no
            # forward of its own: its first part that has one, from that part's config.
            model = next((m for m in model.children() if hasattr(m, "config")
                          and type(m).forward is not torch.nn.Module.forward), model)
            cfg = model.config
    except ImportError as exc:  # a library the model needs is missing: no rung helps
        raise Skip(f"build: {type(exc).__name__}: {_first_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - any build failure is a skip
        return f"build: {type(exc).__name__}: {_first_line(exc)}"
    failure = ""
    for placeholders, labelled in ((False, True), (False, False), (True, True)):
        if not labelled and not _infers(kind, cfg, model):
            continue  # (labels are not what fails)
        if placeholders:
            # No placeholders failed: a model that puts its media's features at
            # placeholder tokens only (InstructBLIP; BLIP-2 either way) gets the id its
            # processor would give, one placeholder per feature.
            unset = _unset_placeholders(cfg) if kind == "vlm" else []
            if not unset:
                break
            for modality in unset:
                _token(cfg, modality)
        try:
            loss_fn, infer_fn = _forwards(kind, cfg, model, labelled)
            _probe(model, loss_fn, infer_fn)
        except Skip:
            if not placeholders and labelled:
                raise  # (inputs this script cannot make: as before the retries)
            continue  # (a retry's skip leaves the first failure, and the next rungs)
        except Exception as exc:  # noqa: BLE001
            failure = failure or f"eager: {type(exc).__name__}: {_first_line(exc)}"
            continue
        return model, loss_fn, infer_fn
    return failure


def _infers(kind: str, cfg: Any, model: Any) -> bool:
    """Whether the model runs its inference forward (no labels): where it does and its
    training forward failed, the labels given are what it rejects (VidEoMT trains on no
    labels of a clip), and the training step's loss is the mean of its outputs."""
    import torch

    try:
        _, infer_fn = _forwards(kind, cfg, model)
        model.eval()
        with torch.no_grad():
            infer_fn()
    except Exception:  # noqa: BLE001 - a failure of its own: no retry without labels
        return False
    return True


def _unset_placeholders(cfg: Any) -> list[str]:
    """The media (image, video) whose placeholder token id the config leaves unset."""
    return [m for m in ("image", "video") if any(
        k in vars(cfg) and vars(cfg)[k] is None for k in (f"{m}_token_id", f"{m}_token_index"))]


# A config's validator rejecting its own defaults: "<field> must be <value>, got ...".
_MUST_BE = re.compile(r"\b(\w+) must be (\w+), got")


def _default_config(cls: Any) -> Any:
    """The default config of a class, or, where its validator rejects its own defaults
    (Gemma 4 Assistant's text_config must have no per-layer inputs, no MoE block), the
    default with each field the validator names set as it says: in the config, or in
    whichever sub-config of its defaults has that field."""
    given: dict[str, Any] = {}
    subs: dict[str, dict[str, Any]] = {}
    for _ in range(8):
        try:
            return cls(**given, **subs)
        except Exception as exc:  # noqa: BLE001 - re-raised where no field is named
            found = _MUST_BE.search(str(exc))
            if found is None:
                raise
            field, text = found.groups()
            value: Any = {"True": True, "False": False, "None": None}.get(text, text)
            value = int(text) if text.isdigit() else value
            owner = _sub_config_with(cls, field)
            if owner is None and (field in given or field not in {
                    f.name for f in dataclasses.fields(cls)}):
                raise
            if owner is None:
                given[field] = value
            else:
                name, model_type = owner
                subs.setdefault(name, {"model_type": model_type})[field] = value
    return cls(**given, **subs)


def _sub_config_with(cls: Any, field: str) -> tuple[str, str] | None:
    """The sub-config (its argument name and model type) whose default has `field`."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for name, spec in (getattr(cls, "sub_configs_defaults", None) or {}).items():
        model_type = getattr(spec, "model_type", None)
        try:  # (the lazy mapping's get() answers None for every name)
            sub = CONFIG_MAPPING[model_type]
        except KeyError:
            continue
        if field in {f.name for f in dataclasses.fields(sub)}:
            return name, model_type
    return None


_MAX_PARAMETERS = 30_000_000


def _configured(kind: str, cls: Any, default: Any, keep: frozenset[str], fill: bool,
                slim: bool, missing: list[tuple[str, str]]) -> Any:
    """The shrunk config a model of `kind` and class `cls` is built from, from the
    `default` config (which the multimodal fits change in place: a fresh one)."""
    import torch

    cfg = default
    # A composite (multimodal) architecture's causal LM is its text model: build it
    # from the composite's text_config, as the composite would.
    sub = next((v for v in vars(cfg).values() if type(v) is not type(cfg)
                and type(v) is getattr(cls, "config_class", None)), None)
    cfg = _shrunk(cfg, keep, fill, slim=slim) if sub is None \
        else _shrunk(sub, keep, fill, depth=1, slim=slim)
    if kind in ("vlm", "speechlm") or kind == "speech" and hasattr(cfg, "audio_config"):
        _fit_multimodal(cfg)  # (a speech LLM as a speech-to-text model: Voxtral)
        if cls.forward is torch.nn.Module.forward:  # (its parts: see _build_once)
            for part in list(_configs(cfg))[1:]:
                if hasattr(part, "text_config"):
                    _fit_multimodal(part)
    if kind in _LABELLED:
        cfg.num_labels = _LABELS
        if hasattr(cfg, "num_targets"):  # a time-series classifier's classes
            cfg.num_targets = _LABELS
    _fill_missing(cfg, missing)
    return cfg


def _parameters(cls: Any, cfg: Any) -> int:
    """The model's parameter count, from a build on the meta device (no memory, no
    initialization), so that a rung that leaves a model too big costs nothing."""
    import torch

    try:
        with torch.device("meta"):
            return sum(p.numel() for p in cls(cfg).parameters())
    except Exception:  # noqa: BLE001 - the real build will say what fails
        return 0


def _forwards(kind: str, cfg: Any, model: Any, labelled: bool = True
              ) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """The training forward (returning a loss) and the inference forward of a model of
    `kind`, on inputs made for it from its config (without labels where `labelled` is
    false). Where the model computes no loss
    from labels this script can give (a detector's matching needs scipy, a depth model
    has no training loss), the loss is the mean of its floating outputs
    (`_output_loss`): the step still runs a backward through every layer."""
    import torch

    g = torch.Generator().manual_seed(0)
    inputs: dict[str, Any] = {}
    labels: Any = None
    vocab = getattr(cfg, "vocab_size", None) or getattr(
        getattr(cfg, "text_config", None), "vocab_size", VOCAB)
    ids = torch.randint(3, min(vocab, VOCAB), (BATCH, SEQ), generator=g)
    own = _OWN_INPUTS.get(getattr(cfg, "model_type", ""))
    if own is not None:
        inputs = own(cfg, g)
    elif kind in _PIXEL_KINDS:
        # (a video model may call its clip pixel_values_videos)
        name = getattr(model, "main_input_name", None)
        name = name if isinstance(name, str) and name.startswith("pixel_values") \
            else "pixel_values"
        inputs[name] = pixels = _pixels(kind, cfg, g, video=name.endswith("videos"))
        params = inspect.signature(model.forward).parameters
        if "spatial_shapes" in params and pixels.dim() == 4:
            # (NaFlex, SigLIP 2: patches flattened, each image's grid and a patch mask)
            vision = getattr(cfg, "vision_config", None) or cfg
            inputs.update(_patches(pixels, vision.patch_size))
        if kind in ("image", "video"):
            labels = torch.randint(0, _LABELS, (BATCH,), generator=g)
        elif kind == "segmentation":
            labels = torch.randint(0, _LABELS, (BATCH, *pixels.shape[-2:]), generator=g)
        elif kind == "contrastive":
            inputs.update(input_ids=ids, attention_mask=torch.ones_like(ids))
        elif kind in ("detection", "panoptic"):
            labels = _objects(kind, pixels, g)
    elif kind == "series":  # a window of each channel's past values, a class each
        length = getattr(cfg, "context_length", SEQ) or SEQ
        channels = getattr(cfg, "num_input_channels", 1) or 1
        inputs["past_values"] = torch.randn(BATCH, length, channels, generator=g)
        labels = torch.randint(0, _LABELS, (BATCH,), generator=g)
    elif kind == "speech" and _reads_text(model):
        if hasattr(cfg, "audio_config"):  # a speech LLM (Voxtral): placeholders for its audio
            inputs = _media_text("speechlm", cfg, model, g)
            labels = inputs["input_ids"]
        else:  # text to speech (Dia): token ids in, the loss of its outputs
            inputs.update(input_ids=ids, attention_mask=torch.ones_like(ids))
            if getattr(cfg, "model_type", None) in _STEP_CODES:
                # (a text token and one code per codebook at each step: Kyutai's speech
                # to text reads the codec's codes beside its text, as generate gives them)
                codes = torch.randint(0, min(cfg.codebook_vocab_size, VOCAB) - 1,
                                      (BATCH, SEQ, cfg.num_codebooks), generator=g)
                inputs["input_ids"] = torch.cat([ids[..., None], codes], -1)
    elif kind in ("audio", "ctc", "speech"):
        name = getattr(model, "main_input_name", "input_values")
        inputs[name] = _audio(name, cfg, g)
        if kind == "audio":
            labels = torch.randint(0, _LABELS, (BATCH,), generator=g)
        elif kind == "ctc":  # a few characters: CTC needs no more than the frames
            labels = ids[:, :4]
        else:
            labels = ids
    elif kind in ("vlm", "speechlm"):
        inputs = _media_text(kind, cfg, model, g)
        labels = inputs["input_ids"]
    else:
        inputs.update(input_ids=ids, attention_mask=torch.ones_like(ids))
        labels = ids
        if kind == "seq2seq" and _aligns_audio(cfg, inspect.signature(model.forward).parameters):
            # A streaming speech model (Voxtral Realtime) adds a feature of its audio to
            # each text token: the recording as long as gives one per token.
            inputs["input_features"] = _aligned_audio(cfg, model, g)
        elif kind == "seq2seq":
            inputs["decoder_input_ids"] = ids
        # Token ids in another layout, as the forward documents it (MusicGen's decoder:
        # a row per codebook of each sample, a column per codebook in its labels).
        shape = _documented_shape(model, "input_ids", cfg)
        if shape is not None and shape != tuple(ids.shape):
            inputs["input_ids"] = torch.randint(3, min(vocab, VOCAB), shape, generator=g)
            shape = _documented_shape(model, "labels", cfg)
            labels = torch.randint(3, min(vocab, VOCAB), shape or (BATCH, SEQ), generator=g)
    inputs.update(_required_ids(cfg, model, inputs, g))
    infer_inputs = dict(inputs)
    if kind == "speech" and "input_ids" not in inputs:
        infer_inputs["decoder_input_ids"] = ids
    elif kind == "vlm" and getattr(cfg, "is_encoder_decoder", False) \
            and "decoder_input_ids" in inspect.signature(model.forward).parameters:
        # (an encoder-decoder's decoder starts from labels in training: UDOP's infers
        # from ids of its own)
        infer_inputs["decoder_input_ids"] = ids
    train_inputs = dict(inputs)
    if not labelled:
        pass
    elif kind == "contrastive":
        train_inputs["return_loss"] = True
    elif kind == "panoptic":
        train_inputs.update(labels)
    elif labels is not None:
        train_inputs["target_values" if kind == "series" else "labels"] = labels
    def infer() -> Any:
        return model(**infer_inputs)

    infer.inputs = infer_inputs  # type: ignore[attr-defined]  # (the decode step's prompt)
    return (lambda: _output_loss(model(**train_inputs))), infer


def _required_ids(cfg: Any, model: Any, inputs: dict[str, Any], g: Any) -> dict[str, Any]:
    """Token sequences a forward requires besides its main input, by their names
    (InstructBLIP's ``qformer_input_ids``, OneFormer's ``task_inputs``): ids below the
    smallest vocabulary of the config tree, as long as the config's ``<prefix>_seq_len``
    (OneFormer's task MLP reads exactly that many) else SEQ, with a mask where the
    forward takes ``<prefix>_attention_mask``."""
    import torch

    params = inspect.signature(model.forward).parameters
    vocabs = [v for c in _configs(cfg) for k, v in vars(c).items()
              if "vocab_size" in k and _is_int(v) and v > 4]
    top = min([VOCAB, *vocabs])
    found: dict[str, Any] = {}
    for name, param in params.items():
        if name in inputs or param.default is not inspect.Parameter.empty \
                or not name.endswith(("_input_ids", "_inputs")):
            continue
        prefix = name[:-len("input_ids")] if name.endswith("_input_ids") \
            else name[:-len("inputs")]
        length = next((v for k in ("seq_len", "sequence_length", "length")
                       if _is_int(v := getattr(cfg, f"{prefix}{k}", None))), SEQ)
        found[name] = torch.randint(3, top, (BATCH, length), generator=g)
        if f"{prefix}attention_mask" in params:
            found[f"{prefix}attention_mask"] = torch.ones(BATCH, length, dtype=torch.long)
    return found


def _documented_shape(model: Any, name: str, cfg: Any) -> tuple[int, ...] | None:
    """The shape a forward's docstring gives an argument (``input_ids (`torch.LongTensor`
    of shape `(batch_size * num_codebooks, sequence_length)`)``), each dimension a
    product of BATCH, SEQ, literals and the config tree's sizes; None where the
    docstring gives none or names a size neither this script nor the config has."""
    doc = inspect.getdoc(type(model).forward) or ""
    found = re.search(rf"\b{name} \(`[^`]*` of shape `\(([^`)]*)\)`", doc)
    if found is None:
        return None
    configs = list(_configs(cfg))
    shape: list[int] = []
    for dim in found.group(1).split(","):
        size = 1
        for term in (t.strip() for t in dim.split("*")):
            value = {"batch_size": BATCH, "sequence_length": SEQ}.get(term)
            if value is None and term.isdigit():
                value = int(term)
            if value is None:
                value = next((v for c in configs if _is_int(v := vars(c).get(term))), None)
            if value is None:
                return None
            size *= value
        shape.append(size)
    return tuple(shape)


def _assistant_inputs(cfg: Any, g: Any) -> dict[str, Any]:
    """Gemma 4 Assistant drafts from its main model's state: that model's last hidden
    states beside its token embeddings (twice its width) and the keys and values of its
    last layer of each attention type, as many heads and head sizes as the assistant's
    layers of that type read."""
    import torch

    text = cfg.get_text_config()
    shared = {}
    for number, kind in enumerate(text.layer_types):
        layer = text.per_layer_config[number]
        shape = (BATCH, layer.num_key_value_heads, SEQ, layer.head_dim)
        shared.setdefault(kind, (torch.randn(*shape, generator=g),
                                 torch.randn(*shape, generator=g)))
    return {"inputs_embeds": torch.randn(BATCH, SEQ, 2 * cfg.backbone_hidden_size, generator=g),
            "shared_kv_states": shared}


# Models a forward of inputs made from the signature cannot run, by model type: their
# inputs, from the config (a model that reads another model's state).
_OWN_INPUTS: dict[str, Callable[[Any, Any], dict[str, Any]]] = {
    "gemma4_assistant": _assistant_inputs}


# Models whose input ids carry, at each step, a code of each codebook after the text
# token (their own layout, no docstring or signature says it), by model type.
_STEP_CODES = frozenset({"kyutai_speech_to_text"})


# A vision-language model's special tokens (image placeholder, vision start and end)
# take ids from here up, text tokens stay below.
_SPECIALS = VOCAB - 32


def _fit_multimodal(cfg: Any) -> None:
    """Fit a multimodal model's config to its shrunk parts: its special tokens get ids
    inside the shrunk vocabulary, its multimodal rotary sections (Qwen2-VL's M-RoPE,
    for a 128-wide head by default) the shrunk head's size, its encoders' projections
    the text's width, and its tokens per image (Gemma 3 pools patches into them) no
    more than the shrunk image has patches."""
    free = _SPECIALS
    text = getattr(cfg, "text_config", None)
    renamed: dict[int, int] = {}
    for obj in (cfg, text):
        for key, value in list(vars(obj).items()) if obj is not None else ():
            # (by an alias too: Molmo2's image_token_id is its image_patch_id)
            if any(n.endswith(("token_id", "token_index")) for n in _names(type(obj), key)) \
                    and _is_int(value) and value >= VOCAB:
                setattr(obj, key, free)
                renamed.setdefault(value, free)
                free += 1
    for part in list(_configs(cfg))[1:]:
        if part is text or getattr(part, "vision_config", None) is None:
            continue
        # A composite inside (T5Gemma 2's encoder: its image tokens, its pooling): the
        # same ids for the ids the top level has, its tokens per image fitted too.
        for obj in (part, getattr(part, "text_config", None)):
            for key, value in list(vars(obj).items()) if obj is not None else ():
                if key.endswith(("token_id", "token_index")) and _is_int(value) \
                        and value >= VOCAB:
                    if value not in renamed:
                        renamed[value], free = free, free + 1
                    setattr(obj, key, renamed[value])
        _fit_tokens_per_image(part, part.vision_config)
    rope = getattr(text, "rope_parameters", None)
    heads = getattr(text, "num_attention_heads", None)
    sections = rope.get("mrope_section") if isinstance(rope, dict) else None
    sections = sections or _default_mrope_sections(cfg)
    if sections and _is_int(heads) and isinstance(rope, dict):
        head = getattr(text, "head_dim", None) or text.hidden_size // heads
        factor = rope.get("partial_rotary_factor") or getattr(
            text, "partial_rotary_factor", None) or 1.0
        half, total = int(head * factor) // 2, sum(sections)
        small = [max(1, s * half // total) for s in sections]
        small[0] += half - sum(small)
        text.rope_parameters = {**rope, "mrope_section": small}
    for encoder, key in (("vision_config", "out_hidden_size"), ("audio_config", "output_dim")):
        sub = getattr(cfg, encoder, None)
        if sub is not None and _is_int(getattr(sub, key, None)) and text is not None:
            setattr(sub, key, text.hidden_size)  # its projection's output is a text token
    vision = getattr(cfg, "vision_config", None)
    shuffle = getattr(cfg, "scale_factor", None)  # Idefics3 merges shuffle x shuffle patches
    patch = getattr(vision, "patch_size", None)
    if _is_int(shuffle) and _is_int(patch) and _is_int(getattr(vision, "image_size", None)):
        vision.image_size = max(vision.image_size, patch * shuffle)
    size = _fit_tokens_per_image(cfg, vision)
    if isinstance(getattr(cfg, "image_grid_pinpoints", None), list) and _is_int(size):
        # LLaVA-NeXT's any-resolution tiles: one tile of the shrunk image (two crops
        # an image: the whole image, and that tile)
        cfg.image_grid_pinpoints = [[size, size]]
    layers = getattr(cfg, "vision_feature_layers", None)
    if isinstance(layers, (list, tuple)):  # (VipLLaVA reads five of 24 layers; the tower has 2)
        cfg.vision_feature_layers = [-1] * len(layers)
    depth = getattr(vision, "num_hidden_layers", None)
    for part in list(_configs(cfg))[1:]:
        for key, value in list(vars(part).items()):
            if key == "text_hidden_size" and _is_int(value) and text is not None:
                # an adapter's output, a text token (Molmo2's default says 3584 for a
                # 4096-wide text: no width of the tree to shrink it with)
                setattr(part, key, text.hidden_size)
        layers = vars(part).get("vision_feature_layer")
        if isinstance(layers, (list, tuple)) and _is_int(depth):
            # (Molmo2's adapter reads layers 24 and 18 of the tower: the last one)
            part.vision_feature_layer = [v if _is_int(v) and -depth <= v < depth else -1
                                         for v in layers]


def _fit_tokens_per_image(cfg: Any, vision: Any) -> Any:
    """Tokens per image (Gemma 3 pools patches into them) no more than the shrunk
    image has patches; the image's size."""
    tokens = getattr(cfg, "mm_tokens_per_image", None)
    size, patch = (getattr(vision, k, None) for k in ("image_size", "patch_size"))
    if _is_int(tokens) and _is_int(size) and _is_int(patch) and patch:
        cfg.mm_tokens_per_image = min(tokens, (size // patch) ** 2)
    return size


def _default_mrope_sections(cfg: Any) -> list[int] | None:
    """The rotary sections a model's code assumes where its config names none
    (``rope_parameters.get("mrope_section", [16, 24, 24])``), read from its source."""
    # (a composite may reuse another family's text model: GLM-4.6V's is GLM-4V's)
    for config in (cfg, getattr(cfg, "text_config", None)):
        name = type(config).__module__.replace(".configuration_", ".modeling_")
        try:
            source = Path(importlib.import_module(name).__file__ or "").read_text()
        except (ImportError, OSError, AttributeError, TypeError):  # (a built-in class)
            continue
        found = re.search(r'get\("mrope_section", \[([\d, ]+)\]\)', source)
        if found:
            return [int(v) for v in found.group(1).split(",")]
    return None


def _reads_text(model: Any) -> bool:
    """Whether a model's main input is token ids (a speech LLM's, a text-to-speech
    model's), not audio."""
    return getattr(model, "main_input_name", None) == "input_ids"


# A forward's media inputs: a multimodal model without any reads text only.
_MEDIA = ("pixel_values", "input_features", "input_values")


def _text_only(cfg: Any, params: Any, g: Any) -> dict[str, Any]:
    """Inputs of a multimodal architecture whose class reads no media (a text model
    registered as image-text-to-text, Mistral 4; a diffusion LM fed encoder outputs):
    token ids, and ids of each other sequence it embeds (Evolla's proteins) with their
    masks."""
    import torch

    ids = torch.randint(3, _SPECIALS, (BATCH, SEQ), generator=g)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for name in params:
        prefix = name[:-len("input_ids")]
        if name.endswith("_input_ids") and prefix != "decoder_":
            # (its vocabulary: the sub-config named for it, protein_encoder_config)
            sub = next((v for k, v in vars(cfg).items() if k.startswith(prefix)
                        and hasattr(v, "to_dict")), None)
            vocab = getattr(sub, "vocab_size", None)
            top = min(vocab, VOCAB) if _is_int(vocab) and vocab > 4 else VOCAB
            inputs[name] = torch.randint(3, top, (BATCH, SEQ), generator=g)
            if f"{prefix}attention_mask" in params:
                inputs[f"{prefix}attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    return inputs


def _media_text(kind: str, cfg: Any, model: Any, g: Any) -> dict[str, Any]:
    """A batch of images (``vlm``) or recordings (``speechlm``) and, per sample, its
    placeholder tokens among text tokens, as a processor makes them: as many
    placeholders as the model's encoder gives features for it (counted by running
    ``get_image_features`` or ``get_audio_features`` once). Patch-grid models
    (Qwen2-VL's family: ``image_grid_thw``) also get vision start and end tokens and
    each token's modality (``mm_token_type_ids``)."""
    import torch

    params = inspect.signature(model.forward).parameters
    if not any(p.startswith(_MEDIA) for p in params):
        return _text_only(cfg, params, g)
    if kind == "speechlm" and _aligns_audio(cfg, params):
        # No audio placeholders: a streaming model adds a feature of its recording to
        # each text token (Voxtral Realtime)
        ids = torch.randint(3, _SPECIALS, (BATCH, SEQ), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "input_features": _aligned_audio(cfg, model, g)}
    # (ids its encoder reads as well: InstructBLIP's Q-Former is instructed by the text)
    required = _required_ids(cfg, model, {"input_ids": None}, g)
    if kind == "vlm":
        media, count, token = _images(cfg, model, params, g, required)
    else:
        media, count, token = _recordings(cfg, model, params, g)
    media = {**required, **media}
    ids = torch.randint(3, _SPECIALS, (BATCH, SEQ + count + 2), generator=g)
    start, end = (getattr(cfg, f"vision_{k}_token_id", None) for k in ("start", "end"))
    if kind == "vlm" and _is_int(start) and _is_int(end):
        ids[:, 1], ids[:, count + 2] = start, end
    ids[:, 2:count + 2] = token
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **media}
    if "mm_token_type_ids" in params:
        inputs["mm_token_type_ids"] = (ids == token).long()
    if "bbox" in params:
        # (a document model: each token's box on the page, (x0, y0, x1, y1) as fractions
        # of it; UDOP places its image's patches by them)
        corners = torch.rand(BATCH, ids.shape[1], 2, 2, generator=g).sort(dim=2).values
        inputs["bbox"] = corners.reshape(BATCH, ids.shape[1], 4)
    pixels = media.get("pixel_values")
    if "image_attention_mask" in params and pixels is not None and pixels.dim() == 5:
        # (IDEFICS: which of a sample's images each token attends to, all here)
        inputs["image_attention_mask"] = torch.ones(BATCH, ids.shape[1], pixels.shape[1],
                                                    dtype=torch.long)
    return inputs


def _token(cfg: Any, modality: str) -> int:
    keys = (f"{modality}_token_id", f"{modality}_token_index")
    found = next((v for k in keys if _is_int(v := getattr(cfg, k, None))), None)
    unset = next((k for k in keys if k in vars(cfg) and vars(cfg)[k] is None), None)
    if found is None and unset is not None:
        # An unset placeholder id is the processor's to give (Voxtral's, Phi-4's audio):
        # a special id no other token has; the model reads it from this config.
        used = {v for k, v in vars(cfg).items() if k.endswith(("token_id", "token_index"))}
        found = next(i for i in range(_SPECIALS, VOCAB) if i not in used)
        setattr(cfg, unset, found)
    if found is None:
        raise Skip(f"no {modality} token id in the config")
    return found


def _images(cfg: Any, model: Any, params: Any, g: Any, required: dict[str, Any]
            ) -> tuple[dict[str, Any], int, int]:
    """Images as the vision tower takes them, its features per image, the image token:
    flattened patches and a grid per image where the model reads ``image_grid_thw``;
    else one image per sample, or a list of one; ``image_sizes`` where
    ``get_image_features`` requires them."""
    import torch

    # (an encoder-decoder's vision config is its encoder's: T5Gemma 2's)
    vision = next((v for c in _configs(cfg) if (v := getattr(c, "vision_config", None))
                   is not None), None)
    if vision is None:  # (Fuyu embeds raw patches, UDOP its image's in its encoder)
        return _unencoded_images(cfg, model, g)
    # (a video model's placeholders are video tokens, encoded by get_video_features:
    # InstructBLIP-Video's clips of frames)
    aliases = getattr(type(cfg), "attribute_map", {})
    modality = next((m for m in ("image", "video") if any(
        k in vars(cfg) or k in aliases for k in (f"{m}_token_id", f"{m}_token_index"))), "image")
    if not any(_is_int(getattr(cfg, f"{modality}_{k}", None)) for k in ("token_id", "token_index")):
        # No placeholders: the model puts the image's features before the text itself
        # (BLIP-2's query tokens, GIT, Kosmos-2's own layout); the eager run decides.
        size = getattr(vision, "image_size", IMAGE)
        size = size if _is_int(size) else tuple(size)[0]
        channels = getattr(vision, "num_channels", 3) or 3
        pixels = torch.randn(BATCH, channels, size, size, generator=g)
        if "image_attention_mask" in params:  # images per sample (IDEFICS): one each
            pixels = pixels[:, None]
        return {"pixel_values": pixels}, 0, -1
    token = _token(cfg, modality)
    if "image_grid_thw" in params:
        patch = vision.patch_size
        temporal = getattr(vision, "temporal_patch_size", None) \
            or getattr(vision, "patch_temporal", 1) or 1  # (Muse names it so)
        merge = getattr(vision, "spatial_merge_size", None) or getattr(vision, "merge_size", 1) or 1
        side = 2 * merge
        channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", 3)
        pixels = torch.randn(BATCH * side * side, channels * temporal * patch * patch,
                             generator=g)
        grid = torch.tensor([[1, side, side]] * BATCH)
        return ({"pixel_values": pixels, "image_grid_thw": grid},
                side * side // (merge * merge), token)
    get = _encoder(model, f"get_{modality}_features")
    processed = _PROCESSED_IMAGES.get(getattr(cfg, "model_type", ""))
    if processed is not None:
        media = processed(cfg, g)
        return media, _features(get, **media) // BATCH, token
    size = getattr(vision, "image_size", IMAGE)
    size = size if _is_int(size) else tuple(size)[0]
    pixels = torch.randn(BATCH, getattr(vision, "num_channels", 3) or 3, size, size,
                         generator=g)
    extra = {k: v for k, v in required.items() if k in inspect.signature(get).parameters}
    wanted = inspect.signature(get).parameters.get("image_sizes")
    if wanted is not None and wanted.default is inspect.Parameter.empty:
        # (where optional, a tower may read them as another layout's: LLaVA's CLIP)
        extra["image_sizes"] = torch.tensor([[size, size]] * BATCH)
    for name, param in inspect.signature(get).parameters.items():
        if name.endswith("_pixel_values") and param.default is inspect.Parameter.empty:
            # another tower's view of the same images (DeepSeek-VL's high-resolution
            # one), at the size of that tower's config
            tower = getattr(cfg, f"{name[:-len('pixel_values')]}vision_config", None) or vision
            side = getattr(tower, "image_size", size)
            side = side if _is_int(side) else tuple(side)[0]
            extra[name] = torch.randn(BATCH, getattr(tower, "num_channels", 3) or 3, side, side,
                                      generator=g)
    failure = ""
    # one image per sample, or a list of crops each (one, or LLaVA-NeXT's two)
    layouts = [pixels, pixels[:, None], pixels[:, None].repeat(1, 2, 1, 1, 1)]
    patch = getattr(vision, "patch_size", None)
    if _is_int(patch):
        # or a sample's patches, each a clip of its time steps, channels last
        # (Inkling's tower folds (time, height, width) into depth, a token a patch)
        steps = getattr(vision, "temporal_patch_size", 1) or 1
        layouts.append(torch.randn(BATCH * 4, steps, patch, patch,
                                   getattr(vision, "num_channels", 3) or 3, generator=g))
    for layout in layouts:
        try:
            count = _features(get, pixel_values=layout, **extra)
        except Exception as exc:  # noqa: BLE001 - the next layout, else a skip below
            failure = failure or f"{type(exc).__name__}: {_first_line(exc)}"
            continue
        return {"pixel_values": layout, **extra}, count // BATCH, token
    raise Skip(f"no image layout the vision tower takes ({failure})")


def _unencoded_images(cfg: Any, model: Any, g: Any) -> tuple[dict[str, Any], int, int]:
    """Images of a model without a vision tower, which embeds patches itself: with an
    image token, a sample's patches flattened (Fuyu: a feature a patch, at its image
    tokens); else one image per sample (UDOP adds its patches to its encoder's)."""
    import torch

    patch = getattr(cfg, "patch_size", None)
    channels = getattr(cfg, "num_channels", 3) or 3
    if not _is_int(patch):
        raise Skip("no vision_config")
    if any(_is_int(getattr(cfg, k, None)) for k in ("image_token_id", "image_token_index")):
        token = _token(cfg, "image")
        patches = torch.randn(BATCH, 4, patch * patch * channels, generator=g)
        count = _features(_encoder(model, "get_image_features"), pixel_values=patches)
        return {"pixel_values": patches}, count // BATCH, token
    size = getattr(cfg, "image_size", IMAGE)
    size = size if _is_int(size) else IMAGE
    return {"pixel_values": torch.randn(BATCH, channels, size, size, generator=g)}, 0, -1


def _molmo2_images(cfg: Any, g: Any) -> dict[str, Any]:
    """Molmo2's processor's layout: each image one crop of patches flattened (as many as
    the tower's positions), and its tokens (a 2 x 2 grid here, no high-resolution part)
    each pooling four of that image's patches."""
    import torch

    vision = cfg.vision_config
    patches = vision.num_position_embeddings
    width = vision.patch_size * vision.patch_size * (getattr(vision, "num_channels", 3) or 3)
    tokens, pool = 4, 4
    return {"pixel_values": torch.randn(BATCH, 1, patches, width, generator=g),
            "image_token_pooling": torch.randint(0, patches, (BATCH * tokens, pool), generator=g),
            "image_grids": torch.tensor([[2, 2, 0, 0]] * BATCH),
            "image_num_crops": torch.ones(BATCH, dtype=torch.long)}


# Images a model's processor lays out its own way (no layout of pixel_values alone
# reaches its tower), by model type: their inputs, from the config.
_PROCESSED_IMAGES: dict[str, Callable[[Any, Any], dict[str, Any]]] = {"molmo2": _molmo2_images}


# A speech LLM's mask over its feature frames, by the names models give it.
_FRAME_MASKS = ("input_features_mask", "feature_attention_mask", "padding_mask")


def _recordings(cfg: Any, model: Any, params: Any, g: Any
                ) -> tuple[dict[str, Any], int, int]:
    """Recordings as the audio encoder takes them, with a mask of every frame where the
    model or its encoder reads one; the encoder's features per recording; the audio
    token. Encoders differ in layout (mel bins by frames or frames by bins, raw
    samples with or without a channel) and in the frame counts they take (Whisper's
    twice its positions, Qwen3-ASR's windows of 100): each layout is tried in turn."""
    import torch

    audio = getattr(cfg, "audio_config", None) or getattr(cfg, "encoder_config", None) or next(
        (v for k, v in vars(cfg).items() if hasattr(v, "to_dict")
         and any(w in k for w in ("audio", "acoustic", "speech"))), None)  # (VibeVoice's)
    if audio is None:
        raise Skip("no audio_config")
    token = _token(cfg, "audio")
    name = next((n for n in ("input_features", "input_values") if n in params), None)
    if name is None:
        raise Skip("no audio input")
    get = _encoder(model, "get_audio_features")
    accepted = set(inspect.signature(get).parameters)
    failure = ""
    for values, frames in _audio_layouts(name, audio, g):
        media = {name: values}
        for mask in _FRAME_MASKS:
            if mask in params or mask in accepted:
                media[mask] = torch.ones(BATCH, frames, dtype=torch.long)
        try:
            count = _features(get, **{k: v for k, v in media.items()
                                      if k in accepted or "kwargs" in accepted})
        except Exception as exc:  # noqa: BLE001 - the next layout, else a skip below
            failure = failure or f"{type(exc).__name__}: {_first_line(exc)}"
            continue
        return {k: v for k, v in media.items() if k in params}, count // BATCH, token
    raise Skip(f"no audio layout the encoder takes ({failure})")


def _aligns_audio(cfg: Any, params: Any) -> bool:
    """Whether a model reads a recording beside its text with no audio placeholder
    tokens (set or left to its processor): a streaming model, a feature a token. (One
    with placeholders, Moss's transcriber, runs on text alone as well.)"""
    return "input_features" in params and hasattr(cfg, "audio_config") \
        and not any(k.startswith("audio_token") for k in vars(cfg))


def _aligned_audio(cfg: Any, model: Any, g: Any) -> Any:
    """Feature frames (in the layout the encoder takes) from which the audio encoder
    gives exactly SEQ features per recording: one per text token."""
    get = _encoder(model, "get_audio_features")
    bins = next((v for k in ("num_mel_bins", "input_dim", "feature_size", "n_mels")
                 if _is_int(v := getattr(cfg.audio_config, k, None))), None)
    if bins is None:
        raise Skip("no audio feature size")
    failure = ""
    for frames in (SEQ * k for k in (1, 2, 4, 8, 16)):
        for values in (_randn(g, BATCH, bins, frames), _randn(g, BATCH, frames, bins)):
            try:
                count = _features(get, input_features=values)
            except Exception as exc:  # noqa: BLE001 - the next length, else a skip below
                failure = failure or f"{type(exc).__name__}: {_first_line(exc)}"
                continue
            if count == BATCH * SEQ:
                return values
    raise Skip(f"no recording gives a feature per token ({failure})")


def _randn(g: Any, *shape: int) -> Any:
    import torch

    return torch.randn(*shape, generator=g)


def _audio_layouts(name: str, audio: Any, g: Any) -> Iterator[tuple[Any, int]]:
    """Candidate recordings for an audio encoder, with their frame counts."""
    import torch

    if name == "input_values":
        samples = torch.randn(BATCH, SAMPLES, generator=g)
        yield samples, SAMPLES
        yield samples[:, None], SAMPLES
        return
    bins = next((v for k in ("num_mel_bins", "input_dim", "feature_size", "n_mels",
                             "input_feat_per_channel") if _is_int(v := getattr(audio, k, None))),
                None)
    if bins is None:
        return
    positions = getattr(audio, "max_source_positions", None)
    counts = ([2 * positions] if _is_int(positions) else []) + [FRAMES, 100, 200]
    # (frames stacked into one input vector: Fun-ASR's low frame rate, 7 x 80 mel bins)
    stacked = [v * bins for k, v in vars(audio).items() if "stack" in k and _is_int(v) and v > 1]
    for width in [bins, *stacked]:
        for frames in dict.fromkeys(counts):
            yield torch.randn(BATCH, width, frames, generator=g), frames
            yield torch.randn(BATCH, frames, width, generator=g), frames


def _encoder(model: Any, method: str) -> Callable[..., Any]:
    """The model's method that encodes its media, else its encoder module itself
    (Qwen2-Audio's audio_tower: its outputs, one per placeholder)."""
    get = getattr(model, method, None) or getattr(getattr(model, "model", None), method, None)
    modality = method[len("get_"):].split("_")[0]  # image, audio
    modality = "vision" if modality == "image" else modality
    for owner in (model, getattr(model, "model", None)):
        for attr in (f"{modality}_tower", f"{modality}_model", f"{modality}_encoder"):
            if get is None and callable(tower := getattr(owner, attr, None)):
                get = tower.forward
    if get is None:
        raise Skip(f"no {method}")
    return get


def _features(get: Callable[..., Any], **inputs: Any) -> int:
    """How many feature vectors an encoder gives for `inputs`: one placeholder token
    each."""
    import torch

    with torch.no_grad():
        out = get(**inputs)
    if not torch.is_tensor(out) and not isinstance(out, (list, tuple)):
        pooled = getattr(out, "pooler_output", None)
        out = out[0] if pooled is None else pooled
    parts = out if isinstance(out, (list, tuple)) else [out]
    return sum(p.numel() // p.shape[-1] for p in parts)


def _patches(pixels: Any, patch: int) -> dict[str, Any]:
    """Images as a NaFlex tower takes them: each one's patches flattened (channels
    last), its grid of patches, and a mask of its patches."""
    import torch

    batch, channels, height, width = pixels.shape
    rows, cols = height // patch, width // patch
    flat = pixels[:, :, :rows * patch, :cols * patch].reshape(
        batch, channels, rows, patch, cols, patch).permute(0, 2, 4, 3, 5, 1).reshape(
        batch, rows * cols, patch * patch * channels)
    return {"pixel_values": flat, "spatial_shapes": torch.tensor([[rows, cols]] * batch),
            "pixel_attention_mask": torch.ones(batch, rows * cols, dtype=torch.long)}


def _pixels(kind: str, cfg: Any, g: Any, video: bool = False) -> Any:
    """An image batch at the config's size (its vision tower's, for a contrastive model),
    or a batch of clips of its frame count, for video (or a contrastive model that
    reads clips: VideoPrism)."""
    import torch

    vision = getattr(cfg, "vision_config", None)
    source = cfg if vision is None or kind != "contrastive" else vision
    channels = getattr(source, "num_channels", 3) or 3
    size = getattr(source, "image_size", IMAGE)  # IMAGE, unless a rung of _LADDER kept it
    height, width = (size, size) if _is_int(size) else tuple(size)[:2] \
        if isinstance(size, (list, tuple)) and len(size) == 2 else (IMAGE, IMAGE)
    frames = getattr(cfg, "num_frames", None)
    frames = frames if _is_int(frames) else getattr(source, "num_frames", None)
    if video and not _is_int(frames):
        frames = 2  # (a clip of any length: VidEoMT's config names no frame count)
    shape = (BATCH, frames, channels, height, width) \
        if (kind == "video" or video) and _is_int(frames) \
        else (BATCH, channels, height, width)
    return torch.randn(*shape, generator=g)


def _objects(kind: str, pixels: Any, g: Any) -> Any:
    """Targets of a detector (per image, classes and boxes as centre and size in [0,
    1]) or of a panoptic segmenter (per image, classes and their masks): three objects
    an image, which the model's loss matches to its predictions (scipy's Hungarian
    assignment, between ops, on the host)."""
    import torch

    objects = 3
    classes = [torch.randint(0, _LABELS, (objects,), generator=g) for _ in range(BATCH)]
    if kind == "detection":
        boxes = [torch.rand(objects, 4, generator=g) * 0.5 + 0.25 for _ in range(BATCH)]
        return [{"class_labels": c, "boxes": b} for c, b in zip(classes, boxes, strict=True)]
    size = pixels.shape[-2:]
    masks = [(torch.rand(objects, *size, generator=g) > 0.5).float() for _ in range(BATCH)]
    return {"mask_labels": masks, "class_labels": classes}


def _audio(name: str, cfg: Any, g: Any) -> Any:
    """A speech model's input by its name: raw samples (`input_values`), or feature
    frames laid out as the config's family reads them (Whisper: mel bins by twice its
    encoder's positions; Speech2Text: frames by features per channel and channels;
    wav2vec2-BERT: frames by its projection's input width; an Audio Spectrogram
    Transformer's `input_values`: its frames by mel bins)."""
    import torch

    if not _is_int(getattr(cfg, "num_mel_bins", None)):
        # (an encoder-decoder's encoder reads the features: Canary's encoder_config)
        cfg = next((c for c in _configs(cfg) if _is_int(getattr(c, "num_mel_bins", None))),
                   cfg)
    mel = getattr(cfg, "num_mel_bins", None)
    if name == "input_values":
        if _is_int(mel) and _is_int(getattr(cfg, "max_length", None)):
            return torch.randn(BATCH, cfg.max_length, mel, generator=g)
        return torch.randn(BATCH, SAMPLES, generator=g)
    positions = getattr(cfg, "max_source_positions", None)
    per_channel = getattr(cfg, "input_feat_per_channel", None)
    projected = getattr(cfg, "feature_projection_input_dim", None)
    if _is_int(mel) and _is_int(positions):
        return torch.randn(BATCH, mel, 2 * positions, generator=g)
    if _is_int(per_channel):
        channels = getattr(cfg, "input_channels", 1) or 1
        return torch.randn(BATCH, FRAMES, per_channel * channels, generator=g)
    width = projected if _is_int(projected) else mel if _is_int(mel) else _WIDTH
    return torch.randn(BATCH, FRAMES, width, generator=g)


def _output_loss(out: Any) -> Any:
    """The model's loss, or else the sum of the means of its floating outputs that
    carry gradients (None where it has none: `run_step` skips the training step)."""
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    values = out.values() if hasattr(out, "values") else out if isinstance(out, tuple) \
        else (out,)
    floats = [v for v in values if hasattr(v, "requires_grad") and v.requires_grad
              and v.is_floating_point()]
    return sum(v.float().mean() for v in floats) if floats else None


def _probe(model: Any, loss_fn: Callable[[], Any], infer_fn: Callable[[], Any]) -> None:
    """A training forward and backward and an inference forward: a config a model
    builds from may still not run (shapes that disagree only show in forward)."""
    import torch

    model.train()
    loss = loss_fn()
    if loss is not None:  # run_step says so: a skip of its own
        loss.backward()
    model.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        infer_fn()


def _first_line(exc: BaseException | str) -> str:
    text = str(exc).strip() or (type(exc).__name__ if isinstance(exc, BaseException) else "")
    return text.splitlines()[0][:200] if text else ""


def _stderr_error(text: str) -> str:
    """The line of a child's stderr that says what failed (the last error line)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for line in reversed(lines):
        if ("Error" in line or "error:" in line or "Exception" in line) \
                and not line.startswith(" "):
            return line.strip()[:200]
    return lines[-1].strip()[:200] if lines else ""


# Kinds whose models generate text (or codes): the decode step applies to those whose
# model says it can generate.
_DECODE_KINDS = ("causal", "seq2seq", "vlm", "speechlm", "speech")
DECODE_TOKENS = 4


def _decode_step(kind: str, model: Any, infer_fn: Callable[[], Any]) -> Callable[[], Any]:
    """Greedy generation of DECODE_TOKENS tokens with the KV cache on, from the
    inference step's inputs: a prefill and DECODE_TOKENS - 1 cached decoding steps,
    as production inference traces mostly are. The cache is whatever the model's
    generate builds for it (a DynamicCache, a sliding-window or hybrid cache, Mamba's
    states): this script only turns use_cache back on."""
    import torch

    if kind not in _DECODE_KINDS or not model.can_generate():
        raise Skip("decode: the model does not generate")
    inputs = dict(getattr(infer_fn, "inputs", {}))
    # generate starts the decoder itself (an encoder-decoder's decoder_start_token_id)
    inputs.pop("decoder_input_ids", None)
    inputs.pop("decoder_attention_mask", None)
    # The shrunk config turned the cache off for training and scoring: on again, in
    # every config of the tree (a VLM's text_config is what its decoder reads).
    for cfg in _configs(model.config):
        if "use_cache" in vars(cfg):
            cfg.use_cache = True
    gen_cfg = model.generation_config
    gen_cfg.use_cache = True
    # A pad id generate would otherwise warn about (or fail on, where eos is unset too):
    # the config's own, else its eos, else 0; each must be inside the shrunk vocabulary.
    vocab = min(_vocab(model.config), VOCAB)
    # (a composite's top config may have no pad_token_id at all: GOT-OCR 2's)
    pad = next((t for t in (gen_cfg.pad_token_id, getattr(model.config, "pad_token_id", None),
                            gen_cfg.eos_token_id) if _is_int(t) and 0 <= t < vocab), 0)
    gen_cfg.pad_token_id = pad
    if getattr(model.config, "is_encoder_decoder", False) \
            and not any(_is_int(t) for t in (gen_cfg.decoder_start_token_id,
                                             gen_cfg.bos_token_id)):
        # An encoder-decoder whose config names no start of its decoder (a composed
        # EncoderDecoder, Switch Transformers as shrunk): T5's convention, the pad id.
        gen_cfg.decoder_start_token_id = pad

    def step() -> None:
        with torch.no_grad():
            model.generate(**inputs, max_new_tokens=DECODE_TOKENS, do_sample=False,
                           use_cache=True, pad_token_id=pad)
    return step


def _vocab(cfg: Any) -> int:
    """The vocabulary a config's decoder reads (its own, or its text config's)."""
    for c in _configs(cfg):
        if _is_int(v := vars(c).get("vocab_size")):
            return v
    return VOCAB


def run_step(kind: str, arch: str, name: str, work: Path) -> dict[str, object]:
    """Capture, generate, replay and compare one step (train, infer or decode) of one
    model."""
    import torch

    from mystique_gen.tools.capture import capture
    from mystique_gen.tools.compare import multiset_match, op_multiset

    model, loss_fn, infer_fn = build(kind, arch)
    train = name == "train"
    if name == "decode":
        model.eval()
        step = _decode_step(kind, model, infer_fn)
    elif train:
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                                foreach=False)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn()
            if loss is None:
                raise Skip("no loss returned")
            loss.backward()
            opt.step()
    else:
        model.eval()

        def step() -> None:
            with torch.no_grad():
                infer_fn()
    try:
        step()  # eager first: an architecture that cannot run is not our failure
    except Skip:
        raise
    except Exception as exc:  # noqa: BLE001
        raise Skip(f"eager: {type(exc).__name__}: {_first_line(exc)}") from None
    stem = f"{kind}_{arch}_{name}".replace("/", "_")
    result = capture(step, work, name=stem, warmup=1, timing_iters=1, kineto=False)
    bench = work / f"{stem}_bench.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    gen = subprocess.run([sys.executable, "-m", "mystique_gen", str(result.et_path), "-o",
                          str(bench)], capture_output=True, text=True, env=env, check=False,
                         cwd=ROOT)
    if gen.returncode != 0:
        return {"outcome": "gen error", "error": _stderr_error(gen.stderr)}
    replay_et = work / f"{stem}_replay.et.json"
    runner = ("import runpy, sys; sys.modules['mystique_gen'] = None; path = sys.argv[1]; "
              "sys.argv = sys.argv[1:]; runpy.run_path(path, run_name='__main__')")
    env.pop("PYTHONPATH", None)
    run = subprocess.run([sys.executable, "-c", runner, str(bench), "--device", "cpu",
                          "--warmup", "0", "--iters", str(REPLAY_ITERS), "--reset-inputs",
                          "off", "--json", "--et", str(replay_et)],
                         capture_output=True, text=True, env=env, check=False, cwd=work)
    if run.returncode != 0:
        return {"outcome": "run error", "error": _stderr_error(run.stderr)}
    nonfinite = json.loads(run.stdout.strip().splitlines()[-1]).get("nonfinite_inputs")
    original = op_multiset(result.et_path, by_overload=True)
    replayed = op_multiset(replay_et, by_overload=True)
    match = multiset_match(original, replayed)
    row: dict[str, object] = {"ops": sum(original.values()), "match": match}
    if original != replayed:
        missing, extra = original - replayed, replayed - original
        row.update(outcome="op mismatch",
                   error=f"missing {dict(missing.most_common(3))} extra "
                         f"{dict(extra.most_common(3))}")
    elif nonfinite:
        row.update(outcome="nonfinite", error=f"NaN or inf after {REPLAY_ITERS} iterations "
                                              f"in {', '.join(nonfinite[:3])}")
    else:
        row["outcome"] = "pass"
    return row


def child(kind: str, arch: str, steps: list[str]) -> None:
    """Run one model's steps in this process; one JSON line per step on stdout."""
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    keep = os.environ.get("SWEEP_KEEP")  # a directory to keep traces in, for debugging
    with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
        if keep:
            tmp = str(Path(keep) / arch)
            Path(tmp).mkdir(parents=True, exist_ok=True)
        for name in steps:
            start = time.perf_counter()
            try:
                row = run_step(kind, arch, name, Path(tmp))
            except Skip as exc:
                row = {"outcome": "skip", "error": str(exc)}
            except Exception as exc:  # noqa: BLE001 - a crash is a result
                # build and eager failures raise Skip: anything else is ours
                row = {"outcome": "capture error",
                       "error": f"{type(exc).__name__}: {_first_line(exc)}"}
                if os.environ.get("SWEEP_DEBUG"):
                    traceback.print_exc()
            row.update(kind=kind, arch=arch, step=name, s=time.perf_counter() - start)
            print("SWEEP " + json.dumps(row), flush=True)


def _run_child(kind: str, arch: str, steps: list[str], timeout: float) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", kind, arch, ",".join(steps)],
                              capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
        out, err = proc.stdout, proc.stderr
        code: int | str = proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err, code = f"timeout after {timeout:.0f} s", "timeout"
    rows = [json.loads(line[6:]) for line in out.splitlines() if line.startswith("SWEEP ")]
    done = {r["step"] for r in rows}
    for name in steps:
        if name not in done:
            rows.append({"kind": kind, "arch": arch, "step": name, "outcome": "crash",
                         "error": f"exit {code}: {_stderr_error(err)}"})
    return rows


def named(arch: str, only: list[str]) -> bool:
    """Whether SWEEP_ONLY's entries (``only``) pick ``arch``: a substring, or ``=name``
    that name alone; all where none is given."""
    return not only or any(arch == s[1:] if s.startswith("=") else s in arch for s in only)


_Work = TypeVar("_Work")


def sampled(work: list[_Work]) -> list[_Work]:
    """SWEEP_SAMPLE=K/N: the items whose place in ``work`` is K modulo N; all without."""
    sample = os.environ.get("SWEEP_SAMPLE")
    if not sample:
        return work
    part, parts = (int(x) for x in sample.split("/"))
    return [w for i, w in enumerate(work) if i % parts == part]


def main() -> int:
    warnings.filterwarnings("ignore")
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: pip install -e '.[bench]' (make bench does)")
        return 1
    only = [s for s in os.environ.get("SWEEP_ONLY", "").split(",") if s]
    kinds = [k for k in os.environ.get("SWEEP_KINDS", ",".join(KINDS)).split(",") if k]
    limit = int(os.environ.get("SWEEP_LIMIT", "0")) or None
    jobs = max(1, int(os.environ.get("SWEEP_JOBS", "1")))
    steps = [s for s in os.environ.get("SWEEP_STEPS", "train,infer").split(",") if s]
    timeout = float(os.environ.get("SWEEP_TIMEOUT", "900"))
    work = sampled([(k, a) for k in kinds for a in
                    [a for a in sorted(_mapping(k)) if named(a, only)][:limit]])
    print(f"{len(work)} architectures x {len(steps)} steps, {jobs} at a time", flush=True)
    print(f"{'kind':<12} {'arch':<28} {'step':<6} {'outcome':<12} {'ops':>5} {'s':>5}  error",
          flush=True)
    rows: list[dict] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for result in pool.map(lambda kw: _run_child(*kw, steps, timeout), work):
            for r in result:
                rows.append(r)
                print(f"{r['kind']:<12} {r['arch']:<28} {r['step']:<6} {r['outcome']:<12} "
                      f"{r.get('ops', ''):>5} {r.get('s', 0):>5.0f}  {r.get('error', '')}",
                      flush=True)
    totals = Counter(r["outcome"] for r in rows)
    order = list(OUTCOMES) + sorted(set(totals) - set(OUTCOMES))
    print(f"totals over {len(rows)} steps of {len(work)} models: "
          + ", ".join(f"{o} {totals[o]}" for o in order if totals[o] or o in OUTCOMES))
    ran = len(rows) - totals["skip"]
    if ran:
        print(f"pass rate of the steps that ran eagerly: {totals['pass']}/{ran} "
              f"({totals['pass'] / ran * 100:.0f}%)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4].split(","))
        sys.exit(0)
    sys.exit(main())
