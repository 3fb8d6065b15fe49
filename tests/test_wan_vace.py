"""Wan VACE: WanVaceToVideo's control entries through the VACE hint blocks, on 1 rank, Ulysses 2, CFG 2 and PipeFusion 2.

Oracle: tests/data/comfy_wan_vace_reference.json, written by tests/data/make_comfy_wan_vace_reference.py with
ComfyUI 0.3.64's own WanVaceToVideo and KSampler on a tiny Wan VACE file (4 blocks, 2 hint blocks after blocks
0 and 2; ComfyUI detects WAN21_Vace): one control video with a mask at strength 0.8, two chained entries of
strengths 1 and 0.5, a reference image (an extra leading latent frame), and no entry at all (ComfyUI's default
entry). The test rebuilds the file (digest in the JSON) into a ComfyUI models tree; the Parallel Model Loader
and Parallel Sampler on real CPU worker pools equal ComfyUI. Under Ulysses each rank runs the hint blocks on
the control tokens of its own video tokens (the control tokens are never gathered); under PipeFusion each stage runs the hint blocks of its own main blocks
on the patch's control tokens (their streams travel with the patch), equal to ComfyUI after a full warmup and
close with stale K/V. The same weights through diffusers' own WanVACETransformer3DModel forward equal our adapter's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from pack_import import load_pack  # tests/ helper

from parallel_runtime.errors import ConfigError
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

REF = json.loads((DATA / "comfy_wan_vace_reference.json").read_text())
TOLERANCE = 1e-4  # relative L2, as the other Wan references
LAYOUTS = {
    "1rank": {"devices": "cpu:1"},
    "ulysses2": {"ulysses": 2},
    "cfg2": {"cfg_parallel": 2},
    "pp2": {"pipefusion": 2, "pp_patches": 2},
}
LOAD = dict(devices="cpu:2", ulysses=1, ring=1, cfg_parallel=1, pipefusion=1, pp_patches=0, pp_warmup=0)
FILE = "wan_vace.safetensors"
VACE = {"embed_dim": 4096, "pooled_dim": None, "image_dim": None, "latent_channels": 16, "in_channels": 16}


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def generated(recipe: dict) -> torch.Tensor:
    t = hashed_uniform(recipe["name"], tuple(recipe["shape"]), recipe["scale"], recipe.get("offset", 0.0))
    assert state_digest({"t": t}) == recipe["digest"], f"{recipe['name']} is not what the reference was made from"
    return t


def tiny_state() -> dict[str, torch.Tensor]:
    info = REF["vace"]["model"]
    state = tiny_wan_state_dict(TinyWan(**info["config"]), info["salt"])
    assert state_digest(state) == info["digest"], "tiny Wan VACE weights differ from the reference's"
    return state


@pytest.fixture(scope="module")
def vace_models(tmp_path_factory) -> RecordingBridge:
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("comfy-models") / "diffusion_models"
    root.mkdir()
    save_file(tiny_state(), str(root / FILE))
    return RecordingBridge(folders={"diffusion_models": [str(root)]})


@pytest.fixture(scope="module")
def vace_ctx(pool_registry, vace_models):
    return NodeContext.create(registry=pool_registry, bridge=vace_models)


def options(case: dict) -> dict:
    """The CONDITIONING options WanVaceToVideo gave (from the reference; none for vace_none)."""
    if not case["vace_frames"]:
        return {}
    return {
        "vace_frames": [tensor(t) for t in case["vace_frames"]],
        "vace_mask": [tensor(t) for t in case["vace_mask"]],
        "vace_strength": list(case["vace_strength"]),
    }


def comfy_cond(case: dict) -> tuple[list, list]:
    return [[generated(case["positive"]), options(case)]], [[generated(case["negative"]), options(case)]]


def load(ctx: NodeContext, **degrees):
    (handle,) = ParallelModelLoader(ctx).load(
        model=FILE, family="wan", layout="manual", dtype="fp32", attention="auto", **{**LOAD, **degrees}
    )["result"]
    return handle


def sample(ctx: NodeContext, name: str, layout: str) -> torch.Tensor:
    case = REF[name]
    pos, neg = comfy_cond(case)
    args = (case["seed"], case["steps"], case["cfg"], case["sampler"], case["scheduler"], 1.0)
    degrees = dict(LAYOUTS[layout])
    if "pipefusion" in degrees:
        degrees["pp_warmup"] = case["steps"]  # PipeFusion exact: every step synchronous
    handle = load(ctx, **degrees)
    (out,) = ParallelSampler(ctx).sample(handle, pos, neg, {"samples": tensor(case["latent"])}, *args)["result"]
    return out["samples"]


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs ComfyUI's {tuple(expected.shape)}"
    return float((got.float() - expected).norm() / expected.norm())


def _params():
    for name in ("vace", "vace_two", "vace_reference", "vace_none"):
        yield pytest.param("1rank", name, id=f"1rank-{name}")
    layouts = (("ulysses2", "vace_two"), ("ulysses2", "vace_reference"), ("cfg2", "vace"), ("pp2", "vace_two"))
    for layout, name in layouts:
        yield pytest.param(layout, name, id=f"{layout}-{name}")


@pytest.mark.parametrize(("layout", "name"), list(_params()))
def test_vace_equals_comfy_ksampler(vace_ctx, layout, name):
    error = relative_error(sample(vace_ctx, name, layout), tensor(REF[name]["output"]))
    assert error <= TOLERANCE, f"{name} on {layout}: relative error {error:.2e}"


def test_vace_file_is_read_as_comfyui_detects_it(vace_models):
    """vace_patch_embedding marks a VACE file (ComfyUI: WAN21_Vace); hints after every blocks // hint-blocks."""
    info = inspect_single_file(Path(vace_models.folders["diffusion_models"][0]) / FILE)
    assert info.family == "wan" and info.config["_class_name"] == "WanVACETransformer3DModel"
    assert (info.config["vace_layers"], info.config["vace_in_channels"]) == ([0, 2], 96)
    assert REF["vace"]["model"]["comfy_model_class"] == "WAN21_Vace"


