"""HunyuanVideo image-to-video: every shipped HunyuanVideo 1.0 config gets its plan (the 16-channel "token_replace"
I2V runs: tests/test_family_hunyuan_video_replace.py), and a noise mask keeps the clean latent as ComfyUI's
HunyuanVideo does; what does not run is refused with a message before any sampling (ComfyUI's "custom" conditioning
key: tests/test_family_hunyuan_video_nodes.py; a HunyuanVideo 1.5 image-to-video folder below)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.hunyuan_video import I2V_CONCAT, I2V_REPLACE, T2V
from parallel_runtime.models.families.hunyuan_video.adapter import HunyuanVideoAdapter

CONFIGS = Path(HunyuanVideoAdapter.__module__.replace(".", "/")).parent


def _config(variant: str) -> SimpleNamespace:
    folder = Path(__file__).resolve().parents[1] / CONFIGS / "configs" / variant
    return SimpleNamespace(**json.loads((folder / "config.json").read_text()))


def test_every_shipped_config_plans():
    for variant in (T2V, I2V_CONCAT, I2V_REPLACE):
        plan = HunyuanVideoAdapter.make_plan(_config(variant), None)
        assert plan.latent_channels == 16 and plan.inpaint_with_clean_latent  # ComfyUI's scale_latent_inpaint


def test_a_hunyuan_video15_image_to_video_folder_is_refused(tmp_path):
    """A HunyuanVideo15ImageToVideoPipeline folder holds the text-to-video transformer class: refused on the host
    (no node hands over the start image, so it would run as text-to-video); the engine's loader reads it (the start
    image given in GlyphText: tests/test_family_hunyuan_video15_i2v.py)."""
    from dit_devtools.tiny import ensure_tiny_model
    from parallel_runtime.models.loading import load_pipeline_components
    from parallel_runtime.service.host_checks import check_load_request
    from parallel_runtime.service.load_request import LoadRequest

    tiny = ensure_tiny_model("tiny-hunyuan-video-1.5")
    folder = tmp_path / "hyv15-i2v"
    folder.mkdir()
    for part in tiny.iterdir():
        if part.is_dir():
            (folder / part.name).symlink_to(part)
    index = json.loads((tiny / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": "HunyuanVideo15ImageToVideoPipeline"}))
    check_load_request(LoadRequest(model=str(tiny)), tiny)  # the text-to-video folder passes
    with pytest.raises(ConfigError, match="HunyuanVideo15ImageToVideoPipeline folder") as refused:
        check_load_request(LoadRequest(model=str(folder)), folder)
    assert "480p_t2v" in str(refused.value)
    assert "GlyphText" in str(refused.value)
    comps = load_pipeline_components(folder, "cpu", parts=("transformer",))
    assert comps.pipeline_class == "HunyuanVideo15ImageToVideoPipeline" and comps.family == "hunyuan-video-1.5"
