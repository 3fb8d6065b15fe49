"""Wan Fun-Control: the control video's (and start image's) latents as extra input channels, on every layout.

Oracle: tests/data/comfy_wan_fun_control_reference.json, written by
tests/data/make_comfy_wan_fun_control_reference.py with ComfyUI 0.3.64's own WanFunControlToVideo /
Wan22FunControlToVideo and KSampler on tiny Fun-Control-structure Wan files (48 input channels with CLIP
vision: ComfyUI's WAN21_FunControl2V; 52 without: Wan 2.2 Fun-Control, the mask between control and start
image). The test rebuilds those files (digests in the JSON) into a ComfyUI models tree; the Parallel Model
Loader and Parallel Sampler on real CPU worker pools equal ComfyUI on one rank, Ulysses 2, CFG 2 and
PipeFusion 2 (every step synchronous). Wan22FunControlToVideo's ref_image (``fun22_ref_image``: a reference
latent read by the file's ref_conv) equals ComfyUI on one rank, Ulysses 2, CFG 2 and PipeFusion 2; under PipeFusion
with stale K/V it rides with each step's first patch (the others read its kept K/V, positions unchanged). A Fun-Control model without a control video reads zeros, as in ComfyUI; image latents on a model
without extra channels, or of a width that does not fill them, and a reference image for a file without
ref_conv, are refused on the host.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from pack_import import load_pack  # tests/ helper

from parallel_runtime.denoise.entries import CondEntry, can_batch, concat_conditioning
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.wan.concat import concat_channels
from parallel_runtime.models.families.wan.conditioning import WanImageInputs
from parallel_runtime.models.families.wan.latent import WAN21
from parallel_runtime.models.single_file import inspect_single_file
from parallel_runtime.service.comfy_conditioning import to_branch

load_pack()
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402
from node_helpers import RecordingBridge  # noqa: E402

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from wan_tiny_weights import TinyWan, hashed_uniform, state_digest, tiny_wan_state_dict  # noqa: E402

REF = json.loads((DATA / "comfy_wan_fun_control_reference.json").read_text())
TOLERANCE = 1e-4  # relative L2, as the other Wan references
LAYOUTS = {
    "1rank": {"devices": "cpu:1"},
    "ulysses2": {"ulysses": 2},
    "cfg2": {"cfg_parallel": 2},
    "pp2": {"pipefusion": 2, "pp_patches": 2},
}
LOAD = dict(devices="cpu:2", ulysses=1, ring=1, cfg_parallel=1, pipefusion=1, pp_patches=0, pp_warmup=0)
FILES = ("fun21", "fun22", "fun22_ref_conv_file")  # the reference cases whose model each file is
FILE_OF = {"fun22_ref_image": "fun22_ref_conv_file"}  # a case run on another case's file
FUN21 = {"embed_dim": 4096, "pooled_dim": None, "image_dim": 1280, "latent_channels": 16, "in_channels": 48}


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def generated(recipe: dict) -> torch.Tensor:
    t = hashed_uniform(recipe["name"], tuple(recipe["shape"]), recipe["scale"], recipe.get("offset", 0.0))
    assert state_digest({"t": t}) == recipe["digest"], f"{recipe['name']} is not what the reference was made from"
    return t


class ClipVisionOutput:
    """What ComfyUI's CLIPVisionEncode returns, as far as Wan reads it."""

    def __init__(self, states: torch.Tensor):
        self.penultimate_hidden_states = states


