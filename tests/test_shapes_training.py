"""The pieces behind tiny-flux-shapes: data set, detector, tokenizers and the exact short text form
that training uses (checked against the full 512-token computation that inference runs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dit_devtools.training import shapes_dataset as data
from dit_devtools.training import shapes_model as parts
from dit_devtools.training.shapes_detector import detect, judge, parse_caption


def test_scenes_are_reproducible_and_never_held_out():
    a, caps_a = data.make_batch(3, 10, 6, 64)
    b, caps_b = data.make_batch(3, 10, 6, 64)
    assert caps_a == caps_b and np.array_equal(a, b)
    assert a.shape == (6, 3, 64, 64) and a.min() >= -1.0 and a.max() <= 1.0
    held = set(data.held_out_prompts())
    assert "a red circle on a blue background" not in held and len(held) >= 10
    for index in range(400):
        scene = data.scene_for(0, index)
        if len(scene.shapes) == 1:
            s = scene.shapes[0]
            assert not data.is_held_out(s.colour, s.kind, scene.background)


@pytest.mark.parametrize("size", [64, 128, 256])
def test_detector_recognises_every_rendered_scene(size):
    for index in range(40):
        rng = np.random.default_rng([11, index])
        scene = data.sample_scene(rng)
        image = data.render(scene, size, rng)
        assert judge(image, scene.caption).ok, (size, scene.caption)


def test_detector_rejects_wrong_pictures():
    scene = data.Scene((data.Shape("circle", "red", 0.5, 0.5, 0.25),), "blue", True)
    image = data.render(scene, 128)
    assert judge(image, "a red circle on a blue background").ok
    assert not judge(image, "a red square on a blue background").shapes_ok
    assert not judge(image, "a green circle on a blue background").colours_ok
    assert not judge(image, "a red circle on a white background").background_ok
    assert not judge(image, "two red circles").ok
    noise = np.random.default_rng(0).random((128, 128, 3))
    assert not judge(noise, "a red circle on a blue background").ok
    blob = detect(image).of_colour("red")[0]
    assert blob.shape == "circle" and abs(blob.centre[0] - 64) < 2 and abs(blob.centre[1] - 64) < 2


def test_caption_parser_reads_the_grammar():
    assert parse_caption("two yellow squares").shapes == (("yellow", "square"),) * 2
    req = parse_caption("an orange triangle and a red circle on a purple background")
    assert req.shapes == (("orange", "triangle"), ("red", "circle")) and req.background == "purple"
    with pytest.raises(ValueError):
        parse_caption("a watercolor fox")


def test_tokenizers_hold_every_word_of_the_grammar():
    words = data.vocabulary()
    clip_tok, t5_tok = parts.build_tokenizers(words)
    for word in words:
        assert clip_tok.tokenize(word) == [word + "</w>"]
        assert t5_tok.tokenize(word) == ["▁" + word]


def test_pack_is_flux_pipelines_packing():
    from diffusers import FluxPipeline

    latent = torch.randn(2, 16, 6, 8)
    ref = FluxPipeline._pack_latents(latent, 2, 16, 6, 8)
    assert torch.equal(parts.pack(latent), ref)
    assert torch.equal(parts.unpack(ref, 6, 8), latent)


@torch.no_grad()
def test_short_text_form_equals_the_full_512_token_run():
    """Training feeds ~25 text tokens with a multiplicity bias; the transformer's output must equal the
    one it gives the 512 T5 tokens that FluxPipeline and our engine feed it."""
    words = data.vocabulary()
    clip_tok, t5_tok = parts.build_tokenizers(words)
    clip, t5 = parts.build_text_encoders(clip_tok, t5_tok, seed=1)
    for p in t5.parameters():  # a non-trivial T5 (random bias per bucket), far buckets at zero as trained
        p.add_(torch.randn_like(p) * 0.2)
    parts.zero_far_buckets(t5)
    transformer = parts.build_transformer(seed=1).eval()
    captions = ["a red circle on a blue background", "", "an orange triangle and a red circle on a purple background"]
    ids = t5_tok(captions, padding="max_length", max_length=512, return_tensors="pt").input_ids
    full = t5(ids)[0]
    short, key_bias = parts.encode_t5_reduced(t5, ids, t5_tok.pad_token_id)
    assert short.shape[1] < 40
    pooled = clip(clip_tok(captions, padding="max_length", max_length=77, return_tensors="pt").input_ids).pooler_output
    x, t = torch.randn(3, 64, 64), torch.tensor([0.2, 0.5, 0.9])
    common = dict(pooled_projections=pooled, timestep=t, img_ids=parts.image_ids(8, 8))
    ref = transformer(hidden_states=x, encoder_hidden_states=full, txt_ids=torch.zeros(512, 3), **common).sample
    mask = torch.cat([key_bias, torch.zeros(3, 64)], dim=1)[:, None, None, :]
    ours = transformer(
        hidden_states=x,
        encoder_hidden_states=short,
        txt_ids=torch.zeros(short.shape[1], 3),
        joint_attention_kwargs={"attention_mask": mask},
        **common,
    ).sample
    assert (ours - ref).abs().max().item() < 1e-4 * ref.abs().max().item()


def test_focused_scenes_are_one_shape_of_six_colours_never_held_out_and_detected():
    a, caps = data.make_batch(5, 0, 40, 128, focused=True)
    b, _ = data.make_batch(5, 0, 40, 128, focused=True)
    assert np.array_equal(a, b)
    held = set(data.focused_held_out_prompts())
    assert held and held <= set(data.held_out_prompts())
    for image, caption in zip(a, caps):
        request = parse_caption(caption)
        assert len(request.shapes) == 1 and caption not in held
        assert {request.shapes[0][0], request.background} <= set(data.FOCUSED_COLOURS)
        assert judge((image.transpose(1, 2, 0) + 1) / 2, caption).ok, caption


def test_centred_scenes_are_large_near_the_middle_and_name_the_background_mostly():
    rng = np.random.default_rng(3)
    scenes = [data.sample_centred_scene(rng) for _ in range(200)]
    for scene in scenes:
        (shape,) = scene.shapes
        assert abs(shape.cx - 0.5) <= data.CENTRE_JITTER and abs(shape.cy - 0.5) <= data.CENTRE_JITTER
        assert 0.27 <= shape.half <= 0.33 and {shape.colour, scene.background} <= set(data.FOCUSED_COLOURS)
        assert not data.is_held_out(shape.colour, shape.kind, scene.background)
    named = np.mean([scene.caption.endswith("background") for scene in scenes])
    assert 0.7 <= named <= 0.9
    images, caps = data.make_batch(5, 0, 24, 128, focused=True, centred=True)
    for image, caption in zip(images, caps):
        assert judge((image.transpose(1, 2, 0) + 1) / 2, caption).ok, caption
