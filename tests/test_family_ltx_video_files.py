"""LTX-Video 0.9 single files in Lightricks' layout (what ComfyUI's ``ltx-video-2b-v0.9*.safetensors`` hold: the
transformer under ``model.diffusion_model.``, the VAE under ``vae.``): detected, read with the shipped config and
what the weights decide (32 heads, as ComfyUI assumes), converted to the same transformer as the diffusers folder;
the conversion is diffusers' own single-file converter's (oracle), only renames (a PipeFusion stage reads its
blocks alone) and the skeleton gives the file's names and shapes back from a config."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.models.conversion_plan import plan_conversion
from parallel_runtime.models.families.ltx_video import LTXV_2B
from parallel_runtime.models.families.ltx_video.keys import LAYOUT
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components

PREFIX = "model.diffusion_model."
# Lightricks' names -> diffusers' (written from the two layouts; diffusers' converter is checked against it below)
ORIGINAL = (("proj_in.", "patchify_proj."), ("time_embed.", "adaln_single."), (".norm_q.", ".q_norm."),
            (".norm_k.", ".k_norm."))  # fmt: skip


def original_name(name: str) -> str:
    for diffusers, original in ORIGINAL:
        name = name.replace(diffusers, original) if diffusers.startswith(".") or name.startswith(diffusers) else name
    return name


@pytest.fixture(scope="module")
def folder():
    return load_pipeline_components(ensure_tiny_model("tiny-ltx-video"), "cpu", torch.float32, parts=("transformer",))


@pytest.fixture(scope="module")
def checkpoint(folder, tmp_path_factory):
    """A full checkpoint: the transformer in Lightricks' names and a VAE tensor beside it."""
    from safetensors.torch import save_file

    state = {PREFIX + original_name(k): v.contiguous() for k, v in folder.transformer.state_dict().items()}
    state["vae.decoder.conv_in.conv.weight"] = torch.zeros(8, 128, 3, 3, 3)
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
