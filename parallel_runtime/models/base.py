"""Model adapter interface: the declarative plan, conditioning, activations, and the block runner.

An adapter drives a diffusers transformer through its own sub-modules in three phases: ``embed`` (patchify,
embeddings, split tokens over the mesh's "sp" dimension), ``run_block`` (one transformer block, self/joint
attention routed to a sequence-parallel attention) and ``final`` (output layer on local tokens, gather, unpatchify).

A family's adapter also declares, in its ``make_plan``, what ComfyUI derives from its model file, so a graph
gives the same picture as with ComfyUI's KSampler: the latent format (``LatentFormat``, ComfyUI's
``latent_formats``), the model sampling (``ModelPlan.model_sampling``, a ``ModelSamplingSpec``: ComfyUI's
``supported_models`` ``sampling_settings`` and model type), whether latents that are not a multiple of the
patch size are padded and cropped as ComfyUI's model does (``pads_to_patch``) and the largest token grid the
model's position embedding covers (``max_grid_side``). Adapters live in their family's folder
(``families/<family>/adapter.py``) with all the family states (``families.spec.FamilySpec``).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Protocol

import torch
from torch import nn

from ..errors import ConfigError
from ..parallel.mesh import ParallelMesh
from ..parallel.sharding import gather, shard
from . import compat, token_grid
from .attention_scope import AttentionScope, intercepted
from .config_sizes import ConfigSizes, standard_config_sizes
from .latent_formats import LatentFormat
from .sampling_spec import ModelSamplingSpec


class BlockCaller(Protocol):
    """Calls a block, its self/joint attention sent where ``attention_for(module)`` says (``compiled_blocks``)."""

    def call(
        self,
        adapter: ModelAdapter,
        name: str,
        block: nn.Module,
        acts: Activations,
        attention_for: Callable[[nn.Module], Callable[..., torch.Tensor]] | None,
    ) -> Activations: ...


class BlockRunner(Protocol):
    """Runs the blocks of one model call (``ModelAdapter.forward``'s ``blocks``; a block cache is one)."""

    def __call__(self, adapter: ModelAdapter, acts: Activations, attention: AttentionScope) -> Activations: ...


@dataclasses.dataclass(frozen=True)
class Split:
    """An Activations field split over a mesh dimension along tensor dim ``dim``."""

    field: str
    dim: int
    mesh_dim: str = "sp"


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """Declarative description of a family, read by the engine (sampling, PipeFusion, VAE)."""

    family: str
    block_lists: tuple[str, ...]  # transformer attributes holding blocks, in execution order
    patch_size: int  # latent pixels per token side (Flux: 2, from the pipeline's 2x2 packing)
    patch_layout: Literal["cpq", "pqc"]  # channel order inside a token: Flux packs (c,p,q), others (p,q,c)
    latent_channels: int
    out_channels: int  # transformer output channels per latent pixel (2x latent with learned sigma)
    learned_sigma: bool
    text_attention: Literal["joint", "cross"]  # text tokens in the attention sequence, or cross-attention K/V
    guidance_embed: bool  # distilled guidance input (Flux dev)
    timestep: Literal["sigma", "sigma_x1000", "discrete"]  # what embed's ``timestep`` means
    latent_format: LatentFormat
    splits: tuple[Split, ...]  # Activations fields split over "sp" (the rest is replicated)
    model_sampling: ModelSamplingSpec  # ComfyUI's default for the file (a ModelSampling* node may replace it)
    pads_to_patch: bool = True  # a latent not a multiple of patch_size is padded (circular) and cropped, as ComfyUI
    max_grid_side: int | None = None  # most token rows/columns the position embedding covers (SD3); None: any
    vae_scale_factor: int = 8  # image pixels per latent pixel, along each side
    latent_dims: int = 2  # 2: image latents [B, C, H, W]; 3: video latents [B, C, T, H, W] (one frame per token)
    vae_temporal_factor: int = 1  # video frames per latent frame (Wan: 4, the first latent frame is 1 frame)
    image_fields: tuple[str, ...] = ("img", "img_rope")  # Activations fields with one entry per image token
    latent_frame_axis: bool = False  # ComfyUI's LATENT is [B, C, 1, H, W] for this image family (Qwen-Image's Wan VAE)
    inpaint_with_clean_latent: bool = False  # a noise mask keeps the unnoised latent (ComfyUI WAN22), else re-noised
    default_guidance: float = 3.5  # embedded guidance of entries without one (ComfyUI's extra_conds; Flux: 3.5)


@dataclasses.dataclass(frozen=True)
class ConditioningExtras:
    """Inputs a family adds to the shared :class:`Conditioning` (a frozen dataclass of optional batch-first tensors
    in its folder, moved and batched like the shared ones); ``pipefusion_refusal``: (what, why, fix) or None."""

    settings_fields: ClassVar[tuple[str, ...]] = ()  # plain fields: kept when tensors move, equal to batch

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.settings_fields}

    def pipefusion_refusal(self) -> tuple[str, str, str] | None:
        return None


