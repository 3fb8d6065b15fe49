"""LTX-Video through the nodes: the tiny CPU workflow file (Parallel Text Encode with T5 on the workers, a 9-frame
latent, Ulysses 2, the parallel VAE decode) equals the same graph on one worker; ComfyUI's LTXVConditioning frame
rate in a CONDITIONING becomes the model's frame rate, LTXVAddGuide's inputs are refused instead of ignored."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from pack_import import ROOT, load_pack  # tests/ helper
from test_workflows import run_ui_workflow

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.ltx_video.conditioning import LTXFrameRate

EXPECTED = {"embed_dim": 32, "pooled_dim": None, "image_dim": None}


def test_tiny_ltx_video_workflow_runs(pool_registry):
    context = importlib.import_module(f"{load_pack().__name__}.nodes.context")
    bridge = importlib.import_module(f"{load_pack().__name__}.nodes.bridge")
    data = json.loads((ROOT / "workflows" / "tiny_ltx_video_cpu_smoke.json").read_text(encoding="utf-8"))
    ctx = context.NodeContext.create(registry=pool_registry, bridge=bridge.ComfyBridge())
    sink = next(n for n in data["nodes"] if n["type"] == "PreviewImage")
    frames = {}
    for layout in ({}, {"devices": "cpu:1", "ulysses": 1}):
        overrides = {"DiTParallelSampler": {"steps": 2}, "DiTParallelModelLoader": layout}
        (frames[bool(layout)],) = run_ui_workflow(data, ctx, overrides)[sink["id"]]
    assert frames[False].shape == (9, 64, 96, 3)  # 1 + 8 * (2 latent frames - 1), at 32x the latent size
    torch.testing.assert_close(frames[False], frames[True], atol=2e-5, rtol=0)


def test_ltxv_conditioning_frame_rate():
    from parallel_runtime.service import comfy_conditioning as conditioning  # what the nodes hand CONDITIONING to

    embeds, mask = torch.randn(1, 6, 32), torch.tensor([[1, 1, 1, 1, 0, 0]])
    (entry,) = conditioning.to_branch([[embeds, {"attention_mask": mask, "frame_rate": 24.0}]], EXPECTED, "ltx-video")
    assert isinstance(entry.cond.extras, LTXFrameRate) and entry.cond.extras.frame_rate.tolist() == [24.0]
    assert torch.equal(entry.cond.attention_mask, mask)
    (plain,) = conditioning.to_branch([[embeds, {}]], EXPECTED, "ltx-video")
    assert plain.cond.extras is None  # the model's default 25 fps
    for key in ("concat_mask", "keyframe_idxs"):
        with pytest.raises(ConfigError, match=key):
            conditioning.to_branch([[embeds, {key: torch.ones(1, 1, 2, 2, 3)}]], EXPECTED, "ltx-video")
