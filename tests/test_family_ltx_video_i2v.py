"""LTX-Video image-to-video as ComfyUI 0.3.64 samples it: LTXVImgToVideo's LATENT (the start image's latent in the
first frame, a noise mask of 1 - strength there) and KSampler, stored by tests/data/make_comfy_ltx_video_i2v_reference.py
on the tiny file, equal our engine to 1e-4 relative (L2) on one device and on Ulysses 2, CFG 2 and PipeFusion 2 in
worker processes (a timestep per token, split with the tokens; the kept frame blended back clean)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.ltx_video.conditioning import LTXFrameRate
from parallel_runtime.models.single_file import load_single_file_components
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service import input_checks
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from ltx_video_tiny_weights import TinyLTXVideo, tiny_ltx_video_state_dict  # noqa: E402
from wan_tiny_weights import hashed_uniform, state_digest  # noqa: E402

REF = json.loads((DATA / "comfy_ltx_video_i2v_reference.json").read_text())
TOLERANCE = 1e-4
PREFIX = "model.diffusion_model."
LAYOUTS = {"ulysses2": ParallelConfig(ulysses=2), "cfg2": ParallelConfig(cfg=2), "pp2": ParallelConfig(pp=2)}


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def conditioning(recipe: dict) -> Conditioning:
    t5 = recipe["t5"]
    states = hashed_uniform(t5["name"], tuple(t5["shape"]), t5["scale"])
    assert state_digest({"t": states}) == t5["digest"], "the T5 states are not what the reference was made from"
    mask = torch.zeros(states.shape[:2])
    mask[:, : recipe["kept"]] = 1
    return Conditioning(states, None, mask, LTXFrameRate(torch.tensor([REF["size"]["frame_rate"]])))


def inputs(index: int):
    run = REF["runs"][index]
    settings = SamplingSettings(
        seed=run["seed"], steps=run["steps"], cfg=run["cfg"], sampler=run["sampler"], scheduler=run["scheduler"]
    )
    pos, neg = conditioning(REF["positive"]), conditioning(REF["negative"])
    return pos, neg, tensor(run["latent"]), tensor(run["noise_mask"]), settings, tensor(run["output"])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from safetensors.torch import save_file

    info = REF["model"]
    state = tiny_ltx_video_state_dict(TinyLTXVideo(**info["config"]), info["salt"])
    assert state_digest(state) == info["digest"], "tiny LTX-Video weights differ from the reference's"
    path = tmp_path_factory.mktemp("comfy-ltx-i2v") / "ltx_video_tiny.safetensors"
    save_file({PREFIX + k: v for k, v in state.items()}, str(path))
    return path


def close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= TOLERANCE, f"relative L2 error {err:.2e} against ComfyUI"


@pytest.mark.parametrize("index", [0, 1], ids=["strength-1-euler", "strength-0.6-euler_ancestral"])
def test_image_to_video_equals_comfyui_ltxv_img_to_video(checkpoint, index):
    adapter = load_single_file_components(checkpoint, "cpu", torch.float32).adapter()
    pos, neg, latent, mask, settings, expected = inputs(index)
    input_checks.noise_mask(mask, tuple(latent.shape))  # what the host checks before the workers run
    out = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, latent, settings, noise_mask=mask
    )
    close(out, expected)
    if index == 0:  # strength 1: the start frame is kept exactly
        torch.testing.assert_close(out[:, :, :1], latent[:, :, :1], rtol=0, atol=1e-6)


def test_a_per_frame_mask_of_another_length_is_refused():
    _, _, latent, mask, _, _ = inputs(0)
    with pytest.raises(ConfigError, match="noise mask"):
        input_checks.noise_mask(mask[:, :, :2], tuple(latent.shape))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_equal_comfyui_ltxv_img_to_video(cpu_pool, checkpoint, layout):
    pool = cpu_pool(LAYOUTS[layout])
    pool.submit(load_model, str(checkpoint), "fp32", "sdpa").result(300)
    pos, neg, latent, mask, settings, expected = inputs(1)
    kwargs = {"patches": 2, "warmup": settings.steps} if layout == "pp2" else {}  # exact: no stale K/V
    close(pool.submit(generate, pos, neg, latent, settings, noise_mask=mask, **kwargs).result(600), expected)
