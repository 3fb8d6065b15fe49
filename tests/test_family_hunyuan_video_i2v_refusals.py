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
