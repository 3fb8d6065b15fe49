"""Command line (``python -m parallel_runtime doctor | generate | bench KIND``), benchmarks and report printing."""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "cli": ("build_parser", "main"),
    },
)
