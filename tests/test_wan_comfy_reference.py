"""Wan against ComfyUI's own code: the outputs stored by tests/data/make_comfy_wan_reference.py
(ComfyUI 0.3.64 loading tiny ORIGINAL-layout Wan files and running KSampler / KSamplerAdvanced on
EmptyHunyuanLatentVideo, WanImageToVideo and Wan22ImageToVideoLatent inputs) equal our engine on the same
files, loaded through our single-file loader, to 1e-4 relative (L2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.wan.conditioning import WanImageInputs
from parallel_runtime.models.single_file import load_single_file_components
from parallel_runtime.parallel.mesh import ParallelMesh

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from wan_tiny_weights import TinyWan, hashed_uniform, state_digest, tiny_wan_state_dict  # noqa: E402

REF = json.loads((DATA / "comfy_wan_reference.json").read_text())
TOLERANCE = 1e-4


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def generated(recipe: dict) -> torch.Tensor:
    t = hashed_uniform(recipe["name"], tuple(recipe["shape"]), recipe["scale"], recipe.get("offset", 0.0))
    assert state_digest({"t": t}) == recipe["digest"], f"{recipe['name']} is not what the reference was made from"
    return t


@pytest.fixture(scope="session")
def wan_file(tmp_path_factory):
    """The original-layout file of a reference model (written once per session), checked by digest."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("comfy-wan")
    made: dict[str, Path] = {}

    def get(info: dict) -> Path:
        if info["salt"] not in made:
            state = tiny_wan_state_dict(TinyWan(**info["config"]), info["salt"])
            assert state_digest(state) == info["digest"], "tiny Wan weights differ from the reference's"
            path = folder / f"wan_{info['salt']}.safetensors"
            save_file({f"model.diffusion_model.{k}": v for k, v in state.items()}, str(path))  # a ComfyUI checkpoint
            made[info["salt"]] = path
        return made[info["salt"]]

    return get


def run(path: Path, case: dict, latent: torch.Tensor, settings: SamplingSettings, **kwargs) -> torch.Tensor:
    comps = load_single_file_components(path, "cpu", torch.float32)
    adapter = comps.adapter()
    ms = model_sampling_for(adapter)
    assert ms.shift == case.get("shift", 8.0)
    pos, neg = kwargs.pop("conds")
    return denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, settings, **kwargs)


def close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= TOLERANCE, f"relative L2 error {err:.2e} against ComfyUI"


def conds(case: dict, **extras) -> tuple[Conditioning, Conditioning]:
    inputs = WanImageInputs(**extras) if extras else None
    return Conditioning(generated(case["positive"]), extras=inputs), Conditioning(
        generated(case["negative"]), extras=inputs
    )


@pytest.mark.parametrize("run_index", [0, 1], ids=["euler-cfg5", "euler_ancestral-cfg1"])
@pytest.mark.parametrize("name", ["t2v", "t2v_padded"], ids=["whole-tokens", "9x5-latent-padded"])
def test_text_to_video_equals_comfyui_ksampler(wan_file, run_index, name):
    """EmptyHunyuanLatentVideo + KSampler; a 9x5 latent is not whole 2x2 tokens: ComfyUI's WanModel pads it
    circularly and crops the prediction back, and so do we."""
    case = REF[name]
    r = case["runs"][run_index]
    settings = SamplingSettings(
        seed=r["seed"], steps=r["steps"], cfg=r["cfg"], sampler=r["sampler"], scheduler=r["scheduler"]
    )
    out = run(wan_file(case["model"]), case, tensor(case["latent"]), settings, conds=conds(case))
    close(out, tensor(r["output"]))


def test_two_experts_two_passes_equal_comfyui_ksampler_advanced(wan_file):
    """Wan 2.2 A14B's graph: high-noise model steps 0-2 (leftover noise kept), low-noise model 2-end."""
    case = REF["two_pass"]
    common = dict(seed=case["seed"], steps=case["steps"], cfg=case["cfg"], sampler="euler", scheduler="simple")
    first, second = case["first"], case["second"]
    mid = run(
        wan_file(case["high"]),
        case,
        tensor(case["latent"]),
        SamplingSettings(
            **common,
            add_noise=first["add_noise"] == "enable",
            start_at_step=first["start_at_step"],
            end_at_step=first["end_at_step"],
            return_with_leftover_noise=first["return_with_leftover_noise"] == "enable",
        ),
        conds=conds(case),
    )
    close(mid, tensor(case["middle"]))
    out = run(
        wan_file(case["low"]),
        case,
        mid,
        SamplingSettings(
            **common,
            add_noise=second["add_noise"] == "enable",
            start_at_step=second["start_at_step"],
            end_at_step=second["end_at_step"],
            return_with_leftover_noise=second["return_with_leftover_noise"] == "enable",
        ),
        conds=conds(case),
    )
    close(out, tensor(case["output"]))


@pytest.mark.parametrize(
    "name", ["i2v_clip", "i2v", "i2v_padded"], ids=["wan2.1-i2v-clip-vision", "wan2.2-i2v-a14b", "9x5-latent-padded"]
)
def test_image_to_video_equals_comfyui_wan_image_to_video(wan_file, name):
    """WanImageToVideo's CONDITIONING (start-image latent + mask, and CLIP-vision states for 2.1); at a size
    that is not whole tokens the start-image channels are padded with the latent."""
    case = REF[name]
    extras = {"concat_image": tensor(case["concat_latent_image"]), "concat_mask": tensor(case["concat_mask"])}
    if case["clip_vision"] is not None:
        extras["image_embeds"] = generated(case["clip_vision"])
    settings = SamplingSettings(
        seed=case["seed"], steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], scheduler=case["scheduler"]
    )
    out = run(wan_file(case["model"]), case, tensor(case["latent"]), settings, conds=conds(case, **extras))
    close(out, tensor(case["output"]))


@pytest.mark.parametrize("name", ["ti2v", "ti2v_padded"], ids=["whole-tokens", "5x3-latent-padded"])
def test_ti2v_first_frame_latent_equals_comfyui_wan22_image_to_video_latent(wan_file, name):
    """Wan 2.2 TI2V-5B: the LATENT's noise mask keeps the first frame and sets per-frame timesteps (at a
    5x3 latent: per-frame time over the padded tokens, the mask's mean over the latent's own pixels)."""
    case = REF[name]
    settings = SamplingSettings(
        seed=case["seed"], steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], scheduler=case["scheduler"]
    )
    latent = tensor(case["latent"])
    out = run(wan_file(case["model"]), case, latent, settings, conds=conds(case), noise_mask=tensor(case["noise_mask"]))
    close(out, tensor(case["output"]))
    torch.testing.assert_close(out[:, :, :1], latent[:, :, :1], rtol=1e-5, atol=1e-5)  # the kept first frame
