"""XLabs Flux ControlNets (x-flux's files; ComfyUI 0.3.64 reads them with ``load_controlnet_flux_xlabs_mistoline``):
Black Forest Labs' block names, double blocks only, and a hint that is the control image itself.

What ComfyUI computes for such a file (numbers matched, tests/test_controlnet_flux_xlabs.py):
- the hint is the IMAGE cropped and scaled to 8x the latent's size (no VAE: the apply node's VAE is left
  unused), mapped to [-1, 1] and brought down 8x by eight 3x3 convolutions (SiLU between them; strides
  1, 1, 2, 1, 2, 1, 2, 1) to a 16-channel map of the latent's size; that map is packed in 2x2 patches like the
  latent and embedded by ``pos_embed_input``, then added to the image tokens;
- no union type; after double block i the image tokens pass ``controlnet_blocks[i]``;
- those residuals repeat cyclically over FLUX.1's 19 double blocks (main double block j takes ControlNet block
  j mod n); the single blocks get nothing.

The file is renamed to diffusers' FluxControlNetModel names (its double blocks by the Flux family's own
converter, ``pos_embed_input`` as ``controlnet_x_embedder``) and runs through :class:`FluxControlNet`'s code,
split over "sp" the same way. The hint's convolutions run on the whole hint on every rank (no communication);
its tokens are split afterwards like the image's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ....errors import ConfigError
from ...base import ModelAdapter
from ...controlnet_kind import FLUX_XLABS, ControlNetFile
from . import ID
from .controlnet import DOUBLE_LIST, FULL_DOUBLE, FULL_SINGLE, FluxControlNet, build_model
from .keys import skeleton, to_diffusers

HINT_STRIDES = (1, 1, 2, 1, 2, 1, 2, 1)  # the pixel hint's convolutions, first to last
HINT_SCALE = 8  # the pixel hint's size over the latent's
_HINT_CONV = re.compile(r"input_hint_block\.(\d+)\.(weight|bias)")
_CONTROL_BLOCK = re.compile(r"controlnet_blocks\.(\d+)\.(weight|bias)")


def count_blocks(keys: Sequence[str], prefix: str) -> int:
    """How many ``prefix.N.`` blocks ``keys`` hold."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    return len({m.group(1) for k in keys if (m := pattern.match(k))})


def config_from_shapes(shapes: dict[str, Sequence[int]], axes_dims_rope: Sequence[int]) -> dict[str, Any]:
    """The diffusers FluxControlNetModel config of an XLabs file, read from its tensor shapes."""
    hidden, in_channels = shapes["img_in.weight"]
    head_dim = shapes["double_blocks.0.img_attn.norm.query_norm.scale"][0]
    return {
        "patch_size": 1,
        "in_channels": int(in_channels),
        "num_layers": count_blocks(list(shapes), "double_blocks"),
        "num_single_layers": 0,
        "attention_head_dim": int(head_dim),
        "num_attention_heads": int(hidden) // int(head_dim),
        "joint_attention_dim": int(shapes["txt_in.weight"][1]),
        "pooled_projection_dim": int(shapes["vector_in.in_layer.weight"][1]),
        "guidance_embeds": "guidance_in.in_layer.weight" in shapes,
        "axes_dims_rope": [int(a) for a in axes_dims_rope],
        "num_mode": None,
    }


