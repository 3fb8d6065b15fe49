"""HunyuanVideo 1.5 (not in ComfyUI 0.3.64: diffusers' pipeline is the oracle). In process: the adapter's embed ->
blocks -> output equals the transformer's forward (glyph + prompt text, padding cut or masked), the text encoding
equals HunyuanVideo15Pipeline.encode_prompt (Qwen2.5-VL chat + ByT5 glyph text), the single-device engine equals
HunyuanVideo15Pipeline with CFG, the VAE decode equals diffusers'. In real worker processes (gloo): Ulysses,
Ring, Ulysses x Ring, CFG parallel and PipeFusion equal one device, and the VAE decoded band-parallel too."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.hunyuan_video15.conditioning import GlyphText
from parallel_runtime.models.families.hunyuan_video15.text import glyph_prompt, template_crop
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode, generate
from parallel_runtime.vae.decode import decode_latent

FAMILY = "hunyuan-video-1.5"
NAME = "tiny-hunyuan-video-1.5"
POSITIVE, NEGATIVE = 'a shop window with a sign that says "open", warm light', "blurry, static"
LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "cfg2": ParallelConfig(cfg=2),
    "pp2": ParallelConfig(pp=2),
    "ulysses2xring2": ParallelConfig(ring=2, ulysses=2),
}


@pytest.fixture(scope="module")
def comps():
    return load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32)


@pytest.fixture(scope="module")
def pipe(comps):
    from diffusers import HunyuanVideo15Pipeline

    pipe = HunyuanVideo15Pipeline.from_pretrained(comps.path, torch_dtype=torch.float32)
    pipe.prompt_template_encode_start_idx = template_crop(pipe.tokenizer)  # 108 with the released tokenizer
    return pipe


def _close(ours: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> None:
    assert ours.shape == ref.shape
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= tol, f"relative L2 error {err:.2e}"


@torch.no_grad()
def test_adapter_equals_the_transformers_forward(comps):
    adapter = comps.adapter()
    assert adapter.plan.latent_channels == 8 and adapter.num_blocks == 2 and not adapter.plan.guidance_embed
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 3, 4, 6, generator=g)
    mllm, byt5 = torch.randn(2, 9, 32, generator=g), torch.randn(2, 6, 32, generator=g)
    m1, m2 = torch.ones(2, 9), torch.ones(2, 6)
    m1[0, 7:], m1[1, 5:], m2[:, 4:], m2[1, 2:] = 0, 0, 0, 0  # different lengths: masked (one rank)
    t = torch.tensor([700.0, 250.0])
    zeros = torch.zeros(2, 9, 3, 4, 6)
    ref = comps.transformer(
        torch.cat([x, zeros], 1), t, mllm, m1, encoder_hidden_states_2=byt5, encoder_attention_mask_2=m2,
        image_embeds=torch.zeros(2, 729, 16),
    ).sample  # fmt: skip
    mesh = ParallelMesh.single()
    ours = comps.adapter().forward(x, t, Conditioning(mllm, None, m1, GlyphText(byt5, m2)), mesh,
                                   SequenceParallelAttention(mesh, "sdpa"))  # fmt: skip
    _close(ours, ref, 1e-6)


@torch.no_grad()
def test_text_encoding_equals_the_pipelines_encode_prompt(comps, pipe):
    prompts = [POSITIVE, "a dog"]  # glyph text in one prompt only; prompts of different lengths
    ref, ref_mask, ref2, ref_mask2 = pipe.encode_prompt(prompts, device="cpu", batch_size=2)
    ours = encode_prompts(comps, FAMILY, prompts, "")[0]
    kept, kept2 = int(ref_mask.sum(1).max()), int(ref_mask2.sum(1).max())
    torch.testing.assert_close(ours.prompt_embeds, ref[:, :kept])
    torch.testing.assert_close(ours.attention_mask, ref_mask[:, :kept])
    torch.testing.assert_close(ours.extras.byt5, ref2[:, :kept2])
    torch.testing.assert_close(ours.extras.byt5_mask, ref_mask2[:, :kept2])
    one = encode_prompts(comps, FAMILY, "a dog", "")[0]  # no quotes: no glyph tokens, no mask
    assert one.attention_mask is None and one.extras.byt5.shape[1] == 0
    assert glyph_prompt('say "hi" and “bye”, "hi"') == 'Text "hi". Text "bye". '


@torch.no_grad()
def test_t2v_matches_diffusers_hunyuan_video15_pipeline(comps, pipe):
    from diffusers import ClassifierFreeGuidance

    pos, neg = encode_prompts(comps, FAMILY, POSITIVE, NEGATIVE)

    def inputs(c: Conditioning, prefix: str) -> dict:
        glyph = c.extras.byt5 if c.extras.byt5.shape[1] else torch.zeros(1, 1, 32)
        return {
            f"{prefix}prompt_embeds": c.prompt_embeds,
            f"{prefix}prompt_embeds_mask": torch.ones(c.prompt_embeds.shape[:2]),
            f"{prefix}prompt_embeds_2": glyph,
            f"{prefix}prompt_embeds_mask_2": torch.ones(glyph.shape[:2]) * bool(c.extras.byt5.shape[1]),
        }

    noise = torch.randn(1, 8, 3, 2, 2, generator=torch.Generator().manual_seed(3))
    pipe.guider = ClassifierFreeGuidance(guidance_scale=4.0)
    ref = pipe(
        **inputs(pos, ""), **inputs(neg, "negative_"), height=32, width=32, num_frames=9, num_inference_steps=3,
        latents=noise, output_type="latent",
    ).frames  # fmt: skip
    adapter = comps.adapter()
    settings = SamplingSettings(seed=0, cfg=4.0, sampler="euler", sigmas=pipe.scheduler.sigmas.float())
    raw = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, torch.zeros_like(noise), settings,
        start_model_space=noise,
    )  # fmt: skip
    _close(adapter.plan.latent_format.to_model(raw), ref)


@torch.no_grad()
def test_vae_decode_equals_diffusers(comps):
    z = torch.randn(1, 8, 3, 3, 2, generator=torch.Generator().manual_seed(1))
    ours = decode_latent(comps.vae, z, ParallelMesh.single(), None)
    torch.testing.assert_close(ours, comps.vae.decode(z).sample, atol=1e-5, rtol=0)
    assert ours.shape == (1, 3, 9, 48, 32)


class Case:
    """The tiny model's conditioning and its single-device result (a glyph text and a negative)."""

    def __init__(self):
        self.path = str(ensure_tiny_model(NAME))
        comps = load_pipeline_components(self.path, "cpu", torch.float32)
        adapter = comps.adapter()
        self.pos, self.neg = encode_prompts(comps, FAMILY, POSITIVE, NEGATIVE)
        self.latent = torch.zeros(1, 8, 3, 3, 5)  # 45 tokens: divisible by neither 2 nor 4
        self.settings = SamplingSettings(seed=5, steps=3, cfg=4.0, sampler="euler_ancestral", scheduler="simple")
        ms = model_sampling_for(adapter)
        mesh = ParallelMesh.single()
        self.expected = denoise_latent(adapter, mesh, ms, self.pos, self.neg, self.latent, self.settings)


