"""Stages 2 and 3 of ``tiny-flux-shapes``: fine-tune a pipeline folder on a narrower grammar, on CPU.

    nice -n 10 python -m dit_devtools.training.finetune_tiny_flux_shapes --base BASE --out DIR --steps N \
        [--grammar focused|centred] [--lr LR]

Stage 1 (``train_tiny_flux_shapes``) learns the VAE, the words and the backgrounds from the full grammar.
The later stages keep the VAE (and its latent normalisation) and train the transformer and both text
encoders at 128 px, where the picture has 64 tokens and a shape spans several of them:

- stage 2, ``--grammar focused``: one shape of six colours anywhere (``shapes_dataset.sample_focused_scene``);
- stage 3, ``--grammar centred``: the same shape large and near the middle, its background named four
  times in five (``sample_centred_scene``). Placing a shape is what a model this small learns last; with
  the place nearly fixed, it learns the shapes within a few thousand steps. The shipped weights are stage 3
  at lr 1e-3, then again at lr 5e-4 (``training.json`` holds every command, recipe, time and loss).

The learning rate is constant after a short warmup, so the weights after step n do not depend on how many
steps were asked for: a checkpoint every ``--every`` steps (``DIR/step-n``, an EMA of the weights) is
exactly what ``--steps n`` gives. One thread: on a shared machine it loses far less to waiting than two,
and the result does not depend on the core count.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import shapes_dataset as data
from . import shapes_model as parts
from .train_tiny_flux_shapes import TextStack, flow_loss, log, save_pipeline


@dataclasses.dataclass(frozen=True)
class FinetuneRecipe:
    """Every number of stage 2."""

    seed: int = 0
    size: int = 128
    scenes: int = 768
    batch: int = 16
    lr: float = 5e-4
    text_lr: float = 5e-4
    warmup: int = 30
    t_shift: float = 3.0
    caption_dropout: float = 0.1
    ema: float = 0.99
    grammar: str = "focused"  # "focused" (stage 2) or "centred" (stage 3)


@torch.no_grad()
def encode_focused(vae, recipe: FinetuneRecipe) -> tuple[torch.Tensor, list[str]]:
    """Model-space latents and captions of the focused training scenes."""
    latents, captions = [], []
    for start in range(0, recipe.scenes, 32):
        count = min(32, recipe.scenes - start)
        centred = recipe.grammar == "centred"
        images, caps = data.make_batch(recipe.seed + 7, start, count, recipe.size, True, centred)
        latents.append(vae.encode(torch.from_numpy(images)).latent_dist.mean)
        captions += caps
    raw = torch.cat(latents)
    return (raw - vae.config.shift_factor) * vae.config.scaling_factor, captions


def _save(base: Path, out: Path, step: int, pipe, ema: dict, modules: dict, report: dict) -> None:
    saved = {name: copy.deepcopy(m) for name, m in modules.items()}
    for name, m in saved.items():
        m.load_state_dict(ema[name])
        m.eval().requires_grad_(False)
    folder = out / f"step-{step}"
    vae = copy.deepcopy(pipe.vae)
    save_pipeline(
        folder, vae, saved["transformer"], saved["clip"], saved["t5"], pipe.tokenizer, pipe.tokenizer_2, torch.float16
    )
    for config in base.glob("*/*config.json"):  # the base's configs, without loading-time fields
        shutil.copyfile(config, folder / config.relative_to(base))
    (folder / "training.json").write_text(json.dumps({**report, "steps": step}, indent=2) + "\n")
    log(f"saved {folder}")


def finetune(base: Path, out: Path, steps: int, every: int, recipe: FinetuneRecipe, threads: int) -> None:
    from diffusers import FluxPipeline

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    pipe = FluxPipeline.from_pretrained(base, torch_dtype=torch.float32)
    x_all, captions = encode_focused(pipe.vae, recipe)
    log(f"encoded {len(captions)} {recipe.grammar} scenes at {recipe.size} px in {time.perf_counter() - t0:.0f} s")
    modules = {"transformer": pipe.transformer, "clip": pipe.text_encoder, "t5": pipe.text_encoder_2}
    text = TextStack(pipe.tokenizer, pipe.tokenizer_2, pipe.text_encoder, pipe.text_encoder_2)
    groups = [
        {"params": list(pipe.transformer.parameters()), "peak": recipe.lr},
        {
            "params": list(pipe.text_encoder.parameters()) + list(pipe.text_encoder_2.parameters()),
            "peak": recipe.text_lr,
        },
    ]
    for m in modules.values():
        m.train().requires_grad_(True)
    opt = torch.optim.AdamW([{**g, "lr": g["peak"]} for g in groups], weight_decay=0.0, betas=(0.9, 0.99))
    ema = {name: {k: v.detach().clone() for k, v in m.state_dict().items()} for name, m in modules.items()}
    gen = torch.Generator().manual_seed(recipe.seed + 2)
    base_report = json.loads((base / "training.json").read_text()) if (base / "training.json").is_file() else {}
    report = {
        "base": base_report,
        "command": "python -m dit_devtools.training.finetune_tiny_flux_shapes " + " ".join(sys.argv[1:]),
        "recipe": dataclasses.asdict(recipe),
        "threads": threads,
        "torch": torch.__version__,
    }
    losses = []
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = group["peak"] * min(1.0, step / recipe.warmup)
        idx = torch.randint(len(captions), (recipe.batch,), generator=gen)
        drop = torch.rand(recipe.batch, generator=gen) < recipe.caption_dropout
        batch_captions = ["" if d else captions[i] for i, d in zip(idx.tolist(), drop.tolist())]
        loss = flow_loss(pipe.transformer, text, x_all[idx], batch_captions, gen, recipe.t_shift)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
        opt.step()
        parts.zero_far_buckets(pipe.text_encoder_2)
        decay = min(recipe.ema, step / (10 + step))
        with torch.no_grad():
            for name, m in modules.items():
                for k, v in m.state_dict().items():
                    if v.dtype.is_floating_point:
                        ema[name][k].lerp_(v, 1 - decay)
        losses.append(loss.item())
        if step % 10 == 0:
            log(f"step {step}: loss {np.mean(losses[-50:]):.4f} ({time.perf_counter() - t0:.0f} s)")
        if step % every == 0 or step == steps:
            seconds = round(time.perf_counter() - t0, 1)
            _save(
                base,
                out,
                step,
                pipe,
                ema,
                modules,
                {**report, "seconds": seconds, "loss": np.mean(losses[-50:])},
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, type=Path, help="the stage-1 FluxPipeline folder")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--every", type=int, default=50, help="checkpoint every this many steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--grammar", choices=("focused", "centred"), default="focused")
    parser.add_argument("--lr", type=float, default=FinetuneRecipe.lr, help="transformer and text encoders")
    args = parser.parse_args(argv)
    recipe = FinetuneRecipe(grammar=args.grammar, lr=args.lr, text_lr=args.lr)
    finetune(args.base, args.out, args.steps, args.every, recipe, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
