"""HunyuanVideo 1.0 against diffusers, in process: the adapter's embed -> blocks -> output equals the transformer's
own forward (padded text cut, prompts of different lengths masked, the I2V start-image channels), the text
encoding equals HunyuanVideoPipeline.encode_prompt, and our single-device engine equals HunyuanVideoPipeline and
HunyuanVideoImageToVideoPipeline on the tiny folders (same weights, text embeddings, noise and sigmas)."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.hunyuan_video.adapter import check_text_split, kept_text
from parallel_runtime.models.families.hunyuan_video.conditioning import HunyuanImageInputs
from parallel_runtime.models.families.hunyuan_video.latent import HUNYUAN_VIDEO
from parallel_runtime.models.families.hunyuan_video.text import TEMPLATE, template_crop
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.mesh import ParallelMesh

STEPS, FRAMES, PX = 3, 9, 32  # 3 latent frames of 4x4
FAMILY = "hunyuan-video"


@pytest.fixture(scope="module")
def t2v():
    return load_pipeline_components(ensure_tiny_model("tiny-hunyuan-video"), "cpu", torch.float32)


def _close(ours: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> None:
    assert ours.shape == ref.shape
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= tol, f"relative L2 error {err:.2e}"


def _forward(adapter, x, t, cond, guidance=None):
    mesh = ParallelMesh.single()
    return adapter.forward(x, t, cond, mesh, SequenceParallelAttention(mesh, "sdpa"), guidance=guidance)


@torch.no_grad()
def test_adapter_equals_the_transformers_forward(t2v):
    """Padded text (the pipeline's 256-token form) is cut to the kept tokens; a batch of prompts of different
    lengths keeps a key mask; both equal the transformer's masked forward."""
    adapter = t2v.adapter()
    assert adapter.plan.latent_format == HUNYUAN_VIDEO and adapter.num_blocks == 4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 3, 4, 6, generator=g)
    text, pooled = torch.randn(2, 9, 32, generator=g), torch.randn(2, 32, generator=g)
    mask = torch.ones(2, 9)
    mask[0, 6:] = 0
    mask[1, 4:] = 0
    t, guidance = torch.tensor([700.0, 300.0]), torch.tensor([6.0, 3.5])
    ref = t2v.transformer(x, t, text, mask, pooled, guidance * 1000).sample
    _close(_forward(adapter, x, t, Conditioning(text, pooled, mask), guidance), ref, 1e-6)
    same = mask[:1].expand(2, -1)  # equal lengths: the text is cut to 6 tokens and no mask is left
    ref = t2v.transformer(x, t, text, same, pooled, guidance * 1000).sample
    _close(_forward(adapter, x, t, Conditioning(text[:, :6], pooled), guidance), ref, 1e-6)
    # the cut is not a no-op: attending to the padded tokens changes the result
    assert (_forward(adapter, x, t, Conditioning(text, pooled), guidance) - ref).abs().max() > 1e-3


@torch.no_grad()
def test_i2v_start_image_channels_equal_the_transformers_forward():
    """HunyuanVideo-I2V v1: [latent, start-image latent in model space (zero after its frame), 1 - mask]."""
    comps = load_pipeline_components(ensure_tiny_model("tiny-hunyuan-video-i2v"), "cpu", torch.float32)
    adapter = comps.adapter()
    assert not adapter.plan.guidance_embed and adapter.plan.latent_channels == 16
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, 3, 4, 4, generator=g)
    image = torch.randn(1, 16, 1, 4, 4, generator=g)
    mask = torch.ones(1, 1, 3, 4, 4)
    mask[:, :, 0] = 0
    text, pooled = torch.randn(1, 5, 32, generator=g), torch.randn(1, 32, generator=g)
    cond = Conditioning(text, pooled, extras=HunyuanImageInputs(image, mask))
    model_image = torch.cat([image * HUNYUAN_VIDEO.scale, torch.zeros(1, 16, 2, 4, 4)], dim=2)
    full = torch.cat([x, model_image, 1 - mask], dim=1)
    ref = comps.transformer(full, torch.tensor([500.0]), text, torch.ones(1, 5), pooled).sample
    _close(_forward(adapter, x, torch.tensor([500.0]), cond), ref, 1e-6)
    with pytest.raises(ConfigError, match="text-to-video"):
        _forward(
            load_pipeline_components(ensure_tiny_model("tiny-hunyuan-video"), "cpu").adapter(), x, 500.0, cond, 6.0
        )


@torch.no_grad()
def test_text_encoding_equals_the_pipelines_encode_prompt(t2v):
    from diffusers import HunyuanVideoPipeline

    pipe = HunyuanVideoPipeline.from_pretrained(t2v.path, torch_dtype=torch.float32)
    template = {"template": TEMPLATE, "crop_start": template_crop(pipe.tokenizer)}
    prompts = ["a red fox running through the snow at dawn", "a cat"]
    ref, ref_pooled, ref_mask = pipe.encode_prompt(prompts, prompt_template=template)
    assert ref.shape[1] == 256 and not bool(ref_mask.all())
    ours = encode_prompts(t2v, FAMILY, prompts, "")[0]
    kept = int(ref_mask.sum(dim=1).max())
    assert ours.prompt_embeds.shape[1] == kept
    torch.testing.assert_close(ours.prompt_embeds, ref[:, :kept])
    torch.testing.assert_close(ours.attention_mask, ref_mask[:, :kept])
    torch.testing.assert_close(ours.pooled, ref_pooled)
    one = encode_prompts(t2v, FAMILY, prompts[1], "")[0]  # one prompt: its own tokens, no mask (ComfyUI's form)
    assert one.attention_mask is None
    torch.testing.assert_close(one.prompt_embeds, ref[1:, : int(ref_mask[1].sum())])


