"""``python -m parallel_runtime generate``: one image from a prompt, on a parallel layout."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from ..errors import (
    ConfigError,
    JobCancelled,
    NonFiniteValues,
    PoolAborted,
    RuntimeTimeout,
    WorkerDied,
    WorkerError,
    WorkerHung,
)
from ..models.families.registry import family
from ..parallel.config import ParallelConfig
from ..runtime.pools import PoolRegistry
from ..service.api import LoadRequest, check_sample_request, load_parallel_model
from .paths import check_model_argument, check_output_file
from .progress_line import ProgressLine


def _layout(args: argparse.Namespace) -> ParallelConfig | None:
    degrees = {d: getattr(args, d) for d in ("cfg", "pp", "ring", "ulysses")}
    if all(v is None for v in degrees.values()):
        return None
    return ParallelConfig(**{d: v or 1 for d, v in degrees.items()})


def save_png(image: torch.Tensor, path: str) -> None:
    """Write IMAGE [B,H,W,3] in 0..1 (first item) as an 8-bit PNG."""
    from PIL import Image

    array = (image[0].clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    Image.fromarray(array).save(path)


def main(args: argparse.Namespace) -> int:
    registry = PoolRegistry()
    try:
        return _generate(args, registry)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        registry.close_all()
        print("\ninterrupted: the job was cancelled", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # now: the interpreter's own teardown of torch and diffusers takes seconds more
    except (WorkerError, WorkerDied, WorkerHung, RuntimeTimeout, JobCancelled, PoolAborted, NonFiniteValues) as exc:
        print(f"\nerror: {_one_message(exc, args.debug)}", file=sys.stderr)
        return 1
    finally:
        registry.close_all()


def _one_message(exc: BaseException, debug: bool) -> str:
    """The error as the user needs it: a worker's error once, its remote traceback only with --debug."""
    if isinstance(exc, WorkerError) and not debug:
        return f"job '{exc.job}' failed on rank {exc.rank}: {exc.exc_type}: {exc.remote_message}\n(run with --debug for the worker's traceback)"
    return str(exc)


def _generate(args: argparse.Namespace, registry: PoolRegistry) -> int:
    t0 = getattr(args, "started", None) or time.perf_counter()  # the command's start: imports count too
    check_output_file(args.out, "--out", image=True)  # before any worker starts: the work must not be lost
    check_model_argument(args.model)
    request = LoadRequest(
        args.model,
        args.devices,
        _layout(args),
        args.dtype,
        args.attention,
        pp_patches=getattr(args, "patches", None),
        pp_warmup=getattr(args, "warmup", 1),
    )
    sampling = dict(
        seed=args.seed, steps=args.steps, guidance=args.guidance, sampler_name=args.sampler, scheduler=args.scheduler
    )
    size = check_sample_request(
        request,
        args.width,
        args.height,
        batch_size=1,
        seed=args.seed,
        steps=args.steps,
        cfg=1.0 if args.cfg_scale is None else args.cfg_scale,
        denoise=1.0,
        guidance=args.guidance,
        sampler=args.sampler,
        scheduler=args.scheduler,
    )
    if size.adjusted:
        print(f"warning: {size.message()}", file=sys.stderr, flush=True)
    model = load_parallel_model(request, registry)
    print(f"loaded {model.describe()} in {time.perf_counter() - t0:.1f} s", flush=True)
    stages = model.info.get("pipefusion")
    if stages:
        per_rank = ", ".join(f"rank {r['rank']}: {r['param_bytes'] / 2**20:.1f} MiB" for r in stages["ranks"])
        print(f"  PipeFusion stages (blocks) {stages['stages']}; weights loaded {per_rank}")
    cfg = args.cfg_scale if args.cfg_scale is not None else family(model.family).generate_cfg
    positive = model.encode_text(args.prompt)
    negative = model.encode_text(args.negative) if cfg != 1.0 else None

    line = ProgressLine(sys.stdout, ranks=len(model.pool.devices))  # the slowest rank's step, rate, ETA
    t1 = time.perf_counter()
    try:
        latent = model.sample(
            positive, negative, None, size.width, size.height, cfg=cfg, on_event=line.on_event, **sampling
        )
    finally:
        line.finish()
    t2 = time.perf_counter()
    image = model.decode(latent)
    t3 = time.perf_counter()
    save_png(image, args.out)
    print(
        f"sampled {args.steps} steps in {t2 - t1:.2f} s, decoded in {t3 - t2:.2f} s "
        f"-> {args.out} ({image.shape[2]}x{image.shape[1]})"
    )
    return 0
