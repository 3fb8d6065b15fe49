"""Exact parallel decode of Wan-style causal VAE latents: diffusers ``AutoencoderKLWan`` (Wan 2.1 and 2.2
videos) and ``AutoencoderKLQwenImage`` (Qwen-Image: the same decoder under its own class names; an image is
one frame).

Each rank decodes a band of latent rows of every frame. The Wan decoder has no GroupNorm (its RMS norm
normalises each pixel over the channels), so only two kinds of layer look beyond a pixel's own rows:
spatial kernels (3x3x3 causal convs, the resamplers' 3x3 convs: one halo row) and the mid-block attention
(all pixels of a frame). Everything else (RMS norm, SiLU, 1x1 and temporal-only convs, nearest x2,
DupUp3D, unpatchify, clamp) is row-local.

So each rank runs diffusers' OWN decode loop on its band (frame by frame, with the causal feature cache,
the "Rep" first upsampling, first_chunk, unpatchify and clamp), while :func:`band_mode` swaps, for the
duration of the call only, the forward of those row-crossing layers for band versions:

- causal conv: the conv input is ``cat(cache, x)`` along time (the cache holds this band's rows of the
  previous frames, kept by diffusers' loop); its halo rows, for every frame of that input, come from the
  neighbouring bands in one exchange (zeros at the true borders); then causal time padding and a conv
  without row padding. Time is never split, so the band-local cache is exact;
- resampler Conv2d: the existing :func:`~.ops.band_conv2d`;
- mid-block attention: per frame, queries of this band against the K/V of all bands (one all-gather).

Ranks with a 0-row band (more ranks than latent rows) skip the decoder and only join the attention
gathers, with empty contributions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..models import compat
from ..parallel.collectives import all_gather_cat, exchange_halo, group_rank, group_size
from ..parallel.mesh import CommStats
from .bands import RowBands, plan_band_rows
from .ops import band_conv2d

_FIX = (
    "decode this VAE on one device (vae.decode), or use a diffusers AutoencoderKLWan (Wan 2.1 or 2.2 VAE) "
    "or AutoencoderKLQwenImage"
)


def is_wan_vae(vae: nn.Module) -> bool:
    """A Wan-style causal VAE this module decodes in bands: AutoencoderKLWan or AutoencoderKLQwenImage."""
    from diffusers import AutoencoderKLQwenImage, AutoencoderKLWan

    return isinstance(vae, (AutoencoderKLWan, AutoencoderKLQwenImage))


def _unsupported(where: str, what: str) -> ConfigError:
    return ConfigError(
        f"the parallel Wan VAE decode cannot split {where}: {what}",
        "each rank decodes a band of rows; that is exact for causal convs with 'same' spatial padding, the "
        "resamplers, per-pixel norms and the mid-block attention, and these layers are swapped for band versions",
        _FIX,
    )


def _layers(vae: nn.Module) -> tuple[list[nn.Module], list[nn.Conv2d], list[nn.Module]]:
    """(spatial causal convs, resampler 3x3 convs, attention blocks) of the decoder; raises for layers a band
    decode would get wrong."""
    causal_convs, attention_blocks = compat.causal_vae_layer_classes()
    causal, conv2d, attention = [], [], []
    for name, module in vae.decoder.named_modules():
        where = f"decoder.{name}"
        if isinstance(module, causal_convs):
            kt, kh, kw = module.kernel_size
            ph, pw = module._padding[2], module._padding[0]
            if module.stride != (1, 1, 1) or module.dilation != (1, 1, 1):
                raise _unsupported(where, f"stride {module.stride} / dilation {module.dilation}")
            if kh != 2 * ph + 1 or kw != 2 * pw + 1:
                raise _unsupported(where, f"kernel {module.kernel_size} with spatial padding ({ph}, {pw})")
            if ph:
                causal.append(module)
        elif isinstance(module, attention_blocks):
            attention.append(module)
        elif isinstance(module, nn.Conv2d):
            if module.stride != (1, 1) or module.kernel_size[0] != 2 * module.padding[0] + 1:
                raise _unsupported(where, f"Conv2d kernel {module.kernel_size}, stride {module.stride}")
            if module.padding[0]:
                conv2d.append(module)
        elif isinstance(module, (nn.GroupNorm, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm)):
            raise _unsupported(where, f"{type(module).__name__} normalises over pixels")
        elif isinstance(module, (nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
            raise _unsupported(where, f"{type(module).__name__}")
    return causal, conv2d, attention


def check_wan_decoder(vae: nn.Module) -> None:
    """Raise ConfigError unless ``vae`` is a Wan-style VAE whose decoder the band decode reproduces."""
    if not is_wan_vae(vae):
        raise ConfigError(
            f"{type(vae).__name__} is not a Wan-style VAE", "this decode walks AutoencoderKLWan's decoder", _FIX
        )
    if vae.training:
        raise ConfigError(
            "the VAE is in training mode",
            "decoding is inference; dropout would make the bands disagree with a single-device decode",
            "call vae.eval() before decoding",
        )
    _layers(vae)


def _at(layout: RowBands, rows: int) -> RowBands:
    """``layout`` at the resolution where this (active) rank's band has ``rows`` rows."""
    factor = rows // layout.local_rows
    if factor < 1 or factor * layout.local_rows != rows:
        raise RuntimeError(f"band of {rows} rows is not a multiple of the latent band of {layout.local_rows}")
    return layout.scaled(factor)


