"""What HiDream takes from a ComfyUI CONDITIONING beyond text: ``conditioning_llama3``, the Llama-3.1 hidden
states of every layer that ComfyUI's HiDream text encoder (QuadrupleCLIPLoader) puts on each entry, [B, layers,
tokens, 4096]. They become the Conditioning's ``HiDreamText``. HiDream E1's ``concat_latent_image`` (editing)
is refused. Light to import: torch is imported on call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....errors import ConfigError
from ..spec import ComfyConditioning

KEYS = ("conditioning_llama3", "concat_latent_image")


def text_inputs(options: Mapping[str, Any], expected: Mapping[str, int | None], role: str):
    """The ``HiDreamText`` of one entry's ``options`` (None when they hold no Llama states)."""
    import torch

    from .conditioning import HiDreamText

    if options.get("concat_latent_image") is not None:
        raise ConfigError(
            f"the {role} conditioning carries an image latent (concat_latent_image)",
            "the parallel sampler runs HiDream-I1 text-to-image; HiDream E1's image editing is not supported",
            "use a HiDream-I1 (Full, Dev or Fast) model without an image input",
        )
    value = options.get("conditioning_llama3")
    if value is None:
        return None
    if not isinstance(value, torch.Tensor) or value.ndim != 4:
        raise ConfigError(
            f"the {role} conditioning's conditioning_llama3 has shape {tuple(getattr(value, 'shape', ()))}",
            "HiDream takes Llama-3.1's hidden states of every layer: [batch, layers, tokens, width]",
            "encode the prompt with ComfyUI's QuadrupleCLIPLoader and CLIPTextEncode",
        )
    return HiDreamText(llama3=value.float().cpu())


COMFY_CONDITIONING = ComfyConditioning(KEYS, text_inputs)
