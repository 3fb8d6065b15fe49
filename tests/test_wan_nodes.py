"""Wan through the ComfyUI nodes, against ComfyUI's own outputs, on every layout.

Part 1 (stand-in model): what the nodes make of the LATENTs and CONDITIONING of ComfyUI's video nodes
(EmptyHunyuanLatentVideo, WanImageToVideo, Wan22ImageToVideoLatent). Part 2 (real runtime, two CPU
workers): the tiny ORIGINAL-layout Wan files of tests/data/comfy_wan_reference.json, picked from
models/diffusion_models by the Parallel Model Loader, sampled by Parallel Sampler / Parallel Sampler
(Advanced) with ComfyUI-shaped inputs on Ulysses, Ring, CFG and PipeFusion layouts, equal ComfyUI's
KSampler / KSamplerAdvanced results stored by make_comfy_wan_reference.py; Parallel VAE Decode of a video
latent with a Wan VAE from models/vae equals ComfyUI's VAE decode.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from pack_import import load_pack  # tests/ helper

from parallel_runtime.errors import ConfigError

load_pack()
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.latent import ParallelEmptyLatent  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402
from dit_parallel_pack.nodes.sampler_advanced import ParallelSamplerAdvanced  # noqa: E402
from dit_parallel_pack.nodes.vae_decode import ParallelVAEDecode  # noqa: E402
from node_helpers import FakeModel, RecordingBridge, fake_handle  # noqa: E402

from parallel_runtime.service.comfy_conditioning import to_branch  # noqa: E402
from parallel_runtime.service.input_checks import model_latent  # noqa: E402

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from make_comfy_wan_reference import vae_weight  # noqa: E402
from wan_tiny_weights import TinyWan, hashed_uniform, state_digest, tiny_wan_state_dict  # noqa: E402

REF = json.loads((DATA / "comfy_wan_reference.json").read_text())
VAE_REF = json.loads((DATA / "comfy_wan_vae_reference.json").read_text())
TOLERANCE = 1e-4  # relative L2, as tests/test_wan_comfy_reference.py
WAN = {"embed_dim": 4096, "pooled_dim": None, "image_dim": 1280}


class ClipVisionOutput:
    """What ComfyUI's CLIPVisionEncode returns, as far as Wan reads it."""

    def __init__(self, states: torch.Tensor):
        self.penultimate_hidden_states = states


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def generated(recipe: dict) -> torch.Tensor:
    t = hashed_uniform(recipe["name"], tuple(recipe["shape"]), recipe["scale"], recipe.get("offset", 0.0))
    assert state_digest({"t": t}) == recipe["digest"]
    return t


def close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= TOLERANCE, f"relative L2 error {err:.2e} against ComfyUI"


# -- part 1: LATENTs and CONDITIONING of ComfyUI's video nodes ----------------------------------------
class FakeVideoModel(FakeModel):
    def __init__(self, channels: int = 16, spatial: int = 8, image_dim: int | None = None):
        super().__init__("wan", channels, 4096, None)
        self.latent_dims, self.temporal_factor, self.spatial_factor = 3, 4, spatial
        self.patch_pixels, self.image_dim = spatial * 2, image_dim
        self.kwargs: dict = {}

    def expected_conditioning(self) -> dict:
        return {**super().expected_conditioning(), "image_dim": self.image_dim}

    def sample(self, positive, negative, latent, **kwargs):
        self.kwargs = kwargs
        self.positive = positive
        return super().sample(positive, negative, latent, **{k: kwargs[k] for k in SAMPLE_ARGS if k in kwargs})


SAMPLE_ARGS = ("width", "height", "batch_size", "seed", "steps", "cfg", "sampler_name", "scheduler", "denoise")
SAMPLE_ARGS += ("sigmas", "guidance", "on_event", "should_cancel")


