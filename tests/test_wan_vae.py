"""Parallel decode of Wan video latents: exact against one device (diffusers' AutoencoderKLWan.decode) and
against ComfyUI's own Wan VAE decode (stored by tests/data/make_comfy_wan_reference.py from ComfyUI's
``comfy.ldm.wan.vae`` / ``vae2_2`` modules), with the VAE read from original-layout files by our loader."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.errors import ConfigError
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.vae.bands import plan_band_rows
from parallel_runtime.vae.decode import decode_to_image_tensor
from parallel_runtime.vae.file import inspect_vae_file, load_vae_file
from tests.dist_jobs import wan_jobs

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from make_comfy_wan_reference import vae_weight  # noqa: E402 (the reference's weight recipe, pure torch)
from wan_tiny_weights import hashed_uniform  # noqa: E402

REF = json.loads((DATA / "comfy_wan_vae_reference.json").read_text())
TOL = 2e-5  # IMAGE values in 0..1


@pytest.fixture(scope="module")
def vae_files(tmp_path_factory) -> dict[str, str]:
    """ComfyUI-layout Wan 2.1 / 2.2 VAE files with the reference's tensors (names and shapes from ComfyUI)."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("wan-vae")
    files = {}
    for name in ("vae21", "vae22"):
        state = {k: vae_weight(k, tuple(s)) for k, s in REF[name]["tensors"].items()}
        files[name] = str(folder / f"{name}.safetensors")
        save_file(state, files[name])
    return files


def latent_of(name: str) -> torch.Tensor:
    spec = REF[name]["latent"]
    return hashed_uniform(spec["name"], tuple(spec["shape"]), spec["scale"])


def comfy_image(name: str) -> torch.Tensor:
    image = REF[name]["image"]
    return torch.tensor(image["data"]).reshape(image["shape"])


@pytest.mark.parametrize("name", ["vae21", "vae22"])
def test_wan_vae_file_decodes_as_comfyui(vae_files, name):
    info = inspect_vae_file(vae_files[name])
    assert info.layout == "wan" and info.latent_channels == (16 if name == "vae21" else 48)
    vae = load_vae_file(vae_files[name])
    z = latent_of(name)
    image = decode_to_image_tensor(vae, z, ParallelMesh.single(), None)
    frames = 1 + 4 * (z.shape[2] - 1)
    assert image.shape == (
        frames,
        z.shape[3] * info.config["scale_factor_spatial"],
        z.shape[4] * info.config["scale_factor_spatial"],
        3,
    )
    torch.testing.assert_close(image, comfy_image(name), atol=TOL, rtol=0)
    with torch.no_grad():  # diffusers' own decode of the same module
        own = vae.decode(z).sample
    torch.testing.assert_close(
        image, ((own + 1) / 2).clamp(0, 1).movedim(1, -1).reshape(image.shape), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("name", ["vae21", "vae22"])
def test_parallel_wan_decode_equals_comfyui_and_one_device(cpu_pool, vae_files, name, ranks):
    """Rows of every frame split over the ranks, halos per causal conv, the causal cache per band."""
    z = latent_of(name)
    if name == "vae21":  # a taller latent with 3 frames: bands of 2 rows on 2 ranks, 1-2 rows on 4
        z = torch.randn(1, 16, 3, 6, 4, generator=torch.Generator().manual_seed(ranks))
    vae = load_vae_file(vae_files[name])
    ref = decode_to_image_tensor(vae, z, ParallelMesh.single(), None)
    outs = (
        cpu_pool(ParallelConfig(ulysses=ranks))
        .submit(wan_jobs.decode_video, vae_files[name], z, min_band_rows=1, result_rank="all")
        .result(timeout=600)
    )
    image = outs[0]["image"]
    torch.testing.assert_close(image, ref, atol=TOL, rtol=0)
    if name == "vae22":
        torch.testing.assert_close(image, comfy_image(name), atol=TOL, rtol=0)
    rows = plan_band_rows(z.shape[3], ranks, 1)
    assert all(out["image"] is None for out in outs[1:])
    for out, r in zip(outs, rows):  # every active rank swapped halos; ranks without rows only gathered K/V
        assert (out["sent"].get("wan_vae_halo", 0) > 0) == (r > 0)
        assert out["sent"].get("wan_vae_kv", 0) > 0 or r == 0


def test_wan_vae_refuses_other_latents(vae_files):
    vae = load_vae_file(vae_files["vae21"])
    with pytest.raises(ConfigError, match="16 channels"):
        decode_to_image_tensor(vae, torch.zeros(1, 48, 2, 2, 2), ParallelMesh.single(), None)
