"""expand_conditioning repeats a one-item conditioning over the latent batch and keeps what is already there."""

from __future__ import annotations

import pytest
import torch

from parallel_runtime.denoise.entries import expand_conditioning
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning


def test_a_field_already_at_the_batch_size_is_kept_while_another_is_repeated():
    prompt = torch.randn(1, 5, 8)
    pooled = torch.randn(3, 4)
    mask = torch.ones(1, 5, dtype=torch.long)
    out = expand_conditioning(Conditioning(prompt, pooled, mask), 3)
    assert out.prompt_embeds.shape == (3, 5, 8) and torch.equal(out.prompt_embeds[2], prompt[0])
    assert out.pooled is not None and torch.equal(out.pooled, pooled)  # was dropped to None
    assert out.attention_mask.shape == (3, 5)


def test_absent_fields_stay_absent_and_a_wrong_batch_is_refused():
    out = expand_conditioning(Conditioning(torch.randn(1, 2, 4), None, None), 2)
    assert out.pooled is None and out.attention_mask is None and out.prompt_embeds.shape[0] == 2
    with pytest.raises(ConfigError):
        expand_conditioning(Conditioning(torch.randn(2, 2, 4), None, None), 3)
