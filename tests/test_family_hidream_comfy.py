"""Same picture as ComfyUI's KSampler on a HiDream-I1 file: the Parallel Sampler, through its node (ComfyUI's
CONDITIONING with conditioning_llama3, as QuadrupleCLIPLoader + CLIPTextEncode give it) and through the API,
against ComfyUI 0.3.64's own KSampler (UNETLoader's HiDream, ModelSamplingSD3, EmptyLatentImage) on the same
file, on one rank, Ulysses 2, Ring 2, CFG 2 and PipeFusion 2 (warmup = steps: exact); ComfyUI's direct forward;
the model sampling and latent format ComfyUI derives from the file.

Oracle: tests/data/comfy_hidream_reference.json and comfy_ref_hidream.safetensors, written by
tests/data/make_comfy_hidream_reference.py from the ComfyUI snapshot.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from comfy_ksampler_cases import (  # tests/ helper
    LAYOUTS,
    TOLERANCE,
    layout_params,
    node_context,
    relative_error,
    sample_both_ways,
    tensor_reader,
)

from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.hidream.conditioning import HiDreamText
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.api import LoadRequest, load_parallel_model

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_hidream_reference.json").read_text(encoding="utf-8"))
FILE = DATA / REFERENCE["models"]["hidream"]["file"]
HIDREAM_LAYOUTS = {**LAYOUTS, "ring2": ("cpu:2", ParallelConfig(ring=2))}
LAYOUT_CASES = {  # one rank runs every case; the parallel layouts these
    "ulysses2": ("hidream_default_euler", "hidream_full_shift3_dpmpp_2m"),
    "ring2": ("hidream_default_euler",),
    "cfg2": ("hidream_default_euler",),
    "pipefusion2": ("hidream_default_euler",),
}
STEPS = max(case["steps"] for case in REFERENCE["cases"])
tensor = tensor_reader(REFERENCE)


def comfy_conditioning(entries: list[dict]) -> list:
    """The CONDITIONING QuadrupleCLIPLoader + CLIPTextEncode give: T5 states, pooled CLIPs, every Llama layer."""
    return [[tensor(e["embeds"]), {"pooled_output": tensor(e["pooled"]), "conditioning_llama3": tensor(e["llama3"])}]
            for e in entries]  # fmt: skip


def api_branch(entries: list[dict]) -> tuple[CondEntry, ...]:
    return tuple(
        CondEntry(Conditioning(tensor(e["embeds"]), tensor(e["pooled"]), None, HiDreamText(tensor(e["llama3"]))))
        for e in entries
    )


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return node_context(pool_registry)


# every layout equals one device on more cases in tests/test_family_hidream_parallel.py
@pytest.mark.parametrize(
    ("layout", "case"),
    layout_params(REFERENCE["cases"], HIDREAM_LAYOUTS, lambda layout, name: name in LAYOUT_CASES[layout]),
)
def test_parallel_sampler_equals_comfy_ksampler(node_ctx, pool_registry, layout, case):
    node = case.get("model_sampling")
    errors = sample_both_ways(
        node_ctx,
        pool_registry,
        str(FILE),
        HIDREAM_LAYOUTS[layout],
        case,
        STEPS,
        tensor,
        comfy_conditioning,
        api_branch,
        None if node is None else node["inputs"],
    )
    assert max(errors.values()) <= TOLERANCE, f"{case['name']} ({case['what']}) on {layout}: {errors}"


@torch.no_grad()
def test_forward_equals_comfys_and_the_file_is_read_as_comfy_reads_it():
    """The file loads (no overrides: the config from the weights) and one forward equals ComfyUI's, sign and all."""
    from parallel_runtime.models.single_file import load_single_file_transformer

    transformer, family, _ = load_single_file_transformer(FILE, "cpu", torch.float32)
    from parallel_runtime.models.families.hidream.adapter import HiDreamAdapter

    adapter = HiDreamAdapter(transformer)
    f = REFERENCE["forward"]
    cond = Conditioning(tensor(f["context"]), tensor(f["pooled"]), None, HiDreamText(tensor(f["llama3"])))
    mesh = ParallelMesh.single()
    ours = adapter.forward(tensor(f["x"]), f["sigma"] * 1000, cond, mesh, SequenceParallelAttention(mesh, "sdpa"))
    expected = tensor(f["out"])  # ComfyUI's output is already negated (HiDream predicts x0 - noise)
    assert relative_error(ours, expected) <= 1e-5
    structure = REFERENCE["models"]["hidream"]["structure"]
    for key in ("num_layers", "num_single_layers", "num_attention_heads", "attention_head_dim", "llama_layers"):
        assert transformer.config[key] == structure[key], key


def test_model_sampling_and_latent_format_are_comfyuis(pool_registry):
    """What ComfyUI derives from the file (supported_models.HiDream): ModelSamplingDiscreteFlow shift 1.0, x1000;
    Flux's latent format."""
    comfy = REFERENCE["models"]["hidream"]["comfy"]
    assert (comfy["model_type"], comfy["model_sampling"]) == ("FLOW", "ModelSamplingDiscreteFlow")
    model = load_parallel_model(LoadRequest(model=str(FILE), devices="cpu:1"), pool_registry)
    spec = model.model_sampling
    assert spec.kind == "discrete_flow"
    assert (spec.shift, spec.multiplier) == pytest.approx((comfy["shift"], comfy["multiplier"]))
    from parallel_runtime.denoise.model_sampling import build_model_sampling

    ms = build_model_sampling(spec)
    assert float(ms.sigma_min) == pytest.approx(comfy["sigma_min"], rel=1e-6)
    assert float(ms.sigma_max) == pytest.approx(comfy["sigma_max"], rel=1e-6)
    from parallel_runtime.models.families.flux.latent import latent_format

    fmt = latent_format(16)
    assert (fmt.scale, fmt.shift) == pytest.approx((comfy["latent_format"]["scale"], comfy["latent_format"]["shift"]))
    assert comfy["latent_format"]["class"] == "Flux"
