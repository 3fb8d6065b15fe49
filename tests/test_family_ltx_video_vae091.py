"""LTX-Video 0.9.1+ VAEs (a timestep-conditioned decoder that adds noise) read from a checkpoint in Lightricks'
layout and decoded band-parallel with a seed.

Oracles: ComfyUI's own decode of the same file (tests/data/make_comfy_ltx_video_vae_reference.py: Load Checkpoint's
loading, VAEDecode right after ``torch.manual_seed(seed)``), diffusers' AutoencoderKLLTXVideo decoding with torch's
global generator seeded the same way (the model internals, the order of the draws), and the single-device decode for
2 worker processes. The 2-rank decode equals the 1-rank one only if every rank draws the noise of the whole picture:
noise drawn per band (or from an unseeded generator) fails it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.ltx_video.vae_bands import DECODE_NOISE_SCALE, DECODE_TIMESTEP
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode
from parallel_runtime.vae.decode import decode_to_image_tensor
from parallel_runtime.vae.file import inspect_vae_file, load_vae_file
from tests.dist_jobs import ltx_vae_jobs

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from ltx_video_tiny_weights import TinyLTXVideo, tiny_ltx_video_state_dict  # noqa: E402
from ltx_video_vae_tiny_weights import VAE_CONFIG, checkpoint_metadata, tiny_ltx_vae_state_dict  # noqa: E402
from wan_tiny_weights import hashed_uniform, state_digest  # noqa: E402

REF = json.loads((DATA / "comfy_ltx_video_vae_reference.json").read_text())
COMFY_TOLERANCE = 1e-5


def _save(path: Path, state: dict, metadata: dict | None = None) -> Path:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata=metadata)
    return path


@pytest.fixture(scope="module")
def vae_state():
    state = tiny_ltx_vae_state_dict()
    assert state_digest({k: v.reshape(-1) for k, v in state.items()}) == REF["vae_digest"]
    return state


@pytest.fixture(scope="module")
def checkpoint(vae_state, tmp_path_factory):
    """The tiny 0.9.1-style checkpoint the reference was made from: transformer, VAE, config metadata."""
    state = {"model.diffusion_model." + k: v for k, v in tiny_ltx_video_state_dict(TinyLTXVideo()).items()}
    state.update({"vae." + k: v for k, v in vae_state.items()})
    return _save(tmp_path_factory.mktemp("ltx-vae") / "ltx-video-tiny-v0.9.1.safetensors", state, checkpoint_metadata())


@pytest.fixture(scope="module")
def vae(checkpoint):
    return load_vae_file(checkpoint)


def latent() -> torch.Tensor:
    recipe = REF["latent"]
    z = hashed_uniform(recipe["name"], tuple(recipe["shape"]), recipe["scale"])
    assert state_digest({"t": z}) == recipe["digest"]
    return z


def strided(image: torch.Tensor) -> torch.Tensor:
    return image.float().flatten()[:: REF["runs"][0]["image"]["stride"]]


def comfy(run: dict) -> torch.Tensor:
    return torch.tensor(run["image"]["data"], dtype=torch.float32)


def test_the_checkpoint_reads_as_comfyui_reads_it(checkpoint, vae_state, tmp_path):
    info = inspect_vae_file(checkpoint)
    assert (info.prefix, info.layout) == ("vae.", "ltx-video")
    config = info.config
    assert config["timestep_conditioning"] and config["decoder_spatial_padding_mode"] == "reflect"
    assert config["decoder_layers_per_block"] == (1, 2, 1, 1)  # pixel side first, as the metadata lists them
    assert config["decoder_inject_noise"] == (True, True, True, False)
    residual = [p["residual"] for name, p in VAE_CONFIG["decoder_blocks"] if name == "compress_all"]
    assert config["upsample_residual"] == tuple(residual) == (True, False, True)  # from the metadata
    # A lone VAE file (VAELoader reads no metadata): ComfyUI's assumption for 0.9.1, residual upsamplers
    lone = inspect_vae_file(_save(tmp_path / "ltx-vae-091.safetensors", vae_state))
    assert lone.prefix == "" and lone.config["upsample_residual"] == (True, True, True)


def test_a_seeded_generator_draws_what_torch_draws_after_manual_seed():
    """ComfyUI's decode draws with torch.randn_like / torch.randn from the global generator; ours from a generator
    seeded alike: the same numbers in the same order (CPU)."""
    x = torch.zeros(1, 128, 2, 2, 2)
    torch.manual_seed(5)
    theirs = [torch.randn_like(x), torch.randn(8, 8)]
    g = torch.Generator().manual_seed(5)
    ours = [torch.randn(x.shape, generator=g, dtype=x.dtype), torch.randn((8, 8), generator=g)]
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours, strict=True))


def test_decode_equals_comfyui_seeded_alike(vae):
    """ComfyUI's VAEDecode right after torch.manual_seed(seed) == our decode with seed, for two seeds; the seeds
    give different videos, as ComfyUI's own decode differs from run to run without a seed."""
    z = latent()
    images = {}
    for run in REF["runs"]:
        image = decode_to_image_tensor(vae, z, ParallelMesh.single(), None, seed=run["seed"])
        assert list(image.shape) == run["image"]["shape"]
        err = (strided(image) - comfy(run)).abs().max().item()
        assert err <= COMFY_TOLERANCE, (run["seed"], err)
        images[run["seed"]] = image
    a, b = images.values()
    assert (a - b).abs().max() > 0.05
    assert REF["unseeded_rerun_max_diff"] > 0.05


