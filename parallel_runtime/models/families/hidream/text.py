"""HiDream prompts: not encoded on the workers. HiDream reads four text encoders (CLIP-L, CLIP-G, T5-XXL and
Llama-3.1-8B-Instruct's hidden states of every layer, ~25 GB together); ComfyUI's QuadrupleCLIPLoader with
CLIPTextEncode encodes them and the Parallel Sampler takes that CONDITIONING. Encoding here is refused with
that way out (on the host, before any job: ``on_workers=False``; a folder's encoders are not loaded)."""

from __future__ import annotations

import torch

from ....errors import ConfigError
from ...base import Conditioning
from ...text_parts import TextComponents
from ..spec import TextEncoding


def encode(comps: TextComponents, prompts: list[str], max_length: int, device: torch.device) -> Conditioning:
    raise ConfigError(
        "HiDream prompts cannot be encoded by the parallel text encoder",
        "HiDream's four text encoders (CLIP-L, CLIP-G, T5-XXL and Llama-3.1 8B, every layer's states) are not "
        "run on the workers",
        "encode the prompt in ComfyUI (QuadrupleCLIPLoader: clip_l, clip_g, t5xxl, llama_3.1_8b; CLIPTextEncode) "
        "and give that CONDITIONING to the Parallel Sampler",
    )


ENCODING = TextEncoding(encode, on_workers=False)
