"""LTX-2's text encoding from single files, as users download them: Gemma-3 12B as ONE safetensors file
(``models/text_encoders/gemma_3_12B_it.safetensors``) and the text connectors from the LTX-2 release checkpoint
(the transformer's single file). Prompts are then encoded exactly as from the diffusers folder (``text.py``).

Gemma's names: the release files keep the older transformers Gemma3ForConditionalGeneration names
(``language_model.model.*``; today's ``model.language_model.*`` is accepted too); only the text model is built
(transformers' ``Gemma3TextModel``: the same hidden states as the whole model for text-only prompts), its sizes from
the header, the rest from google/gemma-3-12b-it's config; the vision tower, projector and ``lm_head`` are never read.
The mapping follows DiffSynth-Studio's LTX-2 text-encoder state-dict converter.

The connectors' names in the release checkpoint: ``text_embedding_projection.aggregate_embed.*`` is diffusers'
``text_proj_in`` (the [width, width x (layers + 1)] Gemma feature projection) and
``model.diffusion_model.video_embeddings_connector.*`` its ``video_connector`` with ``transformer_1d_blocks`` ->
``transformer_blocks`` and ``q_norm``/``k_norm`` -> ``norm_q``/``norm_k`` (``learnable_registers``, ``to_*``,
``to_out.0``, ``ff.net.*`` unchanged), as diffusers' scripts/convert_ltx2_to_diffusers.py renames them (its
LTX_2_0_CONNECTORS_KEYS_RENAME_DICT; it also takes the projection under ``model.diffusion_model.`` and strips a
``connectors.`` prefix: both are read here, see ``CONNECTOR_PREFIXES``). The audio connector is never read."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ...compat import ltx2_text_connectors_class
from ...tensor_files import SafetensorsFile
from ...weights import parameters_on_meta

GEMMA_PREFIXES = ("language_model.model.", "model.language_model.")  # the release's, today's transformers'
# where the connectors' tensors sit: the release checkpoint keeps the projection at the top (some checkpoints under
# the transformer's prefix, as diffusers' converter allows) and the connectors under the transformer's; a separate
# connectors file may hold them bare or under ``connectors.`` (diffusers' converter strips that too)
CONNECTOR_PREFIXES = ("model.diffusion_model.", "", "connectors.", "model.diffusion_model.connectors.")
PROJECTION = "text_embedding_projection.aggregate_embed."
VIDEO_CONNECTOR = "video_embeddings_connector."
CONNECTOR_RENAMES = (
    ("transformer_1d_blocks.", "transformer_blocks."),
    (".q_norm.", ".norm_q."),
    (".k_norm.", ".norm_k."),
)
GEMMA3_12B: Mapping[str, Any] = {  # google/gemma-3-12b-it's text config: what the weights do not show
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 1024,
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 131072,
    "hidden_activation": "gelu_pytorch_tanh",
    "pad_token_id": 0,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    },
}
CONNECTORS_RELEASE: Mapping[str, Any] = {  # LTX-2 19B's connectors: what the weights do not show
    "video_connector_attention_head_dim": 128,
    "connector_rope_base_seq_len": 4096,
    "rope_theta": 10000.0,
    "rope_type": "split",
}


def _shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    return {k: tuple(e.shape) for k, e in SafetensorsFile(Path(path).expanduser()).entries.items()}


def gemma_prefix(shapes: Mapping[str, tuple[int, ...]], path: str | os.PathLike) -> str:
    """The prefix of the Gemma-3 text model's tensors in a file (a ConfigError for another file)."""
    for prefix in GEMMA_PREFIXES:
        if prefix + "embed_tokens.weight" in shapes:
            return prefix
    raise ConfigError(
        f"{Path(path).name} does not hold a Gemma-3 text model (no language_model.model.embed_tokens.weight)",
        "LTX-2 encodes prompts with Gemma-3 12B",
        "pick gemma_3_12B_it.safetensors from models/text_encoders",
    )


def gemma3_config(shapes: Mapping[str, tuple[int, ...]], prefix: str, overrides: Mapping[str, Any] | None = None):
    """Gemma-3's text config: the sizes from the file's shapes, the rest from 12B's (``overrides`` on top)."""
    from transformers import Gemma3TextConfig

    base = {**GEMMA3_12B, **(overrides or {})}
    vocab, width = shapes[prefix + "embed_tokens.weight"]
    layer = prefix + "layers.0."
    head = int(base["head_dim"])
    sizes = {
        "vocab_size": vocab,
        "hidden_size": width,
        "num_hidden_layers": len({k[len(prefix) :].split(".")[1] for k in shapes if k.startswith(prefix + "layers.")}),
        "num_attention_heads": shapes[layer + "self_attn.q_proj.weight"][0] // head,
        "num_key_value_heads": shapes[layer + "self_attn.k_proj.weight"][0] // head,
        "intermediate_size": shapes[layer + "mlp.gate_proj.weight"][0],
    }
    return Gemma3TextConfig(**{**base, **sizes})


def _load(build, tensors: dict[str, str], file: SafetensorsFile, device, dtype: torch.dtype) -> nn.Module:
    """``build()`` on the meta device filled with ``tensors`` (parameter name -> file name)."""
    with parameters_on_meta():
        model = build()
    wanted = {n for n, _ in model.named_parameters()}
    missing = sorted(wanted - tensors.keys())
    if missing:
        raise ConfigError(
            f"{file.path.name} lacks {len(missing)} tensors of the model (e.g. {missing[0]})",
            "the file is not the kind this loader reads, or is cut short",
            "pick the release file named in the README's LTX-2 section",
        )
    with file:
        state = {n: file.read(tensors[n]).to(dtype) for n in wanted}
    model.load_state_dict(state, strict=False, assign=True)
    return model.to(device).eval()


