"""``python -m parallel_runtime bench lora``: applying and swapping LoRAs on a warm pool vs reloading the model.

Model: a wider, deeper tiny Flux (random weights, a real diffusers folder) on 2 CPU ranks with Ulysses 2,
every rank holding the whole transformer. LoRAs: two kohya files of rank 16 over every linear layer of the
transformer blocks, under original-layout names (so fused q/k/v and linear1 are routed as for real files).
Each figure is one worker job that only brings the weights to a stack (no sampling), timed on the host;
swap, strength and the reloads are interleaved contenders (tools/measure.py), repeated, reported as medians:

- ``apply_s``: LoRA A on the pristine model (includes reading the file and keeping pristine copies);
- ``swap_s``: A <-> B (every touched group recomputed from its pristine values);
- ``strength_s``: the current LoRA at another strength; ``unpatch_s``: back to no LoRA;
- ``reload_s``: the same model unloaded and loaded from disk anew into the same warm pool (the baseline;
  afterwards the weights are brought back to the current LoRA, untimed).

"From disk" is meant literally for both sides: before ``swap_s`` (LoRA B's file) and ``reload_s`` (the
model's files) the files are dropped from the OS page cache (``posix_fadvise(DONTNEED)`` on our own
temporary files), as after a restart. ``reload_cached_s`` is the reload with the files still cached (a
fp32 CPU model is then little more than a memory copy, the most favourable case for reloading).
Target: ``swap_s <= 0.5 * reload_s``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..checkout import devtools_module
from ..models.families.registry import family_of_class_name
from ..models.lora.files import lora_file_id
from ..models.lora.patcher import StackEntry
from ..models.lora.skeleton import original_skeleton
from ..parallel.config import ParallelConfig
from ..runtime.jobs import JobContext
from ..runtime.pool import WorkerPool
from ..service.load_job import load_model, loaded_model, unload
from ..service.lora_state import bring_to_stack
from .measure import interleave, ratio

RANK = 16


def apply_stack(ctx: JobContext, stack: tuple[StackEntry, ...]) -> dict[str, Any]:
    """Worker job: bring the loaded transformer to ``stack``; this rank's seconds and counts."""
    model = loaded_model(ctx)
    t0 = time.perf_counter()
    counts = bring_to_stack(model, stack, "transformer")
    seconds = time.perf_counter() - t0
    pristine = getattr(model.lora, "pristine_bytes", 0) if model.lora is not None else 0
    return {"seconds": seconds, **counts, "pristine_bytes": pristine}


def write_lora(config: dict[str, Any], path: Path, seed: int) -> int:
    """A kohya LoRA (rank RANK, alpha RANK/2) on every 2-D block weight; returns its parameter count."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    family = family_of_class_name(config["_class_name"]).id
    for name, shape in original_skeleton(family, config).items():
        if len(shape) != 2 or not name.endswith(".weight") or "blocks." not in name:
            continue
        base = "lora_unet_" + name[: -len(".weight")].replace(".", "_")
        tensors[f"{base}.lora_down.weight"] = torch.randn(RANK, shape[1], generator=gen) * 0.02
        tensors[f"{base}.lora_up.weight"] = torch.randn(shape[0], RANK, generator=gen) * 0.02
        tensors[f"{base}.alpha"] = torch.tensor(RANK / 2)
    save_file(tensors, str(path))
    return sum(t.numel() for t in tensors.values())


def drop_from_page_cache(*paths: Path) -> None:
    """Write our files' dirty pages and drop them from the page cache (Linux; a no-op elsewhere)."""
    import os

    files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed(pool: WorkerPool, *args: Any) -> tuple[float, list[dict[str, Any]]]:
    t0 = time.perf_counter()
    per_rank = pool.submit(*args, result_rank="all").result(3600)
    return time.perf_counter() - t0, per_rank