def test_decode_equals_diffusers_with_its_global_generator_seeded(vae):
    """diffusers' decoder (the model internals) draws its injected noise from torch's global generator: seeded
    right before the latent's noise, it gives our decode; the noise (injected and the latent's) matters."""
    z = latent()
    seed = 7
    ours = decode_to_image_tensor(vae, z, ParallelMesh.single(), None, seed=seed)
    shape = (1, -1, 1, 1, 1)
    with torch.no_grad():
        torch.manual_seed(seed)
        noised = torch.randn_like(z) * DECODE_NOISE_SCALE + (1.0 - DECODE_NOISE_SCALE) * z
        model_space = noised * vae.latents_std.view(shape) + vae.latents_mean.view(shape)
        video = vae.decode(model_space, torch.tensor([DECODE_TIMESTEP])).sample
        quiet = vae.decode(z * vae.latents_std.view(shape) + vae.latents_mean.view(shape), torch.tensor([0.0]))
    theirs = (video / 2 + 0.5).clamp(0, 1)[0].movedim(0, -1)
    assert (ours - theirs).abs().max() <= 1e-6
    assert (ours - (quiet.sample / 2 + 0.5).clamp(0, 1)[0].movedim(0, -1)).abs().max() > 0.05


def test_two_ranks_decode_as_one(cpu_pool, vae, checkpoint):
    """Bands of 1 latent row each (and one band with the other rank sitting out) on 2 worker processes equal the
    single-device decode with the same seed: the noise of every level is drawn whole and cut per band. The service's
    decode job (what Parallel VAE Decode runs) gives ComfyUI's video for each seed."""
    z = latent()
    seed = REF["runs"][0]["seed"]
    expected = decode_to_image_tensor(vae, z, ParallelMesh.single(), None, seed=seed)
    pool = cpu_pool(ParallelConfig(ulysses=2))
    for min_rows in (1, 2):  # 1: two bands of one latent row; 2: rank 0 alone, rank 1 sits out
        got = pool.submit(ltx_vae_jobs.decode_file, str(checkpoint), z, seed, min_band_rows=min_rows).result(300)
        err = (got - expected).abs().max().item()
        assert err <= 1e-5, (min_rows, err)  # float32 rounding of the band convs (measured 1.1e-6)
    assert (strided(got) - comfy(REF["runs"][0])).abs().max() <= COMFY_TOLERANCE
    # The service's path (Parallel VAE Decode): the checkpoint loaded whole, its own VAE decoding with the seed
    pool.submit(load_model, str(checkpoint), "fp32", "sdpa").result(300)
    for run in REF["runs"]:
        image = pool.submit(decode, z, seed=run["seed"]).result(300)
        assert (strided(image) - comfy(run)).abs().max() <= COMFY_TOLERANCE, run["seed"]


def test_what_is_still_refused(vae, vae_state, tmp_path):
    with pytest.raises(ConfigError, match="only its decoder is loaded"):
        vae.encoder(torch.zeros(1, 3, 1, 32, 32))
    meta = json.loads(checkpoint_metadata()["config"])
    meta["vae"]["spatial_padding_mode"] = "replicate"
    path = _save(
        tmp_path / "replicate.safetensors", {"vae." + k: v for k, v in vae_state.items()}, {"config": json.dumps(meta)}
    )
    with pytest.raises(ConfigError, match="spatial_padding_mode 'replicate'"):
        inspect_vae_file(path)
    broken = {k: v for k, v in vae_state.items() if not k.startswith("decoder.up_blocks.2.")}
    with pytest.raises(ConfigError, match="0.9.1\\+ VAE decoder with an upsampler last"):
        inspect_vae_file(_save(tmp_path / "broken.safetensors", broken))