def load_gemma3_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    overrides: Mapping[str, Any] | None = None,
    storage: str = "auto",
) -> nn.Module:
    """Gemma-3's text model from ONE file (see the module doc), on ``device``; ComfyUI's fp8 files (scaled_fp8,
    comfy_quant) keep their Linear layers in fp8 with their scales, as every text-encoder file does
    (``models.prefixed_text_file``; ``storage="compute"``: upcast)."""
    from transformers import Gemma3TextModel

    from ...prefixed_text_file import load_prefixed_model

    shapes = _shapes(path)
    prefix = gemma_prefix(shapes, path)
    config = gemma3_config(shapes, prefix, overrides)
    build = lambda _shapes: Gemma3TextModel(config)  # noqa: E731
    return load_prefixed_model(
        path, prefix, build, device, dtype, storage, what="of Gemma-3", only_model_parameters=True
    )


class _Unread(nn.Module):
    """The audio connector's place: never read nor run for its output (video-only); hands its input back."""

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return states, mask


def connector_prefixes(shapes: Mapping[str, tuple[int, ...]]) -> tuple[str, str] | None:
    """The (projection, video connector) prefixes of the connectors' tensors in a file's shapes; None: it holds none."""
    projection = next((p + PROJECTION for p in CONNECTOR_PREFIXES if p + PROJECTION + "weight" in shapes), None)
    video = next(
        (p + VIDEO_CONNECTOR for p in CONNECTOR_PREFIXES if p + VIDEO_CONNECTOR + "learnable_registers" in shapes), None
    )
    return None if projection is None or video is None else (projection, video)


def _connector_name(name: str) -> str:
    for old, new in CONNECTOR_RENAMES:
        name = name.replace(old, new)
    return name


def load_ltx2_connectors_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    overrides: Mapping[str, Any] | None = None,
) -> nn.Module:
    """diffusers' ``LTX2TextConnectors`` (its video half) from the LTX-2 release checkpoint (see the module doc)."""
    LTX2TextConnectors = ltx2_text_connectors_class()

    shapes = _shapes(path)
    found = connector_prefixes(shapes)
    if found is None:
        raise ConfigError(
            f"{Path(path).name} holds no LTX-2 text connectors ({PROJECTION}weight, {VIDEO_CONNECTOR}*)",
            "LTX-2's text connectors come with its release checkpoint",
            "pick the LTX-2 checkpoint (e.g. ltx-2-19b-dev.safetensors) from models/checkpoints",
        )
    projection, video = found
    base = {**CONNECTORS_RELEASE, **(overrides or {})}
    width, packed = shapes[projection + "weight"]
    inner = shapes[video + "learnable_registers"][1]
    block = video + "transformer_1d_blocks."
    blocks = {k[len(block) :].split(".")[0] for k in shapes if k.startswith(block)}
    config = {
        **base,
        "caption_channels": width,
        "text_proj_in_factor": packed // width,
        "video_connector_num_attention_heads": inner // int(base["video_connector_attention_head_dim"]),
        "video_connector_num_layers": len(blocks),
        "video_connector_num_learnable_registers": shapes[video + "learnable_registers"][0],
        "video_gated_attn": any(k.startswith(video) and "to_gate_logits" in k for k in shapes),
        "audio_connector_num_layers": 0,
        "audio_connector_num_learnable_registers": None,
    }
    tensors = {"text_proj_in." + k[len(projection) :]: k for k in shapes if k.startswith(projection)}
    tensors |= {"video_connector." + _connector_name(k[len(video) :]): k for k in shapes if k.startswith(video)}

    def build() -> nn.Module:
        connectors = LTX2TextConnectors(**config)
        connectors.audio_connector = _Unread()
        return connectors

    return _load(build, tensors, SafetensorsFile(Path(path).expanduser()), device, dtype)


def gemma3_tokenizer(path: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None):
    """Gemma's tokenizer for the file ``path``: the SentencePiece model ComfyUI's Gemma-3 files carry
    (``spiece_model``, read as ComfyUI reads it: ``gemma_tokenizer``), else ``tokenizer_dir`` (a tokenizer folder,
    e.g. the diffusers folder's ``tokenizer``), else the file's own folder when it holds tokenizer.json /
    tokenizer.model, else a ``tokenizer`` folder beside the file."""
    from transformers import AutoTokenizer

    from .gemma_tokenizer import file_tokenizer

    carried = file_tokenizer(path)
    if carried is not None:
        return carried
    here = Path(path).expanduser().resolve().parent
    tokens = ("tokenizer.json", "tokenizer.model")
    places = [Path(tokenizer_dir).expanduser()] if tokenizer_dir else []
    places += [here, here / "tokenizer"]
    for place in places:
        if any((place / t).is_file() for t in tokens):
            return AutoTokenizer.from_pretrained(str(place))
    raise ConfigError(
        f"no Gemma tokenizer for {Path(path).name} (looked in {', '.join(str(p) for p in places)})",
        "this Gemma-3 file carries no tokenizer (ComfyUI's gemma_3_12B_it files carry it as 'spiece_model')",
        "use ComfyUI's gemma_3_12B_it*.safetensors, or put Gemma-3's tokenizer.json (or tokenizer.model) beside the "
        "file, or give the tokenizer folder",
    )
