"""Single-file transformers in their original layouts (BFL Flux, Stability MMDiT, PixArt) written from a
diffusers state dict, for the single-file tests: our diffusers -> original mapping (tests/
test_single_file_reverse.py checks it is diffusers' conversion run backwards) and header-only files."""

from __future__ import annotations

import json
import struct

import torch
from safetensors.torch import save_file

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.models.loading import load_pipeline_components

PREFIX = "model.diffusion_model."
TINY = {"flux": "tiny-flux", "sd3": "tiny-sd3", "pixart": "tiny-pixart"}
PIXART_OVERRIDES = {"attention_head_dim": 24}  # the tiny PixArt's head width (not stored in its weights)


class _Reverse:
    """Moves tensors from a diffusers state dict into original names; ``done`` checks nothing is left."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self.src, self.out = dict(state), {}

    def move(self, src: str, dst: str, kinds=("weight", "bias")) -> None:
        for kind in kinds:
            if f"{src}.{kind}" in self.src:
                self.out[f"{dst}.{kind}"] = self.src.pop(f"{src}.{kind}")

    def tensor(self, src: str, dst: str, swap: bool = False) -> None:
        value = self.src.pop(src)
        self.out[dst] = torch.cat(value.chunk(2)[::-1]) if swap else value

    def fuse(self, srcs: list[str], dst: str) -> None:
        for kind in ("weight", "bias"):
            self.out[f"{dst}.{kind}"] = torch.cat([self.src.pop(f"{s}.{kind}") for s in srcs])

    def swap(self, src: str, dst: str) -> None:
        """diffusers' AdaLayerNormContinuous is (scale, shift); the originals store (shift, scale)."""
        for kind in ("weight", "bias"):
            self.tensor(f"{src}.{kind}", f"{dst}.{kind}", swap=True)

    def done(self) -> dict[str, torch.Tensor]:
        assert not self.src, f"unmapped diffusers tensors: {sorted(self.src)[:8]}"
        return self.out


def _indices(state, prefix: str) -> list[int]:
    return sorted({int(k[len(prefix) :].split(".")[0]) for k in state if k.startswith(prefix)})


def flux_to_bfl(state) -> dict[str, torch.Tensor]:
    r = _Reverse(state)
    for src, dst in (
        ("time_text_embed.timestep_embedder", "time_in"),
        ("time_text_embed.text_embedder", "vector_in"),
        ("time_text_embed.guidance_embedder", "guidance_in"),
    ):
        r.move(f"{src}.linear_1", f"{dst}.in_layer")
        r.move(f"{src}.linear_2", f"{dst}.out_layer")
    r.move("context_embedder", "txt_in")
    r.move("x_embedder", "img_in")
    for i in _indices(state, "transformer_blocks."):
        s, d = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        r.move(s + "norm1.linear", d + "img_mod.lin")
        r.move(s + "norm1_context.linear", d + "txt_mod.lin")
        r.fuse([s + "attn.to_q", s + "attn.to_k", s + "attn.to_v"], d + "img_attn.qkv")
        r.fuse([s + "attn.add_q_proj", s + "attn.add_k_proj", s + "attn.add_v_proj"], d + "txt_attn.qkv")
        for norm, side, which in (
            ("norm_q", "img", "query"),
            ("norm_k", "img", "key"),
            ("norm_added_q", "txt", "query"),
            ("norm_added_k", "txt", "key"),
        ):
            r.tensor(f"{s}attn.{norm}.weight", f"{d}{side}_attn.norm.{which}_norm.scale")
        r.move(s + "attn.to_out.0", d + "img_attn.proj")
        r.move(s + "attn.to_add_out", d + "txt_attn.proj")
        r.move(s + "ff.net.0.proj", d + "img_mlp.0")
        r.move(s + "ff.net.2", d + "img_mlp.2")
        r.move(s + "ff_context.net.0.proj", d + "txt_mlp.0")
        r.move(s + "ff_context.net.2", d + "txt_mlp.2")
    for i in _indices(state, "single_transformer_blocks."):
        s, d = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        r.move(s + "norm.linear", d + "modulation.lin")
        r.fuse([s + "attn.to_q", s + "attn.to_k", s + "attn.to_v", s + "proj_mlp"], d + "linear1")
        r.tensor(s + "attn.norm_q.weight", d + "norm.query_norm.scale")
        r.tensor(s + "attn.norm_k.weight", d + "norm.key_norm.scale")
        r.move(s + "proj_out", d + "linear2")
    r.move("proj_out", "final_layer.linear")
    r.swap("norm_out.linear", "final_layer.adaLN_modulation.1")
    return r.done()


