"""Flux ControlNets in the InstantX / Union layout (diffusers' FluxControlNetModel file), run split like the
main model.

What ComfyUI 0.3.64 computes for such a file (numbers matched, see tests/test_controlnet_flux.py):
- the noisy latent and the hint latent are each padded to whole 2x2 patches (circularly) and packed like the
  main model's input; the image tokens are ``x_embedder(x) + controlnet_x_embedder(hint)``;
- time, guidance and pooled text embed as in the main model; a union file's mode (SetUnionControlNetType)
  is one more text token in front of the text (``controlnet_mode_embedder``, position id 0); no mode, no token;
- after each double block the image tokens pass ``controlnet_blocks[i]``, after each single block
  ``controlnet_single_blocks[i]``; ComfyUI spreads them over the 19 double / 38 single blocks of a full-size
  FLUX.1 (each ControlNet block serves ``ceil(19 / its double blocks)`` consecutive main blocks, likewise for
  single blocks), whatever the main model's depth, and a main block past those counts gets nothing.

On a mesh the ControlNet's token sequences are split over "sp" exactly as the main model's (its image tokens
with the same split sizes), its joint attention goes through the same sequence-parallel attention, and each
rank returns the residuals of the image tokens it holds: nothing is gathered.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ....errors import ConfigError
from ...base import Activations, AttentionScope, Conditioning, LatentFormat, ModelAdapter, ModelPlan, shard_activations
from ...controlnet_kind import FLUX_INSTANTX, ControlNetFile
from . import ID
from .adapter import FluxAdapter, image_ids
from .latent import latent_format as flux_latent_format

FULL_DOUBLE, FULL_SINGLE = 19, 38  # FLUX.1's blocks, over which ComfyUI spreads a ControlNet's residuals
DOUBLE_LIST, SINGLE_LIST = "transformer_blocks", "single_transformer_blocks"


class _ControlBlocks(FluxAdapter):
    """The ControlNet's Flux blocks driven like the main model's (plan, patchify, joint attention per block)."""

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        fields = {k: config[k] for k in ("patch_size", "in_channels", "guidance_embeds")}
        return super().make_plan(SimpleNamespace(out_channels=None, **fields), latent_format)


def config_from_state(state: dict[str, Any], axes_dims_rope: Sequence[int]) -> dict[str, Any]:
    """FluxControlNetModel's config read from a state dict's shapes (``state`` values need ``.shape`` only)."""

    def count(prefix: str) -> int:
        pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
        return len({m.group(1) for k in state if (m := pattern.match(k))})

    inner, in_channels = state["x_embedder.weight"].shape
    head_dim = state["transformer_blocks.0.attn.norm_q.weight"].shape[0]
    mode = state.get("controlnet_mode_embedder.weight")
    return {
        "patch_size": 1,
        "in_channels": int(in_channels),
        "num_layers": count(DOUBLE_LIST),
        "num_single_layers": count(SINGLE_LIST),
        "attention_head_dim": int(head_dim),
        "num_attention_heads": int(inner) // int(head_dim),
        "joint_attention_dim": int(state["context_embedder.weight"].shape[1]),
        "pooled_projection_dim": int(state["time_text_embed.text_embedder.linear_1.weight"].shape[1]),
        "guidance_embeds": "time_text_embed.guidance_embedder.linear_1.weight" in state,
        "axes_dims_rope": [int(a) for a in axes_dims_rope],
        "num_mode": None if mode is None else int(mode.shape[0]),
    }


class FluxControlNet:
    """A loaded InstantX / Union Flux ControlNet beside a Flux main model (``ControlRunner``)."""

    HINT_SCALE = 1  # the hint's size over the latent's (1: a VAE latent)

    def __init__(self, model: torch.nn.Module, main: ModelAdapter):
        self.model = model
        self.blocks = _ControlBlocks(model, main.plan.latent_format)
        self.main = main
        self.union = getattr(model, "controlnet_mode_embedder", None) is not None

    @classmethod
    def load(cls, path: str | Path, main: ModelAdapter) -> FluxControlNet:
        from safetensors.torch import load_file

        state = load_file(str(path))
        config = config_from_state(state, main.transformer.config.axes_dims_rope)
        return cls(build_model(state, config, Path(path).name, main), main)

    def layout_tag(self, control_type: Sequence[int]) -> tuple:
        return ("flux-controlnet", len(control_type) if self.union else 0)

    def _embed(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        cond: Conditioning,
        guidance: torch.Tensor | None,
        hint: torch.Tensor,
        control_type: Sequence[int],
        first_row: int = 0,
    ) -> Activations:
        """``x`` is the padded model input, or a band of it starting at token row ``first_row`` (PipeFusion);
        ``hint`` the whole (padded) hint: only the band's hint tokens are embedded (each token from its own
        patch and position)."""
        m, blocks = self.model, self.blocks
        rows, cols = blocks.grid_of(x)
        t0 = first_row * cols
        hint_tokens = blocks.patchify(self.hint_latent(hint))[:, t0 : t0 + rows * cols]
        img = m.x_embedder(blocks.patchify(x)) + m.controlnet_x_embedder(hint_tokens)
        ids = image_ids(rows, cols, x.device)
        ids[:, 1] += first_row
        ts = timestep.to(img.dtype) * 1000
        if blocks.plan.guidance_embed:  # ComfyUI's Flux default 3.5 when the main model takes no guidance
            g = torch.full_like(ts, 3500.0) if guidance is None else guidance.to(img.dtype) * 1000
            temb = m.time_text_embed(ts, g, cond.pooled)
        else:
            temb = m.time_text_embed(ts, cond.pooled)
        txt = m.context_embedder(cond.prompt_embeds)
        if self.union and len(control_type):
            modes = torch.tensor(list(control_type), device=txt.device)
            mode = m.controlnet_mode_embedder(modes).to(txt.dtype)
            txt = torch.cat([mode.unsqueeze(0).expand(txt.shape[0], -1, -1), txt], dim=1)
        return Activations(
            img=img,
            txt=txt,
            temb=temb,
            temb_out=temb,
            grid=(rows, cols),
            txt_tokens=txt.shape[1],
            img_rope=m.pos_embed(ids),
            txt_rope=m.pos_embed(torch.zeros(txt.shape[1], 3, device=x.device)),
        )

    def residuals(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        cond: Conditioning,
        guidance: torch.Tensor | None,
        hint: torch.Tensor,
        control_type: Sequence[int],
        mesh: Any,
        attention: AttentionScope,
        main_blocks: Sequence[str],
    ) -> list[torch.Tensor | None]:
        """Residuals of this rank's image tokens after each of ``main_blocks`` (the main model's block lists,
        in execution order); ``x`` is the model input (ComfyUI's ``calculate_input``), ``timestep`` the sigma."""
        x, hint = self._inputs(x, hint)
        acts = self._embed(x, *self._on_device(timestep, cond, guidance), hint, control_type)
        acts = shard_activations(acts, self.blocks.plan.splits, mesh)
        return self._run(acts, lambda a, i: self.blocks.run_block(a, i, attention), main_blocks)

    def band_residuals(
        self,
        x_band: torch.Tensor,
        rows: tuple[int, int],
        full_size: tuple[int, ...],
        timestep: torch.Tensor,
        cond: Conditioning,
        guidance: torch.Tensor | None,
        hint: torch.Tensor,
        control_type: Sequence[int],
        mesh: Any,
        run_block: Callable[[ModelAdapter, Activations, int], Activations],
        main_blocks: Sequence[str],
    ) -> list[torch.Tensor | None]:
        """PipeFusion (``pipefusion.control_chain``): the residuals of this rank's share of a row band's image
        tokens after each of ``main_blocks``. ``x_band`` holds the model input's latent ``rows`` (multiples of the
        patch size) of a latent of ``full_size``, ``hint`` the whole hint; ``run_block(blocks, acts, i)`` runs the
        ControlNet's block ``i`` with its own attention over the band (stale K/V of the other bands)."""
        p = self.blocks.plan.patch_size
        x, hint = self._inputs(x_band, hint, rows=rows)
        acts = self._embed(x, *self._on_device(timestep, cond, guidance), hint, control_type, rows[0] // p)
        acts = shard_activations(acts, self.blocks.plan.splits, mesh)
        return self._run(acts, lambda a, i: run_block(self.blocks, a, i), main_blocks)

    def residual_blocks(self, main_blocks: Sequence[str]) -> list[bool]:
        """Which of ``main_blocks`` get a residual (whatever the inputs)."""
        doubles, singles = len(self.model.controlnet_blocks), len(self.model.controlnet_single_blocks)
        return [r is not None for r in self.spread([True] * doubles, [True] * singles, main_blocks)]

    def _inputs(
        self, x: torch.Tensor, hint: torch.Tensor, rows: tuple[int, int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model input (or its latent rows ``rows``) and the whole hint, checked and padded to whole patches."""
        blocks = self.blocks
        dtype, device = blocks.dtype, blocks.device
        hint = hint.to(device, dtype)
        scale = self.HINT_SCALE
        height = x.shape[-2] if rows is None else hint.shape[-2] // scale
        if tuple(hint.shape[-2:]) != (height * scale, x.shape[-1] * scale) or (rows and rows[1] > height):
            raise ConfigError(
                f"a ControlNet hint of {hint.shape[-2]}x{hint.shape[-1]} for a {height}x{x.shape[-1]} latent",
                f"the hint image is scaled to {scale}x the latent's size (and encoded when the ControlNet reads "
                "latents)",
                "prepare the hint at the latent's size (the sampler node does this)",
            )
        x = blocks.pad_to_patch(x.to(device, dtype))
        return x, blocks.pad_to_patch(hint) if scale == 1 else hint

    def _on_device(
        self, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None
    ) -> tuple[torch.Tensor, Conditioning, torch.Tensor | None]:
        device, dtype = self.blocks.device, self.blocks.dtype
        return timestep.to(device), cond.to(device, dtype), None if guidance is None else guidance.to(device)

    def _run(self, acts: Activations, step: Callable[[Activations, int], Activations], main_blocks: Sequence[str]):
        """Every ControlNet block in turn (``step``), its control block's output after each, spread over
        ``main_blocks``."""
        doubles: list[torch.Tensor] = []
        singles: list[torch.Tensor] = []
        for i in range(self.blocks.num_blocks):
            name, _ = self.blocks.block(i)
            acts = step(acts, i)
            if name == DOUBLE_LIST:
                doubles.append(self.model.controlnet_blocks[len(doubles)](acts.img))
            else:
                singles.append(self.model.controlnet_single_blocks[len(singles)](acts.img))
        return self.spread(doubles, singles, main_blocks)

    def hint_latent(self, hint: torch.Tensor) -> torch.Tensor:
        """The hint as the latent-sized map the ControlNet embeds (an InstantX file takes the VAE latent as is)."""
        return hint

    @staticmethod
    def spread(doubles: list[torch.Tensor], singles: list[torch.Tensor], main_blocks: Sequence[str]) -> list:
        return spread(doubles, singles, main_blocks)


def build_model(state: dict[str, torch.Tensor], config: dict[str, Any], name: str, main: ModelAdapter) -> Any:
    """diffusers' FluxControlNetModel of ``config`` holding ``state`` (its names), on the main model's device
    and dtype."""
    from diffusers import FluxControlNetModel

    if config["attention_head_dim"] != sum(config["axes_dims_rope"]):
        raise ConfigError(
            f"the ControlNet {name} has {config['attention_head_dim']}-wide attention heads, the "
            f"model's rotary axes cover {sum(config['axes_dims_rope'])}",
            "a Flux ControlNet runs the main model's block layout and position encoding",
            "use a ControlNet made for this Flux model",
        )
    with torch.device("meta"):
        model = FluxControlNetModel(**config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(main.device, main.dtype).eval().requires_grad_(False)


def spread(doubles: list[torch.Tensor], singles: list[torch.Tensor], main_blocks: Sequence[str]) -> list:
    """Each main block's residual: ControlNet block ``i // ceil(19 / len(doubles))`` for double block i < 19,
    likewise over 38 single blocks (ComfyUI's spread over a full-size FLUX.1)."""
    out: list[torch.Tensor | None] = []
    d = s = 0
    for name in main_blocks:
        if name == DOUBLE_LIST:
            repeat = math.ceil(FULL_DOUBLE / len(doubles)) if doubles else 0
            out.append(doubles[d // repeat] if doubles and d < FULL_DOUBLE else None)
            d += 1
        else:
            repeat = math.ceil(FULL_SINGLE / len(singles)) if singles else 0
            out.append(singles[s // repeat] if singles and s < FULL_SINGLE else None)
            s += 1
    return out


def describe_instantx(path: Path, shapes: dict[str, list[int]]) -> ControlNetFile:
    """A Flux InstantX / Union file's facts from its tensor shapes (a 17-channel inpainting one refused)."""
    _, in_channels = shapes["x_embedder.weight"]
    hint_in = shapes["controlnet_x_embedder.weight"][1]
    if hint_in != in_channels:
        raise ConfigError(
            f"ControlNet file {path.name} takes {hint_in // 4} hint channels (the model's latent has "
            f"{in_channels // 4})",
            "a 17-channel Flux ControlNet is an inpainting ControlNet: its hint carries a mask channel",
            "use a Flux ControlNet whose hint is the plain latent (Union, canny, depth)",
        )
    mode = shapes.get("controlnet_mode_embedder.weight")

    def count(prefix: str) -> int:
        return len({k.split(".")[1] for k in shapes if k.startswith(prefix + ".")})

    return ControlNetFile(
        path=str(path),
        kind=FLUX_INSTANTX,
        family=ID,
        union_modes=0 if mode is None else int(mode[0]),
        hint_channels=int(hint_in) // 4,
        double_blocks=count("transformer_blocks"),
        single_blocks=count("single_transformer_blocks"),
        hint_format=flux_latent_format(int(hint_in) // 4),  # ComfyUI: latent_formats.Flux() for these files
    )