# -- PipeFusion: each stage runs the hint blocks of its main blocks on the patch's control tokens ---------------
# Stale K/V (warmup 1) as a share of the seed-to-seed difference: measured 0.016 / 0.022 ("vace", 2 / 4 patches)
# and 0.012 / 0.017 ("vace_two"), as the other families' PipeFusion bounds.
PP_STALE_BOUND = 0.04
FLOAT = 4  # bytes (fp32)


def pp_run(model, name: str, warmup: int, patches: int = 2, seed_shift: int = 0):
    """(latent, per-rank PipeFusionStats) of the reference case ``name`` on the pp 2 pool's VACE model."""
    from parallel_runtime.denoise.settings import SamplingSettings
    from parallel_runtime.tools.bench_pipefusion import generate_with_stats

    case = REF[name]
    pos, neg = (to_branch(c, {**VACE, "vace_in_channels": 96}, "wan") for c in comfy_cond(case))
    settings = SamplingSettings(
        seed=case["seed"] + seed_shift, steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"],
        scheduler=case["scheduler"],
    )  # fmt: skip
    job = (pos, neg, tensor(case["latent"]), settings, patches, warmup)
    per_rank = model.pool.submit(generate_with_stats, *job, result_rank="all").result(300)
    return per_rank[0]["latent"], [r["stats"] for r in per_rank]


@pytest.fixture(scope="module")
def pp_model(pool_registry, vace_models):
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.api import LoadRequest, load_parallel_model

    path = Path(vace_models.folders["diffusion_models"][0]) / FILE
    request = LoadRequest(model=str(path), devices="cpu:2", layout=ParallelConfig(pp=2), pp_warmup=1)
    return load_parallel_model(request, pool_registry)


