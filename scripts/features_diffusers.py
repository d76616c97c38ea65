"""A batch of steps for ``scripts/bench_features.py``: diffusers' models, which no
other batch or sweep builds (the architecture sweep covers transformers' models).
Each is built from a tiny config written here (diffusers has no config classes to
shrink, and its defaults are full size), never from weights, and trained one AdamW
step (a mean-square loss on its output) and run under ``no_grad``: UNets 2-D, with
cross-attention and 3-D, an AutoencoderKL and a VQ model, ControlNet, and the
transformer denoisers DiT, PixArt, SD3's MMDiT, Flux, Wan, LTX-Video and Sana. Then
whole sampling loops, as a pipeline runs them: four steps of a guided UNet under each
of nine schedulers (DDPM, DDIM, Euler, ancestral Euler, DPM-Solver++, UniPC, PNDM, LMS,
Heun: their timestep lookups, multistep histories and noise draws are host logic
between ops), and a flow-matching Flux loop. ``WORKLOADS``: name -> a builder that
returns the step; none where diffusers is not installed (``pip install -e '.[bench]'``).

What this batch found when it was added: every step replays with the eager step's
ops and shapes, and none ends with NaN or inf in an input. Two sampling loops compute
NaN that reaches no input (the NaN-birth check), both of the class Known limits names
for ``ddim_falling_schedule_min``: DDIM's last step divides ``alphas_cumprod[0]`` by
its ``final_alpha_cumprod``, ``torch.tensor(1.0)``, whose value no op records (filled,
it is less than the numerator, and the variance's square root is NaN); ancestral
Euler's ``sigmas`` come from numpy, and fall only in the model.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

try:
    import diffusers
except ImportError:  # (bench_features lists no step of this batch then)
    diffusers = None
    print("features_diffusers: diffusers is not installed: no steps", file=sys.stderr)

Step = Callable[[], None]
_G = torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_G)


def _unet2d():
    return diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"))


def _unet2d_cond(sample_size: int = 16):
    return diffusers.UNet2DConditionModel(
        sample_size=sample_size, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=8, cross_attention_dim=32,
        attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))


def _autoencoder_kl():
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, block_out_channels=(32, 64), latent_channels=4,
        norm_num_groups=8, sample_size=32,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2)


def _vq():
    return diffusers.VQModel(
        in_channels=3, out_channels=3, block_out_channels=(32, 64), latent_channels=3,
        norm_num_groups=8, num_vq_embeddings=64, sample_size=32,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2)


def _controlnet():
    return diffusers.ControlNetModel(
        in_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        norm_num_groups=8, cross_attention_dim=32, attention_head_dim=8,
        conditioning_embedding_out_channels=(8, 16),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"))


def _unet3d():
    return diffusers.UNet3DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=8, cross_attention_dim=32,
        attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
        up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"))


def _dit():
    return diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
        num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10,
        norm_num_groups=8)


def _pixart():
    return diffusers.PixArtTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
        num_layers=2, sample_size=8, patch_size=2, cross_attention_dim=32,
        caption_channels=24, norm_num_groups=8)


def _sd3():
    return diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=32,
        pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16)


def _flux():
    return diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
        pooled_projection_dim=16, axes_dims_rope=(4, 6, 6))


def _wan():
    return diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
        in_channels=4, out_channels=4, text_dim=16, freq_dim=32, ffn_dim=32,
        num_layers=2, rope_max_seq_len=32)


def _ltx():
    return diffusers.LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1,
        num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        num_layers=1, caption_channels=16)


def _sana():
    return diffusers.SanaTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=1,
        num_attention_heads=2, attention_head_dim=4, num_cross_attention_heads=2,
        cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
        sample_size=8)


def _flux_inputs(latents: torch.Tensor, timestep: torch.Tensor) -> dict[str, Any]:
    batch = latents.shape[0]
    return {"hidden_states": latents, "encoder_hidden_states": _randn(batch, 5, 24),
            "pooled_projections": _randn(batch, 16), "timestep": timestep,
            "img_ids": torch.zeros(latents.shape[1], 3), "txt_ids": torch.zeros(5, 3),
            "guidance": None}


def _steps(batch: int) -> torch.Tensor:
    return torch.tensor([10, 500][:batch])


@dataclass(frozen=True)
class Model:
    build: Callable[[], torch.nn.Module]
    batch: Callable[[], dict[str, Any]]  # its forward's arguments, drawn once a step
    output: str = "sample"  # the output the loss reads


MODELS = {
    "unet2d": Model(_unet2d, lambda: {"sample": _randn(2, 3, 16, 16),
                                      "timestep": _steps(2)}),
    "unet2d_cond": Model(_unet2d_cond, lambda: {
        "sample": _randn(2, 4, 16, 16), "timestep": _steps(2),
        "encoder_hidden_states": _randn(2, 7, 32)}),
    "autoencoder_kl": Model(_autoencoder_kl, lambda: {"sample": _randn(2, 3, 32, 32)}),
    "vq": Model(_vq, lambda: {"sample": _randn(2, 3, 32, 32)}),
    "controlnet": Model(_controlnet, lambda: {
        "sample": _randn(2, 4, 16, 16), "timestep": _steps(2),
        "encoder_hidden_states": _randn(2, 7, 32),
        "controlnet_cond": _randn(2, 3, 32, 32)}, "mid_block_res_sample"),
    "unet3d": Model(_unet3d, lambda: {
        "sample": _randn(1, 4, 3, 8, 8), "timestep": _steps(1),
        "encoder_hidden_states": _randn(1, 7, 32)}),
    "dit": Model(_dit, lambda: {
        "hidden_states": _randn(2, 4, 8, 8), "timestep": torch.tensor([1, 5]),
        "class_labels": torch.tensor([1, 3])}),
    "pixart": Model(_pixart, lambda: {
        "hidden_states": _randn(2, 4, 8, 8), "encoder_hidden_states": _randn(2, 5, 24),
        "timestep": torch.tensor([1, 5]),
        "added_cond_kwargs": {"resolution": None, "aspect_ratio": None}}),
    "sd3": Model(_sd3, lambda: {
        "hidden_states": _randn(2, 4, 8, 8), "encoder_hidden_states": _randn(2, 5, 24),
        "pooled_projections": _randn(2, 16), "timestep": torch.tensor([1, 5])}),
    "flux": Model(_flux, lambda: _flux_inputs(_randn(2, 16, 8), torch.tensor([0.1, 0.5]))),
    "wan": Model(_wan, lambda: {
        "hidden_states": _randn(1, 4, 2, 8, 8), "timestep": _steps(1),
        "encoder_hidden_states": _randn(1, 5, 16)}),
    "ltx": Model(_ltx, lambda: {
        "hidden_states": _randn(1, 32, 8), "encoder_hidden_states": _randn(1, 5, 16),
        "timestep": _steps(1), "encoder_attention_mask": torch.ones(1, 5),
        "num_frames": 2, "height": 4, "width": 4}),
    "sana": Model(_sana, lambda: {
        "hidden_states": _randn(2, 4, 8, 8), "encoder_hidden_states": _randn(2, 5, 8),
        "timestep": torch.tensor([1, 5])}),
}


def built(name: str) -> tuple[torch.nn.Module, Callable[[], torch.Tensor], Step]:
    """The model, its training loss (a mean square of its output) and its forward, on
    a batch drawn when it is built (a data loader's). bench_fidelity's
    FIDELITY_ZOO=diffusers times the same."""
    spec = MODELS[name]
    model, batch = spec.build(), spec.batch()

    def loss() -> torch.Tensor:
        return getattr(model(**batch), spec.output).float().pow(2).mean()

    def forward() -> None:
        model(**batch)
    return model, loss, forward


def trained(name: str) -> Step:
    """One AdamW step of the model on its loss."""
    model, loss, _ = built(name)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
    return step


def inferred(name: str) -> Step:
    model, _, forward = built(name)
    model.eval()

    def step() -> None:
        with torch.no_grad():
            forward()
    return step


SCHEDULERS = ("DDPMScheduler", "DDIMScheduler", "EulerDiscreteScheduler",
              "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler",
              "UniPCMultistepScheduler", "PNDMScheduler", "LMSDiscreteScheduler",
              "HeunDiscreteScheduler")
GUIDANCE = 7.5


def sampled(scheduler_name: str) -> Step:
    """Four denoising steps of a classifier-free-guided UNet, as a text-to-image
    pipeline runs them: the scheduler made anew each call (its step index and history
    are Python state), the latents scaled, the model on both halves, the guidance mix,
    the scheduler's step (with a generator where it draws noise)."""
    model = _unet2d_cond(sample_size=8).eval()
    text = _randn(2, 7, 32)  # (the prompt's and the empty prompt's embeddings)
    cls = getattr(diffusers, scheduler_name)
    draws = "generator" in inspect.signature(cls.step).parameters

    def step() -> None:
        scheduler = cls(num_train_timesteps=100)
        scheduler.set_timesteps(4)
        latents = torch.randn(1, 4, 8, 8) * scheduler.init_noise_sigma
        extra = {"generator": torch.Generator().manual_seed(1)} if draws else {}
        with torch.no_grad():
            for t in scheduler.timesteps:
                both = scheduler.scale_model_input(torch.cat([latents] * 2), t)
                noise = model(both, t, encoder_hidden_states=text).sample
                plain, guided = noise.chunk(2)
                noise = plain + GUIDANCE * (guided - plain)
                latents = scheduler.step(noise, t, latents, **extra).prev_sample
    return step


def flow_matched() -> Step:
    """Four flow-matching Euler steps of Flux (its timesteps as fractions)."""
    model = _flux().eval()
    prompt = _flux_inputs(torch.randn(1, 16, 8), torch.zeros(1))

    def step() -> None:
        scheduler = diffusers.FlowMatchEulerDiscreteScheduler()
        scheduler.set_timesteps(4)
        latents = torch.randn(1, 16, 8)
        with torch.no_grad():
            for t in scheduler.timesteps:
                velocity = model(**{**prompt, "hidden_states": latents,
                                    "timestep": (t / 1000).expand(1)}).sample
                latents = scheduler.step(velocity, t, latents).prev_sample
    return step


WORKLOADS: dict[str, Callable[[], Step]] = {}
if diffusers is not None:
    for _name in MODELS:
        WORKLOADS[f"df_{_name}_train"] = lambda n=_name: trained(n)
        WORKLOADS[f"df_{_name}_infer"] = lambda n=_name: inferred(n)
    for _scheduler in SCHEDULERS:
        _short = _scheduler.removesuffix("Scheduler").lower()
        WORKLOADS[f"df_sample_{_short}"] = lambda s=_scheduler: sampled(s)
    WORKLOADS["df_sample_flow_flux"] = flow_matched
