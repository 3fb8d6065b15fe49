"""Exact parallel VAE decode: the ranks of a group each decode a row band of the latent.

Every 3x3 conv swaps one halo row with the neighbouring bands, every GroupNorm uses statistics of
the whole image, and the mid-block attention gathers keys/values from all bands, so the result
equals ``vae.decode(z).sample`` on one device to float tolerance. A rank only ever holds its own
band (plus halos, plus the mid-block K/V at the lowest resolution); the full image is assembled
on ``result_rank`` alone unless ``result_rank="all"``.

The caller passes the latent in the VAE's own space (``z = latent / scaling_factor + shift_factor``,
as diffusers' pipelines do before ``vae.decode``); every rank of the group passes the same ``z``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError
from ..models.video_vae import DEFAULT_DECODE_SEED
from ..parallel.collectives import all_gather_cat, gather_to, group_rank, group_size
from ..parallel.mesh import ParallelMesh
from .bands import DEFAULT_MIN_BAND_ROWS, RowBands, plan_band_rows
from .causal3d import check_video_latent, decode_video_band, video_vae_of
from .decoder import check_decoder, decode_band
from .wan import check_wan_latent, decode_wan_latent_band, is_wan_vae

ResultRank = int | Literal["all"]


@dataclasses.dataclass(frozen=True)
class DecodedBand:
    """This rank's rows of the decoded image: ``sample`` is [B, 3, rows, W] (may have 0 rows);
    ``layout`` gives every rank's rows at image resolution (``layout.offset`` is where ours start)."""

    sample: torch.Tensor
    layout: RowBands


def compute_dtype(vae: nn.Module, upcast: bool | None = None) -> torch.dtype:
    """The dtype the decode runs in: float32 for a float16 VAE whose config asks for
    ``force_upcast`` (as diffusers' pipelines do), else the VAE's own dtype. ``upcast`` overrides."""
    dtype = next(vae.parameters()).dtype
    if upcast is None:
        config = getattr(vae, "config", None)
        upcast = dtype == torch.float16 and bool(getattr(config, "force_upcast", False))
    return torch.float32 if upcast and dtype in (torch.float16, torch.bfloat16) else dtype


