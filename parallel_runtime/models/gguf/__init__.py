"""GGUF files (ComfyUI-GGUF's format): the GGML storage types, their dequantisation in torch, reading a
file's tensors (or a rank's share of them), the Linear layer that keeps a weight quantised on the device,
and what a GGUF transformer file holds.

Light to import: torch and the ``gguf`` package load with the submodules that need them.
"""

from ...exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "formats": ("GGMLType", "ggml_type"),
        "dequant": ("DEQUANT_MODES", "dequantise"),
        "reader": ("GGUFFile", "GGUFTensor"),
        "linear": ("GGUFLinear", "gguf_layers", "parameter_shapes"),
        "model_file": ("is_gguf",),
    },
)
