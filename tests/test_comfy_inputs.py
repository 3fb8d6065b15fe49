"""ComfyUI's data as the service reads it for the sampler nodes: CONDITIONING to runtime entries and back (with
clear errors for conditioning of another model), and a LATENT's samples in the model's layout."""

from __future__ import annotations

import pytest
import torch
from node_helpers import flux_cond  # tests/ helpers

from parallel_runtime.errors import ConfigError
from parallel_runtime.service.comfy_conditioning import from_runtime, to_branch
from parallel_runtime.service.input_checks import model_latent


def test_conditioning_round_trip_and_entry_options():
    expected = {"embed_dim": 32, "pooled_dim": 32}
    (entry,) = to_branch(flux_cond(guidance=2.5), expected, "flux")
    cond = entry.cond
    assert cond.prompt_embeds.shape == (1, 7, 32) and cond.pooled.shape == (1, 32)
    assert (entry.guidance, entry.strength, entry.start_percent, entry.end_percent) == (2.5, 1.0, None, None)
    combined = flux_cond() + flux_cond(strength=0.5, start_percent=0.2, end_percent=0.8)  # Combine + options
    first, second = to_branch(combined, expected, "flux")
    assert first.is_plain and first.guidance is None
    assert (second.strength, second.start_percent, second.end_percent) == (0.5, 0.2, 0.8)
    mask = torch.ones(1, 8, 8)
    area, masked, percent = to_branch(
        flux_cond(area=(4, 6, 2, 0), strength=0.8)
        + flux_cond(mask=mask, mask_strength=0.5, set_area_to_bounds=True)
        + flux_cond(area=("percentage", 0.5, 1.0, 0.0, 0.25)),
        expected,
        "flux",
    )
    assert area.region.area == (4, 6, 2, 0) and area.strength == 0.8 and not area.is_plain
    assert masked.region.mask is not None and masked.region.mask_strength == 0.5 and masked.region.set_area_to_bounds
    assert percent.region.area_fraction == (0.5, 1.0, 0.0, 0.25) and percent.region.area is None
    back = from_runtime(cond)
    assert torch.equal(back[0][0], cond.prompt_embeds) and torch.equal(back[0][1]["pooled_output"], cond.pooled)


@pytest.mark.parametrize(
    ("conditioning", "match"),
    [
        (flux_cond(width=2048, pooled=1280), "SDXL conditioning given to a Flux model"),
        (flux_cond(width=768, pooled=768), "SD1.x conditioning given to a Flux model"),
        (flux_cond(pooled=None), "has no pooled_output"),
        (flux_cond(pooled=2048), "pooled output is 2048 wide"),
        (flux_cond(area=(8, 8, 0, 0, 1, 1)), "has an area"),  # a video area (6 numbers)
        (flux_cond() + flux_cond(mask=[[1.0]]), "positive entry 2 of 2 conditioning has a mask of type list"),
        (flux_cond(control=object()), "carries a ControlNet"),
        ("not conditioning", "is not a CONDITIONING"),
    ],
)
def test_conditioning_errors_say_what_why_fix(conditioning, match):
    with pytest.raises(ConfigError, match=match) as err:
        to_branch(conditioning, {"embed_dim": 32, "pooled_dim": 32}, "flux")
    assert "why:" in str(err.value) and "fix:" in str(err.value)


def test_model_latent_checks():
    zeros4 = torch.zeros(1, 4, 8, 8)
    assert model_latent(zeros4, "flux", 16, 2).shape == (1, 16, 8, 8)  # empty latent of another family: fixed
    with pytest.raises(ConfigError, match="has 4 channels but this flux model works with 16"):
        model_latent(torch.ones(1, 4, 8, 8), "flux", 16, 2)
    assert model_latent(torch.ones(1, 16, 9, 7), "flux", 16, 2).shape == (1, 16, 9, 7)  # the model pads
    with pytest.raises(ConfigError, match=r"has shape \(1, 16, 3, 8, 8\)"):
        model_latent(torch.ones(1, 16, 3, 8, 8), "flux", 16, 2)
    assert model_latent(torch.ones(1, 16, 1, 8, 8), "qwen-image", 16, 2, frame_axis=True).shape == (1, 16, 8, 8)
    assert model_latent(torch.ones(1, 16, 8, 8), "wan", 16, 3).shape == (1, 16, 1, 8, 8)  # an image: one frame
    with pytest.raises(ConfigError, match=r"shape \[1, 0, 8, 8\]"):
        model_latent(torch.ones(1, 0, 8, 8), "flux", 16, 2)
