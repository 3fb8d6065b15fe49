"""Sequence-parallel attention (USP): Ulysses all-to-all x Ring K/V passing, over pluggable kernels."""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "usp": ("ATTENTION_BACKENDS", "SdpaRedirect", "SequenceLayout", "SequenceParallelAttention", "check_backend"),
        "kernels": ("KERNELS", "AttentionKernel", "select_kernel", "usable_backends"),
        "ring": ("merge_partial", "ring_attention"),
        "ulysses": ("gather_heads", "scatter_heads"),
    },
)