class _Contenders:
    """The interleaved contenders on one warm pool; ``current`` is the stack the weights hold."""

    def __init__(self, pool: WorkerPool, folder: Path, files: list[Path]) -> None:
        self.pool, self.folder, self.files = pool, folder, files
        self.ids = [lora_file_id(f) for f in files]
        self.current: tuple[StackEntry, ...] = (StackEntry(self.ids[0], 1.0),)

    def swap(self) -> float:
        """To the other LoRA (its file dropped from the page cache first)."""
        other = 1 if self.current[0].file == self.ids[0] else 0
        drop_from_page_cache(self.files[other])
        self.current = (StackEntry(self.ids[other], 1.0),)
        return _timed(self.pool, apply_stack, self.current)[0]

    def strength(self) -> float:
        """The same LoRA at another strength."""
        entry = self.current[0]
        self.current = (StackEntry(entry.file, 0.5 if entry.strength_model == 1.0 else 1.0),)
        return _timed(self.pool, apply_stack, self.current)[0]

    def reload(self, cold: bool) -> float:
        """The model unloaded and loaded anew (timed), then brought back to the current stack (untimed)."""
        self.pool.submit(unload).result(600)
        if cold:
            drop_from_page_cache(self.folder)
        t0 = time.perf_counter()
        self.pool.submit(load_model, str(self.folder), "fp32", "sdpa").result(600)
        seconds = time.perf_counter() - t0
        _timed(self.pool, apply_stack, self.current)
        return seconds


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; ``quick`` uses a smaller model and one round (a smoke test)."""
    import json

    build_tiny_pipeline = devtools_module("tiny", "bench lora").build_tiny_pipeline

    heads, layers, singles = (4, 2, 4) if quick else (8, 4, 8)
    repeats = 1 if quick else 5
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        folder = build_tiny_pipeline(
            "tiny-flux", Path(tmp) / "tiny-flux", num_attention_heads=heads, attention_head_dim=64, num_layers=layers,
            num_single_layers=singles,
        )  # fmt: skip
        config = json.loads((folder / "transformer" / "config.json").read_text())
        files = [Path(tmp) / f"lora_{label}.safetensors" for label in "AB"]
        lora_params = [write_lora(config, f, seed) for seed, f in enumerate(files)]
        layout = ParallelConfig(ulysses=2)
        results: dict[str, Any] = {
            "model": f"tiny-flux folder, random fp32 weights: hidden {heads * 64} ({heads} heads x 64), "
            f"{layers} double + {singles} single blocks",
            "baseline": "reload_s: the same model unloaded and loaded from disk anew into the same warm pool "
            "(files dropped from the page cache)",
            "lora": f"kohya rank {RANK} on every block linear ({lora_params[0] / 1e6:.1f} M parameters per file)",
            "layout": f"{layout.describe()} on cpu:2",
            "repeats": repeats,
        }
        with WorkerPool("cpu:2", layout, threads_per_worker=1) as pool:
            info = pool.submit(load_model, str(folder), "fp32", "sdpa").result(600)
            results["transformer_bytes"] = info["transformer_bytes"]
            bench = _Contenders(pool, folder, files)
            results["apply_s"], first = _timed(pool, apply_stack, bench.current)
            results["groups_patched"] = first[0]["recomputed"]
            results["pristine_bytes_per_rank"] = max(r["pristine_bytes"] for r in first)
            times = interleave(
                {
                    "swap": bench.swap,
                    "strength": bench.strength,
                    "reload": lambda: bench.reload(cold=True),
                    "reload_cached": lambda: bench.reload(cold=False),
                },
                repeats=repeats,
            )
            results["unpatch_s"], _ = _timed(pool, apply_stack, ())
    results["seconds"] = {name: s.summary() for name, s in times.items()}
    for name, s in times.items():
        results[f"{name}_s"] = s.median
    results["reload_over_swap"] = ratio(times, "reload", "swap")
    results["swap_vs_reload"] = results["swap_s"] / results["reload_s"]
    results["target_met"] = results["swap_s"] <= 0.5 * results["reload_s"]
    return results