def test_empty_latent_makes_video_latents_as_comfyuis_nodes():
    ctx = NodeContext.create(registry=object(), bridge=RecordingBridge())
    (latent,) = ParallelEmptyLatent().generate(fake_handle(ctx, FakeVideoModel()), 64, 48, 2, length=9)
    assert latent["samples"].shape == (2, 16, 3, 6, 8)  # EmptyHunyuanLatentVideo(64, 48, 9, 2)
    (latent,) = ParallelEmptyLatent().generate(fake_handle(ctx, FakeVideoModel(48, 16)), 64, 64, 1, length=9)
    assert latent["samples"].shape == (1, 48, 3, 4, 4)  # Wan22ImageToVideoLatent(64, 64, 9, 1)
    model = FakeVideoModel(48, 16)
    ParallelEmptyLatent().generate(fake_handle(ctx, model), 48, 48, 1, length=9)
    assert model.checked_sizes == (3, 3)  # the model's own size check ran (whole tokens, padding: the service's)
    with pytest.raises(ConfigError, match="length 9 for the flux image model"):
        ParallelEmptyLatent().generate(fake_handle(ctx), 64, 64, 1, length=9)


def test_model_latent_for_video_models():
    empty = torch.zeros(1, 16, 3, 6, 8)
    assert model_latent(empty, "wan", 48, 3).shape == (1, 48, 3, 6, 8)  # as fix_empty_latent_channels
    assert model_latent(torch.ones(1, 16, 6, 8), "wan", 16, 3).shape == (1, 16, 1, 6, 8)
    with pytest.raises(ConfigError, match="takes latents \\[batch, channels, height, width\\]"):
        model_latent(empty, "flux", 16, 2)


def test_wan_image_to_video_conditioning():
    """WanImageToVideo's concat_latent_image / concat_mask / clip_vision_output become the runtime's fields;
    other families still refuse them."""
    image, mask = torch.randn(1, 16, 3, 6, 8), torch.ones(1, 1, 3, 6, 8)
    states = torch.randn(1, 257, 1280)
    opts = {"concat_latent_image": image, "concat_mask": mask, "clip_vision_output": ClipVisionOutput(states)}
    (entry,) = to_branch([[torch.randn(1, 512, 4096), opts]], WAN, "wan")
    inputs = entry.cond.extras
    assert torch.equal(inputs.concat_image, image) and torch.equal(inputs.concat_mask, mask)
    assert torch.equal(inputs.image_embeds, states)
    (entry,) = to_branch([[torch.randn(1, 512, 4096), opts]], {**WAN, "image_dim": None}, "wan")
    assert entry.cond.extras.image_embeds is None  # a model without image K/V ignores it, as ComfyUI's WanModel does
    with pytest.raises(ConfigError, match="no 1280-wide penultimate states"):
        bad = {"clip_vision_output": ClipVisionOutput(torch.randn(1, 257, 1024))}
        to_branch([[torch.randn(1, 512, 4096), bad]], WAN, "wan")
    with pytest.raises(ConfigError, match="carries a CLIP-vision image embedding"):
        clip_only = {"clip_vision_output": opts["clip_vision_output"]}
        to_branch([[torch.randn(1, 7, 4096), clip_only]], {"embed_dim": 4096, "pooled_dim": None}, "pixart")


def test_samplers_pass_noise_mask_and_ksampler_advanced_settings():
    ctx = NodeContext.create(registry=object(), bridge=RecordingBridge())
    model = FakeVideoModel(48, 16)
    handle = fake_handle(ctx, model)
    mask = torch.ones(1, 1, 3, 4, 4)
    mask[:, :, 0] = 0.0
    latent = {"samples": torch.randn(1, 48, 3, 4, 4), "noise_mask": mask}  # Wan22ImageToVideoLatent's
    cond = [[torch.randn(1, 512, 4096), {}]]
    (out,) = ParallelSampler(ctx).sample(handle, cond, cond, latent, 1, 2, 5.0, "euler", "simple", 1.0)["result"]
    assert torch.equal(model.kwargs["noise_mask"], mask) and out["noise_mask"] is mask  # kept, like KSampler
    assert (model.kwargs["width"], model.kwargs["height"]) == (64, 64)
    args = ("disable", 3, 4, 3.5, "euler", "simple", cond, cond, latent, 2, 10000, "enable")
    ParallelSamplerAdvanced(ctx).sample(handle, *args)
    assert model.kwargs["advanced"] == {
        "add_noise": False,
        "start_at_step": 2,
        "end_at_step": 10000,
        "return_with_leftover_noise": True,
    }
    assert model.kwargs["seed"] == 3 and model.kwargs["steps"] == 4


