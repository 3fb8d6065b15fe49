"""Loading Wan transformer files in the original (ComfyUI) layout: variant detection as ComfyUI's model
detection tells them apart, the structure read from the weights, and bf16 loads that keep in float32 what
diffusers' from_pretrained keeps (rope tables, time embedder, modulation tables)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components
from parallel_runtime.parallel.mesh import ParallelMesh

sys.path.insert(0, str(Path(__file__).parent / "data"))
from wan_tiny_weights import TinyWan, tiny_wan_state_dict  # noqa: E402

VARIANTS = {
    "wan2.1-t2v-1.3b": TinyWan(),
    "wan2.1-i2v-14b": TinyWan(in_dim=36, clip_vision=True),
    "wan2.2-i2v-a14b": TinyWan(in_dim=36),
    "wan2.2-ti2v-5b": TinyWan(in_dim=48, out_dim=48),
}


def _write(tmp_path: Path, cfg: TinyWan, prefix: str = "") -> Path:
    from safetensors.torch import save_file

    path = tmp_path / "wan.safetensors"
    save_file({prefix + k: v.to(torch.bfloat16) for k, v in tiny_wan_state_dict(cfg, "load").items()}, str(path))
    return path


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_and_structure_come_from_the_weights(tmp_path, variant):
    cfg = VARIANTS[variant]
    info = inspect_single_file(_write(tmp_path, cfg, "model.diffusion_model."))
    assert (info.family, info.variant) == ("wan", variant)
    c = info.config
    assert (c["num_attention_heads"], c["attention_head_dim"], c["num_layers"]) == (2, 128, 2)
    assert (c["in_channels"], c["out_channels"], c["ffn_dim"], c["text_dim"]) == (cfg.in_dim, cfg.out_dim, 512, 4096)
    assert c["image_dim"] == (1280 if cfg.clip_vision else None)


def test_bf16_load_keeps_diffusers_float32_modules(tmp_path):
    comps = load_single_file_components(_write(tmp_path, TinyWan()), "cpu", torch.bfloat16)
    t = comps.transformer
    assert t.rope.freqs_cos.dtype == torch.float32 and t.scale_shift_table.dtype == torch.float32
    assert t.condition_embedder.time_embedder.linear_1.weight.dtype == torch.float32
    assert t.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16
    assert t.blocks[0].norm2.weight.dtype == torch.float32  # the cross-attention norm, as from_pretrained keeps it
    adapter = comps.adapter()
    from parallel_runtime.attention.usp import SequenceParallelAttention
    from parallel_runtime.models.base import Conditioning

    mesh = ParallelMesh.single()
    out = adapter.forward(
        torch.randn(1, 16, 2, 4, 4), 500.0, Conditioning(torch.randn(1, 8, 4096)), mesh, SequenceParallelAttention(mesh)
    )
    assert out.shape == (1, 16, 2, 4, 4) and torch.isfinite(out.float()).all()


def test_a_wan_vae_file_is_not_a_transformer(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "wan_vae.safetensors"
    save_file({"decoder.middle.0.residual.0.gamma": torch.ones(4, 1, 1, 1)}, str(path))
    with pytest.raises(ConfigError, match=r"does not look like a .*Wan.* transformer[\s\S]*is it a VAE"):
        inspect_single_file(path)
