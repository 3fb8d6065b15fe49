"""HunyuanVideo LoRA files patch what ComfyUI's LoraLoaderModelOnly patches, weight for weight, and sample as
its KSampler does on Ulysses 2 and PipeFusion 2.

Oracle: tests/data/comfy_hunyuan_video_lora_reference.json, written by ComfyUI 0.3.64's own loader, LoRA code and
KSampler (tests/data/make_comfy_hunyuan_video_lora_reference.py) on the tiny Tencent-layout file and the LoRA
files of tests/data/hunyuan_video_lora_files.py: ComfyUI's / musubi-tuner's ``diffusion_model.<Tencent name>``,
diffusion-pipe's ``transformer.<Tencent name>`` and kohya's ``lora_unet_<ComfyUI's module name>`` (img_mod.lin,
img_mlp.0, modulation.lin...), alone and stacked with a negative strength; fused q/k/v and linear1 rows routed
to diffusers' separate projections.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import lora_files as lf
import pytest
import torch
from safetensors.torch import save_file
from test_family_hunyuan_video_comfy import conditioning, tensor

from parallel_runtime.denoise import SamplingSettings
from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.models.lora.files import lora_file_id
from parallel_runtime.models.lora.keymap import TRANSFORMER
from parallel_runtime.models.lora.model_keys import model_keys
from parallel_runtime.models.lora.patcher import LoraPatcher, StackEntry
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from hunyuan_video_lora_files import CASES, hunyuan_lora_files  # noqa: E402
from hunyuan_video_tiny_weights import TinyHunyuanVideo, tiny_hunyuan_video_state_dict  # noqa: E402
from wan_tiny_weights import state_digest  # noqa: E402

REF = json.loads((DATA / "comfy_hunyuan_video_lora_reference.json").read_text())
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hunyuan-lora")
    info = REF["model"]
    state = tiny_hunyuan_video_state_dict(TinyHunyuanVideo(**info["config"]), info["salt"])
    assert state_digest(state) == info["digest"], "tiny HunyuanVideo weights differ from the reference's"
    save_file(state, str(folder / "tiny_hunyuan_video.safetensors"))
    out = {"model": folder / "tiny_hunyuan_video.safetensors"}
    for stem, sd in hunyuan_lora_files().items():
        out[stem] = folder / f"{stem}.safetensors"
        save_file({k: v.contiguous() for k, v in sd.items()}, str(out[stem]))
    return out


def stack(files, case: str) -> list[StackEntry]:
    return [StackEntry(lora_file_id(files[stem]), strength, 0.0) for stem, strength in CASES[case]]


def original_tensor(model, keys, name: str) -> torch.Tensor:
    """A Tencent-layout tensor put together from the diffusers model's rows."""
    route = keys.routing.routes[name]
    params = dict(model.named_parameters())
    first = params[route.pieces[0].param]
    out = torch.empty((route.rows, *first.shape[1:]), dtype=first.dtype)
    for piece in route.pieces:
        out[piece.index()] = params[piece.param].detach()
    return out


def assert_matches(got: torch.Tensor, expected: dict, label: str) -> None:
    """The reference's checksums (sum, a hashed weighting, sum of squares) and first values."""
    assert list(got.shape) == expected["shape"], label
    flat = got.detach().double().flatten()
    weights = lf.uniform("checksum", (flat.numel(),)).double()
    values = {"sum": flat.sum(), "wsum": (flat * weights).sum(), "sumsq": (flat * flat).sum()}
    scale = math.sqrt(expected["sumsq"] * got.numel())
    for key, value in values.items():
        assert abs(float(value) - expected[key]) <= 1e-6 * scale, f"{label}: {key} {float(value)} != {expected[key]}"
    torch.testing.assert_close(flat[:8], torch.tensor(expected["head"], dtype=torch.float64), rtol=0, atol=1e-6)


def test_comfyuis_names_of_the_modules():
    """The family's table of ComfyUI's module names (kohya files name those) equals what ComfyUI's own loader calls
    every weight of the tiny file."""
    from parallel_runtime.models.families.hunyuan_video.lora_names import comfy_name

    assert len(REF["comfy_names"]) > 30
    assert {t: comfy_name(t) for t in REF["comfy_names"]} == REF["comfy_names"]


@pytest.mark.parametrize("case", list(CASES))
def test_patched_weights_equal_comfyui(files, case):
    path = files["model"]
    model, family, _ = load_single_file_transformer(path, "cpu", torch.float32)
    header = {k: tuple(v.shape) for k, v in tiny_hunyuan_video_state_dict(TinyHunyuanVideo(), "lora").items()}
    keys = model_keys(family, model, inspect_single_file(path).config, original=header)
    pristine = {name: original_tensor(model, keys, name) for name in keys.routing.routes if name in keys.original}
    LoraPatcher(keys, {TRANSFORMER: model}).apply(stack(files, case), [TRANSFORMER])
    expected = REF["patched"][case]
    assert expected["not_loaded"] == []
    changed = {name for name, before in pristine.items() if not torch.equal(original_tensor(model, keys, name), before)}
    assert changed == set(expected["weights"]), f"patched {sorted(changed ^ set(expected['weights']))} unlike ComfyUI"
    for name, stats in expected["weights"].items():
        assert_matches(original_tensor(model, keys, name), stats, f"{case}/{name}")


def inputs():
    s = REF["sampling"]
    settings = SamplingSettings(seed=s["seed"], steps=s["steps"], cfg=s["cfg"], sampler=s["sampler"],
                                scheduler=s["scheduler"])  # fmt: skip
    e = s["empty_latent"]
    latent = torch.zeros(1, 16, (e["length"] - 1) // 4 + 1, e["height"] // 8, e["width"] // 8)
    return (CondEntry(conditioning(s["positive"])),), conditioning(s["negative"]), latent, settings


@pytest.mark.parametrize("layout", ["ulysses2", "pp2"])
def test_stacked_loras_sample_as_comfyui_on_every_rank(cpu_pool, files, layout):
    """The stack patched on every rank (PipeFusion: each stage its own blocks' rows) equals KSampler's output; the
    same warm pool without LoRA gives ComfyUI's output without it (strength changes never reload)."""
    config = ParallelConfig(ulysses=2) if layout == "ulysses2" else ParallelConfig(pp=2)
    pool = cpu_pool(config)
    pool.submit(load_model, str(files["model"]), "fp32", "sdpa").result(300)
    positive, negative, latent, settings = inputs()
    extra = {"patches": 2, "warmup": settings.steps} if layout == "pp2" else {}
    outs = {}
    for case, loras in (("stack", tuple(stack(files, "stack"))), ("none", ())):
        outs[case] = pool.submit(generate, positive, negative, latent, settings, loras=loras, **extra).result(600)
        expected = tensor(REF["sampling"]["outputs"][case])
        err = float((outs[case] - expected).norm() / expected.norm())
        assert err <= TOLERANCE, f"{case}: relative L2 error {err:.2e} against ComfyUI"
    assert float((outs["stack"] - outs["none"]).norm() / outs["none"].norm()) > 100 * TOLERANCE
