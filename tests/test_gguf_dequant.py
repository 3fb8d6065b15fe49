"""GGML blocks dequantised in torch (models/gguf/dequant.py) against two oracles we did not write:

- in float32 arithmetic, the ``gguf`` package's own numpy ``dequantize`` (<= 1e-6 relative);
- in every ``dequant_dtype`` mode (default: float16 products; target; float32; float16; bfloat16) and for the
  compute dtypes float32 / bfloat16 / float16, ComfyUI-GGUF's ``dequantize_tensor`` run from the unmodified
  snapshot (bit for bit).

Blocks are random valid ones (every byte random, the float16 factors finite and of a weight's size, both
signs), and for the types ``gguf.quants`` can quantise also blocks quantised from values.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from comfy_gguf import comfy_dequantise

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.gguf.dequant import DECODERS, DEQUANT_MODES, arithmetic_dtype, dequantise
from parallel_runtime.models.gguf.formats import BY_NAME, SUPPORTED, ggml_type

PACKED = sorted(DECODERS)
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]  # on a GPU machine: also on the device
FACTOR_OFFSETS = {
    "Q8_0": (0,),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def valid_blocks(name: str, count: int, seed: int) -> np.ndarray:
    """``count`` random blocks of ``name`` with finite float16 factors in +-[1e-4, 0.05]."""
    kind = BY_NAME[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(count, kind.nbytes), dtype=np.uint8)
    for at in FACTOR_OFFSETS[name]:
        factor = rng.uniform(1e-4, 0.05, size=count) * rng.choice([-1.0, 1.0], size=count)
        raw[:, at : at + 2] = factor.astype(np.float16).view(np.uint8).reshape(count, 2)
    return raw


def test_the_table_has_every_type_comfyui_gguf_reads_with_gguf_s_block_sizes():
    names = {"F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1"}
    names |= {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"}
    assert set(BY_NAME) == names
    for kind in SUPPORTED.values():
        qtype = gguf.GGMLQuantizationType[kind.name]
        assert int(qtype) == kind.id
        assert gguf.GGML_QUANT_SIZES[qtype] == (kind.elements, kind.nbytes)


@pytest.mark.parametrize("name", PACKED)
def test_float32_arithmetic_equals_gguf_numpy_dequantize(name):
    raw = valid_blocks(name, 96, seed=len(name))
    kind = BY_NAME[name]
    expected = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType[name]).reshape(-1)
    ours = dequantise(torch.from_numpy(raw), kind, (96 * kind.elements,), torch.float32, "float32").numpy()
    assert np.abs(ours - expected).max() <= 1e-6 * np.abs(expected).max()


@pytest.mark.parametrize("name", ["Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1"])
def test_quantised_values_come_back_like_gguf_s(name):
    values = np.random.default_rng(3).normal(0, 0.05, size=(8, 256)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[name]
    raw = gguf.quants.quantize(values, qtype)
    expected = gguf.quants.dequantize(raw, qtype)
    ours = dequantise(torch.from_numpy(raw), BY_NAME[name], (8, 256), torch.float32, "float32").numpy()
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6 * np.abs(expected).max())
    assert np.abs(ours - values).max() < 0.05  # and they are the quantised weights (not noise)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", DEQUANT_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", PACKED)
def test_every_mode_equals_comfyui_gguf_bit_for_bit(name, dtype, mode, device):
    kind = BY_NAME[name]
    raw = torch.from_numpy(valid_blocks(name, 64, seed=7)).to(device)
    shape = (8, 8 * kind.elements)
    theirs = comfy_dequantise(raw, name, shape, dtype, mode)
    ours = dequantise(raw, kind, shape, dtype, mode)
    assert ours.dtype == theirs.dtype == dtype and ours.shape == theirs.shape
    assert ours.device == raw.device and torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["Q8_0", "Q5_1", "Q4_K"])
def test_the_default_mode_rounds_products_to_float16_unlike_float32(name):
    """The default is not exact float32 dequantisation: the case the issue measured (3.6e-4 on a latent)."""
    kind = BY_NAME[name]
    raw = torch.from_numpy(valid_blocks(name, 256, seed=11))
    shape = (16, 16 * kind.elements)
    default = dequantise(raw, kind, shape, torch.float32)
    exact = dequantise(raw, kind, shape, torch.float32, "float32")
    assert not torch.equal(default, exact)
    assert torch.equal(default, exact.to(torch.float16).to(torch.float32)) or name != "Q8_0"


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
def test_float_types_are_casts_in_every_mode(name):
    stored = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[name]
    values = torch.randn(4, 64).to(stored)
    for mode in DEQUANT_MODES:
        out = dequantise(values, BY_NAME[name], (4, 64), torch.float32, mode)
        assert torch.equal(out, values.to(torch.float32))
        raw = values.view(torch.uint8) if name != "F32" else values.view(torch.uint8)
        assert torch.equal(dequantise(raw, BY_NAME[name], (4, 64), torch.float32, mode), out)
        assert torch.equal(out, comfy_dequantise(values, name, (4, 64), torch.float32, mode).float())


def test_unknown_modes_and_types_are_refused_by_name():
    with pytest.raises(ConfigError, match="dequant_dtype 'float64'"):
        arithmetic_dtype("float64", torch.float32)
    with pytest.raises(ConfigError, match="IQ2_XXS") as err:
        ggml_type(int(gguf.GGMLQuantizationType.IQ2_XXS), "blocks.0.ffn.0.weight", "wan.gguf")
    assert "blocks.0.ffn.0.weight" in str(err.value) and "Q4_K" in str(err.value)
