"""Model families and their files: one folder per family (``families/<family>/``: adapter, latent format,
original layout, text encoding, shipped configs; ``families.registry`` lists them), loading from diffusers
folders and single files, text encoding, weights read from files, the built-in models (the shipped trained
tiny one) and the one module touching diffusers internals (``compat``).

Importing this package is light; diffusers is imported when an adapter or a model is requested.
"""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "base": ("Activations", "AttentionScope", "Conditioning", "LatentFormat", "ModelAdapter", "ModelPlan", "Split"),
        "registry": ("adapter_class_for", "family_of", "get_adapter", "supported_class_names"),
        "loading": ("PipelineComponents", "load_pipeline_components", "read_model_index"),
        "single_file": (
            "SingleFileInfo",
            "existing_model_file",
            "inspect_single_file",
            "load_single_file_components",
            "load_single_file_transformer",
            "missing_part_error",
        ),
        "text_encoding": ("encode_prompt", "encode_prompts"),
        "files": ("detect_family", "read_safetensors_header"),
        "model_info": ("model_info_from_path",),
        "weights": ("TensorSource", "folder_tensor_source", "load_tensors", "meta_model", "parameters_on_meta"),
        "builtin": ("BUILTIN_MODELS", "RANDOM_MODELS", "TRAINED_MODELS", "builtin_model_path"),
    },
)
