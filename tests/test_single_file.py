"""Single-file transformers in their original layouts (BFL Flux, Stability MMDiT, PixArt) load to
the same transformer as the diffusers folder, offline, with the family and variant detected."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from bigmodel_files import save as save_file_fp8  # tests/ helpers
from bigmodel_files import to_fp8
from ldm_vae_layout import to_ldm
from safetensors.torch import save_file

from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import ConfigError, WorkerError
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer, shipped_config
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.models.tiny import ensure_tiny_model
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.pipefusion.stage_loading import load_single_file_stage, load_stage_transformer
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode, encode_text, generate

torch.set_num_threads(1)
PREFIX = "model.diffusion_model."
TINY = {"flux": "tiny-flux", "sd3": "tiny-sd3", "pixart": "tiny-pixart"}
PIXART_OVERRIDES = {"attention_head_dim": 24}  # the tiny PixArt's head width (not stored in its weights)


# -- diffusers -> original layout (ours, for building test files) -------------------------------------
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


# -- helpers -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_transformers():
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


def forward(family: str, model, seed: int = 0) -> torch.Tensor:
    """One forward pass of a diffusers transformer on fixed random inputs."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    with torch.no_grad():
        if family == "flux":
            rows = cols = 4
            ids = torch.stack(torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij"), -1).reshape(-1, 2)
            img_ids = torch.cat([torch.zeros(rows * cols, 1), ids.float()], 1)
            return model(
                hidden_states=torch.randn(1, rows * cols, cfg.in_channels, generator=g),
                encoder_hidden_states=torch.randn(1, 5, cfg.joint_attention_dim, generator=g),
                pooled_projections=torch.randn(1, cfg.pooled_projection_dim, generator=g),
                timestep=torch.tensor([0.7]),
                img_ids=img_ids,
                txt_ids=torch.zeros(5, 3),
                guidance=torch.tensor([3.5]) if cfg.guidance_embeds else None,
            ).sample
        x = torch.randn(1, cfg.in_channels, 8, 8, generator=g)
        if family == "sd3":
            return model(
                hidden_states=x,
                encoder_hidden_states=torch.randn(1, 5, cfg.joint_attention_dim, generator=g),
                pooled_projections=torch.randn(1, cfg.pooled_projection_dim, generator=g),
                timestep=torch.tensor([700.0]),
            ).sample
        return model(
            hidden_states=x,
            encoder_hidden_states=torch.randn(1, 5, cfg.caption_channels, generator=g),
            timestep=torch.tensor([700]),
            added_cond_kwargs={"resolution": torch.tensor([[64.0, 64.0]]), "aspect_ratio": torch.tensor([[1.0]])},
        ).sample


# -- our reverse mapping is diffusers' conversion run backwards ------------------------------------------
def test_flux_reverse_mapping_round_trips_through_diffusers_at_flux1_width():
    """diffusers' Flux converter splits single blocks at FLUX.1's width (3072), so the check runs at
    that width: one double and one single block, with one input column per weight (values differ)."""
    from diffusers import FluxTransformer2DModel

    from parallel_runtime.models.compat import convert_flux_transformer
    from parallel_runtime.models.weights import parameters_on_meta

    with parameters_on_meta():
        meta = FluxTransformer2DModel(num_layers=1, num_single_layers=1, guidance_embeds=True)
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape[0], *[1] * (v.dim() - 1), generator=g) for k, v in meta.state_dict().items()}
    back = convert_flux_transformer(flux_to_bfl(state))
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("qk_norm, dual", [("rms_norm", (0,)), (None, ())], ids=["sd3.5-medium", "sd3-medium"])
def test_sd3_reverse_mapping_round_trips_through_diffusers(qk_norm, dual):
    from diffusers import SD3Transformer2DModel

    from parallel_runtime.models.compat import convert_sd3_transformer

    torch.manual_seed(0)
    model = SD3Transformer2DModel(
        sample_size=8,
        num_layers=3,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=24,
        caption_projection_dim=16,
        pooled_projection_dim=12,
        pos_embed_max_size=8,
        qk_norm=qk_norm,
        dual_attention_layers=dual,
    )
    state = model.state_dict()
    back = convert_sd3_transformer(sd3_to_mmdit(state))
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_pixart_reverse_mapping_round_trips_through_our_converter(tiny_transformers):
    """diffusers ships no PixArt single-file converter: ours is the forward direction here (the
    names follow diffusers' scripts/convert_pixart_sigma_to_diffusers.py)."""
    from parallel_runtime.models.original_layout import to_diffusers

    state = tiny_transformers["pixart"].state_dict()
    original = pixart_to_original(state)
    back = to_diffusers("pixart", original, {})
    assert sorted(back) == sorted(k for k in state if k != "pos_embed.pos_embed")  # a computed, unsaved table
    assert all(torch.equal(back[k], state[k]) for k in back)
    assert not original  # everything was used (the empty caption is dropped)


