"""How a family's causal 3-D video VAE is decoded band-parallel, as data the family states (``FamilySpec.video_vae``).

Some video VAEs (HunyuanVideo's) decode the whole clip at once: causal 3-D convolutions padded in time before the
first frame, GroupNorms over all frames and pixels, and a mid-block attention over every pixel of every frame
(frame-causal or not). ``vae.causal3d`` splits the rows of every frame over the ranks and runs the VAE's own
decoder on each band, with these layers swapped for band versions; a family names its VAE's layers here:

- ``CausalConv``: a module whose forward pads (w, w, h, h, t, 0) in ``mode`` and applies ``conv`` (arguments
  beyond the input, e.g. LTX convs' ``causal``, are ignored in band mode: ``conv`` states their effect);
- ``SpatialNoise``: random noise over (rows, width) a decoder adds after a conv (LTX-Video 0.9.1's injected noise),
  drawn from the decode's seeded generator for the WHOLE picture on every rank and cut to the band;
- GroupNorm modules over [B, C, T, H, W] (statistics over the whole clip);
- attention modules, with a band forward the family writes from ``attend`` (queries of this band against the
  keys and values of every band, see ``vae.causal3d``).

Everything else in the decoder must be row-local (per-pixel norms, 1x1 convs, nearest or pixel-shuffle
upsampling, activations). A VAE whose decode is random (LTX-Video 0.9.1+: noise on the latent, ``perturb``) draws it
from a generator seeded with the decode's seed, never from torch's global one. Light to import: no torch at import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

DEFAULT_DECODE_SEED = 0  # the seed of a random decode (LTX-Video 0.9.1+) when the caller gives none

# attend(q, k, v, heads, scale) -> out: q/k/v/out [B, C, T, rows, W] of this band; keys/values of every band
Attend = Callable[..., "torch.Tensor"]


@dataclasses.dataclass(frozen=True)
class CausalConv:
    """A causal 3-D conv: ``module``'s forward is ``conv(pad(x, padding, mode))``."""

    module: nn.Module
    conv: nn.Module  # an nn.Conv3d with stride 1 and no padding of its own
    padding: tuple[int, int, int, int, int, int]  # (w, w, h, h, t before, t after) as F.pad takes it
    mode: str  # "replicate", "constant" or "reflect" (the rows beyond the clip's top and bottom)


@dataclasses.dataclass(frozen=True)
class SpatialNoise:
    """``owner.<scale>`` [C, 1, 1] times a standard normal [rows, width] added to ``after``'s output (every frame and
    batch the same noise); during a band decode ``owner.<scale>`` is None, so the owner's own draw is skipped."""

    owner: nn.Module
    scale: str  # the owner's parameter name
    after: nn.Module  # a module of ``BandLayers.convs`` whose output gets the noise


@dataclasses.dataclass(frozen=True)
class BandLayers:
    """The decoder layers that look beyond a pixel's own rows."""

    convs: tuple[CausalConv, ...]
    group_norms: tuple[nn.Module, ...]
    attentions: tuple[tuple[nn.Module, Callable[[nn.Module, torch.Tensor, Attend], torch.Tensor]], ...]
    noises: tuple[SpatialNoise, ...] = ()


@dataclasses.dataclass(frozen=True)
class VideoVae:
    """A family's causal 3-D video VAE (see the module doc)."""

    vae_class: str  # the diffusers VAE class this describes
    layers: Callable[[nn.Module], BandLayers]  # raises ConfigError for a decoder it cannot split
    decode: Callable[[nn.Module, torch.Tensor], torch.Tensor]  # (vae, z in VAE space) -> video in -1..1, untiled
    latent_channels: Callable[[nn.Module], int]
    spatial_factor: Callable[[nn.Module], int]
    output_frames: Callable[[int], int]  # video frames from latent frames
    causal_attention: Callable[[nn.Module], bool]  # the mid-block attention sees only this and earlier frames
    # (vae, whole z, generator) -> the z to decode (random: noise from the generator), or None: z as it is
    perturb: Callable[[nn.Module, torch.Tensor, torch.Generator], torch.Tensor] | None = None