def _with_row_halo(x: torch.Tensor, halo: int, layout: RowBands) -> torch.Tensor:
    """``x`` [B, C, T, rows, W] with ``halo`` rows of the neighbouring bands above and below (zeros at
    the image border)."""
    pending = exchange_halo(x, halo, layout.up, layout.down, layout.group, layout.stats, dim=3, op="wan_vae_halo")
    from_up, from_down = pending.wait()
    zeros = x.new_zeros(*x.shape[:3], halo, x.shape[4])
    return torch.cat([zeros if from_up is None else from_up, x, zeros if from_down is None else from_down], dim=3)


def _causal_conv(conv: nn.Module, layout: RowBands):
    def forward(x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
        padding = list(conv._padding)  # (w, w, h, h, 2*t, 0) as F.pad takes it
        if cache_x is not None and padding[4] > 0:
            x = torch.cat([cache_x.to(x.device), x], dim=2)
            padding[4] -= cache_x.shape[2]
        x = _with_row_halo(x, padding[2], _at(layout, x.shape[3]))
        padding[2] = padding[3] = 0
        return nn.Conv3d.forward(conv, F.pad(x, padding))

    return forward


def _conv2d(conv: nn.Conv2d, layout: RowBands):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return band_conv2d(x, conv, _at(layout, x.shape[-2]))

    return forward


def _gather_kv(k: torch.Tensor, v: torch.Tensor, layout: RowBands, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [N, 1, tokens, C] of every band, in band order."""
    kv = torch.cat([k, v], dim=-1)
    kv = all_gather_cat(kv, layout.group, layout.stats, dim=2, sizes=[r * width for r in layout.rows], op="wan_vae_kv")
    return kv.split(k.shape[-1], dim=-1)


def _attention(block: nn.Module, layout: RowBands):
    """diffusers' WanAttentionBlock / QwenImageAttentionBlock (single head over the pixels of each frame) with
    gathered K/V."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        identity = x
        b, c, t, h, w = x.shape
        band = _at(layout, h)
        x = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        qkv = block.to_qkv(block.norm(x)).reshape(b * t, 1, c * 3, -1).permute(0, 1, 3, 2)
        q, k, v = qkv.contiguous().chunk(3, dim=-1)
        k, v = _gather_kv(k, v, band, w)
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)
        x = block.proj(x).view(b, t, c, h, w).permute(0, 2, 1, 3, 4)
        return x + identity

    return forward


@contextlib.contextmanager
def band_mode(vae: nn.Module, layout: RowBands) -> Iterator[None]:
    """While active, the decoder's row-crossing layers compute this rank's band (see the module doc).

    The layers' ``forward`` is overridden on the instances and restored on exit, also after an error."""
    causal, conv2d, attention = _layers(vae)
    patched: list[nn.Module] = []
    try:
        for module in causal:
            module.forward = _causal_conv(module, layout)
            patched.append(module)
        for module in conv2d:
            module.forward = _conv2d(module, layout)
            patched.append(module)
        for module in attention:
            module.forward = _attention(module, layout)
            patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward  # back to the class's forward


def _sit_out(vae: nn.Module, z_band: torch.Tensor, layout: RowBands) -> None:
    """A rank without rows joins every K/V gather of the mid-block attention (one per latent frame and
    attention block) with nothing to add."""
    _, _, attention = _layers(vae)
    channels = [block.to_qkv.in_channels for block in attention]
    width = z_band.shape[-1]
    dtype = next(vae.parameters()).dtype
    for _ in range(z_band.shape[2]):
        for c in channels:
            empty = torch.empty(z_band.shape[0], 1, 0, c, dtype=dtype, device=z_band.device)
            _gather_kv(empty, empty, layout, width)


def decode_wan_band(vae: nn.Module, z_band: torch.Tensor, layout: RowBands) -> torch.Tensor:
    """Decode this rank's latent rows ``z_band`` [B, C, T, rows, w] (in the VAE's own space, as
    ``vae.decode`` takes it) to its band of the video [B, 3, 1 + 4(T-1), rows * f, w * f] in -1..1.
    Every rank of ``layout.group`` calls this together; a 0-row band returns a 0-row tensor."""
    factor, frames = spatial_factor(vae), output_frames(z_band.shape[2])
    if layout.local_rows == 0:
        _sit_out(vae, z_band, layout)
        b, _, _, _, w = z_band.shape
        config = vae.config  # AutoencoderKLQwenImage names its image channels input_channels, without a patch
        image_channels = getattr(config, "out_channels", None) or config.input_channels
        out_channels = image_channels // ((getattr(config, "patch_size", None) or 1) ** 2)
        return z_band.new_empty(b, out_channels, frames, 0, w * factor)
    if vae.use_tiling:
        raise ConfigError(
            f"tiled decoding is enabled on this {type(vae).__name__}",
            "the parallel decode splits rows itself; diffusers' tiles would blend across the bands",
            "call vae.disable_tiling() before the parallel decode",
        )
    with band_mode(vae, layout):
        return vae.decode(z_band).sample


def check_wan_latent(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """``z`` as [B, z_dim, T, h, w] (an image latent [B, z_dim, h, w] is one frame, as ComfyUI reads it)."""
    check_wan_decoder(vae)
    if z.dim() == 4:
        z = z.unsqueeze(2)
    channels = vae.config.z_dim
    if z.dim() != 5 or z.shape[1] != channels or min(z.shape[2:]) < 1:
        raise ConfigError(
            f"latent of shape {tuple(z.shape)} does not fit this {type(vae).__name__}",
            f"it decodes video latents [batch, {channels}, frames, height, width] (an image: one frame)",
            f"pass the LATENT of a model with {channels} channels (Wan 2.1 / Qwen-Image: 16, Wan 2.2 TI2V-5B: 48)",
        )
    return z


def decode_wan_latent_band(
    vae: nn.Module,
    z: torch.Tensor,
    group: dist.ProcessGroup | None,
    stats: CommStats,
    min_rows: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, RowBands]:
    """This rank's band of the decoded video [B, 3, frames, rows, W] and every rank's rows at video
    resolution. Every rank of ``group`` calls it with the same ``z`` [B, C, T, h, w]."""
    rows = plan_band_rows(z.shape[3], group_size(group), max(1, min_rows))
    layout = RowBands(rows=rows, rank=group_rank(group), group=group, stats=stats)
    z_band = z.narrow(3, layout.offset, layout.local_rows).to(dtype)
    with torch.no_grad():
        sample = decode_wan_band(vae, z_band, layout)
    return sample, layout.scaled(spatial_factor(vae))


def output_frames(latent_frames: int) -> int:
    """Video frames a Wan VAE makes from ``latent_frames`` latent frames (4x temporal, causal first frame)."""
    return 1 + 4 * (latent_frames - 1)


def spatial_factor(vae: nn.Module) -> int:
    """Pixels per latent pixel along each side (8 for Wan 2.1's and Qwen-Image's VAE, 16 for Wan 2.2's)."""
    return int(
        getattr(vae, "spatial_compression_ratio", None) or getattr(vae.config, "scale_factor_spatial", None) or 8
    )