EXTRAS = "extras."  # the prefix of a family's extra tensors in Conditioning.tensors()


@dataclasses.dataclass(frozen=True)
class Conditioning:
    """Conditioning for one branch (positive or negative). Every tensor is batch first; the optional ones
    are None when absent, and the helpers that batch branches (denoise.entries) treat them all alike."""

    prompt_embeds: torch.Tensor  # [B, T, D]
    pooled: torch.Tensor | None = None  # [B, Dp] (Flux, SD3)
    attention_mask: torch.Tensor | None = None  # [B, T], 1 = keep (PixArt)
    extras: ConditioningExtras | None = None  # what the family adds (its folder declares the type)

    @property
    def batch_size(self) -> int:
        return self.prompt_embeds.shape[0]

    def tensors(self) -> dict[str, torch.Tensor | None]:
        """Every tensor by name (None for the absent ones); a family's extras as ``extras.<field>``."""
        out = {"prompt_embeds": self.prompt_embeds, "pooled": self.pooled, "attention_mask": self.attention_mask}
        if self.extras is not None:
            out.update({EXTRAS + name: t for name, t in self.extras.tensors().items()})
        return out

    def with_tensors(self, tensors: Mapping[str, torch.Tensor | None]) -> Conditioning:
        """This conditioning's structure holding ``tensors`` (named as :meth:`tensors` names them)."""
        extras = self.extras
        if extras is not None:
            extras = dataclasses.replace(
                extras, **{n[len(EXTRAS) :]: t for n, t in tensors.items() if n.startswith(EXTRAS)}
            )
        return Conditioning(tensors["prompt_embeds"], tensors.get("pooled"), tensors.get("attention_mask"), extras)

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Conditioning:
        """Move the tensors to ``device``, the floating ones to ``dtype`` (masks keep integer dtypes)."""

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            return t.to(device=device, dtype=dtype if t.is_floating_point() else None)

        return self.with_tensors({name: move(t) for name, t in self.tensors().items()})


Rope = tuple[torch.Tensor, ...]  # (cos, sin) tables, or one real view of a complex table (Qwen-Image)
COMPUTE_DTYPE_ATTR = "dit_compute_dtype"  # set on a transformer whose weights are stored in another dtype (fp8)

JOINT_TEXT_ORDER: Mapping[str, Literal["first", "last"]] = MappingProxyType(
    {
        compat.FLUX_ATTN_PROCESSOR: "first",  # [text, image]
        compat.JOINT_ATTN_PROCESSOR: "last",  # [image, text] (SD3)
        compat.ATTN_PROCESSOR: "last",  # self-attention over image tokens only (PixArt attn1)
        compat.WAN_ATTN_PROCESSOR: "last",  # self-attention over image tokens only (Wan attn1)
    }
)
"""Where a diffusers attention processor puts the text tokens of joint attention."""


