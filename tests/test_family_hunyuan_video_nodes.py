"""HunyuanVideo 1.0 through the nodes: the tiny CPU workflow file (Parallel Text Encode with Llama + CLIP-L on the
workers, a 9-frame latent, Ulysses 2, the parallel causal 3-D VAE decode) equals the same graph on one worker;
ComfyUI's HunyuanImageToVideo CONDITIONING ("v1 (concat)", "v2 (replace)", "custom") becomes the start-image
inputs; malformed ones are refused instead of ignored."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from pack_import import ROOT, load_pack  # tests/ helper
from test_workflows import run_ui_workflow

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.hunyuan_video.conditioning import HunyuanImageInputs

EXPECTED = {"embed_dim": 32, "pooled_dim": 32, "image_dim": None}


def test_tiny_hunyuan_video_workflow_runs(pool_registry):
    context = importlib.import_module(f"{load_pack().__name__}.nodes.context")
    bridge = importlib.import_module(f"{load_pack().__name__}.nodes.bridge")
    data = json.loads((ROOT / "workflows" / "tiny_hunyuan_video_cpu_smoke.json").read_text(encoding="utf-8"))
    ctx = context.NodeContext.create(registry=pool_registry, bridge=bridge.ComfyBridge())
    sink = next(n for n in data["nodes"] if n["type"] == "PreviewImage")
    frames = {}
    for layout in ({}, {"devices": "cpu:1", "ulysses": 1}):
        overrides = {"DiTParallelSampler": {"steps": 2}, "DiTParallelModelLoader": layout}
        (frames[bool(layout)],) = run_ui_workflow(data, ctx, overrides)[sink["id"]]
    assert frames[False].shape == (9, 48, 64, 3)  # 1 + 4 * (3 latent frames - 1), at 8x the latent size
    torch.testing.assert_close(frames[False], frames[True], atol=2e-5, rtol=0)


def test_hunyuan_image_to_video_conditioning():
    from parallel_runtime.service import comfy_conditioning as conditioning  # what the nodes hand CONDITIONING to

    embeds, pooled = torch.randn(1, 6, 32), torch.randn(1, 32)
    image, mask = torch.randn(1, 16, 1, 4, 4), torch.ones(1, 1, 3, 4, 4)
    options = {"pooled_output": pooled, "concat_latent_image": image, "concat_mask": mask, "guidance": 4.0}
    (entry,) = conditioning.to_branch([[embeds, options]], EXPECTED, "hunyuan-video")
    assert isinstance(entry.cond.extras, HunyuanImageInputs) and entry.guidance == 4.0
    assert torch.equal(entry.cond.extras.concat_image, image) and torch.equal(entry.cond.extras.concat_mask, mask)
    (entry,) = conditioning.to_branch(
        [[embeds, {"pooled_output": pooled, "guiding_frame_index": 0}]], EXPECTED, "hunyuan-video"
    )  # "v2 (replace)": the start image is on the LATENT
    assert torch.equal(entry.cond.extras.guiding_timestep, torch.zeros(1)) and entry.cond.extras.concat_image is None
    (entry,) = conditioning.to_branch(
        [[embeds, {"pooled_output": pooled, "ref_latent": image}]], EXPECTED, "hunyuan-video"
    )
    assert torch.equal(entry.cond.extras.ref_latent, image)  # "custom"
    assert entry.cond.extras.reference_token_count() == 4  # 1 frame of 2x2 patches, beside the video's
    assert entry.cond.extras.without_references().ref_latent is None  # PipeFusion: a patch reading their kept K/V
    for key, value in (("ref_latent", image[0]), ("guiding_frame_index", "0")):
        with pytest.raises(ConfigError, match=key):
            conditioning.to_branch([[embeds, {"pooled_output": pooled, key: value}]], EXPECTED, "hunyuan-video")
    with pytest.raises(ConfigError, match="pooled_output"):  # CLIP-L's pooled output is part of the conditioning
        conditioning.to_branch([[embeds, {}]], EXPECTED, "hunyuan-video")
