"""VAE single files (ComfyUI's models/vae, or inside a full checkpoint) load to the same VAE as the
diffusers folder: original (LDM) names through diffusers' own converter, or diffusers names."""

from __future__ import annotations

import pytest
import torch
from ldm_vae_layout import to_ldm  # tests/ helper
from safetensors.torch import save_file

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.vae.file import inspect_vae_file, load_vae_file

torch.set_num_threads(1)
TINY_GROUPS = 4  # the tiny VAEs' GroupNorm groups (not stored in weights; published VAEs use 32)


def folder_vae(name: str):
    return load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32, ("vae",)).vae


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize(
    "name, prefix",
    [("tiny-flux", ""), ("tiny-pixart", ""), ("tiny-sd3", "first_stage_model.")],
    ids=["flux-ae", "pixart-quant-conv", "sd3-inside-checkpoint"],
)
def test_ldm_file_loads_the_folder_vae(tmp_path, name, prefix):
    ref = folder_vae(name)
    levels = len(ref.config.block_out_channels)
    ldm = {prefix + k: v for k, v in to_ldm(ref.state_dict(), levels).items()}
    assert not any("mid_block" in k or "up_blocks" in k for k in ldm)  # really the original layout
    if prefix:  # a full checkpoint: the transformer's tensors sit next to the VAE's
        ldm["model.diffusion_model.x_embedder.proj.weight"] = torch.zeros(4, 4)
    path = tmp_path / "vae.safetensors"
    save_file(ldm, path)
    info = inspect_vae_file(path, TINY_GROUPS)
    assert (info.layout, info.prefix, info.latent_channels) == ("ldm", prefix, ref.config.latent_channels)
    assert info.config["use_quant_conv"] == (name == "tiny-pixart")
    vae = load_vae_file(path, norm_num_groups=TINY_GROUPS)
    _same_weights(vae, ref)
    z = torch.randn(1, ref.config.latent_channels, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(vae.decode(z).sample, ref.decode(z).sample, rtol=0, atol=0)


def test_diffusers_named_file_and_bf16(tmp_path):
    ref = folder_vae("tiny-flux")
    path = tmp_path / "diffusion_pytorch_model.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    vae = load_vae_file(path, dtype=torch.bfloat16, norm_num_groups=TINY_GROUPS)
    assert inspect_vae_file(path, TINY_GROUPS).layout == "diffusers"
    assert next(vae.parameters()).dtype == torch.bfloat16
    _same_weights(vae, ref.to(torch.bfloat16))


def test_bad_vae_files_fail_clearly(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        inspect_vae_file(tmp_path / "missing.safetensors")
    not_vae = tmp_path / "clip_l.safetensors"
    save_file({"text_model.embeddings.token_embedding.weight": torch.zeros(4, 4)}, not_vae)
    with pytest.raises(ConfigError, match="holds no VAE"):
        inspect_vae_file(not_vae)
    pickled = tmp_path / "vae.pt"
    torch.save({}, pickled)
    with pytest.raises(ConfigError, match="not a .safetensors file"):
        inspect_vae_file(pickled)
    ref = folder_vae("tiny-flux")
    partial = {k: v for k, v in to_ldm(ref.state_dict(), 4).items() if not k.startswith("decoder.up.0.")}
    save_file(partial, tmp_path / "partial.safetensors")
    with pytest.raises(ConfigError, match="lacks .* VAE tensor"):
        load_vae_file(tmp_path / "partial.safetensors", norm_num_groups=TINY_GROUPS)
