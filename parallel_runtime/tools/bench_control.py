"""``python -m parallel_runtime bench control``: a Flux Union ControlNet beside the model, 1 rank, Ulysses 2 and
PipeFusion 2.

Model and ControlNet: the named configs below (random fp32 weights): a wider tiny FLUX.1 dev (a real diffusers
folder) and a Flux ControlNet in the InstantX / Union layout (diffusers' FluxControlNetModel file) of the same width,
with a union control type set (one more text token). The job: ``generate`` on a warm pool (euler, cfg 1), the
ControlNet's hint a latent of the image's size. Each time is the median seconds per sampling step, timed on the host
over a few steps, with and without the ControlNet, on one CPU rank and on Ulysses 2 (two CPU ranks).
``controlnet_share`` = (with - without) / with: the part of a step the ControlNet takes. Contenders run interleaved on
a warm pool, round by round in rotating order. Bytes: what each rank sent per step under Ulysses 2 with the
ControlNet minus without (measured in the collectives), against the formula for a ControlNet whose tokens stay split
like the model's (text and image tokens each split in balanced parts, the first ranks one more): per ControlNet
block one Ulysses attention, rank r holding t_r of the T tokens sends its q, k and v for the other ranks' heads,
3 x t_r x width x (n - 1) / n values, and the attention output of the other ranks' tokens for its own heads,
(T - t_r) x width / n values, at 4 bytes each. Gathering its tokens would add other operations and bytes;
``bytes_match`` says the measured bytes equal the formula on every rank and nothing else was sent.

PipeFusion 2 (2 patches, warmup 1; the ControlNet runs on stage 0 per patch, ``pipefusion/control_chain.py``): the
same timings, and the bytes stage 0 sends stage 1 per step for the ControlNet (``pp_control``) against the formula:
the residual of each of stage 1's blocks for every image token once per step, (stage 1's blocks) x image tokens x
width x 4 (cfg 1: one stream of one row). ``pipefusion_bytes_match`` says they are equal, stage 1 sent nothing of
the ControlNet and every other message's bytes equal the run without it (its tokens never leave stage 0).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..checkout import devtools_module
from ..denoise.control import ControlChain, ControlLink
from ..denoise.entries import Branch, CondEntry
from ..denoise.settings import SamplingSettings
from ..models.base import Conditioning
from ..parallel.config import ParallelConfig
from ..parallel.sharding import split_sizes
from ..parallel.stages import plan_stages
from ..runtime.jobs import JobContext
from ..runtime.pool import WorkerPool
from ..service.load_job import load_model
from ..service.model_jobs import generate

FP32 = 4
TEXT_TOKENS = 16
CONFIGS: dict[str, dict[str, int]] = {
    # name -> model (heads x 64 wide, double + single blocks), ControlNet blocks, image side in px, steps, repeats
    "flux-union-bench": dict(heads=8, double=2, single=4, cn_double=2, cn_single=2, pixels=384, steps=2, repeats=3),
    "flux-union-quick": dict(heads=4, double=1, single=2, cn_double=1, cn_single=1, pixels=128, steps=1, repeats=1),
}
UNION_TYPE = 3  # canny, one of the 10 control types of a Union file
PP_PATCHES, PP_WARMUP = 2, 1


def _controlnet_file(transformer_config: dict[str, Any], cfg: dict[str, int], path: Path) -> Path:
    """A random-weight Flux Union ControlNet of the model's width, saved as a single safetensors file."""
    from diffusers import FluxControlNetModel
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = FluxControlNetModel(
        patch_size=1,
        in_channels=transformer_config["in_channels"],
        num_layers=cfg["cn_double"],
        num_single_layers=cfg["cn_single"],
        attention_head_dim=transformer_config["attention_head_dim"],
        num_attention_heads=transformer_config["num_attention_heads"],
        joint_attention_dim=transformer_config["joint_attention_dim"],
        pooled_projection_dim=transformer_config["pooled_projection_dim"],
        guidance_embeds=transformer_config["guidance_embeds"],
        axes_dims_rope=transformer_config["axes_dims_rope"],
        num_mode=10,
    )
    with torch.no_grad():  # diffusers zero-initialises the output projections; give them weights to add
        for module in (*model.controlnet_blocks, *model.controlnet_single_blocks):
            module.weight.normal_(0.0, 0.02)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def generate_with_bytes(
    ctx: JobContext, positive: Branch, latent: torch.Tensor, settings: SamplingSettings
) -> dict[str, int]:
    """Worker job: ``generate``, then the bytes this rank sent per collective operation during it."""
    generate(ctx, positive, None, latent, settings, preview=False)
    return dict(ctx.mesh.stats.sent)


