"""A VAE from ONE file, as ComfyUI users keep them: ``models/vae/ae.safetensors`` (Flux),
``sdxl_vae.safetensors``, ``flux2-vae.safetensors`` (FLUX.2: the same layout plus the batch-norm
statistics ``bn.*`` of its 2x2-packed latent; loaded as diffusers' ``AutoencoderKLFlux2``), or the
``first_stage_model.`` part of a full checkpoint.

The structure (levels, widths, blocks per level, latent channels, quant convs, mid-block
attention) is read from the tensor shapes in the header; the only thing weights do not record is
the GroupNorm group count, 32 in every published SD / SDXL / SD3 / Flux VAE. Original (LDM) names
are converted by diffusers' own ``convert_ldm_vae_checkpoint`` (through ``models.compat``); files already in diffusers names
load as they are. A family may bring its own VAE file layout (``FamilySpec.vae_file``: Wan 2.1 / 2.2's video VAEs,
``wan_2.1_vae.safetensors`` / ``wan2.2_vae.safetensors``, become ``AutoencoderKLWan``); such a file's layout is
the family's id. Only the VAE's tensors are read, so a 10 GB checkpoint costs its VAE's bytes.
Decoding needs no scaling factors (a LATENT holds raw VAE latents), so none are guessed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..models import compat
from ..models.families.registry import FAMILIES, family
from ..models.tensor_files import read_header

PREFIXES: tuple[str, ...] = ("", "first_stage_model.", "vae.")
BATCH_NORM = "bn.running_mean"  # FLUX.2's VAE: batch-norm statistics of the packed latent
DEFAULT_NORM_GROUPS = 32
# (layout, name of a tensor only that layout has, per-level resnet conv2 name, mid attention name)
_LAYOUTS: tuple[tuple[str, str, str, str], ...] = (
    (
        "ldm",
        "decoder.mid.block_1.conv1.weight",
        "encoder.down.{i}.block.{j}.conv2.weight",
        "decoder.mid.attn_1.q.weight",
    ),
    (
        "diffusers",
        "decoder.mid_block.resnets.0.conv1.weight",
        "encoder.down_blocks.{i}.resnets.{j}.conv2.weight",
        "decoder.mid_block.attentions.0.to_q.weight",
    ),
)


@dataclasses.dataclass(frozen=True)
class VaeFileInfo:
    """What the header says: where the VAE's tensors are and the AutoencoderKL config they imply."""

    path: Path
    prefix: str
    layout: str  # "ldm" | "diffusers" | the id of the family whose VAE file layout it is (FamilySpec.vae_file)
    config: dict[str, Any]
    batch_norm: bool = False  # FLUX.2's VAE: AutoencoderKLFlux2 with the running statistics in ``bn.*``

    @property
    def latent_channels(self) -> int:
        return int(self.config["latent_channels"] if "latent_channels" in self.config else self.config["z_dim"])


