"""LTX-2's video VAE from single files in Lightricks' layout: the ``vae.`` part of the release checkpoint (beside
its transformer) and the same tensors alone (models/vae). The tiny folder's VAE is written in Lightricks' names (the
test's own table, checked against diffusers' single-file converter); read back, its decoder and statistics equal the
folder's, and so does the decode (one device), where LTX-Video 0.9's VAE reader (whose marker these files hold too)
does not take it."""

from __future__ import annotations

import re

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.vae.decode import decode_latent
from parallel_runtime.vae.file import inspect_vae_file, load_vae_file

STATISTICS = {"latents_mean": "per_channel_statistics.mean-of-means",
              "latents_std": "per_channel_statistics.std-of-means"}  # fmt: skip


PIECES = (  # diffusers' piece -> Lightricks' number of it (one rename per name)
    (r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", lambda i: f"encoder.down_blocks.{2 * i + 1}."),
    (r"encoder\.down_blocks\.(\d+)\.", lambda i: f"encoder.down_blocks.{2 * i}."),
    (r"encoder\.mid_block\.()", lambda i: "encoder.down_blocks.8."),
    (r"decoder\.mid_block\.()", lambda i: "decoder.up_blocks.0."),
    (r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.", lambda i: f"decoder.up_blocks.{2 * i + 1}."),
    (r"decoder\.up_blocks\.(\d+)\.", lambda i: f"decoder.up_blocks.{2 * i + 2}."),
)


def original_name(name: str) -> str:
    """diffusers' AutoencoderKLLTX2Video names -> Lightricks' (pieces numbered from the image side in the encoder,
    from the latent side in the decoder; a level's down/upsampler is a piece of its own)."""
    if name in STATISTICS:
        return STATISTICS[name]
    for pattern, number in PIECES:
        found = re.match(pattern, name)
        if found:
            name = number(int(found[1] or 0)) + name[found.end() :]
            break
    return name.replace(".resnets.", ".res_blocks.")


@pytest.fixture(scope="module")
def folder_vae():
    return load_pipeline_components(ensure_tiny_model("tiny-ltx2"), "cpu", torch.float32, parts=("vae",)).vae


@pytest.fixture(scope="module")
def files(folder_vae, tmp_path_factory):
    """(the VAE alone, a release-like checkpoint: a transformer tensor and the VAE under ``vae.``), Lightricks' names
    plus the two statistics diffusers drops."""
    from safetensors.torch import save_file

    state = {original_name(k): v.contiguous() for k, v in folder_vae.state_dict().items()}
    state["per_channel_statistics.channel"] = torch.arange(128.0)
    state["per_channel_statistics.mean-of-stds"] = torch.ones(128)
    root = tmp_path_factory.mktemp("ltx2-vae")
    alone, checkpoint = root / "ltx2_video_vae.safetensors", root / "ltx-2-tiny.safetensors"
    save_file(state, str(alone))
    anchor = "model.diffusion_model.av_ca_a2v_gate_adaln_single.emb.timestep_embedder.linear_1.weight"
    save_file({**{"vae." + k: v for k, v in state.items()}, anchor: torch.zeros(4, 4)}, str(checkpoint))
    return alone, checkpoint, state


def test_the_layout_is_diffusers_single_file_converters(folder_vae, files):
    from diffusers.loaders.single_file_utils import convert_ltx2_vae_to_diffusers

    *_, state = files
    theirs = convert_ltx2_vae_to_diffusers({"vae." + k: v for k, v in state.items()})
    assert set(theirs) == set(folder_vae.state_dict()) and all(theirs[k] is state[original_name(k)] for k in theirs)


@torch.no_grad()
@pytest.mark.parametrize("which", ["alone", "checkpoint"])
def test_vae_file_decodes_as_the_folders_vae(folder_vae, files, which):
    path = files[0] if which == "alone" else files[1]
    info = inspect_vae_file(path)
    assert (info.layout, info.prefix) == ("ltx2", "" if which == "alone" else "vae.")
    vae = load_vae_file(path)
    ours, theirs = vae.state_dict(), folder_vae.state_dict()
    decoder = [k for k in theirs if not k.startswith("encoder.")]
    assert all(torch.equal(ours[k], theirs[k]) for k in decoder)
    for key in ("decoder_block_out_channels", "decoder_layers_per_block", "upsample_factor", "patch_size",
                "decoder_causal", "decoder_spatial_padding_mode", "latent_channels"):  # fmt: skip
        assert tuple_or_value(vae.config[key]) == tuple_or_value(folder_vae.config[key]), key
    assert (vae.spatial_compression_ratio, vae.temporal_compression_ratio) == (32, 8)
    z = torch.randn(1, 128, 2, 3, 2, generator=torch.Generator().manual_seed(2))
    mesh = ParallelMesh.single()
    assert torch.equal(decode_latent(vae, z, mesh, None), decode_latent(folder_vae, z, mesh, None))


def tuple_or_value(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value
