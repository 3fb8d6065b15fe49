"""Same picture as ComfyUI's KSampler on a Chroma file: the Parallel Sampler, through its node and through the
API, against ComfyUI 0.3.64's own KSampler (UNETLoader's Chroma, FluxGuidance, EmptyLatentImage) on the same
original-layout file, on one rank, Ulysses 2, CFG 2 and PipeFusion 2 (warmup = steps: exact).

Oracle: tests/data/comfy_chroma_reference.json and comfy_ref_chroma.safetensors, written by
tests/data/make_comfy_chroma_reference.py from the ComfyUI snapshot.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comfy_ksampler_cases import (  # tests/ helper
    LAYOUTS,
    TOLERANCE,
    layout_params,
    node_context,
    sample_both_ways,
    tensor_reader,
)

from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.models.base import Conditioning
from parallel_runtime.service.api import LoadRequest, load_parallel_model

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_chroma_reference.json").read_text(encoding="utf-8"))
FILE = DATA / REFERENCE["models"]["chroma"]["file"]
STEPS = max(case["steps"] for case in REFERENCE["cases"])
# Every case runs on one rank against ComfyUI. Samplers, schedules, guidance and denoise act the same on every
# layout, so a parallel layout runs the cases its model pass splits differently: the default one; on Ulysses the odd
# size (padded tokens); on CFG 2 equal text lengths (the branches batch). PipeFusion takes whole 16 px tokens.
PARALLEL_CASES = {
    "ulysses2": ("chroma_default_euler", "chroma_odd_size"),
    "cfg2": ("chroma_default_euler", "chroma_same_lengths_dpmpp_2m"),
    "pipefusion2": ("chroma_default_euler",),
}
tensor = tensor_reader(REFERENCE)


def comfy_conditioning(entries: list[dict]) -> list:
    """The CONDITIONING CLIPTextEncode (+ FluxGuidance) gives for a T5-only model: pooled_output None."""
    return [[tensor(e["embeds"]), {"pooled_output": None, **({"guidance": e["guidance"]} if "guidance" in e else {})}]
            for e in entries]  # fmt: skip


def api_branch(entries: list[dict]) -> tuple[CondEntry, ...]:
    return tuple(CondEntry(Conditioning(tensor(e["embeds"])), guidance=e.get("guidance")) for e in entries)


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return node_context(pool_registry)


@pytest.mark.parametrize(
    ("layout", "case"), layout_params(REFERENCE["cases"], LAYOUTS, lambda layout, name: name in PARALLEL_CASES[layout])
)
def test_parallel_sampler_equals_comfy_ksampler(node_ctx, pool_registry, layout, case):
    errors = sample_both_ways(
        node_ctx, pool_registry, str(FILE), LAYOUTS[layout], case, STEPS, tensor, comfy_conditioning, api_branch
    )
    assert max(errors.values()) <= TOLERANCE, f"{case['name']} ({case['what']}) on {layout}: {errors}"


def test_model_sampling_and_latent_format_are_comfyuis(pool_registry):
    """What ComfyUI derives from the file (supported_models.Chroma): ModelSamplingFlux shift 1.15, Flux latents."""
    comfy = REFERENCE["models"]["chroma"]["comfy"]
    assert (comfy["model_type"], comfy["model_sampling"]) == ("FLUX", "ModelSamplingFlux")
    model = load_parallel_model(LoadRequest(model=str(FILE), devices="cpu:1"), pool_registry)
    spec = model.model_sampling
    assert spec.kind == "flux_flow" and spec.shift == pytest.approx(comfy["shift"])
    from parallel_runtime.denoise.model_sampling import build_model_sampling

    ms = build_model_sampling(spec)
    assert float(ms.sigma_min) == pytest.approx(comfy["sigma_min"], rel=1e-6)
    assert float(ms.sigma_max) == pytest.approx(comfy["sigma_max"], rel=1e-6)
    from parallel_runtime.models.families.registry import family

    fmt = family("chroma").adapter().make_plan(model_config(), None).latent_format
    assert (fmt.scale, fmt.shift) == pytest.approx((comfy["latent_format"]["scale"], comfy["latent_format"]["shift"]))


def model_config():
    from parallel_runtime.models.single_file import inspect_single_file

    class Config(dict):
        __getattr__ = dict.get

    return Config(inspect_single_file(FILE).config)
