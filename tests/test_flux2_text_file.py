"""FLUX.2's text encoder from ONE file, as ComfyUI keeps it (Comfy-Org's ``mistral_3_small_flux2_bf16`` /
``_fp8`` .safetensors: Mistral's names under ``model.``, the tekken tokenizer inside as ``tekken_model``; full, or
pruned to 30 layers). Oracle: diffusers' own Flux2Pipeline prompt encoding of the same tiny Mistral3 model and
tokenizer; ComfyUI's encoding keeps only the prompt's tokens, which are the first rows of diffusers' 512."""

from __future__ import annotations

import pytest
import torch
from bigmodel_files import save, to_fp8  # tests/ helpers

from dit_devtools.tiny.big import mistral_text_encoder
from dit_devtools.tiny.tekken import tekken_json, tekken_tokenizer
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.flux2.text_file import (
    encode_flux2_file,
    load_mistral_text_file,
    tokenizer_of_file,
)

PROMPTS = ["a red fox in the snow", "a lighthouse at dusk, oil painting"]


@pytest.fixture(scope="module")
def tekken():
    return tekken_json()


@pytest.fixture(scope="module")
def reference(tekken, tmp_path_factory):
    """The tiny Mistral3 (diffusers' Flux2Pipeline text encoder) and its tokenizer read from the same tekken."""
    tokenizer = tekken_tokenizer(tekken, tmp_path_factory.mktemp("tekken"))
    return mistral_text_encoder(tokenizer).float(), tokenizer


def tiny_overrides(encoder) -> dict:
    """What the tiny encoder's weights cannot show (the real file's values are Mistral Small's)."""
    text = encoder.config.text_config
    theta = text.rope_parameters["rope_theta"]
    return {"head_dim": text.head_dim, "rope_theta": theta, "rms_norm_eps": text.rms_norm_eps}


