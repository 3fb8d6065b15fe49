"""Exact parallel decode of causal 3-D video VAEs that decode the whole clip at once (a family states its VAE's
layers as a ``models.video_vae.VideoVae``: HunyuanVideo's).

Each rank decodes a band of latent rows of every frame by running the VAE's OWN decoder on it, while
:func:`band_mode` swaps, for the call only, the forward of the layers that look beyond a pixel's rows:

- causal convs (padding (w, w, h, h, t, 0), replicate or zeros, then a stride-1 conv): the rows above and
  below come from the neighbouring bands in one exchange; at the clip's true top and bottom they are padded as
  the conv pads (a replicated edge row, or zeros). Time and width are whole on every rank, so their padding is
  the conv's own;
- GroupNorms over [B, C, T, rows, W]: statistics of the whole clip (per-rank mean and M2 combined exactly);
- attention blocks: the family's band forward calls :func:`attend`-style queries of this band against the keys
  and values of all bands (one all-gather), frame-causal when the VAE's is.

- injected spatial noise (``SpatialNoise``): each rank draws the noise of the WHOLE picture at that resolution from
  the decode's generator (seeded alike on every rank, drawn in the decoder's order) and adds its own rows, so the
  video does not depend on the layout; the latent's own noise (``VideoVae.perturb``) is drawn whole before the split.

Nearest and pixel-shuffle upsampling, per-pixel norms, 1x1 convs and activations are row-local and run as they
are. A rank left without rows (more ranks than latent rows allow) decodes a one-row stand-in of its own: it
contributes nothing to any statistic or gather and its output is dropped, so it still takes part in every
collective in the same order.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..models.families.registry import FAMILIES
from ..models.video_vae import DEFAULT_DECODE_SEED, BandLayers, CausalConv, VideoVae
from ..parallel.collectives import all_gather_cat, exchange_halo, group_rank, group_size
from ..parallel.mesh import CommStats
from .bands import RowBands, plan_band_rows


def video_vae_of(vae: nn.Module) -> VideoVae | None:
    """The declaration of the family whose causal 3-D VAE ``vae`` is (None: not such a VAE)."""
    name = type(vae).__name__
    for spec in FAMILIES:
        if spec.video_vae is not None:
            declared = spec.video_vae()
            if declared.vae_class == name:
                return declared
    return None


@dataclasses.dataclass(frozen=True)
class _Band:
    """This rank's place at the latent resolution; ``rows`` is what it decodes (1 for a stand-in)."""

    layout: RowBands
    rows: int
    generator: torch.Generator | None = None  # the decode's random numbers (same seed and draws on every rank)

    def at(self, rows: int) -> RowBands:
        """The layout at the resolution where this rank's tensor has ``rows`` rows."""
        factor = rows // self.rows
        if factor < 1 or factor * self.rows != rows:
            raise RuntimeError(f"a band of {rows} rows is not a multiple of the latent band of {self.rows}")
        return self.layout.scaled(factor)


def _rows_with_halo(x: torch.Tensor, halo: int, layout: RowBands, mode: str) -> torch.Tensor:
    """``x`` [B, C, T, rows, W] with ``halo`` rows of the neighbouring bands above and below; at the clip's
    true border the rows the conv's own padding would add (``mode``: replicate, zeros or reflect; a reflected
    border row may come from the neighbour's halo when this band is thinner than the halo + 1)."""
    pending = exchange_halo(x, halo, layout.up, layout.down, layout.group, layout.stats, dim=3, op="video_vae_halo")
    from_up, from_down = pending.wait()
    if mode == "reflect":
        inner = torch.cat([t for t in (from_up, x, from_down) if t is not None], dim=3)
        if inner.shape[3] > halo:  # else a rank sitting out (its rows are dropped): replicated below
            top = from_up if from_up is not None else inner[:, :, :, 1 : halo + 1].flip(3)
            bottom = from_down if from_down is not None else inner[:, :, :, -halo - 1 : -1].flip(3)
            return torch.cat([top, x, bottom], dim=3)

    def border(edge: torch.Tensor) -> torch.Tensor:
        return (
            edge.expand(*edge.shape[:3], halo, edge.shape[4])
            if mode in ("replicate", "reflect")
            else torch.zeros_like(edge).expand(*edge.shape[:3], halo, edge.shape[4])
        )

    top = from_up if from_up is not None else border(x[:, :, :, :1])
    bottom = from_down if from_down is not None else border(x[:, :, :, -1:])
    return torch.cat([top, x, bottom], dim=3)


