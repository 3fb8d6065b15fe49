"""Mistoline Flux ControlNets (TheMistoAI's MistoLine_Flux.dev files; ComfyUI 0.3.64 reads them with
``load_controlnet_flux_xlabs_mistoline(mistoline=True)``): an XLabs-like file, Black Forest Labs' block names,
told apart by its control blocks (``controlnet_blocks.N.linear``).

What ComfyUI computes for such a file, where it differs from an XLabs file (numbers matched,
tests/test_controlnet_flux_mistoline.py):
- the hint is the IMAGE cropped and scaled to 8x the latent's size, mapped to [-1, 1] and brought down 8x by ten
  convolutions (``input_cond_block.encoder``, SiLU between them): 3x3, 1x1, 3x3, then three pairs of a stride-2
  3x3 and a 3x3, except that the last pair's second is 1x1, and a final 3x3 (each padded by half its kernel);
- each control block is a linear map followed by SiLU; a file may carry single blocks too
  (``single_controlnet_blocks.N.linear``, after the single blocks' image tokens);
- the residuals repeat cyclically: main double block j < 19 takes ControlNet block j mod n, main single block
  j < 38 takes single ControlNet block j mod m.

Otherwise it runs as :class:`XLabsFluxControlNet` (renamed to diffusers' FluxControlNetModel names, split over
"sp" the same way, its hint convolutions on the whole hint on every rank).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from ...base import ModelAdapter
from ...controlnet_kind import FLUX_MISTOLINE, ControlNetFile
from .controlnet import build_model
from .controlnet_xlabs import XLabsFluxControlNet, config_from_shapes, count_blocks, cyclic_spread, pixel_hint_file
from .keys import skeleton, to_diffusers

MARKER = "controlnet_blocks.0.linear.weight"  # ComfyUI's test for a Mistoline file
HINT_STRIDES = (1, 1, 1, 2, 1, 2, 1, 2, 1, 1)  # the hint encoder's convolutions, first to last
_HINT_CONV = re.compile(r"input_cond_block\.encoder\.(\d+)\.(weight|bias)")
_BLOCKS = (  # (the file's control blocks, diffusers' FluxControlNetModel list)
    (re.compile(r"controlnet_blocks\.(\d+)\.linear\.(weight|bias)"), "controlnet_blocks"),
    (re.compile(r"single_controlnet_blocks\.(\d+)\.linear\.(weight|bias)"), "controlnet_single_blocks"),
)


def split_state(
    state: dict[str, torch.Tensor], config: dict
) -> tuple[dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """(the file in diffusers' FluxControlNetModel names, the hint encoder's (weight, bias) in order)."""
    state = dict(state)
    convs = sorted({int(m.group(1)) for k in state if (m := _HINT_CONV.fullmatch(k))})
    hint = [
        (state.pop(f"input_cond_block.encoder.{i}.weight"), state.pop(f"input_cond_block.encoder.{i}.bias"))
        for i in convs
    ]
    control = {}
    for pattern, target in _BLOCKS:
        for key in [k for k in state if pattern.fullmatch(k)]:
            index, kind = pattern.fullmatch(key).groups()  # type: ignore[union-attr]
            control[f"{target}.{index}.{kind}"] = state.pop(key)
    embed_in = {f"controlnet_x_embedder.{kind}": state.pop(f"pos_embed_input.{kind}") for kind in ("weight", "bias")}
    dtype = state["img_in.weight"].dtype
    singles = config["num_single_layers"]
    # diffusers' converter wants a final layer and at least one single block: zero stand-ins, dropped again
    for key, shape in skeleton({**config, "num_single_layers": max(singles, 1)}).items():
        if key.startswith("final_layer.") or (not singles and key.startswith("single_blocks.0.")):
            state[key] = torch.zeros(shape, dtype=dtype)
    converted = to_diffusers(state, {**config, "num_single_layers": max(singles, 1)})
    dropped = ("proj_out.", "norm_out.") + (() if singles else ("single_transformer_blocks.",))
    out = {k: v for k, v in converted.items() if not k.startswith(dropped)}
    return {**out, **control, **embed_in}, hint


class MistolineFluxControlNet(XLabsFluxControlNet):
    """A loaded Mistoline Flux ControlNet beside a Flux main model (``ControlRunner``)."""

    @classmethod
    def load(cls, path: str | Path, main: ModelAdapter) -> MistolineFluxControlNet:
        from safetensors.torch import load_file

        state = load_file(str(path))
        shapes = {k: v.shape for k, v in state.items()}
        config = config_from_shapes(shapes, main.transformer.config.axes_dims_rope)
        config["num_single_layers"] = count_blocks(list(shapes), "single_blocks")
        diffusers_state, hint_convs = split_state(state, config)
        model = build_model(diffusers_state, config, Path(path).name, main)
        for name in ("controlnet_blocks", "controlnet_single_blocks"):  # each control block: linear, then SiLU
            setattr(
                model, name, torch.nn.ModuleList(torch.nn.Sequential(b, torch.nn.SiLU()) for b in getattr(model, name))
            )
        return cls(model, main, hint_convs)

    def layout_tag(self, control_type: Sequence[int]) -> tuple:
        return ("flux-controlnet-mistoline",)

    def hint_latent(self, hint: torch.Tensor) -> torch.Tensor:
        """The pixel hint [n, 3, 8h, 8w] in 0..1 -> the 16-channel map [n, 16, h, w] the ControlNet embeds."""
        x = hint * 2.0 - 1.0
        last = len(self.hint_convs) - 1
        for i, ((weight, bias), stride) in enumerate(zip(self.hint_convs, HINT_STRIDES)):
            x = F.conv2d(x, weight, bias, stride=stride, padding=weight.shape[-1] // 2)
            x = F.silu(x) if i < last else x
        return x

    @staticmethod
    def spread(doubles: list[torch.Tensor], singles: list[torch.Tensor], main_blocks: Sequence[str]) -> list:
        """Main double block j < 19 takes ControlNet block j mod n, single block j < 38 single block j mod m."""
        return cyclic_spread(doubles, singles, main_blocks)


def describe_mistoline(path: Path, shapes: dict[str, list[int]]) -> ControlNetFile:
    """A Mistoline Flux file's facts from its tensor shapes (the hint encoder's convolutions checked)."""
    refusal = (
        f"ControlNet file {path.name} has Mistoline's control blocks without its 10-convolution hint encoder",
        "a Mistoline Flux ControlNet reads the control image through ten convolutions (input_cond_block)",
        "use a MistoLine Flux ControlNet release, or an XLabs / InstantX Flux file",
    )
    first = "input_cond_block.encoder.0.weight"
    return pixel_hint_file(path, shapes, FLUX_MISTOLINE, _HINT_CONV, HINT_STRIDES, first, refusal)
