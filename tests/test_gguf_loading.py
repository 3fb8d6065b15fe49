"""GGUF transformer files (ComfyUI-GGUF's layout, written here with the ``gguf`` package) through the real
single-file loader: every family we run, quantised and plain types, the weights kept in their GGML blocks.

Oracle: the same tensors dequantised by ComfyUI-GGUF's own ``dequantize_tensor`` (default arithmetic, or the
chosen ``dequant_dtype``), saved as an original-layout .safetensors file and loaded through the safetensors
path: the GGUF model must sample exactly the same latent. PipeFusion stages hold only their share (in GGML
bytes) and equal the whole model's tensors; files that are not a diffusion transformer are refused by name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import pytest
import torch
from bigmodel_files import flux2_to_bfl
from comfy_gguf import comfy_reference_file
from gguf_files import write_gguf
from original_layout_files import flux_to_bfl, sd3_to_mmdit
from safetensors.torch import load_file

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import ConfigError
from parallel_runtime.models import Conditioning
from parallel_runtime.models.gguf.linear import GGUFLinear, gguf_layers
from parallel_runtime.models.gguf.reader import GGUFFile
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.pipefusion.stage_loading import load_single_file_stage

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from wan_tiny_weights import TinyWan, tiny_wan_state_dict  # noqa: E402

ARCH = {"flux": "flux", "flux2": "flux", "sd3": "sd3", "wan": "wan", "qwen-image": "qwen_image"}
CASES = [  # (family, quantised type, fallback type for tensors the quantiser keeps / cannot quantise)
    ("flux", "Q8_0", "F16"),
    ("flux", "Q5_1", "BF16"),
    ("flux", "Q4_0", "F16"),
    ("flux2", "Q8_0", "BF16"),
    ("sd3", "Q4_1", "F16"),
    ("wan", "Q4_K", "BF16"),
    ("wan", "Q6_K", "F16"),
    ("wan", "IQ4_XS", "F16"),
    ("qwen-image", "Q5_0", "F16"),
    ("qwen-image", "BF16", "F16"),
]


def original_state(family: str) -> dict[str, torch.Tensor]:
    """A tiny transformer of ``family`` in its original layout (float32 values)."""
    if family == "wan":
        return tiny_wan_state_dict(TinyWan(), "gguf")
    if family == "qwen-image":
        return {k: v.float() for k, v in load_file(str(DATA / "tiny_qwen_image_bf16.safetensors")).items()}
    name = {"flux": "tiny-flux", "flux2": "tiny-flux2", "sd3": "tiny-sd3"}[family]
    state = load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32, ("transformer",)).transformer
    to_original = {"flux": flux_to_bfl, "flux2": flux2_to_bfl, "sd3": sd3_to_mmdit}[family]
    return to_original(state.state_dict())


def sample(comps, seed: int = 0) -> torch.Tensor:
    """Two euler steps of the loaded transformer on fixed noise and conditioning (single device)."""
    adapter = comps.adapter()
    plan, cfg = adapter.plan, comps.transformer_config
    g = torch.Generator().manual_seed(seed)
    width = next(cfg[k] for k in ("joint_attention_dim", "caption_channels", "text_dim") if cfg.get(k))
    pooled = cfg.get("pooled_projection_dim")
    cond = Conditioning(
        torch.randn(1, 6, int(width), generator=g), torch.randn(1, int(pooled), generator=g) if pooled else None
    )
    shape = (1, plan.latent_channels, 2, 8, 8) if plan.latent_dims == 3 else (1, plan.latent_channels, 16, 16)
    start = torch.randn(shape, generator=g)
    settings = SamplingSettings(seed=seed, steps=2, cfg=1.0, sampler="euler", scheduler="simple")
    with torch.no_grad():
        return denoise_latent(
            adapter, ParallelMesh.single(), model_sampling_for(adapter), cond, None, torch.zeros(shape), settings,
            start_model_space=start,
        )  # fmt: skip


@pytest.fixture(scope="module")
def states():
    cache: dict[str, dict[str, torch.Tensor]] = {}

    def get(family: str) -> dict[str, torch.Tensor]:
        if family not in cache:
            cache[family] = original_state(family)
        return cache[family]

    return get


@pytest.mark.parametrize("family, quant, fallback", CASES, ids=[f"{f}-{q}" for f, q, _ in CASES])
def test_gguf_model_samples_like_comfyui_gguf_dequantised_weights(tmp_path, states, family, quant, fallback):
    path = write_gguf(tmp_path / f"{family}-{quant}.gguf", states(family), ARCH[family], quant, fallback)
    comps = load_single_file_components(path, "cpu", torch.float32)
    assert comps.family == family
    layers = gguf_layers(comps.transformer)
    kinds = {layer.kind.name for layer in layers.values()}
    assert quant in kinds  # Linear weights stay in their GGML type on the device
    if quant not in ("BF16",):
        packed = [layer for layer in layers.values() if layer.kind.name == quant]
        assert all(layer.weight.dtype == torch.uint8 for layer in packed)
        assert all(layer.weight.numel() == layer.kind.tensor_bytes(layer.logical_shape) for layer in packed)
    reference = load_single_file_components(comfy_reference_file(path, tmp_path / "ref.safetensors", torch.float32),
                                            "cpu", torch.float32)  # fmt: skip
    assert not gguf_layers(reference.transformer)
    torch.testing.assert_close(sample(comps), sample(reference), rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["float32", "bfloat16", "target"])
def test_dequant_dtype_is_comfyui_gguf_s_choice(tmp_path, states, mode):
    """UnetLoaderGGUFAdvanced's dequant_dtype: the same file, other arithmetic, each equal to ComfyUI-GGUF's."""
    path = write_gguf(tmp_path / "flux-Q5_1.gguf", states("flux"), "flux", "Q5_1")
    comps = load_single_file_components(path, "cpu", torch.float32, dequant_dtype=mode)
    assert {layer.dequant_dtype for layer in gguf_layers(comps.transformer).values()} == {mode}
    ref_file = comfy_reference_file(path, tmp_path / "ref.safetensors", torch.float32, mode)
    reference = load_single_file_components(ref_file, "cpu", torch.float32)
    ours = sample(comps)
    torch.testing.assert_close(ours, sample(reference), rtol=0, atol=0)
    default = sample(load_single_file_components(path, "cpu", torch.float32))
    assert (ours - default).abs().max() > 0  # the arithmetic is not the default's


@pytest.mark.parametrize("family, quant", [("flux", "Q4_0"), ("qwen-image", "Q8_0")])
def test_bf16_compute_equals_the_dequantised_weights_in_bf16(tmp_path, states, family, quant):
    """(Wan keeps its time embedder in float32, as diffusers does: there the weights are dequantised for float32.)"""
    path = write_gguf(tmp_path / f"{family}-{quant}.gguf", states(family), ARCH[family], quant)
    comps = load_single_file_components(path, "cpu", torch.bfloat16)
    reference = load_single_file_components(
        comfy_reference_file(path, tmp_path / "ref.safetensors", torch.bfloat16), "cpu", torch.bfloat16
    )
    assert comps.adapter().dtype == torch.bfloat16
    torch.testing.assert_close(sample(comps), sample(reference), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_pipefusion_stages_read_only_their_gguf_share(tmp_path, states, family):
    quant = "Q8_0" if family == "flux" else "Q4_K"
    path = write_gguf(tmp_path / f"{family}.gguf", states(family), ARCH[family], quant, prefix="model.diffusion_model.")
    whole = load_single_file_components(path, "cpu", torch.float32).transformer
    whole_params = dict(whole.named_parameters())
    held = 0
    for stage in (0, 1):
        comps, plan, weights = load_single_file_stage(path, 2, stage, "cpu", torch.float32)
        params = dict(comps.transformer.named_parameters())
        assert params.keys() == whole_params.keys()
        loaded = {n for n, p in params.items() if p.device.type != "meta"}
        assert 0 < len(loaded) < len(params)
        for name in loaded:
            assert torch.equal(params[name], whole_params[name]), name  # the same blocks / values
        assert weights.param_bytes == sum(params[n].numel() * params[n].element_size() for n in loaded)
        assert weights.total_transformer_bytes == sum(p.numel() * p.element_size() for p in whole_params.values())
        assert 0 < weights.block_bytes < weights.all_block_bytes
        held += weights.block_bytes
    assert held == weights.all_block_bytes


def test_a_file_without_architecture_is_recognised_by_its_names(tmp_path, states):
    path = write_gguf(tmp_path / "sdcpp.gguf", states("flux"), None, "Q8_0")
    assert GGUFFile(path).architecture is None
    assert inspect_single_file(path).family == "flux"


def _llm_file(path: Path, arch: str, qtype: str = "Q8_0") -> Path:
    writer = gguf.GGUFWriter(path=None, arch=arch)
    values = torch.randn(64, 64).numpy()
    kind = gguf.GGMLQuantizationType[qtype]
    data = gguf.quants.quantize(values, kind) if qtype in ("Q8_0", "F32") else torch.randint(0, 255, (64, 66)).byte()
    writer.add_tensor("blk.0.attn_q.weight", data if qtype in ("Q8_0", "F32") else data.numpy(), raw_dtype=kind)
    writer.add_tensor("output_norm.weight", torch.ones(64).numpy(), raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "arch, expected",
    [
        ("llama", "text-encoder GGUF"),
        ("t5", "Parallel Text Encode"),
        ("gemma3", "not a diffusion-transformer GGUF"),
        ("cosmos", "load this file with ComfyUI-GGUF"),
    ],
)
def test_files_that_are_not_our_transformers_are_refused_by_architecture_and_types(tmp_path, arch, expected):
    path = _llm_file(tmp_path / f"{arch}.gguf", arch)
    with pytest.raises(ConfigError, match=expected) as err:
        inspect_single_file(path)
    assert repr(arch) in str(err.value) and "Q8_0 x1" in str(err.value) and "F32 x1" in str(err.value)


def test_unsupported_quant_types_are_refused_naming_the_types_found(tmp_path):
    path = _llm_file(tmp_path / "iq2.gguf", "flux", "IQ2_XXS")
    with pytest.raises(ConfigError, match="IQ2_XXS") as err:
        inspect_single_file(path)
    assert "types found: IQ2_XXS x1, F32 x1" in str(err.value)


def test_wan_without_its_5d_patch_embedding_names_the_fix(tmp_path, states):
    state = {k: v for k, v in states("wan").items() if k != "patch_embedding.weight"}
    path = write_gguf(tmp_path / "wan-raw.gguf", state, "wan", "Q8_0")
    with pytest.raises(ConfigError, match="fix_5d_tensors.py"):
        inspect_single_file(path)


def test_a_truncated_file_is_refused_before_loading(tmp_path, states):
    path = write_gguf(tmp_path / "flux.gguf", states("flux"), "flux", "Q8_0")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 4096])
    with pytest.raises(ConfigError, match="truncated or damaged"):
        inspect_single_file(cut)


def test_gguf_linear_holds_blocks_and_dequantises_per_call(tmp_path, states):
    path = write_gguf(tmp_path / "wan.gguf", states("wan"), "wan", "Q4_K")
    comps = load_single_file_components(path, "cpu", torch.float32)
    layer = next(m for m in gguf_layers(comps.transformer).values() if m.kind.name == "Q4_K")
    assert isinstance(layer, GGUFLinear) and layer.weight.shape == (layer.out_features, layer.in_features // 256 * 144)
    x = torch.randn(3, layer.in_features)
    expected = torch.nn.functional.linear(x, layer.compute_weight(torch.float32), layer.bias)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)
