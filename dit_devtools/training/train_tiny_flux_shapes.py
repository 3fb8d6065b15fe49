"""Train ``tiny-flux-shapes`` on CPU, reproducibly, and save it as a diffusers FluxPipeline folder.

    nice -n 19 python -m dit_devtools.training.train_tiny_flux_shapes --out DIR

1. Build the tokenizers (grammar vocabulary) and every part from seeds (``shapes_model``).
2. Train the VAE on whole 64 px scenes: MSE + L1 reconstruction + a small KL term.
3. Measure the latent mean/std (-> the VAE's ``shift_factor`` / ``scaling_factor``) and encode a fixed
   set of scenes at 64, 128, 192 and 256 px.
4. Train the transformer and both text encoders with Flux's rectified-flow objective:
   x_t = (1 - t) x0 + t noise, predict noise - x0, t logit-normal(0, 1) mixed with uniform and shifted
   towards high noise (shift 3, as SD3 trains), and the caption dropped 10% of the time (so classifier-free guidance with an empty negative prompt works).
   Sampling uses shift 1.0 (FLUX.1-schnell's setting; the model has no guidance input).
5. Save an exponential moving average of the weights in fp16 with ``training.json`` (command, times, losses).

This is stage 1: it learns the VAE, the words and the backgrounds, but not yet shapes. Stages 2 and 3
(``finetune_tiny_flux_shapes``) fine-tune the result on one-shape grammars at 128 px; the shipped
weights are stage 3's.

One thread by default: the result then does not depend on the machine's core count, and on a shared
machine a single thread loses far less to waiting than two.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import shapes_dataset as data
from . import shapes_model as parts


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Every number that decides the weights."""

    seed: int = 0
    vae_steps: int = 800
    vae_batch: int = 16
    vae_scenes: int = 2048  # 64 px scenes the VAE learns from
    vae_lr: float = 3e-3
    vae_kl: float = 1e-4
    scenes: tuple[tuple[int, int], ...] = ((64, 1500), (128, 3000), (256, 300))  # (px, count)
    bucket_weights: tuple[float, ...] = (0.25, 0.65, 0.1)
    flux_steps: int = 1200
    flux_tokens: int = 2800  # text + image tokens per batch (batch size per resolution follows)
    flux_lr: float = 1e-3
    text_lr: float = 1e-3
    t_shift: float = 3.0  # training noise levels lean to high noise, where the caption decides the layout
    caption_dropout: float = 0.1
    ema: float = 0.998

    @classmethod
    def quick(cls) -> Recipe:
        """A few minutes: checks the pipeline end to end (pictures are not yet right)."""
        return cls(
            vae_steps=60,
            vae_scenes=64,
            scenes=((64, 64), (128, 64), (256, 16)),
            flux_steps=60,
            ema=0.9,
        )


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _lr(step: int, steps: int, peak: float, warmup: int = 100) -> float:
    """Linear warmup times a cosine decay to 5% of the peak."""
    return peak * min(1.0, (step + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / steps)))


# -- VAE --------------------------------------------------------------------------------------------
def train_vae(vae, recipe: Recipe) -> list[float]:
    """MSE + L1 reconstruction (images in -1..1) + ``vae_kl`` x KL on whole 64 px scenes; returns losses.

    Whole pictures rather than crops: GroupNorm statistics then match what the VAE sees in use (scenes
    scale with the picture, so their statistics hardly change with the size)."""
    pool = torch.from_numpy(data.make_batch(recipe.seed + 1, 0, recipe.vae_scenes, 64)[0])
    gen = torch.Generator().manual_seed(recipe.seed)
    with torch.no_grad():  # start with small posterior noise; the KL term then lets it grow as it can
        vae.encoder.conv_out.bias[vae.config.latent_channels :] = -8.0
    opt = torch.optim.AdamW(vae.parameters(), lr=recipe.vae_lr, weight_decay=0.0)
    losses = []
    vae.train()
    for step in range(recipe.vae_steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, recipe.vae_steps, recipe.vae_lr)
        x = pool[torch.randint(len(pool), (recipe.vae_batch,), generator=gen)]
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample(generator=gen)).sample
        kl = 0.5 * (posterior.mean.pow(2) + posterior.var - 1 - posterior.logvar).mean()
        loss = (recon - x).pow(2).mean() + (recon - x).abs().mean() + recipe.vae_kl * kl
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == recipe.vae_steps - 1:
            log(f"vae step {step}: loss {np.mean(losses[-100:]):.4f} kl {kl.item():.2f}")
    return losses


