"""Single files tell their family, variant and config by their tensors (tiny files and real-size headers);
files that are not a transformer of the chosen family fail clearly."""

from __future__ import annotations

import pytest
import torch
from bigmodel_files import save as save_file_fp8  # tests/ helpers
from bigmodel_files import to_fp8
from original_layout_files import (
    PIXART_OVERRIDES,
    PREFIX,
    TO_ORIGINAL,
    flux_to_bfl,
    same_config_value,
    write_header_only,
    write_original,
)
from safetensors.torch import save_file

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer, shipped_config


def test_family_and_variant_detection_of_tiny_files(tmp_path, tiny_transformers):
    flux = TO_ORIGINAL["flux"](tiny_transformers["flux"].state_dict())
    save_file(flux, str(tmp_path / "dev.safetensors"))
    save_file({k: v for k, v in flux.items() if not k.startswith("guidance_in.")}, str(tmp_path / "schnell.sft"))
    sd3 = TO_ORIGINAL["sd3"](tiny_transformers["sd3"].state_dict())
    save_file(sd3, str(tmp_path / "sd35m.safetensors"))
    no_dual = {k: v for k, v in sd3.items() if ".attn2." not in k}
    save_file(no_dual, str(tmp_path / "sd35l.safetensors"))
    save_file({k: v for k, v in no_dual.items() if ".ln_" not in k}, str(tmp_path / "sd3m.safetensors"))
    write_original(tiny_transformers["pixart"].state_dict(), "pixart", tmp_path / "pixart.safetensors")

    def inspect(name, **kw):
        return inspect_single_file(tmp_path / name, **kw)

    dev, schnell = inspect("dev.safetensors"), inspect("schnell.sft")
    assert (dev.family, dev.variant, dev.config["guidance_embeds"]) == ("flux", "flux-dev", True)
    assert (schnell.variant, schnell.config["guidance_embeds"]) == ("flux-schnell", False)
    assert schnell.scheduler_config["use_dynamic_shifting"] is False and dev.scheduler_config["use_dynamic_shifting"]
    assert dev.config["axes_dims_rope"] == [4, 6, 6]  # FLUX.1's (16, 56, 56) split scaled to a 16-wide head
    medium, large = inspect("sd35m.safetensors"), inspect("sd35l.safetensors")
    assert (medium.variant, medium.config["dual_attention_layers"], medium.config["qk_norm"]) == (
        "sd3.5-medium",
        [0],
        "rms_norm",
    )
    assert (large.variant, large.config["dual_attention_layers"]) == ("sd3.5-large", [])
    old = inspect("sd3m.safetensors", overrides={"attention_head_dim": 16})
    assert (old.variant, old.config["qk_norm"], old.config["num_attention_heads"]) == ("sd3-medium", None, 4)
    assert medium.config["num_layers"] == 3 and medium.config["pos_embed_max_size"] == 32
    pixart = inspect("pixart.safetensors", overrides=PIXART_OVERRIDES)
    assert (pixart.family, pixart.variant) == ("pixart", "pixart-sigma-1024")
    assert pixart.config["use_additional_conditions"] is True  # the tiny model has alpha's micro-conditions
    assert inspect("dev.safetensors", variant="flux-schnell").variant == "flux-schnell"  # an explicit choice


