"""Regenerate tests/data/comfy_ltx_video_reference.json by running ComfyUI's OWN LTX-Video code on a tiny file.

Run by hand (not in CI) with the Python that imports the ComfyUI snapshot (nothing is written there):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_ltx_video_reference.py /work/shared/ComfyUI

What runs is ComfyUI's: the transformer file (Lightricks' key layout inside a checkpoint's ``model.diffusion_model.``,
weights from ``ltx_video_tiny_weights``) is written to a temporary folder and loaded with
``comfy.sd.load_diffusion_model`` (UNETLoader's path: model detection, the LTXV model class, fp32 on the CPU); the
latent comes from ``EmptyLTXVLatentVideo``, the frame rate from ``LTXVConditioning``; sampling is ``KSampler``
(``nodes.common_ksampler``). The CONDITIONING tensors are given directly (generated T5-XXL-wide states, one with
an attention mask over padded tokens, as ComfyUI's T5 pads prompts to 128): no text encoder runs. Big inputs are
stored as their recipe plus a digest; every output as numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402
from ltx_video_tiny_weights import TinyLTXVideo, tiny_ltx_video_state_dict  # noqa: E402
from make_comfy_wan_reference import COMFY_COMMIT, dump_json, generated  # noqa: E402
from wan_tiny_weights import state_digest  # noqa: E402

WIDTH, HEIGHT, LENGTH = 96, 64, 17  # 17 frames -> 3 latent frames of 2x3 (32x spatial, 8x temporal)
PREFIX = "model.diffusion_model."


def import_comfy(comfy_dir: Path, base: Path) -> SimpleNamespace:
    prepare_comfy(comfy_dir, base, stub_missing=False)
    import comfy.sd
    import comfy_extras.nodes_custom_sampler as custom
    import comfy_extras.nodes_lt as lt

    import nodes

    return SimpleNamespace(sd=comfy.sd, nodes=nodes, lt=lt, custom=custom)


def load_model(c: SimpleNamespace, folder: Path, cfg: TinyLTXVideo, salt: str) -> tuple[object, dict]:
    from safetensors.torch import save_file

    sd = tiny_ltx_video_state_dict(cfg, salt)
    path = folder / f"tiny_ltx_video_{salt}.safetensors"
    save_file({PREFIX + k: v for k, v in sd.items()}, str(path))
    model = c.sd.load_diffusion_model(str(path), model_options={"dtype": torch.float32})
    base = model.model
    info = {
        "config": dataclasses.asdict(cfg),
        "salt": salt,
        "digest": state_digest(sd),
        "comfy_model_class": type(base).__name__,
        "comfy_latent_format": type(base.latent_format).__name__,
        "comfy_scale_factor": float(base.latent_format.scale_factor),
        "comfy_model_sampling": type(base.model_sampling).__name__,
        "comfy_shift": float(base.model_sampling.shift),
    }
    return model, info


def conditioning(name: str, tokens: int, kept: int, text_dim: int) -> tuple[list, dict]:
    """A CONDITIONING with generated T5 states [1, tokens, text_dim] and its attention mask (ComfyUI's LTXV model
    always takes one): the tokens after ``kept`` masked out."""
    emb, recipe = generated(f"{name}/t5", (1, tokens, text_dim), 1.0)
    mask = torch.zeros(1, tokens, dtype=torch.long)
    mask[:, :kept] = 1
    return [[emb, {"attention_mask": mask}]], {"t5": recipe, "kept": kept}


def node(cls, *args):
    out = cls.execute(*args)
    return tuple(out.result) if hasattr(out, "result") else tuple(out)


def case_t2v(c, folder: Path) -> dict:
    cfg = TinyLTXVideo()
    model, info = load_model(c, folder, cfg, "t2v")
    (latent,) = node(c.lt.EmptyLTXVLatentVideo, WIDTH, HEIGHT, LENGTH, 1)
    pos, pos_recipe = conditioning("ltx/positive", 12, 9, cfg.text_dim)
    neg, neg_recipe = conditioning("ltx/negative", 12, 12, cfg.text_dim)
    runs = []
    for seed, steps, scale, sampler, scheduler, frame_rate in (
        (42, 4, 3.0, "euler", "simple", None),  # no LTXVConditioning: ComfyUI's default 25 fps
        (7, 3, 2.5, "euler_ancestral", "normal", 24.0),  # LTXVConditioning on both branches
    ):
        positive, negative = pos, neg
        if frame_rate is not None:
            positive, negative = node(c.lt.LTXVConditioning, pos, neg, frame_rate)
        (out,) = c.nodes.KSampler().sample(model, seed, steps, scale, sampler, scheduler, positive, negative, latent)
        runs.append(
            {"seed": seed, "steps": steps, "cfg": scale, "sampler": sampler, "scheduler": scheduler,
             "frame_rate": frame_rate, "output": tensor_json(out["samples"])}
        )  # fmt: skip
    # LTXVScheduler's SIGMAS (its token-count shift, stretched to the terminal) through SamplerCustom
    (sigmas,) = node(c.lt.LTXVScheduler, 4, 2.05, 0.95, True, 0.1, latent)
    positive, negative = node(c.lt.LTXVConditioning, pos, neg, 24.0)
    (sampler,) = c.custom.KSamplerSelect().get_sampler("euler")
    out, _ = c.custom.SamplerCustom().sample(model, True, 11, 3.0, positive, negative, sampler, sigmas, latent)
    scheduled = {"seed": 11, "cfg": 3.0, "sampler": "euler", "frame_rate": 24.0, "sigmas": tensor_json(sigmas),
                 "ltxv_scheduler": {"steps": 4, "max_shift": 2.05, "base_shift": 0.95, "stretch": True,
                                    "terminal": 0.1}, "output": tensor_json(out["samples"])}  # fmt: skip
    return {
        "model": info,
        "latent": tensor_json(latent["samples"]),
        "empty_latent": {"width": WIDTH, "height": HEIGHT, "length": LENGTH, "batch_size": 1},
        "positive": pos_recipe,
        "negative": neg_recipe,
        "runs": runs,
        "ltxv_scheduler": scheduled,
    }


# LoRA modules (Lightricks' names) and the key forms that patch them: ComfyUI's / ai-toolkit's
# diffusion_model.<name>.lora_A / lora_B, and kohya's lora_unet_<name with _>.lora_down / lora_up / alpha
LORA_MODULES = (
    ("transformer_blocks.0.attn1.to_q", "comfy"),
    ("transformer_blocks.1.attn2.to_v", "comfy"),
    ("patchify_proj", "comfy"),  # proj_in in diffusers' names
    ("adaln_single.linear", "kohya"),  # time_embed.linear
    ("transformer_blocks.1.ff.net.2", "kohya"),
    ("transformer_blocks.0.attn1.q_norm", None),  # a 1-D weight: a diff, not a low-rank pair
)
LORA_RANK, LORA_STRENGTH = 2, 0.8


def lora_state(cfg: TinyLTXVideo, shapes: dict) -> tuple[dict, list]:
    """A LoRA state dict over ``LORA_MODULES`` and its recipe (every tensor generated by name)."""
    state, recipe = {}, []
    for module, form in LORA_MODULES:
        rows, *cols = shapes[module + ".weight"]
        if form is None:
            key = f"diffusion_model.{module}.diff"
            tensors = {key: ((rows,), 0.05)}
        elif form == "comfy":
            tensors = {f"diffusion_model.{module}.lora_A.weight": ((LORA_RANK, cols[0]), 0.3),
                       f"diffusion_model.{module}.lora_B.weight": ((rows, LORA_RANK), 0.3)}  # fmt: skip
        else:
            base = "lora_unet_" + module.replace(".", "_")
            tensors = {f"{base}.lora_down.weight": ((LORA_RANK, cols[0]), 0.3),
                       f"{base}.lora_up.weight": ((rows, LORA_RANK), 0.3)}  # fmt: skip
            state[f"{base}.alpha"] = torch.tensor(1.0)
            recipe.append({"name": f"{base}.alpha", "value": 1.0})
        for key, (shape, scale) in tensors.items():
            t, r = generated(f"ltx-lora/{key}", shape, scale)
            state[key] = t
            recipe.append(r)
    return state, recipe


def case_lora(c, folder: Path) -> dict:
    """LoraLoaderModelOnly's patch (comfy.sd.load_lora_for_models on the file's LoRA tensors) + KSampler."""
    cfg = TinyLTXVideo()
    model, info = load_model(c, folder, cfg, "t2v")
    shapes = {k: tuple(v.shape) for k, v in tiny_ltx_video_state_dict(cfg, "t2v").items()}
    lora, recipe = lora_state(cfg, shapes)
    patched, _ = c.sd.load_lora_for_models(model, None, lora, LORA_STRENGTH, 0.0)
    (latent,) = node(c.lt.EmptyLTXVLatentVideo, WIDTH, HEIGHT, LENGTH, 1)
    pos, _ = conditioning("ltx/positive", 12, 9, cfg.text_dim)
    neg, _ = conditioning("ltx/negative", 12, 12, cfg.text_dim)
    (out,) = c.nodes.KSampler().sample(patched, 5, 3, 3.0, "euler", "simple", pos, neg, latent)
    return {"model_salt": info["salt"], "lora": recipe, "strength": LORA_STRENGTH, "seed": 5, "steps": 3, "cfg": 3.0,
            "sampler": "euler", "scheduler": "simple", "output": tensor_json(out["samples"])}  # fmt: skip


def latent_format() -> dict:
    import comfy.latent_formats as formats

    fmt = formats.LTXV()
    return {
        "channels": fmt.latent_channels,
        "dimensions": fmt.latent_dimensions,
        "scale_factor": float(fmt.scale_factor),
        "shift_factor": float(getattr(fmt, "shift_factor", 0.0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--commit", default=COMFY_COMMIT)
    here = Path(__file__).resolve().parent
    parser.add_argument("--out", type=Path, default=here / "comfy_ltx_video_reference.json")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory(prefix="comfy-ltx-ref-") as tmp:
        folder = Path(tmp)
        c = import_comfy(args.comfy_dir.resolve(), folder / "base")
        ref = {
            "source": {
                "comfyui_commit": args.commit,
                "script": "tests/data/make_comfy_ltx_video_reference.py",
                "torch": torch.__version__,
                "weights": "tests/data/ltx_video_tiny_weights.py (hashed_uniform; digests below)",
            },
            "t2v": case_t2v(c, folder),
            "lora": case_lora(c, folder),
            "latent_format": latent_format(),
        }
    args.out.write_text(dump_json(ref) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
