"""What Wan takes from a ComfyUI CONDITIONING beyond text: ``WanImageToVideo``'s start image,
``WanFunControlToVideo`` / ``Wan22FunControlToVideo``'s control video and start image (and the latter's
reference image, ``reference_latents``).

``concat_latent_image`` / ``concat_mask`` / ``concat_mask_index`` (the image latents, where the start image is
kept, where the mask channels go) and ``clip_vision_output``'s penultimate hidden states (Wan 2.1 I2V) become
the Conditioning's ``WanImageInputs``. As in ComfyUI, a model without image K/V (``expected["image_dim"]`` None)
does not use the CLIP-vision output, and a model with extra input channels but no image reads zeros there
(a Fun-Control model without a control video). Unlike ComfyUI, which ignores them, image latents given to a
model without extra input channels are refused, as are image latents that do not fill the model's channels
(ComfyUI fails inside the model). Light to import: torch is imported on call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....errors import ConfigError
from ..spec import ComfyConditioning

KEYS = ("concat_latent_image", "concat_mask", "concat_mask_index", "clip_vision_output", "reference_latents")
VACE_KEYS = ("vace_frames", "vace_mask", "vace_strength")  # WanVaceToVideo's (a list each, one per node)


def image_inputs(options: Mapping[str, Any], expected: Mapping[str, int | None], role: str):
    """The ``WanImageInputs`` of one entry's ``options`` (None when they hold none)."""
    import torch

    from .conditioning import WanImageInputs

    out: dict[str, Any] = {}
    for key, field in (("concat_latent_image", "concat_image"), ("concat_mask", "concat_mask")):
        value = options.get(key)
        if value is not None:
            if not isinstance(value, torch.Tensor) or value.ndim != 5:
                raise ConfigError(
                    f"the {role} conditioning's {key} has shape {tuple(getattr(value, 'shape', ()))}",
                    "Wan image-to-video takes a video latent [batch, channels, frames, height, width] and its mask",
                    "use WanImageToVideo with a Wan VAE",
                )
            out[field] = value.float().cpu()
    index = options.get("concat_mask_index")
    if index:
        if not isinstance(index, int) or "concat_image" not in out or not 0 < index < out["concat_image"].shape[1]:
            raise ConfigError(
                f"the {role} conditioning's concat_mask_index is {index!r}",
                "it says how many of concat_latent_image's channels come before the mask channels",
                "use Wan22FunControlToVideo's conditioning as it makes it",
            )
        out["concat_mask_index"] = index
    clip = options.get("clip_vision_output")
    if clip is not None and expected.get("image_dim"):
        states = getattr(clip, "penultimate_hidden_states", None)
        if not isinstance(states, torch.Tensor) or states.shape[-1] != expected["image_dim"]:
            raise ConfigError(
                f"the {role} conditioning's clip_vision_output has no {expected['image_dim']}-wide penultimate states",
                f"Wan 2.1 image-to-video attends to CLIP ViT-H's penultimate hidden states ({expected['image_dim']} wide)",
                "encode the start image with CLIPVisionLoader (clip_vision_h) and CLIPVisionEncode",
            )
        out["image_embeds"] = states.float().cpu()
    out.update(vace_inputs(options, expected, role))
    reference = reference_input(options, expected, role)
    if reference is not None:
        out["reference"] = reference
    inputs = WanImageInputs(**out) if out else None
    image_inputs_fit(inputs, expected, role)
    return inputs


def reference_input(options: Mapping[str, Any], expected: Mapping[str, int | None], role: str):
    """The first frame of the last ``reference_latents`` entry (Wan22FunControlToVideo's ref_image) [B, 16, H, W];
    None without one. Refused for a model known to have no reference-image embedding (ComfyUI ignores it)."""
    import torch

    latents = options.get("reference_latents")
    if not latents:
        return None
    refuse_reference(expected, role)
    last = list(latents)[-1]
    channels = expected.get("ref_conv_channels") or 16
    if not isinstance(last, torch.Tensor) or last.ndim != 5 or last.shape[1] != channels:
        raise ConfigError(
            f"the {role} conditioning's last reference latent has shape {tuple(getattr(last, 'shape', ()))}",
            f"Wan Fun-Control reads a video latent [batch, {channels}, frames, height, width] of the reference image",
            "connect ref_image to Wan22FunControlToVideo (it encodes the image with the Wan VAE)",
        )
    return last[:, :, 0].float().cpu()