def comfy_state(encoder, tekken: bytes, layers: int | None = None) -> dict[str, torch.Tensor]:
    """The encoder's tensors as ComfyUI's Mistral file stores them (``layers``: pruned to that many, no final
    norm, as a file made for FLUX.2 only), with the tokenizer's bytes."""
    out = {}
    for key, value in encoder.state_dict().items():
        for old, new in (
            ("model.language_model.", "model."),
            ("model.vision_tower.", "vision_tower."),
            ("model.multi_modal_projector.", "multi_modal_projector."),
        ):
            if key.startswith(old):
                out[new + key[len(old) :]] = value
    if layers is not None:
        out = {k: v for k, v in out.items() if k != "model.norm.weight"}
        out = {k: v for k, v in out.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    out["tekken_model"] = torch.frombuffer(bytearray(tekken), dtype=torch.uint8)
    return out


def diffusers_embeds(encoder, tokenizer, prompt: str) -> tuple[torch.Tensor, int]:
    """Flux2Pipeline's own prompt encoding ([1, 512, 3 x width]) and how many of its tokens are the prompt's."""
    from diffusers import Flux2Pipeline
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input

    embeds = Flux2Pipeline._get_mistral_3_small_prompt_embeds(encoder, tokenizer, prompt, dtype=torch.float32)
    chat = tokenizer.apply_chat_template(format_input([prompt]), tokenize=True, return_dict=True)
    return embeds, len(chat["input_ids"][0])


@pytest.mark.parametrize("layers", [None, 30], ids=["full", "pruned-30"])
def test_file_encodes_as_flux2_pipeline_on_the_prompts_tokens(tmp_path, reference, tekken, layers):
    """The file's encoding equals Flux2Pipeline's on every token of the prompt (1e-5), holds those tokens only
    (ComfyUI pads nothing), and reads its tokenizer from the file."""
    encoder, tokenizer = reference
    path = save(comfy_state(encoder, tekken, layers), tmp_path / "mistral_3_small_flux2_bf16.safetensors")
    model = load_mistral_text_file(path, "cpu", torch.float32, overrides=tiny_overrides(encoder))
    own = tokenizer_of_file(path)
    for prompt in PROMPTS:
        expected, tokens = diffusers_embeds(encoder, tokenizer, prompt)
        got = encode_flux2_file(model, own, [prompt]).prompt_embeds
        assert got.shape == (1, tokens, 3 * encoder.config.text_config.hidden_size) and expected.shape[1] == 512
        torch.testing.assert_close(got, expected[:, :tokens], rtol=0, atol=1e-5)


def test_prompt_text_is_kept_as_comfyui_keeps_it(reference):
    """ComfyUI tokenizes the prompt as written ("[IMG]" stays Mistral's image token); Flux2Pipeline drops
    "[IMG]" first. The file follows ComfyUI."""
    from parallel_runtime.models.families.flux2.text_file import prompt_token_ids

    _, tokenizer = reference
    image = tokenizer.convert_tokens_to_ids("[IMG]")
    plain, marked = prompt_token_ids(tokenizer, "a fox, oil"), prompt_token_ids(tokenizer, "a fox,[IMG] oil")
    assert marked.count(image) == 1 and [t for t in marked if t != image] == plain


@pytest.mark.parametrize("kind", ["scaled", "comfy_quant", "plain"])
def test_fp8_file_keeps_fp8_layers_and_computes_as_its_upcast_weights(tmp_path, reference, tekken, kind):
    """ComfyUI's fp8 files (scaled_fp8 marker, per-layer comfy_quant, plain fp8): Linear layers kept in fp8
    compute as the same file loaded upcast; not as the full-precision weights."""
    from parallel_runtime.models.fp8 import fp8_layers

    encoder, tokenizer = reference
    state = comfy_state(encoder, tekken)
    fp8_state = to_fp8({k: v for k, v in state.items() if k != "tekken_model"}, kind)
    fp8_state["tekken_model"] = state["tekken_model"]
    path = save(fp8_state, tmp_path / "mistral_3_small_flux2_fp8.safetensors")
    overrides = tiny_overrides(encoder)
    kept = load_mistral_text_file(path, "cpu", torch.float32, overrides=overrides)
    upcast = load_mistral_text_file(path, "cpu", torch.float32, storage="compute", overrides=overrides)
    assert "layers.0.self_attn.q_proj" in fp8_layers(kept) and not fp8_layers(upcast)
    own = tokenizer_of_file(path)
    got = encode_flux2_file(kept, own, PROMPTS[:1]).prompt_embeds
    torch.testing.assert_close(got, encode_flux2_file(upcast, own, PROMPTS[:1]).prompt_embeds, rtol=0, atol=1e-5)
    expected, tokens = diffusers_embeds(encoder, tokenizer, PROMPTS[0])
    assert (got - expected[:, :tokens]).abs().max() > 1e-4  # fp8 rounding shows


def test_bad_files_say_what_why_and_fix_on_the_host(tmp_path, reference, tekken):
    """Not a Mistral model, too few layers, no tokenizer in the file, a broken tokenizer tensor: ConfigErrors on
    the host (Parallel Text Encode's check) before any worker reads the file."""
    from parallel_runtime.models.families.flux2.text_file import ENCODER_FILE
    from parallel_runtime.service.host_checks import check_text_encoder_file

    encoder, _ = reference
    state = comfy_state(encoder, tekken)
    qwen_like = save({"model.norm.weight": state["model.norm.weight"]}, tmp_path / "qwen_3_4b.safetensors")
    with pytest.raises(ConfigError, match="does not hold a Mistral text model"):
        check_text_encoder_file(ENCODER_FILE, str(qwen_like), None)
    short = save(comfy_state(encoder, tekken, layers=20), tmp_path / "short.safetensors")
    with pytest.raises(ConfigError, match="has 20 layers"):
        check_text_encoder_file(ENCODER_FILE, str(short), None)
    bare = save({k: v for k, v in state.items() if k != "tekken_model"}, tmp_path / "bare.safetensors")
    with pytest.raises(ConfigError, match="bare.safetensors does not carry its tokenizer"):
        check_text_encoder_file(ENCODER_FILE, str(bare), None)
    broken = {**state, "tekken_model": torch.frombuffer(bytearray(b"{not json"), dtype=torch.uint8)}
    with pytest.raises(ConfigError, match="not a Mistral tekken vocabulary"):
        tokenizer_of_file(str(save(broken, tmp_path / "broken.safetensors")))
    check_text_encoder_file(ENCODER_FILE, str(save(state, tmp_path / "good.safetensors")), None)  # nothing to say


def test_file_encodes_on_the_workers_with_its_own_tokenizer(cpu_pool, tmp_path, reference, tekken):
    """Parallel Text Encode's job for a FLUX.2 model: the file on the text rank, its tokenizer from the file."""
    from dit_devtools.tiny import ensure_tiny_model
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    encoder, tokenizer = reference
    path = save(comfy_state(encoder, tekken, layers=30), tmp_path / "mistral_3_small_flux2_bf16.safetensors")
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-flux2")), "fp32", "sdpa").result(300)
    got = pool.submit(encode_text_file, str(path), None, PROMPTS, None, tiny_overrides(encoder)).result(300)
    for prompt, cond in zip(PROMPTS, got):
        expected, tokens = diffusers_embeds(encoder, tokenizer, prompt)
        torch.testing.assert_close(cond.prompt_embeds, expected[:, :tokens], rtol=0, atol=1e-5)
