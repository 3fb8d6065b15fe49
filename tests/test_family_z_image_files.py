"""Z-Image from the files ComfyUI users keep: the transformer in its original layout (Comfy-Org's repackaged
``z_image_turbo_bf16.safetensors``: fused q/k/v; bf16 and fp8 scaled; a PipeFusion stage of it), the Qwen3 text
encoder as one file (``qwen_3_4b.safetensors``) on the workers, and LoRA files in the three namings Z-Image LoRAs
come in. Oracles: the diffusers folder, diffusers' own single-file converter, and LoRA's formula."""

from __future__ import annotations

import contextlib

import pytest
import torch
from bigmodel_files import save, to_fp8  # tests/ helpers
from original_layout_files import PREFIX, same_config_value, write_header_only

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.models import Conditioning, get_adapter
from parallel_runtime.models.families.z_image.keys import skeleton
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer, shipped_config
from parallel_runtime.parallel.mesh import ParallelMesh

NAME = "tiny-z-image"
FUSED = ("to_q", "to_k", "to_v")


class Plain:
    """Attention as it is: F.scaled_dot_product_attention on one device."""

    def intercept(self):
        return contextlib.nullcontext()


def z_image_to_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' Z-Image names -> the original layout (fused q/k/v, no patch-size key)."""
    out = {}
    for name, value in state.items():
        if ".attention.to_k." in name or ".attention.to_v." in name:
            continue
        if ".attention.to_q." in name:
            parts = [state[name.replace(".to_q.", f".{p}.")] for p in FUSED]
            out[name.replace(".to_q.", ".qkv.")] = torch.cat(parts)
            continue
        for old, new in (
            ("all_x_embedder.2-1.", "x_embedder."),
            ("all_final_layer.2-1.", "final_layer."),
            (".attention.to_out.0.", ".attention.out."),
            (".attention.norm_q.", ".attention.q_norm."),
            (".attention.norm_k.", ".attention.k_norm."),
        ):
            name = name.replace(old, new)
        out[name] = value
    return out


@pytest.fixture(scope="module")
def folder():
    return load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32)


@pytest.fixture(scope="module")
def original(folder):
    return z_image_to_original(folder.transformer.state_dict())


def test_reverse_mapping_and_skeleton_round_trip_through_diffusers_converter(folder, original):
    from parallel_runtime.models.compat import convert_z_image_transformer

    state = folder.transformer.state_dict()
    assert {k: tuple(v.shape) for k, v in original.items()} == skeleton(folder.transformer_config)
    back = convert_z_image_transformer(dict(original))
    assert sorted(back) == sorted(state) and all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("prefix", ["", PREFIX], ids=["comfy-org", "prefixed"])
