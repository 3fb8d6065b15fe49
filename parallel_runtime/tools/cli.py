"""Command line: ``python -m parallel_runtime doctor | bench KIND | generate``."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import time

from ..errors import ConfigError
from .paths import check_model_argument, check_output_file

STARTED = time.perf_counter()  # the command's start, near enough (imported first): what "loaded in" counts from


def _doctor(args: argparse.Namespace) -> int:
    from . import doctor

    info = doctor.collect()
    print(json.dumps(info, indent=2) if args.json else doctor.render(info))
    return 0


BENCHES: dict[str, tuple[str, str]] = {
    # kind -> (module in parallel_runtime.tools with ``run(quick: bool) -> dict``, table title)
    "runtime": ("bench_runtime", "runtime benchmark (2 CPU ranks)"),
    "scaling": ("bench_scaling", "sequence/CFG parallel scaling"),
    "vae": ("bench_vae", "parallel VAE decode"),
    "pipefusion": ("bench_pipefusion", "PipeFusion"),
    "gpu": ("bench_gpu", "one GPU, real-size Flux.1, and a model of N GPUs"),
    "gpu-speed": ("bench_gpu_speed", "one GPU, real-size Flux.1: attention kernels x compiled blocks x bf16/fp8"),
    "speedups": ("bench_speedups", "caches, compiled blocks and Ulysses on tiny-flux-shapes, beside cache-dit"),
    "bigmodels": ("bench_bigmodels", "big models: weights per rank, per-stage and fp8 loading"),
    "gguf": ("bench_gguf", "GGUF files: weights per rank, a stage's load, per-layer dequantisation"),
    "lora": ("bench_lora", "LoRA apply/swap on a warm pool vs reloading the model"),
    "edit": ("bench_edit", "reference-image editing (Kontext structure): 1 rank vs Ulysses 2 vs PipeFusion 2"),
    "control": ("bench_control", "a Flux Union ControlNet beside the model: 1 rank, Ulysses 2, PipeFusion 2, bytes"),
    "video": ("bench_video", "Wan video: sequence parallelism and the parallel video VAE"),
    "families": ("bench_families", "model families: weights per rank, tokens, Ulysses 2 on widened tiny models"),
    "soak": ("bench_soak", "soak: 1,000 small jobs on warm pools (resource slopes, latency), then the fault matrix"),
}


def _bench(args: argparse.Namespace) -> int:
    from .report import emit

    module, title = BENCHES[args.kind]
    run = importlib.import_module(f"{__package__}.{module}").run
    if args.model and "models" not in inspect.signature(run).parameters:
        print(f"error: bench {args.kind} takes no --model (bench pipefusion does)", file=sys.stderr)
        return 2
    if args.no_matrix and "matrix" not in inspect.signature(run).parameters:
        print(f"error: bench {args.kind} takes no --no-matrix (bench soak does)", file=sys.stderr)
        return 2
    extra = {"models": args.model} if args.model else {}
    if args.no_matrix:
        extra["matrix"] = False
    try:
        if args.json:
            check_output_file(args.json, "--json", make_folders=True)  # before the bench runs, not after
        for model in args.model:
            check_model_argument(model)
        result = run(quick=args.quick, **extra)
    except ConfigError as exc:  # e.g. a bench on tiny models run from an installed wheel without the checkout
        print(f"error: {exc}", file=sys.stderr)
        return 2
    emit(result, title, args.json)
    return 0


def _generate(args: argparse.Namespace) -> int:
    from .generate import main

    return main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m parallel_runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="what this machine offers: devices, memory, backends, peer access")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_doctor)

    p = sub.add_parser("bench", help="benchmarks that print a table and write JSON")
    p.add_argument("kind", choices=list(BENCHES))
    p.add_argument("--json", metavar="PATH", help="write the results here")
    p.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        help="pipefusion: also report the stale-K/V error on this model (tiny name or diffusers folder; repeatable)",
    )
    p.add_argument("--no-matrix", action="store_true", help="soak: skip the fault matrix after the jobs")
    p.set_defaults(func=_bench)

    p = sub.add_parser("generate", help="generate one image with a parallel layout")
    p.add_argument(
        "--model",
        default="tiny-flux-shapes",
        help="tiny-flux-shapes (trained on coloured shapes) | tiny-flux | tiny-sd3 | tiny-pixart | ... (random weights, "
        "built by a git checkout's dit_devtools) | path to a diffusers folder or a .safetensors transformer",
    )
    p.add_argument("--devices", default="cpu:2", help='e.g. "cuda:0,cuda:1" or "cpu:2"')
    for dim in ("ulysses", "ring", "cfg", "pp"):
        p.add_argument(f"--{dim}", type=int, default=None, help=f"{dim} parallel degree (default: automatic layout)")
    p.add_argument("--patches", type=int, default=None, help="PipeFusion patches (row bands)")
    p.add_argument("--warmup", type=int, default=1, help="PipeFusion synchronous warmup steps")
    p.add_argument("--prompt", default="a green square on a yellow background")
    p.add_argument("--negative", default="")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (default per family)")
    p.add_argument("--guidance", type=float, default=3.5, help="Flux embedded guidance")
    p.add_argument("--sampler", default="euler")
    p.add_argument("--scheduler", default="simple")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--height", type=int, default=256)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--attention", default="auto")
    p.add_argument("--out", default="out.png")
    p.add_argument("--debug", action="store_true", help="show the workers' tracebacks with their errors")
    p.set_defaults(func=_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.started = STARTED if argv is None else time.perf_counter()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
