"""GGUF files from ComfyUI graphs: the Parallel Model Loader lists .gguf transformers from models/unet and
models/diffusion_models, offers ComfyUI-GGUF's dequant_dtype choices, refuses what is not a transformer
before any worker starts, and says what each rank holds; the auto layout counts GGML bytes and splits a Q4
model that no rank can hold whole; a pp=2 rank's peak host memory while loading its share stays below 1.2x it."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import pytest
import torch
from node_helpers import LOAD, RecordingBridge  # tests/ helpers
from pack_import import load_pack

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.model_info import model_info_from_path
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.layout import LayoutRequest, activation_bytes, plan_layout
from parallel_runtime.parallel.machine import MachineInfo
from parallel_runtime.service.choices import DEQUANT_DTYPES

load_pack()
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.model_files import model_choices, resolve_model  # noqa: E402

DATA = Path(__file__).parent / "data"
FLUX = DATA / "gguf" / "tiny_flux_Q8_0.gguf"
WAN = DATA / "gguf" / "tiny_wan_Q4_K.gguf"


def _folders(tmp_path: Path) -> RecordingBridge:
    (tmp_path / "unet").mkdir()
    (tmp_path / "diffusion_models" / "wan").mkdir(parents=True)
    shutil.copy(FLUX, tmp_path / "unet" / "flux1-dev-Q8_0.gguf")
    shutil.copy(WAN, tmp_path / "diffusion_models" / "wan" / "wan2.1-t2v-14b-Q4_K_M.GGUF")
    (tmp_path / "unet" / "notes.txt").write_text("not a model")
    return RecordingBridge(folders={"diffusion_models": [str(tmp_path / "diffusion_models"), str(tmp_path / "unet")]})


def test_gguf_files_are_listed_from_unet_and_diffusion_models(tmp_path):
    bridge = _folders(tmp_path)
    choices = model_choices(bridge)
    assert "flux1-dev-Q8_0.gguf" in choices and "wan/wan2.1-t2v-14b-Q4_K_M.GGUF" in choices
    assert "notes.txt" not in choices
    assert resolve_model("flux1-dev-Q8_0.gguf", bridge) == str(tmp_path / "unet" / "flux1-dev-Q8_0.gguf")


def test_the_loader_offers_comfyui_gguf_s_dequant_dtype_choices():
    inputs = ParallelModelLoader.INPUT_TYPES()["optional"]
    choices, options = inputs["dequant_dtype"]
    assert tuple(choices) == DEQUANT_DTYPES == ("default", "target", "float32", "float16", "bfloat16")
    assert options["default"] == "default"


def _llm(path: Path) -> Path:
    writer = gguf.GGUFWriter(path=None, arch="qwen2")
    writer.add_tensor("blk.0.ffn_up.weight", gguf.quants.quantize(torch.randn(64, 64).numpy(), gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # fmt: skip
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_loader_refuses_before_any_worker_starts(tmp_path):
    bridge = _folders(tmp_path)
    _llm(tmp_path / "unet" / "qwen2.5-7b-instruct-q4_k_m.gguf")
    loader = ParallelModelLoader(NodeContext.create(registry=object(), bridge=bridge))
    args = dict(family="auto", layout="manual", **LOAD)
    with pytest.raises(ConfigError, match="general.architecture 'qwen2'; Q8_0 x1"):
        loader.load(model="qwen2.5-7b-instruct-q4_k_m.gguf", **args)
    with pytest.raises(ConfigError, match="dequant_dtype 'float64'"):
        loader.load(model="flux1-dev-Q8_0.gguf", dequant_dtype="float64", **args)
    with pytest.raises(ConfigError, match="asked to be stored in fp8"):
        loader.load(model="flux1-dev-Q8_0.gguf", weights="fp8_e4m3fn", **args)
    assert bridge.freed == []


def test_the_node_loads_a_gguf_split_and_says_what_each_rank_holds(pool_registry, tmp_path):
    bridge = _folders(tmp_path)
    loader = ParallelModelLoader(NodeContext.create(registry=pool_registry, bridge=bridge))
    result = loader.load(
        model="flux1-dev-Q8_0.gguf", family="auto", layout="manual", **{**LOAD, "pipefusion": 2},
        dequant_dtype="float32",
    )  # fmt: skip
    (handle,) = result["result"]
    text = result["ui"]["text"][0]
    assert "flux" in text and "GGUF Q8_0 x" in text and "each rank holds at most" in text
    assert handle.request.dequant_dtype == "float32"
    model = handle.model()
    held = [r["param_bytes"] for r in model.info["pipefusion"]["ranks"]]
    info = model_info_from_path(FLUX, dtype="fp32")
    assert sum(held) < 1.2 * info.weight_bytes  # the two stages hold the file's share each, GGML bytes
    assert info.weight_bytes < 0.6 * model_info_from_path(FLUX, dtype="fp32", storage="compute").weight_bytes


def test_auto_layout_splits_a_q4_model_no_rank_can_hold_and_runs_it(cpu_pool):
    """The planner counts GGML bytes: a Wan Q4_K file that does not fit one rank (but its halves do) is split
    over two PipeFusion stages; the pool runs that layout and each rank holds what the planner said."""
    from parallel_runtime.service.load_job import load_model

    info = model_info_from_path(WAN, dtype="fp32")
    dense = model_info_from_path(WAN, dtype="fp32", storage="compute")
    assert info.weight_bytes < 0.3 * dense.weight_bytes and "GGUF Q4_K" in info.storage_note
    request = LayoutRequest(width=64, height=48, frames=9, cfg=1.0, reserve_bytes=0, text_tokens=6)
    half = max(info.stage_bytes(info.stage_counts(2)))
    memory = half + activation_bytes(info, request, 1, 1) + 1024
    assert memory - activation_bytes(info, request, 1, 1) < info.weight_bytes
    plan = plan_layout(MachineInfo.cpu(2, memory_bytes=2 * memory), info, request)
    assert plan.config == ParallelConfig(pp=2) and "GGUF Q4_K" in plan.reason
    pool = cpu_pool(plan.config)
    loaded = pool.submit(load_model, str(WAN), "fp32", "sdpa", plan.pp_stage_weights).result(300)
    held = [r["param_bytes"] for r in loaded["pipefusion"]["ranks"]]
    assert held == list(plan.stage_weight_bytes) and max(held) < info.weight_bytes


def test_peak_memory_loading_a_gguf_share_stays_below_1_2x_that_share(cpu_pool, tmp_path):
    """Each rank of a pp=2 pool loads its half of a ~250 MB Q8_0 file: its peak RSS rises by less than 1.2x
    the GGML bytes it then holds (no dequantised copy, no mapped file pages, one tensor in flight)."""
    from parallel_runtime.tools.bench_bigmodels import measure_load
    from parallel_runtime.tools.bench_gguf import qwen_tensors, write_qwen_gguf

    path = write_qwen_gguf(tmp_path / "qwen_image-Q8_0.gguf", qwen_tensors(1024, 6), "Q8_0")
    pool = cpu_pool(ParallelConfig(pp=2))
    ranks = pool.submit(measure_load, str(path), "bf16", True, result_rank="all").result(600)
    for r in ranks:
        assert r["held_bytes"] > 100 * 1024**2  # about half the file, in GGML blocks
        assert r["kept_increase"] >= 0.9 * r["held_bytes"]  # the measurement sees the weights
        assert r["peak_increase"] < 1.2 * r["held_bytes"], r


def test_gguf_text_encoders_are_listed_and_find_comfyui_s_tokenizer(tmp_path):
    """Parallel Text Encode lists .gguf encoders from models/text_encoders (and models/clip); a Qwen2.5-VL GGUF
    (llama.cpp's file names, e.g. Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf) uses the tokenizer ComfyUI ships."""
    from dit_parallel_pack.nodes.bridge import SHIPPED_TOKENIZERS
    from dit_parallel_pack.nodes.model_files import TEXT_ENCODER_OWN, resolve_text_encoder, text_encoder_choices

    clip, shipped = tmp_path / "clip", tmp_path / "comfy_text_encoders"
    clip.mkdir()
    (shipped / "qwen25_tokenizer").mkdir(parents=True)
    (clip / "Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf").write_bytes(b"")
    bridge = RecordingBridge(folders={"text_encoders": [str(clip)], SHIPPED_TOKENIZERS: [str(shipped)]})
    assert text_encoder_choices(bridge) == [TEXT_ENCODER_OWN, "Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf"]
    assert resolve_text_encoder("Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf", bridge) == (
        str(clip / "Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf"),
        str(shipped / "qwen25_tokenizer"),
    )
