"""dit-parallel: run one Flux / SD3 / PixArt generation across several GPUs, from ComfyUI.

ComfyUI imports this file from custom_nodes/. It stays light: the nodes import torch and the
worker runtime only when they run. Relative imports only (ComfyUI has its own ``nodes`` module).
"""

from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
from .nodes.context import install_web_routes

WEB_DIRECTORY = "./web"

install_web_routes()  # the status panel's HTTP routes; a no-op (one log line) outside ComfyUI

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
