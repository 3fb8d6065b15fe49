"""Qwen-Image (QwenImageTransformer2DModel): dual-stream MMDiT, text tokens with a mask, complex 3-axis RoPE.

Layout: the model-space latent [B,16,H,W] is packed into 2x2 patches (channel order c,p,q, as
QwenImagePipeline and ComfyUI pack it), a token is 64 values; text tokens come first in every joint
attention call. Each sp rank holds [its text shard, its image shard] and the rotary rows of those tokens.

Rotary positions: the image grid is centred (rows and columns run through negative positions, the
module's ``neg_freqs``) and text positions start after it, at max(rows // 2, cols // 2). For grids of
odd size diffusers and ComfyUI centre differently (diffusers: -(n - n//2) .. n//2 - 1, ComfyUI:
-(n//2) .. n - 1 - n//2); Qwen's own 1328x1328 is such a grid. ComfyUI's centring is the default, so a
graph gives ComfyUI's picture; ``QwenImageAdapter.rope_centre = "diffusers"`` gives the pipeline's.
The tables are carried as real ``view_as_real`` tensors (they split, slice and travel between PipeFusion
stages like Flux's cos/sin) and turned back into complex numbers for the block.

Reference images (Qwen-Image-Edit, ``models.reference_latents``): their tokens follow the image's in the
image fields with rotary rows looked up from their ids (frame index, centred row and column), split over the
sp ranks with the image's; the output layer's result keeps the image's tokens.

Text mask: trailing padding shared by the whole batch is dropped (exact: masked keys influence nothing
and no kept token moves); a mask that still masks something is applied on one rank only.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...base import Activations, Conditioning, ModelAdapter, ModelPlan, Split
from ...latent_formats import LatentFormat
from ...reference_latents import in_model_space, references_of
from ...sampling_spec import flux_sampling
from ...text_padding import check_mask_layout, strip_text_padding
from ..wan.latent import WAN21  # Qwen-Image's VAE is Wan 2.1's (ComfyUI's QwenImage: latent_formats.Wan21)
from . import ID

PACK = 2  # 2x2 latent pixels per token
ROPE_TABLE_LEN = 4096  # rows of QwenEmbedRope's pos_freqs / neg_freqs
_UNSUPPORTED = {
    "zero_cond_t": "Qwen-Image-Edit-2511's reference-image modulation",
    "use_additional_t_cond": "an additional timestep condition (layered variants)",
    "use_layer3d_rope": "layered 3-D rotary positions (Qwen-Image-Layered)",
    "guidance_embeds": "a distilled guidance input",
}


class QwenImageAdapter(ModelAdapter):
    family = ID
    sdpa_processors = (compat.QWEN_ATTN_PROCESSOR,)
    rope_centre: Literal["comfyui", "diffusers"] = "comfyui"

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        used = [what for key, what in _UNSUPPORTED.items() if getattr(config, key, False)]
        out = config.out_channels or config.in_channels
        if used or config.patch_size != PACK or config.in_channels != out * PACK * PACK:
            raise ConfigError(
                f"Qwen-Image transformer with {', '.join(used) or f'in_channels={config.in_channels}, out_channels={out}'}",
                "only text-to-image Qwen-Image (2x2-packed 16-channel latents, no edit/layered inputs) is supported",
                "load Qwen-Image or Qwen-Image-Edit / Edit-2509 (qwen_image*.safetensors or a diffusers folder)",
            )
        return ModelPlan(
            family=cls.family,
            block_lists=("transformer_blocks",),
            patch_size=PACK,
            patch_layout="cpq",
            latent_channels=out,
            out_channels=out,
            learned_sigma=False,
            text_attention="joint",
            guidance_embed=False,
            timestep="sigma",
            latent_format=latent_format or wan21_latent_format(out),
            splits=(Split("img", 1), Split("txt", 1), Split("img_rope", 0), Split("txt_rope", 0)),
            model_sampling=flux_sampling(1.15),  # ComfyUI's QwenImage: ModelType.FLUX, sampling_settings shift 1.15
            latent_frame_axis=True,
        )

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        text, mask = strip_text_padding(cond.prompt_embeds, cond.attention_mask)
        rows, cols = self.grid_of(x)
        patches = self.patchify(x)
        refs = references_of(cond, "Qwen-Image")
        if refs is not None:  # Qwen-Image-Edit: reference tokens after the image's, in model space
            ref = in_model_space(refs.tokens, self.plan.latent_format, PACK, "cpq")
            patches = torch.cat([patches, ref.to(patches.dtype)], dim=1)
        img = t.img_in(patches)
        temb = t.time_text_embed(timestep.to(img.dtype), img)
        txt = t.txt_in(t.txt_norm(text))
        img_rope, txt_rope = qwen_rope_tables(t.pos_embed, rows, cols, txt.shape[1], x.device, self.rope_centre)
        if refs is not None:
            img_rope = torch.cat([img_rope, qwen_rope_rows(t.pos_embed, refs.ids[0]).to(img_rope.device)])
        return Activations(
            img=img,
            txt=txt,
            temb=temb,
            temb_out=temb,
            grid=(rows, cols),
            txt_tokens=txt.shape[1],
            img_rope=(torch.view_as_real(img_rope),),
            txt_rope=(torch.view_as_real(txt_rope),),
            txt_mask=mask,
            ref_tokens=0 if refs is None else refs.tokens.shape[1],
        )

    def embed(self, x, timestep, cond, mesh, guidance=None) -> Activations:
        acts = super().embed(x, timestep, cond, mesh, guidance)
        _check_mask_layout(acts, mesh)
        return acts

    def embed_rows(self, x_band, rows, full_size, timestep, cond, mesh, guidance=None) -> Activations:
        acts = super().embed_rows(x_band, rows, full_size, timestep, cond, mesh, guidance)
        _check_mask_layout(acts, mesh)
        return acts

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        rope = (torch.view_as_complex(acts.img_rope[0]), torch.view_as_complex(acts.txt_rope[0]))
        txt, img = block(
            hidden_states=acts.img,
            encoder_hidden_states=acts.txt,
            encoder_hidden_states_mask=acts.txt_mask,
            temb=acts.temb,
            image_rotary_emb=rope,
        )
        return acts.replace(img=img, txt=txt)

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attn]

    def joint_text_order(self, module: nn.Module) -> Literal["first", "last"]:
        return "first"  # QwenDoubleStreamAttnProcessor2_0 attends over [text, image]

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        return t.proj_out(t.norm_out(acts.img, acts.temb_out))


def wan21_latent_format(channels: int) -> LatentFormat:
    """ComfyUI's Wan21 latent format (Qwen-Image's VAE is the Wan 2.1 one): (latent - mean) / std per channel."""
    if channels != WAN21.channels:
        raise ConfigError(
            f"a Qwen-Image transformer with {channels} latent channels",
            f"Qwen-Image's VAE (Wan 2.1) makes {WAN21.channels}-channel latents with per-channel statistics",
            "use a Qwen-Image transformer file, or pass the latent format of your VAE",
        )
    return WAN21


def _check_mask_layout(acts: Activations, mesh) -> None:
    check_mask_layout(acts, mesh, "Qwen-Image")


def _positions(n: int, centre: str, device: torch.device) -> torch.Tensor:
    offset = n // 2 if centre == "comfyui" else n - n // 2
    return torch.arange(n, device=device) - offset


def _axis_rows(pos: torch.Tensor, neg: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rows of one axis' table for signed positions (negative p is ``neg`` row ROPE_TABLE_LEN + p)."""
    rows = torch.where(positions >= 0, positions, positions + ROPE_TABLE_LEN)
    return torch.where((positions >= 0)[:, None], pos[rows.clamp(max=pos.shape[0] - 1)], neg[rows])