def test_vace_under_pipefusion_equals_comfy_after_full_warmup_and_stays_close_with_stale_kv(pp_model):
    """Every step a warmup step: each case (one entry, two chained, the reference frame, the default entry) equals
    ComfyUI's graph to 1e-4. Warmup 1 (the patches attend over stale K/V of the other patch, the hint blocks over
    their own stale buffers, one per entry): within PP_STALE_BOUND of the seed-to-seed difference, not equal."""
    for name in ("vace", "vace_two", "vace_reference", "vace_none"):
        out, _ = pp_run(pp_model, name, warmup=REF[name]["steps"])
        error = relative_error(out.reshape(REF[name]["latent"]["shape"]), tensor(REF[name]["output"]))
        assert error <= TOLERANCE, f"{name} under PipeFusion: {error:.2e}"
    for name in ("vace", "vace_two"):
        expected = tensor(REF[name]["output"])
        shifted, _ = pp_run(pp_model, name, warmup=REF[name]["steps"], seed_shift=1)
        yardstick = float((shifted.reshape(expected.shape) - expected).abs().mean())
        stale, _ = pp_run(pp_model, name, warmup=1)
        error = float((stale.reshape(expected.shape) - expected).abs().mean()) / yardstick
        assert 0 < error < PP_STALE_BOUND, (name, error)


def test_vace_under_pipefusion_sends_each_patch_with_its_own_control_tokens(pp_model):
    """Stage 0 sends stage 1 each item's video tokens with its control streams (one per entry, band tokens only;
    the patch-embedded latent stays behind: only the first hint block, on stage 0, reads it) and the time
    vectors: over a run, steps x all tokens x (1 + entries) rows of the model width, plus items x 7 vectors. Gathering the control tokens of the whole video per patch would add
    (patches - 1) x more of them; no VACE bytes travel any other way (stage 1 sends only latents back). Each stage
    keeps stale K/V of the whole video for its 2 main blocks and for its hint block once per entry (the entries'
    control tokens differ: a buffer shared by them would mix their K/V)."""
    dim, tokens = 256, 2 * 2 * 2  # the tiny model's width; 2 frames of 2x2 tokens
    for name, patches in (("vace", 2), ("vace_two", 2), ("vace", 4)):
        case = REF[name]
        steps, entries, rows = case["steps"], max(1, len(case["vace_frames"])), 2  # cond and uncond in one call
        _, stats = pp_run(pp_model, name, warmup=1, patches=patches)
        first = next(s for s in stats if s.stage == 0)
        items = 1 + (steps - 1) * patches
        assert first.items == items
        expected = FLOAT * rows * dim * (steps * tokens * (1 + entries) + items * 7)
        assert first.sent_bytes["pp_act"] == expected, (name, patches, first.sent_bytes)
        last = next(s for s in stats if s.stage == 1)
        assert set(last.sent_bytes) == {"pp_latent", "pp_final"}, last.sent_bytes
        kv = 2 * FLOAT * rows * tokens * dim  # K and V of one attention layer over the whole video
        assert [s.kv_buffer_bytes for s in stats] == [(2 + entries) * kv] * 2, (name, stats)


def test_vace_stage_loading_gives_each_stage_the_hint_blocks_of_its_blocks(vace_models):
    """pp 2 over the 4 blocks: stage 0 holds blocks 0-1, the hint block after block 0 and the control embedding;
    stage 1 blocks 2-3 and the hint block after block 2; nothing of the other stage's."""
    from parallel_runtime.pipefusion.stage_loading import load_single_file_stage

    path = Path(vace_models.folders["diffusion_models"][0]) / FILE
    for stage, hint in ((0, 0), (1, 1)):
        comps, _, weights = load_single_file_stage(path, 2, stage, "cpu", torch.float32)
        held = {n for n, p in comps.transformer.named_parameters() if p.device.type != "meta"}
        assert {n.split(".")[1] for n in held if n.startswith("vace_blocks.")} == {str(hint)}
        assert any(n.startswith("vace_patch_embedding.") for n in held) == (stage == 0)
        assert {n.split(".")[1] for n in held if n.startswith("blocks.")} == {str(2 * stage), str(2 * stage + 1)}
        assert weights.block_bytes > 0


