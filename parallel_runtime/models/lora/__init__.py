"""LoRA files on a loaded model, with ComfyUI's meaning and math.

``files`` reads a LoRA (identity, header-only or full, XLabs renamed by diffusers' converter);
``modules`` groups its tensors into patch modules (LoRA, LoHa, LoKr, DoRA, diff, set);
``keymap`` / ``resolve`` match module names to the model's tensors (every name family ComfyUI
accepts) with counts and clear errors; ``routing`` / ``skeleton`` map the original layout's tensors to
the diffusers model's rows (through the family's own converter); ``patch_math`` is ComfyUI's arithmetic;
``patcher`` brings a model's weights to a stack and back, exactly, without reloading.
"""

from ...exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "files": ("LoraFileId", "lora_file_id", "read_lora"),
        "keymap": ("ModelKeys", "TRANSFORMER"),
        "model_keys": ("model_keys",),
        "patcher": ("LoraPatcher", "StackEntry"),
        "resolve": ("Resolution", "check_resolution", "resolve"),
        "skeleton": ("original_skeleton",),
    },
)