def qwen_rope_tables(
    rope: nn.Module, rows: int, cols: int, text_tokens: int, device: torch.device, centre: str = "comfyui"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(image freqs [rows*cols, D/2], text freqs [T, D/2]) as complex tables of QwenEmbedRope ``rope``."""
    if centre not in ("comfyui", "diffusers"):
        raise ConfigError(
            f"rope_centre {centre!r}",
            "odd grids are centred as ComfyUI or as diffusers does",
            "use 'comfyui' or 'diffusers'",
        )
    halves = [d // 2 for d in rope.axes_dim]
    pos = rope.pos_freqs.split(halves, dim=1)
    neg = rope.neg_freqs.split(halves, dim=1)
    frame = pos[0][0].expand(rows, cols, -1)
    table = rope.pos_freqs.device
    height = _axis_rows(pos[1], neg[1], _positions(rows, centre, table))[:, None, :].expand(rows, cols, -1)
    width = _axis_rows(pos[2], neg[2], _positions(cols, centre, table))[None, :, :].expand(rows, cols, -1)
    image = torch.cat([frame, height, width], dim=-1).reshape(rows * cols, -1)
    start = max(rows // 2, cols // 2)
    text = rope.pos_freqs[start : start + text_tokens]
    return image.to(device), text.to(device)


def qwen_rope_rows(rope: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Complex rotary rows [N, D/2] of QwenEmbedRope ``rope`` for position ids [N, 3] (frame, row, col)."""
    halves = [d // 2 for d in rope.axes_dim]
    pos = rope.pos_freqs.split(halves, dim=1)
    neg = rope.neg_freqs.split(halves, dim=1)
    ids = ids.to(rope.pos_freqs.device).round().long()
    axes = [_axis_rows(pos[a], neg[a], ids[:, a]) for a in range(3)]
    return torch.cat(axes, dim=-1)
