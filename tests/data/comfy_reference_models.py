"""Tiny transformers in their ORIGINAL layout, loaded through ComfyUI's real loading path.

Helper of ``make_comfy_ksampler_reference.py`` (run with the Python that imports ComfyUI; never imported
by the test suite). The structures are ComfyUI's own module classes (``comfy.ldm.flux.model.Flux``,
MMDiT, ``PixArtMS``) built at tiny widths, so the tensor names and shapes are exactly those of the
published files (Black Forest Labs, Stability, PixArt); the values are deterministic (seeded per name).
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch
from comfy_setup import prepare_comfy  # the sibling helper (found through this folder)

# -- tiny structures (the real block layout of each family, small widths) ----------------------------------
FLUX = {"hidden": 64, "head_dim": 16, "axes_dim": [4, 6, 6], "depth": 1, "depth_single": 1, "context": 32, "vec": 24}
SD3 = {"depth": 1, "context": 32, "adm": 24, "pos_embed_max_size": 6}  # hidden = 64 * depth (MMDiT's rule)
PIXART = {"hidden": 72, "head_dim": 72, "depth": 2, "caption": 32, "token_num": 8, "pos_grid": 32}


def import_comfy(comfy_dir: Path, base_dir: Path) -> SimpleNamespace:
    prepare_comfy(comfy_dir, base_dir, stub_missing=False)
    import comfy.model_detection
    import comfy.ops
    import comfy.sd
    import comfy.utils
    import comfy_extras.nodes_flux as nodes_flux
    import comfy_extras.nodes_model_advanced as nma
    import node_helpers

    import nodes

    comfy.utils.PROGRESS_BAR_ENABLED = False
    return SimpleNamespace(
        comfy=comfy,
        nodes=nodes,
        nma=nma,
        nodes_flux=nodes_flux,
        node_helpers=node_helpers,
        detection=comfy.model_detection,
    )


# -- helpers ---------------------------------------------------------------------------------------------
def randn(name: str, shape, scale: float = 1.0) -> torch.Tensor:
    """Deterministic normal values keyed by ``name`` (independent of creation order)."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(tuple(shape), generator=g, dtype=torch.float32) * scale