@dataclasses.dataclass
class Activations:
    """State between blocks on one rank. Token tensors hold this rank's share unless replicated."""

    img: torch.Tensor  # [B, S_img_local, D] image tokens (row-major over the token grid)
    txt: torch.Tensor | None  # joint: [B, S_txt_local, D]; cross: [B, T, D] replicated; None when consumed
    temb: torch.Tensor  # conditioning vector the blocks take
    temb_out: torch.Tensor  # conditioning vector the output layer takes
    grid: tuple[int, ...]  # full token grid: (rows, cols), or (frames, rows, cols) for video; tokens = product
    txt_tokens: int  # full text token count
    img_rope: Rope | None = None  # rotary (cos, sin) of this rank's image tokens (token dim: the plan's Split)
    txt_rope: Rope | None = None
    txt_mask: torch.Tensor | None = None  # cross-attention bias [B, 1, T] (replicated)
    ref_tokens: int = 0  # reference-image tokens (edit models) after the grid's in the image fields (full count)
    block_txt: torch.Tensor | None = None  # joint text only block k's attention adds: [B, blocks, T, D] (prompt-only)
    control: tuple[torch.Tensor, ...] | None = None  # per-token control streams [B, S_img_local, D] (Wan VACE)
    control_scale: tuple[float, ...] = ()  # the strength of each control stream's hints (Wan VACE: per entry)

    @property
    def img_tokens(self) -> int:
        return token_grid.token_count(self.grid)

    def replace(self, **changes: Any) -> Activations:
        return dataclasses.replace(self, **changes)


def shard_activations(acts: Activations, splits: Sequence[Split], mesh: ParallelMesh) -> Activations:
    """This rank's share of ``acts``: every field named in ``splits`` narrowed with sharding.shard."""
    changes: dict[str, Any] = {}
    for s in splits:
        value = getattr(acts, s.field)
        if value is None:
            continue
        if isinstance(value, tuple):
            changes[s.field] = tuple(shard(v, s.dim, mesh, s.mesh_dim) for v in value)
        else:
            changes[s.field] = shard(value, s.dim, mesh, s.mesh_dim)
    return acts.replace(**changes)


