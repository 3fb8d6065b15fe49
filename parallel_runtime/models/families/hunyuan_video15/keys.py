"""HunyuanVideo 1.5 single files (Tencent's layout, ``byt5_in.``, ``vision_in.``): recognised, not converted yet.

The files are told apart from HunyuanVideo 1.0's (which share the token refiner's names) by the ByT5 mapper; their
conversion to diffusers' names is not written yet, so loading one fails with a message pointing to the diffusers
folder (HunyuanVideo15Pipeline), which loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....errors import ConfigError
from ...layout_shapes import Shapes
from ..spec import OriginalLayout

ANCHOR = "byt5_in.fc1.weight"


def _refuse(*_: Any) -> Any:
    raise ConfigError(
        "a HunyuanVideo 1.5 single file (Tencent's layout)",
        "the conversion of HunyuanVideo 1.5's original tensor names to diffusers' is not written yet",
        "use the diffusers folder of the model (HunyuanVideo15Pipeline, e.g. HunyuanVideo-1.5-Diffusers-480p_t2v) "
        "in ComfyUI/models/diffusers",
    )


def config_from_weights(shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    return _refuse(shapes, base)


LAYOUT = OriginalLayout(ANCHOR, config_from_weights, _refuse, _refuse)
