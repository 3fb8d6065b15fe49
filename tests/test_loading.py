"""Tiny pipeline folders: built deterministically and atomically, loaded by loading.py and by diffusers."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
import torch

from dit_devtools.tiny import TINY_MODELS, TINY_VIDEO_MODELS, build_tiny_pipeline, ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.loading import load_pipeline_components

torch.set_num_threads(1)

EXPECTED = {
    "tiny-flux": ("flux", "FluxPipeline", "FluxTransformer2DModel", ["text_encoder", "text_encoder_2"]),
    "tiny-sd3": (
        "sd3",
        "StableDiffusion3Pipeline",
        "SD3Transformer2DModel",
        ["text_encoder", "text_encoder_2", "text_encoder_3"],
    ),
    "tiny-pixart": ("pixart", "PixArtAlphaPipeline", "PixArtTransformer2DModel", ["text_encoder"]),
    "tiny-qwen-image": ("qwen-image", "QwenImagePipeline", "QwenImageTransformer2DModel", ["text_encoder"]),
    "tiny-flux2": ("flux2", "Flux2Pipeline", "Flux2Transformer2DModel", ["text_encoder"]),
    "tiny-z-image": ("z-image", "ZImagePipeline", "ZImageTransformer2DModel", ["text_encoder"]),
    "tiny-chroma": ("chroma", "ChromaPipeline", "ChromaTransformer2DModel", ["text_encoder"]),
}


@pytest.mark.parametrize("name", TINY_MODELS)
def test_loads_through_loading(name):
    family, pipeline_class, transformer_class, encoders = EXPECTED[name]
    comps = load_pipeline_components(ensure_tiny_model(name), "cpu", torch.bfloat16)
    assert (comps.family, comps.pipeline_class) == (family, pipeline_class)
    assert type(comps.transformer).__name__ == transformer_class
    assert sorted(comps.text_encoders) == encoders
    assert sorted(comps.tokenizers) == [e.replace("text_encoder", "tokenizer") for e in encoders]
    for module in (comps.transformer, comps.vae, *comps.text_encoders.values()):
        assert next(module.parameters()).dtype == torch.bfloat16
        assert not any(p.requires_grad for p in module.parameters())
    assert comps.adapter().plan.family == family


def test_parts_and_device_map():
    comps = load_pipeline_components(
        ensure_tiny_model("tiny-sd3"), {"text": "cpu", "vae": "meta"}, parts=("vae", "text")
    )
    assert comps.transformer is None
    assert comps.vae is not None and next(comps.vae.parameters()).device.type == "meta"
    assert next(comps.text_encoders["text_encoder_3"].parameters()).device.type == "cpu"
    assert comps.transformer_config["joint_attention_dim"] == 96 and comps.scheduler_config["shift"] == 3.0


def _run_pipeline(name: str):
    import diffusers

    path = ensure_tiny_model(name)
    pipeline_class = json.loads((path / "model_index.json").read_text())["_class_name"]
    pipe = getattr(diffusers, pipeline_class).from_pretrained(path)
    kwargs = dict(height=64, width=64, num_inference_steps=2, output_type="np")
    kwargs["generator"] = torch.Generator().manual_seed(0)
    if name == "tiny-pixart":
        kwargs.update(use_resolution_binning=False, clean_caption=False)
    return pipe(prompt="a photo of a cat", **kwargs).images


@pytest.mark.parametrize("name", TINY_MODELS)
def test_diffusers_pipeline_runs_two_steps(name):
    """diffusers' own pipeline class loads the folder and generates: the folders are real."""
    images = _run_pipeline(name)
    assert images.shape == (1, 64, 64, 3)
    assert images.min() >= 0.0 and images.max() <= 1.0 and images.std() > 0


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix in (".safetensors", ".json")
    }


