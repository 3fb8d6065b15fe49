"""Tiny diffusers pipelines built into the package: random-weight Flux, SD3 and PixArt for tests and
benchmarks, and the trained ``tiny-flux-shapes`` (shipped as files; see ``tools/train_tiny_flux_shapes.py``).

Each is a complete diffusers folder (model_index.json, safetensors weights, real tokenizer files)
that ``FluxPipeline.from_pretrained`` etc. load, built from configs with a fixed seed so that
every machine builds the same weights. Structure follows the real models (Flux: double + single
blocks, guidance embedding, 3-axis rope; SD3.5: joint blocks with a dual-attention block and
RMS qk-norm; PixArt-alpha: cross-attention, learned sigma, resolution conditions), sizes do not.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import string
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .tiny_video import TINY_VIDEO_MODELS

TINY_VERSION = "v1"  # bump whenever the built folders change: caches are keyed by it
TINY_MODELS: tuple[str, ...] = ("tiny-flux", "tiny-sd3", "tiny-pixart", "tiny-qwen-image", "tiny-flux2")
TRAINED_MODELS: tuple[str, ...] = ("tiny-flux-shapes",)  # draws the coloured shapes its prompt names
BUILTIN_MODELS: tuple[str, ...] = (*TRAINED_MODELS, *TINY_MODELS, *TINY_VIDEO_MODELS)
TRAINED_ROOT = Path(__file__).resolve().parent / "trained"
CACHE_ENV = "DIT_PARALLEL_TINY_ROOT"
SEED = 0

# Words the tiny tokenizers learn from (lower- and upper-case forms are both seen by T5).
_CORPUS = """
a photo of a cat sitting on a red chair in the garden, highly detailed, 4k
an astronaut riding a horse on the moon, digital art, trending on artstation
portrait of an old man with a beard, oil painting, dramatic lighting
a beautiful landscape with mountains and a lake at sunset, photorealistic
a small house in the forest, snow, winter, cozy light in the window
cyberpunk city street at night, neon lights, rain, reflections
a bowl of fruit on a wooden table, still life, soft shadows
a dog running on the beach, waves, blue sky, summer
the quick brown fox jumps over the lazy dog
A Photo Of The Sea And The Sky With Clouds And Birds
"""


# -- tokenizers --------------------------------------------------------------------------------
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP reversible byte -> printable character table, in CLIP's vocabulary order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def learn_bpe_merges(
    words: collections.Counter[tuple[str, ...]], vocab: list[str], num_merges: int
) -> list[tuple[str, str]]:
    """Learn up to ``num_merges`` BPE merges from word frequencies, deterministically (ties broken by
    the pair itself); each merged symbol not yet in ``vocab`` is appended to it."""
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += freq
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        if best[0] + best[1] not in vocab:
            vocab.append(best[0] + best[1])
        merged: collections.Counter[tuple[str, ...]] = collections.Counter()
        for word, freq in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += freq
        words = merged
    return merges


def _clip_vocab(corpus: str, num_merges: int = 200) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A CLIP-style byte-level BPE vocabulary: 256 bytes, 256 end-of-word bytes, merges learned from
    ``corpus``, then <|startoftext|> and <|endoftext|> (as in openai/clip-vit-large-patch14's vocab.json)."""
    table = _bytes_to_unicode()
    base = list(table.values())
    vocab = base + [c + "</w>" for c in base]
    words: collections.Counter[tuple[str, ...]] = collections.Counter()
    for word in re.findall(r"[a-z]+|[0-9]|[^\sa-z0-9]+", corpus.lower()):
        symbols = [table[b] for b in word.encode("utf-8")]
        symbols[-1] += "</w>"
        words[tuple(symbols)] += 1
    merges = learn_bpe_merges(words, vocab, num_merges)
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    return {tok: i for i, tok in enumerate(vocab)}, merges


def build_clip_tokenizer(pad_token: str = "<|endoftext|>", corpus: str = _CORPUS):
    """A real ``CLIPTokenizer`` (byte-level BPE, 77 tokens) over a tiny vocabulary learned from ``corpus``.

    ``pad_token="!"`` mimics SD3's second CLIP tokenizer, which pads with "!" (id 0)."""
    from transformers import CLIPTokenizer

    vocab, merges = _clip_vocab(corpus)
    return CLIPTokenizer(vocab=vocab, merges=merges, pad_token=pad_token, model_max_length=77)


