"""Qwen-Image-Edit prompts with reference images, encoded on the workers from ComfyUI's Qwen2.5-VL file (text
model + vision tower ``visual.*``), equal ComfyUI 0.3.64's own TextEncodeQwenImageEdit / TextEncodeQwenImageEditPlus.

Oracle: tests/data/comfy_qwen_edit_text_reference.json (tests/data/make_comfy_qwen_edit_text_reference.py) on the
tiny encoder of tests/data/qwen_vl_tiny_weights.py, rebuilt here bit for bit; tokenized with the tokenizer ComfyUI
ships (its Qwen token ids are what ComfyUI's template search and image placeholder rely on).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.errors import ConfigError
from parallel_runtime.parallel.config import ParallelConfig

DATA = Path(__file__).resolve().parents[1] / "data"
sys.path.insert(0, str(DATA))
from qwen_vl_tiny_weights import comfy_state, smooth_image, state_digest  # noqa: E402

REFERENCE = json.loads((DATA / "comfy_qwen_edit_text_reference.json").read_text(encoding="utf-8"))
TEXT = {"head_dim": 12}  # what the tiny file's shapes cannot show
VISION = {"num_heads": 2, "fullatt_block_indexes": [1]}
BOUND = 1e-5  # as the UMT5 / Qwen text-file tests against ComfyUI


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    from safetensors.torch import save_file

    state = comfy_state()
    assert state_digest(state) == REFERENCE["state_digest"]  # the weights ComfyUI's reference was made with
    path = tmp_path_factory.mktemp("qwen_vl") / "qwen_2.5_vl_7b.safetensors"
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, str(path))
    return path


def _mode(case: dict) -> str:
    return "edit" if case["node"] == "TextEncodeQwenImageEdit" else "edit_plus"


def _expected(case: dict) -> torch.Tensor:
    return torch.tensor(case["conditioning"]["data"]).reshape(case["conditioning"]["shape"])


def test_workers_encode_edit_prompts_like_comfyui(cpu_pool, comfy_snapshot, tiny_file):
    """Every case (Edit with one 1 MP image: many vision windows; EditPlus with two and three images of odd
    aspects, with only image2 connected (it stays "Picture 2"), without an image) on a Ulysses-2 pool's text rank."""
    from parallel_runtime.service.edit_text_job import encode_edit_text_file
    from parallel_runtime.service.load_job import load_model

    tokenizer = str(comfy_snapshot / "comfy/text_encoders/qwen25_tokenizer")
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(DATA / "tiny_qwen_image_bf16.safetensors"), "fp32", "sdpa").result(300)
    for case in REFERENCE["cases"]:
        images = [None if spec is None else smooth_image(*spec) for spec in case["images"]]
        job = encode_edit_text_file, str(tiny_file), tokenizer, [case["prompt"]], images, _mode(case), TEXT, VISION
        (got,) = pool.submit(*job).result(300)
        expected = _expected(case)
        assert got.prompt_embeds.shape == expected.shape and got.attention_mask is None, case["name"]
        assert (got.prompt_embeds - expected).abs().max() <= BOUND, case["name"]


