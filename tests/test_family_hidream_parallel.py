"""HiDream-I1 on every layout in real worker processes equals our single-device result (itself diffusers' and
ComfyUI's: tests/test_family_hidream.py, test_family_hidream_comfy.py): Ulysses, Ring, CFG parallel, PipeFusion
(exact with warmup = steps; after warmup within the stale-K/V bound, and several times closer than patch-local
attention). The text differs per block (each block appends its Llama layer's tokens): every rank holds its
share of them, positive and negative of different lengths."""

from __future__ import annotations

import pytest
import torch
from family_layout_cases import LAYOUTS, FamilyReference, close, layout_result, stale_errors  # tests/ helpers
from pipefusion_cases import STALE_BOUND, STALE_VS_PATCH_LOCAL  # tests/ helper

from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.hidream.conditioning import HiDreamText

NAME, STEPS = "tiny-hidream", 3
WIDTH, HEIGHT = 208, 176  # 11 x 13 tokens: odd, not a multiple of 2


def conditioning(t5_tokens: int, llama_tokens: int, seed: int) -> Conditioning:
    """What ComfyUI's HiDream text encoder gives, at the tiny widths (T5 32, pooled 20, 4 Llama layers of 24)."""
    g = torch.Generator().manual_seed(seed)
    llama = torch.randn(1, 4, llama_tokens, 24, generator=g)
    return Conditioning(torch.randn(1, t5_tokens, 32, generator=g), torch.randn(1, 20, generator=g), None,
                        HiDreamText(llama))  # fmt: skip


@pytest.fixture(scope="module")
def reference():
    """Positive 7 T5 + 5 Llama tokens, negative 3 + 4."""
    return FamilyReference(NAME, (WIDTH, HEIGHT), STEPS, 5.0, lambda _: (conditioning(7, 5, 1), conditioning(3, 4, 2)))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_equals_single_device(cpu_pool, reference, layout):
    assert close(layout_result(cpu_pool, reference, layout), reference.result())


def test_pipefusion_after_warmup_stays_within_the_stale_bound(cpu_pool, reference):
    """Warmup 1 of 3 steps with 3 and 5 patches: within STALE_BOUND of what a seed change makes, and several
    times closer than each patch attending only to its own tokens (stale K/V off, 5 patches)."""
    stale, local = stale_errors(cpu_pool, reference, (3, 5))
    assert all(0 < e < STALE_BOUND for e in stale.values()), stale
    assert local > STALE_VS_PATCH_LOCAL * stale[5], (stale, local)
