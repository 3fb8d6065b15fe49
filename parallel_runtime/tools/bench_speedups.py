"""``python -m parallel_runtime bench speedups``: caches, compiled blocks and Ulysses 2 on the trained
tiny-flux-shapes, beside cache-dit's DBCache on diffusers' FluxPipeline with the same model.

Every generation: 28 steps, euler / simple, cfg 2 (the negative prompt empty), the model's native 128x128
px, one of 8 prompts x 2 seeds. Baseline: the plain single-rank run of the same prompt and seed (1 rank x
1 thread, eager, no cache). Contenders, each in its own warm pool of one-thread ranks:

- ``easycache``: Parallel EasyCache at ComfyUI's defaults (0.2, 15%..95%); ``lazycache`` likewise;
- ``blockcache``: the block cache at :data:`BLOCK_CACHE` (1 rank);
- ``compiled``: compiled blocks (1 rank; a step-time figure, the same steps as the baseline);
- ``ulysses2``: Ulysses 2 alone, on 2 ranks x 1 thread (what a second rank buys on this machine);
- ``combined_ulysses2``: Ulysses 2 + the block cache at :data:`COMBINED_BLOCK_CACHE` (a higher threshold:
  the 30 dB target leaves room) + compiled blocks, on 2 ranks x 1 thread;
- cache-dit (``pip install 'dit-parallel[bench]'``): diffusers' FluxPipeline on the same model files with
  true CFG (``true_cfg_scale`` 2, negative ""), the same steps and seeds, each cached pipeline its own
  instance with DBCache F1B0 (``Fn_compute_blocks`` 1: the model has 2 + 4 blocks, cache-dit's default 8
  would not fit) and ``enable_separate_cfg=True`` (the two branches are separate passes), at thresholds
  0.08 / 0.12 / 0.16; its baseline is the uncached FluxPipeline of the same seed; the best threshold is the
  fastest one, reported with the PSNR it reaches.

Speedups are ratios of median seconds, with the range of the per-round paired ratios (one round = every
contender once on the same prompt and seed, in rotating order); PSNR is of the decoded picture (0..1)
against the baseline's, the mean over the rounds (and the lowest). Targets: the block cache at least as fast as cache-dit's best at an equal or better
PSNR; ``combined_speedup_ulysses2`` >= 3.0 at PSNR >= 30 dB.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ..denoise.caching.specs import BlockCacheSpec, StepCacheSpec
from ..denoise.settings import SamplingSettings
from ..models.builtin import builtin_model_path
from ..models.loading import load_pipeline_components
from ..models.text_encoding import encode_prompts
from ..parallel.config import ParallelConfig
from ..parallel.mesh import ParallelMesh
from ..runtime.pools import PoolRegistry
from ..service.load_job import load_model
from ..service.model_jobs import generate
from ..vae.decode import decode_to_image_tensor
from ..vae.latent_space import to_vae_space
from .measure import Samples, interleave, ratio
from .report import machine

MODEL, STEPS, CFG, PX = "tiny-flux-shapes", 28, 2.0, 128
PROMPTS = (
    "a red circle on a blue background",
    "a green square on a yellow background",
    "a blue triangle on a white background",
    "a yellow circle on a green background",
    "a white square on a red background",
    "a red triangle on a yellow background",
    "a blue circle on a white background",
    "a green triangle on a blue background",
)
SEEDS = (0, 1)
BLOCK_CACHE = BlockCacheSpec(threshold=0.16, first_blocks=1, max_consecutive=3, warmup_steps=2)  # beside cache-dit
COMBINED_BLOCK_CACHE = BlockCacheSpec(threshold=0.25, first_blocks=1, max_consecutive=3, warmup_steps=2)
CACHEDIT_THRESHOLDS = (0.08, 0.12, 0.16)
TARGET_COMBINED, TARGET_COMBINED_PSNR = 3.0, 30.0


def psnr(image: torch.Tensor, reference: torch.Tensor) -> float:
    return float(10 * torch.log10(1.0 / (image - reference).pow(2).mean().clamp_min(1e-20)))


class Ours:
    """Our contenders: warm pools, one generation per call on the round's prompt and seed."""

    def __init__(self, registry: PoolRegistry, rounds: list[tuple[str, int]], conds: dict, vae: Any):
        self.registry, self.rounds, self.conds, self.vae = registry, rounds, conds, vae
        self.path = str(builtin_model_path(MODEL))
        self.images: dict[str, list[torch.Tensor]] = {}
        self.reused: dict[str, list[int]] = {}  # per generation: calls a cache answered (skipped / reused)

    def contender(
        self, name: str, config: ParallelConfig, compile_mode: str = "off", **caches: Any
    ) -> Callable[[], float]:
        pool = self.registry.get(f"cpu:{config.world_size}", config, key=(name,), threads_per_worker=1)
        pool.submit(load_model, self.path, "fp32", "sdpa", compile=compile_mode).result(600)
        calls = iter(range(10**6))
        self.images[name], self.reused[name] = [], []

        def run() -> float:
            prompt, seed = self.rounds[next(calls) % len(self.rounds)]
            settings = SamplingSettings(seed=seed, steps=STEPS, cfg=CFG, **caches)
            latent = torch.zeros(1, 16, PX // 8, PX // 8)
            events: list = []
            t0 = time.perf_counter()
            raw = pool.submit(
                generate,
                *self.conds[prompt],
                latent,
                settings,
                preview=False,
                on_event=lambda rank, kind, payload: events.append(payload) if kind == "cache" and rank == 0 else None,
            ).result(1200)
            seconds = time.perf_counter() - t0
            self.images[name].append(self.decode(raw))
            self.reused[name].append(sum(c.get("skipped", c.get("reused", 0)) for e in events for c in e))
            return seconds

        return run

    def decode(self, raw: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            z = to_vae_space(self.vae, raw)
            return decode_to_image_tensor(self.vae, z, ParallelMesh.single(), None, result_rank=0).clamp(0, 1)


class CacheDit:
    """cache-dit's contenders: diffusers' FluxPipeline, plain and with DBCache (its own instance each)."""

    def __init__(self, rounds: list[tuple[str, int]]):
        self.rounds = rounds
        self.images: dict[str, list[torch.Tensor]] = {}
        self.cached: dict[str, Any] = {}

    def contender(self, name: str, threshold: float | None) -> Callable[[], float]:
        import cache_dit
        from diffusers import FluxPipeline

        pipe = FluxPipeline.from_pretrained(str(builtin_model_path(MODEL)), torch_dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        if threshold is not None:
            config = cache_dit.DBCacheConfig(
                Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=threshold, enable_separate_cfg=True
            )
            cache_dit.enable_cache(pipe, cache_config=config)
            self.cached[name] = pipe
        calls = iter(range(10**6))
        self.images[name] = []

        def run() -> float:
            prompt, seed = self.rounds[next(calls) % len(self.rounds)]
            t0 = time.perf_counter()
            image = pipe(
                prompt=prompt,
                negative_prompt="",
                true_cfg_scale=CFG,
                num_inference_steps=STEPS,
                height=PX,
                width=PX,
                generator=torch.Generator().manual_seed(seed),
                output_type="pt",
            ).images
            seconds = time.perf_counter() - t0
            self.images[name].append(image[0].float().clamp(0, 1))
            return seconds

        return run


def _quality(images: dict[str, list[torch.Tensor]], name: str, baseline: str) -> dict[str, float]:
    values = [psnr(a, b) for a, b in zip(images[name], images[baseline])]
    return {"mean": sum(values) / len(values), "min": min(values)}


def run(quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(1)
    prompts, seeds = (PROMPTS[:2], SEEDS[:1]) if quick else (PROMPTS, SEEDS)
    rounds = [(p, s) for p in prompts for s in seeds]
    comps = load_pipeline_components(builtin_model_path(MODEL), "cpu", torch.float32)
    conds = {p: encode_prompts(comps, comps.family, p, "") for p in prompts}
    registry = PoolRegistry(max_pools=8)
    ours = Ours(registry, rounds, conds, comps.vae)
    res: dict[str, Any] = {
        "model": f"{MODEL} (trained, shipped: Flux.1 layout, 2 double + 4 single blocks, hidden 96 = 4 heads x 24, "
        f"16 latent channels, 512 T5 + CLIP tokens), {PX}x{PX} px (64 image tokens), {STEPS} steps euler / simple, "
        f"cfg {CFG} (negative ''), float32; {len(prompts)} prompts x {len(seeds)} seeds",
        "baseline": "the plain single-rank run (1 rank x 1 thread, eager, no cache) of the same prompt and seed; "
        "cache-dit: the uncached diffusers FluxPipeline of the same seed (1 thread)",
        "machine": machine(),
        "block_cache": BLOCK_CACHE.describe(),
        "combined_block_cache": COMBINED_BLOCK_CACHE.describe(),
        "rounds": len(rounds),
    }
    contenders = {
        "plain": ours.contender("plain", ParallelConfig()),
        "easycache": ours.contender("easycache", ParallelConfig(), step_cache=StepCacheSpec("easycache")),
        "lazycache": ours.contender("lazycache", ParallelConfig(), step_cache=StepCacheSpec("lazycache")),
        "blockcache": ours.contender("blockcache", ParallelConfig(), block_cache=BLOCK_CACHE),
        "compiled": ours.contender("compiled", ParallelConfig(), "blocks"),
        "ulysses2": ours.contender("ulysses2", ParallelConfig(ulysses=2)),
        "combined_ulysses2": ours.contender(
            "combined_ulysses2", ParallelConfig(ulysses=2), "blocks", block_cache=COMBINED_BLOCK_CACHE
        ),
    }
    peer = None
    try:
        import cache_dit  # noqa: F401

        peer = CacheDit(rounds)
        contenders["cachedit_plain"] = peer.contender("cachedit_plain", None)
        for thr in CACHEDIT_THRESHOLDS:
            contenders[f"cachedit_{thr}"] = peer.contender(f"cachedit_{thr}", thr)
    except ImportError:
        res["cachedit"] = "not measured: cache-dit is not installed (pip install 'dit-parallel[bench]')"
    try:
        times = interleave(contenders, repeats=len(rounds), warmup=1)
    finally:
        registry.close_all()
    res["seconds"] = {name: s.summary() for name, s in times.items()}
    images = {name: imgs[1:] for name, imgs in {**ours.images, **(peer.images if peer else {})}.items()}
    res["reused_per_generation"] = {n: sum(v[1:]) / max(1, len(v) - 1) for n, v in ours.reused.items() if any(v)}
    res["ulysses2_speedup"] = ratio(times, "plain", "ulysses2")  # the machine's share for a second rank
    for name in ("easycache", "lazycache", "blockcache", "compiled", "combined_ulysses2"):
        res[f"{name.replace('combined_ulysses2', 'combined')}_speedup_detail"] = ratio(times, "plain", name)
    res["easycache_speedup"] = res["easycache_speedup_detail"]["median"]
    res["easycache_psnr_db"] = _quality(images, "easycache", "plain")
    res["lazycache_speedup"] = res["lazycache_speedup_detail"]["median"]
    res["lazycache_psnr_db"] = _quality(images, "lazycache", "plain")
    res["blockcache_speedup"] = res["blockcache_speedup_detail"]["median"]
    res["blockcache_psnr_db"] = _quality(images, "blockcache", "plain")
    res["compile_speedup"] = res["compiled_speedup_detail"]["median"]  # same steps: the step-time ratio
    res["compile_psnr_db"] = _quality(images, "compiled", "plain")
    res["combined_speedup_ulysses2"] = res["combined_speedup_detail"]["median"]
    res["combined_psnr_db"] = _quality(images, "combined_ulysses2", "plain")
    if peer is not None:
        _cachedit_figures(res, times, images, peer)
    res["targets"] = _targets(res)
    return res


def _cachedit_figures(res: dict[str, Any], times: dict[str, Samples], images: dict, peer: CacheDit) -> None:
    import cache_dit

    per = {}
    for thr in CACHEDIT_THRESHOLDS:
        name = f"cachedit_{thr}"
        stats = cache_dit.summary(peer.cached[name], logging=False)[0]
        per[str(thr)] = {
            "speedup": ratio(times, "cachedit_plain", name),
            "psnr_db": _quality(images, name, "cachedit_plain"),
            "cached_steps_last_run": {"cond": len(stats.cached_steps), "uncond": len(stats.cfg_cached_steps)},
        }
    best = max(per, key=lambda t: per[t]["speedup"]["median"])
    res["cachedit"] = {
        "version": getattr(cache_dit, "__version__", "?"),
        "config": "DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=T, "
        "enable_separate_cfg=True), the rest cache-dit's defaults (max_warmup_steps 8)",
        "by_threshold": per,
        "best_threshold": float(best),
    }
    res["cachedit_speedup"] = per[best]["speedup"]["median"]
    res["cachedit_psnr_db"] = per[best]["psnr_db"]


def _targets(res: dict[str, Any]) -> dict[str, Any]:
    out = {
        f"combined_speedup_ulysses2_at_least_{TARGET_COMBINED}_at_psnr_{TARGET_COMBINED_PSNR}": res[
            "combined_speedup_ulysses2"
        ]
        >= TARGET_COMBINED
        and res["combined_psnr_db"]["mean"] >= TARGET_COMBINED_PSNR
    }
    if "cachedit_speedup" in res:
        out["blockcache_at_least_cachedit_speedup_at_equal_or_better_psnr"] = (
            res["blockcache_speedup"] >= res["cachedit_speedup"]
            and res["blockcache_psnr_db"]["mean"] >= res["cachedit_psnr_db"]["mean"]
        )
    return out