# -- loading ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "family, prefix",
    [("flux", ""), ("sd3", PREFIX), ("pixart", ""), ("flux", PREFIX)],
    ids=["flux", "sd3-prefixed", "pixart", "flux-prefixed"],
)
def test_single_file_loads_the_same_transformer(tmp_path, tiny_transformers, family, prefix):
    reference = tiny_transformers[family]
    extra = {"first_stage_model.decoder.conv_in.weight": torch.zeros(2, 2)} if prefix else None
    path = write_original(reference.state_dict(), family, tmp_path / f"{family}.safetensors", prefix, extra)
    overrides = PIXART_OVERRIDES if family == "pixart" else None
    model, found, scheduler = load_single_file_transformer(path, "cpu", torch.float32, overrides=overrides)
    assert found == family and type(model) is type(reference)
    for key, value in reference.config.items():
        if not key.startswith("_") and key not in ("sample_size", "interpolation_scale"):
            assert _same(model.config[key], value), (key, model.config[key], value)
    got, ref = model.state_dict(), reference.state_dict()
    assert sorted(got) == sorted(ref)
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    assert (forward(family, model) - forward(family, reference)).abs().max().item() <= 1e-6
    variant = inspect_single_file(path, overrides=overrides).variant
    assert scheduler == shipped_config(variant)[1]


def _same(a, b) -> bool:
    return list(a) == list(b) if isinstance(a, (list, tuple)) else a == b


def test_pixart_pth_file_and_bf16(tmp_path, tiny_transformers):
    """PixArt's own .pth checkpoints nest the weights under "state_dict"; weights load in the asked dtype."""
    reference = tiny_transformers["pixart"]
    path = tmp_path / "PixArt-Sigma-XL-2-1024-MS.pth"
    torch.save({"state_dict": pixart_to_original(reference.state_dict())}, path)
    model, family, scheduler = load_single_file_transformer(path, "cpu", torch.bfloat16, overrides=PIXART_OVERRIDES)
    assert family == "pixart" and scheduler["_class_name"] == "DPMSolverMultistepScheduler"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ref = reference.state_dict()
    assert all(torch.equal(v, ref[k].to(torch.bfloat16)) for k, v in model.state_dict().items() if k in ref)


# -- detection -------------------------------------------------------------------------------------------
def test_family_and_variant_detection_of_tiny_files(tmp_path, tiny_transformers):
    flux = TO_ORIGINAL["flux"](tiny_transformers["flux"].state_dict())
    save_file(flux, str(tmp_path / "dev.safetensors"))
    save_file({k: v for k, v in flux.items() if not k.startswith("guidance_in.")}, str(tmp_path / "schnell.sft"))
    sd3 = TO_ORIGINAL["sd3"](tiny_transformers["sd3"].state_dict())
    save_file(sd3, str(tmp_path / "sd35m.safetensors"))
    no_dual = {k: v for k, v in sd3.items() if ".attn2." not in k}
    save_file(no_dual, str(tmp_path / "sd35l.safetensors"))
    save_file({k: v for k, v in no_dual.items() if ".ln_" not in k}, str(tmp_path / "sd3m.safetensors"))
    write_original(tiny_transformers["pixart"].state_dict(), "pixart", tmp_path / "pixart.safetensors")

    def inspect(name, **kw):
        return inspect_single_file(tmp_path / name, **kw)

    dev, schnell = inspect("dev.safetensors"), inspect("schnell.sft")
    assert (dev.family, dev.variant, dev.config["guidance_embeds"]) == ("flux", "flux-dev", True)
    assert (schnell.variant, schnell.config["guidance_embeds"]) == ("flux-schnell", False)
    assert schnell.scheduler_config["use_dynamic_shifting"] is False and dev.scheduler_config["use_dynamic_shifting"]
    assert dev.config["axes_dims_rope"] == [4, 6, 6]  # FLUX.1's (16, 56, 56) split scaled to a 16-wide head
    medium, large = inspect("sd35m.safetensors"), inspect("sd35l.safetensors")
    assert (medium.variant, medium.config["dual_attention_layers"], medium.config["qk_norm"]) == (
        "sd3.5-medium",
        [0],
        "rms_norm",
    )
    assert (large.variant, large.config["dual_attention_layers"]) == ("sd3.5-large", [])
    old = inspect("sd3m.safetensors", overrides={"attention_head_dim": 16})
    assert (old.variant, old.config["qk_norm"], old.config["num_attention_heads"]) == ("sd3-medium", None, 4)
    assert medium.config["num_layers"] == 3 and medium.config["pos_embed_max_size"] == 32
    pixart = inspect("pixart.safetensors", overrides=PIXART_OVERRIDES)
    assert (pixart.family, pixart.variant) == ("pixart", "pixart-sigma-1024")
    assert pixart.config["use_additional_conditions"] is True  # the tiny model has alpha's micro-conditions
    assert inspect("dev.safetensors", variant="flux-schnell").variant == "flux-schnell"  # an explicit choice