def _causal_conv(layer: CausalConv, band: _Band):
    w0, w1, h0, h1, t0, t1 = layer.padding
    if h0 != h1:
        raise ConfigError(
            f"a causal conv padded {h0} rows above and {h1} below",
            "band halos are symmetric",
            "decode this VAE on one device",
        )

    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:  # extra arguments: the family's conv states them
        if h0:
            x = _rows_with_halo(x, h0, band.at(x.shape[3]), layer.mode)
        x = F.pad(x, (w0, w1, 0, 0, t0, t1), mode=layer.mode) if (w0 or w1 or t0 or t1) else x
        return layer.conv(x)

    return forward


def _with_noise(scale: torch.Tensor, forward, band: _Band):
    def add_noise(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        out = forward(x, *args, **kwargs)
        layout = band.at(out.shape[3])
        whole = (sum(layout.rows), out.shape[4])
        drawn = torch.randn(whole, generator=band.generator, device=out.device, dtype=out.dtype)
        rows = drawn.narrow(0, layout.offset if band.layout.local_rows else 0, out.shape[3])  # a stand-in: any rows
        return out + (rows[None] * scale.to(out))[None, :, None, ...]

    return add_noise


def _group_norm(norm: nn.GroupNorm, band: _Band):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return band_group_norm_nd(x, norm, band.at(x.shape[3]), sitting_out=band.layout.local_rows == 0)

    return forward


def band_group_norm_nd(
    x: torch.Tensor, norm: nn.GroupNorm, layout: RowBands, sitting_out: bool = False
) -> torch.Tensor:
    """``norm`` over [B, C, T, rows, W] with statistics of the whole clip (exact: the parallel variance formula
    over every rank's mean and M2, in float32 or wider). A sitting-out rank contributes nothing."""
    batch, channels = x.shape[:2]
    groups = norm.num_groups
    per_group = channels // groups
    per_row = per_group * (x[0, 0].numel() // x.shape[3])  # values of one group in one row (all frames)
    stat_dtype = torch.promote_types(x.dtype, torch.float32)
    grouped = x.reshape(batch, groups, -1).to(stat_dtype)
    if sitting_out or grouped.shape[-1] == 0:
        mean = m2 = torch.zeros(batch, groups, dtype=stat_dtype, device=x.device)
    else:
        var, mean = torch.var_mean(grouped, dim=-1, correction=0)
        m2 = var * grouped.shape[-1]
    every = all_gather_cat(torch.stack([mean, m2])[None], layout.group, layout.stats, dim=0, op="groupnorm")
    counts = torch.tensor([r * per_row for r in layout.rows], dtype=stat_dtype, device=x.device).view(-1, 1, 1)
    total = counts.sum()
    means, m2s = every[:, 0], every[:, 1]
    mean = (counts * means).sum(0) / total
    m2 = (m2s + counts * (means - mean).square()).sum(0)
    rstd = torch.rsqrt(m2 / total + norm.eps)
    out = (grouped - mean[..., None]) * rstd[..., None]
    out = out.reshape(x.shape)
    shape = (1, channels) + (1,) * (x.ndim - 2)
    if norm.weight is not None:
        out = out * norm.weight.to(stat_dtype).view(shape)
    if norm.bias is not None:
        out = out + norm.bias.to(stat_dtype).view(shape)
    return out.to(x.dtype)


def _attend(band: _Band, causal: bool):
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, scale: float | None) -> torch.Tensor:
        """q, k, v [B, C, T, rows, W] of this band -> attention over the pixels of every band (and every frame,
        or the frames up to the query's when ``causal``), [B, C, T, rows, W]."""
        layout = band.at(q.shape[3])
        rows = 0 if band.layout.local_rows == 0 else q.shape[3]
        kv = torch.cat([k, v], dim=1).narrow(3, 0, rows)
        kv = all_gather_cat(
            kv.contiguous(), layout.group, layout.stats, dim=3, sizes=list(layout.rows), op="video_vae_kv"
        )
        k, v = kv.chunk(2, dim=1)
        b, c, t, h, w = q.shape

        def tokens(x: torch.Tensor) -> torch.Tensor:  # [B, heads, T*h*W, C/heads]
            return x.reshape(b, heads, c // heads, -1).transpose(-1, -2)

        mask = None
        if causal:
            frame_q = torch.arange(t, device=q.device).repeat_interleave(h * w)
            frame_k = torch.arange(t, device=q.device).repeat_interleave(k.shape[3] * w)
            mask = frame_q[:, None] >= frame_k[None, :]
        out = F.scaled_dot_product_attention(tokens(q), tokens(k), tokens(v), attn_mask=mask, scale=scale)
        return out.transpose(-1, -2).reshape(b, c, t, h, w)

    return attend


def _attention(module: nn.Module, band_forward, attend):
    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return band_forward(module, x, attend)

    return forward


@contextlib.contextmanager
def band_mode(vae: nn.Module, declared: VideoVae, band: _Band) -> Iterator[None]:
    """While active, the decoder's row-crossing layers compute this rank's band (see the module doc). Their
    ``forward`` is overridden on the instances and restored on exit, also after an error."""
    layers: BandLayers = declared.layers(vae)
    attend = _attend(band, declared.causal_attention(vae))
    patched: list[nn.Module] = []
    removed: list[tuple[nn.Module, str, torch.Tensor]] = []
    try:
        for conv in layers.convs:
            conv.module.forward = _causal_conv(conv, band)
            patched.append(conv.module)
        for norm in layers.group_norms:
            norm.forward = _group_norm(norm, band)
            patched.append(norm)
        for module, band_forward in layers.attentions:
            module.forward = _attention(module, band_forward, attend)
            patched.append(module)
        for noise in layers.noises:
            if band.generator is None:
                raise RuntimeError("a decoder with injected noise decodes with a generator")
            scale = getattr(noise.owner, noise.scale)
            noise.after.forward = _with_noise(scale, noise.after.forward, band)
            setattr(noise.owner, noise.scale, None)  # the owner's own draw (torch's global RNG) is skipped
            removed.append((noise.owner, noise.scale, scale))
        yield
    finally:
        for owner, name, scale in removed:
            setattr(owner, name, scale)
        for module in patched:
            del module.forward  # back to the class's forward


def check_video_latent(vae: nn.Module, declared: VideoVae, z: torch.Tensor) -> torch.Tensor:
    """``z`` as [B, C, T, h, w] (an image latent is one frame); raises for a latent this VAE cannot decode."""
    if vae.training:
        raise ConfigError(
            "the VAE is in training mode",
            "decoding is inference; dropout would make the bands disagree with a single-device decode",
            "call vae.eval() before decoding",
        )
    declared.layers(vae)  # raises for a decoder the bands cannot reproduce
    if z.dim() == 4:
        z = z.unsqueeze(2)
    channels = declared.latent_channels(vae)
    if z.dim() != 5 or z.shape[1] != channels or min(z.shape[2:]) < 1:
        raise ConfigError(
            f"latent of shape {tuple(z.shape)} does not fit this {type(vae).__name__}",
            f"it decodes video latents [batch, {channels}, frames, height, width]",
            f"pass the LATENT of a model with {channels} latent channels made for this VAE",
        )
    return z


def decode_video_band(
    vae: nn.Module,
    declared: VideoVae,
    z: torch.Tensor,
    group: dist.ProcessGroup | None,
    stats: CommStats,
    min_rows: int,
    dtype: torch.dtype,
    seed: int = DEFAULT_DECODE_SEED,
) -> tuple[torch.Tensor, RowBands]:
    """This rank's band of the decoded clip [B, 3, frames, rows, W] (-1..1) and every rank's rows at video
    resolution. Every rank of ``group`` calls it with the same ``z`` [B, C, T, h, w] (in the VAE's space) and
    ``seed``: a random decode (LTX-Video 0.9.1+) draws from a generator on ``z``'s device seeded with it, the whole
    latent's noise first and then each injected noise of the whole picture, as the decoder runs."""
    rows = plan_band_rows(z.shape[3], group_size(group), max(1, min_rows))
    layout = RowBands(rows=rows, rank=group_rank(group), group=group, stats=stats)
    sitting_out = layout.local_rows == 0
    random = declared.perturb is not None or bool(declared.layers(vae).noises)
    generator = torch.Generator(device=z.device).manual_seed(seed) if random else None
    z = z.to(dtype)
    if declared.perturb is not None:
        z = declared.perturb(vae, z, generator)
    z_band = torch.zeros_like(z.narrow(3, 0, 1)) if sitting_out else z.narrow(3, layout.offset, layout.local_rows)
    band = _Band(layout, 1 if sitting_out else layout.local_rows, generator)
    with torch.no_grad(), band_mode(vae, declared, band):
        sample = declared.decode(vae, z_band)
    factor = declared.spatial_factor(vae)
    if sitting_out:
        sample = sample.narrow(3, 0, 0)
    return sample, layout.scaled(factor)
