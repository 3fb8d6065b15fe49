"""HunyuanVideo 1.5 LoRA files on the workers (ComfyUI 0.3.64 has no HunyuanVideo 1.5: the oracle is the LoRA
formula): one file in diffusers' PEFT names (``transformer.<diffusers name>``, and ``base_model.model.`` as PEFT saves
an adapter) on the double blocks' attention (image and text projections), feed-forward and modulation, the token
refiner and the ByT5 glyph mapper, and in Tencent's names (``diffusion_model.double_blocks.N.img_attn_v``, kohya's
``lora_unet_double_blocks_*`` with alpha, the refiner's fused ``self_attn_qkv`` split over three projections), sampled on 1 rank, Ulysses 2 and PipeFusion 2 (warmup = steps: exact), equals our
single device with the weights merged by W + strength * alpha / rank * up @ down; an empty stack gives back the plain model's video.
A HunyuanVideo 1.5 LoRA loaded on another family's model is refused with the family its names suggest."""

from __future__ import annotations

import pytest
import torch
from lora_formula_cases import LoraCase, LoraModule, relative, write_lora  # tests/ helper

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig

NAME = "tiny-hunyuan-video-1.5"
POSITIVE, NEGATIVE = 'a shop window with a sign that says "open", warm light', "blurry, static"
LAYOUTS = {"1rank": ParallelConfig(), "ulysses2": ParallelConfig(ulysses=2), "pp2": ParallelConfig(pp=2)}


def peft(name: str, prefix: str = "transformer.") -> LoraModule:
    return LoraModule(prefix + name, (name + ".weight",))


MODULES = [
    peft("transformer_blocks.0.attn.to_q"),
    peft("transformer_blocks.0.norm1.linear"),
    peft("transformer_blocks.1.attn.add_v_proj"),
    peft("transformer_blocks.1.ff.net.0.proj"),
    peft("context_embedder.token_refiner.refiner_blocks.0.attn.to_k", "base_model.model."),
    peft("context_embedder_2.linear_3"),  # the glyph text's mapper (the prompt quotes "open")
    # Tencent's names (the release's, ComfyUI's / musubi-tuner's converted files, kohya's), through the original layout
    LoraModule("diffusion_model.double_blocks.0.img_attn_v", ("transformer_blocks.0.attn.to_v.weight",)),
    LoraModule("lora_unet_double_blocks_1_txt_mlp_fc1", ("transformer_blocks.1.ff_context.net.0.proj.weight",), True),
    LoraModule(  # the refiner's fused q/k/v: rows to diffusers' three projections
        "diffusion_model.txt_in.individual_token_refiner.blocks.1.self_attn_qkv",
        tuple(f"context_embedder.token_refiner.refiner_blocks.1.attn.to_{p}.weight" for p in "qkv"),
    ),
]


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> LoraCase:
    def conds(comps):
        return encode_prompts(comps, "hunyuan-video-1.5", POSITIVE, NEGATIVE)

    latent = torch.zeros(1, 8, 3, 3, 5)  # 45 tokens
    folder = tmp_path_factory.mktemp("hunyuan-video15-lora")
    return LoraCase(str(ensure_tiny_model(NAME)), folder, MODULES, conds, latent, 4.0)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lora_on_the_workers_equals_the_merged_weights(cpu_pool, case, layout):
    pool = cpu_pool(LAYOUTS[layout])
    pipefusion = {"patches": 3, "warmup": case.settings.steps} if layout == "pp2" else {}
    got = case.run(pool, **pipefusion)
    assert relative(got, case.merged) <= 1e-5, f"relative L2 error {relative(got, case.merged):.2e}"
    assert relative(case.plain, case.merged) > 1e-2  # the LoRA changes the video
    if layout == "ulysses2":  # an empty stack restores the weights
        assert relative(case.run(pool, loras=()), case.plain) <= 1e-5


def test_every_module_resolves_and_another_familys_model_names_this_family(tmp_path):
    """Every name patches this model's weights; on the tiny Z-Image a file of the blocks and the glyph mapper in
    diffusers' names matches nothing and the message names HunyuanVideo 1.5 (its ``lora_markers``). (The hint takes
    the first family in the registry whose marker matches: a file that also patches the token refiner is named
    HunyuanVideo 1.0, whose refiner has the same names, and one in Tencent's names Flux.1, for ``double_blocks``.)"""
    from parallel_runtime.models.lora.files import lora_file_id, read_lora
    from parallel_runtime.models.lora.keymap import TRANSFORMER
    from parallel_runtime.models.lora.model_keys import model_keys
    from parallel_runtime.models.lora.patcher import LoraPatcher
    from parallel_runtime.models.lora.resolve import check_resolution, resolve

    own = load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32, parts=("transformer",))
    params = {k: v.detach() for k, v in own.transformer.named_parameters()}
    path = tmp_path / "hunyuan_video15_lora.safetensors"
    write_lora(path, MODULES, params)
    keys = model_keys("hunyuan-video-1.5", own.transformer, own.transformer_config)
    resolution = LoraPatcher(keys, {TRANSFORMER: own.transformer}).resolution(lora_file_id(path))
    assert resolution.transformer_modules == len(MODULES) and not resolution.unmatched, resolution.summary()
    other = load_pipeline_components(ensure_tiny_model("tiny-z-image"), "cpu", torch.float32, parts=("transformer",))
    z_keys = model_keys("z-image", other.transformer, other.transformer_config)
    no_refiner = tmp_path / "hunyuan_video15_blocks_lora.safetensors"
    write_lora(no_refiner, [m for m in MODULES if m.name.startswith("transformer.")], params)
    on_z_image = resolve(read_lora(lora_file_id(no_refiner)), z_keys)
    with pytest.raises(ConfigError, match=r"matches 0 of its 5 .*look like a hunyuan-video-1.5 LoRA"):
        check_resolution(on_z_image, z_keys, no_refiner.name, text_on_workers=False)