def split_state(
    state: dict[str, torch.Tensor], config: dict[str, Any]
) -> tuple[dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """(the file in diffusers' FluxControlNetModel names, the hint convolutions' (weight, bias) in order)."""
    state = dict(state)
    convs = sorted({int(m.group(1)) for k in state if (m := _HINT_CONV.fullmatch(k))})
    hint = [(state.pop(f"input_hint_block.{i}.weight"), state.pop(f"input_hint_block.{i}.bias")) for i in convs]
    control = {k: state.pop(k) for k in [k for k in state if _CONTROL_BLOCK.fullmatch(k)]}
    embed_in = {f"controlnet_x_embedder.{kind}": state.pop(f"pos_embed_input.{kind}") for kind in ("weight", "bias")}
    dtype = state["img_in.weight"].dtype
    # diffusers' converter wants a final layer and at least one single block: zero stand-ins, dropped again
    stand_ins = skeleton({**config, "num_single_layers": 1})
    for key, shape in stand_ins.items():
        if key.startswith(("final_layer.", "single_blocks.0.")):
            state[key] = torch.zeros(shape, dtype=dtype)
    converted = to_diffusers(state, config)
    dropped = ("proj_out.", "norm_out.", "single_transformer_blocks.")
    out = {k: v for k, v in converted.items() if not k.startswith(dropped)}
    return {**out, **control, **embed_in}, hint


class XLabsFluxControlNet(FluxControlNet):
    """A loaded XLabs Flux ControlNet beside a Flux main model (``ControlRunner``)."""

    HINT_SCALE = HINT_SCALE

    def __init__(self, model: torch.nn.Module, main: ModelAdapter, hint_convs: list[tuple[torch.Tensor, ...]]):
        super().__init__(model, main)
        self.hint_convs = [(w.to(main.device, main.dtype), b.to(main.device, main.dtype)) for w, b in hint_convs]

    @classmethod
    def load(cls, path: str | Path, main: ModelAdapter) -> XLabsFluxControlNet:
        from safetensors.torch import load_file

        state = load_file(str(path))
        config = config_from_shapes({k: v.shape for k, v in state.items()}, main.transformer.config.axes_dims_rope)
        diffusers_state, hint_convs = split_state(state, config)
        return cls(build_model(diffusers_state, config, Path(path).name, main), main, hint_convs)

    def layout_tag(self, control_type: Sequence[int]) -> tuple:
        return ("flux-controlnet-xlabs",)

    def hint_latent(self, hint: torch.Tensor) -> torch.Tensor:
        """The pixel hint [n, 3, 8h, 8w] in 0..1 -> the 16-channel map [n, 16, h, w] the ControlNet embeds."""
        x = hint * 2.0 - 1.0
        last = len(self.hint_convs) - 1
        for i, ((weight, bias), stride) in enumerate(zip(self.hint_convs, HINT_STRIDES)):
            x = F.conv2d(x, weight, bias, stride=stride, padding=1)
            x = F.silu(x) if i < last else x
        return x

    @staticmethod
    def spread(doubles: list[torch.Tensor], singles: list[torch.Tensor], main_blocks: Sequence[str]) -> list:
        """Main double block j < 19 takes ControlNet block j mod n; the single blocks take nothing."""
        return cyclic_spread(doubles, [], main_blocks)


def describe_xlabs(path: Path, shapes: dict[str, list[int]]) -> ControlNetFile:
    """An XLabs Flux file's facts from its tensor shapes (the pixel hint's convolutions checked)."""
    refusal = (
        f"ControlNet file {path.name} has an XLabs Flux layout without its 8-convolution pixel hint block",
        "an XLabs Flux ControlNet reads the control image through eight 3x3 convolutions (input_hint_block)",
        "use an XLabs Flux ControlNet release (canny, depth, hed), or a Flux InstantX / Union file",
    )
    return pixel_hint_file(path, shapes, FLUX_XLABS, _HINT_CONV, HINT_STRIDES, "input_hint_block.0.weight", refusal)


def cyclic_spread(doubles: list[torch.Tensor], singles: list[torch.Tensor], main_blocks: Sequence[str]) -> list:
    """Main double block j < 19 takes ControlNet block j mod n, main single block j < 38 single block j mod m
    (none where the file has no blocks of that kind)."""
    out: list[torch.Tensor | None] = []
    d = s = 0
    for name in main_blocks:
        if name == DOUBLE_LIST:
            out.append(doubles[d % len(doubles)] if doubles and d < FULL_DOUBLE else None)
            d += 1
        else:
            out.append(singles[s % len(singles)] if singles and s < FULL_SINGLE else None)
            s += 1
    return out


def pixel_hint_file(
    path: Path,
    shapes: dict[str, list[int]],
    kind: str,
    hint_conv: re.Pattern,
    strides: Sequence[int],
    first_conv: str,
    refusal: tuple[str, str, str],
) -> ControlNetFile:
    """The facts of a Flux file that reads the IMAGE through its own convolutions (XLabs, Mistoline): its hint
    convolutions (``hint_conv``, one per stride, the first reading 3 channels) checked, a ConfigError of
    ``refusal`` (what, why, fix) otherwise."""
    convs = {int(m.group(1)) for k in shapes if (m := hint_conv.fullmatch(k))}
    first = shapes.get(first_conv)
    if len(convs) != len(strides) or first is None or first[1] != 3 or "pos_embed_input.weight" not in shapes:
        raise ConfigError(*refusal)
    return ControlNetFile(
        path=str(path),
        kind=kind,
        family=ID,
        union_modes=0,
        hint_channels=3,
        double_blocks=count_blocks(list(shapes), "double_blocks"),
        single_blocks=count_blocks(list(shapes), "single_blocks"),
        hint_format=None,  # the IMAGE itself, scaled to 8x the latent
    )
