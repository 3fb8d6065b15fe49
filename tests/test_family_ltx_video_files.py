"""LTX-Video 0.9 single files in Lightricks' layout (what ComfyUI's ``ltx-video-2b-v0.9*.safetensors`` hold: the
transformer under ``model.diffusion_model.``, the VAE under ``vae.``): detected, read with the shipped config and
what the weights decide (32 heads, as ComfyUI assumes), converted to the same transformer as the diffusers folder;
the conversion is diffusers' own single-file converter's (oracle), only renames (a PipeFusion stage reads its
blocks alone) and the skeleton gives the file's names and shapes back from a config."""

from __future__ import annotations

import copy

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.conversion_plan import plan_conversion
from parallel_runtime.models.families.ltx_video import LTXV_2B
from parallel_runtime.models.families.ltx_video.keys import LAYOUT
from parallel_runtime.models.families.ltx_video.vae_file import LATER, MARKER
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components
from parallel_runtime.vae.file import inspect_vae_file, load_vae_file

PREFIX = "model.diffusion_model."
# Lightricks' names -> diffusers' (written from the two layouts; diffusers' converter is checked against it below)
ORIGINAL = (("proj_in.", "patchify_proj."), ("time_embed.", "adaln_single."), (".norm_q.", ".q_norm."),
            (".norm_k.", ".k_norm."))  # fmt: skip


# the VAE's diffusers pieces -> Lightricks' 0.9.0 pieces (most specific first)
VAE_PIECES = (
    ("decoder.mid_block.", "decoder.up_blocks.0."), ("decoder.up_blocks.0.", "decoder.up_blocks.1."),
    ("decoder.up_blocks.1.upsamplers.0.", "decoder.up_blocks.2."), ("decoder.up_blocks.1.", "decoder.up_blocks.3."),
    ("decoder.up_blocks.2.conv_in.", "decoder.up_blocks.4."), ("decoder.up_blocks.2.upsamplers.0.", "decoder.up_blocks.5."),
    ("decoder.up_blocks.2.", "decoder.up_blocks.6."), ("decoder.up_blocks.3.conv_in.", "decoder.up_blocks.7."),
    ("decoder.up_blocks.3.upsamplers.0.", "decoder.up_blocks.8."), ("decoder.up_blocks.3.", "decoder.up_blocks.9."),
    ("encoder.down_blocks.0.downsamplers.0.", "encoder.down_blocks.1."), ("encoder.down_blocks.0.conv_out.", "encoder.down_blocks.2."),
    ("encoder.down_blocks.0.", "encoder.down_blocks.0."), ("encoder.down_blocks.1.downsamplers.0.", "encoder.down_blocks.4."),
    ("encoder.down_blocks.1.conv_out.", "encoder.down_blocks.5."), ("encoder.down_blocks.1.", "encoder.down_blocks.3."),
    ("encoder.down_blocks.2.downsamplers.0.", "encoder.down_blocks.7."), ("encoder.down_blocks.2.", "encoder.down_blocks.6."),
    ("encoder.down_blocks.3.", "encoder.down_blocks.8."), ("encoder.mid_block.", "encoder.down_blocks.9."),
)  # fmt: skip
VAE_NAMES = ((".resnets.", ".res_blocks."), (".conv_shortcut.conv.", ".conv_shortcut."), (".norm3.", ".norm3.norm."))
STATISTICS = {
    "latents_mean": "per_channel_statistics.mean-of-means",
    "latents_std": "per_channel_statistics.std-of-means",
}


def original_vae_name(name: str) -> str:
    if name in STATISTICS:
        return STATISTICS[name]
    for diffusers, original in VAE_PIECES:
        if name.startswith(diffusers):
            name = original + name[len(diffusers) :]
            break
    for diffusers, original in VAE_NAMES:
        name = name.replace(diffusers, original)
    return name


def original_name(name: str) -> str:
    for diffusers, original in ORIGINAL:
        name = name.replace(diffusers, original) if diffusers.startswith(".") or name.startswith(diffusers) else name
    return name


@pytest.fixture(scope="module")
def folder():
    return load_pipeline_components(
        ensure_tiny_model("tiny-ltx-video"), "cpu", torch.float32, parts=("transformer", "vae")
    )


@pytest.fixture(scope="module")
def checkpoint(folder, tmp_path_factory):
    """A full checkpoint: the transformer and the VAE in Lightricks' names."""
    from safetensors.torch import save_file

    state = {PREFIX + original_name(k): v.contiguous() for k, v in folder.transformer.state_dict().items()}
    state.update({"vae." + original_vae_name(k): v.contiguous() for k, v in folder.vae.state_dict().items()})
    path = tmp_path_factory.mktemp("ltx-files") / "ltx-video-tiny.safetensors"
    save_file(state, str(path))
    return path, state


def test_diffusers_converter_agrees_with_the_layout(folder, checkpoint):
    from diffusers.loaders.single_file_utils import convert_ltx_transformer_checkpoint_to_diffusers

    _, state = checkpoint
    theirs = convert_ltx_transformer_checkpoint_to_diffusers(dict(state))
    transformer = {k[len(PREFIX) :]: v for k, v in state.items() if k.startswith(PREFIX)}
    ours = LAYOUT.to_diffusers(transformer, folder.transformer.config)
    assert set(theirs) == set(ours) == set(folder.transformer.state_dict())
    assert all(theirs[k] is ours[k] for k in ours)


