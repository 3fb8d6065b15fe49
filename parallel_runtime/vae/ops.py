"""Band-aware layers for the parallel VAE decode: each rank holds a row band [B, C, rows, W].

Every op gives exactly the rows of the whole-image op that fall in this rank's band:
- :func:`band_conv2d`: halo rows from the neighbouring bands, zero padding at the true borders;
- :func:`band_group_norm`: statistics over the whole image (per-rank mean and M2 combined);
- :func:`band_upsample_nearest2x`: nearest 2x, which is local to a band (every band doubles);
- :func:`band_attention`: local queries attend to the keys/values of every band.
A rank whose band has 0 rows still joins each collective (with empty contributions).
The ops read the weights of the given torch / diffusers modules and cast them to the band's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..parallel.collectives import all_gather_cat, exchange_halo
from .bands import RowBands


def _param(p: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    return None if p is None else p.to(dtype=like.dtype, device=like.device)


def band_linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer`` applied with its weights cast to ``x``'s dtype (pointwise over tokens: no exchange)."""
    return F.linear(x, _param(layer.weight, x), _param(layer.bias, x))


def band_conv2d(x: torch.Tensor, conv: nn.Conv2d, layout: RowBands) -> torch.Tensor:
    """A stride-1 ``conv`` on this rank's band, equal to those rows of the whole-image conv.

    Its row padding ``ph`` is taken from the neighbours' edge rows (zeros at the image's top and
    bottom). The halos travel while the band's interior is convolved; then the first and last
    ``ph`` output rows are recomputed from small strips that include the halos, so no padded copy
    of the whole band is made."""
    weight, bias = _param(conv.weight, x), _param(conv.bias, x)
    ph, pw = conv.padding
    batch, _, rows, width = x.shape
    if rows == 0:
        out_width = width + 2 * pw - weight.shape[-1] + 1
        return x.new_empty(batch, weight.shape[0], 0, out_width)
    if ph == 0:
        return F.conv2d(x, weight, bias, padding=(0, pw))
    pending = exchange_halo(x, ph, layout.up, layout.down, layout.group, layout.stats)
    if rows >= 2 * ph:
        out = F.conv2d(x, weight, bias, padding=(ph, pw))
        from_up, from_down = pending.wait()
        if from_up is not None:
            strip = torch.cat([from_up, x[:, :, : 2 * ph]], dim=2)
            out[:, :, :ph] = F.conv2d(strip, weight, bias, padding=(0, pw))
        if from_down is not None:
            strip = torch.cat([x[:, :, rows - 2 * ph :], from_down], dim=2)
            out[:, :, rows - ph :] = F.conv2d(strip, weight, bias, padding=(0, pw))
        return out
    # A band thinner than two halos: pad it whole (cheap, it is thin).
    from_up, from_down = pending.wait()
    zeros = x.new_zeros(batch, x.shape[1], ph, width)
    padded = torch.cat([zeros if from_up is None else from_up, x, zeros if from_down is None else from_down], dim=2)
    return F.conv2d(padded, weight, bias, padding=(0, pw))


def band_group_norm(x: torch.Tensor, norm: nn.GroupNorm, layout: RowBands) -> torch.Tensor:
    """``norm`` with statistics of the whole image, applied to this rank's band.

    Each rank computes, per (sample, group), the mean and the sum of squared deviations (M2) of
    its band in float32 (at least); the ranks exchange these and combine them with the parallel
    variance formula (Chan et al.), which stays accurate when the mean is large next to the
    spread (unlike E[x^2] - E[x]^2). The result is cast back to ``x``'s dtype."""
    batch, channels, rows, width = x.shape
    groups = norm.num_groups
    per_group = channels // groups
    stat_dtype = torch.promote_types(x.dtype, torch.float32)
    grouped = x.reshape(batch, groups, per_group * rows * width).to(stat_dtype)
    if rows > 0:
        var, mean = torch.var_mean(grouped, dim=-1, correction=0)
        m2 = var * grouped.shape[-1]
    else:
        mean = m2 = torch.zeros(batch, groups, dtype=stat_dtype, device=x.device)
    local = torch.stack([mean, m2])[None]  # [1, 2, B, G]
    every = all_gather_cat(local, layout.group, layout.stats, dim=0, op="groupnorm")  # [ranks, 2, B, G]
    counts = torch.tensor([r * width * per_group for r in layout.rows], dtype=stat_dtype, device=x.device)
    counts = counts.view(-1, 1, 1)
    total = counts.sum()
    means, m2s = every[:, 0], every[:, 1]
    mean = (counts * means).sum(0) / total
    m2 = (m2s + counts * (means - mean).square()).sum(0)
    rstd = torch.rsqrt(m2 / total + norm.eps)  # [B, G]
    scale = rstd.repeat_interleave(per_group, dim=1)  # [B, C]
    if norm.weight is not None:
        scale = scale * norm.weight.to(stat_dtype)
    out = grouped.view(batch, channels, rows, width) - mean.repeat_interleave(per_group, dim=1)[:, :, None, None]
    out.mul_(scale[:, :, None, None])
    if norm.bias is not None:
        out.add_(norm.bias.to(stat_dtype)[None, :, None, None])
    return out.to(x.dtype)


def band_upsample_nearest2x(x: torch.Tensor, layout: RowBands) -> tuple[torch.Tensor, RowBands]:
    """Nearest-neighbour 2x upsampling. Each output row copies one input row of the same band,
    so it needs no exchange; the returned layout has every band twice as tall."""
    batch, channels, rows, width = x.shape
    if rows == 0:
        return x.new_empty(batch, channels, 0, 2 * width), layout.scaled(2)
    return F.interpolate(x, scale_factor=2.0, mode="nearest"), layout.scaled(2)


def band_attention(x: torch.Tensor, attn: nn.Module, layout: RowBands) -> torch.Tensor:
    """The VAE mid-block self-attention (a diffusers ``Attention`` over the pixels as tokens).

    Queries come from this band only; keys and values of every band are gathered (one
    all-gather of [K | V]), so each rank holds the full K/V of this low-resolution feature map
    but only its own rows of queries and outputs."""
    batch, channels, rows, width = x.shape
    hidden = x if attn.group_norm is None else band_group_norm(x, attn.group_norm, layout)
    tokens = hidden.flatten(2).transpose(1, 2)  # [B, rows*W, C]
    query = band_linear(tokens, attn.to_q)
    key_value = torch.cat([band_linear(tokens, attn.to_k), band_linear(tokens, attn.to_v)], dim=-1)
    key_value = all_gather_cat(
        key_value, layout.group, layout.stats, dim=1, sizes=[r * width for r in layout.rows], op="vae_attn_kv"
    )
    inner = query.shape[-1]
    heads = attn.heads
    head_dim = inner // heads
    key, value = key_value.split(inner, dim=-1)
    if rows == 0:
        return x.clone()

    def by_head(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, -1, heads, head_dim).transpose(1, 2)

    out = F.scaled_dot_product_attention(by_head(query), by_head(key), by_head(value), scale=attn.scale)
    out = out.transpose(1, 2).reshape(batch, -1, inner)
    out = band_linear(out, attn.to_out[0])
    out = out.transpose(1, 2).reshape(batch, channels, rows, width)
    if attn.residual_connection:
        out = out + x
    return out / attn.rescale_output_factor