def _t5_pieces(corpus: str) -> list[tuple[str, float]]:
    """Unigram pieces: T5's specials (<pad>=0, </s>=1, <unk>=2), the words of ``corpus``, single characters."""
    pieces: dict[str, float] = {"<pad>": 0.0, "</s>": 0.0, "<unk>": 0.0, "▁": -3.0}
    counts = collections.Counter(re.findall(r"\w+|[^\w\s]", corpus))
    for rank, (word, _) in enumerate(counts.most_common()):
        pieces.setdefault("▁" + word, -4.0 - 0.01 * rank)
        pieces.setdefault(word, -6.0 - 0.01 * rank)
    for ch in string.ascii_letters + string.digits + string.punctuation + "éèêàâäöüñçßøåæ":
        pieces.setdefault(ch, -10.0)
        pieces.setdefault("▁" + ch, -11.0)
    return list(pieces.items())


def build_t5_tokenizer(model_max_length: int = 512, corpus: str = _CORPUS):
    """A real T5 tokenizer (SentencePiece-style Unigram over the words of ``corpus``, appends </s>, pads
    with <pad>=0)."""
    from transformers import T5TokenizerFast

    return T5TokenizerFast(vocab=_t5_pieces(corpus), extra_ids=0, model_max_length=model_max_length)


# -- text encoders, VAE, schedulers --------------------------------------------------------------
def _clip_encoder(tokenizer, hidden: int, projection: bool, act: str = "quick_gelu", seed: int = SEED):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=hidden,
        hidden_act=act,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()


def _t5_encoder(tokenizer, d_model: int, seed: int = SEED):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=8,
        d_ff=d_model * 2,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return T5EncoderModel(config).eval()


def _vae(latent_channels: int, scaling: float, shift: float | None, quant_conv: bool):
    """Tiny AutoencoderKL with the real 8x downsampling (4 levels)."""
    from diffusers import AutoencoderKL

    torch.manual_seed(SEED)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        norm_num_groups=4,
        latent_channels=latent_channels,
        sample_size=64,
        scaling_factor=scaling,
        shift_factor=shift,
        use_quant_conv=quant_conv,
        use_post_quant_conv=quant_conv,
    ).eval()


