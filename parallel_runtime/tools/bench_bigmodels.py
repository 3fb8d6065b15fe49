"""``python -m parallel_runtime bench bigmodels``: what each rank holds of the big models, and what loading costs.

- ``weight_gb_per_rank`` / ``weight_gb_per_rank_fp8``: for FLUX.1-dev, Qwen-Image and FLUX.2-dev at their
  real (shipped) configs, the weights the largest PipeFusion stage holds at pp 1/2/4 (blocks of the stage +
  embedding or output layers), in GB (1e9 bytes), computed from the configs on the "meta" device (no
  weights needed): bf16, and fp8 = every block Linear weight one byte, the rest bf16.
- measured on a generated Qwen-Image-shaped file (random weights, a few hundred MB): the bytes each rank
  of a pp=2 pool loaded (equal to the planner's prediction), and the peak RSS increase of a worker while
  loading: its half against a full load (``stage_load_peak_rss_ratio_pp2``), and of an fp8 file against the
  share it holds (``fp8_load_peak_rss_ratio``); load seconds per rank.
Peaks are read from the worker's /proc/self/status (VmHWM, reset before the load through clear_refs).
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..models.families import flux, flux2, qwen_image
from ..models.families.registry import family_of_variant
from ..parallel.config import ParallelConfig
from ..parallel.layout import ModelInfo
from ..parallel.stages import plan_stages
from ..runtime.jobs import JobContext
from ..runtime.pool import WorkerPool

REAL = (flux.DEV, qwen_image.QWEN_IMAGE, flux2.DEV)  # the shipped configs of the models measured at real size
GB = 1e9


def _package_path(folder: Path) -> str:
    """``folder`` relative to the package (``models/families/<family>/configs/<variant>``)."""
    return folder.relative_to(Path(__file__).resolve().parent.parent).as_posix()


def real_weight_gb(storage: str) -> dict[str, dict[str, float]]:
    """{family: {"pp1", "pp2", "pp4"}} GB held by the largest stage, bf16 compute (see the module doc)."""
    import diffusers

    from ..models.single_file import shipped_config
    from ..models.weight_budget import weight_budget

    out = {}
    for variant in REAL:
        family = family_of_variant(variant).id
        config, _ = shipped_config(variant)
        budget = weight_budget(getattr(diffusers, config["_class_name"]), config, 2, storage=storage)
        info = ModelInfo(family, 1, len(budget.blocks), 1, budget.total, budget.blocks, budget.embed, budget.final)
        out[family] = {f"pp{pp}": round(max(info.stage_bytes(info.stage_counts(pp))) / GB, 3) for pp in (1, 2, 4)}
    return out


# -- a Qwen-Image-shaped file big enough to measure ----------------------------------------------------
def write_qwen_shaped_file(path: str | os.PathLike, width: int = 1024, blocks: int = 4, fp8: bool = False) -> Path:
    """A Qwen-Image transformer file (original layout) of ``blocks`` blocks ``width`` wide with seeded random
    weights, written tensor by tensor; with ``fp8`` its Linear weights are ComfyUI "fp8 scaled"."""
    from diffusers import QwenImageTransformer2DModel

    from ..models.fp8 import quantise_per_tensor
    from ..models.tensor_files import write_tensors

    config = dict(
        num_layers=blocks, attention_head_dim=128, num_attention_heads=width // 128, joint_attention_dim=width
    )
    with torch.device("meta"):
        model = QwenImageTransformer2DModel(**config)
    shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    for name, p in model.state_dict().items():
        linear = name.endswith(".weight") and p.ndim == 2
        shapes[name] = (torch.float8_e4m3fn if fp8 and linear else torch.bfloat16, tuple(p.shape))
        if fp8 and linear:
            shapes[name[: -len("weight")] + "scale_weight"] = (torch.float32, ())
    if fp8:
        shapes["scaled_fp8"] = (torch.float8_e4m3fn, (0,))
    gen = torch.Generator().manual_seed(0)
    cache: dict[str, torch.Tensor] = {}

    def make(name: str) -> torch.Tensor:
        if name == "scaled_fp8":
            return torch.empty(0)
        if name.endswith(".scale_weight"):
            return cache.pop(name)
        dtype, shape = shapes[name]
        value = torch.randn(shape, generator=gen) / (shape[-1] ** 0.5 if len(shape) == 2 else 1.0)
        if dtype == torch.float8_e4m3fn:
            value, scale = quantise_per_tensor(value)
            cache[name[: -len("weight")] + "scale_weight"] = scale
        return value

    ordered = {k: shapes[k] for k in sorted(shapes, key=lambda k: (k.endswith(".scale_weight"), k))}
    return write_tensors(path, ordered, make)


# -- measuring a load inside a worker ------------------------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure_load(ctx: JobContext, path: str, dtype: str = "bf16", staged: bool = True) -> dict[str, Any]:
    """Worker job: load ``path`` (this rank's PipeFusion stage when ``staged``, else the whole transformer)
    and report the peak RSS increase during the load, the RSS still held after it, the weight bytes held
    and the seconds taken. Imports and a first reading of the file's header and conversion plan happen
    before measuring, and freed heap memory is handed back to the system (malloc_trim), so the baseline is
    what the process really uses and the load cannot hide in memory freed earlier."""
    from ..models.single_file import load_single_file_transformer, single_file_tensor_source
    from ..pipefusion.stage_loading import load_single_file_stage
    from ..service.load_job import torch_dtype

    def load() -> tuple[Any, int]:
        if staged:
            pp, stage = ctx.mesh.size("pp"), ctx.mesh.rank("pp")
            comps, _, weights = load_single_file_stage(path, pp, stage, ctx.device, torch_dtype(dtype))
            return comps.transformer, weights.param_bytes
        model, _, _ = load_single_file_transformer(path, ctx.device, torch_dtype(dtype))
        return model, sum(p.numel() * p.element_size() for p in model.parameters())

    single_file_tensor_source(path)  # imports, header, conversion plan: done once, then freed
    gc.collect()
    _trim_heap()
    before = _status_kib("VmRSS") * 1024
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # reset VmHWM (the peak) to the current RSS
    t0 = time.perf_counter()
    model, held = load()  # held until measured
    seconds = time.perf_counter() - t0
    after = _status_kib("VmRSS") * 1024
    peak = _status_kib("VmHWM") * 1024
    del model
    return {
        "rank": ctx.rank,
        "held_bytes": held,
        "peak_increase": peak - before,
        "kept_increase": after - before,
        "seconds": seconds,
    }


def _trim_heap() -> None:
    """Give freed heap memory back to the system (glibc), so RSS is what is in use."""
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _measure(path: Path, pp: int, staged: bool) -> list[dict[str, Any]]:
    with WorkerPool(f"cpu:{pp}", ParallelConfig(pp=pp), threads_per_worker=1) as pool:
        return pool.submit(measure_load, str(path), "bf16", staged, result_rank="all").result(1800)


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; ``quick`` measures a smaller generated file."""
    from ..models.model_info import model_info_from_path

    width, blocks = (512, 4) if quick else (1024, 6)
    results: dict[str, Any] = {
        "model": "FLUX.1-dev, Qwen-Image, FLUX.2-dev at their shipped configs on the meta device (weights per "
        f"rank: byte accounting, no weights, no GPU); loads measured on a Qwen-Image-shaped file of {blocks} blocks, "
        f"{width} wide, random weights, bf16 compute, CPU ranks",
        "baseline": "peak RSS ratios: a full load of the same file in one process (stage) / the bytes the rank "
        "holds (fp8)",
        "weight_gb_per_rank": real_weight_gb("auto"),
        "weight_gb_per_rank_fp8": real_weight_gb("fp8_e4m3fn"),
        "real_configs": {family_of_variant(v).id: _package_path(family_of_variant(v).config_folder(v)) for v in REAL},
        "measured_file": f"Qwen-Image-shaped, {blocks} blocks {width} wide, random weights, bf16 compute",
    }
    with tempfile.TemporaryDirectory(prefix="bigmodels-bench-") as tmp:
        bf16 = write_qwen_shaped_file(Path(tmp) / "qwen_image_bf16.safetensors", width, blocks)
        fp8 = write_qwen_shaped_file(Path(tmp) / "qwen_image_fp8_e4m3fn_scaled.safetensors", width, blocks, fp8=True)
        results["file_bytes"] = {"bf16": bf16.stat().st_size, "fp8": fp8.stat().st_size}
        full = _measure(bf16, 1, staged=False)[0]
        halves = _measure(bf16, 2, staged=True)
        fp8_halves = _measure(fp8, 2, staged=True)
        predicted = model_info_from_path(bf16, dtype="bf16")
        results["measured_bytes_per_rank_pp2"] = [r["held_bytes"] for r in halves]
        results["predicted_bytes_per_rank_pp2"] = predicted.stage_bytes(plan_stages(predicted.num_layers, 2).counts)
        results["planner_bytes_per_rank_pp2"] = predicted.stage_bytes(predicted.stage_counts(2))
        results["full_load"] = full
        results["stage_loads_pp2"] = halves
        results["fp8_stage_loads_pp2"] = fp8_halves
        results["stage_load_peak_rss_ratio_pp2"] = max(r["peak_increase"] for r in halves) / full["peak_increase"]
        results["fp8_load_peak_rss_ratio"] = max(r["peak_increase"] / r["held_bytes"] for r in fp8_halves)
        results["bf16_stage_peak_over_share"] = max(r["peak_increase"] / r["held_bytes"] for r in halves)
        results["load_seconds"] = {
            "full": full["seconds"],
            "stage_pp2": [r["seconds"] for r in halves],
            "fp8_stage_pp2": [r["seconds"] for r in fp8_halves],
        }
    return results
