"""LTX-2, video-only. In process: the adapter's embed -> blocks -> output equals diffusers' transformer forward with
the audio<->video cross-attentions off (``isolate_modalities=True``: then the audio stream cannot reach the video,
which the test shows), for both rotary types and per-video frame rates; the prompts' encoding (Gemma-3 + the text
connectors) equals LTX2Pipeline's; the single-device engine equals a denoise loop of diffusers' scheduler (the
release's dynamic-shift config) and transformer with CFG; LTX-2.3 configs are refused. In real worker processes (gloo): Ulysses, Ring, CFG parallel and PipeFusion equal one
device, PipeFusion after warmup stays within the stale-K/V bound and beats patch-local attention. The VAE decode (one
device and band-parallel on two ranks) equals diffusers' decode."""

from __future__ import annotations

import pytest
import torch
from family_layout_cases import LAYOUTS, FamilyReference, close, layout_result, stale_errors  # tests/ helpers
from pipefusion_cases import STALE_BOUND, STALE_VS_PATCH_LOCAL  # tests/ helper

from dit_devtools.tiny import ensure_tiny_model
from dit_devtools.tiny.ltx2 import ltx2_transformer
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.ltx2.adapter import LTX2Adapter, dynamic_shift
from parallel_runtime.models.families.ltx2.conditioning import LTX2FrameRate
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.model_jobs import decode, encode_text
from parallel_runtime.vae.decode import decode_latent

NAME = "tiny-ltx2"
TEXT_WIDTH = 32
POSITIVE, NEGATIVE = "a red fox runs through snow, slow motion", "blurry"


@pytest.fixture(scope="module")
def comps():
    return load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32)


