"""FLUX.2's text encoder from ONE file, as ComfyUI keeps it in ``models/text_encoders``.

Mistral Small 3.x (Comfy-Org's ``mistral_3_small_flux2_bf16.safetensors`` / ``_fp8.safetensors``): Hugging Face's
Mistral names under ``model.`` (``model.layers.N.self_attn.q_proj.weight``, ``model.embed_tokens.weight``,
``model.norm.weight``); 40 layers, or 30 in a file pruned for FLUX.2 (nothing after layer 29 is ever read);
maybe a vision tower beside them (never read); and the tokenizer itself: Mistral's ``tekken.json`` as the bytes
of a uint8 tensor ``tekken_model``. fp8 files keep their Linear layers in fp8 (``fp8.Fp8Linear``); a llama.cpp
GGUF is read by ``text_gguf`` (its Linear weights kept in their GGML blocks, its tokenizer rebuilt from metadata).

The prompt is encoded as ComfyUI's CLIPTextEncode encodes it for FLUX.2 (what a user of this file sees):
``<s>[SYSTEM_PROMPT]{FLUX.2's system message}[/SYSTEM_PROMPT][INST]{prompt}[/INST]``, only the prompt's own tokens
(no padding to 512, no truncation), the hidden states entering layers 10, 20 and 30 (not normalised) stacked per
token. Flux2Pipeline (the diffusers folder, ``text.py``) builds the same tokens through its chat template and
reads the same hidden states, but pads every prompt to 512 tokens: its first rows equal these.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Conditioning
from ...prefixed_text_file import decoder_config, load_prefixed_model
from ...text_parts import loaded_device_of
from ...weights import parameters_on_meta
from ..spec import TextEncoderFile
from .text import FLUX2_LAYERS

MISTRAL_SMALL: Mapping[str, Any] = {  # Mistral-Small-3.1/3.2's text config: what the weights do not show
    "head_dim": 128,
    "rope_theta": 1000000000.0,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 131072,
    "hidden_act": "silu",
}
TEXT_PREFIX = "model."
TOKENIZER_TENSOR = "tekken_model"  # Mistral's tekken.json, as bytes
PROMPT_TEMPLATE = "[SYSTEM_PROMPT]{system}[/SYSTEM_PROMPT][INST]{prompt}[/INST]"
NO_TRUNCATION = 131072  # ComfyUI keeps every token of the prompt (Mistral Small's context is this long)
LAYERS_BUILT = max(FLUX2_LAYERS)  # hidden state k enters layer k: layers 0..k-1 make it


def mistral_text_config(shapes: Mapping[str, tuple[int, ...]], overrides: Mapping[str, Any] | None = None) -> dict:
    """The Mistral config of the layers FLUX.2 reads, from a ComfyUI file's header (``overrides``: e.g. a head
    width)."""
    base = {**MISTRAL_SMALL, **(overrides or {})}
    key = TEXT_PREFIX + "layers.0.self_attn.{}.weight"
    if TEXT_PREFIX + "embed_tokens.weight" not in shapes or key.format("q_proj") not in shapes:
        raise ConfigError(
            "the file does not hold a Mistral text model (no model.embed_tokens / model.layers.0.self_attn)",
            "FLUX.2's text encoder is Mistral Small 3.x, stored by ComfyUI under 'model.'",
            "pick mistral_3_small_flux2*.safetensors from models/text_encoders",
        )
    layers = len({k.split(".")[2] for k in shapes if k.startswith(TEXT_PREFIX + "layers.")})
    if layers < LAYERS_BUILT:
        raise ConfigError(
            f"the Mistral text model in the file has {layers} layers",
            f"FLUX.2 reads the hidden states entering layers {', '.join(map(str, FLUX2_LAYERS))}, which takes "
            f"{LAYERS_BUILT} layers",
            "use Comfy-Org's mistral_3_small_flux2 file (40 layers, or 30 when pruned for FLUX.2)",
        )
    return {**decoder_config(shapes, TEXT_PREFIX, int(base["head_dim"]), LAYERS_BUILT, base), "sliding_window": None}


def load_mistral_text_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    overrides: Mapping[str, Any] | None = None,
) -> nn.Module:
    """The first layers of the Mistral text model in ComfyUI's ``path`` (see the module doc), on ``device``;
    its last hidden state is not normalised (FLUX.2 reads it raw)."""
    from transformers import MistralConfig, MistralModel

    if str(path).lower().endswith(".gguf"):
        return _load_mistral_gguf(path, device, dtype, storage, overrides)

    def build(shapes: Mapping[str, tuple[int, ...]]) -> nn.Module:
        model = MistralModel(MistralConfig(**mistral_text_config(shapes, overrides)))
        model.norm = nn.Identity()
        return model

    return load_prefixed_model(path, TEXT_PREFIX, build, device, dtype, storage, only_model_parameters=True)


def _load_mistral_gguf(path, device, dtype: torch.dtype, storage: str, overrides) -> nn.Module:
    """The first layers of the Mistral text model of a llama.cpp GGUF (``text_gguf``), Linear weights kept in
    their GGML blocks."""
    from transformers import MistralConfig, MistralModel

    from ...gguf.llama_text import llama_gguf_overrides, llama_gguf_source_fields
    from ...gguf.text_model import load_llama_cpp_model
    from .text_gguf import gguf_shapes, open_mistral_gguf

    file = open_mistral_gguf(path)
    config = mistral_text_config(gguf_shapes(file, TEXT_PREFIX), llama_gguf_overrides(file, overrides))
    with parameters_on_meta():
        model = MistralModel(MistralConfig(**config))
    model.norm = nn.Identity()
    return load_llama_cpp_model(model, file, TEXT_PREFIX, device, dtype, storage, llama_gguf_source_fields)


def _no_tokenizer(name: str) -> ConfigError:
    return ConfigError(
        f"{name} does not carry its tokenizer (no {TOKENIZER_TENSOR} tensor)",
        "ComfyUI reads FLUX.2's Mistral tokenizer from the text-encoder file itself (tekken.json's bytes)",
        "use Comfy-Org's mistral_3_small_flux2 file as published",
    )


def check_mistral_file(path: str) -> None:
    """On the host, before any worker reads it: the file holds enough of a Mistral text model, and its
    tokenizer."""
    from ...tensor_files import SafetensorsFile

    if str(path).lower().endswith(".gguf"):
        from .text_gguf import gguf_shapes, open_mistral_gguf, tekken_json_of

        mistral_text_config(gguf_shapes(open_mistral_gguf(path), TEXT_PREFIX), {"head_dim": 1})
        tekken_json_of(path)
        return
    shapes = {k: e.shape for k, e in SafetensorsFile(Path(path).expanduser()).entries.items()}
    mistral_text_config(shapes, {"head_dim": 1})  # the structure only: the head width is not checked here
    if TOKENIZER_TENSOR not in shapes:
        raise _no_tokenizer(Path(path).name)


def tokenizer_of_file(path: str, tokenizer_dir: str | None = None):
    """The tokenizer the file carries: Mistral's tekken vocabulary, as transformers converts it
    (``tokenizer_dir`` is not needed)."""
    from ...tensor_files import SafetensorsFile

    if str(path).lower().endswith(".gguf"):
        from .text_gguf import tekken_json_of

        return _tekken_tokenizer(tekken_json_of(path), Path(path).name)
    file = SafetensorsFile(Path(path).expanduser())
    if TOKENIZER_TENSOR not in file.entries:
        raise _no_tokenizer(file.path.name)
    with file:
        data = file.read(TOKENIZER_TENSOR).contiguous().numpy().tobytes()
    return _tekken_tokenizer(data, file.path.name)


def _tekken_tokenizer(data: bytes, name: str):
    """transformers' tokenizer of a tekken.json's bytes."""
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        tekken = Path(folder) / "tekken.json"
        tekken.write_bytes(data)
        try:
            return convert_tekken_tokenizer(str(tekken), chat_template="")
        except (ValueError, KeyError) as exc:
            raise ConfigError(
                f"{name}: its {TOKENIZER_TENSOR} tensor is not a Mistral tekken vocabulary ({exc})",
                "ComfyUI's Mistral files carry their tokenizer as the bytes of tekken.json",
                "use Comfy-Org's mistral_3_small_flux2 file as published",
            ) from exc


def prompt_token_ids(tokenizer, prompt: str) -> list[int]:
    """The tokens ComfyUI encodes for ``prompt``: the start token, then FLUX.2's system message and the prompt
    in Mistral's instruction markers."""
    from ...compat import flux2_system_message

    text = PROMPT_TEMPLATE.format(system=flux2_system_message(), prompt=prompt)
    return [tokenizer.convert_tokens_to_ids(tokenizer.bos_token)] + tokenizer.encode(text, add_special_tokens=False)


@torch.no_grad()
def encode_flux2_file(
    encoder: nn.Module, tokenizer, prompts: Sequence[str], max_sequence_length: int = NO_TRUNCATION
) -> Conditioning:
    """FLUX.2 conditioning of ``prompts`` as ComfyUI encodes them: [B, tokens, 3 x width] (several prompts must
    have as many tokens: ComfyUI pads a batch, which changes what the model sees; encode one at a time)."""
    device = loaded_device_of(encoder)
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt_token_ids(tokenizer, prompt)[:max_sequence_length]], device=device)
        states = encoder(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
        stacked = torch.stack([states[k] for k in FLUX2_LAYERS], dim=2)  # [1, T, L, D]
        out.append(stacked.reshape(*stacked.shape[:2], -1))
    if len({o.shape[1] for o in out}) > 1:
        raise ValueError("prompts of different token counts: encode them one at a time")
    return Conditioning(torch.cat(out))


ENCODER_FILE = TextEncoderFile(
    "Mistral Small 3",
    load_mistral_text_file,
    encode_flux2_file,
    NO_TRUNCATION,
    tokenizer=tokenizer_of_file,
    check=check_mistral_file,
)
