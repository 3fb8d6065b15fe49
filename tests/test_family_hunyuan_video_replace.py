"""HunyuanVideo-I2V "v2 (replace)" (ComfyUI's HunyuanImageToVideo guidance_type "v2 (replace)": the start image
on the LATENT's first frame, kept by its noise mask, and that frame's tokens modulated with the guiding frame's
vector): our engine equals ComfyUI 0.3.64's KSampler (tests/data/comfy_hunyuan_video_replace_reference.json) on
one device, through the nodes (ComfyUI's CONDITIONING and LATENT into Parallel Sampler on 1 rank and Ulysses 2: the
first frame's tokens on rank 0) and on the other layouts (across ranks 0 and 1 under Ulysses x Ring; PipeFusion
bands; CFG parallel with a negative that has no guiding frame), and diffusers' HunyuanVideoImageToVideoPipeline on
a token-replace transformer where the two agree (no guidance input). And "custom" (the start image's latent as
reference tokens) against ComfyUI on one device, Ulysses x Ring, PipeFusion 2 and PipeFusion 2 x CFG 2 (the reference
tokens with each step's first patch, the other patches reading their kept K/V)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from comfy_ksampler_cases import load_manual  # tests/ helper
from node_helpers import RecordingBridge  # tests/ helper
from pack_import import load_pack  # tests/ helper
from test_family_hunyuan_video_comfy import conditioning, files, generated, tensor  # noqa: F401 (fixture)
from test_family_hunyuan_video_parallel import LAYOUTS, close, run

from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.hunyuan_video.adapter import HunyuanVideoAdapter
from parallel_runtime.models.families.hunyuan_video.conditioning import HunyuanImageInputs
from parallel_runtime.models.families.hunyuan_video.latent import HUNYUAN_VIDEO
from parallel_runtime.models.single_file import load_single_file_components
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.tools.bench_pipefusion import generate_with_stats

REF = json.loads((Path(__file__).parent / "data" / "comfy_hunyuan_video_replace_reference.json").read_text())
CASE = REF["replace"]
GUIDING = HunyuanImageInputs(guiding_timestep=torch.tensor([float(CASE["guiding_frame_index"])]))


def inputs(index: int):
    """(positive branch, negative, LATENT samples, noise mask, settings) of reference run ``index``."""
    run_ref = CASE["runs"][index]
    settings = SamplingSettings(
        seed=run_ref["seed"],
        steps=run_ref["steps"],
        cfg=run_ref["cfg"],
        sampler=run_ref["sampler"],
        scheduler=run_ref["scheduler"],
    )
    positive = (CondEntry(conditioning(CASE["positive"], GUIDING), guidance=run_ref["guidance"]),)
    negative = conditioning(CASE["negative"])  # HunyuanImageToVideo sets the guiding frame on the positive only
    return positive, negative, tensor(CASE["latent"]), tensor(CASE["noise_mask"]), settings


@pytest.mark.parametrize("index", [0, 1], ids=["euler-guidance4.5", "euler_ancestral-cfg2.5"])
def test_v2_replace_equals_comfyui_on_one_device(files, index):  # noqa: F811
    assert CASE["model"]["comfy_model_class"] == "HunyuanVideo"  # ComfyUI loads the 16-channel I2V file so too
    adapter = load_single_file_components(files["t2v"], "cpu", torch.float32).adapter()
    positive, negative, latent, mask, settings = inputs(index)
    out = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), positive, negative, latent, settings,
        noise_mask=mask,
    )  # fmt: skip
    expected = tensor(CASE["runs"][index]["output"])
    close(out, expected)
    torch.testing.assert_close(out[:, :, :1], latent[:, :, :1])  # the start frame stays the image's latent
    # without the guiding frame's modulation (the start frame as any other token) the result is not ComfyUI's
    plain = (CondEntry(conditioning(CASE["positive"]), guidance=CASE["runs"][index]["guidance"]),)
    other = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), plain, negative, latent, settings,
        noise_mask=mask,
    )  # fmt: skip
    assert ((other - expected).norm() / expected.norm()).item() > 1e-3


@pytest.mark.parametrize("layout", ["1rank", "ulysses2"])
def test_v2_replace_graph_equals_comfyui(pool_registry, files, layout):  # noqa: F811
    """HunyuanImageToVideo "v2 (replace)"'s CONDITIONING (guiding_frame_index, FluxGuidance's guidance) and LATENT
    (noise_mask) into Parallel Sampler: the Parallel Model Loader's model of the file from models/diffusion_models.
    36 video tokens, the first frame's 12: all on rank 0 under Ulysses 2."""
    load_pack()
    from dit_parallel_pack.nodes.context import NodeContext
    from dit_parallel_pack.nodes.sampler import ParallelSampler

    bridge = RecordingBridge(folders={"diffusion_models": [str(files["t2v"].parent)]})
    ctx = NodeContext.create(registry=pool_registry, bridge=bridge)
    config = ParallelConfig() if layout == "1rank" else LAYOUTS[layout]
    handle = load_manual(ctx, files["t2v"].name, f"cpu:{config.world_size}", config)
    run_ref = CASE["runs"][0]
    options = {"pooled_output": generated(CASE["positive"]["pooled"]), "guidance": run_ref["guidance"]}
    positive = [[generated(CASE["positive"]["llama"]), {**options, "guiding_frame_index": 0}]]
    negative = [[generated(CASE["negative"]["llama"]), {"pooled_output": generated(CASE["negative"]["pooled"])}]]
    latent = {"samples": tensor(CASE["latent"]), "noise_mask": tensor(CASE["noise_mask"])}
    settings = (run_ref["seed"], run_ref["steps"], run_ref["cfg"], run_ref["sampler"], run_ref["scheduler"], 1.0)
    (out,) = ParallelSampler(ctx).sample(handle, positive, negative, latent, *settings)["result"]
    close(out["samples"], tensor(run_ref["output"]))


