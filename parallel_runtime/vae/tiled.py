"""APPROXIMATE tiled VAE decode on one device, for when even one band does not fit in memory.

Not exact: each tile is decoded on its own, so its GroupNorm statistics and its mid-block
attention only see that tile, and its borders are zero padded. Overlapping tiles are blended
with linear ramps to hide the seams. The error is small for real VAEs with enough overlap but it
is NOT ``vae.decode(z)``; the exact multi-rank decode is :func:`parallel_runtime.vae.decode_latent`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from ..parallel.mesh import CommStats
from .bands import BandLayout
from .decode import compute_dtype
from .decoder import check_decoder, decode_band


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Start offsets of tiles of size ``tile`` (stride ``tile - overlap``) covering ``length``."""
    if length <= tile:
        return [0]
    stride = tile - overlap
    starts = list(range(0, length - tile, stride))
    return [*starts, length - tile]


def _ramp(size: int, fade: int, at_start: bool, at_end: bool, like: torch.Tensor) -> torch.Tensor:
    """Blend weight along one axis: rises over ``fade`` pixels at inner edges, 1 at image borders."""
    pos = torch.arange(size, dtype=torch.float32, device=like.device) + 0.5
    weight = torch.ones(size, dtype=torch.float32, device=like.device)
    if fade > 0 and not at_start:
        weight = torch.minimum(weight, pos / fade)
    if fade > 0 and not at_end:
        weight = torch.minimum(weight, (size - pos) / fade)
    return weight


def tiled_decode_single(
    vae: nn.Module, z: torch.Tensor, tile: int = 64, overlap: int = 16, upcast: bool | None = None
) -> torch.Tensor:
    """APPROXIMATE decode of ``z`` [B, C, h, w] in overlapping ``tile`` x ``tile`` latent tiles
    (``overlap`` latent rows/columns shared by neighbours), blended linearly; one device.

    Peak memory: one tile's activations plus the output image and a weight map. Returns
    [B, 3, H, W] in -1..1 like ``vae.decode(z).sample``, to which it is close but not equal."""
    if tile < 1 or not 0 <= overlap < tile:
        raise ConfigError(
            f"tile={tile}, overlap={overlap}",
            "tiles must hold at least one latent row and overlap by less than a whole tile",
            "use e.g. tile=64, overlap=16 (latent pixels)",
        )
    check_decoder(vae)
    dtype = compute_dtype(vae, upcast)
    z = z.to(device=next(vae.parameters()).device, dtype=dtype)
    height, width = z.shape[-2:]
    rows, cols = tile_starts(height, tile, overlap), tile_starts(width, tile, overlap)
    out = weight_sum = None
    factor = 1
    with torch.no_grad():
        for top in rows:
            for left in cols:
                piece = z[:, :, top : top + tile, left : left + tile]
                layout = BandLayout(rows=(piece.shape[2],), rank=0, group=None, stats=CommStats())
                decoded = decode_band(vae, piece, layout)
                if out is None:
                    factor = decoded.shape[-1] // piece.shape[-1]
                    out = decoded.new_zeros(z.shape[0], decoded.shape[1], height * factor, width * factor)
                    weight_sum = torch.zeros(height * factor, width * factor, dtype=torch.float32, device=z.device)
                th, tw = decoded.shape[-2:]
                wy = _ramp(th, overlap * factor, top == 0, top + tile >= height, decoded)
                wx = _ramp(tw, overlap * factor, left == 0, left + tile >= width, decoded)
                weight = wy[:, None] * wx[None, :]
                y, x = top * factor, left * factor
                out[:, :, y : y + th, x : x + tw] += decoded * weight.to(decoded.dtype)
                weight_sum[y : y + th, x : x + tw] += weight
    return out / weight_sum.to(out.dtype)
