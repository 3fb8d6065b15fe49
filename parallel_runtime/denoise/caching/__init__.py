"""Step caches (ComfyUI's EasyCache / LazyCache) and the block cache, with decisions every rank takes together."""

from ...exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "specs": ("BlockCacheSpec", "StepCacheSpec"),
        "decisions": ("DecisionGroup",),
        "cached_denoiser": ("CachedDenoiser",),
        "block_cache": ("BlockCache", "BlockSlot"),
        "step_caches": ("EasyCache", "LazyCache"),
    },
)