def test_published_sizes_from_header_only(tmp_path):
    """Real-size headers (no data): the shipped configs come back with the published dimensions."""
    sd35l = {
        "model.diffusion_model.x_embedder.proj.weight": (2432, 16, 2, 2),
        "model.diffusion_model.pos_embed": (1, 36864, 2432),
        "model.diffusion_model.context_embedder.weight": (2432, 4096),
        "model.diffusion_model.y_embedder.mlp.0.weight": (2432, 2048),
        "model.diffusion_model.final_layer.linear.weight": (64, 2432),
        "first_stage_model.decoder.conv_in.weight": (512, 16, 3, 3),
        **{f"model.diffusion_model.joint_blocks.{i}.x_block.attn.ln_q.weight": (64,) for i in range(38)},
    }
    info = inspect_single_file(write_header_only(tmp_path / "sd3.5_large.safetensors", sd35l))
    base, _ = shipped_config("sd3.5-large")
    assert info.variant == "sd3.5-large" and info.prefix == PREFIX
    for key in ("num_layers", "num_attention_heads", "attention_head_dim", "caption_projection_dim", "in_channels"):
        assert info.config[key] == base[key], key
    for key in ("joint_attention_dim", "pooled_projection_dim", "pos_embed_max_size", "out_channels", "qk_norm"):
        assert info.config[key] == base[key], key
    assert info.config["dual_attention_layers"] == []
    flux = {
        "img_in.weight": (3072, 64),
        "txt_in.weight": (3072, 4096),
        "vector_in.in_layer.weight": (3072, 768),
        "guidance_in.in_layer.weight": (3072, 256),
        "final_layer.linear.weight": (64, 3072),
        **{f"double_blocks.{i}.img_attn.norm.query_norm.scale": (128,) for i in range(19)},
        **{f"single_blocks.{i}.linear1.weight": (21504, 3072) for i in range(38)},
    }
    info = inspect_single_file(write_header_only(tmp_path / "flux1-dev.safetensors", flux))
    base, scheduler = shipped_config("flux-dev")
    assert info.variant == "flux-dev" and info.scheduler_config == scheduler
    assert all(_same(info.config[k], v) for k, v in base.items())
    assert info.config["out_channels"] is None  # as in FLUX.1's config: the same as in_channels
    pixart = {
        "x_embedder.proj.weight": (1152, 4, 2, 2),
        "y_embedder.y_proj.fc1.weight": (1152, 4096),
        "final_layer.linear.weight": (32, 1152),
        **{f"blocks.{i}.attn.qkv.weight": (3456, 1152) for i in range(28)},
    }
    info = inspect_single_file(write_header_only(tmp_path / "PixArt-Sigma-XL-2-1024-MS.safetensors", pixart))
    base, _ = shipped_config("pixart-sigma-1024")
    assert info.variant == "pixart-sigma-1024" and info.config == base


