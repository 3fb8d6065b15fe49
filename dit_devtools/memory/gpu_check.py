"""The activation-memory estimate at a real model's width, on one GPU: ``python -m dit_devtools.memory.gpu_check``.

Builds the FLUX.1 12B layout with random bf16 weights on the GPU (bench gpu's ``random_flux``), runs one
denoising step (the engine's Denoiser, 1 rank, cfg 1 and batched cfg 2) at 1024 and 2048 px, and compares the
peak allocated above the weights (``torch.cuda.max_memory_allocated``) with
``memory_checks.sampling_bytes_per_rank``; also times the step with the block-boundary cancel points
(``runtime.cancel_points.BlockCancel``; one rank: no collective, the counter's cost only). Prints a table and
one JSON line (``--json PATH`` writes it). About a minute on an H100 (the 24 GB of random weights first).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs one GPU", file=sys.stderr)
        return 2
    from parallel_runtime.denoise.denoiser import Denoiser
    from parallel_runtime.denoise.model_sampling import model_sampling_for
    from parallel_runtime.models import Conditioning, get_adapter
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.parallel.mesh import ParallelMesh
    from parallel_runtime.runtime.cancel_points import BlockCancel
    from parallel_runtime.service.memory_checks import sampling_bytes_per_rank
    from parallel_runtime.tools.bench_gpu import FLUX1_12B, random_flux

    device = torch.device("cuda")
    model = random_flux(FLUX1_12B, device, torch.bfloat16)
    adapter = get_adapter(model)
    info = {
        "patch_size": adapter.plan.patch_size,
        "inner_dim": FLUX1_12B["num_attention_heads"] * FLUX1_12B["attention_head_dim"],
        "num_blocks": adapter.num_blocks,
    }
    ms = model_sampling_for(adapter)
    mesh = ParallelMesh.single(device)
    gen = torch.Generator().manual_seed(1)
    text = 512
    embeds = torch.randn(1, text, FLUX1_12B["joint_attention_dim"], generator=gen).to(device)
    cond = Conditioning(embeds, torch.randn(1, FLUX1_12B["pooled_projection_dim"], generator=gen).to(device))
    rows = []
    for side, cfg in ((1024, 1.0), (1024, 2.0), (2048, 1.0)):
        x = torch.randn(1, 16, side // 8, side // 8, generator=gen).to(device)
        den = Denoiser(adapter, mesh, ms, cond, cond if cfg != 1.0 else None, cfg, 3.5, "auto")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            den(x, torch.tensor(0.6))
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            times = {}
            for hook in (None, "cancel points"):
                adapter.block_hook = None if hook is None else BlockCancel(lambda: False, "check")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(3):
                    den(x, torch.tensor(0.6))
                torch.cuda.synchronize()
                times[hook or "none"] = (time.perf_counter() - t0) / 3
                adapter.block_hook = None
        estimate = sampling_bytes_per_rank(info, ParallelConfig(), tuple(x.shape), text, cfg != 1.0, "bf16")
        rows.append(
            {
                "px": side,
                "cfg": cfg,
                "measured_gib": round(peak / 2**30, 3),
                "estimate_gib": round(estimate / 2**30, 3),
                "estimate_over_measured": round(estimate / max(peak, 1), 3),
                "step_s": round(times["none"], 4),
                "step_s_with_cancel_points": round(times["cancel points"], 4),
            }
        )
        print(
            f"{side} px cfg {cfg}: peak above weights {peak / 2**30:.2f} GiB, estimate {estimate / 2**30:.2f} GiB "
            f"(x{estimate / max(peak, 1):.2f}); step {times['none']:.4f} s, with cancel points "
            f"{times['cancel points']:.4f} s",
            flush=True,
        )
    result = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "rows": rows}
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
