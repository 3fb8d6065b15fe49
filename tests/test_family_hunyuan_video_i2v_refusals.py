"""HunyuanVideo image-to-video: every shipped HunyuanVideo 1.0 config gets its plan (the 16-channel "token_replace"
I2V runs: tests/test_family_hunyuan_video_replace.py), and a noise mask keeps the clean latent as ComfyUI's
HunyuanVideo does; ComfyUI's "custom" conditioning key (tests/test_family_hunyuan_video_nodes.py) runs on every layout
(tests/test_family_hunyuan_video_replace.py). A HunyuanVideo 1.5 image-to-video folder loads and runs from the
nodes: tests/test_family_hunyuan_video15_i2v_nodes.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

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
