"""HunyuanVideo 1.5 image-to-video through the nodes: a HunyuanVideo15ImageToVideoPipeline folder (the tiny
model's parts) loads, Parallel Text Encode encodes both prompts and Parallel HunyuanVideo 1.5 Image To Video makes
the start image's latent (the model's VAE) and SigLIP states (a tiny SigLIP saved as a real models/clip_vision
file in the release's names, or the folder's own image_encoder) on the workers; Parallel Sampler's video equals
diffusers' I2V pipeline on the same components (one rank, the file), and Ulysses 2 (the folder's encoder) equals one
rank."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from node_helpers import RecordingBridge  # tests/ helper
from PIL import Image

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.hunyuan_video15.conditioning import GlyphText
from parallel_runtime.models.families.hunyuan_video15.latent import HUNYUAN_VIDEO15
from parallel_runtime.models.families.hunyuan_video15.text import template_crop
from parallel_runtime.models.families.hunyuan_video15.vision_file import siglip_config
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.sampling.noise import initial_noise

NAME = "tiny-hunyuan-video-1.5"
POSITIVE, NEGATIVE = 'a shop window with a sign that says "open", warm light', "blurry, static"
SIGLIP = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32,
              patch_size=8)  # fmt: skip
WIDTH, HEIGHT, LENGTH, SEED, STEPS, CFG = 48, 32, 9, 5, 3, 4.0
# loader widgets: devices, ulysses, ring, cfg_parallel, pipefusion, pp_patches, pp_warmup (CFG 2 and PipeFusion 2 of
# the same conditioning: tests/test_family_hunyuan_video15_i2v.py)
LAYOUTS = {"one": ("cpu:1", 1, 1, 1, 1, 0, 1), "ulysses2": ("cpu:2", 2, 1, 1, 1, 0, 1)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from safetensors.torch import save_file
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    root = tmp_path_factory.mktemp("hunyuan_video15_i2v")
    tiny = ensure_tiny_model(NAME)
    folder = root / "diffusers" / "tiny-hunyuan-video-1.5-i2v"
    folder.mkdir(parents=True)
    for part in tiny.iterdir():
        if part.is_dir():
            (folder / part.name).symlink_to(part)
    torch.manual_seed(11)
    vision = SiglipVisionModel(SiglipVisionConfig(**SIGLIP)).eval()
    with torch.no_grad():  # norms off their defaults, so a misread tensor shows
        for name, param in vision.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
    vision.save_pretrained(folder / "image_encoder")  # the i2v folder's own encoder: the same weights
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder / "feature_extractor")
    index = json.loads((tiny / "model_index.json").read_text())
    own = {
        "image_encoder": ["transformers", "SiglipVisionModel"],
        "feature_extractor": ["transformers", "SiglipImageProcessor"],
    }
    (folder / "model_index.json").write_text(
        json.dumps({**index, **own, "_class_name": "HunyuanVideo15ImageToVideoPipeline"})
    )
    (root / "clip_vision").mkdir()
    weights = {
        "vision_model." + k.removeprefix("vision_model."): v.contiguous() for k, v in vision.state_dict().items()
    }
    save_file(weights, root / "clip_vision" / "tiny_sigclip.safetensors")  # the release's names
    pixels = np.random.default_rng(3).integers(0, 256, (40, 56, 3), dtype=np.uint8)  # another aspect: cropped
    return SimpleNamespace(
        folder=folder, vision=vision, vision_file=str(root / "clip_vision" / "tiny_sigclip.safetensors"),
        picture=Image.fromarray(pixels), image=torch.from_numpy(pixels).float().div(255).unsqueeze(0),
        bridge=RecordingBridge(folders={"diffusers": [str(root / "diffusers")], "clip_vision": [str(root / "clip_vision")]}),
    )  # fmt: skip


@torch.no_grad()
def pipeline_video(files) -> torch.Tensor:
    """diffusers' HunyuanVideo15ImageToVideoPipeline on the same components: model-space latent [1, 8, 3, 2, 3]."""
    from diffusers import ClassifierFreeGuidance, HunyuanVideo15ImageToVideoPipeline, HunyuanVideo15Pipeline
    from transformers import SiglipImageProcessor

    comps = load_pipeline_components(files.folder, "cpu", torch.float32)
    t2v = HunyuanVideo15Pipeline.from_pretrained(ensure_tiny_model(NAME), torch_dtype=torch.float32)
    processor = SiglipImageProcessor(size={"height": 32, "width": 32})
    pipe = HunyuanVideo15ImageToVideoPipeline(**t2v.components, image_encoder=files.vision, feature_extractor=processor)
    pipe.prompt_template_encode_start_idx = template_crop(pipe.tokenizer)
    pipe.video_processor.calculate_default_height_width = lambda **kw: (HEIGHT, WIDTH)  # the node's width x height
    pipe.guider = ClassifierFreeGuidance(guidance_scale=CFG)
    pos, neg = encode_prompts(comps, "hunyuan-video-1.5", POSITIVE, NEGATIVE)  # = encode_prompt (its own test)

    def inputs(c, prefix: str) -> dict:
        glyph = c.extras.byt5 if c.extras.byt5.shape[1] else torch.zeros(1, 1, 32)
        return {
            f"{prefix}prompt_embeds": c.prompt_embeds,
            f"{prefix}prompt_embeds_mask": torch.ones(c.prompt_embeds.shape[:2]),
            f"{prefix}prompt_embeds_2": glyph,
            f"{prefix}prompt_embeds_mask_2": torch.ones(glyph.shape[:2]) * bool(c.extras.byt5.shape[1]),
        }

    shape = (1, 8, (LENGTH - 1) // 4 + 1, HEIGHT // 16, WIDTH // 16)
    sigmas = [1 - int(i * 1000 / STEPS) / 1000 for i in range(STEPS)]  # ComfyUI's "simple" (before the shift)
    return pipe(
        files.picture, **inputs(pos, ""), **inputs(neg, "negative_"), num_frames=LENGTH, num_inference_steps=STEPS,
        sigmas=sigmas, latents=initial_noise(SEED, shape), output_type="latent",
    ).frames  # fmt: skip


def run_graph(files, layout: str, clip_vision: str) -> torch.Tensor:
    """Loader -> 2 x Parallel Text Encode -> Parallel HunyuanVideo 1.5 Image To Video -> Parallel Sampler: the
    sampler's raw LATENT."""
    from dit_parallel_pack.nodes.context import NodeContext
    from dit_parallel_pack.nodes.image_to_video import ParallelHunyuanVideo15ImageToVideo
    from dit_parallel_pack.nodes.loader import ParallelModelLoader
    from dit_parallel_pack.nodes.sampler import ParallelSampler
    from dit_parallel_pack.nodes.text_encode import ParallelTextEncode

    devices, ulysses, ring, cfg, pp, patches, warmup = LAYOUTS[layout]
    ctx = NodeContext.create(registry=files.registry, bridge=files.bridge)
    (model,) = ParallelModelLoader(context=ctx).load(
        files.folder.name, "auto", devices, "manual", ulysses, ring, cfg, pp, patches, warmup, "fp32", "sdpa"
    )["result"]
    (pos,) = ParallelTextEncode(context=ctx).encode(model, POSITIVE)
    (neg,) = ParallelTextEncode(context=ctx).encode(model, NEGATIVE)
    pos, neg, latent = ParallelHunyuanVideo15ImageToVideo(context=ctx).encode(
        model, pos, neg, clip_vision, WIDTH, HEIGHT, LENGTH, 1, files.image
    )
    assert isinstance(pos[0][1]["dit_parallel_extras"], GlyphText) and latent["samples"].shape == (1, 8, 3, 2, 3)
    (out,) = ParallelSampler(context=ctx).sample(model, pos, neg, latent, SEED, STEPS, CFG, "euler", "simple", 1.0)[
        "result"
    ]
    return out["samples"]


def test_i2v_nodes_equal_diffusers_pipeline_and_every_layout(files, pool_registry):
    files.registry = pool_registry
    ref = pipeline_video(files)
    one = run_graph(files, "one", "tiny_sigclip.safetensors")  # the models/clip_vision file
    err = ((HUNYUAN_VIDEO15.to_model(one) - ref).norm() / ref.norm()).item()
    assert err <= 1e-4, f"one rank vs diffusers' I2V pipeline: relative L2 error {err:.2e}"
    got = run_graph(files, "ulysses2", "(the model's own)")  # the folder's image_encoder (the same weights)
    err = ((got - one).norm() / one.norm()).item()
    assert err <= 1e-5, f"Ulysses 2 vs one rank: relative L2 error {err:.2e}"


def test_start_image_requests_are_checked_on_the_host(files):
    from parallel_runtime.service.start_image_job import check_start_image_request

    assert siglip_config(files.vision_file) == {**SIGLIP, "vision_use_head": True}
    family, t2v = "hunyuan-video-1.5", ensure_tiny_model(NAME)
    check_start_image_request(family, None, files.image, files.folder)  # the i2v folder's own encoder
    with pytest.raises(ConfigError, match="has no image_encoder"):
        check_start_image_request(family, None, files.image, t2v)  # a t2v folder has none: pick a file
    with pytest.raises(ConfigError, match="not an IMAGE"):
        check_start_image_request(family, files.vision_file, torch.zeros(1, 8, 8), t2v)
    with pytest.raises(ConfigError, match="for a wan model"):
        check_start_image_request("wan", files.vision_file, files.image, t2v)
    not_siglip = t2v / "transformer" / "diffusion_pytorch_model.safetensors"
    with pytest.raises(ConfigError, match="no SigLIP vision tower"):
        check_start_image_request(family, str(not_siglip), files.image, t2v)