# -- part 2: the real runtime against ComfyUI's stored outputs ---------------------------------------
LAYOUTS = {
    "ulysses2": {"ulysses": 2},
    "ring2": {"ring": 2},
    "cfg2": {"cfg_parallel": 2},
    "pp2": {"pipefusion": 2, "pp_patches": 2},
}
LOAD = dict(devices="cpu:2", ulysses=1, ring=1, cfg_parallel=1, pipefusion=1, pp_patches=0, pp_warmup=1)


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory) -> RecordingBridge:
    """A ComfyUI models/ tree: the reference's Wan files (as ComfyUI checkpoints) and its Wan VAE files."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("comfy-models")
    (root / "diffusion_models").mkdir()
    (root / "vae").mkdir()
    for case in ("t2v", "two_pass", "i2v_clip", "ti2v"):
        for role in ("model", "high", "low"):
            info = REF[case].get(role)
            if info is None or (root / "diffusion_models" / f"wan_{info['salt']}.safetensors").exists():
                continue
            state = tiny_wan_state_dict(TinyWan(**info["config"]), info["salt"])
            assert state_digest(state) == info["digest"]
            prefixed = {f"model.diffusion_model.{k}": v for k, v in state.items()}
            save_file(prefixed, str(root / "diffusion_models" / f"wan_{info['salt']}.safetensors"))
    for name in ("vae21", "vae22"):
        state = {k: vae_weight(k, tuple(s)) for k, s in VAE_REF[name]["tensors"].items()}
        save_file(state, str(root / "vae" / f"wan_{name}.safetensors"))
    return RecordingBridge(folders={"diffusion_models": [str(root / "diffusion_models")], "vae": [str(root / "vae")]})


@pytest.fixture(scope="module")
def comfy_ctx(pool_registry, comfy_models):
    return NodeContext.create(registry=pool_registry, bridge=comfy_models)


def load(ctx, salt: str, layout: str, steps: int, vae: str | None = None, **kwargs):
    degrees = {**LOAD, **LAYOUTS[layout], "pp_warmup": steps}  # PipeFusion exact: every step synchronous
    kwargs = {"vae": vae, **kwargs} if vae else kwargs
    result = ParallelModelLoader(ctx).load(
        model=f"wan_{salt}.safetensors",
        family="wan",
        layout="manual",
        dtype="fp32",
        attention="auto",
        **degrees,
        **kwargs,
    )
    return result["result"][0]


def comfy_cond(case: dict, **options) -> tuple[list, list]:
    return [[generated(case["positive"]), dict(options)]], [[generated(case["negative"]), dict(options)]]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_text_to_video_graph_equals_comfyui_on_every_layout(comfy_ctx, layout):
    """EmptyHunyuanLatentVideo -> Parallel Sampler (KSampler's inputs) on a Wan 2.1 T2V file."""
    case, run = REF["t2v"], REF["t2v"]["runs"][0]
    handle = load(comfy_ctx, case["model"]["salt"], layout, run["steps"])
    pos, neg = comfy_cond(case)
    latent = {"samples": tensor(case["latent"])}
    args = (run["seed"], run["steps"], run["cfg"], run["sampler"], run["scheduler"], 1.0)
    (out,) = ParallelSampler(comfy_ctx).sample(handle, pos, neg, latent, *args)["result"]
    close(out["samples"], tensor(run["output"]))


@pytest.mark.parametrize("layout", ["ulysses2", "pp2"])
def test_wan22_two_pass_graph_equals_comfyui_ksampler_advanced(comfy_ctx, layout):
    """High-noise file steps 0..2 with leftover noise, low-noise file 2..end without added noise."""
    case = REF["two_pass"]
    pos, neg = comfy_cond(case)
    latent = {"samples": tensor(case["latent"])}
    for role, expected in (("first", case["middle"]), ("second", case["output"])):
        p = case[role]
        handle = load(comfy_ctx, case["high" if role == "first" else "low"]["salt"], layout, case["steps"])
        common = (case["seed"], case["steps"], case["cfg"], case["sampler"], case["scheduler"], pos, neg, latent)
        (latent,) = ParallelSamplerAdvanced(comfy_ctx).sample(
            handle, p["add_noise"], *common, p["start_at_step"], p["end_at_step"], p["return_with_leftover_noise"]
        )["result"]
        close(latent["samples"], tensor(expected))


def test_wan22_two_files_on_one_loader_equal_the_two_pass_graph(comfy_ctx):
    """One Parallel Model Loader with the low-noise file as low_noise_model (boundary between the 2nd and 3rd
    sigma of the 4-step schedule: 0.96 and 0.889 at shift 8) and ONE Parallel Sampler equal ComfyUI's two
    KSamplerAdvanced passes; three prompts on one warm pool, no reload. PipeFusion is refused on the node."""
    case = REF["two_pass"]
    low = f"wan_{case['low']['salt']}.safetensors"
    handle = load(comfy_ctx, case["high"]["salt"], "ulysses2", case["steps"], low_noise_model=low, expert_boundary=0.92)
    model = handle.model()
    pool, generation = model.pool, model._loaded.generation
    pos, neg = comfy_cond(case)
    latent = {"samples": tensor(case["latent"])}
    for seed in (case["seed"], 3, case["seed"]):
        args = (seed, case["steps"], case["cfg"], case["sampler"], case["scheduler"], 1.0)
        (out,) = ParallelSampler(comfy_ctx).sample(handle, pos, neg, latent, *args)["result"]
        if seed == case["seed"]:
            close(out["samples"], tensor(case["output"]))
    again = handle.model()
    assert again.pool is pool and not pool.closed and again._loaded.generation == generation
    with pytest.raises(ConfigError, match="second expert file with the layout"):
        load(comfy_ctx, case["high"]["salt"], "pp2", case["steps"], low_noise_model=low).model()


@pytest.mark.parametrize("layout", ["ulysses2", "ring2", "cfg2", "pp2"])
def test_image_to_video_graph_equals_comfyui_wan_image_to_video(comfy_ctx, layout):
    """WanImageToVideo's CONDITIONING (start-image latent, mask, CLIP-vision output) on a Wan 2.1 I2V file."""
    case = REF["i2v_clip"]
    handle = load(comfy_ctx, case["model"]["salt"], layout, case["steps"])
    clip = ClipVisionOutput(generated(case["clip_vision"]))
    image, mask = tensor(case["concat_latent_image"]), tensor(case["concat_mask"])
    pos, neg = comfy_cond(case, concat_latent_image=image, concat_mask=mask, clip_vision_output=clip)
    latent = {"samples": tensor(case["latent"])}
    args = (case["seed"], case["steps"], case["cfg"], case["sampler"], case["scheduler"], 1.0)
    (out,) = ParallelSampler(comfy_ctx).sample(handle, pos, neg, latent, *args)["result"]
    close(out["samples"], tensor(case["output"]))


@pytest.mark.parametrize("layout", ["ulysses2", "cfg2"])
def test_ti2v_graph_equals_comfyui_and_decodes_as_comfyuis_vae(comfy_ctx, layout):
    """Wan22ImageToVideoLatent's LATENT (noise mask keeping the first frame) on a TI2V-5B file, then Parallel
    VAE Decode with the Wan 2.2 VAE from models/vae: frames equal ComfyUI's VAE decode."""
    case = REF["ti2v"]
    handle = load(comfy_ctx, case["model"]["salt"], layout, case["steps"], vae="wan_vae22.safetensors")
    pos, neg = comfy_cond(case)
    latent = {"samples": tensor(case["latent"]), "noise_mask": tensor(case["noise_mask"])}
    args = (case["seed"], case["steps"], case["cfg"], case["sampler"], case["scheduler"], 1.0)
    (out,) = ParallelSampler(comfy_ctx).sample(handle, pos, neg, latent, *args)["result"]
    close(out["samples"], tensor(case["output"]))
    spec = VAE_REF["vae22"]["latent"]
    z = hashed_uniform(spec["name"], tuple(spec["shape"]), spec["scale"])
    (frames,) = ParallelVAEDecode(comfy_ctx).decode(handle, {"samples": z})
    ref = VAE_REF["vae22"]["image"]
    torch.testing.assert_close(frames, torch.tensor(ref["data"]).reshape(ref["shape"]), atol=2e-5, rtol=0)