def _packed(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(2).transpose(1, 2)  # [B, C, T, H, W] -> [B, T*H*W, C] (patch 1)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return ((a - b).norm() / b.norm()).item()


def _theirs(transformer, x, text, mask, t, fps, audio, isolate=True):
    """diffusers' forward on the packed video and an audio stream; the video prediction."""
    frames, height, width = x.shape[2:]
    return transformer(
        hidden_states=_packed(x), audio_hidden_states=audio, encoder_hidden_states=text,
        audio_encoder_hidden_states=text[..., :TEXT_WIDTH], timestep=t, sigma=t, encoder_attention_mask=mask,
        audio_encoder_attention_mask=mask, num_frames=frames, height=height, width=width, fps=fps,
        audio_num_frames=audio.shape[1], isolate_modalities=isolate, return_dict=False,
    )[0]  # fmt: skip


def _conds(seed: int = 0, tokens: tuple[int, int] = (9, 6), rate: float | None = 24.0):
    """Stand-ins for the text connectors' video context: a positive and a shorter negative (padded, masked)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in tokens:
        text, mask = torch.randn(1, 9, TEXT_WIDTH, generator=g), torch.zeros(1, 9)
        mask[:, :n] = 1
        extras = None if rate is None else LTX2FrameRate(torch.tensor([rate]))
        out.append(Conditioning(text, None, mask, extras))
    return out


@torch.no_grad()
def test_adapter_equals_the_transformers_video_only_forward(comps):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 128, 3, 4, 6, generator=g)
    text = torch.randn(2, 9, TEXT_WIDTH, generator=g)
    mask = torch.ones(2, 9)
    mask[0, 7:], mask[1, 5:] = 0, 0  # prompts of different lengths: padded tokens masked
    t = torch.tensor([700.0, 250.0])
    audio = torch.randn(2, 5, 16, generator=g)
    mesh = ParallelMesh.single()
    released = comps.adapter()
    assert released.plan.latent_channels == 128 and released.num_blocks == 2 and released.plan.text_attention == "cross"
    interleaved = LTX2Adapter(ltx2_transformer(rope_type="interleaved", rope_double_precision=False))
    for adapter in (released, interleaved):
        transformer = adapter.transformer
        for rate in (24.0, 12.5):
            ref = _theirs(transformer, x, text, mask, t, rate, audio)
            cond = Conditioning(text, None, mask, LTX2FrameRate(torch.tensor([rate])))
            ours = adapter.forward(x, t / 1000, cond, mesh, SequenceParallelAttention(mesh))
            assert _rel(_packed(ours), ref) <= 1e-6
        # isolated, the audio stream cannot reach the video; the joint forward (a2v on) differs: what we leave out
        assert torch.equal(_theirs(transformer, x, text, mask, t, rate, audio * 3 + 1), ref)
        assert _rel(_theirs(transformer, x, text, mask, t, rate, audio, isolate=False), ref) > 1e-3
    other = released.forward(x, t / 1000, Conditioning(text, None, mask), mesh, SequenceParallelAttention(mesh))
    assert _rel(other, ours) > 1e-4  # the default 24 fps differs from 12.5: the frame rate moves the time positions
    with pytest.raises(ConfigError, match="frame rate"):
        released.forward(x, t, Conditioning(text, None, mask, LTX2FrameRate(torch.tensor([0.0, 24.0]))), mesh,
                         SequenceParallelAttention(mesh))  # fmt: skip


def test_later_releases_are_refused(comps):
    from diffusers import LTX2VideoTransformer3DModel

    config = dict(comps.transformer.config)
    config = LTX2VideoTransformer3DModel.from_config({**config, "cross_attn_mod": True}).config
    with pytest.raises(ConfigError, match="LTX-2.0's video stream") as info:
        LTX2Adapter.make_plan(config, None)
    assert "load the LTX-2.0 transformer" in str(info.value)


@pytest.fixture(scope="module")
def pipe(comps):
    from diffusers import LTX2Pipeline

    return LTX2Pipeline.from_pretrained(comps.path, torch_dtype=torch.float32, audio_vae=None, vocoder=None)


@torch.no_grad()
def test_text_encoding_equals_the_pipelines_encode_prompt_and_connectors(comps, pipe):
    """Gemma-3's every hidden state (prompts left-padded to 1024 tokens), then the connectors' video context and mask:
    what LTX2Pipeline hands its transformer, here for a positive and a shorter negative batched as it batches them."""
    pos, neg = encode_prompts(comps, "ltx2", POSITIVE, NEGATIVE)
    embeds, mask, neg_embeds, neg_mask = pipe.encode_prompt(POSITIVE, NEGATIVE, device="cpu")
    video, _audio, video_mask = pipe.connectors(
        torch.cat([neg_embeds, embeds]), torch.cat([neg_mask, mask]), padding_side="left"
    )
    assert mask.sum() > neg_mask.sum() and pos.prompt_embeds.shape == (1, 1024, TEXT_WIDTH)
    torch.testing.assert_close(torch.cat([neg.prompt_embeds, pos.prompt_embeds]), video, atol=1e-6, rtol=0)
    assert torch.equal(torch.cat([neg.attention_mask, pos.attention_mask]), video_mask)


def test_audio_is_refused_by_the_samplers_latent_check():
    """No audio is sampled: an audio latent (diffusers' [B, 8, frames, mel bins]) is refused on the host, before any
    worker runs, by the sampler's latent check (the video model's 128 channels)."""
    from parallel_runtime.service.input_checks import model_latent

    audio_latent = torch.randn(1, 8, 5, 16)
    with pytest.raises(ConfigError, match="8 channels but this ltx2 model works with 128"):
        model_latent(audio_latent, "ltx2", 128, 3)


@pytest.mark.parametrize("kind", ["audio", "joint"])
def test_audio_and_joint_audio_video_latents_are_refused_by_the_sampler_node(kind):
    """ComfyUI's audio LATENT ({"type": "audio"}, an empty one is all zeros: it would otherwise pass as an empty
    latent of another channel count) and a joint one (samples: a nested video + audio latent, as
    LTXVConcatAVLatent makes) are refused on the host before the model is asked anything (no model here)."""
    from parallel_runtime.service.comfy_graph import sample

    class Nested:  # ComfyUI's NestedTensor: the video and audio latents side by side
        tensors = [torch.zeros(1, 128, 2, 3, 4), torch.zeros(1, 8, 5, 16)]

    latent = {"samples": torch.zeros(1, 8, 5, 16), "type": "audio"} if kind == "audio" else {"samples": Nested()}
    with pytest.raises(ConfigError, match="audio") as info:
        sample(None, None, None, latent, seed=0, steps=1, cfg=1.0, sampler_name="euler", scheduler="simple")
    assert "video stream alone" in str(info.value) and "connect the video latent alone" in str(info.value)


@pytest.fixture(scope="module")
def pipelines(pipe):
    """LTX2Pipeline as released (with a tiny audio VAE: it always samples an audio latent beside the video) and the
    same pipeline with every block's audio->video cross-attention output projection zeroed (weights our engine never
    reads): there the audio stream still runs, but cannot reach the video."""
    import copy

    from diffusers import LTX2Pipeline

    from dit_devtools.tiny.ltx2 import ltx2_audio_vae

    deaf = copy.deepcopy(pipe.transformer)
    with torch.no_grad():
        for block in deaf.transformer_blocks:
            block.audio_to_video_attn.to_out[0].weight.zero_()
            block.audio_to_video_attn.to_out[0].bias.zero_()
    made, audio_vae = {}, ltx2_audio_vae()
    for name, transformer in (("joint", pipe.transformer), ("video only", deaf)):
        made[name] = LTX2Pipeline(**{**pipe.components, "audio_vae": audio_vae, "transformer": transformer})
        made[name].set_progress_bar_config(disable=True)
    return made


@torch.no_grad()
def test_single_device_equals_ltx2_pipeline_with_its_audio_kept_from_the_video(comps, pipelines):
    """LTX2Pipeline from the prompts (Gemma-3 + connectors, CFG 3, its dynamic-shift sigmas, its own latent
    normalisation), with its extra guidance terms off (STG 0, modality guidance 1, rescale 0: ComfyUI's plain CFG),
    is our engine's result once the audio cannot steer the video (the audio->video output projections zeroed; the
    audio stream still runs): equal to 1e-4 (bitwise on this machine). As released, its joint audio-video forward
    lets the generated audio steer the video, which our video-only engine leaves out by design: that pipeline's video
    differs (~0.4 relative on these random weights) - why the zeroed pipeline is the oracle."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

    noise = torch.randn(1, 128, 2, 3, 4, generator=torch.Generator().manual_seed(3))
    steps, cfg = 3, 3.0
    run = dict(prompt=POSITIVE, negative_prompt=NEGATIVE, height=96, width=128, num_frames=9, frame_rate=24.0,
               num_inference_steps=steps, guidance_scale=cfg, audio_guidance_scale=cfg, stg_scale=0.0,
               audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0, guidance_rescale=0.0,
               audio_guidance_rescale=0.0, output_type="latent", return_dict=False)  # fmt: skip
    got = {}
    for name, pipeline in pipelines.items():
        got[name] = pipeline(latents=_packed(noise), generator=torch.Generator().manual_seed(5), **run)[0]
    sigmas = pipelines["video only"].scheduler.sigmas.float()
    tokens = noise[0, 0].numel()
    assert calculate_shift(tokens, 1024, 4096, 0.95, 2.05) == pytest.approx(dynamic_shift(tokens))
    adapter = comps.adapter()
    settings = SamplingSettings(seed=0, cfg=cfg, sampler="euler", sigmas=sigmas)
    pos, neg = encode_prompts(comps, "ltx2", POSITIVE, NEGATIVE)
    ours = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, torch.zeros_like(noise), settings,
        start_model_space=noise,
    )  # fmt: skip
    ours = _raw(comps.vae, adapter.plan.latent_format.to_model(ours))  # the pipeline un-normalises its latent
    video_only, joint = _rel(ours, got["video only"]), _rel(ours, got["joint"])
    print(f"LTX-2 engine vs LTX2Pipeline: audio kept from the video {video_only:.2e}, joint audio-video {joint:.2e}")
    assert _rel(got["video only"], _raw(comps.vae, noise)) > 0.1  # it denoised
    assert video_only <= 1e-4
    assert joint > 1e-2  # the audio->video path is what differs


