"""``python -m parallel_runtime bench gguf``: GGUF files split across ranks, and what per-layer dequantisation costs.

- ``weight_gb_per_rank_gguf``: {family: {quant: {"pp1", "pp2", "pp4"}}}: the weights the largest PipeFusion stage
  holds (GB, 1e9 bytes; blocks of the stage + embedding or output layers) for Q8_0 and Q4_K_M files of FLUX.1-dev,
  Qwen-Image, FLUX.2-dev and one Wan 2.2 A14B expert at their shipped configs. Byte accounting on the "meta"
  device, no file: each tensor's GGML type as city96's llama.cpp quantiser patch (ComfyUI-GGUF's tools) chooses
  it (:func:`gguf_type`), bf16 compute; ``weight_gb_per_rank_bf16`` the same models in bf16 for comparison.
- ``stage_load_peak_rss_ratio``: {quant: the larger of the two ranks'}: measured: each rank of a pp=2 layout
  loads its share of a generated Qwen-Image-shaped Q8_0 / Q4_K / Q5_1 GGUF file in a fresh process, after a
  warm-up load (:mod:`.bench_gguf_rss`); its peak RSS increase over the GGML bytes it then holds.
- ``dequant_step_overhead``: the step time (one transformer forward, CPU, float32 compute) of the same
  Qwen-Image-shaped model with Q8_0 / Q4_K GGUF weights over the time with its bf16 file's weights.
"""

from __future__ import annotations

import math
import re
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..models.families import flux, flux2, qwen_image, wan
from ..models.families.registry import family_of_variant
from ..models.families.spec import GGUFFacts
from ..parallel.layout import ModelInfo

REAL = (flux.DEV, qwen_image.QWEN_IMAGE, flux2.DEV, wan.T2V_14B)  # shipped configs (Wan: one A14B expert's size)
QUANTS = ("Q8_0", "Q4_K_M")
RSS_QUANTS = ("Q8_0", "Q4_K", "Q5_1")  # stage_load_peak_rss_ratio
GB = 1e9


def gguf_type(facts: GGUFFacts, name: str, shape: tuple[int, ...], quant: str) -> str:
    """The GGML type of the diffusers tensor ``name`` in a ``quant`` file made by ComfyUI-GGUF's tools (``facts``:
    the family's): F32 for 1-D and small (<= 1024 values) tensors; the converted BF16 for other non-2-D tensors
    and the layers the quantiser keeps; else ``quant`` (Q4_K_M: Q4_K, or the family's upgrades), F16 where a K
    type's rows are not whole 256-value blocks."""
    if len(shape) <= 1 or math.prod(shape) <= 1024:
        return "F32"
    if len(shape) != 2 or name.startswith(facts.quantiser_keeps):
        return "BF16"
    kind = "Q8_0"
    if quant == "Q4_K_M":
        kind = next((k for pattern, k in facts.q4_k_m.items() if re.fullmatch(pattern, name)), "Q4_K")
    return kind if not kind.endswith("_K") or shape[-1] % 256 == 0 else "F16"


def _held_budget(facts: GGUFFacts, config: dict[str, Any], quant: str | None):
    import diffusers

    from ..models.gguf.formats import BY_NAME
    from ..models.weight_budget import weight_budget
    from ..models.weights import TensorSource, meta_model

    cls = getattr(diffusers, config["_class_name"])
    if quant is None:
        return weight_budget(cls, config, 2)
    shapes = {n: tuple(p.shape) for n, p in meta_model(cls, config).named_parameters()}
    kinds = {n: BY_NAME[gguf_type(facts, n, s, quant)] for n, s in shapes.items()}
    source = TensorSource(
        "modelled GGUF", {n: math.prod(s) for n, s in shapes.items()}, None, shapes=shapes, ggml=kinds
    )
    return weight_budget(cls, config, 2, gguf_source=source)


def real_weight_gb(quant: str | None) -> dict[str, dict[str, float]]:
    """{family: {"pp1", "pp2", "pp4"}} GB held by the largest stage of a ``quant`` file (None: bf16)."""

    from ..models.single_file import shipped_config

    out = {}
    for variant in REAL:
        spec = family_of_variant(variant)
        config, _ = shipped_config(variant)
        budget = _held_budget(spec.gguf, config, quant)
        info = ModelInfo(spec.id, 1, len(budget.blocks), 1, budget.total, budget.blocks, budget.embed, budget.final)
        out[spec.id] = {f"pp{pp}": round(max(info.stage_bytes(info.stage_counts(pp))) / GB, 3) for pp in (1, 2, 4)}
    return out