@pytest.mark.parametrize("layout", ["ulysses2xring2", "pp2", "cfg2"])
def test_v2_replace_layouts_equal_comfyui(cpu_pool, files, layout):  # noqa: F811
    """The first frame's 12 tokens across ranks 0 and 1 (4 ranks of 9), in PipeFusion's row bands (warmup over
    every step: exact), CFG parallel (the negative runs without the guiding frame, as ComfyUI runs it)."""
    index = 1 if layout == "cfg2" else 0
    positive, negative, latent, mask, settings = inputs(index)
    kwargs = {"patches": 3, "warmup": settings.steps} if layout == "pp2" else {}
    pool = cpu_pool(LAYOUTS[layout])
    out = run(pool, files["t2v"], positive, negative, latent, settings, noise_mask=mask, **kwargs)
    close(out, tensor(CASE["runs"][index]["output"]))


@torch.no_grad()
def test_v2_replace_equals_diffusers_image_to_video_pipeline():
    """A token-replace transformer without guidance input (where ComfyUI and diffusers agree: diffusers leaves
    the embedded guidance out of the guiding frame's vector) in HunyuanVideoImageToVideoPipeline (initial latent
    0.999 x noise + 0.001 x the image latent; the first frame replaced by the image latent before every step)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideoImageToVideoPipeline
    from PIL import Image

    from dit_devtools.tiny.hunyuan_video import hunyuan_video_transformer, hunyuan_video_vae

    transformer = hunyuan_video_transformer(seed=5, guidance_embeds=False, image_condition_type="token_replace")
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=7.0)
    pipe = HunyuanVideoImageToVideoPipeline(
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None, image_processor=None,
        scheduler=scheduler, transformer=transformer, vae=hunyuan_video_vae(),
    )  # fmt: skip
    g = torch.Generator().manual_seed(6)
    text, pooled = torch.randn(1, 7, 32, generator=g), torch.randn(1, 32, generator=g)
    image = Image.fromarray((torch.rand(32, 32, 3, generator=g) * 255).byte().numpy())
    start = pipe.vae.encode(pipe.video_processor.preprocess(image, 32, 32).unsqueeze(2)).latent_dist.mode()
    noise = torch.randn(1, 16, 3, 4, 4, generator=g)
    ref = pipe(
        image=image, prompt_embeds=text, pooled_prompt_embeds=pooled, prompt_attention_mask=torch.ones(1, 7),
        height=32, width=32, num_frames=9, num_inference_steps=3, latents=noise, output_type="latent",
    ).frames  # fmt: skip
    adapter = HunyuanVideoAdapter(transformer)
    latent = torch.zeros(1, 16, 3, 4, 4)
    latent[:, :, :1] = start  # HunyuanImageToVideo "v2 (replace)": the LATENT holds the start image's latent
    mask = torch.ones(1, 1, 3, 4, 4)
    mask[:, :, :1] = 0
    first = noise * 0.999 + start.repeat(1, 1, 3, 1, 1) * HUNYUAN_VIDEO.scale * 0.001
    settings = SamplingSettings(seed=0, cfg=1.0, sampler="euler", sigmas=pipe.scheduler.sigmas.float())
    cond = Conditioning(text, pooled, extras=HunyuanImageInputs(guiding_timestep=torch.zeros(1)))
    raw = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), cond, None, latent, settings,
        start_model_space=first, noise_mask=mask,
    )  # fmt: skip
    ours = HUNYUAN_VIDEO.to_model(raw)
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= 1e-4, f"relative L2 error {err:.2e} against diffusers"


CUSTOM = REF["custom"]


def custom_inputs():
    run_ref = CUSTOM["runs"][0]
    settings = SamplingSettings(
        seed=run_ref["seed"],
        steps=run_ref["steps"],
        cfg=run_ref["cfg"],
        sampler=run_ref["sampler"],
        scheduler=run_ref["scheduler"],
    )
    extras = HunyuanImageInputs(ref_latent=tensor(CUSTOM["ref_latent"]))
    positive = (CondEntry(conditioning(CUSTOM["positive"], extras), guidance=run_ref["guidance"]),)
    return positive, conditioning(CUSTOM["negative"]), tensor(CUSTOM["latent"]), settings


def test_custom_reference_latent_equals_comfyui_on_one_device(files):  # noqa: F811
    """HunyuanImageToVideo "custom": the start image's tokens join the video's (frame -1, beside it) on the
    positive only; CFG 2 over a negative without them."""
    adapter = load_single_file_components(files["t2v"], "cpu", torch.float32).adapter()
    positive, negative, latent, settings = custom_inputs()
    out = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), positive, negative, latent, settings
    )
    expected = tensor(CUSTOM["runs"][0]["output"])
    close(out, expected)
    plain = (CondEntry(conditioning(CUSTOM["positive"]), guidance=CUSTOM["runs"][0]["guidance"]),)
    other = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), plain, negative, latent, settings
    )
    assert ((other - expected).norm() / expected.norm()).item() > 1e-3  # the reference tokens matter


def test_custom_reference_latent_on_ulysses_x_ring_equals_comfyui(cpu_pool, files):  # noqa: F811
    """The reference's tokens split over four ranks with the video's; the negative's shorter sequence is a layout
    of its own."""
    positive, negative, latent, settings = custom_inputs()
    out = run(cpu_pool(LAYOUTS["ulysses2xring2"]), files["t2v"], positive, negative, latent, settings)
    close(out, tensor(CUSTOM["runs"][0]["output"]))


# -- "custom" under PipeFusion: the reference's tokens ride with each step's first patch, the other patches read
# their kept K/V (the video's positions do not move: the reference sits at frame -1, beside the frame) ----------
# Stale K/V (warmup 1, 2 patches, per_step) as a share of the seed-to-seed difference: measured 0.0138 on pp 2
# and on pp 2 x CFG 2 (patch-local attention, stale K/V off: 0.0560).
CUSTOM_STALE_BOUND = 0.03


def custom_pipefusion(pool, warmup: int, patches: int, seed: int | None = None, stale_kv: bool = True):
    """(latent, per-rank stats) of the "custom" case under PipeFusion (reference_kv per_step)."""
    positive, negative, latent, settings = custom_inputs()
    settings = settings if seed is None else dataclasses.replace(settings, seed=seed)
    job = (positive, negative, latent, settings, patches, warmup, stale_kv, "step", "per_step")
    per_rank = pool.submit(generate_with_stats, *job, result_rank="all").result(300)
    return per_rank[0]["latent"].reshape(latent.shape), [r["stats"] for r in per_rank]


def custom_stale_shares(pool, expected: torch.Tensor, *latents: torch.Tensor) -> list[float]:
    """Each latent's mean difference from ComfyUI's as a share of what a seed change makes (the yardstick of the
    other PipeFusion stale-K/V tests; the full-warmup run of the next seed equals one device's)."""
    run_ref = CUSTOM["runs"][0]
    shifted = custom_pipefusion(pool, warmup=run_ref["steps"], patches=2, seed=run_ref["seed"] + 1)[0]
    yardstick = float((shifted - expected).abs().mean())
    return [float((x - expected).abs().mean()) / yardstick for x in latents]


def stage0_activation_bytes(warmup: int, patches: int) -> int:
    """What stage 0 sends over a run (fp32): per step and stream its video tokens and (the positive's) reference
    tokens once, and per item the stream's text tokens and two time vectors (temb, temb_out). Width: ComfyUI's
    128 x heads (tests/data/hunyuan_video_tiny_weights.py)."""
    positive, negative, latent, settings = custom_inputs()
    frames, rows, cols = latent.shape[2:]
    video, width = frames * (rows // 2) * (cols // 2), 128 * CUSTOM["model"]["config"]["heads"]
    refs = HunyuanImageInputs(ref_latent=tensor(CUSTOM["ref_latent"])).reference_token_count()
    streams = ((refs, positive[0].cond.prompt_embeds.shape[1]), (0, negative.prompt_embeds.shape[1]))
    tokens = sum(
        video + ref + (1 if step < warmup else patches) * (text + 2)
        for step in range(settings.steps)
        for ref, text in streams
    )
    return 4 * width * tokens


def test_custom_reference_latent_under_pipefusion(cpu_pool, files):  # noqa: F811
    """PipeFusion 2, every step a warmup step: ComfyUI's result. Warmup 1, 2 patches: within CUSTOM_STALE_BOUND of
    the seed-to-seed difference, closer than patch-local attention (stale K/V off: the second patch sees neither
    the first's tokens nor the reference's). Each stage runs the reference's 12 tokens once per step (the positive's
    stream; the negative has none), not once per patch, and stage 0 sends them once per step (bytes: the formula)."""
    pool = cpu_pool(LAYOUTS["pp2"])
    pool.submit(load_model, str(files["t2v"]), "fp32", "sdpa").result(300)
    expected = tensor(CUSTOM["runs"][0]["output"])
    steps = CUSTOM["runs"][0]["steps"]
    exact, exact_stats = custom_pipefusion(pool, warmup=steps, patches=2)
    close(exact, expected)
    stale, stats = custom_pipefusion(pool, warmup=1, patches=2)
    local, _ = custom_pipefusion(pool, warmup=1, patches=2, stale_kv=False)
    error, local_error = custom_stale_shares(pool, expected, stale, local)
    print(f"hunyuan-video custom, pp 2, warmup 1, 2 patches: {error:.4f} of the seed-to-seed difference "
          f"(patch-local {local_error:.4f})")  # fmt: skip
    assert 0 < error < CUSTOM_STALE_BOUND and error < local_error, (error, local_error)
    frames, rows, cols = CUSTOM["ref_latent"]["shape"][2:]
    blocks = CUSTOM["model"]["config"]["double_blocks"] + CUSTOM["model"]["config"]["single_blocks"]
    per_step = frames * (rows // 2) * (cols // 2) * blocks // 2  # a stage's share of the blocks
    assert [s.reference_tokens for s in stats] == [steps * per_step] * 2, stats
    assert [s.reference_tokens for s in exact_stats] == [steps * per_step] * 2, exact_stats
    for per_rank, warmup in ((stats, 1), (exact_stats, steps)):  # the reference's activations: once per step too
        assert per_rank[0].sent_bytes["pp_act"] == stage0_activation_bytes(warmup, 2), per_rank[0].sent_bytes


def test_custom_reference_latent_under_pipefusion_x_cfg_parallel(cpu_pool, files):  # noqa: F811
    """PipeFusion 2 x CFG 2: the positive's pipeline (cfg rank 0) keeps the reference K/V, the negative's has
    none (a shorter sequence); ComfyUI's result with every step a warmup step, within the bound with warmup 1."""
    pool = cpu_pool(ParallelConfig(pp=2, cfg=2))
    pool.submit(load_model, str(files["t2v"]), "fp32", "sdpa").result(300)
    run_ref = CUSTOM["runs"][0]
    expected = tensor(run_ref["output"])
    close(custom_pipefusion(pool, warmup=run_ref["steps"], patches=2)[0], expected)
    stale, stats = custom_pipefusion(pool, warmup=1, patches=2)
    (error,) = custom_stale_shares(pool, expected, stale)
    print(f"hunyuan-video custom, pp 2 x cfg 2, warmup 1, 2 patches: {error:.4f} of the seed-to-seed difference")
    assert 0 < error < CUSTOM_STALE_BOUND, error
    assert sorted(s.reference_tokens > 0 for s in stats) == [False, False, True, True], stats  # the positive's
