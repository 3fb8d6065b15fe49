"""Tiny Wan transformers in the ORIGINAL (Wan / ComfyUI) key layout, with portable deterministic weights.

Shared by ``make_comfy_wan_reference.py`` (which runs ComfyUI's own code on them) and the tests (which run
ours on the same weights and compare). Pure torch: no ComfyUI and no repository import.

Why generated and not stored: ComfyUI derives Wan's head count as ``dim // 128`` and builds the text
projection for UMT5-XXL's fixed 4096-wide output, so even a 2-block Wan with 2 heads has ~2.5 M parameters
(10 MB in float32) — too big for the repository. Every value here comes from an integer hash of the tensor
name and the element index (no random generator, no libm), so every machine and torch version builds the
same bits; :func:`state_digest` lets a test prove it rebuilt exactly what the reference was made from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zlib

import torch

MASK32 = 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class TinyWan:
    """Structure of a tiny Wan transformer (names as in the original Wan code / ComfyUI's WanModel)."""

    dim: int = 256  # ComfyUI: num_heads = dim // 128
    ffn_dim: int = 512
    num_layers: int = 2
    in_dim: int = 16  # 16 text-to-video; 36 image-to-video (16 latent + 4 mask + 16 image latent); 48 TI2V-5B
    out_dim: int = 16
    text_dim: int = 4096  # UMT5-XXL width (ComfyUI's WanModel default; not read from the file)
    freq_dim: int = 256
    clip_vision: bool = False  # Wan 2.1 I2V: img_emb projects 1280-wide CLIP-vision states
    ref_conv: int = 0  # Fun-Control v1.1 / Wan 2.2 Fun: the reference image's conv (its latent channels; 0: none)
    vace_blocks: int = 0  # Wan VACE: hint blocks (after every num_layers // vace_blocks main blocks; 0: none)
    vace_in_dim: int = 96  # VACE context channels: 32 control video latents + 64 mask

    @property
    def heads(self) -> int:
        return self.dim // 128


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 tensors (every product stays below 2**63)."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = (x * 0x2C1B3C6D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x297A2D39) & MASK32
    return x ^ (x >> 16)


def hashed_uniform(name: str, shape: tuple[int, ...], scale: float, offset: float = 0.0) -> torch.Tensor:
    """float32 values ``offset + scale * u`` with ``u`` uniform in [-1, 1), a pure function of ``name``, the
    element index and nothing else."""
    n = 1
    for s in shape:
        n *= s
    seed = zlib.crc32(name.encode("utf-8"))
    idx = torch.arange(n, dtype=torch.int64)
    h = _mix(_mix(idx + seed) ^ (seed * 0x9E37 & MASK32))
    u = h.to(torch.float64) / 2**31 - 1.0  # exact in float64
    return (offset + scale * u).to(torch.float32).reshape(shape)


def original_shapes(cfg: TinyWan) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, kind) of a Wan transformer in the original layout.
    Kinds: linear weight ``w<fan_in>``, ``bias``, ``norm`` (scale around 1), ``normbias``, ``mod``."""
    d, f = cfg.dim, cfg.ffn_dim
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "patch_embedding.weight": ((d, cfg.in_dim, 1, 2, 2), f"w{cfg.in_dim * 4}"),
        "patch_embedding.bias": ((d,), "bias"),
        "text_embedding.0.weight": ((d, cfg.text_dim), f"w{cfg.text_dim}"),
        "text_embedding.0.bias": ((d,), "bias"),
        "text_embedding.2.weight": ((d, d), f"w{d}"),
        "text_embedding.2.bias": ((d,), "bias"),
        "time_embedding.0.weight": ((d, cfg.freq_dim), f"w{cfg.freq_dim}"),
        "time_embedding.0.bias": ((d,), "bias"),
        "time_embedding.2.weight": ((d, d), f"w{d}"),
        "time_embedding.2.bias": ((d,), "bias"),
        "time_projection.1.weight": ((6 * d, d), f"w{d}"),
        "time_projection.1.bias": ((6 * d,), "bias"),
        "head.modulation": ((1, 2, d), "mod"),
        "head.head.weight": ((cfg.out_dim * 4, d), f"w{d}"),
        "head.head.bias": ((cfg.out_dim * 4,), "bias"),
    }
    blocks = [f"blocks.{i}." for i in range(cfg.num_layers)] + [f"vace_blocks.{i}." for i in range(cfg.vace_blocks)]
    for b in blocks:
        out[b + "modulation"] = ((1, 6, d), "mod")
        attns = ["self_attn", "cross_attn"]
        for attn in attns:
            for proj in ("q", "k", "v", "o"):
                out[f"{b}{attn}.{proj}.weight"] = ((d, d), f"w{d}")
                out[f"{b}{attn}.{proj}.bias"] = ((d,), "bias")
            out[f"{b}{attn}.norm_q.weight"] = ((d,), "norm")
            out[f"{b}{attn}.norm_k.weight"] = ((d,), "norm")
        if cfg.clip_vision:
            for proj in ("k_img", "v_img"):
                out[f"{b}cross_attn.{proj}.weight"] = ((d, d), f"w{d}")
                out[f"{b}cross_attn.{proj}.bias"] = ((d,), "bias")
            out[f"{b}cross_attn.norm_k_img.weight"] = ((d,), "norm")
        out[b + "norm3.weight"] = ((d,), "norm")
        out[b + "norm3.bias"] = ((d,), "normbias")
        out[b + "ffn.0.weight"] = ((f, d), f"w{d}")
        out[b + "ffn.0.bias"] = ((f,), "bias")
        out[b + "ffn.2.weight"] = ((d, f), f"w{f}")
        out[b + "ffn.2.bias"] = ((d,), "bias")
    for i in range(cfg.vace_blocks):  # VACE hint blocks: the first projects the context in, each projects a hint out
        for proj in ("before_proj", "after_proj") if i == 0 else ("after_proj",):
            out[f"vace_blocks.{i}.{proj}.weight"] = ((d, d), f"w{d}")
            out[f"vace_blocks.{i}.{proj}.bias"] = ((d,), "bias")
    if cfg.vace_blocks:
        out["vace_patch_embedding.weight"] = ((d, cfg.vace_in_dim, 1, 2, 2), f"w{cfg.vace_in_dim * 4}")
        out["vace_patch_embedding.bias"] = ((d,), "bias")
    if cfg.ref_conv:
        out["ref_conv.weight"] = ((d, cfg.ref_conv, 2, 2), f"w{cfg.ref_conv * 4}")
        out["ref_conv.bias"] = ((d,), "bias")
    if cfg.clip_vision:
        out.update(
            {
                "img_emb.proj.0.weight": ((1280,), "norm"),
                "img_emb.proj.0.bias": ((1280,), "normbias"),
                "img_emb.proj.1.weight": ((1280, 1280), "w1280"),
                "img_emb.proj.1.bias": ((1280,), "bias"),
                "img_emb.proj.3.weight": ((d, 1280), "w1280"),
                "img_emb.proj.3.bias": ((d,), "bias"),
                "img_emb.proj.4.weight": ((d,), "norm"),
                "img_emb.proj.4.bias": ((d,), "normbias"),
            }
        )
    return out


def tiny_wan_state_dict(cfg: TinyWan, salt: str = "wan") -> dict[str, torch.Tensor]:
    """Original-layout state dict of ``cfg``; ``salt`` gives a different model (e.g. a second expert)."""
    sd = {}
    for name, (shape, kind) in original_shapes(cfg).items():
        key = f"{salt}/{name}"
        if kind.startswith("w"):
            sd[name] = hashed_uniform(key, shape, 3**0.5 / int(kind[1:]) ** 0.5)  # std 1/sqrt(fan_in)
        elif kind == "bias":
            sd[name] = hashed_uniform(key, shape, 0.05)
        elif kind == "norm":
            sd[name] = hashed_uniform(key, shape, 0.1, 1.0)
        elif kind == "normbias":
            sd[name] = hashed_uniform(key, shape, 0.05)
        else:  # modulation tables: diffusers initialises them as randn / sqrt(dim)
            sd[name] = hashed_uniform(key, shape, 3**0.5 / shape[-1] ** 0.5)
    return sd


def state_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the sorted names, shapes, dtypes and bytes of ``tensors``."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
