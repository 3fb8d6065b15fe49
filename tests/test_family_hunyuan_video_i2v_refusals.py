"""HunyuanVideo image-to-video that does not run is refused with a message before any sampling: the 16-channel
HunyuanVideo-I2V ("token_replace": its start frame's tokens take another modulation) when its plan is made, as
its shipped config states it; the 33-channel one ("latent_concat") and text-to-video get their plans. (ComfyUI's
"v2 (replace)" / "custom" conditioning keys are refused in tests/test_family_hunyuan_video_nodes.py.)"""

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


def test_token_replace_i2v_is_refused_and_the_others_plan():
    with pytest.raises(ConfigError, match="token replacement") as refused:
        HunyuanVideoAdapter.make_plan(_config(I2V_REPLACE), None)
    assert "33-channel" in str(refused.value)  # the fix names what runs
    assert HunyuanVideoAdapter.make_plan(_config(I2V_CONCAT), None).latent_channels == 16
    assert HunyuanVideoAdapter.make_plan(_config(T2V), None).latent_channels == 16


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