def test_single_file_loads_the_same_transformer(tmp_path, folder, original, prefix):
    path = save(original, tmp_path / "z_image_turbo_bf16.safetensors", prefix)
    info = inspect_single_file(path)
    assert (info.family, info.variant, info.prefix) == ("z-image", "z-image-6b", prefix)
    model, family, scheduler = load_single_file_transformer(path, "cpu", torch.float32)
    reference = folder.transformer
    for key, value in reference.config.items():
        if not key.startswith("_"):
            assert same_config_value(model.config[key], value), key
    got, ref = model.state_dict(), reference.state_dict()
    assert sorted(got) == sorted(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    assert scheduler == shipped_config("z-image-6b")[1] and scheduler["shift"] == 3.0


def test_published_sizes_from_a_header_only_file(tmp_path):
    """Real Z-Image-Turbo shapes (no data): the shipped config comes back, 32 blocks for PipeFusion to split."""
    from parallel_runtime.models.model_info import model_info_from_path

    dim, hidden = 3840, 10240
    shapes = {"x_embedder.weight": (dim, 64), "cap_embedder.1.weight": (dim, 2560), "x_pad_token": (1, dim)}
    for name, count in (("layers", 30), ("noise_refiner", 2), ("context_refiner", 2)):
        for i in range(count):
            shapes[f"{name}.{i}.attention.q_norm.weight"] = (128,)
            shapes[f"{name}.{i}.feed_forward.w1.weight"] = (hidden, dim)
    path = write_header_only(tmp_path / "z_image_turbo_bf16.safetensors", shapes)
    info = inspect_single_file(path)
    base, _ = shipped_config("z-image-6b")
    assert info.family == "z-image" and {k: info.config[k] for k in base} == base
    planned = model_info_from_path(path)  # what the layout planner reads: 30 heads, 2 refiners + 30 layers
    assert (planned.num_heads, planned.num_layers, planned.hidden_size) == (30, 32, 3840)
    assert len(planned.block_bytes) == 32 and 12.2e9 < planned.weight_bytes < 12.4e9


def test_fp8_scaled_file_keeps_fp8_layers_and_computes_as_its_upcast_weights(tmp_path, original):
    """ComfyUI's scaled fp8: the fused q/k/v is split under its one scale, row by row (a PipeFusion stage reads
    only its rows); kept in fp8 it computes exactly as the same file loaded upcast."""
    from parallel_runtime.models.fp8 import fp8_layers

    path = save(to_fp8(original, "scaled"), tmp_path / "z_image_turbo_fp8_scaled.safetensors")
    kept, _, _ = load_single_file_transformer(path, "cpu", torch.float32)
    upcast, _, _ = load_single_file_transformer(path, "cpu", torch.float32, storage="compute")
    assert "layers.0.attention.to_q" in fp8_layers(kept) and not fp8_layers(upcast)
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(1, 16, 12, 10, generator=g), Conditioning(torch.randn(1, 9, 16, generator=g))
    with torch.no_grad():
        a = get_adapter(kept).forward(x, 0.4, text, ParallelMesh.single(), Plain())
        b = get_adapter(upcast).forward(x, 0.4, text, ParallelMesh.single(), Plain())
    assert (a - b).abs().max().item() <= 1e-5


def test_pipefusion_stage_from_the_single_file_equals_the_folder_stage(tmp_path, original):
    from parallel_runtime.pipefusion.stage_loading import load_single_file_stage, load_stage_transformer

    path = save(original, tmp_path / "z.safetensors")
    for stage in (0, 1):
        comps, plan, weights = load_single_file_stage(path, 2, stage, "cpu", torch.float32)
        ref, ref_plan, ref_weights = load_stage_transformer(ensure_tiny_model(NAME), 2, stage, "cpu", torch.float32)
        assert plan.bounds == ref_plan.bounds and weights == ref_weights
        got, want = dict(comps.transformer.named_parameters()), dict(ref.named_parameters())
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert got[name].device == value.device, name
            if value.device.type != "meta":
                assert torch.equal(got[name], value), name
    # the context refiner (used by the embedding only) stays off the last stage
    assert got["context_refiner.0.attention.to_q.weight"].device.type == "meta"


def _comfy_qwen3_file(tmp_path, folder, fp8: bool = False):
    """The tiny Qwen3 saved as ComfyUI stores qwen_3_4b*.safetensors (Hugging Face names under ``model.``), with
    its tokenizer in a ``<stem>_tokenizer`` folder next to it."""
    comfy = {"model." + k: v for k, v in folder.text_encoders["text_encoder"].state_dict().items()}
    stem = "qwen_3_4b_fp8_scaled" if fp8 else "qwen_3_4b"
    path = save(to_fp8(comfy, "scaled") if fp8 else comfy, tmp_path / f"{stem}.safetensors")
    folder.tokenizers["tokenizer"].save_pretrained(tmp_path / f"{stem}_tokenizer")
    return path, tmp_path / f"{stem}_tokenizer"


def test_qwen3_text_encoder_files_encode_like_the_folder_on_the_workers(cpu_pool, tmp_path, folder, original):
    """ComfyUI's Qwen3 file (full precision; fp8 scaled) on the workers, next to a Z-Image transformer file, encodes
    as the diffusers folder's encoder (exactly; fp8: as its own weights upcast at load)."""
    from parallel_runtime.models.families.z_image.text import encode_z_image
    from parallel_runtime.models.families.z_image.text_file import load_qwen3_text_file
    from parallel_runtime.models.text_encoding import encode_prompt
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    pool = cpu_pool(ParallelConfig(ulysses=2))
    transformer = save(original, tmp_path / "z_image_turbo_bf16.safetensors")
    pool.submit(load_model, str(transformer), "fp32", "sdpa").result(300)  # a transformer file: no encoders
    prompts = ["a red fox in the snow", "a lighthouse at dusk"]
    full, tokenizer = _comfy_qwen3_file(tmp_path, folder)
    got = pool.submit(encode_text_file, str(full), str(tokenizer), prompts).result(300)
    for prompt, cond in zip(prompts, got):
        assert torch.equal(cond.prompt_embeds, encode_prompt(folder, "z-image", prompt).prompt_embeds)
    fp8, fp8_tokenizer = _comfy_qwen3_file(tmp_path, folder, fp8=True)
    got = pool.submit(encode_text_file, str(fp8), str(fp8_tokenizer), prompts[:1]).result(300)
    upcast = load_qwen3_text_file(fp8, "cpu", torch.float32, storage="compute")
    expected = encode_z_image(upcast, folder.tokenizers["tokenizer"], prompts[:1]).prompt_embeds
    assert torch.equal(got[0].prompt_embeds, expected)
    assert not torch.equal(expected, encode_prompt(folder, "z-image", prompts[0]).prompt_embeds)  # fp8 differs


RANK = 2
LORA_CASES = {  # module name in the file -> the diffusers tensors it patches (rows of a fused original: in order)
    "diffusion_model.layers.0.attention.qkv": [f"layers.0.attention.{p}.weight" for p in FUSED],  # ComfyUI
    "lora_unet_noise_refiner_0_feed_forward_w1": ["noise_refiner.0.feed_forward.w1.weight"],  # kohya
    "diffusion_model.layers.1.attention.to_k": ["layers.1.attention.to_k.weight"],  # AI-Toolkit: diffusers names
    "transformer.context_refiner.0.attention.to_out.0": ["context_refiner.0.attention.to_out.0.weight"],  # PEFT
}


def test_lora_files_in_every_naming_patch_by_the_formula(tmp_path):
    """W + strength * alpha / rank * up @ down on the tensors each name means, through the original layout's
    routing (a fused q/k/v patch lands on to_q, to_k and to_v rows) for a model loaded from the diffusers folder."""
    from safetensors.torch import save_file

    from parallel_runtime.models.lora.files import lora_file_id
    from parallel_runtime.models.lora.keymap import TRANSFORMER
    from parallel_runtime.models.lora.model_keys import model_keys
    from parallel_runtime.models.lora.patcher import LoraPatcher, StackEntry

    comps = load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32, parts=("transformer",))
    model = comps.transformer
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(9)
    tensors, expected = {}, {}
    for module, targets in LORA_CASES.items():
        rows = sum(params[t].shape[0] for t in targets)
        down, up = torch.randn(RANK, params[targets[0]].shape[1], generator=g), torch.randn(rows, RANK, generator=g)
        kohya = module.startswith("lora_unet_")
        tensors[f"{module}.{'lora_down' if kohya else 'lora_A'}.weight"] = down
        tensors[f"{module}.{'lora_up' if kohya else 'lora_B'}.weight"] = up
        alpha = 1.0 if kohya else RANK  # no alpha: alpha = rank
        if kohya:
            tensors[f"{module}.alpha"] = torch.tensor(alpha)
        delta = 0.7 * alpha / RANK * (up @ down)
        for target, part in zip(targets, delta.split([params[t].shape[0] for t in targets])):
            expected[target] = params[target] + part
    path = tmp_path / "z_image_lora.safetensors"
    save_file(tensors, str(path))
    keys = model_keys("z-image", model, comps.transformer_config)
    patcher = LoraPatcher(keys, {TRANSFORMER: model})
    resolution = patcher.resolution(lora_file_id(path))
    assert resolution.transformer_modules == len(LORA_CASES) and not resolution.unmatched, resolution.summary()
    patcher.apply([StackEntry(lora_file_id(path), 0.7, 0.0)], [TRANSFORMER])
    now = dict(model.named_parameters())
    for name, value in params.items():
        want = expected.get(name, value)
        assert torch.allclose(now[name], want, rtol=0, atol=1e-6), name
    patcher.apply([], [TRANSFORMER])
    assert all(torch.equal(now[k], v) for k, v in params.items())
