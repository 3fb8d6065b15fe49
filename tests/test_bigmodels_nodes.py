"""Qwen-Image and FLUX.2 from a ComfyUI graph (the nodes, without ComfyUI): LATENTs in ComfyUI's layouts for
these families (Qwen-Image [B,16,1,H,W]; FLUX.2 packed 128-style channels at 1/16), and the decode equal to the
diffusers pipelines' own decode of the same latent."""

from __future__ import annotations

import pytest
import torch
from pack_import import load_pack  # tests/ helper

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.parallel.config import ParallelConfig

PACK = load_pack()
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.latent import ParallelEmptyLatent  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402
from dit_parallel_pack.nodes.text_encode import ParallelTextEncode  # noqa: E402
from dit_parallel_pack.nodes.vae_decode import ParallelVAEDecode  # noqa: E402
from node_helpers import LOAD, RecordingBridge  # noqa: E402

SIZE = 96  # px: 12x12 latent for Qwen-Image (6x6 tokens), 6x6 packed latent for FLUX.2


@pytest.fixture(scope="module")
def ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=RecordingBridge())


def _pipeline_decode(name: str, latent: torch.Tensor) -> torch.Tensor:
    """The diffusers pipeline's own decode of our output latent, as ComfyUI IMAGE [B, H, W, 3] in 0..1."""
    import diffusers

    path = ensure_tiny_model(name)
    if name == "tiny-qwen-image":
        pipe = diffusers.QwenImagePipeline.from_pretrained(path, torch_dtype=torch.float32)
        vae = pipe.vae  # the pipeline's own normalisation: latents / (1 / std) + mean, as ComfyUI's LATENT already is
        image = vae.decode(latent.float(), return_dict=False)[0][:, :, 0]
    else:
        pipe = diffusers.Flux2Pipeline.from_pretrained(path, torch_dtype=torch.float32)
        vae = pipe.vae
        mean = vae.bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
        image = vae.decode(pipe._unpatchify_latents(latent.float() * std + mean), return_dict=False)[0]
    return (image / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)


@pytest.mark.parametrize(
    ("model", "degrees", "cfg", "layout", "latent_shape"),
    [
        ("tiny-qwen-image", {"ulysses": 2}, 2.5, ParallelConfig(ulysses=2), (1, 16, 1, 12, 12)),
        (
            "tiny-qwen-image",
            {"pipefusion": 2, "pp_patches": 2, "pp_warmup": 2},
            2.5,
            ParallelConfig(pp=2),
            (1, 16, 1, 12, 12),
        ),
        ("tiny-flux2", {"ring": 2}, 1.0, ParallelConfig(ring=2), (1, 16, 6, 6)),
    ],
    ids=["qwen-ulysses2", "qwen-pp2", "flux2-ring2"],
)
@torch.no_grad()
def test_graph_runs_and_decodes_like_the_pipeline(ctx, model, degrees, cfg, layout, latent_shape):
    result = ParallelModelLoader(ctx).load(model=model, family="auto", layout="manual", **{**LOAD, **degrees})
    (handle,) = result["result"]
    assert handle.request.layout == layout and "of weights" in result["ui"]["text"][0]
    (pos,) = ParallelTextEncode().encode(handle, "a watercolor fox")
    (neg,) = ParallelTextEncode().encode(handle, "")
    (latent,) = ParallelEmptyLatent().generate(handle, SIZE, SIZE, 1)
    assert latent["samples"].shape == latent_shape
    (out,) = ParallelSampler(ctx).sample(handle, pos, neg, latent, 3, 2, cfg, "euler", "simple", 1.0)["result"]
    samples = out["samples"]
    assert samples.shape == latent_shape and torch.isfinite(samples).all()
    (image,) = ParallelVAEDecode(ctx).decode(handle, out)
    assert image.shape == (1, SIZE, SIZE, 3)
    flat = samples[:, :, 0] if samples.ndim == 5 else samples
    expected = _pipeline_decode(model, flat.unsqueeze(2) if samples.ndim == 5 else flat)
    assert (image - expected).abs().max().item() <= 1e-4


def test_text_encoder_files_and_their_tokenizers_are_found(tmp_path):
    """Parallel Text Encode's encoder list is models/text_encoders; a file's tokenizer is the folder next to it,
    else the one ComfyUI ships for that encoder; what is missing is a ConfigError saying where to put it."""
    from dit_parallel_pack.nodes.bridge import SHIPPED_TOKENIZERS
    from dit_parallel_pack.nodes.model_files import TEXT_ENCODER_OWN, resolve_text_encoder, text_encoder_choices

    from parallel_runtime.errors import ConfigError

    encoders, shipped = tmp_path / "text_encoders", tmp_path / "comfy_text_encoders"
    (encoders / "sub").mkdir(parents=True)
    (shipped / "qwen25_tokenizer").mkdir(parents=True)
    for name in ("qwen_2.5_vl_7b.safetensors", "sub/qwen_2.5_vl_7b_fp8_scaled.safetensors", "t5xxl.safetensors"):
        (encoders / name).write_bytes(b"")
    (encoders / "qwen_2.5_vl_7b_tokenizer").mkdir()
    bridge = RecordingBridge(folders={"text_encoders": [str(encoders)], SHIPPED_TOKENIZERS: [str(shipped)]})
    assert text_encoder_choices(bridge) == [
        TEXT_ENCODER_OWN,
        "qwen_2.5_vl_7b.safetensors",
        "sub/qwen_2.5_vl_7b_fp8_scaled.safetensors",
        "t5xxl.safetensors",
    ]
    assert resolve_text_encoder(TEXT_ENCODER_OWN, bridge) is None
    assert resolve_text_encoder("qwen_2.5_vl_7b.safetensors", bridge) == (
        str(encoders / "qwen_2.5_vl_7b.safetensors"),
        str(encoders / "qwen_2.5_vl_7b_tokenizer"),
    )
    assert resolve_text_encoder("sub/qwen_2.5_vl_7b_fp8_scaled.safetensors", bridge)[1] == str(
        shipped / "qwen25_tokenizer"
    )
    # no folder: (file, None); the family's reader decides on the host whether the file carries its tokenizer
    assert resolve_text_encoder("t5xxl.safetensors", bridge) == (str(encoders / "t5xxl.safetensors"), None)
    (shipped / "t5_tokenizer").mkdir()  # ComfyUI's own T5 tokenizer serves t5xxl*.safetensors
    assert resolve_text_encoder("t5xxl.safetensors", bridge)[1] == str(shipped / "t5_tokenizer")
    with pytest.raises(ConfigError, match="was not found"):
        resolve_text_encoder("missing.safetensors", bridge)