@torch.no_grad()
@pytest.mark.parametrize("true_cfg", [1.0, 3.0], ids=["embedded-guidance", "true-cfg"])
def test_t2v_matches_diffusers_hunyuan_video_pipeline(t2v, true_cfg):
    from diffusers import HunyuanVideoPipeline

    pipe = HunyuanVideoPipeline.from_pretrained(t2v.path, torch_dtype=torch.float32)
    pos, neg = encode_prompts(t2v, FAMILY, "a paper boat drifting down a gutter", "blurry, static")
    noise = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(3))
    ref = pipe(
        prompt_embeds=pos.prompt_embeds,
        pooled_prompt_embeds=pos.pooled,
        prompt_attention_mask=torch.ones(pos.prompt_embeds.shape[:2]),
        negative_prompt_embeds=neg.prompt_embeds,
        negative_pooled_prompt_embeds=neg.pooled,
        negative_prompt_attention_mask=torch.ones(neg.prompt_embeds.shape[:2]),
        height=PX,
        width=PX,
        num_frames=FRAMES,
        num_inference_steps=STEPS,
        guidance_scale=4.5,
        true_cfg_scale=true_cfg,
        latents=noise,
        output_type="latent",
    ).frames
    adapter = t2v.adapter()
    settings = SamplingSettings(
        seed=0, cfg=true_cfg, sampler="euler", sigmas=pipe.scheduler.sigmas.float(), guidance=4.5
    )
    raw = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, torch.zeros_like(noise), settings,
        start_model_space=noise,
    )  # fmt: skip
    _close(adapter.plan.latent_format.to_model(raw), ref)


@torch.no_grad()
def test_i2v_matches_diffusers_image_to_video_pipeline():
    """The 33-channel model with ComfyUI's start-image conditioning equals HunyuanVideoImageToVideoPipeline
    (its initial latent: 0.999 x noise + 0.001 x the image latent on every frame; it returns frames 1..)."""
    from diffusers import HunyuanVideoImageToVideoPipeline
    from PIL import Image

    folder = ensure_tiny_model("tiny-hunyuan-video-i2v")
    comps = load_pipeline_components(folder, "cpu", torch.float32)
    parts = {k: getattr(comps, k) for k in ("transformer", "vae")}
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(folder / "scheduler")
    pipe = HunyuanVideoImageToVideoPipeline(
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None, image_processor=None,
        scheduler=scheduler, **parts,
    )  # fmt: skip
    pos, neg = encode_prompts(comps, FAMILY, "a lighthouse at dusk", "")
    pixels = torch.rand(PX, PX, 3, generator=torch.Generator().manual_seed(2))
    image = Image.fromarray((pixels * 255).byte().numpy())
    start = pipe.vae.encode(pipe.video_processor.preprocess(image, PX, PX).unsqueeze(2)).latent_dist.mode()
    noise = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(4))
    ref = pipe(
        image=image,
        prompt_embeds=pos.prompt_embeds,
        pooled_prompt_embeds=pos.pooled,
        prompt_attention_mask=torch.ones(pos.prompt_embeds.shape[:2]),
        height=PX,
        width=PX,
        num_frames=FRAMES,
        num_inference_steps=STEPS,
        latents=noise,
        output_type="latent",
    ).frames
    mask = torch.ones(1, 1, 3, 4, 4)
    mask[:, :, 0] = 0  # HunyuanImageToVideo's concat_mask: 0 where the start image is kept
    cond = Conditioning(pos.prompt_embeds, pos.pooled, extras=HunyuanImageInputs(start, mask))
    first = noise * 0.999 + start.repeat(1, 1, 3, 1, 1) * HUNYUAN_VIDEO.scale * 0.001
    adapter = comps.adapter()
    settings = SamplingSettings(seed=0, cfg=1.0, sampler="euler", sigmas=pipe.scheduler.sigmas.float())
    raw = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), cond, None, torch.zeros_like(noise), settings,
        start_model_space=first,
    )  # fmt: skip
    _close(adapter.plan.latent_format.to_model(raw)[:, :, 1:], ref)


def test_split_text_is_refused_where_it_cannot_be_exact():
    text = torch.zeros(2, 5, 8)
    check_text_split(*kept_text(text[:, :2], None), 2, "sequence parallelism")  # one token per rank: fine
    with pytest.raises(ConfigError, match="2 text tokens split over 4"):
        check_text_split(*kept_text(text[:, :2], None), 4, "sequence parallelism")
    mask = torch.ones(2, 5)
    mask[:, 4:] = 0
    assert kept_text(text, mask)[1] is None and kept_text(text, mask)[0].shape[1] == 4  # common padding: cut
    mask[1, 3:] = 0
    ragged = kept_text(text, mask)
    check_text_split(*ragged, 1, "sequence parallelism")  # one rank applies the mask
    with pytest.raises(ConfigError, match="different lengths"):
        check_text_split(*ragged, 2, "sequence parallelism")
    with pytest.raises(ConfigError, match="different lengths"):
        check_text_split(*ragged, 1, "PipeFusion", masks_allowed=False)