@torch.no_grad()
def encode_scenes(vae, recipe: Recipe) -> dict[int, tuple[torch.Tensor, list[str]]]:
    """Raw latents (posterior means) and captions of the training scenes, per resolution."""
    vae.eval()
    out = {}
    for size, count in recipe.scenes:
        latents, captions = [], []
        for start in range(0, count, 64):
            images, caps = data.make_batch(recipe.seed, size * 1_000_000 + start, min(64, count - start), size)
            latents.append(vae.encode(torch.from_numpy(images)).latent_dist.mean)
            captions += caps
        out[size] = (torch.cat(latents), captions)
        log(f"encoded {count} scenes at {size} px")
    return out


def latent_normalisation(latents: dict[int, tuple[torch.Tensor, list[str]]]) -> tuple[float, float]:
    """(shift_factor, scaling_factor) that give model-space latents mean 0 and std 1."""
    flat = torch.cat([z.flatten() for z, _ in latents.values()])
    return float(flat.mean()), float(1.0 / flat.std())


# -- transformer + text encoders --------------------------------------------------------------------
class TextStack:
    """Tokenizers + encoders -> (reduced T5 tokens, key bias, CLIP pooled) for a batch of captions."""

    def __init__(self, clip_tok, t5_tok, clip, t5):
        self.clip_tok, self.t5_tok, self.clip, self.t5 = clip_tok, t5_tok, clip, t5

    def __call__(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        clip_ids = self.clip_tok(captions, padding="max_length", max_length=77, truncation=True, return_tensors="pt")
        t5_ids = self.t5_tok(
            captions, padding="max_length", max_length=parts.T5_LENGTH, truncation=True, return_tensors="pt"
        ).input_ids
        pooled = self.clip(clip_ids.input_ids).pooler_output
        tokens, bias = parts.encode_t5_reduced(self.t5, t5_ids, self.t5_tok.pad_token_id)
        return tokens, bias, pooled


def sample_t(n: int, gen: torch.Generator, shift: float) -> torch.Tensor:
    """Noise levels: logit-normal(0, 1) (SD3/Flux) for 80%, uniform for 20% (covers both ends), then
    time-shifted by ``shift`` (t -> shift t / (1 + (shift - 1) t)) towards high noise."""
    logit_normal = torch.sigmoid(torch.randn(n, generator=gen))
    uniform = torch.rand(n, generator=gen)
    t = torch.where(torch.rand(n, generator=gen) < 0.8, logit_normal, uniform)
    return (shift * t / (1 + (shift - 1) * t)).clamp(1e-4, 1 - 1e-4)


def flow_loss(transformer, text: TextStack, x0: torch.Tensor, captions: list[str], gen: torch.Generator, shift: float):
    """Rectified-flow loss on model-space latents ``x0`` [B,16,H,W]: || v(x_t, t) - (noise - x0) ||^2."""
    b, _, h, w = x0.shape
    t = sample_t(b, gen, shift)
    noise = torch.randn(x0.shape, generator=gen)
    tt = t.view(-1, 1, 1, 1)
    x_t = (1 - tt) * x0 + tt * noise
    tokens, bias, pooled = text(captions)
    key_bias = torch.cat([bias, torch.zeros(b, (h // 2) * (w // 2))], dim=1)[:, None, None, :]
    pred = transformer(
        hidden_states=parts.pack(x_t),
        encoder_hidden_states=tokens,
        pooled_projections=pooled,
        timestep=t,
        img_ids=parts.image_ids(h // 2, w // 2),
        txt_ids=torch.zeros(tokens.shape[1], 3),
        joint_attention_kwargs={"attention_mask": key_bias},
    ).sample
    return (pred - parts.pack(noise - x0)).pow(2).mean()


def _batch_sizes(recipe: Recipe) -> dict[int, int]:
    text = 24  # reduced text tokens of a typical prompt
    return {s: max(4, round(recipe.flux_tokens / (text + (s // 16) ** 2))) for s, _ in recipe.scenes}


def train_flux(transformer, text: TextStack, latents, shift: float, scale: float, recipe: Recipe) -> list[float]:
    """Train transformer + text encoders; keeps an EMA of all their weights and loads it at the end."""
    modules = {"transformer": transformer, "clip": text.clip, "t5": text.t5}
    params = [
        {"params": list(transformer.parameters()), "lr": recipe.flux_lr, "peak": recipe.flux_lr},
        {
            "params": list(text.clip.parameters()) + list(text.t5.parameters()),
            "lr": recipe.text_lr,
            "peak": recipe.text_lr,
        },
    ]
    opt = torch.optim.AdamW(params, weight_decay=0.0, betas=(0.9, 0.99))
    ema = {name: {k: v.detach().clone() for k, v in m.state_dict().items()} for name, m in modules.items()}
    gen = torch.Generator().manual_seed(recipe.seed + 1)
    sizes = [s for s, _ in recipe.scenes]
    weights = torch.tensor(recipe.bucket_weights)
    batch_sizes = _batch_sizes(recipe)
    for m in modules.values():
        m.train()
    losses = []
    for step in range(recipe.flux_steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, recipe.flux_steps, group["peak"], warmup=200)
        size = sizes[int(torch.multinomial(weights, 1, generator=gen))]
        z, captions = latents[size]
        idx = torch.randint(len(captions), (batch_sizes[size],), generator=gen)
        drop = torch.rand(len(idx), generator=gen) < recipe.caption_dropout
        batch_captions = ["" if d else captions[i] for i, d in zip(idx.tolist(), drop.tolist())]
        x0 = (z[idx] - shift) * scale
        loss = flow_loss(transformer, text, x0, batch_captions, gen, recipe.t_shift)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in params for p in g["params"]], 1.0)
        opt.step()
        parts.zero_far_buckets(text.t5)
        decay = min(recipe.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for name, m in modules.items():
                for k, v in m.state_dict().items():
                    if v.dtype.is_floating_point:
                        ema[name][k].lerp_(v, 1 - decay)
        losses.append(loss.item())
        if step % 100 == 0 or step == recipe.flux_steps - 1:
            log(f"flux step {step}: loss {np.mean(losses[-100:]):.4f} ({size} px x {len(idx)})")
    for name, m in modules.items():
        m.load_state_dict(ema[name])
        m.eval()
    return losses


# -- saving -----------------------------------------------------------------------------------------
def save_pipeline(out: Path, vae, transformer, clip, t5, clip_tok, t5_tok, dtype: torch.dtype) -> None:
    from diffusers import FluxPipeline

    pipe = FluxPipeline(
        scheduler=parts.build_scheduler(),
        vae=vae,
        text_encoder=clip,
        tokenizer=clip_tok,
        text_encoder_2=t5,
        tokenizer_2=t5_tok,
        transformer=transformer,
    )
    pipe.to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)


def _vae_key(recipe: Recipe) -> str:
    return json.dumps(
        {f: getattr(recipe, f) for f in ("seed", "vae_steps", "vae_batch", "vae_scenes", "vae_lr", "vae_kl")}
    )


def _cached(cache: Path | None, name: str, key: str):
    file = cache / f"{name}.pt" if cache else None
    if file is None or not file.is_file():
        return None
    saved = torch.load(file, weights_only=False)
    if saved["key"] != key:
        return None
    log(f"{name} from {file}")
    return saved["value"]


def _store(cache: Path | None, name: str, key: str, value) -> None:
    if cache:
        cache.mkdir(parents=True, exist_ok=True)
        torch.save({"key": key, "value": value}, cache / f"{name}.pt")


def train(out: Path, recipe: Recipe, threads: int, dtype: torch.dtype, cache: Path | None = None) -> dict:
    torch.set_num_threads(threads)
    t_start = time.perf_counter()
    words = data.vocabulary()
    clip_tok, t5_tok = parts.build_tokenizers(words)
    clip, t5 = parts.build_text_encoders(clip_tok, t5_tok, recipe.seed)
    vae = parts.build_vae(recipe.seed)
    transformer = parts.build_transformer(recipe.seed)

    vae_key = _vae_key(recipe)
    cached_vae = _cached(cache, "vae", vae_key)
    if cached_vae is None:
        vae_losses = train_vae(vae, recipe)
        _store(cache, "vae", vae_key, {"state": vae.state_dict(), "losses": vae_losses})
    else:
        vae.load_state_dict(cached_vae["state"])
        vae_losses = cached_vae["losses"]
    t_vae = time.perf_counter()
    scenes_key = json.dumps([vae_key, recipe.scenes])
    latents = _cached(cache, "latents", scenes_key)
    if latents is None:
        latents = encode_scenes(vae, recipe)
        _store(cache, "latents", scenes_key, latents)
    shift, scale = latent_normalisation(latents)
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    log(f"latent shift {shift:.4f} scale {scale:.4f}")
    t_encode = time.perf_counter()
    flux_losses = train_flux(transformer, TextStack(clip_tok, t5_tok, clip, t5), latents, shift, scale, recipe)
    t_flux = time.perf_counter()
    for m in (vae, transformer, clip, t5):
        m.eval().requires_grad_(False)
    save_pipeline(out, vae, transformer, clip, t5, clip_tok, t5_tok, dtype)
    report = {
        "command": "python -m dit_devtools.training.train_tiny_flux_shapes " + " ".join(sys.argv[1:]),
        "recipe": dataclasses.asdict(recipe),
        "threads": threads,
        "weights_dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "seconds": {
            "vae": round(t_vae - t_start, 1),
            "encode": round(t_encode - t_vae, 1),
            "flux": round(t_flux - t_encode, 1),
            "total": round(time.perf_counter() - t_start, 1),
        },
        "final_loss": {
            "vae": float(np.mean(vae_losses[-100:])) if vae_losses else None,
            "flux": float(np.mean(flux_losses[-200:])),
        },
        "stages_from_cache": [name for name, hit in (("vae", cached_vae is not None),) if hit],
        "latent": {"shift_factor": shift, "scaling_factor": scale},
        "params": {
            name: sum(p.numel() for p in m.parameters())
            for name, m in (("transformer", transformer), ("vae", vae), ("text_encoder", clip), ("text_encoder_2", t5))
        },
    }
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"saved {out} in {report['seconds']['total']:.0f} s")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="folder to write the FluxPipeline into")
    parser.add_argument("--quick", action="store_true", help="a few-minute smoke run (not the shipped recipe)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the shipped weights used 1)")
    parser.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="fp16", help="dtype of the saved weights")
    parser.add_argument("--flux-steps", type=int, help="override the recipe's transformer steps")
    parser.add_argument("--vae-steps", type=int, help="override the recipe's VAE steps")
    parser.add_argument("--cache", type=Path, help="keep/reuse the trained VAE and encoded scenes here (iteration)")
    args = parser.parse_args(argv)
    recipe = Recipe.quick() if args.quick else Recipe()
    overrides = {k: v for k, v in (("flux_steps", args.flux_steps), ("vae_steps", args.vae_steps)) if v is not None}
    recipe = dataclasses.replace(recipe, **overrides)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    train(args.out, recipe, args.threads, dtype, args.cache)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