def test_published_sizes_from_header_only(tmp_path):
    """Real-size headers (no data): the shipped configs come back with the published dimensions."""
    sd35l = {
        "model.diffusion_model.x_embedder.proj.weight": (2432, 16, 2, 2),
        "model.diffusion_model.pos_embed": (1, 36864, 2432),
        "model.diffusion_model.context_embedder.weight": (2432, 4096),
        "model.diffusion_model.y_embedder.mlp.0.weight": (2432, 2048),
        "model.diffusion_model.final_layer.linear.weight": (64, 2432),
        "first_stage_model.decoder.conv_in.weight": (512, 16, 3, 3),
        **{f"model.diffusion_model.joint_blocks.{i}.x_block.attn.ln_q.weight": (64,) for i in range(38)},
    }
    info = inspect_single_file(write_header_only(tmp_path / "sd3.5_large.safetensors", sd35l))
    base, _ = shipped_config("sd3.5-large")
    assert info.variant == "sd3.5-large" and info.prefix == PREFIX
    for key in ("num_layers", "num_attention_heads", "attention_head_dim", "caption_projection_dim", "in_channels"):
        assert info.config[key] == base[key], key
    for key in ("joint_attention_dim", "pooled_projection_dim", "pos_embed_max_size", "out_channels", "qk_norm"):
        assert info.config[key] == base[key], key
    assert info.config["dual_attention_layers"] == []
    flux = {
        "img_in.weight": (3072, 64),
        "txt_in.weight": (3072, 4096),
        "vector_in.in_layer.weight": (3072, 768),
        "guidance_in.in_layer.weight": (3072, 256),
        "final_layer.linear.weight": (64, 3072),
        **{f"double_blocks.{i}.img_attn.norm.query_norm.scale": (128,) for i in range(19)},
        **{f"single_blocks.{i}.linear1.weight": (21504, 3072) for i in range(38)},
    }
    info = inspect_single_file(write_header_only(tmp_path / "flux1-dev.safetensors", flux))
    base, scheduler = shipped_config("flux-dev")
    assert info.variant == "flux-dev" and info.scheduler_config == scheduler
    assert all(same_config_value(info.config[k], v) for k, v in base.items())
    assert info.config["out_channels"] is None  # as in FLUX.1's config: the same as in_channels
    pixart = {
        "x_embedder.proj.weight": (1152, 4, 2, 2),
        "y_embedder.y_proj.fc1.weight": (1152, 4096),
        "final_layer.linear.weight": (32, 1152),
        **{f"blocks.{i}.attn.qkv.weight": (3456, 1152) for i in range(28)},
    }
    info = inspect_single_file(write_header_only(tmp_path / "PixArt-Sigma-XL-2-1024-MS.safetensors", pixart))
    base, _ = shipped_config("pixart-sigma-1024")
    assert info.variant == "pixart-sigma-1024" and info.config == base


def test_wrong_family_missing_file_and_other_files_fail_clearly(tmp_path, tiny_transformers):
    path = write_original(tiny_transformers["flux"].state_dict(), "flux", tmp_path / "flux1-dev.safetensors")
    with pytest.raises(ConfigError, match=r"is a flux transformer but family 'sd3' was chosen") as err:
        load_single_file_transformer(path, family="sd3")
    assert "fix:" in str(err.value)
    with pytest.raises(ConfigError, match=r"variant 'sd3.5-large' is a sd3 model but .* holds a flux"):
        inspect_single_file(path, variant="sd3.5-large")
    with pytest.raises(ConfigError, match="does not exist"):
        load_single_file_transformer(tmp_path / "nothing.safetensors")
    vae = write_header_only(tmp_path / "ae.safetensors", {"decoder.conv_in.weight": (512, 16, 3, 3)})
    with pytest.raises(
        ConfigError, match="does not look like a Flux, FLUX.2, Qwen-Image, SD3, PixArt, Wan.* transformer"
    ):
        inspect_single_file(vae)  # every family, from the registry
    with pytest.raises(ConfigError, match="diffusers' tensor names"):
        inspect_single_file(write_header_only(tmp_path / "d.safetensors", {"single_transformer_blocks.0.x": (1,)}))
    pixart = write_original(tiny_transformers["pixart"].state_dict(), "pixart", tmp_path / "pixart.safetensors")
    with pytest.raises(ConfigError, match="does not split into heads of 72"):
        inspect_single_file(pixart)  # 96 wide: the shipped head width does not fit; an override is needed
    # a ComfyUI "fp8 scaled" Flux.1 file loads with its scales (fp8 storage; see test_bigmodels_files for the maths)
    original = flux_to_bfl(tiny_transformers["flux"].state_dict())
    scaled = save_file_fp8(to_fp8(original, "scaled"), tmp_path / "flux1-dev-fp8-scaled.safetensors")
    model, _, _ = load_single_file_transformer(scaled, "cpu", torch.bfloat16)
    q = model.transformer_blocks[0].attn.to_q
    assert q.weight.dtype == torch.float8_e4m3fn and q.scaled


def test_resolve_model_path_accepts_single_files(tmp_path):
    from parallel_runtime.service.api import resolve_model_path

    f = write_header_only(tmp_path / "m.safetensors", {"img_in.weight": (8, 4)})
    assert resolve_model_path(str(f)) == f
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="not a model file"):
        resolve_model_path(str(tmp_path / "notes.txt"))
