"""The parts of ``tiny-flux-shapes``: real Flux architectures at tiny sizes, and their tokenizers.

- ``FluxTransformer2DModel`` (2x2 packed latents, 3-axis rotary ids, no guidance input: schnell-like, so
  ComfyUI samples it with shift 1.0 and classifier-free guidance works through a negative prompt),
- ``AutoencoderKL`` with 16 latent channels and the /8 layout,
- CLIP-L-like ``CLIPTextModel`` (pooled) + T5-like ``T5EncoderModel`` (tokens), with real CLIP (byte-level
  BPE) and T5 (Unigram) tokenizers whose vocabularies hold every word of the grammar.

T5's "far" relative-position buckets are fixed at zero bias. Then every padding token farther than
``layers x near-distance`` from the prompt and the sequence end gets exactly the same output (T5 attends
without a mask in Flux), and the transformer treats those identical tokens as one token counted many
times. :func:`encode_t5_reduced` runs T5 and hands the transformer ~25 tokens plus a multiplicity bias
instead of 512: training computes exactly the function used at inference, many times cheaper.
"""

from __future__ import annotations

import math

import torch

from ..tiny.vocab import build_clip_tokenizer, build_t5_tokenizer

CLIP_WIDTH = 32
T5_WIDTH = 32
T5_LENGTH = 512  # what FluxPipeline and our text encoding feed the transformer
T5_BUCKETS, T5_MAX_DISTANCE = 8, 8
TRANSFORMER = dict(
    patch_size=1,
    in_channels=64,
    num_layers=2,
    num_single_layers=4,
    attention_head_dim=24,
    num_attention_heads=4,
    joint_attention_dim=T5_WIDTH,
    pooled_projection_dim=CLIP_WIDTH,
    guidance_embeds=False,
    axes_dims_rope=(4, 10, 10),
)
VAE = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(16, 32, 48, 48),
    layers_per_block=1,
    norm_num_groups=2,
    latent_channels=16,
    sample_size=128,
    use_quant_conv=False,
    use_post_quant_conv=False,
)
SCHEDULER = dict(  # FLUX.1-schnell's scheduler settings: shift 1, no resolution-dependent shift
    num_train_timesteps=1000,
    shift=1.0,
    use_dynamic_shifting=False,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
)


# -- tokenizers ------------------------------------------------------------------------------------
def build_tokenizers(words: list[str]):
    """(CLIP tokenizer, T5 tokenizer) that keep each of ``words`` as one token."""
    corpus = " ".join(words)
    return build_clip_tokenizer(corpus=corpus), build_t5_tokenizer(T5_LENGTH, corpus=corpus)


# -- models ----------------------------------------------------------------------------------------
def build_text_encoders(clip_tokenizer, t5_tokenizer, seed: int):
    """(CLIPTextModel, T5EncoderModel) at tiny sizes, seeded."""
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    clip = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(clip_tokenizer),
            hidden_size=CLIP_WIDTH,
            intermediate_size=CLIP_WIDTH * 2,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            projection_dim=CLIP_WIDTH,
            hidden_act="quick_gelu",
            bos_token_id=clip_tokenizer.bos_token_id,
            eos_token_id=clip_tokenizer.eos_token_id,
            pad_token_id=clip_tokenizer.pad_token_id,
        )
    )
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=len(t5_tokenizer),
            d_model=T5_WIDTH,
            d_kv=8,
            d_ff=T5_WIDTH * 2,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=T5_BUCKETS,
            relative_attention_max_distance=T5_MAX_DISTANCE,
            feed_forward_proj="gated-gelu",
            dropout_rate=0.0,
            pad_token_id=t5_tokenizer.pad_token_id,
            eos_token_id=t5_tokenizer.eos_token_id,
            decoder_start_token_id=t5_tokenizer.pad_token_id,
            tie_word_embeddings=False,
        )
    )
    zero_far_buckets(t5)
    return clip, t5


def _far_buckets() -> tuple[int, int]:
    """Bucket indices of the farthest left and right relative positions."""
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.tensor([-10 * T5_MAX_DISTANCE, 10 * T5_MAX_DISTANCE])
    left, right = T5Attention._relative_position_bucket(rel, True, T5_BUCKETS, T5_MAX_DISTANCE).tolist()
    return left, right


def near_distance() -> int:
    """Largest token distance whose T5 bucket is not a far bucket."""
    from transformers.models.t5.modeling_t5 import T5Attention

    far = set(_far_buckets())
    rel = torch.arange(1, 10 * T5_MAX_DISTANCE)
    buckets = T5Attention._relative_position_bucket(rel, True, T5_BUCKETS, T5_MAX_DISTANCE)
    return int(rel[[b not in far for b in buckets.tolist()]].max())