def _rounds(pool: WorkerPool, contenders: dict[str, Branch], latent: torch.Tensor, steps: int, repeats: int):
    """Seconds per step of each contender's jobs, interleaved round by round in rotating order."""
    settings = SamplingSettings(seed=1, steps=steps, cfg=1.0, sampler="euler", guidance=2.5)
    warm = SamplingSettings(seed=1, steps=1, cfg=1.0, sampler="euler")
    for positive in contenders.values():  # loads the ControlNet, first-call kernels
        pool.submit(generate, positive, None, latent, warm, preview=False).result(600)
    out: dict[str, list[float]] = {label: [] for label in contenders}
    labels = list(contenders)
    for r in range(repeats):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            t0 = time.perf_counter()
            pool.submit(generate, contenders[label], None, latent, settings, preview=False).result(3600)
            out[label].append((time.perf_counter() - t0) / steps)
    return out


def _pipefusion_rounds(pool: WorkerPool, contenders: dict[str, Branch], latent: torch.Tensor, steps: int, repeats: int):
    """PipeFusion 2: seconds per step of each contender's jobs (interleaved, rotating) and each one's per-rank
    PipeFusionStats (sent bytes) of its last run."""
    from .bench_pipefusion import generate_with_stats

    settings = SamplingSettings(seed=1, steps=steps, cfg=1.0, sampler="euler", guidance=2.5)
    job = lambda positive: pool.submit(  # noqa: E731
        generate_with_stats, positive, None, latent, settings, PP_PATCHES, PP_WARMUP, result_rank="all"
    )
    stats = {label: job(positive).result(600) for label, positive in contenders.items()}  # warm, and the bytes
    out: dict[str, list[float]] = {label: [] for label in contenders}
    labels = list(contenders)
    for r in range(repeats):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            t0 = time.perf_counter()
            job(contenders[label]).result(3600)
            out[label].append((time.perf_counter() - t0) / steps)
    return out, {label: [rank["stats"] for rank in per_rank] for label, per_rank in stats.items()}


def pipefusion_bytes_formula(later_blocks: int, image_tokens: int, width: int, streams: int = 1) -> int:
    """Stage 0's bytes per step for the ControlNet under PipeFusion 2: the residual of each of the later stage's
    ``later_blocks`` blocks (all getting one) for every image token of every stream once, fp32."""
    return later_blocks * streams * image_tokens * width * FP32


