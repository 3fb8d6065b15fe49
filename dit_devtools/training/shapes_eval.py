"""Evaluate ``tiny-flux-shapes``: draw held-out (and training) prompts with diffusers' FluxPipeline and
judge each picture with the shapes detector.

    python -m dit_devtools.training.shapes_eval DIR [--size 128] [--steps 12] [--seeds 3] [--grid out.png]
        [--grammar full|focused]

``--grammar focused`` keeps the prompts that the one-shape grammars of stages 2 and 3 can say (six colours).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from .shapes_dataset import focused_held_out_prompts, held_out_prompts
from .shapes_detector import judge

TRAINING_PROMPTS = (
    "a red circle on a blue background",
    "two yellow squares",
    "a green triangle and a white circle on a black background",
    "a purple square on an orange background",
)
FOCUSED_TRAINING_PROMPTS = (
    "a red circle on a blue background",
    "a yellow square on a black background",
    "a green triangle on a white background",
    "a white circle on a red background",
)


@torch.no_grad()
def draw(pipe, prompts: list[str], size: int, steps: int, seed: int, cfg: float = 1.0) -> np.ndarray:
    """Pictures [N, size, size, 3] in 0..1 for ``prompts`` (one seeded generator per call)."""
    kwargs = {"negative_prompt": [""] * len(prompts), "true_cfg_scale": cfg} if cfg != 1.0 else {}
    out = pipe(
        prompts,
        height=size,
        width=size,
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
        output_type="np",
        **kwargs,
    ).images
    return np.asarray(out, dtype=np.float32)


def evaluate(
    folder: Path, size: int, steps: int, seeds: int, cfg: float, grid: Path | None, grammar: str = "full"
) -> dict:
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    report: dict = {"size": size, "steps": steps, "seeds": seeds, "cfg": cfg, "grammar": grammar}
    rows = []
    sets = {
        "full": (("held_out", held_out_prompts()), ("training", list(TRAINING_PROMPTS))),
        "focused": (("held_out", focused_held_out_prompts()), ("training", list(FOCUSED_TRAINING_PROMPTS))),
    }[grammar]
    for name, prompts in sets:
        verdicts = []
        for seed in range(seeds):
            images = draw(pipe, prompts, size, steps, seed, cfg)
            verdicts += [judge(img, p) for img, p in zip(images, prompts)]
            rows.append(images)
        report[name] = {
            "pictures": len(verdicts),
            "all_ok": float(np.mean([v.ok for v in verdicts])),
            "background_ok": float(np.mean([v.background_ok for v in verdicts])),
            "colours_ok": float(np.mean([v.colours_ok for v in verdicts])),
            "shapes_ok": float(np.mean([v.shapes_ok for v in verdicts])),
            "failed": sorted({p for v, p in zip(verdicts, prompts * seeds) if not v.ok}),
        }
    if grid is not None:
        from PIL import Image

        width = max(len(r) for r in rows)
        canvas = np.ones((len(rows) * size, width * size, 3), dtype=np.float32)
        for i, r in enumerate(rows):
            canvas[i * size : (i + 1) * size, : len(r) * size] = np.concatenate(list(r), axis=1)
        Image.fromarray((canvas * 255).round().astype(np.uint8)).save(grid)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cfg", type=float, default=1.0, help="true CFG scale with an empty negative prompt")
    parser.add_argument("--grid", type=Path, help="write every picture into one PNG (a row per seed and set)")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--grammar", choices=("full", "focused"), default="full", help="which prompts to draw")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = evaluate(args.folder, args.size, args.steps, args.seeds, args.cfg, args.grid, args.grammar)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