def refuse_reference(expected: Mapping[str, int | None], where: str) -> None:
    """A reference image for a model known to have no reference-image embedding is refused."""
    if "ref_conv_channels" in expected and not expected["ref_conv_channels"]:
        raise ConfigError(
            f"the {where} conditioning carries a reference image (reference_latents) for a Wan model without a "
            "reference-image embedding (ref_conv)",
            "only Wan Fun-Control files with a ref_conv read Wan22FunControlToVideo's ref_image; this model would "
            "ignore it (ComfyUI does, silently)",
            "load a Wan 2.2 Fun-Control (or Fun v1.1) file with ref_conv, or leave ref_image unconnected",
        )


def vace_inputs(options: Mapping[str, Any], expected: Mapping[str, int | None], role: str) -> dict[str, Any]:
    """WanVaceToVideo's entries stacked: ``vace_frames`` [B, N, 32, T, H, W], ``vace_mask`` [B, N, 64, ...] and
    ``vace_strength`` (N); {} without them. Refused for a model known to have no VACE blocks (ComfyUI ignores
    them there)."""
    import torch

    from .vace import check_entries

    if options.get("vace_frames") is None:
        return {}
    if "vace_in_channels" in expected and not expected["vace_in_channels"]:
        raise ConfigError(
            f"the {role} conditioning carries WanVaceToVideo's control video (vace_frames) for a Wan model "
            "without VACE blocks",
            "only a Wan VACE file reads it; this model would ignore it (ComfyUI does, silently)",
            "load a Wan 2.1 VACE file, or leave out WanVaceToVideo",
        )
    frames, masks = list(options["vace_frames"]), options.get("vace_mask")
    strengths = options.get("vace_strength") or [1.0] * len(frames)
    if masks is None:  # ComfyUI's default: every pixel reactive
        masks = [torch.ones(f.shape[0], 64, *f.shape[2:]) for f in frames]
    if len(masks) != len(frames) or not all(isinstance(t, torch.Tensor) and t.ndim == 5 for t in [*frames, *masks]):
        raise ConfigError(
            f"the {role} conditioning has {len(frames)} vace_frames and {len(masks)} vace_mask entries",
            "each WanVaceToVideo entry is a control video latent [batch, 32, frames, height, width] and its mask",
            "use WanVaceToVideo's conditioning as it makes it",
        )
    batch = max(t.shape[0] for t in [*frames, *masks])
    stack = lambda ts: torch.stack([t.float().cpu().expand(batch, *t.shape[1:]) for t in ts], dim=1)  # noqa: E731
    out = {"vace_frames": stack(frames), "vace_mask": stack(masks), "vace_strength": tuple(map(float, strengths))}
    check_entries(out["vace_frames"], out["vace_mask"], out["vace_strength"], role)
    return out


def image_inputs_fit(extras: Any, expected: Mapping[str, Any], where: str) -> None:
    """Image latents only for a model with extra input channels, and of a width that fills them
    (``expected["in_channels"]`` / ``["latent_channels"]``; nothing is checked when they are unknown); a
    reference image only for a model with a ref_conv (``expected["ref_conv_channels"]``)."""
    from .concat import cuts_image, takes_mask
    from .conditioning import WanImageInputs

    if isinstance(extras, WanImageInputs) and extras.reference is not None:
        refuse_reference(expected, where)
    in_channels, latent = expected.get("in_channels"), expected.get("latent_channels")
    image = extras.concat_image if isinstance(extras, WanImageInputs) else None
    if image is None or not (in_channels and latent):
        return
    if in_channels == latent:
        raise ConfigError(
            f"the {where} conditioning carries image latents (concat_latent_image) for a Wan model without extra "
            "input channels",
            "only the image-to-video and Fun-Control models read a start image or control video; this model would "
            "ignore it (ComfyUI does, silently)",
            "load the Wan I2V or Fun-Control model, or leave out WanImageToVideo / WanFunControlToVideo",
        )
    per_frame_time = latent == 48  # TI2V-5B
    takes_mask(
        in_channels - latent,
        image.shape[1],
        cuts_image(in_channels, expected.get("image_dim"), per_frame_time),
        f"the {where}",
    )


COMFY_CONDITIONING = ComfyConditioning(KEYS + VACE_KEYS, image_inputs, image_inputs_fit)