# -- a Qwen-Image-shaped GGUF file ---------------------------------------------------------------------
def qwen_config(width: int, blocks: int) -> dict[str, Any]:
    return dict(num_layers=blocks, attention_head_dim=128, num_attention_heads=width // 128, joint_attention_dim=width)


def qwen_tensors(width: int, blocks: int, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Seeded random weights of a Qwen-Image transformer (its file names are diffusers'), one tensor at a time."""
    from diffusers import QwenImageTransformer2DModel

    with torch.device("meta"):
        model = QwenImageTransformer2DModel(**qwen_config(width, blocks))
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.state_dict().items():
        scale = p.shape[-1] ** -0.5 if p.ndim == 2 else 0.02
        yield name, torch.randn(p.shape, generator=gen) * scale + (1.0 if name.endswith("norm_q.weight") else 0.0)


def write_qwen_gguf(path: Path, tensors: Iterable[tuple[str, torch.Tensor]], quant: str) -> Path:
    """``tensors`` as a GGUF file: 2-D weights in ``quant`` (Q8_0 / Q5_1 quantised from the values; Q4_K random
    valid blocks of the same magnitude, F16 where rows are not whole blocks), the rest F32, written through a
    temporary file (one tensor in memory)."""
    import gguf  # alone in its block: ruff takes it for the checkout's folder when that folder is named "gguf"

    writer = gguf.GGUFWriter(str(path), arch="qwen_image", use_temp_file=True)
    gen = torch.Generator().manual_seed(0)
    for name, value in tensors:
        if value.ndim != 2:
            writer.add_tensor(name, value.float().numpy(), raw_dtype=gguf.GGMLQuantizationType.F32)
        elif quant == "Q4_K" and value.shape[-1] % 256:  # rows of partial K blocks: F16, as the quantiser does
            writer.add_tensor(name, value.half().numpy(), raw_dtype=gguf.GGMLQuantizationType.F16)
        elif quant in ("Q8_0", "Q5_1"):
            packed = gguf.quants.quantize(value.float().numpy(), gguf.GGMLQuantizationType[quant])
            writer.add_tensor(name, packed, raw_dtype=gguf.GGMLQuantizationType[quant])
        else:
            blocks = torch.randint(0, 256, (value.numel() // 256, 144), dtype=torch.uint8, generator=gen)
            factor = torch.tensor([0.2 / 255 / value.shape[-1] ** 0.5] * 2, dtype=torch.float16)
            blocks[:, 0:4] = factor.view(torch.uint8)
            packed = blocks.reshape(value.shape[0], -1).numpy()
            writer.add_tensor(name, packed, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_qwen_bf16(path: Path, width: int, blocks: int, seed: int) -> Path:
    """The same weights as ``qwen_tensors(width, blocks, seed)`` in a bf16 .safetensors file."""
    from ..models.tensor_files import write_tensors

    values = dict(qwen_tensors(width, blocks, seed))
    shapes = {name: (torch.bfloat16, tuple(v.shape)) for name, v in values.items()}
    return write_tensors(path, shapes, values.pop)


# -- measurements -----------------------------------------------------------------------------------
def measure_stage_rss(folder: Path, width: int, blocks: int) -> dict[str, list[dict[str, Any]]]:
    """{quant: each pp=2 rank's load of its share of a ``width`` x ``blocks`` Qwen-Image-shaped file}, each rank
    in a fresh process after a warm-up load of a two-block file of the same type (:mod:`.bench_gguf_rss`)."""
    from .bench_gguf_rss import stage_rss

    out = {}
    for quant in RSS_QUANTS:
        warmup = write_qwen_gguf(folder / f"warmup_{quant}.gguf", qwen_tensors(256, 2), quant)
        path = write_qwen_gguf(folder / f"qwen_image_{quant}.gguf", qwen_tensors(width, blocks), quant)
        out[quant] = [{"file_bytes": path.stat().st_size, **rank} for rank in stage_rss(path, warmup)]
        path.unlink()
    return out


def step_seconds(
    paths: dict[str, Path],
    width: int,
    tokens: int,
    rounds: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> dict[str, list[float]]:
    """Seconds of one transformer forward for each file's model on ``device`` in ``dtype``, rounds interleaved."""
    from ..models.single_file import load_single_file_transformer

    models = {label: load_single_file_transformer(p, device, dtype)[0] for label, p in paths.items()}
    gen = torch.Generator().manual_seed(0)
    side = int(math.isqrt(tokens))
    inputs = dict(
        hidden_states=torch.randn(1, side * side, 64, generator=gen).to(device, dtype),
        encoder_hidden_states=torch.randn(1, 32, width, generator=gen).to(device, dtype),
        encoder_hidden_states_mask=torch.ones(1, 32, dtype=torch.long, device=device),
        timestep=torch.tensor([0.5], device=device, dtype=dtype),
        img_shapes=[[(1, side, side)]],
    )
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {label: [] for label in models}
    with torch.no_grad():
        for model in models.values():
            model(**inputs)  # warm up
        for r in range(rounds):
            for label in list(models)[r % len(models) :] + list(models)[: r % len(models)]:
                sync()
                t0 = time.perf_counter()
                models[label](**inputs)
                sync()
                times[label].append(time.perf_counter() - t0)
    return times


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; ``quick`` uses smaller generated files."""
    width, blocks = (1024, 6) if quick else (1024, 12)  # shares over 100 MiB (quick: Q8_0's only)
    step_width, step_blocks, tokens, rounds = (512, 2, 256, 3) if quick else (1024, 2, 1024, 5)
    device, dtype, where = "cpu", torch.float32, "float32 compute, one CPU thread"
    if torch.cuda.is_available():  # the step on one GPU at Qwen-Image's real width, bf16 compute
        step_width, step_blocks, tokens, rounds = (1024, 2, 1024, 5) if quick else (3072, 2, 4096, 10)
        device, dtype, where = "cuda", torch.bfloat16, f"bf16 compute on {torch.cuda.get_device_name()}"
    results: dict[str, Any] = {
        "model": f"weights per rank: FLUX.1-dev, Qwen-Image, FLUX.2-dev, Wan 2.1/2.2 14B (one A14B expert) at their "
        "shipped configs on the meta device (byte accounting, types as city96's quantiser chooses them, bf16 "
        f"compute); RSS: Qwen-Image-shaped {'/'.join(RSS_QUANTS)} GGUFs of {blocks} blocks {width} wide, random "
        "weights, pp=2, each rank in a fresh process after a warm-up load; "
        f"step: a Qwen-Image-shaped transformer of {step_blocks} blocks {step_width} wide, {tokens} image + 32 text "
        f"tokens, {where}",
        "baseline": "weights: the same model in bf16 (weight_gb_per_rank_bf16); RSS: the GGML bytes the rank holds; "
        "step: the same model's bf16 file (weights upcast once, at load)",
        "weight_gb_per_rank_bf16": real_weight_gb(None),
        "weight_gb_per_rank_gguf": {},
    }
    for quant in QUANTS:
        for family, row in real_weight_gb(quant).items():
            results["weight_gb_per_rank_gguf"].setdefault(family, {})[quant] = row
    results["gguf_over_bf16_pp1"] = {
        family: {q: round(row[q]["pp1"] / results["weight_gb_per_rank_bf16"][family]["pp1"], 3) for q in QUANTS}
        for family, row in results["weight_gb_per_rank_gguf"].items()
    }
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="gguf-bench-") as tmp:
        loads = measure_stage_rss(Path(tmp), width, blocks)
        results["stage_loads_pp2"] = loads
        results["stage_load_peak_rss_ratio"] = {q: max(r["ratio"] for r in ranks) for q, ranks in loads.items()}
        paths = {"bf16": write_qwen_bf16(Path(tmp) / "qwen_image_bf16.safetensors", step_width, step_blocks, 1)}
        for quant in ("Q8_0", "Q4_K"):
            gguf_path = Path(tmp) / f"qwen_image_{quant}.gguf"
            paths[quant] = write_qwen_gguf(gguf_path, qwen_tensors(step_width, step_blocks, seed=1), quant)
        times = step_seconds(paths, step_width, tokens, rounds, device, dtype)
    medians = {label: statistics.median(t) for label, t in times.items()}
    results["step_seconds"] = {label: round(s, 4) for label, s in medians.items()}
    results["dequant_step_overhead"] = {q: round(medians[q] / medians["bf16"], 3) for q in ("Q8_0", "Q4_K")}
    return results