def _rope_axes(head_dim: int) -> tuple[int, int, int]:
    """Flux-style rope split of a head dim: (16, 56, 56) for 128; each part even."""
    side = (head_dim * 7 // 16) // 2 * 2
    return (head_dim - 2 * side, side, side)


# -- families -----------------------------------------------------------------------------------
def _flux(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    clip_tok, t5_tok = build_clip_tokenizer(), build_t5_tokenizer(512)
    clip, t5 = _clip_encoder(clip_tok, 32, projection=False), _t5_encoder(t5_tok, 32)
    config = dict(
        patch_size=1,
        in_channels=64,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
    )
    config.update(overrides)
    config.setdefault("axes_dims_rope", _rope_axes(config["attention_head_dim"]))
    torch.manual_seed(SEED)
    return dict(
        cls=FluxPipeline,
        transformer=FluxTransformer2DModel(**config).eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=3.0,
            use_dynamic_shifting=True,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        ),
        vae=_vae(16, 0.3611, 0.1159, quant_conv=False),
        text_encoder=clip,
        tokenizer=clip_tok,
        text_encoder_2=t5,
        tokenizer_2=t5_tok,
    )


def _sd3(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    tok_l, tok_g, t5_tok = build_clip_tokenizer(), build_clip_tokenizer(pad_token="!"), build_t5_tokenizer(512)
    clip_l = _clip_encoder(tok_l, 32, projection=True, seed=SEED)
    clip_g = _clip_encoder(tok_g, 48, projection=True, act="gelu", seed=SEED + 1)
    t5 = _t5_encoder(t5_tok, 96)  # >= 32 + 48: CLIP features are zero-padded to T5's width
    config = dict(
        sample_size=16,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=3,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=96,
        pooled_projection_dim=80,
        pos_embed_max_size=32,
        dual_attention_layers=(0,),
        qk_norm="rms_norm",
    )
    config.update(overrides)
    config.setdefault("caption_projection_dim", config["num_attention_heads"] * config["attention_head_dim"])
    torch.manual_seed(SEED)
    return dict(
        cls=StableDiffusion3Pipeline,
        transformer=SD3Transformer2DModel(**config).eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        vae=_vae(16, 1.5305, 0.0609, quant_conv=False),
        text_encoder=clip_l,
        tokenizer=tok_l,
        text_encoder_2=clip_g,
        tokenizer_2=tok_g,
        text_encoder_3=t5,
        tokenizer_3=t5_tok,
    )


def _pixart(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import DPMSolverMultistepScheduler, PixArtAlphaPipeline, PixArtTransformer2DModel

    t5_tok = build_t5_tokenizer(512)
    t5 = _t5_encoder(t5_tok, 32)
    config = dict(
        num_attention_heads=4,
        attention_head_dim=24,  # inner dim divisible by 3 (resolution + aspect conditions split it)
        in_channels=4,
        out_channels=8,  # learned sigma
        num_layers=3,
        caption_channels=32,
        sample_size=128,  # PixArt-alpha 1024: the pipeline feeds resolution/aspect conditions only then
        patch_size=2,
        use_additional_conditions=True,
        norm_type="ada_norm_single",
        num_embeds_ada_norm=1000,
        norm_elementwise_affine=False,
        norm_eps=1e-6,
    )
    config.update(overrides)
    config.setdefault("cross_attention_dim", config["num_attention_heads"] * config["attention_head_dim"])
    torch.manual_seed(SEED)
    return dict(
        cls=PixArtAlphaPipeline,
        transformer=PixArtTransformer2DModel(**config).eval(),
        scheduler=DPMSolverMultistepScheduler(
            num_train_timesteps=1000,
            beta_start=0.0001,
            beta_end=0.02,
            beta_schedule="linear",
            prediction_type="epsilon",
            solver_order=2,
            algorithm_type="dpmsolver++",
            solver_type="midpoint",
            lower_order_final=True,
        ),
        vae=_vae(4, 0.18215, None, quant_conv=True),
        text_encoder=t5,
        tokenizer=t5_tok,
    )


def _builders() -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    from . import tiny_big
    from .tiny_video import BUILDERS

    return {
        "tiny-flux": _flux,
        "tiny-sd3": _sd3,
        "tiny-pixart": _pixart,
        "tiny-qwen-image": tiny_big.qwen_image,
        "tiny-flux2": tiny_big.flux2,
        **BUILDERS,
    }


def _check_name(name: str) -> None:
    from .tiny_video import TINY_VIDEO_MODELS

    if name not in (*TINY_MODELS, *TINY_VIDEO_MODELS):
        raise ConfigError(
            f"unknown tiny model {name!r}",
            "tiny models are built from configs shipped in parallel_runtime.models.tiny and .tiny_video",
            f"use one of: {', '.join((*TINY_MODELS, *TINY_VIDEO_MODELS))}",
        )


def build_tiny_pipeline(name: str, dest: str | os.PathLike, **transformer_overrides: Any) -> Path:
    """Build the tiny pipeline ``name`` into the folder ``dest`` (created; must not hold a model).

    ``transformer_overrides`` replace entries of the transformer config, e.g. ``num_layers=8,
    num_attention_heads=8`` for a deeper/wider benchmark variant (text dimensions stay tied to the
    tiny text encoders)."""
    _check_name(name)
    parts = _builders()[name](dict(transformer_overrides))
    pipeline_cls = parts.pop("cls")
    pipe = pipeline_cls(**parts)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(dest, safe_serialization=True)
    return dest


def default_root() -> Path:
    """Cache root: $DIT_PARALLEL_TINY_ROOT, else ~/.cache/dit-parallel/tiny."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "dit-parallel" / "tiny"


def ensure_tiny_model(name: str, root: str | os.PathLike | None = None) -> Path:
    """Path of the tiny pipeline ``name``, building it once (atomically) under ``root``.

    Concurrent callers are safe: each builds into a private temporary folder and renames it into
    place; the first rename wins and the others discard their copy. (Threads of one process that
    build at the same moment share torch's global RNG, so the winner's weights may then differ from
    the seeded ones; separate processes always build identical folders.)"""
    _check_name(name)
    root = Path(root) if root is not None else default_root()
    final = root / f"{name}-{TINY_VERSION}"
    if (final / "model_index.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-build-", dir=root))
    try:
        build_tiny_pipeline(name, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "model_index.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def builtin_model_path(name: str) -> Path:
    """Folder of the built-in model ``name``: a trained one shipped in the package, or a random-weight
    one built once (:func:`ensure_tiny_model`)."""
    if name not in TRAINED_MODELS:
        return ensure_tiny_model(name)
    path = TRAINED_ROOT / name
    if not (path / "model_index.json").is_file():
        raise ConfigError(
            f"the built-in model {name!r} is missing from {path}",
            "its weights are package data of parallel_runtime.models (trained/...), installed with the package",
            "reinstall the package (pip install .), or use a random-weight one: " + ", ".join(TINY_MODELS),
        )
    return path
