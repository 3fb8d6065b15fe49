"""PipeFusion: transformer blocks split into pipeline stages, the latent into patches (row bands),
stale K/V between steps; each stage loads only its own blocks.
"""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "pipeline": ("run_pipefusion",),
        "run_settings": ("PipeFusionSettings", "PipeFusionStats"),
        "stage_loading": (
            "StageWeights",
            "describe_stages",
            "load_pipeline_stage",
            "load_single_file_stage",
            "load_stage_transformer",
        ),
        "schedule": ("PipelineSchedule", "build_schedule", "default_patches"),
        "stale_kv": ("StaleKVCache",),
        "transport": ("ActivationFormat",),
    },
)
