"""LTX-2 single files in Lightricks' layout (``ltx-2-19b-dev.safetensors``: the transformer and its text connectors
under ``model.diffusion_model.``, the VAEs and vocoder beside): detected as LTX-2 (not LTX-Video 0.9, whose marker
its files hold too), read with the shipped config and what the weights decide, converted to the same transformer as
the diffusers folder; the conversion agrees with diffusers' own single-file converter (oracle), only renames (a
PipeFusion stage reads its blocks alone) and the skeleton gives the file's names and shapes back from a config."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.models.conversion_plan import plan_conversion
from parallel_runtime.models.families.ltx2 import LTX2_19B
from parallel_runtime.models.families.ltx2.keys import LAYOUT
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components

PREFIX = "model.diffusion_model."
# diffusers' names -> Lightricks' (written from the two layouts; diffusers' converter is checked against it below)
ORIGINAL = (
    ("audio_proj_in.", "audio_patchify_proj."), ("proj_in.", "patchify_proj."),
    ("audio_time_embed.", "audio_adaln_single."), ("time_embed.", "adaln_single."),
    ("av_cross_attn_video_scale_shift.", "av_ca_video_scale_shift_adaln_single."),
    ("av_cross_attn_video_a2v_gate.", "av_ca_a2v_gate_adaln_single."),
    ("av_cross_attn_audio_scale_shift.", "av_ca_audio_scale_shift_adaln_single."),
    ("av_cross_attn_audio_v2a_gate.", "av_ca_v2a_gate_adaln_single."),
    (".video_a2v_cross_attn_scale_shift_table", ".scale_shift_table_a2v_ca_video"),
    (".audio_a2v_cross_attn_scale_shift_table", ".scale_shift_table_a2v_ca_audio"),
    (".norm_q.", ".q_norm."), (".norm_k.", ".k_norm."),
)  # fmt: skip


def original_name(name: str) -> str:
    for diffusers, original in ORIGINAL:
        if diffusers.startswith("."):
            name = name.replace(diffusers, original)
        elif name.startswith(diffusers):
            name = original + name[len(diffusers) :]
    return name


@pytest.fixture(scope="module")
def folder():
    return load_pipeline_components(ensure_tiny_model("tiny-ltx2"), "cpu", torch.float32, parts=("transformer",))


@pytest.fixture(scope="module")
def checkpoint(folder, tmp_path_factory):
    """A release-like file: the transformer in Lightricks' names, a text connector tensor beside it, a VAE tensor,
    and Lightricks' config metadata stating the (tiny) heads and the rotary type."""
    import json

    from safetensors.torch import save_file

    state = {PREFIX + original_name(k): v.contiguous() for k, v in folder.transformer.state_dict().items()}
    state[PREFIX + "video_embeddings_connector.learnable_registers"] = torch.randn(4, 32)
    state["vae.per_channel_statistics.mean-of-means"] = torch.zeros(128)
    path = tmp_path_factory.mktemp("ltx2-files") / "ltx-2-tiny.safetensors"
    c = folder.transformer.config
    stated = {k: c[k] for k in ("num_attention_heads", "attention_head_dim", "audio_num_attention_heads",
                                "audio_attention_head_dim")}  # fmt: skip
    stated.update(rope_type="split", frequencies_precision="float64")
    save_file(state, str(path), metadata={"config": json.dumps({"transformer": stated})})
    return path, state


def test_diffusers_converter_agrees_with_the_layout(folder, checkpoint):
    from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers

    _, state = checkpoint
    transformer = {k: v for k, v in state.items() if k.startswith(PREFIX)}
    theirs = convert_ltx2_transformer_to_diffusers(dict(transformer))
    ours = LAYOUT.to_diffusers({k[len(PREFIX) :]: v for k, v in transformer.items()}, folder.transformer.config)
    assert set(theirs) == set(ours) == set(folder.transformer.state_dict())
    assert all(theirs[k] is ours[k] for k in ours)


def test_checkpoint_loads_as_the_folders_transformer(folder, checkpoint):
    path, state = checkpoint
    info = inspect_single_file(path)
    assert (info.family, info.variant, info.prefix) == ("ltx2", LTX2_19B, PREFIX)
    # the tiny model's 2 heads are not the release's 32 (the weights cannot show them): compare what they decide
    for key in ("in_channels", "num_layers", "cross_attention_dim", "caption_channels", "audio_in_channels",
                "num_attention_heads", "attention_head_dim", "audio_attention_head_dim", "rope_type",
                "rope_double_precision"):  # fmt: skip
        assert info.config[key] == folder.transformer.config[key], key
    comps = load_single_file_components(path, "cpu", torch.float32)
    ours, theirs = comps.transformer.state_dict(), folder.transformer.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours if not _audio(k))
    skeleton = LAYOUT.skeleton(info.config)
    transformer = {k[len(PREFIX) :]: tuple(v.shape) for k, v in state.items() if k.startswith(PREFIX)}
    assert skeleton == {k: v for k, v in transformer.items() if "connector" not in k}


