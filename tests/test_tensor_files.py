"""Reading tensors and row ranges from .safetensors without a mapping, and conversion plans by probing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from parallel_runtime.models.conversion_plan import PlanError, plan_conversion
from parallel_runtime.models.tensor_files import SafetensorsFile

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name", ["tiny_qwen_image_bf16.safetensors", "tiny_qwen_image_fp8_e4m3fn_scaled.safetensors"])
def test_reads_equal_safetensors_own_loader(name):
    expected = load_file(DATA / name)
    with SafetensorsFile(DATA / name) as f:
        assert set(f.keys()) == set(expected)
        for key, tensor in expected.items():
            got = f.read(key)
            assert got.dtype == tensor.dtype and got.shape == tensor.shape
            assert torch.equal(got.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


def test_row_ranges_and_pieces(tmp_path):
    w = torch.arange(60, dtype=torch.float32).reshape(10, 6)
    save_file({"w": w, "b": torch.arange(10.0)}, tmp_path / "t.safetensors")
    f = SafetensorsFile(tmp_path / "t.safetensors")
    assert torch.equal(f.read("w", (3, 7)), w[3:7])
    assert torch.equal(f.read_rows([("w", 8, 10), ("w", 0, 2)]), torch.cat([w[8:], w[:2]]))
    assert torch.equal(f.read("b", (2, 5)), torch.arange(2.0, 5.0))


def _flux2_original_shapes(d: int = 8, heads_dim: int = 4, text: int = 12) -> dict[str, tuple[int, ...]]:
    shapes = {
        "img_in.weight": (d, 16),
        "txt_in.weight": (d, text),
        "time_in.in_layer.weight": (d, 8),
        "time_in.out_layer.weight": (d, d),
        "double_stream_modulation_img.lin.weight": (6 * d, d),
        "double_stream_modulation_txt.lin.weight": (6 * d, d),
        "single_stream_modulation.lin.weight": (3 * d, d),
        "final_layer.adaLN_modulation.1.weight": (2 * d, d),
        "final_layer.linear.weight": (16, d),
    }
    for s in ("img", "txt"):
        shapes[f"double_blocks.0.{s}_attn.qkv.weight"] = (3 * d, d)
        shapes[f"double_blocks.0.{s}_attn.norm.query_norm.scale"] = (heads_dim,)
        shapes[f"double_blocks.0.{s}_attn.norm.key_norm.scale"] = (heads_dim,)
        shapes[f"double_blocks.0.{s}_attn.proj.weight"] = (d, d)
        shapes[f"double_blocks.0.{s}_mlp.0.weight"] = (6 * d, d)
        shapes[f"double_blocks.0.{s}_mlp.2.weight"] = (d, 3 * d)
    shapes["single_blocks.0.linear1.weight"] = (9 * d, d)
    shapes["single_blocks.0.linear2.weight"] = (d, 4 * d)
    shapes["single_blocks.0.norm.query_norm.scale"] = (heads_dim,)
    shapes["single_blocks.0.norm.key_norm.scale"] = (heads_dim,)
    return shapes


def test_flux2_conversion_plan_rebuilds_the_eager_conversion():
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers as convert

    shapes = _flux2_original_shapes()
    gen = torch.Generator().manual_seed(0)
    state = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    eager = convert(dict(state))
    plan = plan_conversion(convert, shapes)
    assert set(plan.pieces) == set(eager) and not plan.unused
    for name, tensor in eager.items():
        rebuilt = torch.cat([state[p.key][p.r0 : p.r1] for p in plan.pieces[name]])
        assert plan.shape(name) == tuple(tensor.shape) and torch.equal(rebuilt, tensor), name
    swapped = plan.pieces["norm_out.linear.weight"]  # (shift, scale) -> (scale, shift): two pieces, swapped
    assert [(p.r0, p.r1) for p in swapped] == [(8, 16), (0, 8)]


def test_a_converter_doing_arithmetic_is_refused():
    with pytest.raises(PlanError):
        plan_conversion(lambda sd: {k: v * 2.0 for k, v in sd.items()}, {"a": (4, 3)})
    with pytest.raises(PlanError):
        plan_conversion(lambda sd: {"a": sd["a"].reshape(2, 2)}, {"a": (4,)})
