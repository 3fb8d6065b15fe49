"""HiDream-I1 (HiDreamImageTransformer2DModel): double-stream then single-stream blocks with mixture-of-experts
feed-forwards (a shared expert plus the top-k of the routed ones, per token), conditioned on one vector
(timestep + pooled CLIPs) and on text that changes from block to block.

Text: T5's states and the last Llama-3.1 layer's (each through its own caption projection) form the running
text ``txt`` = [T5 | Llama-last], updated by the double blocks and carried through the single ones. Every block
``k`` also appends the projected states of Llama layer ``llama_layers[k]`` (``block_txt[:, k]``) to its
attention sequence and drops them after the block. The attention sequence is [image | text]; text tokens sit
at position 0 on every rotary axis (an identity rotation); image tokens at (0, row, column).

The prediction is the transformer's output negated (diffusers' HiDreamImagePipeline and ComfyUI's model both
negate it): HiDream predicts x0 - noise, the flow convention here is noise - x0.

Sequence parallelism: each sp rank holds a share of the image tokens, of ``txt`` and of every block's Llama
tokens; a rank's attention sequence is then a permutation of the full one (rotations are per token), which
attention does not notice, and the expert routing is per token. Layout: 2x2 patches, channels (p, q, c);
latents are not padded to ``max_resolution`` (ComfyUI does not; diffusers pads non-square latents).
Timestep: sigma x 1000 (ComfyUI's ModelSamplingDiscreteFlow, multiplier 1000).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Activations, Conditioning, LatentFormat, ModelAdapter, ModelPlan, Split
from ...config_sizes import ConfigSizes
from ...sampling_spec import discrete_flow_sampling
from ..flux.latent import latent_format as flux_latent_format
from . import ID
from .conditioning import HiDreamText, llama_states

DOUBLE, SINGLE = "double_stream_blocks", "single_stream_blocks"
PROCESSOR = "HiDreamAttnProcessor"


class HiDreamAdapter(ModelAdapter):
    family = ID
    sdpa_processors = (PROCESSOR,)

    def __init__(self, transformer: nn.Module, latent_format: LatentFormat | None = None):
        super().__init__(transformer, latent_format)
        self._index = {id(b): i for i, (_, b) in enumerate(self._blocks)}  # block k of the model's count

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        out = config.out_channels or config.in_channels
        blocks = config.num_layers + config.num_single_layers
        if out != config.in_channels or len(config.llama_layers or ()) != blocks:
            raise ConfigError(
                f"HiDream transformer with in_channels={config.in_channels}, out_channels={out} and "
                f"{len(config.llama_layers or ())} Llama layers for {blocks} blocks",
                "HiDream-I1 denoises its latent in place and reads one Llama-3.1 layer per block",
                "load a HiDream-I1 (Full, Dev or Fast) transformer",
            )
        return ModelPlan(
            family=cls.family,
            block_lists=(DOUBLE, SINGLE),
            patch_size=config.patch_size,
            patch_layout="pqc",
            latent_channels=out,
            out_channels=out,
            learned_sigma=False,
            text_attention="joint",
            guidance_embed=False,
            timestep="sigma_x1000",
            latent_format=latent_format or flux_latent_format(out),  # ComfyUI: supported_models.HiDream, Flux's
            splits=(Split("img", 1), Split("txt", 1), Split("img_rope", 1), Split("block_txt", 2)),
            # ComfyUI's supported_models.HiDream: ModelType.FLOW, sampling_settings {} -> ModelSamplingDiscreteFlow
            # shift 1.0, multiplier 1000 (its official workflows set ModelSamplingSD3 3.0 / 6.0 in the graph)
            model_sampling=discrete_flow_sampling(1.0),
        )

    @classmethod
    def config_sizes(cls, config: Mapping[str, Any]) -> ConfigSizes:
        """``caption_channels`` is [T5, Llama]: the text the conditioning carries is T5's; pooled: both CLIPs."""
        heads, head_dim = int(config["num_attention_heads"]), int(config["attention_head_dim"])
        blocks = int(config["num_layers"]) + int(config["num_single_layers"])
        return ConfigSizes(heads, head_dim, blocks, int(config["caption_channels"][0]), int(config["text_emb_dim"]))

    def trace_conditioning(self, cond: Conditioning) -> Conditioning:
        """Zero Llama states of every layer the blocks read: the trace needs their shapes only."""
        config = self.transformer.config
        shape = (cond.batch_size, max(config.llama_layers) + 1, 1, int(config.caption_channels[1]))
        return dataclasses.replace(cond, extras=HiDreamText(cond.prompt_embeds.new_zeros(shape)))

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        if cond.pooled is None:
            raise ConfigError(
                "a HiDream model was given conditioning without the pooled CLIP output",
                "HiDream's conditioning vector is the timestep plus CLIP-L and CLIP-G's pooled outputs",
                "encode the prompt with ComfyUI's QuadrupleCLIPLoader and CLIPTextEncode",
            )
        layers = list(t.config.llama_layers)
        states = llama_states(cond, max(layers) + 1)
        rows, cols = self.grid_of(x)
        img = t.x_embedder(self.patchify(x))
        temb = t.t_embedder(timestep, img.dtype) + t.p_embedder(cond.pooled)
        projections = t.caption_projection
        per_block = torch.stack([projections[i](states[:, layer]) for i, layer in enumerate(layers)], dim=1)
        txt = torch.cat([projections[-1](cond.prompt_embeds), per_block[:, -1]], dim=1)
        ids = torch.zeros(rows, cols, 3, device=x.device)
        ids[..., 1] += torch.arange(rows, device=x.device)[:, None]
        ids[..., 2] += torch.arange(cols, device=x.device)[None, :]
        return Activations(
            img=img,
            txt=txt,
            temb=temb,
            temb_out=temb,
            grid=(rows, cols),
            txt_tokens=txt.shape[1] + per_block.shape[2],  # every block's attention: [T5 | Llama-last | layer k]
            img_rope=(t.pe_embedder(ids.reshape(1, -1, 3)),),
            txt_rope=(t.pe_embedder(torch.zeros(1, 1, 3, device=x.device)),),  # position 0: identity
            block_txt=per_block,
        )

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        extra = acts.block_txt[:, self._index[id(block)]]
        images, texts = acts.img.shape[1], acts.txt.shape[1]
        (img_rope,), (txt_rope,) = acts.img_rope, acts.txt_rope
        text_rope = txt_rope.expand(-1, texts + extra.shape[1], *txt_rope.shape[2:])
        rope = torch.cat([img_rope, text_rope], dim=1)
        if list_name == DOUBLE:
            img, txt = block(
                hidden_states=acts.img,
                encoder_hidden_states=torch.cat([acts.txt, extra], dim=1),
                temb=acts.temb,
                image_rotary_emb=rope,
            )
            return acts.replace(img=img, txt=txt[:, :texts])
        joint = block(
            hidden_states=torch.cat([acts.img, acts.txt, extra], dim=1), temb=acts.temb, image_rotary_emb=rope
        )
        return acts.replace(img=joint[:, :images], txt=joint[:, images : images + texts])

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.block.attn1]

    def joint_text_order(self, module: nn.Module) -> Literal["first", "last"]:
        return "last"  # HiDreamAttnProcessor: [image, text]

    def project_out(self, acts: Activations) -> torch.Tensor:
        return -self.transformer.final_layer(acts.img, acts.temb_out)
