"""Model families: one adapter per diffusers transformer class, looked up by class.

Importing this package is light (torch only); diffusers is imported when an adapter is requested.
"""

from .base import Activations, AttentionScope, Conditioning, LatentFormat, ModelAdapter, ModelPlan, Split
from .registry import adapter_class_for, family_of, get_adapter, supported_class_names

__all__ = [
    "Activations",
    "AttentionScope",
    "Conditioning",
    "LatentFormat",
    "ModelAdapter",
    "ModelPlan",
    "Split",
    "adapter_class_for",
    "family_of",
    "get_adapter",
    "supported_class_names",
]