def test_wrong_family_missing_file_and_other_files_fail_clearly(tmp_path, tiny_transformers):
    path = write_original(tiny_transformers["flux"].state_dict(), "flux", tmp_path / "flux1-dev.safetensors")
    with pytest.raises(ConfigError, match=r"is a flux transformer but family 'sd3' was chosen") as err:
        load_single_file_transformer(path, family="sd3")
    assert "fix:" in str(err.value)
    with pytest.raises(ConfigError, match=r"variant 'sd3.5-large' is a sd3 model but .* holds a flux"):
        inspect_single_file(path, variant="sd3.5-large")
    with pytest.raises(ConfigError, match="does not exist"):
        load_single_file_transformer(tmp_path / "nothing.safetensors")
    vae = write_header_only(tmp_path / "ae.safetensors", {"decoder.conv_in.weight": (512, 16, 3, 3)})
    with pytest.raises(
        ConfigError, match="does not look like a Flux, FLUX.2, Qwen-Image, SD3, PixArt or Wan transformer"
    ):
        inspect_single_file(vae)
    with pytest.raises(ConfigError, match="diffusers' tensor names"):
        inspect_single_file(write_header_only(tmp_path / "d.safetensors", {"single_transformer_blocks.0.x": (1,)}))
    pixart = write_original(tiny_transformers["pixart"].state_dict(), "pixart", tmp_path / "pixart.safetensors")
    with pytest.raises(ConfigError, match="does not split into heads of 72"):
        inspect_single_file(pixart)  # 96 wide: the shipped head width does not fit; an override is needed
    # a ComfyUI "fp8 scaled" Flux.1 file loads with its scales (fp8 storage; see test_bigmodels_files for the maths)
    original = flux_to_bfl(tiny_transformers["flux"].state_dict())
    scaled = save_file_fp8(to_fp8(original, "scaled"), tmp_path / "flux1-dev-fp8-scaled.safetensors")
    model, _, _ = load_single_file_transformer(scaled, "cpu", torch.bfloat16)
    q = model.transformer_blocks[0].attn.to_q
    assert q.weight.dtype == torch.float8_e4m3fn and q.scaled


@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_pipefusion_stage_from_a_single_file_equals_the_folder_stage(tmp_path, tiny_transformers, family):
    """Each stage holds exactly the tensors (same values) that the folder's stage loader gives it."""
    folder = ensure_tiny_model(TINY[family])
    path = write_original(tiny_transformers[family].state_dict(), family, tmp_path / "m.safetensors", PREFIX)
    for stage in (0, 1):
        comps, plan, weights = load_single_file_stage(path, 2, stage, "cpu", torch.float32, (0.6, 0.4))
        ref, ref_plan, ref_weights = load_stage_transformer(folder, 2, stage, "cpu", torch.float32, (0.6, 0.4))
        assert plan.bounds == ref_plan.bounds and weights == ref_weights
        got, want = dict(comps.transformer.named_parameters()), dict(ref.named_parameters())
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert got[name].device == value.device, name  # "meta" exactly where the folder's stage has it
            if value.device.type != "meta":
                assert torch.equal(got[name], value), name
        assert 0 < weights.param_bytes < weights.total_transformer_bytes


def test_resolve_model_path_accepts_single_files(tmp_path):
    from parallel_runtime.service.api import resolve_model_path

    f = write_header_only(tmp_path / "m.safetensors", {"img_in.weight": (8, 4)})
    assert resolve_model_path(str(f)) == f
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="not a model file"):
        resolve_model_path(str(tmp_path / "notes.txt"))


# -- through the worker pool -----------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_pool_generate_from_single_file_equals_folder(cpu_pool, tmp_path, family):
    """load_model on a single file, then generate with conditioning encoded in-process from the tiny
    pipeline's text encoders: the same latent as the diffusers folder gives on the same pool."""
    folder = ensure_tiny_model(TINY[family])
    comps = load_pipeline_components(folder, "cpu", torch.float32, parts=("transformer", "text"))
    pos, neg = encode_prompts(comps, family, "a red house by a lake", "blurry")
    path = write_original(comps.transformer.state_dict(), family, tmp_path / f"{family}.safetensors", PREFIX)
    cfg = 4.0 if family == "sd3" else 1.0
    settings = SamplingSettings(seed=3, steps=2, cfg=cfg, guidance=3.5)
    latent = torch.zeros(1, 16, 8, 12)
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(folder), "fp32", "sdpa").result(300)
    expected = pool.submit(generate, pos, neg if cfg > 1 else None, latent, settings).result(300)
    info = pool.submit(load_model, str(path), "fp32", "sdpa").result(300)
    assert info["family"] == family and info["embed_dim"] == comps.transformer_config["joint_attention_dim"]
    got = pool.submit(generate, pos, neg if cfg > 1 else None, latent, settings).result(300)
    assert (got - expected).abs().max().item() <= 1e-6
    with pytest.raises(WorkerError, match="CLIP Text Encode"):
        pool.submit(encode_text, ["a house"]).result(60)
    with pytest.raises(WorkerError, match="VAE Decode"):
        pool.submit(decode, latent).result(60)

    # With the VAE from its own file (original LDM names): sampling is unchanged (the model keeps
    # its latent scale and shift) and the parallel decode equals the folder model's.
    pool.submit(load_model, str(folder), "fp32", "sdpa").result(300)
    z = torch.randn(1, 16, 8, 12, generator=torch.Generator().manual_seed(1))
    folder_image = pool.submit(decode, z).result(300)
    vae = load_pipeline_components(folder, "cpu", torch.float32, parts=("vae",)).vae
    vae_file = tmp_path / "ae.safetensors"
    save_file(to_ldm(vae.state_dict(), len(vae.config.block_out_channels)), str(vae_file))
    pool.submit(load_model, str(path), "fp32", "sdpa", vae_path=str(vae_file), vae_norm_groups=4).result(300)
    got = pool.submit(generate, pos, neg if cfg > 1 else None, latent, settings).result(300)
    assert (got - expected).abs().max().item() <= 1e-6
    torch.testing.assert_close(pool.submit(decode, z).result(300), folder_image, rtol=0, atol=1e-6)


