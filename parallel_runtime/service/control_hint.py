"""A ControlNet hint image made into the latent the ControlNet reads, as ComfyUI 0.3.64 prepares it at
sampling time: the image is cropped to the latent's aspect ratio about its centre, resized (nearest-exact)
to the latent's size times the VAE's downscale, encoded with the VAE given to the apply node, and put in
the ControlNet's model space (its latent format). A ControlNet that reads the image itself (XLabs) takes the
cropped and resized image, at its multiple of the latent's size."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError


def fit_to(image: Any, width: int, height: int, mode: str = "nearest-exact") -> Any:
    """``image`` [B, C, H, W] cropped symmetrically to the aspect ratio ``width / height`` (the longer side
    loses ``round(excess / 2)`` on each end) and resized to ``height x width`` (nearest-exact sampling, or
    ``mode="area"``: each output pixel the mean of the input pixels it covers)."""
    import torch.nn.functional as F

    h, w = image.shape[-2:]
    have, want = w / h, width / height
    cut_w = round((w - w * (want / have)) / 2) if have > want else 0
    cut_h = round((h - h * (have / want)) / 2) if have < want else 0
    kept = image[..., cut_h : h - cut_h, cut_w : w - cut_w]
    return F.interpolate(kept, size=(height, width), mode=mode)


def _check_image(image: Any) -> None:
    import torch

    if not isinstance(image, torch.Tensor) or image.ndim != 4:
        raise ConfigError(
            f"a ControlNet hint of {type(image).__name__} {tuple(getattr(image, 'shape', ()))}",
            "the hint is an IMAGE, which the apply node hands on as [batch, channels, height, width]",
            "connect an IMAGE to Apply ControlNet",
        )


def encode_hint(
    image: Any, vae: Any, latent_shape: tuple[int, ...], hint_format: Any, resize: str = "nearest-exact"
) -> Any:
    """The hint latent [B, C, h, w] in model space for a latent of ``latent_shape`` ([B, C, h, w]); ``resize``:
    how the image is scaled to the VAE's multiple of the latent (a DiffSynth model patch scales by area)."""
    import torch

    _check_image(image)
    factor = int(vae.spacial_compression_encode()) if hasattr(vae, "spacial_compression_encode") else 8
    h, w = latent_shape[-2:]
    with torch.no_grad():
        pixels = fit_to(image.float(), w * factor, h * factor, resize)
        latent = vae.encode(pixels.movedim(1, -1))
    if latent.ndim == 5:  # a video VAE's one frame
        latent = latent[:, :, 0]
    return hint_format.to_model(latent.float().cpu()).contiguous()


def image_hint(image: Any, latent_shape: tuple[int, ...], scale: int) -> Any:
    """The hint IMAGE [B, 3, H, W] cropped and resized to ``scale`` x the latent's size, 0..1 as given."""
    import torch

    _check_image(image)
    h, w = latent_shape[-2:]
    with torch.no_grad():
        return fit_to(image.float(), w * scale, h * scale).cpu().contiguous()


def kept_area(mask: Any, batch: int, channels: int, size: tuple[int, int]) -> Any:
    """An inpainting model patch's mask channels [B, channels, h, w] for a hint latent of ``size``: one minus the
    MASK (1 = inpaint there), averaged over its channels and bilinearly stretched to ``size`` (no crop, unlike the
    image); all ones when there is no mask."""
    import torch
    import torch.nn.functional as F

    if mask is None:
        return torch.ones(batch, channels, *size)
    if not isinstance(mask, torch.Tensor) or mask.ndim not in (3, 4):
        raise ConfigError(
            f"an inpainting mask of {type(mask).__name__} {tuple(getattr(mask, 'shape', ()))}",
            "the mask is a MASK [batch, height, width] (1 where the patch inpaints)",
            "connect a MASK (e.g. from Load Image's mask output) to the mask input",
        )
    kept = 1.0 - (mask.float() if mask.ndim == 4 else mask.float().unsqueeze(1)).mean(dim=1, keepdim=True)
    if channels != 1 or kept.shape[0] not in (1, batch):
        raise ConfigError(
            f"an inpainting mask of shape {list(mask.shape)} for a patch reading {channels} mask channels on a "
            f"batch of {batch} control images",
            "the patch reads one mask channel, one mask per control image (or one for all)",
            "give one mask, or one per control image, to an inpainting patch",
        )
    with torch.no_grad():
        kept = F.interpolate(kept.cpu(), size=tuple(size), mode="bilinear")
    return kept.expand(batch, -1, -1, -1).contiguous()


def inpaint_masks(masks: Any, hint_shape: tuple[int, ...], info: Any) -> list:
    """An inpainting ControlNet's mask channels for a hint latent of ``hint_shape`` [B, C, h, w]: each mask the
    apply node passed ([b, 1, H, W], 1 where the picture is kept) cropped to the latent's aspect ratio about its
    centre, resized nearest-exact to its size and repeated or cut to its batch; none given: all ones (everything
    kept)."""
    import torch

    batch, size = hint_shape[0], tuple(hint_shape[-2:])
    out = []
    for mask in masks or (torch.ones(1, 1, 1, 1),):
        if not isinstance(mask, torch.Tensor) or mask.ndim != 4 or mask.shape[1] != 1:
            raise ConfigError(
                f"an inpainting ControlNet mask of {type(mask).__name__} {list(getattr(mask, 'shape', ()))}",
                f"the ControlNet {info.name} reads one mask channel [batch, 1, height, width] beside its hint",
                "apply it with ControlNet Inpainting (AliMama) Apply and connect a MASK",
            )
        with torch.no_grad():
            mask = fit_to(mask.float().cpu(), size[1], size[0])
        repeats = -(-batch // mask.shape[0])
        out.append(mask.repeat(repeats, 1, 1, 1)[:batch].contiguous())
    if sum(m.shape[1] for m in out) != info.mask_channels:
        raise ConfigError(
            f"{len(out)} masks for the inpainting ControlNet {info.name}",
            f"it reads {info.mask_channels} mask channel(s) after the hint latent",
            "apply it with one mask (ControlNet Inpainting (AliMama) Apply)",
        )
    return out