def _resolve_group(mesh: ParallelMesh, group_dim: str | dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    if group_dim is None or isinstance(group_dim, dist.ProcessGroup):
        return group_dim
    try:
        return mesh.group(group_dim)
    except KeyError:
        raise ConfigError(
            f"unknown mesh dimension {group_dim!r} for the VAE decode",
            "the latent rows are split over the ranks of one process group, named by a mesh dimension",
            "use group_dim='sp' (ring x ulysses), a name among cfg, pp, ring, ulysses, or pass a ProcessGroup",
        ) from None


def _check_latent(vae: nn.Module, z: torch.Tensor) -> None:
    channels = vae.decoder.conv_in.in_channels
    if getattr(vae, "post_quant_conv", None) is not None:
        channels = vae.post_quant_conv.in_channels
    if z.dim() != 4 or z.shape[1] != channels or z.shape[2] < 1 or z.shape[3] < 1:
        raise ConfigError(
            f"latent of shape {tuple(z.shape)} does not fit this VAE",
            f"the decoder expects a non-empty [batch, {channels}, height, width] latent",
            f"pass a 4-D latent with {channels} channels (a video latent must be decoded frame by frame)",
        )


def _agree_on_shape(z: torch.Tensor, min_rows: int, group: dist.ProcessGroup | None, mesh: ParallelMesh) -> None:
    """All ranks must split the same latent the same way, or their collectives would not match."""
    if group_size(group) == 1:
        return
    mine = torch.tensor([[*z.shape, min_rows]], dtype=torch.int64, device=z.device)
    every = all_gather_cat(mine, group, mesh.stats, dim=0, op="vae_check")
    if not bool((every == mine).all()):
        raise ConfigError(
            f"ranks disagree on the latent to decode: shapes + min_band_rows per rank {every.tolist()}",
            "every rank of the group decodes one band of the same latent with the same split",
            "pass the same latent (and the same min_band_rows) to decode_latent on every rank of the group",
        )


def decode_latent_band(
    vae: nn.Module,
    z: torch.Tensor,
    mesh: ParallelMesh,
    group_dim: str | dist.ProcessGroup | None = "sp",
    *,
    min_band_rows: int | None = None,
    upcast: bool | None = None,
    seed: int = DEFAULT_DECODE_SEED,
) -> DecodedBand:
    """Decode this rank's row band of ``z`` [B, C, h, w] (a Wan VAE or a family's causal 3-D VAE:
    [B, C, T, h, w]) and return it without gathering.

    Every rank of the group must call this with the same ``z``. The latent rows are split with
    :func:`~parallel_runtime.parallel.sharding.split_sizes` over as many ranks as can each take
    ``min_band_rows`` rows (default 2, never below what the convs' halos need); the other ranks
    get a 0-row band and only take part in the collectives. ``seed`` seeds a random decode (LTX-Video 0.9.1+'s
    decode noise; the same on every rank, see ``vae.causal3d``); other VAEs ignore it."""
    group = _resolve_group(mesh, group_dim)
    declared = video_vae_of(vae)
    if declared is not None:  # a causal 3-D VAE decoded whole (vae.causal3d), its layers stated by its family
        min_rows = DEFAULT_MIN_BAND_ROWS if min_band_rows is None else min_band_rows
        z = check_video_latent(vae, declared, z).to(next(vae.parameters()).device)
        _agree_on_shape(z, min_rows, group, mesh)
        dtype = compute_dtype(vae, upcast)
        sample, layout = decode_video_band(vae, declared, z, group, mesh.stats, min_rows, dtype, seed)
        return DecodedBand(sample, layout)
    if is_wan_vae(vae):  # Wan / Qwen-Image latents [B, C, T, h, w]: diffusers' own frame loop per band (vae.wan)
        min_rows = DEFAULT_MIN_BAND_ROWS if min_band_rows is None else min_band_rows
        z = check_wan_latent(vae, z).to(next(vae.parameters()).device)
        _agree_on_shape(z, min_rows, group, mesh)
        sample, layout = decode_wan_latent_band(vae, z, group, mesh.stats, min_rows, compute_dtype(vae, upcast))
        return DecodedBand(sample, layout)
    need = check_decoder(vae)
    _check_latent(vae, z)
    if min_band_rows is not None and min_band_rows < need:
        raise ConfigError(
            f"min_band_rows={min_band_rows} is below the {need} latent row(s) this VAE's convolutions need",
            "each conv takes its halo rows from one neighbouring band, so a band must be at least that tall",
            f"use min_band_rows >= {need}, or leave it unset",
        )
    min_rows = max(need, DEFAULT_MIN_BAND_ROWS if min_band_rows is None else min_band_rows)
    param = next(vae.parameters())
    dtype = compute_dtype(vae, upcast)
    z = z.to(device=param.device)
    _agree_on_shape(z, min_rows, group, mesh)
    rows = plan_band_rows(z.shape[2], group_size(group), min_rows)
    layout = RowBands(rows=rows, rank=group_rank(group), group=group, stats=mesh.stats)
    z_band = z.narrow(2, layout.offset, layout.local_rows).to(dtype)
    with torch.no_grad():
        sample = decode_band(vae, z_band, layout)
    factor = sample.shape[-1] // z.shape[-1]
    return DecodedBand(sample, layout.scaled(factor))


def _assemble(band: torch.Tensor, layout: RowBands, dim: int, result_rank: ResultRank, op: str) -> torch.Tensor | None:
    """Concatenate the bands along ``dim`` on ``result_rank`` (a group rank) or on every rank ("all")."""
    if result_rank == "all":
        return all_gather_cat(band, layout.group, layout.stats, dim=dim, sizes=list(layout.rows), op=op)
    return gather_to(band, result_rank, layout.rows, layout.group, layout.stats, dim=dim, op=op)


def _check_result_rank(result_rank: ResultRank, mesh: ParallelMesh, group_dim) -> None:
    n = group_size(_resolve_group(mesh, group_dim))
    if result_rank != "all" and (not isinstance(result_rank, int) or not 0 <= result_rank < n):
        raise ConfigError(
            f"result_rank={result_rank!r} is not a rank of the decode group (size {n})",
            "the decoded image is assembled on one rank of the group, or on all of them",
            f'pass a group rank between 0 and {n - 1}, or "all"',
        )


def decode_latent(
    vae: nn.Module,
    z: torch.Tensor,
    mesh: ParallelMesh,
    group_dim: str | dist.ProcessGroup | None = "sp",
    *,
    result_rank: ResultRank = 0,
    min_band_rows: int | None = None,
    upcast: bool | None = None,
    seed: int = DEFAULT_DECODE_SEED,
) -> torch.Tensor | None:
    """Decode ``z`` [B, C, h, w] across the ranks of ``group_dim`` to an image [B, 3, H, W] in -1..1
    (diffusers' ``vae.decode(z).sample`` convention, equal to it to float tolerance).

    ``result_rank`` is a rank of the group (the rank index within it); only that rank gets the
    image, the others return None. ``"all"`` assembles it on every rank (costs memory)."""
    _check_result_rank(result_rank, mesh, group_dim)
    decoded = decode_latent_band(vae, z, mesh, group_dim, min_band_rows=min_band_rows, upcast=upcast, seed=seed)
    return _assemble(decoded.sample, decoded.layout, decoded.sample.ndim - 2, result_rank, "vae_gather")


def band_to_image(sample: torch.Tensor) -> torch.Tensor:
    """A decoded [B, 3, rows, W] tensor in -1..1 as ComfyUI IMAGE rows [B, rows, W, 3] float32 in 0..1; a
    decoded video [B, 3, T, rows, W] as IMAGE frames [B*T, rows, W, 3] (ComfyUI's VAEDecode of a video)."""
    image = (sample.float() / 2 + 0.5).clamp(0, 1).movedim(1, -1)
    return image.flatten(0, image.ndim - 4).contiguous()


def decode_to_image_tensor(
    vae: nn.Module,
    z: torch.Tensor,
    mesh: ParallelMesh,
    group_dim: str | dist.ProcessGroup | None = "sp",
    *,
    result_rank: ResultRank = 0,
    min_band_rows: int | None = None,
    upcast: bool | None = None,
    seed: int = DEFAULT_DECODE_SEED,
) -> torch.Tensor | None:
    """Like :func:`decode_latent` but returns ComfyUI's IMAGE: [B, H, W, 3] float32 in 0..1 ([B*T, H, W, 3]
    frames for a video), on the VAE's device, on ``result_rank`` only (None elsewhere). Each band is converted before the
    gather, so the ranks send finished pixels."""
    _check_result_rank(result_rank, mesh, group_dim)
    decoded = decode_latent_band(vae, z, mesh, group_dim, min_band_rows=min_band_rows, upcast=upcast, seed=seed)
    return _assemble(band_to_image(decoded.sample), decoded.layout, 1, result_rank, "vae_gather")