@pytest.fixture(scope="module")
def fun_models(tmp_path_factory) -> RecordingBridge:
    """A ComfyUI models/diffusion_models folder with the reference's Fun-Control files (checked by digest)."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("comfy-models") / "diffusion_models"
    root.mkdir()
    for name in FILES:
        info = REF[name]["model"]
        state = tiny_wan_state_dict(TinyWan(**info["config"]), info["salt"])
        assert state_digest(state) == info["digest"], "tiny Wan weights differ from the reference's"
        save_file(state, str(root / f"wan_{name}.safetensors"))
    return RecordingBridge(folders={"diffusion_models": [str(root)]})


@pytest.fixture(scope="module")
def fun_ctx(pool_registry, fun_models):
    return NodeContext.create(registry=pool_registry, bridge=fun_models)


def options(case: dict, control: bool = True) -> dict:
    """The CONDITIONING options the conditioning node gave (from the reference)."""
    out: dict = {}
    if case["clip_vision"] is not None:
        out["clip_vision_output"] = ClipVisionOutput(generated(case["clip_vision"]))
    if case.get("reference_latents"):
        out["reference_latents"] = [tensor(t) for t in case["reference_latents"]]
    if control and case["concat_latent_image"] is not None:
        out["concat_latent_image"] = tensor(case["concat_latent_image"])
        if case["concat_mask"] is not None:
            out["concat_mask"] = tensor(case["concat_mask"])
            out["concat_mask_index"] = case["concat_mask_index"]
    return out


def comfy_cond(case: dict, **extra) -> tuple[list, list]:
    opts = {**options(case), **extra}
    return [[generated(case["positive"]), dict(opts)]], [[generated(case["negative"]), dict(opts)]]


def sample(ctx: NodeContext, name: str, layout: str, reference: bool = True) -> torch.Tensor:
    case = REF[name]
    degrees = {**LOAD, **LAYOUTS[layout], "pp_warmup": case["steps"]}  # PipeFusion exact: every step synchronous
    file = FILE_OF.get(name) or next(f for f in reversed(FILES) if name.startswith(f))
    (handle,) = ParallelModelLoader(ctx).load(
        model=f"wan_{file}.safetensors", family="wan", layout="manual", dtype="fp32", attention="auto", **degrees
    )["result"]
    pos, neg = comfy_cond(case)
    if not reference:
        for entry in (*pos, *neg):
            entry[1].pop("reference_latents", None)
    args = (case["seed"], case["steps"], case["cfg"], case["sampler"], case["scheduler"], 1.0)
    (out,) = ParallelSampler(ctx).sample(handle, pos, neg, {"samples": tensor(case["latent"])}, *args)["result"]
    return out["samples"]


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs ComfyUI's {tuple(expected.shape)}"
    return float((got.float() - expected).norm() / expected.norm())


def _params():
    """Every ComfyUI case on one rank; each layout with one of the two files (CFG with both branches' control).
    Ordered for the pools (3 kept, one per file and layout): the file's pools the tests after this one use
    (one rank: fun21 and the ref_conv file; PipeFusion 2: the ref_conv file) are the last three, so they are
    still warm, instead of being started a second time."""
    for layout, name in (("ulysses2", "fun21"), ("ulysses2", "fun22"), ("cfg2", "fun22"), ("pp2", "fun21"),
                         ("ulysses2", "fun22_ref_image"), ("cfg2", "fun22_ref_image"), ("1rank", "fun22"),
                         ("pp2", "fun22_ref_image")):  # fmt: skip
        yield pytest.param(layout, name, id=f"{layout}-{name}")
    for name in ("fun21", "fun21_control_only", "fun21_no_control", "fun22_ref_conv_file", "fun22_ref_image"):
        yield pytest.param("1rank", name, id=f"1rank-{name}")


@pytest.mark.parametrize(("layout", "name"), list(_params()))
def test_fun_control_equals_comfy_ksampler(fun_ctx, layout, name):
    error = relative_error(sample(fun_ctx, name, layout), tensor(REF[name]["output"]))
    assert error <= TOLERANCE, f"{name} on {layout}: relative error {error:.2e}"


def test_fun_control_files_are_read_as_comfyui_detects_them(fun_models):
    """48 channels with CLIP vision (ComfyUI: WAN21_FunControl2V), 52 without (WAN21_T2V + concat_mask_index)."""
    folder = Path(fun_models.folders["diffusion_models"][0])
    fun21, fun22 = (inspect_single_file(folder / f"wan_{n}.safetensors") for n in ("fun21", "fun22"))
    assert (fun21.family, fun21.config["in_channels"], fun21.config["image_dim"]) == ("wan", 48, 1280)
    assert (fun22.config["in_channels"], fun22.config["image_dim"], fun22.config["out_channels"]) == (52, None, 16)
    assert REF["fun21"]["model"]["comfy_model_config"] == "WAN21_FunControl2V"
    assert REF["fun22"]["model"]["comfy_model_config"] == "WAN21_T2V" and REF["fun22"]["concat_mask_index"] == 16
    with_ref_conv = inspect_single_file(folder / "wan_fun22_ref_conv_file.safetensors")
    assert with_ref_conv.config == {**fun22.config, "_ref_conv_in_channels": 16}  # the reference-image conv's input


def test_reference_image_changes_the_result(fun_ctx):
    """Without its reference latent the same ref_conv file and conditioning give another video (so the equality
    above is the reference's doing), and that one is ComfyUI's without a ref_image (seed aside, fun22's case)."""
    with_ref = sample(fun_ctx, "fun22_ref_image", "1rank")
    without = sample(fun_ctx, "fun22_ref_image", "1rank", reference=False)
    assert relative_error(without, with_ref) > 1e-2


def test_reference_image_refusals_say_what_why_fix():
    """A reference image for a file without ref_conv is refused on the host (ComfyUI ignores it)."""
    case = REF["fun22_ref_image"]
    no_ref_conv = {**FUN21, "in_channels": 52, "image_dim": None, "ref_conv_channels": None}
    with pytest.raises(ConfigError, match="without a reference-image embedding") as err:
        to_branch(comfy_cond(case)[0], no_ref_conv, "wan")
    assert "why:" in str(err.value)
    (entry,) = to_branch(comfy_cond(case)[0], {**no_ref_conv, "ref_conv_channels": 16}, "wan")
    torch.testing.assert_close(entry.cond.extras.reference, tensor(case["reference_latents"][0])[:, :, 0])


# -- the reference frame under PipeFusion: it rides with each step's first patch, the others read its kept K/V ---
# Stale K/V (warmup 1, 2 patches) as a share of the seed-to-seed difference: measured 0.012.
PP_STALE_BOUND = 0.04


def test_reference_image_under_pipefusion_rides_with_each_steps_first_patch(pool_registry, fun_models):
    """Warmup 1, 2 patches (reference_kv per_step): the reference frame's tokens run through every stage with
    the whole-image step and with each later step's first patch (stats: reference tokens x blocks), and the
    result stays within PP_STALE_BOUND of ComfyUI's, relative to the seed-to-seed difference (the full-warmup
    run equals ComfyUI: test_fun_control_equals_comfy_ksampler[pp2-fun22_ref_image])."""
    from parallel_runtime.denoise.settings import SamplingSettings
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.api import LoadRequest, load_parallel_model
    from parallel_runtime.tools.bench_pipefusion import generate_with_stats

    case = REF["fun22_ref_image"]
    path = Path(fun_models.folders["diffusion_models"][0]) / "wan_fun22_ref_conv_file.safetensors"
    request = LoadRequest(model=str(path), devices="cpu:2", layout=ParallelConfig(pp=2), pp_warmup=1)
    model = load_parallel_model(request, pool_registry)
    info = {**FUN21, "in_channels": 52, "image_dim": None, "ref_conv_channels": 16}
    pos, neg = (to_branch(c, info, "wan") for c in comfy_cond(case))

    def run(warmup: int, seed: int):
        settings = SamplingSettings(seed=seed, steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"],
                                    scheduler=case["scheduler"])  # fmt: skip
        job = (pos, neg, tensor(case["latent"]), settings, 2, warmup, True, "step", "per_step")
        per_rank = model.pool.submit(generate_with_stats, *job, result_rank="all").result(300)
        return per_rank[0]["latent"].reshape(case["latent"]["shape"]), [r["stats"] for r in per_rank]

    expected = tensor(case["output"])
    yardstick = float((run(case["steps"], case["seed"] + 1)[0] - expected).abs().mean())
    stale, stats = run(1, case["seed"])
    error = float((stale - expected).abs().mean()) / yardstick
    print(f"fun22_ref_image, pp 2, warmup 1, 2 patches: {error:.4f} of the seed-to-seed difference")
    assert 0 < error < PP_STALE_BOUND, error
    frame = case["latent"]["shape"][-2] // 2 * (case["latent"]["shape"][-1] // 2)  # one frame of 2x2 tokens
    per_stage_blocks = REF["fun22_ref_conv_file"]["model"]["config"]["num_layers"] // 2
    # one stream (cond and uncond batched), the reference run once per step
    assert [s.reference_tokens for s in stats] == [case["steps"] * frame * per_stage_blocks] * 2, stats


@torch.no_grad()
def test_a_patch_reading_the_kept_reference_keeps_the_videos_positions(fun_models):
    """A patch without the reference frame's tokens (PipeFusion, after the step's first patch) has exactly the
    rotary rows and tokens of the same band of the call with them: the video's positions start one frame on."""
    from parallel_runtime.models.reference_latents import reference_count, without_references
    from parallel_runtime.models.registry import get_adapter
    from parallel_runtime.models.single_file import load_single_file_transformer
    from parallel_runtime.parallel.mesh import ParallelMesh

    case = REF["fun22_ref_image"]
    path = Path(fun_models.folders["diffusion_models"][0]) / "wan_fun22_ref_conv_file.safetensors"
    adapter = get_adapter(load_single_file_transformer(path)[0])
    info = {**FUN21, "in_channels": 52, "image_dim": None, "ref_conv_channels": 16}
    (entry,) = to_branch(comfy_cond(case)[0], info, "wan")
    cond, x = entry.cond, hashed_uniform("fun/x", tuple(case["latent"]["shape"]), 1.0)
    frames, h, w = x.shape[2:]
    assert reference_count(cond) == h // 2 * (w // 2) and reference_count(without_references(cond)) == 0
    stacked = x.reshape(1, 16, frames * h, w)  # frames one under the other (token_grid.stacked)
    t, mesh = torch.tensor([500.0]), ParallelMesh.single()
    with_ref = adapter.embed_rows(stacked[:, :, 6:12], (6, 12), (frames, h, w), t, cond, mesh)
    kept = adapter.embed_rows(stacked[:, :, 6:12], (6, 12), (frames, h, w), t, without_references(cond), mesh)
    assert with_ref.ref_tokens == h // 2 * (w // 2) and kept.ref_tokens == 0
    band = kept.img.shape[1]
    assert torch.equal(kept.img, with_ref.img[:, :band])
    for ours, theirs in zip(kept.img_rope, with_ref.img_rope, strict=True):
        assert torch.equal(ours, theirs[:, :band])


def test_fun_control_channels_formula():
    """After the latent: the control video then the start image in model space (2.1); 2.2 puts 1 - mask between."""
    x = torch.zeros(1, 16, 3, 6, 8)
    image = tensor(REF["fun21"]["concat_latent_image"])
    joined = concat_channels(x, WanImageInputs(concat_image=image), 48, WAN21, False, lambda t: t)
    torch.testing.assert_close(joined[:, 16:32], WAN21.to_model(image[:, :16]))
    torch.testing.assert_close(joined[:, 32:], WAN21.to_model(image[:, 16:]))
    assert joined[:, 32:, 1:].abs().max() < 1e-5  # no start image past the first frame: ComfyUI's zero latent
    case = REF["fun22"]
    image, mask = tensor(case["concat_latent_image"]), tensor(case["concat_mask"])
    inputs = WanImageInputs(concat_image=image, concat_mask=mask, concat_mask_index=16)
    joined = concat_channels(x, inputs, 52, WAN21, False, lambda t: t)
    torch.testing.assert_close(joined[:, 16:32], WAN21.to_model(image[:, :16]))
    torch.testing.assert_close(joined[:, 32:36], 1.0 - mask)
    torch.testing.assert_close(joined[:, 36:], WAN21.to_model(image[:, 16:]))
    assert joined[:, 32:36, 0].eq(1).all() and joined[:, 32:36, 1:].eq(0).all()  # the start image's frame kept


def test_fun_control_refusals_say_what_why_fix():
    """On the host: image latents on a plain model (ComfyUI ignores them), a width that does not fill the
    model's channels (ComfyUI fails in the model); a Fun-Control model without them reads zeros, as ComfyUI."""
    case = REF["fun21"]
    (entry,) = to_branch(comfy_cond(case)[0], FUN21, "wan")
    assert entry.cond.extras.concat_image.shape[1] == 32
    plain = {**FUN21, "in_channels": 16, "image_dim": None}
    with pytest.raises(ConfigError, match="without extra input channels") as err:
        to_branch(comfy_cond(case)[0], plain, "wan")
    assert "why:" in str(err.value)
    i2v_16 = comfy_cond(case, concat_latent_image=tensor(case["concat_latent_image"])[:, :16])[0]
    with pytest.raises(ConfigError, match="has 16 channels for a Wan model with 32 extra input channels"):
        to_branch(i2v_16, FUN21, "wan")
    with pytest.raises(ConfigError, match="32 channels for a Wan model with 20"):  # Wan 2.2 I2V A14B
        to_branch(comfy_cond(case)[0], {**FUN21, "in_channels": 36, "image_dim": None}, "wan")
    to_branch(comfy_cond(case)[0], {**FUN21, "in_channels": 36}, "wan")  # Wan 2.1 I2V cuts it, as ComfyUI
    bad_index = comfy_cond(REF["fun22"], concat_mask_index=40)[0]
    with pytest.raises(ConfigError, match="concat_mask_index is 40"):
        to_branch(bad_index, {**FUN21, "in_channels": 52, "image_dim": None}, "wan")
    (entry,) = to_branch([[generated(case["positive"]), {}]], FUN21, "wan")
    assert entry.cond.extras is None  # zeros in the model (test_fun_control_equals_comfy_ksampler: no_control)


def test_api_refuses_control_latents_that_do_not_fit(fun_ctx):
    """The runtime API (no CONDITIONING to read) gets the same refusal on the host, before any job."""
    case = REF["fun21"]
    (handle,) = ParallelModelLoader(fun_ctx).load(
        model="wan_fun21.safetensors", family="wan", layout="manual", dtype="fp32", attention="auto",
        **{**LOAD, "devices": "cpu:1"},
    )["result"]  # fmt: skip
    model = handle.model()
    image = tensor(case["concat_latent_image"])[:, :16]
    cond = Conditioning(generated(case["positive"]), extras=WanImageInputs(concat_image=image))
    branch = (CondEntry(cond),)
    with pytest.raises(ConfigError, match="16 channels for a Wan model with 32 extra input channels"):
        model.sample(branch, branch, tensor(case["latent"]), 48, 64, seed=1, steps=1, cfg=1.0,
                     sampler_name="euler", scheduler="simple", denoise=1.0)  # fmt: skip


def test_mask_index_travels_with_the_conditioning_and_splits_batches():
    """concat_mask_index is a setting, not a tensor: moving keeps it, and entries that differ in it never batch."""
    case = REF["fun22"]
    image, mask = tensor(case["concat_latent_image"]), tensor(case["concat_mask"])
    embeds = generated(case["positive"])
    a = Conditioning(embeds, extras=WanImageInputs(concat_image=image, concat_mask=mask, concat_mask_index=16))
    b = Conditioning(embeds, extras=WanImageInputs(concat_image=image, concat_mask=mask))
    assert "extras.concat_mask_index" not in a.tensors()
    assert a.to(dtype=torch.float64).extras.concat_mask_index == 16
    assert can_batch(a, a) and not can_batch(a, b)
    assert concat_conditioning(a, a).extras.concat_mask_index == 16
