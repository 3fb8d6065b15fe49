"""encode_prompt equals the diffusers pipelines' encode_prompt on the tiny pipelines."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import default_max_sequence_length, encode_prompt, encode_prompts

torch.set_num_threads(1)

LONG = ", ".join(["a photo of a cat sitting on a red chair in the garden"] * 60)  # > 77 CLIP and > 512 T5 tokens
PROMPTS = {
    "normal": "a photo of a cat sitting on a red chair",
    "empty": "",
    "long": LONG,
    "non_ascii": "  Ein Gemälde: château über 猫 🐱 — naïve café ",
}


@pytest.fixture(scope="module", params=["flux", "sd3", "pixart"])
def loaded(request):
    """(our components, the diffusers pipeline loaded by diffusers itself from the same folder)."""
    import diffusers

    family = request.param
    path = ensure_tiny_model(f"tiny-{family}")
    comps = load_pipeline_components(path, parts=("text",))
    pipe = getattr(diffusers, comps.pipeline_class).from_pretrained(path)
    return family, comps, pipe


def reference(family: str, pipe, prompt, negative=None):
    """diffusers' encode_prompt as the pipelines call it by default -> (embeds, pooled, mask, neg...)."""
    with torch.no_grad():  # the pipelines encode under no_grad (SDPA picks another kernel with grad on)
        if family == "flux":
            embeds, pooled, _ = pipe.encode_prompt(prompt, None, device="cpu")
            return embeds, pooled, None, None
        if family == "sd3":
            embeds, neg, pooled, neg_pooled = pipe.encode_prompt(
                prompt, None, None, device="cpu", do_classifier_free_guidance=True, negative_prompt=negative
            )
            return embeds, pooled, None, (neg, neg_pooled, None)
        embeds, mask, neg, neg_mask = pipe.encode_prompt(prompt, negative_prompt=negative or "", device="cpu")
        return embeds, None, mask, (neg, None, neg_mask)


def assert_same(ours, embeds, pooled, mask):
    assert ours.prompt_embeds.shape == embeds.shape
    assert (ours.prompt_embeds - embeds).abs().max().item() <= 1e-6
    if pooled is None:
        assert ours.pooled is None
    else:
        assert (ours.pooled - pooled).abs().max().item() <= 1e-6
    if mask is None:
        assert ours.attention_mask is None
    else:
        assert torch.equal(ours.attention_mask, mask)


@pytest.mark.parametrize("kind", list(PROMPTS))
def test_matches_diffusers(loaded, kind):
    family, comps, pipe = loaded
    prompt = PROMPTS[kind]
    ours = encode_prompt(comps, family, prompt)
    embeds, pooled, mask, _ = reference(family, pipe, prompt)
    assert_same(ours, embeds, pooled, mask)


def test_shapes_follow_pipeline_defaults(loaded):
    family, comps, _ = loaded
    cond = encode_prompt(comps, family, PROMPTS["long"])
    tokens = {"flux": 512, "sd3": 77 + 256, "pixart": 120}[family]
    assert cond.prompt_embeds.shape[1] == tokens
    assert default_max_sequence_length(comps, family) == {"flux": 512, "sd3": 256, "pixart": 120}[family]


def test_batch_and_negative(loaded):
    family, comps, pipe = loaded
    prompts = [PROMPTS["normal"], PROMPTS["non_ascii"]]
    if family == "flux":
        pos = encode_prompt(comps, family, prompts)
        embeds, pooled, mask, _ = reference(family, pipe, prompts)
        assert_same(pos, embeds, pooled, mask)
        return
    pos, neg = encode_prompts(comps, family, prompts, negative_prompt="blurry, low quality")
    embeds, pooled, mask, (n_embeds, n_pooled, n_mask) = reference(family, pipe, prompts, ["blurry, low quality"] * 2)
    assert_same(pos, embeds, pooled, mask)
    assert_same(neg, n_embeds, n_pooled, n_mask)


def test_shorter_t5_length(loaded):
    family, comps, _ = loaded
    cond = encode_prompt(comps, family, PROMPTS["normal"], max_sequence_length=32)
    assert cond.prompt_embeds.shape[1] == (77 + 32 if family == "sd3" else 32)


def test_errors():
    comps = load_pipeline_components(ensure_tiny_model("tiny-pixart"), parts=("transformer",))
    with pytest.raises(ConfigError, match="needs 'text_encoder'"):
        encode_prompt(comps, "pixart", "a cat")
    with pytest.raises(ConfigError, match="unknown model family 'unet'"):
        encode_prompt(comps, "unet", "a cat")
    with pytest.raises(ConfigError, match="2 negative prompts for 1 prompts"):
        encode_prompts(comps, "pixart", "a cat", ["a", "b"])
