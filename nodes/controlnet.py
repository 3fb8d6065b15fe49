"""Parallel ControlNet Loader: a CONTROL_NET for ComfyUI's own ControlNet apply nodes, run on the worker pool.

The CONTROL_NET it returns (``service.comfy_control.ParallelControlNet``) is configured by ComfyUI's Apply
ControlNet and Set Union ControlNet Type as usual; the Parallel Sampler reads the chain and the workers load
the file beside the model they hold.
"""

from __future__ import annotations

import logging
from typing import Any

from .context import shared_bridge
from .declare import Choice, DeclaredNode, NodeSpec, Output
from .model_files import controlnet_choices, resolve_controlnet

log = logging.getLogger("dit_parallel.nodes")


class ParallelControlNetLoader(DeclaredNode):
    """Names a ControlNet file for the worker pool (loaded there when a sampler first needs it)."""

    SPEC = NodeSpec(
        node_id="DiTParallelControlNetLoader",
        display_name="Parallel ControlNet Loader",
        description=(
            "Like Load ControlNet Model, for the Parallel Sampler: wire it into ComfyUI's Apply ControlNet (with the "
            "model's VAE) and Set Union ControlNet Type as usual. The workers load the file and run it split like "
            "the model. Flux ControlNets of the InstantX / Union, XLabs and Mistoline layouts, InstantX Qwen-Image ones."
        ),
        inputs=(
            Choice("control_net_name", "A file from models/controlnet.", lambda: controlnet_choices(shared_bridge())),
        ),
        outputs=(
            Output("CONTROL_NET", "A ControlNet for ComfyUI's ControlNet apply nodes, run by the Parallel Sampler."),
        ),
        function="load_controlnet",
    )

    def load_controlnet(self, control_net_name: str) -> dict[str, Any]:
        from parallel_runtime.service.comfy_control import controlnet

        net, text = controlnet(resolve_controlnet(control_net_name, self.context.bridge))
        log.info("dit-parallel ControlNet: %s", text)
        return {"ui": {"text": [text]}, "result": (net,)}