class LTX2Reference(FamilyReference):
    """The tiny LTX-2's single-device results on a 3 x 3 x 5 latent (45 tokens: divisible by neither 2 nor 4), its
    own Gemma-3 and connectors encoding the prompts."""

    def __init__(self):
        self.path = str(ensure_tiny_model(NAME))
        self.components = load_pipeline_components(self.path, "cpu", torch.float32)
        self.adapter = self.components.adapter()
        pos, neg = encode_prompts(self.components, "ltx2", POSITIVE, NEGATIVE)
        rate = LTX2FrameRate(torch.tensor([25.0]))
        self.pos, self.neg = (Conditioning(c.prompt_embeds, None, c.attention_mask, rate) for c in (pos, neg))
        self.latent = torch.zeros(1, 128, 3, 3, 5)
        self.steps, self.cfg = 3, 3.0
        self.results = {}


@pytest.fixture(scope="module")
def reference():
    return LTX2Reference()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_equals_single_device(cpu_pool, reference, layout):
    assert close(layout_result(cpu_pool, reference, layout), reference.result())


def test_pipefusion_after_warmup_stays_within_the_stale_bound(cpu_pool, reference):
    """One warmup step, then stale K/V: within the bound, and several times closer than each patch attending only to
    its own tokens (stale K/V off)."""
    stale, local = stale_errors(cpu_pool, reference, (2, 3))
    assert all(0 < e < STALE_BOUND for e in stale.values()), stale
    assert local > STALE_VS_PATCH_LOCAL * stale[3], (stale, local)