def test_build_is_deterministic(tmp_path):
    a = build_tiny_pipeline("tiny-pixart", tmp_path / "a")
    b = build_tiny_pipeline("tiny-pixart", tmp_path / "b")
    assert _digest(a) == _digest(b) and len(_digest(a)) >= 8


def test_overrides_build_a_bigger_variant(tmp_path):
    path = build_tiny_pipeline(
        "tiny-flux", tmp_path / "wide", num_layers=3, num_attention_heads=8, attention_head_dim=32
    )
    config = load_pipeline_components(path, parts=()).transformer_config
    assert (config["num_layers"], config["num_attention_heads"]) == (3, 8)
    assert sum(config["axes_dims_rope"]) == 32


def test_concurrent_ensure_is_atomic(tmp_path):
    """Two builders race for the same model (threads: the mkdtemp + rename path is the one
    processes take): both get the finished folder, no temporary debris is left, later calls reuse it."""
    start, results, errors = threading.Barrier(2), [], []

    def build() -> None:
        try:
            start.wait()
            results.append(ensure_tiny_model("tiny-pixart", tmp_path))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    final = tmp_path / "tiny-pixart-v1"
    assert results == [final, final]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-pixart-v1"]
    before = (final / "model_index.json").stat().st_mtime_ns
    assert ensure_tiny_model("tiny-pixart", tmp_path) == final  # cached: not rebuilt
    assert (final / "model_index.json").stat().st_mtime_ns == before
    load_pipeline_components(final, parts=("transformer",))


def test_the_engine_offers_by_name_every_model_the_dev_tools_build(tmp_path, monkeypatch):
    """The engine lists the random-weight models itself (the pack lists them without importing the factory)
    and builds them through the checkout's dit_devtools; other names are refused."""
    from parallel_runtime.models.builtin import RANDOM_MODELS, builtin_model_path

    assert (*TINY_MODELS, *TINY_VIDEO_MODELS) == RANDOM_MODELS
    monkeypatch.setenv("DIT_PARALLEL_TINY_ROOT", str(tmp_path))
    assert builtin_model_path("tiny-pixart") == tmp_path / "tiny-pixart-v1"
    assert load_pipeline_components(tmp_path / "tiny-pixart-v1", parts=()).family == "pixart"
    with pytest.raises(ConfigError, match="'tiny-nothing' is not a built-in model"):
        builtin_model_path("tiny-nothing")


def test_missing_folder(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_pipeline_components(tmp_path / "nowhere")


def test_folder_without_model_index(tmp_path):
    (tmp_path / "transformer").mkdir()
    with pytest.raises(ConfigError, match=r"has no model_index.json \(found: transformer\)"):
        load_pipeline_components(tmp_path)


def test_unsupported_transformer_class(tmp_path):
    (tmp_path / "transformer").mkdir()
    (tmp_path / "model_index.json").write_text(
        json.dumps({"_class_name": "DiTPipeline", "transformer": ["diffusers", "DiTTransformer2DModel"]})
    )
    with pytest.raises(ConfigError) as err:
        load_pipeline_components(tmp_path)
    message = str(err.value)
    assert "DiTTransformer2DModel is not supported" in message
    for name in ("FluxTransformer2DModel", "SD3Transformer2DModel", "PixArtTransformer2DModel"):
        assert name in message


def test_other_bad_folders(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(ConfigError, match="has no transformer component"):
        load_pipeline_components(tmp_path)
    (tmp_path / "transformer").mkdir()
    (tmp_path / "model_index.json").write_text(json.dumps({"transformer": ["my_package", "MyDiT"]}))
    with pytest.raises(ConfigError, match="only components from diffusers or transformers"):
        load_pipeline_components(tmp_path)
    with pytest.raises(ConfigError, match="unknown part"):
        load_pipeline_components(ensure_tiny_model("tiny-flux"), parts=("unet",))
    with pytest.raises(ConfigError, match="unknown tiny model 'tiny-unet'"):
        ensure_tiny_model("tiny-unet", tmp_path)