@torch.no_grad()
def zero_far_buckets(t5) -> None:
    """Set the far buckets' relative-attention bias to 0 (call again after every optimiser step)."""
    bias = t5.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
    for bucket in _far_buckets():
        bias[bucket].zero_()


def build_vae(seed: int):
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(**VAE, scaling_factor=1.0, shift_factor=0.0)


def build_transformer(seed: int):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    return FluxTransformer2DModel(**TRANSFORMER)


def build_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**SCHEDULER)


# -- latents and text tokens as the transformer sees them -----------------------------------------
def pack(latent: torch.Tensor) -> torch.Tensor:
    """[B,C,H,W] -> [B, H/2*W/2, C*4] (2x2 patches, channel order c,p,q as FluxPipeline packs)."""
    b, c, h, w = latent.shape
    x = latent.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of :func:`pack` for a latent of ``h`` x ``w``."""
    b, _, d = tokens.shape
    c = d // 4
    x = tokens.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, h, w)


def image_ids(rows: int, cols: int) -> torch.Tensor:
    """Flux image position ids (0, row, col), row-major."""
    ids = torch.zeros(rows, cols, 3)
    ids[..., 1] = torch.arange(rows)[:, None]
    ids[..., 2] = torch.arange(cols)[None, :]
    return ids.reshape(rows * cols, 3)


def prompt_lengths(t5_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Number of non-padding T5 tokens of each prompt (the prompt and its </s>)."""
    return (t5_ids != pad_id).sum(dim=1)


def reduced_layout(length: int, total: int, layers: int) -> tuple[list[int], int, int]:
    """(positions kept, lo, hi): padding positions ``lo .. hi-1`` give identical T5 outputs and become
    one token (kept at index ``lo`` of the short sequence, standing for the position in their middle)."""
    band = layers * near_distance()
    lo, hi = length + band, total - band
    if hi - lo < 2 * near_distance() + 2:
        return list(range(total)), total, total
    return [*range(lo), (lo + hi) // 2, *range(hi, total)], lo, hi


def _t5_position_bias(t5, positions: list[int], lo: int, hi: int, width: int) -> torch.Tensor:
    """Relative-position bias [heads, width, width] of the short sequence: each kept token's own bias, and
    for the merged token the log-sum-exp of the bias of every position it stands for; -inf past the end."""
    from transformers.models.t5.modeling_t5 import T5Attention

    table = t5.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight  # [buckets, heads]
    config = t5.config
    total = positions[-1] + 1
    rel = torch.arange(total)[None, :] - torch.tensor(positions)[:, None]  # [kept, total]
    buckets = T5Attention._relative_position_bucket(
        rel, True, config.relative_attention_num_buckets, config.relative_attention_max_distance
    )
    full = table[buckets].permute(2, 0, 1)  # [heads, kept, total]
    kept = full[:, :, positions]
    if hi > lo:
        kept = kept.clone()
        kept[:, :, lo] = full[:, :, lo:hi].logsumexp(dim=-1)
    out = torch.full((full.shape[0], width, width), -math.inf)
    out[:, :, : len(positions)] = 0.0
    out[:, : len(positions), : len(positions)] = kept
    return out


def encode_t5_reduced(t5, ids: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """T5's output for ``ids`` [B, 512] in the short form the transformer can use exactly:
    (tokens [B,R,D], key bias [B,R]) where the merged padding token's bias is log(count) (``count``
    identical keys weigh that much in softmax) and rows padding the batch to R have bias -inf.

    Runs T5's own blocks on the short sequence with the bias :func:`_t5_position_bias` builds, which
    gives the same outputs as the full 512-token run (the far buckets' bias is 0, see module docstring)."""
    layers = t5.config.num_layers
    total = ids.shape[1]
    layouts = [reduced_layout(int(n), total, layers) for n in prompt_lengths(ids, pad_id)]
    width = max(len(p) for p, _, _ in layouts)
    short = torch.full((ids.shape[0], width), pad_id, dtype=ids.dtype)
    t5_bias, key_bias = [], torch.full((ids.shape[0], width), -math.inf)
    for i, (positions, lo, hi) in enumerate(layouts):
        short[i, : len(positions)] = ids[i, positions]
        t5_bias.append(_t5_position_bias(t5, positions, lo, hi, width))
        key_bias[i, : len(positions)] = 0.0
        if hi > lo:
            key_bias[i, lo] = math.log(hi - lo)
    position_bias = torch.stack(t5_bias)
    hidden = t5.encoder.embed_tokens(short)
    for block in t5.encoder.block:
        hidden = block(hidden, None, position_bias)[0]
    return t5.encoder.final_layer_norm(hidden), key_bias