def sd3_to_mmdit(state) -> dict[str, torch.Tensor]:
    r = _Reverse(state)
    r.tensor("pos_embed.pos_embed", "pos_embed")
    r.move("pos_embed.proj", "x_embedder.proj")
    r.move("time_text_embed.timestep_embedder.linear_1", "t_embedder.mlp.0")
    r.move("time_text_embed.timestep_embedder.linear_2", "t_embedder.mlp.2")
    r.move("time_text_embed.text_embedder.linear_1", "y_embedder.mlp.0")
    r.move("time_text_embed.text_embedder.linear_2", "y_embedder.mlp.2")
    r.move("context_embedder", "context_embedder")
    blocks = _indices(state, "transformer_blocks.")
    for i in blocks:
        s, x, c = f"transformer_blocks.{i}.", f"joint_blocks.{i}.x_block.", f"joint_blocks.{i}.context_block."
        last = i == blocks[-1]
        r.fuse([s + "attn.to_q", s + "attn.to_k", s + "attn.to_v"], x + "attn.qkv")
        r.fuse([s + "attn.add_q_proj", s + "attn.add_k_proj", s + "attn.add_v_proj"], c + "attn.qkv")
        for norm, dst in (("norm_q", x + "attn.ln_q"), ("norm_k", x + "attn.ln_k")):
            r.move(f"{s}attn.{norm}", dst, ("weight",))
        for norm, dst in (("norm_added_q", c + "attn.ln_q"), ("norm_added_k", c + "attn.ln_k")):
            r.move(f"{s}attn.{norm}", dst, ("weight",))
        r.move(s + "attn.to_out.0", x + "attn.proj")
        r.move(s + "attn.to_add_out", c + "attn.proj")
        if f"{s}attn2.to_q.weight" in state:
            r.fuse([s + "attn2.to_q", s + "attn2.to_k", s + "attn2.to_v"], x + "attn2.qkv")
            r.move(s + "attn2.norm_q", x + "attn2.ln_q", ("weight",))
            r.move(s + "attn2.norm_k", x + "attn2.ln_k", ("weight",))
            r.move(s + "attn2.to_out.0", x + "attn2.proj")
        r.move(s + "norm1.linear", x + "adaLN_modulation.1")
        if last:  # the last context block only modulates (shift, scale) for the final joint attention
            r.swap(s + "norm1_context.linear", c + "adaLN_modulation.1")
        else:
            r.move(s + "norm1_context.linear", c + "adaLN_modulation.1")
        r.move(s + "ff.net.0.proj", x + "mlp.fc1")
        r.move(s + "ff.net.2", x + "mlp.fc2")
        r.move(s + "ff_context.net.0.proj", c + "mlp.fc1")
        r.move(s + "ff_context.net.2", c + "mlp.fc2")
    r.move("proj_out", "final_layer.linear")
    r.swap("norm_out.linear", "final_layer.adaLN_modulation.1")
    return r.done()


def pixart_to_original(state) -> dict[str, torch.Tensor]:
    r = _Reverse(state)
    r.move("pos_embed.proj", "x_embedder.proj")
    for src, dst in (
        ("adaln_single.emb.timestep_embedder", "t_embedder"),
        ("adaln_single.emb.resolution_embedder", "csize_embedder"),
        ("adaln_single.emb.aspect_ratio_embedder", "ar_embedder"),
    ):
        r.move(f"{src}.linear_1", f"{dst}.mlp.0")
        r.move(f"{src}.linear_2", f"{dst}.mlp.2")
    r.move("adaln_single.linear", "t_block.1")
    r.move("caption_projection.linear_1", "y_embedder.y_proj.fc1")
    r.move("caption_projection.linear_2", "y_embedder.y_proj.fc2")
    for i in _indices(state, "transformer_blocks."):
        s, d = f"transformer_blocks.{i}.", f"blocks.{i}."
        r.tensor(s + "scale_shift_table", d + "scale_shift_table")
        r.fuse([s + "attn1.to_q", s + "attn1.to_k", s + "attn1.to_v"], d + "attn.qkv")
        r.move(s + "attn1.to_out.0", d + "attn.proj")
        r.move(s + "attn2.to_q", d + "cross_attn.q_linear")
        r.fuse([s + "attn2.to_k", s + "attn2.to_v"], d + "cross_attn.kv_linear")
        r.move(s + "attn2.to_out.0", d + "cross_attn.proj")
        r.move(s + "ff.net.0.proj", d + "mlp.fc1")
        r.move(s + "ff.net.2", d + "mlp.fc2")
    r.move("proj_out", "final_layer.linear")
    r.tensor("scale_shift_table", "final_layer.scale_shift_table")
    out = r.done()
    caption = out["y_embedder.y_proj.fc1.weight"].shape[1]
    out["y_embedder.y_embedding"] = torch.randn(7, caption)  # the training-only empty caption: dropped on load
    return out


TO_ORIGINAL = {"flux": flux_to_bfl, "sd3": sd3_to_mmdit, "pixart": pixart_to_original}


def tiny_transformers() -> dict[str, torch.nn.Module]:
    """family -> the tiny diffusers transformer (from the cached tiny pipeline folders)."""
    out = {}
    for family, name in TINY.items():
        comps = load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32, parts=("transformer",))
        out[family] = comps.transformer
    return out


def write_original(state, family: str, path, prefix: str = "", extra: dict | None = None):
    tensors = {prefix + k: v.contiguous() for k, v in TO_ORIGINAL[family](state).items()}
    tensors.update(extra or {})
    save_file(tensors, str(path))
    return path


def write_header_only(path, shapes: dict[str, tuple[int, ...]]):
    """A .safetensors file whose header lists ``shapes`` (for detection: the data is never read)."""
    header = {k: {"dtype": "BF16", "shape": list(s), "data_offsets": [0, 0]} for k, s in shapes.items()}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    return path


def same_config_value(a, b) -> bool:
    return list(a) == list(b) if isinstance(a, (list, tuple)) else a == b