class ModelAdapter(abc.ABC):
    """Runs one diffusers transformer family as embed -> blocks -> final over a ParallelMesh."""

    family: str = ""
    sdpa_processors: tuple[str, ...] = ()  # processor classes known to call F.scaled_dot_product_attention
    block_hook: Callable[[], None] | None = None  # called after each block of forward() (a job's cancel points)

    def __init__(self, transformer: nn.Module, latent_format: LatentFormat | None = None):
        self.transformer = transformer
        self.plan = self.make_plan(transformer.config, latent_format)
        self._blocks = [(name, blk) for name in self.plan.block_lists for blk in getattr(transformer, name)]
        self.compiled: BlockCaller | None = None  # compiled blocks (models.compiled_blocks), None: eager
        check_attention_path(self)

    # -- family hooks ----------------------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan: ...

    @classmethod
    def config_sizes(cls, config: Mapping[str, Any]) -> ConfigSizes:
        """Heads, head width, blocks and text widths of a diffusers ``config`` (a dict); a family whose config
        names them otherwise than most diffusers transformers overrides this."""
        return standard_config_sizes(config)

    @abc.abstractmethod
    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        """Embeddings of the whole (unsplit) sequence."""

    def trace_conditioning(self, cond: Conditioning) -> Conditioning:
        """``cond`` of the meta shape trace (``models.extra_roles``) with the extras ``embed_full`` requires."""
        return cond

    @abc.abstractmethod
    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        """Run one diffusers block on local activations."""

    @abc.abstractmethod
    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        """The block's self/joint attention modules (the ones routed to sequence parallelism)."""

    @abc.abstractmethod
    def project_out(self, acts: Activations) -> torch.Tensor:
        """Output layer on local image tokens: [B, S_img_local, patch*patch*out_channels]."""

    # -- common ----------------------------------------------------------------------------------
    def _first_parameter(self) -> torch.Tensor:
        """The first loaded parameter (a PipeFusion stage leaves other stages' weights on "meta")."""
        params = self.transformer.parameters()
        first = next(params)
        return first if first.device.type != "meta" else next((p for p in params if p.device.type != "meta"), first)

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: the loader's record of it (fp8-stored weights compute wider), else that of most of
        a block's weights (small modules such as modulation tables may stay float32, as diffusers keeps them)."""
        recorded = getattr(self.transformer, COMPUTE_DTYPE_ATTR, None)
        if recorded is not None:
            return recorded
        for _, blk in self._blocks:
            sizes: dict[torch.dtype, int] = {}
            for p in blk.parameters():
                if p.device.type != "meta":
                    sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
            if sizes:
                return max(sizes, key=sizes.__getitem__)
        return self._first_parameter().dtype

    @property
    def device(self) -> torch.device:
        return self._first_parameter().device

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    def block(self, i: int) -> tuple[str, nn.Module]:
        """(block list name, module) of block ``i`` in execution order."""
        return self._blocks[i]

    def attention_modules(self, i: int) -> list[nn.Module]:
        name, blk = self._blocks[i]
        return self.self_attention_modules(name, blk)

    def embed(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor | float,
        cond: Conditioning,
        mesh: ParallelMesh,
        guidance: torch.Tensor | float | None = None,
    ) -> Activations:
        """Embed the model-space latent ``x`` ([B,C,H,W], or [B,C,T,H,W] for video) and split its tokens over "sp"."""
        batch = x.shape[0]
        x = x.to(self.device, self.dtype)
        timestep = _batched(timestep, batch, x.device)
        guidance = None if guidance is None else _batched(guidance, batch, x.device)
        acts = self.embed_full(x, timestep, cond.to(x.device, self.dtype), guidance)
        return shard_activations(acts, self.plan.splits, mesh)

    def embed_rows(
        self,
        x_band: torch.Tensor,
        rows: tuple[int, int],
        full_size: tuple[int, ...],
        timestep: torch.Tensor | float,
        cond: Conditioning,
        mesh: ParallelMesh,
        guidance: torch.Tensor | float | None = None,
    ) -> Activations:
        """Embeddings of a row band (PipeFusion patch): latent rows ``rows[0]:rows[1]`` (multiples of the
        patch size) of a latent of size ``full_size`` ((H, W), or (T, H, W) for video), of which ``x_band``
        [B,C,rows,W] holds the band. For video, rows count in the stacked view (frames stacked vertically,
        ``token_grid.stacked``): a band is then a contiguous range of the token sequence, maybe across frames.

        The plan's ``image_fields`` cover only the band's tokens and ``grid`` is the band's 2-D token grid
        (token rows, cols) in the stacked view; text fields are the full text. Split over "sp" like
        :meth:`embed`. This default embeds the band placed in an otherwise zero latent and keeps the band's
        tokens, which is exact when each token's embedding depends only on its own latent patch and its
        position (Flux, SD3, PixArt, Wan); a family may override it with a cheaper band-only computation.
        Reference-image tokens of ``cond`` (edit models) follow the band's (``ref_tokens``)."""
        p = self.plan.patch_size
        (r0, r1), w = rows, full_size[-1]
        h = math.prod(full_size[:-1])
        if r0 % p or r1 % p or not 0 <= r0 < r1 <= h or x_band.shape[-2] != r1 - r0 or x_band.shape[-1] != w:
            raise ConfigError(
                f"row band {r0}:{r1} (a tensor of {x_band.shape[-2]}x{x_band.shape[-1]}) of a {h}x{w} latent",
                f"a patch is a band of whole {p}x{p} token rows inside the latent",
                f"give rows that are multiples of {p} within 0..{h}, with x_band holding exactly those rows",
            )
        full = x_band
        if (r0, r1) != (0, h):
            full = x_band.new_zeros((*x_band.shape[:-2], h, w))
            full[..., r0:r1, :] = x_band
        full = token_grid.unstacked(full, tuple(full_size)).to(self.device, self.dtype)
        cols = self.grid_of(full)[-1]
        batch = full.shape[0]
        timestep = _batched(timestep, batch, full.device)
        guidance = None if guidance is None else _batched(guidance, batch, full.device)
        acts = self.embed_full(full, timestep, cond.to(full.device, self.dtype), guidance)
        t0, t1 = r0 // p * cols, r1 // p * cols
        end, refs = acts.img_tokens, acts.ref_tokens  # reference tokens (edit models) stay, after the band's
        changes: dict[str, Any] = {"grid": ((r1 - r0) // p, cols)}
        for field in self.plan.image_fields:
            value = getattr(acts, field)
            if value is not None:
                dim = self.token_dim(field)
                narrow = functools.partial(token_grid.band_and_tail, dim=dim, band=(t0, t1), end=end, tail=refs)
                changes[field] = tuple(map(narrow, value)) if isinstance(value, tuple) else narrow(value)
        return shard_activations(acts.replace(**changes), self.plan.splits, mesh)

    def token_dim(self, field: str) -> int:
        """The tensor dim of an image field that indexes the tokens (the dim it is split along)."""
        for split in self.plan.splits:
            if split.field == field:
                return split.dim
        raise ConfigError(
            f"{self.family}: image field {field!r} is not split over the tokens",
            "per-token fields are cut to a band and split over sequence-parallel ranks along their token dim",
            f"declare Split({field!r}, <token dim>) in the plan's splits, or drop it from image_fields",
        )

    def process_timestep(self, timestep: torch.Tensor, denoise_mask: torch.Tensor | None) -> torch.Tensor:
        """The timestep given when sampling with a noise mask (ComfyUI's ``process_timestep``); unchanged by default."""
        return timestep

    def joint_text_order(self, module: nn.Module) -> Literal["first", "last"]:
        """Where a self/joint attention module puts the text tokens in the sequence it hands to
        scaled_dot_product_attention (PipeFusion's stale K/V buffers must tell them from image tokens).
        The default reads it from the module's diffusers attention processor."""
        name = type(module.processor).__name__
        order = JOINT_TEXT_ORDER.get(name)
        if order is None:
            raise ConfigError(
                f"{self.family}: attention processor {name} is unknown to PipeFusion",
                "PipeFusion keeps a K/V buffer of the image tokens and needs to know where the text tokens sit "
                "in the joint attention sequence",
                f"use one of the processors {', '.join(JOINT_TEXT_ORDER)}, or override joint_text_order in the adapter",
            )
        return order

    def run_block(self, acts: Activations, i: int, attention: AttentionScope) -> Activations:
        """Block ``i`` (execution order over all block lists); self/joint attention goes to ``attention``
        (when it replaces plain SDPA at all: ``attention.routes_sdpa``, True when absent)."""
        name, blk = self._blocks[i]
        if self.compiled is not None:
            routed = (lambda module: attention) if getattr(attention, "routes_sdpa", True) else None
            return self.compiled.call(self, name, blk, acts, routed)  # type: ignore[arg-type]
        with intercepted(self.self_attention_modules(name, blk), attention):
            return self.call_block(name, blk, acts)

    def run_blocks(
        self, acts: Activations, attention: AttentionScope, start: int = 0, stop: int | None = None
    ) -> Activations:
        """Blocks ``start`` up to ``stop`` (default: the last) in execution order, :attr:`block_hook` after each."""
        hook = self.block_hook
        for i in range(start, self.num_blocks if stop is None else stop):
            acts = self.run_block(acts, i, attention)
            if hook is not None:
                hook()
        return acts

    def final(self, acts: Activations, mesh: ParallelMesh) -> torch.Tensor:
        """Prediction [B, C, (T,) H, W] in model space (a video band's: its stacked 2-D view), gathered on all sp."""
        tokens = gather(self.project_out(acts), 1, acts.img_tokens + acts.ref_tokens, mesh)
        if acts.ref_tokens:  # reference images ride along in the sequence; the prediction is the image's
            tokens = tokens[:, : acts.img_tokens]
        return self.unpatchify(tokens, acts.grid)

    def forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor | float,
        cond: Conditioning,
        mesh: ParallelMesh,
        attention: AttentionScope,
        guidance: torch.Tensor | float | None = None,
        blocks: BlockRunner | None = None,
    ) -> torch.Tensor:
        """embed + all blocks + final. A latent that is not a multiple of the patch size is padded
        circularly to the next multiple and the prediction cropped back (ComfyUI's models do the same,
        ``comfy.ldm.common_dit.pad_to_patch_size``) when the plan allows it (``pads_to_patch``).
        ``blocks`` runs the blocks instead of :meth:`run_blocks` (e.g. a block cache)."""
        h, w = x.shape[-2:]
        x = self.pad_to_patch(x)
        acts = self.embed(x, timestep, cond, mesh, guidance)
        acts = self.run_blocks(acts, attention) if blocks is None else blocks(self, acts, attention)
        return self.final(acts, mesh)[..., :h, :w]

    def pad_to_patch(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` padded at the bottom and right to a multiple of the patch size, wrapping around
        (circular), as ComfyUI pads; unchanged when it already is one or the family does not pad."""
        p = self.plan.patch_size
        pad_h, pad_w = -x.shape[-2] % p, -x.shape[-1] % p
        if not (pad_h or pad_w) or not self.plan.pads_to_patch:
            return x
        frames = (0, 0) if x.ndim == 5 else ()  # a video's frames are whole tokens already (1 frame each)
        return torch.nn.functional.pad(x, (0, pad_w, 0, pad_h, *frames), mode="circular")

    # -- latent <-> tokens -----------------------------------------------------------------------
    def grid_of(self, x: torch.Tensor) -> tuple[int, ...]:
        """(rows, cols) of an image latent, (frames, rows, cols) of a video latent (see token_grid)."""
        plan = self.plan
        return token_grid.grid_of(x, plan.patch_size, plan.latent_dims, self.family, plan.vae_scale_factor)

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """[B,C,(T,)H,W] -> [B, tokens, C*p*p] in the plan's patch layout, tokens row-major over the grid."""
        return token_grid.patchify(x, self.plan.patch_size, self.grid_of(x), self.plan.patch_layout)

    def unpatchify(self, tokens: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        """[B, tokens, C_out*p*p] -> [B, latent_channels, (T,) H, W] (learned-sigma channels dropped). A 2-D
        ``grid`` of a video family's tokens gives the stacked view [B, C, T*H, W] (token_grid)."""
        plan = self.plan
        x = token_grid.unpatchify(tokens, grid, plan.patch_size, plan.out_channels, plan.patch_layout)
        return x[:, : plan.latent_channels] if plan.learned_sigma else x


def _batched(value: torch.Tensor | float, batch: int, device: torch.device) -> torch.Tensor:
    """A [batch] tensor from a number, a one-element tensor or a [batch] tensor."""
    t = value if isinstance(value, torch.Tensor) else torch.tensor(float(value), dtype=torch.float32)
    t = t.to(device)
    return t.reshape(1).expand(batch) if t.ndim == 0 or t.numel() == 1 else t.to(device)


def check_attention_path(adapter: ModelAdapter) -> None:
    """Fail early if a self/joint attention module would not call F.scaled_dot_product_attention.

    attention.intercept() sees only that function. SD3's and PixArt's processors
    (JointAttnProcessor2_0, AttnProcessor2_0) call it directly; Flux's FluxAttnProcessor goes through
    ``dispatch_attention_fn``, which calls it only for diffusers' "native" backend. Other processors
    or backends (xformers, flash-attn, cuDNN, diffusers' own context parallel) would silently compute
    rank-local attention, so they are refused here."""
    for i in range(adapter.num_blocks):
        for module in adapter.attention_modules(i):
            proc = module.processor
            name = type(proc).__name__
            problem = None
            if name not in adapter.sdpa_processors:
                problem = f"uses attention processor {name}"
            elif compat.uses_context_parallel(proc):
                problem = "has diffusers' own context parallelism enabled"
            elif compat.attention_backend(proc) not in (None, compat.NATIVE_BACKEND):
                problem = f"uses diffusers attention backend {compat.attention_backend(proc)!r}"
            if problem:
                raise ConfigError(
                    f"block {i} of {adapter.family} {problem}",
                    "sequence parallelism intercepts torch's scaled_dot_product_attention; this path does "
                    "not call it, so attention would silently see only this rank's tokens",
                    "use the default processors (" + ", ".join(adapter.sdpa_processors) + ") with diffusers' "
                    "native backend: unset DIFFUSERS_ATTN_BACKEND and do not call set_attention_backend / "
                    "enable_parallelism on the transformer",
                )