def fill_state(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Weights ~ N(0, 1/fan_in), biases ~ N(0, 0.02), norm scales ~ 1 + N(0, 0.1); stored as fp16."""
    out = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith(".scale"):  # RMSNorm scales (Flux's q/k norms)
            t = 1.0 + randn(name, shape, 0.1)
        elif len(shape) == 1:
            t = randn(name, shape, 0.02)
        else:
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
            t = randn(name, shape, 1.0 / math.sqrt(fan_in))
        out[name] = t.to(torch.float16).contiguous()
    return out


def meta_shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


# -- original-layout files -----------------------------------------------------------------------------------
def flux_state(c: SimpleNamespace, guidance: bool, in_channels: int = 16) -> dict[str, torch.Tensor]:
    """Flux.1's structure; ``in_channels`` 96 is FLUX.1 Fill's (latent, masked image, 8x8 mask per pixel)."""
    from comfy.ldm.flux.model import Flux

    with torch.device("cpu"):  # disable_weight_init: allocated, never initialised
        model = Flux(
            in_channels=in_channels,
            out_channels=16,
            vec_in_dim=FLUX["vec"],
            context_in_dim=FLUX["context"],
            hidden_size=FLUX["hidden"],
            mlp_ratio=4.0,
            num_heads=FLUX["hidden"] // FLUX["head_dim"],
            depth=FLUX["depth"],
            depth_single_blocks=FLUX["depth_single"],
            axes_dim=FLUX["axes_dim"],
            theta=10000,
            patch_size=2,
            qkv_bias=True,
            guidance_embed=guidance,
            operations=c.comfy.ops.disable_weight_init,
        )
    return fill_state(meta_shapes(model))


def sd3_state(c: SimpleNamespace) -> dict[str, torch.Tensor]:
    from comfy.ldm.modules.diffusionmodules.mmdit import OpenAISignatureMMDITWrapper

    hidden = 64 * SD3["depth"]
    n = SD3["pos_embed_max_size"]
    with torch.device("cpu"):  # disable_weight_init: allocated, never initialised
        model = OpenAISignatureMMDITWrapper(
            input_size=None,
            patch_size=2,
            in_channels=16,
            out_channels=16,
            depth=SD3["depth"],
            adm_in_channels=SD3["adm"],
            context_embedder_config={
                "target": "torch.nn.Linear",
                "params": {"in_features": SD3["context"], "out_features": hidden},
            },
            pos_embed_max_size=n,
            num_patches=n * n,
            pos_embed_scaling_factor=None,
            x_block_self_attn_layers=[],
            operations=c.comfy.ops.disable_weight_init,
        )
    return fill_state(meta_shapes(model))


def pixart_state(c: SimpleNamespace) -> dict[str, torch.Tensor]:
    from comfy.ldm.pixart.pixartms import PixArtMS

    with torch.device("cpu"):  # disable_weight_init: allocated, never initialised
        model = PixArtMS(
            input_size=2 * PIXART["pos_grid"],
            patch_size=2,
            in_channels=4,
            hidden_size=PIXART["hidden"],
            depth=PIXART["depth"],
            num_heads=PIXART["hidden"] // PIXART["head_dim"],
            pred_sigma=True,
            caption_channels=PIXART["caption"],
            model_max_length=PIXART["token_num"],
            micro_condition=False,
            operations=c.comfy.ops.disable_weight_init,
        )
    shapes = meta_shapes(model)
    # what published PixArt files carry besides the modules: the fixed sin-cos table (unused at inference,
    # its size tells ComfyUI the training resolution) and the learned empty caption (training only)
    shapes["pos_embed"] = (1, PIXART["pos_grid"] ** 2, PIXART["hidden"])
    return fill_state(shapes)


def detection_overrides(c: SimpleNamespace) -> dict:
    """Wrap ComfyUI's detect_unet_config: replace the widths it hard-codes by those the weights show."""
    original = c.detection.detect_unet_config
    applied: dict[str, dict] = {}

    def detect(state_dict, key_prefix, metadata=None):
        config = original(state_dict, key_prefix, metadata=metadata)
        if config is None:
            return config
        model = config.get("image_model")
        if model == "flux":
            hidden = state_dict[f"{key_prefix}img_in.weight"].shape[0]
            head_dim = state_dict[f"{key_prefix}double_blocks.0.img_attn.norm.query_norm.scale"].shape[0]
            changes = {
                "hidden_size": hidden,
                "num_heads": hidden // head_dim,
                "context_in_dim": state_dict[f"{key_prefix}txt_in.weight"].shape[1],
                "axes_dim": list(FLUX["axes_dim"]),
            }
        elif model in ("pixart_alpha", "pixart_sigma"):
            hidden = state_dict[f"{key_prefix}x_embedder.proj.weight"].shape[0]
            changes = {
                "hidden_size": hidden,
                "num_heads": hidden // PIXART["head_dim"],
                "caption_channels": state_dict[f"{key_prefix}y_embedder.y_proj.fc1.weight"].shape[1],
            }
        else:
            changes = {}
        config.update(changes)
        applied[model] = {k: v for k, v in changes.items()}
        return config

    c.detection.detect_unet_config = detect
    return applied


def save_and_load(c: SimpleNamespace, name: str, state: dict[str, torch.Tensor], out_dir: Path):
    from safetensors.torch import save_file

    path = out_dir / f"comfy_ref_{name}.safetensors"
    save_file(state, str(path))
    model = c.comfy.sd.load_diffusion_model(str(path), model_options={"dtype": torch.float32})
    # every tensor of the file must be in the loaded model (nothing silently dropped or left uninitialised)
    loaded = model.model.diffusion_model.state_dict()
    unused = {"pos_embed", "y_embedder.y_embedding"} if name.startswith("pixart") else set()
    for key, value in state.items():
        if key in unused:
            continue
        if key not in loaded or not torch.equal(loaded[key].float(), value.float()):
            raise SystemExit(f"{name}: tensor {key} did not load into ComfyUI's model")
    missing = set(loaded) - set(state)
    if missing:
        raise SystemExit(f"{name}: ComfyUI's model has tensors the file lacks: {sorted(missing)[:5]}")
    return path, model


def describe_model(model) -> dict:
    ms = model.get_model_object("model_sampling")
    fmt = model.get_model_object("latent_format")
    info = {
        "model_type": model.model.model_type.name,
        "model_sampling": type(ms).__bases__[0].__name__,
        "prediction": type(ms).__bases__[1].__name__,
        "sigma_min": float(ms.sigma_min),
        "sigma_max": float(ms.sigma_max),
        "latent_format": {
            "class": type(fmt).__name__,
            "scale": float(fmt.scale_factor),
            "shift": float(getattr(fmt, "shift_factor", 0.0) or 0.0),
        },
        "sampling_settings": dict(model.model.model_config.sampling_settings),
    }
    for attr in ("shift", "multiplier"):
        if hasattr(ms, attr):
            info[attr] = float(getattr(ms, attr))
    for attr in ("beta_schedule", "linear_start", "linear_end", "timesteps"):
        value = model.model.model_config.sampling_settings.get(attr)
        if value is not None:
            info[attr] = value
    return info
