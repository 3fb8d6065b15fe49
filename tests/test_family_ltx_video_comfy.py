"""LTX-Video 0.9 against ComfyUI's own code: the outputs stored by tests/data/make_comfy_ltx_video_reference.py
(ComfyUI 0.3.64 loading a tiny Lightricks-layout file and running KSampler on EmptyLTXVLatentVideo, with and
without LTXVConditioning's frame rate, CONDITIONING tensors with attention masks given directly; SamplerCustom on
LTXVScheduler's SIGMAS) equal our engine
on the same file, loaded through our single-file loader, to 1e-4 relative (L2): on one device and on Ulysses 2,
CFG 2 and PipeFusion 2 in real worker processes; the model sampling and latent format are ComfyUI's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.ltx_video.conditioning import LTXFrameRate
from parallel_runtime.models.families.ltx_video.latent import LTXV
from parallel_runtime.models.single_file import load_single_file_components
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from ltx_video_tiny_weights import TinyLTXVideo, tiny_ltx_video_state_dict  # noqa: E402
from wan_tiny_weights import hashed_uniform, state_digest  # noqa: E402

REF = json.loads((DATA / "comfy_ltx_video_reference.json").read_text())
TOLERANCE = 1e-4
PREFIX = "model.diffusion_model."
LAYOUTS = {"ulysses2": ParallelConfig(ulysses=2), "cfg2": ParallelConfig(cfg=2), "pp2": ParallelConfig(pp=2)}


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def conditioning(recipe: dict, frame_rate: float | None) -> Conditioning:
    """The CONDITIONING the reference gave ComfyUI: T5 states, their mask, LTXVConditioning's frame rate."""
    t5 = recipe["t5"]
    states = hashed_uniform(t5["name"], tuple(t5["shape"]), t5["scale"])
    assert state_digest({"t": states}) == t5["digest"], "the T5 states are not what the reference was made from"
    mask = torch.zeros(states.shape[:2])
    mask[:, : recipe["kept"]] = 1
    extras = None if frame_rate is None else LTXFrameRate(torch.tensor([frame_rate]))
    return Conditioning(states, None, mask, extras)


def inputs(index: int):
    case, run = REF["t2v"], REF["t2v"]["runs"][index]
    settings = SamplingSettings(
        seed=run["seed"], steps=run["steps"], cfg=run["cfg"], sampler=run["sampler"], scheduler=run["scheduler"]
    )
    pos, neg = (conditioning(case[side], run["frame_rate"]) for side in ("positive", "negative"))
    return pos, neg, tensor(case["latent"]), settings, tensor(run["output"])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from safetensors.torch import save_file

    info = REF["t2v"]["model"]
    state = tiny_ltx_video_state_dict(TinyLTXVideo(**info["config"]), info["salt"])
    assert state_digest(state) == info["digest"], "tiny LTX-Video weights differ from the reference's"
    path = tmp_path_factory.mktemp("comfy-ltx") / "ltx_video_tiny.safetensors"
    save_file({PREFIX + k: v for k, v in state.items()}, str(path))
    return path


def close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= TOLERANCE, f"relative L2 error {err:.2e} against ComfyUI"


@pytest.mark.parametrize("index", [0, 1], ids=["euler-25fps", "euler_ancestral-ltxvconditioning-24fps"])
def test_text_to_video_equals_comfyui_ksampler(checkpoint, index):
    comps = load_single_file_components(checkpoint, "cpu", torch.float32)
    adapter = comps.adapter()
    ms = model_sampling_for(adapter)
    model = REF["t2v"]["model"]
    assert (adapter.plan.model_sampling.kind, ms.shift) == ("flux_flow", model["comfy_shift"])
    assert adapter.plan.latent_format == LTXV and LTXV.scale == REF["latent_format"]["scale_factor"]
    assert LTXV.channels == REF["latent_format"]["channels"]
    pos, neg, latent, settings, expected = inputs(index)
    close(denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, settings), expected)


def test_ltxv_scheduler_sigmas_equal_comfyui_sampler_custom(checkpoint):
    """LTXVScheduler's SIGMAS (a SIGMAS input of the Parallel Sampler) sample as ComfyUI's SamplerCustom does."""
    case, run = REF["t2v"], REF["t2v"]["ltxv_scheduler"]
    adapter = load_single_file_components(checkpoint, "cpu", torch.float32).adapter()
    settings = SamplingSettings(seed=run["seed"], cfg=run["cfg"], sampler=run["sampler"], sigmas=tensor(run["sigmas"]))
    pos, neg = (conditioning(case[side], run["frame_rate"]) for side in ("positive", "negative"))
    out = denoise_latent(adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, tensor(case["latent"]),
                         settings)  # fmt: skip
    close(out, tensor(run["output"]))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_equal_comfyui_ksampler(cpu_pool, checkpoint, layout):
    pool = cpu_pool(LAYOUTS[layout])
    pool.submit(load_model, str(checkpoint), "fp32", "sdpa").result(300)
    pos, neg, latent, settings, expected = inputs(1)
    kwargs = {"patches": 2, "warmup": settings.steps} if layout == "pp2" else {}
    close(pool.submit(generate, pos, neg, latent, settings, **kwargs).result(600), expected)
