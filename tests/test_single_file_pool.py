"""A single-file model on the worker pool: the same latents and decode as the diffusers folder (Ulysses,
PipeFusion), a VAE from its own file, and clear errors for what a transformer-only file lacks."""

from __future__ import annotations

import pytest
import torch
from ldm_vae_layout import to_ldm  # tests/ helpers
from original_layout_files import PREFIX, TINY, write_original
from safetensors.torch import save_file

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import WorkerError
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode, encode_text, generate


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_pool_generate_from_single_file_equals_folder(cpu_pool, tmp_path, family):
    """load_model on a single file, then generate with conditioning encoded in-process from the tiny
    pipeline's text encoders: the same latent as the diffusers folder gives on the same pool."""
    folder = ensure_tiny_model(TINY[family])
    comps = load_pipeline_components(folder, "cpu", torch.float32, parts=("transformer", "text"))
    pos, neg = encode_prompts(comps, family, "a red house by a lake", "blurry")
    path = write_original(comps.transformer.state_dict(), family, tmp_path / f"{family}.safetensors", PREFIX)
    cfg = 4.0 if family == "sd3" else 1.0
    settings = SamplingSettings(seed=3, steps=2, cfg=cfg, guidance=3.5)
    latent = torch.zeros(1, 16, 8, 12)
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(folder), "fp32", "sdpa").result(300)
    expected = pool.submit(generate, pos, neg if cfg > 1 else None, latent, settings).result(300)
    info = pool.submit(load_model, str(path), "fp32", "sdpa").result(300)
    assert info["family"] == family and info["embed_dim"] == comps.transformer_config["joint_attention_dim"]
    got = pool.submit(generate, pos, neg if cfg > 1 else None, latent, settings).result(300)
    assert (got - expected).abs().max().item() <= 1e-6
    with pytest.raises(WorkerError, match="CLIP Text Encode"):
        pool.submit(encode_text, ["a house"]).result(60)
    with pytest.raises(WorkerError, match="VAE Decode"):
        pool.submit(decode, latent).result(60)

    # With the VAE from its own file (original LDM names): sampling is unchanged (the model keeps
    # its latent scale and shift) and the parallel decode equals the folder model's.
    pool.submit(load_model, str(folder), "fp32", "sdpa").result(300)
    z = torch.randn(1, 16, 8, 12, generator=torch.Generator().manual_seed(1))
    folder_image = pool.submit(decode, z).result(300)
    vae = load_pipeline_components(folder, "cpu", torch.float32, parts=("vae",)).vae
    vae_file = tmp_path / "ae.safetensors"
    save_file(to_ldm(vae.state_dict(), len(vae.config.block_out_channels)), str(vae_file))
    pool.submit(load_model, str(path), "fp32", "sdpa", vae_path=str(vae_file), vae_norm_groups=4).result(300)
    got = pool.submit(generate, pos, neg if cfg > 1 else None, latent, settings).result(300)
    assert (got - expected).abs().max().item() <= 1e-6
    torch.testing.assert_close(pool.submit(decode, z).result(300), folder_image, rtol=0, atol=1e-6)


def test_pool_decodes_with_a_vae_file_instead_of_the_models_own(cpu_pool, tmp_path):
    """The loader's vae input overrides a folder model's VAE too; a VAE of another latent width is refused."""
    folder = ensure_tiny_model("tiny-flux")
    vae = load_pipeline_components(folder, "cpu", torch.float32, parts=("vae",)).vae
    state = {k: v.clone() for k, v in vae.state_dict().items()}
    state["decoder.conv_out.bias"] += 0.25  # a recognisably different VAE
    vae.load_state_dict(state)
    vae_file = tmp_path / "other_ae.safetensors"
    save_file(to_ldm(state, len(vae.config.block_out_channels)), str(vae_file))
    pool = cpu_pool(ParallelConfig(ulysses=2))
    z = torch.randn(1, 16, 16, 8, generator=torch.Generator().manual_seed(2))
    pool.submit(load_model, str(folder), "fp32", "sdpa").result(300)
    own = pool.submit(decode, z).result(300)
    pool.submit(load_model, str(folder), "fp32", "sdpa", vae_path=str(vae_file), vae_norm_groups=4).result(300)
    other = pool.submit(decode, z).result(300)
    with torch.no_grad():
        expected = (vae.decode(z).sample / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)
    torch.testing.assert_close(other, expected, rtol=0, atol=1e-5)
    assert (other - own).abs().max().item() > 0.01

    pixart_vae = load_pipeline_components(ensure_tiny_model("tiny-pixart"), "cpu", torch.float32, parts=("vae",)).vae
    four_channel = tmp_path / "sdxl_vae.safetensors"
    save_file(to_ldm(pixart_vae.state_dict(), 4), str(four_channel))
    with pytest.raises(WorkerError, match="4 latent channels but this flux model makes 16"):
        pool.submit(load_model, str(folder), "fp32", "sdpa", vae_path=str(four_channel), vae_norm_groups=4).result(300)


def test_pool_pipefusion_from_single_file_equals_folder(cpu_pool, tmp_path):
    """pp=2 on a Flux transformer file (no diffusers folder): the same latent as the folder model
    under the same PipeFusion layout, and each rank holds only its stage."""
    folder = ensure_tiny_model("tiny-flux")
    comps = load_pipeline_components(folder, "cpu", torch.float32, parts=("transformer", "text"))
    pos, _ = encode_prompts(comps, "flux", "a lighthouse at dusk", "")
    path = write_original(comps.transformer.state_dict(), "flux", tmp_path / "flux1.safetensors", PREFIX)
    settings = SamplingSettings(seed=5, steps=3, cfg=1.0, guidance=3.5)
    latent = torch.zeros(1, 16, 8, 8)
    pool = cpu_pool(ParallelConfig(pp=2))
    pool.submit(load_model, str(folder), "fp32", "sdpa").result(300)
    expected = pool.submit(generate, pos, None, latent, settings, False, 2).result(300)
    info = pool.submit(load_model, str(path), "fp32", "sdpa").result(300)
    ranks = info["pipefusion"]["ranks"]
    assert all(0 < r["param_bytes"] < r["total_transformer_bytes"] for r in ranks)
    got = pool.submit(generate, pos, None, latent, settings, False, 2).result(300)
    assert (got - expected).abs().max().item() <= 1e-6
