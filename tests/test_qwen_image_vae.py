"""Parallel decode of Qwen-Image latents: its VAE (diffusers ``AutoencoderKLQwenImage``) is Wan 2.1's decoder
under other class names, decoded in row bands exactly like the Wan VAE (vae.wan); equal to diffusers' own
``vae.decode`` on one device, with halo rows and mid-block K/V really exchanged."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny.big import qwen_image_vae
from parallel_runtime.errors import ConfigError
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.vae.bands import plan_band_rows
from parallel_runtime.vae.decode import decode_to_image_tensor
from tests.dist_jobs import vae_jobs

TOL = 2e-5  # IMAGE values in 0..1


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("qwen-image-vae")
    qwen_image_vae().save_pretrained(folder)
    return str(folder)


def diffusers_image(vae, z: torch.Tensor) -> torch.Tensor:
    """diffusers' own single-device decode of a Qwen-Image latent [B, 16, h, w] as ComfyUI IMAGE [B, H, W, 3]."""
    with torch.no_grad():
        sample = vae.decode(z.unsqueeze(2)).sample[:, :, 0]
    return (sample / 2 + 0.5).clamp(0, 1).movedim(1, -1)


@pytest.mark.parametrize("ranks", [2, 4])
def test_parallel_qwen_image_decode_equals_one_device(cpu_pool, vae_dir, ranks):
    """Rows split over the ranks (2 ranks: 4 + 3 rows of a 7-row latent; 4: 2, 2, 2, 1), batch of 2."""
    from diffusers import AutoencoderKLQwenImage

    vae = AutoencoderKLQwenImage.from_pretrained(vae_dir, torch_dtype=torch.float32).eval()
    z = torch.randn(2, 16, 7, 5, generator=torch.Generator().manual_seed(ranks))
    expected = diffusers_image(vae, z)
    assert expected.shape == (2, 56, 40, 3) and expected.std() > 0.05
    torch.testing.assert_close(decode_to_image_tensor(vae, z, ParallelMesh.single(), None), expected, atol=TOL, rtol=0)
    outs = (
        cpu_pool(ParallelConfig(ulysses=ranks))
        .submit(vae_jobs.decode_qwen_image, vae_dir, z, min_band_rows=1, result_rank="all")
        .result(timeout=600)
    )
    torch.testing.assert_close(outs[0]["image"], expected, atol=TOL, rtol=0)
    assert all(out["image"] is None for out in outs[1:])
    for out, rows in zip(outs, plan_band_rows(z.shape[2], ranks, 1)):  # each rank decoded only its band
        assert rows > 0 and out["sent"].get("wan_vae_halo", 0) > 0 and out["sent"].get("wan_vae_kv", 0) > 0


def test_qwen_image_vae_refuses_other_latents(vae_dir):
    from diffusers import AutoencoderKLQwenImage

    vae = AutoencoderKLQwenImage.from_pretrained(vae_dir, torch_dtype=torch.float32).eval()
    with pytest.raises(ConfigError, match="16 channels"):
        decode_to_image_tensor(vae, torch.zeros(1, 48, 4, 4), ParallelMesh.single(), None)
