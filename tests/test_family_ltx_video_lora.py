"""LTX-Video LoRA files patch what ComfyUI's LoraLoaderModelOnly patches: ``diffusion_model.<Lightricks name>``
lora_A / lora_B pairs (attention projections; ``patchify_proj``, which diffusers calls ``proj_in``), kohya's
``lora_unet_*`` with alpha (``adaln_single.linear`` = diffusers' ``time_embed.linear``, the feed-forward output) and a
``.diff`` on a q-norm; KSampler's output on the patched tiny checkpoint equals ComfyUI's to 1e-4 on one rank and on
Ulysses 2. Oracle: the ``lora`` case of tests/data/comfy_ltx_video_reference.json (make_comfy_ltx_video_reference.py:
comfy.sd.load_lora_for_models, what LoraLoaderModelOnly runs, on the same file, then KSampler)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.models.base import Conditioning
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.lora import LoraSpec

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from ltx_video_tiny_weights import TinyLTXVideo, tiny_ltx_video_state_dict  # noqa: E402
from wan_tiny_weights import hashed_uniform, state_digest  # noqa: E402

REF = json.loads((DATA / "comfy_ltx_video_reference.json").read_text())
TOLERANCE = 1e-4
LAYOUTS = {"1rank": ("cpu:1", ParallelConfig()), "ulysses2": ("cpu:2", ParallelConfig(ulysses=2))}


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def conditioning(recipe: dict) -> Conditioning:
    t5 = recipe["t5"]
    states = hashed_uniform(t5["name"], tuple(t5["shape"]), t5["scale"])
    assert state_digest({"t": states}) == t5["digest"]
    mask = torch.zeros(states.shape[:2])
    mask[:, : recipe["kept"]] = 1
    return Conditioning(states, None, mask)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("ltx-lora")
    info = REF["t2v"]["model"]
    state = tiny_ltx_video_state_dict(TinyLTXVideo(**info["config"]), REF["lora"]["model_salt"])
    assert state_digest(state) == info["digest"]
    save_file({"model.diffusion_model." + k: v for k, v in state.items()}, str(folder / "ltx.safetensors"))
    lora = {}
    for r in REF["lora"]["lora"]:
        if "value" in r:
            lora[r["name"]] = torch.tensor(r["value"])
            continue
        lora[r["name"].removeprefix("ltx-lora/")] = t = hashed_uniform(r["name"], tuple(r["shape"]), r["scale"])
        assert state_digest({"t": t}) == r["digest"]
    save_file(lora, str(folder / "ltx_lora.safetensors"))
    return {"model": folder / "ltx.safetensors", "lora": folder / "ltx_lora.safetensors"}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lora_samples_as_comfyui(pool_registry, files, layout):
    devices, config = LAYOUTS[layout]
    case, run = REF["t2v"], REF["lora"]
    model = load_parallel_model(LoadRequest(model=str(files["model"]), devices=devices, layout=config), pool_registry)
    patched = model.with_loras(LoraSpec.of(files["lora"], run["strength"]))
    latent = tensor(case["latent"])
    settings = {k: run[k] for k in ("seed", "steps", "cfg", "scheduler")}
    args = (conditioning(case["positive"]), conditioning(case["negative"]), latent, 96, 64)
    got = patched.sample(*args, sampler_name=run["sampler"], **settings)
    expected = tensor(run["output"])
    err = float((got - expected).norm() / expected.norm())
    assert err <= TOLERANCE, f"relative L2 error {err:.2e} against ComfyUI"
    plain = model.sample(*args, sampler_name=run["sampler"], **settings)
    assert float((plain - expected).norm() / expected.norm()) > 100 * TOLERANCE  # the LoRA changes the video
