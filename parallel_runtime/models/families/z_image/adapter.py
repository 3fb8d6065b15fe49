"""Z-Image (ZImageTransformer2DModel): single-stream DiT, Qwen3 caption features, 3-axis complex RoPE.

The model, as diffusers' ZImagePipeline and ComfyUI run it (``comfy.ldm.lumina``'s NextDiT with Z-Image's
settings): the latent [B,16,H,W] is cut into 2x2 patches (channel order p,q,c), 64 values a token. Both token
sequences are padded to a multiple of ``SEQ_MULTIPLE`` (32): the caption with the learned ``cap_pad_token``
(positions continue 1, 2, ... through the padding), the image with ``x_pad_token`` at position (0, 0, 0). Image
tokens sit at (caption length + 1, row, col). Then:

1. ``context_refiner`` (no modulation): the caption attends to itself. It does not depend on the timestep and is
   small, so it runs in :meth:`ZImageAdapter.embed_full` on every rank, whole.
2. ``noise_refiner`` (modulated): the image tokens and the image's pad tokens attend to each other only.
3. ``layers`` (modulated): image, image pads and caption attend to each other.
4. The final layer on the image tokens; the prediction is its negative (the model predicts data - noise; ComfyUI
   and the pipeline both negate it) and the timestep it embeds is ``1 - sigma`` (times ``t_scale``).

Layout: ``img`` holds the image tokens (split over "sp" like every family's); ``txt`` holds the image's pad tokens
followed by the caption, split over "sp" as one sequence, so attention is joint with the text last. The rotary
tables travel as real ``view_as_real`` tensors; ``txt_rope`` carries, next to them, which text tokens are image pads
(a prefix of every rank's text share): the noise refiner takes just those. Exact on every layout except PipeFusion
stages that also split the sequence (``ulysses`` / ``ring`` inside a stage) with an image whose token count is not
a multiple of 32: refused (stale-K/V attention needs every rank's share of the pads to follow the even split).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...base import Activations, Conditioning, ModelAdapter, ModelPlan, Split
from ...config_sizes import ConfigSizes
from ...latent_formats import LatentFormat
from ...sampling_spec import discrete_flow_sampling
from ..flux.latent import latent_format as flux_latent_format  # Z-Image's VAE is Flux.1's
from . import ID

SEQ_MULTIPLE = 32  # diffusers' SEQ_MULTI_OF, ComfyUI's pad_tokens_multiple
PATCH, FRAME_PATCH = 2, 1
EMBEDDER = f"{PATCH}-{FRAME_PATCH}"  # the key of the patch size in all_x_embedder / all_final_layer
SHIFT = 3.0  # ComfyUI's ZImage sampling_settings (shift 3.0, multiplier 1.0) = the release's scheduler shift


def padded(n: int) -> int:
    """``n`` rounded up to a multiple of SEQ_MULTIPLE."""
    return n + (-n) % SEQ_MULTIPLE


class ZImageAdapter(ModelAdapter):
    family = ID
    sdpa_processors = (compat.Z_IMAGE_ATTN_PROCESSOR,)

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        pairs = list(zip(config.all_patch_size, config.all_f_patch_size))
        siglip = getattr(config, "siglip_feat_dim", None)
        if (PATCH, FRAME_PATCH) not in pairs or siglip is not None:
            raise ConfigError(
                f"Z-Image transformer with patch sizes {pairs} and siglip_feat_dim={siglip}",
                "only text-to-image Z-Image (2x2 patches, no SigLIP image conditioning of the Omni variant) is supported",
                "load Z-Image-Turbo or Z-Image (z_image*.safetensors or the Tongyi-MAI folders)",
            )
        channels = int(config.in_channels)
        return ModelPlan(
            family=cls.family,
            block_lists=("noise_refiner", "layers"),
            patch_size=PATCH,
            patch_layout="pqc",
            latent_channels=channels,
            out_channels=channels,
            learned_sigma=False,
            text_attention="joint",
            guidance_embed=False,
            timestep="sigma",
            latent_format=latent_format or flux_latent_format(channels),
            splits=(Split("img", 1), Split("txt", 1), Split("img_rope", 0), Split("txt_rope", 0)),
            model_sampling=discrete_flow_sampling(SHIFT, 1.0),
        )

    @classmethod
    def config_sizes(cls, config: Mapping[str, Any]) -> ConfigSizes:
        heads, dim = int(config.get("n_heads", 30)), int(config.get("dim", 3840))  # diffusers' defaults
        blocks = int(config.get("n_refiner_layers", 2)) + int(config.get("n_layers", 30))
        return ConfigSizes(heads, dim // heads, blocks, int(config.get("cap_feat_dim", 2560)), None)

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        rows, cols = self.grid_of(x)
        cap = self._caption(cond)
        caption, batch, device = cap.shape[1], x.shape[0], x.device
        cap_freqs = t.rope_embedder(_ids(caption, device, first=torch.arange(1, caption + 1, device=device)))
        for layer in t.context_refiner:
            cap = layer(cap, None, cap_freqs[None])
        img = t.all_x_embedder[EMBEDDER](self.patchify(x))
        pads = -(rows * cols) % SEQ_MULTIPLE
        grid = torch.stack(torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij"), -1).reshape(-1, 2)
        img_ids = torch.cat([torch.full((rows * cols, 1), caption + 1), grid], dim=1).to(device)
        txt_freqs = torch.cat([t.rope_embedder(_ids(pads, device)), cap_freqs])
        is_pad = torch.arange(pads + caption, device=device) < pads
        emb = t.t_embedder  # its forward casts to its weights' dtype: run the MLP in the compute dtype (fp8 files)
        t_freq = emb.timestep_embedding((1 - timestep.float()) * t.t_scale, emb.frequency_embedding_size)
        temb = emb.mlp(t_freq.to(self.dtype)).type_as(img)
        return Activations(
            img=img,
            txt=torch.cat([t.x_pad_token.to(img.dtype).expand(batch, pads, -1), cap.to(img.dtype)], dim=1),
            temb=temb,
            temb_out=temb,
            grid=(rows, cols),
            txt_tokens=pads + caption,
            img_rope=(torch.view_as_real(t.rope_embedder(img_ids)),),
            txt_rope=(torch.view_as_real(txt_freqs), is_pad),
        )

    def _caption(self, cond: Conditioning) -> torch.Tensor:
        """The embedded caption [B, L', D]: each prompt's valid tokens, padded with cap_pad_token to L', a
        multiple of 32 (the same for the whole batch)."""
        t, text = self.transformer, cond.prompt_embeds
        if text.shape[-1] != t.config.cap_feat_dim:
            raise ConfigError(
                f"text embeddings {text.shape[-1]} wide for a Z-Image transformer that takes {t.config.cap_feat_dim}",
                "Z-Image projects the second-to-last hidden states of its Qwen3 text encoder",
                "encode the prompt with this model's text encoder (Qwen3-4B: qwen_3_4b.safetensors)",
            )
        if cond.attention_mask is None:
            lengths, rows = [text.shape[1]] * text.shape[0], list(text)
        else:
            keep = cond.attention_mask.to(device=text.device).bool()
            lengths, rows = keep.sum(dim=1).tolist(), [row[k] for row, k in zip(text, keep)]
        caption = {padded(n) for n in lengths}
        if min(lengths) == 0 or len(caption) != 1:
            raise ConfigError(
                f"a batch of Z-Image prompts of {lengths} tokens",
                "each caption is padded to a multiple of 32 tokens; prompts padded to different lengths need an "
                "attention mask, which sequence-parallel attention cannot apply (and an empty one has no tokens)",
                "encode one prompt per batch (ComfyUI's text encode does), or prompts of similar length",
            )
        size = caption.pop()
        feats = torch.stack([torch.cat([row, row.new_zeros(size - row.shape[0], row.shape[-1])]) for row in rows])
        is_pad = torch.tensor([[i >= n for i in range(size)] for n in lengths], device=text.device)
        return torch.where(is_pad[..., None], t.cap_pad_token.to(feats.dtype), t.cap_embedder(feats))

    def embed_rows(self, x_band, rows, full_size, timestep, cond, mesh, guidance=None) -> Activations:
        tokens = math.prod(-(-side // PATCH) for side in full_size[-2:])
        if tokens % SEQ_MULTIPLE and mesh.size("sp") > 1:
            raise ConfigError(
                f"Z-Image under PipeFusion with ulysses x ring = {mesh.size('sp')} and an image of {tokens} tokens",
                "the image's pad tokens (up to the next multiple of 32) take part in the noise refiner's attention; "
                "stale-K/V attention with a sequence split inside a stage needs every rank's share of them to follow "
                "the even split",
                "choose a size whose (width / 16) x (height / 16) is a multiple of 32 (e.g. 1024x1024, 1152x896), "
                "or use PipeFusion without ulysses / ring",
            )
        return super().embed_rows(x_band, rows, full_size, timestep, cond, mesh, guidance)

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        img_freqs = torch.view_as_complex(acts.img_rope[0])
        txt_freqs, is_pad = torch.view_as_complex(acts.txt_rope[0]), acts.txt_rope[1]
        n = acts.img.shape[1]
        if list_name == "noise_refiner":  # the image and its pad tokens only: the caption waits
            k = int(is_pad.sum())
            x = torch.cat([acts.img, acts.txt[:, :k]], dim=1)
            out = block(x, None, torch.cat([img_freqs, txt_freqs[:k]])[None], acts.temb)
            return acts.replace(img=out[:, :n], txt=torch.cat([out[:, n:], acts.txt[:, k:]], dim=1))
        x = torch.cat([acts.img, acts.txt], dim=1)
        out = block(x, None, torch.cat([img_freqs, txt_freqs])[None], acts.temb)
        return acts.replace(img=out[:, :n], txt=out[:, n:])

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attention]

    def joint_text_order(self, module: nn.Module) -> Literal["first", "last"]:
        return "last"  # call_block hands the blocks [image, text]

    def project_out(self, acts: Activations) -> torch.Tensor:
        return -self.transformer.all_final_layer[EMBEDDER](acts.img, c=acts.temb_out)


def _ids(n: int, device: torch.device, first: torch.Tensor | None = None) -> torch.Tensor:
    """Position ids [n, 3]: ``first`` on the first axis (zeros when None), 0 on the others."""
    ids = torch.zeros(n, 3, dtype=torch.long, device=device)
    if first is not None:
        ids[:, 0] = first
    return ids
