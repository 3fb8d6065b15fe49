"""XLabs Flux ControlNet on the worker pool, against ComfyUI 0.3.64's own graph.

Oracle: tests/data/comfy_controlnet_xlabs_reference.json, written by ``tests/data/make_comfy_controlnet_reference.py
--kind xlabs`` (ControlNetLoader -> ControlNetApplyAdvanced -> KSampler on the tiny FLUX.1-dev file and
tests/controlnet_files.py's tiny XLabs file, which ComfyUI loads with ``load_controlnet_flux_xlabs_mistoline``).
Here the same file goes through Parallel ControlNet Loader's CONTROL_NET into the Parallel Sampler node on real CPU
pools: one rank, Ulysses 2, CFG 2, PipeFusion 2. The hint is the image itself (the apply node's VAE is never called). Also the
spread of an XLabs file's residuals over the main model's blocks (cyclic over 19 double blocks) against the formula.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from controlnet_files import FLUX_XLABS, XLABS_DOUBLE_BLOCKS, flux_xlabs_state  # tests/ helper
from test_controlnet_flux import LAYOUTS, MODEL, apply, load_node, node_ctx, relative_error, union_type  # noqa: F401

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.controlnet_files import describe_controlnet
from parallel_runtime.models.controlnet_kind import FLUX_XLABS as XLABS_KIND
from parallel_runtime.models.families.flux.controlnet_xlabs import XLabsFluxControlNet
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.comfy_control import ParallelControlNet

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_controlnet_xlabs_reference.json").read_text(encoding="utf-8"))
TOLERANCE = 1e-4  # relative L2

from controlnet_hint_vae import HintVAE  # noqa: E402  (tests/data is on sys.path through test_controlnet_flux)
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402


def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def graph(case: dict):
    positive = [[tensor(f"{case['name']}.pos"), {"pooled_output": tensor(f"{case['name']}.pos_pooled")}]]
    negative = [[tensor(f"{case['name']}.neg"), {"pooled_output": tensor(f"{case['name']}.neg_pooled")}]]
    net, vae = ParallelControlNet(describe_controlnet(FLUX_XLABS)), HintVAE()
    for a in case["applies"]:
        image = tensor(f"hint.{a['hint']}")
        typed = union_type(net, a["type"])
        positive, negative = apply(
            positive, negative, typed, image, a["strength"], a["start_percent"], a["end_percent"], vae
        )
    return positive, negative, vae


def sample(ctx, handle, positive, negative, case, latent):
    return ParallelSampler(ctx).sample(
        handle, positive, negative, latent, case["seed"], case["steps"], case["cfg"], case["sampler_name"],
        case["scheduler"], 1.0,
    )["result"][0]["samples"]  # fmt: skip


def test_stored_xlabs_file_is_what_the_builder_makes_and_reads_as_xlabs():
    from safetensors.torch import load_file

    stored, built = load_file(str(FLUX_XLABS)), flux_xlabs_state()
    assert stored.keys() == built.keys() and all(torch.equal(stored[k], built[k]) for k in built)
    info = describe_controlnet(FLUX_XLABS)
    assert (info.kind, info.union_modes, info.hint_channels, info.hint_format, info.hint_scale) == (
        XLABS_KIND, 0, 3, None, 8
    )  # fmt: skip
    assert (info.double_blocks, info.single_blocks) == (XLABS_DOUBLE_BLOCKS, 0)
    assert REFERENCE["controlnet_model"] == f"ControlNetFlux(latent_input=False, double={XLABS_DOUBLE_BLOCKS})"


def test_xlabs_residuals_repeat_cyclically_over_nineteen_double_blocks():
    doubles = [torch.full((1,), float(i)) for i in range(3)]
    main = ["transformer_blocks"] * 22 + ["single_transformer_blocks"] * 4
    out = XLabsFluxControlNet.spread(doubles, [], main)
    assert [None if r is None else int(r) for r in out[:22]] == [j % 3 for j in range(19)] + [None] * 3
    assert out[22:] == [None] * 4


@pytest.mark.parametrize(
    ("layout", "case"),
    [pytest.param(layout, case, id=f"{layout}-{case['name']}") for layout in LAYOUTS for case in REFERENCE["cases"]],
)
def test_parallel_sampler_with_xlabs_controlnet_equals_comfy(node_ctx, layout, case):  # noqa: F811
    handle = load_node(node_ctx, layout)
    positive, negative, vae = graph(case)
    latent = {"samples": torch.zeros(1, 16, case["latent"][1] // 8, case["latent"][0] // 8)}
    got = sample(node_ctx, handle, positive, negative, case, latent)
    expected = tensor(f"{case['name']}.expected")
    error = relative_error(got, expected)
    assert error <= TOLERANCE, f"{case['name']} on {layout}: {error}"
    assert vae.calls == case["vae_encode_calls"] == []  # the image itself is the hint
    if layout != "1rank":
        return
    plain = [[e[0], {"pooled_output": e[1]["pooled_output"]}] for e in positive]
    plain_neg = [[e[0], {"pooled_output": e[1]["pooled_output"]}] for e in negative]
    assert relative_error(sample(node_ctx, handle, plain, plain_neg, case, latent), expected) > 100 * TOLERANCE
    odd = {"samples": torch.zeros(1, 16, 5, 6)}  # 2x2 patches of the image hint's map would not be whole
    with pytest.raises(ConfigError, match="multiple of 16 px"):
        sample(node_ctx, handle, *graph(case)[:2], case, odd)


def test_xlabs_under_pipefusion_equals_comfy_after_full_warmup(node_ctx):  # noqa: F811
    """PipeFusion 2, every step a warmup step: stage 0 runs the XLabs ControlNet per item; its residuals reach the
    double blocks only, all on stage 0 here, so nothing of it travels; equal to ComfyUI to 1e-4."""
    from comfy_ksampler_cases import load_manual

    handle = load_manual(node_ctx, str(MODEL), "cpu:2", ParallelConfig(pp=2), warmup=5)
    for case in REFERENCE["cases"]:
        assert case["steps"] <= 5
        latent = {"samples": torch.zeros(1, 16, case["latent"][1] // 8, case["latent"][0] // 8)}
        got = sample(node_ctx, handle, *graph(case)[:2], case, latent)
        error = relative_error(got, tensor(f"{case['name']}.expected"))
        assert error <= TOLERANCE, f"{case['name']} under PipeFusion 2: {error}"