@pytest.fixture(scope="module")
def case() -> Case:
    return Case()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_equal_single_device(cpu_pool, case, layout):
    pool = cpu_pool(LAYOUTS[layout])
    pool.submit(load_model, case.path, "fp32", "sdpa").result(300)
    kwargs = {"patches": 3, "warmup": case.settings.steps} if layout == "pp2" else {}
    got = pool.submit(generate, case.pos, case.neg, case.latent, case.settings, **kwargs).result(600)
    _close(got, case.expected, 1e-5)
    if layout == "ulysses2":  # the decode job: the VAE's rows over the two ranks, equal to diffusers' decode
        image = pool.submit(decode, case.expected).result(300)
        comps = load_pipeline_components(case.path, "cpu", torch.float32, parts=("vae",))
        with torch.no_grad():
            own = comps.vae.decode(case.expected).sample
        assert image.shape == (9, 48, 80, 3)
        torch.testing.assert_close(image, ((own + 1) / 2).clamp(0, 1)[0].movedim(0, -1), atol=2e-5, rtol=0)


def test_glyph_text_survives_the_conditioning_of_parallel_text_encode():
    """Parallel Text Encode's CONDITIONING carries the family's extra inputs (the glyph states) to the sampler."""
    from parallel_runtime.service import comfy_conditioning as conditioning  # what the nodes hand CONDITIONING to

    comps = load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32, parts=("text",))
    cond = encode_prompts(comps, FAMILY, POSITIVE, "")[0]
    assert cond.extras.byt5.shape[1] > 0
    expected = {"embed_dim": 32, "pooled_dim": None, "image_dim": None}
    (entry,) = conditioning.to_branch(conditioning.from_runtime(cond), expected, FAMILY)
    assert entry.cond.extras is cond.extras and torch.equal(entry.cond.prompt_embeds, cond.prompt_embeds)
