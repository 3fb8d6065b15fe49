"""HunyuanVideo 1.0 across ranks in real worker processes (gloo): every layout gives ComfyUI's KSampler output
(tests/data/comfy_hunyuan_video_reference.json) on the same Tencent-layout file, as one device does
(test_family_hunyuan_video_comfy.py): Ulysses, Ring, Ulysses x Ring (text and video tokens split over four
ranks), CFG parallel, PipeFusion (warmup over every step: exact; stale K/V: within its bound); image-to-video
under Ulysses and CFG; Parallel Text Encode on the workers; and the causal 3-D VAE decoded band-parallel equal
to one device (ComfyUI's decode for its file, diffusers' for a folder; ranks without rows sit out)."""

from __future__ import annotations

import pytest
import torch
from test_family_hunyuan_video_comfy import REF, files, i2v_inputs, t2v_inputs, tensor  # noqa: F401 (fixture)

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode, encode_text, generate
from parallel_runtime.vae.bands import plan_band_rows
from parallel_runtime.vae.decode import decode_to_image_tensor
from parallel_runtime.vae.file import load_vae_file
from tests.dist_jobs import hunyuan_video_jobs

LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "cfg2": ParallelConfig(cfg=2),
    "pp2": ParallelConfig(pp=2),
    "ulysses2xring2": ParallelConfig(ring=2, ulysses=2),
}
TOLERANCE = 1e-4


def close(got: torch.Tensor, expected: torch.Tensor, tol: float = TOLERANCE) -> float:
    assert got.shape == expected.shape
    err = ((got - expected).norm() / expected.norm()).item()
    assert err <= tol, f"relative L2 difference {err:.2e}"
    return err


def run(pool, path, positive, negative, latent, settings, **kwargs) -> torch.Tensor:
    pool.submit(load_model, str(path), "fp32", "sdpa").result(300)
    return pool.submit(generate, positive, negative, latent, settings, **kwargs).result(600)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_text_to_video_layouts_equal_comfyui(cpu_pool, files, layout):  # noqa: F811
    """True CFG over a FluxGuidance'd positive with euler_ancestral (ComfyUI's noise on every rank)."""
    run_ref = REF["t2v"]["runs"][1]
    positive, negative, latent, settings = t2v_inputs(run_ref)
    kwargs = {"patches": 3, "warmup": settings.steps} if layout == "pp2" else {}
    out = run(cpu_pool(LAYOUTS[layout]), files["t2v"], positive, negative, latent, settings, **kwargs)
    close(out, tensor(run_ref["output"]))


def test_pipefusion_stale_kv_stays_within_its_bound(cpu_pool, files):  # noqa: F811
    """After one whole-latent warmup step the patches attend to stale K/V of the others: close to ComfyUI's, not
    equal (the stale-K/V-off exactness is the pp2 case above)."""
    run_ref = REF["t2v"]["runs"][0]
    positive, negative, latent, settings = t2v_inputs(run_ref)
    out = run(cpu_pool(LAYOUTS["pp2"]), files["t2v"], positive, negative, latent, settings, patches=3, warmup=1)
    err = ((out - tensor(run_ref["output"])).norm() / tensor(run_ref["output"]).norm()).item()
    assert 1e-6 < err < 0.05, f"stale K/V error {err:.2e}"


@pytest.mark.parametrize("layout", ["ulysses2", "ring2", "cfg2", "pp2"])
def test_image_to_video_layouts_equal_comfyui(cpu_pool, files, layout):  # noqa: F811
    """Guidance "v1 (concat)": the start image's latent and mask join the latent's channels before the tokens are
    split (or the patches cut: PipeFusion with every step a warmup step is exact)."""
    positive, negative, latent, settings = i2v_inputs()
    kwargs = {"patches": 3, "warmup": settings.steps} if layout == "pp2" else {}
    out = run(cpu_pool(LAYOUTS[layout]), files["i2v"], positive, negative, latent, settings, **kwargs)
    close(out, tensor(REF["i2v"]["output"]))


def test_text_encode_and_decode_jobs_on_the_workers(cpu_pool):
    """Parallel Text Encode runs Llama + CLIP-L on the workers; the decode job gives the folder VAE's own decode
    (diffusers' frame-causal attention) as IMAGE frames [4T-3, H, W, 3]."""
    path = str(ensure_tiny_model("tiny-hunyuan-video"))
    pool = cpu_pool(LAYOUTS["ulysses2"])
    pool.submit(load_model, path, "fp32", "sdpa").result(300)
    (got,) = pool.submit(encode_text, ["a paper boat drifting down a gutter"]).result(120)
    comps = load_pipeline_components(path, "cpu", torch.float32, parts=("text", "vae"))
    expected = encode_prompts(comps, "hunyuan-video", "a paper boat drifting down a gutter")[0]
    torch.testing.assert_close(got.prompt_embeds, expected.prompt_embeds)
    torch.testing.assert_close(got.pooled, expected.pooled)
    latent = torch.randn(1, 16, 3, 6, 4, generator=torch.Generator().manual_seed(2))
    image = pool.submit(decode, latent).result(300)
    assert image.shape == (9, 48, 32, 3)
    with torch.no_grad():
        own = comps.vae.decode(latent).sample
    torch.testing.assert_close(image, ((own + 1) / 2).clamp(0, 1)[0].movedim(0, -1), atol=2e-5, rtol=0)


@pytest.mark.parametrize(
    ("ranks", "min_rows"), [(2, 2), (4, 1), (4, 2)], ids=["2-ranks", "4-ranks-thin-bands", "4-ranks-two-sit-out"]
)
def test_parallel_vae_decode_equals_one_device(cpu_pool, files, ranks, min_rows):  # noqa: F811
    """Rows of every frame over the ranks: halos per causal conv (replicated at the clip's border), GroupNorm
    statistics of the whole clip, the mid-block attention over every band's pixels; a 5-row latent on 4 ranks
    with 2-row bands leaves two ranks without rows."""
    config = LAYOUTS["ulysses2"] if ranks == 2 else LAYOUTS["ulysses2xring2"]
    spec = REF["vae"]["latent"]
    from wan_tiny_weights import hashed_uniform

    z = hashed_uniform(spec["name"], tuple(spec["shape"]), spec["scale"])
    vae = load_vae_file(files["vae"])
    one = decode_to_image_tensor(vae, z, ParallelMesh.single(), None)
    torch.testing.assert_close(one, tensor(REF["vae"]["image"]), atol=2e-5, rtol=0)
    job = hunyuan_video_jobs.decode_video
    outs = cpu_pool(config).submit(job, str(files["vae"]), z, min_rows, result_rank="all").result(600)
    torch.testing.assert_close(outs[0]["image"], one, atol=2e-5, rtol=0)
    assert all(out["image"] is None for out in outs[1:])
    rows = plan_band_rows(z.shape[3], ranks, min_rows)
    assert rows.count(0) == (2 if min_rows == 2 and ranks == 4 else 0)
    for out, r in zip(outs, rows):  # active ranks swap halos and send K/V; every rank joins the statistics
        assert (out["sent"].get("video_vae_halo", 0) > 0) == (r > 0)
        assert (out["sent"].get("video_vae_kv", 0) > 0) == (r > 0)
        assert out["sent"].get("groupnorm", 0) > 0