def bytes_formula(text_tokens: int, image_tokens: int, width: int, blocks: int, ranks: int) -> list[int]:
    """Each rank's bytes per model call for ``blocks`` Ulysses attentions over split text and image tokens."""
    total = text_tokens + image_tokens
    local = [t + i for t, i in zip(split_sizes(text_tokens, ranks), split_sizes(image_tokens, ranks))]
    per_rank = [3 * t * width * (ranks - 1) // ranks + (total - t) * width // ranks for t in local]
    return [blocks * FP32 * values for values in per_rank]


def run(quick: bool = False, config: str | None = None) -> dict[str, Any]:
    """Run the benchmark on the named config (``quick``: the small one, a smoke test)."""
    name = config or ("flux-union-quick" if quick else "flux-union-bench")
    cfg = CONFIGS[name]
    build_tiny_pipeline = devtools_module("tiny", "bench control").build_tiny_pipeline
    with tempfile.TemporaryDirectory(prefix="control-bench-") as tmp:
        folder = build_tiny_pipeline(
            "tiny-flux", Path(tmp) / "tiny-flux", num_attention_heads=cfg["heads"], attention_head_dim=64,
            num_layers=cfg["double"], num_single_layers=cfg["single"],
        )  # fmt: skip
        tconfig = json.loads((folder / "transformer" / "config.json").read_text())
        control_file = _controlnet_file(tconfig, cfg, Path(tmp) / "flux_union.safetensors")
        gen = torch.Generator().manual_seed(0)
        side = cfg["pixels"] // 8
        channels = tconfig["in_channels"] // 4
        latent = torch.zeros(1, channels, side, side)
        cond = Conditioning(
            torch.randn(1, TEXT_TOKENS, tconfig["joint_attention_dim"], generator=gen),
            torch.randn(1, tconfig["pooled_projection_dim"], generator=gen),
        )
        hint = torch.randn(1, channels, side, side, generator=gen)
        chain = ControlChain((ControlLink(str(control_file), hint, 1.0, 0.0, 1.0, (UNION_TYPE,)),))
        plain, controlled = (CondEntry(cond),), (CondEntry(cond, control=chain),)
        steps, repeats = cfg["steps"], cfg["repeats"]
        timings: dict[str, list[float]] = {}
        sent: dict[str, list[dict[str, int]]] = {}
        with WorkerPool("cpu:1", ParallelConfig(), threads_per_worker=1) as pool:
            pool.submit(load_model, str(folder), "fp32", "sdpa").result(600)
            for label, values in _rounds(pool, {"control": controlled, "plain": plain}, latent, steps, repeats).items():
                timings[f"{label}_1rank"] = values
        with WorkerPool("cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1) as pool:
            pool.submit(load_model, str(folder), "fp32", "sdpa").result(600)
            for label, values in _rounds(pool, {"control": controlled, "plain": plain}, latent, steps, repeats).items():
                timings[f"{label}_ulysses2"] = values
            settings = SamplingSettings(seed=1, steps=steps, cfg=1.0, sampler="euler", guidance=2.5)
            for label, positive in (("control", controlled), ("plain", plain)):
                job = pool.submit(generate_with_bytes, positive, latent, settings, result_rank="all")
                sent[label] = job.result(600)
        with WorkerPool("cpu:2", ParallelConfig(pp=2), threads_per_worker=1) as pool:
            pool.submit(load_model, str(folder), "fp32", "sdpa").result(600)
            pp_times, pp_stats = _pipefusion_rounds(
                pool, {"control": controlled, "plain": plain}, latent, steps, repeats
            )
            for label, values in pp_times.items():
                timings[f"{label}_pipefusion2"] = values
    width = cfg["heads"] * 64
    formula = bytes_formula(TEXT_TOKENS + 1, (side // 2) ** 2, width, cfg["cn_double"] + cfg["cn_single"], 2)
    measured = [(c.get("ulysses", 0) - p.get("ulysses", 0)) // steps for c, p in zip(sent["control"], sent["plain"])]
    others = [
        {op: c.get(op, 0) - p.get(op, 0) for op in set(c) | set(p) if op not in ("ulysses", "meta")}
        for c, p in zip(sent["control"], sent["plain"])
    ]
    results: dict[str, Any] = {
        "config": name,
        "model": f"tiny FLUX.1 dev structure, random fp32 weights: hidden {width} ({cfg['heads']} heads x 64), "
        f"{cfg['double']} double + {cfg['single']} single blocks",
        "controlnet": f"Flux Union (InstantX layout), random fp32 weights: {cfg['cn_double']} double + "
        f"{cfg['cn_single']} single blocks, 10 control types (type {UNION_TYPE} set)",
        "image": f"{cfg['pixels']}x{cfg['pixels']} px: {(side // 2) ** 2} image tokens + {TEXT_TOKENS} text tokens",
        "baseline": "plain_*_step_s: the same job without the ControlNet on the same pool, interleaved",
        "steps_per_job": steps,
        "repeats": repeats,
    }
    for label, values in timings.items():
        results[f"{label}_step_s"] = statistics.median(values)
        results[f"{label}_samples_s"] = values
    for layout in ("1rank", "ulysses2", "pipefusion2"):
        with_cn, without = results[f"control_{layout}_step_s"], results[f"plain_{layout}_step_s"]
        results[f"controlnet_share_{layout}"] = (with_cn - without) / with_cn
    results["speedup_with_controlnet"] = results["control_1rank_step_s"] / results["control_ulysses2_step_s"]
    results["controlnet_bytes_per_step_per_rank"] = measured
    results["controlnet_bytes_per_step_formula"] = formula  # per rank; text + union token and image split
    results["controlnet_other_bytes_per_rank"] = others
    results["bytes_match"] = measured == formula and all(not any(o.values()) for o in others)
    later = len(plan_stages(cfg["double"] + cfg["single"], 2).blocks(1))
    pp_formula = pipefusion_bytes_formula(later, (side // 2) ** 2, width)
    first, second = sorted(pp_stats["control"], key=lambda s: s.stage)
    pp_measured = [s.sent_bytes.get("pp_control", 0) // steps for s in (first, second)]
    pp_others = [
        {op: c.sent_bytes.get(op, 0) - p.sent_bytes.get(op, 0) for op in set(c.sent_bytes) | set(p.sent_bytes)}
        for c, p in zip(pp_stats["control"], pp_stats["plain"])
    ]
    results["pipefusion"] = f"PipeFusion 2: {PP_PATCHES} patches, warmup {PP_WARMUP}, stage 1 holds {later} blocks"
    results["pipefusion_control_bytes_per_step_per_stage"] = pp_measured
    results["pipefusion_control_bytes_per_step_formula"] = [pp_formula, 0]
    results["pipefusion_bytes_match"] = pp_measured == [pp_formula, 0] and all(
        not any(v for op, v in o.items() if op not in ("pp_control", "meta")) for o in pp_others
    )
    return results
