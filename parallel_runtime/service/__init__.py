"""The model service: the host-side API the nodes and the CLI call (load, encode, sample, decode)
and the worker-side model jobs it submits.
"""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "api": (
            "LoadRequest",
            "ParallelModel",
            "PoolRegistry",
            "check_pipefusion_request",
            "load_parallel_model",
            "resolve_model_path",
        ),
        "sampling_checks": (
            "check_branches_for_layout",
            "check_latent_size",
            "check_sampler_for_layout",
            "check_sampling_args",
        ),
        "load_job": ("LoadedModel", "load_model", "loaded_model", "unload"),
        "lora": ("LoraSpec", "inspect_lora", "stack_entries"),
        "model_jobs": ("decode", "encode_text", "generate"),
    },
)
