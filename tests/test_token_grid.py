"""The adapter contract for video: per-channel latent formats and N-D token grids.

Oracles: ComfyUI's own Wan latent formats (values stored by tests/data/make_comfy_wan_reference.py),
diffusers' AutoencoderKLWan defaults and Wan pipeline convention, the image (2-D) path frame by frame,
and a full-latent embedding sliced to the band.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Activations, LatentFormat, ModelAdapter, ModelPlan, Split
from parallel_runtime.models.families.wan.latent import WAN21, WAN22
from parallel_runtime.models.latent_formats import per_channel
from parallel_runtime.models.sampling_spec import discrete_flow_sampling
from parallel_runtime.models.token_grid import patchify, stacked, unpatchify, unstacked
from parallel_runtime.parallel.mesh import ParallelMesh

REF = json.loads((Path(__file__).parent / "data" / "comfy_wan_reference.json").read_text())["latent_formats"]


@pytest.mark.parametrize(("fmt", "name"), [(WAN21, "Wan21"), (WAN22, "Wan22")])
def test_wan_latent_formats_are_comfyuis(fmt, name):
    ref = REF[name]
    assert fmt.channels == ref["channels"] and fmt.scale == ref["scale_factor"] == 1.0
    for ours, theirs in ((fmt.mean, ref["mean"]), (fmt.std, ref["std"])):  # ComfyUI keeps them as float32
        assert torch.equal(torch.tensor(ours, dtype=torch.float32), torch.tensor(theirs, dtype=torch.float32))


@pytest.mark.parametrize("shape", [(2, 16, 3, 4, 6), (1, 16, 5, 7)])
def test_per_channel_format_is_comfyuis_formula_for_any_rank(shape):
    fmt = per_channel(16, WAN21.mean, WAN21.std, scale=0.7)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    z = fmt.to_model(x)
    for c in range(16):  # ComfyUI's process_in: (latent - mean) * scale_factor / std, channel by channel
        expect = (x[:, c] - WAN21.mean[c]) * 0.7 / WAN21.std[c]
        torch.testing.assert_close(z[:, c], expect, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fmt.to_raw(z), x, rtol=1e-5, atol=1e-5)


def test_from_vae_config_reads_wan_vae_statistics():
    from diffusers import AutoencoderKLWan

    config = AutoencoderKLWan(base_dim=8, z_dim=16).config  # diffusers' defaults are Wan 2.1's statistics
    fmt = LatentFormat.from_vae_config(config)
    assert fmt == WAN21
    latents = torch.randn(1, 16, 2, 3, 3)
    # diffusers' Wan pipelines decode with latents / (1 / std) + mean
    std = torch.tensor(config.latents_std).view(1, 16, 1, 1, 1)
    mean = torch.tensor(config.latents_mean).view(1, 16, 1, 1, 1)
    torch.testing.assert_close(fmt.to_raw(latents), latents / (1.0 / std) + mean)


def test_scalar_formats_are_unchanged():
    fmt = LatentFormat.from_vae_config({"latent_channels": 16, "scaling_factor": 0.3611, "shift_factor": 0.1159})
    assert fmt == LatentFormat(16, 0.3611, 0.1159) and not fmt.per_channel
    x = torch.randn(1, 16, 4, 4)
    torch.testing.assert_close(fmt.to_model(x), (x - 0.1159) * 0.3611)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"channels": 2, "mean": (0.0,), "std": (1.0, 1.0)},
        {"channels": 2, "mean": (0.0, 0.0)},
        {"channels": 2, "mean": (0.0, 0.0), "std": (1.0, 0.0)},
        {"channels": 2, "scale": 0.0},
    ],
)
def test_bad_latent_formats_are_refused(kwargs):
    with pytest.raises(ConfigError):
        LatentFormat(**kwargs)


def test_per_channel_format_refuses_other_channel_counts():
    with pytest.raises(ConfigError, match="16-channel"):
        WAN21.to_model(torch.zeros(1, 48, 1, 2, 2))


@pytest.mark.parametrize("layout", ["cpq", "pqc"])
def test_video_tokens_are_the_frames_image_tokens_in_order(layout):
    x = torch.randn(2, 3, 4, 6, 8)
    tokens = patchify(x, 2, (4, 3, 4), layout)
    per_frame = [patchify(x[:, :, t], 2, (3, 4), layout) for t in range(4)]
    torch.testing.assert_close(tokens, torch.cat(per_frame, dim=1), rtol=0, atol=0)
    torch.testing.assert_close(unpatchify(tokens, (4, 3, 4), 2, 3, layout), x, rtol=0, atol=0)
    # a 2-D grid of the same tokens is the stacked view (frames stacked vertically)
    view = unpatchify(tokens, (12, 4), 2, 3, layout)
    torch.testing.assert_close(view, stacked(x), rtol=0, atol=0)
    torch.testing.assert_close(unstacked(view, (4, 6, 8)), x, rtol=0, atol=0)


class _ToyVideo(ModelAdapter):
    """A video family whose token embedding depends on its own patch and its position only."""

    family = "toy-video"

    @classmethod
    def make_plan(cls, config, latent_format):
        return ModelPlan(
            family=cls.family,
            block_lists=("blocks",),
            patch_size=2,
            patch_layout="pqc",
            latent_channels=3,
            out_channels=3,
            learned_sigma=False,
            text_attention="cross",
            guidance_embed=False,
            timestep="sigma_x1000",
            latent_format=latent_format or per_channel(3, (0.1, 0.2, 0.3), (1.0, 2.0, 3.0)),
            splits=(Split("img", 1), Split("img_rope", 1)),
            model_sampling=discrete_flow_sampling(8.0),
            latent_dims=3,
            vae_temporal_factor=4,
        )

    def embed_full(self, x, timestep, cond, guidance=None):
        grid = self.grid_of(x)
        img = self.transformer.proj(self.patchify(x)) + timestep[:, None, None]
        pos = torch.arange(math.prod(grid), dtype=x.dtype)[None, :, None, None].expand(1, -1, 1, 4)
        return Activations(
            img=img,
            txt=cond.prompt_embeds,
            temb=timestep,
            temb_out=timestep,
            grid=grid,
            txt_tokens=cond.prompt_embeds.shape[1],
            img_rope=(pos.cos(), pos.sin()),
        )

    def call_block(self, list_name, block, acts):
        return acts

    def self_attention_modules(self, list_name, block):
        return []

    def project_out(self, acts):
        return acts.img


def _toy() -> _ToyVideo:
    torch.manual_seed(0)
    transformer = nn.Module()
    transformer.proj = nn.Linear(12, 12)
    transformer.blocks = nn.ModuleList()
    transformer.config = SimpleNamespace()
    return _ToyVideo(transformer)


@pytest.mark.parametrize(("r0", "r1"), [(0, 20), (0, 8), (8, 20), (6, 14), (18, 20)])
def test_video_band_embedding_is_the_band_of_the_full_embedding(r0, r1):
    """Latent rows r0:r1 of the stacked view (5 frames of 4 latent rows), also bands across frames."""
    adapter = _toy()
    x = torch.randn(1, 3, 5, 4, 6)
    cond = SimpleNamespace(prompt_embeds=torch.randn(1, 5, 12), to=lambda *a, **k: cond)
    full = adapter.embed(x, 0.5, cond, ParallelMesh.single())
    assert full.grid == (5, 2, 3) and full.img_tokens == 30
    band = adapter.embed_rows(stacked(x)[..., r0:r1, :], (r0, r1), (5, 4, 6), 0.5, cond, ParallelMesh.single())
    t0, t1 = r0 // 2 * 3, r1 // 2 * 3
    assert band.grid == ((r1 - r0) // 2, 3)
    torch.testing.assert_close(band.img, full.img[:, t0:t1], rtol=0, atol=0)
    for got, want in zip(band.img_rope, full.img_rope):
        torch.testing.assert_close(got, want[:, t0:t1], rtol=0, atol=0)
    out = adapter.final(band, ParallelMesh.single())  # a band of the stacked view comes back as one
    torch.testing.assert_close(out, stacked(adapter.final(full, ParallelMesh.single()))[..., r0:r1, :])


def test_video_family_refuses_image_latents_and_image_families_video_latents():
    with pytest.raises(ConfigError, match="video latents"):
        _toy().grid_of(torch.zeros(1, 3, 4, 4))
    from parallel_runtime.models.token_grid import grid_of

    with pytest.raises(ConfigError, match="image latents"):
        grid_of(torch.zeros(1, 16, 2, 4, 4), 2, 2, "flux", 8)
