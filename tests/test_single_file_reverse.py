"""Our diffusers -> original-layout mapping, with which the single-file tests write their files, is
diffusers' (or, for PixArt, our) conversion run backwards."""

from __future__ import annotations

import pytest
import torch
from original_layout_files import flux_to_bfl, pixart_to_original, sd3_to_mmdit  # tests/ helpers


def test_flux_reverse_mapping_round_trips_through_diffusers_at_flux1_width():
    """diffusers' Flux converter splits single blocks at FLUX.1's width (3072), so the check runs at
    that width: one double and one single block, with one input column per weight (values differ)."""
    from diffusers import FluxTransformer2DModel

    from parallel_runtime.models.compat import convert_flux_transformer
    from parallel_runtime.models.weights import parameters_on_meta

    with parameters_on_meta():
        meta = FluxTransformer2DModel(num_layers=1, num_single_layers=1, guidance_embeds=True)
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape[0], *[1] * (v.dim() - 1), generator=g) for k, v in meta.state_dict().items()}
    back = convert_flux_transformer(flux_to_bfl(state))
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("qk_norm, dual", [("rms_norm", (0,)), (None, ())], ids=["sd3.5-medium", "sd3-medium"])
def test_sd3_reverse_mapping_round_trips_through_diffusers(qk_norm, dual):
    from diffusers import SD3Transformer2DModel

    from parallel_runtime.models.compat import convert_sd3_transformer

    torch.manual_seed(0)
    model = SD3Transformer2DModel(
        sample_size=8,
        num_layers=3,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=24,
        caption_projection_dim=16,
        pooled_projection_dim=12,
        pos_embed_max_size=8,
        qk_norm=qk_norm,
        dual_attention_layers=dual,
    )
    state = model.state_dict()
    back = convert_sd3_transformer(sd3_to_mmdit(state))
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_pixart_reverse_mapping_round_trips_through_our_converter(tiny_transformers):
    """diffusers ships no PixArt single-file converter: ours is the forward direction here (the
    names follow diffusers' scripts/convert_pixart_sigma_to_diffusers.py)."""
    from parallel_runtime.models.original_layout import to_diffusers

    state = tiny_transformers["pixart"].state_dict()
    original = pixart_to_original(state)
    back = to_diffusers("pixart", original, {})
    assert sorted(back) == sorted(k for k in state if k != "pos_embed.pos_embed")  # a computed, unsaved table
    assert all(torch.equal(back[k], state[k]) for k in back)
    assert not original  # everything was used (the empty caption is dropped)
