"""Command line (python -m parallel_runtime doctor|generate|bench), benchmarks and report printing."""