def test_conversion_only_renames(folder, checkpoint):
    _, state = checkpoint
    shapes = {k[len(PREFIX) :]: tuple(v.shape) for k, v in state.items() if k.startswith(PREFIX)}
    plan = plan_conversion(lambda s: LAYOUT.to_diffusers(s, folder.transformer.config), shapes)
    assert set(plan.unused) == {"video_embeddings_connector.learnable_registers"}
    assert set(plan.pieces) == set(folder.transformer.state_dict())
    assert all(len(p) == 1 and p[0].r0 == 0 and p[0].r1 == shapes[p[0].key][0] for p in plan.pieces.values())


def test_bench_families_counts_the_video_streams_weights_of_the_released_config():
    """``bench families``' byte accounting at the shipped LTX-2 config counts what is held: the model built from it
    has 18.9B parameters (the release's "19B"), of which the audio stream and the audio<->video cross-attentions
    (5.8B) are never read (video-only), 2 bytes each of the other 13.0B; 768x512 px, 121 frames is 16 x 24 x 16 =
    6144 video tokens (the text is cross-attention)."""
    from diffusers import LTX2VideoTransformer3DModel

    from parallel_runtime.models.families.registry import family
    from parallel_runtime.models.single_file import shipped_config
    from parallel_runtime.tools.bench_families import default_tokens, weight_gb

    spec, (config, _) = family("ltx2"), shipped_config(LTX2_19B)
    with torch.device("meta"):
        named = dict(LTX2VideoTransformer3DModel.from_config(config).named_parameters())
    audio = sum(p.numel() for n, p in named.items() if _audio(n))
    video = sum(p.numel() for n, p in named.items() if not _audio(n))
    assert 18.8e9 < audio + video < 19.0e9 and 5.7e9 < audio < 5.9e9
    assert weight_gb(spec, LTX2_19B, "auto")["pp1"] == round(2 * video / 1e9, 3)
    assert default_tokens(spec, LTX2_19B) == {"size": "768x512x121", "image_tokens": 6144, "sequence_tokens": 6144}


AUDIO = ("audio", "av_cross_attn_", "video_to_audio_", "video_a2v_")  # the audio side's diffusers names, written here


def _audio(name: str) -> bool:
    return any(part.startswith(AUDIO) for part in name.split("."))


@torch.no_grad()
def test_the_audio_streams_tensors_are_never_read(folder, checkpoint, monkeypatch):
    """Video-only: loading the release file reads exactly the video stream's tensors (the file reader's record),
    leaves the audio stream's parameters on "meta" (never held), and the model predicts what the folder's full
    model predicts; a PipeFusion stage of the file reads and counts only its share of the video stream."""
    from parallel_runtime.attention.usp import SequenceParallelAttention
    from parallel_runtime.models.base import Conditioning
    from parallel_runtime.models.registry import get_adapter
    from parallel_runtime.models.tensor_files import SafetensorsFile
    from parallel_runtime.parallel.mesh import ParallelMesh
    from parallel_runtime.pipefusion.stage_loading import load_single_file_stage

    path, state = checkpoint
    read: list[str] = []
    original_read = SafetensorsFile.read
    monkeypatch.setattr(
        SafetensorsFile, "read", lambda self, k, rows=None: read.append(k) or original_read(self, k, rows)
    )
    transformer = load_single_file_components(path, "cpu", torch.float32).transformer
    params = dict(folder.transformer.named_parameters())
    video = {PREFIX + original_name(k) for k in params if not _audio(k)}
    assert set(read) == video and any(_audio(k) for k in params)  # the audio tensors are in the file, never read
    for name, p in transformer.named_parameters():
        assert (p.device.type == "meta") == _audio(name), name
    g = torch.Generator().manual_seed(0)
    x, text, mask = torch.randn(1, 128, 2, 3, 4, generator=g), torch.randn(1, 9, 32, generator=g), torch.ones(1, 9)
    mesh = ParallelMesh.single()
    cond, t = Conditioning(text, None, mask), torch.tensor([0.6])
    ours = get_adapter(transformer).forward(x, t, cond, mesh, SequenceParallelAttention(mesh))
    full = folder.adapter().forward(x, t, cond, mesh, SequenceParallelAttention(mesh))
    assert torch.equal(ours, full)
    held = []
    for stage in (0, 1):
        read.clear()
        _, _, weights = load_single_file_stage(path, 2, stage, "cpu", torch.float32)
        assert read and not any(_audio(k) for k in read)
        held.append(weights.param_bytes)
        assert weights.total_transformer_bytes == 4 * sum(p.numel() for k, p in params.items() if not _audio(k))
    assert sum(held) == weights.total_transformer_bytes