@torch.no_grad()
def test_vae_decode_equals_diffusers(comps):
    vae = comps.vae
    z = torch.randn(1, 128, 2, 3, 2, generator=torch.Generator().manual_seed(1))
    ours = decode_latent(vae, z, ParallelMesh.single(), None)
    torch.testing.assert_close(ours, vae.decode(_raw(vae, z)).sample, atol=1e-5, rtol=0)
    assert ours.shape == (1, 3, 9, 96, 64)


def _raw(vae, z: torch.Tensor) -> torch.Tensor:
    """The model-space latent un-normalised with the VAE's statistics, as LTX2Pipeline does before vae.decode."""
    shape = (1, -1, 1, 1, 1)
    return z * vae.latents_std.view(shape) / vae.config.scaling_factor + vae.latents_mean.view(shape)


@pytest.mark.parametrize("rows", [3, 4])
def test_vae_decode_band_parallel_equals_diffusers(cpu_pool, reference, rows):
    """The decode job on Ulysses 2: each rank decodes a band of every frame's rows, the convs' halos exchanged and the
    clip's top and bottom rows reflected (4 latent rows: 2 + 2; 3 rows: too few for two bands of the minimum 2, one
    rank decodes them all while the other sits out), equal to diffusers' decode of the whole clip."""
    pool = cpu_pool(LAYOUTS["ulysses2"])
    reference.load(pool)
    if rows == 4:  # Parallel Text Encode's job: Gemma-3 + the connectors on the workers, as in process
        (got,) = pool.submit(encode_text, [POSITIVE]).result(120)
        torch.testing.assert_close(got.prompt_embeds, reference.pos.prompt_embeds)
        assert torch.equal(got.attention_mask, reference.pos.attention_mask)
    z = torch.randn(1, 128, 2, rows, 5, generator=torch.Generator().manual_seed(rows))
    image = pool.submit(decode, z).result(300)
    vae = reference.components.vae
    with torch.no_grad():
        own = vae.decode(_raw(vae, z)).sample
    assert image.shape == (9, 32 * rows, 160, 3)
    torch.testing.assert_close(image, ((own + 1) / 2).clamp(0, 1)[0].movedim(0, -1), atol=2e-5, rtol=0)


def test_the_shipped_tiny_ltx2_workflow_runs(pool_registry):
    """workflows/tiny_ltx2_cpu_smoke.json (the built-in tiny-ltx2: Gemma-3 + connectors on the workers, a 9-frame
    latent, Ulysses 2, the band-parallel decode) through our node classes with the real runtime (one pool start;
    every layout's numbers are tested above)."""
    import importlib
    import json

    from pack_import import ROOT, load_pack  # tests/ helpers
    from test_workflows import run_ui_workflow

    from parallel_runtime.models.builtin import BUILTIN_MODELS

    assert NAME in BUILTIN_MODELS
    context = importlib.import_module(f"{load_pack().__name__}.nodes.context")
    bridge = importlib.import_module(f"{load_pack().__name__}.nodes.bridge")
    data = json.loads((ROOT / "workflows" / "tiny_ltx2_cpu_smoke.json").read_text(encoding="utf-8"))
    ctx = context.NodeContext.create(registry=pool_registry, bridge=bridge.ComfyBridge())
    sink = next(n["id"] for n in data["nodes"] if n["type"] == "PreviewImage")
    (frames,) = run_ui_workflow(data, ctx, {"DiTParallelSampler": {"steps": 2}})[sink]
    assert frames.shape == (9, 64, 128, 3) and 0.0 <= float(frames.min()) <= float(frames.max()) <= 1.0
    assert float(frames.std()) > 0 and (frames[0] - frames[-1]).abs().max() > 0