def test_checkpoint_loads_as_the_folders_transformer(folder, checkpoint):
    path, state = checkpoint
    info = inspect_single_file(path)
    assert (info.family, info.variant, info.prefix) == ("ltx-video", LTXV_2B, PREFIX)
    for key in ("num_attention_heads", "attention_head_dim", "num_layers", "cross_attention_dim", "caption_channels"):
        assert info.config[key] == folder.transformer.config[key], key
    comps = load_single_file_components(path, "cpu", torch.float32)
    ours, theirs = comps.transformer.state_dict(), folder.transformer.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    skeleton = LAYOUT.skeleton(info.config)
    assert skeleton == {k[len(PREFIX) :]: tuple(v.shape) for k, v in state.items() if k.startswith(PREFIX)}


def test_conversion_only_renames(folder, checkpoint):
    _, state = checkpoint
    shapes = {k[len(PREFIX) :]: tuple(v.shape) for k, v in state.items() if k.startswith(PREFIX)}
    plan = plan_conversion(lambda s: LAYOUT.to_diffusers(s, folder.transformer.config), shapes)
    assert not plan.unused and set(plan.pieces) == set(folder.transformer.state_dict())
    assert all(len(p) == 1 and p[0].r0 == 0 and p[0].r1 == shapes[p[0].key][0] for p in plan.pieces.values())


def test_the_checkpoints_vae_loads_as_the_folders(folder, checkpoint):
    from diffusers.loaders.single_file_utils import convert_ltx_vae_checkpoint_to_diffusers

    path, state = checkpoint
    vae_state = {k: v for k, v in state.items() if k.startswith("vae.")}
    theirs = convert_ltx_vae_checkpoint_to_diffusers(dict(vae_state))  # the names written here are Lightricks'
    assert set(theirs) == set(folder.vae.state_dict())
    info = inspect_vae_file(path)
    assert (info.prefix, info.layout) == ("vae.", "ltx-video")
    vae = load_vae_file(path)
    assert type(vae) is type(folder.vae)

    def listed(config) -> dict:
        return {k: list(v) if isinstance(v, (tuple, list)) else v for k, v in config.items() if k[0] != "_"}

    assert listed(vae.config) == listed(folder.vae.config)
    ours, expected = vae.state_dict(), folder.vae.state_dict()
    assert set(ours) == set(expected) and all(torch.equal(ours[k], expected[k]) for k in ours)


def test_incomplete_or_unknown_vae_layouts_are_refused(tmp_path):
    """(0.9.1+ files decode: tests/test_family_ltx_video_vae091.py)"""
    from safetensors.torch import save_file

    path = tmp_path / "ltx-video-2b-v0.9.1.safetensors"
    save_file({"vae." + MARKER: torch.zeros(1), "vae." + LATER: torch.zeros(1)}, str(path))
    with pytest.raises(ConfigError, match="0.9.1\\+ VAE decoder with no decoder.conv_in"):
        load_vae_file(path)
    save_file({"vae." + MARKER: torch.zeros(1)}, str(path))
    with pytest.raises(ConfigError, match="unknown Lightricks layout"):
        load_vae_file(path)


def test_the_checkpoint_runs_with_its_own_vae_on_ulysses(cpu_pool, folder, checkpoint):
    """Loaded on two worker processes, the checkpoint's transformer samples as the folder's on one device and its
    own VAE (found beside the transformer) decodes band-parallel as diffusers' decode of the folder's VAE with its
    decoder's convs padded with reflect (ComfyUI's padding of a 0.9.0 file whose metadata states none; diffusers'
    zeros differ: tests/test_family_ltx_video_vae090.py compares with ComfyUI)."""
    from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
    from parallel_runtime.models.base import Conditioning
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.parallel.mesh import ParallelMesh
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import decode, generate

    path, _ = checkpoint
    g = torch.Generator().manual_seed(2)
    pos = Conditioning(torch.randn(1, 6, 32, generator=g), None, torch.tensor([[1.0, 1, 1, 1, 0, 0]]))
    latent = torch.zeros(1, 128, 2, 3, 2)
    settings = SamplingSettings(seed=1, steps=2, cfg=1.0, sampler="euler", scheduler="simple")
    adapter = folder.adapter()
    with torch.no_grad():
        expected = denoise_latent(
            adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, None, latent, settings
        )
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(path), "fp32", "sdpa").result(300)
    got = pool.submit(generate, pos, None, latent, settings).result(600)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    image = pool.submit(decode, expected).result(300)
    vae = copy.deepcopy(folder.vae)
    pictures = {}
    for padding in ("reflect", "zeros"):  # the file's decoder pads as ComfyUI's (reflect), the folder's as diffusers'
        for module in vae.decoder.modules():
            if isinstance(module, torch.nn.Conv3d):
                module.padding_mode = padding
        with torch.no_grad():
            z = expected * vae.latents_std.view(1, -1, 1, 1, 1) + vae.latents_mean.view(1, -1, 1, 1, 1)
            pictures[padding] = ((vae.decode(z).sample + 1) / 2).clamp(0, 1)[0].movedim(0, -1)
    assert image.shape == (9, 96, 64, 3)
    torch.testing.assert_close(image, pictures["reflect"], atol=2e-5, rtol=0)
    assert (image - pictures["zeros"]).abs().max() > 1e-3