def test_vision_tokens_are_transformers_tower_in_comfyuis_window_order(tiny_file):
    """The tokens are transformers' own Qwen2.5-VL tower's, listed window by window as ComfyUI's tower returns
    them: for a picture of several windows the raster order (transformers' model) is a different sequence."""
    from parallel_runtime.models.families.qwen_image.vision import (
        image_patches,
        load_qwen25_vision_file,
        vision_tokens,
    )

    tower = load_qwen25_vision_file(tiny_file, "cpu", torch.float32, overrides=VISION)
    image = smooth_image(250, 200, 7)[0]
    tokens, (rows, cols) = vision_tokens(tower, image)
    patches, grid = image_patches(image)
    raster = tower(patches, grid_thw=torch.tensor([grid])).pooler_output
    assert (rows, cols) == (grid[1] // 2, grid[2] // 2) and rows > 4 and cols > 4  # several 4x4 windows
    assert torch.equal(tokens[:16], raster.reshape(rows, cols, -1)[:4, :4].reshape(16, -1))  # the first window
    assert torch.equal(tokens.sort(0).values, raster.sort(0).values) and not torch.equal(tokens, raster)


def test_a_file_without_a_vision_tower_or_a_gguf_is_refused_with_images(tmp_path):
    from safetensors.torch import save_file

    from parallel_runtime.models.families.qwen_image.vision import load_qwen25_vision_file

    text_only = {k: v.to(torch.bfloat16) for k, v in comfy_state().items() if k.startswith("model.")}
    save_file(text_only, str(tmp_path / "qwen_2.5_vl_7b.safetensors"))
    with pytest.raises(ConfigError, match="no vision tower"):
        load_qwen25_vision_file(tmp_path / "qwen_2.5_vl_7b.safetensors", "cpu", torch.float32)
    with pytest.raises(ConfigError, match="GGUF"):
        load_qwen25_vision_file(tmp_path / "Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf", "cpu", torch.float32)


def test_edit_plus_prompt_equals_transformers_qwen2_5_vl_where_the_orders_agree(tiny_file, comfy_snapshot):
    """With windows as large as the picture (window order = raster order), two pictures in an EditPlus prompt
    give transformers' Qwen2_5_VLForConditionalGeneration's last hidden state (its processor's expansion of
    <|image_pad|>, its get_rope_index positions) from the first token after "<|im_start|>user\\n"."""
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from parallel_runtime.models.families.qwen_image import edit_prompt
    from parallel_runtime.models.families.qwen_image.vision import image_patches, load_qwen25_vision_file
    from parallel_runtime.models.qwen25_text_file import load_qwen25_text_file

    tokenizer = AutoTokenizer.from_pretrained(comfy_snapshot / "comfy/text_encoders/qwen25_tokenizer")
    one_window = {**VISION, "window_size": 112 * 16}
    encoder = load_qwen25_text_file(tiny_file, "cpu", torch.float32, overrides=TEXT)
    tower = load_qwen25_vision_file(tiny_file, "cpu", torch.float32, overrides=one_window)
    images = [smooth_image(200, 120, 1)[0], smooth_image(150, 150, 2)[0]]
    prompt = "put the cat of picture 2 next to the fox"
    got = edit_prompt.encode_qwen_image_edit(encoder, tower, tokenizer, [prompt], images, "edit_plus").prompt_embeds

    text_config = {**encoder.config.to_dict(), "pad_token_id": tokenizer.pad_token_id}
    config = Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=tower.config.to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
    )
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    state = {"model.language_model." + k: v for k, v in encoder.state_dict().items()}
    state.update({"model.visual." + k: v for k, v in tower.state_dict().items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    rows, grids = [], []
    for image in images:
        patches, grid = image_patches(edit_prompt.area_scaled(image, 384 * 384))
        rows.append(patches)
        grids.append(grid)
    text = edit_prompt.edit_prompt_text(prompt, [1, 2], "edit_plus")
    for t, h, w in grids:  # the processor's expansion: one <|image_pad|> per merged token
        text = text.replace("<|image_pad|>", "<|placeholder|>" * (t * h * w // 4), 1)
    ids = tokenizer(text.replace("<|placeholder|>", "<|image_pad|>"), return_tensors="pt").input_ids
    with torch.no_grad():
        out = model(
            input_ids=ids,
            mm_token_type_ids=(ids == config.image_token_id).int(),  # what its processor marks: image tokens
            pixel_values=torch.cat(rows),
            image_grid_thw=torch.tensor(grids),
            output_hidden_states=True,
        )
    drop = len(tokenizer(edit_prompt.EDIT_TEMPLATE.split("{}")[0]).input_ids)
    expected = out.hidden_states[-1][:, drop:]
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= BOUND


class _RecordingModel:
    """The runtime model's face the nodes use: answers with ComfyUI's stored conditioning for the case."""

    def __init__(self, case: dict):
        self.case, self.calls = case, []

    def encode_edit_text(self, prompt, text_encoder, images, mode):
        from parallel_runtime.models.base import Conditioning

        self.calls.append((prompt, text_encoder, images, mode))
        return Conditioning(_expected(self.case))


class _RecordingVAE:
    def __init__(self):
        self.seen = []

    def encode(self, pixels):
        self.seen.append(pixels)
        return pixels.movedim(-1, 1)[:, :, ::8, ::8]


@pytest.mark.parametrize("name", [c["name"] for c in REFERENCE["cases"]])
def test_edit_nodes_mirror_comfyuis_inputs_and_reference_latents(tmp_path, name):
    """The Parallel nodes pass the prompt, the images in their slots and the mode on, and make each reference
    latent from the pixels ComfyUI's node scales for the VAE (sizes; values to float32 rounding)."""
    import types

    from node_helpers import RecordingBridge
    from pack_import import load_pack

    load_pack()
    from dit_parallel_pack.nodes import text_encode_edit

    case = next(c for c in REFERENCE["cases"] if c["name"] == name)
    (tmp_path / "qwen_2.5_vl_7b.safetensors").write_bytes(b"")
    (tmp_path / "qwen_2.5_vl_7b_tokenizer").mkdir()
    model = _RecordingModel(case)
    bridge = RecordingBridge(folders={"text_encoders": [str(tmp_path)]})
    handle = types.SimpleNamespace(model=lambda: model, context=types.SimpleNamespace(bridge=bridge))
    images = [None if spec is None else smooth_image(*spec) for spec in case["images"]]
    vae = _RecordingVAE()
    if case["node"] == "TextEncodeQwenImageEdit":
        node, slots = text_encode_edit.ParallelTextEncodeQwenImageEdit(), {"image": images[0] if images else None}
    else:
        node = text_encode_edit.ParallelTextEncodeQwenImageEditPlus()
        slots = {f"image{i + 1}": images[i] if i < len(images) else None for i in range(3)}
    ((conditioning, options),) = node.encode(handle, case["prompt"], "qwen_2.5_vl_7b.safetensors", vae, **slots)[0]
    ((prompt, encoder, sent, mode),) = model.calls
    assert prompt == case["prompt"] and mode == _mode(case)
    assert encoder == (str(tmp_path / "qwen_2.5_vl_7b.safetensors"), str(tmp_path / "qwen_2.5_vl_7b_tokenizer"))
    assert [s is None for s in sent] == [s is None for s in (list(slots.values()))]
    assert torch.equal(conditioning, _expected(case))
    assert len(options.get("reference_latents", [])) == len(vae.seen) == len(case["vae_pixels"])
    for pixels, summary in zip(vae.seen, case["vae_pixels"]):
        flat = pixels.double().flatten()
        assert list(pixels.shape) == summary["shape"]
        assert abs(flat.sum().item() - summary["sum"]) <= 1e-6 * flat.numel()
        assert abs((flat * flat).sum().item() - summary["sum_squares"]) <= 1e-6 * flat.numel()
        sample = torch.tensor(summary["every_9973rd"]["data"], dtype=torch.float64)
        assert (flat[::9973] - sample).abs().max() <= 1e-6


def test_edit_requests_are_checked_on_the_host(tmp_path, tiny_file):
    """What the workers cannot do is refused before any job: another family, no file, more images than the
    node takes, something that is not an IMAGE, a file without the vision tower."""
    from safetensors.torch import save_file

    from parallel_runtime.service.edit_text_job import check_edit_text_request

    tokenizer = str(tmp_path / "tokenizer")
    image = smooth_image(40, 40, 0)
    assert check_edit_text_request("qwen-image", (str(tiny_file), tokenizer), [image, None], "edit_plus") == (
        str(tiny_file),
        tokenizer,
    )
    refusals = [
        ("flux", (str(tiny_file), tokenizer), [image], "edit_plus", "Qwen-Image-Edit prompt for a flux model"),
        ("qwen-image", None, [image], "edit_plus", "no text-encoder file"),
        ("qwen-image", (str(tiny_file), tokenizer), [image, image], "edit", "2 images for a edit prompt"),
        ("qwen-image", (str(tiny_file), tokenizer), [image[0]], "edit_plus", "image 1 is not an IMAGE"),
    ]
    for family_id, encoder, images, mode, message in refusals:
        with pytest.raises(ConfigError, match=message):
            check_edit_text_request(family_id, encoder, images, mode)
    text_only = {k: v.to(torch.bfloat16) for k, v in comfy_state().items() if k.startswith("model.")}
    save_file(text_only, str(tmp_path / "qwen_2.5_vl_7b.safetensors"))
    with pytest.raises(ConfigError, match="has no vision tower"):
        check_edit_text_request(
            "qwen-image", (str(tmp_path / "qwen_2.5_vl_7b.safetensors"), tokenizer), [image], "edit"
        )
    assert check_edit_text_request("qwen-image", (str(tmp_path / "qwen_2.5_vl_7b.safetensors"), tokenizer), [], "edit")


def test_fp8_scaled_file_keeps_the_vision_towers_linear_layers_in_fp8(tmp_path, comfy_snapshot):
    """A scaled-fp8 file (every Linear weight e4m3fn with its scale, ComfyUI's layout): the vision tower holds its
    Linear layers in fp8 as the text model does, and the edit prompt equals the same file's weights upcast at load
    (not the bf16 file's)."""
    from bigmodel_files import save, to_fp8
    from transformers import AutoTokenizer

    from parallel_runtime.models.families.qwen_image.edit_prompt import encode_qwen_image_edit
    from parallel_runtime.models.families.qwen_image.vision import load_qwen25_vision_file
    from parallel_runtime.models.fp8 import fp8_layers
    from parallel_runtime.models.qwen25_text_file import load_qwen25_text_file

    tokenizer = AutoTokenizer.from_pretrained(comfy_snapshot / "comfy/text_encoders/qwen25_tokenizer")
    state = comfy_state()
    fp8 = save(to_fp8(state, "scaled"), tmp_path / "qwen_2.5_vl_7b_fp8_scaled.safetensors")
    bf16 = save({k: v.to(torch.bfloat16) for k, v in state.items()}, tmp_path / "qwen_2.5_vl_7b.safetensors")
    images = [smooth_image(200, 120, 1), smooth_image(150, 150, 2)]

    def encode(path, storage):
        encoder = load_qwen25_text_file(path, "cpu", torch.float32, storage=storage, overrides=TEXT)
        tower = load_qwen25_vision_file(path, "cpu", torch.float32, storage=storage, overrides=VISION)
        cond = encode_qwen_image_edit(encoder, tower, tokenizer, ["a collage"], images, "edit_plus")
        return cond.prompt_embeds, tower

    kept, tower = encode(fp8, "auto")
    assert len(fp8_layers(tower)) == 2 * 5 + 2 and all(layer.scaled for layer in fp8_layers(tower).values())
    upcast, _ = encode(fp8, "compute")
    assert torch.equal(kept, upcast)
    assert not torch.allclose(kept, encode(bf16, "auto")[0], atol=1e-3)  # fp8 is not bf16