def test_pool_decodes_with_a_vae_file_instead_of_the_models_own(cpu_pool, tmp_path):
    """The loader's vae input overrides a folder model's VAE too; a VAE of another latent width is refused."""
    folder = ensure_tiny_model("tiny-flux")
    vae = load_pipeline_components(folder, "cpu", torch.float32, parts=("vae",)).vae
    state = {k: v.clone() for k, v in vae.state_dict().items()}
    state["decoder.conv_out.bias"] += 0.25  # a recognisably different VAE
    vae.load_state_dict(state)
    vae_file = tmp_path / "other_ae.safetensors"
    save_file(to_ldm(state, len(vae.config.block_out_channels)), str(vae_file))
    pool = cpu_pool(ParallelConfig(ulysses=2))
    z = torch.randn(1, 16, 16, 8, generator=torch.Generator().manual_seed(2))
    pool.submit(load_model, str(folder), "fp32", "sdpa").result(300)
    own = pool.submit(decode, z).result(300)
    pool.submit(load_model, str(folder), "fp32", "sdpa", vae_path=str(vae_file), vae_norm_groups=4).result(300)
    other = pool.submit(decode, z).result(300)
    with torch.no_grad():
        expected = (vae.decode(z).sample / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)
    torch.testing.assert_close(other, expected, rtol=0, atol=1e-5)
    assert (other - own).abs().max().item() > 0.01

    pixart_vae = load_pipeline_components(ensure_tiny_model("tiny-pixart"), "cpu", torch.float32, parts=("vae",)).vae
    four_channel = tmp_path / "sdxl_vae.safetensors"
    save_file(to_ldm(pixart_vae.state_dict(), 4), str(four_channel))
    with pytest.raises(WorkerError, match="4 latent channels but this flux model makes 16"):
        pool.submit(load_model, str(folder), "fp32", "sdpa", vae_path=str(four_channel), vae_norm_groups=4).result(300)


def test_pool_pipefusion_from_single_file_equals_folder(cpu_pool, tmp_path):
    """pp=2 on a Flux transformer file (no diffusers folder): the same latent as the folder model
    under the same PipeFusion layout, and each rank holds only its stage."""
    folder = ensure_tiny_model("tiny-flux")
    comps = load_pipeline_components(folder, "cpu", torch.float32, parts=("transformer", "text"))
    pos, _ = encode_prompts(comps, "flux", "a lighthouse at dusk", "")
    path = write_original(comps.transformer.state_dict(), "flux", tmp_path / "flux1.safetensors", PREFIX)
    settings = SamplingSettings(seed=5, steps=3, cfg=1.0, guidance=3.5)
    latent = torch.zeros(1, 16, 8, 8)
    pool = cpu_pool(ParallelConfig(pp=2))
    pool.submit(load_model, str(folder), "fp32", "sdpa").result(300)
    expected = pool.submit(generate, pos, None, latent, settings, False, 2).result(300)
    info = pool.submit(load_model, str(path), "fp32", "sdpa").result(300)
    ranks = info["pipefusion"]["ranks"]
    assert all(0 < r["param_bytes"] < r["total_transformer_bytes"] for r in ranks)
    got = pool.submit(generate, pos, None, latent, settings, False, 2).result(300)
    assert (got - expected).abs().max().item() <= 1e-6