def inspect_vae_file(path: str | os.PathLike, norm_num_groups: int = DEFAULT_NORM_GROUPS) -> VaeFileInfo:
    """Find the VAE inside ``path`` and derive its config from the header (reads no weights)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"VAE file {path} not found",
            "the VAE is read from that file",
            "pick a file from ComfyUI's models/vae folder, or leave the VAE input on the model's own",
        )
    if path.suffix.lower() not in (".safetensors", ".sft"):
        raise ConfigError(
            f"{path.name} is not a .safetensors file",
            "VAE files are read lazily from safetensors headers (pickled .pt/.ckpt files could run code)",
            "use the .safetensors release of the VAE",
        )
    tensors, metadata = read_header(path)
    shapes = {k: tuple(v["shape"]) for k, v in tensors.items()}
    # highest detection priority first: a family's layout may hold the markers of an older one's (LTX-2, LTX-Video)
    ordered = sorted(FAMILIES, key=lambda spec: -spec.detection_priority)
    formats = [(spec.id, spec.vae_file()) for spec in ordered if spec.vae_file is not None]
    for prefix in PREFIXES:
        for layout, fmt in formats:  # a family's own VAE file layout (e.g. Wan's video VAEs)
            if fmt.matches(shapes, prefix):
                local = {k[len(prefix) :]: s for k, s in shapes.items() if k.startswith(prefix)}
                config = fmt.config(local)
                if fmt.metadata is not None:  # ComfyUI reads a checkpoint's metadata, not a lone VAE file's
                    config = fmt.metadata(config, metadata if prefix else {})
                return VaeFileInfo(path, prefix, layout, config)
        for layout, marker, conv2, attention in _LAYOUTS:
            if prefix + marker in shapes:
                local = {k[len(prefix) :]: s for k, s in shapes.items() if k.startswith(prefix)}
                config = _config(local, conv2, attention, norm_num_groups)
                widths = config["block_out_channels"]
                if norm_num_groups < 1 or any(w % norm_num_groups for w in widths):
                    raise ConfigError(
                        f"the VAE in {path.name} has widths {widths}, which {norm_num_groups} GroupNorm groups do not divide",
                        "GroupNorm splits each width into equal groups",
                        "give the group count the VAE was trained with (32 for every published VAE)",
                    )
                if prefix + BATCH_NORM in shapes:  # FLUX.2: its latent is packed 2x2 and normalised by ``bn``
                    packed = shapes[prefix + BATCH_NORM][0]
                    config["patch_size"] = _patch_for(packed, config["latent_channels"], path)
                    return VaeFileInfo(path, prefix, layout, config, batch_norm=True)
                return VaeFileInfo(path, prefix, layout, config)
    raise ConfigError(
        f"{path.name} holds no VAE",
        "no decoder tensors were found under any known name (decoder.mid.block_1 / decoder.mid_block, "
        f"with prefixes {', '.join(repr(p) for p in PREFIXES if p)} or none)",
        "pick the VAE file that belongs to the model (e.g. ae.safetensors for Flux)",
    )


def _patch_for(packed: int, latent: int, path: Path) -> tuple[int, int]:
    side = int(round((packed / latent) ** 0.5))
    if side * side * latent != packed:
        raise ConfigError(
            f"{path.name} has batch-norm statistics for {packed} channels over a {latent}-channel latent",
            "FLUX.2's VAE normalises its latent packed in square patches (4x the channels for 2x2)",
            "use the VAE file published with FLUX.2 (flux2-vae.safetensors)",
        )
    return (side, side)


def _config(shapes: Mapping[str, tuple[int, ...]], conv2: str, attention: str, norm_num_groups: int) -> dict:
    levels = 0
    while conv2.format(i=levels, j=0) in shapes:
        levels += 1
    blocks = 0
    while conv2.format(i=0, j=blocks) in shapes:
        blocks += 1
    return {
        "in_channels": shapes["encoder.conv_in.weight"][1] if "encoder.conv_in.weight" in shapes else 3,
        "out_channels": shapes["decoder.conv_out.weight"][0],
        "down_block_types": ["DownEncoderBlock2D"] * levels,
        "up_block_types": ["UpDecoderBlock2D"] * levels,
        "block_out_channels": [shapes[conv2.format(i=i, j=0)][0] for i in range(levels)],
        "layers_per_block": blocks,
        "latent_channels": shapes["decoder.conv_in.weight"][1],
        "norm_num_groups": norm_num_groups,
        "use_quant_conv": "quant_conv.weight" in shapes,
        "use_post_quant_conv": "post_quant_conv.weight" in shapes,
        "mid_block_add_attention": attention in shapes,
    }


def load_vae_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    norm_num_groups: int = DEFAULT_NORM_GROUPS,
) -> nn.Module:
    """A diffusers ``AutoencoderKL`` (``AutoencoderKLFlux2`` for FLUX.2's, ``AutoencoderKLWan`` for a Wan VAE)
    with the weights of the VAE in ``path`` (see the module doc)."""
    from diffusers import AutoencoderKL, AutoencoderKLFlux2
    from safetensors import safe_open

    from ..models.weights import parameters_on_meta

    info = inspect_vae_file(path, norm_num_groups)
    with safe_open(str(info.path), framework="pt", device="cpu") as f:
        names = [k for k in f.keys() if k.startswith(info.prefix)]  # noqa: SIM118 - safe_open is not iterable
        state = {k[len(info.prefix) :]: f.get_tensor(k) for k in names}
    if info.layout not in ("ldm", "diffusers"):  # a family's own layout
        vae = family(info.layout).vae_file().build(state, info.config, info.path.name)
        return nn.Module.to(vae, device=torch.device(device), dtype=dtype).eval().requires_grad_(False)
    if info.layout == "ldm":
        norms = {k: v for k, v in state.items() if k.startswith("bn.")}  # the converter knows no batch norm
        state = {**compat.convert_ldm_vae(state, info.config), **norms}
    with parameters_on_meta():
        vae = AutoencoderKLFlux2(**info.config) if info.batch_norm else AutoencoderKL(**info.config)
    if info.batch_norm:  # the step counter of the running statistics, when the file does not carry it
        state.setdefault("bn.num_batches_tracked", torch.zeros((), dtype=torch.long))
    expected = set(vae.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing:
        raise ConfigError(
            f"{info.path.name} lacks {len(missing)} VAE tensor(s), e.g. {missing[:3]}",
            "the VAE found in the file does not have every part its structure implies (a partial or unusual VAE)",
            "use the VAE file published with the model",
        )
    if unexpected and info.layout == "diffusers":  # a converted LDM file may carry extras (e.g. loss weights)
        raise ConfigError(
            f"{info.path.name} has {len(unexpected)} tensor(s) this VAE cannot hold, e.g. {unexpected[:3]}",
            "the file's VAE has parts a standard AutoencoderKL does not",
            "use the VAE file published with the model",
        )
    vae.load_state_dict({k: state[k] for k in expected}, strict=True, assign=True)
    return nn.Module.to(vae, device=torch.device(device), dtype=dtype).eval().requires_grad_(False)