def test_vace_entries_refused_on_a_model_without_vace_blocks():
    (entry,) = to_branch(comfy_cond(REF["vace_two"])[0], {**VACE, "vace_in_channels": 96}, "wan")
    extras = entry.cond.extras
    assert extras.vace_frames.shape == (1, 2, 32, 2, 4, 4) and extras.vace_strength == (1.0, 0.5)
    with pytest.raises(ConfigError, match="without VACE blocks"):
        to_branch(comfy_cond(REF["vace"])[0], {**VACE, "vace_in_channels": None}, "wan")


@pytest.fixture(scope="module")
def vace_adapter(tmp_path_factory):
    """Our adapter on the reference's VACE file, in this process."""
    from safetensors.torch import save_file

    from parallel_runtime.models.registry import get_adapter
    from parallel_runtime.models.single_file import load_single_file_transformer

    path = tmp_path_factory.mktemp("vace") / FILE
    save_file(tiny_state(), str(path))
    return get_adapter(load_single_file_transformer(path)[0])


def one_entry() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, object]:
    """(latent, timestep, text, Conditioning) with the reference's first entry at strength 1."""
    from parallel_runtime.models.base import Conditioning
    from parallel_runtime.models.families.wan.conditioning import WanImageInputs

    case = REF["vace"]
    frames, mask = tensor(case["vace_frames"][0]), tensor(case["vace_mask"][0])
    extras = WanImageInputs(vace_frames=frames[:, None], vace_mask=mask[:, None], vace_strength=(1.0,))
    text = generated(case["positive"])
    x = hashed_uniform("vace/x", (1, 16, 2, 4, 4), 1.0)
    return x, torch.tensor([700.0]), text, Conditioning(text, extras=extras)


@torch.no_grad()
def test_vace_single_device_equals_diffusers_transformer(vace_adapter):
    """Our adapter's forward on one device equals diffusers' own WanVACETransformer3DModel forward (one entry at
    strength 1: diffusers takes one control context)."""
    from parallel_runtime.attention.usp import SequenceParallelAttention
    from parallel_runtime.models.families.wan.latent import WAN21
    from parallel_runtime.parallel.mesh import ParallelMesh

    mesh = ParallelMesh.single()
    x, t, text, cond = one_entry()
    ours = vace_adapter.forward(x, t, cond, mesh, SequenceParallelAttention(mesh, "sdpa"))
    frames, mask = cond.extras.vace_frames[:, 0], cond.extras.vace_mask[:, 0]
    context = torch.cat([WAN21.to_model(frames[:, :16]), WAN21.to_model(frames[:, 16:]), mask], dim=1)
    theirs = vace_adapter.transformer(x, t, text, control_hidden_states=context, return_dict=False)[0]
    assert relative_error(ours, theirs) <= 1e-5


@torch.no_grad()
def test_vace_control_tokens_are_split_with_the_video_tokens(vace_adapter):
    """Under Ulysses 2 each rank embeds only its own half of the control streams (the patch-embedded latent and
    each entry's context), aligned with its video tokens: nothing of the control is held whole on a rank."""
    from parallel_runtime.parallel.config import MESH_DIMS, ParallelConfig
    from parallel_runtime.parallel.mesh import ParallelMesh

    def rank_mesh(rank: int) -> ParallelMesh:
        coords = dict.fromkeys((*MESH_DIMS, "sp"), 0)
        coords.update(ulysses=rank, sp=rank)
        return ParallelMesh(ParallelConfig(ulysses=2), torch.device("cpu"), dict.fromkeys(coords), coords)

    x, t, _, cond = one_entry()
    full = vace_adapter.embed(x, t, cond, ParallelMesh.single())
    parts = [vace_adapter.embed(x, t, cond, rank_mesh(r)) for r in range(2)]
    assert len(full.control) == 2 and full.control[0].shape[1] == full.img_tokens == 8
    for i in range(2):
        assert [p.control[i].shape[1] for p in parts] == [4, 4]
        assert torch.equal(torch.cat([p.control[i] for p in parts], 1), full.control[i])
    assert torch.equal(full.control[0], full.img)  # the first stream is the latent's own tokens
